"""`SpecHarness`: runs any harness spec (spec.py). One class per spec (`SpecHarness.bind(spec)`), so what
a harness declares (`calls_model`, `gui`, `own_browser`, `available`) stays on the class, as for every
adapter. A spec's `hook` names a subclass that overrides what needs code (Claude Code's result JSON,
Codex's native binary); everything else comes from the file.

Where the program is found:
    local sandbox   <cache>/venvs/<name>/bin/<program> (pip), <cache>/node_modules/.bin/<program> (npm),
                    else the PATH; `{python}` is forge's own interpreter
    containers      <program> on the image's PATH (the spec's [image] programs are checked first)

How an ending is read (`outcome`): an exit code in `failures.policy_exit_codes` or output matching
`failures.policy_output` is the policy's failure (reward 0, kept); any other non-zero exit is a harness
failure; exit 0 reads the answer where [answer] says, and an answer not found there is a harness
failure. No output makes an ending an infrastructure failure: the policy writes into the output, and
must not be able to mask its 0 (the runner decides infra from the proxy's record, failures.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.rollouts.harnesses import agent_files
from openforge.rollouts.harnesses.base import (HarnessBase, HarnessContext, HarnessOutcome, SideCalls, last_line,
                                              read_text)
from openforge.rollouts.harnesses.npm import NpmHarness, install_env, install_packages, npm_cache_dir
from openforge.rollouts.harnesses.spec import HarnessSpec, McpSpec, OptionsSpec, expand
from openforge.rollouts.harnesses.venv import INSTALL_TIMEOUT_S, install_venv
from openforge.sandbox.base import ExecResult, Sandbox
from openforge.sandbox.confine import Confinement

if TYPE_CHECKING:
    from openforge.sandbox.harness_image import VenvLayer

FORGE_DIR = ".forge"
INSTRUCTION_FILE = f"{FORGE_DIR}/instruction.txt"


class SpecHarness(HarnessBase):
    """A harness run from its spec; `bind` makes the class for one spec."""

    spec: ClassVar[HarnessSpec]
    # A hook that writes the harness's own config file sets this and merges the spec's [prompt] config
    # into it; a spec run by any other class that sets [prompt] config is refused (spec_class).
    writes_config: ClassVar[bool] = False

    @classmethod
    def bind(cls, spec: HarnessSpec) -> type[SpecHarness]:
        return type(cls.__name__, (cls,), {"spec": spec, "name": spec.name, "calls_model": spec.calls_model,
                                           "gui": spec.gui, "own_browser": spec.own_browser,
                                           "takes_tools": spec.mcp is not None,
                                           "side_calls": SideCalls(tuple(spec.side_calls.match.items()),
                                                                   spec.side_calls.train)})

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.cache = npm_cache_dir(config)

    # -- install -----------------------------------------------------------------------------------------

    @classmethod
    def venv(cls, cache: Path) -> Path:
        return cache / "venvs" / cls.spec.name

    @classmethod
    def local_program(cls, cache: Path) -> str | None:
        """The program a local sandbox runs, or None when this machine does not have it."""
        program = cls.spec.run.program
        if "{" in program:  # {python}: always there
            return program
        candidates = []
        if cls.spec.install.pip:
            candidates.append(cls.venv(cache) / "bin" / program)
        if cls.spec.install.npm:
            candidates.append(cache / "node_modules" / ".bin" / program)
        for path in candidates:
            if os.access(path, os.X_OK):
                return str(path)
        return shutil.which(program) if not candidates else None

    @classmethod
    def install_line(cls, cache: Path) -> str:
        """What `forge harness install` runs, spelt out."""
        install = cls.spec.install
        steps = ([f"npm install --prefix {cache} {' '.join(install.npm)}"] if install.npm else []) + \
            ([f"pip install {' '.join(install.pip)} into {cls.venv(cache)}"] if install.pip else []) + \
            ([install.command] if install.command else [])
        return "; ".join(steps) or f"put {cls.spec.run.program} on the PATH"

    @classmethod
    def missing(cls, cache: Path) -> str | None:
        """None when a local sandbox can run it from `cache`, else the fix."""
        default = npm_cache_dir(None) == cache
        fix = f"forge harness install {cls.spec.name}" + ("" if default else f" --cache {cache}")
        if cls.local_program(cache) is None:
            if not cls.installs_anything():
                return (f"harness {cls.spec.name!r}: `{cls.spec.run.program}` is not on the PATH: "
                        f"{cls.spec.install.hint or 'put it there'}")
            return f"harness {cls.spec.name!r} is not installed in {cache}: run `{fix}`"
        import importlib.util

        for module in cls.spec.install.imports:
            if importlib.util.find_spec(module) is None:
                return f"harness {cls.spec.name!r} needs the `{module}` module in {sys.executable}: pip install {module}"
        return None

    @classmethod
    def available(cls, config: ForgeConfig) -> str | None:
        return cls.missing(npm_cache_dir(config.harness))

    @classmethod
    def installs_anything(cls) -> bool:
        """Whether `forge harness install` has something to do for it (npm, pip or a command)."""
        install = cls.spec.install
        return bool(install.npm or install.pip or install.command)

    @classmethod
    def install(cls, cache: Path, *, timeout: float = INSTALL_TIMEOUT_S,
                on_line: Callable[[str], None] | None = None) -> str:
        """Install the spec's packages into `cache` (a no-op when they are there); the program's path.
        HarnessError, naming the step, when one fails."""
        install, name = cls.spec.install, cls.spec.name
        if cls.local_program(cache) is None and not cls.installs_anything():
            raise HarnessError(f"harness {name!r} has nothing `forge harness install` can install: "
                               f"{install.hint or f'put {cls.spec.run.program} on the PATH'}")
        if cls.local_program(cache) is None:
            if install.npm:
                install_packages(install.npm, cache, timeout=timeout, on_line=on_line)
            if install.pip:
                install_venv(cls.venv(cache), install.pip, what=name, timeout=timeout, on_line=on_line)
            if install.command:  # the spec author's code: confined, its cache the one host folder it may write
                cache.mkdir(parents=True, exist_ok=True)
                argv, env = Confinement.where_available().command(
                    ["/bin/sh", "-c", install.command], str(cache), network=True, at=str(cache),
                    env=install_env(FORGE_HARNESS_CACHE=str(cache), HOME=str(cache)))
                try:
                    done = subprocess.run(argv, cwd=cache, capture_output=True, text=True, env=env, timeout=timeout)
                finally:
                    shutil.rmtree(f"{cache}.run", ignore_errors=True)
                if done.returncode != 0:
                    why = last_line(done.stderr) or last_line(done.stdout) or f"exit {done.returncode}"
                    raise HarnessError(f"{cls.spec.path}: install.command failed: {why}")
        fix = cls.missing(cache)
        if fix is not None:
            raise HarnessError(f"{cls.spec.path}: installed, but {fix}")
        return (cls.local_program(cache) or cls.spec.run.program).replace("{python}", sys.executable)

    @classmethod
    def npm_harness(cls) -> NpmHarness | None:
        install = cls.spec.install
        return NpmHarness(tuple(install.npm), cls.spec.run.program) if install.npm else None

    @classmethod
    def venv_layer(cls, cache: Path) -> VenvLayer | None:
        """A pip harness's venv, on the python image at /opt/forge/<name>, its program on the PATH."""
        from openforge.sandbox.harness_image import VenvLayer

        if not cls.spec.install.pip:
            return None
        program = cls.spec.run.program
        if not os.access(cls.venv(cache) / "bin" / program, os.X_OK):
            raise HarnessError(f"harness {cls.spec.name!r} is not installed in {cache}: "
                               f"run `forge harness install {cls.spec.name}`")
        return VenvLayer(name=cls.spec.name, venv=cls.venv(cache), python=f"{sys.version_info.major}.{sys.version_info.minor}",
                         imports=(), base="python", prefix=f"opt/forge/{cls.spec.name}", scripts=(program,))

    # -- one rollout ---------------------------------------------------------------------------------------

    def values(self, ctx: HarnessContext) -> dict[str, str]:
        """What each placeholder stands for in this rollout (spec.PLACEHOLDERS)."""
        workdir = ctx.workdir.rstrip("/")
        root = ctx.proxy_url.rstrip("/")
        return {
            "instruction": ctx.instruction, "instruction_file": f"{workdir}/{INSTRUCTION_FILE}", "workdir": workdir,
            "forge_dir": f"{workdir}/{FORGE_DIR}", "answer_file": f"{workdir}/{agent_files.ANSWER_FILE}",
            "model": ctx.model, "base_url": root if self.spec.api.flavour == "anthropic" else f"{root}/v1",
            "proxy_url": root, "api_key": ctx.api_key, "max_turns": str(self.config.max_turns),
            "max_tokens": str(self.config.max_tokens), "options": "{options}",
            "python": sys.executable if ctx.backend == "local" else "python3",
            "mcp_url": ctx.tools_url, "mcp_token": ctx.tools_token,
            "context_tokens": str(ctx.context_tokens or ""),
        }

    def _mcp(self, ctx: HarnessContext) -> McpSpec:
        """The [mcp] options of this rollout: the spec's for a task that has tools, else none."""
        return self.spec.mcp if ctx.tools_url and self.spec.mcp is not None else McpSpec()

    async def prepare(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        if ctx.backend == "local":
            fix = self.missing(self.cache)
            if fix is not None:
                raise HarnessError(f"{fix} (that is: {self.install_line(self.cache)})")
        else:  # the image is the user's choice (sandbox.image): one without the program is named, with the fix
            for program in self.spec.image.programs or [self.spec.run.program.replace("{python}", "python3")]:
                found = await sandbox.exec(["/bin/sh", "-c", f"command -v {program}"], timeout=30)
                if found.exit_code != 0:
                    build = f"; {self.spec.image.build}" if self.spec.image.build else ""
                    raise HarnessError(f"harness {self.name!r}: `{program}` is not on the PATH of the {ctx.backend} "
                                       f"sandbox image ({self.spec.path}: image.programs){build}")
        values = self.values(ctx)
        await sandbox.write_file(INSTRUCTION_FILE, ctx.instruction.encode("utf-8"))
        for path, source in self.spec.run.copy_files.items():
            await sandbox.write_file(path, (self.spec.path.parent / source).read_bytes())
        for path, text in {**self.spec.run.files, **self._mcp(ctx).files}.items():
            await sandbox.write_file(path, expand(text, values).encode("utf-8"))

    def _context(self, ctx: HarnessContext) -> OptionsSpec:
        """The [context] options of this rollout: the spec's when the run's context size is known, else none."""
        return self.spec.context if ctx.context_tokens else OptionsSpec()

    def command(self, ctx: HarnessContext) -> list[str]:
        values, run = self.values(ctx), self.spec.run
        program = self.local_program(self.cache) if ctx.backend == "local" else None
        # harness.extra_args last: where a CLI takes the last of a repeated setting (Codex's -c), the user's wins
        options = [expand(a, values) for a in [*self.spec.limits.args, *self._context(ctx).args,
                                               *self.spec.prompt.args, *self._mcp(ctx).args]] + self.config.extra_args
        args = [expand(a, values) for a in run.args]
        if "{options}" in args:
            at = args.index("{options}")
            args[at:at + 1] = options
        else:
            args += options
        return [expand(program or run.program, values), *args]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        values, api = self.values(ctx), self.spec.api
        env = {var: values["base_url"] for var in api.base_url_env}
        env |= {var: ctx.api_key for var in api.api_key_env} | {var: ctx.model for var in api.model_env}
        # [context] first: a value the spec sets in [run.env] itself (a user's copy of a built-in) wins
        for extra in (self._context(ctx).env, self.spec.run.env, self.spec.limits.env, self.spec.prompt.env,
                      self._mcp(ctx).env):
            env |= {key: expand(value, values) for key, value in extra.items()}
        return env

    async def outcome(self, result: ExecResult, sandbox: Sandbox) -> HarnessOutcome:
        failures, output = self.spec.failures, f"{result.stdout}\n{result.stderr}"
        policy = next((m for p in failures.policy_output if (m := re.search(p, output, re.MULTILINE))), None)
        if result.exit_code in failures.policy_exit_codes or policy is not None:
            why = _line_of(output, policy) if policy else f"exit code {result.exit_code}"
            return HarnessOutcome.policy_failed(f"{self.name} stopped on the policy's failure: {why}")
        if result.exit_code != 0:
            why = last_line(result.stderr) or last_line(result.stdout) or "no output"
            return HarnessOutcome.failed(f"{self.name} exited {result.exit_code}: {why}")
        answer = await self.read_answer(result, sandbox)
        if answer is None:
            return HarnessOutcome.failed(f"{self.name} exited 0 but its answer was not found "
                                         f"({self.spec.path}: answer.{self._answer_field()})")
        return HarnessOutcome(answer=answer)

    async def read_answer(self, result: ExecResult, sandbox: Sandbox) -> str | None:
        """The final answer where [answer] says, or None when it is not there ("" for source = "none")."""
        answer = self.spec.answer
        if answer.source == "none":
            return ""
        if answer.source == "stdout":
            lines = [ln for ln in result.stdout.splitlines() if not any(re.search(p, ln.strip()) for p in answer.skip)]
            return last_line("\n".join(lines)) or None
        text = await read_text(sandbox, answer.path) if answer.path else None
        if answer.source == "file":
            return text
        return json_answer(text if answer.path else _last_json_line(result.stdout), answer.key)

    def _answer_field(self) -> str:
        return {"file": "path", "json": "key", "stdout": "source"}.get(self.spec.answer.source, "source")


def json_answer(text: str | None, key: str) -> str | None:
    """`key` (dotted: "info.submission") in the JSON object `text`, as text; None when it is not there."""
    try:
        value: Any = json.loads(text) if text else None
    except ValueError:
        return None
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _last_json_line(stdout: str) -> str | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.strip().startswith("{"):
            return line
    return None


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else None].strip()[:300]
