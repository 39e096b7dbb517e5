"""What the engine refuses before it loads anything: engine/model.py's path, device and dtype, engine/lora.py's
adapter folder, and engine/weights.py's checkpoint (each one line naming what is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openforge.engine.lora import check_adapter_dir
from openforge.engine.model import resolve_device, resolve_dtype, resolve_model_path
from openforge.engine.weights import _base_name, copy_weights_from_disk
from openforge.errors import EngineError


def test_a_model_path_must_be_a_hugging_face_folder(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(EngineError, match="does not exist.*forge model tiny"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(EngineError, match=r"not a Hugging Face checkpoint folder \(no config.json\)"):
        resolve_model_path(str(tmp_path))
    assert resolve_model_path(str(tiny_model)) == tiny_model


def test_device_and_dtype_auto_pick_exact_fp32_on_cpu() -> None:
    cpu = resolve_device("cpu")
    assert cpu.type == "cpu"
    assert resolve_dtype("auto", cpu) is torch.float32  # logprobs exact against the trainer's fp32 pass
    assert resolve_dtype("bfloat16", cpu) is torch.bfloat16
    with pytest.raises(EngineError, match="unknown torch device 'warp-drive'"):
        resolve_device("warp-drive")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="no CUDA device"):
            resolve_device("cuda:0")


def test_an_adapter_folder_needs_a_readable_adapter_config(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="not a PEFT adapter folder"):
        check_adapter_dir(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(EngineError, match="cannot read"):
        check_adapter_dir(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text('{"r": 4}')
    assert check_adapter_dir(str(tmp_path)) == tmp_path


def test_weights_from_disk_map_peft_names_and_refuse_a_non_checkpoint(tmp_path: Path) -> None:
    assert _base_name("model.layers.0.self_attn.q_proj.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert _base_name("model.layers.0.self_attn.q_proj.lora_A.step-1.weight") is None  # adapters stay as loaded
    assert _base_name("model.norm.weight") == "model.norm.weight"
    with pytest.raises(EngineError, match="not a Hugging Face checkpoint folder"):
        copy_weights_from_disk(None, str(tmp_path))  # type: ignore[arg-type] - refused before the model is read
