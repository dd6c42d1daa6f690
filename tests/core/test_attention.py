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
DTYPES = [torch.float32, torch.float64]


def randn(gen, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype)


def random_mask(gen, n_q, n_k, *batch, p=0.5):
    """A random boolean mask with at least one True in every row."""
    mask = torch.rand(*batch, n_q, n_k, generator=gen) < p
    first = torch.randint(0, n_k, (*batch, n_q, 1), generator=gen)
    return mask.scatter(-1, first, True)


def check_against_torch(q, k, v, mask=None, scale=None):
    out, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    torch_mask = mask
    if mask is not None and mask.dim() == 1:  # torch wants at least (n_q, n_k)
        torch_mask = mask.expand(q.shape[-2], k.shape[-2])
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask, scale=scale)
    atol = TOL[q.dtype]
    assert out.dtype == q.dtype and weights.dtype == q.dtype
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=atol, rtol=atol)
    ref_w = attention_weights(q, k, scale=scale, mask=mask)
    assert weights.shape == ref_w.shape
    np.testing.assert_allclose(as_np(weights), ref_w, atol=atol, rtol=0)
    np.testing.assert_allclose(as_np(out), attention_output(ref_w, v), atol=10 * atol, rtol=0)
    return out, weights


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, n_q, n_k, d_k, d_v, mask", [
    ((), 5, 5, 8, 8, None),
    ((2,), 7, 7, 4, 4, "causal"),
    ((), 1, 1, 5, 3, "random"),
    ((), 3, 9, 5, 3, "random"),
    ((), 9, 3, 5, 3, "random"),
    ((), 3, 11, 16, 2, None),          # n_q != n_k and d_k != d_v
    ((2, 3), 5, 7, 4, 6, None),        # batch and head dims
    ((2, 3), 5, 7, 4, 6, "random"),
])
def test_matches_torch(gen, dtype, batch, n_q, n_k, d_k, d_v, mask):
    q, k, v = (randn(gen, *batch, n, d, dtype=dtype) for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    if mask == "causal":
        mask = causal_mask(n_q)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(check_against_torch(q, k, v, mask)[0], expected,
                                   atol=TOL[dtype], rtol=TOL[dtype])
    elif mask == "random":
        mask = random_mask(gen, n_q, n_k, *batch, p=0.3)
    out, weights = check_against_torch(q, k, v, mask)
    assert out.shape == (*batch, n_q, d_v) and weights.shape == (*batch, n_q, n_k)
    if mask is not None:
        assert torch.all(weights[~mask.expand_as(weights)] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "mask_shape", [(6,), (1, 6), (4, 6), (1, 4, 6), (3, 1, 6), (2, 1, 4, 6), (2, 3, 4, 6)]
)
def test_broadcast_masks_match_torch(gen, dtype, mask_shape):
    q = randn(gen, 2, 3, 4, 5, dtype=dtype)
    k = randn(gen, 2, 3, 6, 5, dtype=dtype)
    v = randn(gen, 2, 3, 6, 7, dtype=dtype)
    mask = torch.rand(mask_shape, generator=gen) < 0.5
    mask[..., 0] = True  # every row keeps a key
    check_against_torch(q, k, v, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5, 7])
def test_explicit_scale_matches_torch(gen, dtype, scale):
    q = randn(gen, 4, 6, dtype=dtype)
    k = randn(gen, 5, 6, dtype=dtype)
    v = randn(gen, 5, 3, dtype=dtype)
    check_against_torch(q, k, v, scale=scale)
    check_against_torch(q, k, v, random_mask(gen, 4, 5), scale=scale)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v),     # default 1 / sqrt(d_k)
                               scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(6)))


def test_gradients_match_torch(gen):
    q, k, v = (randn(gen, 2, 5, 4).requires_grad_() for _ in range(3))
    mask = random_mask(gen, 5, 5)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    grad_out = randn(gen, 2, 5, 4)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    theirs = torch.autograd.grad(expected, (q, k, v), grad_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_row_gives_finite_zero_gradients(gen, dtype):
    q = randn(gen, 3, 4, dtype=dtype).requires_grad_()
    k = randn(gen, 6, 4, dtype=dtype).requires_grad_()
    v = (100 * randn(gen, 6, 5, dtype=dtype)).requires_grad_()
    mask = random_mask(gen, 3, 6)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    (out.sum() + weights.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[1], torch.zeros(4, dtype=q.dtype))
    assert q.grad[0].abs().sum() > 0


@pytest.mark.parametrize("scale", [None, 0.3])
def test_dot_product_scores_loop(gen, scale):
    q, k = randn(gen, 2, 3, 5), randn(gen, 2, 4, 5)
    raw, scaled = dot_product_scores(q, k), scaled_dot_product_scores(q, k, scale=scale)
    factor = 1 / math.sqrt(5) if scale is None else scale
    for b, i, j in np.ndindex(2, 3, 4):
        expected = sum(q[b, i, t].item() * k[b, j, t].item() for t in range(5))
        assert raw[b, i, j].item() == pytest.approx(expected, abs=1e-12)
        assert scaled[b, i, j].item() == pytest.approx(factor * expected, abs=1e-12)


def additive_loop(q, k, w_q, w_k, v_a):
    """e_ij = v_a . tanh(W_q q_i + W_k k_j), with explicit loops (q, k 2-D)."""
    q, k, w_q, w_k, v_a = (as_np(t) for t in (q, k, w_q, w_k, v_a))
    d_a = w_q.shape[0]
    out = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            total = 0.0
            for a in range(d_a):
                pre = sum(w_q[a, t] * q[i, t] for t in range(q.shape[1]))
                pre += sum(w_k[a, t] * k[j, t] for t in range(k.shape[1]))
                total += v_a[a] * math.tanh(pre)
            out[i, j] = total
    return out


def test_additive_scores_loop(gen):
    q, k = randn(gen, 2, 3, 4), randn(gen, 2, 5, 6)  # d_q != d_k is allowed
    w_q, w_k, v_a = randn(gen, 7, 4), randn(gen, 7, 6), randn(gen, 7)
    scores = additive_scores(q, k, w_q=w_q, w_k=w_k, v_a=v_a)
    assert scores.shape == (2, 3, 5)
    for b in range(2):
        np.testing.assert_allclose(as_np(scores[b]), additive_loop(q[b], k[b], w_q, w_k, v_a),
                                   atol=1e-12)


def test_additive_score_module_matches_function_and_trains(gen):
    torch.manual_seed(0)
    module = AdditiveScore(d_q=4, d_k=6, d_attn=5)
    q, k = randn(gen, 3, 4, dtype=torch.float32), randn(gen, 2, 6, dtype=torch.float32)
    q.requires_grad_()
    scores = module(q, k)
    assert scores.shape == (3, 2)
    expected_fn = additive_scores(
        q, k, module.w_q.weight, module.w_k.weight, module.w_v.weight.reshape(-1)
    )
    torch.testing.assert_close(scores, expected_fn)
    (scores * randn(gen, 3, 2, dtype=torch.float32)).sum().backward()
    params = dict(module.named_parameters())
    assert set(params) == {"w_q.weight", "w_k.weight", "w_v.weight"}
    for name, p in params.items():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_masked_softmax_matches_reference(gen):
    scores = randn(gen, 2, 4, 6)
    mask = random_mask(gen, 4, 6, 2)
    weights = masked_softmax(scores, mask)
    for b in range(2):
        for i in range(4):
            allowed = mask[b, i]
            e = torch.exp(scores[b, i][allowed] - scores[b, i][allowed].max())
            expected = torch.zeros(6, dtype=scores.dtype)
            expected[allowed] = e / e.sum()
            torch.testing.assert_close(weights[b, i], expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(masked_softmax(scores), torch.softmax(scores, -1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_fully_masked_rows(gen, dtype):
    scores = (10 * randn(gen, 3, 5, dtype=dtype)).requires_grad_()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0] = False
    mask[2, 1:] = False
    weights = masked_softmax(scores, mask)
    assert torch.equal(weights[0], torch.zeros(5, dtype=dtype))
    assert torch.equal(weights[2], torch.tensor([1.0, 0, 0, 0, 0], dtype=dtype))
    # a large upstream gradient must not turn 0 * (1 / tiny) into inf or NaN
    upstream = 1e3 * randn(gen, 3, 5, dtype=dtype)
    (grad,) = torch.autograd.grad(weights, scores, upstream)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[0], torch.zeros(5, dtype=dtype))
    assert grad[1].abs().sum() > 0
