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


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("window", [1, 2, 3, 7, 20])
def test_causal_and_sliding_window_masks(n, window):
    assert torch.equal(causal_mask(n), loop_mask(n, lambda i, j: j <= i))
    assert torch.equal(sliding_window_mask(n, window), loop_mask(n, lambda i, j: 0 <= i - j < window))
    assert torch.equal(sliding_window_mask(n, window, causal=False),
                       loop_mask(n, lambda i, j: abs(i - j) < window))


@pytest.mark.parametrize("lengths", [[2, 5, 1], (2, 5, 1), torch.tensor([2, 5, 1]),
                                     torch.tensor([2, 5, 1], dtype=torch.int32)])
@pytest.mark.parametrize("max_len", [None, 5, 8])
def test_padding_mask_loop(lengths, max_len):
    width = 5 if max_len is None else max_len
    mask = padding_mask(lengths, max_len)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[t < length for t in range(width)] for length in (2, 5, 1)]


def test_key_padding_to_attention_mask(gen):
    key_padding = padding_mask([2, 4, 3])
    mask = key_padding_to_attention_mask(key_padding)
    assert mask.shape == (3, 1, 4) and torch.equal(mask[:, 0], key_padding)
    # used in attention, each batch element attends exactly to its real keys
    q = torch.randn(3, 5, 6, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    for b, length in enumerate([2, 4, 3]):
        assert (weights[b, :, length:] == 0).all()
        expected, _ = scaled_dot_product_attention(q[b], k[b, :length], v[b, :length])
        torch.testing.assert_close(out[b], expected, atol=1e-12, rtol=0)


def test_entropy_effective_keys_and_max_weight_hand_formulas(gen):
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    logits[0, 1, 2:] = -torch.inf  # exact zeros in some rows
    weights = torch.softmax(logits, -1)
    h = attention_entropy(weights)
    assert h.shape == (2, 3)
    np.testing.assert_allclose(h.numpy(), reference_entropy(weights), atol=1e-12)
    np.testing.assert_allclose(effective_keys(weights).numpy(), np.exp(reference_entropy(weights)))
    assert torch.equal(max_weight(weights), weights.amax(-1))


def test_normalized_entropy_uses_the_visible_keys_ceiling(gen):
    weights = torch.tensor([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    assert normalized_entropy(weights).tolist() == [1.0, 0.0, 0.5]
    # with a mask the ceiling is ln(visible keys): two visible keys, evenly weighted -> 1
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert normalized_entropy(weights, mask).tolist() == [1.0, 0.0, 1.0]
    # a broadcast (n_k,) mask on random rows: the hand formula over ln 3
    visible = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool)
    scores = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    w = torch.softmax(scores.masked_fill(~visible, -math.inf), -1)
    got = normalized_entropy(w, visible)
    np.testing.assert_allclose(got.numpy(), reference_entropy(w) / math.log(3), atol=1e-12)

