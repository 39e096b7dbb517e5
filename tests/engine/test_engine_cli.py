"""`forge engine` and `forge model tiny` as a user runs them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from openforge.engine.client import EngineClient
from openforge.forge_cli.main import app

runner = CliRunner()


def test_model_tiny_builds_a_loadable_model_and_refuses_a_full_folder(tmp_path):
    target = tmp_path / "tiny"
    result = runner.invoke(app, ["model", "tiny", str(target)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"built the tiny model in {target}")
    assert (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file()
    assert json.loads((target / "config.json").read_text())["max_position_embeddings"] == 131072
    short = runner.invoke(app, ["model", "tiny", str(tmp_path / "short"), "--context", "8192"])
    assert short.exit_code == 0 and "context 8,192 tokens" in short.output
    assert json.loads((tmp_path / "short" / "config.json").read_text())["max_position_embeddings"] == 8192
    # RoPE has no position table: the context length changes no weight.
    assert (tmp_path / "short" / "model.safetensors").read_bytes() == (target / "model.safetensors").read_bytes()
    again = runner.invoke(app, ["model", "tiny", str(target)])
    assert again.exit_code == 1 and "is not empty (use --force to overwrite)" in again.output


def test_model_tiny_defaults_to_the_learnable_gain_forge_up_builds(tmp_path):
    from safetensors.torch import load_file

    from openforge.engine.tiny import LEARNABLE_NORM_GAIN

    runner.invoke(app, ["model", "tiny", str(tmp_path / "a")])
    runner.invoke(app, ["model", "tiny", str(tmp_path / "b"), "--norm-gain", "1"])
    gain = {name: float(load_file(tmp_path / name / "model.safetensors")["model.norm.weight"].mean())
            for name in ("a", "b")}
    assert gain == {"a": LEARNABLE_NORM_GAIN, "b": 1.0}
    bad = runner.invoke(app, ["model", "tiny", str(tmp_path / "c"), "--norm-gain", "0"])
    assert bad.exit_code == 1 and "--norm-gain must be positive" in bad.output


def test_engine_with_a_wrong_model_path_is_one_line(tmp_path):
    result = runner.invoke(app, ["engine", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert result.output.strip() == (f"forge: error: model path {tmp_path / 'missing'} does not exist "
                                     f"(build the tiny model with `forge model tiny {tmp_path / 'missing'}`)")


@pytest.mark.slow
def test_forge_engine_prints_its_url_first_and_serves_until_sigint(tiny_model):
    proc = subprocess.Popen([sys.executable, "-m", "openforge.forge_cli.main", "engine", "--model", str(tiny_model), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"engine: serving {tiny_model} at http://127.0.0.1:"), first
        url = first.split(" at ")[1].split()[0]

        async def probe():
            async with EngineClient(url) as client:
                await client.wait_healthy(60)
                return await client.generate([3, 4], {"max_new_tokens": 3, "ignore_eos": True})
        assert len(asyncio.run(probe()).output_ids) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
