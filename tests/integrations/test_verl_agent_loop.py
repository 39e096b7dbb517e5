"""The online veRL bridge (integrations/verl/agent_loop.py) driven by veRL 0.9.1's own `AgentLoopWorker`.

veRL's real worker (built from veRL's generated ppo_trainer config on the tiny model) reads the agent loop
from an agent-loop YAML through veRL's registry, runs `generate_sequences` on a DataProto of
`forge export --format verl-rl`-shaped rows, and pads/stacks the outputs with its own
`_agent_loop_postprocess` and `_postprocess`. The loop runs each row as a mini rollout in a real sandbox,
its calls served through the recording proxy by the "veRL server": `EmbeddedVerlServer` (veRL's
`LLMServerClient.generate` signature and `TokenOutput`) over the scripted engine (deterministic multi-turn
tool use) or the embedded engine with the tiny model (random sampling). Skips where veRL is not importable.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.required import skip_or_fail

try:
    import verl.experimental.agent_loop.agent_loop  # noqa: F401
except ImportError as exc:
    skip_or_fail("verl", f"veRL 0.9.1 (with hydra-core) not installed ({exc})")

import torch  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

from openforge.engine.scripted import ScriptedEngine, scripted_logprob  # noqa: E402
from openforge.engine.serve import serve_in_thread  # noqa: E402
from openforge.errors import TrainerError  # noqa: E402
from openforge.store import Call, Store, Trajectory  # noqa: E402
from openforge.integrations.verl import agent_loop as bridge_mod  # noqa: E402
from openforge.integrations.verl.agent_loop import (EmbeddedVerlServer, OpenForgeRolloutFailed,  # noqa: E402
                                                    VerlServerBackend, output_of)
from tests.helpers.verl import PROMPT_LEN, RESPONSE_LEN, batch_of, generate, runs_of, unpad, worker_for  # noqa: E402

WRITE = '<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hello world\\n"}}\n</tool_call>'


def check_token_exact(out: DataProto, server: EmbeddedVerlServer) -> dict[str, list]:
    """Every sample's sampled spans are exactly the ids and log probs veRL's server returned for its calls, in
    order, and every call's prompt is the sequence so far (the tool results in between are mask 0)."""
    by_rollout: dict[str, list] = {}
    for session, prompt_ids, tok in server.calls:  # veRL's request id: the rollout's, on every turn
        by_rollout.setdefault(session, []).append((prompt_ids, tok))
    for i, info in enumerate(out.non_tensor_batch["openforge"]):
        calls = by_rollout[info["rollout_id"]]
        prompt, response, mask, lps = unpad(out, i)
        spans = runs_of(mask)
        assert len(spans) == len(calls) == info["n_calls"] and out.non_tensor_batch["__num_turns__"][i] == 2 * len(calls)
        assert prompt == calls[0][0]
        seq = prompt + response
        for (start, end), (call_prompt, tok) in zip(spans, calls, strict=True):
            assert response[start:end] == tok.token_ids  # token-exact
            assert seq[:len(call_prompt)] == call_prompt and len(call_prompt) == len(prompt) + start
            assert lps[start:end] == pytest.approx(tok.log_probs, abs=1e-6)
        assert all(lp == 0.0 for j, lp in enumerate(lps) if not mask[j])
    return by_rollout


def test_verl_worker_runs_mini_rollouts_through_veRLs_server_and_accepts_the_outputs(
        tiny_model: Path, tmp_path: Path) -> None:
    tokenizer_engine = ScriptedEngine(tiny_model, ["unused"])
    tok = tokenizer_engine.tokenizer

    def answer(prompt_ids: list[int]) -> str:
        prompt = tok.decode(prompt_ids)
        if "What is 2 + 3" in prompt:
            return "5"
        if "How many words" in prompt:
            return "9"  # wrong: 4
        return "Done: hello world" if "wrote 12 characters" in prompt else WRITE

    engine = ScriptedEngine(tiny_model, answer)
    with serve_in_thread(engine.app) as eng:
        server = EmbeddedVerlServer(eng.url, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN)
        server.global_steps = 3  # veRL's weights after its trainer's step 3
        worker = worker_for(tiny_model, tmp_path, server, temperature=0.7)
        # easy-sum twice: veRL runs a task's n samples (a GRPO group) at once
        out = generate(worker, batch_of(["med-create-file", "easy-sum", "easy-sum", "easy-count-words"]), server)

    b = out.batch
    assert b["prompts"].shape == (4, PROMPT_LEN) and b["responses"].shape == (4, RESPONSE_LEN)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (4, PROMPT_LEN + RESPONSE_LEN)
    # the rewards are the rollouts' exact grades, at the last response token (veRL's rm_scores)
    last = b["attention_mask"][:, PROMPT_LEN:].sum(dim=1) - 1
    assert b["rm_scores"][torch.arange(4), last].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert b["rm_scores"].sum().item() == 3.0
    by_rollout = check_token_exact(out, server)
    info = list(out.non_tensor_batch["openforge"])
    assert [i["n_calls"] for i in info] == [2, 1, 1, 1] and all(i["status"] == "scored" for i in info)
    assert len({i["rollout_id"] for i in info}) == 4
    # each trajectory's weight versions as veRL's own loops hand them on (its fully-async trainer reads both)
    assert list(out.non_tensor_batch["min_global_steps"]) == list(out.non_tensor_batch["max_global_steps"]) == [3] * 4
    # the file task: two sampled spans with the tool result (mask 0) between them, logprobs the engine's
    _, response, mask, lps = unpad(out, 0)
    (s0, e0), (s1, e1) = runs_of(mask)
    assert "wrote 12 characters" in tok.decode(response[e0:s1])
    assert lps[s0:e0] == pytest.approx([scripted_logprob(t, j) for j, t in enumerate(response[s0:e0])], abs=1e-6)
    # veRL's sampling params reached every engine call (the harness asks none); veRL's trainer needs them
    assert {r["sampling_params"]["temperature"] for r in engine.requests} == {0.7}
    assert len(engine.requests) == sum(len(v) for v in by_rollout.values()) == 5
    # the OpenForge store kept the rollouts, one run for these sampling params
    store = Store(tmp_path / "home" / "forge.db")
    try:
        [run] = [r for r in store.list_runs() if r.name == "veRL bridge"]
        assert run.config_json["verl_sampling_params"]["temperature"] == 0.7 and run.status == "finished"
        assert {r.reward for r in store.list_rollouts(run.id)} == {0.0, 1.0}
        # the proxy of this run recorded the temperature veRL's server sampled at, on every call
        assert [c.temperature for c in store.list_calls(run_id=run.id)] == [0.7] * 5
    finally:
        store.close()


class _LocalActor:
    """A Ray actor handle's calling convention (`handle.method.remote(...)` -> an awaitable) over a local
    object: the one stand-in below, so veRL's real LLMServerClient and GlobalRequestLoadBalancer run
    without a Ray cluster."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._obj, name)

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                result = method(*args, **kwargs)
                if asyncio.iscoroutine(result):
                    return asyncio.ensure_future(result)
                done = asyncio.get_running_loop().create_future()
                done.set_result(result)
                return done

        return _Remote()


@pytest.mark.slow
def test_through_veRLs_real_LLMServerClient_and_load_balancer(tiny_model: Path, tmp_path: Path) -> None:
    """veRL's own client (sticky sessions by request id, least-loaded choice) over two replicas: every call
    of a rollout reaches one replica, and the outputs are still token-exact."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    tok = ScriptedEngine(tiny_model, ["unused"]).tokenizer

    def answer(prompt_ids: list[int]) -> str:
        prompt = tok.decode(prompt_ids)
        if "What is 2 + 3" in prompt:
            return "5"
        return "Done: hello world" if "wrote 12 characters" in prompt else WRITE

    engines = [ScriptedEngine(tiny_model, answer) for _ in range(2)]
    with serve_in_thread(engines[0].app) as e0, serve_in_thread(engines[1].app) as e1:
        replicas = [EmbeddedVerlServer(e.url, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN) for e in (e0, e1)]
        acquired: list[tuple[str, str]] = []

        class Recording(GlobalRequestLoadBalancer):  # veRL's documented extension point: acquire_server
            def acquire_server(self, request_id: str, **kw: Any) -> Any:
                server_id, handle = super().acquire_server(request_id, **kw)
                acquired.append((request_id, server_id))
                return server_id, handle

        balancer = _LocalActor(Recording({"r0": _LocalActor(replicas[0]), "r1": _LocalActor(replicas[1])}))
        worker = worker_for(tiny_model, tmp_path, None)
        client = LLMServerClient(worker.config, load_balancer_handle=balancer)
        worker.llm_client = client

        async def main() -> DataProto:
            try:
                return await worker.generate_sequences(batch_of(["med-create-file", "easy-sum", "med-create-file"]))
            finally:
                for r in replicas:
                    await r.aclose()
                bridge_mod.close_bridges()

        out = asyncio.run(main())
    info = list(out.non_tensor_batch["openforge"])
    # veRL's session id is the rollout's; every call of a rollout went to one replica (sticky)
    assert sorted(session for session, _ in acquired) == sorted(i["rollout_id"] for i in info for _ in range(i["n_calls"]))
    assert all(len({sid for s, sid in acquired if s == i["rollout_id"]}) == 1 for i in info)
    # token-exact: each sampled span is a call a replica answered, at the prompt that precedes it
    answered = [(p, t) for r in replicas for _, p, t in r.calls]
    for i in range(3):
        prompt, response, mask, _ = unpad(out, i)
        for start, end in runs_of(mask):
            seq = prompt + response[:start]
            assert any(p == seq and t.token_ids == response[start:end] for p, t in answered)
    last = out.batch["attention_mask"][:, PROMPT_LEN:].sum(dim=1) - 1
    assert out.batch["rm_scores"][torch.arange(3), last].tolist() == [1.0, 1.0, 1.0]
    assert sum(len(e.requests) for e in engines) == 5


@pytest.mark.slow
def test_verl_worker_with_the_embedded_engine_sampling_the_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    from openforge.engine.embedded import EmbeddedEngine
    from openforge.config import EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_model), max_batch_size=4))
    try:
        with serve_in_thread(engine.app) as eng:
            server = EmbeddedVerlServer(eng.url, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN)
            worker = worker_for(tiny_model, tmp_path, server, temperature=1.0,
                                forge_toml='[harness]\nname = "mini"\nmax_turns = 2\n[proxy]\nmax_tokens_cap = 24\n')
            out = generate(worker, batch_of(["easy-sum", "easy-sum"]), server)
    finally:
        engine.close()
    check_token_exact(out, server)
    assert all(len(tok.token_ids) <= 24 for _, _, tok in server.calls)
    last = out.batch["attention_mask"][:, PROMPT_LEN:].sum(dim=1) - 1
    assert out.batch["rm_scores"][torch.arange(2), last].tolist() == [0.0, 0.0]  # random weights answer wrong


def _rollout_with_segments(store: Store, status: str = "scored", reward: float | None = 1.0,
                           failure_kind: str | None = None) -> Any:
    run = store.create_run(kind="train")
    ro = store.create_rollout(run_id=run.id, task_id="easy-sum", step=0, sample_index=0, harness="claude-code")
    ids = [store.add_call(Call(run_id=run.id, rollout_id=ro.id, seq=s, api="anthropic_messages", status="ok",
                               request_json={}, latency_ms=100.0)).id for s in range(3)]
    store.replace_trajectories(ro.id, [
        Trajectory(run_id=run.id, rollout_id=ro.id, segment=0, token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                   loss_mask=[0, 0, 1, 1, 0, 0, 1, 1], logprobs=[0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4],
                   call_ids=ids[:2]),
        Trajectory(run_id=run.id, rollout_id=ro.id, segment=1, token_ids=[9, 9, 10, 11],
                   loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -0.5, -0.6], call_ids=ids[2:])])
    store.update_rollout(ro.id, status=status, reward=reward, failure_kind=failure_kind, n_segments=2)
    return store.get_rollout(ro.id)


def test_segments_map_to_one_output_and_a_failed_rollout_gets_no_reward(store: Store) -> None:
    ro = _rollout_with_segments(store)
    last = output_of(store, ro, response_length=64)
    assert (last.prompt_ids, last.response_ids, last.response_mask) == ([9, 9], [10, 11], [1, 1])
    assert last.response_logprobs == pytest.approx([-0.5, -0.6]) and last.reward_score == 1.0
    assert last.num_turns == 2 and last.extra_fields["openforge"]["n_segments"] == 2
    longest = output_of(store, ro, response_length=64, segment="longest")
    assert (longest.prompt_ids, longest.response_ids) == ([1, 2], [3, 4, 5, 6, 7, 8])
    assert longest.response_mask == [1, 1, 0, 0, 1, 1] and longest.num_turns == 4
    cut = output_of(store, ro, response_length=3, segment="longest")
    assert cut.response_ids == [3, 4, 5] and cut.extra_fields["openforge"]["response_truncated"]
    seen = _rollout_with_segments(store)
    [_, last_seg] = sorted(store.list_trajectories(rollout_ids=[seen.id]), key=lambda t: t.segment)
    store.replace_trajectories(seen.id, [Trajectory(run_id=seen.run_id, rollout_id=seen.id, segment=0, token_ids=[9, 10],
                                                    loss_mask=[0, 1], logprobs=[0, -0.1], call_ids=last_seg.call_ids,
                                                    images=["ab" * 32])])
    with pytest.raises(TrainerError, match="has images"):  # not silently trained without its pixels
        output_of(store, seen, response_length=64)
    failed = _rollout_with_segments(store, status="failed", reward=None, failure_kind="infra")
    with pytest.raises(OpenForgeRolloutFailed, match="without a reward"):
        output_of(store, failed, response_length=64)


def test_engine_adapter_refuses_foreign_requests_and_servers_that_ignore_stops(tiny_model: Path) -> None:
    from verl.workers.rollout.replica import TokenOutput

    from openforge.engine.protocol import BadRequest

    eng = ScriptedEngine(tiny_model, ["x"])
    eos = eng.eos_id

    class Server:  # returns tokens past the eos: not SGLang's stop rules
        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
            self.params, self.request_id = sampling_params, request_id
            return TokenOutput(token_ids=[5, eos, 6], log_probs=[-0.1, -0.2, -0.3])

    async def main() -> None:
        server = Server()
        backend = VerlServerBackend(server, eng.tokenizer, model_path=str(tiny_model), context_length=256,
                                    owner_loop=asyncio.get_running_loop(),
                                    params_for=lambda rid: {"temperature": 0.3} if rid.startswith("ro_1") else None)
        body = {"input_ids": [1, 2, 3], "rid": "ro_2_abc", "sampling_params": {"max_new_tokens": 8}}
        with pytest.raises(BadRequest) as refused:
            await backend.start(body)
        assert refused.value.status == 403
        with pytest.raises(BadRequest, match="past a stop") as past:
            await backend.start({**body, "rid": "ro_1_abc"})
        assert past.value.status == 502
        assert server.params == {"temperature": 0.3, "max_tokens": 8, "logprobs": True}
        assert server.request_id == "ro_1"  # the rollout's session id, not the proxy's per-call rid

    asyncio.run(main())
