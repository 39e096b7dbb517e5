#!/usr/bin/env bash
# GPU smoke test: start the real SGLang server through forge's own launcher (EngineProcess,
# kind = "sglang") and run the engine-client suite (tests/engine/test_engine_api.py) against it.
#
#   MODEL=/models/Qwen2.5-0.5B-Instruct SGLANG_PYTHON=/opt/sglang/bin/python bench/gpu_smoke.sh
#
# MODEL          checkpoint folder or hub id (default Qwen/Qwen2.5-0.5B-Instruct; a folder also
#                enables the runtime-LoRA check, which builds an adapter for it)
# SGLANG_PYTHON  interpreter of the environment that has sglang (default: python3)
# FORGE_PYTHON   interpreter of this project's environment (default: .venv/bin/python)
# SGLANG_ARGS    extra launch_server flags (default: --enable-deterministic-inference, which SGLang
#                needs for `sampling_seed` to reproduce a sampled completion)
# PORT           default 31000; LOG default bench/results/gpu_smoke_sglang.log
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
SGLANG_PYTHON="${SGLANG_PYTHON:-python3}"
FORGE_PYTHON="${FORGE_PYTHON:-.venv/bin/python}"
SGLANG_ARGS="${SGLANG_ARGS:---enable-deterministic-inference}"
PORT="${PORT:-31000}"
LOG="${LOG:-bench/results/gpu_smoke_sglang.log}"
mkdir -p "$(dirname "$LOG")"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
  || echo "gpu_smoke: warning: nvidia-smi not found; SGLang will likely fail to start" >&2
if ! "$SGLANG_PYTHON" -c "import sglang" 2>/dev/null; then
  echo "gpu_smoke: $SGLANG_PYTHON cannot import sglang; install it in its own venv (pip install 'sglang[all]')" >&2
  exit 2
fi
"$SGLANG_PYTHON" -c "import sglang; print('sglang', sglang.__version__)"

export MODEL SGLANG_PYTHON SGLANG_ARGS PORT LOG
exec "$FORGE_PYTHON" - <<'EOF'
import os, shlex, sys, time

import pytest

from openforge.engine.supervisor import EngineProcess, engine_api_key
from openforge.config import SglangEngineConfig

model = os.environ["MODEL"]
config = SglangEngineConfig(model=model, sglang_python=os.environ["SGLANG_PYTHON"],
                            port=int(os.environ["PORT"]), startup_timeout_s=900,
                            sglang_args=shlex.split(os.environ["SGLANG_ARGS"]))
key = engine_api_key(config)  # SGLang gets --api-key; the suite sends it (ENGINE_API_KEY)
engine = EngineProcess(config, log_path=os.environ["LOG"], max_restarts=0, api_key=key)
started = time.monotonic()
print("gpu_smoke: launching SGLang (--incremental-streaming-output, --api-key ***)", flush=True)
engine.start()
print(f"gpu_smoke: SGLang healthy at {engine.url} after {time.monotonic() - started:.0f}s (log {engine.log_path})", flush=True)
os.environ["ENGINE_URL"] = engine.url
os.environ["ENGINE_API_KEY"] = key
if os.path.isdir(os.path.expanduser(model)):
    os.environ["ENGINE_MODEL_PATH"] = os.path.expanduser(model)
try:
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests/engine/test_engine_api.py"])
finally:
    engine.stop()
print(f"gpu_smoke: pytest exit code {int(rc)}", flush=True)
sys.exit(int(rc))
EOF
