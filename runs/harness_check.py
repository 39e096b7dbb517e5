"""`forge harness check NAME` without the CLI: one tiny rollout of the harness through the proxy, and every
problem it showed at once.

    report = check_harness(store, config, home=home)
    report.problems            # [] when it is fit to train on
    report.first_prompt_tokens  # what its first request costs in context (its prompt budget)
    checks = harness_run_checks(config, home=home)  # `forge up --dry-run`: each harness of the run, as checks

It runs under the settings the run will use (the config's, or with `--demo` the preset's: the context,
the tokens per call, the sampling). Problems looked for: the harness cannot be found or is not installed;
it never called the model (the proxy got no request: not reachable, wrong URL or key variable); it
called another API than its spec says; its own prompt does not fit the context (the proxy refused a main
call that held no answer of the policy's); no main call was answered (a side call its spec names does not
count); its model calls failed; it ended without an answer where its spec says to find one; it ran past
the time limit. Warnings: it asks for its own sampling (temperature 0 makes a group's answers the same),
which training overrides. The answer it read is printed beside its score (is it the agent's answer, or a
line printed after it?).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from openforge.config import ForgeConfig
from openforge.errors import HarnessError
from openforge.rollouts.runner.failures import prompt_misfit
from openforge.rollouts.tasks.format import TaskSpec
from openforge.rollouts.tasks.grading import ExpectedAnswer
from openforge.runs.checks import Check
from openforge.store import Call, Store

CHECK_TASK = TaskSpec(id="harness-check", instruction="Reply with the single word ok.",
                      expect_answer=ExpectedAnswer(words="ok"), time_limit_s=120.0)
_GOT = re.compile(r"^answer: \w+: expected .*?, got (.*)$", re.MULTILINE)  # the exact grader's line (grader.py)


@dataclass
class HarnessCheck:
    """What one check of a harness found."""

    harness: str
    problems: list[str] = field(default_factory=list)
    first_prompt_tokens: int | None = None
    calls: int = 0
    refused: int = 0  # calls the proxy refused as over the context
    side_calls: int = 0  # the harness's own background calls, as its spec names them
    apis: list[str] = field(default_factory=list)  # as the proxy recorded them
    seconds: float = 0.0
    answer: str | None = None  # what the harness's [answer] read, quoted as the grader quotes it
    score: float | None = None  # the check task's reward for it (the answer "ok")
    warnings: list[str] = field(default_factory=list)


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
    main = [c for c in calls if c.side is None]
    report.calls, report.side_calls = len(calls), len(calls) - len(main)
    report.refused = sum(1 for c in calls if c.status == "refused")
    report.apis = sorted({c.api for c in calls})
    report.score = ro.reward
    if got := _GOT.search(ro.verifier_output or ""):
        report.answer = got.group(1)
    report.warnings = sampling_warnings(calls, config)
    if main:
        report.first_prompt_tokens = main[0].prompt_tokens or None
    # the proxy refused its prompt, or the harness would not send it (told the context: the runner's verdict)
    misfit = prompt_misfit(cls.name, calls) or (
        ro.error.removeprefix("config: ") if ro.failure_kind == "config" and ro.error else None)
    if misfit:
        report.problems.append(f"its own prompt does not fit: {misfit.split(': ', 1)[1]}")
    elif main and not any(c.status == "ok" for c in main):
        report.problems.append(f"none of its {len(main)} main call(s) was answered"
                               + (f" ({report.side_calls} side call(s) were)" if report.side_calls else ""))
    if not calls and not misfit:
        report.problems.append(f"it never called the model: the proxy got no request (is {cls.name} pointed at "
                               f"the proxy's URL and key? exit code {ro.exit_code})")
    if issubclass(cls, SpecHarness):
        flavour = cls.spec.api.flavour
        other = [api for api in report.apis if api != RECORDED_API[flavour]]
        if other:
            report.problems.append(f"it called the {', '.join(other)} API, but {cls.spec.path} says "
                                   f"api.flavour = {flavour!r}")
    failed = [c for c in calls if c.status in ("error", "interrupted")]
    if failed:
        report.problems.append(f"{len(failed)} of its {len(calls)} model call(s) failed: {failed[0].error}")
    if ro.status == "timed_out":
        report.problems.append(f"it ran past the check's time limit ({CHECK_TASK.time_limit_s:g} s)")
    elif ro.status == "failed" and ro.failure_kind != "config" and not (
            failed and "last model call failed" in (ro.error or "")):
        report.problems.append(ro.error or "the rollout failed")
    return report


def harness_run_checks(config: ForgeConfig, *, home: Path,
                       on_harness: Callable[[str], None] = lambda name: None) -> list[Check]:
    """`check_harness` on every harness of the run, under the run's own settings, in a scratch store (no run
    row in FORGE_HOME's store): one check per harness, failed by any problem, its prompt size in the detail.
    This is what `forge up --dry-run` runs after the plan's checks pass, to see a prompt that cannot fit."""
    checks = []
    with tempfile.TemporaryDirectory(prefix="forge-harness-check-") as scratch:
        store = Store(Path(scratch) / "check.db")
        try:
            for name in config.harness.weights():
                on_harness(name)
                one = config.model_copy(update={"harness": config.harness.one(name)})
                report = check_harness(store, one, home=home)
                tokens = f"first prompt {report.first_prompt_tokens:,} tokens" if report.first_prompt_tokens \
                    else "no prompt recorded"
                said = f"{report.calls} model call(s), {report.refused} refused for length, {tokens}"
                if report.problems:
                    checks.append(Check(f"harness {report.harness}", "missing",
                                        f"harness {report.harness}: {'; '.join(report.problems)} ({said})"))
                else:
                    checks.append(Check(f"harness {report.harness}", "warn" if report.warnings else "ok",
                                        f"harness {report.harness}: one rollout ran, {said}"
                                        + "".join(f"; {w}" for w in report.warnings)))
        finally:
            store.close()
    return checks


def sampling_warnings(calls: list[Call], config: ForgeConfig) -> list[str]:
    """What the harness asked for of the sampling (its request bodies), when the run samples otherwise."""
    asked: dict[str, set[object]] = {}
    for call in calls:
        body = call.request_json if isinstance(call.request_json, dict) else {}
        for key in ("temperature", "top_p", "top_k"):
            if body.get(key) is not None:
                asked.setdefault(key, set()).add(body[key])
    if not asked:
        return []
    said = ", ".join(f"{key} {' / '.join(str(v) for v in sorted(values, key=str))}" for key, values in asked.items())
    if config.proxy.sampling == "harness":
        greedy = "temperature" in asked and 0 in asked["temperature"]
        return [f"it asks for {said}, and proxy.sampling = \"harness\" honours it"
                + ("; at temperature 0 every answer of a group is the same and GRPO learns nothing" if greedy else "")]
    return [f"it asks for {said}: training samples by the run's settings instead (proxy.sampling = \"run\": "
            f"temperature {config.proxy.temperature_override if config.proxy.temperature_override is not None else 1.0:g}"
            ", top_p 1); the calls record what it asked"]

