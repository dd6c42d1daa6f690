"""Tiled (FlashAttention), linear and local attention against exact references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers.efficient import (
    OnlineSoftmaxState,
    block_state,
    elu_feature_map,
    finalize,
    init_state,
    linear_attention,
    local_attention,
    merge_states,
    online_softmax_step,
    tiled_attention,
)


def qkv(gen, *shape_qk, d_v=None, n_k=None, dtype=torch.float64):
    *batch, n, d = shape_qk
    n_k = n if n_k is None else n_k
    d_v = d if d_v is None else d_v
    return (torch.randn(*batch, n, d, generator=gen, dtype=dtype),
            torch.randn(*batch, n_k, d, generator=gen, dtype=dtype),
            torch.randn(*batch, n_k, d_v, generator=gen, dtype=dtype))


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 130])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_equals_exact_attention_float64(gen, n, causal):
    q, k, v = qkv(gen, 2, 3, n, 16, d_v=5)
    mask = ah.causal_mask(n) if causal else None
    expected = ah.scaled_dot_product_attention(q, k, v, mask)[0]
    got = tiled_attention(q, k, v, block_size=16, causal=causal)
    assert got.shape == expected.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)


def test_tiled_float32_matches_torch_sdpa_with_uneven_blocks(gen):
    q, k, v = qkv(gen, 1, 8, 300, 64, dtype=torch.float32)
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        got = tiled_attention(q, k, v, block_size=128, query_block_size=96, causal=causal)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_tiled_cross_attention_and_broadcast_batch(gen):
    q = torch.randn(4, 7, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 11, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 11, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(tiled_attention(q, k, v, block_size=4),
                               ah.scaled_dot_product_attention(q, k, v)[0])


def test_tiled_large_scores_do_not_overflow(gen):
    q, k, v = qkv(gen, 2, 50, 4, dtype=torch.float32)
    q = q * 300  # scores in the thousands: a softmax without the running max overflows
    got = tiled_attention(q, k, v, block_size=8)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)


def test_tiled_never_holds_more_than_one_block_of_scores(gen, monkeypatch):
    """Every score tensor the tiled loop creates is one (query block, key block) tile."""
    import attn_helpers.efficient as eff

    seen = []
    real_step = eff._step

    def spy(state, scores, values, *, in_place):
        seen.append(tuple(scores.shape[-2:]))
        return real_step(state, scores, values, in_place=in_place)

    monkeypatch.setattr(eff, "_step", spy)
    q, k, v = qkv(gen, 100, 8)
    eff.tiled_attention(q, k, v, block_size=32, query_block_size=16)
    assert seen and all(rows <= 16 and cols <= 32 for rows, cols in seen)
    assert len(seen) == math.ceil(100 / 16) * math.ceil(100 / 32)


def test_causal_tiled_skips_future_blocks(gen, monkeypatch):
    import attn_helpers.efficient as eff

    calls = []
    real_step = eff._step
    monkeypatch.setattr(eff, "_step", lambda *a, **kw: calls.append(1) or real_step(*a, **kw))
    q, k, v = qkv(gen, 64, 4)
    eff.tiled_attention(q, k, v, block_size=16, causal=True)
    assert len(calls) == 4 * 5 // 2  # only the blocks on and below the diagonal


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 17), qblock=st.integers(1, 17),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_tiled_property_any_sizes(n, block, qblock, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv(g, n, 6, d_v=3)
    mask = ah.causal_mask(n) if causal else None
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=block, query_block_size=qblock, causal=causal),
        ah.scaled_dot_product_attention(q, k, v, mask)[0], atol=1e-12, rtol=1e-10)


def test_online_softmax_step_by_step_equals_softmax(gen):
    scores = 4 * torch.randn(3, 10, generator=gen, dtype=torch.float64)
    values = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    state = init_state((), 3, 2, dtype=torch.float64)
    for start in range(0, 10, 3):
        before = scores.clone()
        state = online_softmax_step(state, scores[:, start:start + 3], values[start:start + 3])
        assert torch.equal(scores, before)  # the public step leaves its input alone
        seen = scores[:, :start + 3]
        torch.testing.assert_close(state.max, seen.amax(-1, keepdim=True))
        torch.testing.assert_close(state.total, torch.exp(seen - state.max).sum(-1, keepdim=True))
    torch.testing.assert_close(finalize(state), torch.softmax(scores, -1) @ values)


@settings(max_examples=30, deadline=None)
@given(split=st.integers(1, 11), seed=st.integers(0, 2**16))
def test_merge_states_is_order_free(split, seed):
    g = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(4, 12, generator=g, dtype=torch.float64)
    values = torch.randn(12, 5, generator=g, dtype=torch.float64)
    a = block_state(scores[:, :split], values[:split])
    b = block_state(scores[:, split:], values[split:])
    expected = torch.softmax(scores, -1) @ values
    torch.testing.assert_close(finalize(merge_states(a, b)), expected)
    torch.testing.assert_close(finalize(merge_states(b, a)), expected)


def test_fully_masked_rows_give_zero_not_nan():
    scores = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, float("-inf")]], dtype=torch.float64)
    values = torch.eye(3, dtype=torch.float64)
    out = finalize(block_state(scores, values))
    assert torch.isfinite(out).all() and torch.equal(out[0], torch.zeros(3, dtype=torch.float64))


def linear_reference(q, k, v, causal):
    """Linear attention the slow way: explicit (n, n) kernel weights, normalised by rows."""
    weights = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)
    if causal:
        weights = weights * ah.causal_mask(q.shape[-2])
    return (weights / weights.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("n", [1, 7, 129])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_its_quadratic_form(gen, n, causal):
    q, k, v = qkv(gen, 2, n, 8, d_v=3)
    torch.testing.assert_close(linear_attention(q, k, v, causal, chunk_size=32),
                               linear_reference(q, k, v, causal), atol=1e-12, rtol=1e-10)


def test_linear_attention_features_are_positive_and_rows_are_convex(gen):
    x = 3 * torch.randn(50, generator=gen, dtype=torch.float64)
    assert (elu_feature_map(x) > 0).all()
    q, k, _ = qkv(gen, 9, 4)
    out = linear_attention(q, k, torch.eye(9, dtype=torch.float64))  # output = weights
    torch.testing.assert_close(out.sum(-1), torch.ones(9, dtype=torch.float64))
    assert (out > 0).all()


def test_linear_attention_is_not_softmax_attention(gen):
    q, k, v = qkv(gen, 16, 8)
    gap = (linear_attention(q, k, v) - ah.scaled_dot_product_attention(q, k, v)[0]).abs().max()
    assert gap > 1e-2


@pytest.mark.parametrize("n", [1, 10, 33])
@pytest.mark.parametrize("window", [1, 4, 40])
@pytest.mark.parametrize("causal", [True, False])
def test_local_attention_equals_masked_attention(gen, n, window, causal):
    q, k, v = qkv(gen, 2, n, 8, d_v=3)
    expected = ah.scaled_dot_product_attention(q, k, v, ah.sliding_window_mask(n, window, causal))[0]
    for block in (None, 3):
        torch.testing.assert_close(local_attention(q, k, v, window, causal, block_size=block),
                                   expected, atol=1e-12, rtol=1e-10)


def test_local_attention_float32_matches_torch(gen):
    q, k, v = qkv(gen, 1, 2, 200, 16, dtype=torch.float32)
    mask = ah.sliding_window_mask(200, 24, causal=True)
    torch.testing.assert_close(local_attention(q, k, v, 24),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fn", [
    lambda q, k, v: tiled_attention(q, k, v),
    lambda q, k, v: linear_attention(q, k, v),
    lambda q, k, v: local_attention(q, k, v, 4),
])
def test_bad_inputs_name_the_argument(gen, fn):
    q, k, v = qkv(gen, 6, 4)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        fn([[1.0]], k, v)
    with pytest.raises(ValueError, match="d_k"):
        fn(q, k[..., :3], v)
    with pytest.raises(ValueError, match="n_k"):
        fn(q, k, v[:5])
    with pytest.raises(ValueError, match=r"at least 2 dimensions"):
        fn(q[0], k, v)
    with pytest.raises(TypeError, match="dtype"):
        fn(q.float(), k, v)


def test_bad_options(gen):
    q, k, v = qkv(gen, 6, 4)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        tiled_attention(q, k, v, block_size=2.5)
    with pytest.raises(ValueError, match="n_q == n_k"):
        tiled_attention(q, k[:4], v[:4], causal=True)
    with pytest.raises(ValueError, match="window"):
        local_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="n_q == n_k"):
        local_attention(q[:3], k, v, 2)
    with pytest.raises(ValueError, match="n_q == n_k"):
        linear_attention(q[:3], k, v, causal=True)
    with pytest.raises(TypeError, match="causal"):
        linear_attention(q, k, v, causal="yes")
    with pytest.raises(TypeError, match="state"):
        online_softmax_step((1, 2, 3), q, v)
    state = init_state((), 6, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="block size"):
        online_softmax_step(state, q @ k.T, v[:5])
    assert isinstance(state, OnlineSoftmaxState)
