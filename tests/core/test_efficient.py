"""Tiled (FlashAttention) forward and backward, linear attention and its RNN view, and local
attention, against exact references (PyTorch's SDPA and autograd, explicit quadratic forms)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers import efficient as eff


def qkv(gen, *shape_qk, d_v=None, n_k=None, dtype=torch.float64):
    *batch, n, d = shape_qk
    n_k = n if n_k is None else n_k
    d_v = d if d_v is None else d_v
    return (torch.randn(*batch, n, d, generator=gen, dtype=dtype),
            torch.randn(*batch, n_k, d, generator=gen, dtype=dtype),
            torch.randn(*batch, n_k, d_v, generator=gen, dtype=dtype))


def test_tiled_huge_scores_do_not_overflow(gen):
    q, k, v = qkv(gen, 2, 50, 4, dtype=torch.float32)
    q = 300 * q  # scores in the thousands: a softmax without the running max overflows
    torch.testing.assert_close(eff.tiled_attention(q, k, v, block_size=8),
                               F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)


def sdpa_reference(q, k, v, causal, scale=None):
    """Output and log-sum-exp by plain autograd: PyTorch's SDPA, and logsumexp of the scores."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(~ah.causal_mask(q.shape[-2]), float("-inf"))
    return (F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
            torch.logsumexp(scores, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("n_q", "n_k", "causal", "block", "q_block"), [
    (37, 37, True, 16, None),    # n not a multiple of the block
    (64, 64, True, 16, 8),       # different query and key blocks
    (50, 50, False, 64, None),   # one block larger than n
    (23, 41, False, 8, 5),       # cross-attention, n_q != n_k
    (1, 9, False, 4, None),
])
def test_tiled_gradients_equal_sdpa_autograd(gen, dtype, n_q, n_k, causal, block, q_block):
    q, k, v = qkv(gen, 2, 3, n_q, 16, n_k=n_k, d_v=5, dtype=dtype)
    d_out = torch.randn(2, 3, n_q, 5, generator=gen, dtype=dtype)
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 1e-4}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = eff.tiled_attention(*leaves, block_size=block, query_block_size=q_block, causal=causal)
    got = torch.autograd.grad(out, leaves, d_out)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, _ = sdpa_reference(*ref_leaves, causal)
    expected = torch.autograd.grad(ref_out, ref_leaves, d_out)
    torch.testing.assert_close(out, ref_out, **tol)
    for name, g, e in zip("qkv", got, expected, strict=True):
        torch.testing.assert_close(g, e, **tol, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_return_lse_is_logsumexp_of_scaled_masked_scores(gen, causal, scale):
    q, k, v = (t.requires_grad_() for t in qkv(gen, 3, 45, 8))
    out, lse = eff.tiled_attention(q, k, v, block_size=16, causal=causal, return_lse=True, scale=scale)
    ref_out, ref_lse = sdpa_reference(q, k, v, causal, scale)
    assert lse.shape == (3, 45)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    # the gradient through lse alone is the softmax weights' contribution: P^T applied to Q, K
    weights = torch.randn(3, 45, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((lse * weights).sum(), (q, k)),
                               torch.autograd.grad((ref_lse * weights).sum(), (q, k)))


def test_broadcast_batch_gradients_are_summed_back(gen):
    q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
               for shape in ((4, 7, 8), (1, 11, 8), (11, 3)))
    got = torch.autograd.grad(eff.tiled_attention(q, k, v, block_size=4).square().sum(), (q, k, v))
    expected = torch.autograd.grad(ah.scaled_dot_product_attention(q, k, v)[0].square().sum(), (q, k, v))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_no_keys_give_zero_output_minus_inf_lse_and_zero_gradients(gen):
    q = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = torch.zeros(2, 0, 4, dtype=torch.float64), torch.zeros(2, 0, 3, dtype=torch.float64)
    out, lse = eff.tiled_attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros(2, 5, 3, dtype=torch.float64)) and torch.isneginf(lse).all()
    out.sum().backward()
    assert not q.grad.any()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 17), qblock=st.integers(1, 17),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_tiled_property_any_sizes(n, block, qblock, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv(g, n, 6, d_v=3)
    mask = ah.causal_mask(n) if causal else None
    torch.testing.assert_close(
        eff.tiled_attention(q, k, v, block_size=block, query_block_size=qblock, causal=causal),
        ah.scaled_dot_product_attention(q, k, v, mask)[0], atol=1e-12, rtol=1e-10)


def test_online_softmax_step_by_step_equals_softmax(gen):
    scores = 4 * torch.randn(3, 10, generator=gen, dtype=torch.float64)
    values = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    state = eff.init_state((), 3, 2, dtype=torch.float64)
    for start in range(0, 10, 3):
        state = eff.online_softmax_step(state, scores[:, start:start + 3], values[start:start + 3])
        seen = scores[:, :start + 3]
        torch.testing.assert_close(state.max, seen.amax(-1, keepdim=True))
        torch.testing.assert_close(state.total, torch.exp(seen - state.max).sum(-1, keepdim=True))
    torch.testing.assert_close(eff.finalize(state), torch.softmax(scores, -1) @ values)


@settings(max_examples=30, deadline=None)
@given(split=st.integers(1, 11), seed=st.integers(0, 2**16))
def test_merge_states_is_order_free(split, seed):
    g = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(4, 12, generator=g, dtype=torch.float64)
    values = torch.randn(12, 5, generator=g, dtype=torch.float64)
    a = eff.block_state(scores[:, :split], values[:split])
    b = eff.block_state(scores[:, split:], values[split:])
    expected = torch.softmax(scores, -1) @ values
    torch.testing.assert_close(eff.finalize(eff.merge_states(a, b)), expected)
    torch.testing.assert_close(eff.finalize(eff.merge_states(b, a)), expected)


def test_fully_masked_rows_give_zero_not_nan():
    scores = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, float("-inf")]], dtype=torch.float64)
    values = torch.eye(3, dtype=torch.float64)
    out = eff.finalize(eff.block_state(scores, values))
    assert torch.isfinite(out).all() and torch.equal(out[0], torch.zeros(3, dtype=torch.float64))


def linear_reference(q, k, v, causal):
    """Linear attention the slow way: explicit (n, n) kernel weights, normalised by rows."""
    weights = eff.elu_feature_map(q) @ eff.elu_feature_map(k).transpose(-2, -1)
    if causal:
        weights = weights * ah.causal_mask(q.shape[-2])
    return (weights / weights.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("n", [1, 50, 129])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_linear_attention_equals_its_quadratic_form(gen, n, causal, chunk):
    q, k, v = qkv(gen, 2, n, 8, d_v=3)
    torch.testing.assert_close(eff.linear_attention(q, k, v, causal=causal, chunk_size=chunk),
                               linear_reference(q, k, v, causal), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("n", [1, 10, 33])
@pytest.mark.parametrize("window", [1, 4, 40])
@pytest.mark.parametrize("causal", [True, False])
def test_local_attention_equals_masked_attention(gen, n, window, causal):
    q, k, v = qkv(gen, 2, n, 8, d_v=3)
    expected = ah.scaled_dot_product_attention(q, k, v, ah.sliding_window_mask(n, window, causal))[0]
    for block in (None, 3):
        torch.testing.assert_close(eff.local_attention(q, k, v, window, causal, block_size=block),
                                   expected, atol=1e-12, rtol=1e-10)


def test_linear_attention_rnn_view_equals_causal_linear_attention(gen):
    q, k, v = qkv(gen, 2, 3, 40, 8, d_v=5)
    expected = eff.linear_attention(q, k, v, causal=True)
    state = None
    for t in range(40):
        o_t, state = eff.linear_attention_step(state, q[..., t, :], k[..., t, :], v[..., t, :])
        torch.testing.assert_close(o_t, expected[..., t, :], atol=1e-12, rtol=1e-10)
        assert state.S.shape == (2, 3, 8, 5) and state.z.shape == (2, 3, 8)  # does not grow with t
    torch.testing.assert_close(state.S, eff.elu_feature_map(k).mT @ v)
    torch.testing.assert_close(state.z, eff.elu_feature_map(k).sum(-2))


def test_decoding_memory_kv_cache_grows_linear_state_does_not():
    sizes = [eff.decoding_memory(n, d_k=64, d_v=64, num_heads=8, num_layers=6) for n in (0, 1, 4096)]
    assert [s["kv_cache"] for s in sizes] == [0, 2 * 6 * 8 * 64 * 2, 4096 * 2 * 6 * 8 * 64 * 2]
    assert {s["linear_state"] for s in sizes} == {(64 * 64 + 64) * 8 * 6 * 2}  # S and z, per head


@pytest.mark.parametrize("causal", [False, True])
def test_backward_tiles_sum_to_autograd_gradients(gen, causal):
    """backward_tile over every key tile (all queries at once) gives autograd's dQ, dK, dV."""
    q, k, v = qkv(gen, 2, 19, 8, dtype=torch.float64)
    d_out = torch.randn(2, 19, 8, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sdpa_reference(*leaves, causal)
    out.backward(d_out)
    lse, D = lse.detach().unsqueeze(-1), (d_out * out.detach()).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, 19, 5):
        mask = ah.causal_mask(19)[:, j:j + 5] if causal else None
        dq_j, dk[:, j:j + 5], dv[:, j:j + 5] = eff.backward_tile(q, k[:, j:j + 5], v[:, j:j + 5], d_out,
                                                             lse, D, mask=mask)
        dq += dq_j
    for got, leaf in zip((dq, dk, dv), leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, atol=1e-12, rtol=1e-10)
