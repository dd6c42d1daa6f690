"""Notebook 06's checkers: each accepts correct answers and names each known mistake; the decoder
reference is checked against PyTorch's."""

from __future__ import annotations

import math

import pytest
import torch
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


def learner_alignment(weights, src_real, gold, tgt_real, *, mask_pad=True, invert=False, dim=-1,
                      count_padded=False, padded_as_miss=False, per_sentence=False, mark=True,
                      padded_as_hit=False):
    """A learner's answer written out by hand, with a loop; each keyword plants one mistake."""
    keep = ~src_real if invert else src_real
    scores = weights.clone()
    if mask_pad:
        scores[~keep[:, None, :].expand_as(scores)] = float("-inf")
    alignment = scores.argmax(dim)
    if mark:
        alignment = torch.where(tgt_real, alignment, torch.full_like(alignment, -1))
    if dim != -1:
        return alignment, 0.0
    hits = alignment == gold
    if padded_as_hit:                                 # -1 == -1 at padded steps: counted as hits
        return alignment, hits.sum().item() / tgt_real.sum().item()
    if count_padded:
        return alignment, hits.double().mean().item()
    hits = hits & tgt_real
    if padded_as_miss:
        return alignment, hits.double().mean().item()
    if per_sentence:
        return alignment, (hits.sum(1) / tgt_real.sum(1)).mean().item()
    return alignment, hits.sum().item() / tgt_real.sum().item()


def test_alignment_checker_accepts_the_reference_and_a_loop_with_python_floats():
    assert ex.check_alignment_accuracy(ex.alignment_accuracy_reference, solution=True)
    verdict = ex.check_alignment_accuracy(learner_alignment)
    assert verdict and verdict.message.endswith("edge cases included.")


ALIGNMENT_WRONG = {
    "padding won the argmax": dict(mask_pad=False),
    "the mask is inverted": dict(invert=True),
    "the argmax ran over the output steps": dict(dim=1, mark=False),
    "padded output steps counted in the accuracy": dict(count_padded=True),
    "padded output steps counted as misses": dict(padded_as_miss=True),
    "mean of per-sentence accuracies": dict(per_sentence=True),
    "must be marked -1": dict(mark=False),
    "padded output steps counted as hits": dict(padded_as_hit=True),
}


@pytest.mark.parametrize("phrase", ALIGNMENT_WRONG)
def test_alignment_checker_names_the_mistake(phrase):
    verdict = ex.check_alignment_accuracy(
        lambda *a: learner_alignment(*a, **ALIGNMENT_WRONG[phrase]))
    assert_rejected(verdict, phrase)


def test_a_mistake_named_only_if_it_gives_the_answer_on_every_case():   # hits / src_real.sum()
    def by_sources(w, s, g, t):               # equals "counted as hits" on case 1 by chance (0.75)
        a = ex.alignment_accuracy_reference(w, s, g, t)[0]
        return a, ((a == g) & t).sum() / s.sum()
    verdict = ex.check_alignment_accuracy(by_sources)
    assert not verdict and "\nHint: " not in verdict.message, verdict.message


def test_alignment_checker_refuses_weights_as_the_alignment():
    verdict = ex.check_alignment_accuracy(lambda w, s, g, t: (w.max(-1).values, 1.0))
    assert_rejected(verdict, "integer tensor")


def test_the_level_3_skeletons_filled_in_pass():
    decode = skeleton("cross_attention.decode", "layer, y, memory, memory_real", (
        "ah.split_heads(ca.k_proj(memory), h)", "ah.split_heads(ca.v_proj(memory), h)",
        "ah.split_heads(ca.q_proj(x_t), h)",
        "ah.scaled_dot_product_attention(q, K_m, V_m, memory_real[:, None, None, :])",
        "layer.norm2(x_t + ca.out_proj(ah.merge_heads(o)))",
        "layer.norm3(x_t + layer.feed_forward(x_t))"),
        prefix=GIVEN, ah=ah)
    assert ex.check_decode_layer(decode)
    alignment = skeleton("cross_attention.alignment", "weights, src_real, gold, tgt_real", (
        "weights.masked_fill(~src_real[:, None, :], float('-inf'))",
        "scores.argmax(-1).masked_fill(~tgt_real, -1)", "(alignment == gold) & tgt_real",
        "hits.sum() / tgt_real.sum()"))
    assert ex.check_alignment_accuracy(alignment)


def test_decode_hints_before_the_skeleton_do_not_state_the_solution():
    hints = EXERCISES["cross_attention.decode"].hints
    for fragment in ("<-", "LN_2(", "LN_3(", "norm(x + block(x))", "norm2(x_t", "split_heads(ca"):
        assert fragment not in hints[0] + hints[1], fragment


def test_an_alignment_miss_names_one_step_not_the_whole_answer():
    expected, _ = ex.alignment_accuracy_reference(*ex._alignment_cases()[0].values())
    verdict = ex.check_alignment_accuracy(lambda *a: learner_alignment(*a, mask_pad=False))
    assert_rejected(verdict, "case 1 of 4", "you returned the alignment with wrong values: at index")
    assert str(expected[0].tolist()) not in verdict.message              # no row of the answer
    verdict = ex.check_alignment_accuracy(lambda *a: learner_alignment(*a, dim=1, mark=False))
    assert_rejected(verdict, "you returned the alignment with shape", "output steps (dim 1)")
    verdict = ex.check_alignment_accuracy(lambda *a: learner_alignment(*a, mask_pad=False, mark=False))
    assert_rejected(verdict, "(0, 1) you gave 5", "\nHint: at index (0, 1) you chose source position "
                    "5, which is padding in sentence 0")
