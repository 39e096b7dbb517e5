"""Harness specs (rollouts/harnesses/spec.py, spec_harness.py): how a spec file is found, what it refuses
(one line naming the file and the field), what `SpecHarness` runs from it, third-party adapters by
entry point, the `forge harness` commands, and docs/harnesses.md's worked example, run for real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openforge.config import ForgeConfig, HarnessConfig, LocalSandboxConfig
from openforge.errors import HarnessError
from openforge.forge_cli.main import app
from openforge.rollouts.harnesses import HARNESSES, get_harness, harness_available, harness_class, harness_names
from openforge.rollouts.harnesses.base import HarnessContext
from openforge.rollouts.harnesses.spec import HarnessSpecError, load_spec
from openforge.rollouts.harnesses.spec_harness import SpecHarness
from openforge.sandbox.base import ExecResult
from openforge.sandbox.factory import make_sandbox
from tests.helpers.paths import REPO
from tests.helpers.proxy_rig import make_rig  # noqa: F401 - fixture

EXAMPLE = REPO / "docs" / "examples" / "hello-agent" / "hello-agent.toml"

MINIMAL = '''
name = "shell-agent"
[api]
flavour = "openai-chat"
base_url_env = ["BASE"]
api_key_env = ["KEY"]
[run]
program = "sh"
args = ["-c", "{options}", "echo {model} > out.txt; echo answer-line"]
[answer]
source = "stdout"
'''


def write_spec(folder: Path, text: str, name: str = "shell-agent") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def ctx(workdir: str = "/work", backend: str = "local") -> HarnessContext:
    return HarnessContext(proxy_url="http://127.0.0.1:8700/", api_key="sk-r", model="forge-policy",
                          instruction="-do it", workdir=workdir, backend=backend)


# -- bad specs: one line naming the file and the field ------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ("name = [", "not valid TOML"),
    (MINIMAL.replace('program = "sh"', 'programme = "sh"'), "run.program: required; run.programme: unknown field"),
    (MINIMAL.replace("{model}", "{modle}"), "run.args[2]: unknown placeholder {modle}; known: {instruction}, "),
    (MINIMAL.replace('"openai-chat"', '"openai-completions"'), "api.flavour: Input should be 'openai-chat'"),
    (MINIMAL.replace('source = "stdout"', 'source = "json"'), "answer: source = \"json\" needs key"),
    (MINIMAL + '[failures]\npolicy_output = ["(unclosed"]\n', "failures: bad regex '(unclosed'"),
    (MINIMAL.replace('name = "shell-agent"', 'name = "a b"'), "name: String should match pattern"),
    (MINIMAL + '[limits]\nargs = ["x{options}"]\n', "limits.args[0]: {options} may only stand as a whole argument"),
])
def test_a_bad_spec_is_one_line_naming_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write_spec(tmp_path, text)
    with pytest.raises(HarnessSpecError) as err:
        load_spec(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_every_shipped_spec_loads() -> None:
    for name in ("mini", "claude-code", "codex", "mini-swe-agent", "opencode", "openclaw", "browser-use", "mini-gui"):
        assert issubclass(harness_class(name), SpecHarness)
    assert HARNESSES == {}  # every built-in harness is a spec (what needs code: the hook it names)
    hooks = {name: harness_class(name).__mro__[1] for name in ("openclaw", "browser-use", "mini-gui")}
    assert {name: f"{cls.__module__}:{cls.__name__}" for name, cls in hooks.items()} == \
        {name: harness_class(name).spec.hook for name in hooks}
    assert load_spec(EXAMPLE).name == "hello-agent"


# -- where a name is found ------------------------------------------------------------------------------------

def test_specs_are_found_in_the_project_then_forge_home_then_built_in(tmp_path: Path, forge_home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_spec(forge_home / "harnesses", MINIMAL.replace("answer-line", "from-home"))
    assert harness_class("shell-agent").spec.path == forge_home / "harnesses" / "shell-agent.toml"
    write_spec(tmp_path / "harnesses", MINIMAL)
    assert harness_class("shell-agent").spec.path == tmp_path / "harnesses" / "shell-agent.toml"
    assert harness_names()[0] == "shell-agent" and "mini" in harness_names()
    # a user's spec named like a built-in replaces it; a path is a spec file
    write_spec(tmp_path / "harnesses", MINIMAL.replace('"shell-agent"', '"mini"'), name="mini")
    assert harness_class("mini").spec.path == tmp_path / "harnesses" / "mini.toml"
    other = write_spec(tmp_path / "elsewhere", MINIMAL.replace('"shell-agent"', '"by-path"'), name="x")
    assert harness_class(str(other)).name == "by-path"
    assert get_harness(HarnessConfig(spec=str(other))).name == "by-path"


def test_an_unknown_harness_names_the_known_ones() -> None:
    with pytest.raises(HarnessError, match=r"^unknown harness 'nope'; known: browser-use, claude-code, codex, mini, "):
        harness_class("nope")
    config = ForgeConfig()
    config.harness = HarnessConfig(name="nope")
    assert harness_available(config).startswith("unknown harness 'nope'")
    assert harness_available(config.model_copy(update={"harness": HarnessConfig(spec="/no/such.toml")})) == \
        "/no/such.toml: no such harness spec file"


def test_an_entry_point_makes_an_installed_packages_harness_appear(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A real distribution on sys.path (as `pip install some-adapter` leaves it): one entry point names a
    spec file, one an adapter class, one something else."""
    package = tmp_path / "site" / "forge_extra"
    package.mkdir(parents=True)
    write_spec(package, MINIMAL.replace('"shell-agent"', '"from-package"'), name="agent")
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        "from openforge.rollouts.harnesses.base import HarnessBase\n"
        "SPEC = Path(__file__).with_name('agent.toml')\n"
        "class Adapter(HarnessBase):\n    name = 'adapter-class'\n"
        "NOT_A_HARNESS = 3\n")
    info = tmp_path / "site" / "forge_extra-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: forge-extra\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[openforge.harnesses]\nfrom-package = forge_extra:SPEC\n"
                                           "adapter-class = forge_extra:Adapter\nbroken = forge_extra:NOT_A_HARNESS\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert {"from-package", "adapter-class", "broken"} <= set(harness_names())
    assert harness_class("from-package").spec.api.flavour == "openai-chat"
    assert harness_class("adapter-class").name == "adapter-class"
    with pytest.raises(HarnessError, match="entry point broken = 'forge_extra:NOT_A_HARNESS'.*names neither"):
        harness_class("broken")


# -- what SpecHarness runs ---------------------------------------------------------------------------------

def test_a_spec_says_the_command_and_the_environment(tmp_path: Path) -> None:
    path = write_spec(tmp_path, MINIMAL + '[limits]\nargs = ["--turns={max_turns}"]\n[prompt]\nenv = { SLIM = "1" }\n')
    harness = get_harness(HarnessConfig(spec=str(path), max_turns=3, extra_args=["--x"]))
    assert harness.command(ctx()) == [shutil.which("sh"), "-c", "--turns=3", "--x", "echo forge-policy > out.txt; echo answer-line"]
    assert harness.env(ctx()) == {"BASE": "http://127.0.0.1:8700/v1", "KEY": "sk-r", "SLIM": "1"}
    anthropic = write_spec(tmp_path, MINIMAL.replace('"openai-chat"', '"anthropic"'), name="a")
    assert get_harness(HarnessConfig(spec=str(anthropic))).env(ctx())["BASE"] == "http://127.0.0.1:8700"


@pytest.mark.parametrize(("answer", "failures", "result", "expected"), [
    ('source = "stdout"', "", (0, "log\nthe answer\n"), ("the answer", None)),
    # a usage line printed after the answer is skipped (issue 44), and no line left is no answer
    ('source = "stdout"\nskip = ["^tokens used:"]', "", (0, "the answer\ntokens used: 42\n"), ("the answer", None)),
    ('source = "stdout"\nskip = ["^tokens used:"]', "", (0, "tokens used: 42\n"),
     (None, "shell-agent exited 0 but its answer was not found")),
    ('source = "stdout"', "", (0, ""), (None, "shell-agent exited 0 but its answer was not found")),
    ('source = "json"\nkey = "result.text"', "", (0, 'x\n{"result": {"text": "42"}}\n'), ("42", None)),
    ('source = "json"\npath = "r.json"\nkey = "a"', "", (0, ""), ("from-file", None)),
    ('source = "file"\npath = "missing.txt"', "", (0, ""), (None, "(SPEC: answer.path)")),
    ('source = "none"', "", (0, ""), ("", None)),
    ('source = "stdout"', "", (2, "boom\n"), (None, "shell-agent exited 2: boom")),
    ('source = "stdout"', "policy_exit_codes = [3]", (3, "turn limit\n"), (None, "policy: exit code 3")),
    ('source = "stdout"', 'policy_output = ["^max turns reached"]', (1, "max turns reached\n"),
     (None, "policy: max turns reached")),
])
async def test_a_spec_says_how_an_ending_is_read(tmp_path: Path, answer: str, failures: str,
                                                 result: tuple[int, str], expected: tuple[Any, Any]) -> None:
    text = MINIMAL.replace('[answer]\nsource = "stdout"\n', f"[answer]\n{answer}\n[failures]\n{failures}\n")
    path = write_spec(tmp_path, text)
    harness = get_harness(HarnessConfig(spec=str(path)))
    async with make_sandbox(LocalSandboxConfig(isolation="none"), run_id="run-s", rollout_id="ro-s") as sb:
        await sb.write_file("r.json", json.dumps({"a": "from-file"}).encode())
        got = await harness.outcome(ExecResult(exit_code=result[0], stdout=result[1], stderr=""), sb)
    answer_, failure = expected
    assert got.answer == answer_
    if failure is None:
        assert (got.failure, got.policy_failure) == (None, None)
    elif failure.startswith("policy: "):  # the policy's failure: scored 0 and kept, never a harness failure
        assert got.failure is None and got.policy_failure == ("shell-agent stopped on the policy's failure: "
                                                              + failure.removeprefix("policy: "))
    else:
        assert got.failure is not None and failure.replace("SPEC", str(path)) in got.failure, got.failure


async def test_a_container_image_without_the_program_is_named_with_the_field(tmp_path: Path) -> None:
    path = write_spec(tmp_path, MINIMAL + '[image]\nprograms = ["no-such-agent-xyz"]\nbuild = "see the docs"\n')
    harness = get_harness(HarnessConfig(spec=str(path)))
    async with make_sandbox(LocalSandboxConfig(isolation="none"), run_id="run-s", rollout_id="ro-i") as sb:
        with pytest.raises(HarnessError, match=r"`no-such-agent-xyz` is not on the PATH of the docker sandbox image "
                                               rf"\({path}: image.programs\); see the docs"):
            await harness.prepare(sb, ctx(sb.info.workdir, backend="docker"))


# -- forge harness ... ---------------------------------------------------------------------------------------

def test_forge_harness_list_show_and_bad_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["harness", "list"])
    assert out.exit_code == 0 and "mini-swe-agent" in out.output and "opencode" in out.output, out.output
    out = CliRunner().invoke(app, ["harness", "show", "mini"])
    assert out.exit_code == 0 and 'program = "{python}"' in out.output
    out = CliRunner().invoke(app, ["harness", "show", "nope"])
    assert out.exit_code == 2 and "unknown harness 'nope'" in out.output and "Traceback" not in out.output
    bad = write_spec(tmp_path / "harnesses", MINIMAL.replace("{model}", "{modle}"))
    for command in (["harness", "show", "shell-agent"], ["harness", "install", str(bad)]):
        out = CliRunner().invoke(app, command)
        assert out.exit_code == 1 and f"{bad}: run.args[2]: unknown placeholder {{modle}}" in out.output, out.output
    out = CliRunner().invoke(app, ["harness", "list"])  # a broken spec is listed with its error
    assert out.exit_code == 0 and "shell-agent      error: " in out.output


def test_forge_harness_install_runs_the_spec_and_names_a_failing_step(tmp_path: Path) -> None:
    ok = write_spec(tmp_path / "s", MINIMAL.replace('program = "sh"', 'program = "made-by-install"') +
                    '[install]\ncommand = "mkdir -p bin && printf \'#!/bin/sh\\\\n\' > bin/made-by-install && '
                    'chmod +x bin/made-by-install && touch $FORGE_HARNESS_CACHE/ran"\n', name="ok")
    out = CliRunner().invoke(app, ["harness", "install", str(ok), "--cache", str(tmp_path / "c")])
    # the command ran in the cache, but the program is on no PATH this spec names: refused, with the fix
    assert (tmp_path / "c" / "ran").exists()
    assert out.exit_code == 1 and f"{ok}: installed, but harness 'shell-agent' is not installed" in out.output
    failing = write_spec(tmp_path / "s", MINIMAL.replace('program = "sh"', 'program = "not-there-xyz"') + '[install]\ncommand = "echo no registry >&2; exit 7"\n', name="f")
    out = CliRunner().invoke(app, ["harness", "install", str(failing), "--cache", str(tmp_path / "c")])
    assert out.exit_code == 1 and f"{failing}: install.command failed: no registry" in out.output, out.output
    assert "Traceback" not in out.output


@pytest.mark.slow
def test_forge_harness_check_says_a_harness_never_called_the_model(tmp_path: Path, tiny_model: Path) -> None:
    silent = write_spec(tmp_path, MINIMAL, name="silent")
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "harness", "check", str(silent)])
    assert out.exit_code == 1, out.output
    assert "shell-agent: 0 model call(s) (none)" in out.output
    assert "problem: it never called the model: the proxy got no request" in out.output
    out = CliRunner().invoke(app, ["--set", f"engine.model={tiny_model}", "--set", "harness.max_turns=1",
                                   "harness", "check", str(EXAMPLE)])
    assert "hello-agent: 1 model call(s) (openai_chat), 0 refused for length, first prompt " in out.output, out.output
    assert "never called the model" not in out.output and "API error" not in out.output


# -- docs/harnesses.md's worked example, run for real -------------------------------------------------------

def test_the_docs_show_the_example_as_it_is() -> None:
    doc = (REPO / "docs" / "harnesses.md").read_text()
    for file in (EXAMPLE, EXAMPLE.with_name("hello_agent.py")):
        assert file.read_text().strip() in doc, f"docs/harnesses.md does not show {file.name} as it is"


async def test_the_docs_example_trains_through_forge(make_rig: Any) -> None:
    """The example spec, found by path, through RolloutRunner -> sandbox -> the agent -> proxy -> verifier."""
    from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
    from openforge.rollouts.tasks.format import TaskSpec
    from tests.helpers.harnesses import COMMAND, MARK

    from openforge.sandbox.testing import proxy_socket_path

    rig = make_rig([], uds=Path(proxy_socket_path()))
    tok = rig.engine.tokenizer
    call = f'<tool_call>\n{json.dumps({"name": "bash", "arguments": {"command": COMMAND}})}\n</tool_call>'
    rig.engine.script = lambda ids: "proof.txt is written" if MARK in tok.decode(ids) else call
    config = ForgeConfig()
    config.harness = HarnessConfig(name=str(EXAMPLE), max_turns=3)
    task = TaskSpec(id="proof", instruction="Write forge-ok into proof.txt.", verifier="grep -qx forge-ok proof.txt")
    runner = RolloutRunner(rig.store, config=config, proxy_url=rig.url, proxy_socket=rig.proxy.uds)
    [ro] = await runner.run(rig.rollout.run_id, [RolloutSpec(task, 0)])
    assert (ro.status, ro.reward, ro.harness) == ("scored", 1.0, "hello-agent"), (ro.error, ro.stderr)
    assert ro.stdout.strip().endswith("proof.txt is written")
    assert [c.api for c in rig.calls(ro.id)] == ["openai_chat", "openai_chat"]

