"""Each call's prompt ids: the rollout's earlier sampled ids reused (tokens.PromptBuilder), the rest
rendered and tokenised - off the event loop when it is long - and the prompt's size checked.

    render (chat template) -> size bound on bytes -> tokenise the tail -> exact length check

One huge prompt must not freeze the proxy: `/health` and every other call keep being served while it
is rendered and tokenised in a worker thread (the Rust tokenizer's batch call releases the GIL), and a
prompt whose bytes alone prove it too long is refused before it is tokenised at all.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from openforge.image_store import ImageStore
from openforge.paths import forge_home
from openforge.proxy.api_adapters import ADAPTERS
from openforge.proxy.calls import APIError, CallRequest, Completion
from openforge.proxy.image_inputs import resolving_from
from openforge.proxy.parsing import ParserSetup
from openforge.proxy.reasoning import opens_thinking
from openforge.proxy.recorder import Recorder
from openforge.proxy.tokens import ChatRenderer, Prompt, PromptBuilder

log = logging.getLogger("forge.proxy")
LONG_TEXT = 16_384  # characters; below this, a thread hop costs more than the work


class PromptTooLong(APIError):
    """A prompt refused as over the context; `tokens` is its length (or a lower bound of it)."""

    def __init__(self, message: str, *, tokens: int) -> None:
        super().__init__("context_length", message, param="messages")
        self.tokens = tokens


def too_long(tokens: int, limit: int, *, at_least: bool = False) -> PromptTooLong:
    """The context error in the words both vendors use ("prompt is too long" is what Claude Code
    recognises and offers /compact for)."""
    count = f"at least {tokens}" if at_least else str(tokens)
    return PromptTooLong(f"prompt is too long: {count} tokens > {limit - 1} maximum (the engine's context is "
                         f"{limit} tokens, prompt and completion together)", tokens=tokens)


class RolloutPrompts:
    def __init__(self, renderer: ChatRenderer, recorder: Recorder, *, parsers: ParserSetup | None = None,
                 home: Path | None = None) -> None:
        self.renderer = renderer
        self.home = home  # the data dir whose runs/<run>/images/ resolve a recorded body's images
        self.recorder = recorder
        self.parsers = parsers or ParserSetup()
        self.builder = PromptBuilder(renderer)
        self._warm_locks: dict[str, asyncio.Lock] = {}
        # With many proxy workers (proxy/workers.py) a rollout's calls may be served by several
        # processes: its turns here are used only while they include its newest finished call.
        self.shared_store = False
        self._newest: dict[str, int] = {}  # the newest call id remembered per rollout
        self._pending: dict[str, list[tuple[CallRequest, Prompt, Completion, int]]] = {}  # answered, not yet remembered

    async def build(self, rollout_id: str, req: CallRequest, *, limit: int | None, body_chars: int) -> Prompt:
        """The prompt for `req` in `rollout_id`; raises the context error if it leaves no room for one
        completion token within `limit` (prompt + max_new_tokens must stay below it, as SGLang counts)."""
        self._settle(rollout_id)
        await self._warm(rollout_id)
        if body_chars > LONG_TEXT:
            prompt = await asyncio.to_thread(self.builder.plan, rollout_id, req.messages, req.prompt_tools)
        else:
            prompt = self.builder.plan(rollout_id, req.messages, req.prompt_tools)
        if limit is not None:
            at_least = len(prompt.ids) + self.renderer.min_tokens(prompt.tail)
            if at_least + 1 >= limit:
                raise too_long(at_least, limit, at_least=True)
        if len(prompt.tail) > LONG_TEXT:
            prompt = await asyncio.to_thread(self.builder.encode_tail, prompt)
        else:
            self.builder.encode_tail(prompt)
        if limit is not None and len(prompt.ids) + 1 >= limit:
            raise too_long(len(prompt.ids), limit)
        return prompt

    def remember(self, rollout_id: str, req: CallRequest, prompt: Prompt, comp: Completion, call_id: int) -> None:
        """A finished call, so the next request replaying its answer reuses its exact ids.

        Its turn is rendered (the whole history plus the answer) just after the response goes out,
        not before: a harness sends its next call only once it has this answer, and that call's
        `build` settles whatever is still pending first, whichever runs first."""
        self._newest[rollout_id] = max(call_id, self._newest.get(rollout_id, 0))
        self._pending.setdefault(rollout_id, []).append((req, prompt, comp, call_id))
        asyncio.get_running_loop().call_soon(self._settle, rollout_id)

    def _settle(self, rollout_id: str) -> None:
        for req, prompt, comp, call_id in self._pending.pop(rollout_id, ()):
            try:
                self.builder.record(rollout_id, req.messages, req.prompt_tools, prompt, comp, call_id)
            except Exception:  # noqa: BLE001 - the call is answered and recorded; only its reuse is lost
                log.exception("proxy: could not remember call %s of rollout %s for token reuse", call_id, rollout_id)

    async def _warm(self, rollout_id: str) -> None:
        """After a proxy restart, relearn a rollout's last turns from the store so reuse continues."""
        if self.builder.knows(rollout_id) and not await self._stale(rollout_id):
            return
        lock = self._warm_locks.setdefault(rollout_id, asyncio.Lock())
        async with lock:
            known = self.builder.knows(rollout_id)
            if known and not await self._stale(rollout_id):
                return
            # Known but stale: another worker served it since; only the calls newer than ours are read.
            rows = await self.recorder.calls_of_rollout(rollout_id, after_id=self._newest.get(rollout_id, 0) if known
                                                        else 0, last=self.builder.turns_per_rollout)
            for row in rows:
                adapter = ADAPTERS.get(row.api)
                images = ImageStore.for_run(self.home or forge_home(), row.run_id)
                try:
                    with resolving_from(images.get):
                        old = adapter.parse_request(row.request_json) if adapter and row.request_json else None
                except (APIError, ValueError, TypeError):
                    old = None
                if old is None:
                    continue
                comp = self._replayed_completion(old, row.prompt_ids or [], row.completion_ids or [],
                                                 row.tool_calls_json or [])
                prompt = Prompt(row.prompt_ids or [], "", row.reused_tokens)
                self.builder.record(rollout_id, old.messages, old.prompt_tools, prompt, comp, row.id)
            if rows:
                self._newest[rollout_id] = max(r.id for r in rows)
            self.builder.mark_known(rollout_id)
        self._warm_locks.pop(rollout_id, None)

    async def _stale(self, rollout_id: str) -> bool:
        """True when the store has a finished call of this rollout newer than any remembered here."""
        if not self.shared_store:
            return False
        newest = await self.recorder.newest_call_id(rollout_id)
        return newest is not None and newest > self._newest.get(rollout_id, 0)

    def _replayed_completion(self, req: CallRequest, prompt_ids: list[int], ids: list[int],
                             tool_calls: list[dict[str, Any]]) -> Completion:
        """A recorded completion as the client saw it: text cut at its stop string, the same parsers
        (thinking and calls) as when it was served, the same call ids."""
        text = self.renderer.decode(ids)
        hits = [text.find(s) for s in req.stop if s in text]
        # Whether the generation prompt opened a thinking block: its last tokens tell.
        opened = opens_thinking(self.renderer.decode(prompt_ids[-8:]))
        parsed = self.parsers.for_request(req, prompt_text="<think>" if opened else "")
        parsed.feed(text[:min(hits)] if hits else text)
        parsed.finish()
        for call, recorded in zip(parsed.calls, tool_calls):
            call.id = recorded.get("id", call.id)
        return Completion(parsed.text, parsed.calls, "stop", ids, [], 0, reasoning=parsed.reasoning)
