"""MultiHeadAttention against torch.nn.MultiheadAttention and (grouped-query) against
F.scaled_dot_product_attention(enable_gqa=True); split/merge; parameter counts; bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.kv_cache import KVCache
from attn_helpers.masks import causal_mask, key_padding_to_attention_mask, padding_mask
from attn_helpers.multihead import (
    MultiHeadAttention,
    merge_heads,
    parameter_count,
    split_heads,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)


def offset_causal(n_q: int, n_k: int) -> torch.Tensor:
    """``(n_q, n_k)`` causal-style mask, True = may attend; every row keeps key 0."""
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    return j <= torch.clamp(i + (n_k - n_q), min=0)


def compare_with_torch(*, b, h, d_head, n_q, n_k, kdim, vdim, batch_first, bias, use_mask,
                       use_padding, seed, dtype=torch.float32, atol=1e-5):
    d_model = h * d_head
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    reference = torch.nn.MultiheadAttention(d_model, h, bias=bias, kdim=kdim, vdim=vdim,
                                            batch_first=batch_first, dtype=dtype).eval()
    with torch.no_grad():  # non-zero biases, so a mix-up of biases would show
        for name, p in reference.named_parameters():
            if "bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=dtype))
    query, key, value = (torch.randn(b, n, d or d_model, generator=g, dtype=dtype)
                         for n, d in ((n_q, d_model), (n_k, kdim), (n_k, vdim)))
    causal = offset_causal(n_q, n_k) if use_mask else None
    real = padding_mask(torch.randint(1, n_k + 1, (b,), generator=g), n_k) if use_padding else None
    mask = causal
    if real is not None:
        padding = key_padding_to_attention_mask(real)
        mask = padding if causal is None else causal & padding
    out, weights = MultiHeadAttention.from_torch(reference)(query, key, value, mask)
    args = [query, key, value] if batch_first else [t.transpose(0, 1) for t in (query, key, value)]
    t_out, t_weights = reference(
        *args, attn_mask=None if causal is None else to_torch_attn_mask(causal),
        key_padding_mask=None if real is None else to_torch_key_padding_mask(real),
        average_attn_weights=False)
    t_out = t_out if batch_first else t_out.transpose(0, 1)
    assert out.shape == (b, n_q, d_model) and weights.shape == (b, h, n_q, n_k)
    torch.testing.assert_close(out, t_out, atol=atol, rtol=1e-4)
    torch.testing.assert_close(weights, t_weights, atol=atol, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 4), h=st.integers(1, 8), d_head=st.integers(1, 6), n_q=st.integers(1, 7),
    n_k=st.integers(1, 7), kdim=st.one_of(st.none(), st.integers(1, 9)),
    vdim=st.one_of(st.none(), st.integers(1, 9)), batch_first=st.booleans(), bias=st.booleans(),
    use_mask=st.booleans(), use_padding=st.booleans(), seed=st.integers(0, 10_000),
)
def test_equals_torch_random_configurations(**config):
    compare_with_torch(**config)


def test_equals_torch_in_float64_to_high_precision():
    compare_with_torch(b=2, h=4, d_head=8, n_q=6, n_k=9, kdim=5, vdim=7, batch_first=False, bias=True,
                       use_mask=True, use_padding=True, seed=3, dtype=torch.float64, atol=1e-12)


def test_head_mask_switches_off_exactly_one_head(gen):
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 4, 12, generator=gen)
    full, weights = mha(x, x, x)
    same, _ = mha(x, x, x, head_mask=torch.ones(3))
    torch.testing.assert_close(full, same)
    keep = torch.tensor([True, False, True])
    ablated, ablated_weights = mha(x, x, x, head_mask=keep)
    heads = merge_heads(weights @ split_heads(mha.v_proj(x), 3))
    heads[..., 4:8] = 0
    torch.testing.assert_close(ablated, mha.out_proj(heads))
    torch.testing.assert_close(ablated_weights, weights)  # the pattern itself is unchanged


def reference_gqa(mha, query, key, value, mask):
    """torch's fused attention with ``enable_gqa=True`` on our module's projections, and the
    weights computed independently with the K/V heads repeated (head i uses kv head i // (h/g))."""
    b, n_q, _ = query.shape
    n_k, h, g, d = key.shape[1], mha.num_heads, mha.num_kv_heads, mha.d_head
    q = mha.q_proj(query).view(b, n_q, h, d).transpose(1, 2)
    k = mha.k_proj(key).view(b, n_k, g, d).transpose(1, 2)
    v = mha.v_proj(value).view(b, n_k, g, d).transpose(1, 2)
    attn_mask = None if mask is None else mask.expand(b, h, n_q, n_k)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
    output = mha.out_proj(heads.transpose(1, 2).reshape(b, n_q, h * d))
    scores = q @ k.repeat_interleave(h // g, dim=1).transpose(-2, -1) / d**0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return output, scores.softmax(-1)


def random_mask(kind, b, h, n_q, n_k, g):
    if kind is None:
        return None, None
    if kind == "causal":
        mask = offset_causal(n_q, n_k)                                  # (n_q, n_k)
        return mask, mask
    if kind == "padding":
        real = padding_mask(torch.randint(1, n_k + 1, (b,), generator=g), n_k)
        return key_padding_to_attention_mask(real), real[:, None, None, :]  # (b, 1, n_k)
    mask = torch.rand(b, h, n_q, n_k, generator=g) > 0.5                # per head
    mask[..., 0] = True
    return mask, mask


@settings(max_examples=40, deadline=None)
@given(data=st.data(), b=st.integers(1, 3), h=st.integers(1, 8), d_head=st.integers(1, 5),
       n_q=st.integers(1, 6), n_k=st.integers(1, 6), kdim=st.one_of(st.none(), st.integers(1, 9)),
       vdim=st.one_of(st.none(), st.integers(1, 9)), bias=st.booleans(),
       mask_kind=st.sampled_from([None, "causal", "padding", "per-head"]), seed=st.integers(0, 999))
def test_grouped_query_equals_torch_enable_gqa(data, b, h, d_head, n_q, n_k, kdim, vdim, bias,
                                               mask_kind, seed):
    g_kv = data.draw(st.sampled_from([g for g in range(1, h + 1) if h % g == 0]), label="g")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d_model = h * d_head
    mha = MultiHeadAttention(d_model, h, num_kv_heads=g_kv, bias=bias, kdim=kdim, vdim=vdim)
    query = torch.randn(b, n_q, d_model, generator=g)
    key = torch.randn(b, n_k, kdim or d_model, generator=g)
    value = torch.randn(b, n_k, vdim or d_model, generator=g)
    ours_mask, torch_mask = random_mask(mask_kind, b, h, n_q, n_k, g)
    out, weights = mha(query, key, value, ours_mask)
    ref_out, ref_weights = reference_gqa(mha, query, key, value, torch_mask)
    assert out.shape == (b, n_q, d_model) and weights.shape == (b, h, n_q, n_k)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("grouped", [False, True])
def test_gradients_equal_torch(gen, grouped):
    """Against nn.MultiheadAttention's autograd, and grouped against F.sdpa(enable_gqa=True)'s."""
    if grouped:
        ours = MultiHeadAttention(16, 4, num_kv_heads=2, kdim=6, vdim=3)

        def reference(q, k, v):
            return reference_gqa(ours, q, k, v, None)
    else:
        reference = torch.nn.MultiheadAttention(16, 4, kdim=6, vdim=3, batch_first=True)
        ours = MultiHeadAttention.from_torch(reference)
    q, k, v = (torch.randn(2, n, d, generator=gen, requires_grad=True)
               for n, d in ((3, 16), (5, 6), (5, 3)))
    mine = torch.autograd.grad(ours(q, k, v)[0].square().sum(), (q, k, v))
    theirs = torch.autograd.grad(reference(q, k, v)[0].square().sum(), (q, k, v))
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_grouped_query_heads_never_copy_keys_and_values():
    """Multi-query attention over 4096 keys: no allocation is as large as K repeated for h heads."""
    b, h, d_head, n_k = 2, 8, 64, 4096
    mqa = MultiHeadAttention(h * d_head, h, num_kv_heads=1).eval()
    query, key = torch.randn(b, 3, h * d_head), torch.randn(b, n_k, h * d_head)
    with torch.no_grad(), torch.profiler.profile(profile_memory=True) as profile:
        mqa(query, key, key)
    assert max(event.cpu_memory_usage for event in profile.events()) < b * h * n_k * d_head * 4


@pytest.mark.parametrize("g_kv", [1, 2, 4])
def test_incremental_decoding_with_a_cache_equals_the_causal_forward(gen, g_kv):
    mha = MultiHeadAttention(16, 4, num_kv_heads=g_kv).double()
    x = torch.randn(2, 7, 16, generator=gen, dtype=torch.float64)
    full, full_weights = mha(x, x, x, causal_mask(7))
    cache = KVCache(7)
    prefill, _ = mha(x[:, :3], x[:, :3], x[:, :3], cache=cache)     # the prompt as one block
    steps = [mha(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat([prefill] + [o for o, _ in steps], 1), full)
    torch.testing.assert_close(steps[-1][1], full_weights[:, :, 6:])
    assert cache.keys.shape == (2, g_kv, 7, 4)                      # g heads cached, not h
    assert cache.score_counts == [9, 4, 5, 6, 7]


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 6), h=st.integers(1, 6), d_head=st.integers(1, 5))
def test_split_merge_are_inverse_and_split_takes_consecutive_features(b, n, h, d_head):
    x = torch.randn(b, n, h * d_head)
    heads = split_heads(x, h)
    assert heads.shape == (b, h, n, d_head)
    for i in range(h):
        assert torch.equal(heads[:, i], x[..., i * d_head:(i + 1) * d_head])
    assert torch.equal(merge_heads(heads), x)
    assert torch.equal(split_heads(merge_heads(heads), h), heads)


@pytest.mark.parametrize("d_model, h, g_kv, kdim, vdim, bias", [
    (768, 12, None, None, None, True), (6, 3, None, 2, 5, False), (64, 8, 2, None, None, True),
    (64, 8, 1, 32, 16, False),
])
def test_parameter_count_matches_the_module_and_torch(d_model, h, g_kv, kdim, vdim, bias):
    kwargs = {"bias": bias, "kdim": kdim, "vdim": vdim}
    ours = MultiHeadAttention(d_model, h, num_kv_heads=g_kv, **kwargs)
    d_kv = (g_kv or h) * (d_model // h)                     # num_kv_heads defaults to num_heads
    assert (ours.num_kv_heads, ours.d_head) == (g_kv or h, d_model // h)
    assert ours.k_proj.weight.shape == (d_kv, kdim or d_model)
    expected = sum(p.numel() for p in ours.parameters())
    assert parameter_count(d_model, h, num_kv_heads=g_kv, **kwargs) == expected
    if g_kv is None:
        reference = torch.nn.MultiheadAttention(d_model, h, **kwargs)
        assert sum(p.numel() for p in reference.parameters()) == expected

