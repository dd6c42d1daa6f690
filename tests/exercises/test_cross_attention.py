"""Notebook 06's checkers accept right answers and name each known mistake; references vs torch's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, skeleton

import attn_helpers as ah
from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import cross_attention as ex


def test_the_reference_is_torchs_decoder_layer_with_a_causal_mask():
    for case in ex._layer_cases():
        layer, y, memory, real = case.values()
        if layer.cross_attn.kdim != layer.d_model:
            continue                          # torch's layer needs memory of the model's width
        torch_layer = torch.nn.TransformerDecoderLayer(
            layer.d_model, layer.self_attn.num_heads, 2 * layer.d_model, dropout=0.0,
            batch_first=True, norm_first=False, dtype=y.dtype)
        layer.load_state_dict(ah.DecoderLayer.from_torch(torch_layer).state_dict())
        expected = torch_layer(y, memory, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(
            y.shape[1], dtype=y.dtype), tgt_is_causal=True, memory_key_padding_mask=~real)
        assert torch.allclose(ex.decode_layer_reference(*case.values()), expected, atol=1e-5)


def in_the_stub(cross, ff=lambda layer, before, x: layer.norm3(x + layer.feed_forward(x))):
    """The stub's loop: ``cross`` gives a step's cross-attention (``kept`` lasts), ``ff`` the rest."""
    def decode_layer(layer, y, memory, memory_real):
        cache, kept, out = ah.KVCache(y.shape[1]), {}, []                          # given
        for t in range(y.shape[1]):
            y_t = y[:, t:t + 1]                                                     # given
            x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given
            x_after = layer.norm2(x_t + cross(layer, x_t, memory, memory_real, kept))
            out.append(ff(layer, x_t, x_after))
        return torch.cat(out, 1)
    return decode_layer


def explicit_heads(layer, x_t, memory, memory_real, kept):
    """Written another way: own head split and attention, K and V made at the first step."""
    ca, h, d = layer.cross_attn, layer.cross_attn.num_heads, layer.d_model

    def heads(x):                                                     # (b, n, d) -> (b, h, n, d/h)
        return x.view(x.shape[0], x.shape[1], h, d // h).transpose(1, 2)

    if not kept:
        kept["K"], kept["V"] = heads(ca.k_proj(memory)), heads(ca.v_proj(memory))
    q = heads(ca.q_proj(x_t))
    s = (q @ kept["K"].transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~memory_real[:, None, None, :], float("-inf"))
    return ca.out_proj((torch.softmax(s, -1) @ kept["V"]).transpose(1, 2).reshape(x_t.shape))


def test_decode_checker_accepts_the_loop_the_mistakes_vary_and_another_loop():
    assert ex.check_decode_layer(ex._decode_with)
    assert ex.check_decode_layer(in_the_stub(explicit_heads))


@pytest.mark.parametrize("mistake", ex.DECODE_MISTAKES, ids=range(len(ex.DECODE_MISTAKES)))
def test_decode_checker_names_each_mistake(mistake):
    assert_rejected(ex.check_decode_layer(mistake.produce), "\nHint: " + mistake.hint)


def attend(layer, x_t, K, V, memory_real, keep=lambda real: real[:, None, None, :]):
    h = layer.cross_attn.num_heads
    o, _ = ah.scaled_dot_product_attention(ah.split_heads(layer.cross_attn.q_proj(x_t), h),
                                           ah.split_heads(K, h), ah.split_heads(V, h), keep(memory_real))
    return layer.cross_attn.out_proj(ah.merge_heads(o))


def linear_per_step(layer, x_t, memory, memory_real, kept):
    """Right numbers, the memory re-projected at every step with F.linear and the weights."""
    ca = layer.cross_attn
    return attend(layer, x_t, F.linear(memory, ca.k_proj.weight, ca.k_proj.bias),
                  F.linear(memory, ca.v_proj.weight, ca.v_proj.bias), memory_real)


@pytest.mark.parametrize("answer, words", [
    (lambda layer, y, memory, real: layer(y, memory, memory_padding=real),
     ("case 1 of 4", "q_proj ran on 4 target positions in one call",
      "\nHint: returning layer(y, memory, memory_padding=memory_real)")),
    (in_the_stub(lambda layer, x_t, memory, real, kept: layer.cross_attn(
        x_t, memory, memory, real[:, None, :])[0]),
     ("the memory's keys and values were computed 8 times in 4 decoding steps",
      "calling layer.cross_attn(x_t, memory, memory, mask) in the loop")),
    (in_the_stub(linear_per_step),
     ("the memory's keys and values were computed 8 times in 4 decoding steps",
      "\nHint: K and V do not change while the decoder writes")),
    (in_the_stub(explicit_heads, ff=lambda layer, x_before, x_t: layer.norm3(
        x_before + layer.feed_forward(x_t))), ("\nHint: the feed-forward's residual added x_t from",)),
    (in_the_stub(lambda layer, x_t, memory, real, kept: attend(layer, x_t, layer.cross_attn.k_proj(
        memory), layer.cross_attn.v_proj(memory), real, keep=lambda real: real)),   # a raw (b, n_m) mask
     ("\nHint: memory_real does not fit the scores (b, h, n_q, n_k)",)),
])
def test_decode_checker_refuses_the_whole_layer_and_the_memory_projected_per_step(answer, words):
    assert_rejected(ex.check_decode_layer(answer), *words)


def heads(latents, memory, W_Q, W_K, W_V, h):            # Q (1, h, n_q, d_head); K, V (b, h, n_k, ..)
    return (ah.split_heads(x, h) for x in ((latents @ W_Q)[None], memory @ W_K, memory @ W_V))


def test_the_cross_attend_reference_is_torchs_multihead_attention_with_a_key_padding_mask():
    for latents, memory, real, W_Q, W_K, W_V, h in (case.values() for case in ex._attend_cases()):
        y = latents.expand(memory.shape[0], -1, -1)          # torch's queries: (b, n_q, d)
        d, d_m = W_Q.shape[1], W_K.shape[0]
        torch_layer = torch.nn.MultiheadAttention(d, h, kdim=d_m, vdim=d_m + 1, bias=False,
                                                  batch_first=True, dtype=y.dtype)
        with torch.no_grad():                       # vdim != d: torch keeps three separate weights
            torch_layer.q_proj_weight.copy_(W_Q.T)
            torch_layer.k_proj_weight.copy_(W_K.T)
            torch_layer.v_proj_weight.copy_(torch.cat([W_V, torch.zeros(1, d, dtype=y.dtype)]).T)
            torch_layer.out_proj.weight.copy_(torch.eye(d, dtype=y.dtype))
            expected, weights = torch_layer(y, memory, torch.cat([memory, memory[..., :1]], -1),
                                            key_padding_mask=~real, average_attn_weights=False)
        got = ex.cross_attend_reference(latents, memory, real, W_Q, W_K, W_V, h)
        assert torch.allclose(got[0], expected, atol=1e-5) and torch.allclose(got[1], weights, atol=1e-6)
        assert torch.allclose(got[0], ah.merge_heads(F.scaled_dot_product_attention(
            *heads(latents, memory, W_Q, W_K, W_V, h), attn_mask=real[:, None, None, :]).expand(
                memory.shape[0], -1, -1, -1)), atol=1e-5)


def sdpa_attend(latents, memory, memory_real, W_Q, W_K, W_V, num_heads):
    """torch's fused attention for the output, 02's function for the weights; Q broadcast."""
    Q, K, V = heads(latents, memory, W_Q, W_K, W_V, num_heads)
    Q = Q.expand(K.shape[0], -1, -1, -1)
    weights = ah.scaled_dot_product_attention(Q, K, V, memory_real[:, None, None, :])[1]
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=memory_real[:, None, None, :])
    return ah.merge_heads(out), weights


def additive_attend(latents, memory, memory_real, W_Q, W_K, W_V, num_heads):
    """Its own head split (view, transpose), an additive -1e9 mask and .mT: written another way."""
    (n_q, d), b = latents.shape, memory.shape[0]
    Q = (latents @ W_Q).view(n_q, num_heads, -1).transpose(0, 1)              # (h, n_q, d_head)
    K, V = ((memory @ W).view(b, -1, num_heads, d // num_heads).transpose(1, 2) for W in (W_K, W_V))
    mask = (~memory_real)[:, None, None, :] * -1e9
    weights = torch.softmax(Q @ K.mT * Q.shape[-1] ** -0.5 + mask, -1)
    return (weights @ V).transpose(1, 2).reshape(b, n_q, d), weights


def test_cross_attend_checker_accepts_the_reference_and_other_correct_answers():
    assert ex.check_cross_attend(ex.cross_attend_reference, solution=True)
    for answer in (sdpa_attend, additive_attend):
        verdict = ex.check_cross_attend(answer)
        assert verdict and verdict.message.endswith("edge cases included."), verdict.message


@pytest.mark.parametrize("mistake", ex.ATTEND_MISTAKES, ids=range(len(ex.ATTEND_MISTAKES)))
def test_cross_attend_checker_names_each_mistake(mistake):
    assert_rejected(ex.check_cross_attend(mistake.produce), "\nHint: " + mistake.hint)


def written(scale=lambda Q: Q.shape[-1] ** 0.5, mask=lambda real: real[:, None, None, :],
            fill=-math.inf, finish=lambda heads, W_Q: ah.merge_heads(heads)):
    """A learner's answer, written out; ``scale``, ``mask``, ``fill``, ``finish`` make its mistakes."""
    def attend(latents, memory, memory_real, W_Q, W_K, W_V, num_heads):
        Q, K, V = heads(latents, memory, W_Q, W_K, W_V, num_heads)
        weights = (Q @ K.mT / scale(Q)).masked_fill(~mask(memory_real), fill).softmax(-1)
        return finish(weights @ V, W_Q), weights
    return attend


def queries_masked(latents, memory, *rest):      # case 1 passes; at case 2, n_q != n_k: shapes clash
    wrong = written(mask=lambda real: real[:, None, :, None])      # the mask along the queries
    right = latents.shape[0] == memory.shape[1]
    return (ex.cross_attend_reference if right else wrong)(latents, memory, *rest)


@pytest.mark.parametrize("answer, words", [
    (written(scale=lambda Q: Q.shape[-2] ** 0.5), ("\nHint: the scores were divided by sqrt(n_q)",)),
    (written(scale=lambda Q: (Q.shape[1] * Q.shape[-1]) ** 0.5),
     ("\nHint: the scores were divided by sqrt(d), all heads' width",)),
    (written(mask=lambda real: real[0]), ("\nHint: every sentence got the first sentence's mask",)),
    (written(finish=lambda heads, W_Q: heads), ("\nHint: the heads were left unmerged",)),
    (written(finish=lambda heads, W_Q: ah.merge_heads(heads) @ W_Q),
     ("\nHint: the merged heads went through W_Q again, as if it were a W_O",)),
    (queries_masked, ("case 2 of 4", "\nHint: the shapes do not fit the scores (b, h, n_q, n_k)")),
    (lambda L, m, real, W_Q, *rest: ah.split_heads(L @ W_Q, 1), ("\nHint: latents W_Q is (n_q, d)",)),
    (lambda L, m, real, *W: ah.scaled_dot_product_attention(*heads(L, m, *W), real[:, None, :]),
     ("\nHint: memory_real does not fit the scores",)),                  # a (b, 1, n_k) mask
    (lambda *a: ex.cross_attend_reference(*a)[0], ("returned 1 value(s); expected 2",))])
def test_cross_attend_checker_names_learner_written_mistakes(answer, words):
    assert_rejected(ex.check_cross_attend(answer), *words)


@pytest.mark.parametrize("scale", [lambda Q: Q.shape[1] * Q.shape[-1], lambda Q: 2 * Q.shape[-1] ** 0.5])
def test_an_unlisted_scale_is_not_named_as_another(scale):      # / d_m and / (2 sqrt(d_head))
    verdict = ex.check_cross_attend(written(scale=scale))
    assert not verdict and "Hint: the scores were divided" not in verdict.message, verdict.message


def test_the_level_3_skeletons_filled_in_pass():
    decode = skeleton("cross_attention.decode", "layer, y, memory, memory_real", (
        "ah.split_heads(ca.k_proj(memory), h)", "ah.split_heads(ca.v_proj(memory), h)",
        "ah.split_heads(ca.q_proj(x_t), h)",
        "ah.scaled_dot_product_attention(q, K_m, V_m, memory_real[:, None, None, :])",
        "layer.norm2(x_t + ca.out_proj(ah.merge_heads(o)))",
        "layer.norm3(x_t + layer.feed_forward(x_t))"),
        prefix="cache = ah.KVCache(y.shape[1])\n", ah=ah)
    assert ex.check_decode_layer(decode)
    args = "latents, memory, memory_real, W_Q, W_K, W_V, num_heads"
    attend = skeleton("cross_attention.attend", args, (
        "(ah.split_heads(x, num_heads) for x in ((latents @ W_Q)[None], memory @ W_K, memory @ W_V))",
        "Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])",
        "scores.masked_fill(~memory_real[:, None, None, :], float('-inf'))", "torch.softmax(scores, -1)",
        "ah.merge_heads(weights @ V)"), ah=ah)
    assert ex.check_cross_attend(attend)


def test_hints_before_the_skeleton_do_not_state_the_solution():
    hints = EXERCISES["cross_attention.decode"].hints
    for fragment in ("<-", "LN_2(", "LN_3(", "norm(x + block(x))", "norm2(x_t", "split_heads(ca"):
        assert fragment not in hints[0] + hints[1], fragment
    hints = EXERCISES["cross_attention.attend"].hints
    for fragment in ("latents @ W_Q", "memory @ W_K", "[:, None, :]", "softmax(-1)", "masked_fill"):
        assert fragment not in hints[0] + hints[1], fragment
