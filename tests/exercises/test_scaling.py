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
    check_jacobian_norm,
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
    (_from_a(lambda a, g: a * g), "a a^T term of J is missing"),
    (_from_a(lambda a, g: g - (a * g).sum(-1, keepdim=True)), "factor a_i is missing"),
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
    assert name in verdict.message and "<a, g>" not in verdict.message
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
    assert "no n x n matrix" in verdict.message and "hint('scaling.softmax_backward', 2)" in (
        verdict.message)
    assert "<a, g>" not in verdict.message            # a refusal says why, not the answer
    assert torch.eye(2).shape == (2, 2)                                           # restored after
    assert torch.overrides._get_current_function_mode() is None


def test_softmax_backward_stub():
    assert check_softmax_backward(_stub).message == "softmax_backward is not implemented yet."


# --- jacobian_norm -----------------------------------------------------------------------------


def jacobian_norm(a):
    s2 = (a * a).sum(dim=-1)                        # |diag(a)|^2
    s3 = (a ** 3).sum(dim=-1)                       # <diag(a), a a^T>
    return (s2 - 2 * s3 + s2 ** 2).clamp(min=0).sqrt()


def _per_row_loop(a):
    """One row at a time, with dot products: the same sums, written differently."""
    rows = a.reshape(-1, a.shape[-1])
    norms = []
    for row in rows:
        s2 = torch.dot(row, row)
        squared = s2 - 2 * torch.dot(row * row, row) + s2 * s2
        norms.append(squared.clamp(min=0).sqrt())
    return torch.stack(norms).reshape(a.shape[:-1])


def _diagonal_plus_off_diagonal(a):
    """|J|^2 = sum_i a_i^2 (1 - a_i)^2 + sum_{i != j} a_i^2 a_j^2, every term >= 0: no clamp needed."""
    b = a * a
    return (b * ((1 - a) ** 2 + b.sum(-1, keepdim=True) - b)).sum(-1).sqrt()


def _einsum(a):
    s2 = torch.einsum("...i,...i->...", a, a)
    s3 = torch.einsum("...i,...i,...i->...", a, a, a)
    return (s2 * (1 + s2) - 2 * s3).clamp(min=0).sqrt()


def test_jacobian_norm_accepts_the_reference_and_other_correct_forms():
    for correct in (jacobian_norm, _per_row_loop, _diagonal_plus_off_diagonal, _einsum):
        verdict = check_jacobian_norm(correct)
        assert verdict, verdict.message


def test_jacobian_norm_equals_the_norm_of_the_built_jacobian_on_known_rows():
    from attn_helpers.exercises.scaling import _norm_cases
    for case in _norm_cases():
        torch.testing.assert_close(jacobian_norm(case["a"]), scaling.jacobian_norm(case["a"]),
                                   atol=1e-6, rtol=1e-5)
    n = 5
    rows = torch.tensor([[1.0, 0, 0, 0, 0], [0.2] * 5, [0.5, 0.5, 0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(jacobian_norm(rows), torch.tensor(
        [0.0, math.sqrt(n - 1) / n, 0.5], dtype=torch.float64))       # one-hot, uniform, a tie


def test_jacobian_norm_cases_catch_the_missing_clamp():
    """On the unscaled d_k = 1024 rows the three sums cancel, and rounding leaves a few squared
    norms below 0: the check names the clamp."""
    def unclamped(a):
        s2, s3 = (a * a).sum(-1), (a ** 3).sum(-1)
        return (s2 - 2 * s3 + s2 ** 2).sqrt()

    verdict = check_jacobian_norm(unclamped)
    assert not verdict and "nan" in verdict.message and "Clamp it at 0" in verdict.message, \
        verdict.message


def _sums(combine, dim=-1, keepdim=False, mean=False):
    def norm(a):
        reduce = (lambda x: x.mean() if mean else x.sum()) if dim is None else (
            lambda x: x.mean(dim, keepdim=keepdim) if mean else x.sum(dim, keepdim=keepdim))
        return combine(reduce(a ** 2), reduce(a ** 3), reduce(a ** 4))
    return norm


def _root(x):
    return x.clamp(min=0).sqrt()


def _right(s2, s3, s4):
    return _root(s2 - 2 * s3 + s2 ** 2)


@pytest.mark.parametrize("wrong, words", [
    (_sums(lambda s2, s3, s4: s2 - 2 * s3 + s2 ** 2), "the squared norm"),
    (lambda a: _root((a ** 2 * (1 - a) ** 2).sum(-1)), "the diagonal of J alone"),
    (_sums(lambda s2, s3, s4: _root(s2 - 2 * s3 + s4)), "the diagonal of J alone"),
    (_sums(lambda s2, s3, s4: _root(s2 + 2 * s3 + s2 ** 2)), "the wrong sign"),
    (_sums(lambda s2, s3, s4: _root(s2 - s3 + s2 ** 2)), "comes with a factor 2"),
    (lambda a: a.norm(dim=-1), "the first term alone"),
    (_sums(lambda s2, s3, s4: s2), "the outer product alone"),
    (_sums(lambda s2, s3, s4: _root(s2 ** 2 - s4)), "the off-diagonal part"),
    (_sums(_right, mean=True), "not a mean"),
    (_sums(_right, dim=0), "wrong axis"),
    (_sums(_right, dim=None), "the whole tensor"),
    (_sums(_right, keepdim=True), "drop keepdim=True"),
    (_sums(lambda s2, s3, s4: _root(2 * s2 - 2 * s3)), "not sum_i a_i^2 itself"),
    (_sums(lambda s2, s3, s4: _root(s2 - 2 * s3 + 1)), "(sum_i a_i)^2 is 1"),
    (_sums(lambda s2, s3, s4: _root(s2 - 2 * s3)), "the |P|^2 term is missing"),
    (_sums(lambda s2, s3, s4: _root(s2 - 4 * s3 + s2 ** 2)), "the cross term's factor is off"),
    (_sums(lambda s2, s3, s4: _root(s2 - 2 * s2 ** 2 + s2 ** 2)), "is not (sum_i a_i^2)^2"),
])
def test_jacobian_norm_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_jacobian_norm(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def _notebook_softmax_jacobian(a):  # section 2's cell
    return torch.diag_embed(a) - a[..., :, None] * a[..., None, :]


def _via_autograd_jacobian(a):
    rows = a.reshape(-1, a.shape[-1])
    J = [torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), r.log()) for r in rows]
    return torch.stack([j.norm() for j in J]).reshape(a.shape[:-1])


@pytest.mark.parametrize("shortcut, name", [
    (lambda a: torch.linalg.matrix_norm(scaling.softmax_jacobian(a)), "scaling.softmax_jacobian"),
    (lambda a: torch.linalg.matrix_norm(_notebook_softmax_jacobian(a)), "torch.diag_embed"),
    (lambda a: scaling.jacobian_norm(a), "scaling.jacobian_norm"),
    (_via_autograd_jacobian, "functional.jacobian"),
    (lambda a: torch.func.vmap(torch.func.jacrev(lambda s: torch.softmax(s, -1)))(
        a.reshape(-1, a.shape[-1]).log()).norm(dim=(-2, -1)).reshape(a.shape[:-1]), "jacrev"),
    (lambda a: torch.func.vmap(torch.func.jacfwd(lambda s: torch.softmax(s, -1)))(
        a.reshape(-1, a.shape[-1]).log()).norm(dim=(-2, -1)).reshape(a.shape[:-1]), "jacfwd"),
])
def test_jacobian_norm_blocks_the_ways_of_building_J(shortcut, name):
    verdict = check_jacobian_norm(shortcut)
    assert not verdict and "which does this exercise for you" in verdict.message, verdict.message
    assert name in verdict.message and "sums over each row's weights" in verdict.message
    assert torch.diag_embed(torch.ones(2, 3)).shape == (2, 3, 3)        # restored afterwards


def _via_outer_product(a):
    J = -a[..., :, None] * a[..., None, :]
    i = torch.arange(a.shape[-1])
    J[..., i, i] += a
    return torch.linalg.matrix_norm(J)


def _via_eye(a):
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    return (eye * a[..., None] - a[..., :, None] * a[..., None, :]).pow(2).sum((-2, -1)).sqrt()


def _via_autograd_columns(a):  # J's columns one at a time: no n x n tensor, but autograd measures J
    rows = a.reshape(-1, a.shape[-1])
    s = rows.log().requires_grad_(True)
    w = torch.softmax(s, -1)
    squared = sum(torch.autograd.grad(w[:, j].sum(), s, retain_graph=True)[0].pow(2).sum(-1)
                  for j in range(a.shape[-1]))
    return squared.sqrt().reshape(a.shape[:-1])


@pytest.mark.parametrize("shortcut, words", [
    (_via_outer_product, "as big as the (..., n, n) Jacobian"),
    (_via_eye, "as big as the (..., n, n) Jacobian"),
    (_via_autograd_columns, "used autograd"),
])
def test_jacobian_norm_refuses_J_by_any_route(shortcut, words):
    verdict = check_jacobian_norm(shortcut)
    assert not verdict and words in verdict.message, verdict.message
    assert "no n x n matrix" in verdict.message, verdict.message
    assert torch.overrides._get_current_function_mode() is None


def test_jacobian_norm_refuses_the_checkers_own_answer():
    from attn_helpers.exercises import scaling_mistakes

    verdict = check_jacobian_norm(scaling_mistakes._from_sums(scaling_mistakes._right))
    assert not verdict and "the checker's own answer" in verdict.message, verdict.message
    wrapped = check_jacobian_norm(lambda a: scaling_mistakes._right(
        (a * a).sum(-1), (a ** 3).sum(-1), None))
    assert not wrapped and "the checker's own code" in wrapped.message, wrapped.message


def test_jacobian_norm_reports_the_stub_and_a_number():
    assert check_jacobian_norm(_stub).message == "jacobian_norm is not implemented yet."
    verdict = check_jacobian_norm(lambda a: float(jacobian_norm(a).mean()))
    assert not verdict and "return a torch.Tensor" in verdict.message, verdict.message


def test_exercises_are_registered_with_three_hints(capsys):
    for key in ("scaling.choose_scale", "scaling.softmax_backward", "scaling.jacobian_norm"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
        exercises.hint(key, 3)
        assert "Hint 3 of 3" in capsys.readouterr().out
    check_choose_scale(choose_scale)
    assert exercises.progress(show=False)["scaling"]["scaling.choose_scale"] is True


@pytest.mark.parametrize("key, answers", [
    ("scaling.softmax_backward", ("<a, g>", "a_i g_i - a_i", "g - ")),
    ("scaling.jacobian_norm", ("a_i^3", "(sum_i a_i^2)^2", "s2 - 2", "P_ii = a_i")),
])
def test_the_first_two_hints_lead_without_stating_the_answer(key, answers):
    for text in exercises.EXERCISES[key].hints[:2]:
        assert not any(answer in text for answer in answers), text


@pytest.mark.parametrize("key, signature, check, fills", [
    ("scaling.choose_scale", "x, W_Q, W_K", check_choose_scale,
     ("S.var(dim=-1).mean()", "1 / v.sqrt().item()")),
    ("scaling.softmax_backward", "scores, grad_weights", check_softmax_backward,
     ("(a * grad_weights).sum(dim=-1, keepdim=True)", "a * (grad_weights - dot)")),
    ("scaling.jacobian_norm", "a", check_jacobian_norm,
     ("(a * a).sum(dim=-1)", "(a ** 3).sum(dim=-1)", "s2 - 2 * s3 + s2 ** 2")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)


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


def test_no_softmax_backward_verdict_gives_the_formula_away():
    """Review 4: the mistake messages ended with the answer, a * (g - <a, g>)."""
    wrong = [lambda s, g: torch.softmax(s, -1) * g,
             lambda s, g: g - (torch.softmax(s, -1) * g).sum(-1, keepdim=True),
             lambda s, g: -torch.softmax(s, -1) * (g - (torch.softmax(s, -1) * g).sum(-1, keepdim=True)),
             lambda s, g: torch.softmax(s, -1) * (1 - torch.softmax(s, -1)) * g]
    for answer in wrong:
        message = check_softmax_backward(answer).message
        assert "Hint:" in message and "(g - <a, g>)" not in message, message
