"""How forge reads a Harbor task's environment/Dockerfile: its steps, the WORKDIR each runs in, what each
COPY brings. One reading serves the three that need it: the agent's files of a Dockerfile that builds
nothing (harbor/folder.py `local_environment`), the image paths a stdio MCP server runs from (harbor/mcp.py
`image_copies`) and the WORKDIR it runs in (harbor/folder.py `task_mcp_servers`).

A relative WORKDIR is joined to the one before it, as Docker does: so the WORKDIR of each step is traced
from the one the build starts in ([environment] workdir, else /app), never from the final one.
"""

from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath
from typing import NamedTuple


class Step(NamedTuple):
    """One Dockerfile instruction and the WORKDIR in effect at it (after it, for a WORKDIR step)."""

    line: int
    word: str  # the instruction, upper case
    args: str
    workdir: str


def dockerfile_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), start=1):
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        start = start or n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        word, _, args = (buf + line).strip().partition(" ")
        out.append((start, word.upper(), args.strip()))
        buf, start = "", 0
    return out


def in_workdir(path: str, workdir: str) -> str:
    """`path` as the absolute path it names in the image (a relative one is read from `workdir`)."""
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


def traced_steps(text: str, workdir: str) -> list[Step]:
    """Every step of the Dockerfile `text` with its WORKDIR, traced from `workdir`, the one the build starts in."""
    steps = []
    for n, word, args in dockerfile_lines(text):
        if word == "WORKDIR":
            workdir = in_workdir(args, workdir)
        steps.append(Step(n, word, args, workdir))
    return steps


def final_workdir(steps: list[Step], start: str) -> str:
    """The WORKDIR the image ends in (`start` when no step sets one)."""
    return steps[-1].workdir if steps else start


def copy_parts(step: Step) -> tuple[list[str], str] | None:
    """(sources, absolute destination) of a COPY/ADD step, flags dropped; None when it names fewer than two."""
    parts = [p for p in shlex.split(step.args) if not p.startswith("--")]
    if len(parts) < 2:
        return None
    *srcs, dest = parts
    return srcs, in_workdir(dest, step.workdir)


def copied_files(env_dir: Path, step: Step) -> dict[str, str]:
    """{absolute path in the image: the environment/ file it came from} for each file a COPY/ADD of the build
    context brings (a folder's files each); {} for a copy from another stage or from outside environment/."""
    parsed = copy_parts(step) if step.word in ("COPY", "ADD") and "--from" not in step.args else None
    if parsed is None:
        return {}
    srcs, dest = parsed
    copies: dict[str, str] = {}
    root = env_dir.resolve()
    for src in srcs:
        source = (env_dir / src).resolve()
        if not source.is_relative_to(root) or not source.exists():
            continue
        if source.is_dir():
            for f in source.rglob("*"):
                if f.is_file():
                    copies[str(PurePosixPath(dest) / f.relative_to(source).as_posix())] = f.relative_to(root).as_posix()
        else:
            target = str(PurePosixPath(dest) / source.name) if dest.endswith("/") or len(srcs) > 1 else dest
            copies[str(PurePosixPath(target))] = source.relative_to(root).as_posix()
    return copies
