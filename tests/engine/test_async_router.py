"""The asynchronous loop on a fleet (issue 34, "cluster path"): `forge train` with engine.kind = "router"
and `trainer.max_staleness = 2`, the real sglang-router (PyPI, Rust) in front of two embedded workers,
the mini harness in local sandboxes. The same loop as on one engine: every adapter version is loaded
on both workers before a rollout asks for it, a rollout's calls stay on one worker, a worker serves
an older version after a newer one is loaded there, and the run trains its steps with every group
once. The workers are the run's `engine.worker_urls` (SGLang servers already running, as on a
cluster); each sits behind a relay here that records what reaches it, in order, and passes it on."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("sglang_router", reason="the [router] extra (sglang-router) is not installed")

from openforge.config import EmbeddedEngineConfig  # noqa: E402
from openforge.engine.serve import serve_in_thread  # noqa: E402
from openforge.engine.supervisor import EngineProcess  # noqa: E402
from openforge.store import Store  # noqa: E402

KEY = "fleet-key"
STEPS = 5
QUESTION = "Which digit fills the line '{d} {d} {d} {d} {d} {d} {d} {d}'? Answer with a number: 3 or 8."


class WorkerLog:
    """What reached the workers, in one order across both: ("loaded", worker, adapter) once a worker
    has answered a load, ("unload", worker, adapter) before it is asked to unload, ("generate",
    worker, rid, adapter) as a call arrives, ("done", worker, rid) once its answer has been sent."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.seq = itertools.count()

    def add(self, *event: Any) -> None:
        with self.lock:
            self.events.append((next(self.seq), *event))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [e for e in self.events if e[1] == kind]


def relay(worker: int, upstream: str, log: WorkerLog) -> Any:
    """An ASGI app that passes every request on to `upstream` as it came (streams too) and logs it."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    http = httpx.AsyncClient(timeout=httpx.Timeout(300, connect=5))

    async def forward(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        fields = json.loads(body) if body and path in ("/generate", "/load_lora_adapter", "/unload_lora_adapter") \
            else {}
        if path == "/unload_lora_adapter":
            log.add("unload", worker, fields["lora_name"])
        if path == "/generate":
            log.add("generate", worker, fields.get("rid"), fields.get("lora_path"))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        up = await http.send(http.build_request(request.method, f"{upstream}{path}", content=body, headers=headers,
                                                params=request.query_params), stream=True)
        if path == "/load_lora_adapter":
            content = await up.aread()
            await up.aclose()
            if up.status_code == 200 and json.loads(content).get("success"):
                log.add("loaded", worker, fields["lora_name"])
            return Response(content, status_code=up.status_code, media_type=up.headers.get("content-type"))

        async def relayed():
            try:
                async for chunk in up.aiter_raw():
                    yield chunk
            finally:
                await up.aclose()
                if path == "/generate":
                    log.add("done", worker, fields.get("rid"))

        return StreamingResponse(relayed(), status_code=up.status_code, media_type=up.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT"])])


@pytest.fixture
def fleet(tiny_model: Path, tmp_path: Path):
    """Two embedded workers (the run's key), each behind a logging relay: the relays' URLs and the log."""
    log = WorkerLog()
    workers, relays = [], []
    try:
        for i in range(2):
            w = EngineProcess(EmbeddedEngineConfig(model=str(tiny_model), startup_timeout_s=240),
                              log_path=tmp_path / f"worker-{i}.log", api_key=KEY)
            workers.append(w)
        for i, w in enumerate(workers):
            w.start()
            relays.append(serve_in_thread(relay(i, w.url, log)))
        yield [r.url for r in relays], log
    finally:
        for r in relays:
            r.stop()
        for w in workers:
            w.stop()


AGENT = """import os, sys
from openai import OpenAI
client, messages = OpenAI(), [{"role": "user", "content": sys.argv[-1]}]
for _ in range(3):  # three turns of one conversation, each a call that extends the last
    reply = client.chat.completions.create(model=os.environ["MODEL"], messages=messages, max_tokens=2)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                 {"role": "user", "content": "Once more: 3 or 8?"}]
print((reply.choices[0].message.content or "").strip().replace("\\n", " "))
"""
SPEC = """name = "three-turns"
[install]
imports = ["openai"]
[api]
flavour = "openai-chat"
base_url_env = ["OPENAI_BASE_URL"]
api_key_env = ["OPENAI_API_KEY"]
model_env = ["MODEL"]
[run]
program = "{python}"
args = [".forge/agent.py", "--", "{instruction}"]
copy_files = { ".forge/agent.py" = "agent.py" }
[answer]
source = "stdout"
"""


def _harness(folder: Path) -> Path:
    """A harness of three calls a rollout, whatever the model says (mini stops at its first plain answer)."""
    folder.mkdir()
    (folder / "agent.py").write_text(AGENT)
    (folder / "three-turns.toml").write_text(SPEC)
    return folder / "three-turns.toml"


def _tasks(path: Path, home: Path) -> Path:
    """Three exact-graded tasks. `late` starts its agent only once step 1's adapter is saved (so step
    0's has been hot-loaded on both workers): its group, started under the base model (version 0), is
    served after newer versions are loaded, and trained at step 2, two versions late."""
    wait = f"until ls -d {home}/runs/*/adapters/step-1 >/dev/null 2>&1; do sleep 0.2; done"
    rows = [{"id": "three", "instruction": QUESTION.format(d=3), "expect_answer": {"number": 3}},
            {"id": "eight", "instruction": QUESTION.format(d=8), "expect_answer": {"number": 8}},
            {"id": "late", "instruction": QUESTION.format(d=3), "expect_answer": {"number": 3}, "setup": wait}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_the_async_loop_drives_a_fleet_behind_sglang_router(fleet, tiny_model: Path, tmp_path: Path,
                                                            forge_home: Path) -> None:
    urls, log = fleet
    tasks = _tasks(tmp_path / "tasks.jsonl", forge_home)
    sets = {"engine.kind": "router", "engine.model": str(tiny_model), "engine.worker_urls": json.dumps(urls),
            "engine.api_key": KEY, "engine.startup_timeout_s": "240", "tasks.path": str(tasks),
            "trainer.max_staleness": "2", "trainer.tasks_per_step": "1", "runner.samples_per_task": "2",
            "runner.concurrency": "4", "runner.verifier_timeout_s": "300", "sandbox.isolation": "none",
            "harness.name": str(_harness(tmp_path / "harness"))}
    argv = [sys.executable, "-m", "openforge.forge_cli.main"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    out = subprocess.run([*argv, "train", "--steps", str(STEPS)], env={**os.environ, "FORGE_HOME": str(forge_home)},
                         cwd=tmp_path, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    store = Store(forge_home / "forge.db")
    run = store.get_run("latest")
    steps = store.list_train_steps(run.id)
    # the same run as on one engine: every step, every group of the stream once, every rollout scored
    assert [s.step for s in steps] == list(range(STEPS)) and run.status == "finished"
    assert sum(s.metrics_json["n_groups"] + s.metrics_json["dropped_groups"] for s in steps) == STEPS
    rollouts = store.list_rollouts(run.id)
    assert len(rollouts) == 2 * STEPS and all(r.status == "scored" for r in rollouts)
    staleness = Counter()
    for s in steps:
        staleness.update({int(k): v for k, v in s.metrics_json["staleness"].items()})
    assert staleness[2] >= 1 and max(staleness) == 2  # the late group: trained two versions after its own

    published = [f"{run.id}-step-{i}" for i in range(STEPS)]
    loaded = {(w, a): seq for seq, _, w, a in log.of("loaded")}
    unloaded = {(w, a): seq for seq, _, w, a in log.of("unload")}
    # every adapter the trainer published reached both workers
    assert sorted(loaded) == sorted((w, a) for w in (0, 1) for a in published), log.events
    calls = log.of("generate")
    assert len(calls) == 3 * len(rollouts)
    first_ask = {}
    for seq, _, w, rid, adapter in calls:
        if adapter is not None:
            first_ask.setdefault(adapter, seq)
            # loaded on this worker before the call came, and not unloaded under it
            assert loaded[(w, adapter)] < seq < unloaded.get((w, adapter), float("inf")), (w, rid, adapter)
    # ... and on both workers before any rollout anywhere asked for it (the fan-out ends before publish)
    assert all(max(loaded[(0, a)], loaded[(1, a)]) < seq for a, seq in first_ask.items())
    # groups started under versions 1 and 2 (positions 3 and 4, admitted at the first two publishes)
    assert {f"{run.id}-step-0", f"{run.id}-step-1"} <= set(first_ask)

    # every call of a rollout on one worker (the router's manual policy keyed by the rollout id)
    where: dict[str, set[int]] = defaultdict(set)
    for _, _, w, rid, _ in calls:
        where[rid.rsplit("_", 1)[0]].add(w)
    assert set(where) == {r.id for r in rollouts}
    assert all(len(ws) == 1 for ws in where.values()), where

    # the late group's calls ask for the base model (version 0) on a worker that already serves step
    # 0's adapter (version 1): one worker, several versions at once
    late = {r.id: r for r in rollouts if r.task_id == "late" and r.adapter is None}
    late_calls = [(seq, w) for seq, _, w, rid, adapter in calls if rid.rsplit("_", 1)[0] in late]
    assert late_calls and all(adapter is None for _, _, _, rid, adapter in calls if rid.rsplit("_", 1)[0] in late)
    assert all(loaded[(w, f"{run.id}-step-0")] < seq for seq, w in late_calls)

    # what a clock shows (printed, not asserted): calls of different versions in flight together
    open_: dict[str, str | None] = {}
    together = 0
    for e in sorted(log.events):
        if e[1] == "generate":
            open_[e[3]] = e[4]
            together = max(together, len(set(open_.values())))
        elif e[1] == "done":
            open_.pop(e[3], None)
    spread = Counter(next(iter(ws)) for ws in where.values())
    print(f"\nfleet: {len(calls)} calls of {len(rollouts)} rollouts, rollouts per "
          f"worker {dict(spread)}, staleness {dict(staleness)}, most versions in flight at once {together}")
