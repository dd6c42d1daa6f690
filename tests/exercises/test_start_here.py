"""Notebook 00's checkers (``exercises.start_here``): the references pass, a stub is "not
implemented yet" and nothing more, and every plausible wrong answer is rejected with a message
that names the mistake."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton, stub

from attn_helpers import exercises
from attn_helpers.exercises import Mistake, check_function
from attn_helpers.exercises import start_here as ex

# --- exercise 1: softmax with a temperature ----------------------------------------------------


def softmax_t(scores, temperature):
    z = scores / temperature
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def test_softmax_with_temperature_accepts_right_answers():
    for right in (softmax_t, lambda s, t: softmax_t(s.double(), t).to(s.dtype)):
        result = ex.check_softmax_with_temperature(right)
        assert result and result.message.startswith("Passed"), result.message


def test_softmax_with_temperature_stub_says_only_not_implemented():
    result = ex.check_softmax_with_temperature(stub)
    assert result.message == "softmax_with_temperature is not implemented yet."


def no_max(s, t):
    e = torch.exp(s / t)
    return e / e.sum(-1, keepdim=True)


def global_max(s, t):
    z = s / t
    e = torch.exp(z - z.max())
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, t: softmax_t(s, 1.0), ["temperature was ignored"]),
    (lambda s, t: softmax_t(s * t * t, t), ["multiplied the scores by T"]),
    (lambda s, t: softmax_t(s.movedim(0, -1), t).movedim(-1, 0), ["first dimension", "dim=-1"]),
    (lambda s, t: torch.exp(s / t - (s / t).amax(-1, keepdim=True)), ["not normalised"]),
    (lambda s, t: softmax_t(s, 1.0) / t, ["after the softmax"]),
    (no_max, ["nan", "overflows", "row's own maximum", "case 6 of 8"]),
    (global_max, ["nan", "one maximum for the whole tensor", "case 6 of 8"]),
    (lambda s, t: softmax_t(s, t).sum(-1), ["returned the weights with shape ()", "shape (5,)"]),
    (lambda s, t: softmax_t(s, t).float(), ["returned the weights as torch.float32",
                                             "the right answer is torch.float64"]),
])
def test_softmax_with_temperature_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_softmax_with_temperature(wrong), *fragments)


# --- exercise 2: the entropy of attention rows ---------------------------------------------------


def entropy(p):
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def test_entropy_stub_says_only_not_implemented():
    assert ex.check_entropy(stub).message == "entropy is not implemented yet."


@pytest.mark.parametrize("wrong, fragments", [
    (lambda p: -torch.where(p > 0, p * torch.log2(p), 0.0).sum(-1), ["bits"]),
    (lambda p: -torch.where(p > 0, p * torch.log10(p), 0.0).sum(-1), ["log base 10"]),
    (lambda p: -entropy(p), ["sign is flipped"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).mean(-1), ["averaged over the keys"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum(0), ["first dimension"]),
    (lambda p: -torch.where(p > 0, torch.log(p), 0.0).sum(-1), ["weighted by a_j"]),
    (lambda p: -(p * torch.log(p)).sum(-1), ["nan", "0 * ln 0", "(3, 3)"]),
    (lambda p: entropy(p)[..., None], ["shape (1,)", "shape ()"]),
    (lambda p: entropy(p).float() if p.dtype == torch.float64 else entropy(p).double(),
     ["as torch.float", "the right answer is torch.float"]),
    (lambda p: entropy(p) + 0.1, ["returned the entropy with wrong values", "largest difference 0.1"]),
    (lambda p: entropy(p).tolist(), ["returned the entropy as a float; return a torch.Tensor"]),
])
def test_entropy_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_entropy(wrong), *fragments)


def test_hints_are_printed_on_demand_and_a_solution_never_counts(capsys):
    exercises.hint("start_here.entropy", 2)
    assert "ln a_j" in capsys.readouterr().out
    verdict = ex.check_entropy(entropy, solution=True)
    assert verdict and "does not count" in verdict.message
    ex.check_entropy(stub)
    assert exercises.progress(show=False)["start_here"]["start_here.entropy"] is not True


@pytest.mark.parametrize("key, signature, check, fills", [
    ("start_here.softmax_with_temperature", "scores, temperature",
     ex.check_softmax_with_temperature,
     ("z.amax(dim=-1, keepdim=True)", "e.sum(dim=-1, keepdim=True)")),
    ("start_here.entropy", "weights", ex.check_entropy,
     ("weights * torch.log(weights)", "terms.sum(dim=-1)")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)


def test_a_softmax_normalised_over_the_wrong_axis_is_named():
    def wrong(scores, temperature):
        z = scores / temperature
        e = torch.exp(z - z.amax(-1, keepdim=True))
        return e / e.sum(0, keepdim=True)

    assert_rejected(ex.check_softmax_with_temperature(wrong), "Hint: ", "wrong axis")


def test_check_cases_names_a_mistake_even_where_it_gives_nan():
    """A failing answer is compared with each known mistake with NaN equal to NaN, the NaN hint
    comes only when no mistake matches, and the stub's verdict stays as it is."""
    cases = [{"x": torch.tensor([1.0, 0.0, 4.0])}]
    mistakes = [Mistake(torch.log, "you took the log."),
                Mistake(lambda x: x / x, "you divided x by itself.")]
    assert check_function(lambda x: x / x, torch.sqrt, cases, mistakes=mistakes
                             ).message.endswith("Hint: you divided x by itself.")
    verdict = check_function(lambda x: x / x, torch.sqrt, cases, mistakes=mistakes,
                             nan_hint="a NaN.")                                   # 0 / 0 at 0
    assert not verdict and verdict.message.endswith("Hint: you divided x by itself.")
    verdict = check_function(lambda x: torch.where(x > 0, x, torch.nan), torch.sqrt, cases,
                             mistakes=mistakes, nan_hint="a NaN.")
    assert not verdict and verdict.message.endswith("Hint: a NaN.")
    verdict = check_function(lambda x: x + 1, torch.sqrt, cases, mistakes=mistakes,
                             nan_hint="a NaN.")
    assert not verdict and "Hint" not in verdict.message
    assert check_function(stub, torch.sqrt, cases, what="root").message == (
        "root is not implemented yet.")
    assert check_function(torch.sqrt, torch.sqrt, cases)


def test_right_values_in_the_wrong_dtype_get_no_mistake_hint():
    """Review 4: a float64 answer on float32 inputs was told "the temperature was ignored" (on
    case 1, T = 1, that mistake equals the right answer). A dtype-only miss names no mistake, and
    a mistake is named only on a case where it differs from the right answer."""
    def softmax64(scores, temperature):
        s = scores.double() / temperature
        e = (s - s.max(-1, keepdim=True).values).exp()
        return e / e.sum(-1, keepdim=True)

    def entropy64(weights):
        a = weights.double()
        return -torch.where(a > 0, a * a.log(), torch.zeros_like(a)).sum(-1)

    for verdict in (ex.check_softmax_with_temperature(softmax64), ex.check_entropy(entropy64)):
        assert not verdict and "torch.float64" in verdict.message, verdict.message
        assert "Hint" not in verdict.message, verdict.message


def no_keepdim_max(s, t):
    """Review 7: the row maximum without keepdim passes the 1-D cases, then fails to broadcast."""
    z = s / t
    e = torch.exp(z - z.amax(-1))
    return e / e.sum(-1, keepdim=True)


def test_the_commonest_beginner_slips_in_the_softmax_are_named():
    """Review 5: a row sum without keepdim raised a bare broadcasting error, and a sum over the
    whole tensor got no hint."""
    def stable(s, t):
        return torch.exp(s / t - (s / t).amax(-1, keepdim=True))

    assert_rejected(ex.check_softmax_with_temperature(lambda s, t: stable(s, t) / stable(s, t).sum(-1)),
                    "the shapes do not fit", "a row maximum or a row sum lost its axis",
                    "Keep the reduced axis on both")
    assert_rejected(ex.check_softmax_with_temperature(no_keepdim_max),
                    "the shapes do not fit", "a row maximum or a row sum lost its axis",
                    "Keep the reduced axis on both")
    assert_rejected(ex.check_softmax_with_temperature(lambda s, t: stable(s, t) / stable(s, t).sum()),
                    "sum of the whole tensor")


# --- review 6: tiny weights, and a threshold or an eps that changes them ------------------------


def test_the_peaked_case_has_tiny_subnormal_and_zero_weights_and_an_exact_top_weight():
    w = ex._peaked()
    assert w.dtype == torch.float32 and (w[1:, 0] == 1.0).all()             # its term is exactly 0
    positive = w[w > 0]
    tiny = torch.finfo(torch.float32).tiny                                    # smallest normal
    assert ((positive > 5e-7) & (positive < 2e-6)).any()                      # about 1e-6
    assert ((positive > 5e-21) & (positive < 2e-20)).any()                    # about 1e-20
    assert (positive < tiny).any()                                            # a subnormal
    assert (w == 0).any()
    assert 1e-19 < ex.entropy_reference(w)[1] < 1e-18                          # tiny terms only


def xlogy_style(p):
    """x log y with 0 log 0 = 0, as torch.xlogy does it: log only where x > 0."""
    safe = torch.where(p > 0, p, torch.ones_like(p))
    return 0.0 - torch.where(p > 0, p * torch.log(safe), torch.zeros_like(p)).sum(-1)


@pytest.mark.parametrize("right", [
    entropy, xlogy_style,
    lambda p: -torch.nan_to_num(p * torch.log(p)).sum(-1),
    lambda p: -(p * torch.log(p)).nansum(-1),
    lambda p: -(p * torch.log(p.clamp_min(1e-30))).sum(-1),                   # an eps far below
    lambda p: (-torch.where(p > 0, p.double() * p.double().log(), 0.0).sum(-1)).to(p.dtype),
], ids=["where", "xlogy_style", "nan_to_num", "nansum", "clamp_1e-30", "float64_inside"])
def test_right_answers_pass_and_give_the_reference_on_the_peaked_case(right):
    assert ex.check_entropy(right)
    w = ex._peaked()
    expected = ex.entropy_reference(w)
    assert torch.allclose(right(w).double(), expected.double(), atol=1e-30, rtol=1e-4)


def eps_form(form, eps):
    if form == "where":
        return lambda p: -torch.where(p > eps, p * torch.log(p), torch.zeros_like(p)).sum(-1)
    if form == "clamp":
        return lambda p: -(p * torch.log(p.clamp_min(eps))).sum(-1)
    if form == "add":
        return lambda p: -(p * torch.log(p + eps)).sum(-1)
    return lambda p: -(p * torch.log(p)).masked_fill(p < eps, 0.0).sum(-1)


@pytest.mark.parametrize("form, eps", [(f, e) for f in ("where", "clamp", "add", "masked_fill")
                                       for e in (1e-1, 1e-3, 1e-5)] + [("add", 1e-6), ("add", 1e-8)])
def test_an_eps_that_moves_the_entropy_past_the_tolerance_is_caught_and_named(form, eps):
    verdict = ex.check_entropy(eps_form(form, eps))
    assert_rejected(verdict, "Hint: a threshold or an eps moved your entropy by more than the "
                             "checker allows (1e-9 nats plus 0.01%)")
    for fix in ("w > 0", "weights > 0", "torch.where(", "clamp_min(", "torch.log("):
        assert fix not in verdict.message, fix


@pytest.mark.parametrize("form, eps", [("add", 1e-12), ("clamp", 1e-12), ("where", 1e-9),
                                       ("masked_fill", 1e-12), ("add", 1e-16)])
def test_an_eps_that_moves_the_entropy_by_under_1e_9_nats_passes(form, eps):
    """Issue 33: the text promises that such an eps passes; check it moves the answer that little."""
    wrong = eps_form(form, eps)
    for case in ex._entropy_cases():
        w = case["weights"]
        assert (wrong(w).double() - ex.entropy_reference(w).double()).abs().max() < 1e-9
    assert ex.check_entropy(wrong)
