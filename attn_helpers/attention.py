r"""Attention scores and scaled dot-product attention.

Notation follows Vaswani et al. (2017): queries ``q`` ``(..., n_q, d_k)``, keys ``k``
``(..., n_k, d_k)``, values ``v`` ``(..., n_k, d_v)``. A boolean ``mask`` is ``True`` where a query
may attend to a key, the same meaning as a boolean ``attn_mask`` in
``torch.nn.functional.scaled_dot_product_attention``.

.. math::  \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (
    check_additive,
    check_qk,
    check_qkv,
    require_bytes,
    require_mask,
    require_min_dim,
    require_nonempty_last,
    require_positive_int,
    require_tensor,
    resolve_scale,
    shape,
)

__all__ = [
    "dot_product_scores",
    "scaled_dot_product_scores",
    "additive_scores",
    "AdditiveScore",
    "masked_softmax",
    "scaled_dot_product_attention",
]


def dot_product_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Raw similarity ``q @ k^T``: ``(..., n_q, d_k), (..., n_k, d_k) -> (..., n_q, n_k)``."""
    check_qk(q, k)
    return q @ k.transpose(-2, -1)  # (..., n_q, n_k): S = Q K^T


def scaled_dot_product_scores(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """``q @ k^T * scale`` with ``scale = 1/sqrt(d_k)`` by default; shape ``(..., n_q, n_k)``."""
    check_qk(q, k)
    scale = resolve_scale(scale, q.shape[-1])
    return q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k): S = Q K^T / sqrt(d_k)


def additive_scores(
    q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, v_a: torch.Tensor
) -> torch.Tensor:
    r"""Additive scores (Bahdanau et al., 2015) :math:`e_{ij} = v_a^\top \tanh(W_q q_i + W_k k_j)`.

    Unlike dot-product scores, queries and keys may have different sizes. (The paper writes
    :math:`v_a^\top \tanh(W_a s_{i-1} + U_a h_j)` for a decoder state and an encoder state.)

    Args:
        q: ``(..., n_q, d_q)`` queries.
        k: ``(..., n_k, d_k)`` keys.
        w_q: ``(d_a, d_q)`` query projection into the attention space of size ``d_a``.
        w_k: ``(d_a, d_k)`` key projection.
        v_a: ``(d_a,)`` the vector that turns each ``d_a``-dimensional feature into one score.

    Returns:
        ``(..., n_q, n_k)`` scores.
    """
    check_additive(q, k, w_q, w_k, v_a)
    q_a = (q @ w_q.T).unsqueeze(-2)  # (..., n_q, 1, d_a): W_q q_i
    k_a = (k @ w_k.T).unsqueeze(-3)  # (..., 1, n_k, d_a): W_k k_j
    features = torch.tanh(q_a + k_a)  # (..., n_q, n_k, d_a), broadcast over every (i, j) pair
    return features @ v_a  # (..., n_q, n_k): e_ij = v_a . tanh(W_q q_i + W_k k_j)


class AdditiveScore(nn.Module):
    """Learnable additive (Bahdanau) scoring: ``forward(q (..., n_q, d_q), k (..., n_k, d_k))
    -> (..., n_q, n_k)``.

    ``w_q``, ``w_k`` are ``nn.Linear(d_q, d_attn)``, ``nn.Linear(d_k, d_attn)``; ``w_v`` is
    ``nn.Linear(d_attn, 1)``, whose weight is :func:`additive_scores`' ``v_a`` (the attribute keeps
    the name ``w_v`` so saved checkpoints still load).
    """

    def __init__(self, d_q: int, d_k: int, d_attn: int):
        super().__init__()
        for name, size in (("d_q", d_q), ("d_k", d_k), ("d_attn", d_attn)):
            require_positive_int(name, size)
        require_bytes(f"d_q = {d_q}, d_k = {d_k} and d_attn = {d_attn}: the projections",
                      4 * d_attn * (d_q + d_k + 1))
        self.w_q = nn.Linear(d_q, d_attn, bias=False)
        self.w_k = nn.Linear(d_k, d_attn, bias=False)
        self.w_v = nn.Linear(d_attn, 1, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return additive_scores(q, k, self.w_q.weight, self.w_k.weight, self.w_v.weight[0])


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """:func:`masked_softmax` without the checks (the callers have made them).

    Blocked keys (and scores of ``-inf``) are filled with the dtype's most negative number, so
    ``torch.softmax`` gives them exactly 0; a row with no allowed key would come out uniform, and
    is multiplied by 0. The same arithmetic as Hugging Face's BERT, so a real model's weights
    match it to the last bit.
    """
    allowed = scores != float("-inf")  # (..., n_q, n_k); NaN stays NaN, never hidden
    if mask is not None:
        allowed = allowed & mask
    filled = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(filled, dim=-1)
    has_key = allowed.any(dim=-1, keepdim=True)                # (..., n_q, 1)
    return weights if bool(has_key.all()) else weights * has_key  # skip a multiply by all ones


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim that ignores keys where ``mask`` is False.

    A row in which no key is allowed gets all-zero weights (not NaN), and so does its gradient.

    Args:
        scores: ``(..., n_q, n_k)`` with ``n_k >= 1``.
        mask: boolean, broadcastable to ``scores``; ``True`` = may attend.
    """
    require_tensor("scores", scores, floating=True)
    require_min_dim("scores", scores, 1, "(..., n_q, n_k)")
    require_nonempty_last("scores", scores, "(..., n_q, n_k)")
    if mask is not None:
        require_mask("mask", mask, scores.shape)
    return _masked_softmax(scores, mask)


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
    batch = check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    if mask is not None:
        require_mask("mask", mask, (*batch, q.shape[-2], k.shape[-2]),
                     of=f"the shape (..., n_q, n_k) of the scores of q {shape(q)} and k {shape(k)}")
    scores = q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k): Q K^T / sqrt(d_k)
    weights = _masked_softmax(scores, mask)  # (..., n_q, n_k): softmax over the keys
    return weights @ v, weights  # (..., n_q, d_v): A V
