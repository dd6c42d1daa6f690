"""masks.py and entropy.py against the contract's formulas, written as explicit loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference import entropy as reference_entropy

from attn_helpers import (
    attention_entropy,
    causal_mask,
    effective_keys,
    key_padding_to_attention_mask,
    max_weight,
    normalized_entropy,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)


def loop_mask(n, rule):
    return torch.tensor([[rule(i, j) for j in range(n)] for i in range(n)], dtype=torch.bool)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_causal_mask(n):
    mask = causal_mask(n)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    assert torch.equal(mask, loop_mask(n, lambda i, j: j <= i))


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("window", [1, 2, 3, 7, 20])
def test_sliding_window(n, window):
    assert torch.equal(sliding_window_mask(n, window), loop_mask(n, lambda i, j: 0 <= i - j < window))
    assert torch.equal(sliding_window_mask(n, window, causal=False),
                       loop_mask(n, lambda i, j: abs(i - j) < window))


def test_sliding_window_examples():
    # window 1 is the identity; a window as wide as the sequence is the causal mask
    assert torch.equal(sliding_window_mask(5, 1), torch.eye(5, dtype=torch.bool))
    assert torch.equal(sliding_window_mask(5, 1, causal=False), torch.eye(5, dtype=torch.bool))
    assert torch.equal(sliding_window_mask(5, 5), causal_mask(5))
    assert sliding_window_mask(5, 5, causal=False).all()
    assert int(sliding_window_mask(6, 2).sum()) == 6 + 5


@pytest.mark.parametrize("lengths", [[2, 5, 1], (2, 5, 1), torch.tensor([2, 5, 1]),
                                     torch.tensor([2, 5, 1], dtype=torch.int32)])
@pytest.mark.parametrize("max_len", [None, 5, 8])
def test_padding_mask_loop(lengths, max_len):
    mask = padding_mask(lengths, max_len)
    width = 5 if max_len is None else max_len
    assert mask.shape == (3, width)
    values = [2, 5, 1]
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[t < values[b] for t in range(width)] for b in range(3)]


def test_key_padding_to_attention_mask(gen):
    key_padding = padding_mask([2, 4, 3])
    mask = key_padding_to_attention_mask(key_padding)
    assert mask.shape == (3, 1, 4) and mask.dtype == torch.bool
    assert torch.equal(mask[:, 0], key_padding)
    # used in attention, each batch element attends exactly to its real keys
    q = torch.randn(3, 5, 6, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    for b, length in enumerate([2, 4, 3]):
        assert (weights[b, :, length:] == 0).all()
        expected, _ = scaled_dot_product_attention(q[b], k[b, :length], v[b, :length])
        torch.testing.assert_close(out[b], expected, atol=1e-12, rtol=0)


def test_attention_entropy_hand_formula(gen):
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    logits[0, 1, 2:] = -torch.inf  # exact zeros in some rows
    weights = torch.softmax(logits, -1)
    h = attention_entropy(weights)
    assert h.shape == (2, 3)
    np.testing.assert_allclose(h.numpy(), reference_entropy(weights), atol=1e-12)


def test_normalized_entropy(gen):
    weights = torch.tensor([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(
        normalized_entropy(weights), torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    )
    # with a mask the ceiling is ln(visible keys): two visible keys, evenly weighted -> 1
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(
        normalized_entropy(weights, mask), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    )
    # a broadcast (n_k,) mask; random rows lie in [0, 1] and match the hand formula
    w = torch.softmax(torch.randn(5, 6, generator=gen, dtype=torch.float64), -1)
    visible = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool)
    w_masked = torch.where(visible, w, 0.0)
    w_masked = w_masked / w_masked.sum(-1, keepdim=True)
    got = normalized_entropy(w_masked, visible)
    np.testing.assert_allclose(got.numpy(), reference_entropy(w_masked) / math.log(3), atol=1e-12)
    assert ((got >= 0) & (got <= 1 + 1e-12)).all()


def test_effective_keys_and_max_weight():
    n = 6
    uniform = torch.full((2, n), 1 / n, dtype=torch.float64)
    one_hot = torch.zeros(2, n, dtype=torch.float64)
    one_hot[0, 3] = one_hot[1, 0] = 1.0
    torch.testing.assert_close(effective_keys(uniform), torch.full((2,), float(n), dtype=torch.float64))
    torch.testing.assert_close(effective_keys(one_hot), torch.ones(2, dtype=torch.float64))
    half = torch.tensor([0.5, 0.5, 0.0])
    torch.testing.assert_close(effective_keys(half), torch.tensor(2.0))
    weights = torch.tensor([[0.1, 0.7, 0.2], [0.3, 0.3, 0.4]])
    assert torch.equal(max_weight(weights), torch.tensor([0.7, 0.4]))
    assert torch.equal(max_weight(one_hot), torch.ones(2, dtype=torch.float64))
