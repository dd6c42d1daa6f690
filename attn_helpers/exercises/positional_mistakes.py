"""The known mistakes of notebook 07's exercises 1 and 3, each as one function with a switch per
mistake (:func:`_shift`, :func:`_reach`); with their defaults they are the right answers (the
checker of exercise 3 refuses :func:`_reach` itself as a learner's answer, see
:func:`.positional_encoding.check_reach`)."""

from __future__ import annotations

import math

import torch

__all__: list[str] = []


def _reach(m: torch.Tensor, n: int, *, rounding: str = "ceil", keys: int = 0, sign: float = -1.0,
           base: float = math.e, log2: bool = False, endless: bool = False, cap: bool = False,
           statistic: str = "half") -> torch.Tensor:
    """The half-weight reach ``(H,)`` long of slopes ``m (H,)`` in a causal row of ``n`` keys with one
    thing changed (the known mistakes of exercise 3); with the defaults it is the right answer,
    ``ceil(x)`` with ``x = -ln((1 + r^n) / 2) / m``, ``r = e^{-m}``. ``keys``: a row of ``n + keys``
    keys; ``sign = +1``: weights ``e^{+m delta}``; ``base``: weights ``base^{-m delta}``; ``log2``:
    ``log2`` in place of ``ln``; ``endless``: ``ln 2 / m`` (``cap``: at most ``n``); ``statistic``:
    ``"mean"`` distance or ``"uniform"`` (``n / 2``, the slope ignored)."""
    m, rows = m.double() * math.log(base), n + keys                  # base^(-m d) = e^(-m ln(base) d)
    if statistic == "mean":
        delta = torch.arange(n, dtype=torch.float64)                  # (n,): distances 0 .. n-1
        x = (torch.softmax(-m[:, None] * delta, -1) * delta).sum(-1)  # (H,): the mean distance
    elif statistic == "uniform":
        x = torch.full_like(m, n / 2)
    elif endless:
        x = math.log(2) / m
    else:
        x = -torch.log1p(torch.expm1(-m * rows) / 2) / m               # (H,): share(x) = 1/2
        x = x if sign < 0 else rows - x          # weights e^{+m d}: the row read from its far end
    x = x / math.log(2) if log2 else x
    k = {"ceil": torch.ceil, "floor": torch.floor, "round": torch.round}[rounding](x)
    return (k.clamp(max=n) if cap else k).long()


def _shift(k: int, d: int, *, sign: float = 1.0, exponents=None, halves: bool = False,
           same_angle: bool = False, no_sin: bool = False) -> torch.Tensor:
    """The ``(d, d)`` matrix ``M_k`` with ``PE(p + k) = M_k PE(p)`` for the interleaved sinusoidal
    encoding (pair ``(sin, cos)``: block ``[[cos, sin], [-sin, cos]]`` of the angle ``k omega_i``),
    with one thing changed (the known mistakes of notebook 07's exercise 1); with the defaults
    it is the right answer."""
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    omega = torch.ones(d // 2) if same_angle else 10000.0 ** (-exponents.double())
    omega = omega.double()
    c, s = (k * omega).cos(), sign * (k * omega).sin() * (0.0 if no_sin else 1.0)
    first = torch.arange(d // 2) if halves else torch.arange(0, d, 2)   # the pair's two rows
    second = first + d // 2 if halves else first + 1
    M = torch.zeros(d, d, dtype=torch.float64)
    M[first, first], M[first, second] = c, s
    M[second, first], M[second, second] = -s, c
    return M
