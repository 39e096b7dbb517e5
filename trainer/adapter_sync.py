"""Getting each new adapter (or full-weight checkpoint) the trainer saves into the serving engine."""

from __future__ import annotations

from typing import Any

from openforge.errors import EngineError
from openforge.trainer.bridge import BackgroundLoop


class AdapterSync:
    """Hot-loads each new adapter into the engine under a new name and unloads old ones.

    The adapter of step N-1 stays loaded while N is being served: with one-step-off-policy overlap,
    rollouts that started with it may still be running."""

    def __init__(self, client: Any, bridge: BackgroundLoop, keep: int = 2) -> None:
        self.client, self.bridge, self.keep = client, bridge, keep
        self.loaded: list[str] = []

    def load(self, name: str, path: str) -> None:
        try:
            self.bridge.run(self.client.load_lora_adapter(name, path))
        except EngineError as first:
            # A long-lived engine (kind = "url") may hold this name from before a resume; SGLang
            # refuses to load a name twice, so replace it. Any other failure is the one reported.
            try:
                self.bridge.run(self.client.unload_lora_adapter(name))
            except EngineError:
                raise first from None
            self.bridge.run(self.client.load_lora_adapter(name, path))
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            self.bridge.run(self.client.unload_lora_adapter(self.loaded.pop(0)))

    def retain(self, n: int) -> None:
        """Keep at least the newest `n` adapters loaded (asynchronous training: groups sampled by
        older versions are still running)."""
        self.keep = max(self.keep, n)

    def update_weights(self, path: str) -> None:
        """Full fine-tuning: the engine reloads its base weights from the saved model folder."""
        self.bridge.run(self.client.update_weights_from_disk(path))
