r"""Attention scores and scaled dot-product attention.

Notation follows Vaswani et al. (2017): queries ``q`` ``(..., n_q, d_k)``, keys ``k``
``(..., n_k, d_k)``, values ``v`` ``(..., n_k, d_v)``. A boolean ``mask`` is ``True`` where a query
may attend to a key, the same meaning as a boolean ``attn_mask`` in
``torch.nn.functional.scaled_dot_product_attention``.

.. math::  \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import require_min_dim, require_tensor, shape

__all__ = [
    "dot_product_scores",
    "scaled_dot_product_scores",
    "additive_scores",
    "AdditiveScore",
    "masked_softmax",
    "scaled_dot_product_attention",
]


def _check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    require_tensor("q", q, floating=True)
    require_tensor("k", k, floating=True)
    require_min_dim("q", q, 2, "(..., n_q, d_k)")
    require_min_dim("k", k, 2, "(..., n_k, d_k)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension d_k, got q {shape(q)} and k {shape(k)}"
        )
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {shape(q)} and k {shape(k)} do not broadcast"
        ) from None


def dot_product_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Raw similarity ``q @ k^T``: ``(..., n_q, d_k), (..., n_k, d_k) -> (..., n_q, n_k)``."""
    _check_qk(q, k)
    return q @ k.transpose(-2, -1)


def _resolve_scale(scale, d_k: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return float(scale)


def scaled_dot_product_scores(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """``q @ k^T * scale`` with ``scale = 1/sqrt(d_k)`` by default; shape ``(..., n_q, n_k)``."""
    _check_qk(q, k)
    return (q @ k.transpose(-2, -1)) * _resolve_scale(scale, q.shape[-1])


def additive_scores(
    q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor
) -> torch.Tensor:
    r"""Additive (Bahdanau) scores :math:`e_{ij} = w_v^\top \tanh(W_q q_i + W_k k_j)`.

    Unlike dot-product scores, queries and keys may have different sizes.

    Args:
        q: ``(..., n_q, d_q)`` queries.
        k: ``(..., n_k, d_k)`` keys.
        w_q: ``(d_a, d_q)`` query projection into the attention space of size ``d_a``.
        w_k: ``(d_a, d_k)`` key projection.
        w_v: ``(d_a,)`` the vector that turns each ``d_a``-dimensional feature into one score.

    Returns:
        ``(..., n_q, n_k)`` scores.
    """
    for name, t in (("q", q), ("k", k), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        require_tensor(name, t, floating=True)
    require_min_dim("q", q, 2, "(..., n_q, d_q)")
    require_min_dim("k", k, 2, "(..., n_k, d_k)")
    for name, t in (("k", k), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if w_q.dim() != 2 or w_q.shape[1] != q.shape[-1]:
        raise ValueError(f"w_q must have shape (d_a, d_q={q.shape[-1]}), got {shape(w_q)}")
    if w_k.dim() != 2 or w_k.shape[1] != k.shape[-1]:
        raise ValueError(f"w_k must have shape (d_a, d_k={k.shape[-1]}), got {shape(w_k)}")
    if w_k.shape[0] != w_q.shape[0] or w_v.shape != (w_q.shape[0],):
        raise ValueError(
            "w_q, w_k and w_v must share the attention size d_a: got "
            f"w_q {shape(w_q)}, w_k {shape(w_k)}, w_v {shape(w_v)}"
        )
    features = torch.tanh((q @ w_q.T).unsqueeze(-2) + (k @ w_k.T).unsqueeze(-3))
    return features @ w_v


class AdditiveScore(nn.Module):
    """Learnable additive (Bahdanau) scoring: ``forward(q (..., n_q, d_q), k (..., n_k, d_k))
    -> (..., n_q, n_k)``."""

    def __init__(self, d_q: int, d_k: int, d_attn: int):
        super().__init__()
        self.w_q = nn.Linear(d_q, d_attn, bias=False)
        self.w_k = nn.Linear(d_k, d_attn, bias=False)
        self.w_v = nn.Linear(d_attn, 1, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return additive_scores(q, k, self.w_q.weight, self.w_k.weight, self.w_v.weight[0])


def _check_mask(mask, scores_shape: torch.Size) -> torch.Tensor:
    require_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got dtype {mask.dtype}")
    try:
        target = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        target = None
    if target != scores_shape:
        raise ValueError(
            f"mask of shape {shape(mask)} does not broadcast to the scores' shape "
            f"(..., n_q, n_k) = {tuple(scores_shape)}"
        )
    return mask


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim that ignores keys where ``mask`` is False.

    A row in which no key is allowed gets all-zero weights (not NaN), and so does its gradient.

    Args:
        scores: ``(..., n_q, n_k)``.
        mask: boolean, broadcastable to ``scores``; ``True`` = may attend.
    """
    require_tensor("scores", scores, floating=True)
    if mask is not None:
        mask = _check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)
    denominator = exp.sum(dim=-1, keepdim=True)
    return exp / denominator.clamp_min(torch.finfo(scores.dtype).tiny)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention that also returns its weights.

    Args:
        q: ``(..., n_q, d_k)`` queries.
        k: ``(..., n_k, d_k)`` keys.
        v: ``(..., n_k, d_v)`` values.
        mask: optional boolean tensor broadcastable to ``(..., n_q, n_k)``; ``True`` = may attend.
        scale: multiplies the scores; defaults to ``1/sqrt(d_k)``.

    Returns:
        ``(output, weights)``: output ``(..., n_q, d_v)``, weights ``(..., n_q, n_k)``; each row of
        weights sums to one, except rows with no allowed key, which are all zero (output zero).
    """
    _check_qk(q, k)
    require_tensor("v", v, floating=True)
    require_min_dim("v", v, 2, "(..., n_k, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys n_k, got k {shape(k)} and v {shape(v)}"
        )
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the same dtype as q, got {v.dtype} and {q.dtype}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {shape(q)}, k {shape(k)} and v {shape(v)} do not broadcast"
        ) from None
    scores = scaled_dot_product_scores(q, k, scale=scale)
    weights = masked_softmax(scores, mask)
    return weights @ v, weights
