r"""Notebook 03's measurement after exercise 3: the gradient that reaches :math:`W_Q`, with and
without the :math:`1/\sqrt{d_k}` scale, and where it comes from.

The chain is :math:`dW_Q = x^\top dQ`, :math:`dQ = c\, dS\, K`, :math:`dS` the gradient at the
scores :math:`S = c\, QK^\top`. Without the scale (:math:`c = 1`) the softmax saturates and most
rows of :math:`dS` vanish (section 3), but :math:`dQ` misses the factor :math:`1/\sqrt{d_k}`: the two
effects compete. :func:`projection_gradient_table` measures both on random inputs as in section 1;
:func:`projection_claims` states what holds. :mod:`attn_helpers.lessons.scaling` re-exports them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from itertools import pairwise

import torch

from ..measure import fit_power_law
from ..training import single_thread

__all__ = ["PROJECTION_SEEDS", "projection_gradient_table", "projection_claims"]

PROJECTION_SEEDS = (0, 1, 2, 3, 4)
# The thresholds of the claims, defined once (see projection_claims()).
LARGER = (1.5, 8)             # unscaled |dW_Q| / scaled: above at every d_k; above at d_k = 1024
FLAT_W = 0.2                  # scaled |dW_Q|: medians over seeds within 20% of each other
SPLIT = 0.2                   # ratio within 20% of sqrt(d_k) x the ratio of |dS| (all rows)
ROOT_SLOPE = (-0.35, -0.1)    # unscaled |dS| over all rows: log-log slope against d_k, 64 on
MEAN_SLOPE = (-0.6, -0.35)    # unscaled mean row |dS_i|: the same slope
FEW_ROWS = (0.1, 0.9, 0.4)    # largest d_k: the top 10% of rows hold > 90% of |dS|^2 unscaled,
                              # < 40% scaled
MEDIAN_ROW = 1e-3             # ...and the median row's |dS_i| below this x the scaled one


def _autograd(x, w_q, w_k, scale, up):
    """Autograd's gradients at ``W_Q``, ``W_K`` and the scores ``S`` for ``L = <softmax(S), up>``."""
    w_q, w_k = (w.clone().requires_grad_(True) for w in (w_q, w_k))
    scores = scale * (x @ w_q) @ (x @ w_k).mT                        # (b, n, n)
    scores.retain_grad()
    (torch.softmax(scores, dim=-1) * up).sum().backward()
    return w_q.grad, w_k.grad, scores.grad


def projection_gradient_table(
    gradients: Callable | None, d_ks: Sequence[int], seeds: Sequence[int] = PROJECTION_SEEDS, *,
    batch: int = 32, n: int = 16, d_model: int = 64,
) -> list[dict]:
    r"""For each ``d_k``, seed and setting of the scale (:math:`1/\sqrt{d_k}` or 1), on ``batch``
    sequences of ``n`` tokens ``x`` with standard normal components, ``W_Q``, ``W_K``
    ``(d_model, d_k)`` with entries of variance ``1/d_model`` (so every component of ``q`` and
    ``k`` has variance about 1, as in section 1) and a fixed upstream gradient ``dL/dA`` with
    standard normal entries (the same for both settings): a row ``{"d_k", "seed", "scaled",
    "W_Q", "W_K", "scores", "mean row", "median row", "top share"}``. ``"W_Q"`` and ``"W_K"`` are
    the norms of ``gradients(x, W_Q, W_K, scale, dL/dA)`` (exercise 3's function; ``None``:
    autograd's);
    the rest describe ``dS``, autograd's gradient at the scores: its norm over all rows, the mean
    and the median of its rows' norms, and the share of its squared norm held by the tenth of the
    rows with the largest norms. Runs on one thread (see :func:`attn_helpers.training.single_thread`)."""
    with single_thread():
        return [row for d_k in d_ks for seed in seeds
                for row in _measure(gradients, d_k, seed, batch, n, d_model)]


def _measure(gradients, d_k, seed, batch, n, d_model) -> list[dict]:
    """:func:`projection_gradient_table`'s two rows (unscaled, scaled) for one ``d_k`` and seed."""
    g = torch.Generator().manual_seed(1000 * seed + d_k)
    x = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
    w_q, w_k = (torch.randn(d_model, d_k, generator=g, dtype=torch.float64) / math.sqrt(d_model)
                for _ in range(2))
    up = torch.randn(batch, n, n, generator=g, dtype=torch.float64)       # dL/dA, both settings
    rows = []
    for scaled in (False, True):
        scale = 1 / math.sqrt(d_k) if scaled else 1.0
        grad_w_q, grad_w_k, d_s = _autograd(x, w_q, w_k, scale, up)
        if gradients is not None:
            grad_w_q, grad_w_k = gradients(x, w_q, w_k, scale, up)
        per_row = d_s.norm(dim=-1).flatten()                            # (batch * n,)
        squares = per_row.square().sort(descending=True).values
        top = squares[:max(1, round(FEW_ROWS[0] * len(squares)))].sum() / squares.sum()
        rows.append({"d_k": d_k, "seed": seed, "scaled": scaled, "W_Q": grad_w_q.norm().item(),
                     "W_K": grad_w_k.norm().item(), "scores": d_s.norm().item(),
                     "mean row": per_row.mean().item(), "median row": per_row.median().item(),
                     "top share": top.item()})
    return rows


def _pairs(rows: list[dict]) -> dict[tuple[int, int], tuple[dict, dict]]:
    """``{(d_k, seed): (unscaled row, scaled row)}``."""
    by = {(r["d_k"], r["seed"], r["scaled"]): r for r in rows}
    return {(d, s): (by[d, s, False], by[d, s, True]) for d, s, scaled in by if scaled}


def _median_over_seeds(rows: list[dict], d_ks: list[int], key: str, scaled: bool) -> list[float]:
    return [statistics.median(r[key] for r in rows if r["d_k"] == d and r["scaled"] == scaled)
            for d in d_ks]


def projection_claims(rows: list[dict], *, why: bool = False) -> dict[str, bool]:
    """Notebook 03's statements about :func:`projection_gradient_table` (every seed, or the
    median over seeds where named): what the gradient at ``W_Q`` does, or (``why``) where it
    comes from."""
    pairs = _pairs(rows)
    d_ks = sorted({d for d, _ in pairs})
    ratio = {key: off["W_Q"] / on["W_Q"] for key, (off, on) in pairs.items()}
    top = max(d_ks)
    if not why:
        median_ratio = [statistics.median(r for (d, _), r in ratio.items() if d == d_k)
                        for d_k in d_ks]
        scaled = _median_over_seeds(rows, d_ks, "W_Q", True)
        return {
            f"unscaled: more gradient reaches W_Q and W_K than scaled (> {LARGER[0]}x) at every "
            "d_k, on every seed": all(off[w] > LARGER[0] * on[w] for off, on in pairs.values()
                                      for w in ("W_Q", "W_K")),
            f"the W_Q ratio rises with every d_k step (median over seeds), > {LARGER[1]}x at d_k = "
            f"{top} on every seed": all(a < b for a, b in pairwise(median_ratio))
            and all(r > LARGER[1] for (d, _), r in ratio.items() if d == top),
            f"scaled: |dW_Q| flat in d_k (medians over seeds within {FLAT_W:.0%} of each other)":
                max(scaled) < (1 + FLAT_W) * min(scaled),
        }
    mid = [d for d in d_ks if d >= 64]
    root, mean = (_median_over_seeds(rows, mid, key, False) for key in ("scores", "mean row"))
    off_top, on_top = zip(*(pairs[d, s] for d, s in pairs if d == top), strict=True)
    return {
        f"the W_Q ratio is sqrt(d_k) x the ratio of |dS| over all rows, within {SPLIT:.0%} (every d_k "
        "and seed)": all(abs(ratio[d, s] / (math.sqrt(d) * off["scores"] / on["scores"]) - 1) < SPLIT
                         for (d, s), (off, on) in pairs.items()),
        f"unscaled, from d_k = 64 on: |dS| over all rows falls like d_k^-1/4 (slope in "
        f"{ROOT_SLOPE}), the mean row like d_k^-1/2 (slope in {MEAN_SLOPE})":
            ROOT_SLOPE[0] < fit_power_law(mid, root).slope < ROOT_SLOPE[1]
            and MEAN_SLOPE[0] < fit_power_law(mid, mean).slope < MEAN_SLOPE[1],
        f"d_k = {top}: the top {FEW_ROWS[0]:.0%} of rows hold > {FEW_ROWS[1]:.0%} of |dS|^2 "
        f"unscaled, < {FEW_ROWS[2]:.0%} scaled; the median row passes back < {MEDIAN_ROW:g}x the "
        "scaled one": all(r["top share"] > FEW_ROWS[1] for r in off_top)
        and all(r["top share"] < FEW_ROWS[2] for r in on_top)
        and all(off["median row"] < MEDIAN_ROW * on["median row"]
                for off, on in zip(off_top, on_top, strict=True)),
    }
