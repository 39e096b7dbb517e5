"""GSM8K-style question files as forge tasks: `forge tasks import gsm8k test.jsonl --out gsm8k.jsonl`.

A source line is one JSON object, as GSM8K's own files are:

    {"question": "Natalia sold 48 clips in April, and half as many in May. How many in all?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\\nIn all 48+24 = <<48+24=72>>72 clips.\\n#### 72"}

Each becomes a forge task that asks the question and wants the final number alone:

    {"id": "gsm8k-00001", "instruction": "...How many in all?\\n\\nReply with the final answer: one number in digits ...",
     "expect_answer": {"number": 72}, "tags": ["gsm8k"], "solution": "... 72 > .forge/answer.txt"}

The reward is the runner's exact number check (rollouts/tasks/grading.py): the whole reply is that number
("72", "72.0", "+72", "**72**"); a reply that holds it among other words or numbers ("48 + 24 = 72",
"The answer is 72") scores 0. The reasoning after the question in `answer` is never shown to the agent.
A line without a question, without a `#### N` final line, or whose N is not one plain number (or is too
large to compare exactly) is refused with its line number: nothing is guessed.

The imported tasks are plain exact-answer tasks, so this family claims no loaded task (`claims` is false):
it contributes its importer alone, and the runner grades its tasks as any task with `expect_answer`.
"""

from __future__ import annotations

import json
import re
import shlex
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from openforge.errors import TaskError
from openforge.rollouts.harnesses.agent_files import ANSWER_FILE
from openforge.rollouts.tasks.importing import ImportResult, write_jsonl
from openforge.rollouts.tasks.kinds import TaskKindBase

ASK = "Reply with the final answer: one number in digits (no commas, no units), nothing else."
TIME_LIMIT_S = 120.0
# GSM8K's final line: "#### 72", "#### -3", "#### 1,600", "#### 0.5"; nothing else may follow the number.
_FINAL = re.compile(r"^####\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*$")
_EXACT_LIMIT = 2 ** 53  # past it a float (ExpectedAnswer.number) no longer holds every integer exactly


def final_number(answer: str) -> Decimal:
    """The number of the `#### N` line that ends a GSM8K answer. ValueError (a reason) when there is none,
    or it is not one plain decimal number, or it cannot be compared exactly."""
    lines = [ln.strip() for ln in answer.strip().splitlines() if ln.strip()]
    match = _FINAL.match(lines[-1]) if lines else None
    if match is None:
        raise ValueError("answer: no final '#### N' line with one number")
    try:
        number = Decimal(match.group(1).replace(",", ""))
    except InvalidOperation:
        raise ValueError(f"answer: {match.group(1)!r} is not a number") from None
    if abs(number) >= _EXACT_LIMIT or Decimal(repr(float(number))) != number:
        raise ValueError(f"answer: {match.group(1)} cannot be checked exactly as a number")
    return number


def convert(line: dict[str, Any], task_id: str) -> dict[str, Any]:
    """One GSM8K line as a forge task record. ValueError (a reason) for a line that cannot be one."""
    question, answer = line.get("question"), line.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: missing or not text")
    if not isinstance(answer, str):
        raise ValueError("answer: missing or not text")
    number = final_number(answer)
    said = format(number.normalize(), "f")  # "72", "0.5", "-3": what the reference solution answers
    return {"id": task_id, "instruction": f"{question.strip()}\n\n{ASK}", "expect_answer": {"number": float(number)},
            "time_limit_s": TIME_LIMIT_S, "tags": ["gsm8k"],
            "solution": f"mkdir -p .forge && printf '%s\\n' {shlex.quote(said)} > {ANSWER_FILE}"}


def import_gsm8k(src: str | Path, *, prefix: str = "gsm8k") -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(task records, [(where, why) refused]) of a GSM8K-style JSONL file; a task's id is its line number."""
    path = Path(src).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{src}: cannot read: {exc}") from None
    tasks, refused = [], []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        task_id = f"{prefix}-{n:05d}"
        try:
            line = json.loads(raw)
            if not isinstance(line, dict):
                raise ValueError(f"a JSON {type(line).__name__}, not an object")
            tasks.append(convert(line, task_id))
        except json.JSONDecodeError as exc:
            refused.append((f"{path}:{n}", f"bad JSON: {exc.msg} (column {exc.colno})"))
        except ValueError as exc:
            refused.append((f"{path}:{n}", str(exc)))
    return tasks, refused


class Gsm8kKind(TaskKindBase):
    """The family's importer; its tasks, once imported, are plain exact-answer tasks (module docstring)."""

    name = "gsm8k"
    import_formats = ("gsm8k",)
    import_help = "a GSM8K-style JSONL file: {\"question\": ..., \"answer\": \"... #### 42\"} a line"
    import_out = "a .jsonl file"

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """Write the converted tasks to `out` (default gsm8k-tasks.jsonl), one a line."""
        tasks, refused = import_gsm8k(src)
        written = write_jsonl(tasks, out or "gsm8k-tasks.jsonl") if tasks else Path(out or "gsm8k-tasks.jsonl")
        return ImportResult(tasks=tasks, written_to=str(written), refused=refused,
                            summary=f"{src}: {len(tasks) + len(refused)} question(s): {len(tasks)} imported to "
                                    f"{written}, {len(refused)} refused")
