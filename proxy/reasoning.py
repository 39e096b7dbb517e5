"""Reasoning parsers: a model's thinking split off its answer, as SGLang's `--reasoning-parser` does.

    qwen3        `<think>...</think>` when the answer opens with `<think>` (Qwen3 with thinking on);
                 a template whose generation prompt already opened `<think>` (Qwen3-2507 Thinking)
                 starts inside it. A `<tool_call>` before `</think>` closes the thinking (SGLang
                 does the same: Qwen3 sometimes calls a tool without closing it).
    deepseek_r1  thinking from the first token until `</think>` (R1's template opens `<think>`
                 itself); an answer that never closes it is all thinking.
    none         no thinking: the text is the answer.

The thinking is what the template would render between the tags: the newlines around it stripped
(Qwen3's template writes `<think>\\n` + reasoning.strip("\\n") + `\\n</think>\\n\\n` + content.lstrip("\\n")),
and the whitespace between `</think>` and the answer is layout. Feeding the text in any chunking
gives the same split (streaming == non-streaming).
"""

from __future__ import annotations

from openforge.proxy.calls import ReasoningDelta

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN = "<tool_call>"
REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1")
ALIASES = {"deepseek-r1": "deepseek_r1", "qwen3-thinking": "qwen3"}  # SGLang's spellings


def resolve_reasoning_parser(name: str, chat_template: str) -> str:
    """`auto`: `qwen3` for a template that knows `<think>` (Qwen3's), else `none`."""
    name = ALIASES.get(name, name)
    if name == "auto":
        return "qwen3" if THINK_OPEN in chat_template or "reasoning_content" in chat_template else "none"
    return name


def opens_thinking(prompt_text: str) -> bool:
    """The generation prompt already opened a thinking block the answer continues (and must close)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


class ReasoningParser:
    """Incremental: `feed(text)` returns reasoning deltas and the answer text released so far."""

    def __init__(self, kind: str, *, in_reasoning: bool = False) -> None:
        self.kind = ALIASES.get(kind, kind)
        # "start": waiting to see whether the answer opens <think>; "think": inside; "answer": after.
        if self.kind == "none":
            self.state = "answer"
        elif self.kind == "deepseek_r1" or in_reasoning:
            self.state = "think_start"  # inside, a leading <think> (R1-0528 writes one) is dropped
        else:
            self.state = "start"
        self.buf = ""
        self.pending_nl = ""  # newlines held back inside the thinking: dropped if </think> follows
        self.began = False  # some thinking text was released (leading newlines are dropped before it)
        self.strip_answer = False  # whitespace right after </think> is layout
        self.parts: list[str] = []

    @property
    def reasoning(self) -> str:
        return "".join(self.parts)

    def feed(self, chunk: str) -> tuple[list[ReasoningDelta], str]:
        self.buf += chunk
        deltas: list[ReasoningDelta] = []
        answer: list[str] = []
        while self.buf:
            if self.state == "answer":
                if self.strip_answer:
                    stripped = self.buf.lstrip()
                    if not stripped:
                        self.buf = ""
                        break
                    self.buf, self.strip_answer = stripped, False
                answer.append(self.buf)
                self.buf = ""
            elif self.state in ("start", "think_start"):
                head = self.buf.lstrip()
                if head.startswith(THINK_OPEN):
                    self.buf, self.state = head[len(THINK_OPEN):], "think"
                elif THINK_OPEN.startswith(head):  # could still become <think>
                    break
                else:
                    self.state = "answer" if self.state == "start" else "think"
            else:  # think
                ends = [(i, tag) for tag in (THINK_CLOSE, TOOL_OPEN) if self.kind == "qwen3" or tag == THINK_CLOSE
                        if (i := self.buf.find(tag)) >= 0]
                if ends:
                    i, tag = min(ends)
                    self._think(self.buf[:i], deltas, final=True)
                    self.buf = self.buf[i + len(THINK_CLOSE):] if tag == THINK_CLOSE else self.buf[i:]
                    self.state, self.strip_answer = "answer", True
                    continue
                hold = max(_partial_suffix(self.buf, THINK_CLOSE),
                           _partial_suffix(self.buf, TOOL_OPEN) if self.kind == "qwen3" else 0)
                self._think(self.buf[:len(self.buf) - hold], deltas, final=False)
                self.buf = self.buf[len(self.buf) - hold:]
                break
        return deltas, "".join(answer)

    def finish(self) -> tuple[list[ReasoningDelta], str]:
        """The end of the text: an unclosed thinking block stays thinking (SGLang's rule)."""
        deltas: list[ReasoningDelta] = []
        rest = ""
        if self.state in ("start",):
            rest = self.buf  # only ever a prefix of "<think>" (or whitespace): it is the answer
        elif self.state == "think_start":
            self._think(self.buf.lstrip(), deltas, final=True)
        elif self.state == "think":
            self._think(self.buf, deltas, final=True)
        else:
            rest = self.buf.lstrip() if self.strip_answer else self.buf
        self.buf = ""
        self.state = "answer"
        return deltas, rest

    def _think(self, text: str, deltas: list[ReasoningDelta], *, final: bool) -> None:
        if not self.began:
            text = text.lstrip("\n")
        body = text.rstrip("\n")
        if not body:
            self.pending_nl = "" if final else self.pending_nl + text
            return
        out = self.pending_nl + body
        self.pending_nl = "" if final else text[len(body):]
        self.began = True
        self.parts.append(out)
        deltas.append(ReasoningDelta(out))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back while streaming)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
