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


# --- scaled_dot_product_attention vs torch ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_mask_matches_torch(gen, dtype):
    q, k, v = (randn(gen, 5, 8, dtype=dtype) for _ in range(3))
    check_against_torch(q, k, v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_mask_matches_torch(gen, dtype):
    q, k, v = (randn(gen, 2, 7, 4, dtype=dtype) for _ in range(3))
    mask = causal_mask(7)
    out, weights = check_against_torch(q, k, v, mask)
    assert torch.all(weights[..., ~mask] == 0)
    # torch's own causal flag means the same thing as our causal mask
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_masks_match_torch(gen, dtype):
    for n_q, n_k in [(1, 1), (3, 9), (9, 3), (6, 6)]:
        q = randn(gen, n_q, 5, dtype=dtype)
        k = randn(gen, n_k, 5, dtype=dtype)
        v = randn(gen, n_k, 3, dtype=dtype)
        mask = random_mask(gen, n_q, n_k, p=0.3)
        _, weights = check_against_torch(q, k, v, mask)
        assert torch.all(weights[~mask] == 0)


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
def test_batch_and_head_dims_match_torch(gen, dtype):
    b, h, n_q, n_k, d_k, d_v = 2, 3, 5, 7, 4, 6
    q = randn(gen, b, h, n_q, d_k, dtype=dtype)
    k = randn(gen, b, h, n_k, d_k, dtype=dtype)
    v = randn(gen, b, h, n_k, d_v, dtype=dtype)
    out, weights = check_against_torch(q, k, v)
    assert out.shape == (b, h, n_q, d_v)
    assert weights.shape == (b, h, n_q, n_k)
    out, weights = check_against_torch(q, k, v, random_mask(gen, n_q, n_k, b, h))


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_batch_dims(gen, dtype):
    """q with batch (2, 3), k and v shared across the batch: same as repeating them."""
    q = randn(gen, 2, 3, 4, 5, dtype=dtype)
    k = randn(gen, 6, 5, dtype=dtype)
    v = randn(gen, 1, 6, 2, dtype=dtype)
    out, weights = scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 4, 2) and weights.shape == (2, 3, 4, 6)
    np.testing.assert_allclose(as_np(weights), attention_weights(q, k), atol=TOL[dtype], rtol=0)
    for a in range(2):
        for c in range(3):
            single, _ = scaled_dot_product_attention(q[a, c], k, v[0])
            torch.testing.assert_close(out[a, c], single, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_nq_differs_from_nk_and_dk_from_dv(gen, dtype):
    q = randn(gen, 3, 16, dtype=dtype)
    k = randn(gen, 11, 16, dtype=dtype)
    v = randn(gen, 11, 2, dtype=dtype)
    out, weights = check_against_torch(q, k, v)
    assert out.shape == (3, 2) and weights.shape == (3, 11)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5, 7])
def test_explicit_scale_matches_torch(gen, dtype, scale):
    q = randn(gen, 4, 6, dtype=dtype)
    k = randn(gen, 5, 6, dtype=dtype)
    v = randn(gen, 5, 3, dtype=dtype)
    check_against_torch(q, k, v, scale=scale)
    check_against_torch(q, k, v, random_mask(gen, 4, 5), scale=scale)


def test_default_scale_is_one_over_sqrt_dk(gen):
    q, k, v = randn(gen, 4, 9), randn(gen, 5, 9), randn(gen, 5, 3)
    default = scaled_dot_product_attention(q, k, v)
    explicit = scaled_dot_product_attention(q, k, v, scale=1 / 3)
    torch.testing.assert_close(default, explicit, atol=1e-12, rtol=0)
    unscaled = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert not torch.allclose(default[1], unscaled[1])


def test_rows_with_no_allowed_key_are_zero_and_match_torch_elsewhere(gen):
    q, k, v = randn(gen, 4, 3), randn(gen, 5, 3), randn(gen, 5, 2)
    mask = random_mask(gen, 4, 5)
    mask[2] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.equal(weights[2], torch.zeros(5, dtype=weights.dtype))
    assert torch.equal(out[2], torch.zeros(2, dtype=out.dtype))
    keep = [0, 1, 3]
    expected = F.scaled_dot_product_attention(q[keep], k, v, attn_mask=mask[keep])
    torch.testing.assert_close(out[keep], expected, atol=1e-10, rtol=1e-10)


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


# --- scores ---------------------------------------------------------------------------------


def test_dot_product_scores_loop(gen):
    q, k = randn(gen, 2, 3, 5), randn(gen, 2, 4, 5)
    scores = dot_product_scores(q, k)
    assert scores.shape == (2, 3, 4)
    for b in range(2):
        for i in range(3):
            for j in range(4):
                expected = sum(q[b, i, t].item() * k[b, j, t].item() for t in range(5))
                assert scores[b, i, j].item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("scale", [None, 0.3])
def test_scaled_dot_product_scores_loop(gen, scale):
    q, k = randn(gen, 3, 7), randn(gen, 4, 7)
    scores = scaled_dot_product_scores(q, k, scale=scale)
    factor = 1 / math.sqrt(7) if scale is None else scale
    for i in range(3):
        for j in range(4):
            expected = factor * sum(q[i, t].item() * k[j, t].item() for t in range(7))
            assert scores[i, j].item() == pytest.approx(expected, abs=1e-12)


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
    q, k = randn(gen, 3, 4), randn(gen, 5, 6)  # d_q != d_k is allowed
    w_q, w_k, v_a = randn(gen, 7, 4), randn(gen, 7, 6), randn(gen, 7)
    scores = additive_scores(q, k, w_q=w_q, w_k=w_k, v_a=v_a)
    assert scores.shape == (3, 5)
    np.testing.assert_allclose(as_np(scores), additive_loop(q, k, w_q, w_k, v_a), atol=1e-12)


def test_additive_scores_batched(gen):
    q, k = randn(gen, 2, 3, 4), randn(gen, 2, 5, 2)
    w_q, w_k, v_a = randn(gen, 3, 4), randn(gen, 3, 2), randn(gen, 3)
    scores = additive_scores(q, k, w_q, w_k, v_a)
    assert scores.shape == (2, 3, 5)
    for b in range(2):
        np.testing.assert_allclose(
            as_np(scores[b]), additive_loop(q[b], k[b], w_q, w_k, v_a), atol=1e-12
        )


def test_additive_score_module_matches_function_and_trains(gen):
    torch.manual_seed(0)
    module = AdditiveScore(d_q=4, d_k=6, d_attn=5)
    q, k = randn(gen, 3, 4, dtype=torch.float32), randn(gen, 2, 6, dtype=torch.float32)
    q.requires_grad_()
    scores = module(q, k)
    assert scores.shape == (3, 2)
    expected = additive_loop(q, k, module.w_q.weight, module.w_k.weight, module.w_v.weight[0])
    np.testing.assert_allclose(as_np(scores), expected, atol=1e-5)
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


# --- masked_softmax ------------------------------------------------------------------------


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
