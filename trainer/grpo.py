"""GRPO in plain PyTorch: group advantages, the clipped token-level objective with truncated importance
sampling, the k3 KL to the reference, and one optimisation step over micro-batches.

Symbols (per token t of sequence i, only where the loss mask is 1):

    A_i      = (R_i - mean(R_group)) / (std(R_group) + eps)       GRPO; Dr. GRPO drops the division
    mu       = the engine's sampling probability (the behaviour policy, recorded by the proxy)
    pi_old   = the trainer's probability before this update (the proximal policy)
    pi       = the trainer's probability now (carries the gradient)
    r        = pi / pi_old
    rho      = pi_old / mu                                         the engine/trainer ratio of the token
    w        = min(rho, C), detached                               truncated importance sampling (TIS)
               rho * 1[rho <= C]                                   masked IS (MIS): the token leaves the loss
               rho * 1[a <= rho <= b]                              IcePop: masked outside the band [a, b]
               1                                                   none: no correction
    L_pg     = -w * min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)
    KL_k3    = exp(ref - logp) - (ref - logp) - 1                  Schulman's k3, unbiased and >= 0
    H        = -sum_v pi(v) log pi(v)                              the policy's entropy at token t's position
    L        = agg(L_pg + beta * KL_k3 - alpha_H * H)              token-mean or sequence-mean

TIS follows Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(2025, fengyao.notion.site/off-policy-rl), as veRL (`rollout_is`, docs/advance/rollout_is.md) and slime
(`compute_tis_weights`: exp(train_old - rollout) clamped) implement it: the PPO ratio is taken
against the trainer's own pre-update logprobs and the engine/trainer gap is a separate, capped weight.
MIS and IcePop drop a token whose ratio is too far off instead of capping it (trainer/off_policy.py):
its policy-gradient term gets weight 0; the aggregation still counts it, as IcePop's objective does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from openforge.config import TrainerConfig
from openforge.errors import TrainerError
from openforge.trainer.off_policy import mismatch, off_policy_weights
from openforge.trainer.prefix import PastFactory, autocast, shared_prefix, units_of


def group_advantages(rewards: torch.Tensor, *, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Advantages from rewards grouped along the last dim: [G] or [n_groups, G] -> same shape.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))   # mean 0.5, std 0.5774 (unbiased)
    tensor([ 0.8660, -0.8660, -0.8660,  0.8660])
    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), std_normalize=False)   # Dr. GRPO
    tensor([ 0.5000, -0.5000, -0.5000,  0.5000])

    A group whose rewards are all equal has zero advantage (nothing to learn from it). The std is the
    unbiased one, as in DeepSeekMath's GRPO and TRL.
    """
    r = rewards.float()
    centred = r - r.mean(dim=-1, keepdim=True)
    if not std_normalize:
        return centred
    std = r.std(dim=-1, keepdim=True) if r.shape[-1] > 1 else torch.zeros_like(r)
    return centred / (std + eps)


@dataclass
class LossParts:
    """What one call of `policy_loss` measured (plain floats, summed later into step metrics)."""

    loss: torch.Tensor  # scalar with grad
    clip_frac: float  # share of mask tokens where the clipped branch was taken
    kl: float  # mean k3 KL on mask tokens (0 without a reference)
    tis_frac: float  # share of mask tokens whose TIS weight hit the cap
    masked: int = 0  # mask tokens MIS / IcePop dropped from the policy-gradient term
    entropy: float = 0.0  # mean policy entropy on mask tokens (0 when none was given)


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    logp_proximal: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    tis_cap: float = 2.0,
    off_policy: str = "tis",
    icepop_band: tuple[float, float] = (0.5, 5.0),
    loss_agg: str = "token-mean",
    weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> LossParts:
    """The clipped GRPO objective with TIS, on tensors of shape [B, T] (advantages: [B] or [B, T]).

    `logp_old` is the engine's recorded sampling logprob (behaviour policy mu); `logp_proximal` the
    trainer's logprob before this update (default: `logp_new` detached, exact for one epoch per step).
    `weights` [B, T] replaces `loss_agg` when the caller aggregates over a larger batch than this one
    (micro-batching): the loss is then sum(weights * per-token loss). `entropy` [B, T] is the policy's
    entropy at each token's position (`token_logprobs(..., entropy=True)`, with its graph): the bonus
    `entropy_coef * H` is subtracted, so minimising the loss keeps the policy from collapsing early.
    `off_policy` picks the engine/trainer correction (`off_policy_weights`).

    Worked example: one token, A = 1, engine logprob log 0.5, trainer logprob log 0.6 (first epoch, so
    r = 1): w = min(0.6/0.5, 2) = 1.2, L = -1.2 * 1 * 1 = -1.2, and dL/dlogp = -1.2.

    >>> lp = torch.log(torch.tensor([[0.6]])).requires_grad_()
    >>> out = policy_loss(lp, torch.log(torch.tensor([[0.5]])), torch.tensor([1.0]), torch.ones(1, 1))
    >>> round(out.loss.item(), 4)
    -1.2
    """
    mask = mask.float()
    adv = advantages.float()
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp_new)
    prox = logp_new.detach() if logp_proximal is None else logp_proximal
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    ratio = torch.exp(logp_new - prox)  # r = pi / pi_old
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    pg = torch.maximum(unclipped, clipped)  # -min(rA, clip(r)A)
    raw_w = torch.exp(prox - logp_old.float()).detach()  # rho = pi_old / mu
    w, dropped = off_policy_weights(raw_w, off_policy, cap=tis_cap, band=icepop_band)
    per_token = w * pg

    kl = torch.zeros_like(per_token)
    if logp_ref is not None:
        delta = logp_ref - logp_new
        kl = torch.exp(delta) - delta - 1.0  # k3
        per_token = per_token + kl_coef * kl
    if entropy is not None:
        per_token = per_token - entropy_coef * entropy

    if weights is None:
        weights = aggregation_weights(mask, loss_agg)
    loss = (per_token * weights * mask).sum()
    n = mask.sum().clamp_min(1.0)
    return LossParts(
        loss=loss,
        clip_frac=float(((clipped > unclipped).float() * mask).sum() / n),
        kl=float((kl.detach() * mask).sum() / n),
        tis_frac=float(((raw_w > tis_cap).float() * mask).sum() / n) if off_policy == "tis" else 0.0,
        masked=int((dropped.float() * mask).sum()),
        entropy=float((entropy.detach() * mask).sum() / n) if entropy is not None else 0.0,
    )


def aggregation_weights(mask: torch.Tensor, loss_agg: str, seq_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights w so that sum(w * mask * loss) is the chosen mean.

    token-mean: every mask token counts the same, w = 1 / n_tokens (DAPO, Dr. GRPO).
    seq-mean:   every sequence counts the same, w = 1 / (n_seqs * n_tokens_of_its_sequence) (the
                original GRPO). `seq_ids` [B] groups several rows into one sequence (a rollout's
                segments), so a rollout with many segments does not outweigh one with a single segment.

    >>> aggregation_weights(torch.tensor([[1., 1., 0.], [1., 0., 0.]]), "seq-mean")[:, 0]
    tensor([0.2500, 0.5000])
    """
    mask = mask.float()
    if loss_agg == "token-mean":
        return torch.full_like(mask, 1.0 / max(float(mask.sum()), 1.0))
    if loss_agg != "seq-mean":
        raise TrainerError(f"unknown loss_agg {loss_agg!r} (token-mean or seq-mean)")
    if seq_ids is None:
        seq_ids = torch.arange(mask.shape[0])
    uniq, inverse = torch.unique(seq_ids, return_inverse=True)
    per_seq = torch.zeros(len(uniq)).index_add_(0, inverse, mask.sum(dim=1))
    w_row = 1.0 / (len(uniq) * per_seq.clamp_min(1.0)[inverse])
    return w_row[:, None].expand_as(mask).clone()


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float | torch.Tensor = 1.0, first: int = 1, past: Any = None,
                   images: tuple[torch.Tensor, torch.Tensor] | None = None, entropy: bool = False) -> Any:
    """log pi_T(x_t | x_<t) for t = 1..T-1: [B, T] -> [B, T-1] (fp32 log-softmax, as the engine does).

    `temperature` is a number or [B, T-1] (per predicted token: each call's own temperature).
    Only targets t >= `first` are computed (earlier entries are 0): agent prompts are long (a harness's
    system prompt alone can be 10k+ tokens) and the LM head + log-softmax over them would dominate
    time and memory, so the model is asked for the last T - first + 1 positions' logits only.
    `past` is a cache holding the K/V of a prefix these rows continue (trainer/prefix.py).
    `images` = (pixel_values, image_grid_thw) of the rows' images, in row order (trainer/vision.py):
    the vision tower runs on them and M-RoPE positions come from the model's get_rope_index.
    With `entropy`, returns (logprobs, entropies), both [B, T-1]: each position's entropy of the
    same tempered distribution, H = logsumexp(z) - sum softmax(z) * z (the bonus of `entropy_coef`)."""
    T = input_ids.shape[1]
    keep = T - max(first, 1) + 1
    if past is not None:  # the mask covers the prefix too; positions continue after it
        ones = attention_mask.new_ones(attention_mask.shape[0], past.get_seq_length())
        attention_mask = torch.cat([ones, attention_mask], dim=1)
    if images is not None:
        if past is not None:
            raise TrainerError("rows with images never continue a shared prefix (trainer/data.py)")
        from openforge.trainer.vision import vision_forward_kwargs

        extra = vision_forward_kwargs(model, input_ids, attention_mask, *images)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, **extra).logits
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, cache=past, use_cache=past is not None,
                       logits_to_keep=keep).logits
    logits = logits[:, -keep:-1].float()  # positions first-1 .. T-2 predict tokens first .. T-1
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature[:, T - keep:, None].to(logits.dtype)
    elif temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, T - keep + 1:]
    # log softmax at the target only: gather - logsumexp, without a [B, T, V] log-prob tensor.
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.nn.functional.pad(logits.gather(-1, targets[..., None]).squeeze(-1) - lse, (T - keep, 0))
    if not entropy:
        return out
    ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return out, torch.nn.functional.pad(ent, (T - keep, 0))


@dataclass
class StepConfig:
    """What one optimizer step reads: `from_trainer` takes it from `[trainer]` (TrainerConfig), the one
    place it is built for a run; the defaults (TrainerConfig's) serve hand-built steps in tests."""

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    tis_cap: float = 2.0
    off_policy: str = "tis"
    icepop_band: tuple[float, float] = (0.5, 5.0)
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"
    max_grad_norm: float = 1.0
    epochs: int = 1
    autocast_dtype: torch.dtype | None = None  # bf16 on GPUs that support it; None = fp32

    @classmethod
    def from_trainer(cls, config: TrainerConfig, autocast_dtype: torch.dtype | None) -> StepConfig:
        return cls(clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high, tis_cap=config.tis_cap,
                   off_policy=config.off_policy, icepop_band=tuple(config.icepop_band),  # type: ignore[arg-type]
                   kl_coef=config.kl_coef, entropy_coef=config.entropy_coef, loss_agg=config.loss_agg,
                   max_grad_norm=config.max_grad_norm, epochs=config.epochs_per_step, autocast_dtype=autocast_dtype)


def _forward(model: Any, mb: dict[str, torch.Tensor], cfg: StepConfig, past: PastFactory | None = None,
             entropy: bool = False) -> Any:
    # each sampled token at its call's temperature (trainer/data.py); 1.0 for hand-built micro-batches
    temperature = mb.get("temperature", 1.0)
    cache = past(mb["input_ids"].shape[0]) if past is not None else None
    with autocast(mb["input_ids"].device.type, cfg.autocast_dtype):
        images = (mb["pixel_values"], mb["image_grid_thw"]) if "pixel_values" in mb else None
        return token_logprobs(model, mb["input_ids"], mb["attention_mask"], temperature, int(mb["first"]), cache,
                              images, entropy=entropy)


@torch.no_grad()
def _logprobs(model: Any, micro_batches: list[dict[str, torch.Tensor]], cfg: StepConfig) -> list[torch.Tensor]:
    """Every micro-batch's logprobs without a graph (pi_old before several epochs; the reference)."""
    out: list[torch.Tensor] = []
    for i, past in _with_prefixes(model, micro_batches, cfg, grad=False):
        out.append(_forward(model, micro_batches[i], cfg, past))
    return out


def _with_prefixes(model: Any, micro_batches: list[dict[str, torch.Tensor]], cfg: StepConfig, *, grad: bool
                   ) -> Iterator[tuple[int, PastFactory | None]]:
    """Each micro-batch's index with its prefixes' K/V: a shared prefix (and a second-level one inside
    it) runs once for its consecutive micro-batches, its backward once after them (trainer/prefix.py)."""
    for unit in units_of(micro_batches):
        with shared_prefix(model, micro_batches[unit[0]], grad=grad, autocast_dtype=cfg.autocast_dtype) as past:
            for sub in units_of([micro_batches[i] for i in unit], key="prefix2"):
                first = micro_batches[unit[sub[0]]]
                with shared_prefix(model, first, grad=grad, autocast_dtype=cfg.autocast_dtype, parent=past,
                                   key="prefix2") as inner:
                    for j in sub:
                        yield unit[j], inner


def _reference_logprobs(model: Any, micro_batches: list[dict[str, torch.Tensor]], cfg: StepConfig
                        ) -> list[torch.Tensor]:
    # The reference is the base model: the same weights with the LoRA adapter switched off.
    if not hasattr(model, "disable_adapter"):
        raise TrainerError("kl_coef > 0 needs a LoRA model (the reference is the adapter disabled)")
    with model.disable_adapter():
        return _logprobs(model, micro_batches, cfg)


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, micro_batches: list[dict[str, torch.Tensor]],
              cfg: StepConfig, scheduler: Any = None) -> dict[str, float]:
    """One GRPO update: for each epoch, accumulate gradients over all micro-batches, clip, step.

    Each micro-batch holds input_ids/attention_mask [B, T] and, aligned with the predicted tokens
    [B, T-1]: mask, old_logp (engine), weights (from `aggregation_weights` over the whole step), and
    advantages [B]. Returns the step's metrics; `mismatch_*` compare the engine's logprobs with the
    trainer's pre-update logprobs on the sampled tokens: the mean and max |log pi_old - log mu|, the mean
    k3 estimate of KL(mu || pi_old) (`mismatch_kl`) and the largest ratio pi_old / mu (`mismatch_ratio_max`);
    `masked_tokens` counts the tokens MIS / IcePop dropped.
    """
    if not micro_batches:
        raise TrainerError("no trainable tokens in this step (every group was dropped or empty)")
    model.train()
    # several updates on one batch: pi_old must be frozen before the first
    proximal: list[torch.Tensor | None] = list(_logprobs(model, micro_batches, cfg)) if cfg.epochs > 1 \
        else [None] * len(micro_batches)
    refs: list[torch.Tensor | None] = list(_reference_logprobs(model, micro_batches, cfg)) if cfg.kl_coef > 0 \
        else [None] * len(micro_batches)

    sums = {"loss": 0.0, "clip": 0.0, "kl": 0.0, "tis": 0.0, "ent": 0.0, "mm_sum": 0.0, "mm_max": 0.0, "mm_kl": 0.0,
            "ratio_max": 0.0, "masked": 0.0, "tok": 0.0}
    grad_norm = 0.0
    for epoch in range(cfg.epochs):
        optimizer.zero_grad(set_to_none=True)
        for i, past in _with_prefixes(model, micro_batches, cfg, grad=True):
            _accumulate(model, micro_batches[i], cfg, past, proximal[i], refs[i], sums if epoch == 0 else None)
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            raise TrainerError(f"gradient norm is {grad_norm} at epoch {epoch}: the loss diverged; lower the lr")
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    tok = max(sums["tok"], 1.0)
    return {
        "loss": sums["loss"], "clip_frac": sums["clip"] / tok, "kl": sums["kl"] / tok,
        "tis_frac": sums["tis"] / tok, "mismatch_mean": sums["mm_sum"] / tok, "mismatch_max": sums["mm_max"],
        "mismatch_kl": sums["mm_kl"] / tok, "mismatch_ratio_max": sums["ratio_max"],
        "masked_tokens": int(sums["masked"]),
        "grad_norm": grad_norm, "n_tokens": int(sums["tok"]),
        **({"entropy": sums["ent"] / tok} if cfg.entropy_coef > 0 else {}),
    }


def _accumulate(model: Any, mb: dict[str, torch.Tensor], cfg: StepConfig, past: PastFactory | None,
                proximal: torch.Tensor | None, ref: torch.Tensor | None, sums: dict[str, float] | None) -> None:
    """One micro-batch: forward, loss, backward (gradients accumulate); metrics into `sums` if given."""
    logp, entropy = _forward(model, mb, cfg, past, entropy=True) if cfg.entropy_coef > 0 \
        else (_forward(model, mb, cfg, past), None)
    mask = mb["mask"]
    parts = policy_loss(
        logp, mb["old_logp"], mb["advantages"], mask, logp_proximal=proximal, logp_ref=ref,
        kl_coef=cfg.kl_coef, clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
        tis_cap=cfg.tis_cap, off_policy=cfg.off_policy, icepop_band=cfg.icepop_band, weights=mb["weights"],
        entropy=entropy, entropy_coef=cfg.entropy_coef,
    )
    parts.loss.backward()
    if sums is None:
        return
    n = float(mask.sum())
    before = (proximal if proximal is not None else logp).detach()
    mm = mismatch(before, mb["old_logp"], mask)
    sums["loss"] += float(parts.loss.detach())
    sums["clip"] += parts.clip_frac * n
    sums["kl"] += parts.kl * n
    sums["tis"] += parts.tis_frac * n
    sums["ent"] += parts.entropy * n
    sums["masked"] += parts.masked
    sums["mm_sum"] += mm["gap_sum"]
    sums["mm_max"] = max(sums["mm_max"], mm["gap_max"])
    sums["mm_kl"] += mm["k3_sum"]
    sums["ratio_max"] = max(sums["ratio_max"], mm["ratio_max"])
    sums["tok"] += n


def lr_lambda(schedule: str, *, total_steps: int, warmup_steps: int = 0):  # -> Callable[[int], float]
    """Multiplier of the base lr after `n` optimizer steps: linear warmup, then constant/cosine/linear.

    >>> f = lr_lambda("linear", total_steps=4, warmup_steps=2)
    >>> [f(n) for n in range(5)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    """
    if schedule not in ("constant", "cosine", "linear"):
        raise TrainerError(f"unknown lr_schedule {schedule!r} (constant, cosine, linear)")

    def f(n: int) -> float:
        if n < warmup_steps:
            return (n + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        span = max(total_steps - warmup_steps, 1)
        progress = min((n - warmup_steps) / span, 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return f

