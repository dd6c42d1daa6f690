"""The known mistakes of notebook 07's exercises, each as one function with a switch per mistake
(:func:`_shift`, :func:`_coefficients`, :func:`_reach`); with their defaults they are the right
answers (the checkers refuse them as a learner's answer, see :mod:`.positional_encoding`). Also
exercise 2's cases and series (:func:`_rope_cases`, :func:`_series`) and exercise 3's guard
against a sum over the row (:func:`_no_row_sum`)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import torch

from ..positional import alibi_slopes
from .core import Refused, seeded

__all__: list[str] = []

#: Run around the learner's function while it is checked (exercise 2's scores from its (a, b)).
CALLED_WHILE_CHECKING = ("_series",)


# --- exercise 2: the score from d/2 coefficients -------------------------------------------------


def _series(a: torch.Tensor, b: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``a, b (..., d/2)``, ``delta (n,)`` -> ``(..., n)``: ``sum_i a_i cos(delta_j w_i) + b_i
    sin(delta_j w_i)`` in float64, ``w_i = 10000^(-2i/d)``."""
    d = 2 * a.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)     # (d/2,)
    angles = delta.to(torch.float64)[:, None] * omega                        # (n, d/2)
    return (a.double()[..., None, :] * angles.cos() + b.double()[..., None, :] * angles.sin()).sum(-1)


def _coefficients(q: torch.Tensor, k: torch.Tensor, *, sign: float = 1.0, no_b: bool = False,
                  swap: bool = False, halves: bool = False, plus: bool = False):
    """``(a, b)``, each ``(..., d/2)`` float64: the per-pair dot ``q_2i k_2i + q_2i+1 k_2i+1`` and
    cross ``q_2i k_2i+1 - q_2i+1 k_2i`` (apply_rope turns a pair counter-clockwise, so
    ``R(m)^T R(m - delta) = R(-delta)``), with one thing changed (exercise 2's known mistakes)."""
    d = q.shape[-1]
    split = (lambda x: (x[..., :d // 2], x[..., d // 2:])) if halves else (
        lambda x: (x[..., 0::2], x[..., 1::2]))
    (q0, q1), (k0, k1) = split(q.double()), split(k.double())
    a = q0 * k0 + q1 * k1                                                    # (..., d/2)
    b = sign * (q0 * k1 + q1 * k0 if plus else q0 * k1 - q1 * k0)            # (..., d/2)
    b = torch.zeros_like(a) if no_b else b
    return (b, a) if swap else (a, b)


_FAR = [50, -300, 1000, -2500, 6000, -15000, 40000]  # offsets that tell the slow pairs apart


def _rope_cases() -> list[dict]:
    """Queries and keys ``(..., d)`` float64, each with the offsets ``delta = -d .. d`` and a few
    far ones (to 40000, both ways), and the query's position ``m`` for each offset
    (random, up to 5000): enough offsets that only the right ``(a, b)`` fits them all."""
    g = seeded(71)
    h, half = torch.randint(1, 7, (2,), generator=g).tolist()
    specs = [((8,), [40, 1000]), ((3, 16), [100, 4096]), ((2,), [7, -7, 300]),
             ((4, 8), [-300, 2048]), ((2, 6), [1000, -1001, 4096]), ((h, 2 * half), [-999, 3000])]
    cases = []
    for shape, far in specs:
        d = shape[-1]
        delta = torch.cat([torch.arange(-d, d + 1), torch.tensor(far + _FAR)])    # (n,)
        m = torch.randint(-100, 5001, delta.shape, generator=g)                   # (n,)
        cases.append({"q": torch.randn(*shape, generator=g, dtype=torch.float64),
                      "k": torch.randn(*shape, generator=g, dtype=torch.float64),
                      "delta": delta, "m": m})
    return cases


# --- exercise 3: its cases, and no sum over the row -------------------------------------------

#: Every case keeps each head's real-valued k, x = -ln((1 + r^n) / 2) / m, at least this far from a
#: whole number >= 1 (tested), so any float64 closed form (log or log1p, ...) rounds it alike.
REACH_MARGIN = 0.01


def _reach_cases() -> list[dict]:
    """ALiBi's slopes for 4, 8, 12 and 16 heads in rows of 1 to 3000 keys, tiny and large slopes (the
    limits ceil(n / 2) and 1), and a random case; none within :data:`REACH_MARGIN` of a tie."""
    g = seeded(72)
    heads = int(torch.randint(2, 7, (1,), generator=g))
    log_m = torch.empty(heads, dtype=torch.float64).uniform_(math.log(1e-3), math.log(2.0), generator=g)
    n = int(torch.randint(2, 4001, (1,), generator=g))
    slopes = alibi_slopes
    return [{"m": m, "n": n} for m, n in [
        (slopes(8), 24), (slopes(4), 1), (slopes(12), 100), (slopes(4), 7), (slopes(8), 3000),
        (slopes(16), 2048),
        (torch.tensor([1e-6, 1e-4, 1e-3], dtype=torch.float64), 1001),
        (torch.tensor([0.3, 3.0, 40.0], dtype=torch.float64), 50), (log_m.exp(), n)]]


#: Rows shorter than this are not watched: a closed form's (H,) tensors could reach their length.
ROW_GUARD_MIN = 256
_NOT_THE_LEARNER = tuple(os.path.dirname(os.path.abspath(f)) for f in (
    torch.__file__, os.path.dirname(__file__), contextlib.__file__))
_WHY = ("that is a sum over the row, which this exercise refuses. The closed form is the point: "
        "the geometric series gives the reach for any n in O(1) work, even for an endless row "
        "(n -> infinity), where no sum can run. Derive it from the geometric series")


class _NoRowSum(torch.overrides.TorchFunctionMode):
    """Refuses, while ``half_weight_reach`` runs on a row of ``n`` keys, any tensor of ``n`` or more
    elements and ``n`` or more torch calls: the row's weights, vectorised or one at a time."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.calls = n, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls += 1
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() >= self.n:
                raise Refused(f"half_weight_reach built a tensor of shape {tuple(t.shape)} for a row "
                              f"of n = {self.n} keys: {_WHY}.")
        if self.calls >= self.n:
            raise Refused(f"half_weight_reach made {self.calls} torch calls for a row of n = "
                          f"{self.n} keys, one per key: {_WHY}.")
        return out


@contextlib.contextmanager
def _no_row_sum(inputs: dict) -> Iterator[None]:
    """Exercise 3's ``guard``: for a row of ``n >= ROW_GUARD_MIN`` keys, refuse a tensor as long as
    the row (:class:`_NoRowSum`) and a Python loop over it (``n`` lines run in the learner's code)."""
    n = inputs["n"]
    if not isinstance(n, int) or n < ROW_GUARD_MIN:
        yield
        return
    lines = [0]

    def local(frame, event, arg):
        if event == "line":
            lines[0] += 1
            if lines[0] >= n:
                raise Refused(f"half_weight_reach ran {lines[0]} lines of Python for a row of n = "
                              f"{n} keys: {_WHY}.")
        return local

    def tracer(frame, event, arg):
        return None if frame.f_code.co_filename.startswith(_NOT_THE_LEARNER) else local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        with _NoRowSum(n):
            yield
    finally:
        sys.settrace(previous)


# --- the known mistakes of exercises 1 and 3 ----------------------------------------------------


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
