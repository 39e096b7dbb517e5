"""Pure pieces of the embedded engine: truncation, sampling, logprob definition, the batch KV cache."""

from __future__ import annotations

import pytest
import torch

from openforge.engine.kv import BatchKV
from openforge.engine.protocol import BadRequest, CompletionState, parse_sampling_params
from openforge.engine.sampling import _truncate, sample_next


def test_truncation_follows_sglang_and_keeps_vocabulary_order():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    kept = lambda **kw: _truncate(probs, parse_sampling_params(kw)).nonzero().flatten().tolist()  # noqa: E731
    # top_p: a token is dropped once the mass before it already exceeds p (0.5 + 0.3 > 0.7).
    assert kept(top_p=0.7) == [1, 3]
    assert kept(top_p=0.81) == [1, 2, 3]
    assert kept(top_k=1) == [1]
    assert kept(min_p=0.5) == [1, 3]  # keeps p >= 0.5 * 0.5
    assert kept() == [0, 1, 2, 3]


def test_sample_next_greedy_seeded_and_logprob_definition(monkeypatch):
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    greedy = parse_sampling_params({"temperature": 0})
    tokens, lps = sample_next(logits, [greedy], [torch.Generator()])
    assert tokens == [1] and lps[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
    hot = parse_sampling_params({"temperature": 0.5})
    draws = [sample_next(logits, [hot], [torch.Generator().manual_seed(4)]) for _ in range(2)]
    assert draws[0] == draws[1]
    token = draws[0][0][0]
    assert draws[0][1][0] == pytest.approx(float(torch.log_softmax(logits[0] / 0.5, -1)[token]))
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    _, raw = sample_next(logits, [hot], [torch.Generator().manual_seed(4)])
    assert raw[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[token]))


def test_sampling_params_are_validated_like_sglang():
    for bad, match in (({"temperature": -1}, "non-negative"), ({"top_k": 0}, "top_k"),
                       ({"max_new_tokens": "x"}, "must be a number"), ({"stop_token_ids": ["a"]}, "integers")):
        with pytest.raises(BadRequest, match=match):
            parse_sampling_params(bad)


def test_completion_state_finish_rules():
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # noqa: E731 - 1 -> 'a', 2 -> 'b', ...
    s = CompletionState(parse_sampling_params({"stop": ["cd"], "max_new_tokens": 10}), {9}, decode)
    assert [s.append(t, -1.0) for t in (1, 3, 4)] == [False, False, True]
    assert s.finish == {"type": "stop", "matched": "cd"} and s.text() == "a"
    s = CompletionState(parse_sampling_params({"max_new_tokens": 5}), {9}, decode)
    assert [s.append(t, -1.0) for t in (1, 9)] == [False, True]
    assert s.finish == {"type": "stop", "matched": 9} and s.output_ids == [1, 9] and s.text() == "a"
    s = CompletionState(parse_sampling_params({"max_new_tokens": 2, "ignore_eos": True}), {9}, decode)
    assert [s.append(t, -1.0) for t in (9, 9)] == [False, True] and s.finish["type"] == "length"
    # SGLang: ignore_eos ignores stop_token_ids too, not stop strings; max_new_tokens is checked first.
    s = CompletionState(parse_sampling_params({"max_new_tokens": 3, "ignore_eos": True, "stop_token_ids": [2],
                                               "stop": ["c"]}), {9}, decode)
    assert [s.append(t, -1.0) for t in (2, 3)] == [False, True] and s.finish == {"type": "stop", "matched": "c"}
    s = CompletionState(parse_sampling_params({"max_new_tokens": 2, "stop_token_ids": [2]}), {9}, decode)
    assert [s.append(t, -1.0) for t in (1, 2)] == [False, True] and s.finish == {"type": "length", "length": 2}


def _cache(rows: int, length: int, seed: int):
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    kv = [(torch.randn(rows, 2, length, 4, generator=g), torch.randn(rows, 2, length, 4, generator=g)) for _ in range(2)]
    return DynamicCache(ddp_cache_data=kv), kv


def test_batch_kv_left_pads_on_join_and_trims_on_leave():
    batch = BatchKV()
    short, short_kv = _cache(1, 3, 0)
    long, long_kv = _cache(1, 5, 1)
    batch.join(short)
    batch.join(long)
    assert (batch.size, batch.length, batch.pads) == (2, 5, [2, 0])
    assert batch.decode_mask("cpu").tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    layer = batch.cache.layers[1]
    assert torch.equal(layer.keys[0, :, 2:], short_kv[1][0][0]) and torch.equal(layer.keys[1], long_kv[1][0][0])
    assert not layer.keys[0, :, :2].any()
    batch.keep([0])  # the long row leaves: the short row's padding goes with it
    assert (batch.length, batch.pads) == (3, [0])
    assert torch.equal(batch.cache.layers[0].values[0], short_kv[0][1][0])
    batch.keep([])
    assert batch.cache is None and batch.size == 0


def test_batch_kv_joins_a_multi_row_prefill_with_its_padding():
    batch = BatchKV()
    first, _ = _cache(1, 6, 2)
    group, group_kv = _cache(2, 4, 3)
    batch.join(first)
    batch.join(group, pads=[0, 1])  # the second prompt was one token shorter
    assert (batch.size, batch.length, batch.pads) == (3, 6, [0, 2, 3])
    assert torch.equal(batch.cache.layers[0].keys[2, :, 2:], group_kv[0][0][1])
