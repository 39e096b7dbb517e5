"""`forge export --format verl-sft|verl-rl`: datasets read back by veRL's own classes.

A run the suite makes itself (the scripted engine behind the real proxy, mini in real sandboxes: a file task
with tool calls that passes, an answer task that passes, one that fails) plus a hand-made Claude Code-style
rollout (Anthropic Messages calls) whose history was rewritten, so its trajectory has two segments. The
files are loaded with veRL's MultiTurnSFTDataset and RLHFDataset on the tiny model's tokenizer, and the
reward module is loaded through veRL's own custom-reward loader. The veRL parts skip where veRL 0.9.1 is not
importable (`pip install -e '.[verl]'` and `pip install --no-deps verl==0.9.1`: see docs/trainer.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from openforge.forge_cli.main import app
from openforge.config import ForgeConfig
from openforge.store import Call, Store, Trajectory
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec, load_tasks
from tests.helpers.verl_data import multiturn_sft_dataset, verl_or_skip
from tests.helpers.paths import REPO
from tests.helpers.mini import serve  # noqa: F401 - the scripted engine behind the real proxy, as a fixture
from openforge.integrations.verl.data import DATA_SOURCE, rl_rows, sft_rows

WRITE = '<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hello world\\n"}}\n</tool_call>'
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "hello.txt"}}\n</tool_call>'


def script(tokenizer: Any) -> Any:
    def answer(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if "What is 2 + 3" in prompt:
            return "5"
        if "How many words" in prompt:
            return "9"  # wrong: 4
        if "<tool_response>\nhello world" in prompt:
            return "Done: hello world"
        return READ if "wrote 12 characters" in prompt else WRITE

    return answer


def claude_style_rollout(store: Store, run_id: str) -> str:
    """Two Anthropic calls of task easy-sum; the second rewrote the history (a new system prompt), so the
    trajectory has two segments, one call each."""
    tools = [{"name": "Bash", "description": "run a command",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    ro = store.create_rollout(run_id=run_id, task_id="easy-sum", step=0, sample_index=9, harness="claude-code")
    first = {"model": "m", "max_tokens": 64, "system": "You are Claude Code.", "tools": tools,
             "messages": [{"role": "user", "content": "What is 2 + 3? Answer with the number."}]}
    second = {**first, "system": "You are Claude Code, compacted.", "messages": [
        *first["messages"],
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                           "input": {"command": "echo $((2+3))"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5\n"}]}]}
    ids = []
    for seq, (req, resp, tcs) in enumerate([
        (first, {"type": "message", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                                 "input": {"command": "echo $((2+3))"}}]},
         [{"id": "toolu_1", "name": "Bash", "arguments": {"command": "echo $((2+3))"}}]),
        (second, {"type": "message", "content": [{"type": "text", "text": "5"}]}, []),
    ]):
        call = store.add_call(Call(run_id=run_id, rollout_id=ro.id, seq=seq, api="anthropic_messages", status="ok",
                                   request_json=req, response_json=resp, tool_calls_json=tcs,
                                   break_reason="system prompt changed" if seq else None))
        ids.append(call.id)
    store.replace_trajectories(ro.id, [Trajectory(run_id=run_id, rollout_id=ro.id, segment=s, token_ids=[1, 2],
                                                  loss_mask=[0, 1], logprobs=[0.0, -0.1], call_ids=[i])
                                       for s, i in enumerate(ids)])
    store.update_rollout(ro.id, status="scored", reward=1.0, n_segments=2)
    return ro.id


@pytest.fixture
def recorded_run(serve, store: Store) -> str:  # noqa: ANN001
    proxy, engine = serve([])
    engine.script = script(engine.tokenizer)
    tasks = {t.id: t for t in load_tasks("builtin")}
    run = store.create_run(kind="eval")
    runner = RolloutRunner(store, config=ForgeConfig(), proxy_url=proxy.url, proxy_socket=proxy.uds)
    out = asyncio.run(runner.run(run.id, [RolloutSpec(tasks[t]) for t in ("med-create-file", "easy-sum",
                                                                             "easy-count-words")]))
    assert [(r.task_id, r.status, r.reward) for r in out] == [
        ("med-create-file", "scored", 1.0), ("easy-sum", "scored", 1.0), ("easy-count-words", "scored", 0.0)], \
        [(r.error, r.stderr[-500:]) for r in out]
    claude_style_rollout(store, run.id)
    return run.id


def test_rows_are_the_recorded_chats_and_files_are_regular(store: Store, recorded_run: str, tmp_path: Path) -> None:
    """verl-sft: one row per segment of the rollouts that passed, the segment's last chat plus the answer."""
    rows = sft_rows(store, recorded_run)
    assert sorted((r["task_id"], r["harness"], r["segment"]) for r in rows) == [
        ("easy-sum", "claude-code", 0), ("easy-sum", "claude-code", 1), ("easy-sum", "mini", 0),
        ("med-create-file", "mini", 0)]  # the failed easy-count-words is left out
    mini = next(r for r in rows if r["task_id"] == "med-create-file")
    msgs = mini["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [[(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in m["tool_calls"]]
            for m in msgs if m["role"] == "assistant"] == [
        [("write_file", {"path": "hello.txt", "content": "hello world\n"})], [("read_file", {"path": "hello.txt"})], []]
    assert msgs[-1]["content"] == "Done: hello world" and msgs[5]["content"].startswith("hello world")
    assert msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]  # the result answers the call
    assert {t["function"]["name"] for t in mini["tools"]} >= {"bash", "read_file", "write_file"}
    seg0, seg1 = sorted((r for r in rows if r["harness"] == "claude-code"), key=lambda r: r["segment"])
    assert [m["role"] for m in seg0["messages"]] == ["system", "user", "assistant"]
    assert seg0["messages"][2]["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"command": "echo $((2+3))"}'}
    assert [m["role"] for m in seg1["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert seg1["messages"][0]["content"] == "You are Claude Code, compacted." and seg1["messages"][-1]["content"] == "5"
    assert seg1["tools"] == [{"type": "function", "function": {"name": "Bash", "description": "run a command",
                              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    # --min-reward 0 keeps the failed one too
    assert len(sft_rows(store, recorded_run, min_reward=0.0)) == 5

    # verl-rl: one row per task, its prompt the chat the harness really sent on its first call
    rows = rl_rows(store, recorded_run)
    assert [r["extra_info"]["task_id"] for r in rows] == ["easy-count-words", "easy-sum", "med-create-file"]
    by_task = {r["extra_info"]["task_id"]: r for r in rows}
    mini_first = min((c for c in store.list_calls(run_id=recorded_run) if c.rollout_id in
                      {r.id for r in store.list_rollouts(recorded_run) if r.task_id == "easy-sum" and r.harness == "mini"}),
                     key=lambda c: c.seq)
    prompt = by_task["easy-sum"]["prompt"]
    assert [(m["role"], m["content"]) for m in prompt] == [(m["role"], m["content"])
                                                           for m in mini_first.request_json["messages"]]
    assert prompt[0]["role"] == "system" and "What is 2 + 3?" in prompt[1]["content"]  # the real chat, not the bare instruction
    assert by_task["easy-sum"]["reward_model"] == {"style": "rule", "ground_truth": '{"number": 5.0}'}
    assert by_task["med-create-file"]["reward_model"]["ground_truth"] == ""
    assert all(r["data_source"] == DATA_SOURCE and r["ability"] == "agent" for r in rows)
    assert json.loads(by_task["med-create-file"]["extra_info"]["task"])["expect_files"] == {"hello.txt": "hello world\n"}

    runner = CliRunner()
    for fmt, n, what in (("verl-sft", 4, "conversation(s) of passing rollouts"), ("verl-rl", 3, "task prompt(s)")):
        res = runner.invoke(app, ["export", recorded_run, "--format", fmt, "--out", str(tmp_path / f"{fmt}.parquet")])
        assert res.exit_code == 0 and f"wrote {n} {what}" in res.output, res.output
        shown = res.output.split("path=")[1].split()[0]  # how to point veRL at this repo's class / function
        assert Path(shown).is_file() and shown.endswith("verl/sft.py" if fmt == "verl-sft" else "verl/reward.py")
        table = pq.read_table(tmp_path / f"{fmt}.parquet")
        assert table.num_rows == n
        # regular: every column a typed arrow column (no opaque object column), the same for every row
        assert all(str(t) not in ("null", "binary") for t in table.schema.types), table.schema
        res = runner.invoke(app, ["export", recorded_run, "--format", fmt, "--out", str(tmp_path / f"{fmt}.jsonl")])
        assert res.exit_code == 0, res.output
        assert len((tmp_path / f"{fmt}.jsonl").read_text().splitlines()) == n
    res = runner.invoke(app, ["export", recorded_run, "--format", "verl-sft", "--min-reward", "0",
                              "--out", str(tmp_path / "all.parquet")])
    assert "wrote 5 conversation(s)" in res.output, res.output


# -- veRL's own classes ------------------------------------------------------------------------------------


def test_verl_datasets_load_the_files_and_its_loader_runs_the_reward(store: Store, recorded_run: str,
                                                                    tmp_path: Path, tiny_model: Path) -> None:
    """verl-sft in veRL's MultiTurnSFTDataset: only the assistant turns are trained on."""
    verl_or_skip()
    from transformers import AutoTokenizer

    path = tmp_path / "sft.parquet"
    assert CliRunner().invoke(app, ["export", recorded_run, "--format", "verl-sft", "--out", str(path)]).exit_code == 0
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ds = multiturn_sft_dataset()(str(path), tok, {"max_length": 4096, "truncation": "error",
                                                  "messages_key": "messages", "tools_key": "tools"})
    rows = pq.read_table(path).to_pylist()
    assert len(ds) == len(rows) == 4
    for i, row in enumerate(rows):
        item = ds[i]  # veRL's sanity check (per-turn rendering == whole rendering) runs inside
        ids, loss = item["input_ids"], item["loss_mask"]
        n = int(item["attention_mask"].sum())
        trained = tok.decode(ids[:n][loss[:n] == 1])
        context = tok.decode(ids[:n][loss[:n] == 0])
        said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        for m in row["messages"]:
            if m["role"] == "assistant":
                assert m["content"] in trained and all(tc["function"]["name"] in trained for tc in m["tool_calls"])
            elif m["content"].strip():  # the context (system, user, tool results) is never trained on
                assert m["content"].strip() in context
                assert m["content"].strip() not in trained or any(m["content"].strip() in a for a in said)
        assert trained.count("<|im_end|>") == sum(m["role"] == "assistant" for m in row["messages"])

    # ForgeSFTDataset, loaded the way veRL's SFT trainer loads `data.custom_cls`: the messages and tools exactly
    # as the proxy rendered them, so veRL's tokens are the recorded ones: the last call's prompt and completion
    from verl.utils.import_utils import load_extern_object

    exact = load_extern_object(str(REPO / "integrations" / "verl" / "sft.py"), "ForgeSFTDataset")(
        str(path), tok, {"max_length": 4096, "truncation": "error"})
    calls = {c.id: c for c in store.list_calls(run_id=recorded_run)}
    trajs = {(t.rollout_id, t.segment): t for t in store.list_trajectories(run_id=recorded_run)}
    for i, row in enumerate(rows):
        if row["harness"] != "mini":
            continue  # the hand-made rollout has no recorded tokens
        item = exact[i]
        n = int(item["attention_mask"].sum())
        ids, loss = item["input_ids"][:n].tolist(), item["loss_mask"][:n].tolist()
        last = calls[trajs[(row["rollout_id"], row["segment"])].call_ids[-1]]
        assert ids[:len(last.prompt_ids) + len(last.completion_ids)] == last.prompt_ids + last.completion_ids
        seg_calls = [calls[c] for c in trajs[(row["rollout_id"], row["segment"])].call_ids]
        trained = tok.decode([t for t, m in zip(ids, loss) if m])
        assert trained == "".join(tok.decode(c.completion_ids) + "\n" for c in seg_calls)  # every sampled turn

    # verl-rl in veRL's RLHFDataset, graded by integrations/verl/reward.py loaded through veRL's own loader
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = tmp_path / "rl.parquet"
    assert CliRunner().invoke(app, ["export", recorded_run, "--format", "verl-rl", "--out", str(path)]).exit_code == 0
    ds = RLHFDataset(data_files=str(path), tokenizer=tok, config=OmegaConf.create({
        "max_prompt_length": 4096, "filter_overlong_prompts": True, "cache_dir": str(tmp_path / "cache"),
        "filter_overlong_prompts_workers": 1}))
    assert len(ds) == 3  # no prompt was filtered out: each renders through the tokenizer's chat template
    rows = {r["extra_info"]["task_id"]: r for r in rl_rows(store, recorded_run)}
    items = {ds[i]["extra_info"]["task_id"]: ds[i] for i in range(len(ds))}
    assert [m["content"] for m in items["easy-sum"]["raw_prompt"]] == [m["content"] for m in rows["easy-sum"]["prompt"]]

    score = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(REPO / "integrations" / "verl" / "reward.py"), "name": "compute_score"}}}))
    item = items["easy-sum"]

    def grade(response: str, it: dict[str, Any] = item) -> float:  # as veRL's reward managers call it
        return score(data_source=it["data_source"], solution_str=response,
                     ground_truth=it["reward_model"]["ground_truth"], extra_info=it["extra_info"])

    assert [grade(r) for r in ("5", " 5. ", "**5**", "The answer is 5", "6", "")] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    # a file task: the response is only an answer, so the expected file is missing: 0, graded in a sandbox
    assert grade("Done: hello world", items["med-create-file"]) == 0.0
    with pytest.raises(ValueError, match="is not graded here"):
        score(data_source="openai/gsm8k", solution_str="5", ground_truth="5", extra_info={})


def test_reward_runs_a_shell_verifier_on_the_answer_in_a_sandbox() -> None:
    from openforge.integrations.verl.reward import compute_score

    task = TaskSpec(id="answer-file", instruction="say 42", verifier="grep -qx 42 .forge/answer.txt")
    info = {"task": json.dumps(task.to_record())}
    assert compute_score(DATA_SOURCE, "42", "", info) == 1.0
    assert compute_score(DATA_SOURCE, "41", "", info) == 0.0
