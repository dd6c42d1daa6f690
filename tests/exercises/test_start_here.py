"""Notebook 00's checkers (``exercises.start_here``): the references pass, a stub is "not
implemented yet" and nothing more, and every plausible wrong answer is rejected with a message
that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_rejected, from_hint, stub

from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import start_here as ex


def test_the_exercises_are_registered_with_three_hints():
    for key in ("start_here.softmax_with_temperature", "start_here.attend_one"):
        assert len(EXERCISES[key].hints) == 3


# --- exercise 1: softmax with a temperature ----------------------------------------------------


def softmax_t(scores, temperature):
    z = scores / temperature
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def test_softmax_with_temperature_accepts_right_answers():
    for right in (softmax_t, lambda s, t: torch.softmax(s / t, dim=-1),
                  ex.softmax_with_temperature_reference):
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
    (lambda s, t: torch.softmax(s / t, dim=0), ["first dimension", "dim=-1"]),
    (lambda s, t: torch.exp(s / t - (s / t).amax(-1, keepdim=True)), ["not normalised"]),
    (lambda s, t: softmax_t(s, 1.0) / t, ["after the softmax"]),
    (no_max, ["nan", "overflows", "row's own maximum", "case 6 of 8"]),
    (global_max, ["nan", "one maximum for the whole tensor", "case 6 of 8"]),
    (lambda s, t: softmax_t(s, t).sum(-1), ["has shape ()", "shape (5,)"]),
])
def test_softmax_with_temperature_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_softmax_with_temperature(wrong), *fragments)


# --- exercise 2: one attention row by hand -----------------------------------------------------


def attend(q, K, V):  # noqa: N803
    s = K @ q / math.sqrt(q.shape[-1])          # (n,)
    a = softmax_t(s, 1.0)                        # (n,)
    return a, a @ V                              # (n,), (d_v,)


def test_attend_one_accepts_right_answers():
    def with_loops(q, K, V):  # noqa: N803
        s = torch.stack([torch.dot(q, k) for k in K]) / q.shape[-1] ** 0.5
        a = torch.softmax(s, -1)
        return a, sum(a_j * v_j for a_j, v_j in zip(a, V, strict=True))

    for right in (attend, with_loops, ex.attend_one_reference):
        result = ex.check_attend_one(right)
        assert result and result.message.startswith("Passed"), result.message


def test_attend_one_stub_says_only_not_implemented():
    assert ex.check_attend_one(stub).message == "attend_one is not implemented yet."
    assert "not implemented yet" in ex.check_attend_one(lambda q, K, V: None).message


def scaled_by(scale, mix=lambda a, K, V: a @ V):
    def wrong(q, K, V):  # noqa: N803
        a = softmax_t(K @ q * scale(q, V), 1.0)
        return a, mix(a, K, V)
    return wrong


def attend_no_max(q, K, V):  # noqa: N803
    e = torch.exp(K @ q / math.sqrt(q.shape[-1]))
    a = e / e.sum()
    return a, a @ V


def attend_hard(q, K, V):  # noqa: N803
    a = torch.zeros(K.shape[0], dtype=q.dtype)
    a[(K @ q).argmax()] = 1.0
    return a, a @ V


@pytest.mark.parametrize("wrong, fragments", [
    (scaled_by(lambda q, V: 1.0), ["not scaled", "sqrt(d_k)"]),
    (scaled_by(lambda q, V: 1 / q.shape[-1]), ["divided by d_k"]),
    (scaled_by(lambda q, V: 1 / math.sqrt(V.shape[-1])), ["sqrt(d_v)", "case 2 of 6"]),
    (lambda q, K, V: ((K @ q) / math.sqrt(q.shape[-1]),
                      (K @ q) / math.sqrt(q.shape[-1]) @ V), ["raw scores", "softmax"]),
    (scaled_by(lambda q, V: 1 / math.sqrt(q.shape[-1]), mix=lambda a, K, V: a @ K),
     ["mixes the keys", "a @ V"]),
    (attend_hard, ["hard lookup"]),
    (lambda q, K, V: (torch.ones(K.shape[0]) / K.shape[0], V.mean(0)), ["same weight 1/n"]),
    (attend_no_max, ["nan", "overflows", "case 5 of 6"]),
    (lambda q, K, V: attend(q, K, V)[::-1], ["the weights a has shape (3,)"]),
    (lambda q, K, V: attend(q, K, V)[1], ["returned 1 value(s); expected 2"]),
])
def test_attend_one_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_attend_one(wrong), *fragments)


def test_hints_are_printed_on_demand(capsys):
    ex.hint("start_here.attend_one", 2)
    assert "sqrt(d_k)" in capsys.readouterr().out
    ex.check_attend_one(attend)
    assert ex.progress(show=False)["start_here"]["start_here.attend_one"] is True



@pytest.mark.parametrize("key, signature, check", [
    ("start_here.softmax_with_temperature", "scores, temperature",
     ex.check_softmax_with_temperature),
    ("start_here.attend_one", "q, K, V", ex.check_attend_one),
])
def test_the_third_hint_passes_once_it_is_in_the_stub(key, signature, check):
    assert check(from_hint(key, signature))


def test_check_cases_names_a_mistake_even_where_it_gives_nan():
    """A failing answer is compared with each known mistake with NaN equal to NaN, the NaN hint
    comes only when no mistake matches, and the stub's verdict stays as it is."""
    cases = [{"x": torch.tensor([1.0, 0.0, 4.0])}]
    mistakes = [ex.Mistake(torch.log, "you took the log."),
                ex.Mistake(lambda x: x / x, "you divided x by itself.")]
    assert ex.check_function(lambda x: x / x, torch.sqrt, cases, mistakes=mistakes
                             ).message.endswith("Hint: you divided x by itself.")
    verdict = ex.check_cases(lambda x: x / x, torch.sqrt, cases, mistakes=mistakes,
                             nan_hint="a NaN.")                                   # 0 / 0 at 0
    assert not verdict and verdict.message.endswith("Hint: you divided x by itself.")
    verdict = ex.check_cases(lambda x: torch.where(x > 0, x, torch.nan), torch.sqrt, cases,
                             mistakes=mistakes, nan_hint="a NaN.")
    assert not verdict and verdict.message.endswith("Hint: a NaN.")
    verdict = ex.check_cases(lambda x: x + 1, torch.sqrt, cases, mistakes=mistakes,
                             nan_hint="a NaN.")
    assert not verdict and "Hint" not in verdict.message
    assert ex.check_cases(stub, torch.sqrt, cases, what="root").message == (
        "root is not implemented yet.")
    assert ex.check_cases(torch.sqrt, torch.sqrt, cases)
