"""Notebook 06's checkers: each accepts correct answers and names each known mistake; both
references are checked against PyTorch's (nn.MultiheadAttention with a key_padding_mask, and
nn.TransformerDecoderLayer)."""

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


GIVEN = "cache = ah.KVCache(y.shape[1])\n"                  # the stub's lines before its loop


def learner_decode(layer, y, memory, memory_real):
    """A learner's answer written another way (explicit heads, own attention) in the stub's loop."""
    h, d = layer.cross_attn.num_heads, layer.d_model
    ca = layer.cross_attn
    cache = ah.KVCache(y.shape[1])                                              # given

    def heads(x):                                                     # (b, n, d) -> (b, h, n, d/h)
        return x.view(x.shape[0], x.shape[1], h, d // h).transpose(1, 2)

    def attend(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(q.shape[0], q.shape[2], d)

    K_m, V_m = heads(ca.k_proj(memory)), heads(ca.v_proj(memory))
    out = []
    for t in range(y.shape[1]):
        y_t = y[:, t:t + 1]                                                     # given
        x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given
        x_t = layer.norm2(x_t + ca.out_proj(attend(heads(ca.q_proj(x_t)), K_m, V_m,
                                                   memory_real[:, None, None, :])))
        out.append(layer.norm3(x_t + layer.feed_forward(x_t)))
    return torch.cat(out, 1)


def test_decode_checker_accepts_the_reference_loop_and_another_loop():
    assert ex.check_decode_layer(lambda *a: ex._decode_with(*a))
    assert ex.check_decode_layer(learner_decode)


@pytest.mark.parametrize("flaw, words", [
    ({"mask_memory": False}, "padded memory positions were read"),
    ({"pre_norm": (True, True)}, "written pre-norm"), ({"pre_norm": ("both", True)}, "pre-norm"),
    ({"pre_norm": (False, "both")}, "written pre-norm"),
    ({"memory_queries": True}, "the decoder asks"), ({"cross_out": False}, "out_proj"),
    ({"mask_3d": True}, "its batch axis meets the heads axis"),
    ({"zero_mask": True}, "a score of 0 is not -inf"), ({"soft_mask": True}, "after the softmax"),
    ({"cross_residual": False}, "the residual"), ({"cross_norm": "norm1"}, "went through norm1"),
    ({"query_before_self": True}, "before the self-attention block"),
    ({"one_head": True}, "heads were not split"),
    ({"cross_norm": False}, "the sum after the cross-attention was not normalised"),
    ({"ff_residual": False}, "the feed-forward's output must be ADDED"),
    ({"ff_norm": "norm2"}, "norm3 for the feed-forward"),
    ({"ff_norm": None}, "the sum after the feed-forward was not normalised"),
    ({"softmax_dim": -2}, "the softmax ran over dim -2"),
    ({"scale": 1.0, "mask_memory": False}, "neither scaled by 1/sqrt(d_head) nor masked"),
    ({"invert_memory": True}, "the memory mask is inverted"),
    ({"causal_memory": True}, "masked causally"),
    ({"scale": 1.0}, "the scores were not scaled"), ({"scale": "d_model"}, "not 1/sqrt(d_model)"),
    ({"norm_outside": True}, "the LayerNorm went on x_t alone"),
    ({"no_transpose": True}, "without moving the head axis before the positions"),
    ({"ff_first": "own"}, "wrong order"), ({"ff_first": "place"}, "wrong order"),
    ({"values_are_keys": True}, "the values were the keys"),
    ({"cross_norm": "norm3"}, "sum went through norm3"),
    ({"residual_from_y": True}, "residual came from y_t"),
    ({"ff_on_pre_cross": True}, "from before the cross-attention block")])
def test_decode_checker_names_the_mistake(flaw, words):
    assert_rejected(ex.check_decode_layer(lambda *a: ex._decode_with(*a, **flaw)), "\nHint: ", words)


def cross_attn_per_step(layer, y, memory, memory_real):
    """Right numbers, but the memory projected at every step: layer.cross_attn in the loop."""
    cache = ah.KVCache(y.shape[1])                                              # given
    out = []
    for t in range(y.shape[1]):
        y_t = y[:, t:t + 1]                                                     # given
        x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given
        x_t = layer.norm2(x_t + layer.cross_attn(x_t, memory, memory, memory_real[:, None, :])[0])
        out.append(layer.norm3(x_t + layer.feed_forward(x_t)))
    return torch.cat(out, 1)


def values_from_k_proj(layer, y, memory, memory_real):
    """Both projections before the loop, but V made with k_proj."""
    ca, h = layer.cross_attn, layer.cross_attn.num_heads
    cache = ah.KVCache(y.shape[1])                                              # given
    K_m, V_m = ah.split_heads(ca.k_proj(memory), h), ah.split_heads(ca.k_proj(memory), h)
    out = []
    for t in range(y.shape[1]):
        y_t = y[:, t:t + 1]                                                     # given
        x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given
        o, _ = ah.scaled_dot_product_attention(ah.split_heads(ca.q_proj(x_t), h), K_m, V_m,
                                               memory_real[:, None, None, :])
        x_t = layer.norm2(x_t + ca.out_proj(ah.merge_heads(o)))
        out.append(layer.norm3(x_t + layer.feed_forward(x_t)))
    return torch.cat(out, 1)


def test_decode_checker_names_values_made_with_k_proj_not_a_per_step_projection():
    verdict = ex.check_decode_layer(values_from_k_proj)
    assert_rejected(verdict, "cross_attn.k_proj ran twice and cross_attn.v_proj never",
                    "\nHint: K = memory W_K comes from k_proj, V = memory W_V from v_proj")
    assert "at every step" not in verdict.message


def test_decode_checker_refuses_the_whole_layer_and_the_memory_projected_per_step():
    whole = ex.check_decode_layer(lambda layer, y, memory, real: layer(y, memory,
                                                                       memory_padding=real))
    assert_rejected(whole, "case 1 of 4", "q_proj ran on 4 target positions in one call",
                    "\nHint: returning layer(y, memory, memory_padding=memory_real)")
    per_step = ex.check_decode_layer(cross_attn_per_step)
    assert_rejected(per_step, "cross_attn.k_proj ran 4 times in 4 decoding steps",
                    "\nHint: calling layer.cross_attn(x_t, memory, memory, mask) in the loop")


def linear_per_step(layer, y, memory, memory_real):
    """Right numbers, but the memory re-projected at every step with F.linear and the weights."""
    ca, h = layer.cross_attn, layer.cross_attn.num_heads
    cache = ah.KVCache(y.shape[1])                                              # given
    out = []
    for t in range(y.shape[1]):
        y_t = y[:, t:t + 1]                                                     # given
        x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given
        K_m = ah.split_heads(F.linear(memory, ca.k_proj.weight, ca.k_proj.bias), h)
        V_m = ah.split_heads(F.linear(memory, ca.v_proj.weight, ca.v_proj.bias), h)
        o, _ = ah.scaled_dot_product_attention(ah.split_heads(ca.q_proj(x_t), h), K_m, V_m,
                                               memory_real[:, None, None, :])
        x_t = layer.norm2(x_t + ca.out_proj(ah.merge_heads(o)))
        out.append(layer.norm3(x_t + layer.feed_forward(x_t)))
    return torch.cat(out, 1)


def test_decode_checker_refuses_the_memory_reprojected_per_step_without_the_modules():
    assert_rejected(ex.check_decode_layer(linear_per_step),
                    "the memory's keys and values were computed 8 times in 4 decoding steps",
                    "\nHint: K and V do not change while the decoder writes")


def test_the_cross_attend_reference_is_torchs_multihead_attention_with_a_key_padding_mask():
    for y, memory, real, W_Q, W_K, W_V in (case.values() for case in ex._attend_cases()):
        d, d_m = W_Q.shape[1], W_K.shape[0]
        torch_layer = torch.nn.MultiheadAttention(d, 1, kdim=d_m, vdim=d_m + 1, bias=False,
                                                  batch_first=True, dtype=y.dtype)
        W_I = torch.eye(d, dtype=y.dtype)                           # noqa: N806 - out_proj = I
        with torch.no_grad():                       # vdim != d: torch keeps three separate weights
            torch_layer.q_proj_weight.copy_(W_Q.T)
            torch_layer.k_proj_weight.copy_(W_K.T)
            torch_layer.v_proj_weight.copy_(torch.cat([W_V, torch.zeros(1, d, dtype=y.dtype)]).T)
            torch_layer.out_proj.weight.copy_(W_I)
            expected, weights = torch_layer(y, memory, torch.cat([memory, memory[..., :1]], -1),
                                            key_padding_mask=~real)
        got = ex.cross_attend_reference(y, memory, real, W_Q, W_K, W_V)
        assert torch.allclose(got[0], expected, atol=1e-5) and torch.allclose(got[1], weights, atol=1e-6)
        assert torch.allclose(got[0], F.scaled_dot_product_attention(
            y @ W_Q, memory @ W_K, memory @ W_V, attn_mask=real[:, None, :]), atol=1e-5)


def sdpa_attend(y, memory, memory_real, W_Q, W_K, W_V):
    """torch's fused attention for the output, 02's function for the weights."""
    Q, K, V = y @ W_Q, memory @ W_K, memory @ W_V
    weights = ah.scaled_dot_product_attention(Q, K, V, memory_real[:, None, :])[1]
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=memory_real[:, None, :]), weights


def additive_attend(y, memory, memory_real, W_Q, W_K, W_V):
    """An additive -1e9 mask, a unsqueezed mask and .mT: written another way."""
    Q, K, V = y @ W_Q, memory @ W_K, memory @ W_V
    scores = Q @ K.mT * Q.shape[-1] ** -0.5 + (~memory_real).unsqueeze(1) * -1e9
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, weights


def test_cross_attend_checker_accepts_the_reference_and_other_correct_answers():
    assert ex.check_cross_attend(ex.cross_attend_reference, solution=True)
    for answer in (sdpa_attend, additive_attend, lambda *a: ex._attend_with(*a)):
        verdict = ex.check_cross_attend(answer)
        assert verdict and verdict.message.endswith("edge cases included."), verdict.message


@pytest.mark.parametrize("flaw, words", [
    ({"mask": None}, "padded memory positions were read"),
    ({"mask": "queries"}, "laid along the queries, (b, n_k, 1)"),
    ({"mask": "batch"}, "batch axis met the scores' query axis"),
    ({"mask": "inverted"}, "the mask is inverted"),
    ({"causal": True}, "cross-attention needs no causal mask"),
    ({"kv_from": "y"}, "the keys and values came from the decoder states y"),
    ({"queries_from": "memory", "kv_from": "y"}, "the roles are swapped"),
    ({"values": "W_K"}, "the values were the keys"),
    ({"softmax_dim": -2}, "the softmax ran over dim -2"),
    ({"scale": None}, "the scores were not scaled"), ({"scale": "d_m"}, "divided by sqrt(d_m)"),
    ({"scale": "d2"}, "divided by d;"), ({"mask": "times"}, "a score of 0 is not -inf"),
    ({"scale": "n_k"}, "divided by sqrt(n_k), the number of memory positions"),
    ({"mask": "after"}, "the mask came after the softmax"),
    ({"scale": "output"}, "the output was divided by sqrt(d), after the weighted sum"),
    ({"transposed": ("W_Q",)}, "a weight was transposed: x @ W.T is nn.Linear's habit"),
    ({"transposed": ("W_Q", "W_K", "W_V")}, "the weights were transposed"),
    ({"zero_padded_rows": True}, "padded memory rows were set to zero instead of masked"),
    ({"swapped": True}, "the two results are swapped")])
def test_cross_attend_checker_names_the_mistake(flaw, words):
    assert_rejected(ex.check_cross_attend(lambda *a: ex._attend_with(*a, **flaw)), "\nHint: ", words)


def test_cross_attend_checker_names_padded_scores_filled_with_zero():
    def filled_with_zero(y, memory, memory_real, W_Q, W_K, W_V):
        Q, K, V = y @ W_Q, memory @ W_K, memory @ W_V
        scores = (Q @ K.mT / Q.shape[-1] ** 0.5).masked_fill(~memory_real[:, None, :], 0.0)
        return scores.softmax(-1) @ V, scores.softmax(-1)
    assert_rejected(ex.check_cross_attend(filled_with_zero), "\nHint: the padded scores were set "
                    "to 0 (masked_fill with 0, or the scores times the mask)", "Fill them with -inf")


def test_cross_attend_checker_explains_a_mask_that_does_not_fit_and_a_missing_output():
    def queries_masked(y, memory, memory_real, W_Q, W_K, W_V):   # m != n: the shapes clash
        Q, K, V = y @ W_Q, memory @ W_K, memory @ W_V
        if Q.shape[1] == K.shape[1]:
            return ex.cross_attend_reference(y, memory, memory_real, W_Q, W_K, W_V)
        scores = (Q @ K.mT / Q.shape[-1] ** 0.5).masked_fill(~memory_real[..., None], -math.inf)
        return scores.softmax(-1) @ V, scores.softmax(-1)
    assert_rejected(ex.check_cross_attend(queries_masked), "case 2 of 4", "the shapes do not fit",
                    "\nHint: the shapes do not fit the scores (b, n_q, n_k)")
    assert_rejected(ex.check_cross_attend(lambda *a: ex.cross_attend_reference(*a)[0]),
                    "returned 1 value(s); expected 2")


def test_the_level_3_skeletons_filled_in_pass():
    decode = skeleton("cross_attention.decode", "layer, y, memory, memory_real", (
        "ah.split_heads(ca.k_proj(memory), h)", "ah.split_heads(ca.v_proj(memory), h)",
        "ah.split_heads(ca.q_proj(x_t), h)",
        "ah.scaled_dot_product_attention(q, K_m, V_m, memory_real[:, None, None, :])",
        "layer.norm2(x_t + ca.out_proj(ah.merge_heads(o)))",
        "layer.norm3(x_t + layer.feed_forward(x_t))"),
        prefix=GIVEN, ah=ah)
    assert ex.check_decode_layer(decode)
    attend = skeleton("cross_attention.attend", "y, memory, memory_real, W_Q, W_K, W_V", (
        "y @ W_Q, memory @ W_K, memory @ W_V", "Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])",
        "scores.masked_fill(~memory_real[:, None, :], float('-inf'))", "torch.softmax(scores, -1)"))
    assert ex.check_cross_attend(attend)


def test_hints_before_the_skeleton_do_not_state_the_solution():
    hints = EXERCISES["cross_attention.decode"].hints
    for fragment in ("<-", "LN_2(", "LN_3(", "norm(x + block(x))", "norm2(x_t", "split_heads(ca"):
        assert fragment not in hints[0] + hints[1], fragment
    hints = EXERCISES["cross_attention.attend"].hints
    for fragment in ("y @ W_Q", "memory @ W_K", "[:, None, :]", "softmax(-1)", "masked_fill"):
        assert fragment not in hints[0] + hints[1], fragment
