"""Harnesses by name. A name is looked up, first match wins, in:

    ./harnesses/<name>.toml             a project's own specs
    $FORGE_HOME/harnesses/<name>.toml   a user's specs
    entry points `openforge.harnesses`  installed packages: an adapter class, or a spec file's path
    specs/<name>.toml                   the built-in specs (mini, claude-code, codex, openclaw, browser-use,
                                        mini-gui, mini-swe-agent, opencode, zeroclaw); what a file cannot say
                                        is a hook class the spec names (claude_code.py, codex.py, openclaw.py,
                                        browseruse.py, mini_gui.py)
    HARNESSES                           Python adapters registered by name (none built in: every built-in
                                        harness is a spec)

A name that ends in `.toml` or holds a `/` is a spec file's path. Adapter modules are imported only
when asked for, so `forge` starts fast and an adapter's missing dependency only matters to whoever
uses it. Everything else asks the adapter class what it needs (`available`, `gui`, `own_browser`,
`calls_model`, `npm_harness`, `venv_layer`: rollouts/harnesses/base.py). `container_images.py` builds a sandbox image
with harnesses in it from what they declare.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from openforge.config import ForgeConfig, HarnessConfig
from openforge.errors import HarnessError
from openforge.lazy import lazy_class
from openforge.paths import forge_home
from openforge.rollouts.harnesses.base import Harness, HarnessBase
from openforge.rollouts.harnesses.npm import NpmHarness
from openforge.rollouts.harnesses.spec import HarnessSpec, load_spec

BUILTIN_SPECS = Path(__file__).with_name("specs")
ENTRY_POINT_GROUP = "openforge.harnesses"

# name -> (module, class): Python adapters registered by name, looked up after the specs
HARNESSES: dict[str, tuple[str, str]] = {}


def spec_folders() -> list[Path]:
    """Where specs are looked for by name, first match wins."""
    return [Path.cwd() / "harnesses", forge_home() / "harnesses", BUILTIN_SPECS]


def is_spec_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name


def harness_names() -> list[str]:
    """Every harness name known here, in lookup order."""
    names: list[str] = []
    for folder in spec_folders()[:2]:
        names += sorted(p.stem for p in folder.glob("*.toml"))
    names += [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += sorted(p.stem for p in BUILTIN_SPECS.glob("*.toml"))
    return list(dict.fromkeys([*names, *HARNESSES]))


def find_spec_file(name: str) -> Path | None:
    """The spec file `name` names (a path, or a spec found by name before any entry point), else None."""
    if is_spec_path(name):
        return Path(name).expanduser()
    for folder in spec_folders()[:2]:
        if (folder / f"{name}.toml").is_file():
            return folder / f"{name}.toml"
    return None


def find_spec(name: str) -> HarnessSpec | None:
    """The spec `name` resolves to, read without importing its `hook` (`forge harness show`: reading a spec
    runs none of its author's code); None for an installed package's adapter or a Python one."""
    file = find_spec_file(name)
    if file is not None:
        return load_spec(file)
    if entry_points(group=ENTRY_POINT_GROUP, name=name):
        return None
    builtin = BUILTIN_SPECS / f"{name}.toml"
    return load_spec(builtin) if builtin.is_file() else None


def spec_class(spec: HarnessSpec) -> type[HarnessBase]:
    """The adapter class that runs `spec`: its hook (a SpecHarness subclass), else SpecHarness."""
    from openforge.rollouts.harnesses.spec_harness import SpecHarness

    base: type[SpecHarness] = SpecHarness
    if spec.hook:
        module_name, _, class_name = spec.hook.partition(":")
        try:
            hook = lazy_class(module_name, class_name)
        except (ImportError, LookupError, ValueError) as exc:
            raise HarnessError(f"{spec.path}: hook: cannot load {spec.hook!r}: {exc}") from None
        if not (isinstance(hook, type) and issubclass(hook, SpecHarness)):
            raise HarnessError(f"{spec.path}: hook: {spec.hook!r} is not a SpecHarness subclass")
        base = hook
    if spec.prompt.config and not base.writes_config:
        raise HarnessError(f"{spec.path}: prompt.config: {base.__name__} writes no config file to merge it into "
                           f"(a hook with writes_config does: OpenClaw's); use prompt.args or prompt.env")
    return base.bind(spec)


def npm_harness(name: str) -> NpmHarness:
    """Where npm harness `name` lives in the cache, as its adapter declares it (`npm_harness()`: a spec's
    [install] npm and [run] program, or its hook's): what npm.py's functions take from a caller that has
    only a name. HarnessError when it installs no npm package."""
    found = harness_class(name).npm_harness()
    if found is None:
        raise HarnessError(f"{name!r} is not an npm harness: it installs no npm package")
    return found


def harness_class(name: str) -> type[HarnessBase]:
    """The adapter class for harness `name` (or a spec file's path). HarnessError if unknown or its
    module or spec cannot load."""
    file = find_spec_file(name)
    if file is not None:
        return spec_class(load_spec(file))
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return _from_entry_point(ep)
    if (BUILTIN_SPECS / f"{name}.toml").is_file():
        return spec_class(load_spec(BUILTIN_SPECS / f"{name}.toml"))
    entry = HARNESSES.get(name)
    if entry is None:
        raise HarnessError(f"unknown harness {name!r}; known: {', '.join(harness_names())}")
    try:
        return lazy_class(*entry)
    except ImportError as exc:
        raise HarnessError(f"harness {name!r} is not available here: {exc}") from None
    except LookupError as exc:
        raise HarnessError(f"harness {name!r}: {exc}") from None


def _from_entry_point(ep: object) -> type[HarnessBase]:
    """An `openforge.harnesses` entry point's adapter: it names an adapter class or a spec file's path."""
    where = f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP})"  # type: ignore[attr-defined]
    try:
        target = ep.load()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - a broken third-party package is named, not raised
        raise HarnessError(f"{where}: cannot load it: {type(exc).__name__}: {exc}") from None
    if isinstance(target, type) and issubclass(target, HarnessBase):
        return target
    if isinstance(target, (str, Path)):
        return spec_class(load_spec(target))
    raise HarnessError(f"{where}: names neither a HarnessBase subclass nor a spec file's path")


def get_harness(config: HarnessConfig) -> Harness:
    """The adapter `config.spec` or `config.name` names, built with its config. HarnessError if unknown or
    unavailable."""
    return harness_class(config.spec or config.name)(config)  # type: ignore[call-arg]


def harness_available(config: ForgeConfig) -> str | None:
    """None when `config.harness` can run with `config.sandbox`, else the fix to print (for preflight).

    A sandbox that runs host programs (local) runs what this machine has: the adapter's `available`
    checks it (the harness cache's programs, this venv's `openai` for `mini`, a `zeroclaw` on the PATH).
    Container sandboxes run their image's install, which only a started container can show: the
    adapter's `prepare` checks it (a harness failure names the fix)."""
    from openforge.sandbox.factory import sandbox_class

    try:
        cls = harness_class(config.harness.spec or config.harness.name)
    except HarnessError as exc:
        return str(exc)
    if not sandbox_class(config.sandbox.type).runs_host_programs:
        return None
    return cls.available(config)
