"""`judge.endpoint = "policy-base"`: the run's own engine, with its base weights, as a task's judge.

Through the real runner, the real proxy on loopback and its unix socket, a local sandbox: the judge's
call goes to the proxy's judge route with the rollout's judge key, is served without the policy's
adapter and recorded as a `judgement` row, never a `call` (so never training data); the judge key
works nowhere else, and the agent's key never on the judge route. A scripted engine gives the judge's
verdicts (its parse rules, failures dropped and counted); the embedded engine on the tiny model runs the
same path for real (its random weights answer no verdict: a judge failure, counted, never a 0)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from openforge.config import ForgeConfig, JudgeConfig
from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.errors import ConfigError
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.failures import is_infra_failure
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.judge import JudgeSpec
from openforge.rollouts.tasks.selfcheck import _StandInHarness
from openforge.store import Store, new_judge_key
from tests.helpers.judges import POLICY_BASE, serve  # noqa: F401 - fixtures
from tests.helpers.gui_fixtures import needs_display

RUBRIC = "PASS when the final answer names the capital of France; FAIL otherwise."
GRADER = "You are a grader."  # the first words of the rubric judge's system prompt (rollouts/tasks/judge.py)


def _task(task_id: str = "capital") -> TaskSpec:
    return TaskSpec(id=task_id, instruction="What is the capital of France?", judge=JudgeSpec(rubric=RUBRIC))


def _judge_script(policy_says: str, judge_says: str | None = None):  # noqa: ANN202
    """The policy answers `policy_says`; the judge (a prompt holding the grader's system text) answers
    `judge_says`, or by the rubric: PASS when the quoted answer names Paris."""
    def script(engine: ScriptedEngine, ids: list[int]) -> str:
        text = engine.tokenizer.decode(ids)
        if GRADER not in text:
            return policy_says
        if judge_says is not None:
            return judge_says
        answer = text.split(": final answer>>>", 1)[1].split("<<<END DATA", 1)[0]
        return "The answer names Paris.\nVERDICT: PASS" if "Paris" in answer else "VERDICT: FAIL"
    return script


def _scripted(tiny_model: Path, policy_says: str, judge_says: str | None = None) -> ScriptedEngine:
    engine: ScriptedEngine | None = None
    script = _judge_script(policy_says, judge_says)
    engine = ScriptedEngine(tiny_model, lambda ids: script(engine, ids))  # type: ignore[arg-type]
    return engine


def test_the_judge_runs_on_the_base_weights_and_is_never_a_policy_call(serve, tiny_model: Path, store: Store,
                                                                        ) -> None:  # noqa: ANN001
    """mini answers through the proxy with the run's adapter; the judge is served without it, recorded
    as a judgement, and the rollout's calls and trajectory hold the policy's tokens only."""
    engine = _scripted(tiny_model, "Paris")
    engine.adapters["step-1"] = "/adapters/step-1"  # the policy samples with an adapter, as in training
    proxy = serve(engine)
    run = store.create_run(kind="eval")
    runner = RolloutRunner(store, config=POLICY_BASE, proxy_url=proxy.url, proxy_socket=proxy.uds)
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(_task())], adapter="step-1"))
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "mini"), (ro.error, ro.stderr)

    policy, judged = engine.requests  # the agent's one call, then the judge's
    assert policy.get("lora_path") == "step-1" and judged.get("lora_path") is None
    assert GRADER in engine.tokenizer.decode(judged["input_ids"])

    [row] = store.list_judgements(rollout_id=ro.id)
    assert (row.score, row.error, row.reply) == (1.0, None, "The answer names Paris.\nVERDICT: PASS")
    assert row.model == "policy-base (forge-policy)" and row.prompt_json[0]["content"].startswith(GRADER)
    assert row.latency_ms is not None and row.run_id == run.id

    # Never training data: the rollout's one call and its trajectory are the policy's tokens alone.
    [call] = store.list_calls(rollout_id=ro.id)
    assert call.prompt_ids == policy["input_ids"] and call.adapter == "step-1"
    [traj] = store.list_trajectories(rollout_ids=[ro.id])
    assert traj.token_ids == call.prompt_ids + call.completion_ids and traj.call_ids == [call.id]
    assert GRADER not in engine.tokenizer.decode(traj.token_ids)


def test_only_a_judge_key_opens_the_judge_route_and_it_opens_nothing_else(serve, tiny_model: Path,
                                                                          store: Store) -> None:  # noqa: ANN001
    engine = _scripted(tiny_model, "Paris", "VERDICT: PASS")
    proxy = serve(engine)
    run = store.create_run(kind="eval")
    store.set_run_status(run.id, "running")
    agent = store.create_rollout(run_id=run.id, task_id="t", status="running")
    judge_key = new_judge_key()
    judged = store.create_rollout(run_id=run.id, task_id="t", status="running", key=judge_key)
    body = {"model": "m", "messages": [{"role": "system", "content": GRADER}, {"role": "user", "content": "x"}],
            "max_tokens": 32}

    def post(path: str, key: str | None) -> httpx.Response:
        return httpx.post(proxy.url + path, json=body, timeout=60,
                          headers={"Authorization": f"Bearer {key}"} if key else {})

    for key in (agent.key, None, "forge-judge-guessed"):  # the agent's key, none, a made-up judge key
        refused = post("/judge/v1/chat/completions", key)
        assert refused.status_code == 401 and "x-forge-judgement" not in refused.headers
    assert post("/v1/chat/completions", judge_key).status_code == 401  # a judge key is no policy key
    assert post("/r/" + judge_key + "/v1/chat/completions", None).status_code == 401
    assert store.list_calls(run_id=run.id) == [] and store.list_judgements(run_id=run.id) == []

    served = post("/judge/v1/chat/completions", judge_key)
    assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"] == "VERDICT: PASS"
    [row] = store.list_judgements(run_id=run.id)
    assert int(served.headers["x-forge-judgement"]) == row.id and row.rollout_id == judged.id
    assert store.list_calls(run_id=run.id) == []
    store.update_rollout(judged.id, status="scored")  # an ended rollout's judge key works no more
    assert post("/judge/v1/chat/completions", judge_key).status_code == 401


@pytest.mark.parametrize(("judge_says", "fault", "error"), [
    ("I think it passes.", None, "unparseable judge reply"),
    ("VERDICT: PASS", "http_500", "the inference engine failed this call"),
])
def test_a_judge_that_gives_no_verdict_is_an_infra_failure_recorded_once(
        serve, tiny_model: Path, store: Store, judge_says: str, fault: str | None, error: str) -> None:  # noqa: ANN001
    engine = _scripted(tiny_model, "unused", judge_says)
    if fault:
        engine.fail_next(fault)  # type: ignore[arg-type]
    proxy = serve(engine)
    run = store.create_run(kind="eval")
    runner = RolloutRunner(store, config=POLICY_BASE, proxy_url=proxy.url,
                           harness=_StandInHarness({}, {"capital": "Paris"}))
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(_task())]))
    assert ro.status == "failed" and ro.reward is None and is_infra_failure(ro), (ro.status, ro.error)
    assert "the judge failed" in ro.error and error in ro.error
    [row] = store.list_judgements(rollout_id=ro.id)  # the proxy's row, its error the runner's or its own
    assert row.score is None and error in row.error and row.model.startswith("policy-base")


def test_a_judge_past_its_limit_is_ended_and_recorded_by_the_proxy(serve, tiny_model: Path,
                                                                    store: Store) -> None:  # noqa: ANN001
    """The proxy ends the call at the runner's judge.timeout_s (sent with it) and records why: one row,
    the runner's own limit (timeout_s + a grace) never reached."""
    engine = _scripted(tiny_model, "unused", "VERDICT: PASS")
    engine.fail_next("delay", seconds=15)  # far past the judge's limit, however loaded the machine
    proxy = serve(engine)
    run = store.create_run(kind="eval")
    config = ForgeConfig(judge=JudgeConfig(endpoint="policy-base", timeout_s=2))
    runner = RolloutRunner(store, config=config, proxy_url=proxy.url,
                           harness=_StandInHarness({}, {"capital": "Paris"}))
    [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(_task())]))
    assert ro.status == "failed" and is_infra_failure(ro) and "the judge failed" in ro.error, ro.error
    [row] = store.list_judgements(rollout_id=ro.id)
    assert row.score is None and row.error.startswith("the judge's call took over 2s"), row.error


def test_policy_base_is_the_run_engine_or_nothing() -> None:
    from openforge.config import load_config

    with pytest.raises(ValueError, match="leave them empty"):
        JudgeConfig(endpoint="policy-base", url="http://judge/v1")
    with pytest.raises(ConfigError, match="engine.kind = \"remote\" has none"):
        load_config(None, overrides={"judge": {"endpoint": "policy-base"},
                                     "engine": {"kind": "remote", "url": "http://teacher/v1", "model": "m",
                                                "upstream_model": "t"}})


def test_the_embedded_engine_judges_for_real(tiny_model: Path, store: Store, tmp_path: Path) -> None:
    """The tiny model answers the real judge prompt through the real route, on its base weights although
    the rollout's adapter is loaded (its reply is the base model's greedy answer, not the adapter's); its
    random weights give no verdict line, so the rollout is a judge failure (counted), its reply recorded."""
    from openforge.config import EmbeddedEngineConfig
    from openforge.engine.client import EngineClient
    from openforge.engine.embedded import EmbeddedEngine
    from openforge.engine.testing import make_random_lora
    from openforge.proxy.openai_chat import parse_request
    from openforge.proxy.tokens import ChatRenderer, load_tokenizer

    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_model), max_batch_size=2))
    adapter = make_random_lora(tiny_model, tmp_path / "step-1")
    config = POLICY_BASE.model_copy(deep=True)
    config.proxy.max_tokens_cap = 12

    async def greedy(url: str, ids: list[int]) -> tuple[list[int], list[int]]:
        async with EngineClient(url, timeout=120) as client:
            params = {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": renderer.stop_token_ids}
            base = await client.generate(ids, params)
            tuned = await client.generate(ids, params, lora_path="step-1")
            return base.output_ids, tuned.output_ids

    renderer = ChatRenderer(load_tokenizer(tiny_model))
    try:
        with serve_in_thread(engine.app) as eng, ProxyServer(config.proxy, store_path=store.path, engine_url=eng.url,
                                                              model_path=tiny_model) as proxy:
            asyncio.run(_load(eng.url, "step-1", adapter))
            run = store.create_run(kind="eval")
            runner = RolloutRunner(store, config=config, proxy_url=proxy.url,
                                   harness=_StandInHarness({}, {"capital": "Paris"}))
            [ro] = asyncio.run(runner.run(run.id, [RolloutSpec(_task())], adapter="step-1"))
            [row] = store.list_judgements(rollout_id=ro.id)
            prompt = parse_request({"messages": row.prompt_json})
            ids = renderer.encode(renderer.render(prompt.messages, [], generation=True))
            base, tuned = asyncio.run(greedy(eng.url, ids))
    finally:
        engine.close()
    assert row.model == "policy-base (forge-policy)" and row.latency_ms > 0 and ro.adapter == "step-1"
    assert base != tuned and row.reply == renderer.decode(base)  # the base weights answered, not the adapter
    assert row.score is None and row.error.startswith("unparseable judge reply"), row.error
    assert (ro.status, ro.failure_kind) == ("failed", "infra") and "the judge failed" in ro.error
    assert store.list_calls(rollout_id=ro.id) == []  # the judge's call is no call of the rollout


async def _load(url: str, name: str, path: Path) -> None:
    from openforge.engine.client import EngineClient

    async with EngineClient(url, timeout=120) as client:
        await client.load_lora_adapter(name, str(path))


def test_the_proxy_records_a_judge_prompt_as_the_runner_does() -> None:
    """The judge route's record of a prompt with screenshots is the runner's own (each image a
    `forge-image:<sha256>` reference, the same file the policy's call stored), never the bytes."""
    import io

    from PIL import Image

    from openforge.image_store import image_id
    from openforge.proxy.judge import recorded_messages
    from openforge.rollouts.tasks.judge import build_messages, recorded

    shots = []
    for colour in ("red", "blue"):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
        shots.append(buf.getvalue())
    spec = JudgeSpec(rubric=RUBRIC, sees=["instruction", "answer", "screenshots"])
    messages = build_messages(spec, instruction="Open the page.", answer="done", files={}, max_chars=1000,
                              images=shots)
    kept = recorded_messages(messages)
    assert kept == recorded(messages)
    assert [p["image_url"]["url"] for p in kept[1]["content"] if p["type"] == "image_url"] == \
        [f"forge-image:{image_id(s)}" for s in shots]


@needs_display
def test_a_gui_rollouts_screenshots_reach_the_base_weights_judge(tiny_vl_model: Path, store: Store) -> None:
    """mini-gui on a builtin-web task (two clicks, then done) judged by WebVoyager on the run's own
    (scripted) Qwen2-VL: the judge's engine request carries the policy's last two screenshots as its
    image_data, without an adapter; the judgement keeps references; the rollout's calls are the policy's."""
    import base64
    import hashlib

    from tests.helpers.gui_fixtures import run_gui_task
    from openforge.config import HarnessConfig

    actions = iter(["click(1)", "click(0)", "done()"])

    def script(engine: ScriptedEngine, ids: list[int]) -> str:
        return "SUCCESS" if "<<<BEGIN DATA" in engine.tokenizer.decode(ids) else next(actions)

    ro, engine = run_gui_task(store, tiny_vl_model, script, "gui-colour-click-red",
                              HarnessConfig(name="mini-gui", max_turns=4, max_tokens=8,
                                            extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"]),
                              judge=JudgeConfig(endpoint="policy-base"),
                              task_judge=JudgeSpec(name="webvoyager", screenshots=2))
    assert (ro.status, ro.reward) == ("scored", 0.5), (ro.error, ro.verifier_output, ro.stdout)  # site 0, judge 1
    calls = store.list_calls(rollout_id=ro.id)
    shots = [c.images[-1] for c in calls]
    assert len(calls) == 3 and len(engine.requests) == 4
    judged = engine.requests[-1]
    assert judged.get("lora_path") is None
    sent = [hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest() for url in judged["image_data"]]
    assert sent == shots[:2]  # the last two distinct screens, oldest first
    [row] = store.list_judgements(rollout_id=ro.id)
    refs = [p["image_url"]["url"] for p in row.prompt_json[1]["content"] if p["type"] == "image_url"]
    assert refs == [f"forge-image:{sha}" for sha in shots[:2]] and (row.score, row.reply) == (1.0, "SUCCESS")
