"""The proxy's small streaming parts: proxy/generation.py's text deltas (whole characters only, cut at a stop
string), proxy/slots.py's bounded call slots, and proxy/prompts.py's context error."""

from __future__ import annotations

import asyncio

import pytest

from openforge.proxy.calls import APIError
from openforge.proxy.generation import IncrementalDecoder, StopFilter
from openforge.proxy.prompts import PromptTooLong, too_long
from openforge.proxy.slots import Slots


class _Bytes:
    """A byte-level tokenizer's decode: one id per byte; a cut multi-byte character decodes to U+FFFD."""

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_decoder_never_releases_half_a_character() -> None:
    text = "añ€😀!"
    dec, out = IncrementalDecoder(_Bytes()), []  # type: ignore[arg-type]
    for b in text.encode():
        out.append(dec.feed([b]))
    assert "".join(out) + dec.flush() == text
    assert all("\ufffd" not in piece for piece in out)
    assert out[1] == "" and out[2] == "ñ"  # ñ's first byte alone is held back


def test_stop_filter_cuts_at_the_first_stop_even_split_across_deltas() -> None:
    f = StopFilter(["</end>", "STOP"])
    got = f.feed("abc</e") + f.feed("nd>ignored") + f.feed("more")
    assert (got, f.hit, f.flush()) == ("abc", "</end>", "")
    g = StopFilter(["STOP"])
    assert g.feed("no st") + g.feed("op here") + g.flush() == "no stop here"  # held text comes back at the end
    assert StopFilter([]).feed("x") == "x"


async def test_slots_queue_then_refuse_and_release_once() -> None:
    slots = Slots(1, queue_limit=2, wait_s=0.2)
    first = await slots.take()
    waiter = asyncio.create_task(slots.take())
    await asyncio.sleep(0.01)
    with pytest.raises(APIError) as full:
        await slots.take()  # one holds, one waits: the third is refused at once
    assert full.value.kind == "rate_limit"
    handed = first.hand_over()
    first.release()  # the old handle does nothing now
    assert not waiter.done()
    handed.release()
    second = await asyncio.wait_for(waiter, 1)
    second.release()
    second.release()  # released exactly once
    assert slots.pending == 0
    held = await slots.take()
    with pytest.raises(APIError, match="waited too long"):
        await slots.take()
    held.release()
    assert slots.pending == 0


def test_too_long_says_it_in_the_words_harnesses_recognise() -> None:
    err = too_long(5000, 4096)
    assert isinstance(err, PromptTooLong) and err.tokens == 5000
    assert str(err.message).startswith("prompt is too long: 5000 tokens > 4095 maximum")
    assert "at least 5000 tokens" in too_long(5000, 4096, at_least=True).message
