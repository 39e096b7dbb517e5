"""Exact grading on the host: a task's expected answer and expected files, checked by the runner.

These checks run in forge's own process on bytes read out of the sandbox, so nothing the agent did
inside the sandbox (a planted `cmp`, a `json.py` beside the verifier, a replaced `/bin/sh` in a
container where it is root) can change the verdict. Each check is all-or-nothing.

    expect_answer = {"number": 5}             the whole answer is one number, equal to 5 ("5", "5.0", "+5")
    expect_answer = {"words": "hello world"}  the answer's words, lower-cased, are exactly these, in order
    expect_answer = {"text": "OK"}            the answer, trimmed, is exactly this (case-sensitive)
    expect_files = {"out.txt": "4\\n"}        the file holds exactly this (a trailing newline optional)

An answer is normalised before comparing: surrounding whitespace, one pair of wrapping quotes,
backticks or `**`, and one trailing `.` are dropped. Nothing else: "The answer is 5" is not 5.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, model_validator

# An exact answer is short; a longer one is wrong without being scanned (1 MB of digits must not pass).
MAX_ANSWER_CHARS = 2_000
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_WORD_RE = re.compile(r"[a-z0-9_]+")
_WRAPPERS = ("**", "`", '"', "'")


class ExpectedAnswer(BaseModel):
    """Exactly one of `number`, `words`, `text`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: float | None = None
    words: str | None = None
    text: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "ExpectedAnswer":
        given = [name for name in ("number", "words", "text") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("expect_answer needs exactly one of number, words, text")
        if self.number is not None and not math.isfinite(self.number):
            raise ValueError("expect_answer.number must be finite")
        if self.words is not None and not _WORD_RE.findall(self.words.lower()):
            raise ValueError("expect_answer.words has no words")
        return self

    def describe(self) -> str:
        if self.number is not None:
            return f"the number {self.number:g}"
        return f"the words {self.words!r}" if self.words is not None else f"the text {self.text!r}"


def normalise_answer(answer: str) -> str:
    """The answer without what a correct answer may be wrapped in (see the module docstring)."""
    text = answer.strip()
    for wrap in _WRAPPERS:
        if len(text) > 2 * len(wrap) and text.startswith(wrap) and text.endswith(wrap):
            text = text[len(wrap):-len(wrap)].strip()
            break
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    return text


def answer_matches(expect: ExpectedAnswer, answer: str) -> bool:
    """Whether the harness's final answer is the expected one, exactly (after normalising)."""
    text = answer.strip()
    if len(text) > MAX_ANSWER_CHARS:
        return False
    text = normalise_answer(text)
    if expect.number is not None:
        return bool(_NUMBER_RE.fullmatch(text)) and float(text) == expect.number
    if expect.words is not None:
        return _WORD_RE.findall(text.lower()) == _WORD_RE.findall(expect.words.lower())
    return text == expect.text


def file_matches(want: str, got: bytes | None) -> bool:
    """Whether a file's bytes are the expected text; one trailing newline on either side is optional."""
    if got is None:
        return False
    try:
        text = got.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.removesuffix("\n") == want.removesuffix("\n")


def clip(text: str, limit: int = 80) -> str:
    """A short quote of what the agent gave, for the verifier output."""
    return repr(text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)")
