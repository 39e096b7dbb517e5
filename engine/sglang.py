"""The SGLang server command line (kind = "sglang"); `EngineProcess` runs and supervises it.

SGLang lives in its own environment (it pins its own torch and CUDA), so forge runs
`<engine.sglang_python> -m sglang.launch_server ...` and talks to it over HTTP only. Flags, as in
SGLang's `server_args.py` and its LoRA serving docs:

    --model-path P --host H --port N --tp-size T --random-seed S [--dtype D]
    --incremental-streaming-output
        (SGLang's default stream resends every token id and logprob so far with each new token:
        quadratic, 380 MB of JSON and ~25 s of proxy CPU for one 4,000-token answer)
    --api-key K
        (then every route but /health* needs `Authorization: Bearer K`; SGLang has no env var for
        it, so the key is in argv: the engine host's process list is as private as the key)
    --enable-lora --max-lora-rank R --lora-target-modules all|q_proj ...
        (adapters are loaded later through POST /load_lora_adapter, so SGLang cannot infer the rank
        or the target modules from --lora-paths: both must be given up front)
    --enable-multimodal
        (a vision-language checkpoint folder, e.g. Qwen2-VL: SGLang turns it on by itself for the
        models it knows; said explicitly so a VLM never runs text-only)
    ... engine.sglang_args (passed last, verbatim: e.g. --mem-fraction-static 0.8)

Images (GUI agents): forge sends SGLang's `/generate` `input_ids` with every image's placeholder run
already expanded (as the HF processor expands it) plus `image_data` (data URLs). SGLang keeps such
ids verbatim only with `SGLANG_MM_AVOID_RETOKENIZE=1` (its default on main, absent in 0.5.12 and
older: there it decodes the ids and re-runs the processor, which re-expands the runs and fails, or
re-tokenizes and drifts): `sglang_env()` sets it for the child.
"""

from __future__ import annotations

import subprocess

from openforge.engine.vision import is_vision_model
from openforge.config import SglangEngineConfig


def sglang_env() -> dict[str, str]:
    """Environment for the SGLang child: pre-tokenized multimodal prompts kept verbatim (module doc)."""
    return {"SGLANG_MM_AVOID_RETOKENIZE": "1"}


def sglang_command(config: SglangEngineConfig, *, model_path: str, port: int,
                   lora_target_modules: list[str] | None = None, api_key: str = "") -> list[str]:
    cmd = [
        config.sglang_python, "-m", "sglang.launch_server",
        "--model-path", model_path,
        "--host", config.host,
        "--port", str(port),
        "--tp-size", str(config.tp_size),
        "--random-seed", str(config.seed),
        "--incremental-streaming-output",
        "--enable-lora",
        "--max-lora-rank", str(config.max_lora_rank),
        "--lora-target-modules", *(lora_target_modules or ["all"]),
    ]
    if config.dtype != "auto":
        cmd += ["--dtype", config.dtype]
    if api_key:
        cmd += ["--api-key", api_key]
    if is_vision_model(model_path):  # a local checkpoint folder (a hub id: False, SGLang decides)
        cmd += ["--enable-multimodal"]
    return cmd + list(config.sglang_args)


def sglang_version(python: str, timeout: float = 60.0) -> str | None:
    """The sglang version importable by `python`, or None (for `forge doctor`)."""
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
