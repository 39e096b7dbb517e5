"""The embedded engine: SGLang's native HTTP API served from transformers + torch, CPU by default.

    engine = EmbeddedEngine(EmbeddedEngineConfig(model="~/.forge/models/tiny"))   # engine.app: a Starlette app

The HTTP side (routes, shapes, the `--api-key` check) is engine/sglang_api.py's; this module is the
backend behind it: request validation (vocabulary, context length, adapters), generation through the
scheduler thread, and the control commands. Continuous batching, the prefix cache, sampling and
LoRA live in engine/scheduler.py, engine/prefix_cache.py, engine/sampling.py and engine/lora.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import torch
from starlette.applications import Starlette

from openforge.engine.model import LoadedModel, load_model
from openforge.engine.multimodal import ImageCache, check_text_only, image_data_list, prepare_images
from openforge.engine.protocol import BadRequest, CompletionState, parse_input_ids, parse_sampling_params
from openforge.engine.scheduler import Scheduler, Sequence
from openforge.engine.sglang_api import create_sglang_app
from openforge.engine.weights import copy_weights_from_disk
from openforge.config import EmbeddedEngineConfig
from openforge.errors import EngineError


class _EmbeddedGeneration:
    """One request in the scheduler, seen from the event loop (`openforge.engine.sglang_api.Generation`)."""

    def __init__(self, seq: Sequence, events: asyncio.Queue, weight_version: str) -> None:
        self.seq = seq
        self.rid = seq.rid
        self.prompt_tokens = len(seq.input_ids)
        self.state: CompletionState = seq.state
        self._events = events
        self._weight_version = weight_version

    async def updates(self) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
        finish = None
        while finish is None:
            n, finish = await self._events.get()
            while finish is None and not self._events.empty():  # coalesce: only the newest state
                n, finish = self._events.get_nowait()
            yield n, finish

    def abort(self) -> None:
        self.seq.aborted = True  # the scheduler frees its batch slot at the next step

    def meta(self) -> dict[str, Any]:
        return {"weight_version": self._weight_version, "cached_tokens": self.seq.cached_tokens}


class EmbeddedEngine:
    """The model and its scheduler thread (an SGLang-API backend); `.app` serves them."""

    def __init__(self, config: EmbeddedEngineConfig, loaded: LoadedModel | None = None, *,
                 incremental_stream: bool = True, api_key: str | None = None) -> None:
        self.config = config
        # Stream chunks hold only the new tokens, as SGLang's --incremental-streaming-output does;
        # SGLang's default (cumulative chunks) resends the whole completion per token, which is
        # quadratic in its length. EngineClient reads either.
        self.incremental_stream = incremental_stream
        self.m = loaded or load_model(config.model, dtype=config.dtype, device=config.device)
        self.scheduler = Scheduler(self.m, max_batch_size=config.max_batch_size,
                                   prefix_cache_bytes=config.prefix_cache_mb * 2**20)
        self.weight_version = "default"
        self.images = ImageCache()  # decoded images by their bytes (engine/multimodal.py)
        self._seeds = itertools.count()
        self.app = create_sglang_app(self, api_key=config.api_key if api_key is None else api_key)
        self.app.state.engine = self

    def close(self) -> None:
        self.scheduler.close()

    # -- generation -------------------------------------------------------------------------

    def _check_length(self, input_ids: list[int]) -> None:
        ctx = self.m.context_length
        if len(input_ids) >= ctx:  # SGLang's TokenizerManager refuses it with this very sentence
            raise BadRequest(f"The input ({len(input_ids)} tokens) is longer than the model's context length ({ctx} tokens).")

    def _sequence(self, body: dict[str, Any], loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> Sequence:
        if "input_ids" not in body and isinstance(body.get("text"), str):  # SGLang also takes text
            body = {**body, "input_ids": list(self.m.tokenizer.encode(body["text"]))}
        input_ids = parse_input_ids(body, len(self.m.tokenizer))
        params = parse_sampling_params(body.get("sampling_params"))
        self._check_length(input_ids)
        adapter = body.get("lora_path")
        if adapter is not None and (adapter not in self.scheduler.adapters.paths
                                    or adapter in self.scheduler.closing_adapters):
            raise BadRequest(f"LoRA adapter {adapter!r} is not loaded")
        # Per-request generator: SGLang's `sampling_seed`, else one derived from the engine seed and
        # the request's arrival number (reproducible for the same request order).
        seed = params.sampling_seed if params.sampling_seed is not None else self.config.seed * 1_000_003 + next(self._seeds)
        gen = torch.Generator(device=self.m.device).manual_seed(seed)
        skip = params.skip_special_tokens
        state = CompletionState(params, self.m.eos_ids, lambda ids: self.m.tokenizer.decode(ids, skip_special_tokens=skip))

        def emit(seq: Sequence) -> None:  # scheduler thread: snapshot now, deliver on the loop
            snapshot = (len(seq.state.output_ids), seq.state.finish)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, snapshot)

        return Sequence(rid=str(body.get("rid") or uuid.uuid4().hex), input_ids=input_ids, params=params,
                        adapter=adapter, state=state, generator=gen, emit=emit, stream=bool(body.get("stream")))

    async def start(self, body: dict[str, Any]) -> _EmbeddedGeneration:
        events: asyncio.Queue = asyncio.Queue()
        seq = self._sequence(body, asyncio.get_running_loop(), events)
        images = image_data_list(body)
        if images:  # decoding and the image processor run off the event loop
            seq.mm = await asyncio.to_thread(prepare_images, self.m, seq.input_ids, images, self.images)
            seq.input_ids = seq.mm.input_ids  # runs of one placeholder came expanded
            self._check_length(seq.input_ids)
        else:
            check_text_only(self.m, seq.input_ids)
        if not self.scheduler.alive:
            raise BadRequest("the engine's scheduler is not running", 503)
        self.scheduler.submit(seq)
        return _EmbeddedGeneration(seq, events, self.weight_version)

    # -- health and info --------------------------------------------------------------------

    async def healthy(self) -> bool:
        return self.scheduler.alive

    async def health_generate(self) -> bool:
        gen = await self.start({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        finish = None
        try:
            async with asyncio.timeout(20):
                async for _, finish in gen.updates():
                    pass
        except TimeoutError:
            gen.abort()
            return False
        return finish is not None and finish.get("type") != "abort"

    def model_info(self) -> dict[str, Any]:
        hf = self.m.model.config
        return {
            "model_path": str(self.m.path), "tokenizer_path": str(self.m.path), "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.weight_version,
            "has_image_understanding": self.m.vision is not None, "has_audio_understanding": False,
            "model_type": getattr(hf, "model_type", None), "architectures": getattr(hf, "architectures", None),
            # Not in SGLang's /model_info (its /server_info has it): kept here so one call tells all.
            "context_length": self.m.context_length,
            "engine": "embedded", "device": str(self.m.device), "dtype": str(self.m.dtype).removeprefix("torch."),
            "max_batch_size": self.config.max_batch_size, "loaded_adapters": dict(self.scheduler.adapters.paths),
        }

    def server_info(self) -> dict[str, Any]:
        """SGLang's /server_info names: its server_args fields plus scheduler info and internal states."""
        ctx = self.m.context_length
        return {
            "model_path": str(self.m.path), "tokenizer_path": str(self.m.path), "served_model_name": str(self.m.path),
            "context_length": ctx, "max_req_input_len": ctx - 1, "max_total_num_tokens": ctx,
            "max_running_requests": self.config.max_batch_size, "random_seed": self.config.seed,
            "incremental_streaming_output": self.incremental_stream, "enable_lora": True,
            "disable_radix_cache": self.scheduler.prefix_cache is None,
            "internal_states": [self.scheduler.stats()], "version": "embedded",
        }

    def loaded_adapters(self) -> dict[str, str]:
        return dict(self.scheduler.adapters.paths)

    # -- control ----------------------------------------------------------------------------

    async def _run(self, fn: Any, ready: Any = lambda: True, exclusive: bool = False) -> str | None:
        """Run `fn` on the scheduler thread; the error message, or None on success."""
        try:
            await asyncio.wrap_future(self.scheduler.call(fn, ready, exclusive=exclusive))
        except EngineError as exc:
            return str(exc)
        except RuntimeError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    async def load_lora(self, name: str, path: str) -> str | None:
        return await self._run(lambda: self.scheduler.adapters.load(name, path))

    async def unload_lora(self, name: str) -> str | None:
        # Like SGLang: refuse new requests for it at once, unload when its in-flight requests finish.
        self.scheduler.closing_adapters.add(name)
        try:
            return await self._run(lambda: self.scheduler.unload_adapter(name),
                                   ready=lambda: not self.scheduler.uses_adapter(name))
        finally:
            self.scheduler.closing_adapters.discard(name)

    async def update_weights(self, path: str, weight_version: str | None) -> str | None:
        # Between steps and with no sequence running: no request sees a half-updated model.
        error = await self._run(lambda: self.scheduler.update_weights(lambda: copy_weights_from_disk(self.m, path)),
                                exclusive=True)
        if error is None:
            self.weight_version = weight_version or path
        return error

    async def flush_cache(self) -> bool:
        return await self._run(self.scheduler.flush_prefix_cache) is None


def create_engine_app(config: EmbeddedEngineConfig) -> Starlette:
    """Load `config.model` and return the engine's ASGI app (`app.state.engine` is the EmbeddedEngine)."""
    return EmbeddedEngine(config).app


def _pick_cpu_threads(m: LoadedModel) -> None:
    """One intra-op thread for small models on CPU (this process is the engine's own).

    A decode step of a small model is many tiny matmuls; OpenMP's fork/join per op then costs more
    than the op, and on a busy machine it is catastrophic (measured here: a [8x64]x[64x128] linear
    takes 27 us on 1 thread, 3.8 ms on 2 when the other core is busy). Big models keep torch's default."""
    if m.device.type == "cpu" and sum(p.numel() for p in m.model.parameters()) < 50_000_000:
        torch.set_num_threads(1)


def serve_engine(config: EmbeddedEngineConfig, *, announce=print) -> None:
    """Run the embedded engine in the foreground until SIGINT/SIGTERM (`forge engine`, `python -m openforge.engine`).

    The socket is bound first, so `port=0` works and the announced URL is the real one; connections
    made while the model loads wait in the listen backlog and are answered once it is serving."""
    import uvicorn

    from openforge.engine.serve import KEEP_ALIVE_S, listen_tcp, quiet_shutdown_cancellations

    sock = listen_tcp(config.host, config.port)
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    engine = EmbeddedEngine(config)
    _pick_cpu_threads(engine.m)
    guard = "API key required" if config.api_key else "no API key: anyone who reaches this port can use it"
    announce(f"engine: serving {engine.m.path} at http://{host}:{port} "
             f"({engine.m.device}, {str(engine.m.dtype).removeprefix('torch.')}; {guard})")
    server = uvicorn.Server(uvicorn.Config(engine.app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                           timeout_keep_alive=KEEP_ALIVE_S))
    quiet_shutdown_cancellations()
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
