"""A key/value cache for incremental decoding: each step projects only the new token, appends
its key and value to preallocated buffers and scores its one query against the cached keys, ``O(L)``
a step; and :func:`kv_cache_bytes`, what the cache costs.
"""

from __future__ import annotations

import torch

from ._checks import (
    broadcast_batch,
    check_qkv,
    require_positive_int,
    require_size,
    require_tensor,
    resolve_scale,
    shape,
)
from .attention import attention, scaled_dot_product_attention
from .masks import causal_mask

__all__ = ["KVCache", "decode_with_cache", "kv_cache_bytes", "generate_with_cache",
           "generate_without_cache"]


def kv_cache_bytes(n_tokens: int, *, num_layers: int, num_kv_heads: int, head_dim: int,
                   bytes_per_value: int = 2) -> int:
    """``2 * num_layers * num_kv_heads * head_dim * bytes_per_value * n_tokens``: the bytes of the
    keys and values of ``n_tokens`` positions of one sequence (2 bytes a value in float16)."""
    require_positive_int("n_tokens", n_tokens, allow_zero=True)
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("bytes_per_value", bytes_per_value)):
        require_positive_int(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value * n_tokens


class KVCache:
    """Keys ``(..., L, d_k)`` and values ``(..., L, d_v)`` of the ``L`` positions so far, in
    buffers for ``max_len``. :meth:`append` adds ``t`` positions; :meth:`attend` lets the last
    ``t`` positions' queries attend causally. ``keys``/``values``: the filled part (None while
    empty); ``score_counts``: the scores each :meth:`attend` computed; ``nbytes``: the buffers."""

    def __init__(self, max_len: int):
        self.max_len = require_positive_int("max_len", max_len)
        self._keys: torch.Tensor | None = None    # (..., max_len, d_k), allocated at first append
        self._values: torch.Tensor | None = None  # (..., max_len, d_v)
        self.length = 0
        self.score_counts: list[int] = []

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        if not self.length:
            return f"KVCache(empty, max_len={self.max_len})"
        return (f"KVCache(len={self.length}, max_len={self.max_len}, keys {shape(self.keys)}, "
                f"values {shape(self.values)})")

    @property
    def keys(self) -> torch.Tensor | None:
        return self._keys[..., : self.length, :] if self.length else None

    @property
    def values(self) -> torch.Tensor | None:
        return self._values[..., : self.length, :] if self.length else None

    @property
    def nbytes(self) -> int:
        if self._keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    def reset(self) -> None:
        """Empty the cache and its counts; the buffers are kept for the next sequence."""
        self.length = 0
        self.score_counts = []

    def _fits(self, k_new: torch.Tensor, v_new: torch.Tensor) -> bool:
        return (self._keys is not None and self._keys.shape[:-2] == k_new.shape[:-2]
                and self._keys.shape[-1] == k_new.shape[-1]
                and self._values.shape[-1] == v_new.shape[-1]
                and self._keys.dtype == k_new.dtype and self._keys.device == k_new.device)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Write ``t`` new positions ``k_new (..., t, d_k)``, ``v_new (..., t, d_v)``; the first
        append (or one after :meth:`reset`, with new shapes) allocates the buffers."""
        for name, t, layout in (("k_new", k_new, "(..., t, d_k)"), ("v_new", v_new, "(..., t, d_v)")):
            require_tensor(name, t, floating=True)
            if t.dim() < 2:
                raise ValueError(f"{name} must be {layout}, got shape {shape(t)}")
        if k_new.shape[:-1] != v_new.shape[:-1] or k_new.dtype != v_new.dtype:
            raise ValueError(f"k_new and v_new must share their batch dims, t and dtype, got k_new "
                             f"{shape(k_new)} {k_new.dtype} and v_new {shape(v_new)} {v_new.dtype}")
        t = k_new.shape[-2]
        if self.length + t > self.max_len:
            raise ValueError(f"the cache is full: it holds {self.length} of max_len={self.max_len} "
                             f"positions and cannot take t={t} more (k_new {shape(k_new)})")
        fits = self._fits(k_new, v_new)
        if self.length and not fits:
            raise ValueError(f"k_new {shape(k_new)} and v_new {shape(v_new)} do not fit the cache's "
                             f"keys {shape(self.keys)} and values {shape(self.values)}")
        if not fits:
            *batch, _, d_k = k_new.shape
            require_size(f"max_len={self.max_len}: the (..., max_len, d) cache for k_new "
                         f"{shape(k_new)}", *batch, self.max_len, max(d_k, v_new.shape[-1]))
            self._keys = k_new.new_empty((*batch, self.max_len, d_k))
            self._values = v_new.new_empty((*batch, self.max_len, v_new.shape[-1]))
        start, self.length = self.length, self.length + t
        self._keys[..., start : self.length, :] = k_new
        self._values[..., start : self.length, :] = v_new

    def attend(self, q_new: torch.Tensor, *, scale: float | None = None, group: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The last ``t`` positions' queries ``q_new (..., t, d_k)`` over the cache, causal: returns
        ``(output (..., t, d_v), weights (..., t, len))``. ``group > 1``: ``group`` query heads per
        cached head, stacked as rows ``(..., group * t, d_k)``, so K and V are never copied."""
        if not self.length:
            raise ValueError("the cache is empty: append the new keys and values before attend")
        require_tensor("q_new", q_new, floating=True)
        require_positive_int("group", group)
        rows = q_new.shape[-2] if q_new.dim() >= 2 else 0
        t = rows // group
        if not 1 <= t <= self.length or rows % group or q_new.shape[-1] != self._keys.shape[-1]:
            raise ValueError(f"q_new (..., group * t, d_k) must have 1 <= t <= the {self.length} "
                             f"cached positions (group={group}) and the keys' d_k, got q_new "
                             f"{shape(q_new)} and keys {shape(self.keys)}")
        broadcast_batch(("q_new", q_new, 2), ("the cache's keys", self.keys, 2))
        if q_new.dtype != self._keys.dtype:
            raise TypeError(f"q_new must have the cache's dtype {self._keys.dtype}, got {q_new.dtype}")
        self.score_counts.append(t * self.length)
        return self._attend(q_new, resolve_scale(scale, q_new.shape[-1]), t)

    def _attend(self, q_new: torch.Tensor, scale: float, t: int):
        """:meth:`attend` on checked arguments, ``O(t * len)``: no ``(len, len)`` mask."""
        mask = None
        if t > 1:
            length, rows = self.length, q_new.shape[-2]
            positions = torch.arange(length - t, length, device=q_new.device).repeat(rows // t)
            mask = torch.arange(length, device=q_new.device) <= positions[:, None]  # (rows, len)
        return attention(q_new, self.keys, self.values, mask, scale)


def decode_with_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      scale: float | None = None) -> tuple[torch.Tensor, list[int]]:
    """Causal attention one position at a time with a :class:`KVCache`: q, k ``(..., n, d_k)``,
    v ``(..., n, d_v)``. Returns ``(output (..., n, d_v), counts)``, ``counts[t] = t + 1``."""
    check_qkv(q, k, v)
    if not q.shape[:-1] == k.shape[:-1] == v.shape[:-1]:
        raise ValueError(f"q, k and v must share their batch dims and n, got q {shape(q)}, "
                         f"k {shape(k)}, v {shape(v)}")
    cache = KVCache(q.shape[-2])
    output = q.new_empty((*q.shape[:-1], v.shape[-1]))                   # (..., n, d_v)
    for t in range(q.shape[-2]):
        cache.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
        output[..., t : t + 1, :] = cache.attend(q[..., t : t + 1, :], scale=scale)[0]
    return output, cache.score_counts


def _check_decode(x, w_q, w_k, w_v) -> None:
    require_tensor("x", x, floating=True)
    if x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"x must be 2-D (n, d_model) with n >= 1 tokens and d_model >= 1, got "
                         f"shape {shape(x)}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        require_tensor(name, w, floating=True)
        if w.dim() != 2 or w.shape[0] != x.shape[1]:
            raise ValueError(f"{name} must have shape (d_model={x.shape[1]}, d), got {shape(w)}")
        if w.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {w.dtype}")
    if w_q.shape[1] != w_k.shape[1] or w_q.shape[1] == 0:
        raise ValueError(f"w_q and w_k must give the same d_k >= 1, got {shape(w_q)} and "
                         f"{shape(w_k)}")


def generate_without_cache(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                           w_v: torch.Tensor) -> torch.Tensor:
    """Decoding without a cache: step ``t`` runs the whole prefix ``x[:t + 1]`` again. x ``(n,
    d_model)``, w_q, w_k ``(d_model, d_k)``, w_v ``(d_model, d_v)``; returns ``(n, d_v)``."""
    _check_decode(x, w_q, w_k, w_v)
    rows = x.new_empty((x.shape[0], w_v.shape[1]))
    for t in range(x.shape[0]):
        prefix = x[: t + 1]                                             # (t+1, d_model)
        q, k, v = prefix @ w_q, prefix @ w_k, prefix @ w_v              # all t+1 rows, again
        rows[t] = scaled_dot_product_attention(q, k, v, causal_mask(t + 1))[0][-1]
    return rows


def generate_with_cache(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                        w_v: torch.Tensor) -> torch.Tensor:
    """:func:`generate_without_cache` with a :class:`KVCache`: only the new token is projected."""
    _check_decode(x, w_q, w_k, w_v)
    cache = KVCache(x.shape[0])
    rows = x.new_empty((x.shape[0], w_v.shape[1]))
    for t in range(x.shape[0]):
        token = x[t : t + 1]                                            # (1, d_model)
        cache.append(token @ w_k, token @ w_v)                          # one new key and value
        rows[t] = cache.attend(token @ w_q)[0][0]                       # (1, d_v): one query
    return rows
