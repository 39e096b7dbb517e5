"""`forge analyze` on runs the suite makes itself through the real Claude Code and Codex CLIs: the scripted
engine behind the real proxy plays the same four-turn conversation in each harness (a check that fails,
an edit, the same check again, the answer), the runner grades it, and the metrics computed from what the
proxy recorded must be the ones that conversation implies; `--by harness` compares the two runs. The same
runs are then exported with `forge export --format verl-sft` and read back through veRL (ForgeSFTDataset).

Skipped (with the reason) unless both harnesses are installed in the npm cache (.ci/run installs them;
see tests/rollouts/harnesses/test_real_harnesses.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig, HarnessConfig
from openforge.rollouts.analysis.analyze import analyze
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.runner.transcript import transcript_of
from openforge.sandbox.testing import proxy_socket_path
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture
from tests.helpers.harnesses import NPM_CACHE, needs

pytestmark = pytest.mark.timeout(240)

# The outputs below are split so that a marker appears in the prompt only once the tool's *result* came back,
# never from the call's own arguments: the script moves on when it sees one.
CHECK = "cat proof.txt"  # fails first (no file yet), then succeeds: a failed step recovered on the same program
WRITE = "printf 'forge-%s\\n' ok > proof.txt && printf 'FORGE_%s\\n' WROTE"  # an edit (a redirection)
FAILED_MARK, WROTE_MARK, CHECKED_MARK = "proof.txt: No such file", "FORGE_WROTE", "forge-ok"
ANSWER = "Done: proof.txt holds forge-ok."
# harness -> (its shell tool, the tool's command argument, other arguments, extra CLI arguments)
HARNESSES: dict[str, tuple[str, str, dict[str, str], list[str]]] = {
    "claude-code": ("Bash", "command", {"description": "step"}, ["--bare", "--tools", "Bash"]),
    "codex": ("exec_command", "cmd", {}, []),
}

# Two declared checkpoints, one of which the agent is never asked to reach: plan completion 0.5, reward 1.
TASK = TaskSpec(
    id="proof-checked", instruction="Write the proof file and check it.", requires_tools=True,
    checkpoints=["written", "signed"],
    verifier=("if grep -qx forge-ok proof.txt; then echo 'checkpoint written: ok'; "
              "else echo 'checkpoint written: fail'; exit 1; fi; "
              "if [ -f signed.txt ]; then echo 'checkpoint signed: ok'; else echo 'checkpoint signed: fail'; fi"),
)


def tool_call(tool: str, argument: str, extra: dict[str, str], command: str) -> str:
    return f'<tool_call>\n{json.dumps({"name": tool, "arguments": {argument: command, **extra}})}\n</tool_call>'


def conversation(tokenizer: Any, tool: str, argument: str, extra: dict[str, str]) -> Any:
    """cat (fails) -> write -> cat (succeeds) -> answer, each step chosen by the results in the prompt."""
    def call(command: str) -> str:
        return tool_call(tool, argument, extra, command)

    def script(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if CHECKED_MARK in prompt:
            return ANSWER
        if WROTE_MARK in prompt:
            return call(CHECK)
        if FAILED_MARK in prompt:
            return call(WRITE)
        return call(CHECK)

    return script


async def run_under(rig: Any, run_id: str, harness: str) -> Any:
    tool, argument, extra, extra_args = HARNESSES[harness]
    rig.engine.script = conversation(rig.engine.tokenizer, tool, argument, extra)
    config = ForgeConfig()
    config.harness = HarnessConfig(name=harness, npm_cache=str(NPM_CACHE), max_turns=8, extra_args=extra_args)
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(run_id, [RolloutSpec(TASK, 0)])
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, harness), \
        (ro.error, ro.verifier_output, rig.served_texts(ro.id), ro.stdout[-2000:])
    return ro


@needs("claude-code")
@needs("codex")
async def test_analyze_compares_claude_code_and_codex_on_the_same_conversation(make_rig, tmp_path: Path):  # noqa: ANN001
    rig = make_rig([], uds=Path(proxy_socket_path()), max_context_tokens=400_000)
    store = rig.store
    claude_run, codex_run = store.create_run(kind="eval").id, store.create_run(kind="eval").id
    claude = await run_under(rig, claude_run, "claude-code")
    codex = await run_under(rig, codex_run, "codex")

    served = {ro.harness: rig.served_texts(ro.id) for ro in (claude, codex)}
    for harness, (tool, argument, extra, _) in HARNESSES.items():
        steps = [tool_call(tool, argument, extra, c) for c in (CHECK, WRITE, CHECK)]
        assert served[harness] == [*steps, ANSWER], harness  # the whole conversation, once
    tokens = {h: sum(len(rig.engine.completion_ids(t)) for t in texts) / 4 for h, texts in served.items()}
    offered = {ro.harness: transcript_of([c for c in rig.calls(ro.id)]).tools_offered for ro in (claude, codex)}
    assert offered["claude-code"] == ["Bash"]  # --tools Bash
    assert "exec_command" in offered["codex"] and len(offered["codex"]) > 1

    report = analyze(store, [claude_run, codex_run], by="harness")
    assert [(g.key, g.n_rollouts) for g in report.groups] == [("claude-code", 1), ("codex", 1)]
    for g in report.groups:
        m = {k: v.mean for k, v in g.metrics.items()}
        # 4 answered calls, 3 tool calls; the last edit (the write) is followed by a check (cat); the one
        # failed step (the first cat: no file yet) is followed by a successful cat; the answer came after
        # tools; the verifier reported one of the two declared checkpoints; one trajectory segment.
        assert (m["turns"], m["tool_calls"], m["self_verified"], m["error_recovery"]) == (4, 3, 1.0, 1.0), g.key
        assert (m["gave_up"], m["plan_completion"], m["prefix_breaks"], m["reward"]) == (0.0, 0.5, 0, 1.0), g.key
        assert m["tool_coverage"] == pytest.approx(1 / len(offered[g.key])), g.key
        assert m["tokens_per_turn"] == pytest.approx(tokens[g.key]), g.key
        assert (g.pass_at["1"], g.break_reasons) == (1.0, {}), g.key
    [change] = report.changes
    assert (change.base, change.other) == ("claude-code", "codex")
    assert change.metrics["tool_coverage"].mean == pytest.approx(1 / len(offered["codex"]) - 1.0)
    for same in ("turns", "tool_calls", "self_verified", "error_recovery", "gave_up", "reward"):
        assert change.metrics[same].mean == 0.0, same

    from openforge.forge_cli.main import app

    out = CliRunner().invoke(app, ["analyze", claude_run, codex_run, "--by", "harness"])
    assert out.exit_code == 0, out.output
    assert "claude-code" in out.output and "codex" in out.output and "self_verified" in out.output
    js = json.loads(CliRunner().invoke(app, ["analyze", claude_run, codex_run, "--by", "harness", "--json"]).output)
    assert {r["harness"]: r["error_recovery"] for r in js["rollouts"]} == {"claude-code": 1.0, "codex": 1.0}


    # The same recorded runs exported for veRL (issue 17): the real harnesses' requests through parquet, and
    # veRL's own tokenisation (ForgeSFTDataset) giving back exactly the tokens the engine was given and sampled.
    import pyarrow.parquet as pq

    for run_id, ro in ((claude_run, claude), (codex_run, codex)):
        out = tmp_path / f"{ro.harness}.parquet"
        res = CliRunner().invoke(app, ["export", run_id, "--format", "verl-sft", "--out", str(out)])
        assert res.exit_code == 0 and "wrote 1 conversation(s)" in res.output, res.output
        [row] = pq.read_table(out).to_pylist()
        exact = json.loads(row["messages_json"])
        assert [m["content"] for m in exact if m["role"] == "assistant"][-1] == ANSWER
        assert sum(m["role"] == "assistant" for m in exact) == 4 and sum(m["role"] == "tool" for m in exact) == 3
        names = [t["function"]["name"] for t in json.loads(row["tools_json"])]  # as rendered (namespaces expanded)
        assert names == ["Bash"] if ro.harness == "claude-code" else "exec_command" in names and len(names) > 1
        verl_tokens_are_the_recorded_ones(rig, out, ro.id)


def verl_tokens_are_the_recorded_ones(rig: Any, path: Path, rollout_id: str) -> None:
    try:
        from tests.helpers.paths import REPO
        from tests.helpers.verl_data import multiturn_sft_dataset, verl_or_skip

        verl_or_skip()
    except pytest.skip.Exception:
        return  # the export above is checked; veRL's side is tests/integrations/test_export_verl.py's, skipped there with why
    from verl.utils.import_utils import load_extern_object

    multiturn_sft_dataset()  # the transformers-version stand-in, if this venv needs it
    ds = load_extern_object(str(REPO / "integrations" / "verl" / "sft.py"), "ForgeSFTDataset")(
        str(path), rig.engine.tokenizer, {"max_length": 120_000, "truncation": "error"})
    item = ds[0]
    n = int(item["attention_mask"].sum())
    last = [c for c in rig.calls(rollout_id) if c.status == "ok"][-1]
    assert item["input_ids"][:n].tolist()[:len(last.prompt_ids) + len(last.completion_ids)] == \
        last.prompt_ids + last.completion_ids
