"""The KV cache: preallocated, incremental decoding equals full causal attention, the work it counts,
the memory formula, and generation with and without a cache."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.attention import scaled_dot_product_attention
from attn_helpers.kv_cache import (
    KVCache,
    decode_with_cache,
    generate_with_cache,
    generate_without_cache,
    kv_cache_bytes,
)
from attn_helpers.masks import causal_mask

# --- the cache ---------------------------------------------------------------------------------


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


def test_decode_with_cache_passes_the_scale_on(gen):
    q, k, v = (torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    output, _ = decode_with_cache(q, k, v, scale=0.3)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert torch.allclose(output, reference, atol=1e-12)


def test_cache_blocks_are_causal_within_the_block(gen):
    q, k, v = (torch.randn(2, 7, 4, generator=gen) for _ in range(3))
    cache = KVCache(7)
    cache.append(k[:, :3], v[:, :3])
    first, _ = cache.attend(q[:, :3])
    cache.append(k[:, 3:], v[:, 3:])
    second, weights = cache.attend(q[:, 3:])
    full, full_weights = scaled_dot_product_attention(q, k, v, causal_mask(7))
    assert len(cache) == 7 and cache.score_counts == [9, 28]
    assert torch.allclose(torch.cat([first, second], 1), full, atol=1e-6)
    assert weights.shape == (2, 4, 7) and torch.allclose(weights, full_weights[:, 3:], atol=1e-6)
    assert torch.all(weights[:, 0, 4:] == 0)


def test_cache_is_preallocated_and_never_reallocates(gen):
    cache = KVCache(6)
    assert cache.nbytes == 0 and cache.keys is None
    cache.append(torch.randn(2, 1, 4, generator=gen), torch.randn(2, 1, 3, generator=gen))
    buffer = cache._keys.data_ptr()
    assert cache._keys.shape == (2, 6, 4) and cache._values.shape == (2, 6, 3)
    assert cache.nbytes == 4 * 2 * 6 * (4 + 3)
    for _ in range(5):
        cache.append(torch.randn(2, 1, 4, generator=gen), torch.randn(2, 1, 3, generator=gen))
    assert len(cache) == 6 and cache._keys.data_ptr() == buffer       # written in place
    assert cache.keys.shape == (2, 6, 4) and cache.keys.data_ptr() == buffer


def test_cache_keys_and_values_hold_what_was_appended(gen):
    k, v = torch.randn(3, 5, 2, generator=gen), torch.randn(3, 5, 4, generator=gen)
    cache = KVCache(8)
    cache.append(k[:, :2], v[:, :2])
    cache.append(k[:, 2:], v[:, 2:])
    assert torch.equal(cache.keys, k) and torch.equal(cache.values, v)


def test_cache_memory_is_the_formula_for_one_layer(gen):
    # one layer, batch 1, g = 2 kv heads of 8, 16 positions, float16: 2 * 2 * 8 * 2 * 16 bytes
    cache = KVCache(16)
    cache.append(torch.randn(1, 2, 1, 8, generator=gen).half(), torch.randn(1, 2, 1, 8).half())
    assert cache.nbytes == kv_cache_bytes(16, num_layers=1, num_kv_heads=2, head_dim=8) == 1024


def test_cache_reset_keeps_the_buffer_and_reallocates_for_new_shapes(gen):
    cache = KVCache(4)
    assert len(cache) == 0 and "empty" in repr(cache)
    cache.append(torch.randn(1, 2, generator=gen), torch.randn(1, 3, generator=gen))
    assert "len=1" in repr(cache) and "max_len=4" in repr(cache)
    cache.attend(torch.randn(1, 2, generator=gen))
    buffer = cache._keys.data_ptr()
    cache.reset()
    assert len(cache) == 0 and cache.score_counts == [] and cache.keys is None
    cache.append(torch.randn(2, 2, generator=gen), torch.randn(2, 3, generator=gen))
    assert cache._keys.data_ptr() == buffer and len(cache) == 2
    cache.reset()
    cache.append(torch.randn(3, 1, 5, generator=gen), torch.randn(3, 1, 5, generator=gen))
    assert cache.keys.shape == (3, 1, 5)


def test_cache_queries_broadcast_over_grouped_heads(gen):
    # (b, g, 1, L, d) cached, (b, g, h/g, t, d) queries: every head of a group uses the same K, V
    k, v = torch.randn(2, 2, 1, 5, 4, generator=gen), torch.randn(2, 2, 1, 5, 4, generator=gen)
    q = torch.randn(2, 2, 3, 5, 4, generator=gen)
    cache = KVCache(5)
    cache.append(k, v)
    output, weights = cache.attend(q)
    reference, _ = scaled_dot_product_attention(q, k.expand(2, 2, 3, 5, 4),
                                                v.expand(2, 2, 3, 5, 4), causal_mask(5))
    assert output.shape == (2, 2, 3, 5, 4) and weights.shape == (2, 2, 3, 5, 5)
    assert torch.allclose(output, reference, atol=1e-6)


def test_total_work_is_quadratic_step_work_linear():
    n = 64
    _, counts = decode_with_cache(*(torch.zeros(n, 2) for _ in range(3)))
    assert counts[-1] == n and sum(counts) == n * (n + 1) // 2
    assert all(b - a == 1 for a, b in zip(counts, counts[1:], strict=False))


def test_cache_bad_inputs(gen):
    with pytest.raises(TypeError, match="max_len must be an int"):
        KVCache(4.0)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        KVCache(0)
    cache = KVCache(3)
    with pytest.raises(ValueError, match="empty"):
        cache.attend(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="k_new and v_new"):
        cache.append(torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="k_new and v_new"):
        cache.append(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="k_new"):
        cache.append([0.0], torch.zeros(1, 4))
    cache.append(torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="do not fit"):
        cache.append(torch.zeros(1, 5), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"t <= the 2 cached positions"):
        cache.attend(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="d_k"):
        cache.attend(torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"full: it holds 2 of max_len=3.*t=2"):
        cache.append(torch.zeros(2, 4), torch.zeros(2, 3))
    cache.append(torch.zeros(1, 4), torch.zeros(1, 3))                    # exactly full is fine
    assert len(cache) == 3
    with pytest.raises(ValueError, match="q, k and v"):
        decode_with_cache(torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(4, 2))


def test_absurd_cache_is_refused_before_allocating():
    cache = KVCache(10**9)
    with pytest.raises(ValueError, match=r"max_len=1000000000.*bytes"):
        cache.append(torch.zeros(8, 1, 64), torch.zeros(8, 1, 64))
    assert cache.nbytes == 0


# --- the memory formula ------------------------------------------------------------------------


def test_llama_2_7b_sized_cache_is_half_a_mebibyte_per_token():
    per_token = kv_cache_bytes(1, num_layers=32, num_kv_heads=32, head_dim=128)
    assert per_token == 524_288 == 2**19                                 # 0.5 MiB in fp16
    assert kv_cache_bytes(4096, num_layers=32, num_kv_heads=32, head_dim=128) == 2 * 2**30
    grouped = kv_cache_bytes(1, num_layers=32, num_kv_heads=8, head_dim=128)
    assert grouped * 4 == per_token                                      # 8 kv heads: 4x less
    assert kv_cache_bytes(1, num_layers=32, num_kv_heads=32, head_dim=128,
                          bytes_per_value=4) == 2 * per_token           # float32: twice
    assert kv_cache_bytes(0, num_layers=32, num_kv_heads=8, head_dim=128) == 0


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 10**6), layers=st.integers(1, 100), g=st.integers(1, 64),
       d=st.integers(1, 256), bpv=st.sampled_from([1, 2, 4, 8]))
def test_kv_cache_bytes_is_the_formula(n, layers, g, d, bpv):
    got = kv_cache_bytes(n, num_layers=layers, num_kv_heads=g, head_dim=d, bytes_per_value=bpv)
    assert type(got) is int and got == 2 * layers * g * d * bpv * n


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(n_tokens=-1), ValueError, "n_tokens must be >= 0"),
    (dict(n_tokens=1.5), TypeError, "n_tokens must be an int"),
    (dict(num_layers=0), ValueError, "num_layers must be >= 1"),
    (dict(num_kv_heads=True), TypeError, "num_kv_heads must be an int"),
    (dict(head_dim=-3), ValueError, "head_dim must be >= 1"),
    (dict(bytes_per_value=0), ValueError, "bytes_per_value must be >= 1"),
])
def test_kv_cache_bytes_bad_arguments(kwargs, error, pattern):
    args = dict(n_tokens=10, num_layers=2, num_kv_heads=2, head_dim=4) | kwargs
    n_tokens = args.pop("n_tokens")
    with pytest.raises(error, match=pattern):
        kv_cache_bytes(n_tokens, **args)


def test_kv_cache_bytes_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        kv_cache_bytes(1, 32, 32, 128)


# --- generation of one attention layer, with and without a cache --------------------------------


def reference_generation(x, w_q, w_k, w_v):
    """Step t re-runs the whole prefix through torch's fused causal attention; keep the last row."""
    rows = []
    for t in range(x.shape[0]):
        prefix = x[: t + 1]
        out = F.scaled_dot_product_attention(prefix @ w_q, prefix @ w_k, prefix @ w_v, is_causal=True)
        rows.append(out[-1])
    return torch.stack(rows)


@pytest.mark.parametrize("n, d_model, d_k, d_v", [(1, 4, 3, 2), (17, 8, 4, 6), (40, 16, 16, 16)])
def test_generation_with_and_without_cache_equal_torch(gen, n, d_model, d_k, d_v):
    x = torch.randn(n, d_model, generator=gen, dtype=torch.float64)
    w_q, w_k = (torch.randn(d_model, d_k, generator=gen, dtype=torch.float64) for _ in range(2))
    w_v = torch.randn(d_model, d_v, generator=gen, dtype=torch.float64)
    reference = reference_generation(x, w_q, w_k, w_v)
    with_cache, without = generate_with_cache(x, w_q, w_k, w_v), generate_without_cache(x, w_q, w_k, w_v)
    assert with_cache.shape == without.shape == (n, d_v)
    torch.testing.assert_close(with_cache, reference, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(without, reference, atol=1e-12, rtol=1e-10)
    # and both equal one causal pass over the whole sequence
    full = F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, is_causal=True)
    torch.testing.assert_close(with_cache, full, atol=1e-12, rtol=1e-10)


def test_generation_bad_inputs():
    x, w = torch.zeros(3, 4), torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"x must be 2-D.*\(3,\)"):
        generate_with_cache(torch.zeros(3), w, w, w)
    with pytest.raises(ValueError, match=r"w_k must have shape \(d_model=4, d\), got \(5, 2\)"):
        generate_without_cache(x, w, torch.zeros(5, 2), w)
    with pytest.raises(ValueError, match="same d_k"):
        generate_with_cache(x, w, torch.zeros(4, 3), w)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        generate_without_cache(x.long(), w, w, w)


# --- bad input at each entry point (issue 17's fuzz findings) ----------------------------------


def test_attend_names_q_new_when_its_batch_dims_do_not_fit(gen):
    cache = KVCache(8)
    cache.append(torch.randn(2, 3, 4, generator=gen), torch.randn(2, 3, 6, generator=gen))
    with pytest.raises(ValueError, match=r"q_new \(0, 1, 4\), the cache's keys \(2, 3, 4\) do not"):
        cache.attend(torch.randn(0, 1, 4))                                  # error named q, not q_new
    with pytest.raises(ValueError, match=r"q_new \(3, 1, 4\).*do not broadcast"):
        cache.attend(torch.randn(3, 1, 4))
    with pytest.raises(TypeError, match="q_new must have the cache's dtype torch.float32"):
        cache.attend(torch.randn(2, 1, 4, dtype=torch.float64))
    # batch dims that broadcast still work: (5, 2, t, d_k) queries over a (2, L, d_k) cache
    out, weights = cache.attend(torch.randn(5, 2, 1, 4, generator=gen))
    assert out.shape == (5, 2, 1, 6) and weights.shape == (5, 2, 1, 3)


@pytest.mark.parametrize("generate", [generate_with_cache, generate_without_cache])
def test_generate_names_an_empty_x_and_checks_the_weights(gen, generate):
    w_q, w_k, w_v = (torch.randn(8, d, generator=gen) for d in (4, 4, 6))
    for x in (torch.zeros(0, 8), torch.zeros(5, 0)):                      # named w_q or max_len
        with pytest.raises(ValueError, match=r"x must be 2-D \(n, d_model\) with n >= 1 tokens.*"
                                             + re.escape(str(tuple(x.shape)))):
            generate(x, w_q, w_k, w_v)
    x = torch.randn(5, 8, generator=gen)
    with pytest.raises(ValueError, match=r"the same d_k >= 1, got \(8, 0\) and \(8, 0\)"):
        generate(x, w_q[:, :0], w_k[:, :0], w_v)                            # was 1 / sqrt(0)
    with pytest.raises(TypeError, match="w_v must have x's dtype torch.float32, got torch.float64"):
        generate(x, w_q, w_k, w_v.double())


def test_decode_with_cache_names_no_keys():
    with pytest.raises(ValueError, match=r"k and v must hold at least one key.*\(2, 0, 4\)"):
        decode_with_cache(*(torch.zeros(2, 0, 4) for _ in range(3)))        # was max_len >= 1
    with pytest.raises(TypeError, match="v must have the same dtype as q"):
        decode_with_cache(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2).double())
