"""Notebook 02: query, key, value. The hard and the soft lookup (the notebook prints
:func:`lookups`), the hand-set sentence of section 2, and the 2-D convex hull that section 3 draws.
The experiments and their claims are in the notebook's cells.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import require_tensor, shape

__all__ = ["convex_hull_2d", "inside_convex_hull", "draw_hull_figure", "QUERY", "CATEGORIES",
           "PLANE_VALUES", "lookups", "TOKENS", "FEATURES", "EMBEDDING", "LOOKS_FOR",
           "sentence_projections"]


def _check_points(name: str, points) -> torch.Tensor:
    require_tensor(name, points, floating=True)
    if points.dim() != 2 or points.shape[1] != 2:
        raise ValueError(f"{name} must have shape (n, 2), got {shape(points)}")
    return points


def _cross(o: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def convex_hull_2d(points: torch.Tensor) -> torch.Tensor:
    """Vertices ``(h, 2)`` of the convex hull of ``points`` ``(n, 2)``, counter-clockwise
    (Andrew's monotone chain; collinear points on an edge are dropped)."""
    _check_points("points", points)
    ordered = sorted(map(tuple, points.tolist()))
    unique = [torch.tensor(p, dtype=points.dtype) for i, p in enumerate(ordered)
              if i == 0 or p != ordered[i - 1]]
    if len(unique) <= 2:
        return torch.stack(unique)
    lower, upper = [], []
    for p in unique:
        while len(lower) >= 2 and _cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(unique):
        while len(upper) >= 2 and _cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return torch.stack(lower[:-1] + upper[:-1])


def inside_convex_hull(queries: torch.Tensor, points: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """``(m,)`` bool: which of ``queries`` ``(m, 2)`` lie in the convex hull of ``points``
    ``(n, 2)`` (boundary included, up to ``tol``). The hull must have at least 3 vertices."""
    _check_points("queries", queries)
    hull = convex_hull_2d(points).to(queries.dtype)
    if len(hull) < 3:
        raise ValueError(f"points must span an area (>= 3 non-collinear points), got {shape(points)}")
    start, end = hull, torch.roll(hull, -1, dims=0)
    edge = end - start                                  # (h, 2)
    to_query = queries[:, None, :] - start[None, :, :]  # (m, h, 2)
    cross = edge[None, :, 0] * to_query[..., 1] - edge[None, :, 1] * to_query[..., 0]
    return (cross >= -tol).all(dim=1)


LABEL_OFFSETS = {"cat": (8, -4), "dog": (6, 6), "car": (-9, -4), "bus": (-8, 6),
                 "apple": (-9, -10), "pear": (9, -4)}   # points: each label beside its marker


def draw_hull_figure(ax, keys: torch.Tensor, key_names, queries: torch.Tensor,
                     outputs: torch.Tensor) -> None:
    """Section 3's picture on ``ax``: the convex hull of the values (= ``keys`` ``(n, 2)``), the
    ``queries`` ``(m, 2)``, their ``outputs`` ``(m, 2)`` and the labelled keys, all in view."""
    for name, points in (("keys", keys), ("queries", queries), ("outputs", outputs)):
        _check_points(name, points)
    hull = convex_hull_2d(keys)
    ax.fill(*torch.cat([hull, hull[:1]]).T, alpha=0.15, color="#3b75af",
            label="convex hull of values")
    ax.scatter(*queries.T, s=6, color="grey", alpha=0.4, label="queries")
    ax.scatter(*outputs.T, s=8, color="#ff7f0e", label="outputs")
    ax.scatter(*keys.T, s=60, color="#3b75af", edgecolor="black", label="values (= keys)")
    for name, (x, y) in zip(key_names, keys.tolist(), strict=True):
        dx, dy = LABEL_OFFSETS.get(name, (8, 4))
        ax.annotate(name, (x, y), xytext=(dx, dy), textcoords="offset points",
                    ha="right" if dx < 0 else "left",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "lw": 0})
    limit = 1.05 * torch.cat([queries, keys]).abs().max().item()      # every point in view
    ax.set(aspect="equal", xlim=(-limit, limit), ylim=(-limit, limit))
    ax.legend(fontsize=8, loc="lower left")


# --- section 1: a hard and a soft lookup in the plane ------------------------------------------

QUERY = (1.0, 0.4)            # section 1's query, between the animals and the fruit
CATEGORIES = ("animal", "vehicle", "fruit")
PLANE_VALUES = (0, 0, 1, 1, 2, 2)   # the category of each of the six keys, in order


def lookups(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
    r"""Hard and soft lookup of one query ``(d_k,)`` among ``keys`` ``(n, d_k)`` with ``values``
    ``(n, d_v)``, with scaled scores :math:`s_j = q \cdot k_j / \sqrt{d_k}`.

    Returns ``(hard, soft)`` weights ``(n,)`` and outputs ``(d_v,)``, as ``(hard_w, soft_w,
    hard_out, soft_out)``: ``hard_w`` is one-hot on the best key (``argmax``), ``soft_w`` is
    ``softmax(s)``; the outputs are ``weights @ values``."""
    scores = keys @ query / math.sqrt(keys.shape[-1])                      # (n,)
    hard = F.one_hot(scores.argmax(), len(keys)).to(scores.dtype)          # (n,)
    soft = torch.softmax(scores, dim=0)                                    # (n,)
    return hard, soft, hard @ values, soft @ values                        # (d_v,) outputs


# --- section 2: the sentence with hand-set projections ----------------------------------------

TOKENS = ("the", "cat", "sat", "on", "the", "mat")
FEATURES = ("det", "noun", "animal", "verb", "prep", "place")
EMBEDDING = {                 # one row per word: which features it has
    "the": (1, 0, 0, 0, 0, 0), "cat": (0, 1, 1, 0, 0, 0), "sat": (0, 0, 0, 1, 0, 0),
    "on": (0, 0, 0, 0, 1, 0), "mat": (0, 1, 0, 0, 0, 1),
}
LOOKS_FOR = {"det": "noun", "verb": "animal", "prep": "place", "animal": "verb", "place": "prep"}
AFFINITY = 6.0


def sentence_projections(seed: int = 0):
    r"""The sentence of section 2 and its hand-set projections: ``(X, W_Q, W_K, W_V)``.

    ``X`` ``(n, d_model) = (6, 6)`` holds one feature row per token. ``M[a, b] = 6`` when a
    token with feature ``a`` looks for feature ``b``; only :math:`W_Q W_K^\top` enters the scores,
    so ``M`` is factored as :math:`W_Q = M R`, :math:`W_K = R` with a random orthogonal ``R``
    (seeded): :math:`W_Q W_K^\top = M R R^\top = M`. ``W_V`` is the identity."""
    X = torch.tensor([EMBEDDING[t] for t in TOKENS], dtype=torch.float32)   # (n, d_model)
    f = {name: i for i, name in enumerate(FEATURES)}
    M = torch.zeros(len(FEATURES), len(FEATURES))
    for mine, wanted in LOOKS_FOR.items():
        M[f[mine], f[wanted]] = AFFINITY
    generator = torch.Generator().manual_seed(seed)
    R, _ = torch.linalg.qr(torch.randn(len(FEATURES), len(FEATURES), generator=generator))
    return X, M @ R, R, torch.eye(len(FEATURES))
