"""browser-use (PyPI `browser-use`, pinned) as a harness: it starts the sandbox's Chromium, drives it
over CDP and asks the proxy's Chat Completions API (with the rollout's key) for its next actions,
with a screenshot each step. docs/harnesses.md describes what it sends. (This module is not named
browser_use.py: beside browser_use_agent.py that would shadow the package when the agent runs from here.)

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
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses.base import HarnessBase, HarnessContext, HarnessOutcome, last_line, read_text
from openforge.rollouts.harnesses import agent_files
from openforge.rollouts.harnesses.npm import npm_cache_dir
from openforge.rollouts.harnesses.venv import INSTALL_TIMEOUT_S, install_venv
from openforge.sandbox.base import ExecResult, Sandbox

if TYPE_CHECKING:
    from openforge.sandbox.harness_image import VenvLayer

BROWSER_USE_VERSION = "0.13.14"
AGENT_SOURCE = Path(__file__).with_name("browser_use_agent.py")
AGENT_PATH = ".forge/browser_use_agent.py"
INSTRUCTION_PATH = ".forge/instruction.txt"
RESULT_PATH = ".forge/browser_use_result.json"  # browser_use_agent.RESULT_FILE
VENV_NAME = "browser-use-venv"
IMAGE_PREFIX = "opt/forge/browser-use"  # the venv's place in the browser-use image
IMAGE_PYTHON = f"/{IMAGE_PREFIX}/bin/python3"  # -> the image's /usr/bin/python3, as a venv
# What the image's check imports (besides every compiled module): what browser_use_agent.py uses.
IMAGE_IMPORTS = ("browser_use.agent.service", "browser_use.browser.session", "browser_use.llm.openai.chat")
BUILD_COMMAND = "forge sandbox build-image --harness browser-use"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# browser-use phones home unless told not to (PostHog telemetry, cloud sync, a version check, the
# default extensions' downloads): all off, so the proxy is the only address it talks to.
QUIET_ENV = {
    "ANONYMIZED_TELEMETRY": "false",
    "BROWSER_USE_CLOUD_SYNC": "false",
    "BROWSER_USE_VERSION_CHECK": "false",
    "BROWSER_USE_DISABLE_EXTENSIONS": "1",
    "BROWSER_USE_CALCULATE_COST": "false",
    "BROWSER_USE_LOGGING_LEVEL": "info",
}


def venv_dir(cache: Path) -> Path:
    return cache / VENV_NAME


def venv_python(cache: Path) -> Path | None:
    """The venv's python when browser-use is installed in it, else None."""
    python = venv_dir(cache) / "bin" / "python"
    marker = venv_dir(cache) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "browser_use"
    return python if python.exists() and marker.is_dir() else None


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def install_browser_use(cache: Path, *, timeout: float = INSTALL_TIMEOUT_S,
                        on_line: Callable[[str], None] | None = None) -> Path:
    """A venv with browser-use==BROWSER_USE_VERSION in the harness cache (a no-op if present); its python."""
    found = venv_python(cache)
    if found is not None:
        return found
    install_venv(venv_dir(cache), [f"browser-use=={BROWSER_USE_VERSION}"], what="browser-use", timeout=timeout,
                 on_line=on_line)
    found = venv_python(cache)
    if found is None:
        raise HarnessError(f"pip installed browser-use but {venv_dir(cache)} has no browser_use package")
    return found


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


class BrowserUseHarness(HarnessBase):
    name = "browser-use"
    gui = True  # it sends screenshots: the policy must see images
    # It starts and drives its own Chromium: a GUI task's display gets no browser of the sandbox's, and
    # the page it would have shown comes as FORGE_START_URL (rollouts/runner/runner.py).
    own_browser = True

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        cache = npm_cache_dir(config.harness)
        if venv_python(cache) is None:
            return f"browser-use is not installed in {cache}: run `forge harness install browser-use`"
        return None if find_chromium() else "browser-use needs a Chromium on this machine: apt-get install chromium"

    @classmethod
    def venv_layer(cls, cache: Path) -> VenvLayer:
        return image_layer(cache)

    @classmethod
    def install(cls, cache: Path, *, on_line: Callable[[str], None] | None = None) -> str:
        return str(install_browser_use(cache, on_line=on_line))  # a pinned pip install into its own venv

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.cache = npm_cache_dir(config)

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        if ctx.backend == "local":
            if venv_python(self.cache) is None:
                raise HarnessError(f"browser-use is not installed in {self.cache}: run `forge harness install browser-use`")
            if find_chromium() is None:
                raise HarnessError("browser-use needs a Chromium on this machine: apt-get install chromium")
        else:
            # The image is the user's choice (sandbox.image): one without the venv is named, with the fix.
            found = await sandbox.exec([IMAGE_PYTHON, "-c", "import browser_use"], timeout=60)
            if found.exit_code != 0:
                why = last_line(found.stderr) or last_line(found.stdout) or f"exit {found.exit_code}"
                raise HarnessError(f"browser-use is not installed in the {ctx.backend} sandbox image ({IMAGE_PYTHON}: "
                                   f"{why}): build one with `{BUILD_COMMAND}` and set sandbox.image to its tag")
        await sandbox.write_file(AGENT_PATH, AGENT_SOURCE.read_bytes())
        await sandbox.write_file(agent_files.SANDBOX_PATH, agent_files.SOURCE.read_bytes())
        await sandbox.write_file(INSTRUCTION_PATH, ctx.instruction.encode("utf-8"))

    def command(self, ctx: HarnessContext) -> list[str]:
        python = str(venv_python(self.cache) or venv_dir(self.cache) / "bin" / "python") \
            if ctx.backend == "local" else IMAGE_PYTHON
        return [python, AGENT_PATH, "--instruction-file", INSTRUCTION_PATH,
                "--max-steps", str(self.config.max_turns), *self.config.extra_args]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        chromium = (find_chromium() or "chromium") if ctx.backend == "local" else "chromium"
        return {
            **QUIET_ENV,
            "OPENAI_BASE_URL": ctx.proxy_url.rstrip("/") + "/v1",
            "OPENAI_API_KEY": ctx.api_key,
            "FORGE_MODEL": ctx.model,
            "FORGE_CHROMIUM": chromium,
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        return browser_use_outcome(result, await read_text(sandbox, RESULT_PATH))
