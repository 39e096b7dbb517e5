"""trainer/model_export.py: a checkpoint's PEFT adapter leaves as exactly the files PeftModel loads (the merged
weights, loaded back and compared logit for logit, are tests/trainer/test_export_models.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.errors import TrainerError
from openforge.trainer.model_export import PEFT_FILES, write_peft


def test_a_peft_export_copies_exactly_the_adapter_files(tmp_path: Path) -> None:
    adapter = tmp_path / "step-2"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    with pytest.raises(TrainerError, match="not a PEFT adapter folder.*adapter_model.safetensors"):
        write_peft(adapter, tmp_path / "out")
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00weights")
    (adapter / "optimizer.pt").write_bytes(b"not exported")
    out = write_peft(adapter, tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (out / "adapter_model.safetensors").read_bytes() == b"\x00weights"
    assert set(PEFT_FILES) == {"adapter_config.json", "adapter_model.safetensors"}
