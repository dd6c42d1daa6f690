"""How focused is an attention row: the Shannon entropy ``H = -sum_j a_j ln a_j`` nats
(``0 ln 0 = 0``), 0 for one key, ``ln n`` spread evenly over ``n``, and related measures."""

from __future__ import annotations

import math

import torch

from ._checks import require_distribution, require_mask, require_positive_int

__all__ = ["attention_entropy", "max_entropy", "normalized_entropy", "effective_keys", "max_weight"]


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dim: ``(..., n_k) -> (...)``; ``0 * ln 0 = 0``. Each
    row must be a distribution or all zero (no visible key), else ``ValueError``."""
    require_distribution("weights", weights)
    return torch.special.entr(weights).sum(dim=-1)  # (...): H = -sum_j a_j ln a_j


def max_entropy(n: int) -> float:
    """``ln n``: the entropy of the uniform distribution over ``n`` keys (the ceiling)."""
    return math.log(require_positive_int("n", n))


def normalized_entropy(weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy over its ceiling ``ln(visible keys)``, in ``[0, 1]``: ``(..., n_k) -> (...)``;
    ``mask`` (bool, True = visible) picks the keys that count; one visible key gives 0."""
    entropy = attention_entropy(weights)  # (...)
    if mask is None:
        visible = torch.full_like(entropy, weights.shape[-1])
    else:
        require_mask("mask", mask, weights.shape, of="the weights' shape (..., n_k)")
        visible = torch.broadcast_to(mask, weights.shape).sum(dim=-1).to(weights.dtype)  # (...)
    ceiling = torch.log(visible.clamp_min(1.0))  # (...): ln(visible keys)
    return torch.where(ceiling > 0, entropy / ceiling.clamp_min(1e-12), torch.zeros_like(entropy))


def effective_keys(weights: torch.Tensor) -> torch.Tensor:
    """``exp(entropy)``: how many keys the row is spread over (1 = one-hot, n = uniform)."""
    return torch.exp(attention_entropy(weights))


def max_weight(weights: torch.Tensor) -> torch.Tensor:
    """The largest weight in each row: ``(..., n_k) -> (...)``."""
    return require_distribution("weights", weights).amax(dim=-1)
