"""OpenForge's own environment variables are all named `FORGE_*`. A few were once `OPENFORGE_*`
(`OPENFORGE_IMAGE_CACHE`, `OPENFORGE_DEBIAN_MIRROR`, `OPENFORGE_BUILD_*_IMAGE`); a user may still have
those set in a shell profile or a CI job, so `forge_env` reads the old name when the new one is unset."""

from __future__ import annotations

import os

_OLD_PREFIX = "OPEN"  # OPENFORGE_X was the name of FORGE_X


def forge_env(name: str, default: str = "") -> str:
    """`$name` (a `FORGE_*` variable), else its pre-rename `$OPENFORGE_*`, else `default`."""
    if not name.startswith("FORGE_"):
        raise ValueError(f"{name!r} is not one of OpenForge's variables (FORGE_*)")
    return os.environ.get(name) or os.environ.get(_OLD_PREFIX + name) or default
