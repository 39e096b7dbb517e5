"""The proxy's memoised rendering and tokenising (proxy/promptcache.py) is exact and bounded.

Exact: on multi-turn Chat, Responses and Anthropic conversations with tools (and images, on the tiny
VLM), grown one turn at a time through one warm renderer, every prompt's text and ids equal a fresh
`apply_chat_template` + one whole call of the Rust tokenizer (placeholders expanded for images); and on
random text full of special tokens, spaces and combining marks. Invalidation: a changed system prompt,
tool list or image gives the fresh computation's answer, not a stale one. Bounded: the caches stay
under their character budgets. Guarded: a tokenizer whose pieces tokenise differently on their own
(Metaspace with a "first" prefix) is not chunked, and a template that reads the clock is not memoised.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from openforge.engine.tiny import build_tokenizer
from openforge.proxy import anthropic, openai_chat, openai_responses
from openforge.proxy.calls import Message
from openforge.proxy.promptcache import ChunkedEncoder, RenderCache
from openforge.proxy.tokens import ChatRenderer, PromptBuilder
from openforge.proxy.vision import load_placeholders

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
SYSTEM = "You are a careful coding agent.  Use the tools.\n"


def _png(color: tuple[int, int, int], size: tuple[int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


RED, BLUE = _png((230, 20, 20), (1280, 800)), _png((20, 20, 230), (1024, 768))  # 28 and 24 image tokens


def chat_turns(image: str | None, system: str = SYSTEM, tool: str = "bash") -> list[dict]:
    first = [{"type": "text", "text": "What colour is it?"}] + (
        [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}] if image else [])
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": first},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": tool, "arguments": json.dumps({"command": "ls -l"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb  c.txt\n"},
            {"role": "assistant", "content": "Two files: a.txt and b  c.txt."},
            {"role": "user", "content": "Merci ! \u00e9\u0301 \u65e5\u672c  <|im_end|> x"}]
    tools = [{"type": "function", "function": {"name": tool, "description": "Run a command", "parameters": SCHEMA}}]
    return [{"model": "m", "messages": msgs[:n], "tools": tools} for n in (2, 4, 6)]


def responses_turns(image: str | None, system: str = SYSTEM, tool: str = "bash") -> list[dict]:
    first = [{"type": "input_text", "text": "What colour is it?"}] + (
        [{"type": "input_image", "image_url": f"data:image/png;base64,{image}"}] if image else [])
    items = [{"type": "message", "role": "user", "content": first},
             {"type": "function_call", "call_id": "c1", "name": tool, "arguments": json.dumps({"command": "ls"})},
             {"type": "function_call_output", "call_id": "c1", "output": "a.txt\n"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "One file."}]},
             {"type": "message", "role": "user", "content": "And now?  \n"}]
    tools = [{"type": "function", "name": tool, "description": "Run a command", "parameters": SCHEMA}]
    return [{"model": "m", "instructions": system, "input": items[:n], "tools": tools} for n in (1, 3, 5)]


def anthropic_turns(image: str | None, system: str = SYSTEM, tool: str = "bash") -> list[dict]:
    first = [{"type": "text", "text": "What colour is it?"}] + (
        [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}}] if image else [])
    msgs = [{"role": "user", "content": first},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "tu1", "name": tool, "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "a.txt\n"}]},
            {"role": "assistant", "content": "One file."},
            {"role": "user", "content": "Thanks.\t"}]
    tools = [{"name": tool, "description": "Run a command", "input_schema": SCHEMA}]
    return [{"model": "m", "max_tokens": 8, "system": system, "messages": msgs[:n], "tools": tools} for n in (1, 3, 5)]


APIS = {"chat": (openai_chat, chat_turns), "responses": (openai_responses, responses_turns),
        "anthropic": (anthropic, anthropic_turns)}


def fresh_ids(tokenizer, vision, messages: list[Message], tools: list[dict]) -> tuple[str, list[int]]:
    """The reference: the template rendered anew, the text tokenised in one call, images expanded."""
    text = tokenizer.apply_chat_template([m.template_dict() for m in messages], tools=tools or None, tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    if vision is not None:
        ids = vision.expand(ids, [im for m in messages for im in m.images])
    return text, ids


@pytest.fixture(scope="module")
def text_tokenizers():
    return {name: build_tokenizer(template=name) for name in ("tiny", "qwen3")}


@pytest.fixture(scope="module")
def vl(tiny_vl_model):
    return AutoTokenizer.from_pretrained(str(tiny_vl_model)), load_placeholders(tiny_vl_model)


def _check_turns(renderer: ChatRenderer, tokenizer, vision, module, bodies: list[dict]) -> None:
    for body in bodies:
        req = module.parse_request(body)
        text, ids = fresh_ids(tokenizer, vision, req.messages, req.prompt_tools)
        assert renderer.render(req.messages, req.prompt_tools, generation=True) == text
        prompt = PromptBuilder(renderer).build("r", req.messages, req.prompt_tools)  # no reuse: all tokenised
        assert prompt.ids == ids
        assert renderer.encode(text) == tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("template", ["tiny", "qwen3"])
def test_multi_turn_text_prompts_are_token_exact(text_tokenizers, api, template):
    tokenizer = text_tokenizers[template]
    renderer = ChatRenderer(tokenizer)
    assert renderer.chunks.boundaries  # ChatML's tokens split this tokenizer's output
    module, turns = APIS[api]
    _check_turns(renderer, tokenizer, None, module, turns(None))
    assert renderer.chunks.hits > 0 and renderer.renders.hits > 0  # later turns found the earlier pieces
    # Invalidation: another system prompt, another tool: the fresh answer, never a remembered one.
    _check_turns(renderer, tokenizer, None, module, turns(None, system="Be brief.\n\n"))
    _check_turns(renderer, tokenizer, None, module, turns(None, tool="shell"))


@pytest.mark.parametrize("api", list(APIS))
def test_multi_turn_image_prompts_are_token_exact(vl, api):
    tokenizer, vision = vl
    renderer = ChatRenderer(tokenizer, vision)
    module, turns = APIS[api]
    _check_turns(renderer, tokenizer, vision, module, turns(RED))
    hits = renderer.renders.hits
    # The same text with another image (another size: another number of placeholder tokens): the
    # rendered text is rightly shared, the ids follow the new image.
    _check_turns(renderer, tokenizer, vision, module, turns(BLUE))
    assert renderer.renders.hits > hits
    red = PromptBuilder(renderer).build("r", module.parse_request(turns(RED)[-1]).messages, [])
    blue = PromptBuilder(renderer).build("r", module.parse_request(turns(BLUE)[-1]).messages, [])
    assert red.ids != blue.ids and [im.sha for im in red.images] != [im.sha for im in blue.images]


PIECES = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</think>", "<|im", "_end|>",
                          "user\n", "assistant", " ", "  ", "\n", "\n\n", "\t", "x", " hello", "wörld", "\u0301",
                          "\u0338", ">", "<", "12 345", "\u65e5\u672c\u8a9e", "\U0001f600", '{"a": 1}', "\u2581x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=24))
def test_chunked_tokenising_equals_one_call_on_any_text(text_tokenizers, parts):
    tokenizer = text_tokenizers["qwen3"]
    encoder = _ENCODERS.setdefault("qwen3", ChunkedEncoder(tokenizer, ChatRenderer(tokenizer).encode_batch))
    text = "".join(parts)
    whole = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert encoder.encode(text) == whole
    assert encoder.encode(text) == whole  # again, from the cache


_ENCODERS: dict[str, ChunkedEncoder] = {}


def test_caches_stay_within_their_budgets(text_tokenizers):
    tokenizer = text_tokenizers["tiny"]
    encoder = ChunkedEncoder(tokenizer, ChatRenderer(tokenizer).encode_batch, max_chars=4_000)
    renders = RenderCache(max_chars=4_000)
    for i in range(300):
        text = f"<|im_start|>user\nline {i} " + "word " * (i % 40) + "<|im_end|>\n<|im_start|>assistant\n"
        assert encoder.encode(text) == tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        renders.put(renders.key([{"role": "user", "content": str(i)}], [], True), text)
        assert encoder.chars <= 4_000 and renders.chars <= 4_000
    assert len(encoder) < 300 and len(renders) < 300
    big = "<|im_start|>user\n" + "x" * 1_000 + "<|im_end|>"  # over an eighth of the budget: used, not kept
    assert encoder.encode(big) == tokenizer.backend_tokenizer.encode(big, add_special_tokens=False).ids
    assert "x" * 1_000 not in "".join(encoder._pieces)


def test_a_tokenizer_that_prefixes_each_text_is_not_chunked():
    """SentencePiece-style Metaspace with prepend_scheme "first": a piece tokenised on its own gets a
    leading "▁" it does not get inside the whole text, so no token is a safe boundary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(["hello world x y the user assistant"] * 50, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"], show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    encoder = ChunkedEncoder(fast, lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])
    assert encoder.boundaries == []
    text = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\nx"
    assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids


def test_a_template_that_reads_the_clock_is_rendered_every_time(text_tokenizers, monkeypatch):
    import itertools
    from datetime import datetime

    import transformers.utils.chat_template_utils as chat_templates

    years = itertools.count(2025)

    class Clock(datetime):  # a year passes at each look: a cached render would keep the first one
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return datetime(next(years), 1, 1)

    monkeypatch.setattr(chat_templates, "datetime", Clock)  # what transformers' strftime_now reads
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ("{{ strftime_now('%Y') }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                               "{{ m.content }}<|im_end|>\n{% endfor %}")
    renderer = ChatRenderer(tokenizer)
    assert not renderer.renders.enabled
    msgs = [Message("user", "hi")]
    first, second = renderer.render(msgs, [], generation=False), renderer.render(msgs, [], generation=False)
    assert int(first[:4]) < int(second[:4]) and first[4:] == second[4:], (first, second)
    assert len(renderer.renders) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1023), max_size=40))
def test_decoding_through_the_rust_tokenizer_gives_transformers_text(text_tokenizers, ids):
    for tokenizer in text_tokenizers.values():
        renderer = _RENDERERS.setdefault(id(tokenizer), ChatRenderer(tokenizer))
        assert renderer._backend_decodes
        assert renderer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


_RENDERERS: dict[int, ChatRenderer] = {}
