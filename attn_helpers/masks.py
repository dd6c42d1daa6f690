"""Boolean attention masks. ``True`` means "this query may attend to this key".

Every mask here has the same meaning as a boolean ``attn_mask`` for
``torch.nn.functional.scaled_dot_product_attention`` and for
:func:`attn_helpers.scaled_dot_product_attention`.
"""

from __future__ import annotations

from numbers import Integral

import torch

from ._checks import (
    require_bool,
    require_bytes,
    require_device,
    require_positive_int,
    require_tensor,
    shape,
)

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask", "key_padding_to_attention_mask"]


def _check_n(n: int, device) -> torch.device | None:
    """Check the size ``n`` of an ``(n, n)`` mask built from int64 offsets ``i - j``, and ``device``."""
    require_positive_int("n", n)
    require_bytes(f"n = {n}: the (n, n) mask and its int64 offsets i - j", 9 * n * n)
    return require_device("device", device)


def _offsets(n: int, device) -> torch.Tensor:
    """``(n, n)`` tensor holding ``i - j`` for query ``i`` and key ``j``."""
    positions = torch.arange(n, device=device)
    return positions[:, None] - positions[None, :]


def causal_mask(n: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``(n, n)`` bool, True on and below the diagonal: query ``i`` sees keys ``0..i``."""
    device = _check_n(n, device)
    return _offsets(n, device) >= 0  # (n, n): j <= i


def padding_mask(lengths, max_len: int | None = None) -> torch.Tensor:
    """``(batch, max_len)`` bool, True at the real (non-pad) positions of each sequence.

    Args:
        lengths: ``(batch,)`` integer tensor (or list) of true lengths, each in ``0..max_len``.
        max_len: padded length; defaults to the largest length.
    """
    if isinstance(lengths, (list, tuple)):
        if not all(isinstance(n, Integral) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be a list of ints or an integer tensor, got {lengths!r}")
        lengths = torch.tensor(lengths, dtype=torch.long)
    require_tensor("lengths", lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {shape(lengths)}")
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    require_positive_int("max_len", max_len, allow_zero=True)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(
            f"every length must lie in 0..max_len={max_len}, got lengths {lengths.tolist()}"
        )
    batch = len(lengths)
    require_bytes(f"max_len = {max_len} and batch = {batch}: the (batch, max_len) mask",
                  (batch + 8) * max_len)
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]  # (batch, max_len): t < length_b


def sliding_window_mask(
    n: int, window: int, causal: bool = True, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """``(n, n)`` bool local-attention mask.

    With ``causal=True``: True where ``0 <= i - j < window`` (each query sees itself and the
    ``window - 1`` keys before it). With ``causal=False``: True where ``|i - j| < window``.
    """
    device = _check_n(n, device)
    require_positive_int("window", window)
    require_bool("causal", causal)
    offsets = _offsets(n, device)  # (n, n): i - j
    if causal:
        return (offsets >= 0) & (offsets < window)
    return offsets.abs() < window


def key_padding_to_attention_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """Turn a ``(batch, n_k)`` padding mask into ``(batch, 1, n_k)``, broadcastable to the
    ``(batch, n_q, n_k)`` attention scores (every query sees only the real keys)."""
    require_tensor("key_padding", key_padding)
    if key_padding.dtype != torch.bool or key_padding.dim() != 2:
        raise ValueError(
            f"key_padding must be a bool tensor (batch, n_k), got {key_padding.dtype} "
            f"shape {shape(key_padding)}"
        )
    return key_padding[:, None, :]
