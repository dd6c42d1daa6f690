r"""Notebook 07's ALiBi reach: how far back a head looks from its bias alone (exercise 3 and the
cell after it).

With equal content scores, a query that sees ``n`` keys (causal: distances ``delta = 0 .. n - 1``)
puts weight proportional to ``r^delta``, ``r = e^{-m}``, on the key ``delta`` back under ALiBi's bias
``-m delta``. The *half-weight reach* is the smallest ``k`` such that the keys at distances
``0 .. k - 1`` carry at least half the row's weight. The geometric series gives their share,
``share(k) = (1 - r^k) / (1 - r^n)``, and ``share(k) >= 1/2`` exactly when ``r^k <= (1 + r^n) / 2``,
that is ``k >= x = -ln((1 + r^n) / 2) / m``, so ``k = ceil(x)``, with ``1 <= k <= n``. A row of one
key gives 1; as ``m -> 0`` the row turns uniform and ``k -> ceil(n / 2)``; when ``m n`` is large,
``r^n -> 0`` and ``k = ceil(ln 2 / m)``, the reach of an endless row. At an exact tie
(``share(k) = 1/2``) that ``k`` counts, as "at least half" says.
"""

from __future__ import annotations

import math

import torch

from .._checks import require_positive_int, require_tensor, shape

__all__ = ["REACH_LENGTHS", "half_weight_reach", "reach_claims"]

#: The two rows notebook 07 measures its 8 heads in: section 5's 24 keys, and a long row.
REACH_LENGTHS = (24, 2048)


def half_weight_reach(m: torch.Tensor, n: int) -> torch.Tensor:
    """``(H,)`` long: the half-weight reach of each head, ``m (H,)`` its ALiBi slopes (``> 0``), in a
    causal row of ``n >= 1`` keys (equal content scores), computed in float64."""
    require_tensor("m", m, floating=True)
    if m.dim() != 1 or m.numel() == 0:
        raise ValueError(f"m must be a 1-D tensor (H,) of slopes, H >= 1, got shape {shape(m)}")
    bad = (~(torch.isfinite(m) & (m > 0))).nonzero()
    if len(bad):
        raise ValueError(f"m must hold positive, finite slopes, got m[{int(bad[0])}] = "
                         f"{m[bad[0]].item()}")
    require_positive_int("n", n)
    m = m.double()
    x = -torch.log1p(torch.expm1(-m * n) / 2) / m     # (H,): -ln((1 + r^n) / 2) / m, exact as m n -> 0
    return torch.ceil(x).clamp(1, n).long()           # (H,): the smallest whole k >= x (1 <= k <= n)


def reach_claims(slopes: torch.Tensor, reaches: dict[int, torch.Tensor]) -> dict[str, bool]:
    """What notebook 07 says about its heads' reaches, each claim with its verdict. ``slopes (H,)``:
    the heads' slopes, steepest first; ``reaches``: ``{n: (H,) reaches}`` for a short and a long
    row (:data:`REACH_LENGTHS`), from the learner's :func:`half_weight_reach` or the reference."""
    short, long = sorted(reaches)
    near, far = reaches[short], reaches[long]                    # (H,) each
    endless = torch.ceil(math.log(2) / slopes.double()).long()   # (H,): an endless row's reach
    ratio = far[1:] / far[:-1]                                   # (H - 1,): head h + 1 over head h
    half = math.ceil(short / 2)
    return {
        f"{short} keys: no head reaches less far than the one before":
            bool((near[1:] >= near[:-1]).all()),
        f"{short} keys: the two heads with the gentlest slopes reach {half} keys, half the row, as a "
        "uniform row does":
            bool((near[-2:] == half).all()),
        f"{long} keys: every head reaches as far as in an endless row, ceil(ln 2 / m_h)":
            bool((far == endless).all()),
        f"{long} keys: each head reaches 1.5 to 2 times as far as the one before":
            bool(((ratio >= 1.5) & (ratio <= 2)).all()),
        f"{long} keys: the steepest head reaches 2 keys, the shallowest over 100":
            bool(far[0] == 2 and far[-1] > 100),
    }
