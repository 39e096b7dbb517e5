"""Typed configuration: one pydantic model per component, composed into `ForgeConfig`.

Precedence, lowest first: the defaults below, a TOML file (`forge.toml`), then CLI flags. The CLI is
the only place that reads flags; it builds these models and hands them to the libraries.

    [engine]
    kind = "embedded"          # or "sglang", "url" for an engine already running, or "router"
    model = "~/.forge/models/tiny"

    [sandbox]
    type = "local"

Unknown keys are an error (a typo in a config file must not be silently ignored).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from openforge.errors import ConfigError, SandboxError
from openforge.lazy import lazy_class
from openforge.presets import preset_layers


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _EngineCommon(_Section):
    """Settings every engine kind has."""

    kind: str = Field("embedded", description="the engine: embedded, sglang, url, router or remote")  # narrowed by each kind
    model: str = Field("", description="local HF checkpoint directory; empty = the tiny model in FORGE_HOME")
    api_key: str = Field("", repr=False, description="the engine's credential (SGLang's --api-key); empty = forge "
                         "makes one per run and hands it to the proxy and trainer in memory")
    request_timeout_s: float = Field(300.0, gt=0, description="longest wait for one engine request (trainer, "
                                     "router front)")
    startup_timeout_s: float = Field(300.0, gt=0, description="longest wait for the engine to load and answer "
                                     "/health")


class _LaunchedEngine(_EngineCommon):
    """Settings of an engine forge starts itself (every kind but url)."""

    host: str = Field("127.0.0.1", description="the address the engine forge starts listens on")
    port: int = Field(0, description="0 = pick a free port")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights' dtype; auto = the embedded engine's float32 on CPU, bfloat16 on CUDA; "
        "SGLang's own choice")
    seed: int = Field(0, description="the engine's random seed (a request's sampling_seed takes precedence)")


class EmbeddedEngineConfig(_LaunchedEngine):
    """forge's own engine (engine/embedded.py), a supervised child process: the CPU, or one GPU."""

    kind: Literal["embedded"] = Field("embedded", description="the engine: embedded (forge's own, on the CPU or "
                                      "one GPU)")
    device: str = Field("auto", description="torch device of the embedded engine (a router's: of each worker it "
                        "starts): auto, cpu, cuda")
    max_batch_size: int = Field(16, ge=1, description="sequences one embedded engine decodes together")
    prefix_cache_mb: int = Field(512, ge=0, description="one embedded engine's memory for the KV of cached prompt "
                                 "prefixes (RadixAttention-like); 0 = no prefix cache")


class SglangEngineConfig(_LaunchedEngine):
    """A supervised SGLang server (engine/sglang.py), run from its own venv."""

    kind: Literal["sglang"] = Field("sglang", description="the engine: sglang (a supervised SGLang server)")
    sglang_python: str = Field("python", description="interpreter of the venv that has sglang installed")
    tp_size: int = Field(1, ge=1, description="SGLang's --tp-size: GPUs one model is split over")
    max_lora_rank: int = Field(64, ge=1, description="SGLang's --max-lora-rank: the largest LoRA rank it loads")
    sglang_args: list[str] = Field(default_factory=list, description="extra launch_server arguments")


class UrlEngineConfig(_EngineCommon):
    """An engine already running (SGLang's native API): forge starts nothing, and waits for its /health."""

    kind: Literal["url"] = Field("url", description="the engine: url (one already running)")
    url: str = Field("", description="base URL of the engine, e.g. http://gpu-host:30000")


class RouterEngineConfig(EmbeddedEngineConfig):
    """sglang-router (PyPI, `pip install -e .[router]`) in front of several workers (engine/router.py). The
    workers forge starts are embedded engines: this table holds their settings too."""

    kind: Literal["router"] = Field("router", description="the engine: router (sglang-router in front of several "
                                    "workers)")
    workers: int = Field(2, ge=1, description="embedded engine workers to start")
    worker_urls: list[str] = Field(default_factory=list, description="SGLang workers already running (URLs), instead "
                                   "of starting embedded ones")
    router_url: str = Field("", description="a sglang-router already running (a cluster's, with service discovery): "
                            "forge starts no workers and no router, and fans adapter loads out to the workers it lists")
    policy: Literal["manual", "cache_aware", "round_robin", "power_of_two", "random"] = Field(
        "manual", description="sglang-router's policy; manual = one rollout's calls on one worker (keyed by "
        "rollout), new rollouts to the worker with the fewest")


class RemoteEngineConfig(_EngineCommon):
    """A teacher behind the proxy (proxy/teacher.py): each call goes to an OpenAI-compatible or Anthropic
    endpoint and is recorded in the tokens of the student, whose folder `model` names (its tokenizer
    and chat template). No engine runs; nothing is trained against it (SFT data: docs/trainer.md)."""

    kind: Literal["remote"] = Field("remote", description="the engine: remote (a teacher's OpenAI-compatible or "
                                    "Anthropic endpoint; calls recorded in the student's tokens)")
    url: str = Field("", description="the upstream's base URL, e.g. https://api.anthropic.com or "
                     "http://host:8000 (the API's path is added)")
    api: Literal["openai", "anthropic"] = Field("openai", description="the upstream's API: openai (POST "
                                                "/v1/chat/completions) or anthropic (POST /v1/messages)")
    api_key_env: str = Field("", description="the NAME of the environment variable holding the upstream's key "
                             "(the key itself is never in a config); empty = no key")
    upstream_model: str = Field("", description="the teacher's model id at the upstream")
    max_retries: int = Field(4, ge=0, description="retries of an upstream 429, 5xx, 529 or connection failure")
    backoff_s: float = Field(1.0, gt=0, description="first retry's wait, doubled each retry (an upstream's "
                             "Retry-After is honoured instead)")
    max_backoff_s: float = Field(30.0, gt=0, description="longest wait before one retry")


_ENGINE_KINDS = {"embedded": EmbeddedEngineConfig, "sglang": SglangEngineConfig, "url": UrlEngineConfig,
                 "router": RouterEngineConfig, "remote": RemoteEngineConfig}
# The keys of the flat [engine] table before the union, and their names in the router's table.
_ENGINE_RENAMED = {"router_workers": "workers", "router_worker_urls": "worker_urls", "router_policy": "policy"}


def _union_tag(key: str, default: str) -> Callable[[Any], str]:
    """A union's discriminator: `key` of a table or a model; a table without it is `default` (as before
    the union)."""
    def tag(value: Any) -> str:
        return str(value.get(key, default) if isinstance(value, dict) else getattr(value, key, default))
    return tag


_engine_tag = _union_tag("kind", "embedded")


# Which engine serves the policy: one table, holding the chosen kind's keys only.
EngineConfig = Annotated[
    Annotated[EmbeddedEngineConfig, Tag("embedded")]
    | Annotated[SglangEngineConfig, Tag("sglang")]
    | Annotated[UrlEngineConfig, Tag("url")]
    | Annotated[RouterEngineConfig, Tag("router")]
    | Annotated[RemoteEngineConfig, Tag("remote")],
    Discriminator(_engine_tag),
]


def embedded_engine_config(config: EngineConfig, **fields: Any) -> EmbeddedEngineConfig:
    """The embedded engine with the settings `config` shares with it, `fields` over them (ConfigError for a
    bad one): a router's worker, or what `forge engine` serves whatever `engine.kind` names."""
    shared = config.model_dump(include=set(EmbeddedEngineConfig.model_fields) - {"kind"})
    try:
        return EmbeddedEngineConfig(**{**shared, **fields})
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, "engine (embedded)")) from None


class ProxyConfig(_Section):
    """The recording proxy that harnesses talk to."""

    host: str = Field("127.0.0.1", description="address the proxy listens on (a sandbox without network reaches it "
                      "through its unix socket)")
    port: int = Field(0, description="0 = pick a free port")
    served_model_name: str = Field("forge-policy", description="the model id the APIs report")
    max_concurrent_calls: int = Field(64, ge=1, description="calls at the engine at once, per worker")
    workers: int = Field(1, ge=1, le=256, description="proxy processes serving the one port and unix socket "
                         "(about one per spare core: see docs/performance.md)")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request body accepted; a bigger one "
                                "is refused")
    call_timeout_s: float = Field(300.0, gt=0, description="how long one model call may take at the engine")
    read_timeout_s: float = Field(30.0, gt=0, description="a request's headers and body must arrive within this")
    default_max_tokens: int = Field(512, ge=1, description="max tokens of a call whose request names none")
    max_tokens_cap: int | None = Field(None, ge=1, description="the most tokens one call may generate, whatever "
                                       "it asks (Claude Code always asks for 32,000); unset = no cap")
    max_context_tokens: int | None = Field(
        None, ge=16, description="the longest prompt + completion served; unset = the engine's context length "
        "(set, it can only lower it)")
    temperature_override: float | None = Field(
        None, description="force this sampling temperature on every call (RL wants on-policy sampling)"
    )
    sampling: Literal["run", "harness"] = Field(
        "run", description="run = every call is sampled by the run's settings (temperature_override, else 1.0; "
        "top_p 1; top_k the whole vocabulary) whatever the harness asks (a harness's temperature 0 would make "
        "every answer of a group the same); harness = as each request asks. The request body keeps what it asked")
    tool_parser: Literal["auto", "hermes", "qwen25", "qwen", "qwen3_coder", "none"] = Field(
        "auto", description="how tool calls are read from the model's text (SGLang's detector names); auto = from "
        "the chat template: qwen3_coder for <function=...> templates, qwen25 for <tool_call> ones, else hermes")
    reasoning_parser: Literal["auto", "qwen3", "deepseek_r1", "deepseek-r1", "none"] = Field(
        "auto", description="how thinking is split off the answer; auto = qwen3 for templates that know <think>, "
        "else none")
    tool_parser_strict: bool = Field(
        False, description="parse as SGLang does: no call to a tool the request did not offer, qwen25's newlines "
        "required, arguments written as a JSON string not decoded, no calls parsed when no tools are offered")


# sandbox.type -> (module, class) of the backend that runs it, imported when first used: this layer names
# its backends and never imports them (tests/test_layers.py), so `forge` starts without the docker or
# kubernetes SDKs. A new backend is one entry here and its config class in `SandboxConfig`'s union.
SANDBOX_BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("openforge.sandbox.local", "LocalSandbox"),
    "docker": ("openforge.sandbox.docker", "DockerSandbox"),
    "kubernetes": ("openforge.sandbox.kubernetes", "KubernetesSandbox"),
}
# What to install when a backend's module cannot be imported.
SANDBOX_INSTALL_HINTS: dict[str, str] = {"kubernetes": "pip install 'kubernetes>=37,<38'",
                                         "docker": "pip install docker"}


def sandbox_backend(sandbox_type: str) -> type:
    """The backend class (sandbox/base.py's `SandboxBase`) `sandbox.type` names; SandboxError for an unknown
    or unloadable one."""
    entry = SANDBOX_BACKENDS.get(sandbox_type)
    if entry is None:
        raise SandboxError(f"unknown sandbox.type {sandbox_type!r}; choose {', '.join(SANDBOX_BACKENDS)}")
    try:
        return lazy_class(*entry)
    except ImportError as exc:
        hint = SANDBOX_INSTALL_HINTS.get(sandbox_type, "check its dependencies")
        raise SandboxError(f"the {sandbox_type} backend cannot be loaded ({exc}); {hint}") from None


class _SandboxCommon(_Section):
    """Settings every sandbox backend has, and what the config does with them (SWE-ReX's deployment configs):
    it builds its backend (`get_sandbox`), names what must answer before a run (`preflight_checks`), says
    what a dry run shows (`plan_lines`, `plan_manifests`) and sweeps what lives off this machine
    (`collect_remote`). Callers call these and never compare `type`."""

    type: str = Field("local", description="the backend: local, docker or kubernetes")  # narrowed by each backend
    workdir: str = Field("/workspace", description="the task's working directory inside container backends")
    start_retries: int = Field(2, ge=0, description="retries of a sandbox that failed to start")
    max_output_bytes: int = Field(1024 * 1024, ge=1024, description="stdout/stderr kept per exec")
    allow_internet: bool = Field(False, description="let a run's online-only tasks (imported WebVoyager / "
                                 "Online-Mind2Web tasks) run: the one switch that admits egress to the public web "
                                 "(on kubernetes, the NetworkPolicy's internet variant); off, they are refused")

    def backend(self) -> type:
        """The class that runs this config's sandboxes (sandbox/base.py's `SandboxBase`), imported now."""
        return sandbox_backend(self.type)

    def get_sandbox(self, *, run_id: str, rollout_id: str, proxy_socket: str | Path | None = None,
                    site_socket: str | Path | None = None) -> Any:
        """A not-yet-started sandbox of this backend: `async with config.get_sandbox(...) as sb`
        (sandbox/factory.py's `make_sandbox` documents the sockets)."""
        return self.backend()(self, run_id=run_id, rollout_id=rollout_id, proxy_socket=proxy_socket,
                              site_socket=site_socket)

    def preflight_checks(self) -> list[tuple[str, Callable[[], object]]]:
        """What must answer before a run starts on this backend, each a name and a call that raises
        SandboxError with the fix (runs/prepare.py's preflight). Isolation is checked for every backend."""
        return []

    def plan_lines(self) -> list[tuple[str, str]]:
        """What `forge up --dry-run` shows of this backend, after its name."""
        return []

    def plan_manifests(self, *, proxy_port: int, gui: bool) -> list[dict[str, Any]]:
        """What this backend would create in a cluster for every rollout, rendered and checked (ForgeError
        where the API server would refuse it); [] for a backend that creates none."""
        return self.backend().plan_manifests(self, proxy_port=proxy_port, gui=gui)

    def collect_remote(self, *, also_cluster: bool = False, **sweep: Any) -> tuple[list[Any], list[str]]:
        """What crashed runs left off this machine (sandbox/gc.py's `Leftover`s) and one note per sweep that
        could not run; `sweep` is `collect_all`'s. Folders and containers on this machine are swept for every
        backend there. `also_cluster` (`forge sandbox gc --kubernetes`): the default cluster's pods too."""
        found, notes = self._collect_own(**sweep)
        if also_cluster:
            pods, more = KubernetesSandboxConfig().collect_remote(**sweep)
            found, notes = found + pods, notes + more
        return found, notes

    def _collect_own(self, **sweep: Any) -> tuple[list[Any], list[str]]:
        try:
            backend = self.backend()
        except SandboxError as exc:
            return [], [f"{self.type}: skipped ({exc})"]
        return backend.collect_leftovers(self, **sweep)


class LocalSandboxConfig(_SandboxCommon):
    """A folder and a process tree on this machine, isolated by bubblewrap (an unprivileged user namespace)."""

    type: Literal["local"] = Field("local", description="the backend: local (processes on this machine, bubblewrap "
                                   "when available)")
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto", description="auto = bwrap, and refuse to run if it cannot isolate; 'none' = plain subprocesses "
                            "(no isolation: only for code you trust)")
    cpu_time_s: int = Field(600, ge=1, description="CPU seconds a sandboxed process may use (RLIMIT_CPU)")
    memory_mb: int = Field(2048, ge=16, description="memory limit of the sandbox, in MB")
    max_processes: int = Field(256, ge=1, description="processes the sandbox may run at once")
    max_file_mb: int = Field(512, ge=1, description="largest file a sandboxed process may write")
    cpus: int = Field(0, ge=0, description="cores the sandbox's processes may run on (CPU affinity); 0 = every "
                      "core this process may use")
    read_only_paths: list[str] = Field(
        default_factory=list, description="host folders bound read-only into each sandbox besides the system, "
                                          "this Python, node and the npm harness cache")

    def plan_lines(self) -> list[tuple[str, str]]:
        return [("isolation", self.isolation),
                ("limits", f"{self.memory_mb} MB, {self.cpu_time_s} CPU s, {self.max_processes} processes")]


class DockerSandboxConfig(_SandboxCommon):
    """One container per rollout on a Docker engine."""

    type: Literal["docker"] = Field("docker", description="the backend: docker (one container per rollout)")
    image: str = Field("openforge-sandbox:latest", description="the container image every rollout runs in")
    base_url: str = Field("", description="Docker engine URL; empty = DOCKER_HOST or the default socket")
    network: str = Field("none", description="'none': the proxy's unix socket, bound in, is the only way out; "
                                             "'host' shares the host's network, every host port included")
    memory_mb: int = Field(2048, ge=16, description="memory limit of each container")
    cpus: float = Field(1.0, gt=0, description="CPU limit of each container (cores, fractions allowed)")
    pids_limit: int = Field(256, ge=1, description="processes a container may run at once")
    max_file_mb: int = Field(0, ge=0, description="largest file a process may write (ulimit fsize); 0 = no limit")
    compose_services: list[dict[str, Any]] = Field(
        default_factory=list, description="set per task, not here: a task's compose services started beside its "
                                          "container (sandbox/compose.py)")

    def preflight_checks(self) -> list[tuple[str, Callable[[], object]]]:
        return [("Docker engine", lambda: self.backend().preflight(self))]

    def plan_lines(self) -> list[tuple[str, str]]:
        return [("image", self.image), ("network", self.network),
                ("limits", f"{self.memory_mb} MB, {self.cpus:g} CPUs, {self.pids_limit} pids")]


class KubernetesSandboxConfig(_SandboxCommon):
    """One pod per rollout on a Kubernetes cluster."""

    type: Literal["kubernetes"] = Field("kubernetes", description="the backend: kubernetes (one pod per rollout)")
    namespace: str = Field("openforge", description="the namespace the pods are created in")
    image: str = Field("openforge:latest", description="the container image of every rollout's pod")
    context: str = Field("", description="kubeconfig context; empty = current context or in-cluster")
    kubeconfig: str = Field("", description="kubeconfig file; empty = KUBECONFIG, ~/.kube/config or in-cluster")
    proxy_url: str = Field("", description="how pods reach the proxy, e.g. http://forge-proxy.openforge:8700")
    cpu_request: str = Field("500m", description="the pod's CPU request (Kubernetes quantity)")
    cpu_limit: str = Field("2", description="the pod's CPU limit (Kubernetes quantity)")
    memory_request: str = Field("512Mi", description="the pod's memory request (Kubernetes quantity)")
    memory_limit: str = Field("2Gi", description="the pod's memory limit (Kubernetes quantity)")
    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels a pod must be scheduled on")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="the pod's tolerations, as in a pod "
                                              "spec")
    image_pull_secrets: list[str] = Field(default_factory=list, description="names of secrets used to pull the image")
    service_account: str = Field("", description="the pods' service account; empty = the namespace's default")
    start_timeout_s: float = Field(300.0, gt=0, description="how long a pod may take to be scheduled and start")
    active_deadline_s: int = Field(
        3600, ge=60, description="activeDeadlineSeconds of each pod: the backstop if forge dies before deleting it"
    )
    run_as_user: int = Field(1000, ge=1, description="uid of every process in the pod (never root)")
    run_as_group: int = Field(1000, ge=1, description="gid, and the fsGroup of the pod's volumes")
    home: str = Field("/home/forge", description="$HOME in the pod: a writable emptyDir (the root is read-only)")
    ephemeral_storage_request: str = Field("1Gi", description="disk the scheduler reserves for a pod")
    ephemeral_storage_limit: str = Field("8Gi", description="disk a pod may use: its volumes, logs and layer")
    delete_grace_s: int = Field(5, ge=1, description="grace period of the pod delete (TERM, then KILL after it)")
    max_pods_per_minute: int = Field(600, ge=1, description="client-side limit on pod creates")
    api_qps: float = Field(50.0, gt=0, description="client-side limit on API requests per second")
    api_burst: int = Field(100, ge=1, description="client-side burst of API requests above api_qps")
    max_threads: int = Field(
        128, ge=4, description="the backend's own executor: one thread per running exec; >= 2 x runner.concurrency"
    )
    create_error_retries: int = Field(
        3, ge=0, description="CreateContainerError seen this often on one pod fails its start (retried as transient)"
    )
    site_relay_host: str = Field(
        "", description="GUI tasks: the address the site relay listens on (e.g. 0.0.0.0 in the controller pod); "
                        "empty = the host of proxy_url, which is where pods dial it"
    )
    site_relay_port: int = Field(
        0, ge=0, le=65535, description="GUI tasks: the site relay's TCP port; 0 = any free one. Fix it in a "
                                       "cluster: the Service and the NetworkPolicy name it"
    )
    compose_services: list[dict[str, Any]] = Field(
        default_factory=list, description="set per task, not here: a task's compose services, each a container "
                                          "of the rollout's pod (sandbox/k8s_manifests.py)")

    def preflight_checks(self) -> list[tuple[str, Callable[[], object]]]:
        return [("Kubernetes", lambda: self.backend().preflight(self))]

    def plan_lines(self) -> list[tuple[str, str]]:
        return [("image", self.image), ("namespace", self.namespace), ("proxy", self.proxy_url or "(none)"),
                ("limits", f"cpu {self.cpu_request}/{self.cpu_limit}, memory {self.memory_request}/"
                           f"{self.memory_limit}, disk {self.ephemeral_storage_request}/"
                           f"{self.ephemeral_storage_limit} (request/limit)")]

    def collect_remote(self, *, also_cluster: bool = False, **sweep: Any) -> tuple[list[Any], list[str]]:
        return self._collect_own(**sweep)  # the configured cluster is the one `also_cluster` means


_SANDBOX_TYPES = {"local": LocalSandboxConfig, "docker": DockerSandboxConfig, "kubernetes": KubernetesSandboxConfig}


_sandbox_tag = _union_tag("type", "local")


# Which backend runs each rollout's sandbox: one table, holding the chosen backend's keys only.
SandboxConfig = Annotated[
    Annotated[LocalSandboxConfig, Tag("local")]
    | Annotated[DockerSandboxConfig, Tag("docker")]
    | Annotated[KubernetesSandboxConfig, Tag("kubernetes")],
    Discriminator(_sandbox_tag),
]


def sandbox_config(type: str = "local", **fields: Any) -> LocalSandboxConfig | DockerSandboxConfig | KubernetesSandboxConfig:
    """The sandbox config of backend `type` (ConfigError for an unknown one or a bad field)."""
    cls = _SANDBOX_TYPES.get(type)
    if cls is None:
        raise ConfigError(f"unknown sandbox.type {type!r}; choose local, docker or kubernetes")
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, f"sandbox ({type})")) from None


class HarnessConfig(_Section):
    """The agent program that runs in each sandbox."""

    # An open name: a spec in ./harnesses/ or $FORGE_HOME/harnesses/, an installed adapter (entry-point group
    # openforge.harnesses), a built-in, or a spec file's path; `forge harness list` shows what exists here.
    name: str = Field("mini", min_length=1, description="the agent harness each rollout runs (forge harness list), "
                      "or the path of a harness spec file")
    spec: str = Field("", description="a harness spec file (TOML) to run instead of the one harness.name finds")
    # Several harnesses in one run: each GRPO group (each eval task's k samples) runs in one of them.
    names: list[str] | dict[str, float] = Field(
        default_factory=list, description="several harnesses in one run (names or spec paths): a list is taken in "
        "turn, a table name -> weight by weighted round-robin, group by group; each group runs in one harness. "
        "harness.name is then the first of them")
    max_turns: int = Field(8, ge=1, description="the harness's own turn limit ({max_turns} in a "
                           "harness spec): model turns before it gives up")
    max_tokens: int = Field(256, ge=1, description="the harness's own cap on tokens per model call "
                            "({max_tokens} in a harness spec)")
    npm_cache: str = Field("", description="folder with node_modules of npm harnesses; empty = FORGE_HOME/npm")
    extra_args: list[str] = Field(default_factory=list, description="extra command-line arguments passed to the "
                                  "harness")

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        """`names` and `name` are one setting: with `names`, `name` is its first (so a stored config reads
        back the same); any other `name`, or a `spec`, beside them is a conflict."""
        if not isinstance(data, dict) or not data.get("names"):
            return data
        names = data["names"]
        listed = list(names) if isinstance(names, (list, dict)) else []
        if isinstance(names, list) and len(set(map(str, listed))) != len(listed):
            raise ValueError(f"harness.names lists a harness twice: {listed}")
        if isinstance(names, dict) and any(not isinstance(w, (int, float)) or w <= 0 for w in names.values()):
            raise ValueError(f"harness.names: every weight must be a number > 0, got {names}")
        if data.get("spec"):
            raise ValueError("harness.spec names one harness; with harness.names, list the spec's path there instead")
        if "name" in data and listed and data["name"] != listed[0]:
            raise ValueError(f"harness.name {data['name']!r} and harness.names {listed} are one setting: give one")
        return {**data, "name": listed[0]} if listed else data

    def weights(self) -> dict[str, float]:
        """Each harness of the run -> its share of the groups (one harness: itself, weight 1)."""
        if isinstance(self.names, dict):
            return {name: float(w) for name, w in self.names.items()}
        return {name: 1.0 for name in self.names} or {self.name: 1.0}

    def one(self, name: str) -> HarnessConfig:
        """This config for harness `name` alone (its other settings shared by every harness of the run)."""
        if not self.names:
            return self
        return self.model_copy(update={"name": name, "names": []})


class TasksConfig(_Section):
    path: str = Field("builtin", description="a task folder or .jsonl file, or 'builtin'")
    include: list[str] = Field(default_factory=list, description="only these task ids (empty = all)")
    max_setup_file_mb: float = Field(
        64.0, gt=0, description="the largest file a task folder may hold (files/, verifier/, a Harbor task's tests/, "
        "environment/ and solution/, an imported task's fixtures): a larger one refuses the task, judged by its size, "
        "unread")
    max_setup_files: int = Field(5000, ge=1, description="the most files one folder of a task may hold (files/, "
                                 "tests/, ...): more refuses the task, counted before any is read")


class RunnerConfig(_Section):
    """How rollouts are scheduled."""

    concurrency: int = Field(4, ge=1, description="rollouts running at once")
    rollout_timeout_s: float = Field(300.0, gt=0, description="cap on a rollout; a task's own limit may be lower")
    time_limit_scale: float = Field(1.0, gt=0, description="multiplies every task's time limit (a CPU engine "
                                    "serving a real harness's 48k-token prompts is many times slower than a GPU)")
    wall_cap_scale: float = Field(4.0, ge=1.0, description="a harness run's hard wall-clock cap, as a multiple of "
                                  "its time limit: the limit leaves out the time its model calls spend at the "
                                  "proxy and engine, up to this cap (past it: an infra failure, a hung engine)")
    verifier_timeout_s: float = Field(60.0, gt=0, description="cap on a task's verifier run")
    samples_per_task: int = Field(4, ge=1, description="k for eval, the group size G for GRPO")
    pass_k: list[int] = Field(default_factory=lambda: [1, 3], description="the k values of pass@k and pass^k in eval "
                              "summaries")


class JudgeConfig(_Section):
    """The model that grades a task's judge component (rollouts/tasks/judge.py): any OpenAI-compatible
    chat endpoint, or the run's own engine with its base weights, called by the runner after the agent
    is gone."""

    endpoint: Literal["url", "policy-base"] = Field(
        "url", description="url: the OpenAI-compatible endpoint at `url`; policy-base: the run's own engine "
        "with its base weights (no LoRA adapter), through the proxy's judge route, recorded as judgements and "
        "never as policy calls: no second model (`url`, `model`, `api_key_env` stay empty)")
    url: str = Field("", description="the endpoint's base URL (…/v1); empty = no judge (a task with a judge "
                     "component then fails as an infra failure)")
    model: str = Field("", description="the model name sent in each request")
    api_key_env: str = Field("", description="the NAME of the environment variable holding the API key "
                             "(empty = no Authorization header); the key itself never goes in a config file")
    timeout_s: float = Field(60.0, gt=0, description="one judge call's limit; past it the rollout is an infra failure")
    max_answer_chars: int = Field(8000, ge=100, description="the agent's answer (and each file) is cut to this "
                                  "many characters before the judge sees it")

    @model_validator(mode="after")
    def _one_endpoint(self) -> JudgeConfig:
        if self.endpoint == "policy-base" and (self.url or self.model or self.api_key_env):
            raise ValueError("judge.url, judge.model and judge.api_key_env name an endpoint of its own: leave them "
                             "empty with judge.endpoint = \"policy-base\" (the run's own engine)")
        return self


class TrainerConfig(_Section):
    """GRPO with LoRA. The names follow the papers' symbols where there is one."""

    steps: int = Field(10, ge=0, description="training steps to run")
    tasks_per_step: int = Field(4, ge=1, description="groups per step; each group is samples_per_task rollouts")
    lr: float = Field(1e-4, gt=0, description="peak learning rate of AdamW")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="learning rate after "
                                                                 "warm-up: constant, cosine or linear decay to 0")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients are clipped to this global norm")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range epsilon")
    clip_eps_high: float | None = Field(None, description="asymmetric upper clip (DAPO); None = clip_eps")
    tis_cap: float = Field(2.0, gt=0, description="truncated importance sampling cap C on pi_old / mu (the "
                           "trainer's probability of a sampled token over the engine's); with off_policy = mis, "
                           "the ratio above which a token is masked")
    off_policy: Literal["tis", "mis", "icepop", "none"] = Field(
        "tis", description="the engine/trainer correction of each sampled token's policy gradient "
        "(trainer/off_policy.py): tis = weight min(ratio, tis_cap); mis = weight ratio, masked (0) above tis_cap; "
        "icepop = weight ratio, masked outside icepop_band; none = weight 1")
    icepop_band: tuple[float, float] = Field(
        (0.5, 5.0), description="off_policy = icepop: the band [low, high] of pi_old / mu a token is trained in "
        "(IcePop's alpha, beta); tokens outside it are masked")
    kl_coef: float = Field(0.0, ge=0, description="beta of the KL to the reference (adapter disabled)")
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus: the loss subtracts it times "
                                "the mean entropy of the policy on the sampled tokens' positions (keeps a GUI policy "
                                "exploring); 0 = none")
    std_normalize: bool = Field(True, description="GRPO divides advantages by the group std; False = Dr. GRPO")
    loss_agg: Literal["token-mean", "seq-mean"] = Field("token-mean", description="how token losses are averaged: "
                                                        "over all tokens, or per sequence then over sequences")
    epochs_per_step: int = Field(1, ge=1, description="passes over a step's rollouts (more than 1 reuses them "
                                 "off-policy, clipped)")
    micro_batch_tokens: int = Field(4096, ge=16, description="token budget of one micro-batch")
    share_prefix_min_tokens: int = Field(
        256, ge=0, description="rows sharing a prompt prefix this long run it once per step (exact); 0 = off"
    )
    full_finetune: bool = Field(False, description="train every weight instead of a LoRA adapter")
    lora_r: int = Field(8, ge=1, description="LoRA rank")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling alpha (the update is scaled by alpha / r)")
    lora_dropout: float = Field(0.0, ge=0, le=1, description="dropout on the LoRA input")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="the modules LoRA adapts")
    init_from: str | None = Field(
        None, description="a PEFT adapter folder the LoRA starts from instead of a fresh one (an SFT result: "
        "`forge up --init-from RUN` stores its final adapter's path here); its rank and target modules must be these")
    device: str = Field("auto", description="torch device for training: auto, cpu, cuda")
    seed: int = Field(0, description="seed of the LoRA init and the task order")
    overlap: bool = Field(False, description="one-step-off-policy, the older name of max_staleness = 1: true sets "
                          "max_staleness to 1 when it is 0 (a larger max_staleness already samples ahead)")
    max_staleness: int = Field(0, ge=0, description="asynchronous training (trainer/buffer.py): groups are sampled "
                               "continuously and trained at most this many adapter versions after the one that "
                               "sampled them; 0 = synchronous")
    rollout_versions: int = Field(1, ge=1, description="asynchronous training: how many adapter versions one "
                                  "rollout's calls may span. 1 = a rollout keeps the adapter it started with; N > 1 "
                                  "= partial rollouts: a rollout still running moves onto each newly published "
                                  "adapter, every call recording the one that served it, up to N versions")
    rollout_versions_policy: Literal["finish_old", "drop_group"] = Field(
        "finish_old", description="a rollout at the rollout_versions cap when a newer adapter is published: "
        "finish_old = it finishes under the version it has; drop_group = it moves on and its group is dropped "
        "from training (counted: version_capped, version_dropped_groups)")
    nproc: int = Field(1, ge=1, description="trainer processes on this machine: > 1 runs `forge train` / `forge up` "
                       "under torchrun with FSDP2 (gloo on CPU, NCCL on GPUs, one GPU per rank); rank 0 owns the run")

    @model_validator(mode="after")
    def _overlap_is_staleness_one(self) -> TrainerConfig:
        # One path samples ahead: the asynchronous buffer. Set in __dict__, as a validated assignment
        # would run this validator again.
        if self.overlap and self.max_staleness == 0:
            self.__dict__["max_staleness"] = 1
        return self

    @model_validator(mode="after")
    def _band_around_one(self) -> TrainerConfig:
        low, high = self.icepop_band
        if not 0 < low < 1 < high:  # a band without 1 would mask tokens the engine and trainer agree on
            raise ValueError(f"icepop_band {[low, high]}: needs 0 < low < 1 < high (IcePop's is [0.5, 5])")
        return self


class SftConfig(_Section):
    """`forge sft`: supervised fine-tuning on kept rollouts, with the optimizer and LoRA of [trainer] at
    SFT's own learning rate."""

    lr: float = Field(2e-4, gt=0, description="peak learning rate of SFT's AdamW (RL's is trainer.lr): 2e-4 is the "
                      "usual rate for LoRA SFT of a real model; full fine-tuning wants ~1e-5; the tiny demo model "
                      "needs 3e-3 (the demo preset's, `forge sft --demo`; bench sft_stages)")

    max_tokens: int = Field(4096, ge=16, description="tokens of one packed row: short sequences share a row "
                            "(attention kept within each), one row per optimizer step; a longer one is a row alone")


class TrackingConfig(_Section):
    """Experiment trackers every train step is logged to, beside the run store (runs/tracking.py): each
    backend an optional extra (`pip install 'openforge[wandb]'`, `[tensorboard]`, `[mlflow]`), imported only
    when named."""

    backends: list[Literal["wandb", "tensorboard", "mlflow"]] = Field(
        default_factory=list, description="where to log each train step: wandb, tensorboard, mlflow; empty = the run "
        "store only")
    project: str = Field("openforge", description="the W&B project, the MLflow experiment")
    run_name: str = Field("", description="the tracked run's display name; empty = the run's name, else its id")
    dir: str = Field("", description="where trackers write their files (W&B's offline runs, TensorBoard's event "
                     "files, MLflow's SQLite store); empty = the run's folder, FORGE_HOME/runs/<id>/tracking")
    wandb_mode: Literal["auto", "online", "offline"] = Field(
        "auto", description="auto = online when a W&B key is configured (WANDB_API_KEY, ~/.netrc) and accepted, "
        "else offline with one warning (upload later with `wandb sync`); WANDB_MODE=offline forces offline")
    mlflow_uri: str = Field("", description="MLflow's tracking URI (a server, or a database); empty = a SQLite "
                            "file in the tracking dir, artifacts beside it")
    samples_per_step: int = Field(4, ge=0, description="rollouts per step logged as a table of transcripts "
                                  "(task, harness, reward, the readable steps); 0 = none")


class StoreConfig(_Section):
    """Where runs are recorded: the SQLite file `FORGE_HOME/forge.db` (the default), or a PostgreSQL
    database shared by many proxy workers and machines (docs/cluster.md; the `[postgres]` extra)."""

    url: str = Field("", description="empty = the SQLite file in FORGE_HOME; or postgresql+asyncpg://user@host/db "
                     "(the password from PGPASSWORD or ~/.pgpass, or in the URL); $FORGE_STORE_URL also sets it")

    @model_validator(mode="after")
    def _postgres_only(self) -> StoreConfig:
        if self.url and self.url.partition("://")[0].split("+", 1)[0] not in ("postgresql", "postgres"):
            raise ValueError("store.url: only PostgreSQL URLs (postgresql+asyncpg://user@host/db); "
                             "leave it empty for the SQLite file")
        return self


class ForgeConfig(_Section):
    """Everything a run needs. `forge config show` prints the effective one."""

    name: str = Field("", description="a human name for the run")
    engine: EngineConfig = Field(default_factory=EmbeddedEngineConfig, description="[engine]: the inference engine "
                                 "serving the policy (embedded, sglang, url, router or remote)")
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="[proxy]: the recording proxy harnesses call")
    sandbox: SandboxConfig = Field(default_factory=LocalSandboxConfig, description="[sandbox]: where each rollout "
                                   "runs (local, docker or kubernetes)")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="[harness]: the agent harness")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="[tasks]: which tasks runs use")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="[runner]: how rollouts are run and graded")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="[trainer]: the GRPO trainer")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="[judge]: the model that grades tasks' "
                               "judge components")
    sft: SftConfig = Field(default_factory=SftConfig, description="[sft]: supervised fine-tuning (forge sft)")
    store: StoreConfig = Field(default_factory=StoreConfig, description="[store]: where runs are recorded")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="[tracking]: experiment trackers "
                                     "(W&B, TensorBoard, MLflow) each train step is logged to")

    @model_validator(mode="before")
    @classmethod
    def _sandbox_shape(cls, data: Any) -> Any:
        """Say plainly what is wrong with a `[sandbox]` table the union cannot place."""
        sandbox = data.get("sandbox") if isinstance(data, dict) else None
        if not isinstance(sandbox, dict):
            return data
        kind = sandbox.get("type", "local")
        if kind not in _SANDBOX_TYPES:
            raise ValueError(f"sandbox.type: unknown backend {kind!r}; choose local, docker or kubernetes")
        for name in _SANDBOX_TYPES:
            if isinstance(sandbox.get(name), dict):  # the shape before the union: [sandbox.docker] image = ...
                key = next(iter(sandbox[name]), "KEY")
                raise ValueError(f"sandbox.{name}.{key}: the [sandbox] table now holds the chosen backend's keys "
                                 f"directly: write sandbox.{key} (with sandbox.type = \"{name}\")")
        return data

    @model_validator(mode="after")
    def _judge_has_an_engine(self) -> ForgeConfig:
        if self.judge.endpoint == "policy-base" and self.engine.kind == "remote":
            raise ValueError("judge.endpoint = \"policy-base\" judges with the run's own engine, and engine.kind = "
                             "\"remote\" has none: set judge.endpoint = \"url\" with judge.url")
        return self

    @model_validator(mode="before")
    @classmethod
    def _engine_shape(cls, data: Any) -> Any:
        """Say plainly what is wrong with an `[engine]` table the union cannot place."""
        engine = data.get("engine") if isinstance(data, dict) else None
        if not isinstance(engine, dict):
            return data
        kind = engine.get("kind", "embedded")
        if kind not in _ENGINE_KINDS:
            raise ValueError(f"engine.kind: unknown kind {kind!r}; choose embedded, sglang, url, router or remote")
        for old, new in _ENGINE_RENAMED.items():
            if old in engine:  # the flat table before the union
                raise ValueError(f"engine.{old}: the router's keys have no prefix now: write engine.{new} "
                                 "(with engine.kind = \"router\")")
        return data


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _format_validation(err: ValidationError, source: str, layers: Sequence[tuple[str, Any]] = ()) -> str:
    """The first error as one line, blamed on the highest of `layers` (label, values) that set the bad
    value (a `--set` item, a preset, the file), else on `source`."""
    first = err.errors()[0]
    loc = list(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    for section, tag_key, members in (("sandbox", "type", _SANDBOX_TYPES), ("engine", "kind", _ENGINE_KINDS)):
        if loc[:1] == [section] and len(loc) > 1 and loc[1] in members:
            tag = loc.pop(1)  # the union's tag: the user wrote sandbox.image, not sandbox.docker.image
            if first["type"] == "extra_forbidden" and len(loc) == 2:
                owners = ", ".join(name for name, member in members.items() if loc[1] in member.model_fields)
                msg = f"not a key of {section}.{tag_key} = \"{tag}\"" + (f" ({owners} only)" if owners else "")
    where = ".".join(str(p) for p in loc)
    # a whole-config check names its key first ("engine.kind: unknown kind ..."): blame who set that key
    named = re.match(r"([a-z_]+(?:\.[a-z_]+)+): ", msg) if not loc else None
    key = named.group(1).split(".") if named else loc
    source = next((label for label, values in reversed(layers) if _sets_leaf(values, key)), source)
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {where}: {msg}{more}" if where else f"{source}: {msg}{more}"


def _sets_leaf(values: Any, loc: Sequence[Any]) -> bool:
    """Whether `values` gives the setting at `loc` itself (not only a section around it)."""
    for part in loc:
        if isinstance(values, dict) and part in values:
            values = values[part]
        elif isinstance(values, list) and isinstance(part, int) and part < len(values):
            values = values[part]
        else:
            return False
    return bool(loc) and not isinstance(values, dict)


def parse_override(item: str) -> dict[str, Any]:
    """`trainer.lr=3e-4` -> {"trainer": {"lr": 3e-4}}; the value is read as TOML, else as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE (e.g. trainer.lr=1e-4), got {item!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    node: dict[str, Any] = {}
    cursor = node
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cursor[part] = {}
        cursor = cursor[part]
    cursor[parts[-1]] = value
    return node


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    preset: str | None = None,
) -> ForgeConfig:
    """Build the effective config from defaults, a TOML file, a preset (openforge/presets/), `--set`
    items and nested `overrides` (flags), each layer over the one before.

    With `path=None`, `./forge.toml` is read if it exists. A given path that is missing is an error.
    The preset's harness-specific layer (e.g. demo-claude-code.toml) is picked by the harness the flags
    or `--set` items name, however they name it: `--harness X` and `--set harness.name=X` get the same.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is None and Path("forge.toml").is_file():
        path = "forge.toml"
    if path is not None:
        p = Path(path).expanduser()
        source = str(p)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {p}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p} is not valid TOML: {exc}") from None
    layers: list[tuple[str, Any]] = [(source, data)]  # who set what, lowest first: an error blames the highest
    given: dict[str, Any] = {}
    sets_given = [(f"--set {item}", parse_override(item)) for item in sets or []]
    for _, one in sets_given:
        given = _deep_merge(given, one)
    given = _deep_merge(given, overrides or {})
    if preset is not None:
        harness = given.get("harness", {}).get("name") if isinstance(given.get("harness"), dict) else None
        for layer in preset_layers(preset, harness):
            data = _merge_layer(data, layer)
            layers.append((f"the {preset} preset", layer))
    layers += [*sets_given, ("the command's options", overrides or {})]
    data = _merge_layer(data, given)
    try:
        return ForgeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, source, layers)) from None


def _merge_layer(data: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """`layer` over `data`, where harness.name and harness.names are one setting: a layer that gives
    one of them replaces what a lower layer gave in the other spelling (`--harness codex` over a file's
    names runs codex alone; `--set harness.names=[...]` over the demo preset's name runs those)."""
    harness, below = layer.get("harness"), data.get("harness")
    if isinstance(harness, dict) and isinstance(below, dict) and ("name" in harness) != ("names" in harness):
        other = "names" if "name" in harness else "name"
        data = {**data, "harness": {k: v for k, v in below.items() if k != other}}
    return _deep_merge(data, layer)


def stored_config(data: dict[str, Any]) -> ForgeConfig:
    """A run's stored config (`run.config_json`) as a ForgeConfig, whatever release stored it. Before the
    engine union, `[engine]` held every kind's keys (the router's with a `router_` prefix): the keys of
    the run's own kind are kept, under their names of today, and the rest dropped, so an old run resumes."""
    data = dict(data)
    engine = data.get("engine")
    member = _ENGINE_KINDS.get(engine.get("kind", "embedded")) if isinstance(engine, dict) else None
    if isinstance(engine, dict) and member is not None:
        engine = {_ENGINE_RENAMED.get(key, key): value for key, value in engine.items()}
        data["engine"] = {key: value for key, value in engine.items() if key in member.model_fields}
    try:
        return ForgeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, "the run's stored config")) from None


def dump_toml(config: BaseModel) -> str:
    """The config as TOML (None values are left out: TOML has no null)."""
    import tomli_w

    data = config.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(data)


def describe_toml(config: BaseModel) -> str:
    """The config as TOML with every key, each under a comment that says what it is (`forge config
    show`). A None value has no TOML spelling: its key is printed commented out, as `(unset)`."""
    lines: list[str] = []
    _describe(config, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _describe(model: BaseModel, path: list[str], lines: list[str]) -> None:
    import tomli_w

    fields = type(model).model_fields
    values = {name: getattr(model, name) for name in fields}
    # TOML puts a table's plain keys before its sub-tables.
    plain = [n for n, v in values.items() if not isinstance(v, (BaseModel, dict))]
    tables = [n for n in fields if n not in plain]
    for name in plain:
        if fields[name].description:  # every field has one (tests/core/test_config.py)
            lines.append(f"# {fields[name].description}")
        value = model.model_dump(mode="json", include={name})[name]
        lines.append(f"# {name} = (unset)" if value is None else tomli_w.dumps({name: value}).rstrip("\n"))
    for name in tables:
        value, where = values[name], [*path, name]
        lines += ["", f"# {fields[name].description}", f"[{'.'.join(where)}]"]
        if isinstance(value, BaseModel):
            _describe(value, where, lines)
        else:  # a free-form table (sandbox.node_selector): its keys are the user's
            lines += tomli_w.dumps(value).rstrip("\n").splitlines() if value else []
