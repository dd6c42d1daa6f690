"""Notebook 04's checkers (``exercises.multi_head``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_helpers import exercises
from attn_helpers.exercises.multi_head import (
    _forward_cases,
    _gqa,
    _gqa_cases,
    _module_forward,
    check_grouped_query_attention,
    check_multi_head_forward,
)
from attn_helpers.multihead import MultiHeadAttention


def _stub(*args):
    raise NotImplementedError


# --- multi_head_forward ----------------------------------------------------------------------


def multi_head_forward(x, W_Q, W_K, W_V, W_O, num_heads, *, split="right", merge="right",
                       d_scale="head", dim=-1, linear_layout=False, mix=True):
    b, n, d_model = x.shape
    h, d_head = num_heads, d_model // num_heads
    if linear_layout:
        W_Q, W_K, W_V, W_O = W_Q.T, W_K.T, W_V.T, W_O.T

    def to_heads(t):                                    # (b, n, d_model) -> (b, h, n, d_head)
        if split == "reshape only":
            return t.reshape(b, h, n, d_head)
        if split == "strided":
            return t.reshape(b, n, d_head, h).permute(0, 3, 1, 2)
        return t.reshape(b, n, h, d_head).transpose(1, 2)

    q, k, v = to_heads(x @ W_Q), to_heads(x @ W_K), to_heads(x @ W_V)
    scale = {"head": 1 / math.sqrt(d_head), "model": 1 / math.sqrt(d_model), "none": 1.0}[d_scale]
    heads = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim) @ v
    concat = (heads.reshape(b, n, d_model) if merge == "reshape only"
              else heads.transpose(1, 2).reshape(b, n, d_model))
    return concat @ W_O if mix else concat


def test_forward_accepts_the_reference():
    assert check_multi_head_forward(multi_head_forward)


def test_forward_reference_equals_torch_multihead_attention():
    for case in _forward_cases():
        x, w_q, w_k, w_v, w_o, h = case.values()
        d = x.shape[-1]
        with torch.random.fork_rng(devices=[]):
            ref = torch.nn.MultiheadAttention(d, h, bias=False, batch_first=True).to(x.dtype)
        with torch.no_grad():
            ref.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))
            ref.out_proj.weight.copy_(w_o.T)
            expected = ref(x, x, x, need_weights=False)[0]
        assert torch.allclose(_module_forward(*case.values()), expected, atol=1e-5)
        assert isinstance(MultiHeadAttention.from_torch(ref), MultiHeadAttention)


def test_forward_reference_does_not_move_the_global_seed():
    state = torch.random.get_rng_state()
    _module_forward(*_forward_cases()[0].values())
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("mistake, words", [
    ({"split": "reshape only"}, "mixes positions into heads"),
    ({"split": "strided"}, "not every h-th feature"),
    ({"merge": "reshape only"}, "the merge scrambles the heads"),
    ({"d_scale": "model"}, "not 1/sqrt(d_model)"),
    ({"d_scale": "none"}, "not scaled"),
    ({"dim": -2}, "wrong axis"),
    ({"linear_layout": True}, "not x @ W_Q.T"),
    ({"mix": False}, "multiply by W_O"),
])
def test_forward_rejects_known_mistakes_with_their_hint(mistake, words):
    verdict = check_multi_head_forward(lambda *args: multi_head_forward(*args, **mistake))
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_forward_stub_and_non_function():
    assert check_multi_head_forward(_stub).message == "multi_head_forward is not implemented yet."
    assert not check_multi_head_forward(3)


# --- grouped_query_attention -----------------------------------------------------------------


def grouped_query_attention(q, k, v, *, share="interleave", scale=None, dim=-1):
    h, g, d_head = q.shape[1], k.shape[1], q.shape[-1]
    if share == "interleave":
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    elif share == "repeat":
        k, v = k.repeat(1, h // g, 1, 1), v.repeat(1, h // g, 1, 1)
    elif share == "first":
        k, v = k[:, :1], v[:, :1]
    elif share == "i // g":
        index = torch.tensor([i // g for i in range(h)])
        k, v = k[:, index], v[:, index]
    scale = 1 / math.sqrt(d_head) if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim) @ v


def test_gqa_accepts_the_reference_and_torch_enable_gqa():
    assert check_grouped_query_attention(grouped_query_attention)
    assert check_grouped_query_attention(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_gqa_reference_equals_torch_enable_gqa_on_every_case():
    for case in _gqa_cases():
        expected = F.scaled_dot_product_attention(*case.values(), enable_gqa=True)
        assert torch.allclose(_gqa(*case.values()), expected, atol=1e-6)


@pytest.mark.parametrize("mistake, words", [
    ({"share": "repeat"}, "repeat_interleave"),
    ({"share": "first"}, "every query head read the first"),
    ({"scale": 1.0}, "not scaled"),
    ({"dim": -2}, "wrong axis"),
])
def test_gqa_rejects_known_mistakes_with_their_hint(mistake, words):
    verdict = check_grouped_query_attention(lambda q, k, v: grouped_query_attention(q, k, v, **mistake))
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_gqa_rejects_a_wrong_group_index_and_a_wrong_scale():
    verdict = check_grouped_query_attention(
        lambda q, k, v: grouped_query_attention(q, k, v, scale=1 / math.sqrt(q.shape[1] * q.shape[-1])))
    assert not verdict and "not by 1/sqrt(h * d_head)" in verdict.message
    # i // g runs past the last key/value head when h/g > g: reported as the learner's error
    verdict = check_grouped_query_attention(
        lambda q, k, v: grouped_query_attention(q, k, v, share="i // g"))
    assert not verdict and ("not i // g" in verdict.message or "IndexError" in verdict.message)


def test_gqa_wrong_group_index_gets_its_hint_where_it_stays_in_range():
    def i_over_g(q, k, v):
        h, g = q.shape[1], k.shape[1]
        index = torch.tensor([min(i // g, g - 1) for i in range(h)])
        return grouped_query_attention(q, k[:, index], v[:, index], share="none")

    verdict = check_grouped_query_attention(i_over_g)
    assert not verdict and "not i // g" in verdict.message, verdict.message


def test_gqa_stub_and_averaged_heads():
    verdict = check_grouped_query_attention(_stub)
    assert verdict.message == "grouped_query_attention is not implemented yet."
    verdict = check_grouped_query_attention(                 # one output per group: wrong shape
        lambda q, k, v: grouped_query_attention(q.unflatten(1, (k.shape[1], -1)).mean(2), k, v))
    assert not verdict and "has shape" in verdict.message


def test_exercises_are_registered_with_three_hints():
    for key in ("multi_head.forward", "multi_head.grouped_query"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
