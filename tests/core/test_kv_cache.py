"""The KV cache: incremental decoding equals full causal attention, and the work it counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.attention import scaled_dot_product_attention
from attn_helpers.kv_cache import KVCache, decode_with_cache
from attn_helpers.masks import causal_mask


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), d_k=st.integers(1, 6),
       d_v=st.integers(1, 5), batch=st.sampled_from([(), (2,), (2, 3)]))
def test_decode_with_cache_equals_full_causal_attention(seed, n, d_k, d_v, batch):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(*batch, n, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, n, d_v, generator=g, dtype=torch.float64)
    output, counts = decode_with_cache(q, k, v)
    full, _ = scaled_dot_product_attention(q, k, v, causal_mask(n))
    assert torch.allclose(output, full, atol=1e-12)
    assert torch.allclose(output, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12)
    assert counts == list(range(1, n + 1))


def test_cache_blocks_are_causal_within_the_block(gen):
    q, k, v = (torch.randn(2, 7, 4, generator=gen) for _ in range(3))
    cache = KVCache()
    cache.append(k[:, :3], v[:, :3])
    first, _ = cache.attend(q[:, :3])
    cache.append(k[:, 3:], v[:, 3:])
    second, weights = cache.attend(q[:, 3:])
    full, full_weights = scaled_dot_product_attention(q, k, v, causal_mask(7))
    assert len(cache) == 7 and cache.score_counts == [9, 28]
    assert torch.allclose(torch.cat([first, second], 1), full, atol=1e-6)
    assert weights.shape == (2, 4, 7) and torch.allclose(weights, full_weights[:, 3:], atol=1e-6)
    assert torch.all(weights[:, 0, 4:] == 0)


def test_cache_reset_and_repr(gen):
    cache = KVCache()
    assert len(cache) == 0 and "empty" in repr(cache)
    cache.append(torch.randn(1, 2, generator=gen), torch.randn(1, 3, generator=gen))
    assert "len=1" in repr(cache)
    cache.attend(torch.randn(1, 2, generator=gen))
    cache.reset()
    assert len(cache) == 0 and cache.score_counts == []


def test_total_work_is_quadratic_step_work_linear():
    n = 64
    _, counts = decode_with_cache(*(torch.zeros(n, 2) for _ in range(3)))
    assert counts[-1] == n and sum(counts) == n * (n + 1) // 2
    assert all(b - a == 1 for a, b in zip(counts, counts[1:], strict=False))


def test_cache_bad_inputs(gen):
    cache = KVCache()
    with pytest.raises(ValueError, match="empty"):
        cache.attend(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="k_new and v_new"):
        cache.append(torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(TypeError, match="k_new"):
        cache.append([0.0], torch.zeros(1, 4))
    cache.append(torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="do not fit"):
        cache.append(torch.zeros(1, 5), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="only 2 positions"):
        cache.attend(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="d_k"):
        cache.attend(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="q, k and v"):
        decode_with_cache(torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(4, 2))
