"""Memoised prompt rendering and tokenising: the work a rollout's calls, and a group's rollouts, repeat.

Every call renders its whole history with the chat template and tokenises what is not reused. The
calls of a rollout share the system prompt and the tool definitions, the rollouts of a GRPO group send
the same first prompt, and a harness's next call replays the history the last one rendered. Two
caches, both exact (a hit returns what the full computation would) and both bounded:

- `ChunkedEncoder`: tokenise(text) == the concatenation of tokenise(piece) over the pieces of `text`
  that each end right after a *boundary token* (ChatML's `<|im_start|>`, `<|im_end|>`). A Rust
  tokenizer splits its input at added tokens before normalising or pre-tokenising anything, so the
  text on either side of one is tokenised on its own. Each piece's ids are kept (LRU, bounded in
  characters), so only pieces not seen before are tokenised. A token is used as a boundary only if
  its flags allow it (not normalised, no lstrip/rstrip/single_word, no other added token overlapping
  it) *and* the tokenizer itself, probed at start-up, splits there (a Metaspace "first" prefix, for
  one, tokenises a piece differently on its own: such a tokenizer is not chunked).
- `RenderCache`: the template's text for (messages, tools, generation), keyed by a digest of their
  JSON. Templates that read the clock (`strftime_now`) are not cached.
"""

from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

BatchEncode = Callable[[list[str]], list[list[int]]]

# Text around a boundary that would tokenise differently if a tokenizer merged across it, or added a
# prefix to a piece that starts a text: spaces, newlines, a combining mark (NFC would fuse it with the
# character before), digits, punctuation that ends the tokens, non-ASCII.
_PROBES = ["", "x", " x", "  x", "\n", "\n\n", " ", "\t", "\u0338x", "\u0301", "é", "12", ">", "|>", "<", "<|",
           "a b\n", "\u2581x", "日本"]


def _overlaps(a: str, b: str) -> bool:
    """True when a proper suffix of `a` is a proper prefix of `b` (a match of one could cut the other)."""
    return any(a.endswith(b[:i]) for i in range(1, min(len(a), len(b))))


def safe_boundaries(tokenizer: Any, encode: BatchEncode) -> list[str]:
    """The added tokens at which this tokenizer's output splits: checked on flags, then by probing."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    added = list(backend.get_added_tokens_decoder().values())
    contents = [t.content for t in added]
    candidates = []
    for tok in added:
        t = tok.content
        if not tok.special or tok.normalized or tok.lstrip or tok.rstrip or tok.single_word or len(t) < 2:
            continue
        if any(t in other for other in contents if other != t):  # a longer added token holds it
            continue
        if any(_overlaps(other, t) or _overlaps(t, other) for other in contents):  # itself included
            continue
        candidates.append(t)
    lefts = ["", "x", " ", "\n", "\u00e9"]  # what ends the piece before the boundary
    rights = _PROBES + contents  # what starts the next piece
    texts = list(dict.fromkeys([a + t + b for t in candidates for a in lefts for b in rights]
                               + [a + t for t in candidates for a in lefts] + rights))
    ids = dict(zip(texts, encode(texts)))  # one batch call
    safe = [t for t in candidates
            if all(ids[a + t + b] == ids[a + t] + ids[b] for a in lefts for b in rights)]
    return safe


class ChunkedEncoder:
    """`encode(text)` with the ids of each boundary-terminated piece memoised (see the module doc).

    Thread-safe: a long prompt is tokenised in a worker thread while the event loop tokenises others."""

    def __init__(self, tokenizer: Any, encode: BatchEncode, *, max_chars: int = 8_000_000) -> None:
        self._encode = encode
        self.max_chars = max_chars
        self.boundaries = safe_boundaries(tokenizer, encode)
        self._split = re.compile("|".join(re.escape(t) for t in sorted(self.boundaries, key=len, reverse=True))) \
            if self.boundaries else None
        self._pieces: OrderedDict[str, array] = OrderedDict()
        self.chars = 0  # characters of the pieces held
        self.hits = 0  # pieces found (counted for tests and the bench)
        self.misses = 0  # pieces tokenised
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        if self._split is None or not text:
            return self._encode([text])[0] if text else []
        cuts = [m.end() for m in self._split.finditer(text)]
        if not cuts or cuts[-1] != len(text):
            cuts.append(len(text))
        pieces = [text[a:b] for a, b in zip([0, *cuts], cuts)]
        with self._lock:
            found = [self._pieces.get(p) for p in pieces]
            for p, ids in zip(pieces, found):
                if ids is not None:
                    self._pieces.move_to_end(p)
        missing = list(dict.fromkeys(p for p, ids in zip(pieces, found) if ids is None))
        new: dict[str, array] = {}
        if missing:  # one batch call: the Rust code runs without the GIL
            new = {p: array("i", ids) for p, ids in zip(missing, self._encode(missing))}
            self._keep(new)
        out: list[int] = []
        for p, ids in zip(pieces, found):
            out.extend(ids if ids is not None else new[p])
        self.hits += len(pieces) - len(missing)
        self.misses += len(missing)
        return out

    def _keep(self, new: dict[str, array]) -> None:
        with self._lock:
            for p, ids in new.items():
                if len(p) > self.max_chars // 8 or p in self._pieces:  # one huge tool output must not flush the rest
                    continue
                self._pieces[p] = ids
                self.chars += len(p)
            while self.chars > self.max_chars and self._pieces:
                gone, _ = self._pieces.popitem(last=False)
                self.chars -= len(gone)

    def __len__(self) -> int:
        return len(self._pieces)


class RenderCache:
    """Rendered prompts by a digest of (messages, tools, generation): LRU, bounded in characters."""

    def __init__(self, *, enabled: bool = True, max_chars: int = 8_000_000) -> None:
        self.enabled = enabled
        self.max_chars = max_chars
        self.chars = 0
        self.hits = 0
        self.misses = 0
        self._texts: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], generation: bool) -> bytes | None:
        try:
            blob = orjson.dumps([messages, tools, generation])
        except (TypeError, orjson.JSONEncodeError):  # a value JSON cannot hold exactly: render it every time
            return None
        return hashlib.sha256(blob).digest()

    def get(self, key: bytes | None) -> str | None:
        if key is None or not self.enabled:
            return None
        with self._lock:
            text = self._texts.get(key)
            if text is not None:
                self._texts.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
        return text

    def put(self, key: bytes | None, text: str) -> None:
        if key is None or not self.enabled or len(text) > self.max_chars // 8:
            return
        with self._lock:
            if key in self._texts:
                return
            self._texts[key] = text
            self.chars += len(text)
            while self.chars > self.max_chars and self._texts:
                self.chars -= len(self._texts.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._texts)
