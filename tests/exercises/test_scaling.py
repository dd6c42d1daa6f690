"""Notebook 03's checkers (``exercises.scaling``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_skeleton

from attn_helpers import exercises
from attn_helpers.exercises.scaling import (
    check_choose_scale,
    check_gradient_norm,
    check_softmax_backward,
)
from attn_helpers.lessons import scaling


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


# --- softmax_backward ------------------------------------------------------------------------


def softmax_backward(scores, grad_weights):
    a = torch.softmax(scores, dim=-1)
    return a * (grad_weights - (a * grad_weights).sum(dim=-1, keepdim=True))


def test_softmax_backward_accepts_the_reference_and_equals_autograd():
    assert check_softmax_backward(softmax_backward)
    g = torch.Generator().manual_seed(0)
    s, up = torch.randn(3, 5, dtype=torch.float64, generator=g), torch.randn(3, 5, dtype=torch.float64,
                                                                           generator=g)
    s.requires_grad_(True)
    (torch.softmax(s, -1) * up).sum().backward()
    assert torch.allclose(softmax_backward(s.detach(), up), s.grad, atol=1e-12)


def _naive_softmax(s):
    e = s.exp()
    return e / e.sum(-1, keepdim=True)


def _from_a(f):
    return lambda s, g: f(torch.softmax(s, -1), g)


def _via_jacobian(s, g):
    a = torch.softmax(s, -1)
    J = torch.diag_embed(a) - a[..., :, None] * a[..., None, :]
    return (J @ g[..., None])[..., 0]


def _via_autograd(s, g):
    s = s.clone().requires_grad_(True)
    return torch.autograd.grad((torch.softmax(s, -1) * g).sum(), s)[0]


def _via_backward(s, g):
    s = s.clone().requires_grad_(True)
    (torch.softmax(s, -1) * g).sum().backward()
    return s.grad


@pytest.mark.parametrize("wrong, words", [
    (_from_a(lambda a, g: a * g), "outer-product term is missing"),
    (_from_a(lambda a, g: g - (a * g).sum(-1, keepdim=True)), "factor a is missing"),
    (_from_a(lambda a, g: a * (g - g.sum(-1, keepdim=True))), "not the plain sum"),
    (_from_a(lambda a, g: a * ((a * g).sum(-1, keepdim=True) - g)), "the sign is flipped"),
    (_from_a(lambda a, g: a * (1 - a) * g), "only the diagonal"),
    (_from_a(lambda a, g: a * (g - (a * g).sum(0, keepdim=True))), "wrong axis"),
    (lambda s, g: s * (g - (s * g).sum(-1, keepdim=True)), "not the raw scores"),
    (_from_a(lambda a, g: a * (g - (a * g).sum())), "not over the whole tensor"),
    (lambda s, g: (lambda a: a * (g - (a * g).sum(-1, keepdim=True)))(_naive_softmax(s)),
     "Subtract each row's max"),
])
def test_softmax_backward_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_softmax_backward(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


@pytest.mark.parametrize("shortcut, name", [
    (_via_jacobian, "diag_embed"), (_via_autograd, "grad"), (_via_backward, "backward"),
    (lambda s, g: (scaling.softmax_jacobian(torch.softmax(s, -1)) @ g[..., None])[..., 0],
     "softmax_jacobian"),
])
def test_softmax_backward_blocks_the_shortcuts(shortcut, name):
    verdict = check_softmax_backward(shortcut)
    assert not verdict and "which does this exercise for you" in verdict.message, verdict.message
    assert name in verdict.message
    a = torch.randn(2, 3)          # everything is restored afterwards
    assert torch.diag_embed(a).shape == (2, 3, 3)


def _via_eye(s, g):
    a = torch.softmax(s, -1)
    J = torch.eye(s.shape[-1], dtype=s.dtype) * a[..., None] - a[..., :, None] * a[..., None, :]
    return (J @ g[..., None])[..., 0]


def _via_outer_product(s, g):
    a = torch.softmax(s, -1)
    J = -a[..., :, None] * a[..., None, :]
    i = torch.arange(s.shape[-1])
    J[..., i, i] += a
    return (J @ g[..., None])[..., 0]


def _via_zeros_filled(s, g):
    a = torch.softmax(s, -1)
    n = s.shape[-1]
    J = torch.zeros(*s.shape, n, dtype=s.dtype)
    for i in range(n):
        for j in range(n):
            J[..., i, j] = a[..., i] * ((i == j) - a[..., j])
    return torch.einsum("...ij,...j->...i", J, g)


@pytest.mark.parametrize("shortcut, name", [
    (_via_eye, "torch.eye"), (_via_outer_product, "as big as the (..., n, n) Jacobian"),
    (_via_zeros_filled, "as big as the (..., n, n) Jacobian"),
])
def test_softmax_backward_refuses_building_the_jacobian(shortcut, name):
    verdict = check_softmax_backward(shortcut)
    assert not verdict and name in verdict.message, verdict.message
    assert "a * (g - <a, g>)" in verdict.message and "no n x n matrix" in verdict.message
    assert torch.eye(2).shape == (2, 2)                                           # restored after
    assert torch.overrides._get_current_function_mode() is None


def test_softmax_backward_stub():
    assert check_softmax_backward(_stub).message == "softmax_backward is not implemented yet."


# --- gradient_norm -----------------------------------------------------------------------------


def gradient_norm(q, k, scaled, *, divisor=None, dim=-1, what="J", reduce="mean"):
    d_k = q.shape[-1]
    c = (d_k ** 0.5 if scaled else 1.0) if divisor is None else divisor(d_k, scaled)
    a = torch.softmax(q @ k.T / c, dim=dim)
    outer = a[:, :, None] * a[:, None, :]
    J = {"J": torch.diag_embed(a) - outer, "diag": torch.diag_embed(a), "outer": outer}[what]
    norms = torch.linalg.matrix_norm(J)
    return (norms.sum() if reduce == "sum" else norms.mean()).item()


def test_gradient_norm_accepts_the_reference_and_a_loop():
    assert check_gradient_norm(gradient_norm)

    def loop(q, k, scaled):
        total = 0.0
        for row in q:
            s = k @ row / (q.shape[-1] ** 0.5 if scaled else 1.0)
            a = torch.exp(s - s.max())
            a = a / a.sum()
            total += float((torch.diag(a) - torch.outer(a, a)).norm())
        return total / q.shape[0]

    assert check_gradient_norm(loop)


@pytest.mark.parametrize("wrong, words", [
    (lambda q, k, s: gradient_norm(q, k, False), "the scale was ignored"),
    (lambda q, k, s: gradient_norm(q, k, s, divisor=lambda d, sc: d if sc else 1), "divided by d_k"),
    (lambda q, k, s: gradient_norm(q, k, s, divisor=lambda d, sc: d ** -0.5 if sc else 1),
     "multiplied by sqrt(d_k)"),
    (lambda q, k, s: gradient_norm(q, k, s, dim=0), "over the queries"),
    (lambda q, k, s: gradient_norm(q, k, s, divisor=lambda d, sc: k.shape[0] ** 0.5 if sc else 1),
     "the number of keys"),
    (lambda q, k, s: gradient_norm(q, k, s, what="diag"), "norm of the weights a"),
    (lambda q, k, s: gradient_norm(q, k, s, what="outer"), "a a^T alone"),
    (lambda q, k, s: torch.linalg.matrix_norm(
        torch.diag_embed(a := torch.softmax(q @ k.T / (q.shape[-1] ** 0.5 if s else 1), -1))
        - a[:, :, None] * a[:, None, :], ord=2).mean().item(), "spectral norm"),
    (lambda q, k, s: gradient_norm(q, k, s, reduce="sum"), "summed over the queries"),
])
def test_gradient_norm_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_gradient_norm(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_gradient_norm_blocks_the_lessons_measurement_and_reports_the_stub():
    verdict = check_gradient_norm(
        lambda q, k, s: scaling.jacobian_norm(torch.softmax(q @ k.T, -1)).mean().item())
    assert not verdict and "jacobian_norm" in verdict.message, verdict.message
    assert check_gradient_norm(_stub).message == "gradient_norm is not implemented yet."
    verdict = check_gradient_norm(lambda q, k, s: torch.ones(2))
    assert not verdict and "should return a number" in verdict.message, verdict.message


def test_exercises_are_registered_with_three_hints(capsys):
    for key in ("scaling.choose_scale", "scaling.softmax_backward", "scaling.gradient_norm"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
        exercises.hint(key, 3)
        assert "Hint 3 of 3" in capsys.readouterr().out
    check_choose_scale(choose_scale)
    assert exercises.progress(show=False)["scaling"]["scaling.choose_scale"] is True


@pytest.mark.parametrize("key, signature, check, fills", [
    ("scaling.choose_scale", "x, W_Q, W_K", check_choose_scale,
     ("S.var(dim=-1).mean()", "1 / v.sqrt().item()")),
    ("scaling.softmax_backward", "scores, grad_weights", check_softmax_backward,
     ("(a * grad_weights).sum(dim=-1, keepdim=True)", "a * (grad_weights - dot)")),
    ("scaling.gradient_norm", "q, k, scaled", check_gradient_norm,
     ("S / q.shape[-1] ** 0.5", "torch.softmax(S, dim=-1)")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills, softmax_jacobian=scaling.softmax_jacobian)


def test_gradient_norm_allows_section_2s_jacobian_the_notebooks_copy_included():
    """Exercise 2 asks for J (its product with g); exercise 3 measures J's norm, so J is given."""
    def notebook_softmax_jacobian(a):  # cell 9's definition
        return torch.diag_embed(a) - a[..., :, None] * a[..., None, :]

    for jacobian in (scaling.softmax_jacobian, notebook_softmax_jacobian):
        def measure(q, k, scaled, jacobian=jacobian):
            S = q @ k.T / (q.shape[-1] ** 0.5 if scaled else 1.0)
            return torch.linalg.matrix_norm(jacobian(torch.softmax(S, -1))).mean().item()
        verdict = check_gradient_norm(measure)
        assert verdict, verdict.message


def _aten(s, g):
    return torch.ops.aten._softmax_backward_data(g, torch.softmax(s, -1), -1, s.dtype)


def _grad_fn(s, g):
    return torch.softmax(s.clone().requires_grad_(), -1).grad_fn(g)


def _jvp(s, g):  # J is symmetric: J g by forward mode is the answer
    return torch.func.jvp(lambda x: torch.softmax(x, -1), (s,), (g,))[1]


@pytest.mark.parametrize("route", [_aten, _grad_fn, _jvp])
def test_softmax_backward_refuses_autograd_by_any_route(route):
    result = check_softmax_backward(route)
    assert not result and "does this exercise for you" in result.message, result.message
