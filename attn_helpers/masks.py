"""Boolean attention masks: True = this query may attend to this key, as a bool ``attn_mask`` in
``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import torch

from ._checks import require_bool, require_positive_int, require_tensor, shape

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask", "key_padding_to_attention_mask"]


def offsets(n: int, device=None) -> torch.Tensor:
    """``(n, n)`` tensor holding ``i - j`` for query ``i`` and key ``j``."""
    positions = torch.arange(n, device=device)
    return positions[:, None] - positions[None, :]


def causal_mask(n: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``(n, n)`` bool, True on and below the diagonal: query ``i`` sees keys ``0..i``."""
    require_positive_int("n", n)
    return offsets(n, device) >= 0  # (n, n): j <= i


def sliding_window_mask(n: int, window: int, causal: bool = True, *,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """``(n, n)`` bool, True where ``0 <= i - j < window`` (``causal=False``: ``|i - j| < window``)."""
    require_positive_int("n", n)
    require_positive_int("window", window)
    require_bool("causal", causal)
    i_minus_j = offsets(n, device)  # (n, n)
    if causal:
        return (i_minus_j >= 0) & (i_minus_j < window)
    return i_minus_j.abs() < window


def padding_mask(lengths, max_len: int | None = None) -> torch.Tensor:
    """``(batch, max_len)`` bool, True at the real positions; ``lengths`` ``(batch,)`` ints in
    ``0..max_len`` (default: the largest)."""
    if isinstance(lengths, (list, tuple)):
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be a list of ints or an integer tensor, got {lengths!r}")
        lengths = torch.tensor(lengths, dtype=torch.long)
    require_tensor("lengths", lengths)
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {shape(lengths)}")
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    require_positive_int("max_len", max_len, allow_zero=True)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"every length must lie in 0..max_len={max_len}, got lengths "
                         f"{lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]  # (batch, max_len): t < length_b


def key_padding_to_attention_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """A ``(batch, n_k)`` padding mask as ``(batch, 1, n_k)``, broadcastable to the scores."""
    require_tensor("key_padding", key_padding)
    if key_padding.dtype != torch.bool or key_padding.dim() != 2:
        raise ValueError(f"key_padding must be a bool tensor (batch, n_k), got "
                         f"{key_padding.dtype} shape {shape(key_padding)}")
    return key_padding[:, None, :]
