"""`forge train --nproc N`: the same command again on N ranks under torchrun (PyTorch's elastic launcher).

    forge train --nproc 2 ...            # this process: torchrun --nproc_per_node 2 -m openforge.forge_cli.main train ...
      rank 0: forge train ...            # the whole run as in one process; trains through trainer/distributed.Group
      rank 1: forge train ...            # trainer.distributed.follow(): builds the same policy, runs what rank 0 says

On a cluster the same `python -m openforge.forge_cli.main train ...` runs under a torchrun that the Kubernetes
Job starts (deploy/k8s/trainer-job.yaml): `--nnodes`, `--node_rank` and the master address come from it.

torchrun ends every rank when one dies (max_restarts 0): the run is then continued with
`forge train --resume RUN`, from its last checkpoint, on any number of ranks (checkpoints keep the
one-process format).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Sequence

from openforge.errors import TrainerError
from openforge.ports import free_port


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets LOCAL_RANK and TORCHELASTIC_RUN_ID)."""
    return "LOCAL_RANK" in os.environ and "RANK" in os.environ


def is_follower() -> bool:
    """A rank other than 0: it trains what rank 0 announces and touches neither store nor engine."""
    return under_torchrun() and int(os.environ["RANK"]) != 0


def follow() -> None:
    from openforge.trainer.distributed import follow as run

    run()


def torchrun_args(nproc: int, argv: Sequence[str], *, port: int | None = None) -> list[str]:
    """torchrun's own arguments for `python -m openforge.forge_cli.main ARGV` on `nproc` local ranks."""
    return ["--nproc_per_node", str(nproc), "--nnodes", "1", "--max_restarts", "0", "--rdzv_backend", "static",
            "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()), "--rdzv_id", uuid.uuid4().hex[:8],
            "-m", "openforge.forge_cli.main", *argv]


def relaunch(nproc: int, argv: Sequence[str]) -> int:
    """Run `forge ARGV` on `nproc` ranks and wait. Returns rank 0's exit status when it ended the run
    itself (it has printed why); raises TrainerError naming the rank that died otherwise (torchrun's
    own report is a traceback). Ctrl-C: torchrun passes SIGINT to every rank and waits (30 s, then
    SIGKILL); rank 0 stops the run and tells the other ranks (they ignore SIGINT) to exit."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    # argv goes after the parse: argparse would take `--nproc` for an abbreviation of its own option
    config, cmd, cmd_args = config_from_args(get_args_parser().parse_args(torchrun_args(nproc, [])))
    cmd_args = [*cmd_args, *argv]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the ranks got it too; rank 0 decides
    try:
        elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
    except SignalException as exc:  # Ctrl-C or `kill`: torchrun passed it on to every rank and waited
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if rank == 0 and failure.exitcode > 0:
            return failure.exitcode  # the run failed and rank 0 said why
        how = (f"was killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
               else f"exited {failure.exitcode}")
        raise TrainerError(f"trainer rank {rank} of {nproc} {how}; every rank was stopped. "
                           "Continue the run with `forge train --resume RUN`") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0
