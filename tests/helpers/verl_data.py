"""veRL's dataset classes for the export tests, imported only inside a test: the skip (a failure under
FORGE_REQUIRE=verl) where veRL is not importable, and its MultiTurnSFTDataset on any transformers."""

from __future__ import annotations

import sys
import types
from typing import Any

from tests.helpers.required import skip_or_fail


def verl_or_skip() -> None:
    try:
        import verl  # noqa: F401
        from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not usable here
        skip_or_fail("verl", f"verl is not importable here ({type(exc).__name__}: {exc}); see docs/trainer.md")


def multiturn_sft_dataset() -> Any:
    """veRL's MultiTurnSFTDataset. verl 0.9.1 supports transformers < 5.11; on a newer one its module fails
    at `from verl.models.transformers.qwen2_vl import get_rope_index` (a Qwen2-VL class transformers
    removed). That helper is used only for Qwen2-VL image processors, never on text, so it is replaced by
    one that refuses to run; every line of the dataset that runs here is veRL's own."""
    try:
        from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    except ImportError as exc:
        if "qwen2_vl" not in str(exc).lower() and "Qwen2VL" not in str(exc):
            raise
        shim = types.ModuleType("verl.models.transformers.qwen2_vl")

        def get_rope_index(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("Qwen2-VL position ids are not used for text data")

        shim.get_rope_index = get_rope_index  # type: ignore[attr-defined]
        sys.modules["verl.models.transformers.qwen2_vl"] = shim
        sys.modules.pop("verl.utils.dataset.multiturn_sft_dataset", None)
        from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    return MultiTurnSFTDataset
