"""ForgeSFTDataset: veRL's MultiTurnSFTDataset on `forge export --format verl-sft` files, exactly.

    # veRL SFT config, with openforge installed in veRL's environment:
    data.custom_cls.path=/path/to/openforge/integrations/verl/sft.py
    data.custom_cls.name=ForgeSFTDataset

veRL's own class reads the `messages` and `tools` columns, which parquet had to make regular: every tool's
JSON schema padded with the other tools' fields as nulls (Claude Code's 24 tools render 48% longer that
way), tool-call arguments as JSON strings (quoted by `tojson` templates such as Qwen2.5's). This subclass
reads `messages_json` and `tools_json` instead: the messages and tools exactly as the proxy passed them to
the chat template when the model was sampled. Everything else (per-turn tokenisation, loss mask, sanity
check, padding) is veRL's. Needs verl (imported here: this file is loaded by veRL, not by forge).
"""

from __future__ import annotations

import json
from typing import Any

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class ForgeSFTDataset(MultiTurnSFTDataset):
    def _read_files_and_process(self) -> None:
        super()._read_files_and_process()
        for column in ("messages_json", "tools_json"):
            if column not in self.dataframe.columns:
                raise ValueError(f"{column} is missing: write the file with `forge export --format verl-sft`")
        self.tools = [json.loads(t) for t in self.dataframe["tools_json"].tolist()]
        self.exact_messages = [json.loads(m) for m in self.dataframe["messages_json"].tolist()]

    def __getitem__(self, item: int) -> Any:
        self._item = item  # _build_messages has only the row; the row's position is what we need
        return super().__getitem__(item)

    def _build_messages(self, example: dict) -> list:
        return json.loads(json.dumps(self.exact_messages[self._item]))  # a fresh copy: templates may edit it
