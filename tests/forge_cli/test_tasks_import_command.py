"""`forge tasks import` names no task family (forge_cli/cmd_rollouts.py): the formats, their sources, what --out
becomes and each family's own options come from the families' kinds (rollouts/tasks/kinds.py `import_formats`),
and the command runs the kind's importer and prints what it returns. A new family's importer needs no edit here."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.forge_cli import cmd_rollouts
from openforge.forge_cli.main import app
from openforge.rollouts.tasks.kinds import import_formats, kind_names

COMMAND = ("tasks_import", "_import_parameters")


def _command_source(command: tuple[str, ...] = COMMAND) -> list[ast.AST]:
    tree = ast.parse(Path(inspect.getsourcefile(cmd_rollouts) or "").read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in command]
    assert sorted(n.name for n in found) == sorted(command)
    return found


@pytest.mark.parametrize(("command", "imports"), [(COMMAND, "nothing"), (("eval_cmd",), "no family")],
                         ids=["tasks import", "eval"])
def test_the_command_names_no_family(command: tuple[str, ...], imports: str) -> None:
    """No family's or format's name in its code or text, and nothing imported from a family's folder: `forge
    eval` prints a family's own figures through its kind (`summary_lines`), ClawEval's included."""
    names = {*import_formats(), *kind_names()} - {"plain"}
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w-])",
                         re.IGNORECASE)
    said, imported = [], []
    for fn in _command_source(command):
        for node in ast.walk(fn):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.search(node.value):
                said.append((fn.name, node.value))
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and (
                    imports == "nothing" or pattern.search(ast.unparse(node))):
                imported.append(ast.unparse(node))
    assert (said, imported) == ([], [])
    family_modules = [n for n in ast.walk(ast.parse(Path(inspect.getsourcefile(cmd_rollouts) or "").read_text()))
                      if isinstance(n, ast.ImportFrom) and n.module and n.col_offset == 0
                      and re.match(r"openforge\.rollouts\.tasks\.(" + "|".join(names) + r")\b", n.module)]
    assert family_modules == []  # nothing of a family imported at the module's top either


def test_the_families_declare_the_command_the_old_help_described() -> None:
    """Every format, source, option and default the command had before the families declared it."""
    result = CliRunner().invoke(app, ["tasks", "import", "--help"], env={"COLUMNS": "400"})
    shown = " ".join(result.output.split())
    assert result.exit_code == 0
    for text in ("claweval (a claw-eval checkout)", "harbor (task folders, their Dockerfiles built into images)",
                 "osworld (OSWorld-format JSON tasks)", "webvoyager or online-mind2web (their task files)",
                 "the name of a task family with an importer",
                 "the source: a claw-eval checkout (or its tasks/ folder); a Harbor dataset folder or task; "
                 "WebVoyager's data/WebVoyager_data.jsonl (or data/); Online-Mind2Web's tasks JSON",
                 "webvoyager, online-mind2web: a .jsonl file",
                 "--local-sites", "webvoyager, online-mind2web: a JSON map of website -> builtin-web site",
                 "--base", "harbor: FROM=IMAGE", "--cache", "osworld: an OSWorld cache folder",
                 "--reward", "claweval: the tasks' reward", "[default: claweval]"):
        assert text in shown, text
