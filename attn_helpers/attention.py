"""Attention scores and scaled dot-product attention (Vaswani et al., 2017):
``softmax(Q K^T / sqrt(d_k)) V`` with ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``,
``v (..., n_k, d_v)``; a bool ``mask`` is True where a query may attend to a key, as in torch.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (
    broadcast_batch,
    check_qkv,
    require_mask,
    require_positive_int,
    require_size,
    require_tensor,
    resolve_scale,
    shape,
)

__all__ = ["dot_product_scores", "scaled_dot_product_scores", "additive_scores", "AdditiveScore",
           "masked_softmax", "scaled_dot_product_attention"]


def dot_product_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Raw similarity ``q @ k^T``: ``(..., n_q, d_k), (..., n_k, d_k) -> (..., n_q, n_k)``."""
    check_qkv(q, k, keys_may_be_empty=True)
    return q @ k.mT  # (..., n_q, n_k): S = Q K^T


def scaled_dot_product_scores(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None
                              ) -> torch.Tensor:
    """``q @ k^T * scale`` with ``scale = 1/sqrt(d_k)`` by default; shape ``(..., n_q, n_k)``."""
    check_qkv(q, k, keys_may_be_empty=True)
    return q @ k.mT * resolve_scale(scale, q.shape[-1])  # (..., n_q, n_k): Q K^T / sqrt(d_k)


def bahdanau_scores(q, k, w_q, w_k, v_a):
    """:func:`additive_scores` on checked arguments."""
    q_a = (q @ w_q.T).unsqueeze(-2)     # (..., n_q, 1, d_a): W_q q_i
    k_a = (k @ w_k.T).unsqueeze(-3)     # (..., 1, n_k, d_a): W_k k_j
    features = torch.tanh(q_a + k_a)    # (..., n_q, n_k, d_a), every (i, j) pair
    return features @ v_a               # (..., n_q, n_k): e_ij = v_a . tanh(W_q q_i + W_k k_j)


def additive_scores(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                    v_a: torch.Tensor) -> torch.Tensor:
    """Additive scores (Bahdanau et al., 2015) ``e_ij = v_a . tanh(W_q q_i + W_k k_j)``: ``q (...,
    n_q, d_q)``, ``k (..., n_k, d_k)``, ``w_q (d_a, d_q)``, ``w_k (d_a, d_k)``, ``v_a (d_a,)`` ->
    ``(..., n_q, n_k)``."""
    for name, t in (("q", q), ("k", k), ("w_q", w_q), ("w_k", w_k), ("v_a", v_a)):
        require_tensor(name, t, floating=True)
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    for name, x, layout in (("q", q, "(..., n_q, d_q)"), ("k", k, "(..., n_k, d_k)")):
        if x.dim() < 2:
            raise ValueError(f"{name} must be {layout}, got shape {shape(x)}")
    d_a = v_a.shape[0] if v_a.dim() == 1 else -1
    if w_q.shape != (d_a, q.shape[-1]) or w_k.shape != (d_a, k.shape[-1]):
        raise ValueError(f"w_q must be (d_a, d_q), w_k (d_a, d_k) and v_a (d_a,) for q {shape(q)} "
                         f"and k {shape(k)}, got w_q {shape(w_q)}, w_k {shape(w_k)}, "
                         f"v_a {shape(v_a)}")
    batch = broadcast_batch(("q", q, 2), ("k", k, 2))
    require_size(f"q {shape(q)}, k {shape(k)} and w_q {shape(w_q)}: the (..., n_q, n_k, d_a) "
                 "tanh features", *batch, q.shape[-2], k.shape[-2], d_a)
    return bahdanau_scores(q, k, w_q, w_k, v_a)


class AdditiveScore(nn.Module):
    """Learnable additive (Bahdanau) scoring: ``forward(q (..., n_q, d_q), k (..., n_k, d_k))
    -> (..., n_q, n_k)``. ``w_v.weight[0]`` is :func:`additive_scores`' ``v_a``."""

    def __init__(self, d_q: int, d_k: int, d_attn: int):
        super().__init__()
        for name, size in (("d_q", d_q), ("d_k", d_k), ("d_attn", d_attn)):
            require_positive_int(name, size)
        self.w_q = nn.Linear(d_q, d_attn, bias=False)
        self.w_k = nn.Linear(d_k, d_attn, bias=False)
        self.w_v = nn.Linear(d_attn, 1, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return additive_scores(q, k, self.w_q.weight, self.w_k.weight, self.w_v.weight[0])


def softmax_with_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """:func:`masked_softmax` on checked arguments: blocked keys get the dtype's most negative
    number (exactly 0 after the softmax); a row with no allowed key is multiplied by 0."""
    allowed = scores != float("-inf")                              # (..., n_q, n_k); NaN stays NaN
    if mask is not None:
        allowed = allowed & mask
    weights = torch.softmax(scores.masked_fill(~allowed, torch.finfo(scores.dtype).min), dim=-1)
    has_key = allowed.any(dim=-1, keepdim=True)                    # (..., n_q, 1)
    return weights if bool(has_key.all()) else weights * has_key


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of ``scores (..., n_q, n_k)`` ignoring keys where the bool
    ``mask`` is False; a row with no allowed key gets zero weights (not NaN)."""
    require_tensor("scores", scores, floating=True)
    if scores.dim() == 0 or scores.shape[-1] == 0:
        raise ValueError(f"scores (..., n_q, n_k) must have n_k >= 1 keys, got shape "
                         f"{shape(scores)}")
    if mask is not None:
        require_mask("mask", mask, scores.shape)
    return softmax_with_mask(scores, mask)


def attention(q, k, v, mask, scale):
    """:func:`scaled_dot_product_attention` on checked arguments (``scale`` a number)."""
    scores = q @ k.mT * scale                       # (..., n_q, n_k): Q K^T / sqrt(d_k)
    weights = softmax_with_mask(scores, mask)       # (..., n_q, n_k): softmax over the keys
    return weights @ v, weights                     # (..., n_q, d_v): A V


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, *, scale: float | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output (..., n_q, d_v), weights (..., n_q, n_k))`` of q ``(..., n_q, d_k)``, k ``(...,
    n_k, d_k)``, v ``(..., n_k, d_v)``; ``mask`` bool, True = may attend; ``scale`` default
    ``1/sqrt(d_k)``. A row with no allowed key gets zero weights and output."""
    batch = check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    target = (*batch, q.shape[-2], k.shape[-2])
    if mask is not None:
        require_mask("mask", mask, target,
                     of=f"the shape (..., n_q, n_k) of the scores of q {shape(q)} and k {shape(k)}")
    require_size(f"q {shape(q)} and k {shape(k)}: the (..., n_q, n_k) scores", *target)
    return attention(q, k, v, mask, scale)
