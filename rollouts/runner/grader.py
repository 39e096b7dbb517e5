"""Grading a rollout once its agent is gone: the exact graders (answer, files, a GUI site's state, a task
service's record, the shell verifier, a Harbor task's tests) and a judge component weighed beside them.

    grader = RolloutGrader(store, config)
    reward, output, note = await grader.grade(sb, ro, task, answer, site, services=services)

Everything the graders read is read on the host or written afresh for them: the answer file, the
verifier's files and HOME, the tools' dispatch record (the host's copy), never a file the agent could
have planted where the grader looks (docs/security.md). A grader that cannot run raises InfraFailure:
the rollout is the infrastructure's failure, never a 0.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from collections.abc import Callable
from typing import Any

from openforge.config import ForgeConfig
from openforge.errors import SandboxError
from openforge.image_store import ImageError, ImageStore
from openforge.paths import store_home
from openforge.rollouts.runner.tool_server import dispatch_record_path
from openforge.rollouts.runner.transcript import action_history
from openforge.rollouts.tasks.format import ANSWER_FILE, TaskSpec, parse_score
from openforge.rollouts.tasks.grading import answer_matches, clip, file_matches
from openforge.rollouts.tasks.judge import PolicyBaseJudge, judge, weighted_reward
from openforge.rollouts.tasks.services import gates_hold
from openforge.rollouts.tasks.tools import DISPATCH_ENV, DISPATCH_FILE
from openforge.sandbox.base import ExecResult, Sandbox, SandboxFileNotFound, SandboxPathRefused, stop_shielded
from openforge.store import Judgement, Rollout, Store, hash_key, new_judge_key

STORED_OUTPUT_CHARS = 64_000  # harness/verifier output kept per rollout (the tail: where errors are)
SNAPSHOT_MAX_BYTES = 16 << 20  # a file copied out for a ClawEval grader (env_snapshot); past it, an error entry
KILL_GRACE_S = 10.0  # past the limit, a sandbox that has not returned from exec is stopped by force
# The verifier's own HOME and TMPDIR, made afresh in the grader's folder: nothing the agent left in its
# HOME (a usercustomize.py in the user site, a ~/.gitconfig running commands) runs in the verifier.
VERIFIER_HOME = ".forge/verifier-home"


class InfraFailure(Exception):
    """A failure of the machinery, not the policy's: recorded as status `failed`, failure_kind infra."""


def verifier_env(workdir: str) -> dict[str, str]:
    home = f"{workdir.rstrip('/')}/{VERIFIER_HOME}"
    return {"HOME": home, "TMPDIR": home, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def tail(text: str, limit: int = STORED_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


async def run_in_sandbox(config: ForgeConfig, sb: Sandbox, command: list[str] | str, *, timeout: float,
                         env: dict[str, str] | None = None) -> ExecResult:
    """`sb.exec` with a backstop: a sandbox that does not return shortly after the limit is stopped."""
    try:
        return await asyncio.wait_for(
            sb.exec(command, timeout=timeout, env=env, max_output=config.sandbox.max_output_bytes),
            timeout=timeout + KILL_GRACE_S)
    except TimeoutError:
        await stop_shielded(sb)
        return ExecResult(exit_code=124, stdout="", stderr="killed: the sandbox did not return at its limit",
                          timed_out=True, duration_s=timeout + KILL_GRACE_S)
    except SandboxError as exc:
        raise InfraFailure(f"the sandbox failed while running: {exc}") from None


async def _db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Store calls are sync SQLite; off the loop they cannot stall a proxy serving on this loop.
    return await asyncio.to_thread(fn, *args, **kwargs)


class RolloutGrader:
    """The graders of one runner's rollouts (its store records the judgements; `proxy_url` serves the
    policy-base judge)."""

    def __init__(self, store: Store, config: ForgeConfig, *, proxy_url: str = "") -> None:
        self.store = store
        self.config = config
        self.proxy_url = proxy_url

    async def grade(self, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str, site: Any = None, *,
                     services: Any = None,
                     ) -> tuple[float, str, str | None]:
        """(reward, what the graders said, a note when a verifier's output was unusable): the exact
        graders' reward, and a judge component's score weighed beside it (rollouts/tasks/judge.py). An
        imported ClawEval task's reward is its own grader's task score (ClawEval's formula, its judge inside);
        under `claweval.reward = "judge"` forge's reward above, ClawEval's scores said and stored beside it."""
        # The files a ClawEval grader reads, copied out first: the agent is gone, and nothing forge writes
        # for its own graders (the answer file, verifier folders) can stand in for them.
        snapshot = await self._claweval_snapshot(sb, task) if task.claweval and task.claweval.snapshot_files else None
        if task.claweval is None:
            return await self._grade(sb, ro, task, answer, site, services=services)
        if task.claweval.reward == "judge":
            reward, output, note = await self._grade(sb, ro, task, answer, site, services=services)
        else:  # forge's own judge is not asked: ClawEval's grader asks its judge itself
            from openforge.rollouts.tasks.services import services_summary
            reward, output, note = None, services_summary(services.requests()) if services is not None else "", None
        from openforge.rollouts.runner.claweval_score import claweval_verdict
        from openforge.rollouts.tasks.claweval_grading import ClawEvalGradingFailed, verdict_line

        policy_base = await self._policy_base(ro) \
            if task.claweval.needs_judge and self.config.judge.endpoint == "policy-base" else None
        try:
            verdict = await claweval_verdict(self.config, self.store, ro, task, answer, services, snapshot,
                                             policy_base=policy_base)
        except ClawEvalGradingFailed as exc:
            raise InfraFailure(str(exc)) from None
        line = verdict_line(verdict, is_reward=reward is None)
        return (float(verdict["task_score"]) if reward is None else reward), tail(f"{output}\n{line}".strip()), note

    async def _claweval_snapshot(self, sb: Sandbox, task: TaskSpec) -> dict[str, Any]:
        """ClawEval's env_snapshot of the files the task names (its /workspace paths), read from the sandbox's
        working directory: a missing file, a link out or a folder is ClawEval's "not found" entry."""
        from openforge.rollouts.tasks.claweval_grading import snapshot_entry

        assert task.claweval is not None
        snapshot = {}
        for name, rel in task.claweval.snapshot_files.items():
            data = await self.read_expected(sb, rel, SNAPSHOT_MAX_BYTES + 1)
            snapshot[f"file:{name}"] = snapshot_entry(name, data) if data is None or len(data) <= SNAPSHOT_MAX_BYTES \
                else {"error": f"{name} is larger than {SNAPSHOT_MAX_BYTES} bytes"}
        return snapshot

    async def _grade(self, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str, site: Any = None, *,
                     services: Any = None) -> tuple[float, str, str | None]:
        exact = await self._grade_exact(sb, task, answer, site, services=services, ro=ro) if task.exact_graded else None
        if task.judge is None:
            assert exact is not None  # TaskSpec requires a grader
            return exact
        # Gates only ever zero the reward: with no other exact rule the judge's score is the reward, so a
        # safety check the agent kept by doing nothing earns nothing (issue 31's ClawEval tasks).
        if services is not None and not gates_hold(task.expect_requests, services.requests()):
            said, note = (f"{exact[1]}\n", exact[2]) if exact is not None else ("", None)
            return 0.0, tail(f"{said}a gate rule failed: reward 0, the judge not asked"), note
        score, line = await self._judge(sb, ro, task, answer)
        if exact is None:
            return score, line, None
        reward, output, note = exact
        return weighted_reward(reward, score, task.judge.weight), tail(f"{output}\n{line}"), note

    async def _judge(self, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str) -> tuple[float, str]:
        """The judge's score and a line saying it; every call is recorded. A judge that gave no score
        (a timeout, an HTTP error, an unparseable reply) makes the rollout an infra failure, never a 0."""
        assert task.judge is not None
        cap = self.config.judge.max_answer_chars
        files: dict[str, str | None] = {}
        for path in task.judge.files:  # read on the host, as the exact graders do; cut to the cap
            got = await self.read_expected(sb, path, 4 * cap + 4)
            files[path] = None if got is None else got.decode("utf-8", "replace")
        images = await _db(self._screenshots, ro, task.judge.screenshots) if task.judge.shows_screenshots else None
        actions = action_history(await _db(self.store.list_calls, rollout_id=ro.id)) \
            if task.judge.shows_actions else None
        policy_base = await self._policy_base(ro) if self.config.judge.endpoint == "policy-base" else None
        done = await judge(self.config.judge, task.judge, instruction=task.instruction, answer=answer, files=files,
                           images=images, actions=actions, policy_base=policy_base)
        if done.judgement_id is not None:  # the proxy's judge route recorded the call: the score is ours
            await _db(self.store.score_judgement, done.judgement_id, score=done.score, error=done.error)
        else:
            await _db(self.store.add_judgement, Judgement(
                run_id=ro.run_id, rollout_id=ro.id, model=done.model, prompt_json=done.messages, reply=done.reply,
                score=done.score, error=done.error, latency_ms=done.latency_ms))
        if done.score is None:
            raise InfraFailure(f"the judge failed: {done.error}")
        return done.score, f"judge: {task.judge.output} score {done.score:g}, weight {task.judge.weight:g}"

    async def _policy_base(self, ro: Rollout) -> PolicyBaseJudge:
        """The proxy's judge route with a judge key that replaces the rollout's key: the agent is gone (its
        key now works nowhere) and never saw this one, which the proxy takes on its judge route only."""
        key = new_judge_key()
        await _db(self.store.update_rollout, ro.id, key_hash=hash_key(key))
        return PolicyBaseJudge(self.proxy_url, key)

    def _screenshots(self, ro: Rollout, n: int) -> list[bytes]:
        """The last `n` distinct images the rollout's calls sent the policy (a GUI agent's screenshots),
        oldest first, read from the run's image files the proxy wrote beside the store."""
        shas: list[str] = []
        for call in self.store.list_calls(rollout_id=ro.id):
            for sha in call.images or []:
                if sha in shas:  # an agent resends earlier screenshots: keep each at its latest place
                    shas.remove(sha)
                shas.append(sha)
        images = ImageStore.for_run(store_home(self.store.path), ro.run_id)  # where the proxy wrote them
        try:
            return [images.get(sha) for sha in shas[-n:]]
        except (ImageError, OSError) as exc:
            raise InfraFailure(f"a screenshot for the judge is unreadable: {exc}") from None

    async def _grade_exact(self, sb: Sandbox, task: TaskSpec, answer: str, site: Any = None, *,
                           services: Any = None, ro: Rollout | None = None,
                           ) -> tuple[float, str, str | None]:
        """The exact graders: (reward, what they said, a note when a verifier's output was unusable). The answer,
        the expected files and a GUI task's site state (read on the host) are checked here, outside the
        sandbox; then the shell verifier."""
        if task.harbor is not None:  # a Harbor task: its own tests are its grader
            return await self._harbor(sb, task)
        if task.osworld is not None:  # an OSWorld-format task: its evaluator is its grader
            return await self._osworld(sb, task, answer)
        lines, passed = [], True
        if services is not None:  # the record forge's own fronts kept: nothing in the sandbox is read
            from openforge.rollouts.tasks.services import check_requests, services_summary
            record = services.requests()
            ok, rule_lines = check_requests(task.expect_requests, record)
            passed &= ok
            lines += [*rule_lines, services_summary(record)]
        if site is not None and task.gui is not None and task.gui.expect_state:
            ok, line = site.grade()
            passed &= ok
            lines.append(line)
        if task.expect_answer is not None:
            ok = answer_matches(task.expect_answer, answer)
            passed &= ok
            lines.append(f"answer: {'ok' if ok else 'wrong'}: expected {task.expect_answer.describe()}, "
                         f"got {clip(answer)}")
        for path, want in task.expect_files.items():
            got = await self.read_expected(sb, path, len(want.encode("utf-8")) + 2)
            ok = file_matches(want, got)
            passed &= ok
            lines.append(f"{path}: {'ok' if ok else 'missing' if got is None else 'wrong'}"
                         + ("" if ok or got is None else f": got {clip(got.decode('utf-8', 'replace'))}"))
        try:
            await self._grader_folders(sb, task)
            await sb.write_file(ANSWER_FILE, answer.encode("utf-8"))
            # The host's record, never one the agent wrote (`.forge/` was moved aside).
            if (task.tools or task.mcp_servers) and ro is not None:
                record = dispatch_record_path(ro.run_id, ro.id)
                await sb.write_file(DISPATCH_FILE, record.read_bytes() if record.is_file() else b"")
        except SandboxPathRefused as exc:  # the agent planted a link or FIFO where the grader writes
            return 0.0, tail("\n".join([*lines, f"the grader's files cannot be written: {exc}"])), None
        except SandboxError as exc:
            raise InfraFailure(f"writing the answer file failed: {exc}") from None
        reward, note = (1.0 if passed else 0.0), None
        if task.verifier is not None:
            v_reward, v_output, note = await self._verify(sb, task)
            lines.append(v_output)
            reward = v_reward if passed else 0.0
        return reward, tail("\n".join(lines)), note

    async def _harbor(self, sb: Sandbox, task: TaskSpec) -> tuple[float, str, str | None]:
        """A Harbor task's tests, copied in now (the agent is gone) and run; the reward file read on the
        host (rollouts/tasks/harbor_verifier.py). A verifier that could not run is the infrastructure's."""
        from openforge.rollouts.tasks.harbor_verifier import VerifierUnavailable, run_harbor_tests

        assert task.harbor is not None
        try:
            await self._grader_folders(sb, task)
        except SandboxPathRefused as exc:  # the agent planted a link or FIFO where the grader writes
            return 0.0, f"the grader's files cannot be written: {exc}", None
        try:
            reward, output, note = await run_harbor_tests(
                sb, task.harbor, lambda cmd, timeout, env: run_in_sandbox(self.config, sb, cmd, timeout=timeout, env=env),
                verifier_env(sb.info.workdir))
        except VerifierUnavailable as exc:
            raise InfraFailure(f"the task's verifier could not run: {exc}") from None
        return reward, tail(output), note

    async def _osworld(self, sb: Sandbox, task: TaskSpec, answer: str) -> tuple[float, str, str | None]:
        """An OSWorld-format evaluator: its getters in the sandbox (the agent gone), OSWorld's metric on the
        host (rollouts/tasks/osworld_eval.py). A metric that cannot run is the infrastructure's failure."""
        from openforge.rollouts.tasks.osworld_eval import OSWorldUnavailable, grade_osworld

        assert task.osworld is not None
        try:
            await self._grader_folders(sb, task)
        except SandboxPathRefused as exc:  # the agent planted a link or FIFO where the grader writes
            return 0.0, f"the grader's files cannot be written: {exc}", None
        limit, env = self.config.runner.verifier_timeout_s, verifier_env(sb.info.workdir)
        try:
            reward, output = await grade_osworld(
                task.osworld, answer, read_file=lambda path, cap: self.read_expected(sb, path, cap),
                run=lambda line: run_in_sandbox(self.config, sb, line, timeout=limit, env=env))
        except OSWorldUnavailable as exc:
            raise InfraFailure(f"the task's OSWorld evaluator could not run: {exc}") from None
        return reward, tail(output), None

    async def _grader_folders(self, sb: Sandbox, task: TaskSpec) -> None:
        """Move aside what the agent left where the grader writes: `.forge/` (the answer file's folder)
        and each hidden top-level folder of the verifier's files (`.verify/`: a planted `json.py` there
        would be on a Python verifier's import path), then make the verifier's fresh HOME. A rename, not
        `rm -rf`: it takes no time however many files the agent made there, and it moves a link itself,
        never what it points at. Raises SandboxPathRefused when that failed (the agent's doing)."""
        folders = sorted({".forge", *(p.split("/", 1)[0] for p in task.verifier_files if p.startswith(".")
                                      and "/" in p)})
        aside = f".forge-left-{secrets.token_hex(4)}"
        script = " && ".join(f"{{ ! [ -e {q} ] && ! [ -L {q} ] || mv -- {q} {aside}-{i}; }}"
                             for i, q in enumerate(map(shlex.quote, folders)))
        done = await run_in_sandbox(self.config, sb, f"{script} && mkdir -p {shlex.quote(VERIFIER_HOME)}",
                                timeout=self.config.runner.verifier_timeout_s)
        if done.exit_code != 0:
            raise SandboxPathRefused(f"clearing {', '.join(folders)} failed (exit {done.exit_code}): "
                                     f"{tail(done.stderr, 300)}")

    async def read_expected(self, sb: Sandbox, path: str, limit: int) -> bytes | None:
        """A file the task expects, read up to `limit` bytes (a longer one is wrong anyway)."""
        try:
            return await sb.read_file(path, max_bytes=limit)
        except (SandboxFileNotFound, SandboxPathRefused):  # a link out, a FIFO, a folder: not the file
            return None
        except SandboxError as exc:
            if "directory" in str(exc).lower() or "not a regular" in str(exc).lower():
                return None  # the agent left a folder (or worse) where the file should be: not there
            raise InfraFailure(f"reading {path} from the sandbox failed: {exc}") from None

    async def _verify(self, sb: Sandbox, task: TaskSpec) -> tuple[float, str, str | None]:
        """(reward, verifier output, a note when the verifier's output was unusable)."""
        assert task.verifier is not None
        try:
            for path, content in task.verifier_files.items():
                await sb.write_file(path, content.encode("utf-8"))
        except SandboxPathRefused as exc:  # a folder of the verifier's made a link out by the agent
            return 0.0, f"verifier: its files cannot be written: {exc}", None
        except SandboxError as exc:
            raise InfraFailure(f"writing the verifier files failed: {exc}") from None
        limit = self.config.runner.verifier_timeout_s
        cap = self.config.sandbox.max_output_bytes
        env = verifier_env(sb.info.workdir) | ({DISPATCH_ENV: f"{sb.info.workdir.rstrip('/')}/{DISPATCH_FILE}"}
                                                 if task.tools or task.mcp_servers else {})
        done = await run_in_sandbox(self.config, sb, task.verifier, timeout=limit, env=env)
        output = tail(f"verifier: exit code {done.exit_code}\n{done.stdout}"
                       + (f"\n[stderr]\n{done.stderr}" if done.stderr else ""))
        if done.timed_out:
            return 0.0, output, f"verifier ran past {limit:g}s"
        if done.truncated and len(done.stdout.encode("utf-8")) >= cap - 3:
            # Only the head was kept: the last line is not the verifier's last line, and without a
            # score line an exit 0 would read as 1.0 (the agent's output can push the score line off).
            return 0.0, output, f"verifier printed more than {cap} bytes: its score line was cut off"
        reward, note = parse_score(done.exit_code, done.stdout)
        return reward, output, note
