"""A ClawEval task's own grader run for one rollout (rollouts/tasks/claweval/grading.py), from forge's records.

    verdict = await claweval_verdict(config, store, ro, task, answer, services)   # after the exact graders

The trace is built from what forge kept on the host: the proxy's calls (the messages), the services'
recording fronts (the dispatches) with the tool server's dispatch record (their response bodies), and
each service's audit asked now, straight at the service's port (not through its front, so the record
the exact graders read is not touched). For a task whose grader reads the files the agent left, the
runner's grader passes the named workspace files it copied out of the sandbox after the agent was gone
(`env_snapshot`, RolloutGrader._claweval_snapshot). The verdict is stored beside the run
(`$FORGE_HOME/runs/<run>/claweval/<rollout>.json`, the trace it graded beside it as `<rollout>.trace.jsonl`)
for `forge eval`'s ClawEval figures, and each call the grader made to its judge (ClawEval's LLMJudge on
forge's [judge] endpoint) as a judgement row. Its task score is the rollout's reward (unless the task
asks for forge's judge-only reward, `claweval.reward = "judge"`). With `judge.endpoint = "policy-base"` the
LLMJudge calls the proxy's judge route with a judge key the runner's grader made (the agent gone): the
proxy records each call as a row, and the score the LLMJudge parsed is added to that row (a call it made
again, to the retried one's error).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.config import ForgeConfig
from openforge.rollouts.runner.tool_server import dispatch_record_path
from openforge.rollouts.runner.transcript import final_text, transcript_of
from openforge.rollouts.tasks.claweval.grading import run_grader, trace_dispatches
from openforge.rollouts.tasks.claweval.payload import ClawEvalPayload
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.judge import PROXY_GRACE_S, PolicyBaseJudge
from openforge.store import JUDGE_DEADLINE_HEADER, JUDGE_ROUTE, JUDGEMENT_HEADER, Call, Judgement, Rollout, Store

RETRIED = "ClawEval's LLMJudge took no score from this call and asked again"


def verdict_path(run_id: str, rollout_id: str) -> Path:
    """$FORGE_HOME/runs/<run>/claweval/<rollout>.json"""
    from openforge.paths import forge_home, runs_dir

    return runs_dir(forge_home()) / run_id / "claweval" / f"{rollout_id}.json"


def trace_messages(instruction: str, calls: Iterable[Call], answer: str) -> list[dict[str, Any]]:
    """ClawEval `Message`s (Anthropic-shaped content blocks) from the proxy's recorded calls."""
    calls = sorted(calls, key=lambda c: c.seq)
    steps = transcript_of(calls).steps
    out: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": instruction}]}]
    last_text = ""
    for call in (c for c in calls if c.status == "ok"):
        mine = [s for s in steps if s.call_seq == call.seq]
        last_text = final_text(call) or ""
        blocks = ([{"type": "text", "text": last_text}] if last_text else []) + [
            {"type": "tool_use", "id": s.id, "name": s.name, "input": s.arguments} for s in mine]
        out.append({"role": "assistant", "content": blocks})
        if results := [s for s in mine if s.result is not None]:
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": s.id, "content": [{"type": "text", "text": s.result}],
                 "is_error": bool(s.failed)} for s in results]})
    if answer.strip() and answer.strip() != last_text.strip():  # the harness's answer: the last assistant text
        out.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return out


def _tool_record(run_id: str, rollout_id: str) -> list[dict[str, Any]]:
    path = dispatch_record_path(run_id, rollout_id)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _judge(config: ForgeConfig, policy_base: PolicyBaseJudge | None) -> dict[str, Any] | None:
    j = config.judge
    if policy_base is not None:  # the proxy ends each call at judge.timeout_s (the header) and records it
        return {"url": policy_base.proxy_url.rstrip("/") + JUDGE_ROUTE, "model": "policy-base", "key": policy_base.key,
                "headers": {JUDGE_DEADLINE_HEADER: f"{j.timeout_s:g}"}, "row_header": JUDGEMENT_HEADER,
                "timeout_s": j.timeout_s + PROXY_GRACE_S}
    if not (j.url and j.model):
        return None
    return {"url": j.url, "model": j.model, "key": os.environ.get(j.api_key_env, "") if j.api_key_env else ""}


async def claweval_verdict(config: ForgeConfig, store: Store, ro: Rollout, task: TaskSpec, answer: str,
                           services: Any, env_snapshot: dict[str, Any] | None = None,
                           policy_base: PolicyBaseJudge | None = None) -> dict[str, Any]:
    """Run the task's ClawEval grader on this rollout's records (and the files copied out of the sandbox
    after the agent, `env_snapshot`, for a task that names them); store and return its verdict. `policy_base`:
    the proxy's judge route and a judge key, for a grader that asks a judge under judge.endpoint =
    "policy-base". Raises ClawEvalGradingFailed (an infrastructure failure)."""
    payload = task.payload(ClawEvalPayload)
    assert payload is not None
    spec = payload.grading
    audits = {name: services.audit(name, path) for name, path in spec.audits.items()} if services else {}
    calls = await asyncio.to_thread(store.list_calls, rollout_id=ro.id)
    record = services.requests() if services else []
    messages = trace_messages(task.instruction, calls, answer)
    dispatches = trace_dispatches(spec, record, _tool_record(ro.run_id, ro.id))
    timeout = config.runner.verifier_timeout_s + (4 * config.judge.timeout_s if spec.needs_judge else 0.0)
    path = verdict_path(ro.run_id, ro.id)
    verdict = await asyncio.to_thread(
        run_grader, spec, trace_id=ro.id, model=config.proxy.served_model_name, messages=messages,
        dispatches=dispatches, audits=audits, timeout_s=timeout, judge=_judge(config, policy_base),
        env_snapshot=env_snapshot, keep_trace=path.with_suffix(".trace.jsonl"))
    log, retried = verdict.pop("judge_log", None) or [], verdict.pop("judge_retried", None) or []
    if policy_base is not None:  # the proxy's rows: the grader's parsed score goes on each, no second row
        for call in log:
            if call.get("judgement_id") is not None:
                await asyncio.to_thread(store.score_judgement, call["judgement_id"], score=call.get("score"),
                                        error=None)
        for judgement_id in retried:
            await asyncio.to_thread(store.score_judgement, judgement_id, score=None, error=RETRIED)
        log = []
    for call in log:  # `forge show --judgements` lists them beside forge's judge's
        await asyncio.to_thread(store.add_judgement, Judgement(
            run_id=ro.run_id, rollout_id=ro.id, model=config.judge.model,
            prompt_json=[{"role": "user", "content": f"ClawEval {call.get('method', 'judge')}: "
                                                     f"{call.get('rubric_preview', '')}"}],
            reply=str(call.get("reasoning", "")), score=call.get("score")))
    path.write_text(json.dumps({"task_id": task.id, **verdict}) + "\n", encoding="utf-8")
    return verdict


def run_claweval_figures(store: Store, run_id: str) -> dict[str, Any] | None:
    """ClawEval's figures of a run (claweval_summary) over its ClawEval-graded tasks, None without any. A
    scored rollout counts its grader's task score; a policy failure or a timeout is a failed trial (0.0);
    an infrastructure or harness failure is no trial (ClawEval reruns those until it has its trials)."""
    from openforge.rollouts.tasks.claweval.grading import claweval_summary

    trials: dict[str, list[float]] = {}
    graded: set[str] = set()
    for ro in store.list_rollouts(run_id):
        path = verdict_path(run_id, ro.id)
        if ro.status == "scored" and path.is_file():
            trials.setdefault(ro.task_id, []).append(float(json.loads(path.read_text(encoding="utf-8"))["task_score"]))
            graded.add(ro.task_id)
        elif ro.status == "timed_out" or ro.failure_kind == "policy":
            trials.setdefault(ro.task_id, []).append(0.0)
    return claweval_summary({t: s for t, s in trials.items() if t in graded}) if graded else None
