"""Checkers for notebook 00 (start here): one attention row, written by hand.

1. ``softmax_with_temperature(scores (..., n), temperature) -> weights (..., n)``: the softmax of
   each row of scores divided by the temperature, with the row's maximum subtracted first.
2. ``attend_one(q (d_k,), K (n, d_k), V (n, d_v)) -> (a (n,), o (d_v,))``: one query's weights
   over the keys and its output, the weighted sum of the values.

The stored notebook calls each checker on a stub that raises ``NotImplementedError``; the
checker then says only "... is not implemented yet.". Hints come on demand, in three levels:
``exercises.hint("start_here.attend_one", 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise, hint, progress

__all__ = ["OVERFLOW_HINT", "check_attend_one", "check_cases", "check_softmax_with_temperature",
           "hint", "progress", "size"]


def size(g: torch.Generator, low: int, high: int) -> int:
    """A seeded random size in ``[low, high]``, for cases with random shapes."""
    return int(torch.randint(low, high + 1, (), generator=g))


def check_cases(candidate: Callable, reference: Callable, cases: list[dict], *,
                mistakes: Sequence[Mistake] = (), nan_hint: str | None = None,
                **kwargs) -> CheckResult:
    """:func:`~.core.check_function` (which recognises a known mistake even where it gives NaN,
    and adds ``nan_hint`` only when no mistake matches); kept as the name the checkers use."""
    return check_function(candidate, reference, cases, mistakes=mistakes, nan_hint=nan_hint,
                          **kwargs)


OVERFLOW_HINT = (
    "exp of a large number overflows to inf, and inf / inf is NaN; if you subtracted one maximum "
    "for the whole tensor, a row far below it underflows to 0 / 0 instead. Subtract each row's own "
    "maximum before exp (x.amax(dim=-1, keepdim=True)): the constant cancels in the ratio.")


# --- exercise 1: softmax with a temperature ----------------------------------------------------


def _softmax_cases() -> list[dict]:
    g = seeded(100)
    return [
        {"scores": torch.randn(5, generator=g), "temperature": 1.0},
        {"scores": torch.randn(4, generator=g), "temperature": 0.5},
        {"scores": torch.randn(3, 6, generator=g), "temperature": 2.0},
        {"scores": torch.randn(1, generator=g), "temperature": 1.0},                  # one key
        {"scores": torch.randn(2, 2, 5, generator=g, dtype=torch.float64), "temperature": 10.0},
        {"scores": torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1000.0, -999.0]]),
         "temperature": 1.0},
        {"scores": 3 * torch.randn(4, 7, generator=g), "temperature": 0.01},  # scores / T huge
        {"scores": torch.randn(size(g, 1, 4), size(g, 1, 9), generator=g),    # random shape
         "temperature": size(g, 2, 50) / 10},
    ]


def softmax_with_temperature_reference(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(..., n) -> (..., n)``: softmax over the last dim of ``scores / temperature``."""
    return torch.softmax(scores.double() / temperature, dim=-1).to(scores.dtype)


@exercise("start_here.softmax_with_temperature", "softmax of a score row, with a temperature",
          hints=(
              "A temperature T divides the scores before the softmax: small T sharpens the row, "
              "large T flattens it. Each row (the last dimension) must sum to one, and scores of "
              "1000 must not overflow.",
              "a_j = exp((s_j - m) / T) / sum_k exp((s_k - m) / T), with m = max_k s_k the "
              "row's own maximum (subtracting it changes nothing mathematically).",
              "z = scores / temperature\n"
              "e = torch.exp(z - z.amax(dim=-1, keepdim=True))\n"
              "return e / e.sum(dim=-1, keepdim=True)"))
def check_softmax_with_temperature(softmax_with_temperature: Callable) -> CheckResult:
    """Exercise: ``softmax_with_temperature(scores (..., n), temperature) -> (..., n)``."""
    return check_function(
        softmax_with_temperature, softmax_with_temperature_reference, _softmax_cases(),
        what="softmax_with_temperature", output_names=("the weights",),
        mistakes=[
            Mistake(lambda s, t: torch.softmax(s, -1),
                    "the temperature was ignored: divide the scores by T before the softmax."),
            Mistake(lambda s, t: torch.softmax(s * t, -1),
                    "you multiplied the scores by T; divide them by T (a small T must sharpen "
                    "the row)."),
            Mistake(lambda s, t: torch.softmax(s / t, 0),
                    "the softmax ran over the first dimension; each row (the last dimension, "
                    "dim=-1) must sum to one."),
            Mistake(lambda s, t: torch.exp(s / t - (s / t).amax(-1, keepdim=True)),
                    "the exponentials were not normalised: divide them by their row's sum so the "
                    "row sums to one."),
            Mistake(lambda s, t: torch.softmax(s, -1) / t,
                    "you divided the weights by T after the softmax; divide the scores before it, "
                    "so that the row still sums to one."),
        ],
        nan_hint=OVERFLOW_HINT,
    )


# --- exercise 2: one attention row by hand -----------------------------------------------------


def _attend_cases() -> list[dict]:
    g = seeded(101)
    cases = []
    for n, d_k, d_v, dtype in [(4, 3, 3, torch.float32), (5, 8, 2, torch.float32),
                               (1, 4, 3, torch.float32), (6, 16, 5, torch.float64)]:
        cases.append({"q": torch.randn(d_k, generator=g, dtype=dtype),
                      "K": torch.randn(n, d_k, generator=g, dtype=dtype),
                      "V": torch.randn(n, d_v, generator=g, dtype=dtype)})
    cases.append({"q": 100 * torch.randn(8, generator=g), "K": 10 * torch.randn(6, 8, generator=g),
                  "V": torch.randn(6, 3, generator=g)})                       # scores in the 1000s
    n, d_k, d_v = size(g, 1, 9), size(g, 1, 9), size(g, 1, 9)                   # random shapes
    cases.append({"q": torch.randn(d_k, generator=g), "K": torch.randn(n, d_k, generator=g),
                  "V": torch.randn(n, d_v, generator=g)})
    return cases


def attend_one_reference(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor):  # noqa: N803
    """``q (d_k,), K (n, d_k), V (n, d_v) -> (a (n,), o (d_v,))``."""
    a = torch.softmax((K @ q).double() / math.sqrt(q.shape[-1]), dim=-1)    # (n,)
    return a.to(q.dtype), (a @ V.double()).to(q.dtype)                       # (n,), (d_v,)


def _attend_with(weights: Callable, mix: Callable = lambda a, K, V: a @ V) -> Callable:
    def attend(q, K, V):  # noqa: N803
        a = weights(q, K, V)
        return a, mix(a, K, V)
    return attend


@exercise("start_here.attend_one", "one attention row by hand", hints=(
    "Score the query against every key with a dot product, scale, turn the scores into weights "
    "with a softmax over the keys, then mix the values with those weights.",
    "s_j = q . k_j / sqrt(d_k);  a = softmax(s);  o = sum_j a_j v_j.",
    "a = torch.softmax(K @ q / q.shape[-1] ** 0.5, dim=-1)   # (n,)\n"
    "return a, a @ V                                          # (n,), (d_v,)"))
def check_attend_one(attend_one: Callable) -> CheckResult:
    """Exercise: ``attend_one(q (d_k,), K (n, d_k), V (n, d_v)) -> (a (n,), o (d_v,))``."""
    d = math.sqrt
    return check_function(
        attend_one, attend_one_reference, _attend_cases(), what="attend_one",
        output_names=("the weights a", "the output o"),
        mistakes=[
            Mistake(_attend_with(lambda q, K, V: torch.softmax(K @ q, -1)),
                    "the scores were not scaled: divide q . k_j by sqrt(d_k) before the softmax."),
            Mistake(_attend_with(lambda q, K, V: torch.softmax(K @ q / q.shape[-1], -1)),
                    "you divided by d_k; the scale is 1 / sqrt(d_k)."),
            Mistake(_attend_with(lambda q, K, V: torch.softmax(K @ q / d(V.shape[-1]), -1)),
                    "you scaled by sqrt(d_v), the size of the values; the scale is 1 / sqrt(d_k), "
                    "the size of the queries and keys."),
            Mistake(_attend_with(lambda q, K, V: K @ q / d(q.shape[-1])),
                    "the weights are the raw scores: pass them through a softmax so they are "
                    "positive and sum to one."),
            Mistake(_attend_with(lambda q, K, V: torch.softmax(K @ q / d(q.shape[-1]), -1),
                                 lambda a, K, V: a @ K),
                    "the output mixes the keys; it must mix the values: o = a @ V."),
            Mistake(_attend_with(lambda q, K, V: torch.nn.functional.one_hot(
                        (K @ q).argmax(), K.shape[0]).to(q.dtype)),
                    "that is a hard lookup (all weight on the best key); attention is soft: "
                    "every key gets softmax(s)_j."),
            Mistake(_attend_with(lambda q, K, V: torch.full((K.shape[0],), 1 / K.shape[0],
                                                         dtype=q.dtype)),
                    "every key got the same weight 1/n: the weights must come from the scores "
                    "q . k_j."),
        ],
        nan_hint=OVERFLOW_HINT,
    )
