"""Input validation shared by every helper: clear errors that name the argument and its shape."""

from __future__ import annotations

import torch


def require_tensor(name: str, value, *, floating: bool = False) -> torch.Tensor:
    """Return ``value`` if it is a tensor (floating point when asked), else raise ``TypeError``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def require_min_dim(name: str, value: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``value`` has at least ``ndim`` dimensions."""
    if value.dim() < ndim:
        raise ValueError(
            f"{name} must have at least {ndim} dimensions {layout}, got shape {tuple(value.shape)}"
        )


def require_positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` if it is a (non-negative / positive) int, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)
