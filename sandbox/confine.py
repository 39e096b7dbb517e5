"""A task's own processes on the host, kept to no more reach than the agent's.

    confinement = Confinement.for_sandbox(config.sandbox)     # bubblewrap, or ConfinementUnavailable
    argv, env = confinement.command(["python3", "server.py"], folder, env={"PORT": "8080"})
    subprocess.Popen(argv, env=env, cwd=folder, ...)

A task brings code forge runs beside the agent's sandbox, on the host: its stdio MCP servers
(rollouts/runner/mcp_upstream.py), its services (rollouts/tasks/services.py) and its tools' commands
(rollouts/runner/tool_server.py). The agent drives them (a tool's arguments, a request's body), so what
they can reach, the agent can ask for: run as forge's user with forge's environment, one file-reading
tool handed it /etc/shadow, the store, the task's own tests and the teacher's key (issue 43).

So each runs in a bubblewrap sandbox of its own, built as the local backend builds the agent's
(sandbox/local.py): an unprivileged user namespace as the sandbox's user with every capability dropped,
its own pid, ipc, uts and network namespaces (no network at all: a service is reached through a unix
socket, `listen`), the system dirs, this Python and node read-only with FORGE_HOME and the built-in task
set covered, a private /tmp, and its own folder (writable, at FOLDER_INSIDE) as the only host folder it
can write. Its environment is built here from nothing: PATH, LANG, HOME and TMPDIR, then what the task
declares. No key, no FORGE_* variable of forge's own, no view of the store, FORGE_HOME, the task's
tests, solution or task file.

Where the run chose `sandbox.isolation = "none"` (code the user trusts) they run as plain processes in
their folder, still with that environment. Anywhere else without a usable bubblewrap (a Docker or
Kubernetes backend on a host without it) they are refused: `ConfinementUnavailable`, an
infrastructure failure, never an unconfined run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openforge.errors import SandboxError
from openforge.sandbox.container_images import user_entries
from openforge.sandbox.local import (FORWARDER, ISOLATION_FLAGS, _hidden_in, _system_binds, bwrap_usable,
                                     runtime_mounts)

FOLDER_INSIDE = "/task"  # where a confined process sees its own folder (its cwd and HOME)
SOCKET_DIR_INSIDE = "/run/forge"  # the folder of a service's listening socket, as the process sees it
_FORWARDER_INSIDE = "/run/forge-forwarder.py"
CONFINE_FIX = ("a task's MCP servers, services and tool commands run in a bubblewrap sandbox of their own: "
               "install bubblewrap (apt-get install bubblewrap) where forge runs, or, for code you trust, "
               "sandbox.type = \"local\" with sandbox.isolation = \"none\"")


class ConfinementUnavailable(SandboxError):
    """A task's own processes cannot be confined here, and the run did not choose to run them unconfined."""


def base_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a task's process: nothing of forge's own but PATH."""
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": home,
            "TMPDIR": "/tmp", **(extra or {})}


@dataclass(frozen=True)
class Confinement:
    """How a task's own processes run on the host: in bubblewrap (`bwrap`, its path), or (None) as plain
    processes with a scrubbed environment, only where the run chose `sandbox.isolation = "none"`."""

    bwrap: str | None

    @classmethod
    def for_sandbox(cls, config: Any) -> "Confinement":
        """The confinement for a run whose agents run in `config` (a sandbox config of any backend)."""
        from openforge.sandbox.factory import isolation_check

        if isolation_check(config).name == "none":
            return cls(None)
        return cls.required()

    @classmethod
    def where_available(cls) -> "Confinement":
        """Bubblewrap where it works here, else plain processes (still with base_env): for what the user
        asked for by name (`forge harness install`), where refusing would only stop them."""
        return cls(bwrap_usable())

    @classmethod
    def required(cls) -> "Confinement":
        path = bwrap_usable()
        if path is None:
            raise ConfinementUnavailable(CONFINE_FIX)
        return cls(path)

    @property
    def confined(self) -> bool:
        return self.bwrap is not None

    def inside(self, folder: str, at: str | None = None) -> str:
        """Where the process sees `folder` (its own): `at`, else FOLDER_INSIDE."""
        return (at or FOLDER_INSIDE) if self.bwrap else folder

    @staticmethod
    def listen_socket(folder: str) -> str:
        """The host's unix socket to a service that `command(..., listen=port)` runs in `folder`."""
        return os.path.join(folder + ".run", "sock", "listen.sock")

    def command(self, argv: list[str], folder: str, *, env: Mapping[str, str] | None = None,
                listen: int | None = None, network: bool = False,
                at: str | None = None) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that run `argv` in `folder`, confined. `env` is added to base_env. `listen`:
        a service listening on 127.0.0.1:listen in its own network; the host reaches it at
        `listen_socket(folder)` (sandbox/forwarder.py --listen-socket), its only way in or out. `network`:
        the host's network instead (a harness install fetching its packages). `at`: where the process
        sees `folder` (FOLDER_INSIDE; an install its cache's own path, which the files it writes name)."""
        inside = self.inside(folder, at)
        env = base_env(inside, env)
        if self.bwrap is None:
            return list(argv), env
        run_dir = folder + ".run"  # beside the folder, out of the process's reach: passwd, group, the socket
        os.makedirs(os.path.join(run_dir, "sock"), mode=0o700, exist_ok=True)
        passwd, group = user_entries(inside)
        with open(os.path.join(run_dir, "passwd"), "w", encoding="utf-8") as f:
            f.write(f"root:x:0:0:root:/root:/bin/sh\n{passwd}nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        with open(os.path.join(run_dir, "group"), "w", encoding="utf-8") as f:
            f.write(f"root:x:0:\n{group}nogroup:x:65534:\n")
        mounts = ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *_system_binds(),
                  "--ro-bind", os.path.join(run_dir, "passwd"), "/etc/passwd",
                  "--ro-bind", os.path.join(run_dir, "group"), "/etc/group", *runtime_mounts([]),
                  "--bind", folder, inside]
        mounts += [arg for h in _hidden_in(mounts) for arg in ("--remount-ro", h)]
        inner = list(argv)
        if listen is not None:
            mounts += ["--bind", os.path.join(run_dir, "sock"), SOCKET_DIR_INSIDE,
                       "--ro-bind", str(FORWARDER), _FORWARDER_INSIDE]
            inner = [sys.executable, "-I", _FORWARDER_INSIDE, "--listen-socket", f"{SOCKET_DIR_INSIDE}/listen.sock",
                     "--to-port", str(listen), "--", *inner]
        # ISOLATION_FLAGS' --die-with-parent ties the process to the *thread* that starts it (PR_SET_PDEATHSIG):
        # start it from one that outlives it (the event loop's, an executor's worker), never a passing thread.
        flags = list(ISOLATION_FLAGS)
        if network:
            flags.remove("--unshare-net")
            mounts += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        setenv = [arg for k, v in env.items() for arg in ("--setenv", k, v)]
        return [self.bwrap, *flags, *mounts, "--clearenv", *setenv, "--chdir", inside, "--", *inner], env
