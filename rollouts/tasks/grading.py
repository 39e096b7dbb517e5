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

Exact means exact for look-alikes too: a number is ASCII digits compared as a decimal ("４" and "٤"
are not 4, and "4.0000000000000001" is not 4 though it is as a float); every word of the answer
counts, in any script ("hello мир world" is not "hello world"); only letters whose lower case stays
in their own script are lower-cased (the Kelvin sign "K" is not "k"); and an answer holding control
or invisible format characters (NUL, zero-width space, bidi overrides) is wrong.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, model_validator

# An exact answer is short; a longer one is wrong without being scanned (1 MB of digits must not pass).
MAX_ANSWER_CHARS = 2_000
_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # ASCII digits: \d takes "４" and "٤" too
_WORD_RE = re.compile(r"\w+")  # a word in any script: one the expected words lack makes the answer wrong
_ALLOWED_CONTROLS = "\t\n\r"
_WRAPPERS = ("**", "`", '"', "'")



def check_relative_paths(paths: Iterable[str], inside: str) -> None:
    """ValueError (for a pydantic validator) unless every path is relative and stays `inside` its folder:
    no NUL byte (no file system takes one: a write would fail mid-rollout), not absolute, no `..`."""
    for path in paths:
        if "\0" in path:
            raise ValueError(f"file path {path!r} contains a NUL byte, which no file name can hold")
        p = PurePosixPath(path)
        if not path or p.is_absolute() or ".." in p.parts:
            raise ValueError(f"file path {path!r} must be relative and stay inside {inside}")

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
        if self.words is not None and not _words(self.words):
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


def _words(text: str) -> list[str]:
    """The words of `text`, lower-cased letter by letter only where the lower case stays in the
    letter's own script (the Kelvin sign's lower case is an ASCII "k": it stays a Kelvin sign)."""
    lowered = "".join(ch.lower() if ch.isascii() or not ch.lower().isascii() else ch for ch in text)
    return _WORD_RE.findall(lowered)


def _has_hidden_characters(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf") and ch not in _ALLOWED_CONTROLS for ch in text)


def answer_matches(expect: ExpectedAnswer, answer: str) -> bool:
    """Whether the harness's final answer is the expected one, exactly (after normalising)."""
    text = answer.strip()
    if len(text) > MAX_ANSWER_CHARS or _has_hidden_characters(text):
        return False
    text = normalise_answer(text)
    if expect.number is not None:
        if not _NUMBER_RE.fullmatch(text):
            return False
        try:  # as decimals: a float would round 4.0000000000000001 to 4
            return Decimal(text) == Decimal(repr(expect.number))
        except InvalidOperation:
            return False
    if expect.words is not None:
        return _words(text) == _words(expect.words)
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
