"""Notebook 03's checkers: each accepts the reference and names each known mistake."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_skeleton

from attn_helpers import exercises
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


def test_choose_scale_accepts_the_reference_biased_or_not_and_a_tensor():
    assert check_choose_scale(choose_scale)
    assert check_choose_scale(
        lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(-1, unbiased=False).mean().sqrt())
    # centring each row first, then the variance of everything: the same number
    assert check_choose_scale(
        lambda x, W_Q, W_K: 1 / (_S(x, W_Q, W_K) - _S(x, W_Q, W_K).mean(-1, keepdim=True)).var().sqrt())


@pytest.mark.parametrize("wrong, words", [
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var().sqrt().item(), "variance of the whole score matrix"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(dim=0).mean().sqrt().item(), "wrong axis"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).std(dim=-1).mean().item(), "averaged the rows' standard"),
    (lambda x, W_Q, W_K: (1 / _S(x, W_Q, W_K).std(dim=-1)).mean().item(), "averaged a scale per row"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(dim=-1).median().sqrt().item(), "the median row"),
    (lambda x, W_Q, W_K: 1 / math.sqrt(W_Q.shape[1]), "right only when the components"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(-1).mean().item(), "not of the variance"),
    (lambda x, W_Q, W_K: (1 / math.sqrt(W_Q.shape[1])) / _S(x, W_Q, W_K).var(-1).mean().sqrt().item(),
     "does not stack on it"),
    (lambda x, W_Q, W_K: _S(x, W_Q, W_K).var(-1).mean().sqrt().item(), "divides by it"),
    (lambda x, W_Q, W_K: choose_scale(x, W_Q, W_K) * W_Q.shape[1] ** 0.5, "already scaled"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).pow(2).mean().sqrt().item(), "subtract each row's mean"),
    (lambda x, W_Q, W_K: 1 / (W_Q.shape[1] * (x @ W_Q).var() * (x @ W_K).var()).sqrt().item(),
     "the independence prediction"),
    (lambda x, W_Q, W_K: 1 / ((x @ W_Q).var() * (x @ W_K).var()).sqrt().item(),
     "you measured the components"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q.T, W_K.T).var(-1).mean().sqrt().item(), "not x @ W_Q.T"),
    (lambda x, W_Q, W_K: 1 / math.sqrt(W_Q.shape[1] * (x @ W_Q).var().item()),
     "counts the spread of q only"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_Q).var(-1).mean().sqrt().item(), "Q Q^T"),
    (lambda x, W_Q, W_K: 1 / ((x @ W_Q) * (x @ W_K)).sum(-1).std().item(),
     "every query against every key"),
])
def test_choose_scale_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_choose_scale(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_choose_scale_names_a_non_number():
    verdict = check_choose_scale(lambda x, W_Q, W_K: x @ W_Q)
    assert not verdict and "should return a number" in verdict.message


def softmax_backward(scores, grad_weights, dim=-1):      # dim=-2: a mistake of exercise 3
    a = torch.softmax(scores, dim=dim)
    return a * (grad_weights - (a * grad_weights).sum(dim=-1, keepdim=True))


def test_softmax_backward_accepts_the_reference():
    assert check_softmax_backward(softmax_backward)


def _naive_softmax(s):
    e = s.exp()
    return e / e.sum(-1, keepdim=True)


def _from_a(f):
    return lambda s, g: f(torch.softmax(s, -1), g)


def _via_jacobian(s, g):
    a = torch.softmax(s, -1)
    J = torch.diag_embed(a) - a[..., :, None] * a[..., None, :]
    return (J @ g[..., None])[..., 0]


@pytest.mark.parametrize("wrong, words", [
    (_from_a(lambda a, g: a * g), "a a^T term of J is missing"),
    (_from_a(lambda a, g: g - (a * g).sum(-1, keepdim=True)), "factor a_i is missing"),
    (_from_a(lambda a, g: a * g - (a * g).sum(-1, keepdim=True)), "row sum lost its factor a_i"),
    (_from_a(lambda a, g: a * (g - g.sum(-1, keepdim=True))), "not the plain sum"),
    (_from_a(lambda a, g: a * (g - (a * g).mean(-1, keepdim=True))), "not a mean"),
    (_from_a(lambda a, g: a * ((a * g).sum(-1, keepdim=True) - g)), "the sign is flipped"),
    (_from_a(lambda a, g: a * (1 - a) * g), "only the diagonal"),
    (_from_a(lambda a, g: a * (g - (a * g).sum(0, keepdim=True))), "wrong axis"),
    (lambda s, g: s * (g - (s * g).sum(-1, keepdim=True)), "not the raw scores"),
    (_from_a(lambda a, g: a * (g - (a * g).sum())), "not over the whole tensor"),
    (_from_a(lambda a, g: a * (g - g.mean(-1, keepdim=True))), "not the plain mean of g"),
    (_from_a(lambda a, g: a * (g - g.mean())), "not the plain mean of g"),
    (lambda s, g: softmax_backward(s, g, dim=0), "wrong axis (dim=0)"),
    (lambda s, g: softmax_backward(s, g, dim=1 if s.dim() > 1 else 0), "wrong axis (dim=-2)"),
    (_from_a(lambda a, g: a * (g - (a * g).sum(-1))), "without keepdim it is (...,)"),
    (lambda s, g: (lambda a: a * (g - (a * g).sum(-1, keepdim=True)))(_naive_softmax(s)),
     "Subtract each row's max"),
])
def test_softmax_backward_rejects_known_mistakes_with_their_hint(wrong, words):  # no hint gives it away
    verdict = check_softmax_backward(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message
    assert "(g - <a, g>)" not in verdict.message


def _via_outer_product(s, g):
    a = torch.softmax(s, -1)
    J = -a[..., :, None] * a[..., None, :]
    i = torch.arange(s.shape[-1])
    J[..., i, i] += a
    return (J @ g[..., None])[..., 0]


@pytest.mark.parametrize("shortcut", [_via_jacobian, _via_outer_product])
def test_softmax_backward_refuses_building_the_jacobian(shortcut):
    verdict = check_softmax_backward(shortcut)
    assert not verdict and "as big as the (..., n, n) Jacobian" in verdict.message, verdict.message
    assert "WITHOUT J" in verdict.message and "<a, g>" not in verdict.message  # why, not the answer


def _chain(x, W_Q, W_K, scale, g, backward=softmax_backward):
    Q, K = x @ W_Q, x @ W_K                         # (..., n, d_k)
    dS = backward(scale * Q @ K.mT, g)              # (..., n, n)
    dQ, dK = scale * dS @ K, scale * dS.mT @ Q      # (..., n, d_k)
    return x.mT @ dQ, x.mT @ dK                     # (..., d_model, d_k)


def projection_gradients(x, W_Q, W_K, scale, grad_weights):
    grad_W_Q, grad_W_K = _chain(x, W_Q, W_K, scale, grad_weights)
    if x.dim() == 3:                                # a batch: W_Q, W_K serve every sequence
        return grad_W_Q.sum(0), grad_W_K.sum(0)
    return grad_W_Q, grad_W_K


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
    dW_Q = scale * torch.einsum("...id,...ij,...jk->dk", x, dS, K)
    dW_K = scale * torch.einsum("...jd,...ij,...ik->dk", x, dS, Q)
    return dW_Q, dW_K


def _scale_late(x, W_Q, W_K, scale, g):
    """The scale applied once, at the end: past dS the gradients are linear in it."""
    Q, K = x @ W_Q, x @ W_K
    dS = softmax_backward(scale * Q @ K.mT, g)
    gq, gk = (x.mT @ (dS @ K)), (x.mT @ (dS.mT @ Q))
    if x.dim() == 3:
        gq, gk = gq.sum(0), gk.sum(0)
    return scale * gq, scale * gk


def test_projection_gradients_accepts_the_reference_and_other_correct_forms():
    for correct in (projection_gradients, _flattened, _einsum, _scale_late):
        verdict = check_projection_gradients(correct)
        assert verdict, verdict.message


def _sum_batch(gq, gk, x):
    return (gq.sum(0), gk.sum(0)) if x.dim() == 3 else (gq, gk)


def _chain_with(x, W_Q, W_K, scale, g, *, dq=None, dk=None, dS=None, wrt_w=True):
    """A learner's chain with one step written differently: dq(dS, Q, K), dk(dS, Q, K)."""
    Q, K = x @ W_Q, x @ W_K
    dS = softmax_backward(scale * Q @ K.mT, g) if dS is None else dS
    dQ = dq(dS, Q, K) if dq else scale * dS @ K
    dK = dk(dS, Q, K) if dk else scale * dS.mT @ Q
    if not wrt_w:
        return dQ, dK
    return _sum_batch(x.mT @ dQ, x.mT @ dK, x)


@pytest.mark.parametrize("wrong, words", [
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dS=g), "not at the scores"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dS=softmax_backward(torch.softmax(c * (x @ W_Q) @ (x @ W_K).mT, -1), g)),
     "a softmax of a softmax"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dS=torch.softmax(c * (x @ W_Q) @ (x @ W_K).mT, -1) * g),
     "misses the a a^T part"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dS=(
        lambda a: a * (1 - a) * g)(torch.softmax(c * (x @ W_Q) @ (x @ W_K).mT, -1))),
     "only the diagonal of J"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dS=softmax_backward((x @ W_Q) @ (x @ W_K).mT, g)), "without the scale"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dS=softmax_backward(
        c * (x @ W_Q) @ (x @ W_K).mT, g, dim=-2)), "recomputed the weights over dim -2"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dq=lambda dS, Q, K: dS @ K, dk=lambda dS, Q, K: dS.mT @ Q),
     "the scale is missing from dQ and dK"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dk=lambda dS, Q, K: dS.mT @ Q),
     "dK lacks the scale that dQ has"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dq=lambda dS, Q, K: c * c * dS @ K, dk=lambda dS, Q, K: c * c * dS.mT @ Q),
     "the scale came in twice"),
    (lambda x, W_Q, W_K, c, g: projection_gradients(x, W_Q, W_K, 1 / math.sqrt(W_Q.shape[1]), g),
     "you used 1/sqrt(d_k)"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dk=lambda dS, Q, K: c * dS @ Q),
     "not its transpose"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dq=lambda dS, Q, K: c * dS.mT @ K, dk=lambda dS, Q, K: c * dS @ Q),
     "swapped between dQ and dK"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, dq=lambda dS, Q, K: c * dS.mT @ K),
     "dQ was computed from dS^T"),
    (lambda x, W_Q, W_K, c, g: _chain_with(
        x, W_Q, W_K, c, g, dq=lambda dS, Q, K: c * dS @ Q, dk=lambda dS, Q, K: c * dS.mT @ K),
     "Q and K are swapped in the chain"),
    (lambda x, W_Q, W_K, c, g: _chain_with(x, W_Q, W_K, c, g, wrt_w=False), "the gradient at Q and K"),
    (lambda x, W_Q, W_K, c, g: tuple(grad.T for grad in projection_gradients(x, W_Q, W_K, c, g)),
     "came out transposed"),
    (lambda x, W_Q, W_K, c, g: projection_gradients(x, W_Q, W_K, c, g)[::-1], "are swapped"),
    (lambda x, W_Q, W_K, c, g: _chain(x, W_Q, W_K, c, g), "one gradient per sequence"),
    (lambda x, W_Q, W_K, c, g: tuple(t.mean(0) if x.dim() == 3 else t
                                     for t in _chain(x, W_Q, W_K, c, g)), "not the means"),
    (lambda x, W_Q, W_K, c, g: tuple(-t for t in projection_gradients(x, W_Q, W_K, c, g)),
     "the sign is flipped"),
    (lambda x, W_Q, W_K, c, g: projection_gradients(x[0], W_Q, W_K, c, g[0]) if x.dim() == 3
     else projection_gradients(x, W_Q, W_K, c, g), "only the first sequence"),
    (lambda x, W_Q, W_K, c, g: projection_gradients(x, W_Q, W_K, c, g.mT), "came in transposed"),
])
def test_projection_gradients_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_projection_gradients(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


@pytest.mark.filterwarnings("ignore:The use of `x.T`")   # torch warns once per process
def test_projection_gradients_names_overflow_and_a_batch_transposed_with_T():
    def naive(x, W_Q, W_K, scale, g):
        s = scale * (x @ W_Q) @ (x @ W_K).mT
        a = s.exp() / s.exp().sum(-1, keepdim=True)
        return _sum_batch(*_chain(x, W_Q, W_K, scale, g,
                                  backward=lambda _s, g: a * (g - (a * g).sum(-1, keepdim=True))), x)

    verdict = check_projection_gradients(naive)
    assert not verdict and "case 6 of 6" in verdict.message and "Subtract each row's max" in (
        verdict.message), verdict.message

    def with_T(x, W_Q, W_K, scale, g):
        Q, K = x @ W_Q, x @ W_K
        dS = softmax_backward(scale * Q @ K.T, g)
        return x.T @ (scale * dS @ K), x.T @ (scale * dS.T @ Q)

    verdict = check_projection_gradients(with_T)
    assert not verdict and "case 5 of 6" in verdict.message and ".mT" in verdict.message, \
        verdict.message


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
