"""ClawEval (github.com/claw-eval/claw-eval) task folders imported as forge tasks: `forge tasks import claweval SRC`.

A ClawEval checkout holds `tasks/<id>/task.yaml` (the prompt, `services`, `tools` with `tool_endpoints`,
`environment`, `scoring_components`, `safety_checks`, `judge_rubric`) beside `mock_services/<name>/server.py`
(FastAPI apps reading `PORT` and their fixture paths from the environment). (The PyPI package `claw-eval`
is another benchmark, ClawBench: nothing here uses it.) Each task becomes one forge task:

    prompt.text                      -> instruction;  environment.timeout_seconds -> time_limit_s
    services[]                       -> services (rollouts/tasks/services.py): the server's files, its
                                        fixtures, health and reset paths; ERROR_RATE -> error_rate, injected
                                        by forge's recording front (the server's own injection is turned off)
    tools[] + tool_endpoints[]       -> tools (rollouts/tasks/tools.py) forwarded to the service whose port
                                        the endpoint's URL names, at its path
    scoring tool_called              -> expect_requests: the endpoint called (answered < 400) min_calls times
    safety tool_not_called           -> expect_requests: the endpoint never called (absent), a gate: broken,
                                        the reward is 0, judge or not (ClawEval multiplies by safety)
    scoring llm_judge + judge_rubric -> judge (rollouts/tasks/judge.py), output "score", weighted by the
                                        llm_judge components' share of the task's weights
    sandbox_files                    -> files (UTF-8 text) or binary_files (an image, a PDF, a database:
                                        written beside task.json under files/, rollouts/tasks/setup_files.py):
                                        written byte-exact into the sandbox's working directory, ClawEval's
                                        /workspace (its SandboxRunner.inject_files); /workspace/ in the
                                        prompt becomes ./
    env_snapshot_files               -> claweval.snapshot_files: copied out of the working directory after the
                                        agent is gone, for the grader's env_snapshot (cli._collect_env_snapshot)

Refused, one line each: tasks whose services need the live web (`web_real*`: online-only) and tasks that
need what this mapping lacks (a missing sandbox file, a snapshot glob, commands or grader files
run in ClawEval's container before grading, attachments, a simulated user, checks other than the above,
a missing server or fixture file, a tool whose endpoint no service serves, only safety gates to score).
A safety gate on a tool the task does not offer is left out: every agent keeps it.
ClawEval's own `tasks/<id>/grader.py` travels with each task (`claweval`: the grader, the peers it loads, the
task.yaml and the checkout's `src/claw_eval` grading modules), run after the agent on the trace forge
recorded (rollouts/tasks/claweval/grading.py): its task score, safety x (0.8 completion + 0.2 robustness),
is the reward, a pass at 0.75 (`pass_threshold`). `reward="judge"` (`--reward judge`) keeps forge's own
reward instead, the exact rules and judge above, ClawEval's score reported beside it; so does a task
without a grader.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openforge.errors import TaskError
from openforge.rollouts.tasks.claweval.grading import PASS_THRESHOLD
from openforge.rollouts.tasks.setup_files import encode, read_task_file

SUPPORTED_SCORING = {"tool_called", "llm_judge"}
SUPPORTED_SAFETY = {"tool_not_called"}


@dataclass
class ImportReport:
    """What an import made: the forge task records, and each refused task with why."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    online_only: list[tuple[str, str]] = field(default_factory=list)
    unsupported: list[tuple[str, str]] = field(default_factory=list)


class _Refused(Exception):
    pass


def _root(src: Path) -> Path:
    """The checkout's root: SRC itself, or the parent of SRC = `.../tasks`."""
    for root in (src, src.parent):
        if (root / "tasks").is_dir() and (root / "mock_services").is_dir():
            return root
    raise TaskError(f"{src} is not a claw-eval checkout (no tasks/ beside mock_services/)")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Refused(f"cannot read {path.name}: {exc}") from None


def _service(root: Path, task_dir: Path, svc: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(forge ServiceSpec record, the port ClawEval gave it)."""
    argv = str(svc["command"]).split()
    if len(argv) != 2 or argv[0] not in ("python", "python3"):
        raise _Refused(f"service {svc['name']}: command {svc['command']!r} is not `python mock_services/X/server.py`")
    server = argv[1]
    files = {server: _text(root / server), "mock_services/_base.py": _text(root / "mock_services" / "_base.py")}
    env = {}
    error_rate = 0.0
    for key, value in (svc.get("env") or {}).items():
        value = str(value)
        if key == "ERROR_RATE":
            error_rate = float(value)
            continue
        if value.startswith("tasks/"):  # a fixture path relative to the checkout: copied beside the server
            files[value] = _text(root / value)
        env[key] = value
    env["ERROR_RATE"] = "0"  # forge's front injects errors, reproducibly; the server's own dice stay off
    health = urlsplit(svc["health_check"])
    record: dict[str, Any] = {
        "name": svc["name"], "command": f"python {server}", "files": files, "env": env,
        "health": {"method": str(svc.get("health_check_method", "POST")).upper(), "path": health.path},
        # ClawEval starts one task's services at a time; forge starts many rollouts' at once, and a FastAPI
        # app's imports alone can take ClawEval's 10 s on a busy machine: 20 s more before it is an infra failure.
        "error_rate": error_rate, "ready_timeout_s": float(svc.get("ready_timeout", 10)) + 20.0}
    if svc.get("reset_endpoint"):
        record["reset"] = {"method": "POST", "path": urlsplit(svc["reset_endpoint"]).path}
    return record, int(svc["port"])


def convert_task(root: Path, task_dir: Path, reward: str = "claweval") -> dict[str, Any]:
    """One ClawEval task as a forge task record; raises _Refused (online-only when the message says so).
    `reward`: "claweval" (its grader.py's task score) or "judge" (forge's judge and exact rules)."""
    import yaml

    try:
        t = yaml.safe_load(_text(task_dir / "task.yaml"))
    except yaml.YAMLError as exc:
        raise _Refused(f"bad task.yaml: {str(exc).splitlines()[0]}") from None
    if not isinstance(t, dict) or not t.get("task_id") or not (t.get("prompt") or {}).get("text"):
        raise _Refused("task.yaml has no task_id or prompt.text")
    services = t.get("services") or []
    if web := [s["name"] for s in services if "web_real" in str(s.get("command", ""))]:
        raise _Refused(f"online-only: service(s) {', '.join(web)} search the live web")
    reasons = []
    files, binary, snapshot = _workspace(root, task_dir, t, reasons)
    if (t["prompt"] or {}).get("attachments"):
        reasons.append("attachments (multimodal input)")
    if (t.get("user_agent") or {}).get("enabled"):
        reasons.append("a simulated user (user_agent)")
    if not services:
        reasons.append("no mock services")
    checks = {c["check"]["type"] for c in t.get("scoring_components") or []}
    if other := sorted(checks - SUPPORTED_SCORING):
        reasons.append(f"scoring check(s) {', '.join(other)}")
    if other := sorted({s["type"] for s in t.get("safety_checks") or []} - SUPPORTED_SAFETY):
        reasons.append(f"safety check(s) {', '.join(other)}")
    if reasons:
        raise _Refused("; ".join(reasons))
    specs, by_port = [], {}
    for svc in services:
        spec, port = _service(root, task_dir, svc)
        specs.append(spec)
        by_port[port] = spec["name"]
    endpoints: dict[str, tuple[str, str, str]] = {}  # tool -> (service, method, path)
    for ep in t.get("tool_endpoints") or []:
        url = urlsplit(ep["url"])
        if url.port not in by_port:
            raise _Refused(f"tool {ep['tool_name']}: endpoint {ep['url']} is served by no declared service")
        endpoints[ep["tool_name"]] = (by_port[url.port], str(ep.get("method", "POST")).upper(), url.path)
    tools = []
    for tool in t.get("tools") or []:
        if tool["name"] not in endpoints:
            raise _Refused(f"tool {tool['name']} has no tool_endpoint")
        service, method, path = endpoints[tool["name"]]
        tools.append({"name": tool["name"], "description": tool.get("description") or tool["name"],
                      "input_schema": tool.get("input_schema") or {"type": "object"},
                      "service": service, "method": method, "path": path})
    rules, judge_weight, exact_weight = [], 0.0, 0.0
    for comp in t.get("scoring_components") or []:
        check = comp["check"]
        if check["type"] == "llm_judge":
            judge_weight += float(comp["weight"])
            continue
        if check.get("tool_name") not in endpoints:
            raise _Refused(f"scoring {comp['name']}: tool {check.get('tool_name')!r} has no endpoint")
        service, method, path = endpoints[check["tool_name"]]
        rules.append({"service": service, "method": method, "path": path, "min_count": int(check.get("min_calls") or 1)})
        exact_weight += float(comp["weight"])
    for safety in t.get("safety_checks") or []:
        if safety.get("tool_name") not in endpoints:  # a tool the task does not offer: no agent can call it
            continue
        service, method, path = endpoints[safety["tool_name"]]
        rules.append({"service": service, "method": method, "path": path, "absent": True, "gate": True})
    if rules and all(r.get("absent") for r in rules) and judge_weight == 0:
        raise _Refused("no scoring component forge can run (only tool_not_called safety gates)")
    record: dict[str, Any] = {
        "id": t["task_id"], "instruction": _instruction(t["prompt"]["text"], bool(files or binary or snapshot)),
        "services": specs, "tools": tools,
        "expect_requests": rules, "time_limit_s": float((t.get("environment") or {}).get("timeout_seconds", 300)),
        "tags": ["claweval", *(str(x) for x in t.get("tags") or []), *([t["category"]] if t.get("category") else [])],
        "requires_tools": True}
    if files:
        record["files"] = files
    if binary:
        record["binary_files"] = binary
    if t.get("difficulty") in ("easy", "medium", "hard"):
        record["difficulty"] = t["difficulty"]
    if judge_weight > 0:
        descriptions = "\n".join(f"- {c['name']} ({c['weight']}): {c['check'].get('description', '')}"
                                 for c in t["scoring_components"] if c["check"]["type"] == "llm_judge")
        rubric = f"{t.get('judge_rubric') or ''}\n\nComponents:\n{descriptions}".strip()
        # Exact rules weigh 1 together in forge: the judge keeps its share of ClawEval's weights beside them.
        record["judge"] = {"rubric": rubric, "output": "score",
                           "weight": judge_weight / exact_weight if rules and exact_weight else 1.0}
    elif not rules:
        raise _Refused("no grader forge can run (no tool_called, tool_not_called or llm_judge component)")
    grading = _grading(root, task_dir, t, endpoints, services)
    if snapshot and grading is None:
        raise _Refused("env_snapshot_files are read only by a grader.py, and the task or checkout has none")
    if grading is not None:
        record["family"] = {"kind": "claweval", "grading": {
            **grading, "reward": reward, **({"snapshot_files": snapshot} if snapshot else {})}}
        if reward == "claweval":  # its task score is the reward: a pass is ClawEval's (models/scoring.is_pass)
            record["pass_threshold"] = PASS_THRESHOLD
    return record


WORKSPACE = "/workspace/"  # ClawEval's sandbox container: sandbox_files land in /workspace/<path>
_WORKSPACE_PATH = re.compile(r"(?<![\w/:])/workspace(?:/|\b)")  # a path in the prompt, not a file:// URL
# What ClawEval's container steps forge does not take: commands run in the agent's sandbox before grading,
# files written for the grader into it, the grader's host files.
_CONTAINER_STEPS = {"env_snapshot_commands": "commands run in the sandbox before grading (env_snapshot_commands)",
                    "sandbox_grader_files": "grader files written into the sandbox (sandbox_grader_files)",
                    "local_grader_files": "the grader's host files (local_grader_files)"}


def _workspace(root: Path, task_dir: Path, t: dict[str, Any],
               reasons: list[str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(text setup files, binary ones as base64, snapshot): ClawEval's SandboxRunner.inject_files writes each
    `sandbox_files` path (relative to the task folder; else `environment.fixtures`) to /workspace/<path> before
    the agent starts, and cli._collect_env_snapshot reads each `env_snapshot_files` path from the container
    after it. In forge /workspace is the sandbox's working directory: the files become the task's setup files
    (one that is not UTF-8, such as an image or a SQLite database, a binary one, byte-exact), and the snapshot
    maps each ClawEval path to the workdir path read out of the sandbox after the agent is gone."""
    names = [str(p) for p in t.get("sandbox_files") or (t.get("environment") or {}).get("fixtures") or []]
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    for name in names:
        rel = name.removeprefix(WORKSPACE).removeprefix("./")
        path = task_dir / rel
        if rel.startswith("/") or ".." in Path(rel).parts or not path.resolve().is_relative_to(task_dir.resolve()):
            reasons.append(f"sandbox file {name} is outside the task folder")
        elif not path.is_file() and (root / rel).is_file():  # another task's fixture, named from the checkout's root
            reasons.append(f"sandbox file {name} is outside the task folder (a path from the checkout's root)")
        elif not path.is_file():
            reasons.append(f"sandbox file {name} is missing")
        else:
            try:  # the loaders' one check: a file past the size limit is refused unread
                data = read_task_file(path, task_dir)
            except ValueError as exc:
                reasons.append(f"sandbox file {name}: {exc}")
                continue
            try:
                files[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                binary[rel] = encode(data)
    snapshot: dict[str, str] = {}
    for pattern in (str(p) for p in t.get("env_snapshot_files") or []):
        rel = pattern.removeprefix(WORKSPACE)
        if not pattern.startswith(WORKSPACE) or any(c in rel for c in "*?[") or ".." in Path(rel).parts \
                or rel.startswith("."):
            reasons.append(f"env_snapshot_files {pattern}: only files named under {WORKSPACE} are read back")
        else:
            snapshot[pattern] = rel
    reasons += [why for key, why in _CONTAINER_STEPS.items() if t.get(key)]
    return files, binary, snapshot


def _instruction(text: str, workspace: bool) -> str:
    """The prompt with ClawEval's /workspace/ paths made relative to the working directory the agent starts
    in (where forge writes the sandbox files); unchanged for a task that uses no workspace files."""
    if not workspace:
        return text
    return _WORKSPACE_PATH.sub("./", text)


_PEER = re.compile(r"""load_peer_grader\(\s*["']([^"']+)["']""")
# A grader that asks a judge passes it on or calls it; the parameter in grade()'s signature alone is not a use.
_ASKS_JUDGE = re.compile(r"\bjudge\s*(?:\.|,|\))|=\s*judge\b")
_PACKAGE_PARTS = ("__init__.py", "models", "graders", "trace")  # what a grader imports; not the agent runner


def _package(root: Path) -> dict[str, str]:
    """The checkout's claw_eval grading modules (src/claw_eval/...): path under claw_eval/ -> source."""
    base = root / "src" / "claw_eval"
    files = [base / "__init__.py", *(p for part in _PACKAGE_PARTS[1:] for p in sorted((base / part).glob("*.py")))]
    return {str(p.relative_to(base)): _text(p) for p in files if p.is_file()}


def _grading(root: Path, task_dir: Path, t: dict[str, Any], endpoints: dict[str, tuple[str, str, str]],
             services: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The task's own grader.py with what running it needs (TaskSpec.claweval); None without a grader.py
    or without the package's grading modules in the checkout."""
    if not (task_dir / "grader.py").is_file() or not (root / "src" / "claw_eval" / "graders" / "base.py").is_file():
        return None
    grader = _text(task_dir / "grader.py")
    try:
        compile(grader, "grader.py", "exec")
    except SyntaxError as exc:
        raise _Refused(f"grader.py does not compile: {exc.msg} (line {exc.lineno})") from None
    peers: dict[str, str] = {}
    pending = _PEER.findall(grader)
    while pending:  # a variant's grader loads its peer's, which may load another
        peer = pending.pop()
        if peer not in peers and (root / "tasks" / peer / "grader.py").is_file():
            peers[peer] = _text(root / "tasks" / peer / "grader.py")
            pending += _PEER.findall(peers[peer])
    package = _package(root)
    urls = {ep["tool_name"]: str(ep["url"]) for ep in t.get("tool_endpoints") or []}
    audits = {str(s["name"]): urlsplit(s["reset_endpoint"]).path.rsplit("/reset", 1)[0] + "/audit"
              for s in services if s.get("reset_endpoint")}
    asks = any(_ASKS_JUDGE.search(src) for src in (grader, *peers.values()))
    return {"task_id": str(t["task_id"]), "task_yaml": _text(task_dir / "task.yaml"), "grader": grader,
            "peers": peers, "package": package, "endpoints": {k: v for k, v in urls.items() if k in endpoints},
            "audits": audits, "needs_judge": asks}


def import_claweval(src: str | Path, *, reward: str = "claweval") -> ImportReport:
    """Every task of a claw-eval checkout: converted, or refused with a reason. `reward`: "claweval", a task's
    reward is its grader.py's task score (ClawEval's formula); "judge", forge's judge and exact rules."""
    if reward not in ("claweval", "judge"):
        raise TaskError(f"unknown ClawEval reward {reward!r}: claweval (its grader's task score) or judge")
    root = _root(Path(src).expanduser())
    try:
        import yaml  # noqa: F401
    except ImportError:
        raise TaskError("the ClawEval importer reads task.yaml with PyYAML: pip install 'openforge[claweval]'") from None
    report = ImportReport()
    for task_dir in sorted(p for p in (root / "tasks").iterdir() if (p / "task.yaml").is_file()):
        try:
            report.tasks.append(convert_task(root, task_dir, reward))
        except _Refused as exc:
            reason = str(exc)
            if reason.startswith("online-only: "):
                report.online_only.append((task_dir.name, reason.removeprefix("online-only: ")))
            else:
                report.unsupported.append((task_dir.name, reason))
        except (KeyError, TypeError, ValueError) as exc:
            report.unsupported.append((task_dir.name, f"malformed task.yaml: {type(exc).__name__}: {exc}"))
    return report
