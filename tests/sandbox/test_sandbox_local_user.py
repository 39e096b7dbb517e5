"""The local sandbox's user (issue 31): under bubblewrap every exec runs as uid/gid 1000 `forge`, the user the
Docker and Kubernetes sandboxes run as, never root, so programs that refuse root (VLC's main, xterm's
initgroups) run; what forge writes into the sandbox is that user's. Unisolated (`isolation = "none"`)
commands run as forge's own user: changing it takes privileges a local sandbox never uses."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from openforge.config import LocalSandboxConfig
from openforge.rollouts.runner.runner import RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.sandbox.gui import GuiSpec
from openforge.sandbox.container_images import SANDBOX_UID, SANDBOX_USER
from openforge.sandbox.local import LocalSandbox
from openforge.sandbox.testing import backend_config
from openforge.store import Store
from tests.helpers.required import skip_or_fail
from tests.helpers.runner import ShellHarness, _runner

pytestmark = pytest.mark.timeout(180)

# What VLC's main does first (vlc.c: `if (geteuid() == 0) ... "VLC is not supposed to be run as root"`).
REFUSES_ROOT = ("import os, sys\n"
                "if os.geteuid() == 0:\n"
                "    sys.exit('not supposed to be run as root. Sorry.')\n"
                "print('started as', os.geteuid())\n")


def _isolated() -> LocalSandboxConfig:
    cfg, why = backend_config("local-bwrap")
    if cfg is None:
        skip_or_fail("local-bwrap", why)  # never required: a machine without user namespaces skips
    return cfg


async def test_the_sandbox_user_is_forge_with_its_home_and_no_privileges(tmp_path: Path) -> None:
    sb = LocalSandbox(_isolated(), run_id="r", rollout_id="user", root=tmp_path)
    async with sb:
        got = await sb.exec('id -u; id -un; id -g; id -gn; id -G; echo "$HOME"; getent passwd "$(id -un)"; '
                            'grep -E "^(CapEff|NoNewPrivs)" /proc/self/status', timeout=30)
        assert got.stdout.splitlines() == [
            "1000", "forge", "1000", "forge", "1000", "/sandbox/home", "forge:x:1000:1000:forge:/sandbox/home:/bin/sh",
            "CapEff:\t0000000000000000", "NoNewPrivs:\t1"], got
        assert (SANDBOX_UID, SANDBOX_USER) == (1000, "forge")  # the containers' user (sandbox/container_images.py)
        await sb.write_file("refuses_root.py", REFUSES_ROOT.encode())
        ran = await sb.exec([sys.executable, "refuses_root.py"], timeout=30)
        assert (ran.exit_code, ran.stdout) == (0, "started as 1000\n"), ran
        # HOME, TMPDIR and the workdir are the user's; what forge writes in (setup files, their parents) too.
        writes = await sb.exec('for d in "$PWD" "$HOME" "$TMPDIR" /tmp; do echo ok > "$d/f" && cat "$d/f"; done',
                               timeout=30)
        assert (writes.exit_code, writes.stdout) == (0, "ok\n" * 4), writes
        await sb.write_file("deep/er/f.txt", b"from forge\n", mode=0o600)
        owned = await sb.exec("echo more >> deep/er/f.txt && touch deep/er/g && stat -c '%U %G' deep deep/er/f.txt "
                              "&& cat deep/er/f.txt", timeout=30)
        assert (owned.exit_code, owned.stdout) == (0, "forge forge\nforge forge\nfrom forge\nmore\n"), owned
        assert await sb.read_file("deep/er/g") == b""
        # The host's root files read as the user's (one id is mapped) and stay read-only binds.
        escape = await sb.exec("touch /usr/owned 2>&1; echo rc=$?; echo x >> /etc/passwd; echo rc=$?", timeout=30)
        assert "rc=0" not in escape.stdout and not os.path.exists("/usr/owned"), escape


async def test_an_application_that_refuses_root_shows_its_window() -> None:
    """xterm calls initgroups() for its shell: as root of a user namespace (the sandbox's user before
    issue 31) that fails and xterm exits before it maps a window; as forge it shows one."""
    missing = [n for n in ("xterm", "Xvfb", "xdotool") if shutil.which(n) is None]
    if missing:  # CI's desktop part installs xterm beside xedit (x11-apps)
        skip_or_fail("desktop", f"needs {', '.join(missing)} (apt-get install -y --no-install-recommends xterm xvfb "
                              "xdotool)")
    sb = LocalSandbox(_isolated(), run_id="r", rollout_id=f"ro-xterm-{os.getpid()}")
    async with sb:
        sb.attach_gui(GuiSpec(url=None, start="( xterm -T forge-term -e sh -c 'id -un > who.txt; sleep 60' & )"))
        got = await sb.exec("for i in $(seq 150); do xdotool search --name '^forge-term$' getwindowname && break; "
                            "sleep 0.2; done; cat who.txt", timeout=150)
    assert (got.exit_code, got.stdout) == (0, "forge-term\nforge\n"), got


async def test_unisolated_commands_run_as_forges_own_user(tmp_path: Path) -> None:
    sb = LocalSandbox(LocalSandboxConfig(isolation="none"), run_id="r", rollout_id="plain", root=tmp_path)
    async with sb:
        await sb.write_file("refuses_root.py", REFUSES_ROOT.encode())
        got = await sb.exec([sys.executable, "refuses_root.py"], timeout=30)
    if os.geteuid() == 0:  # forge as root: the program refuses, as VLC does
        assert (got.exit_code, got.stderr) == (1, "not supposed to be run as root. Sorry.\n"), got
    else:
        assert (got.exit_code, got.stdout) == (0, f"started as {os.geteuid()}\n"), got


async def test_a_rollout_edits_its_setup_files_and_the_grader_reads_them_as_forge(store: Store) -> None:
    """Through the runner: setup files (forge writes them before the agent), the agent's edits to them, and
    the verifier's own files (written after the agent is gone) are all the user's to read and write."""
    _isolated()
    run = store.create_run(kind="eval")
    harness = ShellHarness('[ "$(id -un)" = forge ] && printf "%s\\n" more >> data/list.txt && sort -o data/list.txt '
                           'data/list.txt && echo done > done.txt')
    task = TaskSpec(id="owned", instruction="add 'more' to data/list.txt, sorted", files={"data/list.txt": "zeta\n"},
                    verifier_files={".verify/check.sh": '[ "$(id -un)" = forge ] && [ -O data/list.txt ] && '
                                                        'printf "more\\nzeta\\n" | cmp - data/list.txt && '
                                                        'echo "checked by $(id -un)" && echo "score: 1"'},
                    verifier="sh .verify/check.sh || echo 'score: 0'")
    [ro] = await _runner(store, harness).run(run.id, [RolloutSpec(task, 0)])
    assert (ro.status, ro.reward, ro.exit_code) == ("scored", 1.0, 0), (ro.error, ro.stderr, ro.verifier_output)
    assert "checked by forge" in ro.verifier_output, ro.verifier_output
    [idle] = await _runner(store, ShellHarness("echo done > done.txt")).run(run.id, [RolloutSpec(task, 1)])
    assert (idle.status, idle.reward) == ("scored", 0.0), (idle.error, idle.verifier_output)
