"""An OSWorld-format task's evaluator, run once the agent is gone: the getters in the sandbox, the metric on the host.

OSWorld's `evaluator` {func, result, expected, options, conj, postconfig} becomes `OSWorldEval`
(the importer, rollouts/tasks/osworld/importer.py, maps it). After `kill_all`:

    postconfig  shell lines run in the sandbox (OSWorld's `execute` / `command` steps after the episode); a
                step's `stdout` / `stderr` (OSWorld writes them into its cache dir) kept on the host by name
    getters     vm_file: the file read out of the sandbox (a link out, a FIFO, a folder: missing);
                vm_command_line: the command run in the sandbox, its stdout (OSWorld's /execute `output`);
                rule: the task's constants; cloud_file: the expected file, carried in the task record on
                the host (the agent can plant nothing there); cache_file: a postconfig step's kept output
    metric      OSWorld's own function (rollouts/tasks/osworld/metric.py) in a child process on the host

The reward follows `DesktopEnv.evaluate`: an `infeasible` task scores 1 when the agent's final answer is
FAIL, any other task scores 0 on FAIL; several metrics combine by `conj` (and: 0 at the first 0, else
the mean; or: 1 at the first 1, else the max). A metric that cannot be loaded or does not finish is the
machinery's failure (`OSWorldUnavailable`), never a score; a metric that raises on the agent's files is
a 0, with the error in the output.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openforge.rollouts.tasks.grading import check_relative_paths

INFEASIBLE_ANSWER = "FAIL"  # OSWorld's FAIL action: the agent says the task cannot be done
METRIC_TIMEOUT_S = 120.0
METRIC_COMMAND = [sys.executable, "-m", "openforge.rollouts.tasks.osworld.metric"]
MAX_FILE_BYTES = 64 << 20  # a result file larger than this is read as missing
# `export OSW_HOME` first: the importer maps OSWorld's /home/user and ~/ onto the sandbox's working directory.
HOME_PRELUDE = 'export OSW_HOME="$PWD"; '


class OSWorldUnavailable(Exception):
    """The evaluator could not run (its metric not importable, a metric process that hung)."""


class OSWorldGetter(BaseModel):
    """One getter of OSWorld's evaluator, as the importer mapped it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["vm_file", "vm_command_line", "rule", "cloud_file", "cache_file"]
    paths: list[str] = Field(default_factory=list, description=(
        "vm_file: paths relative to the working directory; cloud_file: names in `OSWorldEval.files`; "
        "cache_file: the name a postconfig step's output is kept under"))
    gives: list[int] = Field(default_factory=lambda: [0], description="which of `paths` reach the metric (OSWorld's `gives`)")
    command: str | None = Field(None, description="vm_command_line: the shell line run in the sandbox")
    rules: Any = Field(None, description="rule: the value handed to the metric as it is")

    @model_validator(mode="after")
    def _complete(self) -> "OSWorldGetter":
        if self.type in ("vm_file", "cloud_file", "cache_file") and not self.paths:
            raise ValueError(f"{self.type}: paths missing")
        if self.type == "vm_file":
            check_relative_paths({p: "" for p in self.paths}, "the working directory")
        if self.type == "vm_command_line" and not self.command:
            raise ValueError("vm_command_line: command missing")
        if any(not 0 <= g < len(self.paths) for g in self.gives) and self.paths:
            raise ValueError(f"gives {self.gives} outside the {len(self.paths)} path(s)")
        return self


class OSWorldCommand(BaseModel):
    """A postconfig shell line whose output OSWorld keeps in its cache dir (`stdout` / `stderr`: file names there),
    which a cache_file getter then reads: forge keeps it on the host, where the sandbox cannot write."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    line: str
    stdout: str | None = None
    stderr: str | None = None

    def kept(self) -> list[str]:
        return [name for name in (self.stdout, self.stderr) if name]


class OSWorldEval(BaseModel):
    """An OSWorld evaluator: metrics over getters, graded after the agent (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    funcs: list[str] = Field(min_length=1, description="OSWorld metric names; ['infeasible'] for an infeasible task")
    conj: Literal["and", "or"] = "and"
    result: list[OSWorldGetter] = Field(default_factory=list, description="one getter per metric")
    expected: list[OSWorldGetter | None] = Field(default_factory=list, description="one per metric, or none")
    options: list[dict[str, Any]] = Field(default_factory=list, description="one per metric: its keyword arguments")
    postconfig: list[str | OSWorldCommand] = Field(default_factory=list, description=(
        "shell lines run in the sandbox before the getters (a command: its output kept for cache_file)"))
    files: dict[str, str] = Field(default_factory=dict, description="expected files (cloud_file), name -> base64")
    source: str | None = Field(None, description="the OSWorld task this came from (domain/id)")

    @model_validator(mode="after")
    def _shape(self) -> "OSWorldEval":
        from openforge.rollouts.tasks.osworld.metric import METRIC_MODULES

        if self.infeasible:
            return self
        if unknown := [f for f in self.funcs if f not in METRIC_MODULES]:
            raise ValueError(f"metric {', '.join(unknown)} is not supported (supported: {', '.join(sorted(METRIC_MODULES))}, "
                             "infeasible alone)")
        n = len(self.funcs)
        if len(self.result) != n or len(self.options) != n or (self.expected and len(self.expected) != n):
            raise ValueError(f"{n} metric(s) need as many result getters, options (and expected getters, if any)")
        missing = {p for g in [*self.result, *self.expected] if g and g.type == "cloud_file" for p in g.paths} - set(self.files)
        if missing:
            raise ValueError(f"cloud_file: no local copy of {', '.join(sorted(missing))} in files")
        kept = {name for step in self.postconfig if isinstance(step, OSWorldCommand) for name in step.kept()}
        if unkept := {p for g in [*self.result, *self.expected] if g and g.type == "cache_file" for p in g.paths} - kept:
            raise ValueError(f"cache_file: no postconfig step keeps {', '.join(sorted(unkept))}")
        return self

    @property
    def infeasible(self) -> bool:
        return self.funcs == ["infeasible"]


ReadFile = Callable[[str, int], Awaitable[bytes | None]]
RunLine = Callable[[str], Awaitable[Any]]  # -> ExecResult


async def grade_osworld(ev: OSWorldEval, answer: str, *, read_file: ReadFile, run: RunLine) -> tuple[float, str]:
    """(reward, what the evaluator said), the agent gone. `read_file` reads the sandbox (None: missing),
    `run` runs a shell line there."""
    said_fail = answer.strip() == INFEASIBLE_ANSWER
    if ev.infeasible:
        return (1.0 if said_fail else 0.0), f"infeasible task: the answer {'was' if said_fail else 'was not'} FAIL"
    if said_fail:
        return 0.0, "the agent answered FAIL on a feasible task"
    lines: list[str] = []
    kept: dict[str, str] = {}  # a postconfig command's output, by the name OSWorld gives its cache file
    for step in ev.postconfig:
        line = step if isinstance(step, str) else step.line
        done = await run(HOME_PRELUDE + line)
        lines.append(f"postconfig exit {done.exit_code}: {line[:120]}")
        if isinstance(step, OSWorldCommand):
            kept.update({name: text for name, text in ((step.stdout, done.stdout), (step.stderr, done.stderr)) if name})
    scores: list[float] = []
    with tempfile.TemporaryDirectory(prefix="forge-osworld-") as tmp:
        for i, func in enumerate(ev.funcs):
            result = await _get(ev, ev.result[i], Path(tmp) / f"result-{i}", read_file, run, kept)
            expected = await _get(ev, ev.expected[i], Path(tmp) / f"expected-{i}", read_file, run, kept) \
                if ev.expected and ev.expected[i] is not None else None
            score, said = await _metric(func, result, expected, ev.options[i])
            lines.append(f"{func}: {said}")
            if ev.conj == "and" and score == 0.0:
                return 0.0, "\n".join(lines)
            if ev.conj == "or" and score == 1.0:
                return 1.0, "\n".join(lines)
            scores.append(score)
    reward = sum(scores) / len(scores) if ev.conj == "and" else max(scores)
    return min(max(reward, 0.0), 1.0), "\n".join(lines)


async def _get(ev: OSWorldEval, getter: OSWorldGetter, folder: Path, read_file: ReadFile, run: RunLine,
               kept: dict[str, str]) -> Any:
    if getter.type == "rule":
        return getter.rules
    if getter.type == "vm_command_line":
        assert getter.command is not None
        return (await run(HOME_PRELUDE + getter.command)).stdout
    folder.mkdir()
    out: list[str | None] = []
    for i, path in enumerate(getter.paths):
        if getter.type == "cache_file":  # OSWorld writes the output as text (open(..., "w"))
            data: bytes | None = kept[path].encode()
        elif getter.type == "cloud_file":
            data = base64.b64decode(ev.files[path])
        else:
            data = await read_file(path, MAX_FILE_BYTES)
        if i not in getter.gives:
            continue
        if data is None:  # as OSWorld's get_vm_file: a file it could not fetch reaches the metric as None
            out.append(None)
            continue
        host = folder / f"{i}-{Path(path).name}"
        host.write_bytes(data)
        out.append(str(host))
    return out[0] if len(out) == 1 else out


async def _metric(func: str, result: Any, expected: Any, options: dict[str, Any]) -> tuple[float, str]:
    job = json.dumps({"func": func, "result": result, "expected": expected, "options": options}).encode()
    proc = await asyncio.create_subprocess_exec(
        *METRIC_COMMAND, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        stdout, _ = await asyncio.wait_for(proc.communicate(job), timeout=METRIC_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise OSWorldUnavailable(f"OSWorld metric {func} ran past {METRIC_TIMEOUT_S:g}s") from None
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        said = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise OSWorldUnavailable(f"OSWorld metric {func} died (exit {proc.returncode})") from None
    if "unavailable" in said:
        raise OSWorldUnavailable(said["unavailable"])
    if "error" in said:
        return 0.0, f"0 (the metric raised on the files: {said['error']})"
    score = float(said["score"])
    if not math.isfinite(score):
        return 0.0, f"0 (the metric returned {score})"
    return score, f"{score:g}"
