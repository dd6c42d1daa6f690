"""Notebook 02's data: section 1's query and the categories of its six keys (the widget's
``DEMO_KEYS``), section 2's sentence with its features, and the convex hull of points in a plane."""

import torch

QUERY = (1.0, 0.4)                  # section 1's query, between the animals and the fruit
CATEGORIES = ("animal", "vehicle", "fruit")
PLANE_VALUES = (0, 0, 1, 1, 2, 2)   # the category of each of the six keys, in order

TOKENS = ("the", "cat", "sat", "on", "the", "mat")
FEATURES = ("det", "noun", "animal", "verb", "prep", "place")
EMBEDDING = {                       # one row per word: which features it has
    "the": (1, 0, 0, 0, 0, 0), "cat": (0, 1, 1, 0, 0, 0), "sat": (0, 0, 0, 1, 0, 0),
    "on": (0, 0, 0, 0, 1, 0), "mat": (0, 1, 0, 0, 0, 1),
}
LOOKS_FOR = {"det": "noun", "verb": "animal", "prep": "place", "animal": "verb", "place": "prep"}


def left_of(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``> 0`` where the points ``p`` ``(..., 2)`` lie left of the line ``a -> b``."""
    return (b[0] - a[0]) * (p[..., 1] - a[1]) - (b[1] - a[1]) * (p[..., 0] - a[0])


def hull_edges(points: torch.Tensor) -> dict[int, int]:
    """The convex hull of ``points`` ``(m, 2)``: ``{i: j}`` for each edge ``i -> j``, every point
    on its left (counter-clockwise). Iterating over it from any key walks round the hull."""
    m = len(points)
    return {i: j for i in range(m) for j in range(m)
            if i != j and bool((left_of(points[i], points[j], points) >= 0).all())}


def hull_corners(points: torch.Tensor) -> list[int]:
    """The hull's corners in order round it."""
    edges = hull_edges(points)
    corners = [next(iter(edges))]
    while len(corners) < len(edges):
        corners.append(edges[corners[-1]])
    return corners
