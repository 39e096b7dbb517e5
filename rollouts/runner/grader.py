"""Grading a rollout once its agent is gone: the exact graders (answer, files, a family's check such as a GUI
site's state, a task service's record, the shell verifier) and a judge component weighed beside them. A task's
family (rollouts/tasks/kinds.py) decides which: its own exact graders (a Harbor task's tests, an OSWorld
evaluator) or its own grader altogether (ClawEval's).

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
from openforge.rollouts.tasks.kinds import TaskKind, kind_of
from openforge.rollouts.tasks.services import gates_hold
from openforge.rollouts.tasks.tools import DISPATCH_ENV, DISPATCH_FILE
from openforge.sandbox.base import ExecResult, Sandbox, SandboxFileNotFound, SandboxPathRefused, stop_shielded
from openforge.store import Judgement, Rollout, Store, hash_key, new_judge_key

STORED_OUTPUT_CHARS = 64_000  # harness/verifier output kept per rollout (the tail: where errors are)
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
        """(reward, what the graders said, a note when a verifier's output was unusable), as the task's family
        grades it (rollouts/tasks/kinds.py): by default the exact graders' reward, and a judge component's score
        weighed beside it (rollouts/tasks/judge.py); a family may grade with its own (ClawEval's grader.py)."""
        return await kind_of(task).grade(self, sb, ro, task, answer, site, services=services)

    async def grade_with_judge(self, kind: TaskKind, sb: Sandbox, ro: Rollout, task: TaskSpec, answer: str,
                               site: Any = None, *, services: Any = None) -> tuple[float, str, str | None]:
        """The family's exact graders (`kind.grade_exact`) and the task's judge weighed beside them."""
        exact = await kind.grade_exact(self, sb, ro, task, answer, site, services=services) \
            if task.exact_graded else None
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
        policy_base = await self.policy_base(ro) if self.config.judge.endpoint == "policy-base" else None
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

    async def policy_base(self, ro: Rollout) -> PolicyBaseJudge:
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

    async def grade_checks(self, sb: Sandbox, task: TaskSpec, answer: str, *, services: Any = None,
                           ro: Rollout | None = None, site_check: Callable[[], tuple[bool, str]] | None = None,
                           ) -> tuple[float, str, str | None]:
        """The exact graders: (reward, what they said, a note when a verifier's output was unusable). The
        services' record, the family's `site_check` (a GUI site's state, read on the host), the answer and the
        expected files are checked here, outside the sandbox; then the shell verifier."""
        lines, passed = [], True
        if services is not None:  # the record forge's own fronts kept: nothing in the sandbox is read
            from openforge.rollouts.tasks.services import check_requests, services_summary
            record = services.requests()
            ok, rule_lines = check_requests(task.expect_requests, record)
            passed &= ok
            lines += [*rule_lines, services_summary(record)]
        if site_check is not None:
            ok, line = site_check()
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
            await self.grader_folders(sb, task)
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

    async def grader_folders(self, sb: Sandbox, task: TaskSpec) -> None:
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
