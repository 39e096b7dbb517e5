"""Task families by name, and what is known of a family before any task is read: its class and its payload.

    KINDS                                the families forge ships, in the order they claim a task; one line each
    entry points `openforge.task_kinds`  installed packages: `name = "package.module:KindClass"`

A family's class is imported only when a task or a command asks for it (`forge` starts fast, and a broken
plugin matters only to whoever uses its tasks). The task loader finds a `family` payload's model here by its
`kind` (`payload_model`), so this module knows nothing of a task: rollouts/tasks/kinds.py holds the protocol
and decides a task's family, rollouts/tasks/format.py reads tasks, and both import this one.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from openforge.errors import TaskError
from openforge.lazy import lazy_class
from openforge.rollouts.tasks.payload import FamilyPayload

ENTRY_POINT_GROUP = "openforge.task_kinds"

# name -> (module, class): the families forge ships, in the order they claim a task. One line per family.
KINDS: dict[str, tuple[str, str]] = {
    "harbor": ("openforge.rollouts.tasks.harbor.kind", "HarborKind"),
    "osworld": ("openforge.rollouts.tasks.osworld.kind", "OSWorldKind"),
    "claweval": ("openforge.rollouts.tasks.claweval.kind", "ClawEvalKind"),
    "desktop": ("openforge.rollouts.tasks.desktop.kind", "DesktopKind"),
    "web": ("openforge.rollouts.tasks.web.kind", "WebKind"),
    "gsm8k": ("openforge.rollouts.tasks.gsm8k.kind", "Gsm8kKind"),
}

_installed: dict[str, Any] = {}  # an installed package's family class, by name, once loaded


class UnknownFamily(TaskError):
    """No family of this name is shipped or installed."""


def family_names() -> list[str]:
    """Every family's name, shipped then installed (not the plain kind: rollouts/tasks/kinds.py)."""
    return list(dict.fromkeys([*KINDS, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))]))


def _unknown(name: str) -> str:
    return (f"unknown task family {name!r} (known: {', '.join(family_names())}): a family from another package "
            f"is found once that package is installed where forge runs (`pip install` it: it declares {name!r} in "
            f"the entry-point group {ENTRY_POINT_GROUP})")


def kind_class(name: str) -> Any:
    """The class of family `name`. UnknownFamily when none is shipped or installed by that name; TaskError
    when its module cannot be imported."""
    if name in _installed:
        return _installed[name]
    try:
        if name in KINDS:
            return lazy_class(*KINDS[name])
        found = entry_points(group=ENTRY_POINT_GROUP, name=name)
        if not found:
            raise UnknownFamily(_unknown(name))
        cls = _installed[name] = next(iter(found)).load()
        return cls
    except (ImportError, LookupError, AttributeError) as exc:
        raise TaskError(f"task family {name!r} cannot be loaded: {exc}") from None


def payload_model(kind: str) -> type[FamilyPayload]:
    """The model of family `kind`'s part of a task (its kind's `payload_model`). TaskError when no such family
    is installed or it brings no payload."""
    model = kind_class(kind).payload_model
    if model is None:
        raise TaskError(f"task family {kind!r} has no payload of its own (its tasks are plain; write them "
                        "without `family`)")
    if not (isinstance(model, type) and issubclass(model, FamilyPayload)):
        raise TaskError(f"task family {kind!r}: its payload_model {model!r} is not a FamilyPayload")
    return model
