"""Notebook 00's checkers: right answers pass, a stub is only "not implemented yet", and every
named mistake gets its hint."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton

from attn_helpers.exercises import start_here as ex


def softmax_t(scores, temperature):
    z = scores / temperature
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def entropy(p):
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def stable(s, t):
    return torch.exp(s / t - (s / t).amax(-1, keepdim=True))


def normalise(e):
    return e / e.sum(-1, keepdim=True)


def test_softmax_with_temperature_accepts_right_answers():
    for right in (softmax_t, lambda s, t: softmax_t(s.double(), t).to(s.dtype)):
        result = ex.check_softmax_with_temperature(right)
        assert result and result.message.startswith("Passed"), result.message


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, t: softmax_t(s, 1.0), ["temperature was ignored"]),
    (lambda s, t: softmax_t(s * t * t, t), ["multiplied the scores by T"]),
    (lambda s, t: softmax_t(s.movedim(0, -1), t).movedim(-1, 0), ["first dimension", "dim=-1"]),
    (lambda s, t: stable(s, t) / stable(s, t).sum(0, keepdim=True), ["Hint: ", "wrong axis"]),
    (stable, ["not normalised"]),
    (lambda s, t: softmax_t(s, 1.0) / t, ["after the softmax"]),
    (lambda s, t: stable(s, t) / stable(s, t).sum(), ["sum of the whole tensor"]),
    (lambda s, t: stable(s, t) / stable(s, t).sum(-1),
     ["the shapes do not fit", "a row maximum or a row sum lost its axis"]),
    (lambda s, t: torch.exp(s / t - (s / t).amax(-1)) / stable(s, t).sum(-1, keepdim=True),
     ["the shapes do not fit", "Keep the reduced axis on both"]),           # fails to broadcast
    (lambda s, t: normalise(torch.exp(s / t)), ["nan", "overflows", "row's own maximum", "case 6 of 8"]),
    (lambda s, t: normalise(torch.exp(s / t - (s / t).max())),     # a mistake named though NaN
     ["nan", "one maximum for the whole tensor", "case 6 of 8"]),
    (lambda s, t: normalise(torch.exp(s / t - s.amax(-1, keepdim=True))),
     ["maximum of s, not of s / T", "case 7 of 8"]),
    (lambda s, t: normalise(torch.exp(s / t - (s / t).min(-1, keepdim=True).values)),
     ["nan", "minimum or mean, not its maximum", "case 7 of 8"]),
    (lambda s, t: normalise(torch.exp(s / t - (s / t).mean(-1, keepdim=True))),
     ["nan", "minimum or mean, not its maximum"]),
    (lambda s, t: softmax_t(s, t).sum(-1), ["returned the weights with shape ()", "shape (5,)"]),
    (lambda s, t: torch.softmax(s / t, dim=1), ["Dimension out of range", "Hint: a fixed axis"]),
    (lambda s, t: softmax_t(s - s.max(-1, keepdim=True), t), ["Hint: max(dim=...) returns a pair"]),
    (lambda s, t: softmax_t(s, t ** 0.5), ["divided the scores by sqrt(T)"]),
    (lambda s, t: normalise(torch.exp((s / t).clamp(-80, 80))), ["clamped s / T", "case 6 of 8"]),
    (lambda s, t: normalise(torch.exp2(s / t - (s / t).amax(-1, keepdim=True))), ["2 ** x"]),
    (lambda s, t: normalise(torch.exp(s / t - (s / t).amax(0))),
     ["maximum over dim=0", "each row's own maximum", "case 3 of 8"]),
    (lambda s, t: softmax_t(s, t).float(), ["as torch.float32", "the right answer is torch.float64"]),
    (lambda s, t: torch.nn.functional.softmax(s / t, -1), ["a softmax call", "torch.exp"]),
])
def test_softmax_with_temperature_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_softmax_with_temperature(wrong), *fragments)


@pytest.mark.parametrize("wrong, fragments", [
    (lambda p: -torch.where(p > 0, p * torch.log2(p), 0.0).sum(-1), ["bits"]),
    (lambda p: -torch.where(p > 0, p * torch.log10(p), 0.0).sum(-1), ["log base 10"]),
    (lambda p: -entropy(p), ["sign is flipped"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).mean(-1), ["averaged over the keys"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum(0), ["first dimension"]),
    (lambda p: -torch.where(p > 0, torch.log(p), 0.0).sum(-1), ["weighted by a_j"]),
    (lambda p: -(p * torch.log1p(p)).sum(-1), ["log1p(a) is ln(1 + a)"]),
    (lambda p: torch.distributions.Categorical(probs=p).entropy(), ["1.2e-07", "Categorical clamps"]),
    (lambda p: torch.tensor(p.shape[-1], dtype=p.dtype).log() - entropy(p), ["ln n - H"]),
    (lambda p: -(p * torch.log(p)).sum(-1), ["nan", "0 * ln 0", "(3, 3)"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum(-1, keepdim=True),
     ["shape (1,)", "shape ()", "Hint: you kept the summed axis (keepdim=True)"]),
    (lambda p: torch.where(p > 0, -p * torch.log(p), 0.0), ["shape (6,)", "shape ()",
                                                            "Hint: you returned each key's term"]),
    (lambda p: torch.where(p > 0, p * torch.log(1 / p), 0.0).sum(-1),
     ["with inf at index", "Hint: an entropy came out infinite", "1 / a is inf"]),
    (lambda p: entropy(p) + 0.1, ["returned the entropy with wrong values", "largest difference 0.1"]),
    (lambda p: entropy(p).tolist(), ["returned the entropy as a float; return a torch.Tensor"]),
    (lambda p: torch.special.entr(p).sum(-1), ["torch.special.entr", "torch.log"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum(1), ["Dimension out of range",
                                                                 "Hint: a fixed axis"]),
])
def test_entropy_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_entropy(wrong), *fragments)


def test_right_values_in_the_wrong_dtype_get_no_mistake_hint():   # float64 = "T ignored" at T = 1
    for verdict in (ex.check_softmax_with_temperature(lambda s, t: softmax_t(s.double(), t)),
                    ex.check_entropy(lambda p: entropy(p.double()))):
        assert not verdict and "torch.float64" in verdict.message, verdict.message
        assert "Hint" not in verdict.message, verdict.message


@pytest.mark.parametrize("key, signature, check, fills", [
    ("start_here.softmax_with_temperature", "scores, temperature", ex.check_softmax_with_temperature,
     ("z.amax(dim=-1, keepdim=True)", "e.sum(dim=-1, keepdim=True)")),
    ("start_here.entropy", "weights", ex.check_entropy,
     ("torch.ones_like(weights)", "dim=-1")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)


# --- tiny weights: an eps that moves the entropy by more than 1e-9 nats is named -----------------


def eps_form(form, eps):
    return {"where": lambda p: -torch.where(p > eps, p * torch.log(p), torch.zeros_like(p)).sum(-1),
            "clamp": lambda p: -(p * torch.log(p.clamp_min(eps))).sum(-1),
            "add": lambda p: -(p * torch.log(p + eps)).sum(-1),
            "masked_fill": lambda p: -(p * torch.log(p)).masked_fill(p < eps, 0.0).sum(-1)}[form]


@pytest.mark.parametrize("right", [
    entropy,
    lambda p: -torch.nan_to_num(p * torch.log(p)).sum(-1),
    lambda p: -(p * torch.log(p)).nansum(-1),
    lambda p: -(p * torch.log(p.clamp_min(1e-30))).sum(-1),                   # an eps far below
    lambda p: 0.0 - torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0).sum(-1),
    lambda p: (-torch.where(p > 0, p.double() * p.double().log(), 0.0).sum(-1)).to(p.dtype),
    eps_form("add", 1e-12), eps_form("clamp", 1e-12), eps_form("where", 1e-9),
    eps_form("masked_fill", 1e-12), eps_form("add", 1e-16),
], ids=["where", "nan_to_num", "nansum", "clamp_1e-30", "xlogy_style", "float64_inside",
        "add_1e-12", "clamp_1e-12", "where_1e-9", "masked_fill_1e-12", "add_1e-16"])
def test_right_answers_and_an_eps_under_1e_9_nats_pass(right):
    assert ex.check_entropy(right)


def test_a_pass_whose_gradient_is_nan_through_a_softmax_gets_a_note():
    for answer in (entropy, lambda p: -torch.xlogy(p, p).sum(-1)):        # single where, xlogy
        assert "Note: through a softmax" in ex.check_entropy(answer).message
    double_where = lambda p: -(p * torch.log(torch.where(p > 0, p, 1.0))).sum(-1)  # noqa: E731
    assert "Note:" not in ex.check_entropy(double_where).message


@pytest.mark.parametrize("form, eps", [("where", 1e-3), ("clamp", 1e-5), ("masked_fill", 1e-1),
                                       ("add", 1e-6), ("add", 1e-8)])
def test_an_eps_that_moves_the_entropy_past_the_tolerance_is_named(form, eps):
    verdict = ex.check_entropy(eps_form(form, eps))
    assert_rejected(verdict, "Hint: a threshold or an eps moved your entropy by more than the "
                             "checker allows (1e-9 nats plus 0.01%)")
