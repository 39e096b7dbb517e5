"""`forge collect`: a teacher behind the proxy drives the real mini harness on builtin tasks in local
sandboxes, graded as eval and RL grade; the kept rollouts (rejection sampling) are what `forge sft
--from RUN` trains on. The teacher is a fake OpenAI-compatible upstream on loopback (the one edge that
cannot run here) that knows the answer to one task and not to the other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from openforge.engine.serve import serve_in_thread
from openforge.forge_cli.main import app
from openforge.store import Store
from openforge.trainer.sft import select_examples

pytestmark = pytest.mark.timeout(300)
KEY_ENV = "FORGE_TEST_TEACHER_KEY"
TASKS = ["--tasks", "builtin", "--task", "easy-sum", "--task", "easy-say-done"]


class Teacher:
    """Answers 2 + 3 right and anything else wrong, as a Chat Completions endpoint; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def app(self) -> Starlette:
        async def answer(request: Request) -> JSONResponse:
            self.calls += 1
            body = await request.json()
            asked = " ".join(str(m.get("content")) for m in body["messages"] if m["role"] == "user")
            content = "5" if "2 + 3" in asked else "I would rather not say."
            return JSONResponse({
                "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 1765000000, "model": "teacher-1",
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": content, "refusal": None}}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}})

        return Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])


@pytest.fixture
def teacher(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Teacher, list[str]]]:
    monkeypatch.setenv(KEY_ENV, "sk-upstream-secret")
    fake = Teacher()
    server = serve_in_thread(fake.app())
    sets = ["engine.kind=remote", f"engine.url={server.url}", "engine.upstream_model=teacher-1",
            f"engine.api_key_env={KEY_ENV}", f"engine.model={tiny_model}", "harness.name=mini"]
    yield fake, [a for s in sets for a in ("--set", s)]
    server.stop()


def test_collect_keeps_what_passes_and_sft_trains_on_it_only(teacher: tuple[Teacher, list[str]], tiny_model: Path,
                                                             forge_home: Path) -> None:
    fake, sets = teacher
    out = CliRunner().invoke(app, [*sets, "collect", *TASKS, "-k", "2", "--min-reward", "1"])
    assert out.exit_code == 0, out.output
    assert "kept 2 of 4 scored rollout(s)" in out.output and "forge sft --from " in out.output
    store = Store(forge_home / "forge.db")
    (run,) = store.list_runs()
    assert run.kind == "collect" and run.status == "finished"
    summary = run.summary_json
    assert summary["kept_by_task"] == {"easy-sum": {"scored": 2, "kept": 2}, "easy-say-done": {"scored": 2, "kept": 0}}
    assert summary["kept_by_harness"] == {"mini": {"scored": 4, "kept": 2}}
    calls = store.list_calls(run_id=run.id)
    assert len(calls) == fake.calls == 4 and all(c.retokenized for c in calls)  # one answer per rollout

    # Resumed: a sample that did not end scored (here: interrupted) is taken again, the scored ones are not.
    lost = next(r for r in store.list_rollouts(run.id) if r.task_id == "easy-say-done")
    store.update_rollout(lost.id, status="interrupted")
    again = CliRunner().invoke(app, [*sets, "collect", "--resume", run.id])
    assert again.exit_code == 0, again.output
    assert "collect: 1 rollout(s) to sample" in again.output and fake.calls == 5
    assert store.get_run(run.id).summary_json["kept_by_task"]["easy-say-done"] == {"scored": 2, "kept": 0}
    assert store.get_run(run.id).summary_json["kept"] == 2

    kept = select_examples(store, [run.id], min_reward=1.0)
    assert {e.task_id for e in kept} == {"easy-sum"} and len(kept) == 2
    sft = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "trainer.device=cpu", "sft",
                                   "--from", run.id, "--epochs", "1"])  # --min-reward: the collect run's
    assert sft.exit_code == 0, sft.output
    trained = [r for r in store.list_runs() if r.kind == "sft"][0]
    assert trained.summary_json["train_sequences"] == 2 and trained.summary_json["val_sequences"] == 0
    assert trained.summary_json["min_reward"] == {run.id: 1.0}


def test_resume_refuses_another_kind_of_run(store: Store, teacher: tuple[Teacher, list[str]]) -> None:
    _, sets = teacher
    other = store.create_run(kind="eval")
    out = CliRunner().invoke(app, [*sets, "collect", "--resume", other.id])
    assert out.exit_code == 1
    assert out.stderr.strip() == f"forge: error: run {other.id} is of kind eval; --resume continues a forge collect run"
