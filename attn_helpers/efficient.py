r"""Efficient attention from scratch: tiled (FlashAttention), linear (and its RNN view), local.

Shapes as :func:`attn_helpers.scaled_dot_product_attention`. Online softmax (Milakov & Gimelshein,
2018; FlashAttention) keeps a running max ``m``, ``l = sum e^(s - m)`` and ``acc = sum e^(s - m) v``:
``m' = max(m, max s)``, ``l' = e^(m - m') l + sum e^(s - m')``, ``acc' = e^(m - m') acc + e^(s - m') V``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._checks import (
    broadcast_batch,
    check_qkv,
    require_bool,
    require_mask,
    require_min_dim,
    require_positive_int,
    require_size,
    require_tensor,
    resolve_scale,
    shape,
)
from .kv_cache import kv_cache_bytes

__all__ = ["OnlineSoftmaxState", "init_state", "block_state", "online_softmax_step", "merge_states",
           "finalize", "tiled_attention", "backward_tile", "elu_feature_map", "linear_attention",
           "LinearAttentionState", "linear_attention_step", "decoding_memory", "local_attention",
           "tile_scores"]


class OnlineSoftmaxState(NamedTuple):
    """``max`` ``(..., n_q, 1)`` the running max ``m`` (``-inf`` before any key), ``total`` the sum
    ``l``, ``acc`` ``(..., n_q, d_v)``."""

    max: torch.Tensor
    total: torch.Tensor
    acc: torch.Tensor


def init_state(batch_shape, n_q: int, d_v: int, *, dtype=torch.float32, device=None
               ) -> OnlineSoftmaxState:
    """The state before any key (max ``-inf``, total 0, acc 0); ``batch_shape`` a tuple of ints."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as (2, 4) or (), "
                        f"got {type(batch_shape).__name__}")
    for name, size in (*((f"batch_shape[{i}]", s) for i, s in enumerate(batch_shape)),
                       ("n_q", n_q), ("d_v", d_v)):
        require_positive_int(name, size, allow_zero=True)
    rows = (*batch_shape, n_q, 1)
    return OnlineSoftmaxState(torch.full(rows, float("-inf"), dtype=dtype, device=device),
                              torch.zeros(rows, dtype=dtype, device=device),
                              torch.zeros((*batch_shape, n_q, d_v), dtype=dtype, device=device))


def _safe(m: torch.Tensor) -> torch.Tensor:
    """``-inf`` (no key yet) replaced by 0, so that ``exp(-inf - 0) = 0``, not NaN."""
    return torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device))


def fold_block(state: OnlineSoftmaxState, scores: torch.Tensor, values: torch.Tensor
               ) -> OnlineSoftmaxState:
    """:func:`online_softmax_step` on checked arguments."""
    m, l, acc = state
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))   # (..., n_q, 1)
    correction = torch.exp(m - _safe(m_new))                        # e^{m - m'}
    p = torch.exp(scores - _safe(m_new))                            # (..., n_q, block)
    return OnlineSoftmaxState(m_new, correction * l + p.sum(dim=-1, keepdim=True),
                              correction * acc + p @ values)


def _check_block(scores, values, acc=None) -> torch.Size:
    """``scores (..., n_q, block >= 1)``, ``values (..., block, d_v)`` and a state's ``acc``, one
    dtype; returns their broadcast batch dims."""
    for name, t in (("scores", scores), ("values", values)):
        require_tensor(name, t, floating=True)
        require_min_dim(name, t, 2, "(..., n_q, block) and (..., block, d_v)")
    if values.dtype != scores.dtype or not scores.shape[-1] == values.shape[-2] >= 1:
        raise ValueError(f"scores (..., n_q, block) and values (..., block, d_v) must share the "
                         f"block size >= 1 and the dtype, got scores {shape(scores)} "
                         f"{scores.dtype} and values {shape(values)} {values.dtype}")
    if acc is not None and (acc.shape[-2:] != (scores.shape[-2], values.shape[-1])
                            or acc.dtype != scores.dtype):
        raise ValueError(f"the state's acc {shape(acc)} {acc.dtype} does not fit scores "
                         f"{shape(scores)} and values {shape(values)} {values.dtype}")
    return broadcast_batch(("scores", scores, 2), ("values", values, 2),
                           *([] if acc is None else [("the state's acc", acc, 2)]))


def online_softmax_step(state: OnlineSoftmaxState, scores: torch.Tensor, values: torch.Tensor
                        ) -> OnlineSoftmaxState:
    """Fold one block of keys into ``state``: ``scores`` ``(..., n_q, block)`` (scaled, ``-inf`` =
    masked), ``values`` ``(..., block, d_v)``."""
    if not isinstance(state, OnlineSoftmaxState):
        raise TypeError(f"state must be an OnlineSoftmaxState, got {type(state).__name__}")
    _check_block(scores, values, state.acc)
    return fold_block(state, scores, values)


def block_state(scores: torch.Tensor, values: torch.Tensor) -> OnlineSoftmaxState:
    """The state of one block on its own (shapes as :func:`online_softmax_step`)."""
    batch = _check_block(scores, values)
    empty = init_state(tuple(batch), scores.shape[-2], values.shape[-1], dtype=scores.dtype,
                       device=scores.device)
    return fold_block(empty, scores, values)


def merge_states(a: OnlineSoftmaxState, b: OnlineSoftmaxState) -> OnlineSoftmaxState:
    """Combine the states of two disjoint sets of keys (same queries), in either order."""
    for name, s in (("a", a), ("b", b)):
        if not isinstance(s, OnlineSoftmaxState):
            raise TypeError(f"{name} must be an OnlineSoftmaxState, got {type(s).__name__}")
    if a.acc.shape[-2:] != b.acc.shape[-2:]:
        raise ValueError(f"states of acc shapes {shape(a.acc)} and {shape(b.acc)} do not match")
    m = torch.maximum(a.max, b.max)
    ca, cb = torch.exp(a.max - _safe(m)), torch.exp(b.max - _safe(m))
    return OnlineSoftmaxState(m, ca * a.total + cb * b.total, ca * a.acc + cb * b.acc)


def finalize(state: OnlineSoftmaxState) -> torch.Tensor:
    """``acc / l``: the output ``(..., n_q, d_v)``; a row with no key gives 0, not NaN."""
    if not isinstance(state, OnlineSoftmaxState):
        raise TypeError(f"state must be an OnlineSoftmaxState, got {type(state).__name__}")
    return state.acc / state.total.clamp_min(torch.finfo(state.acc.dtype).tiny)


def _blocks(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def tile_scores(q_i, k_j, i: slice, j: slice, *, scale: float, causal: bool) -> torch.Tensor:
    """The tile ``S_ij = Q_i K_j^T * scale`` ``(..., B_q, B_k)``; ``causal``: ``-inf`` past the query."""
    s = (q_i @ k_j.mT) * scale
    if causal and j.stop - 1 > i.start:                               # the tile crosses the diagonal
        future = torch.arange(j.start, j.stop)[None, :] > torch.arange(i.start, i.stop)[:, None]
        s = s.masked_fill(future.to(s.device), float("-inf"))
    return s


def flash_backward_tile(q, k, v, d_out, lse, D, scale, mask=None):
    """:func:`backward_tile` on checked arguments."""
    s = (q @ k.mT) * scale                                            # S (..., n_q, b_k)
    if mask is not None:
        s = s.masked_fill(~mask.to(s.device), float("-inf"))
    p = torch.exp(s - lse)                                            # P, recomputed from lse
    dp = d_out @ v.mT                                                 # dP = dO V_j^T
    ds = p * (dp - D)                                                 # dS = P * (dP - D)
    return (ds @ k) * scale, (ds.mT @ q) * scale, p.mT @ d_out      # dQ, dK_j, dV_j


class _TiledAttention(torch.autograd.Function):
    """FlashAttention's forward and backward; saves only ``q, k, v, O`` and ``lse``."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
        out = q.new_empty((*q.shape[:-1], d_v))                       # O (..., n_q, d_v)
        lse = q.new_empty(q.shape[:-1])                               # (..., n_q)
        for i in _blocks(n_q, block_q):                               # outer loop: query blocks Q_i
            state = init_state(q.shape[:-2], i.stop - i.start, d_v, dtype=q.dtype, device=q.device)
            for j in _blocks(i.stop if causal else n_k, block_k):     # inner loop: K_j, V_j
                s = tile_scores(q[..., i, :], k[..., j, :], i, j, scale=scale, causal=causal)
                state = fold_block(state, s, v[..., j, :])            # m, l, acc; the tile is dropped
            out[..., i, :] = finalize(state)                          # O_i = acc / l
            lse[..., i] = (state.max + state.total.log()).squeeze(-1)  # lse_i = m + log l
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal, ctx.block_q, ctx.block_k = scale, causal, block_q, block_k
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_lse):
        (q, k, v, out, lse), scale, causal = ctx.saved_tensors, ctx.scale, ctx.causal
        lse = _safe(lse).unsqueeze(-1)                                # (..., n_q, 1)
        D = (d_out * out).sum(dim=-1, keepdim=True) - d_lse.unsqueeze(-1)  # rowsum(dO * O) (- d_lse)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for j in _blocks(k.shape[-2], ctx.block_k):                   # outer loop over K_j, V_j, as
            for i in _blocks(q.shape[-2], ctx.block_q):               # in FlashAttention-2's backward
                if causal and j.start >= i.stop:                      # the tile is above the diagonal
                    continue
                mask = (torch.arange(j.start, j.stop)[None, :] <= torch.arange(i.start, i.stop)[:, None]
                        if causal and j.stop - 1 > i.start else None)   # the tile crosses the diagonal
                dq_i, dk_j, dv_j = flash_backward_tile(q[..., i, :], k[..., j, :], v[..., j, :],
                                                       d_out[..., i, :], lse[..., i, :],
                                                       D[..., i, :], scale, mask)
                dq[..., i, :] += dq_i                                 # dQ_i += dS K_j * scale
                dk[..., j, :] += dk_j                                 # dK_j += dS^T Q_i * scale
                dv[..., j, :] += dv_j                                 # dV_j += P^T dO_i
        return dq, dk, dv, None, None, None, None


def backward_tile(q, k, v, d_out, lse, D, *, scale=None, mask=None):
    """One key/value tile of FlashAttention-2's backward: ``q``, ``d_out`` ``(..., n_q, d_k/d_v)``,
    ``k = K_j``, ``v = V_j`` ``(..., b_k, d_k/d_v)``, ``lse``, ``D = rowsum(dO * O)`` ``(..., n_q,
    1)``, ``mask`` (True = may attend). Returns ``(dQ share, dK_j, dV_j)``."""
    batch = check_qkv(q, k, v)
    n_q = q.shape[-2]
    for name, t, last in (("d_out", d_out, v.shape[-1]), ("lse", lse, 1), ("D", D, 1)):
        require_tensor(name, t, floating=True)
        if t.shape[-2:] != (n_q, last) or t.dtype != q.dtype:
            raise ValueError(f"{name} must be (..., n_q={n_q}, {last}) in q's dtype {q.dtype} for "
                             f"q {shape(q)} and v {shape(v)}, got {shape(t)} {t.dtype}")
        broadcast_batch(("q", q, 2), (name, t, 2))
    if mask is not None:
        require_mask("mask", mask, (*batch, n_q, k.shape[-2]), "the tile's scores (..., n_q, b_k)")
    return flash_backward_tile(q, k, v, d_out, lse, D, resolve_scale(scale, q.shape[-1]), mask)


def _check_causal(q, k, causal: bool) -> None:
    require_bool("causal", causal)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs n_q == n_k, got q {shape(q)} and k {shape(k)}")


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_size: int = 64,
                    causal: bool = False, return_lse: bool = False,
                    query_block_size: int | None = None, scale: float | None = None):
    """Exact attention, FlashAttention's way: online softmax over tiles of ``block_size`` keys and
    ``query_block_size`` queries, a backward that recomputes them. Shapes as softmax attention;
    ``causal`` needs ``n_q == n_k``. Returns ``O``, or ``(O, lse)`` with ``lse`` ``(..., n_q)``."""
    batch = check_qkv(q, k, v, keys_may_be_empty=True)
    require_positive_int("block_size", block_size)
    query_block_size = require_positive_int(
        "query_block_size", block_size if query_block_size is None else query_block_size)
    _check_causal(q, k, causal)
    require_bool("return_lse", return_lse)
    scale = resolve_scale(scale, q.shape[-1])
    q, k, v = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))  # views; autograd sums back
    out, lse = _TiledAttention.apply(q, k, v, scale, causal, query_block_size, block_size)
    return (out, lse) if return_lse else out


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``, same shape: positive features."""
    require_tensor("x", x, floating=True)
    return F.elu(x) + 1.0


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     chunk_size: int = 128) -> torch.Tensor:
    """Linear attention (Katharopoulos et al., 2020), ``phi(x) = elu(x) + 1``: ``o_i = phi(q_i)^T S
    / phi(q_i)^T z`` with ``S = sum_j phi(k_j) v_j^T``, ``z = sum_j phi(k_j)``. ``causal`` (needs
    ``n_q == n_k``) sums ``j <= i``, ``chunk_size`` rows at a time. Shapes as softmax attention."""
    batch = check_qkv(q, k, v)
    _check_causal(q, k, causal)
    require_positive_int("chunk_size", chunk_size)
    rows = min(chunk_size, q.shape[-2]) if causal else 0             # of one causal chunk
    require_size(f"chunk_size={chunk_size}, q {shape(q)}: a (..., chunk, chunk) causal kernel",
                 *batch, rows, rows)
    phi_q, phi_k = F.elu(q) + 1.0, F.elu(k) + 1.0
    if not causal:
        S = phi_k.transpose(-2, -1) @ v                               # (..., d_k, d_v)
        z = phi_k.sum(dim=-2).unsqueeze(-1)                           # (..., d_k, 1)
        return (phi_q @ S) / (phi_q @ z)                              # (..., n_q, d_v)
    S = q.new_zeros((*batch, q.shape[-1], v.shape[-1]))              # sums over earlier chunks
    z = q.new_zeros((*batch, q.shape[-1], 1))
    outputs = []
    for c in _blocks(q.shape[-2], chunk_size):
        pq, pk, vc = phi_q[..., c, :], phi_k[..., c, :], v[..., c, :]   # one chunk of rows
        a = (pq @ pk.mT).tril()                                       # (..., c, c) causal kernel
        numerator = pq @ S + a @ vc                                   # (..., c, d_v)
        denominator = pq @ z + a.sum(dim=-1, keepdim=True)            # (..., c, 1)
        outputs.append(numerator / denominator)
        S, z = S + pk.mT @ vc, z + pk.sum(dim=-2).unsqueeze(-1)       # carry the chunk's sums
    return torch.cat(outputs, dim=-2)


class LinearAttentionState(NamedTuple):
    """Causal linear attention as an RNN: ``S`` ``(..., d_k, d_v)`` and ``z`` ``(..., d_k)``."""

    S: torch.Tensor
    z: torch.Tensor


def linear_attention_step(state: LinearAttentionState | None, q_t: torch.Tensor,
                          k_t: torch.Tensor, v_t: torch.Tensor):
    """Add token ``t`` (``q_t, k_t`` ``(..., d_k)``, ``v_t`` ``(..., d_v)``) to ``state`` (None at
    first), read it with ``q_t``; returns ``(o_t, new_state)``, row ``t`` of causal linear attention."""
    if state is not None and not isinstance(state, LinearAttentionState):
        raise TypeError(f"state must be a LinearAttentionState or None, got {type(state).__name__}")
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        require_tensor(name, t, floating=True)
        require_min_dim(name, t, 1, "(..., d)")
    d_k, d_v = k_t.shape[-1], v_t.shape[-1]
    S_shape = (d_k, d_v) if state is None else tuple(state.S.shape[-2:])
    if q_t.shape[-1] != d_k or S_shape != (d_k, d_v) or d_k == 0 or not (
            q_t.dtype == k_t.dtype == v_t.dtype):
        raise ValueError(f"q_t {shape(q_t)}, k_t {shape(k_t)} and v_t {shape(v_t)} must share one "
                         f"dtype and d_k >= 1 and fit the state's S (..., d_k, d_v) = (..., *{S_shape})")
    broadcast_batch(("q_t", q_t, 1), ("k_t", k_t, 1), ("v_t", v_t, 1),
                    *([] if state is None else [("state.S", state.S, 2)]))
    phi_q, phi_k = F.elu(q_t) + 1.0, F.elu(k_t) + 1.0                 # (..., d_k)
    S, z = phi_k.unsqueeze(-1) * v_t.unsqueeze(-2), phi_k             # phi(k_t) v_t^T (..., d_k, d_v)
    if state is not None:
        S, z = state.S + S, state.z + z                               # S_t = S_{t-1} + phi(k_t) v_t^T
    o_t = (phi_q.unsqueeze(-2) @ S).squeeze(-2) / (phi_q * z).sum(dim=-1, keepdim=True)
    return o_t, LinearAttentionState(S, z)


def decoding_memory(n_tokens: int, *, d_k: int, d_v: int, num_heads: int = 1, num_layers: int = 1,
                    bytes_per_value: int = 2) -> dict[str, int]:
    """Bytes a decoder keeps per sequence: ``"kv_cache"`` (``n_tokens * (d_k + d_v)`` per head and
    layer) and ``"linear_state"`` (``S`` and ``z``, ``d_k * d_v + d_k``, constant)."""
    for name, value in dict(d_k=d_k, d_v=d_v, num_heads=num_heads).items():
        require_positive_int(name, value)
    kv = kv_cache_bytes(n_tokens, num_layers=num_layers, num_kv_heads=num_heads,  # 2 x head_dim
                        head_dim=d_k + d_v, bytes_per_value=bytes_per_value) // 2  # = d_k + d_v
    return {"kv_cache": kv, "linear_state": (d_k * d_v + d_k) * num_heads * num_layers * bytes_per_value}


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                    causal: bool = True, *, block_size: int | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """Sliding-window attention (:func:`attn_helpers.sliding_window_mask`) in ``O(n * window)``:
    each block of ``block_size`` queries (default ``window``) scores only the keys in its reach.
    q, k ``(..., n, d_k)``, v ``(..., n, d_v)``; returns ``(..., n, d_v)``."""
    batch = check_qkv(q, k, v, keys_may_be_empty=True)              # n = 0: an empty output
    require_positive_int("window", window)
    require_bool("causal", causal)
    block_size = require_positive_int("block_size", window if block_size is None else block_size)
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"local attention needs n_q == n_k, got q {shape(q)} and k {shape(k)}")
    n, scale = q.shape[-2], resolve_scale(scale, q.shape[-1])
    out = q.new_empty((*batch, n, v.shape[-1]))
    for i in _blocks(n, block_size):                                  # a block of queries
        j = slice(max(0, i.start - window + 1), i.stop if causal else min(n, i.stop + window - 1))
        scores = (q[..., i, :] @ k[..., j, :].mT) * scale             # (..., B, keys in reach)
        offsets = torch.arange(i.start, i.stop)[:, None] - torch.arange(j.start, j.stop)[None, :]
        allowed = (offsets >= 0) & (offsets < window) if causal else offsets.abs() < window
        scores = scores.masked_fill(~allowed.to(q.device), float("-inf"))
        out[..., i, :] = torch.softmax(scores, dim=-1) @ v[..., j, :]
    return out
