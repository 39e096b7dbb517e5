"""Harness specs: an agent program described by a TOML file, so that training on it needs no Python.

    name = "my-agent"
    [install]  npm = [...] | pip = [...] | command = "..."      how `forge harness install` puts it in the cache
    [api]      flavour = "openai-chat"; base_url_env = [...]; api_key_env = [...]    how it reaches the proxy
    [run]      program = "my-agent"; args = ["--task", "{instruction}"]; env, files, copy_files
    [answer]   source = "file" | "stdout" | "json" | "none"; path; key
    [failures] policy_exit_codes, policy_output                    which endings are the policy's (reward 0)
    [limits]   args/env that set its own turn/token limits (from harness.max_turns / max_tokens)
    [context]  args/env that tell it the run's context size ({context_tokens}), where it compacts
    [prompt]   args/env that shrink its prompt (its prompt budget); config, merged into a hook's config file
    [image]    programs a container image must have on its PATH
    [side_calls] match = { title = "regex" }; train             its own background calls, tagged, not trained on
    [mcp]      args/env/files that give it an MCP server: a task's tools ({mcp_url}, {mcp_token})

docs/harnesses.md describes every field. `load_spec` reads a file into a `HarnessSpec` and refuses,
in one line naming the file and the field, anything it cannot run: an unknown field, a bad value, a
placeholder that does not exist. `SpecHarness` (spec_harness.py) runs one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from openforge.errors import HarnessError

# Every placeholder a spec may use in args, env values, file contents and answer paths. `{options}` is
# more: an argument that is exactly "{options}" becomes the limit options, the prompt options and
# harness.extra_args, spliced in as separate arguments (they go at the end when args does not name it).
PLACEHOLDERS: dict[str, str] = {
    "instruction": "the task's instruction text",
    "instruction_file": "absolute path of a file in the sandbox that holds the instruction",
    "workdir": "the sandbox's working directory (absolute)",
    "forge_dir": "{workdir}/.forge, forge's own folder in the sandbox (instruction, answer, copied files)",
    "answer_file": "{workdir}/.forge/answer.txt, where an agent may leave its final answer",
    "model": "the model name the proxy serves (proxy.served_model_name)",
    "base_url": "the proxy's base URL for [api] flavour (…/v1 for the OpenAI APIs, the bare URL for Anthropic)",
    "proxy_url": "the proxy's root URL as seen from the sandbox",
    "api_key": "the rollout's credential (the proxy records the calls under it)",
    "max_turns": "harness.max_turns",
    "max_tokens": "harness.max_tokens",
    "python": "a Python 3 (the local sandbox: forge's own interpreter; containers: the image's python3)",
    "mcp_url": "the rollout's MCP server of task tools as the sandbox reaches it (streamable HTTP; [mcp] only)",
    "mcp_token": "the bearer token that MCP server demands (`Authorization: Bearer {mcp_token}`; [mcp] only)",
    "context_tokens": "the run's context size: the longest prompt + completion the proxy serves (the engine's "
                      "context length, or proxy.max_context_tokens where lower); [context] only",
    "options": "(a whole argument) the [limits] and [prompt] args and harness.extra_args, spliced in",
}
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
FLAVOURS = ("openai-chat", "openai-responses", "anthropic")
# What the proxy records as a call's `api` for each flavour (tables.Call.api).
RECORDED_API = {"openai-chat": "openai_chat", "openai-responses": "openai_responses",
                "anthropic": "anthropic_messages"}


class HarnessSpecError(HarnessError):
    """A spec file that cannot be read or run: the message names the file and the field."""


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not a silent default


class InstallSpec(_Table):
    npm: list[str] = Field(default_factory=list, description="npm packages, installed into the harness cache")
    pip: list[str] = Field(default_factory=list, description="pip requirements, installed into the harness's own "
                           "venv in the cache (<cache>/venvs/<name>)")
    command: str = Field("", description="a shell command run in the cache folder, for anything else "
                         "($FORGE_HARNESS_CACHE names the folder)")
    imports: list[str] = Field(default_factory=list, description="Python modules {python} must import here "
                               "(checked before a local run)")
    hint: str = Field("", description="how to get the program when forge cannot install it (no npm, pip or "
                      "command): shown where it is missing")


class ApiSpec(_Table):
    flavour: Literal["openai-chat", "openai-responses", "anthropic"] = Field(
        description="the API it speaks: openai-chat (/v1/chat/completions), openai-responses (/v1/responses) "
                    "or anthropic (/v1/messages)")
    base_url_env: list[str] = Field(default_factory=list, description="variables set to {base_url}")
    api_key_env: list[str] = Field(default_factory=list, description="variables set to {api_key}")
    model_env: list[str] = Field(default_factory=list, description="variables set to {model}")


class RunSpec(_Table):
    program: str = Field(description="the executable: found in the harness cache (its npm packages' bins, its "
                         "venv) or on the PATH for a local sandbox, on the image's PATH in a container; or {python}")
    args: list[str] = Field(default_factory=list, description="its arguments (placeholders expanded)")
    env: dict[str, str] = Field(default_factory=dict, description="more environment (quiet settings, ...)")
    files: dict[str, str] = Field(default_factory=dict, description="files written into the sandbox before it "
                                  "starts: path (relative to the working directory) -> content")
    copy_files: dict[str, str] = Field(default_factory=dict, description="files copied into the sandbox: path -> a file "
                                 "relative to the spec's folder")


class AnswerSpec(_Table):
    source: Literal["file", "stdout", "json", "none"] = Field(
        "none", description="file: a file's text; stdout: the last non-empty stdout line; json: `key` in a JSON "
                            "file (or, with no path, in the last JSON line of stdout); none: state-graded tasks")
    path: str = Field("", description="file/json: the file, relative to the working directory")
    key: str = Field("", description="json: a dotted path into the object, e.g. result.text")
    skip: list[str] = Field(default_factory=list, description="stdout: regexes of lines that are not the answer "
                            "(a usage or cost line printed after it); the last line that matches none is")

    @model_validator(mode="after")
    def _complete(self) -> AnswerSpec:
        if self.source == "file" and not self.path:
            raise ValueError("source = \"file\" needs path")
        if self.source == "json" and not self.key:
            raise ValueError("source = \"json\" needs key")
        for pattern in self.skip:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad regex {pattern!r}: {exc}") from None
        return self


class FailureSpec(_Table):
    policy_exit_codes: list[int] = Field(default_factory=list, description="exit codes that are the policy's "
                                         "failure (its limits reached, output caps): reward 0, kept in the group")
    policy_output: list[str] = Field(default_factory=list, description="regexes on its output that mark the "
                                     "policy's failure")

    @model_validator(mode="after")
    def _regexes(self) -> FailureSpec:
        for pattern in self.policy_output:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad regex {pattern!r}: {exc}") from None
        return self


class OptionsSpec(_Table):
    args: list[str] = Field(default_factory=list, description="arguments, spliced in at {options}")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")


class PromptSpec(OptionsSpec):
    config: dict[str, Any] = Field(default_factory=dict, description="settings deep-merged into the config file "
                                   "the spec's hook writes for the harness (OpenClaw: {\"tools\": {\"profile\": "
                                   "\"coding\"}}); only a hook that writes one takes it")


class ContextSpec(OptionsSpec):
    """How the harness is told the run's context size ({context_tokens}), so that it manages its context
    (compacts) where the proxy would refuse a prompt; used when the proxy reports the size."""


class McpSpec(_Table):
    """How the harness takes an MCP server; used only for a task that has tools (rollouts/tasks/tools.py)."""

    args: list[str] = Field(default_factory=list, description="arguments, spliced in at {options}")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")
    files: dict[str, str] = Field(default_factory=dict, description="files written into the sandbox before it "
                                  "starts: path (relative to the working directory) -> content")


class SideCallsSpec(_Table):
    match: dict[str, str] = Field(default_factory=dict, description="its own background calls by name: a regex "
                                  "searched in a call's system prompt, first message and closing user turn, e.g. "
                                  "{ title = \"^Generate a title\" }; such calls are recorded and tagged (call.side)")
    train: bool = Field(False, description="train on them too (by default they are left out of the trajectory)")

    @model_validator(mode="after")
    def _regexes(self) -> SideCallsSpec:
        for name, pattern in self.match.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{name}: bad regex {pattern!r}: {exc}") from None
        return self


class ImageSpec(_Table):
    programs: list[str] = Field(default_factory=list, description="what a container image must have on its "
                                "PATH (default: run.program)")
    build: str = Field("", description="how to build such an image (printed when one lacks a program)")


class HarnessSpec(_Table):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the harness's name (harness.name)")
    description: str = ""
    hook: str = Field("", description="module:Class, a SpecHarness subclass for what needs code")
    calls_model: bool = Field(True, description="a rollout without a model call is a harness failure")
    gui: bool = Field(False, description="it sends screenshots: the policy must be a vision model")
    own_browser: bool = Field(False, description="it starts its own browser (a GUI task's page comes as "
                              "FORGE_START_URL)")
    install: InstallSpec = Field(default_factory=InstallSpec)
    api: ApiSpec
    run: RunSpec
    answer: AnswerSpec = Field(default_factory=AnswerSpec)
    failures: FailureSpec = Field(default_factory=FailureSpec)
    limits: OptionsSpec = Field(default_factory=OptionsSpec)
    context: ContextSpec = Field(default_factory=ContextSpec)
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    image: ImageSpec = Field(default_factory=ImageSpec)
    side_calls: SideCallsSpec = Field(default_factory=SideCallsSpec)
    mcp: McpSpec | None = Field(None, description="how it takes an MCP server (a task's tools); a harness "
                                "without it cannot run a task that has tools")

    path: Path = Field(Path("."), exclude=True)  # the file it was read from (set by load_spec)

    def templates(self) -> dict[str, str]:
        """Every text that may hold placeholders, by the field it is in (for the load-time check)."""
        fields: dict[str, str] = {"run.program": self.run.program, "answer.path": self.answer.path}
        for table, options in (("run", self.run), ("limits", self.limits), ("context", self.context),
                               ("prompt", self.prompt)):
            fields |= {f"{table}.args[{i}]": arg for i, arg in enumerate(options.args)}
            fields |= {f"{table}.env.{key}": value for key, value in options.env.items()}
        fields |= {f"run.files.{path!r}": text for path, text in self.run.files.items()}
        if self.mcp is not None:
            fields |= {f"mcp.args[{i}]": arg for i, arg in enumerate(self.mcp.args)}
            fields |= {f"mcp.env.{key}": value for key, value in self.mcp.env.items()}
            fields |= {f"mcp.files.{path!r}": text for path, text in self.mcp.files.items()}
        return fields


def placeholders_in(text: str) -> list[str]:
    return _PLACEHOLDER.findall(text)


def expand(text: str, values: dict[str, str]) -> str:
    """`text` with each `{name}` replaced by `values[name]` (names were checked when the spec loaded)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def load_spec(path: str | Path) -> HarnessSpec:
    """The spec in `path`. HarnessSpecError, naming the file and the field, if it cannot be run."""
    file = Path(path).expanduser()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessSpecError(f"{file}: no such harness spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessSpecError(f"{file}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HarnessSpecError(f"{file}: not valid TOML: {exc}") from None
    try:
        spec = HarnessSpec.model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {_message(e)}" for e in exc.errors()]
        raise HarnessSpecError(f"{file}: {'; '.join(problems)}") from None
    for field, text in spec.templates().items():
        unknown = [name for name in placeholders_in(text) if name not in PLACEHOLDERS]
        if unknown:
            raise HarnessSpecError(f"{file}: {field}: unknown placeholder {{{unknown[0]}}}; "
                                   f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if {"mcp_url", "mcp_token"} & set(placeholders_in(text)) and not field.startswith("mcp."):
            raise HarnessSpecError(f"{file}: {field}: {{mcp_url}} and {{mcp_token}} may only be used in [mcp]")
        if "context_tokens" in placeholders_in(text) and not field.startswith("context."):
            raise HarnessSpecError(f"{file}: {field}: {{context_tokens}} may only be used in [context] (given "
                                   "only when the proxy reports the run's context size)")
        if "{options}" in text and not field.startswith("run.args["):
            raise HarnessSpecError(f"{file}: {field}: {{options}} may only stand as a whole argument in run.args")
    for sandbox_path, source in spec.run.copy_files.items():
        if not (file.parent / source).is_file():
            raise HarnessSpecError(f"{file}: run.copy_files.{sandbox_path!r}: no file {file.parent / source}")
    return spec.model_copy(update={"path": file.resolve()})


def _message(error: dict[str, object]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "required"
    return str(error["msg"]).removeprefix("Value error, ")
