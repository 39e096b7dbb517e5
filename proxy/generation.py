"""One completion from the engine, as a stream of API-neutral events and a final `Completion`.

    engine deltas (token ids) -> incremental detokeniser -> stop-string filter
        -> OutputParser (thinking, then tool calls: proxy/parsing.py) -> events

Streaming and non-streaming share every stage after the engine, so both return the same text, the
same tool calls and the same token ids for the same completion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from openforge.engine.client import EngineClient
from openforge.proxy.calls import Completion, StreamEvent
from openforge.proxy.parsing import OutputParser, ParserSetup
from openforge.proxy.tokens import ChatRenderer


class IncrementalDecoder:
    """Token ids -> text deltas without splitting a multi-byte character (byte-level BPE emits them
    across tokens): decode a short window and only release text that no longer ends in U+FFFD."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # ids already turned into released text

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        before = self.renderer.decode(self.ids[self.prefix:self.read])
        after = self.renderer.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        before = self.renderer.decode(self.ids[self.prefix:self.read])
        after = self.renderer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopFilter:
    """Cuts the text at the caller's first stop string, holding back what could be its beginning."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buf = ""
        self.hit: str | None = None

    def feed(self, text: str) -> str:
        if self.hit is not None:
            return ""
        if not self.stops:
            return text
        self.buf += text
        found = [(self.buf.find(s), s) for s in self.stops if s in self.buf]
        if found:
            i, self.hit = min(found)
            out, self.buf = self.buf[:i], ""
            return out
        cut = max(0, len(self.buf) - self.hold)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out

    def flush(self) -> str:
        out, self.buf = ("" if self.hit else self.buf), ""
        return out


@dataclass
class GenerationParams:
    prompt_ids: list[int]
    sampling: dict[str, Any]
    stop: list[str]
    lora_path: str | None
    rid: str | None = None
    id_prefix: str = "call"
    parser: OutputParser | None = None  # the request's parsers (default: lenient Hermes, no thinking)
    image_data: list[str] | None = None  # SGLang's image_data: one data URL per placeholder run, in order
    routing_key: str | None = None  # the rollout id: a router keeps a rollout's calls on one worker


class Generation:
    """Run one completion; iterate `events()` (streaming) or await `complete()`; then `.completion`."""

    def __init__(self, engine: EngineClient, renderer: ChatRenderer, params: GenerationParams) -> None:
        self.engine = engine
        self.renderer = renderer
        self.params = params
        self.parser = params.parser or OutputParser(ParserSetup(), id_prefix=params.id_prefix)
        self.decoder = IncrementalDecoder(renderer)
        self.stops = StopFilter(params.stop)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.completion: Completion | None = None

    @property
    def record(self) -> dict[str, Any]:
        """What the call's row holds beyond the common fields (a teacher's call has more)."""
        return {}

    def _push(self, ids: list[int], lps: list[float]) -> list[StreamEvent]:
        self.ids += ids
        self.logprobs += lps
        return self.parser.feed(self.stops.feed(self.decoder.feed(ids)))

    def _close(self) -> list[StreamEvent]:
        events = self.parser.feed(self.stops.feed(self.decoder.flush()))
        events += self.parser.feed(self.stops.flush())
        events += self.parser.finish()
        if len(self.logprobs) != len(self.ids):  # an engine that omits logprobs must not misalign them
            self.logprobs = (self.logprobs + [float("nan")] * len(self.ids))[:len(self.ids)]
        thinking = 0
        if self.parser.reasoning and self.renderer.think_close_id is not None:
            close = self.renderer.think_close_id
            # An unclosed block is all thinking, unless a call or text followed it (then it is not counted).
            thinking = self.ids.index(close) + 1 if close in self.ids else \
                0 if self.parser.text or self.parser.calls else len(self.ids)
        # SGLang checks max_new_tokens before stop tokens: an answer whose last allowed token ends the
        # turn comes back "length". The model did end its turn: a harness must not hear "cut off"
        # (Claude Code errors out on max_tokens). The record keeps the engine's tokens as they were.
        ended = bool(self.ids) and self.ids[-1] in set(self.params.sampling.get("stop_token_ids") or ())
        reason = "length" if self.finish == "length" and not ended else "stop"
        if self.parser.calls and reason == "stop":
            reason = "tool_calls"
        self.completion = Completion(
            text=self.parser.text, tool_calls=list(self.parser.calls), finish_reason=reason,  # type: ignore[arg-type]
            completion_ids=self.ids, logprobs=self.logprobs, prompt_tokens=len(self.params.prompt_ids),
            tool_parse_error=self.parser.parse_error, stop_sequence=self.stops.hit, reasoning=self.parser.reasoning,
            reasoning_tokens=thinking,
        )
        return events

    async def events(self) -> AsyncIterator[list[StreamEvent] | None]:
        """The completion's events, a list per engine chunk (written to the client together: one
        write, not one per event); `None` once, when the engine's first tokens arrived (the caller
        can commit to a 200 streaming response then: the engine is up and generating)."""
        p = self.params
        stream = self.engine.stream_generate(p.prompt_ids, p.sampling, lora_path=p.lora_path, rid=p.rid,
                                             image_data=p.image_data, routing_key=p.routing_key)
        started = False
        try:
            async for delta in stream:
                if not started:
                    started = True
                    yield None
                events = self._push(delta.token_ids, delta.logprobs)
                if events:
                    yield events
                if delta.finish_reason is not None:
                    self.finish = delta.finish_reason
        finally:
            await stream.aclose()  # closes the engine connection, which aborts generation in SGLang
        events = self._close()
        if events:
            yield events

    async def complete(self) -> Completion:
        out = await self.engine.generate(self.params.prompt_ids, self.params.sampling, lora_path=self.params.lora_path,
                                         rid=self.params.rid, image_data=self.params.image_data,
                                         routing_key=self.params.routing_key)
        self.finish = out.finish_reason
        self._push(out.output_ids, out.logprobs)
        self._close()
        assert self.completion is not None
        return self.completion


def token_logprobs(renderer: ChatRenderer, comp: Completion) -> list[dict[str, Any]]:
    """OpenAI-style per-token logprobs of the sampled tokens (no alternatives: the engine samples one)."""
    out = []
    for tid, lp in zip(comp.completion_ids, comp.logprobs):
        if tid in renderer.stop_token_ids:
            continue
        text = renderer.tokenizer.decode([tid])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace")),
                    "top_logprobs": []})
    return out
