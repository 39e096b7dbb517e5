"""ClawEval's own graders on the public set (rollouts/tasks/claweval/grading.py): do they run on forge's trace?

`CLAWEVAL_SRC=path/to/claw-eval python -m bench claweval_grading`: imports the checkout, then runs every
imported task's tasks/<id>/grader.py (with the checkout's claw_eval package, in its own child process)
on the trace forge writes for an agent that answered without calling a tool: the instruction, one
answer, no dispatches, no audit. Every one of them asks a judge: a scripted OpenAI-compatible judge on
loopback answers each call {"score": 0.0}. Reports how many graders ran, which failed and why, their
wall time, and the ClawEval task scores of that idle answer (none may pass 0.75). The same graders run
again with a judge that answers every call {"score": 1.0}: the task score, an imported task's reward
since issue 44, of an agent that did nothing under the most lenient judge (forge's judge-only reward gave
it 1.0). And the import's counts:
the unsupported tasks by reason, those with sandbox files, and those with a binary sandbox file (written
byte-exact since rollouts/tasks/setup_files.py) with what else keeps them out.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

IDLE_ANSWER = "I could not complete this task."


class _ScriptedJudge(BaseHTTPRequestHandler):
    score = 0.0  # every reply's score

    def content(self) -> str:
        """The reply's text: ClawEval's LLMJudge reads a JSON object's "score"."""
        return json.dumps({"score": self.score, "reasoning": "scripted judge"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        reply = {"id": "judge", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", ""),
                 "choices": [{"index": 0, "finish_reason": "stop", "message": {
                     "role": "assistant", "content": self.content()}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


# The reasons the importer gives (rollouts/tasks/claweval/importer.py), by kind; a task counts under each of its own.
_KINDS = {"sandbox file missing": " is missing",
          "sandbox file outside the task folder": " is outside the task folder",
          "container steps (commands, grader files, host files, snapshot globs)": (
              "env_snapshot_commands", "sandbox_grader_files", "local_grader_files", "env_snapshot_files"),
          "no mock services": "no mock services", "scoring or safety checks forge does not run": (
              "scoring check", "safety check", "no grader forge can run", "no scoring component"),
          "attachments": "attachments", "simulated user": "user_agent"}


def _has_binary_file(task_dir: Path) -> bool:
    """Whether a task names a sandbox file the checkout holds that is not UTF-8 text (rollouts/tasks/claweval/importer.py)."""
    import yaml

    t = yaml.safe_load((task_dir / "task.yaml").read_text(encoding="utf-8")) or {}
    for name in t.get("sandbox_files") or (t.get("environment") or {}).get("fixtures") or []:
        path = task_dir / str(name).removeprefix("/workspace/").removeprefix("./")
        if path.is_file():
            try:
                path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                return True
    return False


def _refusals(src: str, unsupported: list[tuple[str, str]]) -> dict[str, Any]:
    """The unsupported tasks by reason kind, and how many of those with sandbox files each kind blocks."""
    import yaml

    def kinds(why: str) -> set[str]:
        return {k for k, marks in _KINDS.items() for m in ((marks,) if isinstance(marks, str) else marks) if m in why}

    root = next(r for r in (Path(src), Path(src).parent) if (r / "tasks").is_dir())
    with_files = {tid for tid, _ in unsupported if (yaml.safe_load((root / "tasks" / tid / "task.yaml").read_text(
        encoding="utf-8")) or {}).get("sandbox_files")} if (root / "tasks").is_dir() else set()
    by_kind: dict[str, int] = {}
    files_by_kind: dict[str, int] = {}
    for tid, why in unsupported:
        for kind in kinds(why) or {"other"}:
            by_kind[kind] = by_kind.get(kind, 0) + 1
            files_by_kind[kind] = files_by_kind.get(kind, 0) + (tid in with_files)
    left = sum(1 for tid, why in unsupported if tid in with_files and not kinds(why) - {"scoring or safety checks forge "
                                                                                      "does not run"})
    binary = {tid: why for tid, why in unsupported if _has_binary_file(root / "tasks" / tid)}
    binary_by_kind: dict[str, int] = {}
    for why in binary.values():  # what still keeps out a task whose binary sandbox files are written now
        for kind in kinds(why) or {"other"}:
            binary_by_kind[kind] = binary_by_kind.get(kind, 0) + 1
    return {"unsupported": len(unsupported), "unsupported_by_reason": dict(sorted(by_kind.items())),
            "unsupported_with_sandbox_files": len(with_files),
            "sandbox_file_tasks_by_reason": dict(sorted(files_by_kind.items())),
            "unsupported_with_binary_sandbox_files": len(binary),
            "binary_sandbox_file_tasks_by_reason": dict(sorted(binary_by_kind.items())),
            "sandbox_file_tasks_refused_only_for_checks": left}


def run(quick: bool = False) -> dict[str, Any]:
    from openforge.rollouts.tasks.claweval.importer import import_claweval
    from openforge.rollouts.tasks.claweval.payload import ClawEvalPayload
    from openforge.rollouts.tasks.claweval.grading import ClawEvalGradingFailed, run_grader
    from openforge.rollouts.tasks.format import TaskSpec

    src = os.environ.get("CLAWEVAL_SRC")
    if not src:
        print("CLAWEVAL_SRC is not set: nothing to measure")
        return {}
    report = import_claweval(src)
    tasks = [TaskSpec.model_validate(t) for t in report.tasks]
    graded = [t for t in tasks if t.payload(ClawEvalPayload) is not None][: 5 if quick else None]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lenient = ThreadingHTTPServer(("127.0.0.1", 0), type("Always1", (_ScriptedJudge,), {"score": 1.0}))
    threading.Thread(target=lenient.serve_forever, daemon=True).start()
    judge = {"url": f"http://127.0.0.1:{server.server_address[1]}/v1", "model": "scripted", "key": ""}

    def grade(task: TaskSpec, judge: dict[str, str] = judge) -> tuple[str, float, dict[str, Any] | str]:
        payload = task.payload(ClawEvalPayload)
        assert payload is not None
        messages = [{"role": "user", "content": [{"type": "text", "text": task.instruction}]},
                    {"role": "assistant", "content": [{"type": "text", "text": IDLE_ANSWER}]}]
        t0 = time.perf_counter()
        try:
            verdict = run_grader(payload.grading, trace_id=f"{task.id}-idle", model="bench", messages=messages,
                                 dispatches=[], audits={}, timeout_s=300.0, judge=judge)
        except ClawEvalGradingFailed as exc:
            return task.id, time.perf_counter() - t0, str(exc)
        return task.id, time.perf_counter() - t0, verdict

    always_1 = {**judge, "url": f"http://127.0.0.1:{lenient.server_address[1]}/v1"}
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            done = list(pool.map(grade, graded))
            done_1 = list(pool.map(lambda t: grade(t, always_1), graded))
    finally:
        for s in (server, lenient):
            s.shutdown()
            s.server_close()
    scores_1 = [v["task_score"] for _, _, v in done_1 if not isinstance(v, str)]
    failures = {tid: v for tid, _, v in done if isinstance(v, str)}
    verdicts = {tid: v for tid, _, v in done if not isinstance(v, str)}
    for tid, why in failures.items():
        print(f"  grader failed: {tid}: {why[:200]}")
    scores = [v["task_score"] for v in verdicts.values()]
    result = {"imported": len(tasks), "online_only": len(report.online_only),
              "with_grader": len(graded), "graded": len(verdicts), "failed": len(failures),
              "failures": {k: v[:300] for k, v in failures.items()},
              "grader_median_s": round(statistics.median(s for _, s, _ in done), 2) if done else None,
              "grader_max_s": round(max(s for _, s, _ in done), 2) if done else None,
              "idle_task_score_max": max(scores) if scores else None,
              "idle_task_score_mean": round(statistics.mean(scores), 4) if scores else None,
              "idle_passed": sum(v["passed"] for v in verdicts.values()),
              "judge_calls": sum(v["judge_calls"] for v in verdicts.values()),
              "idle_always_1_judge_graded": len(scores_1),
              "idle_always_1_judge_task_score_min": min(scores_1) if scores_1 else None,
              "idle_always_1_judge_task_score_mean": round(statistics.mean(scores_1), 4) if scores_1 else None,
              "idle_always_1_judge_task_score_max": max(scores_1) if scores_1 else None,
              "idle_always_1_judge_passed": sum(s >= 0.75 for s in scores_1),
              "with_sandbox_files": sum(bool(t.files or t.binary_files) for t in tasks),
              "with_binary_sandbox_files": sum(bool(t.binary_files) for t in tasks),
              **_refusals(src, report.unsupported)}
    print(f"claweval graders: {result['graded']} of {result['with_grader']} ran on forge's trace of an idle answer "
          f"({result['failed']} failed); median {result['grader_median_s']} s each; idle task score mean "
          f"{result['idle_task_score_mean']}, max {result['idle_task_score_max']}, {result['idle_passed']} passed; "
          f"with a judge that always says 1: mean {result['idle_always_1_judge_task_score_mean']}, max "
          f"{result['idle_always_1_judge_task_score_max']}, {result['idle_always_1_judge_passed']} passed")
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
