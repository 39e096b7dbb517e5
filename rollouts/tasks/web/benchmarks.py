"""Web benchmarks' task files as forge tasks: `forge tasks import webvoyager|online-mind2web SRC`.

    WebVoyager (github:MinorJerry/WebVoyager data/WebVoyager_data.jsonl), one JSON object a line:
        {"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Provide a recipe ...",
         "web": "https://www.allrecipes.com/"}
      and, beside it, data/reference_answer.json: {web_name: {"answers": [{"id": 0, "type", "ans"}]}}
    Online-Mind2Web (huggingface osunlp/Online-Mind2Web), one JSON list:
        [{"task_id": "...", "confirmed_task": "...", "website": "https://...", "reference_length": 8,
          "level": "easy"}]

Each task becomes an online-only task (`online`: its start URL, site, and the reference answer where
the benchmark gives one, kept for people: no judge of the field was shown one) graded by the
benchmark's judge (`judge.name`, rollouts/tasks/judge_prompts.py). Online tasks need the live web:
a run refuses them unless `sandbox.allow_internet` (`check_online`); with it, a rollout's browser opens
the task's start page (`LivePage`, in place of a builtin-web site's session) and the judge grades it.

Offline, `--local-sites MAP.json` maps a benchmark's sites onto local copies, the builtin-web sites
(rollouts/tasks/web/sites.py): `{"Allrecipes": {"site": "wiki", "params": {...}, "path": "/"}}`, keyed
by WebVoyager's `web_name` or Online-Mind2Web's `website` as the file writes it. A mapped task is a GUI
task on that site (no longer online), graded by the same judge from its screens, so the whole loop
(import, load, rollout, judge) runs here. Its question is the benchmark's own, asked of a site that
may not hold the answer: the mapping tests the machinery, not the benchmark.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from openforge.errors import ConfigError, TaskError
from openforge.sandbox.gui import GuiSpec

Benchmark = Literal["webvoyager", "online-mind2web"]
JUDGE_OF: dict[str, str] = {"webvoyager": "webvoyager", "online-mind2web": "webjudge"}
_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
PROBE_TIMEOUT_S = 20  # how long an online task's start page may take to answer before the agent starts


class OnlineWeb(BaseModel):
    """A task's `online` part: it needs the live web, from this start page (its web payload's:
    rollouts/tasks/web/payload.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: Benchmark = Field(description="where the task comes from")
    start_url: str = Field(description="the page the browser opens first (http or https)")
    website: str = Field("", description="the benchmark's name for the site")
    reference_answer: str = Field("", description="the benchmark's reference answer, where it gives one; "
                                  "kept for people, shown to no judge")
    reference_length: int | None = Field(None, description="Online-Mind2Web: the steps a person took")

    @field_validator("start_url")
    @classmethod
    def _web_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value


def _task_id(benchmark: str, raw: str) -> str:
    return f"{benchmark}-{_BAD_ID_CHARS.sub('-', raw).strip('-')}"[:128]


def _records(src: Path, benchmark: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The benchmark's task objects (and WebVoyager's reference answers, when its file is beside them)."""
    if benchmark == "webvoyager":
        path = src / "WebVoyager_data.jsonl" if src.is_dir() else src
        try:
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            records = [json.loads(line) for line in lines]
        except (OSError, ValueError) as exc:
            raise TaskError(f"cannot read WebVoyager tasks from {path}: {exc}") from None
        answers_path = path.parent / "reference_answer.json"
        try:
            answers = json.loads(answers_path.read_text(encoding="utf-8")) if answers_path.exists() else {}
        except (OSError, ValueError) as exc:
            raise TaskError(f"cannot read {answers_path}: {exc}") from None
        return records, answers
    try:
        records = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"cannot read Online-Mind2Web tasks from {src}: {exc}") from None
    if not isinstance(records, list):
        raise TaskError(f"{src}: want a JSON list of Online-Mind2Web tasks")
    return records, {}


def _fields(benchmark: str, record: dict[str, Any], answers: dict[str, Any]) -> dict[str, Any]:
    """(id, question, online part, difficulty) of one benchmark record; KeyError/TypeError when malformed."""
    if benchmark == "webvoyager":
        web_name, raw_id = record["web_name"], record["id"]
        number = raw_id.rsplit("--", 1)[-1]
        ref = next((a.get("ans", "") for a in (answers.get(web_name) or {}).get("answers", [])
                    if str(a.get("id")) == number), "")
        return {"id": _task_id(benchmark, raw_id), "question": record["ques"], "site_key": web_name,
                "online": {"benchmark": benchmark, "start_url": record["web"], "website": web_name,
                           "reference_answer": ref}, "difficulty": None}
    level = record.get("level")
    return {"id": _task_id(benchmark, record["task_id"]), "question": record["confirmed_task"],
            "site_key": record["website"],
            "online": {"benchmark": benchmark, "start_url": record["website"], "website": record["website"],
                       "reference_length": record.get("reference_length")},
            "difficulty": level if level in ("easy", "medium", "hard") else None}


def _local_sites(path: str | Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    try:
        sites = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"cannot read the local site map {path}: {exc}") from None
    if not isinstance(sites, dict) or not all(isinstance(v, dict) and "site" in v for v in sites.values()):
        raise TaskError(f"{path}: want {{website: {{\"site\": ..., \"params\": ..., \"path\": ...}}}}")
    return sites


def import_web_benchmark(benchmark: str, src: str | Path, *, local_sites: str | Path | None = None,
                         ) -> tuple[list[dict[str, Any]], int]:
    """The benchmark's tasks in `src` as forge task records, and how many of them are online-only
    (the rest are mapped onto local sites by `local_sites`). Raises TaskError for an unreadable
    source or a malformed task, naming it."""
    if benchmark not in JUDGE_OF:
        raise TaskError(f"unknown web benchmark {benchmark!r}: webvoyager or online-mind2web")
    from openforge.rollouts.tasks.format import TaskSpec

    records, answers = _records(Path(src), benchmark)
    sites = _local_sites(local_sites)
    out, online = [], 0
    for n, record in enumerate(records, 1):
        try:
            f = _fields(benchmark, record, answers)
        except (KeyError, TypeError, AttributeError) as exc:
            raise TaskError(f"{src}: task {n} is not a {benchmark} task (missing {exc})") from None
        task: dict[str, Any] = {"id": f["id"], "tags": ["web", benchmark],
                                "judge": {"name": JUDGE_OF[benchmark]}}
        if f["difficulty"]:
            task["difficulty"] = f["difficulty"]
        if (local := sites.get(f["site_key"])) is not None:
            task["instruction"] = f["question"]
            task["family"] = {"kind": "web", "gui": {"site": local["site"], "params": local.get("params", {}),
                                                     "path": local.get("path", "/")}}
            task["tags"].append("local-copy")
        else:
            task["instruction"] = f"{f['question']}\n(Start at {f['online']['start_url']})"
            task["family"] = {"kind": "web", "online": {k: v for k, v in f["online"].items() if v not in ("", None)}}
            task["tags"].append("online-only")
            online += 1
        try:
            TaskSpec.model_validate(task)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise TaskError(f"{src}: task {f['id']}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        out.append(task)
    ids = [t["id"] for t in out]
    if len(set(ids)) != len(ids):
        raise TaskError(f"{src}: task ids repeat after import: {sorted({i for i in ids if ids.count(i) > 1})[:3]}")
    return out, online


class LivePage:
    """An online task's page for one rollout, where a builtin-web task has its site session
    (rollouts/tasks/web/server.py): nothing served by forge, no socket to bind; the browser opens the
    task's start URL through the sandbox's own network (the egress of `sandbox.allow_internet`). Nothing
    of it is graded on the host: the task's judge grades the rollout from its screens."""

    socket_path = None  # a container binds no site socket

    def __init__(self, online: OnlineWeb) -> None:
        self.online = online

    def gui_spec(self) -> GuiSpec:
        return GuiSpec(url=self.online.start_url, mode="kiosk")

    def probe_command(self) -> str:
        """A shell command, run in the sandbox before the agent, that exits non-zero (its reason on stderr)
        when the start page cannot be fetched at all: no route, no DNS, refused, no answer in
        PROBE_TIMEOUT_S. Any HTTP answer, an error status too, is the page the agent meets."""
        script = ("import sys, urllib.error, urllib.request\n"
                  "try:\n"
                  f"    urllib.request.urlopen(sys.argv[1], timeout={PROBE_TIMEOUT_S})\n"
                  "except urllib.error.HTTPError:\n"
                  "    pass\n"
                  "except Exception as exc:\n"
                  "    sys.exit(f'{type(exc).__name__}: {exc}')\n")
        return f"python3 -c {shlex.quote(script)} {shlex.quote(self.online.start_url)}"

    def close(self) -> None:
        """Nothing to end: the page lives on its own server."""


def check_online(online: list[str], *, allow_internet: bool) -> None:
    """ConfigError (one line) when a run holds online-only tasks (their ids: `online`) without
    `sandbox.allow_internet`. With it, the backend's isolation check decides (a local sandbox refuses it at
    preflight: runs/prepare.py)."""
    if not online or allow_internet:
        return
    shown = ", ".join(online[:3]) + (f" (and {len(online) - 3} more)" if len(online) > 3 else "")
    raise ConfigError(f"task(s) {shown} are online-only (they need the live web): set "
                      "sandbox.allow_internet = true to run them, or import them with --local-sites")
