"""attention.py against torch's scaled_dot_product_attention and hand-written loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _reference import as_np, attention_output, attention_weights

from attn_helpers import (
    AdditiveScore,
    additive_scores,
    causal_mask,
    dot_product_scores,
    masked_softmax,
    scaled_dot_product_attention,
    scaled_dot_product_scores,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def randn(gen, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype)


def random_mask(gen, *shape):
    """A random boolean mask with at least one True in every row."""
    mask = torch.rand(*shape, generator=gen) < 0.5
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch, n_q, n_k, d_k, d_v, mask, scale", [
    ((), 5, 5, 8, 8, None, None),
    ((2,), 7, 7, 4, 4, "causal", None),
    ((), 1, 1, 5, 3, (1, 1), None),
    ((), 9, 3, 5, 3, (9, 3), 7.0),
    ((), 3, 11, 16, 2, None, 2.5),        # n_q != n_k and d_k != d_v
    ((2, 3), 4, 6, 5, 7, (6,), None),     # masks that broadcast over batch, heads and queries
    ((2, 3), 4, 6, 5, 7, (2, 1, 4, 6), 1.0),
])
def test_matches_torch_and_the_loop_formula(gen, dtype, batch, n_q, n_k, d_k, d_v, mask, scale):
    q, k, v = (randn(gen, *batch, n, d, dtype=dtype) for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    if mask is not None:
        mask = causal_mask(n_q) if mask == "causal" else random_mask(gen, *mask)
    out, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    torch_mask = None if mask is None else mask.expand(*mask.shape[:-2], n_q, n_k)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask, scale=scale)
    atol = TOL[dtype]
    assert out.dtype == weights.dtype == dtype and weights.shape == (*batch, n_q, n_k)
    torch.testing.assert_close(out, expected, atol=atol, rtol=atol)
    ref_weights = attention_weights(q, k, scale=scale, mask=mask)   # scale None: 1 / sqrt(d_k)
    np.testing.assert_allclose(as_np(weights), ref_weights, atol=atol, rtol=0)
    np.testing.assert_allclose(as_np(out), attention_output(ref_weights, v), atol=10 * atol, rtol=0)


def test_gradients_match_torch(gen):
    q, k, v = (randn(gen, 2, 5, 4).requires_grad_() for _ in range(3))
    mask, grad_out = random_mask(gen, 5, 5), randn(gen, 2, 5, 4)
    ours = torch.autograd.grad(scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v), grad_out)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    theirs = torch.autograd.grad(expected, (q, k, v), grad_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fully_masked_rows_give_finite_zero_gradients(gen, dtype):
    q = randn(gen, 3, 4, dtype=dtype).requires_grad_()
    k = randn(gen, 6, 4, dtype=dtype).requires_grad_()
    v = (100 * randn(gen, 6, 5, dtype=dtype)).requires_grad_()
    mask = random_mask(gen, 3, 6)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    (out.sum() + weights.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert not q.grad[1].any() and q.grad[0].abs().sum() > 0
    # masked_softmax alone: a large upstream gradient must not turn 0 * (1 / tiny) into inf or NaN
    scores = (10 * randn(gen, 2, 5, dtype=dtype)).requires_grad_()
    weights = masked_softmax(scores, torch.tensor([[False] * 5, [True] * 5]))
    (grad,) = torch.autograd.grad(weights, scores, 1e3 * randn(gen, 2, 5, dtype=dtype))
    assert torch.isfinite(grad).all() and not grad[0].any() and grad[1].abs().sum() > 0


def test_masked_softmax_is_softmax_over_the_allowed_keys(gen):
    scores, mask = randn(gen, 2, 4, 6), random_mask(gen, 2, 4, 6)
    expected = torch.softmax(scores.masked_fill(~mask, -math.inf), -1)
    torch.testing.assert_close(masked_softmax(scores, mask), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(masked_softmax(scores), torch.softmax(scores, -1))


@pytest.mark.parametrize("scale", [None, 0.3])
def test_dot_product_scores_loop(gen, scale):
    q, k = randn(gen, 2, 3, 5), randn(gen, 2, 4, 5)
    raw, scaled = dot_product_scores(q, k), scaled_dot_product_scores(q, k, scale=scale)
    factor = 1 / math.sqrt(5) if scale is None else scale
    for b, i, j in np.ndindex(2, 3, 4):
        expected = sum(q[b, i, t].item() * k[b, j, t].item() for t in range(5))
        assert raw[b, i, j].item() == pytest.approx(expected, abs=1e-12)
        assert scaled[b, i, j].item() == pytest.approx(factor * expected, abs=1e-12)


def test_additive_scores_are_bahdanaus_formula(gen):
    """e_ij = v_a . tanh(W_q q_i + W_k k_j), with explicit loops; d_q != d_k is allowed. The
    module AdditiveScore computes the same function with its own weights."""
    q, k = randn(gen, 2, 3, 4), randn(gen, 2, 5, 6)
    w_q, w_k, v_a = randn(gen, 7, 4), randn(gen, 7, 6), randn(gen, 7)
    scores = additive_scores(q, k, w_q=w_q, w_k=w_k, v_a=v_a)
    assert scores.shape == (2, 3, 5)
    for b, i, j in np.ndindex(2, 3, 5):
        expected = sum(v_a[a] * torch.tanh(w_q[a] @ q[b, i] + w_k[a] @ k[b, j]) for a in range(7))
        assert scores[b, i, j].item() == pytest.approx(expected.item(), abs=1e-12)
    module = AdditiveScore(d_q=4, d_k=6, d_attn=7).double()
    torch.testing.assert_close(module(q, k), additive_scores(
        q, k, module.w_q.weight, module.w_k.weight, module.w_v.weight.reshape(-1)))
