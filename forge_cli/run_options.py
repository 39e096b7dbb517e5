"""Options that `forge up` and `forge train` (and `forge sft`, for --nproc) share: one declaration each, so
their names, help and defaults cannot drift apart between the commands."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Nproc = Annotated[Optional[int], typer.Option("--nproc", min=1, help="trainer processes under torchrun, "
                                              "sharded with FSDP2; one GPU each on GPUs (trainer.nproc)")]
InitFrom = Annotated[Optional[str], typer.Option("--init-from", metavar="RUN_OR_PATH", help="start the LoRA from "
                                                 "an SFT run's final adapter or a PEFT adapter folder "
                                                 "(trainer.init_from); the engine serves it from step 0")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print the plan (engines, sandboxes, trainer, tasks, "
                                      "tracking; on Kubernetes the pod manifests) and the checks that would "
                                      "fail; then each harness runs one tiny rollout under the run's settings "
                                      "(does its prompt fit?) in a scratch store; exit 1 if a check fails")]
# Unset (None) by default, not True: each torchrun rank is handed the invocation as the user wrote it.
HarnessCheck = Annotated[Optional[bool], typer.Option("--harness-check/--no-harness-check",
                                                      help="with --dry-run: run each harness once (the "
                                                      "prompt-fit check of `forge harness check`; on unless "
                                                      "--no-harness-check); off: start nothing")]
