"""Notebook 02's data: section 1's query and keys' categories, section 2's sentence and its
features, the convex hull of points in a plane, and section 2's shared-matrix training."""

import math

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
    """The convex hull of ``points (m, 2)``: ``{i: j}`` per edge ``i -> j``, every point on its left."""
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


def weights(X: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor) -> torch.Tensor:
    """softmax((X W_Q)(X W_K)^T / sqrt(d_k)): X (n, d_model), W (..., d_model, d_k) -> (..., n, n)."""
    Q, K = X @ W_Q, X @ W_K                                         # (..., n, d_k) each
    return torch.softmax(Q @ K.mT / math.sqrt(W_Q.shape[-1]), dim=-1)


def train_projections(X: torch.Tensor, i: torch.Tensor, j: torch.Tensor, *, shared: bool,
                      seeds=(0, 1, 2), steps=150):
    """Gradient ascent on the mean of ln a_ij over the pairs ``(i, j)``, one run per seed, side by
    side (Adam is elementwise). ``shared``: W_Q = W_K = W. Returns the weights ``(s, n, n)``, W_Q."""
    d = X.shape[-1]
    W_Q, W_K = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        W_Q.append(0.3 * torch.randn(d, d))                         # (d_model, d_k = d_model)
        W_K.append(W_Q[-1] if shared else 0.3 * torch.randn(d, d))
    W_Q = torch.stack(W_Q).requires_grad_()                         # (s, d_model, d_k)
    W_K = W_Q if shared else torch.stack(W_K).requires_grad_()
    optimizer = torch.optim.Adam([W_Q] if shared else [W_Q, W_K], lr=0.1)
    for _ in range(steps):
        loss = -weights(X, W_Q, W_K)[:, i, j].log().mean(-1).sum()  # each run's mean, added up
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return weights(X, W_Q, W_K), W_Q.detach()
