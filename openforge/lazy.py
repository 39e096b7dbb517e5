"""`lazy_class(module, name)`: a class named in a registry (sandbox backends, harness adapters), imported
only when asked for, so `forge` starts fast and a backend's missing SDK matters only to whoever uses it."""

from __future__ import annotations

import importlib


def lazy_class(module_name: str, class_name: str) -> type:
    """`module_name.class_name`, imported now. ImportError when the module (or what it imports) cannot be
    imported; LookupError when it defines no such class. Callers turn both into their own one-line error."""
    module = importlib.import_module(module_name)
    cls = vars(module).get(class_name)
    if not isinstance(cls, type):
        raise LookupError(f"{module_name} defines no class {class_name}")
    return cls
