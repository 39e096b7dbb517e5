"""browser-use (PyPI `browser-use`, pinned) as a harness: the spec specs/browser-use.toml says how it runs
(browser_use_agent.py, copied into the sandbox, starts the sandbox's Chromium, drives it over CDP and asks
the proxy's Chat Completions API, with the rollout's key, for its next actions, with a screenshot each
step); this hook holds what a spec cannot say. docs/harnesses.md describes what it sends. (This module is
not named browser_use.py: beside browser_use_agent.py that would shadow the package when the agent runs
from here.)

Installed into its own venv inside the harness cache (beside the npm harnesses, so local sandboxes
see it read-only exactly as they see those):

    forge harness install browser-use      # <cache>/browser-use-venv, pip install browser-use==VERSION

Local sandboxes run that venv's python and the host's chromium. Containers (Docker, Kubernetes pods) run
the browser-use image, the browser image plus that venv's site-packages as a venv over the image's own
python3 at /opt/forge/browser-use (`forge sandbox build-image --harness browser-use`;
sandbox/harness_image.py), and the image's `chromium`. The outcome is browser-use's own
structured history (browser_use_agent.py writes is_done / is_successful / final_result / errors):
done is the answer (its `text`); an API error without done, a crash or a missing result is a harness
failure (never graded); the step limit reached without done is the policy's doing, graded with an
empty answer (a state-graded task is graded by the state it left).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from openforge.config import ForgeConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import HarnessContext, HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses.npm import npm_cache_dir
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult, Sandbox
from openforge.sandbox.gui import find_chromium

if TYPE_CHECKING:
    from openforge.sandbox.harness_image import VenvLayer

RESULT_PATH = ".forge/browser_use_result.json"  # browser_use_agent.RESULT_FILE (the spec's answer.path)
VENV_NAME = "browser-use-venv"
IMAGE_PREFIX = "opt/forge/browser-use"  # the venv's place in the browser-use image
IMAGE_PYTHON = f"/{IMAGE_PREFIX}/bin/python3"  # -> the image's /usr/bin/python3, as a venv (the spec's run.program)
# What the image's check imports (besides every compiled module): what browser_use_agent.py uses.
IMAGE_IMPORTS = ("browser_use.agent.service", "browser_use.browser.session", "browser_use.llm.openai.chat")
BUILD_COMMAND = "forge sandbox build-image --harness browser-use"
NO_CHROMIUM = "browser-use needs a Chromium on this machine: apt-get install chromium"


def venv_dir(cache: Path) -> Path:
    return cache / VENV_NAME


def venv_python(cache: Path) -> Path | None:
    """The venv's python when browser-use is installed in it, else None."""
    python = venv_dir(cache) / "bin" / "python"
    marker = venv_dir(cache) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "browser_use"
    return python if python.exists() and marker.is_dir() else None


def image_layer(cache: Path) -> VenvLayer:
    """What `forge sandbox build-image --harness browser-use` copies into the browser image: the cache's
    browser-use venv. HarnessError if it is not installed."""
    from openforge.sandbox.harness_image import VenvLayer

    if venv_python(cache) is None:
        raise HarnessError(f"browser-use is not installed in {cache}: run `forge harness install browser-use`")
    return VenvLayer(name="browser-use", venv=venv_dir(cache), python=f"{sys.version_info.major}.{sys.version_info.minor}",
                     imports=IMAGE_IMPORTS, base="browser", prefix=IMAGE_PREFIX)


def browser_use_outcome(result: ExecResult, record_text: str | None) -> HarnessOutcome:
    """browser-use's verdict, from the history record its runner wrote."""
    try:
        record = json.loads(record_text) if record_text else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        why = last_line(result.stderr) or last_line(result.stdout) or "no output"
        return HarnessOutcome.failed(f"browser-use exited {result.exit_code} without its result: {why}")
    if result.exit_code != 0 or "error" in record:
        return HarnessOutcome.failed(f"browser-use failed: {record.get('error') or f'exit code {result.exit_code}'}")
    steps = record.get("steps") if isinstance(record.get("steps"), int) else None
    if record.get("is_done") is True:
        answer = record.get("final_result")
        answer = answer if isinstance(answer, str) else ""
        # JSON can spell a lone surrogate ("\\ud800"): no text can hold it, and the runner's answer file
        # (UTF-8) would fail on it, an infra failure. Replaced, it stays the policy's (wrong) answer.
        answer = answer.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return HarnessOutcome(answer=answer, turns=steps)
    api_errors = record.get("api_errors") or []
    if api_errors:  # it stopped because the API failed it, not because of what the policy did
        return HarnessOutcome.failed(f"browser-use: {api_errors[-1]}", turns=steps)
    if record.get("answered", 1) == 0:  # no reply ever reached the policy: the browser, not the policy, broke
        errors = [e for e in record.get("errors") or [] if isinstance(e, str)]
        return HarnessOutcome.failed(f"browser-use got no model reply: {errors[-1] if errors else 'no step ran'}",
                                     turns=steps)
    return HarnessOutcome(answer="", turns=steps)  # the step limit (or its failure limit) without done


class BrowserUseHarness(SpecHarness):
    """The hook specs/browser-use.toml names: its venv (in the cache, in the image), the Chromium a local
    sandbox runs, its history record."""

    @classmethod
    def venv(cls, cache: Path) -> Path:
        return venv_dir(cache)

    @classmethod
    def local_program(cls, cache: Path) -> str | None:
        python = venv_python(cache)  # the venv's python, once browser_use is in it
        return str(python) if python else None

    @classmethod
    def missing(cls, cache: Path) -> str | None:
        # Its own venv marker (the browser_use package, not just bin/python); the fix as preflight has
        # always printed it.
        return None if venv_python(cache) else \
            f"browser-use is not installed in {cache}: run `forge harness install browser-use`"

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        return cls.missing(npm_cache_dir(config.harness)) or (None if find_chromium() else NO_CHROMIUM)

    @classmethod
    def venv_layer(cls, cache: Path) -> VenvLayer:
        return image_layer(cache)  # on the browser image, checked by importing what the agent uses

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        if ctx.backend != "local":
            # The image is the user's choice (sandbox.image): one without the venv is named, with the fix.
            found = await sandbox.exec([IMAGE_PYTHON, "-c", "import browser_use"], timeout=60)
            if found.exit_code != 0:
                why = last_line(found.stderr) or last_line(found.stdout) or f"exit {found.exit_code}"
                raise HarnessError(f"browser-use is not installed in the {ctx.backend} sandbox image ({IMAGE_PYTHON}: "
                                   f"{why}): build one with `{BUILD_COMMAND}` and set sandbox.image to its tag")
        await super().prepare(sandbox, ctx)
        if ctx.backend == "local" and find_chromium() is None:
            raise HarnessError(NO_CHROMIUM)

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = super().env(ctx)
        if ctx.backend == "local":
            env["FORGE_CHROMIUM"] = find_chromium() or "chromium"
        return env

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return browser_use_outcome(result, await read_text(sandbox, RESULT_PATH))
