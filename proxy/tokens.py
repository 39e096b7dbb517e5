"""Tokens: chat-template rendering and reuse of sampled token ids (tool calls: proxy/toolcalls.py).

Why reuse: a harness replays the model's earlier turns as text/JSON (`{"command": "ls"}` where the
model wrote `{"command":"ls"}`, content stripped, ids renamed). Re-rendering and re-tokenising that
history gives token ids the policy never sampled, so the trajectory would train on a sequence the
model did not produce. `PromptBuilder` instead finds the recorded call whose prompt + answer render
exactly like the start of the new request and splices that call's exact prompt + completion ids in;
only the new tail (tool results, the next user turn) is tokenised. By construction the new prompt then
extends the earlier prompt + completion token for token, which is what trajectory assembly merges on.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.errors import ConfigError
from openforge.proxy.breaks import explain_break
from openforge.proxy.calls import APIError, Completion, Message, bad_request
from openforge.proxy.promptcache import ChunkedEncoder, RenderCache
from openforge.proxy.toolcalls import CLOSE_TAG, OPEN_TAG, ToolCallParser, parse_tool_calls

__all__ = ["CLOSE_TAG", "OPEN_TAG", "ChatRenderer", "Prompt", "PromptBuilder", "ToolCallParser", "load_tokenizer",
           "parse_completion"]
_PROBE = "\u2063forge-probe\u2063"  # text no template alters, to find what follows an assistant turn


def load_tokenizer(model_path: str | Path):  # -> PreTrainedTokenizerBase
    """The served model's tokenizer (and chat template), from its checkpoint directory."""
    from transformers import AutoTokenizer

    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model directory not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from None


class ChatRenderer:
    """A tokenizer's chat template as a function of internal messages, plus its end-of-turn token."""

    def __init__(self, tokenizer: Any, vision: Any = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise bad_request("the served model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.vision = vision  # proxy/vision.ImagePlaceholders of a VLM; None: the model reads text only
        template = tokenizer.chat_template
        # The template's text, for `auto` parsers (a tokenizer may hold several named templates).
        self.template_text: str = template if isinstance(template, str) else "\n".join(map(str, template.values())) \
            if isinstance(template, dict) else str(template)
        # Exact memos of rendering and tokenising (proxy/promptcache.py): a template that reads the
        # clock renders differently from one day to the next, so it is rendered every time.
        self.renders = RenderCache(enabled="strftime_now" not in self.template_text)
        # transformers' decode is the Rust decode plus argument handling (a few us a call, and the
        # streaming decoder calls it twice a chunk) and an optional space clean-up: where that
        # clean-up is off and `_decode` is transformers' own, the Rust call gives the same text.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend_decodes = self._backend is not None and not getattr(
            tokenizer, "clean_up_tokenization_spaces", True) and _plain_decode(tokenizer)
        self.chunks = ChunkedEncoder(tokenizer, self.encode_batch)
        probe = self.render([Message("user", "x"), Message("assistant", _PROBE)], [], generation=False)
        after = probe[probe.rindex(_PROBE) + len(_PROBE):]
        after_ids = self.encode(after)
        # The first token after an assistant's content is what the model samples to end its turn
        # (`<|im_end|>` for ChatML); what follows it (`\n`) is template text, never sampled.
        self.eot_id: int = after_ids[0] if after_ids else int(tokenizer.eos_token_id)
        self.eot_text: str = tokenizer.decode([self.eot_id])
        stops = {self.eot_id}
        if tokenizer.eos_token_id is not None:
            stops.add(int(tokenizer.eos_token_id))
        self.stop_token_ids = sorted(stops)
        self.max_token_bytes = _longest_token_bytes(tokenizer)
        think_close = self.encode("</think>")  # one added token in Qwen3's vocabulary: thinking can be counted
        self.think_close_id: int | None = think_close[0] if len(think_close) == 1 else None

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of `text`, from its length alone: no token covers more than
        `max_token_bytes` bytes, so an over-long prompt is refused before it is tokenised."""
        return len(text.encode("utf-8", "surrogatepass")) // self.max_token_bytes

    def render(self, messages: list[Message], tools: list[dict[str, Any]], *, generation: bool) -> str:
        dicts = [m.template_dict() for m in messages]
        key = self.renders.key(dicts, tools, generation)
        text = self.renders.get(key)
        if text is not None:
            return text
        try:
            text = self.tokenizer.apply_chat_template(dicts, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=generation)
        except APIError:
            raise
        except Exception as exc:  # jinja raises anything (TemplateError, TypeError, raise_exception)
            raise bad_request(f"the model's chat template cannot render these messages: {exc}") from None
        text = text if isinstance(text, str) else str(text)
        self.renders.put(key, text)
        return text

    def encode(self, text: str) -> list[int]:
        """`text`'s ids, exactly as one call of the tokenizer gives them; pieces seen before are not
        tokenised again (proxy/promptcache.ChunkedEncoder)."""
        return self.chunks.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The template already wrote any BOS/special text; the tokenizer must not add more. The Rust
        # tokenizer is called directly where there is one: transformers' wrapper re-applies padding
        # and truncation settings on every call (mutating the Rust object), which is unsafe when
        # several threads encode at once.
        # `encode_batch`, not `encode`: only the batch call releases the GIL while the Rust code runs,
        # so a long prompt tokenised in a worker thread leaves the event loop free.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def decode(self, ids: list[int]) -> str:
        if self._backend_decodes:
            return self._backend.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _plain_decode(tokenizer: Any) -> bool:
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return isinstance(tokenizer, TokenizersBackend) and type(tokenizer)._decode is TokenizersBackend._decode


def _longest_token_bytes(tokenizer: Any) -> int:
    """The most bytes of text one token can stand for (special tokens included). A byte-level BPE
    vocabulary spells each byte as one character; any other vocabulary is measured in UTF-8, which
    can only overstate it. A normaliser may shrink text (NFKC maps some 3-4 byte characters to one
    byte), so the bound is loosened by 4 when there is one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"
    longest = max((len(t) if byte_level else len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()),
                  default=1)
    added = max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_added_vocab()), default=1)
    shrink = 4 if backend is None or backend.normalizer is not None else 1
    return max(longest, added, 1) * shrink


def parse_completion(text: str, id_prefix: str = "call") -> ToolCallParser:
    """The lenient Hermes parse of a whole completion (proxy/toolcalls.py has the parsers)."""
    return parse_tool_calls(text, "hermes", None, id_prefix)


# ---------------------------------------------------------------------------------------------
# Reuse of sampled token ids


@dataclass
class Turn:
    """A recorded call as the ledger keeps it: prompt + completion ids, and the reuse behind them."""

    ids: array  # prompt ids + completion ids, exactly as sent to / sampled by the engine (4 bytes each)
    reused_tokens: int  # sampled tokens of earlier turns inside `ids` (this call's own included)
    call_id: int | None = None


@dataclass
class Prompt:
    ids: list[int]
    text: str  # the template's rendering (what re-tokenisation would have tokenised)
    reused_tokens: int = 0  # earlier sampled tokens spliced in verbatim
    extends_call: int | None = None  # the call whose prompt + completion this prompt extends
    tail: str = ""  # text still to tokenise and append to `ids` (see PromptBuilder.plan)
    break_reason: str | None = None  # why it extends none of the rollout's earlier calls (None: it does, or is the first)
    images: list[Any] = field(default_factory=list)  # the prompt's ImageInputs, in placeholder order
    images_in_ids: int = 0  # how many of them `ids` already holds (expanded); the rest are in `tail`


def _images(messages: list[Message]) -> list[Any]:
    return [im for m in messages for im in m.images]


def _key(text: str, images: list[Any] = ()) -> str:  # type: ignore[assignment]
    """A rendered history's key. Its images' sha256 ids are part of it: two screenshots render the
    same placeholder text, and a prompt extends an earlier one only if its images are the same."""
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    for im in images:
        h.update(b"\0image:" + im.sha.encode("ascii"))
    return h.hexdigest()


class PromptBuilder:
    """Builds each call's prompt ids, reusing the sampled ids of the rollout's earlier turns.

    Keeps the last `turns_per_rollout` turns of each rollout in memory (a harness replays its latest
    turn; older keys are only tried when the history was rewritten), the least recently used
    rollouts dropped beyond `max_tokens` stored ids in all (Claude Code's prompts are ~50k tokens:
    the budget, not a rollout count, bounds memory). A dropped rollout is reloaded from the store."""

    def __init__(self, renderer: ChatRenderer, *, turns_per_rollout: int = 8, max_tokens: int = 32_000_000,
                 max_tries: int = 4) -> None:
        self.renderer = renderer
        self.turns_per_rollout = turns_per_rollout
        self.max_tokens = max_tokens
        self.max_tries = max_tries
        self.stored_tokens = 0
        self._turns: OrderedDict[str, OrderedDict[str, Turn]] = OrderedDict()
        # Each rollout's last recorded calls (messages + answer, tools): what a break is explained against.
        self._last: dict[str, list[tuple[list[Message], list[dict[str, Any]]]]] = {}

    def knows(self, rollout_id: str) -> bool:
        return rollout_id in self._turns

    def mark_known(self, rollout_id: str) -> None:
        """A rollout whose recorded turns (possibly none) are loaded: don't look them up again."""
        self._turns.setdefault(rollout_id, OrderedDict())

    def build(self, rollout_id: str, messages: list[Message], tools: list[dict[str, Any]]) -> Prompt:
        return self.encode_tail(self.plan(rollout_id, messages, tools))

    def plan(self, rollout_id: str, messages: list[Message], tools: list[dict[str, Any]]) -> Prompt:
        """The prompt with its reused ids in `ids` and the text still to tokenise in `tail` (the
        caller may tokenise a long tail off the event loop with `encode_tail`)."""
        full = self.renderer.render(messages, tools, generation=True)
        images = _images(messages)
        turns = self._turns.get(rollout_id)
        if turns:
            self._turns.move_to_end(rollout_id)
            spliced = self._splice(turns, messages, tools, full)
            if isinstance(spliced, Prompt):
                spliced.images = images
                return spliced
            why = explain_break(self._last.get(rollout_id, []), messages, tools)
            return Prompt(ids=[], text=full, tail=full, break_reason=why or spliced, images=images)
        return Prompt(ids=[], text=full, tail=full, images=images)

    def encode_tail(self, prompt: Prompt) -> Prompt:
        tail = self.renderer.encode(prompt.tail)
        if self.renderer.vision is not None:  # each new image's one pad -> its N pads, as the processor does
            tail = self.renderer.vision.expand(tail, prompt.images[prompt.images_in_ids:])
        prompt.ids, prompt.tail, prompt.images_in_ids = prompt.ids + tail, "", len(prompt.images)
        return prompt

    def _splice(self, turns: OrderedDict[str, Turn], messages: list[Message], tools: list[dict[str, Any]],
                full: str) -> Prompt | str:
        """The spliced prompt, or why there is none (recorded as the call's `break_reason`)."""
        tries = 0
        reason = "no earlier answer is replayed (a new conversation: a sub-agent, or the history was dropped)"
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].role != "assistant":
                continue
            tries += 1
            if tries > self.max_tries:
                break
            try:
                head = self.renderer.render(messages[:k + 1], tools, generation=False)
            except APIError:
                continue
            turn = turns.get(_key(head, _images(messages[:k + 1])))
            if turn is None:
                reason = ("the replayed history matches no recorded answer of this rollout (rewritten, compacted, "
                          "or its tools changed)")
                continue
            if not full.startswith(head):
                reason = "the chat template renders the replayed history differently once new turns follow it"
                continue
            # `head` ends with the end-of-turn token plus template text (ChatML: "<|im_end|>\n"); the
            # model sampled up to the end-of-turn token, the rest is prompt text.
            cut = head.rfind(self.renderer.eot_text)
            trailer = head[cut + len(self.renderer.eot_text):] if cut >= 0 else ""
            ids = list(turn.ids)
            if not ids or ids[-1] != self.renderer.eot_id:  # cut by max_tokens or a stop string
                ids.append(self.renderer.eot_id)
            return Prompt(ids=ids, text=full, reused_tokens=turn.reused_tokens, extends_call=turn.call_id,
                          tail=trailer + full[len(head):], images_in_ids=len(_images(messages[:k + 1])))
        return reason

    def record(self, rollout_id: str, messages: list[Message], tools: list[dict[str, Any]],
               prompt: Prompt, completion: Completion, call_id: int | None = None) -> None:
        """Remember a finished call so a later request replaying its answer reuses its exact ids."""
        try:
            head = self.renderer.render(messages + [completion.message()], tools, generation=False)
        except APIError:
            return
        turns = self._turns.setdefault(rollout_id, OrderedDict())
        self._turns.move_to_end(rollout_id)
        recent = self._last.setdefault(rollout_id, [])
        recent.append((messages + [completion.message()], tools))
        del recent[:-4]  # the main conversation and a few side requests
        key = _key(head, _images(messages))
        if key in turns:
            self.stored_tokens -= len(turns.pop(key).ids)
        turn = Turn(array("i", prompt.ids + completion.completion_ids),
                    prompt.reused_tokens + len(completion.completion_ids), call_id)
        turns[key] = turn
        self.stored_tokens += len(turn.ids)
        while len(turns) > self.turns_per_rollout:
            self.stored_tokens -= len(turns.popitem(last=False)[1].ids)
        while self.stored_tokens > self.max_tokens and len(self._turns) > 1:
            gone, dropped = self._turns.popitem(last=False)
            self._last.pop(gone, None)
            self.stored_tokens -= sum(len(t.ids) for t in dropped.values())
