"""DecoderLayer against torch.nn.TransformerDecoderLayer; the tiny LM's generation with and
without a KV cache (same tokens and logits, the work of each step)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attn_helpers.decoder_lm import StepCost, TinyCausalLM
from attn_helpers.masks import causal_mask, padding_mask
from attn_helpers.transformer import DecoderLayer


def torch_layer(d_model=16, heads=4, d_ff=24, *, norm_first, activation="relu", bias=True,
                batch_first=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout=0.1, activation=activation,
                                       batch_first=batch_first, norm_first=norm_first, bias=bias,
                                       dtype=dtype).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so a mix-up would show
        for name, p in layer.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.3 * torch.randn(p.shape, dtype=dtype))
    return layer


def inputs(b=3, n=5, n_m=7, d_model=16, d_memory=16, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, d_model, generator=g, dtype=dtype)
    memory = torch.randn(b, n_m, d_memory, generator=g, dtype=dtype)
    real = padding_mask(torch.randint(1, n_m + 1, (b,), generator=g), n_m)   # True = real
    return x, memory, real


def torch_output(layer, x, memory, real, *, causal=True):
    n = x.shape[1]
    return layer(x, memory, tgt_mask=~causal_mask(n) if causal else None, tgt_is_causal=causal,
                 memory_key_padding_mask=None if real is None else ~real)


CASES = [(*case, torch.float32, 16) for case in itertools.product(
    [False, True], ["relu", "gelu", nn.GELU(), F.relu], [True, False])]
CASES += [(False, "gelu", True, torch.float64, 16), (True, "gelu", True, torch.float64, 16),
          (True, "relu", True, torch.float32, 10)]          # a memory of another width (kdim, vdim)


@pytest.mark.parametrize("norm_first, activation, bias, dtype, d_memory", CASES)
def test_from_torch_equals_torch_decoder_layer(norm_first, activation, bias, dtype, d_memory):
    layer = torch_layer(norm_first=norm_first, activation=activation, bias=bias, dtype=dtype)
    if d_memory != 16:
        layer.multihead_attn = nn.MultiheadAttention(16, 4, kdim=d_memory, vdim=d_memory,
                                                     batch_first=True).eval()
    ours = DecoderLayer.from_torch(layer)
    x, memory, real = inputs(d_memory=d_memory, dtype=dtype)
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-4}
    for causal, padding in [(True, real), (True, None), (False, real)]:
        torch.testing.assert_close(ours(x, memory, causal=causal, memory_padding=padding),
                                   torch_output(layer, x, memory, padding, causal=causal), **tol)


def test_from_torch_of_a_sequence_first_layer_and_gradients(gen):
    layer = torch_layer(norm_first=False, batch_first=False)
    ours = DecoderLayer.from_torch(layer)
    x, memory, real = inputs()
    x.requires_grad_(True)
    out = ours(x, memory, memory_padding=real)
    reference = layer(x.transpose(0, 1), memory.transpose(0, 1), tgt_mask=~causal_mask(5),
                      memory_key_padding_mask=~real).transpose(0, 1)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)
    mine = torch.autograd.grad(out.square().sum(), x)[0]
    theirs = torch.autograd.grad(reference.square().sum(), x)[0]
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_weights_are_causal_and_skip_padded_memory(gen):
    ours = DecoderLayer(16, 4, 24, norm_first=True)
    x, memory, real = inputs()
    out, weights = ours(x, memory, memory_padding=real, need_weights=True)
    assert torch.equal(out, ours(x, memory, memory_padding=real))
    assert weights.self_attention.shape == (3, 4, 5, 5) and weights.cross_attention.shape == (3, 4, 5, 7)
    assert torch.all(weights.self_attention[..., ~causal_mask(5)] == 0)
    assert torch.all(weights.cross_attention.masked_select(~real[:, None, None, :]) == 0)


def test_decoder_only_layer_equals_a_causal_torch_encoder_layer(gen):
    # without cross-attention, a decoder layer is torch's encoder layer with a causal mask
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
    ours = DecoderLayer(16, 4, 24, norm_first=True, activation="gelu", cross_attention=False)
    ours.self_attn = ours.self_attn.from_torch(reference.self_attn)
    for mine, theirs in ((ours.feed_forward.linear1, reference.linear1),
                         (ours.feed_forward.linear2, reference.linear2),
                         (ours.norm1, reference.norm1), (ours.norm3, reference.norm2)):
        mine.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 6, 16, generator=gen)
    torch.testing.assert_close(ours(x), reference(x, src_mask=~causal_mask(6), is_causal=True),
                               atol=1e-5, rtol=1e-4)
    assert ours.cross_attn is None and ours.norm2 is None


def tiny_lm(num_kv_heads=None, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return TinyCausalLM(11, 16, 4, 3, 32, num_kv_heads=num_kv_heads, max_len=24).to(dtype).eval()


@pytest.mark.parametrize("num_kv_heads, dtype, atol", [
    (None, torch.float32, 1e-5), (2, torch.float32, 1e-5), (1, torch.float64, 1e-12),
])
def test_generation_with_and_without_cache_agree(num_kv_heads, dtype, atol):
    model = tiny_lm(num_kv_heads, dtype)
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    cached = model.generate(prompt, 12, use_cache=True)
    plain = model.generate(prompt, 12, use_cache=False)
    assert cached.tokens.shape == (2, 16)
    assert torch.equal(cached.tokens, plain.tokens) and torch.equal(cached.tokens[:, :4], prompt)
    torch.testing.assert_close(cached.logits, plain.logits, atol=atol, rtol=atol)
    assert torch.equal(cached.tokens[:, 4:], cached.logits.argmax(-1))      # greedy
    # the same logits as one teacher-forced causal pass over the generated sequence
    full = model(cached.tokens[:, :-1])[:, 3:]
    torch.testing.assert_close(cached.logits, full, atol=atol, rtol=atol)
    assert len(set(cached.tokens[0, 4:].tolist())) > 1                      # not a constant output


def test_each_step_cost_with_and_without_cache():
    model = tiny_lm(num_kv_heads=2)
    layers, heads, n_prompt, steps = 3, 4, 5, 6
    prompt = torch.randint(0, 11, (1, n_prompt), generator=torch.Generator().manual_seed(0))
    plain = model.generate(prompt, steps, use_cache=False).costs
    cached = model.generate(prompt, steps, use_cache=True).costs
    lengths = [n_prompt + s for s in range(steps)]                          # prefix at each step
    assert plain == [StepCost(n, layers * heads * n * n) for n in lengths]  # all of it, again
    assert cached[0] == plain[0]                                            # the prompt, once
    assert cached[1:] == [StepCost(1, layers * heads * n) for n in lengths[1:]]  # one new row


def test_language_model_is_causal_and_returns_weights(gen):
    model = tiny_lm()
    tokens = torch.randint(0, 11, (2, 8), generator=gen)
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    logits, weights = model(tokens, need_weights=True)
    assert logits.shape == (2, 8, 11) and len(weights) == 3 and weights[0].shape == (2, 4, 8, 8)
    torch.testing.assert_close(model(changed)[:, :5], logits[:, :5])
    assert not torch.allclose(model(changed)[:, 5:], logits[:, 5:])
