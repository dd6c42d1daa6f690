"""Notebook 03's checkers: each accepts the reference and correct variants, names each mistake of
its table, and learners' own spellings of a few of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _exercises import assert_skeleton

from attn_helpers import exercises
from attn_helpers.exercises import scaling as ex
from attn_helpers.exercises.scaling import (
    check_choose_scale,
    check_projection_gradients,
    check_softmax_backward,
)


def choose_scale(x, W_Q, W_K):
    S = (x @ W_Q) @ (x @ W_K).T                 # (n, n)
    return 1 / S.var(dim=-1).mean().sqrt().item()


def _S(x, W_Q, W_K):
    return (x @ W_Q) @ (x @ W_K).T


def softmax_backward(scores, grad_weights):
    a = torch.softmax(scores, dim=-1)
    return a * (grad_weights - (a * grad_weights).sum(dim=-1, keepdim=True))


def projection_gradients(x, W_Q, W_K, scale, grad_weights):
    Q, K = x @ W_Q, x @ W_K                         # (..., n, d_k)
    dS = softmax_backward(scale * Q @ K.mT, grad_weights)
    dQ, dK = scale * dS @ K, scale * dS.mT @ Q      # (..., n, d_k)
    grad_W_Q, grad_W_K = x.mT @ dQ, x.mT @ dK       # (..., d_model, d_k)
    return (grad_W_Q.sum(0), grad_W_K.sum(0)) if x.dim() == 3 else (grad_W_Q, grad_W_K)


def _flattened(x, W_Q, W_K, scale, g):
    """Every token of every sequence as one row of x: the batch's sum comes out of the product."""
    Q, K = x @ W_Q, x @ W_K
    dS = softmax_backward(scale * Q @ K.transpose(-2, -1), g)
    dQ, dK = scale * dS @ K, scale * dS.transpose(-2, -1) @ Q
    rows = x.reshape(-1, x.shape[-1])
    return rows.T @ dQ.reshape(-1, dQ.shape[-1]), rows.T @ dK.reshape(-1, dK.shape[-1])


def _einsum(x, W_Q, W_K, scale, g):
    Q, K = x @ W_Q, x @ W_K
    a = torch.softmax(scale * torch.einsum("...ik,...jk->...ij", Q, K), -1)
    dS = a * (g - (a * g).sum(-1, keepdim=True))
    return (scale * torch.einsum("...id,...ij,...jk->dk", x, dS, K),
            scale * torch.einsum("...jd,...ij,...ik->dk", x, dS, Q))


@pytest.mark.parametrize("check, answer", [
    (check_choose_scale, choose_scale),
    (check_choose_scale, lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(-1, unbiased=False).mean().sqrt()),
    (check_choose_scale,  # centring each row first, then the variance of everything: the same number
     lambda x, W_Q, W_K: 1 / (_S(x, W_Q, W_K) - _S(x, W_Q, W_K).mean(-1, keepdim=True)).var().sqrt()),
    (check_choose_scale, lambda x, W_Q, W_K: np.float32(choose_scale(x, W_Q, W_K))),  # one number
    (check_softmax_backward, softmax_backward),
    (check_projection_gradients, projection_gradients), (check_projection_gradients, _flattened),
    (check_projection_gradients, _einsum)])
def test_each_checker_accepts_the_reference_and_other_correct_forms(check, answer):
    verdict = check(answer)
    assert verdict, verdict.message


@pytest.mark.parametrize("check, mistake", [
    *((check_choose_scale, m) for m in ex.CHOOSE_SCALE_MISTAKES),
    *((check_softmax_backward, m) for m in ex.BACKWARD_MISTAKES),
    *((check_projection_gradients, m) for m in ex.PROJECTION_MISTAKES)],
    ids=lambda v: v.hint[:30] if isinstance(v, ex.Mistake) else v.__name__)
def test_each_checker_names_each_mistake_of_its_table(check, mistake):
    verdict = check(mistake.produce)
    assert not verdict and verdict.message.endswith("\nHint: " + mistake.hint), verdict.message
    assert "(g - <a, g>)" not in verdict.message                     # no hint gives it away


def _via_jacobian(s, g):
    a = torch.softmax(s, -1)
    return ((torch.diag_embed(a) - a[..., :, None] * a[..., None, :]) @ g[..., None])[..., 0]


def _via_outer_product(s, g):
    a = torch.softmax(s, -1)
    J = -a[..., :, None] * a[..., None, :]
    i = torch.arange(s.shape[-1])
    J[..., i, i] += a
    return (J @ g[..., None])[..., 0]


def _naive_projection(x, W_Q, W_K, scale, g):
    s = scale * (x @ W_Q) @ (x @ W_K).mT
    a = s.exp() / s.exp().sum(-1, keepdim=True)
    dS = a * (g - (a * g).sum(-1, keepdim=True))
    grads = x.mT @ (scale * dS @ (x @ W_K)), x.mT @ (scale * dS.mT @ (x @ W_Q))
    return tuple(t.sum(0) for t in grads) if x.dim() == 3 else grads


def _with_T(x, W_Q, W_K, scale, g):
    Q, K = x @ W_Q, x @ W_K
    dS = softmax_backward(scale * Q @ K.T, g)
    return x.T @ (scale * dS @ K), x.T @ (scale * dS.T @ Q)


def _weights_for_dS(x, W_Q, W_K, scale, g):
    Q, K = x @ W_Q, x @ W_K
    A = torch.softmax(scale * Q @ K.mT, dim=-1)
    grads = x.mT @ (scale * A @ K), x.mT @ (scale * A.mT @ Q)
    return tuple(t.sum(0) for t in grads) if x.dim() == 3 else grads


def _keys_in_dK(x, W_Q, W_K, scale, g):
    Q, K = x @ W_Q, x @ W_K
    dS = softmax_backward(scale * Q @ K.mT, g)
    grads = x.mT @ (scale * dS @ K), x.mT @ (scale * dS.mT @ K)
    return tuple(t.sum(0) for t in grads) if x.dim() == 3 else grads


@pytest.mark.filterwarnings("ignore:The use of `x.T`")   # torch warns once per process
@pytest.mark.parametrize("check, wrong, words", [
    (check_choose_scale, lambda x, W_Q, W_K: _S(x, W_Q, W_K).var(-1), ("return one number", "(200,)")),
    (check_softmax_backward, lambda s, g: (lambda a: a * (g - (a * g).sum(-1)))(torch.softmax(s, -1)),
     ("without keepdim it is (...,)",)),
    (check_softmax_backward, lambda s, g: (lambda a: a * (g - (a * g).sum(-1, keepdim=True)))(
        s.exp() / s.exp().sum(-1, keepdim=True)), ("Subtract each row's max",)),
    (check_choose_scale, lambda x, W_Q, W_K: 1 / ((x @ W_Q) @ (x @ W_K)).var(-1).mean().sqrt(),
     ("shapes do not fit", "\nHint: the scores are S = Q K^T", "transpose the keys")),
    (check_choose_scale, lambda x, W_Q, W_K: (lambda S: 1 / (S - S.mean(dim=0)).var().sqrt().item())(
        _S(x, W_Q, W_K)), ("\nHint: you subtracted each column's mean",)),
    (check_softmax_backward, lambda s, g: (lambda a: a * (1 - a) * (g - (a * g).sum(-1)[..., None]))(
        torch.softmax(s, -1)), ("\nHint: the factor (1 - a_i) is extra",)),
    (check_softmax_backward, lambda s, g: (lambda a: a * g - (a ** 2 * g).sum(-1, keepdim=True))(
        torch.softmax(s, -1)), ("\nHint: the a_i of (a a^T g)_i",)),
    (check_softmax_backward, lambda s, g: (lambda a: a * (g - (a * a * g).sum(-1)[..., None]))(
        torch.softmax(s, -1)), ("\nHint: <a, g> = sum_j a_j g_j carries one",)),
    (check_projection_gradients, _weights_for_dS, ("\nHint: you used the weights A where dS",)),
    (check_projection_gradients, _keys_in_dK, ("\nHint: dK used the keys",)),
    (check_projection_gradients, _naive_projection, ("case 6 of 6", "Subtract each row's max")),
    (check_projection_gradients, _with_T, ("case 5 of 6", ".mT"))])
def test_checkers_name_learners_own_spellings(check, wrong, words):
    verdict = check(wrong)
    assert not verdict and all(w in verdict.message for w in words), verdict.message


def test_choose_scale_names_a_mistake_only_if_it_matches_on_every_case():
    def per_token(x, W_Q, W_K):          # matches 'the median row' on case 1 alone, by chance
        return choose_scale((x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True), W_Q, W_K)
    verdict = check_choose_scale(per_token)
    assert not verdict and "Hint" not in verdict.message, verdict.message


@pytest.mark.parametrize("shortcut", [_via_jacobian, _via_outer_product])
def test_softmax_backward_refuses_building_the_jacobian(shortcut):
    verdict = check_softmax_backward(shortcut)
    assert not verdict and "as big as the (..., n, n) Jacobian" in verdict.message, verdict.message
    assert "WITHOUT J" in verdict.message and "<a, g>" not in verdict.message  # why, not the answer


def test_exercise_2s_stub_inside_exercise_3_is_named():
    """Exercise 3 may call the learner's softmax_backward: while that is still the stub, the verdict
    says so."""
    notebook: dict = {}
    exec("def softmax_backward(scores, grad_weights):\n    raise NotImplementedError\n"  # noqa: S102
         "def projection_gradients(x, W_Q, W_K, scale, grad_weights):\n"
         "    return softmax_backward(scale * (x @ W_Q) @ (x @ W_K).mT, grad_weights)\n", notebook)
    verdict = check_projection_gradients(notebook["projection_gradients"])
    assert not verdict and "still exercise 2's stub" in verdict.message, verdict.message


@pytest.mark.parametrize("key, answers", [
    ("scaling.softmax_backward", ("<a, g>", "a_i g_i - a_i", "g - ")),
    ("scaling.projection_gradients", ("dS @ K", "dS.mT @ Q", "dS^T Q", "x^T dQ", "x.mT @ dQ",
                                      "sum(0)")),
])
def test_the_first_two_hints_lead_without_stating_the_answer(key, answers):
    for text in exercises.EXERCISES[key].hints[:2]:
        assert not any(answer in text for answer in answers), text


@pytest.mark.parametrize("key, signature, check, fills", [
    ("scaling.choose_scale", "x, W_Q, W_K", check_choose_scale,
     ("S.var(dim=-1).mean()", "1 / v.sqrt().item()")),
    ("scaling.softmax_backward", "scores, grad_weights", check_softmax_backward,
     ("(a * grad_weights).sum(dim=-1, keepdim=True)", "a * (grad_weights - dot)")),
    ("scaling.projection_gradients", "x, W_Q, W_K, scale, grad_weights", check_projection_gradients,
     ("scale * dS @ K", "scale * dS.mT @ Q", "(x.mT @ dQ).reshape(-1, *W_Q.shape).sum(0)",
      "(x.mT @ dK).reshape(-1, *W_K.shape).sum(0)")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills, softmax_backward=softmax_backward)
