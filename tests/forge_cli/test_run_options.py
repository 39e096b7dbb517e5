"""forge_cli/run_options.py: the options `forge up`, `forge train` and `forge sft` share are one declaration, so
each command shows the same name, help and default."""

from __future__ import annotations

import typer.main

from openforge.forge_cli import run_options
from openforge.forge_cli.main import app

SHARED = {"--nproc": run_options.Nproc, "--init-from": run_options.InitFrom, "--dry-run": run_options.DryRun,
          "--harness-check": run_options.HarnessCheck}


def _params(command: str) -> dict[str, object]:
    cli = typer.main.get_command(app)
    return {opt: p for p in cli.commands[command].params for opt in p.opts}


def test_up_and_train_take_each_shared_option_as_declared() -> None:
    up, train, sft = _params("up"), _params("train"), _params("sft")
    for opt, annotated in SHARED.items():
        declared = annotated.__metadata__[0]
        assert opt in str(declared.default)  # typer keeps the declared flag there
        assert up[opt].help == train[opt].help == declared.help, opt
        assert up[opt].default == train[opt].default, opt
    assert up["--harness-check"].default is None  # unset: each torchrun rank gets the invocation as written
    assert sft["--nproc"].help == up["--nproc"].help and "--init-from" not in sft
