"""The known mistakes of notebook 07's ALiBi exercise, as one function with a switch per mistake
(:func:`_alibi`); with its defaults it is the right answer, so the checker refuses it as a learner's
answer (see :func:`.positional_encoding.check_alibi`)."""

from __future__ import annotations

import torch

__all__: list[str] = []


def _alibi(n: int, H: int, *, first: int = 1, sign: float = -1.0, distance: str = "signed",  # noqa: N803
           future: float = float("-inf"), base: float = 2.0, per: str = "head", H_for_ratio=None,
           diagonal: bool = True, order: str = "up", transpose: bool = False) -> torch.Tensor:
    """The causal ALiBi bias ``(H, n, n)`` with one thing changed (the known mistakes); with the
    defaults it is the right answer: ``-m_h (i - j)`` for ``j <= i``, ``-inf`` above, ``m_h =
    2^(-8h/H)`` for ``h = 1 .. H``."""
    h = torch.arange(first, first + H, dtype=torch.float64)
    h = h.flip(0) if order == "down" else h
    m = base ** (-8.0 * h / (H if H_for_ratio is None else H_for_ratio))        # (H,)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    gap = (i - j).to(torch.float64)                                             # (n, n): i - j
    gap = gap.abs() if distance == "abs" else gap
    if per == "head":
        bias = sign * m[:, None, None] * gap                                    # (H, n, n)
    else:                                                 # a slope per query row or key column
        bias = sign * (m[:, None] if per == "query" else m[None, :]) * gap      # (n, n) if H == n
    visible = (j <= i) if diagonal else (j < i)
    if future is not None:
        bias = bias.masked_fill(~visible, future)
    bias = bias.transpose(-1, -2) if transpose else bias
    return bias.float()


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
