"""Image rollouts through the online veRL bridge (integrations/verl/agent_loop.py, issue 18): the loop hands
veRL a rollout's screenshots the way veRL 0.9.1's own single-turn and tool loops hand theirs
(`AgentLoopOutput.multi_modal_data = {"images": [PIL, ...]}`), and veRL's own post-processing
(`AgentLoopWorker._agent_loop_postprocess`: `_compute_multi_modal_inputs`, `_compute_position_ids`)
turns them into the pixel values the engine saw and the M-RoPE positions the model computes.

veRL's processor. veRL's worker loads it with `verl.utils.tokenizer.hf_processor`, which cannot run
unchanged in this venv, for two reasons (file and line in docs/cluster.md):
- `AutoProcessor.from_pretrained` needs torchvision for Qwen2-VL's video processor, and torchvision is
  kept out of the venv (every veRL engine extra installs it). hf_processor catches the ImportError and
  leaves the worker with no processor, so veRL would build no pixel inputs. The bridge refuses image
  rollouts in that case (tested below).
- transformers 5.24 (this venv; veRL 0.9.1 pins transformers < 5.11) checks in `ProcessorMixin.__call__`
  that the text holds one `<|image_pad|>` per image. veRL decodes the sequence with
  `skip_special_tokens=True`, which removes Qwen2-VL's special placeholders, so that check refuses every
  Qwen2-VL sample with images, including those of veRL's own loops. veRL's hf_processor already turns
  the same check off for Gemma4, with the comment "which Qwen's processor lacks".
`verl_processor` therefore builds what hf_processor returns under veRL's pinned versions: the same
`Qwen2VLProcessor` class from the same folder (engine.vision.load_processor, images only), the model's
`get_rope_index` / `get_vision_position_ids` bound to it and its config attached as hf_processor does,
and that one check off. Everything after that is veRL's own code.
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.required import requires, skip_or_fail

try:
    import verl.experimental.agent_loop.agent_loop  # noqa: F401
except ImportError as exc:
    skip_or_fail("verl", f"veRL 0.9.1 (with hydra-core) not installed ({exc})")

import torch  # noqa: E402

from openforge.engine.serve import serve_in_thread  # noqa: E402
from openforge.engine.vision import VisionTokens, image_token_counts, load_processor, open_image, pixel_inputs, placeholder_runs  # noqa: E402
from tests.helpers.gui_fixtures import missing_gui_tools  # noqa: E402
from openforge.errors import TrainerError  # noqa: E402
from openforge.image_store import ImageStore  # noqa: E402
from openforge.store import Store, Trajectory  # noqa: E402
from tests.helpers.verl import (PROMPT_LEN, RESPONSE_LEN, batch_of, generate, runs_of, unpad,  # noqa: E402
                                worker_for)
from tests.helpers.vl import BLUE, RED, _png, _prompt  # noqa: E402
from openforge.integrations.verl.agent_loop import EmbeddedVerlServer, output_of  # noqa: E402


def verl_processor(model_dir: Path) -> Any:
    """veRL's processor for a Qwen2-VL folder as hf_processor makes it under veRL's pinned versions
    (module docstring: the two stand-ins and why)."""
    from transformers import AutoConfig
    from transformers.models.qwen2_vl import Qwen2VLModel

    proc = load_processor(model_dir)
    proc.config = AutoConfig.from_pretrained(str(model_dir))  # hf_processor: `processor.config = config`
    proc.get_rope_index = types.MethodType(Qwen2VLModel.get_rope_index, proc)
    proc.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, proc)
    proc.validate_inputs = lambda *args, **kwargs: None  # as hf_processor does for Gemma4
    return proc


def vl_worker(model_dir: Path, tmp: Path, server: Any, **kw: Any) -> Any:
    worker = worker_for(model_dir, tmp, server, **kw)
    assert worker.processor is None  # hf_processor could not load it here (torchvision): see the module doc
    worker.processor = worker.model_config.processor = verl_processor(model_dir)
    return worker


def postprocess(worker: Any, output: Any) -> Any:
    """veRL's own per-sample post-processing (what generate_sequences runs on each loop's output)."""
    return asyncio.run(worker._agent_loop_postprocess(output, validate=False, raw_prompt=[{"role": "user", "content": "x"}]))


def model_positions(model: Any, ids: list[int], pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The M-RoPE positions [3, n] the trainer gives the sequence (the model's own get_rope_index)."""
    from openforge.trainer.vision import vision_forward_kwargs

    t = torch.tensor([ids])
    return vision_forward_kwargs(model, t, torch.ones_like(t), pixels, grid)["position_ids"][:, 0, :]


def check_multimodal(row: Any, images: list[bytes], proc: Any, model: Any) -> None:
    """veRL's multi_modal_inputs and position_ids of one post-processed sample are the engine's pixels and
    the model's positions for its images; every placeholder run has its image."""
    mmi = row.multi_modal_inputs
    pixels, grid = pixel_inputs(images, proc)
    assert torch.equal(mmi["pixel_values"], pixels) and torch.equal(mmi["image_grid_thw"], grid)
    valid = row.attention_mask[0].bool()
    ids = row.input_ids[0][valid].tolist()
    tokens = VisionTokens.from_processor(proc)
    runs = placeholder_runs(ids, tokens.image_token_id)
    assert [b - a for a, b in runs] == image_token_counts(grid, tokens.merge_size)
    assert row.position_ids.shape == (1, 4, PROMPT_LEN + RESPONSE_LEN)  # veRL: text positions + 3 M-RoPE rows
    assert torch.equal(row.position_ids[0, 1:, valid], model_positions(model, ids, pixels, grid))
    assert row.position_ids[0, 0, valid].tolist() == list(range(len(ids)))


def _stored_rollout(store: Store, home: Path, proc: Any) -> tuple[Any, list[int], list[bytes], int]:
    """A scored rollout whose one segment has a screenshot in its prompt and another in a later turn (a
    harness that replays its history: the second image is in veRL's response, mask 0)."""
    red, blue = _png(RED, (120, 80)), _png(BLUE, (64, 200), box=(.1, .5, .9, .9))
    run = store.create_run(kind="train")
    shas = [ImageStore.for_run(home, run.id).put(b) for b in (red, blue)]
    prompt = _prompt(proc, [red], "what colour?")
    turn = _prompt(proc, [blue], "and now?")  # the next user turn, its image expanded as the proxy does
    c1, c2 = [101, 102, 103], [201, 202]
    tokens = prompt + c1 + turn + c2
    mask = [0] * len(prompt) + [1] * len(c1) + [0] * len(turn) + [1] * len(c2)
    ro = store.create_rollout(run_id=run.id, task_id="gui", step=0, sample_index=0)
    store.replace_trajectories(ro.id, [Trajectory(
        run_id=run.id, rollout_id=ro.id, segment=0, token_ids=tokens, loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask], call_ids=[], images=shas)])
    store.update_rollout(ro.id, status="scored", reward=1.0)
    return store.get_rollout(ro.id), tokens, [red, blue], len(prompt)


def test_image_outputs_pass_verls_own_postprocessing(tiny_vl_model: Path, store: Store, forge_home: Path,
                                                     tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    worker = vl_worker(tiny_vl_model, tmp_path, None)
    proc = worker.processor
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model), dtype=torch.float32).eval()
    ro, tokens, images, n_prompt = _stored_rollout(store, forge_home, proc)
    kw = dict(images=ImageStore.for_run(forge_home, ro.run_id), vision=VisionTokens.from_processor(proc),
              prompt_length=PROMPT_LEN)

    out = output_of(store, ro, response_length=RESPONSE_LEN, **kw)
    assert out.prompt_ids + out.response_ids == tokens and len(out.prompt_ids) == n_prompt
    assert out.mm_processor_kwargs == {} and out.extra_fields["openforge"]["n_images"] == 2
    got = out.multi_modal_data["images"]  # the stored bytes decoded, in placeholder-run order
    assert [g.tobytes() for g in got] == [open_image(b).tobytes() for b in images]
    check_multimodal(postprocess(worker, out), images, proc, model)

    # A response cut inside the second image's run is cut before its <|vision_start|>; that image is dropped.
    vs = VisionTokens.from_processor(proc).vision_start_id
    start = placeholder_runs(tokens, proc.image_token_id)[1][0]
    cut = output_of(store, ro, response_length=start + 3 - n_prompt, **kw)
    assert cut.response_ids == tokens[n_prompt:start - 1] and tokens[start - 1] == vs
    assert len(cut.multi_modal_data["images"]) == 1 and cut.extra_fields["openforge"]["response_truncated"]
    check_multimodal(postprocess(worker, cut), images[:1], proc, model)

    with pytest.raises(TrainerError, match="prompt with images is .* over rollout.prompt_length=10"):
        output_of(store, ro, response_length=RESPONSE_LEN, **{**kw, "prompt_length": 10})
    with pytest.raises(TrainerError, match="no multimodal processor"):  # what the unmodified worker has here
        output_of(store, ro, response_length=RESPONSE_LEN, **{**kw, "vision": None})
    ImageStore.for_run(forge_home, ro.run_id).path(store.list_trajectories(rollout_ids=[ro.id])[0].images[1]).unlink()
    with pytest.raises(TrainerError, match="is not in"):
        output_of(store, ro, response_length=RESPONSE_LEN, **kw)


MINI_GUI = """[harness]
name = "mini-gui"
max_turns = 2
max_tokens = 8
extra_args = ["--no-tools", "--max-side", "64"]
[proxy]
max_tokens_cap = 8
default_max_tokens = 8
call_timeout_s = 300.0
[runner]
time_limit_scale = 3.0
rollout_timeout_s = 300.0
"""


class _Recording(EmbeddedVerlServer):
    """Keeps the `image_data` each call handed veRL's server, by the call's session (rollout) id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.images: dict[str, list[Any]] = {}

    async def generate(self, request_id: str, *, image_data: list[Any] | None = None, **kwargs: Any) -> Any:
        self.images.setdefault(request_id, []).append(image_data)
        return await super().generate(request_id, image_data=image_data, **kwargs)


@pytest.mark.slow
@requires("chromium", "needs Xvfb, xdotool and chromium on the host" if missing_gui_tools() else None)
def test_verl_worker_runs_mini_gui_rollouts_of_the_tiny_vlm(tiny_vl_model: Path, tmp_path: Path) -> None:
    """veRL's generate_sequences over mini-gui rollouts (a real Chromium screenshot per call, in a local
    sandbox), the tiny Qwen2-VL sampled by the embedded engine behind EmbeddedVerlServer: veRL's batch
    holds each sample's pixels and M-RoPE positions, token-exact spans and the exact reward."""
    from transformers import AutoModelForImageTextToText

    from openforge.engine.embedded import EmbeddedEngine
    from openforge.config import EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_vl_model), dtype="float32", max_batch_size=4))
    try:
        with serve_in_thread(engine.app) as eng:
            server = _Recording(eng.url, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN)
            worker = vl_worker(tiny_vl_model, tmp_path, server, temperature=1.0, forge_toml=MINI_GUI)
            out = generate(worker, batch_of(["gui-colour-name-red", "gui-colour-name-blue"], "builtin-web"), server)
    finally:
        engine.close()

    # token-exact: mini-gui sends a fresh chat each step, so each call is a segment of its own and veRL
    # gets the last one: its prompt and sampled span are exactly that call's to veRL's server
    calls: dict[str, list] = {}
    for session, prompt_ids, tok in server.calls:
        calls.setdefault(session, []).append((prompt_ids, tok))
    for i, info in enumerate(out.non_tensor_batch["openforge"]):
        assert info["n_segments"] == len(calls[info["rollout_id"]]) and info["n_calls"] == 1
        call_prompt, tok = calls[info["rollout_id"]][-1]
        prompt, response, mask, lps = unpad(out, i)
        [(start, end)] = runs_of(mask)
        assert prompt == call_prompt and start == 0 and response[start:end] == tok.token_ids
        assert lps[start:end] == pytest.approx(tok.log_probs, abs=1e-6)
    proc = worker.processor
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model), dtype=torch.float32).eval()
    b = out.batch
    assert b["position_ids"].shape == (2, 4, PROMPT_LEN + RESPONSE_LEN)
    store = Store(tmp_path / "home" / "forge.db")
    try:
        for i, info in enumerate(out.non_tensor_batch["openforge"]):
            ro = store.get_rollout(info["rollout_id"])
            [seg] = [t for t in store.list_trajectories(rollout_ids=[ro.id]) if t.segment == info["segment"]]
            assert seg.images and info["n_images"] == len(seg.images)  # mini-gui: one screenshot a call
            shots = [ImageStore.for_run(tmp_path / "home", ro.run_id).get(s) for s in seg.images]
            mmi = out.non_tensor_batch["multi_modal_inputs"][i]
            row = types.SimpleNamespace(multi_modal_inputs=mmi, attention_mask=b["attention_mask"][i:i + 1],
                                        input_ids=b["input_ids"][i:i + 1], position_ids=b["position_ids"][i:i + 1])
            check_multimodal(row, shots, proc, model)
            # veRL's server was handed the call's screenshot as veRL's own loops hand theirs: PIL images
            sent = server.images[ro.id][-1]
            assert [im.tobytes() for im in sent] == [open_image(b).tobytes() for b in shots]
            last = int(b["attention_mask"][i, PROMPT_LEN:].sum()) - 1
            assert float(b["rm_scores"][i, last]) == ro.reward  # the rollout's exact grade
    finally:
        store.close()
