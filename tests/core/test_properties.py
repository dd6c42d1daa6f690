"""Property tests (hypothesis): what must hold for any shapes, masks and seeds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers import (
    attention_entropy,
    causal_mask,
    effective_keys,
    max_entropy,
    max_weight,
    normalized_entropy,
    scaled_dot_product_attention,
)

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)  # the same examples every run


@st.composite
def problems(draw, *, dtype=torch.float64, square=False):
    """Random q, k, v (with batch dims) and a seeded generator for anything else."""
    seed = draw(st.integers(0, 2**31 - 1))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    n_q = draw(st.integers(1, 12))
    n_k = n_q if square else draw(st.integers(1, 12))
    d_k = draw(st.integers(1, 8))
    d_v = draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n_q, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, n_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, n_k, d_v, generator=g, dtype=dtype)
    return q, k, v, g


def mask_with_allowed_key(g, shape):
    """Random bool mask of ``shape`` (..., n_q, n_k) with at least one True per row."""
    mask = torch.rand(shape, generator=g) < 0.5
    first = torch.randint(0, shape[-1], (*shape[:-1], 1), generator=g)
    return mask.scatter(-1, first, True)


def scores_shape(q, k):
    return (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])


@SETTINGS
@given(problems(), st.booleans())
def test_weights_are_distributions_and_outputs_convex_combinations(problem, use_mask):
    """Rows of weights sum to one over the allowed keys, so their entropy lies in [0, ln(allowed
    keys)]; each output coordinate lies between the smallest and largest allowed value's."""
    q, k, v, g = problem
    allowed = mask_with_allowed_key(g, scores_shape(q, k))
    mask = allowed if use_mask else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    allowed = allowed if use_mask else torch.ones_like(allowed)
    assert (weights >= 0).all() and (weights[~allowed] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=weights.dtype),
                               atol=1e-12, rtol=0)
    h = attention_entropy(weights)
    assert (h >= 0).all() and (h <= torch.log(allowed.sum(-1).double()) + 1e-12).all()
    seen = v.unsqueeze(-3).expand(*allowed.shape, v.shape[-1])   # (..., n_q, n_k, d_v)
    low = seen.masked_fill(~allowed[..., None], math.inf).amin(-2)
    high = seen.masked_fill(~allowed[..., None], -math.inf).amax(-2)
    assert (out >= low - 1e-10).all() and (out <= high + 1e-10).all()


@SETTINGS
@given(problems(), st.booleans())
def test_permuting_keys_and_values_together(problem, use_mask):
    q, k, v, g = problem
    mask = mask_with_allowed_key(g, scores_shape(q, k)) if use_mask else None
    perm = torch.randperm(k.shape[-2], generator=g)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    out_p, weights_p = scaled_dot_product_attention(
        q, k[..., perm, :], v[..., perm, :], None if mask is None else mask[..., perm]
    )
    torch.testing.assert_close(out_p, out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(weights_p, weights[..., perm], atol=1e-12, rtol=1e-12)


@SETTINGS
@given(problems(), st.sampled_from([torch.float32, torch.float64]))
def test_fully_masked_rows_are_zero_never_nan(problem, dtype):
    q, k, v, g = (t.to(dtype) if isinstance(t, torch.Tensor) else t for t in problem)
    shape = scores_shape(q, k)
    mask = torch.rand(shape, generator=g) < 0.5
    dead = torch.rand(shape[:-1], generator=g) < 0.5  # these query rows see no key at all
    mask = mask & ~dead[..., None]
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    empty = ~mask.any(-1)
    assert (weights[empty] == 0).all() and (out[empty] == 0).all()
    torch.testing.assert_close(weights.sum(-1)[~empty], torch.ones(int((~empty).sum()), dtype=dtype),
                               atol=1e-5, rtol=0)


@SETTINGS
@given(problems(dtype=torch.float32), st.sampled_from([1e4, -1e4]), st.booleans())
def test_huge_logits_stay_finite(problem, target, use_mask):
    q, k, v, g = problem
    mask = mask_with_allowed_key(g, scores_shape(q, k)) if use_mask else None
    biggest = (q @ k.mT / math.sqrt(q.shape[-1])).abs().max().clamp_min(1e-3)
    # scale q so that the largest |score| is 1e4, or -1e4 so both extremes appear
    for q_big, scale in ((q * target / biggest, None), (q, abs(target))):
        out, weights = scaled_dot_product_attention(q_big, k, v, mask, scale=scale)
        assert torch.isfinite(out).all() and torch.isfinite(weights).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)


@SETTINGS
@given(problems(square=True), st.data())
def test_causal_mask_leaks_nothing_from_the_future(problem, data):
    q, k, v, g = problem
    n = q.shape[-2]
    t = data.draw(st.integers(0, n - 1), label="t")
    mask = causal_mask(n)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[..., t + 1 :, :] = torch.randn(k2[..., t + 1 :, :].shape, generator=g, dtype=k.dtype)
    v2[..., t + 1 :, :] = 100 * torch.randn(v2[..., t + 1 :, :].shape, generator=g, dtype=v.dtype)
    out2, weights2 = scaled_dot_product_attention(q, k2, v2, mask)
    assert torch.equal(out2[..., : t + 1, :], out[..., : t + 1, :])
    assert torch.equal(weights2[..., : t + 1, :], weights[..., : t + 1, :])
    if t + 1 < n:
        # sanity: the last row does see the change (its weights on the new keys are > 0)
        assert not torch.equal(out2[..., -1, :], out[..., -1, :])


@SETTINGS
@given(st.integers(1, 64), st.integers(0, 63), st.sampled_from([torch.float32, torch.float64]))
def test_entropy_uniform_and_one_hot(n, hot, dtype):
    uniform = torch.full((3, n), 1.0 / n, dtype=dtype)
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(
        attention_entropy(uniform), torch.full((3,), math.log(n), dtype=dtype), atol=atol, rtol=0
    )
    assert max_entropy(n) == math.log(n)
    one_hot = torch.zeros(2, n, dtype=dtype)
    one_hot[:, hot % n] = 1.0
    assert torch.equal(attention_entropy(one_hot), torch.zeros(2, dtype=dtype))


@SETTINGS
@given(problems(dtype=torch.float32), st.sampled_from([torch.float32, torch.float16,
                                                       torch.bfloat16]), st.floats(0.1, 30.0))
def test_entropy_accepts_every_weights_attention_returns(problem, dtype, sharpness):
    """The distribution check (rows sum to one, or are all zero) never rejects real attention
    weights: any dtype, any temperature, fully masked rows included."""
    q, k, v, g = problem
    shape = scores_shape(q, k)
    mask = (torch.rand(shape, generator=g) < 0.7) & (torch.rand(shape[:-1], generator=g) < 0.8)[
        ..., None]
    _, weights = scaled_dot_product_attention((sharpness * q).to(dtype), k.to(dtype), v.to(dtype),
                                              mask)
    for fn in (attention_entropy, normalized_entropy, effective_keys, max_weight):
        assert torch.isfinite(fn(weights)).all()


@SETTINGS
@given(problems(), st.floats(2e-3, 0.5), st.booleans())
def test_entropy_rejects_rows_off_by_more_than_the_tolerance(problem, error, negative):
    q, k, v, _ = problem
    _, weights = scaled_dot_product_attention(q, k, v)
    bad = weights.clone()
    if negative and k.shape[-2] > 1:  # move mass so one entry goes below zero; sum still one
        bad[..., 0, 0] -= error + bad[..., 0, 0]
        bad[..., 0, -1] += error + weights[..., 0, 0]
    else:
        bad[..., 0, 0] += error
    with pytest.raises(ValueError, match="weights"):
        attention_entropy(bad)
