"""Bad input gets a ValueError or TypeError that names the argument and the shapes it got
(COURSE_DESIGN.md, "Public contract"), never a deep error from inside torch nor a silent answer."""

from __future__ import annotations

import re

import pytest
import torch

import attn_helpers as ah
from attn_helpers import efficient as eff
from attn_helpers.ring import ring_attention
from attn_helpers.widgets import AttentionFrame

V, T = ValueError, TypeError
MHA, DECODER = ah.MultiHeadAttention(8, 2), ah.DecoderLayer(8, 2, 16)
LM = ah.TinyCausalLM(5, 8, 2, 1, 16)


def t(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


def cache_of(n, max_len, *batch):
    cache = ah.KVCache(max_len)
    cache.append(t(*batch, n, 4), t(*batch, n, 3))
    return cache


def sdpa(q, k, v, mask=None, **kwargs):
    return lambda: ah.scaled_dot_product_attention(q, k, v, mask, **kwargs)


CASES = {
    # name: (callable, expected exception, regex on the message)
    "q not a tensor": (sdpa([[1.0, 2.0]], t(3, 2), t(3, 2)), T, r"q must be a torch\.Tensor.*list"),
    "integer q": (sdpa(t(3, 4, dtype=torch.int64), t(5, 4), t(5, 2)), T, r"\bq\b.*torch\.int64"),
    "q 1-D": (sdpa(t(4), t(5, 4), t(5, 2)), V, r"\bq\b.*\(4,\)"),
    "q and k last dim mismatch": (
        sdpa(t(2, 3, 4), t(2, 5, 6), t(2, 5, 2)), V, r"\bq\b.*\(2, 3, 4\).*\bk\b.*\(2, 5, 6\)"),
    "k and v n_k mismatch": (sdpa(t(3, 4), t(5, 4), t(6, 2)), V, r"\bk\b.*\(5, 4\).*\bv\b.*\(6, 2\)"),
    "mask float dtype": (sdpa(t(3, 4), t(5, 4), t(5, 2), t(3, 5)), T, r"mask.*bool.*torch\.float32"),
    "mask not broadcastable": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), t(4, 5, dtype=bool)), V, r"mask.*\(4, 5\).*\(3, 5\)"),
    "batch dims of q and k do not broadcast": (
        sdpa(t(2, 3, 4), t(3, 5, 4), t(3, 5, 2)), V, r"q \(2, 3, 4\).*k \(3, 5, 4\)"),
    "q and k dtype mismatch": (
        sdpa(t(3, 4), t(5, 4, dtype=torch.float64), t(5, 2)),
        T, r"\bk\b.*torch\.float32.*torch\.float64"),
    "negative scale": (sdpa(t(3, 4), t(5, 4), t(5, 2), scale=-0.5), V, r"scale.*-0\.5"),
    "dot_product_scores k not a tensor": (
        lambda: ah.dot_product_scores(t(3, 4), [[1.0] * 4]), T, r"\bk\b.*torch\.Tensor"),
    "masked_softmax mask shape": (
        lambda: ah.masked_softmax(t(3, 4), t(3, 5, dtype=bool)), V, r"mask.*\(3, 5\).*\(3, 4\)"),
    "causal_mask(0)": (lambda: ah.causal_mask(0), V, r"\bn\b.*>= 1.*\b0\b"),
    "padding_mask length > max_len": (lambda: ah.padding_mask([1, 5], 3), V, r"max_len=3.*\[1, 5\]"),
    # torch.tensor([1.5, 2.0], dtype=long) would silently truncate 1.5 to 1
    "padding_mask float list lengths": (lambda: ah.padding_mask([1.5, 2.0]), T, r"lengths"),
    "sliding_window_mask window 0": (lambda: ah.sliding_window_mask(4, 0), V, r"window.*>= 1.*\b0\b"),
    "sliding_window_mask float n": (lambda: ah.sliding_window_mask(4.0, 2), T, r"\bn\b.*float"),
    "key_padding_to_attention_mask 1-D": (
        lambda: ah.key_padding_to_attention_mask(t(4, dtype=bool)), V, r"key_padding.*\(4,\)"),
    "additive_scores wrong w_q shape": (
        lambda: ah.additive_scores(t(3, 4), t(5, 6), t(3, 5), t(3, 6), t(3)), V, r"w_q.*\(3, 5\)"),
    # float64 q and k with float32 weights: torch's matmul raises a RuntimeError otherwise
    "additive_scores dtype mismatch": (
        lambda: ah.additive_scores(t(3, 4).double(), t(5, 6).double(), t(3, 4), t(3, 6), t(3)),
        T, r"w_q.*float"),
    "max_entropy(0)": (lambda: ah.max_entropy(0), V, r"\bn\b.*>= 1.*\b0\b"),
    "attention_entropy non-tensor": (
        lambda: ah.attention_entropy([0.5, 0.5]), T, r"weights.*torch\.Tensor.*list"),
    "attention_entropy 0-D": (lambda: ah.attention_entropy(torch.tensor(1.0)), V, r"weights.*\(\)"),
    # broadcast_to raises a RuntimeError from inside torch otherwise
    "normalized_entropy mask shape": (
        lambda: ah.normalized_entropy(t(3, 5) / 5, t(4, 5, dtype=bool)), V, r"mask.*\(4, 5\).*\(3, 5\)"),
    "AttentionFrame wrong label counts": (
        lambda: AttentionFrame(t(3, 4) / 4, ["a", "b"], ["w", "x", "y", "z"]),
        V, r"2 query labels.*4 key labels.*\(3, 4\)"),
    "AttentionFrame mask shape": (
        lambda: AttentionFrame(t(2, 3) / 3, ["a", "b"], ["x", "y", "z"], mask=t(3, 2, dtype=bool)),
        V, r"mask.*\(2, 3\).*\(3, 2\)"),
    "setup('x')": (lambda: ah.setup("x"), T, r"seed.*int.*str"),
    "sdpa with no keys": (sdpa(t(3, 4), t(0, 4), t(0, 2)), V, r"n_k >= 1.*\(0, 4\)"),
    "sdpa scores too large (notebook 08's sizes)": (
        sdpa(t(40_000, 1), t(40_000, 1), t(40_000, 1)), V, r"scores would need 6.4e\+09"),
    # entropy: weights that are not attention weights
    "entropy of rows not summing to 1": (
        lambda: ah.effective_keys(torch.tensor([0.5, 0.2])), V, r"sum to 1.*0\.7"),
    "entropy of NaN weights": (
        lambda: ah.normalized_entropy(torch.tensor([float("nan"), 1.0])), V, r"NaN"),
    # positional encodings
    "sinusoidal odd d_model": (lambda: ah.sinusoidal_encoding(4, 5), V, r"d_model.*even.*5"),
    "sinusoidal base 1": (lambda: ah.sinusoidal_encoding(4, 4, base=1.0), V, r"base.*> 1"),
    "pair_rotation pair out of range": (
        lambda: ah.positional.pair_rotation(1.0, 8, 4), V, r"pair.*between 0 and 3.*4"),
    "rope odd d": (lambda: ah.apply_rope(t(3, 5)), V, r"\bx\b.*even.*\(3, 5\)"),
    "rope positions shape": (
        lambda: ah.apply_rope(t(3, 4), torch.arange(4)), V, r"positions.*\(4,\).*\(3,\)"),
    "alibi no heads": (lambda: ah.alibi_bias(4, 0), V, r"num_heads.*0"),
    "learned positions past max_len": (
        lambda: ah.positional.LearnedPositionalEmbedding(4, 8)(t(5, 8)), V, r"max_len=4.*\(5, 8\)"),
    # multi-head attention
    "num_heads does not divide d_model": (
        lambda: ah.MultiHeadAttention(10, 3), V, r"d_model=10.*num_heads=3"),
    "num_kv_heads does not divide num_heads": (
        lambda: ah.MultiHeadAttention(16, 8, num_kv_heads=3), V, r"num_kv_heads=3.*num_heads=8"),
    "bias not a bool": (lambda: ah.multihead.parameter_count(8, 2, bias="False"), T, r"bias.*bool.*str"),
    "mha query width": (lambda: MHA(t(2, 3, 7), t(2, 5, 8), t(2, 5, 8)), V, r"query.*\(2, 3, 7\)"),
    "mha key and value lengths": (
        lambda: MHA(t(2, 3, 8), t(2, 5, 8), t(2, 4, 8)), V, r"key \(2, 5, 8\) and value \(2, 4, 8\)"),
    "mha not batch first": (lambda: MHA(t(3, 8), t(5, 8), t(5, 8)), V, r"batch first"),
    "mha mask shape": (
        lambda: MHA(t(2, 3, 8), t(2, 5, 8), t(2, 5, 8), t(3, 4, dtype=bool)),
        V, r"mask of shape \(3, 4\).*\(2, 2, 3, 5\)"),
    "mha head_mask shape": (
        lambda: MHA(t(1, 3, 8), t(1, 3, 8), t(1, 3, 8), head_mask=t(3)),
        V, r"head_mask.*\(2,\).*\(3,\)"),
    "mha cache and mask": (
        lambda: MHA(t(1, 2, 8), t(1, 2, 8), t(1, 2, 8), ah.causal_mask(2), cache=ah.KVCache(4)),
        V, r"mask must be None"),
    "mha from_torch of a Linear": (
        lambda: ah.MultiHeadAttention.from_torch(torch.nn.Linear(2, 2)), T, r"MultiheadAttention"),
    "split_heads not divisible": (
        lambda: ah.split_heads(t(1, 2, 10), 3), V, r"d_model=10.*\(1, 2, 10\).*num_heads=3"),
    # the KV cache
    "KVCache max_len 0": (lambda: ah.KVCache(0), V, r"max_len.*>= 1"),
    "attend on an empty cache": (lambda: ah.KVCache(3).attend(t(1, 2)), V, r"empty"),
    "attend with batch dims that do not fit": (
        lambda: cache_of(3, 8, 2).attend(t(3, 1, 4)), V, r"q_new \(3, 1, 4\).*do not broadcast"),
    "attend with another dtype": (
        lambda: cache_of(3, 8).attend(t(1, 4, dtype=torch.float64)), T, r"q_new.*cache's dtype"),
    "append past max_len": (
        lambda: cache_of(2, max_len=3).append(t(2, 4), t(2, 3)),
        V, r"full: it holds 2 of max_len=3.*t=2"),
    "kv_cache_bytes no layers": (
        lambda: ah.kv_cache_bytes(10, num_layers=0, num_kv_heads=1, head_dim=4), V, r"num_layers.*>= 1"),
    "kv_cache_bytes positional sizes": (lambda: ah.kv_cache_bytes(1, 32, 32, 128), T, r"positional"),
    "decode_with_cache lengths differ": (
        lambda: ah.decode_with_cache(t(3, 2), t(4, 2), t(4, 2)), V, r"q \(3, 2\), k \(4, 2\)"),
    "generate weights of the wrong width": (
        lambda: ah.generate_with_cache(t(3, 4), t(4, 2), t(5, 2), t(4, 2)),
        V, r"w_k.*d_model=4.*\(5, 2\)"),
    # efficient attention
    "tiled block_size 0": (
        lambda: ah.tiled_attention(t(6, 4), t(6, 4), t(6, 4), block_size=0), V, r"block_size"),
    "tiled causal n_q != n_k": (
        lambda: ah.tiled_attention(t(6, 4), t(4, 4), t(4, 4), causal=True), V, r"n_q == n_k"),
    "tiled return_lse not a bool": (
        lambda: ah.tiled_attention(t(6, 4), t(6, 4), t(6, 4), return_lse=1), T, r"return_lse"),
    "tiled batch dims": (
        lambda: ah.tiled_attention(t(2, 6, 4), t(3, 6, 4), t(6, 4)), V, r"do not broadcast"),
    "linear attention no keys": (lambda: ah.linear_attention(t(3, 4), t(0, 4), t(0, 2)), V, r"n_k >= 1"),
    "linear attention huge causal chunk": (
        lambda: ah.linear_attention(t(40_000, 1), t(40_000, 1), t(40_000, 1), causal=True,
                                    chunk_size=10**9), V, r"chunk_size=1000000000.*bytes"),
    "local attention window 0": (lambda: ah.local_attention(t(6, 4), t(6, 4), t(6, 4), 0), V, r"window"),
    "init_state batch_shape": (lambda: eff.init_state("2", 3, 4), T, r"batch_shape.*str"),
    "online step, state not a state": (
        lambda: eff.online_softmax_step((1, 2, 3), t(6, 6), t(6, 4)), T, r"state"),
    "online step, block sizes differ": (
        lambda: eff.online_softmax_step(eff.init_state((), 6, 4), t(6, 6), t(5, 4)),
        V, r"block size.*\(6, 6\).*\(5, 4\)"),
    "backward_tile lse shape": (
        lambda: eff.backward_tile(t(3, 4), t(5, 4), t(5, 2), t(3, 2), t(3), t(3, 1)),
        V, r"lse.*n_q=3.*\(3,\)"),
    "linear step d_k": (lambda: eff.linear_attention_step(None, t(3), t(4), t(4)), V, r"q_t \(3,\)"),
    "ring n_q != n_k": (lambda: ring_attention(t(6, 4), t(4, 4), t(4, 4)), V, r"same n"),
    "ring world_size above n": (
        lambda: ring_attention(t(2, 4), t(2, 4), t(2, 4), 3), V, r"world_size=3.*n=2"),
    # the decoder layer and the tiny language model
    "decoder x width": (lambda: DECODER(t(2, 3, 7), t(2, 4, 8)), V, r"\bx\b.*\(2, 3, 7\)"),
    "decoder memory_padding shape": (
        lambda: DECODER(t(2, 3, 8), t(2, 4, 8), memory_padding=t(2, 3, dtype=bool)),
        V, r"memory_padding.*\(2, 4\).*\(2, 3\)"),
    "decoder activation": (lambda: ah.DecoderLayer(8, 2, 16, activation="tanh"), V, r"tanh"),
    "decoder cache without causal": (
        lambda: ah.DecoderLayer(8, 2, 16, cross_attention=False)(t(1, 2, 8), causal=False,
                                                                 cache=ah.KVCache(4)),
        V, r"causal=True"),
    "language model token ids": (lambda: LM(torch.tensor([[1, 7]])), V, r"0\.\.4.*7"),
    "language model float tokens": (lambda: LM(t(1, 2)), V, r"tokens.*long.*float32"),
    "language model prompt past max_len": (
        lambda: ah.TinyCausalLM(5, 8, 2, 1, 16, max_len=4).generate(
            torch.zeros(1, 3, dtype=torch.long), 2, use_cache=True), V, r"max_len=4"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_clear_error(name):
    call, error, pattern = CASES[name]
    with pytest.raises(error, match=pattern) as info:
        call()
    # the message is one of ours, not a torch internal error re-raised
    assert not re.search(r"RuntimeError|Traceback", str(info.value))


