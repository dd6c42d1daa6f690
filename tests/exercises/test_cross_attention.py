"""The checkers of notebook 06 (``exercises.cross_attention``): each accepts the reference and a
learner's other correct solutions, and rejects plausible wrong answers with a message that names
the mistake. The references are checked against PyTorch and against the trained model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attn_helpers as ah
from attn_helpers.exercises import cross_attention as ex
from attn_helpers.exercises.workflow import EXERCISES

CHECKERS = [(ex.check_cross_attention_step, "cross_attention_step", "cross_attention.step"),
            (ex.check_decode_contexts, "decode_contexts", "cross_attention.decode")]


@pytest.mark.parametrize("check, what, key", CHECKERS)
def test_a_stub_is_not_implemented_yet_and_nothing_more(check, what, key):
    def stub(*args):
        raise NotImplementedError

    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key == key and key in EXERCISES


# --- the references against independent implementations -------------------------------------


def _cases(stages):
    return [case for cases, _, _ in stages for case in cases]


def test_step_reference_is_torch_sdpa_and_zero_for_an_empty_sentence():
    for case in _cases(ex._step_stages()):
        s_t, K, V, lengths, q_proj = case.values()
        context, weights = ex.cross_attention_step_reference(s_t, K, V, lengths, q_proj)
        real = torch.arange(K.shape[1])[None, :] < lengths[:, None]
        for i in range(len(lengths)):
            if lengths[i] == 0:
                assert torch.all(context[i] == 0) and torch.all(weights[i] == 0)
                continue
            expected = F.scaled_dot_product_attention(q_proj(s_t[i])[None, None], K[i][None],
                                                      V[i][None], attn_mask=real[i][None, None])
            assert torch.allclose(context[i], expected[0, 0], atol=1e-6)
            assert torch.allclose(weights[i].sum(), torch.ones((), dtype=weights.dtype))
            assert torch.all(weights[i][~real[i]] == 0)


def test_decode_reference_is_cross_attention_of_all_steps_at_once():
    for case in ex._decode_cases():
        S, H, lengths, q_proj, k_proj, v_proj = case.values()
        contexts, weights = ex.decode_contexts_reference(*case.values())
        mask = ah.padding_mask(lengths, H.shape[1])[:, None, :]
        expected = ah.scaled_dot_product_attention(q_proj(S), k_proj(H), v_proj(H), mask)
        assert torch.allclose(contexts, expected[0], atol=1e-6)
        assert torch.allclose(weights, expected[1], atol=1e-6)


# --- exercise 1: one decoding step ------------------------------------------------------------


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


def test_step_checker_accepts_the_reference_and_learner_solutions():
    assert ex.check_cross_attention_step(ex.cross_attention_step_reference)
    assert ex.check_cross_attention_step(learner_step)

    def with_course_helper(s_t, K, V, lengths, q_proj):
        real = ah.padding_mask(lengths, K.shape[1])[:, None, :]
        context, weights = ah.scaled_dot_product_attention(q_proj(s_t)[:, None], K, V, real)
        return context.squeeze(1), weights.squeeze(1)

    verdict = ex.check_cross_attention_step(with_course_helper)
    total = len(_cases(ex._step_stages()))
    assert verdict and verdict.message.endswith(f"on all {total} cases, edge cases included.")


def _planted(**mistake):
    return lambda s_t, K, V, lengths, q_proj: learner_step(s_t, K, V, lengths, q_proj, **mistake)


STEP_WRONG = {
    "padded encoder positions received weight": _planted(keep=lambda j, L: j >= 0),
    "the mask is inverted": _planted(keep=lambda j, L: j >= L),
    "off by one": _planted(keep=lambda j, L: j <= L),
    "the scores were not scaled": _planted(scale=1.0),
    "the scale uses the decoder state's width d":
        lambda s_t, *rest: learner_step(s_t, *rest, scale=s_t.shape[-1] ** -0.5),
    "the softmax ran over the batch": _planted(dim=0, zero_empty=False),
    "weighted sum of the values V, not of the keys K": _planted(values=lambda K, V: K),
    "the projection's bias is missing": _planted(query=lambda s, proj: s @ proj.weight.T),
    "exp overflowed": _planted(manual_exp=True, zero_empty=False),
    "the NaN it gave were then turned into zeros": _planted(manual_exp=True),
    "a softmax over all -inf is 0/0 = NaN": _planted(zero_empty=False),
    "got uniform weights over its padding": _planted(fill=-1e9, zero_empty=False),
}


@pytest.mark.parametrize("phrase", STEP_WRONG)
def test_step_checker_names_the_mistake(phrase):
    verdict = ex.check_cross_attention_step(STEP_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_step_cases_cover_the_edge_cases():
    cases = _cases(ex._step_stages())
    assert any(c["K"].shape[1] == 1 for c in cases)                   # one encoder token
    assert any(bool((c["lengths"] == 0).any()) for c in cases)        # an empty sentence
    assert any(c["K"].dtype == torch.float64 for c in cases)          # float64
    assert any(c["s_t"].abs().max() > 30 for c in cases)              # scores that overflow exp
    assert all((c["lengths"] < c["K"].shape[1]).all() for c in cases[:1])   # every row padded


# --- exercise 2: every step, K and V once -----------------------------------------------------


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
