"""Behaviour metrics of one rollout, from its transcript. Definitions (also in docs/analyze.md):

    turns              answered model calls
    tool_calls         tool calls the model made
    tool_coverage      distinct tools used / distinct tools offered (None: none offered)
    self_verified      after the last *edit* step, some *check* step (None: no edit)
    error_recovery     failed steps followed later by a successful step on the same *sub-goal* /
                       failed steps (None: no failed step)
    plan_completion    checkpoints the verifier reported reached / checkpoints the task declares
                       (None: the task declares none)
    gave_up            an answer with no tool call at all on a task that needs tools (None: the task
                       needs none, or the model was never called)
    prefix_breaks      calls whose prompt did not extend the previous call's tokens (segments - 1)
    tokens_per_turn    mean completion tokens per answered call

An *edit* step writes state: a file tool (write/edit/patch) or a shell command that writes (a `>`
redirection to a file, `tee`, `sed -i`, `cp`, `mv`, `rm`, `mkdir`, `touch`, `patch`, `git apply`).
A *check* step reads state back or runs it: a read tool, or a shell command that writes nothing
and starts with a reading or testing program (`cat`, `ls`, `grep`, `pytest`, `python FILE`, ...).
The *sub-goal* of a step is (tool, target): the file path for file tools, the program (first word
after any `cd ... &&`) for shell commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from openforge.rollouts.runner.transcript import ToolStep, Transcript, shell_command

EDIT_TOOLS = {"write_file", "write", "edit", "multiedit", "str_replace_editor", "str_replace_based_edit_tool",
              "apply_patch", "notebookedit", "create_file"}
READ_TOOLS = {"read_file", "read", "view", "grep", "glob", "ls", "list_dir", "view_image"}
CHECK_PROGRAMS = {"cat", "head", "tail", "less", "ls", "grep", "rg", "egrep", "diff", "cmp", "wc", "test", "[",
                  "stat", "find", "file", "md5sum", "sha256sum", "pytest", "python", "python3", "node", "bash",
                  "sh", "go", "cargo", "npm", "make", "ruff", "mypy", "jq"}
# A `>`/`>>` redirection to a file (not to /dev/null, not a `2>&1` fd duplication).
_REDIRECT = re.compile(r"(?<![0-9&])>>?\s*(?!&|/dev/null)[^\s|;&]+|(?:^|\s)[0-9]>>?\s*(?!&|/dev/null)[^\s|;&]+")
_WRITING = re.compile(r"(?:^|[;&|]\s*|\s)(?:tee|cp|mv|rm|mkdir|touch|patch|install|ln)\s|sed\s+-i|git\s+apply")
_PATH_KEYS = ("path", "file_path", "filename", "file", "notebook_path")


def _program(command: str) -> str:
    """The first program of a command line, after any leading `cd DIR &&` / `VAR=x`."""
    for part in re.split(r"&&|;", command):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        words = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
        if words and words[0] != "cd":
            return words[0].rsplit("/", 1)[-1]
    return ""


def is_edit(step: ToolStep) -> bool:
    if step.name.lower() in EDIT_TOOLS:
        return True
    command = shell_command(step)
    return bool(command and (_REDIRECT.search(command) or _WRITING.search(command)))


def is_check(step: ToolStep) -> bool:
    if step.name.lower() in READ_TOOLS:
        return True
    command = shell_command(step)
    return bool(command and not is_edit(step) and _program(command) in CHECK_PROGRAMS)


def sub_goal(step: ToolStep) -> tuple[str, str]:
    command = shell_command(step)
    if command is not None:
        return ("shell", _program(command))
    for key in _PATH_KEYS:
        if isinstance(step.arguments.get(key), str):
            return (step.name.lower(), step.arguments[key])
    return (step.name.lower(), "")


@dataclass
class Behaviour:
    rollout_id: str
    task_id: str
    harness: str
    step: int
    reward: float | None
    passed: bool | None
    turns: int
    tool_calls: int
    tool_coverage: float | None
    self_verified: float | None  # 1.0 / 0.0 so that means are rates
    error_recovery: float | None
    plan_completion: float | None
    gave_up: float | None
    prefix_breaks: int
    tokens_per_turn: float | None
    break_reasons: list[str] = field(default_factory=list)  # why each prefix break happened (call.break_reason)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def self_verified(steps: list[ToolStep]) -> float | None:
    edits = [i for i, s in enumerate(steps) if is_edit(s)]
    if not edits:
        return None
    return 1.0 if any(is_check(s) for s in steps[edits[-1] + 1:]) else 0.0


def error_recovery(steps: list[ToolStep]) -> float | None:
    failed = [i for i, s in enumerate(steps) if s.failed]
    if not failed:
        return None
    recovered = sum(1 for i in failed
                    if any(s.failed is False and sub_goal(s) == sub_goal(steps[i]) for s in steps[i + 1:]))
    return recovered / len(failed)


def tool_coverage(steps: list[ToolStep], offered: list[str]) -> float | None:
    if not offered:
        return None
    offered_set = set(offered)
    return len({s.name for s in steps} & offered_set) / len(offered_set)


_CHECKPOINT = re.compile(r"^\s*checkpoint\s+(?P<name>[A-Za-z0-9._-]+)\s*:\s*(?P<state>ok|pass|fail)\s*$",
                         re.IGNORECASE | re.MULTILINE)


def checkpoints_reached(verifier_output: str | None) -> set[str]:
    """Checkpoint names the verifier reported as reached: lines `checkpoint NAME: ok` (or `pass`)."""
    return {m["name"] for m in _CHECKPOINT.finditer(verifier_output or "") if m["state"].lower() in ("ok", "pass")}


def plan_completion(declared: list[str], verifier_output: str | None) -> float | None:
    if not declared:
        return None
    return len(set(declared) & checkpoints_reached(verifier_output)) / len(set(declared))


def requires_tools(task: dict[str, Any]) -> bool:
    """A task needs tools when it says so (`requires_tools`), else when it gives the agent files to work on."""
    flag = task.get("requires_tools")
    return bool(task.get("files") or task.get("binary_files")) if flag is None else bool(flag)


def behaviour_of(rollout: Any, transcript: Transcript, task: dict[str, Any]) -> Behaviour:
    """The metrics of one rollout. `task` is the task's record as stored (`{}` when unknown)."""
    steps = transcript.steps
    reward = rollout.reward
    threshold = float(task.get("pass_threshold", 1.0))
    needs_tools = requires_tools(task)
    return Behaviour(
        rollout_id=rollout.id, task_id=rollout.task_id, harness=rollout.harness, step=rollout.step,
        reward=reward, passed=None if reward is None else reward >= threshold,
        turns=transcript.turns, tool_calls=len(steps),
        tool_coverage=tool_coverage(steps, transcript.tools_offered),
        self_verified=self_verified(steps),
        error_recovery=error_recovery(steps),
        plan_completion=plan_completion(list(task.get("checkpoints") or []), rollout.verifier_output),
        gave_up=(0.0 if steps else 1.0) if needs_tools and transcript.turns > 0 else None,
        prefix_breaks=max(0, (rollout.n_segments or 1) - 1) if rollout.n_segments else len(transcript.break_reasons),
        tokens_per_turn=fmean(transcript.completion_tokens) if transcript.completion_tokens else None,
        break_reasons=list(transcript.break_reasons),
    )
