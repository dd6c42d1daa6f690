"""The checkers of notebook 06 (``exercises.cross_attention``): each accepts the reference and a
learner's other correct solutions, and rejects plausible wrong answers with a message that names
the mistake. The references are checked against PyTorch and against the trained model."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_rejected, from_hint

import attn_helpers as ah
from attn_helpers.exercises import cross_attention as ex
from attn_helpers.exercises.workflow import EXERCISES

CHECKERS = [(ex.check_decode_contexts, "decode_contexts", "cross_attention.decode"),
            (ex.check_alignment_accuracy, "alignment_accuracy", "cross_attention.alignment")]


@pytest.mark.parametrize("check, what, key", CHECKERS)
def test_a_stub_is_not_implemented_yet_and_nothing_more(check, what, key):
    def stub(*args):
        raise NotImplementedError

    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key == key and key in EXERCISES


# --- the references against independent implementations -------------------------------------


def test_decode_reference_is_cross_attention_of_all_steps_at_once():
    for case in ex._decode_cases():
        S, H, lengths, q_proj, k_proj, v_proj = case.values()
        contexts, weights = ex.decode_contexts_reference(*case.values())
        mask = ah.padding_mask(lengths, H.shape[1])[:, None, :]
        expected = ah.scaled_dot_product_attention(q_proj(S), k_proj(H), v_proj(H), mask)
        assert torch.allclose(contexts, expected[0], atol=1e-6)
        assert torch.allclose(weights, expected[1], atol=1e-6)


# --- exercise 1: every step, K and V once -----------------------------------------------------


def learner_step(s_t, K, V, lengths, q_proj, *, keep=None, scale=None, dim=-1, fill=-math.inf,
                 manual_exp=False, zero_empty=True, values=None, query=None):
    """A learner's step written out by hand; each keyword plants one mistake."""
    q = q_proj(s_t) if query is None else query(s_t, q_proj)  # (b, d_k)
    scores = torch.einsum("bk,bnk->bn", q, K) * (K.shape[-1] ** -0.5 if scale is None else scale)
    positions = torch.arange(K.shape[1])[None, :]
    real = positions < lengths[:, None] if keep is None else keep(positions, lengths[:, None])
    scores = scores.masked_fill(~real, fill)
    if manual_exp:
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
    else:
        weights = torch.softmax(scores, dim=dim)
    if zero_empty:
        weights = weights.nan_to_num(0.0) * real.any(-1, keepdim=True)
    return torch.einsum("bn,bnv->bv", weights, V if values is None else values(K, V)), weights


def learner_decode(S, H, lengths, q_proj, k_proj, v_proj, *, per_step=False, stack_dim=1,
                   same_query=False, swap=False, step=learner_step):
    K, V = (None, None) if per_step else (k_proj(H), v_proj(H))
    contexts, weights = [], []
    for t in range(S.shape[1]):
        if per_step:
            K, V = k_proj(H), v_proj(H)
        keys, values = (V, K) if swap else (K, V)
        c, a = step(S[:, 0 if same_query else t], keys, values, lengths, q_proj)
        contexts.append(c)
        weights.append(a)
    return torch.stack(contexts, stack_dim), torch.stack(weights, stack_dim)


def test_decode_checker_accepts_a_loop_and_a_vectorised_solution():
    assert ex.check_decode_contexts(ex.decode_contexts_reference)
    assert ex.check_decode_contexts(learner_decode)

    def all_at_once(S, H, lengths, q_proj, k_proj, v_proj):
        real = torch.arange(H.shape[1])[None, None, :] < lengths[:, None, None]   # (b, 1, n)
        return ah.scaled_dot_product_attention(q_proj(S), k_proj(H), v_proj(H), real)

    assert ex.check_decode_contexts(all_at_once)


DECODE_WRONG = {
    "k_proj ran 4 times": dict(per_step=True),
    "stacked along dim 0": dict(stack_dim=0),
    "every step used the same query s_0": dict(same_query=True),
    "keys and values are swapped": dict(swap=True),
    "padded encoder positions received weight": dict(
        step=lambda *a: learner_step(*a, keep=lambda j, L: j >= 0)),
    "the scores were not scaled": dict(step=lambda *a: learner_step(*a, scale=1.0)),
}


@pytest.mark.parametrize("phrase", DECODE_WRONG)
def test_decode_checker_names_the_mistake(phrase):
    verdict = ex.check_decode_contexts(lambda *a: learner_decode(*a, **DECODE_WRONG[phrase]))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_counting_linear_counts_and_prints_briefly():
    proj = ex.CountingLinear(3, 2, bias=True, generator=torch.Generator().manual_seed(0))
    proj(torch.ones(3))
    proj(torch.ones(2, 3))
    assert proj.calls == 2 and repr(proj) == "nn.Linear(3 -> 2)"


# --- exercise 2: the hard alignment and its accuracy ------------------------------------------


def learner_alignment(weights, src_real, gold, tgt_real, *, mask_pad=True, invert=False, dim=-1,
                      count_padded=False, padded_as_miss=False, per_sentence=False, mark=True):
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
    if count_padded:
        return alignment, hits.double().mean().item()
    hits = hits & tgt_real
    if padded_as_miss:
        return alignment, hits.double().mean().item()
    if per_sentence:
        return alignment, (hits.sum(1) / tgt_real.sum(1)).mean().item()
    return alignment, hits.sum().item() / tgt_real.sum().item()


def test_alignment_checker_accepts_the_reference_and_a_loop_with_python_floats():
    assert ex.check_alignment_accuracy(ex.alignment_accuracy_reference)
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
}


@pytest.mark.parametrize("phrase", ALIGNMENT_WRONG)
def test_alignment_checker_names_the_mistake(phrase):
    verdict = ex.check_alignment_accuracy(
        lambda *a: learner_alignment(*a, **ALIGNMENT_WRONG[phrase]))
    assert_rejected(verdict, phrase)


def test_alignment_checker_refuses_weights_as_the_alignment():
    verdict = ex.check_alignment_accuracy(lambda w, s, g, t: (w.max(-1).values, 1.0))
    assert_rejected(verdict, "integer tensor")


def test_alignment_cases_have_padding_that_would_win_and_uneven_targets():
    cases = ex._alignment_cases()
    assert any(bool((c["weights"].argmax(-1) >= c["src_real"].sum(-1)[:, None]).any()) for c in cases)
    assert all(len(set(c["tgt_real"].sum(1).tolist())) > 1 for c in cases if len(c["gold"]) > 1)
    assert any(c["weights"].dtype == torch.float64 for c in cases)


def test_alignment_reference_on_the_reversal_model_is_the_mirror_share_of_the_notebook():
    from attn_helpers.lessons import cross_attention, rnn_bottleneck

    model = rnn_bottleneck.load_pretrained("seq2seq_reversal_additive")
    got = cross_attention.reversal_alignment_accuracy(model, ex.alignment_accuracy_reference)
    assert got["accuracy"] == pytest.approx(got["mirror share"], abs=1e-9)


def test_the_level_3_hints_are_working_code():
    decode = from_hint("cross_attention.decode", "S, H, lengths, q_proj, k_proj, v_proj", ah=ah)
    assert ex.check_decode_contexts(decode)
    alignment = from_hint("cross_attention.alignment", "weights, src_real, gold, tgt_real")
    assert ex.check_alignment_accuracy(alignment)
