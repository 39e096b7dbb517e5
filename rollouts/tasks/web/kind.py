"""The web family as a task kind (rollouts/tasks/kinds.py): a `gui` task's site served on the host for each
rollout and graded by its state, or an online-only task's live start page, probed from the sandbox first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openforge.rollouts.tasks.importing import ImportOption, ImportResult
from openforge.rollouts.tasks.kinds import Graded, RolloutGrading, TaskKindBase
from openforge.rollouts.tasks.web.payload import WebPayload

if TYPE_CHECKING:
    from openforge.config import ForgeConfig
    from openforge.rollouts.tasks.format import TaskSpec
    from openforge.sandbox.base import Sandbox
    from openforge.store import Rollout


class WebKind(TaskKindBase):
    name = "web"
    payload_model = WebPayload
    import_formats = ("webvoyager", "online-mind2web")
    import_help = "their task files"
    import_source = "WebVoyager's data/WebVoyager_data.jsonl (or data/); Online-Mind2Web's tasks JSON"
    import_out = "a .jsonl file"
    import_options = (ImportOption("local_sites", "a JSON map of website -> builtin-web site, to run those tasks "
                                                  "offline (docs/tasks.md, \"Web benchmarks\")"),)

    def import_tasks(self, src: str, out: str, *, fmt: str, options: dict[str, Any]) -> ImportResult:
        """A web benchmark's task file (rollouts/tasks/web/benchmarks.py) as one JSONL file (default
        <format>-tasks.jsonl): online-only tasks, or mapped onto builtin-web sites by --local-sites."""
        from openforge.rollouts.tasks.importing import write_jsonl
        from openforge.rollouts.tasks.web.benchmarks import import_web_benchmark

        tasks, online = import_web_benchmark(fmt, src, local_sites=options["local_sites"])
        if not tasks:
            return ImportResult(tasks=[], written_to="")
        path = write_jsonl(tasks, out or f"{fmt}-tasks.jsonl")
        return ImportResult(tasks=tasks, written_to=str(path),
                            summary=f"{src}: {len(tasks)} task(s) imported to {path}: {online} online-only (they need "
                                    f"sandbox.allow_internet), {len(tasks) - online} on local sites")

    def describe(self, task: TaskSpec) -> str:
        web = task.payload(WebPayload)
        return "online-web" if web is not None and web.online is not None else "gui"

    def check_run(self, tasks: list[TaskSpec], config: ForgeConfig) -> None:
        from openforge.rollouts.tasks.web.benchmarks import check_online

        online = [t.id for t in tasks if (web := t.payload(WebPayload)) is not None and web.online is not None]
        check_online(online, allow_internet=config.sandbox.allow_internet)

    def open_site(self, task: TaskSpec) -> Any:
        """An online task's live start page (`LivePage`: the browser opens it over the sandbox's egress), else
        the task's site served on the host for this rollout (rollouts/tasks/web/server.py)."""
        from openforge.rollouts.tasks.web.benchmarks import LivePage

        web = task.payload(WebPayload)
        assert web is not None
        if web.online is not None:
            return LivePage(web.online)
        from openforge.rollouts.runner.grader import InfraFailure
        from openforge.rollouts.tasks.web.server import SiteSession
        try:
            return SiteSession(web.gui)
        except OSError as exc:
            raise InfraFailure(f"cannot serve the task's site: {exc}") from None

    async def prepare(self, sb: Sandbox, task: TaskSpec, site: Any) -> None:
        """A start page that cannot load is the network's failure, never the policy's 0."""
        from openforge.rollouts.runner.grader import InfraFailure
        from openforge.rollouts.tasks.web.benchmarks import PROBE_TIMEOUT_S, LivePage

        if not isinstance(site, LivePage):
            return
        probe = await sb.exec(site.probe_command(), timeout=PROBE_TIMEOUT_S + 15)
        if probe.exit_code != 0:
            why = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or [f"exit code {probe.exit_code}"]
            raise InfraFailure(f"the start page {site.online.start_url} could not be fetched from the sandbox "
                               f"(is its egress open? docs/tasks.md): {why[0][-300:]}")

    async def grade_exact(self, grader: RolloutGrading, sb: Sandbox, ro: Rollout | None, task: TaskSpec, answer: str,
                          site: Any = None, *, services: Any = None) -> Graded:
        """The exact graders, the site's state (read on the host) among them where the task expects one."""
        web = task.payload(WebPayload)
        check = site.grade if site is not None and web is not None and web.exact_graded else None
        return await grader.grade_checks(sb, task, answer, services=services, ro=ro, site_check=check)
