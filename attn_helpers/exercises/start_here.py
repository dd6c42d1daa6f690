"""Checkers for notebook 00 (start here): the two extremes of an attention row."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import CheckResult, Mistake, check_function

__all__ = ["check_one_hot_row", "check_uniform_row"]

_SIZES = [{"n": n, "j": j} for n, j in [(1, 0), (4, 2), (6, 0), (9, 8)]]


def check_one_hot_row(one_hot_row: Callable) -> CheckResult:
    """Exercise: ``one_hot_row(n, j)`` -> ``(n,)`` float weights with all weight on key ``j``."""

    def reference(n, j):
        row = torch.zeros(n)
        row[j] = 1.0
        return row

    def off_by_one(n, j):
        row = torch.zeros(n)
        row[(j + 1) % n] = 1.0
        return row

    return check_function(
        one_hot_row, reference, _SIZES, what="one_hot_row", output_names=("the row",),
        mistakes=[Mistake(off_by_one, "the weight landed one key too far right: Python counts "
                                      "from 0, so key j is row[j].")],
    )


def check_uniform_row(uniform_row: Callable) -> CheckResult:
    """Exercise: ``uniform_row(n)`` -> ``(n,)`` float weights spread evenly, summing to one."""
    cases = [{"n": n} for n in (1, 2, 5, 12)]
    return check_function(
        uniform_row, lambda n: torch.full((n,), 1.0 / n), cases, what="uniform_row",
        output_names=("the row",),
        mistakes=[Mistake(lambda n: torch.ones(n),
                          "every weight is 1, so the row sums to n: divide by n so it sums to one.")],
    )
