"""The online veRL bridge: a veRL agent loop that runs every sample as an OpenForge rollout.

    # agent_loops.yaml, with openforge installed in veRL's environment:
    - name: openforge_agent
      _target_: openforge.integrations.verl.agent_loop.OpenForgeAgentLoop
      forge_config: /path/to/forge.toml       # harness, sandbox, runner (else $FORGE_VERL_CONFIG, ./forge.toml)
      segment: last                           # last | longest: which segment of a rollout veRL trains on

    actor_rollout_ref.rollout.agent.agent_loop_config_path=agent_loops.yaml
    actor_rollout_ref.rollout.agent.default_agent_loop=openforge_agent     # or the rows' agent_name column
    actor_rollout_ref.rollout.calculate_log_probs=True
    data.train_files=rl.parquet               # `forge export --format verl-rl`: one row per task

Importing this module also registers the loop as `openforge_agent` in veRL's registry (`register`).

For each sample, veRL's `AgentLoopWorker` calls `run(sampling_params, **row)`. The loop takes the task from
the row (`extra_info.task`, as `forge export --format verl-rl` writes it), runs it as one OpenForge rollout
(the configured harness in an OpenForge sandbox; its model calls go through the recording proxy) and
returns veRL's `AgentLoopOutput`, built from the rollout's recorded trajectory:

- **The engine is veRL's own server.** The proxy's engine is an SGLang-API adapter (`VerlServerBackend`)
  whose `/generate` calls `server_manager.generate(request_id, prompt_ids=, sampling_params=, image_data=)`
  (images as PIL images, as veRL's own loops pass them) - veRL's `LLMServerClient`, the very object veRL
  hands every agent loop - and replays the returned `TokenOutput` (token ids, log probs) through SGLang's finish rules. The sampled ids and log probs the
  proxy records are therefore exactly the ones veRL's server produced, and veRL's load balancing and
  sticky sessions (by request id) apply. veRL's sampling params (temperature, top_p, top_k,
  repetition_penalty) are applied to every call of the rollout whatever the harness asked; the length
  limit and stop strings are the harness's (through the proxy). Each set of veRL sampling params has
  its own run and proxy (`temperature_override` = veRL's temperature), so the calls record it.
- **The output.** One rollout can record several segments (a harness that rewrote its history, a
  sub-agent: rollouts/runner/trajectory.py). veRL 0.9.1 takes one `AgentLoopOutput` per sample, so the loop
  returns ONE segment: `segment="last"` (default: the one that ended with the graded answer) or
  `"longest"` (the most sampled tokens). The other segments stay in the OpenForge store (and in
  `forge export`), untrained by veRL; `extra_fields["openforge"]` says how many there were.
  `prompt_ids` = the segment up to its first sampled token; `response_ids` = the rest (sampled tokens,
  then tool results and the next turns' template tokens, ...); `response_mask` = 1 on sampled tokens;
  `response_logprobs` = the sampling log probs (0.0 where the mask is 0); `num_turns` = 2 x the segment's
  calls (each: the user/tool message before it, the assistant's answer); `extra_fields`
  `min_global_steps` / `max_global_steps` = the weight versions veRL's server reported for the rollout's
  calls (veRL's fully-async trainer reads them for every batch). A response longer than
  `rollout.response_length` is cut to it (as veRL's own loops do); a prompt longer than
  `rollout.prompt_length` is left-truncated by veRL's `_cap_text_prompt_length`.
- **Images** (a vision-language policy; GUI harnesses send screenshots): `multi_modal_data = {"images": [...]}`,
  the segment's images as PIL RGB images in the order of their placeholder runs, decoded from the bytes
  the proxy stored (what the engine was sent), as veRL's own single-turn and tool loops hand theirs.
  veRL's post-processing then runs its processor on them (`_compute_multi_modal_inputs`: pixel_values,
  image_grid_thw) and the model's `get_rope_index` (`_compute_position_ids`: M-RoPE positions).
  `mm_processor_kwargs` is `{}`: the checkpoint's own processor settings, which the proxy expanded the
  placeholder runs with (`data.mm_processor_kwargs` would give other grids than the engine saw). A
  response cut to `rollout.response_length` is cut before the first image whose run would not fit
  whole, and that image and the later ones are dropped; a prompt with images longer than
  `rollout.prompt_length` is an error (veRL's own loops refuse it too: truncation would misalign the
  runs). veRL's worker must have a multimodal processor (`hf_processor`), else the rollout is refused.
- **The reward** is the rollout's exact grade (the task's verifier, rollouts/runner/runner.py): `reward_score`, so
  veRL's reward manager does not grade the sample again. A rollout that failed for infrastructure or
  harness reasons has no reward and none is invented: `run` raises `OpenForgeRolloutFailed`.

Where veRL's server needs a GPU (its SGLang/vLLM replicas), `EmbeddedVerlServer` stands in for
`LLMServerClient`: the same `generate` signature and `TokenOutput`, the same sampling-param handling as
veRL's `SGLangHttpServer.generate`, over any SGLang-API engine (the embedded CPU engine).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import logging
import os
import secrets
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.workers.rollout.replica import TokenOutput

from openforge.engine.protocol import BadRequest, CompletionState, finish_json, parse_input_ids, parse_sampling_params
from openforge.engine.sglang_api import StaticInfo
from openforge.errors import TrainerError

log = logging.getLogger("forge.verl")

AGENT_NAME = "openforge_agent"
CONFIG_ENV = "FORGE_VERL_CONFIG"
HOME_ENV = "FORGE_VERL_HOME"
VERL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")  # what veRL's worker sets


class OpenForgeRolloutFailed(TrainerError):
    """The rollout of a sample ended without a reward (infrastructure or harness failure)."""


# -- veRL's server behind the proxy ------------------------------------------------------------------


def verl_sampling_params(engine_params: dict[str, Any], verl_params: dict[str, Any]) -> dict[str, Any]:
    """The params for veRL's `generate`: veRL's sampling settings over the proxy's; the harness's length
    limit and stops; log probs always (the recorded trajectory needs them)."""
    out = {k: engine_params[k] for k in ("temperature", "top_p", "top_k") if k in engine_params}
    out.update({k: verl_params[k] for k in VERL_SAMPLING_KEYS if verl_params.get(k) is not None})
    out["max_tokens"] = int(engine_params.get("max_new_tokens", 128))
    for key in ("stop", "stop_token_ids"):
        if engine_params.get(key):
            out[key] = list(engine_params[key])
    out["logprobs"] = True
    return out


@dataclass
class _Answered:
    """A /generate that veRL's server has already answered (`openforge.engine.sglang_api.Generation`)."""

    rid: str
    prompt_tokens: int
    state: CompletionState

    async def updates(self) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
        yield len(self.state.output_ids), self.state.finish

    def abort(self) -> None:
        pass  # the answer is complete before the first byte goes out

    def meta(self) -> dict[str, Any]:
        return {}


class VerlServerBackend(StaticInfo):
    """An SGLang-API backend (engine.sglang_api.SGLangBackend) whose /generate is veRL's server manager.

    `server_manager.generate` runs on `owner_loop` (veRL's agent-loop worker loop, where its Ray handles and
    locks live), whatever thread serves the HTTP request. `params_for(rid)` gives veRL's sampling params of
    the rollout a request belongs to (None: not a bridge rollout, refused)."""

    incremental_stream = True
    info_version = "verl-bridge"
    weight_version = "verl"

    def __init__(self, server_manager: Any, tokenizer: Any, *, model_path: str, context_length: int,
                 owner_loop: asyncio.AbstractEventLoop, params_for: Callable[[str], dict[str, Any] | None],
                 model_name: str = "verl") -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.model_path, self.model_name = model_path, model_name
        self.context_length = context_length
        self.owner_loop = owner_loop
        self.params_for = params_for
        self.eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        # rollout id -> (min, max) of the weight versions (veRL's `global_steps`) that served its calls
        self.weight_versions: dict[str, tuple[int, int]] = {}

    async def _on_owner_loop(self, coro: Any) -> Any:
        if asyncio.get_running_loop() is self.owner_loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.owner_loop))

    async def start(self, body: dict[str, Any]) -> _Answered:
        input_ids = parse_input_ids(body, len(self.tokenizer))
        engine_params = dict(body.get("sampling_params") or {})
        params = parse_sampling_params(engine_params)
        if body.get("lora_path"):
            raise BadRequest("veRL's server serves veRL's current weights; it loads no OpenForge LoRA adapter")
        if len(input_ids) >= self.context_length:
            raise BadRequest(f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        verl_params = self.params_for(rid)
        if verl_params is None:
            raise BadRequest(f"request {rid!r} belongs to no rollout of the veRL bridge", 403)
        # veRL's request id is the trajectory's, the same for every turn (its sticky session: one server
        # keeps the rollout's prefix cache), as in veRL's ToolAgentLoop; the proxy's rid is <rollout id>_<hex>.
        out = await self._on_owner_loop(self.server_manager.generate(
            request_id=rid.rsplit("_", 1)[0], prompt_ids=input_ids,
            sampling_params=verl_sampling_params(engine_params, verl_params), image_data=_pil_images(body)))
        self._note_versions(rid.rsplit("_", 1)[0], out.extra_fields or {})
        ids = [int(t) for t in out.token_ids]
        lps = [float(x) for x in out.log_probs] if out.log_probs else [float("nan")] * len(ids)
        if len(lps) != len(ids):
            raise BadRequest(f"veRL's server returned {len(ids)} tokens but {len(lps)} log probs", 502)
        skip = params.skip_special_tokens
        state = CompletionState(params, self.eos_ids, lambda t: self.tokenizer.decode(t, skip_special_tokens=skip))
        for i, (tid, lp) in enumerate(zip(ids, lps, strict=True)):
            if state.append(tid, lp) and i != len(ids) - 1:
                raise BadRequest(f"veRL's server went on {len(ids) - i - 1} tokens past a stop "
                                 f"({state.finish}): it does not apply SGLang's stop rules", 502)
        if state.finish is None:  # veRL's server ended it: its own length cap, or an abort
            state.finish = (finish_json("abort", message="veRL's server aborted the request")
                            if out.stop_reason == "aborted" else finish_json("length", length=len(ids)))
        return _Answered(rid, len(input_ids), state)

    def _note_versions(self, rollout_id: str, fields: dict[str, Any]) -> None:
        """veRL's LLMServerClient reports the weight version of each answer (`min_global_steps` ..
        `max_global_steps`: a partial rollout aborted by a weight sync and resumed spans two); its own
        agent loops hand the trajectory's span to the trainer, and its fully-async trainer reads it."""
        lo, hi = fields.get("min_global_steps", fields.get("global_steps")), \
            fields.get("max_global_steps", fields.get("global_steps"))
        if lo is None or hi is None:
            return
        seen = self.weight_versions.get(rollout_id)
        self.weight_versions[rollout_id] = (int(lo), int(hi)) if seen is None else \
            (min(seen[0], int(lo)), max(seen[1], int(hi)))

    def versions_of(self, rollout_id: str) -> dict[str, int]:
        """AgentLoopOutput's `min_global_steps` / `max_global_steps` of a finished rollout (forgotten here)."""
        span = self.weight_versions.pop(rollout_id, None)
        return {} if span is None else {"min_global_steps": span[0], "max_global_steps": span[1]}

    def loaded_adapters(self) -> dict[str, str]:
        return {}

    async def load_lora(self, name: str, path: str) -> str | None:
        return "veRL owns the policy's weights: OpenForge loads no adapter into veRL's server"

    async def unload_lora(self, name: str) -> str | None:
        return "veRL owns the policy's weights: OpenForge loads no adapter into veRL's server"

    async def update_weights(self, path: str, weight_version: str | None) -> str | None:
        return "veRL owns the policy's weights: it syncs them itself"

    async def flush_cache(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _pil_images(body: dict[str, Any]) -> list[Any] | None:
    """The proxy's `image_data` (data URLs) as what veRL's own loops hand its servers: PIL images (veRL's
    vLLM server puts them in vLLM's `multi_modal_data`, its SGLang server in SGLang's `image_data`)."""
    from openforge.engine.multimodal import decode_data_url, image_data_list
    from openforge.engine.vision import open_image
    from openforge.image_store import ImageError

    urls = image_data_list(body)
    try:
        return [open_image(decode_data_url(u, i), i) for i, u in enumerate(urls)] or None
    except ImageError as exc:
        raise BadRequest(str(exc)) from None


def _data_url(image: Any) -> str:
    """A PIL image (what veRL's servers are given) as a PNG data URL for an SGLang-API engine; PNG is lossless,
    so the engine decodes the very pixels."""
    import base64
    import io

    if isinstance(image, str):
        return image
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class EmbeddedVerlServer:
    """Stands in for veRL's `LLMServerClient` where veRL's server needs a GPU: `generate(request_id, *,
    prompt_ids, sampling_params, image_data, ...) -> TokenOutput` over an SGLang-API engine at `engine_url`,
    with the sampling-param handling of veRL 0.9.1's `SGLangHttpServer.generate` (max_new_tokens, else
    max_tokens, else min(response_length, prompt_length + response_length - len(prompt)), clamped to the
    model length; `logprobs` -> SGLang's `return_logprob`). `calls` keeps (request_id, prompt_ids, TokenOutput)
    of each."""

    def __init__(self, engine_url: str, *, prompt_length: int, response_length: int, max_model_len: int | None = None,
                 api_key: str | None = None) -> None:
        from openforge.engine.client import EngineClient

        self.client = EngineClient(engine_url, api_key=api_key, timeout=600)
        self.prompt_length, self.response_length = prompt_length, response_length
        self.max_model_len = max_model_len or prompt_length + response_length
        self.calls: list[tuple[str, list[int], TokenOutput]] = []
        self.global_steps = 0  # the weight version veRL's server reports (its trainer's step)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: list[Any] | None = None, video_data: list[Any] | None = None,
                       audio_data: list[Any] | None = None, mm_processor_kwargs: dict[str, Any] | None = None,
                       **kwargs: Any) -> TokenOutput:
        if video_data or audio_data:
            raise ValueError("the embedded engine takes images only (no video_data / audio_data)")
        prompt_ids = [int(t) for t in prompt_ids]
        room = self.max_model_len - len(prompt_ids) - 1
        if room < 0:
            raise ValueError(f"Prompt length ({len(prompt_ids)}) exceeds the model's maximum context length "
                             f"({self.max_model_len}).")
        params = dict(sampling_params)
        if "max_new_tokens" in params:
            max_new = params.pop("max_new_tokens")
        elif "max_tokens" in params:
            max_new = params.pop("max_tokens")
        else:
            max_new = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        params["max_new_tokens"] = max(0, min(int(max_new), room))
        return_logprob = bool(params.pop("logprobs", False))
        # a fresh id per turn, as LLMServerClient._vllm_request_id gives the server; `request_id` is the session's
        out = await self.client.generate(prompt_ids, params, rid=uuid.uuid4().hex,
                                         image_data=[_data_url(x) for x in image_data] if image_data else None)
        result = TokenOutput(token_ids=list(out.output_ids), log_probs=list(out.logprobs) if return_logprob else None,
                             stop_reason="aborted" if out.finish_reason == "abort" else "completed", num_preempted=0,
                             extra_fields={"global_steps": self.global_steps})
        # as LLMServerClient.generate: a turn's span is its own version unless the server said otherwise
        result.extra_fields.setdefault("min_global_steps", self.global_steps)
        result.extra_fields.setdefault("max_global_steps", self.global_steps)
        self.calls.append((request_id, prompt_ids, result))
        return result

    async def aclose(self) -> None:
        await self.client.aclose()


# -- the bridge: store, proxy, runner, per veRL worker ----------------------------------------------


class OpenForgeBridge:
    """What the loops of one veRL worker share: the store, the engine adapter in front of veRL's server, and
    per set of veRL sampling params one OpenForge run with its own recording proxy and rollout runner
    (training and validation thus land in different runs, each recording the params it sampled at)."""

    def __init__(self, server_manager: Any, tokenizer: Any, *, config: Any, model_path: str, context_length: int,
                 home: Path) -> None:
        self.server_manager, self.tokenizer, self.config = server_manager, tokenizer, config
        self.model_path, self.context_length, self.home = model_path, context_length, home
        self.store: Any = None
        self.backend: VerlServerBackend | None = None
        self._engine_url, self._engine_key = "", ""
        self._lanes: dict[str, tuple[str, Any]] = {}  # sampling params (json) -> (run id, its runner)
        self._run_params: dict[str, dict[str, Any]] = {}  # run id -> sampling params
        self._rollout_params: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop: list[Callable[[], Any]] = []
        self._index = itertools.count()
        self._tasks: set[tuple[str, str]] = set()  # (run id, task id) already in the store
        self._tasks_lock: asyncio.Lock | None = None  # made on veRL's loop

    def start(self, owner_loop: asyncio.AbstractEventLoop) -> OpenForgeBridge:
        from openforge.engine.serve import serve_in_thread
        from openforge.engine.sglang_api import create_sglang_app
        from openforge.store import Store

        try:
            self.store = Store(self.home / "forge.db")
            self._stop.append(self.store.close)
            self._engine_key = secrets.token_hex(24)
            backend = self.backend = VerlServerBackend(
                self.server_manager, self.tokenizer, model_path=self.model_path, context_length=self.context_length,
                owner_loop=owner_loop, params_for=self.params_for)
            engine = serve_in_thread(create_sglang_app(backend, api_key=self._engine_key))
            self._stop.append(engine.stop)
            self._engine_url = engine.url
        except BaseException:
            self.close()
            raise
        log.info("veRL bridge up: store %s, engine adapter %s in front of veRL's server", self.store.path, engine.url)
        return self

    def lane_for(self, sampling_params: dict[str, Any]) -> tuple[str, Any]:
        """(run id, runner) for these veRL sampling params (blocking: the first time starts a proxy). Each set of
        params has its own run and its own proxy, whose `temperature_override` is veRL's temperature, so the
        temperature recorded on every call is the one veRL's server sampled at."""
        from openforge.proxy.server import ProxyServer
        from openforge.rollouts.runner.runner import RolloutRunner

        params = {k: (v.item() if hasattr(v, "item") else v) for k, v in sampling_params.items()}
        key = json.dumps(params, sort_keys=True, default=str)
        with self._lock:
            if key in self._lanes:
                return self._lanes[key]
            proxy_cfg = self.config.proxy.model_copy(update={"temperature_override": params.get("temperature")})
            proxy = ProxyServer(proxy_cfg, store_path=self.store.path, engine_url=self._engine_url,
                                model_path=self.model_path, uds=Path(tempfile.mkdtemp(prefix="forge-verl-")) / "proxy.sock",
                                engine_key=self._engine_key)
            self._stop.append(proxy.stop)
            proxy.start()
            run = self.store.create_run(kind="train", name="veRL bridge",
                                        config={"verl_sampling_params": params, "harness": self.config.harness.name})
            self.store.set_run_status(run.id, "running")
            self._run_params[run.id] = params
            runner = RolloutRunner(self.store, config=self.config.model_copy(update={"proxy": proxy_cfg}),
                                   proxy_url=proxy.url, proxy_socket=proxy.uds)
            self._lanes[key] = (run.id, runner)
            log.info("veRL bridge: run %s samples at %s through proxy %s", run.id, params, proxy.url)
            return self._lanes[key]

    def params_for(self, rid: str) -> dict[str, Any] | None:
        rollout_id = rid.rsplit("_", 1)[0]
        with self._lock:
            if rollout_id in self._rollout_params:
                return self._rollout_params[rollout_id]
        try:
            run_id = self.store.get_rollout(rollout_id).run_id
        except Exception:  # noqa: BLE001 - not one of ours
            return None
        with self._lock:
            params = self._run_params.get(run_id)
            if params is not None:
                self._rollout_params[rollout_id] = params
            return params

    async def rollout(self, task: Any, sampling_params: dict[str, Any]) -> Any:
        from openforge.rollouts.runner.runner import RolloutSpec

        run_id, runner = await asyncio.to_thread(self.lane_for, sampling_params)
        if (run_id, task.id) not in self._tasks:  # veRL runs a task's n samples at once: add it once, here
            if self._tasks_lock is None:
                self._tasks_lock = asyncio.Lock()
            async with self._tasks_lock:
                if (run_id, task.id) not in self._tasks:
                    await asyncio.to_thread(self.store.add_tasks, run_id, [task.to_record()])
                    self._tasks.add((run_id, task.id))
        [ro] = await runner.run(run_id, [RolloutSpec(task, sample_index=next(self._index))])
        return ro

    def close(self) -> None:
        with self._lock:
            for run_id in self._run_params:
                try:
                    self.store.set_run_status(run_id, "finished")
                except Exception as exc:  # noqa: BLE001 - keep closing
                    log.warning("finishing run %s failed: %s", run_id, exc)
            self._run_params.clear()
        while self._stop:
            try:
                self._stop.pop()()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping the veRL bridge: %s", exc)


_bridges: dict[int, OpenForgeBridge] = {}
_bridges_lock = threading.Lock()


def bridge_for(loop: AgentLoopBase, owner_loop: asyncio.AbstractEventLoop, *, forge_config: str | None,
               forge_home: str | None) -> OpenForgeBridge:
    """The bridge of `loop.server_manager` (one per veRL worker), started on first use; `owner_loop` is the
    event loop veRL runs the agent loops on (blocking: call it off that loop)."""
    with _bridges_lock:
        bridge = _bridges.get(id(loop.server_manager))
        if bridge is not None:
            return bridge
        from openforge.config import load_config

        path = forge_config or os.environ.get(CONFIG_ENV) or ("forge.toml" if Path("forge.toml").is_file() else None)
        config = load_config(path)
        model_cfg = loop.config.actor_rollout_ref.model
        model_path = str(model_cfg.get("local_path") or model_cfg.path)
        if not Path(model_path).is_dir():
            raise TrainerError(f"the veRL bridge needs the policy's checkpoint as a local folder (the proxy renders "
                               f"its chat template); actor_rollout_ref.model.path is {model_path!r}")
        rollout_cfg = loop.rollout_config
        context = int(rollout_cfg.get("max_model_len") or rollout_cfg.prompt_length + rollout_cfg.response_length)
        home = Path(forge_home or os.environ.get(HOME_ENV) or tempfile.mkdtemp(prefix="forge-verl-home-"))
        bridge = OpenForgeBridge(loop.server_manager, loop.tokenizer, config=config, model_path=model_path,
                                 context_length=context, home=home).start(owner_loop)
        _bridges[id(loop.server_manager)] = bridge
        return bridge


def close_bridges() -> None:
    """Stop every bridge of this process (proxy, engine adapter, store); veRL workers end with the process."""
    with _bridges_lock:
        while _bridges:
            _bridges.popitem()[1].close()


atexit.register(close_bridges)  # a veRL worker ends with its process: the runs are marked finished


# -- the recorded trajectory -> veRL's AgentLoopOutput ------------------------------------------------


def task_of(row: dict[str, Any]) -> Any:
    """The task of a `forge export --format verl-rl` row (its `extra_info.task`, graded by its ground truth)."""
    from openforge.integrations.verl.reward import task_from_row

    extra = row.get("extra_info")
    if hasattr(extra, "item") and not isinstance(extra, dict):
        extra = extra.item()
    truth = (row.get("reward_model") or {}).get("ground_truth")
    return task_from_row(extra, truth)


def output_of(store: Any, rollout: Any, *, response_length: int, segment: str = "last",
              cap_prompt: Callable[[list[int]], list[int]] | None = None, images: Any = None,
              vision: Any = None, prompt_length: int | None = None) -> AgentLoopOutput:
    """veRL's AgentLoopOutput of one recorded rollout (see the module's docstring for the mapping).

    A segment with images needs `images` (the run's ImageStore) and `vision` (engine.vision.VisionTokens of
    veRL's processor: the placeholder ids); `prompt_length` is veRL's `rollout.prompt_length`."""
    from openforge.rollouts.runner.failures import is_infra_failure

    if is_infra_failure(rollout) or rollout.reward is None:
        raise OpenForgeRolloutFailed(f"rollout {rollout.id} of task {rollout.task_id} ended {rollout.status} without "
                                     f"a reward: {rollout.error or 'no reason recorded'}")
    segments = sorted(store.list_trajectories(rollout_ids=[rollout.id]), key=lambda t: t.segment)
    segments = [s for s in segments if 1 in (s.loss_mask or [])]
    if not segments:
        raise OpenForgeRolloutFailed(f"rollout {rollout.id} of task {rollout.task_id} recorded no sampled token")
    if segment == "last":
        seg = segments[-1]
    elif segment == "longest":
        seg = max(segments, key=lambda s: (sum(s.loss_mask), s.segment))
    else:
        raise TrainerError(f"segment must be 'last' or 'longest', not {segment!r}")
    tokens, mask, lps = list(seg.token_ids), list(seg.loss_mask), [float(x) for x in seg.logprobs]
    first = mask.index(1)
    prompt_ids = tokens[:first]
    mm: dict[str, Any] = {}
    if getattr(seg, "images", None):
        response_length, mm = _segment_images(rollout, seg, tokens, first, response_length, images, vision,
                                              prompt_length)
    if cap_prompt is not None:  # a prompt with images over the limit was refused above
        prompt_ids = cap_prompt(prompt_ids)
    response_ids, response_mask, response_logprobs = tokens[first:], mask[first:], lps[first:]
    truncated = len(response_ids) > response_length
    calls = {c.id: c for c in store.list_calls(rollout_id=rollout.id)}
    seg_calls = [calls[i] for i in seg.call_ids if i in calls]
    generate_s = sum((c.latency_ms or 0.0) for c in seg_calls) / 1000
    all_generate_s = sum((c.latency_ms or 0.0) for c in calls.values() if c.status == "ok") / 1000
    wall_s = ((rollout.ended_at - rollout.started_at).total_seconds()
              if rollout.started_at is not None and rollout.ended_at is not None else 0.0)
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids[:response_length],
        response_mask=response_mask[:response_length],
        response_logprobs=response_logprobs[:response_length],
        reward_score=float(rollout.reward),
        num_turns=2 * len(seg.call_ids),
        metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=max(0.0, wall_s - all_generate_s)),
        extra_fields={"turn_scores": [], "tool_rewards": [], "openforge": {
            "rollout_id": rollout.id, "run_id": rollout.run_id, "task_id": rollout.task_id,
            "status": rollout.status, "segment": seg.segment, "n_segments": len(segments),
            "n_calls": len(seg.call_ids), "response_truncated": truncated,
            "n_images": len(mm.get("multi_modal_data", {}).get("images", []))}},
        **mm,
    )


def _segment_images(rollout: Any, seg: Any, tokens: list[int], first: int, response_length: int, images: Any,
                    vision: Any, prompt_length: int | None) -> tuple[int, dict[str, Any]]:
    """(the response length to keep, AgentLoopOutput's multimodal fields) of a segment with images: every
    image whose placeholder run is kept whole, decoded from the run's ImageStore, in run order."""
    from openforge.engine.vision import open_image, placeholder_runs
    from openforge.image_store import ImageError

    where = f"rollout {rollout.id} of task {rollout.task_id}"
    if vision is None or images is None:
        raise TrainerError(f"{where} has images but veRL's worker has no multimodal processor for this model "
                           "(veRL's hf_processor could not load it; see its warning), so veRL cannot build the "
                           "pixel inputs a VLM trains on")
    runs = placeholder_runs(tokens, vision.image_token_id)
    if len(runs) != len(seg.images):
        raise TrainerError(f"{where} has {len(seg.images)} image(s) but {len(runs)} image placeholder run(s)")
    if prompt_length is not None and first > prompt_length and runs[0][0] < first:
        raise TrainerError(f"{where}: its prompt with images is {first} tokens, over rollout.prompt_length="
                           f"{prompt_length}; cutting it would misalign the image runs (veRL's own loops refuse "
                           "it too): raise rollout.prompt_length")
    end = first + response_length  # the response is cut here, or before the first image cut by it
    keep = len(runs)
    for k, (start, stop) in enumerate(runs):
        if stop > end:
            before = start - 1 if tokens[start - 1] == vision.vision_start_id else start
            end, keep = min(end, before), k
            break
    try:
        pil = [open_image(images.get(sha), i) for i, sha in enumerate(seg.images[:keep])]
    except ImageError as exc:
        raise TrainerError(f"{where}: {exc}") from None
    # mm_processor_kwargs {}: the checkpoint's own processor settings, as the proxy expanded the runs with
    return end - first, {"multi_modal_data": {"images": pil}, "mm_processor_kwargs": {}}


def _vision_tokens(processor: Any) -> Any:
    """The image placeholder ids of veRL's processor (a Qwen2-VL-style one); None without a processor."""
    from openforge.engine.vision import VisionTokens

    if processor is None:
        return None
    try:
        return VisionTokens.from_processor(processor)
    except (AttributeError, TypeError, ValueError):  # not a Qwen2-VL-style processor: images are refused
        return None


@register(AGENT_NAME)
class OpenForgeAgentLoop(AgentLoopBase):
    """veRL's agent loop that runs each sample as an OpenForge rollout (see the module's docstring).

    Keyword settings (from the agent-loop YAML): `forge_config` (a forge.toml: harness, sandbox, runner),
    `forge_home` (where the store goes; else $FORGE_VERL_HOME, else a fresh temporary folder), `segment`."""

    def __init__(self, *args: Any, forge_config: str | None = None, forge_home: str | None = None,
                 segment: str = "last", name: str | None = None, tools: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if segment not in ("last", "longest"):
            raise TrainerError(f"openforge_agent: segment must be 'last' or 'longest', not {segment!r}")
        self.forge_config, self.forge_home, self.segment = forge_config, forge_home, segment

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = task_of(kwargs)
        bridge = _bridges.get(id(self.server_manager))
        if bridge is None:
            owner = asyncio.get_running_loop()
            bridge = await owner.run_in_executor(None, lambda: bridge_for(
                self, owner, forge_config=self.forge_config, forge_home=self.forge_home))
        rollout = await bridge.rollout(task, sampling_params)
        from openforge.image_store import ImageStore

        vision = _vision_tokens(self.processor)
        out = await asyncio.get_running_loop().run_in_executor(None, lambda: output_of(
            bridge.store, rollout, response_length=self.rollout_config.response_length, segment=self.segment,
            cap_prompt=self._cap_text_prompt_length, images=ImageStore.for_run(bridge.home, rollout.run_id),
            vision=vision, prompt_length=self.rollout_config.prompt_length))
        # the weight versions that served the rollout, as veRL's own loops report them (the rollout's span:
        # its segments' calls all lie within it); veRL's fully-async trainer needs both
        if bridge.backend is not None:
            out.extra_fields.update(bridge.backend.versions_of(rollout.id))
        return out
