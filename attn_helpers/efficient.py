r"""Efficient attention from scratch: tiled (FlashAttention's online softmax), linear and local.

Shapes follow :func:`attn_helpers.scaled_dot_product_attention`: queries ``q`` ``(..., n_q, d_k)``,
keys ``k`` ``(..., n_k, d_k)``, values ``v`` ``(..., n_k, d_v)``; the leading (batch, head)
dimensions broadcast.

**Online softmax.** For one query row, scores arrive block by block. After the blocks seen so far
the state holds the running maximum :math:`m`, the running sum :math:`\ell = \sum_j e^{s_j - m}`
and the unnormalised output :math:`\mathrm{acc} = \sum_j e^{s_j - m} v_j`. A new block
:math:`s^{(b)}, V^{(b)}` updates them with

.. math::

    m' = \max(m, \max_j s^{(b)}_j), \quad
    \ell' = e^{m - m'}\,\ell + \sum_j e^{s^{(b)}_j - m'}, \quad
    \mathrm{acc}' = e^{m - m'}\,\mathrm{acc} + \sum_j e^{s^{(b)}_j - m'} v^{(b)}_j,

and the output is :math:`\mathrm{acc} / \ell` once every block has been seen. The result is exact
(not an approximation): the factor :math:`e^{m - m'}` re-expresses old terms relative to the new
maximum.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._checks import require_min_dim, require_positive_int, require_tensor, shape

__all__ = [
    "OnlineSoftmaxState",
    "init_state",
    "block_state",
    "online_softmax_step",
    "merge_states",
    "finalize",
    "tiled_attention",
    "elu_feature_map",
    "linear_attention",
    "local_attention",
]


class OnlineSoftmaxState(NamedTuple):
    """Running statistics of an online softmax over the keys seen so far.

    Attributes:
        max: ``(..., n_q, 1)`` running maximum of the scores (``-inf`` before any allowed key).
        total: ``(..., n_q, 1)`` running sum of ``exp(score - max)``.
        acc: ``(..., n_q, d_v)`` running sum of ``exp(score - max) * value``.
    """

    max: torch.Tensor
    total: torch.Tensor
    acc: torch.Tensor


def init_state(batch_shape, n_q: int, d_v: int, *, dtype=torch.float32, device=None
               ) -> OnlineSoftmaxState:
    """The state before any key: max ``-inf``, total 0, acc 0 (shapes as in the class)."""
    rows = (*tuple(batch_shape), n_q, 1)
    return OnlineSoftmaxState(
        torch.full(rows, float("-inf"), dtype=dtype, device=device),
        torch.zeros(rows, dtype=dtype, device=device),
        torch.zeros((*tuple(batch_shape), n_q, d_v), dtype=dtype, device=device),
    )


def _safe(m: torch.Tensor) -> torch.Tensor:
    """Replace ``-inf`` maxima (rows with no allowed key yet) by 0, so ``exp(-inf - 0) = 0``."""
    return torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device))


def _check_step(state, scores, values) -> None:
    if not isinstance(state, OnlineSoftmaxState):
        raise TypeError(f"state must be an OnlineSoftmaxState, got {type(state).__name__}")
    require_tensor("scores", scores, floating=True)
    require_tensor("values", values, floating=True)
    require_min_dim("scores", scores, 2, "(..., n_q, block)")
    require_min_dim("values", values, 2, "(..., block, d_v)")
    if scores.shape[-1] != values.shape[-2]:
        raise ValueError(
            f"scores (..., n_q, block) and values (..., block, d_v) must share the block size, "
            f"got scores {shape(scores)} and values {shape(values)}"
        )
    if state.max.shape[-2] != scores.shape[-2] or state.acc.shape[-1] != values.shape[-1]:
        raise ValueError(
            f"state for (n_q, d_v) = {(state.acc.shape[-2], state.acc.shape[-1])} does not fit "
            f"scores {shape(scores)} and values {shape(values)}"
        )


def _step(state: OnlineSoftmaxState, scores: torch.Tensor, values: torch.Tensor, *,
          in_place: bool) -> OnlineSoftmaxState:
    new_max = torch.maximum(state.max, scores.amax(dim=-1, keepdim=True))
    shift = _safe(new_max)
    correction = torch.exp(state.max - shift)                     # (..., n_q, 1)
    # exp(scores - shift), computed in place when the caller no longer needs the scores, so that
    # one block of scores is alive at a time.
    p = scores.sub_(shift).exp_() if in_place else torch.exp(scores - shift)
    total = state.total * correction + p.sum(dim=-1, keepdim=True)
    acc = state.acc * correction + p @ values
    return OnlineSoftmaxState(new_max, total, acc)


def online_softmax_step(state: OnlineSoftmaxState, scores: torch.Tensor, values: torch.Tensor
                        ) -> OnlineSoftmaxState:
    """Fold one block of keys into the running state (the recurrence in the module docstring).

    Args:
        state: the state after the previous blocks (:func:`init_state` before the first).
        scores: ``(..., n_q, block)`` scaled scores of the queries against this block's keys;
            ``-inf`` marks a key a query may not attend to.
        values: ``(..., block, d_v)`` this block's values.

    Returns:
        The new :class:`OnlineSoftmaxState`; ``scores`` is left unchanged.
    """
    _check_step(state, scores, values)
    return _step(state, scores, values, in_place=False)


def block_state(scores: torch.Tensor, values: torch.Tensor) -> OnlineSoftmaxState:
    """The state of one block on its own: ``scores`` ``(..., n_q, block)``, ``values``
    ``(..., block, d_v)``. Equal to ``online_softmax_step(init_state(...), scores, values)``."""
    require_tensor("scores", scores, floating=True)
    require_tensor("values", values, floating=True)
    batch = torch.broadcast_shapes(scores.shape[:-2], values.shape[:-2])
    start = init_state(batch, scores.shape[-2], values.shape[-1], dtype=scores.dtype,
                       device=scores.device)
    return online_softmax_step(start, scores, values)


def merge_states(a: OnlineSoftmaxState, b: OnlineSoftmaxState) -> OnlineSoftmaxState:
    """Combine the states of two disjoint sets of keys (for the same queries), in any order.

    This is what ring attention does with the partial results of each key/value block.
    """
    for name, s in (("a", a), ("b", b)):
        if not isinstance(s, OnlineSoftmaxState):
            raise TypeError(f"{name} must be an OnlineSoftmaxState, got {type(s).__name__}")
    if a.acc.shape[-2:] != b.acc.shape[-2:]:
        raise ValueError(f"states of acc shapes {shape(a.acc)} and {shape(b.acc)} do not match")
    new_max = torch.maximum(a.max, b.max)
    shift = _safe(new_max)
    ca, cb = torch.exp(a.max - shift), torch.exp(b.max - shift)
    return OnlineSoftmaxState(new_max, a.total * ca + b.total * cb, a.acc * ca + b.acc * cb)


def finalize(state: OnlineSoftmaxState) -> torch.Tensor:
    """``acc / total``: the attention output ``(..., n_q, d_v)``; rows with no allowed key give 0."""
    if not isinstance(state, OnlineSoftmaxState):
        raise TypeError(f"state must be an OnlineSoftmaxState, got {type(state).__name__}")
    return state.acc / state.total.clamp_min(torch.finfo(state.acc.dtype).tiny)


def _check_qkv(q, k, v) -> torch.Size:
    """Validate q, k, v as for scaled dot-product attention; return the broadcast batch shape."""
    for name, t, layout in (("q", q, "(..., n_q, d_k)"), ("k", k, "(..., n_k, d_k)"),
                            ("v", v, "(..., n_k, d_v)")):
        require_tensor(name, t, floating=True)
        require_min_dim(name, t, 2, layout)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension d_k, got q {shape(q)} and k {shape(k)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys n_k, got k {shape(k)} and v {shape(v)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    try:
        return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {shape(q)}, k {shape(k)} and v {shape(v)} do not broadcast"
        ) from None


def _resolve_scale(scale, d_k: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive number or None, got {scale!r}")
    return float(scale)


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int = 64,
    causal: bool = False,
    query_block_size: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention, FlashAttention's way: queries and keys in blocks, online softmax.

    For each block of ``query_block_size`` queries, the keys and values are visited in blocks of
    ``block_size``; the ``(query block, key block)`` scores are folded into a running max, sum and
    output (:func:`online_softmax_step`) and then discarded. Only one block of scores is alive
    at a time, so the extra memory is ``O(query_block_size * block_size)`` per head instead of
    ``O(n_q * n_k)``. The work is the same ``O(n_q * n_k * d)`` as exact attention.

    Args:
        q: ``(..., n_q, d_k)``; k: ``(..., n_k, d_k)``; v: ``(..., n_k, d_v)``.
        block_size: keys per block (any ``n_k``; the last block may be shorter).
        causal: query ``i`` sees keys ``0..i`` (as :func:`attn_helpers.causal_mask`); key blocks
            entirely in the future are skipped.
        query_block_size: queries per block; defaults to ``block_size``.
        scale: score scale, ``1/sqrt(d_k)`` by default.

    Returns:
        ``(..., n_q, d_v)``, equal to ``scaled_dot_product_attention(q, k, v, mask)[0]``.
    """
    batch = _check_qkv(q, k, v)
    require_positive_int("block_size", block_size)
    query_block_size = block_size if query_block_size is None else query_block_size
    require_positive_int("query_block_size", query_block_size)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    if causal and n_q != n_k:
        raise ValueError(f"causal attention needs n_q == n_k, got q {shape(q)} and k {shape(k)}")
    scale = _resolve_scale(scale, q.shape[-1])
    out = torch.empty((*batch, n_q, d_v), dtype=q.dtype, device=q.device)
    k_t = k.transpose(-2, -1)
    for q_start in range(0, n_q, query_block_size):
        q_end = min(q_start + query_block_size, n_q)
        q_block = q[..., q_start:q_end, :] * scale
        state = init_state(batch, q_end - q_start, d_v, dtype=q.dtype, device=q.device)
        k_stop = q_end if causal else n_k
        for k_start in range(0, k_stop, block_size):
            k_end = min(k_start + block_size, n_k)
            scores = q_block @ k_t[..., k_start:k_end]             # the one live block of scores
            if causal and k_end - 1 > q_start:                       # the block crosses the diagonal
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]
                scores.masked_fill_(cols > rows, float("-inf"))
            state = _step(state, scores, v[..., k_start:k_end, :], in_place=True)
            del scores
        out[..., q_start:q_end, :] = finalize(state)
    return out


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``: positive features, so the kernel ``phi(q) . phi(k)`` is positive."""
    return F.elu(x) + 1.0


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    *,
    chunk_size: int = 128,
) -> torch.Tensor:
    r"""Kernelised (linear) attention of Katharopoulos et al. (2020), feature map ``elu(x) + 1``.

    The softmax kernel :math:`e^{q \cdot k}` is replaced by :math:`\phi(q)\cdot\phi(k)`, so the
    product can be re-associated:
    :math:`o_i = \phi(q_i)^\top \big(\sum_j \phi(k_j) v_j^\top\big) / \phi(q_i)^\top \sum_j \phi(k_j)`.
    The ``(d_k, d_v)`` sum is computed once: ``O(n d_k d_v)`` time and memory, linear in ``n``.
    With ``causal=True`` the sums run over ``j <= i`` only: prefix sums, taken chunk by chunk
    (``chunk_size`` rows at a time) with the total of the previous chunks carried over.

    This is a different model from softmax attention (its weights are not a softmax), not an
    approximation that converges to it.

    Args:
        q: ``(..., n_q, d_k)``; k: ``(..., n_k, d_k)``; v: ``(..., n_k, d_v)``.
        causal: prefix sums instead of full sums (needs ``n_q == n_k``).

    Returns:
        ``(..., n_q, d_v)``.
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    require_positive_int("chunk_size", chunk_size)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    if not causal:
        kv = phi_k.transpose(-2, -1) @ v                              # (..., d_k, d_v)
        normaliser = phi_k.sum(dim=-2, keepdim=True)                  # (..., 1, d_k)
        return (phi_q @ kv) / (phi_q * normaliser).sum(-1, keepdim=True)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"causal attention needs n_q == n_k, got q {shape(q)} and k {shape(k)}")
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    phi_q, phi_k = phi_q.expand(*batch, *phi_q.shape[-2:]), phi_k.expand(*batch, *phi_k.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    kv_carry = q.new_zeros((*batch, q.shape[-1], v.shape[-1]))        # sum over earlier chunks
    z_carry = q.new_zeros((*batch, q.shape[-1]))
    outputs = []
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        pk, pq, vc = phi_k[..., start:end, :], phi_q[..., start:end, :], v[..., start:end, :]
        # prefix sums inside the chunk: S_i = carry + sum_{j <= i} phi(k_j) v_j^T
        kv_prefix = kv_carry.unsqueeze(-3) + torch.cumsum(pk.unsqueeze(-1) * vc.unsqueeze(-2), -3)
        z_prefix = z_carry.unsqueeze(-2) + torch.cumsum(pk, dim=-2)
        numerator = (pq.unsqueeze(-2) @ kv_prefix).squeeze(-2)        # (..., chunk, d_v)
        outputs.append(numerator / (pq * z_prefix).sum(-1, keepdim=True))
        kv_carry, z_carry = kv_prefix[..., -1, :, :], z_prefix[..., -1, :]
    return torch.cat(outputs, dim=-2)


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    causal: bool = True,
    *,
    block_size: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Sliding-window attention computed block by block in ``O(n * window)`` time and memory.

    The mask is :func:`attn_helpers.sliding_window_mask`: with ``causal=True`` query ``i`` sees keys
    ``j`` with ``0 <= i - j < window``; with ``causal=False``, ``|i - j| < window``. Each block of
    ``block_size`` queries (default ``window``) only ever scores the keys its window can reach,
    ``block_size + window - 1`` of them (``+ window - 1`` more when not causal).

    Args:
        q, k: ``(..., n, d_k)``; v: ``(..., n, d_v)`` (self-attention: the same ``n``).
        window: the window size, ``>= 1``.

    Returns:
        ``(..., n, d_v)``, equal to exact attention with the sliding-window mask.
    """
    batch = _check_qkv(q, k, v)
    require_positive_int("window", window)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    block_size = window if block_size is None else block_size
    require_positive_int("block_size", block_size)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"local attention needs n_q == n_k, got q {shape(q)} and k {shape(k)}")
    scale = _resolve_scale(scale, q.shape[-1])
    out = torch.empty((*batch, n, v.shape[-1]), dtype=q.dtype, device=q.device)
    for start in range(0, n, block_size):
        end = min(start + block_size, n)
        k_start = max(0, start - window + 1)
        k_end = end if causal else min(n, end + window - 1)
        scores = (q[..., start:end, :] * scale) @ k[..., k_start:k_end, :].transpose(-2, -1)
        offsets = (torch.arange(start, end, device=q.device)[:, None]
                   - torch.arange(k_start, k_end, device=q.device)[None, :])
        allowed = (offsets >= 0) & (offsets < window) if causal else offsets.abs() < window
        scores.masked_fill_(~allowed, float("-inf"))
        out[..., start:end, :] = torch.softmax(scores, dim=-1) @ v[..., k_start:k_end, :]
    return out
