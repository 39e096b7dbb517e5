"""Garbage collection: find what crashed runs left (sandbox folders, stray processes, cgroups,
containers, pods) by their labels, and remove it.

A leftover belongs to a run; it is removed unless that run is *live* (the caller decides, normally:
the store says running/paused and its owner process is alive). `run_id` narrows the sweep to one run
and removes its sandboxes even if it looks live (the user asked for it).

`collect_all` sweeps local and docker here, and asks the configured backend for what it keeps off this
machine (the kubernetes backend's pods, swept by its `gc_pods`; with `kubernetes`, the default cluster's
too). It also sweeps the host-side folders a rollout
makes outside any sandbox (a task's services, its MCP tool server, a container's exposed sockets:
`owned_tempdir`), with whatever still runs in them, once the process that made them is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from openforge.config import DockerSandboxConfig, SandboxConfig
from openforge.errors import SandboxError
from openforge.sandbox.base import LABEL_HOME, LABEL_MANAGED, LABEL_RUN
from openforge.sandbox.procs import kill_tree, orphan_cgroups, remove_cgroup_dir


@dataclass
class Leftover:
    backend: str  # local | docker | kubernetes
    ident: str  # folder, container name, network name (compose services), pod name
    run_id: str
    removed: bool  # False in a dry run


def _wanted(run: str, run_id: str | None, is_live: Callable[[str], bool]) -> bool:
    return run == run_id if run_id else not is_live(run)


OWNER_SUFFIX = ".owner"  # beside an owned temp folder (not in it: a container may see the folder): who made it


def owned_tempdir(prefix: str, dir: str | Path | None = None) -> str:
    """A private temp folder (0700) that `forge gc` removes, killing what still runs in it, once the
    process that made it is gone (a crashed run leaves no service or tool server behind for good).
    Its maker removes it with `remove_owned`."""
    folder = tempfile.mkdtemp(prefix=prefix, dir=dir)
    me = psutil.Process()
    Path(folder + OWNER_SUFFIX).write_text(json.dumps({"pid": me.pid, "started": me.create_time()}))
    return folder


def remove_owned(folder: str | Path) -> None:
    """An owned temp folder and its owner record, gone."""
    shutil.rmtree(folder, ignore_errors=True)
    Path(f"{folder}{OWNER_SUFFIX}").unlink(missing_ok=True)


def _made_by_a_live_process(owner: Path) -> bool:
    try:
        made = json.loads(owner.read_text())
        return abs(psutil.Process(int(made["pid"])).create_time() - float(made["started"])) < 1.0
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):  # gone, or its pid reused since
        return False


def collect_owned_folders(*, dry_run: bool = False, root: Path | None = None) -> list[Leftover]:
    """Owned temp folders (`owned_tempdir`) whose maker is gone: the processes whose working directory
    is inside one are killed (with their process groups), then the folder is removed."""
    found: list[Leftover] = []
    base = root or Path(tempfile.gettempdir())
    for owner in sorted(base.glob(f"forge-*{OWNER_SUFFIX}")):
        folder = Path(str(owner)[:-len(OWNER_SUFFIX)])
        if _made_by_a_live_process(owner):
            continue
        if not dry_run:
            inside = str(folder.resolve()) + os.sep
            for proc in psutil.process_iter(["cwd"]):
                cwd = proc.info.get("cwd")
                if cwd and (cwd + os.sep).startswith(inside):
                    _kill_group_of(proc.pid)
            remove_owned(folder)
        found.append(Leftover("host", str(folder), "", not dry_run))
    return found


def _kill_group_of(pid: int) -> None:
    """SIGKILL a leftover and its process group (services and tool handlers start a session of their own),
    never the group gc itself runs in."""
    try:
        group = os.getpgid(pid)
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _owner_alive(meta: Path) -> bool:
    """A local sandbox whose owning process died has no one left to stop it, whatever its run says."""
    try:
        return psutil.pid_exists(int(json.loads(meta.read_text())["owner_pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def collect_local(root: Path, *, run_id: str | None, is_live: Callable[[str], bool],
                  dry_run: bool = False, run_of: Callable[[str], str | None] = lambda rollout: None,
                  ) -> list[Leftover]:
    """Local sandboxes are known by their folder's name (the rollout id, chosen by forge) and their run
    by the store (`run_of`); `sandbox.json` (host-side, outside what a sandbox can see) only for a
    rollout the store does not know. The processes killed are those of *this* folder's rollout id,
    whatever a label says: a forged label can at worst get its own sandbox removed."""
    from openforge.sandbox.local import META_FILE, SANDBOX_ENV, remove_tree

    found: list[Leftover] = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        run = run_of(d.name)
        if run is None:
            try:
                run = str(json.loads((d / META_FILE).read_text())["labels"].get(LABEL_RUN, ""))
            except (OSError, ValueError, KeyError, AttributeError):
                run = ""  # died before writing its metadata
        if not (_wanted(run, run_id, is_live) or (run_id is None and not _owner_alive(d / META_FILE))):
            continue
        if not dry_run:
            kill_tree(None, SANDBOX_ENV, d.name)
            remove_tree(d)
        found.append(Leftover("local", str(d), run, not dry_run))
    for cg in orphan_cgroups():  # machine-wide, but only those whose owner process is dead
        if not dry_run:
            remove_cgroup_dir(cg)
        found.append(Leftover("local", str(cg), "", not dry_run))
    return found


def collect_docker(config: SandboxConfig, *, home: Path, run_id: str | None, is_live: Callable[[str], bool],
                   dry_run: bool = False) -> list[Leftover]:
    """Containers labelled by this data dir (`home`): another FORGE_HOME's live runs are not ours to judge."""
    from openforge.sandbox.docker_engine import connect

    base_url = config.base_url if isinstance(config, DockerSandboxConfig) else ""
    client = connect(base_url, timeout=10)
    found: list[Leftover] = []
    try:
        filters = {"label": [f"{LABEL_MANAGED}=1", f"{LABEL_HOME}={home}"]
                   + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
        for c in client.containers.list(all=True, filters=filters):
            run = c.labels.get(LABEL_RUN, "")
            if not _wanted(run, run_id, is_live):
                continue
            if not dry_run:
                c.remove(force=True, v=True)
            found.append(Leftover("docker", c.name, run, not dry_run))
        import docker.errors

        for n in client.networks.list(filters=filters):  # a rollout's compose services' network (sandbox/compose.py)
            run = (n.attrs.get("Labels") or {}).get(LABEL_RUN, "")
            if not _wanted(run, run_id, is_live):
                continue
            removed = False
            if not dry_run:
                with contextlib.suppress(docker.errors.APIError):  # still in use: left for the next sweep
                    n.remove()
                    removed = True
            found.append(Leftover("docker", n.name, run, removed))
    finally:
        client.close()
    return found


def collect_all(config: SandboxConfig, *, home: Path, run_id: str | None, is_live: Callable[[str], bool],
                live_runs: bool, dry_run: bool = False, kubernetes: bool = False,
                run_of: Callable[[str], str | None] = lambda rollout: None,
                ) -> tuple[list[Leftover], list[str]]:
    """Sweep local and docker (and kubernetes when configured or asked for); returns what was found
    and one note per backend that could not be swept. `live_runs`: whether any run is live now."""
    from openforge.sandbox.local import sandboxes_root

    found = collect_local(sandboxes_root(home), run_id=run_id, is_live=is_live, dry_run=dry_run, run_of=run_of)
    found += collect_owned_folders(dry_run=dry_run)
    notes: list[str] = []
    try:
        found += collect_docker(config, home=home, run_id=run_id, is_live=is_live, dry_run=dry_run)
    except SandboxError as exc:
        notes.append(f"docker: skipped ({exc})")
    remote, remote_notes = config.collect_remote(also_cluster=kubernetes, home=home, run_id=run_id, is_live=is_live,
                                                 live_runs=live_runs, dry_run=dry_run)
    return found + remote, notes + remote_notes
