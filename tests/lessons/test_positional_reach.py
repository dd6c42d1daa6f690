"""Notebook 07's ALiBi reach (``lessons.positional_reach``): the package's half-weight reach, its
argument checks, and the claims the notebook prints after exercise 3, for the same inputs."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from attn_helpers.lessons import positional_encoding as lesson
from attn_helpers.lessons.positional_reach import REACH_LENGTHS, half_weight_reach, reach_claims
from attn_helpers.positional import alibi_slopes


def notebook_reaches() -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """What notebook 07 computes after exercise 3: section 5's eight heads at both lengths."""
    slopes = alibi_slopes(8)
    return slopes, {n: half_weight_reach(slopes, n) for n in REACH_LENGTHS}


def test_the_notebook_claims_hold_and_the_printed_reaches_are_these():
    slopes, reaches = notebook_reaches()
    verdicts = reach_claims(slopes, reaches)
    assert all(verdicts.values()), {k: v for k, v in verdicts.items() if not v}
    assert reaches[24].tolist() == [2, 3, 6, 8, 10, 11, 12, 12]
    assert reaches[2048].tolist() == [2, 3, 6, 12, 23, 45, 89, 178]
    assert lesson.reach_claims is reach_claims and lesson.half_weight_reach is half_weight_reach


def test_the_notebook_inputs_stay_away_from_ties():
    """Each head's real-valued k is at least 0.05 from a whole number, so a learner's passing
    function prints the same reaches on any CPU."""
    slopes = alibi_slopes(8)
    for n in REACH_LENGTHS:
        x = -torch.log1p(torch.expm1(-slopes * n) / 2) / slopes
        assert ((x - x.round()).abs() >= 0.05).all(), (n, x)


def test_reach_claims_can_fail():
    slopes, reaches = notebook_reaches()
    assert _failed(slopes, reaches, 24, reaches[24]) == set()
    assert "24 keys: no head reaches less far than the one before" in _failed(
        slopes, reaches, 24, torch.tensor([2, 3, 6, 8, 10, 13, 12, 12]))
    assert any("the two heads with the gentlest slopes reach 12" in k for k in _failed(
        slopes, reaches, 24, torch.tensor([2, 3, 6, 8, 10, 11, 11, 12])))
    long = reaches[2048].clone()
    long[-1] = 173                                   # the reach of 1024 keys, not an endless row's
    assert any("as far as in an endless row" in k for k in _failed(slopes, reaches, 2048, long))
    long = reaches[2048].clone()
    long[3] = 7
    assert any("1.5 to 2 times" in k for k in _failed(slopes, reaches, 2048, long))
    long = reaches[2048].clone()
    long[-1] = 100
    assert any("over 100" in k for k in _failed(slopes, reaches, 2048, long))
    long = reaches[2048].clone()
    long[0] = 1
    assert any("the steepest head reaches 2 keys" in k for k in _failed(slopes, reaches, 2048, long))


def _failed(slopes, reaches, n, replaced) -> set[str]:
    return {k for k, v in reach_claims(slopes, {**reaches, n: replaced}).items() if not v}


@pytest.mark.parametrize("m, n, error, match", [
    ([0.5], 3, TypeError, "m must be a torch.Tensor"),
    (torch.tensor([1, 2]), 3, TypeError, "m must be a floating-point tensor"),
    (torch.ones(2, 2), 3, ValueError, r"m must be a 1-D tensor \(H,\).*\(2, 2\)"),
    (torch.ones(0), 3, ValueError, r"m must be a 1-D tensor.*\(0,\)"),
    (torch.tensor([0.5, 0.0]), 3, ValueError, r"positive, finite slopes, got m\[1\] = 0.0"),
    (torch.tensor([math.inf]), 3, ValueError, r"positive, finite slopes, got m\[0\] = inf"),
    (torch.tensor([math.nan]), 3, ValueError, "positive, finite slopes"),
    (torch.tensor([0.5]), 0, ValueError, "n must be >= 1"),
    (torch.tensor([0.5]), 2.0, TypeError, "n must be an int"),
    (torch.tensor([0.5]), True, TypeError, "n must be an int"),
])
def test_bad_inputs_name_the_argument(m, n, error, match):
    with pytest.raises(error, match=match):
        half_weight_reach(m, n)


def test_extreme_slopes_stay_between_1_and_n():
    m = torch.tensor([5e-324, 1e-300, 1e-12, 1e300], dtype=torch.float64)
    for n in (1, 2, 10**9):
        k = half_weight_reach(m, n)
        assert k.dtype == torch.long and ((k >= 1) & (k <= n)).all()
    mpmath.mp.dps = 40
    x = -mpmath.log((1 + mpmath.exp(mpmath.mpf(-1e-12) * 10**9)) / 2) / mpmath.mpf(1e-12)
    assert half_weight_reach(torch.tensor([1e-12], dtype=torch.float64), 10**9).item() == int(
        mpmath.ceil(x))                              # m n = 1e-3: k just under n / 2
