"""Notebook 03's checkers (``exercises.scaling``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers import exercises
from attn_helpers.entropy import attention_entropy
from attn_helpers.exercises.scaling import (
    check_choose_scale,
    check_half_entropy_temperature,
    check_softmax_jacobian,
)


def _stub(*args):
    raise NotImplementedError


# --- choose_scale ----------------------------------------------------------------------------


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


def test_choose_scale_makes_the_within_row_variance_one():
    from attn_helpers.exercises.scaling import _choose_scale_cases
    for case in _choose_scale_cases():
        c = choose_scale(*case.values())
        S = _S(*case.values())
        assert abs((c * S).var(dim=-1).mean().item() - 1) < 1e-5
        # softmax is shift-invariant per row: adding a different constant to each row changes
        # neither the weights nor the answer
        shifted = S + torch.randn(S.shape[0], 1, dtype=S.dtype) * 10
        torch.testing.assert_close(torch.softmax(c * shifted, -1), torch.softmax(c * S, -1))
    # PyTorch's default init: far from the 1/sqrt(d_k) rule (the point of the exercise)
    case = _choose_scale_cases()[1]
    assert choose_scale(*case.values()) > 2 / math.sqrt(case["W_Q"].shape[1])
    # inputs with a mean: the whole matrix's variance is clearly larger than the within-row one
    case = _choose_scale_cases()[3]
    assert _S(*case.values()).var().item() > 1.2 * _S(*case.values()).var(-1).mean().item()


@pytest.mark.parametrize("wrong, words", [
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var().sqrt().item(), "variance of the whole score matrix"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(dim=0).mean().sqrt().item(), "wrong axis"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).std(dim=-1).mean().item(), "averaged the rows' standard"),
    (lambda x, W_Q, W_K: 1 / math.sqrt(W_Q.shape[1]), "right only when the components"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).var(-1).mean().item(), "not of the variance"),
    (lambda x, W_Q, W_K: _S(x, W_Q, W_K).var(-1).mean().sqrt().item(), "divides by it"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q, W_K).pow(2).mean().sqrt().item(), "subtract each row's mean"),
    (lambda x, W_Q, W_K: 1 / ((x @ W_Q).var() * (x @ W_K).var()).sqrt().item(),
     "you measured the components"),
    (lambda x, W_Q, W_K: 1 / _S(x, W_Q.T, W_K.T).var(-1).mean().sqrt().item(), "not x @ W_Q.T"),
    (lambda x, W_Q, W_K: 1 / ((x @ W_Q) * (x @ W_K)).sum(-1).std().item(),
     "every query against every key"),
])
def test_choose_scale_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_choose_scale(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_choose_scale_reports_stubs_and_non_numbers():
    assert check_choose_scale(_stub).message == "choose_scale is not implemented yet."
    assert "not implemented yet" in check_choose_scale(lambda x, W_Q, W_K: None).message
    verdict = check_choose_scale(lambda x, W_Q, W_K: x @ W_Q)
    assert not verdict and "should return a number" in verdict.message


# --- softmax_jacobian ------------------------------------------------------------------------


def softmax_jacobian(scores):
    a = torch.softmax(scores, dim=-1)
    return torch.diag_embed(a) - a[..., :, None] * a[..., None, :]


def test_softmax_jacobian_accepts_the_reference_and_equals_autograd():
    assert check_softmax_jacobian(softmax_jacobian)
    s = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for row in s:
        auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), row)
        assert torch.allclose(softmax_jacobian(row), auto, atol=1e-12)


def _naive_softmax(s):
    e = s.exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("wrong, words", [
    (lambda s: -softmax_jacobian(s), "the sign is flipped"),
    (lambda s: (lambda a: torch.diag_embed(a) - a[..., :, None] * a[..., :, None])(torch.softmax(s, -1)),
     "a[..., None, :]"),
    (lambda s: torch.diag_embed(torch.softmax(s, -1)), "diag(a) is only half"),
    (lambda s: (lambda a: -a[..., :, None] * a[..., None, :])(torch.softmax(s, -1)),
     "diagonal is missing"),
    (lambda s: (lambda a: torch.diag_embed(a * (1 - a)))(torch.softmax(s, -1)), "only the diagonal"),
    (lambda s: torch.diag_embed(s) - s[..., :, None] * s[..., None, :], "not the raw scores"),
    (lambda s: (lambda a: torch.diag_embed(a) - a[..., :, None] * a[..., None, :])(torch.softmax(s, 0)),
     "wrong axis"),
    (lambda s: (lambda a: torch.diag_embed(a) - a[..., :, None] * a[..., None, :])(_naive_softmax(s)),
     "Subtract each row's max"),
])
def test_softmax_jacobian_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_softmax_jacobian(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_softmax_jacobian_stub():
    assert check_softmax_jacobian(_stub).message == "softmax_jacobian is not implemented yet."


# --- half_entropy_temperature ----------------------------------------------------------------


def _entropy(scores, T):
    return attention_entropy(torch.softmax(scores.double() / T, -1)).item()


def _bisect(scores, target, *, steps=100, multiply=False):
    low, high = math.log(1e-4), math.log(1e4)
    for _ in range(steps):
        m = 0.5 * (low + high)
        T = math.exp(m)
        h = _entropy(scores, 1 / T if multiply else T)
        if (h < target) != multiply:
            low = m
        else:
            high = m
    return math.exp(0.5 * (low + high))


def half_entropy_temperature(scores):
    return _bisect(scores, 0.5 * _entropy(scores, 1.0))


def test_half_entropy_temperature_accepts_the_reference():
    assert check_half_entropy_temperature(half_entropy_temperature)


@pytest.mark.parametrize("wrong, words", [
    (lambda s: 0.5, "not proportional to T"),
    (lambda s: 2.0, "*raises* the entropy"),
    (lambda s: _bisect(s, 0.5 * _entropy(s, 1.0), multiply=True), "you found 1/T"),
    (lambda s: _bisect(s, 0.5 * math.log(len(s))), "not half the ceiling"),
    (lambda s: 0.5 * _entropy(s, 1.0), "you returned the target entropy"),
    (lambda s: round(half_entropy_temperature(s), 1), "too coarse"),
])
def test_half_entropy_temperature_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_half_entropy_temperature(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_half_entropy_temperature_stub_and_a_few_bisection_steps():
    verdict = check_half_entropy_temperature(_stub)
    assert verdict.message == "half_entropy_temperature is not implemented yet."
    assert not check_half_entropy_temperature(lambda s: _bisect(s, 0.5 * _entropy(s, 1.0), steps=4))


def test_exercises_are_registered_with_three_hints(capsys):
    for key in ("scaling.choose_scale", "scaling.softmax_jacobian", "scaling.half_entropy_temperature"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
        exercises.hint(key, 3)
        assert "Hint 3 of 3" in capsys.readouterr().out
    check_choose_scale(choose_scale)
    assert exercises.progress(show=False)["scaling"]["scaling.choose_scale"] is True
