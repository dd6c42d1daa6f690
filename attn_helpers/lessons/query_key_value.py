"""Small 2-D geometry used to show that attention outputs are convex combinations of values."""

from __future__ import annotations

import torch

from .._checks import require_tensor, shape

__all__ = ["convex_hull_2d", "inside_convex_hull"]


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
