"""A new user's first session (issue 44 "First use", issue 43 "Also"), each through the real `forge` CLI
(Typer's CliRunner) on the real store: what the docs and recipe headers say works, and what is wrong is
refused in one line that names its cause."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tests.helpers.paths import REPO
from openforge.forge_cli.main import app
from openforge.store import Store, TrainStep

runner = CliRunner()


def invoke(*args: str, **kw):  # noqa: ANN003, ANN201
    return runner.invoke(app, list(args), catch_exceptions=False, **kw)


# ---------------------------------------------------------------------------------------------------
# Root options after the command, as every recipe header writes them


def test_config_after_the_command_works_as_before_it(tmp_path: Path) -> None:
    cfg = tmp_path / "forge.toml"
    cfg.write_text('[trainer]\nlr = 3e-4\n')
    before = invoke("--config", str(cfg), "config", "show")
    after = invoke("config", "show", "--config", str(cfg), "--set", "trainer.steps=7")
    assert before.exit_code == 0 and after.exit_code == 0, after.output
    assert "lr = 0.0003" in after.stdout and "steps = 7" in after.stdout
    assert after.stdout.replace("steps = 7", "steps = 10") == before.stdout


def test_every_recipe_header_command_runs_as_written(forge_home: Path, tiny_model: Path) -> None:
    """The header's `forge up --config examples/X.toml`, as a dry run: the plan's checks, then the harness runs
    once under the recipe's settings in a scratch store (its prompt fits); no run row in the store."""
    header = (REPO / "examples" / "laptop-demo.toml").read_text()
    [line] = [ln.strip("# ").split() for ln in header.splitlines() if ln.startswith("#   forge up --config")]
    # the session's tiny model stands in for the demo's (built and warmed up on first use: half a minute)
    res = invoke(*line[1:], "--set", "sandbox.isolation=none", "--set", f"engine.model={tiny_model}", "--dry-run")
    assert res.exit_code == 0, res.output
    lines = [ln.strip() for ln in res.output.strip().splitlines()]
    assert lines[-1] == "no run was started (each harness ran once, in a scratch store); every check passed"
    [ran] = [ln for ln in lines if ln.startswith("ok") and "harness " in ln]
    assert "one rollout ran" in ran and "0 refused for length" in ran and "first prompt " in ran, ran
    assert not Store(forge_home / "forge.db").list_runs()


# ---------------------------------------------------------------------------------------------------
# forge up --dry-run checks --init-from


def test_dry_run_fails_an_init_from_that_names_nothing(forge_home: Path, tmp_path: Path) -> None:
    for store_exists in (False, True):
        if store_exists:
            Store(forge_home / "forge.db").create_run(name="some-other-run").id  # a store with runs in it
        res = invoke("--set", "sandbox.isolation=none", "up", "--dry-run", "--init-from", "NO-SUCH-RUN")
        assert res.exit_code == 1, res.output
        fail = [ln for ln in res.output.splitlines() if "FAIL" in ln]
        assert len(fail) == 1 and "--init-from NO-SUCH-RUN" in fail[0] and "neither an adapter folder nor a run" \
            in fail[0], res.output
        assert "every check passed" not in res.output
    not_adapter = tmp_path / "not-an-adapter"
    not_adapter.mkdir()
    res = invoke("--set", "sandbox.isolation=none", "up", "--dry-run", "--init-from", str(not_adapter))
    assert res.exit_code == 1 and "not a PEFT adapter folder" in res.output, res.output


# ---------------------------------------------------------------------------------------------------
# A bad --set is blamed on the --set, not on the file


def test_a_bad_set_value_is_blamed_on_the_set_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "forge.toml"
    cfg.write_text('[trainer]\nlr = 3e-4\n')
    for args in (("--config", str(cfg)), ()):
        res = invoke(*args, "--set", "trainer.lr=abc", "config", "show")
        assert res.exit_code == 1
        line = res.stderr.strip()
        assert line.startswith("forge: error: --set trainer.lr=abc: trainer.lr:"), line
        assert str(cfg) not in line and "defaults" not in line
    cfg.write_text('[trainer]\nlr = "fast"\n')  # the file's own mistake is still the file's
    res = invoke("--config", str(cfg), "--set", "trainer.steps=3", "config", "show")
    assert res.exit_code == 1 and res.stderr.startswith(f"forge: error: {cfg}: trainer.lr:"), res.stderr


# ---------------------------------------------------------------------------------------------------
# Rewards, ids and imports that name nothing are refused


def test_collect_refuses_a_reward_threshold_outside_0_1(forge_home: Path) -> None:
    for bad, bound in (("7", "less than or equal to 1"), ("-0.5", "greater than or equal to 0")):
        res = invoke("collect", "--min-reward", bad)
        assert res.exit_code == 2, res.output
        assert "Invalid value for '--min-reward'" in res.stderr and bound in res.stderr, res.stderr
    assert not (forge_home / "forge.db").exists()  # refused before any run row


def test_an_empty_run_id_is_refused_in_one_line(forge_home: Path) -> None:
    store = Store(forge_home / "forge.db")
    for name in ("a", "b"):
        store.create_run(name=name)
    for args in (("sft", "--from", ""), ("show", ""), ("show", " ")):
        res = invoke(*args)
        assert res.exit_code == 1, (args, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "empty run id" in lines[0] and "ambiguous" not in lines[0], lines
    assert [r.kind for r in store.list_runs()].count("sft") == 0


def test_an_import_that_refuses_every_task_exits_non_zero(tmp_path: Path) -> None:
    src = tmp_path / "claw-eval" / "tasks"
    (tmp_path / "claw-eval" / "mock_services").mkdir(parents=True)
    for name in ("T01_broken", "T02_broken"):
        (src / name).mkdir(parents=True)
        (src / name / "task.yaml").write_text("note: no prompt, no grader\n")  # malformed: refused
    out = tmp_path / "out"
    res = invoke("tasks", "import", "claweval", str(src.parent), "--out", str(out))
    assert res.exit_code == 1, res.output
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("forge: error: ") and "none of" in last and "2 task(s)" in last, res.stderr


# ---------------------------------------------------------------------------------------------------
# Help, docs links


def test_help_text_keeps_its_square_brackets() -> None:
    """Rich markup read `[trainer]` as a tag and printed nothing: every bracketed word of a help shows."""
    root = typer.main.get_command(app)

    def walk(cmd, path):  # noqa: ANN001, ANN202
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    seen = 0
    for path, cmd in walk(root, []):
        words = {w.strip("\\") for text in [cmd.help or "", *(getattr(p, "help", "") or "" for p in cmd.params)]
                 for w in re.findall(r"\\?\[[a-z_.]+\]", text)}
        if not words:
            continue
        out = runner.invoke(app, [*path, "--help"], terminal_width=300)
        for word in words:
            seen += 1
            assert word in out.stdout, (path, word, out.stdout)
    assert seen >= 1  # forge sft's "[trainer]"


def test_every_docs_link_to_a_docs_page_resolves() -> None:
    missing = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\bdocs/([a-z0-9_-]+\.md)\b", page.read_text()):
            if not (REPO / "docs" / target).is_file():
                missing.append(f"{page.name} -> docs/{target}")
    assert not missing, missing


# ---------------------------------------------------------------------------------------------------
# Step numbers: 0-based everywhere a user reads them (the store, forge show, the headless lines)


def test_forge_show_never_cuts_a_step_number_at_80_columns(forge_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    store = Store(forge_home / "forge.db")
    run = store.create_run(name="r", kind="train")
    for step in range(12):
        store.add_train_step(TrainStep(run_id=run.id, step=step, loss=0.123456, reward_mean=0.5, pass_rate=0.5,
                                       kl=0.001234, clip_frac=0.1, mismatch_max=0.01, grad_norm=1.2345,
                                       tokens_per_s=1234.5, metrics_json={"infra_failures": 0}))
    res = invoke("show", run.id)
    assert res.exit_code == 0
    rows = [line for line in res.stdout.splitlines() if line.startswith("│")]
    firsts = [row.strip("│ ").split("│")[0].strip() for row in rows]
    assert firsts == [str(s) for s in range(12)], res.stdout  # whole, and 0-based as the store


def test_the_headless_line_numbers_steps_as_the_store_does() -> None:
    from openforge.forge_cli.up_views import step_line

    line = step_line({"step": 0, "reward_mean": 0.5}, 12, None, "run-x")
    assert line.startswith("step 0 (1 of 12)"), line
