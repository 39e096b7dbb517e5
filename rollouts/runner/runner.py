"""The rollout runner: many (task, sample) rollouts, each in its own sandbox, bounded and recorded.

    runner = RolloutRunner(store, config=config, proxy_url=proxy.url)
    rollouts = await runner.run(run_id, [RolloutSpec(task, i) for task in tasks for i in range(4)])

A spec may name one of the run's harnesses (`harness.names`); each rollout runs in, and records, its own.

One rollout: pending -> running -> start a sandbox (retried: infrastructure) -> setup files and
command -> harness prepare + run under the time limit (the sandbox kills it) -> assemble the
trajectory from the proxy's recorded calls -> the harness's outcome (answer or failure) -> graded
(rollouts/runner/grader.py: the answer and expected files checked exactly, then the shell verifier,
then a judge component) -> scored. A task's services and tools run on the host around the sandbox
(rollouts/tasks/services.py, rollouts/runner/tool_server.py). What differs by task family (its display,
its sandbox image, its probes, its graders) is the family's `TaskKind` (rollouts/tasks/kinds.py); a family
may drive a rollout as steps, a harness run per step in the one sandbox, each graded before the next
(rollouts/runner/steps.py: a multi-step Harbor task). The final states say who failed:

    scored     graded; `reward` is the policy's data (0.0 for an agent that did nothing). With
               failure_kind "policy" the harness stopped on the policy's own failure (its turn limit, a
               context the policy filled, an output cap, the agent killing its harness): reward 0.0,
               never graded, `error` "policy: <reason>"; kept in its group and in pass@k
    timed_out  the harness ran past its limit and was killed; reward 0.0 (the agent's failure)
    failed     no reward; the trainer drops the whole group. `failure_kind` and the prefix of `error`
               say whose: "infra" (the sandbox would not start, setup or the harness install broke,
               the sandbox died, the rollout's last model call failed in the proxy/engine, the task's
               judge gave no score) or
               "harness" (the harness reported a fault that is not the policy's, exited without an
               answer for no reason of the policy's, or made no successful model call:
               rollouts/harnesses/base.py). Never graded from its output.
    cancelled  the run was cancelled (Ctrl-C, `cancel()`) before the rollout finished

Which ending is whose is decided from what the policy cannot write (rollouts/runner/failures.py
`judge_outcome`): the harness's structured result, its exit code, and the proxy's record of the calls.
One harness run and its classification is rollouts/runner/harness_run.py, shared with steps.py.

Every sandbox is stopped on every path, cancellation included. The runner never asks which sandbox
backend, harness or task family it has: it uses only the members their protocols declare (sandbox/base.py,
rollouts/harnesses/base.py, rollouts/tasks/kinds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from openforge.config import ForgeConfig
from openforge.errors import SandboxError
from openforge.store import Rollout, Store
from openforge.rollouts.harnesses.base import Harness, HarnessContext
from openforge.rollouts.runner.failures import failure_fields
from openforge.rollouts.runner.grader import InfraFailure, RolloutGrader, tail
from openforge.rollouts.runner.harness_run import run_harness
from openforge.rollouts.runner.tool_server import ToolServer, ToolServerUnavailable, dispatch_record_path
from openforge.rollouts.runner.trajectory import assemble_rollout
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.kinds import check_run, kind_of
from openforge.sandbox.base import Sandbox, SandboxStartFailed, start_with_retry, stop_shielded
from openforge.sandbox.confine import Confinement

log = logging.getLogger(__name__)

TOOLS_PORT = 8701  # a task's MCP server on the sandbox's own 127.0.0.1 (the proxy's forwarder has 8700)
SandboxFactory = Callable[..., Sandbox]  # (SandboxConfig, *, run_id, rollout_id) -> Sandbox


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout to run: a task, its position within the task's group, and the harness it runs in
    (a name of `harness.names`; "" = the runner's own harness)."""

    task: TaskSpec
    sample_index: int = 0
    harness: str = ""


def _default_factory() -> SandboxFactory:
    from openforge.sandbox.factory import make_sandbox

    return make_sandbox


def _with_harness_install(config: ForgeConfig) -> Any:
    """The sandbox config, with a configured npm harness install made readable inside a sandbox that
    runs host programs (a container backend carries its own install and leaves its config as it is)."""
    if not config.harness.npm_cache:
        return config.sandbox
    from openforge.rollouts.harnesses.npm import npm_cache_dir
    from openforge.sandbox.factory import sandbox_class

    return sandbox_class(config.sandbox.type).with_host_folders(config.sandbox, [str(npm_cache_dir(config.harness))])


class RolloutRunner:
    """Runs rollouts with bounded concurrency; `pause()` holds new ones back, `cancel()` stops all."""

    def __init__(self, store: Store, *, config: ForgeConfig, proxy_url: str, harness: Harness | None = None,
                 sandbox_factory: SandboxFactory | None = None,
                 on_progress: Callable[[Rollout], Any] | None = None, proxy_socket: str | None = None) -> None:
        from openforge.rollouts.harnesses import get_harness

        self.store = store
        self.config = config
        self.proxy_url = proxy_url
        self.proxy_socket = proxy_socket  # the proxy's unix socket, bound into isolated sandboxes
        self.sandbox_config = _with_harness_install(config)
        self.harness = harness or get_harness(config.harness)  # the run's harness (its first, with several)
        self._harnesses: dict[str, Harness] = {"": self.harness}
        self.sandbox_factory = sandbox_factory or _default_factory()
        self.on_progress = on_progress
        self.grader = RolloutGrader(store, config, proxy_url=proxy_url)
        self._gate = asyncio.Event()
        self._gate.set()
        self._sem = asyncio.Semaphore(config.runner.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._context_asked, self._context_size = False, None  # the proxy's context size (context_tokens)

    # -- control --------------------------------------------------------------------------------

    def pause(self) -> None:
        """Start no new rollouts until `resume()`; running ones carry on."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    @property
    def paused(self) -> bool:
        return not self._gate.is_set()

    def cancel(self) -> None:
        """Cancel every unfinished rollout of the current `run` (their sandboxes are stopped)."""
        for task in self._tasks:
            task.cancel()

    async def context_tokens(self, key: str | None) -> int | None:
        """The run's context size as the proxy enforces it (its model listing's `context_length`), asked
        once with a live rollout's key; None when the proxy reports none or cannot be asked (the harness
        is then not told: its spec's [context] is left out)."""
        if self._context_asked:
            return self._context_size
        import httpx

        try:
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.get(f"{self.proxy_url.rstrip('/')}/v1/models",
                                          headers={"Authorization": f"Bearer {key}"})
                answer.raise_for_status()
                size = answer.json()["data"][0].get("context_length")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            log.warning("the proxy at %s did not say the run's context size (%s): harnesses are not told it",
                        self.proxy_url, exc)
            size = None
        self._context_asked, self._context_size = True, int(size) if size else None
        return self._context_size

    # -- running --------------------------------------------------------------------------------

    def harness_for(self, name: str) -> Harness:
        """The adapter of harness `name` of `harness.names` ("" or the only one: the runner's), built once.
        HarnessError if it cannot be built."""
        from openforge.rollouts.harnesses import get_harness

        if name not in self._harnesses:
            self._harnesses[name] = (self.harness if not self.config.harness.names
                                     else get_harness(self.config.harness.one(name)))
        return self._harnesses[name]

    async def run(self, run_id: str, specs: list[RolloutSpec], *, step: int = 0,
                  adapter: str | None = None) -> list[Rollout]:
        """Run every spec; returns their rollouts (final states) in the order of `specs`.

        Rollouts are created `pending` up front, so the dashboard sees the whole step at once. If the
        caller is cancelled (Ctrl-C), every unfinished rollout becomes `cancelled`, every sandbox is
        stopped, and the CancelledError propagates."""
        unique = {s.task.id: s.task for s in specs}
        harnesses = [self.harness_for(s.harness) for s in specs]  # an unknown one fails the call, before any row
        check_run(unique.values(), self.config)  # a family's refusal fails the call
        await self._db(self.store.add_tasks, run_id, [t.to_record() for t in unique.values()])
        rollouts = []
        for spec, harness in zip(specs, harnesses):
            rollouts.append(await self._db(
                self.store.create_rollout, run_id=run_id, task_id=spec.task.id, step=step,
                sample_index=spec.sample_index, sandbox=self.config.sandbox.type, harness=harness.name,
                adapter=adapter))
        tasks = [asyncio.create_task(self._guarded(ro, spec)) for ro, spec in zip(rollouts, specs)]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._tasks.difference_update(tasks)
        return [await self._db(self.store.get_rollout, ro.id) for ro in rollouts]

    async def _guarded(self, ro: Rollout, spec: RolloutSpec) -> None:
        try:
            await self._rollout(ro, spec)
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(ro.id, status="cancelled", error="cancelled before it finished",
                                              only_unfinished=True))
            raise
        except Exception as exc:  # noqa: BLE001 - one rollout's bug must not take the step down
            log.exception("rollout %s crashed", ro.id)
            await self._finish(ro.id, status="failed",
                               **failure_fields("infra", f"runner error: {type(exc).__name__}: {exc}"))

    async def _rollout(self, ro: Rollout, spec: RolloutSpec) -> None:
        await self._gate.wait()
        async with self._sem:
            await self._gate.wait()  # a pause while this one queued for a slot holds it too
            await self._db(self.store.update_rollout, ro.id, status="running")
            self._progress(ro.id)
            try:  # a GUI task's site first: a container binds its socket when it is created
                site = self._open_site(spec.task)
            except InfraFailure as exc:
                await self._finish(ro.id, status="failed", **failure_fields("infra", str(exc)))
                return
            services = None
            try:
                services = await self._open_services(ro, spec)
                if services is False:
                    return
                sb = await self._start_sandbox(ro, site, spec.task)
                if sb is None:
                    return
                try:
                    if site is not None and not sb.supports_gui:
                        raise InfraFailure(f"GUI task {spec.task.id} needs a sandbox with a display: the "
                                            f"{sb.info.backend} backend has none (use sandbox.type = \"local\" "
                                            "with bubblewrap, or \"docker\" with the browser image)")
                    async with self._tools(ro, spec.task, services) as tools:
                        await self._drive(sb, ro, spec.task, self.harness_for(spec.harness), site, services=services,
                                          tools=tools)
                except InfraFailure as exc:
                    await self._finish(ro.id, status="failed", **failure_fields("infra", str(exc)))
                finally:
                    await stop_shielded(sb)
            finally:  # after the sandbox: nothing inside can reach the site any more
                if site is not None:
                    await asyncio.shield(asyncio.to_thread(site.close))
                if services:  # after grading: the graders read their record
                    await asyncio.shield(asyncio.to_thread(services.close))

    @contextlib.asynccontextmanager
    async def _tools(self, ro: Rollout, task: TaskSpec, services: Any) -> AsyncIterator[ToolServer | None]:
        """A task's tools: its MCP server on the host for this rollout (forwarding to the recording fronts
        of the task's services), closed on every path; None for a task without tools."""
        if not task.tools and not task.mcp_servers:
            yield None
            return
        try:
            confinement = self._confinement()
        except SandboxError as exc:
            raise InfraFailure(f"the task's tools could not be served: {exc}") from None
        server = ToolServer(task.tools, record=dispatch_record_path(ro.run_id, ro.id),
                            services=services.urls() if services else {}, mcp_servers=task.mcp_servers,
                            confinement=confinement)
        try:
            await server.start()
        except (ToolServerUnavailable, OSError) as exc:
            await server.close()
            raise InfraFailure(f"the task's tools could not be served: {exc}") from None
        try:
            yield server
        finally:
            await asyncio.shield(server.close())

    def _confinement(self) -> Confinement:
        """How a task's own code (its services, MCP servers, tool commands) runs on the host: in a bubblewrap
        sandbox of its own, or plain only where the run chose `sandbox.isolation = "none"` (sandbox/confine.py)."""
        return Confinement.for_sandbox(self.config.sandbox)

    @staticmethod
    def _open_site(task: TaskSpec) -> Any:
        """The task's display for this rollout, as its family opens it (a web task's site served on the host or
        its live start page, a desktop task's display); None for a task without one."""
        return kind_of(task).open_site(task)

    async def _open_services(self, ro: Rollout, spec: RolloutSpec) -> Any:
        """The task's services for this rollout (rollouts/tasks/services.py), None without any, or False
        after recording `failed` (infra) when one would not start or become healthy."""
        if not spec.task.services:
            return None
        from openforge.rollouts.tasks.services import ServiceSession, ServiceStartFailed
        try:
            confinement = self._confinement()
        except SandboxError as exc:
            await self._finish(ro.id, status="failed", **failure_fields("infra", f"services cannot run here: {exc}"))
            return False
        # Seeded by task and sample: a rerun of a sample meets the same injected errors.
        opening = asyncio.ensure_future(asyncio.to_thread(ServiceSession.open, spec.task.services,
                                                          seed=f"{spec.task.id}/{spec.sample_index}",
                                                          confinement=confinement))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:  # the thread goes on starting them: what it opens is closed at once
            opening.add_done_callback(lambda done: done.cancelled() or done.exception() is not None
                                      or threading.Thread(target=done.result().close, daemon=True).start())
            raise
        except ServiceStartFailed as exc:
            await self._finish(ro.id, status="failed", **failure_fields("infra", str(exc)))
            return False

    async def _start_sandbox(self, ro: Rollout, site: Any = None, task: TaskSpec | None = None) -> Sandbox | None:
        """A started sandbox, or None after recording `failed` once every start attempt has failed.
        A GUI task's site socket goes to the factory (a container binds it at creation); a task with an
        image of its own (a built Harbor environment) runs in it where the backend can."""

        async def record(attempt: int, error: BaseException | None) -> None:
            await self._db(self.store.update_rollout, ro.id, attempts=attempt)

        extra = {"proxy_socket": self.proxy_socket} if self.proxy_socket else {}
        if site is not None:
            extra["site_socket"] = site.socket_path
        try:
            sb = await start_with_retry(
                lambda: self.sandbox_factory(self._sandbox_config_for(task), run_id=ro.run_id, rollout_id=ro.id,
                                             **extra),
                retries=self.config.sandbox.start_retries, timeout=self.config.runner.rollout_timeout_s,
                on_attempt=record)
        except SandboxStartFailed as exc:
            await self._finish(ro.id, status="failed", **failure_fields("infra", str(exc)))
            return None
        await self._db(self.store.update_rollout, ro.id, sandbox_id=sb.info.sandbox_id)
        return sb

    def _sandbox_config_for(self, task: TaskSpec | None) -> Any:
        """The run's sandbox config, with what the task's family asks of it (its image, services, limits)."""
        kind = kind_of(task) if task is not None else None
        if kind is None or not kind.needs_own_sandbox_config(task):
            return self.sandbox_config
        from openforge.sandbox.factory import sandbox_class

        return kind.sandbox_config(task, sandbox_class(self.config.sandbox.type), self.sandbox_config)

    async def _drive(self, sb: Sandbox, ro: Rollout, task: TaskSpec, harness: Harness, site: Any = None, *,
                     services: Any = None, tools: ToolServer | None = None) -> None:
        budget = min(task.time_limit_s * self.config.runner.time_limit_scale, self.config.runner.rollout_timeout_s)
        tools_url = ""
        if harness.gui and site is None:  # a display is started only around a site or a desktop
            raise InfraFailure(f"harness {harness.name} acts on a display, and forge starts one only for a GUI "
                               f"task's site or a desktop task; task {task.id} has none (a task done with a shell "
                               "takes a shell harness: mini, claude-code)")
        if tools is not None:
            if not harness.takes_tools:
                raise InfraFailure(f"task {task.id} has tools, but harness {harness.name} takes none (its spec "
                                    "has no [mcp] table: docs/harnesses.md)")
            try:
                tools_url = sb.expose_socket(tools.socket_path, tools.url, TOOLS_PORT)
            except SandboxError as exc:
                raise InfraFailure(f"the task's tools cannot reach the sandbox: {exc}") from None
        service_env: dict[str, str] = {}
        if services is not None:  # each service's recording front, as FORGE_SERVICE_<NAME>_URL
            try:
                service_env = services.expose(sb)
            except SandboxError as exc:
                raise InfraFailure(f"the task's services cannot reach the sandbox: {exc}") from None
        ctx = HarnessContext(proxy_url=sb.agent_proxy_url(self.proxy_url), api_key=ro.key,
                             model=self.config.proxy.served_model_name, instruction=task.instruction,
                             workdir=sb.info.workdir, backend=sb.info.backend, task_id=task.id,
                             tools_url=tools_url, tools_token=tools.token if tools is not None else "",
                             context_tokens=await self.context_tokens(ro.key))
        await self._setup(sb, task)
        kind = kind_of(task)
        await kind.prepare(sb, task, site)  # its probes: what the sandbox lacks is never the policy's 0
        if await kind.drive(self, sb, ro, task, harness, ctx, service_env):  # a family that runs steps itself
            return
        assembly_error: str | None = None

        async def before_judging() -> None:  # after kill_all and the record, before the ending is decided
            nonlocal assembly_error
            if tools is not None or services is not None:  # the grader's execs reach no tool and no service
                sb.withdraw_sockets()
            if tools is not None:  # no dispatch arrives after this
                await tools.close()
            assembly_error = await self._assemble(ro.id, harness)
            if tools is not None and tools.infra_error:  # a tool's handler could not run: not the policy's data
                raise InfraFailure(f"a task tool failed: {tools.infra_error}")

        run = await run_harness(self, sb, ro, harness, ctx, budget=budget, env=service_env, site=site,
                                before_judging=before_judging)
        if run.ending == "timed_out":
            await self._finish(ro.id, status="timed_out", reward=0.0, failure_kind="timeout", error=run.reason)
            return
        if run.ending in ("harness", "config"):  # never scored: its error text is not an answer
            await self._finish(ro.id, status="failed", **failure_fields(run.ending, run.reason))
            return
        if run.ending == "policy":  # the policy's 0, not graded: its output is no answer either
            reward, verifier_output, ending = 0.0, None, failure_fields("policy", run.reason)
        else:
            reward, verifier_output, note = await self.grader.grade(sb, ro, task, run.answer, site,
                                                                    services=services)
            ending = {"error": note}
        if assembly_error:
            await self._finish(ro.id, status="failed", reward=reward, verifier_output=verifier_output,
                               **failure_fields("infra", f"trajectory assembly failed: {assembly_error}"))
            return
        await self._finish(ro.id, status="scored", reward=reward, verifier_output=verifier_output, **ending)

    async def _setup(self, sb: Sandbox, task: TaskSpec) -> None:
        try:
            for path, data in task.setup_files().items():  # text and binary, byte-exact on every backend
                await sb.write_file(path, data)
            if task.setup:
                done = await sb.exec(task.setup, timeout=self.config.runner.verifier_timeout_s)
                if done.exit_code != 0:
                    raise InfraFailure(f"task setup exited {done.exit_code}: {tail(done.stderr, 500)}")
        except SandboxError as exc:
            raise InfraFailure(f"task setup failed: {exc}") from None

    async def _assemble(self, rollout_id: str, harness: Harness) -> str | None:
        """Write the rollout's trajectory rows (the harness's side calls tagged); returns why it failed, or None."""
        try:
            await self._db(assemble_rollout, self.store, rollout_id, harness.side_calls)
        except Exception as exc:  # noqa: BLE001 - recorded on the rollout; the group gets dropped
            return f"{type(exc).__name__}: {exc}"
        return None

    # -- helpers --------------------------------------------------------------------------------

    async def _finish(self, rollout_id: str, *, status: str, only_unfinished: bool = False, **fields: Any) -> None:
        if only_unfinished:
            current = await self._db(self.store.get_rollout, rollout_id)
            if current.status not in ("pending", "running"):
                return
        await self._db(self.store.update_rollout, rollout_id, status=status, **fields)
        self._progress(rollout_id)

    def _progress(self, rollout_id: str) -> None:
        if self.on_progress is None:
            return
        try:
            self.on_progress(self.store.get_rollout(rollout_id))
        except Exception as exc:  # noqa: BLE001 - a dashboard callback must not break rollouts
            log.warning("progress callback failed: %s", exc)

    @staticmethod
    async def _db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Store calls are sync SQLite; off the loop they cannot stall a proxy serving on this loop.
        return await asyncio.to_thread(fn, *args, **kwargs)

