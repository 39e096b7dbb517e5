"""`forge harness check NAME` without the CLI: one tiny rollout of the harness through the proxy, and every
problem it showed at once.

    report = check_harness(store, config, home=home)
    report.problems            # [] when it is fit to train on
    report.first_prompt_tokens  # what its first request costs in context (its prompt budget)

Problems looked for: the harness cannot be found or is not installed; it never called the model (the
proxy got no request: not reachable, wrong URL or key variable); it called another API than its spec
says; its model calls failed (e.g. a first prompt over the model's context); it ended without an
answer where its spec says to find one; it ran past the time limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from openforge.config import ForgeConfig
from openforge.errors import HarnessError
from openforge.rollouts.tasks.format import TaskSpec
from openforge.store import Store

CHECK_TASK = TaskSpec(id="harness-check", instruction="Reply with the single word ok.", verifier="true",
                      time_limit_s=120.0)


@dataclass
class HarnessCheck:
    """What one check of a harness found."""

    harness: str
    problems: list[str] = field(default_factory=list)
    first_prompt_tokens: int | None = None
    calls: int = 0
    apis: list[str] = field(default_factory=list)  # as the proxy recorded them
    seconds: float = 0.0


def check_harness(store: Store, config: ForgeConfig, *, home: Path) -> HarnessCheck:
    """Run CHECK_TASK once in the configured harness (engine + proxy brought up for it)."""
    from openforge.rollouts.harnesses import harness_available, harness_class
    from openforge.rollouts.harnesses.spec import RECORDED_API
    from openforge.rollouts.harnesses.spec_harness import SpecHarness
    from openforge.runs.prepare import resolve_model
    from openforge.runs.stack import Stack

    name = config.harness.spec or config.harness.name
    try:
        cls = harness_class(name)
    except HarnessError as exc:
        return HarnessCheck(name, [str(exc)])
    report = HarnessCheck(cls.name)
    fix = harness_available(config)
    if fix is not None:
        report.problems.append(fix)
        return report
    started = time.monotonic()
    model = str(resolve_model(config, home))
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": model})})
    run = store.create_run(kind="eval", name=f"harness check {cls.name}")
    with Stack(config, store, runner=True) as stack:
        assert stack.bridge is not None
        from openforge.rollouts.runner.runner import RolloutSpec

        [ro] = stack.bridge.run(stack.runner.run(run.id, [RolloutSpec(CHECK_TASK)]))
    store.set_run_status(run.id, "finished")
    report.seconds = time.monotonic() - started
    calls = store.list_calls(rollout_id=ro.id)
    report.calls = len(calls)
    report.apis = sorted({c.api for c in calls})
    if calls:
        report.first_prompt_tokens = calls[0].prompt_tokens or None
    else:
        report.problems.append(f"it never called the model: the proxy got no request (is {cls.name} pointed at "
                               f"the proxy's URL and key? exit code {ro.exit_code})")
    if issubclass(cls, SpecHarness):
        flavour = cls.spec.api.flavour
        other = [api for api in report.apis if api != RECORDED_API[flavour]]
        if other:
            report.problems.append(f"it called the {', '.join(other)} API, but {cls.spec.path} says "
                                   f"api.flavour = {flavour!r}")
    failed = [c for c in calls if c.status != "ok"]
    if failed:
        report.problems.append(f"{len(failed)} of its {len(calls)} model call(s) failed: {failed[0].error}")
    if ro.status == "timed_out":
        report.problems.append(f"it ran past the check's time limit ({CHECK_TASK.time_limit_s:g} s)")
    elif ro.status == "failed" and not (failed and "last model call failed" in (ro.error or "")):
        report.problems.append(ro.error or "the rollout failed")
    return report

