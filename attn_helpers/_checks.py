"""Argument checks, one copy of each: a ``TypeError`` (wrong kind) or ``ValueError`` (wrong value
or shape) that names the argument and what it got. Public functions check, then call the math."""

from __future__ import annotations

import math

import torch

#: The most elements one tensor of scores may have (4 GiB in float32): notebook 08 invites more.
MAX_ELEMENTS = 2**30


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def require_tensor(name: str, value, *, floating: bool = False) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def require_min_dim(name: str, value: torch.Tensor, ndim: int, layout: str) -> None:
    if value.dim() < ndim:
        raise ValueError(f"{name} must have at least {ndim} dimensions {layout}, "
                         f"got shape {shape(value)}")


def require_int_in(name: str, value, low: int, high: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}"
                         if high < math.inf else f"{name} must be >= {low}, got {value}")
    return value


def require_positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    return require_int_in(name, value, 0 if allow_zero else 1)


def require_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def require_number(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or (positive and value <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value}")
    return float(value)


def resolve_scale(scale, d_k: int) -> float:
    """The score scale: ``1/sqrt(d_k)`` when ``scale`` is None, else ``scale`` checked positive."""
    return 1.0 / math.sqrt(d_k) if scale is None else require_number("scale", scale, positive=True)


def require_size(what: str, *dims: int) -> None:
    """Refuse, before allocating, a tensor of ``prod(dims)`` elements over :data:`MAX_ELEMENTS`."""
    elements = math.prod(dims)
    if elements > MAX_ELEMENTS:
        raise ValueError(f"{what} would need {4 * elements:.3g} bytes ({elements:.3g} elements, "
                         f"more than the {MAX_ELEMENTS:.3g} this course allows)")


def broadcast_batch(*named: tuple[str, torch.Tensor, int]) -> torch.Size:
    """The broadcast batch dims of ``(name, tensor, core)`` triples (all dims but the last
    ``core``), or a ``ValueError`` naming every tensor and its shape."""
    try:
        return torch.broadcast_shapes(*(t.shape[: t.dim() - core] for _, t, core in named))
    except RuntimeError:
        got = ", ".join(f"{name} {shape(t)}" for name, t, _ in named)
        raise ValueError(f"the batch dimensions (...) of {got} do not broadcast") from None


def check_qkv(q, k, v=None, *, keys_may_be_empty: bool = False) -> torch.Size:
    """``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``: floating, one dtype,
    ``d_k >= 1``, ``n_k >= 1`` (unless allowed 0); returns the broadcast batch shape."""
    named = [("q", q, "(..., n_q, d_k)"), ("k", k, "(..., n_k, d_k)")]
    named += [] if v is None else [("v", v, "(..., n_k, d_v)")]
    for name, t, layout in named:
        require_tensor(name, t, floating=True)
        require_min_dim(name, t, 2, layout)
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] == 0:
        raise ValueError(f"q and k must share their last dimension d_k >= 1, got q {shape(q)} "
                         f"and k {shape(k)}")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must hold the same number of keys n_k, got k {shape(k)} and "
                         f"v {shape(v)}")
    if k.shape[-2] == 0 and not keys_may_be_empty:
        raise ValueError(f"k must hold at least one key (n_k >= 1), got k {shape(k)}")
    return broadcast_batch(*((name, t, 2) for name, t, _ in named))


def require_mask(name: str, mask, target: tuple[int, ...],
                 of: str = "the scores' shape (..., n_q, n_k)") -> torch.Tensor:
    """``mask``: a bool tensor (True = may attend) that broadcasts to ``target`` without growing it."""
    require_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor (True = may attend), got dtype {mask.dtype}")
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == tuple(target)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {shape(mask)} does not broadcast to {of} = "
                         f"{tuple(target)}")
    return mask


def require_distribution(name: str, weights, *, rtol: float = 1e-3) -> torch.Tensor:
    """``weights (..., n_k)``: rows non-negative summing to one (within ``rtol``), or all zero."""
    require_tensor(name, weights, floating=True)
    if weights.dim() == 0 or weights.shape[-1] == 0:
        raise ValueError(f"{name} (..., n_k) must have n_k >= 1 keys, got shape {shape(weights)}")
    if not torch.isfinite(weights).all():
        raise ValueError(f"{name} must be finite, got NaN or inf (shape {shape(weights)})")
    if (weights < 0).any():
        raise ValueError(f"{name} must be non-negative, got a smallest entry "
                         f"{weights.min().item():.3g} (shape {shape(weights)})")
    sums = weights.sum(dim=-1)
    bad = ((sums - 1).abs() > max(rtol, 10 * torch.finfo(weights.dtype).eps)) & (sums != 0)
    if bad.any():
        raise ValueError(f"each row of {name} (over the last dim, n_k) must sum to 1, or to 0 for a "
                         f"query with no visible key; got a row summing to "
                         f"{sums[bad].flatten()[0].item():.6g} (shape {shape(weights)})")
    return weights
