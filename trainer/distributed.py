"""Data-parallel GRPO under torchrun with PyTorch FSDP2 (`fully_shard`): gloo on CPU, NCCL on GPUs.

    torchrun --nproc_per_node N script.py      # every rank: init(), shard(model), then distributed_step(...)

Every rank holds the whole step's samples (rank 0 reads the store and broadcasts them: `broadcast`),
packs the same micro-batches, with loss weights computed over the whole step, and takes its share
of them, split by padded tokens (longest first onto the least-loaded rank). So rank r's loss is its
part of the one global sum; FSDP's reduce-scatter averages over the N ranks, so each rank scales its
loss weights by N (exact in floating point for a power of 2; gloo has no pre-multiplied sum for
`set_gradient_divide_factor(1)`): the update equals the one-process update on the same batch.

FSDP runs collectives inside every forward and backward (all-gather, reduce-scatter), so every rank
must run the same number of micro-batches in the same order: a rank with fewer gets copies of its
smallest one with zero loss weights (no gradient, no metric). For the same reason shared-prefix
units (trainer/prefix.py: a prefix forward, then suffix forwards and backwards, then a prefix
backward) are not used under FSDP: their collective order differs from a plain micro-batch's.

Rank 0 owns the store, the checkpoints and adapter publishing; the others only train.

Rows with images (a vision-language model, trainer/vision.py): the vision tower is frozen and left
out of the sharding (`ignored_params`: a full copy on every rank, no collective inside it), so a rank
can run the tower on its micro-batches while another runs a text-only one. Rank 0 ships each image
row's image ids and the step's image bytes (the encoded PNG/JPEG, each once, not pixel values: a
1920x1080 screenshot is ~100x larger as a Qwen2-VL pixel tensor); every rank re-creates pixel values
for the micro-batches it runs, and only those, with the model's own processor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Sequence

import torch
import torch.distributed as dist

from openforge.errors import TrainerError
from openforge.image_store import ImageError
from openforge.trainer.grpo import StepConfig, grpo_step


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init() -> Dist:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        # NCCL for the CUDA tensors (FSDP's collectives), gloo for the CPU ones (a step's metric sums,
        # broadcast objects): a process group of NCCL alone refuses a CPU tensor.
        device, backend = torch.device("cuda", local), "cuda:nccl,cpu:gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def leave() -> None:
    """Tear the process group down once every rank has come here. Torn down while another rank still
    had a collective in flight (a broadcast, a state-dict gather), gloo's threads could abort that
    process at exit ("terminate called without an active exception", exit -6)."""
    dist.barrier()
    dist.destroy_process_group()


def shard(model: Any) -> Any:
    """FSDP2 over every decoder layer and the root (a PEFT model: the LoRA weights shard with their layer).

    A vision-language model's decoder layers are its language model's; its vision tower (frozen: LoRA
    and full fine-tuning leave it alone, trainer/model.py) stays whole on every rank, outside FSDP, so
    ranks running image and text-only micro-batches side by side issue the same collectives."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    for layer in getattr(inner, "language_model", inner).layers:
        fully_shard(layer)
    visual = getattr(inner, "visual", None)
    ignored = set(visual.parameters()) if visual is not None else None
    if ignored and any(p.requires_grad for p in ignored):
        raise TrainerError("the vision tower has trainable weights; under trainer.nproc > 1 it must stay frozen")
    fully_shard(model, ignored_params=ignored)
    return model


def broadcast(obj: Any, d: Dist) -> Any:
    """Rank 0's `obj` on every rank (the step's samples: rank 0 alone reads the store)."""
    box = [obj if d.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def split_by_tokens(micro_batches: Sequence[dict[str, torch.Tensor]], world: int) -> list[list[int]]:
    """Micro-batch indices per rank: longest first onto the rank with the fewest padded tokens.

    >>> mbs = [{"input_ids": torch.zeros(1, n)} for n in (10, 4, 4, 2)]
    >>> split_by_tokens(mbs, 2)
    [[0], [1, 2, 3]]
    """
    sizes = [int(mb["input_ids"].numel()) for mb in micro_batches]
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = min(range(world), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += sizes[i]
    return [sorted(x) for x in out]


def smallest(micro_batches: Sequence[dict[str, torch.Tensor]]) -> int:
    """The index of the micro-batch a rank with fewer repeats as idle work (the first of the smallest)."""
    return min(range(len(micro_batches)), key=lambda i: micro_batches[i]["input_ids"].numel())


def _idle(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `mb` that contributes nothing: zero loss weights and an empty loss mask."""
    return {**mb, "weights": torch.zeros_like(mb["weights"]), "mask": torch.zeros_like(mb["mask"])}


def distributed_step(model: Any, optimizer: torch.optim.Optimizer, micro_batches: list[dict[str, torch.Tensor]],
                     cfg: StepConfig, d: Dist, scheduler: Any = None) -> dict[str, float]:
    """This rank's share of one GRPO update; returns the step's metrics over all ranks (on every rank)."""
    if any("prefix_id" in mb for mb in micro_batches):
        raise ValueError("shared-prefix micro-batches cannot run under FSDP; pack with share_prefix_min=0")
    shares = split_by_tokens(micro_batches, d.world)
    mine = [{**micro_batches[i], "weights": micro_batches[i]["weights"] * d.world} for i in shares[d.rank]]
    most = max(len(s) for s in shares)
    mine += [_idle(micro_batches[smallest(micro_batches)])] * (most - len(mine))
    m = grpo_step(model, optimizer, mine, cfg, scheduler)
    tok = float(m["n_tokens"])
    sums = torch.tensor([m["loss"] / d.world, m["clip_frac"] * tok, m["kl"] * tok, m["tis_frac"] * tok,
                         m["mismatch_mean"] * tok, tok, m.get("entropy", 0.0) * tok, m["mismatch_kl"] * tok,
                         m["masked_tokens"]], dtype=torch.float64)
    dist.all_reduce(sums)
    peak = torch.tensor([m["mismatch_max"], m["mismatch_ratio_max"]], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    n = max(float(sums[5]), 1.0)
    return {"loss": float(sums[0]), "clip_frac": float(sums[1]) / n, "kl": float(sums[2]) / n,
            "tis_frac": float(sums[3]) / n, "mismatch_mean": float(sums[4]) / n, "mismatch_max": float(peak[0]),
            "mismatch_kl": float(sums[7]) / n, "mismatch_ratio_max": float(peak[1]), "masked_tokens": int(sums[8]),
            "grad_norm": m["grad_norm"], "n_tokens": int(sums[5]),
            **({"entropy": float(sums[6]) / n} if cfg.entropy_coef > 0 else {})}


# ---------------------------------------------------------------------------------------------
# `forge train` under torchrun: rank 0 runs the whole run (store, engine, proxy, rollouts, the loop
# of trainer/loop.py) and drives the other ranks through `Group`; every other rank runs `follow()`.
# Each op rank 0 announces (a broadcast) is then run by all ranks together, in the same order, so
# the FSDP collectives inside it line up. Followers never touch the store or the checkpoint files:
# weights and optimizer state reach them by broadcast, so ranks on other machines need no shared disk.


def launched() -> bool:
    """True in a process torchrun started with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def _trainable_names(model: Any) -> list[str]:
    # The order of build_optimizer's params (model.parameters() filtered), which is what the ints of
    # a one-process optimizer state_dict number; fully_shard keeps the names.
    return [n for n, p in model.named_parameters() if p.requires_grad]


def optimizer_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A one-process `optimizer.state_dict()` (params numbered) keyed by parameter name instead."""
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


def optimizer_by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of `optimizer_by_name`: the checkpoint format of the one-process trainer."""
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


@dataclass
class Gathered:
    """Rank 0's full copy of the sharded weights and optimizer, shaped like what save_checkpoint saves
    in one process (PEFT's `save_pretrained`, a numbered `optimizer.state_dict()`): a checkpoint of a
    torchrun run resumes in one process and the other way round."""

    model: Any
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]

    def save_pretrained(self, path: Any) -> None:
        self.model.save_pretrained(path, state_dict=self.weights)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer


@dataclass
class StepImages:
    """What every rank needs to re-create the pixels of a step's image rows: each sample's image ids
    in placeholder order (None for a text row) and the encoded bytes of each image, once. Bytes, not
    files: ranks on other machines need no shared disk (as for weights and optimizer state)."""

    ids: list[list[str] | None]
    data: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, samples: Sequence[Any], trajectories: Sequence[Any], images: Any) -> StepImages | None:
        """From the step's trajectories (their `images`) and the run's ImageStore; None without images."""
        by_row = {(t.rollout_id, t.segment): list(t.images) for t in trajectories if getattr(t, "images", None)}
        ids = [by_row[(s.rollout_id, s.segment)] if s.image_grid_thw is not None else None for s in samples]
        if not any(ids):
            return None
        return cls(ids, {sha: images.get(sha) for row in ids if row for sha in row})


class _ShippedImages:
    """The read side of an ImageStore over the bytes rank 0 shipped with the current step."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, sha: str) -> bytes:
        try:
            return self.data[sha]
        except KeyError:
            raise ImageError(f"image {sha[:12]} was not shipped with this step") from None


@dataclass
class _Setup:
    """What rank 0 announces once: enough for a follower to build the same sharded policy."""

    config: dict[str, Any]
    model_path: str
    step_cfg: StepConfig
    pad_id: int
    scheduler: dict[str, Any] | None  # a resumed run's LR schedule position
    resumed: bool


def shard_and_sync(model: Any, config: Any, d: Dist, resumed: bool,
                    optimizer_state: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    """Shard `model`, give every rank rank 0's trainable weights (its fresh or resumed adapter) and,
    when resuming, rank 0's optimizer state. Collective."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from openforge.trainer.model import build_optimizer

    names = _trainable_names(model)
    weights = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad} if d.is_main else {}
    model = shard(model)
    set_model_state_dict(model, weights, options=_full_options(broadcast_from_rank0=True, strict=False))
    optimizer, scheduler = build_optimizer(model, config)
    if resumed:
        full = optimizer_by_name(optimizer_state, names) if d.is_main and optimizer_state else {}
        set_optimizer_state_dict(model, optimizer, full, options=_full_options(broadcast_from_rank0=True))
    return model, optimizer, scheduler


class Group:
    """Rank 0's handle on the other ranks of a torchrun job (trainer/loop.py holds one)."""

    def __init__(self, d: Dist) -> None:
        self.d = d
        self.closed = False

    def _announce(self, op: str, payload: Any = None) -> None:
        broadcast((op, payload), self.d)

    def setup(self, model: Any, config: Any, model_path: str, step_cfg: StepConfig, pad_id: int,
              resumed: dict[str, Any] | None) -> tuple[Any, Any, Any]:
        """Shard rank 0's `model` (fresh, or loaded from the resumed adapter) across all ranks;
        `resumed` is the checkpoint's trainer state. Returns (model, optimizer, scheduler)."""
        sched = resumed.get("scheduler") if resumed else None
        self._announce("setup", _Setup(config.model_dump(), str(model_path), step_cfg, pad_id, sched, resumed is not None))
        model, optimizer, scheduler = shard_and_sync(model, config, self.d, resumed is not None,
                                                      resumed["optimizer"] if resumed else None)
        if sched is not None:
            scheduler.load_state_dict(sched)
        return model, optimizer, scheduler

    def step(self, model: Any, optimizer: Any, scheduler: Any, samples: list[Any], step_cfg: StepConfig,
             config: Any, pad_id: int, images: StepImages | None = None) -> dict[str, float]:
        """One update on every rank. `samples` may hold pixel values (rank 0's build_batch made them);
        the other ranks get the samples without them and `images` to re-create their share's."""
        shipped = [replace(s, pixel_values=None) for s in samples] if images is not None else samples
        self._announce("step", (shipped, images))
        return _step(model, optimizer, scheduler, samples, step_cfg, config, pad_id, self.d)

    def gather(self, model: Any, optimizer: Any) -> Gathered:
        self._announce("gather")
        return gather(model, optimizer, self.d)

    def close(self) -> None:
        """Let the followers exit (rank 0 is done, or failed outside a collective)."""
        if not self.closed:
            self.closed = True
            self._announce("stop")
            leave()  # with the followers, after the last message


def _step(model: Any, optimizer: Any, scheduler: Any, samples: list[Any], step_cfg: StepConfig, config: Any,
          pad_id: int, d: Dist, images: StepImages | None = None, pixels: Any = None) -> dict[str, float]:
    from openforge.trainer.data import micro_batches

    # Shared-prefix units cannot run under FSDP (see the module docstring): plain micro-batches.
    if images is not None:
        mbs = _with_own_pixels(samples, images, pixels, config, pad_id, d)
    else:
        mbs = micro_batches(samples, token_budget=config.micro_batch_tokens, pad_id=pad_id, loss_agg=config.loss_agg,
                            device=d.device)
    if not mbs:  # the same on every rank: each packed the same samples
        return {"n_tokens": 0}
    return distributed_step(model, optimizer, mbs, step_cfg, d, scheduler)


def _with_own_pixels(samples: list[Any], images: StepImages, pixels: Any, config: Any, pad_id: int,
                     d: Dist) -> list[dict[str, torch.Tensor]]:
    """The step's micro-batches, packed as on every rank, with pixel values in those this rank runs
    (its share and the idle copy) only: re-created from the shipped bytes by `pixels` (a
    trainer/vision.py TrajectoryImages over them, cached across steps by image id)."""
    from openforge.trainer.data import collate_images, micro_batches, pack_rows

    bare = [replace(s, pixel_values=None, image_grid_thw=None) for s in samples]  # packs exactly as with images
    mbs = micro_batches(bare, token_budget=config.micro_batch_tokens, pad_id=pad_id, loss_agg=config.loss_agg,
                        device=d.device)
    if not mbs:
        return mbs
    # the rows of each micro-batch: micro_batches' own packing (no prefix sharing: one unit of all rows)
    rows = pack_rows(samples, list(range(len(samples))), config.micro_batch_tokens)
    if [(len(g), max(len(samples[j].token_ids) for j in g)) for g in rows] != [tuple(mb["input_ids"].shape) for mb in mbs]:
        raise TrainerError("micro-batches do not match trainer/data.py's packing: image rows cannot be placed")
    pixels.images.data = images.data
    shares = split_by_tokens(mbs, d.world)
    idle = {smallest(mbs)} if len(shares[d.rank]) < max(len(x) for x in shares) else set()
    for i in set(shares[d.rank]) | idle:
        members = []
        for j in rows[i]:
            s = samples[j]
            if s.image_grid_thw is not None:
                where = SimpleNamespace(rollout_id=s.rollout_id, segment=s.segment, images=images.ids[j])
                values, grid = pixels.inputs(where, s.token_ids)
                if not torch.equal(grid, s.image_grid_thw):
                    raise TrainerError(f"rank {d.rank}: the images of {s.rollout_id}/{s.segment} give grid "
                                       f"{grid.tolist()}, rank 0 saw {s.image_grid_thw.tolist()}")
                s = replace(s, pixel_values=values)
            members.append(s)
        mbs[i].update(collate_images(members, d.device))
    return mbs


def gather(model: Any, optimizer: Any, d: Dist) -> Gathered:
    """The sharded trainable weights and optimizer state, whole on rank 0 (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    full = get_model_state_dict(model, options=_full_options(cpu_offload=True))
    osd = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    names = _trainable_names(model)
    weights = {k: v for k, v in full.items() if k in set(names)}
    return Gathered(model, weights, optimizer_by_index(osd, names) if d.is_main else {})


def follow() -> None:
    """A rank other than 0: build the same sharded policy, then run what rank 0 announces until it
    says stop. Ctrl-C is left to rank 0 (it stops the run and then says stop here)."""
    import signal

    from openforge.config import TrainerConfig
    from openforge.trainer.model import build_policy
    from openforge.trainer.vision import TrajectoryImages

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    d = init()
    model = optimizer = scheduler = pixels = None
    setup: _Setup | None = None
    try:
        while True:
            op, payload = broadcast(None, d)
            if op == "setup":
                setup = payload
                config = TrainerConfig(**setup.config)
                torch.manual_seed(config.seed)
                model = build_policy(setup.model_path, config, device=d.device)
                model, optimizer, scheduler = shard_and_sync(model, config, d, setup.resumed, None)
                if setup.scheduler is not None:
                    scheduler.load_state_dict(setup.scheduler)
                # the processor loads on the first image row only
                pixels = TrajectoryImages(_ShippedImages(), setup.model_path)  # type: ignore[arg-type]
            elif op == "step":
                assert setup is not None
                samples, images = payload
                _step(model, optimizer, scheduler, samples, setup.step_cfg, config, setup.pad_id, d, images, pixels)
            elif op == "gather":
                gather(model, optimizer, d)
            elif op == "stop":
                leave()  # with rank 0's Group.close, after the last message
                return
            else:
                raise RuntimeError(f"rank {d.rank}: unknown op {op!r} from rank 0")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
