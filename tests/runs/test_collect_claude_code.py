"""`forge collect` through the real Claude Code, short: a teacher behind the proxy (`engine.kind =
"remote"`, `engine.api = "anthropic"`) drives `claude -p` in local sandboxes on one builtin task, the
rollouts are graded from Claude Code's own answer, the kept calls are recorded in the student's tokens
(re-tokenised), and `forge sft --from RUN` trains the student on exactly those tokens.

The teacher is an Anthropic Messages endpoint on loopback (the one edge that cannot run here) that
solves the task as an agent: a `tool_use` of Claude Code's Bash tool, then the tool's output as the
answer, in the real API's reply shape (`type: message`, content blocks, `stop_reason`, usage).
`--bare --tools Bash` keeps Claude Code's prompt short (docs/dashboard.md): the same run, with SFT rows
of a few thousand tokens instead of ~48k, so the test is a short form CI can afford."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import AutoTokenizer
from typer.testing import CliRunner

from openforge.engine.serve import serve_in_thread
from openforge.forge_cli.main import app
from openforge.store import Store
from openforge.trainer.sft import select_examples
from tests.helpers.harnesses import NPM_CACHE, needs

KEY_ENV = "FORGE_TEST_TEACHER_KEY"
SUM = re.compile(r"What is (\d+) \+ (\d+)\?")


class AnthropicTeacher:
    """Solves "What is a + b?" as an agent would, in the Messages API: first a `tool_use` of Bash that
    computes the sum, then, given the tool's result, that result as the answer. Every request body kept."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.url = ""

    def reply(self, body: dict) -> tuple[list[dict], str]:
        last = body["messages"][-1]
        blocks = [{"type": "text", "text": last["content"]}] if isinstance(last["content"], str) else last["content"]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:  # the tool ran: its output is the answer
            out = results[-1]["content"]
            text = out if isinstance(out, str) else "".join(b.get("text", "") for b in out)
            return [{"type": "text", "text": text.strip()}], "end_turn"
        found = SUM.findall(" ".join(b.get("text", "") for b in blocks if b.get("type") == "text"))
        if not found:
            return [{"type": "text", "text": "I cannot tell."}], "end_turn"
        a, b = found[-1]
        return [{"type": "tool_use", "id": f"toolu_{len(self.requests):04d}", "name": "Bash",
                 "input": {"command": f"echo $(({a} + {b}))", "description": "Add the numbers"}}], "tool_use"

    def app(self) -> Starlette:
        async def messages(request: Request) -> JSONResponse:
            if request.headers.get("x-api-key") != "sk-ant-teacher" or not request.headers.get("anthropic-version"):
                return JSONResponse({"type": "error", "error": {"type": "authentication_error",
                                                                "message": "invalid x-api-key"}}, status_code=401)
            body = await request.json()
            self.requests.append(body)
            content, stop = self.reply(body)
            return JSONResponse({
                "id": f"msg_{len(self.requests):04d}", "type": "message", "role": "assistant", "model": body["model"],
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": 1200, "output_tokens": 20}})

        return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


@pytest.fixture
def teacher(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnthropicTeacher]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-teacher")
    fake = AnthropicTeacher()
    server = serve_in_thread(fake.app())
    fake.url = server.url
    yield fake
    server.stop()


@pytest.mark.timeout(600)  # ~10 s on 2 idle cores
@needs("claude-code")
def test_collect_through_claude_code_then_sft(teacher: AnthropicTeacher, tiny_model: Path, forge_home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_NPM_CACHE", str(NPM_CACHE))
    (forge_home / "forge.toml").write_text(f"""
[engine]
kind = "remote"
api = "anthropic"
url = "{teacher.url}"
upstream_model = "claude-teacher-1"
api_key_env = "{KEY_ENV}"
model = "{tiny_model}"

[harness]
name = "claude-code"
max_turns = 3
extra_args = ["--bare", "--tools", "Bash"]

[runner]
time_limit_scale = 5.0

[proxy]
max_context_tokens = 131072
""")
    config = ["--config", str(forge_home / "forge.toml")]
    out = CliRunner().invoke(app, [*config, "collect", "--tasks", "builtin", "--task", "easy-sum", "-k", "2"])
    assert out.exit_code == 0, out.output
    store = Store(forge_home / "forge.db")
    (run,) = store.list_runs()
    assert run.kind == "collect" and run.status == "finished"
    assert run.summary_json["kept"] == run.summary_json["rollouts"] == 2
    assert run.summary_json["kept_by_harness"] == {"claude-code": {"scored": 2, "kept": 2}}
    rollouts = store.list_rollouts(run.id)
    assert all(r.status == "scored" and r.reward == 1.0 and r.failure_kind is None for r in rollouts)
    # Claude Code's own requests reached the teacher, in its API, with its tools and system prompt.
    assert teacher.requests and all(b["model"] == "claude-teacher-1" and b["system"] for b in teacher.requests)

    # Every call recorded in the student's tokens: the answer rendered by its template, the tool call in
    # its tool-call format; Claude Code ran the tool and sent its output back.
    calls = store.list_calls(run_id=run.id)
    assert len(calls) == len(teacher.requests) == 4 and all(c.api == "anthropic_messages" and c.retokenized
                                                             for c in calls)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tool_call = '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo $((2 + 3))", "description": ' \
                '"Add the numbers"}}\n</tool_call>'
    for r in rollouts:
        first, second = sorted((c for c in calls if c.rollout_id == r.id), key=lambda c: c.seq)
        assert tokenizer.decode(first.completion_ids, skip_special_tokens=True).strip() == tool_call
        assert tokenizer.decode(second.completion_ids, skip_special_tokens=True).strip() == "5"
    ran = [b for body in teacher.requests for b in body["messages"][-1]["content"]
           if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert len(ran) == 2 and all("5" in str(b["content"]) for b in ran)  # Bash ran in the sandbox, printed 5

    kept = select_examples(store, [run.id], min_reward=1.0)
    assert {e.task_id for e in kept} == {"easy-sum"} and len({e.rollout_id for e in kept}) == 2
    for r in rollouts:  # the supervised tokens are the teacher's re-tokenised answers, nothing of the prompt
        answers = [t for c in sorted((c for c in calls if c.rollout_id == r.id), key=lambda c: c.seq)
                   for t in c.completion_ids]
        assert [t for e in kept if e.rollout_id == r.id for t, m in zip(e.token_ids, e.loss_mask) if m] == answers

    sft = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "trainer.device=cpu", "sft",
                                   "--from", run.id, "--epochs", "2", "--val-tasks", "0"])
    assert sft.exit_code == 0, sft.output
    trained = next(r for r in store.list_runs() if r.kind == "sft")
    assert trained.status == "finished" and trained.summary_json["train_sequences"] == len(kept)
    assert trained.summary_json["train_loss_last"] < trained.summary_json["train_loss_first"]
