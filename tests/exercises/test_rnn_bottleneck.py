"""Notebook 01's checkers (``exercises.rnn_bottleneck``): the references pass and agree with the
notebook's model, a stub is "not implemented yet" and nothing more, and every plausible wrong
answer is rejected with a message that names the mistake."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, from_hint, stub

from attn_helpers import AdditiveScore
from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import rnn_bottleneck as ex


def test_the_exercises_are_registered_with_three_hints():
    for key in ("rnn_bottleneck.context_vector", "rnn_bottleneck.additive_scores"):
        assert len(EXERCISES[key].hints) == 3


# --- exercise 1: the context vector ------------------------------------------------------------


def context(H, e, src_mask):  # noqa: N803
    a = torch.softmax(e.masked_fill(~src_mask, float("-inf")), dim=-1)
    return torch.einsum("bn,bnd->bd", a, H), a


def test_context_vector_reference_is_a_convex_combination_that_ignores_padding():
    g = torch.Generator().manual_seed(0)
    H, e = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, generator=g)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    c, a = ex.context_vector_reference(H, e, mask)
    assert torch.allclose(a.sum(-1), torch.ones(2)) and (a[1, 2:] == 0).all()
    changed = H.clone()
    changed[1, 2:] = 100.0                       # padding states do not reach c_t
    assert torch.equal(ex.context_vector_reference(changed, e, mask)[0], c)


def test_context_vector_accepts_right_answers():
    def with_bmm(H, e, src_mask):  # noqa: N803
        scores = torch.where(src_mask, e, torch.full_like(e, -1e30))
        scores = scores - scores.amax(-1, keepdim=True)
        weights = scores.exp() * src_mask
        weights = weights / weights.sum(-1, keepdim=True)
        return torch.bmm(weights[:, None, :], H)[:, 0], weights

    for right in (context, with_bmm, ex.context_vector_reference):
        result = ex.check_context_vector(right)
        assert result and result.message.startswith("Passed"), result.message


def test_context_vector_stub_says_only_not_implemented():
    assert ex.check_context_vector(stub).message == "context_vector is not implemented yet."


def mixed(weights):
    def wrong(H, e, src_mask):  # noqa: N803
        a = weights(e, src_mask)
        return (a.unsqueeze(-1) * H).sum(1), a
    return wrong


def no_max(H, e, src_mask):  # noqa: N803
    w = torch.exp(e) * src_mask
    a = w / w.sum(-1, keepdim=True)
    return (a.unsqueeze(-1) * H).sum(1), a


@pytest.mark.parametrize("wrong, fragments", [
    (mixed(lambda e, m: e.softmax(-1)), ["padding positions received weight"]),
    (mixed(lambda e, m: e.masked_fill(m, -torch.inf).softmax(-1)), ["mask is inverted"]),
    (mixed(lambda e, m: e.masked_fill(~m, 0).softmax(-1)), ["exp(0) = 1"]),
    (mixed(lambda e, m: e.masked_fill(~m, -torch.inf).softmax(0)), ["over the batch (dim=0)"]),
    (mixed(lambda e, m: torch.where(m, e, 0.0)), ["raw scores"]),
    (mixed(lambda e, m: m / m.sum(-1, keepdim=True)), ["same weight"]),
    (no_max, ["nan", "overflows", "case 5 of 6"]),
    (lambda H, e, m: (H.mean(1), e.softmax(-1)), ["the context c_t differs"]),
    (lambda H, e, m: context(H, e, m)[::-1], ["the context c_t has shape (2, 6)"]),
])
def test_context_vector_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_context_vector(wrong), *fragments)


# --- exercise 2: the additive score ------------------------------------------------------------


def scores(s, H, U_q, U_k, v_a):  # noqa: N803
    return torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a


def test_additive_reference_is_the_notebooks_scorer():
    """The reference equals ``ah.AdditiveScore`` (the scorer in notebook 01's model) with
    ``U_q = w_q.weight.T``, ``U_k = w_k.weight.T``, ``v_a = w_v.weight[0]``."""
    torch.manual_seed(0)
    scorer = AdditiveScore(4, 6, 5)
    s, H = torch.randn(3, 4), torch.randn(3, 7, 6)
    expected = scorer(s[:, None, :], H)[:, 0, :]
    got = ex.additive_scores_reference(s, H, scorer.w_q.weight.T, scorer.w_k.weight.T,
                                       scorer.w_v.weight[0])
    assert got.shape == (3, 7) and torch.allclose(got, expected, atol=1e-6)


def test_additive_scores_accepts_right_answers():
    def with_loops(s, H, U_q, U_k, v_a):  # noqa: N803
        return torch.stack([torch.stack([torch.tanh(s[i] @ U_q + h @ U_k) @ v_a for h in H[i]])
                            for i in range(len(s))])

    for right in (scores, with_loops, ex.additive_scores_reference):
        result = ex.check_additive_scores(right)
        assert result and result.message.startswith("Passed"), result.message


def test_additive_scores_stub_says_only_not_implemented():
    assert ex.check_additive_scores(stub).message == "additive_scores is not implemented yet."


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, H, U_q, U_k, v_a: ((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["tanh is missing"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a),
     ["tanh comes before v_a"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) * (H @ U_k)) @ v_a,
     ["multiplied the two projections"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(H @ U_k) @ v_a, ["decoder state s_t is missing"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_k).unsqueeze(1) + H @ U_q) @ v_a,
     ["U_q and U_k are swapped"]),
    (lambda s, H, U_q, U_k, v_a: torch.relu((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["ReLU"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).softmax(-1), ["after a softmax"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(s @ U_q + H @ U_k) @ v_a,        # no axis for j
     ["raised RuntimeError", "case 1 of 5"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),
     ["shape (2, 5, 3)", "shape (2, 5)"]),
])
def test_additive_scores_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_additive_scores(wrong), *fragments)



@pytest.mark.parametrize("key, signature, check", [
    ("rnn_bottleneck.context_vector", "H, e, src_mask", ex.check_context_vector),
    ("rnn_bottleneck.additive_scores", "s, H, U_q, U_k, v_a", ex.check_additive_scores),
])
def test_the_third_hint_passes_once_it_is_in_the_stub(key, signature, check):
    assert check(from_hint(key, signature))
