"""Argument checks shared by every helper: one copy of each, clear errors that name the argument.

Every public entry point checks its arguments once, with these, and then reads like the math.
A failed check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong
value or shape), and the message names the argument and what it got.
"""

from __future__ import annotations

import math

import torch

#: The most elements a helper will allocate for one tensor (a float32 tensor of this many elements
#: is 4 GiB). Sizes past it are refused up front, with the estimate, instead of dying in the
#: allocator or running for minutes.
MAX_ELEMENTS = 2**30


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


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


def require_int_in(name: str, value, low: int, high: int) -> int:
    """Return ``value`` if it is an int with ``low <= value <= high``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def require_bool(name: str, value) -> bool:
    """Return ``value`` if it is a bool, else raise ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def require_number(name: str, value, *, positive: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real number (``> 0`` when asked), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or (positive and value <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value}")
    return float(value)


def resolve_scale(scale, d_k: int) -> float:
    """The score scale: ``1/sqrt(d_k)`` when ``scale`` is None, else ``scale`` checked positive."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    return require_number("scale", scale, positive=True)


def require_size(what: str, *dims: int, bytes_per_element: int = 4) -> None:
    """Refuse, before allocating, a tensor of ``prod(dims)`` elements over :data:`MAX_ELEMENTS`.

    ``what`` names the argument(s) and the tensor, e.g. ``"n = 100000: the (n, n) mask"``.
    """
    elements = math.prod(dims)
    if elements > MAX_ELEMENTS:
        raise ValueError(
            f"{what} would need {elements * bytes_per_element:.3g} bytes "
            f"({elements:.3g} elements, more than the {MAX_ELEMENTS:.3g} this course allows)"
        )
