"""`python -m engine --model PATH [--host H] [--port P] ...`: the embedded engine as its own process.

This is what `EngineProcess` launches (kind = "embedded"); `forge engine` is the same for people."""

from __future__ import annotations

import argparse
import sys

from openforge.config import EngineConfig
from openforge.errors import ForgeError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="HF checkpoint folder (empty: the tiny model in FORGE_HOME)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        from engine.model import resolve_model_path

        resolve_model_path(args.model)  # a wrong path fails here, before seconds of torch imports
        from engine.embedded import serve_engine

        config = EngineConfig(model=args.model, host=args.host, port=args.port, dtype=args.dtype, device=args.device,
                              max_batch_size=args.max_batch_size, seed=args.seed)
        serve_engine(config, announce=lambda line: print(line, flush=True))
    except ForgeError as exc:
        print(f"engine: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
