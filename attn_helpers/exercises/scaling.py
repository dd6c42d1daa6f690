"""Checkers for notebook 03 (why scale by sqrt(d_k)): score variance, softmax Jacobian, and the
temperature that halves a row's entropy."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..entropy import attention_entropy
from ..lessons.scaling import softmax_jacobian, temperature_for_entropy
from .core import CheckResult, Mistake, check_function, seeded

__all__ = ["as_number_function", "check_score_variance", "check_softmax_jacobian",
           "check_half_entropy_temperature"]


def as_number_function(fn: Callable, what: str) -> Callable:
    """Wrap a learner's function that returns a plain number so :func:`check_function` can
    compare it: the number comes back as a float64 scalar tensor. Anything else raises a
    ``TypeError`` that the checker reports in words."""
    if not callable(fn):
        return fn

    def wrapped(*args):
        value = fn(*args)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} should return a number, got {type(value).__name__}")
        return torch.tensor(float(value), dtype=torch.float64)

    return wrapped


def check_score_variance(predict: Callable) -> CheckResult:
    """Exercise: ``predict(d_k, scaled) -> number``, the variance of ``q . k`` (divided by
    ``sqrt(d_k)`` when ``scaled``) for standard-normal components."""
    cases = [{"d_k": d_k, "scaled": scaled} for d_k in (4, 64, 512, 1) for scaled in (False, True)]

    def number(f):
        return lambda d_k, scaled: torch.tensor(float(f(d_k, scaled)), dtype=torch.float64)

    return check_function(
        as_number_function(predict, "predict"),
        number(lambda d_k, scaled: 1.0 if scaled else d_k), cases,
        what="predict", output_names=("the variance",), atol=1e-9, rtol=1e-9,
        mistakes=[
            Mistake(number(lambda d_k, scaled: 1.0 if scaled else math.sqrt(d_k)),
                    "sqrt(d_k) is the standard deviation of q . k; its variance is d_k "
                    "(a sum of d_k independent products, each of variance 1)."),
            Mistake(number(lambda d_k, scaled: 1.0 / math.sqrt(d_k) if scaled else d_k),
                    "dividing a number by c divides its variance by c**2: d_k / sqrt(d_k)**2 = 1."),
            Mistake(number(lambda d_k, scaled: float(d_k)),
                    "the scaled case divides q . k by sqrt(d_k), which divides the variance by d_k."),
        ],
    )


def _jacobian_cases() -> list[dict]:
    g = seeded(31)
    cases = [{"weights": torch.softmax(2 * torch.randn(shape, generator=g, dtype=torch.float64), -1)}
             for shape in [(5,), (3, 4), (2, 3, 6)]]
    cases.append({"weights": torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.25, 0.5]], dtype=torch.float64)})
    return cases


def check_softmax_jacobian(jacobian: Callable) -> CheckResult:
    """Exercise: ``jacobian(weights (..., n)) -> (..., n, n)`` with
    ``J[i, j] = a_i (delta_ij - a_j)``."""
    return check_function(
        jacobian, softmax_jacobian, _jacobian_cases(), what="jacobian",
        output_names=("the Jacobian",), atol=1e-9,
        mistakes=[
            Mistake(lambda a: -softmax_jacobian(a),
                    "the sign is flipped: J = diag(a) - a a^T, so its diagonal a_i (1 - a_i) is "
                    "positive."),
            Mistake(lambda a: torch.diag_embed(a) - a[..., :, None] * a[..., :, None],
                    "a[..., :, None] * a[..., :, None] gives a_i * a_i in every column; the outer "
                    "product a_i * a_j needs a[..., :, None] * a[..., None, :]."),
            Mistake(lambda a: torch.diag_embed(a),
                    "diag(a) is only half of it: subtract the outer product a a^T."),
        ],
    )


def _temperature_cases() -> list[dict]:
    g = seeded(32)
    cases = [{"scores": 2 * torch.randn(n, generator=g, dtype=torch.float64)} for n in (4, 8, 16)]
    cases.append({"scores": torch.tensor([3.0, 1.0, 0.0, 0.0, -1.0], dtype=torch.float64)})
    return cases


def _half_entropy_temperature(scores: torch.Tensor) -> torch.Tensor:
    target = 0.5 * attention_entropy(torch.softmax(scores, -1)).item()
    return torch.tensor(temperature_for_entropy(scores, target), dtype=torch.float64)


def check_half_entropy_temperature(find: Callable) -> CheckResult:
    """Exercise: ``find(scores (n,)) -> T`` such that the entropy of ``softmax(scores / T)`` is
    half the entropy of ``softmax(scores)``."""
    return check_function(
        as_number_function(find, "find"), _half_entropy_temperature, _temperature_cases(),
        what="find", output_names=("the temperature",), atol=1e-3, rtol=1e-3,
        mistakes=[
            Mistake(lambda scores: torch.tensor(0.5, dtype=torch.float64),
                    "the entropy is not proportional to T. Search for T instead: the entropy "
                    "grows with T, so a bisection between a small and a large T converges."),
            Mistake(lambda scores: torch.tensor(2.0, dtype=torch.float64),
                    "a larger T flattens the softmax and *raises* the entropy; you need T < 1, "
                    "and it is not simply 1/2 either: search for it."),
        ],
    )
