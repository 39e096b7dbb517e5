"""LoRA adapters loaded, unloaded and swapped at run time through PEFT, by name.

PEFT injects LoRA layers into the served model in place; `activate(name)` picks the adapter a forward
pass uses (None = the base model, with every adapter disabled). Batches are grouped by adapter, so
one forward pass never mixes adapters. Unloading the last adapter restores the original modules.
Only the scheduler thread calls these (between steps), so no lock is needed.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openforge.errors import EngineError

# PeftModel.__init__ reads transformers 5's deprecated `is_gradient_checkpointing`: a FutureWarning on
# every adapter loaded, about code that is not ours.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def check_adapter_dir(path: str) -> Path:
    p = Path(path).expanduser()
    if not (p / "adapter_config.json").is_file():
        raise EngineError(f"{p} is not a PEFT adapter folder (no adapter_config.json)")
    try:
        json.loads((p / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"cannot read {p / 'adapter_config.json'}: {exc}") from None
    return p


class AdapterSet:
    """The adapters loaded into one model: name -> path."""

    def __init__(self, model: Any) -> None:
        self.model = model  # the transformers model; PEFT modifies its modules in place
        self.peft: Any = None  # the PeftModel wrapper once an adapter is loaded
        self.paths: dict[str, str] = {}

    def load(self, name: str, path: str) -> None:
        from peft import PeftModel

        if name in self.paths:
            raise EngineError(f"a LoRA adapter named {name!r} is already loaded; unload it first or use a new name")
        folder = check_adapter_dir(path)
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.model, str(folder), adapter_name=name)
            else:
                self.peft.load_adapter(str(folder), adapter_name=name)
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EngineError(f"cannot load LoRA adapter {name!r} from {folder}: {first}") from None
        self.peft.eval()
        self.paths[name] = str(folder)

    def unload(self, name: str) -> None:
        if name not in self.paths:
            raise EngineError(f"LoRA adapter {name!r} is not loaded")
        if len(self.paths) == 1:
            # Removing the last adapter: put the original modules back, leaving the plain model.
            self.peft.unload()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
        del self.paths[name]

    @contextlib.contextmanager
    def activate(self, name: str | None) -> Iterator[None]:
        if self.peft is None:
            if name is not None:
                raise EngineError(f"LoRA adapter {name!r} is not loaded")
            yield
        elif name is None:
            with self.peft.disable_adapter():
                yield
        else:
            self.peft.set_adapter(name)
            yield
