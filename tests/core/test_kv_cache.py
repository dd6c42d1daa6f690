"""The KV cache against full causal attention (torch's SDPA): outputs, work, memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.kv_cache import (
    KVCache,
    decode_with_cache,
    generate_with_cache,
    generate_without_cache,
    kv_cache_bytes,
)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), d_k=st.integers(1, 6),
       d_v=st.integers(1, 5), batch=st.sampled_from([(), (2,), (2, 3)]),
       scale=st.sampled_from([None, 0.3]))
def test_decode_with_cache_equals_full_causal_attention(seed, n, d_k, d_v, batch, scale):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*batch, n, d, generator=g, dtype=torch.float64) for d in (d_k, d_k, d_v))
    output, counts = decode_with_cache(q, k, v, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    assert torch.allclose(output, expected, atol=1e-12) and counts == list(range(1, n + 1))


@pytest.mark.parametrize("t", [1, 4])
def test_attend_costs_O_L_per_new_token_not_an_L_by_L_mask(t):
    """One decoding step allocates nothing larger than the (t, L) scores: no (L, L) causal mask."""
    L = 2048
    cache = KVCache(L)
    cache.append(torch.zeros(L, 8), torch.zeros(L, 8))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as profile:
        cache.attend(torch.zeros(t, 8))
    assert max(event.cpu_memory_usage for event in profile.events()) <= 4 * t * L  # float32


def test_cache_bytes_reset_and_a_new_shape(gen):
    # one layer, batch 1, g = 2 kv heads of 8, 16 positions preallocated, float16: the formula's bytes
    cache = KVCache(16)
    assert cache.nbytes == 0 and cache.keys is None
    cache.append(torch.randn(1, 2, 1, 8, generator=gen).half(), torch.randn(1, 2, 1, 8).half())
    assert cache.nbytes == kv_cache_bytes(16, num_layers=1, num_kv_heads=2, head_dim=8) == 1024
    assert len(cache) == 1 and cache.keys.shape == (1, 2, 1, 8)
    cache.reset()
    assert len(cache) == 0 and cache.score_counts == [] and cache.keys is None
    cache.append(torch.randn(3, 2, 5, generator=gen), torch.randn(3, 2, 5, generator=gen))
    assert cache.keys.shape == (3, 2, 5)


@pytest.mark.parametrize("n, d_model, d_k, d_v", [(1, 4, 3, 2), (17, 8, 4, 6), (40, 16, 16, 16)])
def test_generation_with_and_without_cache_equal_torch(gen, n, d_model, d_k, d_v):
    x = torch.randn(n, d_model, generator=gen, dtype=torch.float64)
    w_q, w_k = (torch.randn(d_model, d_k, generator=gen, dtype=torch.float64) for _ in range(2))
    w_v = torch.randn(d_model, d_v, generator=gen, dtype=torch.float64)
    reference = F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, is_causal=True)
    for generate in (generate_with_cache, generate_without_cache):
        torch.testing.assert_close(generate(x, w_q, w_k, w_v), reference, atol=1e-12, rtol=1e-10)
