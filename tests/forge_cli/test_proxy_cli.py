"""`forge proxy` as a real process (against a scripted engine URL) and `forge calls`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import openai
import pytest
from typer.testing import CliRunner

from openforge.engine.scripted import ScriptedEngine
from openforge.engine.serve import serve_in_thread
from openforge.forge_cli.main import app
from openforge.store import Store, hash_key
from tests.helpers.proxy_rig import CHAT_TOOLS, TOOL_TURN

pytestmark = pytest.mark.timeout(120)
FORGE = [sys.executable, "-c", "from forge_cli.main import main; main()"]


def _read_until(proc: subprocess.Popen, prefix: str, deadline: float) -> list[str]:
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no {prefix!r} line; got {lines}")


def test_forge_proxy_records_one_key_and_refuses_others(tiny_model, forge_home):
    engine = ScriptedEngine(tiny_model, [TOOL_TURN, "finished"])
    with serve_in_thread(engine.app) as es:
        proc = subprocess.Popen([*FORGE, "proxy", "--model", str(tiny_model), "--engine", es.url, "--api-key",
                                 "sk-only-this"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "FORGE_HOME": str(forge_home)})
        try:
            lines = _read_until(proc, "api key", time.monotonic() + 60)
            assert lines[0].startswith("run run-") and lines[-1] == "api key sk-only-this"
            url = lines[1].split()[1]
            c = openai.OpenAI(base_url=url + "/v1", api_key="sk-only-this", max_retries=0, timeout=20)
            msgs = [{"role": "user", "content": "ls"}]
            msg = c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS).choices[0].message
            msgs += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                                          "content": "a.txt"}]
            assert c.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS).choices[0].message.content \
                == "finished"
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url + "/v1", api_key="sk-other", max_retries=0).chat.completions.create(
                    model="m", messages=msgs)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "recorded 2 call(s) into 1 segment(s)" in out
    store = Store(forge_home / "forge.db")
    run = store.get_run(lines[0].split()[1])
    assert run.kind == "proxy" and run.status == "stopped"
    (rollout,) = store.list_rollouts(run.id)
    assert rollout.key_hash == hash_key("sk-only-this") and rollout.status == "cancelled" and rollout.n_extends == 1
    (traj,) = store.list_trajectories(rollout_ids=[rollout.id])
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert engine.tokenizer.decode(sampled, skip_special_tokens=True) == TOOL_TURN + "finished"

    runner = CliRunner()
    listed = runner.invoke(app, ["calls", run.id])
    assert listed.exit_code == 0 and "tool_calls" in listed.output and "bash" in listed.output
    first = store.list_calls(run_id=run.id)[0]
    shown = runner.invoke(app, ["calls", run.id, "--show", str(first.id)])
    assert shown.exit_code == 0 and "Let me look." in shown.output
    assert f"{first.logprobs[0]:.4f}" in shown.output
    missing = runner.invoke(app, ["calls", run.id, "--show", "999"])
    assert missing.exit_code == 1 and "no call 999" in missing.output


def test_bad_engine_flag_is_one_line(tiny_model):
    result = CliRunner().invoke(app, ["proxy", "--model", str(tiny_model), "--engine", "gpu-please"])
    assert result.exit_code == 1 and "forge: error: --engine must be" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_restarting_forge_proxy_with_the_same_key_starts_a_new_recorded_session(tiny_model, forge_home):
    """Issue 44: a harness configured with one key is the usual reason to restart `forge proxy --api-key K`.
    The key moves to a new run and says so; the earlier run keeps its calls; a live session's key is refused."""
    engine = ScriptedEngine(tiny_model, ["one", "two"])
    env = {**os.environ, "FORGE_HOME": str(forge_home)}
    argv = [*FORGE, "proxy", "--model", str(tiny_model), "--engine", "", "--api-key", "sk-same"]
    runs = []
    with serve_in_thread(engine.app) as es:
        argv[argv.index("")] = es.url
        for answer in ("one", "two"):
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                lines = _read_until(proc, "api key", time.monotonic() + 60)
                if runs:
                    lines.append(proc.stdout.readline().rstrip("\n"))
                    assert lines[-1] == f"a new recorded session: the key's earlier one is run {runs[0]} (stopped), " \
                                        "kept as it was", lines
                    live = CliRunner().invoke(app, argv[3:])  # the same key while this session serves it
                    assert live.exit_code == 1 and f"that --api-key is serving proxy run {lines[0].split()[1]}" \
                        in live.stderr, live.output
                runs.append(lines[0].split()[1])
                c = openai.OpenAI(base_url=lines[1].split()[1] + "/v1", api_key="sk-same", max_retries=0, timeout=20)
                got = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                assert got.choices[0].message.content == answer
            finally:
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
    store = Store(forge_home / "forge.db")
    assert len(set(runs)) == 2 and all(store.get_run(r).status == "stopped" for r in runs)
    assert [len(store.list_calls(run_id=r)) for r in runs] == [1, 1]  # each session its own record
    assert store.rollout_with_key("sk-same").run_id == runs[1]
