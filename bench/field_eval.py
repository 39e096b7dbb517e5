"""`forge eval` on each imported field set, through mini and a real harness on the tiny model: does every
rollout end as the policy's outcome, never an infrastructure failure?

On request (`python -m bench field_eval`; Docker at DOCKER_HOST, the npm harnesses in FORGE_NPM_CACHE).
The sets come from the variables the import benches read: CLAWEVAL_SRC (a claw-eval checkout),
HARBOR_SRC (a folder of Harbor task folders, run in Docker: a built task runs in its own image, so every
Dockerfile base is mapped, as bench/harbor_import.py maps it, to HARBOR_MAP_TO, default the Claude Code
sandbox image `forge sandbox build-image --harness claude-code --no-latest` builds, python3 and the openai
SDK for mini included; the tasks without an image run in it too), OSWORLD_SRC (an OSWorld checkout); a
set whose variable is unset is left out, as is one FIELD_EVAL_SETS (comma-separated) does not name.
FIELD_EVAL_LABELS may name each source in the results (a JSON object, set -> label).

Each set is imported with `forge tasks import FORMAT SRC --out DIR`; its slice is SLICE_TASKS task ids
spread evenly over the sorted ids of those that run here (for OSWorld: not those needing a desktop
application or root), each run SAMPLES times by `forge eval --task ...` once per harness, as a user
runs it, in one fresh FORGE_HOME
(the tiny model, or for mini-gui / browser-use the tiny Qwen2-VL model, built there once). A ClawEval
task asks a judge (its rubric and its grader.py's LLMJudge): the tiny model's random weights give no
verdict (a judge failure, infra by design: docs/tasks.md), so `[judge]` points at a scripted
OpenAI-compatible judge on loopback that gives every answer score 0 (bench/claweval_grading.py's).
Per set and harness: rollouts, scored (an answer graded), policy failures (the policy's own failure or
timeout, scored 0), infrastructure failures (harness or infra, masked) with their reasons, and the wall
time per rollout (median, max), read from the store the eval wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.claweval_grading import _ScriptedJudge

SLICE_TASKS = 3
SAMPLES = 1
EVAL_TIMEOUT_S = 1800
# set -> (source variable, import format, [(harness, sandbox backend)]). The imported OSWorld-format tasks
# are done with a shell (forge has no desktop yet: a display only around a builtin-web site), so the shell
# harnesses run them beside the GUI ones, whose outcome there is measured too.
SETS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "claweval": ("CLAWEVAL_SRC", "claweval", [("mini", "local"), ("claude-code", "local")]),
    "harbor": ("HARBOR_SRC", "harbor", [("mini", "docker"), ("claude-code", "docker")]),
    "osworld": ("OSWORLD_SRC", "osworld", [("mini", "local"), ("claude-code", "local"), ("mini-gui", "local"),
                                           ("browser-use", "local")]),
}


class _FieldJudge(_ScriptedJudge):
    """Score 0 to every answer, in both judges' formats: ClawEval's LLMJudge reads the JSON object, forge's
    judge component (rollouts/tasks/judge.py) the last line."""

    def content(self) -> str:
        # forge's parser counts every line that opens with "score" as a verdict line: the JSON's first key
        # is another, and the one SCORE line is the last.
        return json.dumps({"reasoning": "scripted judge", "score": self.score}) + f"\nSCORE: {self.score:g}"


def _forge(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    forge = Path(sys.executable).with_name("forge")  # the venv's `forge`, as a user runs it
    cmd = [str(forge) if forge.exists() else "forge", "--home", str(home), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _harness_image(home: Path) -> str:
    """The Docker sandbox image with Claude Code in it (built once, found by its hash after), not tagged latest."""
    done = _forge(home, "sandbox", "build-image", "--harness", "claude-code", "--no-latest", timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"forge sandbox build-image --harness claude-code: {done.stderr[-500:]}")
    return done.stdout.split()[0]


def _import(home: Path, name: str, fmt: str, src: str, out: Path, image: str) -> list[str]:
    """`forge tasks import` of `src` into `out`; the task ids of the slice."""
    args = ["tasks", "import", fmt, src, "--out", str(out)]
    if fmt == "harbor":  # as bench/harbor_import.py: builds are offline, every base mapped to a local image
        local = os.environ.get("HARBOR_MAP_TO") or image
        froms = sorted({line.split()[1] for p in Path(src).glob("*/environment/Dockerfile")
                        for line in p.read_text("utf-8", "replace").splitlines()
                        if line.upper().startswith("FROM ") and len(line.split()) > 1})
        args += [x for base in froms for x in ("--base", f"{base}={local}")]
    done = _forge(home, *args, timeout=1800)
    print(f"  {name}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]}")
    ids = sorted(p.name for p in out.iterdir() if p.is_dir())
    if fmt == "osworld":
        from openforge.rollouts.tasks.osworld.importer import import_osworld

        not_here = {tid for tid, _ in import_osworld(src).not_here}
        ids = [i for i in ids if i not in not_here]
    return [ids[i * len(ids) // SLICE_TASKS] for i in range(min(SLICE_TASKS, len(ids)))]  # spread over the set


def _eval(home: Path, tasks: Path, ids: list[str], harness: str, sandbox: str, judge_url: str,
          image: str) -> dict[str, Any]:
    from openforge.rollouts.runner.failures import is_infra_failure
    from openforge.store import Store

    name = f"field-{tasks.name}-{harness}"
    docker = ["--set", "sandbox.type=docker", "--set", f"sandbox.image={image}"] if sandbox == "docker" else []
    args = ["--set", f"judge.url={judge_url}", "--set", "judge.model=scripted", *docker, "eval", "--tasks", str(tasks),
            *[x for i in ids for x in ("--task", i)], "-k", str(SAMPLES), "--harness", harness, "--sandbox", sandbox,
            "--concurrency", "2", "--name", name]
    t0 = time.perf_counter()
    try:
        done = _forge(home, *args, timeout=EVAL_TIMEOUT_S)
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        tail = [f"forge eval ran past {EVAL_TIMEOUT_S} s"]
    wall = time.perf_counter() - t0
    store = Store(home / "forge.db")
    try:
        runs = [r for r in store.list_runs(limit=200) if r.name == name]
        rollouts = store.list_rollouts(runs[0].id) if runs else []
        summary = (runs[0].summary_json or {}) if runs else {}
    finally:
        store.close()
    records = [home / "runs" / r.run_id / "tools" / f"{r.id}.jsonl" for r in rollouts]  # the host's dispatch records
    infra = [r for r in rollouts if is_infra_failure(r)]
    policy = [r for r in rollouts if r.status != "scored" and not is_infra_failure(r)]
    walls = [(r.ended_at - r.started_at).total_seconds() for r in rollouts if r.started_at and r.ended_at]
    row = {"harness": harness, "sandbox": sandbox, "tasks": len(ids), "rollouts": len(rollouts),
           "scored": sum(r.status == "scored" for r in rollouts), "policy failures": len(policy),
           "infra failures": len(infra), "model calls": sum(r.n_calls for r in rollouts),
           "tool dispatches": sum(len(p.read_text().splitlines()) for p in records if p.exists()),
           "mean reward": round(statistics.mean(r.reward or 0.0 for r in rollouts), 3) if rollouts else None,
           "s per rollout (median)": round(statistics.median(walls), 1) if walls else None,
           "s per rollout (max)": round(max(walls), 1) if walls else None, "eval wall s": round(wall, 1),
           "policy failure reasons": _reasons(r.error or r.status for r in policy),
           "infra failure reasons": _reasons(r.error or "" for r in infra)}
    if "claweval" in summary:  # ClawEval's own figures (its grader.py's task scores), beside forge's reward
        figures = summary["claweval"]
        row["ClawEval task score (mean), pass^1"] = f"{figures.get('mean_task_score')}, {figures.get('pass^1')}"
    if not rollouts:
        row["eval output"] = tail
    print(f"    {tasks.name} {harness}: {row['rollouts']} rollouts, {row['scored']} scored, "
          f"{row['policy failures']} policy, {row['infra failures']} infra {row['infra failure reasons']}; "
          f"median {row['s per rollout (median)']} s")
    return row


def _reasons(errors: Any) -> str:
    """'2x why; 1x other why', the most frequent first."""
    return "; ".join(f"{n}x {why}" for why, n in Counter(e[:240] for e in errors).most_common())


def run(quick: bool = False) -> dict[str, Any]:
    labels = json.loads(os.environ.get("FIELD_EVAL_LABELS") or "{}")
    only = [s for s in os.environ.get("FIELD_EVAL_SETS", "").split(",") if s]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FieldJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    judge_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    results: dict[str, Any] = {"slice": f"{SLICE_TASKS} runnable task ids, spread over the sorted ids, "
                                        f"x {SAMPLES} sample",
                               "judge": "scripted, score 0 to every answer (the tiny model gives no verdict)",
                               "sources": {}, "tasks": {}, "rows": []}
    home = Path(tempfile.mkdtemp(prefix="forge-field-eval-"))
    try:
        for name, (var, fmt, runs) in SETS.items():
            src = os.environ.get(var)
            if not src or (only and name not in only):
                print(f"  {name}: left out ({var} is not set, or FIELD_EVAL_SETS does not name it)")
                continue
            out = home / f"{name}-tasks"
            image = _harness_image(home) if any(sandbox == "docker" for _, sandbox in runs) else ""
            ids = _import(home, name, fmt, src, out, image)
            results["sources"][name], results["tasks"][name] = labels.get(name, src), ids
            results["rows"] += [{"set": name, **_eval(home, out, ids, h, sandbox, judge_url, image)}
                                for h, sandbox in runs[:1 if quick else None]]
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(home, ignore_errors=True)
    return results


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=1))
