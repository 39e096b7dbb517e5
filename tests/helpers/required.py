"""What a test needs that the machine may lack, and whether its absence skips the test or fails it.

A user's plain `pytest` skips a test whose tool is missing, saying why. CI installs those tools
(.ci/run) and sets FORGE_REQUIRE=docker,npm,...: there a missing tool means the install broke, and a
skip would hide it, so the same test FAILS with the same reason. Every such skip goes through here:

    skip_or_fail("docker", why)                       # inside a test or fixture (or at module level)
    pytestmark = requires("chromium", why_or_none)    # a mark: conftest.py's setup hook applies it
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_ENV = "FORGE_REQUIRE"
# The tools .ci/run installs; FORGE_REQUIRE may name only these (a typo would silently require nothing).
KNOWN_REQUIREMENTS = ("docker", "npm", "chromium", "browser-use", "verl", "postgres", "tracking", "osworld",
                      "desktop", "libreoffice")  # libreoffice: a manual check, not installed by CI


class UnknownRequirement(ValueError):
    """FORGE_REQUIRE names something no test checks for."""


def required() -> frozenset[str]:
    """The requirements FORGE_REQUIRE names (comma-separated). FORGE_REQUIRE_POSTGRES=1, the older
    switch for PostgreSQL alone, still counts as `postgres`."""
    names = {part.strip() for part in os.environ.get(REQUIRE_ENV, "").split(",") if part.strip()}
    unknown = sorted(names - set(KNOWN_REQUIREMENTS))
    if unknown:
        raise UnknownRequirement(f"{REQUIRE_ENV} names {', '.join(unknown)}; known: {', '.join(KNOWN_REQUIREMENTS)}")
    if os.environ.get("FORGE_REQUIRE_POSTGRES") == "1":
        names.add("postgres")
    return frozenset(names)


def skip_or_fail(requirement: str, reason: str) -> NoReturn:
    """Skip the current test (or module) because `requirement` is missing here; fail it instead when
    FORGE_REQUIRE names `requirement`. A name outside KNOWN_REQUIREMENTS (e.g. a sandbox backend
    CI does not install, `local-bwrap`) is never required: it always skips."""
    if requirement in required():
        pytest.fail(f"{REQUIRE_ENV} requires {requirement}, but: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def requires(requirement: str, missing: str | None) -> pytest.MarkDecorator:
    """A mark for a test or module that needs `requirement`; `missing` is why it cannot run here, or
    None when it can. conftest.py's setup hook calls skip_or_fail for it (a skipif mark cannot fail)."""
    return pytest.mark.requires(requirement, missing)
