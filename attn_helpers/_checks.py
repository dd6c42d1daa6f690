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
        if d_k < 1:
            raise ValueError(f"the default scale 1/sqrt(d_k) needs d_k >= 1 features, got d_k = {d_k}")
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


#: The most bytes of working memory one helper call may allocate: 4 GiB, the size of a float32
#: tensor of :data:`MAX_ELEMENTS` elements. Used where a call's tensors are not all float32 (int64
#: offsets, float64 angles, bool masks), so that the estimate counts the bytes they really hold.
MAX_BYTES = 4 * MAX_ELEMENTS


def require_bytes(what: str, n_bytes: int) -> None:
    """Refuse, before allocating, a call whose tensors would need more than :data:`MAX_BYTES`.

    ``what`` names the argument(s) and the tensors, e.g. ``"n = 100000: the (n, n) mask"``.
    """
    if n_bytes > MAX_BYTES:
        raise ValueError(
            f"{what} would need {n_bytes:.3g} bytes, more than the {MAX_BYTES:.3g} this course allows"
        )


def require_shape(name: str, value) -> tuple[int, ...]:
    """Return ``value`` as a tuple if it is a shape: a tuple, list or ``torch.Size`` of ints
    ``>= 0`` (``()`` for no dims); else raise, naming ``name[i]`` for a bad entry."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints such as (2, 4) or (), "
                        f"got {type(value).__name__}")
    for i, size in enumerate(value):
        require_positive_int(f"{name}[{i}]", size, allow_zero=True)
    return tuple(value)


def require_device(name: str, value) -> torch.device | None:
    """Return ``value`` as a ``torch.device`` (None stays None) if it names a usable device."""
    if value is None:
        return None
    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{name} must be a torch.device, a string such as 'cpu', or None, "
                        f"got {type(value).__name__}")
    try:
        device = torch.device(value)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"{name}={value!r} is not a device this machine can use ({error})") from None
    return device


def require_dtype(name: str, value, *, floating: bool = True) -> torch.dtype:
    """Return ``value`` if it is a ``torch.dtype`` (floating point when asked), else raise."""
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype such as torch.float32, "
                        f"got {type(value).__name__}")
    if floating and not value.is_floating_point:
        raise TypeError(f"{name} must be a floating-point dtype, got {value}")
    return value


def _batch_shape(layouts: list[tuple[str, torch.Tensor]]) -> torch.Size:
    """The broadcast of the batch dims ``(...)`` of ``(..., n, d)`` tensors, or a ValueError."""
    try:
        return torch.broadcast_shapes(*(t.shape[:-2] for _, t in layouts))
    except RuntimeError:
        got = ", ".join(f"{name} {shape(t)}" for name, t in layouts)
        raise ValueError(f"the batch dimensions of {got} do not broadcast") from None


def broadcast_batch(*named: tuple[str, torch.Tensor, int]) -> torch.Size:
    """The broadcast of the batch dims of ``(name, tensor, core)`` triples, the batch dims being
    all but the last ``core`` (2 for ``(..., n, d)``, 1 for ``(..., d)``), or a ``ValueError``
    that names every tensor and its shape."""
    try:
        return torch.broadcast_shapes(*(t.shape[: t.dim() - core] for _, t, core in named))
    except RuntimeError:
        got = ", ".join(f"{name} {shape(t)}" for name, t, _ in named)
        raise ValueError(f"the batch dimensions (...) of {got} do not broadcast") from None


def check_qk(q, k) -> torch.Size:
    """Check queries ``q (..., n_q, d_k)`` and keys ``k (..., n_k, d_k)`` for ``Q K^T``.

    Both floating point, of one dtype, with the same ``d_k >= 1`` and batch dims that broadcast.
    Returns the broadcast batch shape ``(...)``.
    """
    require_tensor("q", q, floating=True)
    require_tensor("k", k, floating=True)
    require_min_dim("q", q, 2, "(..., n_q, d_k)")
    require_min_dim("k", k, 2, "(..., n_k, d_k)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension d_k, got q {shape(q)} and k {shape(k)}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"q and k must have d_k >= 1 features, got q {shape(q)} and k {shape(k)}")
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    return _batch_shape([("q", q), ("k", k)])


def check_qkv(q, k, v, *, keys_may_be_empty: bool = False, holds_scores: bool = True
              ) -> torch.Size:
    """:func:`check_qk`, then values ``v (..., n_k, d_v)``: q's dtype, the same ``n_k >= 1`` keys
    as ``k``, batch dims that broadcast. Refuses scores ``(..., n_q, n_k)`` over
    :data:`MAX_ELEMENTS`. Returns the batch shape ``(...)`` of the scores ``Q K^T``.

    ``keys_may_be_empty=True`` accepts ``n_k = 0`` (for a function that defines the output of a
    query with no key); ``holds_scores=False`` skips the scores' size guard (for a function that
    never holds the whole ``(..., n_q, n_k)`` matrix: tiled, linear, ring attention)."""
    batch = check_qk(q, k)
    require_tensor("v", v, floating=True)
    require_min_dim("v", v, 2, "(..., n_k, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys n_k, got k {shape(k)} and v {shape(v)}"
        )
    if k.shape[-2] == 0 and not keys_may_be_empty:
        raise ValueError(f"k and v must hold at least one key (n_k >= 1), got k {shape(k)}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the same dtype as q, got {v.dtype} and {q.dtype}")
    _batch_shape([("q", q), ("k", k), ("v", v)])
    if holds_scores:
        require_size(f"q {shape(q)} and k {shape(k)}: the (..., n_q, n_k) scores",
                     *batch, q.shape[-2], k.shape[-2])
    return batch


def check_backward_tile(q, k, v, d_out, lse, D, mask) -> None:
    """FlashAttention's backward tile: ``q, k, v`` as :func:`check_qkv`; ``d_out``
    ``(..., n_q, d_v)``; ``lse`` and ``D`` ``(..., n_q, 1)``; all of q's dtype; ``mask`` None or
    bool, broadcastable to the tile's scores ``(..., n_q, b_k)``."""
    batch = check_qkv(q, k, v)
    n_q = q.shape[-2]
    for name, value, last in (("d_out", d_out, v.shape[-1]), ("lse", lse, 1), ("D", D, 1)):
        require_tensor(name, value, floating=True)
        require_min_dim(name, value, 2, f"(..., n_q, {last})")
        if value.shape[-2:] != (n_q, last):
            raise ValueError(f"{name} must be (..., n_q={n_q}, {last}) for q {shape(q)} and "
                             f"v {shape(v)}, got {shape(value)}")
        if value.dtype != q.dtype:
            raise TypeError(f"{name} must have the same dtype as q, got {value.dtype} and {q.dtype}")
        _batch_shape([("q", q), (name, value)])
    if mask is not None:
        require_mask("mask", mask, (*batch, n_q, k.shape[-2]), "the tile's scores (..., n_q, b_k)")


def check_block(scores, values, acc=None) -> torch.Size:
    """Check a block of ``block >= 1`` keys for the online softmax: ``scores (..., n_q, block)``
    and ``values (..., block, d_v)``, one floating dtype, batch dims that broadcast; with ``acc``
    (a running state's ``(..., n_q, d_v)`` accumulator), also its ``n_q``, ``d_v``, dtype and
    batch dims. Returns the broadcast batch dims ``(...)`` of ``scores`` and ``values``."""
    require_tensor("scores", scores, floating=True)
    require_tensor("values", values, floating=True)
    require_min_dim("scores", scores, 2, "(..., n_q, block)")
    require_min_dim("values", values, 2, "(..., block, d_v)")
    if scores.shape[-1] != values.shape[-2]:
        raise ValueError(f"scores (..., n_q, block) and values (..., block, d_v) must share the "
                         f"block size, got scores {shape(scores)} and values {shape(values)}")
    require_nonempty_last("scores", scores, "(..., n_q, block)")  # a max over no key
    if scores.dtype != values.dtype:
        raise TypeError(f"scores and values must have the same dtype, got {scores.dtype} and "
                        f"{values.dtype}")
    batch = broadcast_batch(("scores", scores, 2), ("values", values, 2))
    if acc is None:
        return batch
    if acc.shape[-2] != scores.shape[-2] or acc.shape[-1] != values.shape[-1]:
        raise ValueError(f"state for (n_q, d_v) = {tuple(acc.shape[-2:])} does not fit "
                         f"scores {shape(scores)} and values {shape(values)}")
    if acc.dtype != scores.dtype:
        raise TypeError(f"scores and values must have the state's dtype {acc.dtype}, "
                        f"got {scores.dtype}")
    broadcast_batch(("the state's acc", acc, 2), ("scores", scores, 2), ("values", values, 2))
    return batch


def check_additive(q, k, w_q, w_k, v_a) -> torch.Size:
    """Check the arguments of additive scores ``v_a . tanh(W_q q_i + W_k k_j)``: ``q (..., n_q,
    d_q)``, ``k (..., n_k, d_k)``, ``w_q (d_a, d_q)``, ``w_k (d_a, d_k)``, ``v_a (d_a,)``, one
    floating dtype. Refuses ``(..., n_q, n_k, d_a)`` features over :data:`MAX_BYTES`. Returns the
    batch shape ``(...)``."""
    for name, t in (("q", q), ("k", k), ("w_q", w_q), ("w_k", w_k), ("v_a", v_a)):
        require_tensor(name, t, floating=True)
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    require_min_dim("q", q, 2, "(..., n_q, d_q)")
    require_min_dim("k", k, 2, "(..., n_k, d_k)")
    for name, weight, x, d in (("w_q", w_q, q, "d_q"), ("w_k", w_k, k, "d_k")):
        if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
            raise ValueError(f"{name} must have shape (d_a, {d}={x.shape[-1]}) to project "
                             f"{name[-1]} {shape(x)}, got {shape(weight)}")
    if w_k.shape[0] != w_q.shape[0] or v_a.shape != (w_q.shape[0],):
        raise ValueError(
            "w_q, w_k and v_a must share the attention size d_a: got "
            f"w_q {shape(w_q)}, w_k {shape(w_k)}, v_a {shape(v_a)}"
        )
    batch = _batch_shape([("q", q), ("k", k)])
    features = batch.numel() * q.shape[-2] * k.shape[-2] * w_q.shape[0]
    require_bytes(f"q {shape(q)}, k {shape(k)} and w_q {shape(w_q)}: the (..., n_q, n_k, d_a) "
                  "tanh features", 2 * features * q.element_size())
    return batch


def require_mask(
    name: str, mask, target: tuple[int, ...], of: str = "the scores' shape (..., n_q, n_k)"
) -> torch.Tensor:
    """Return ``mask`` if it is a bool tensor (True = may attend) that broadcasts to ``target``
    without growing it; ``of`` names ``target`` in the message."""
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


def require_nonempty_last(name: str, value: torch.Tensor, layout: str) -> None:
    """Raise ``ValueError`` if the last dimension of ``value`` (a softmax's keys) is empty."""
    if value.shape[-1] == 0:
        raise ValueError(f"{name} {layout} must have at least one entry in its last dimension, "
                         f"got shape {shape(value)}")


def require_distribution(name: str, weights, *, rtol: float = 1e-3) -> torch.Tensor:
    """Return ``weights (..., n_k)`` if every row is a distribution, else raise.

    A row must be non-negative and sum to one (within ``rtol``, or the dtype's rounding if larger)
    or be all zero (a query with no visible key).
    """
    require_tensor(name, weights, floating=True)
    require_min_dim(name, weights, 1, "(..., n_k)")
    require_nonempty_last(name, weights, "(..., n_k)")
    if weights.numel() == 0:
        return weights
    if not torch.isfinite(weights).all():
        raise ValueError(f"{name} must be finite attention weights, got NaN or inf "
                         f"(shape {shape(weights)})")
    if (weights < 0).any():
        raise ValueError(f"{name} must be non-negative attention weights, got a smallest entry "
                         f"{weights.min().item():.3g} (shape {shape(weights)})")
    sums = weights.sum(dim=-1)
    tolerance = max(rtol, 10 * torch.finfo(weights.dtype).eps)
    bad = ((sums - 1).abs() > tolerance) & (sums != 0)
    if bad.any():
        raise ValueError(f"each row of {name} (over the last dim, n_k) must sum to 1, or to 0 for a "
                         f"query with no visible key; got a row summing to "
                         f"{sums[bad].flatten()[0].item():.6g} (shape {shape(weights)})")
    return weights
