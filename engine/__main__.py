"""`python -m openforge.engine --model PATH [--host H] [--port P] ...`: the embedded engine as its own process.

This is what `EngineProcess` launches (kind = "embedded"); `forge engine` is the same for people.
The API key, if any, is read from FORGE_ENGINE_API_KEY (and removed from the environment)."""

from __future__ import annotations

import argparse
import os
import sys

from openforge.config import EmbeddedEngineConfig
from openforge.errors import ForgeError


def exit_with_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Watch the supervising process: once it is gone (even by SIGKILL, which runs no cleanup of its
    own) this engine is reparented, and it stops itself with SIGTERM like a normal shutdown."""
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        os._exit(1)  # the graceful path did not finish in time

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openforge.engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="HF checkpoint folder (empty: the tiny model in FORGE_HOME)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix-cache-mb", type=int, default=512, help="memory for cached prompt-prefix KV (0 = off)")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="exit when this process dies (EngineProcess passes its own pid: no orphaned engines)")
    args = p.parse_args(argv)
    if args.parent_pid:
        exit_with_parent(args.parent_pid)
    try:
        from openforge.engine.model import resolve_model_path

        resolve_model_path(args.model)  # a wrong path fails here, before seconds of torch imports
        from openforge.engine.embedded import serve_engine

        from openforge.engine.sglang_api import API_KEY_ENV

        # The key comes in the environment, not argv (any local user can read a process's argv).
        api_key = os.environ.pop(API_KEY_ENV, "")
        config = EmbeddedEngineConfig(model=args.model, host=args.host, port=args.port, dtype=args.dtype,
                                      device=args.device, max_batch_size=args.max_batch_size, seed=args.seed,
                                      api_key=api_key, prefix_cache_mb=args.prefix_cache_mb)
        serve_engine(config, announce=lambda line: print(line, flush=True))
    except ForgeError as exc:
        print(f"engine: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
