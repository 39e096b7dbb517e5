"""A Harbor task's environment/docker-compose.yaml: its services beside `main`, as the task's `compose`.

Harbor starts a task's compose project with `docker compose up`: `main` is the agent's container, every
other service runs beside it on one network, reached by its name (a database, an API that tests/test.sh
queries after the agent). forge reads the part of Compose's format such services use and the Docker
backend runs them per rollout (sandbox/compose.py; the Kubernetes backend as containers of the rollout's
pod, sandbox/k8s_manifests.py):

    services:
      svc:
        image: my-api:1        # an image the engine holds (forge pulls nothing), or
        build: ./svc           # a folder of environment/ (or {context, dockerfile}), built offline by
                               # `forge tasks import harbor` as the task's own image is
        environment: {TOKEN: "x"}     # or ["TOKEN=x"]
        command: ["python3", "-m", "http.server", "8000"]

Anything else is refused with one line each: other keys of a service (ports, volumes, depends_on, ...),
settings of `main` (forge runs the agent's container from the task's Dockerfile alone), a variable
taken from the host's environment (`- TOKEN` with no value), a file that does not parse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from openforge.sandbox.compose import SERVICE_NAME

SUPPORTED = ("image", "build", "environment", "command")
# (service name, its build context folder, its Dockerfile there) -> the tag of the image built from it
ServiceBuild = Callable[[str, Path, str], str]


def compose_file(env_dir: Path) -> Path | None:
    return next((p for p in (env_dir / "docker-compose.yaml", env_dir / "docker-compose.yml") if p.exists()), None)


def compose_services(env_dir: Path, build: ServiceBuild | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(the TaskSpec.compose records of the services beside `main`, one line per part forge cannot run). A
    service with a `build` is built by `build` (an ImageBuildFailed raised there goes to the caller); without
    one it is refused, saying which command builds it."""
    path = compose_file(env_dir)
    if path is None:
        return [], []
    where = f"environment/{path.name}"
    services, reasons = _read(path, where)
    records: list[dict[str, Any]] = []
    for name, settings in services.items():
        settings = settings or {}
        if name == "main":
            if settings:
                reasons.append(f"{where}: service main sets {', '.join(sorted(map(str, settings)))}: forge runs the "
                               "agent's container from the task's Dockerfile alone")
            continue
        at = f"{where}: service {name}"
        if not SERVICE_NAME.match(str(name)):
            reasons.append(f"{at}: not a name forge can give as a host name (lower-case letters, digits, '_.-')")
            continue
        if unknown := sorted(str(k) for k in settings if k not in SUPPORTED):
            reasons.append(f"{at} sets {', '.join(unknown)}: forge runs a service from only its "
                           f"{', '.join(SUPPORTED)}")
            continue
        try:
            record = {"name": name, "image": _image(env_dir, name, settings, build, at),
                      "environment": _environment(settings.get("environment"), at)}
        except ValueError as exc:
            reasons.append(str(exc))
            continue
        command = settings.get("command")
        if command is not None:
            if not (isinstance(command, str) or isinstance(command, list) and all(isinstance(c, str) for c in command)):
                reasons.append(f"{at}: command must be a string or a list of strings")
                continue
            record["command"] = command
        records.append(record)
    return records, reasons


def _read(path: Path, where: str) -> tuple[dict[str, Any], list[str]]:
    try:
        import yaml
    except ImportError:
        return {}, [f"{where}: reading it needs PyYAML (pip install 'openforge[claweval]')"]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [f"{where}: cannot read it: {exc}"]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        return {}, [f"{where}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}"]
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not all(isinstance(v, dict | None) for v in services.values()):
        return {}, [f"{where}: expected a mapping `services:` of service name -> settings (Docker Compose's format)"]
    return services, []


def _image(env_dir: Path, name: str, settings: dict[str, Any], build: ServiceBuild | None, at: str) -> str:
    if "image" in settings and "build" not in settings:
        if not isinstance(settings["image"], str) or not settings["image"].strip():
            raise ValueError(f"{at}: image must name an image")
        return settings["image"].strip()
    if "build" not in settings:
        raise ValueError(f"{at}: no image or build")
    spec = settings["build"]
    spec = {"context": spec} if isinstance(spec, str) else spec
    if not isinstance(spec, dict) or set(spec) - {"context", "dockerfile"} or not isinstance(spec.get("context"), str):
        raise ValueError(f"{at}: build {spec!r}: forge builds a `context` folder of environment/ (with a "
                         "`dockerfile` in it), nothing else")
    context = (env_dir / spec["context"]).resolve()
    dockerfile = str(spec.get("dockerfile") or "Dockerfile")
    if not context.is_relative_to(env_dir.resolve()) or not (context / dockerfile).is_file():
        raise ValueError(f"{at}: build {spec['context']!r}: no {dockerfile} in that folder of environment/")
    if build is None:
        raise ValueError(f"{at} has a build: `forge tasks import harbor SRC --out DIR` builds it (offline), "
                         "then the imported task runs on the Docker backend")
    return build(name, context, dockerfile)


def _environment(value: Any, at: str) -> dict[str, str]:
    """Compose's `environment` (a mapping, or a list of KEY=VALUE) as strings; a value taken from the host's
    environment (a key with none) is refused: a rollout gets nothing of the host's."""
    if value is None:
        return {}
    items = value.items() if isinstance(value, dict) else (
        [tuple(v.split("=", 1)) if "=" in v else (v, None) for v in value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value) else None)
    if items is None:
        raise ValueError(f"{at}: environment must be a mapping or a list of KEY=VALUE")
    env = {}
    for key, val in items:
        if val is None:
            raise ValueError(f"{at}: environment {key} takes its value from the host's environment; give it one")
        env[str(key)] = str(val).lower() if isinstance(val, bool) else str(val)
    return env
