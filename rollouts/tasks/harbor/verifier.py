"""A Harbor task's verifier, run after the agent is gone: its tests copied in, test.sh run, the reward read.

Harbor (harbor-framework/harbor, `harbor/verifier/verifier.py`) uploads the task's tests/ to /tests
after the agent phase, removes stale reward files, runs /tests/test.sh, and reads
/logs/verifier/reward.json (a JSON object whose "reward" key is the trial's reward, or one number),
else /logs/verifier/reward.txt (one number). Here:

- The runner calls `run_harbor_tests` only after `kill_all`: nothing the agent started can still
  run, so nothing can rewrite the tests or the reward while they run.
- The tests and the reward folder go into the sandbox's grader folder, emptied for each grading
  (`Sandbox.grader_folder`: `<it>/tests`, `<it>/logs/verifier`), as Harbor's live in /tests and /logs,
  out of the agent's tree: outside its working directory, HOME and TMPDIR and under no folder it could
  write, so it cannot have planted a reward file, a link, or a conftest.py or pytest.ini beside or above
  the tests (pytest's rootdir would be the agent's, and its conftest.py loaded: issue 43). The fixed paths
  of the task's files (/tests, /logs, the Dockerfile's WORKDIR) are rewritten to that folder and to the
  sandbox's working directory (a local sandbox has no /tests, /logs or /app of its own).
- The reward file is read by forge on the host (`read_file`: a regular file, at most 64 KiB), never
  from test.sh's output. It must be one finite number in [0, 1].

Endings: a reward file that parses is the reward. When test.sh ran to its end without one (or with
one that does not parse) the reward is 0.0, with a note. When the verifier could not run (its files
could not be written, test.sh or a command it needs could not be started: exit 126/127, or it was
killed by a signal) it raises `VerifierUnavailable`: an infrastructure failure, never a reward.
A test.sh that runs past its timeout scores 0.0 (the agent's code can hang the tests) and its reward
file is not read.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from openforge.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxFileNotFound, SandboxPathRefused

REWARD_MAX_BYTES = 64 * 1024
# Harbor's fixed paths inside its environments (harbor/models/trial/paths.py EnvironmentPaths); /solution
# is uploaded by its oracle agent alone (harbor/agents/oracle.py), forge's reference run (selfcheck.py).
TESTS_DIR, LOGS_DIR, SOLUTION_DIR = "/tests", "/logs", "/solution"
_EXIT_CANNOT_RUN = (126, 127)  # the shell could not execute test.sh, or a command it names

Exec = Callable[[str, float, dict[str, str]], Awaitable[ExecResult]]


class VerifierUnavailable(Exception):
    """The verifier itself could not run: an infrastructure failure of the rollout, not a reward."""


class HarborTests(BaseModel):
    """What a Harbor task's verifier needs; kept on the task (its harbor payload, `tests`), never shown to the agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: dict[str, str] = Field(description="tests/ of the task: path relative to tests/ -> content")
    script: str = Field("test.sh", description="the script under tests/ that writes the reward")
    timeout_s: float = Field(600.0, gt=0, description="[verifier] timeout_sec")
    env: dict[str, str] = Field(default_factory=dict, description="[verifier] env")
    workdir: str = Field("/app", description="the environment's WORKDIR, mapped to the sandbox's working directory")


def rewrite_paths(text: str, mapping: dict[str, str]) -> str:
    """`text` with each absolute path root of `mapping` (/tests, /app) replaced where it starts a path:
    `/app/x`, `cd /app`, `"/tests"` are; `/application` and `a/app` are not."""
    if not mapping:
        return text
    roots = "|".join(re.escape(r) for r in sorted(mapping, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.~/$-])({roots})(?=$|[^\w.-])", re.M)
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def parse_reward(name: str, data: bytes) -> tuple[float, str | None]:
    """(reward, None) from a reward file's bytes, or (0.0, why) when it does not hold one in [0, 1]."""
    try:
        text = data.decode("utf-8").strip()
        value = json.loads(text) if name.endswith(".json") else float(text)
    except (UnicodeDecodeError, ValueError):
        return 0.0, f"{name} does not hold a number: {data[:80]!r}"
    if isinstance(value, dict):
        if "reward" not in value:
            return 0.0, f"{name} has no \"reward\" key: {sorted(value)[:5]}"
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0, f"{name}'s reward is not a number: {str(value)[:80]!r}"
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return 0.0, f"{name}'s reward {value!r} is outside [0, 1]"
    return float(value), None


async def run_harbor_tests(sb: Sandbox, tests: HarborTests, run: Exec, env: dict[str, str]
                           ) -> tuple[float, str, str | None]:
    """(reward, verifier output, a note when no usable reward came). `run(command, timeout, env)`
    execs in the sandbox's working directory; `env` is the verifier's fresh HOME and the like."""
    workdir = sb.info.workdir.rstrip("/")
    try:
        root = (await sb.grader_folder()).rstrip("/")
    except SandboxError as exc:
        raise VerifierUnavailable(f"cannot make the verifier's folder: {exc}") from None
    mapping = {TESTS_DIR: f"{root}/tests", LOGS_DIR: f"{root}/logs"}
    if tests.workdir.rstrip("/") not in ("", workdir):
        mapping[tests.workdir.rstrip("/")] = workdir
    script = f"{root}/tests/{tests.script}"
    try:
        made = await run(f"mkdir -p {shlex.quote(root)}/logs/verifier {shlex.quote(root)}/logs/agent", 30.0, env)
        if made.exit_code != 0:
            raise VerifierUnavailable(f"cannot make the verifier's folders: {made.stderr.strip()[:300]}")
        for path, content in tests.files.items():
            await sb.write_file(f"{root}/tests/{path}", rewrite_paths(content, mapping).encode("utf-8"),
                                mode=0o755 if path == tests.script else 0o644)
    except SandboxError as exc:
        raise VerifierUnavailable(f"cannot copy the task's tests into the sandbox: {exc}") from None
    verifier_env = {**{k: rewrite_paths(v, mapping) for k, v in tests.env.items()}, **env}
    done = await run(f"exec {shlex.quote(script)}", tests.timeout_s, verifier_env)
    output = f"test.sh: exit code {done.exit_code}\n{done.stdout}" + (f"\n[stderr]\n{done.stderr}" if done.stderr else "")
    if done.timed_out:
        return 0.0, output, f"test.sh ran past its timeout of {tests.timeout_s:g}s"
    for name in ("reward.json", "reward.txt"):  # Harbor's order: the JSON file wins
        try:
            data = await sb.read_file(f"{root}/logs/verifier/{name}", max_bytes=REWARD_MAX_BYTES + 1)
        except SandboxFileNotFound:
            continue
        except SandboxPathRefused as exc:
            return 0.0, output, f"{name} is not a regular file: {exc}"
        except SandboxError as exc:
            raise VerifierUnavailable(f"cannot read {name}: {exc}") from None
        if len(data) > REWARD_MAX_BYTES:
            return 0.0, output, f"{name} is larger than {REWARD_MAX_BYTES} bytes"
        reward, note = parse_reward(name, data)
        return reward, output + f"\n{name}: {data[:200].decode('utf-8', 'replace').strip()}", note
    if done.exit_code in _EXIT_CANNOT_RUN or done.exit_code > 128:
        raise VerifierUnavailable(f"test.sh could not run to its end (exit {done.exit_code}) and wrote no "
                                  f"reward: {(done.stderr or done.stdout).strip()[-300:]}")
    return 0.0, output, f"test.sh exited {done.exit_code} without writing /logs/verifier/reward.txt or reward.json"
