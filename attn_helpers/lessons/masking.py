"""Notebook 05: the associative-recall task on which Going deeper trains a small model with ``g``
key/value heads (the training itself runs in the notebook's cell)."""

from __future__ import annotations

import torch

from .._checks import require_positive_int

__all__ = ["recall_batch"]


def recall_batch(batch_size: int, generator: torch.Generator, *, num_keys: int = 16,
                 num_values: int = 8, pairs: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Associative recall: ``pairs`` (key, value) tokens with distinct keys (token ``key *
    num_values + value``), then a query key (token ``num_keys * num_values + key``).

    Returns ``(tokens (b, pairs + 1), answers (b,))``: the value stored with the queried key."""
    require_positive_int("batch_size", batch_size)
    keys = torch.rand(batch_size, num_keys, generator=generator).argsort(-1)[:, :pairs]  # (b, pairs)
    values = torch.randint(0, num_values, (batch_size, pairs), generator=generator)   # (b, pairs)
    pick = torch.randint(0, pairs, (batch_size,), generator=generator)                # (b,)
    rows = torch.arange(batch_size)
    query = num_keys * num_values + keys[rows, pick]                                   # (b,)
    return torch.cat([keys * num_values + values, query[:, None]], 1), values[rows, pick]
