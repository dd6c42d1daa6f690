r"""A key/value cache for incremental (autoregressive) decoding, and what it costs in memory.

A causal model generating token ``t`` needs the keys and values of tokens ``0..t`` in every layer.
Those of ``0..t-1`` were computed at earlier steps and never change (the causal mask guarantees
that no earlier position depends on a later one), so a cache keeps them: each step projects only
the new token, appends its key and value, and scores its one query against the ``t + 1`` cached
keys. Without a cache, every step runs the whole prefix through every layer again.

The cache is preallocated: ``KVCache(max_len)`` reserves room for ``max_len`` positions at the
first :meth:`KVCache.append` (whose shapes fix the batch dims, ``d_k`` and ``d_v``), and each append
writes into that buffer; nothing is copied as the cache grows. Its memory, over a whole model, is

.. math::  2 \times \text{layers} \times \text{kv heads} \times \text{head dim}
           \times \text{bytes per value} \times \text{tokens}

(keys and values): :func:`kv_cache_bytes`.

Public API (notebooks import it; keep it stable)::

    cache = KVCache(max_len)
    cache.append(k_new, v_new)            # k_new (..., t, d_k), v_new (..., t, d_v)
    output, weights = cache.attend(q_new) # q_new (..., t, d_k) -> (..., t, d_v), (..., t, len)
    len(cache); cache.reset(); cache.score_counts; cache.nbytes

    output, counts = decode_with_cache(q, k, v)   # one token at a time == full causal attention
    kv_cache_bytes(n_tokens, num_layers=..., num_kv_heads=..., head_dim=...)
    generate_with_cache(x, w_q, w_k, w_v) == generate_without_cache(x, w_q, w_k, w_v)
"""

from __future__ import annotations

import torch

from ._checks import (
    broadcast_batch,
    check_qkv,
    require_min_dim,
    require_positive_int,
    require_size,
    require_tensor,
    shape,
)
from .attention import scaled_dot_product_attention
from .masks import causal_mask

__all__ = [
    "KVCache",
    "decode_with_cache",
    "kv_cache_bytes",
    "generate_with_cache",
    "generate_without_cache",
]


def kv_cache_bytes(n_tokens: int, *, num_layers: int, num_kv_heads: int, head_dim: int,
                   bytes_per_value: int = 2) -> int:
    """Bytes of a KV cache holding ``n_tokens`` positions of one sequence:
    ``2 * num_layers * num_kv_heads * head_dim * bytes_per_value * n_tokens`` (the 2: keys and
    values). ``bytes_per_value`` is 2 for float16/bfloat16, 4 for float32."""
    require_positive_int("n_tokens", n_tokens, allow_zero=True)
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("bytes_per_value", bytes_per_value)):
        require_positive_int(name, value)
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value * n_tokens


class KVCache:
    """Keys ``(..., L, d_k)`` and values ``(..., L, d_v)`` of the ``L`` positions decoded so far,
    in buffers preallocated for ``max_len`` positions.

    :meth:`append` writes the keys and values of ``t`` new positions; :meth:`attend` lets the
    queries of the *last* ``t`` positions attend causally: the query at absolute position ``p``
    sees cached positions ``0..p``. The usual step is ``append`` then ``attend`` with ``t = 1``.
    The queries' batch dims need only broadcast with the cache's, so a grouped-query layer can
    cache ``(b, g, 1, L, d)`` and attend with ``(b, g, h/g, t, d)``.

    Args:
        max_len: the most positions the cache can hold; appending past it raises ``ValueError``.

    Attributes:
        keys, values: views of the filled part of the buffers, or ``None`` while empty.
        score_counts: one int per :meth:`attend` call, the number of query-key scores it computed
            per batch element (``t * len(cache)``).
        nbytes: bytes of the two buffers (0 before the first append).
    """

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
        return (self._keys.numel() * self._keys.element_size()
                + self._values.numel() * self._values.element_size())

    def reset(self) -> None:
        """Empty the cache and its counts; the buffers are kept for the next sequence."""
        self.length = 0
        self.score_counts = []

    def _check_append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        require_tensor("k_new", k_new, floating=True)
        require_tensor("v_new", v_new, floating=True)
        require_min_dim("k_new", k_new, 2, "(..., t, d_k)")
        require_min_dim("v_new", v_new, 2, "(..., t, d_v)")
        if k_new.shape[:-1] != v_new.shape[:-1] or k_new.dtype != v_new.dtype:
            raise ValueError(
                f"k_new and v_new must share their batch dims, t and dtype, got k_new "
                f"{shape(k_new)} {k_new.dtype} and v_new {shape(v_new)} {v_new.dtype}")
        t = k_new.shape[-2]
        if self.length + t > self.max_len:
            raise ValueError(
                f"the cache is full: it holds {self.length} of max_len={self.max_len} positions "
                f"and cannot take t={t} more (k_new {shape(k_new)})")
        if self.length and (k_new.shape[:-2] != self._keys.shape[:-2]
                            or k_new.shape[-1] != self._keys.shape[-1]
                            or v_new.shape[-1] != self._values.shape[-1]
                            or k_new.dtype != self._keys.dtype):
            raise ValueError(
                f"k_new {shape(k_new)} and v_new {shape(v_new)} do not fit the cache's keys "
                f"{shape(self.keys)} and values {shape(self.values)}")

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Write ``t`` new positions: ``k_new (..., t, d_k)``, ``v_new (..., t, d_v)``.

        The first append after creation (or after :meth:`reset`, if the shapes changed) allocates
        the buffers ``(..., max_len, d_k)`` and ``(..., max_len, d_v)``; later ones must match
        their batch dims, feature sizes and dtype.
        """
        self._check_append(k_new, v_new)
        *batch, t, d_k = k_new.shape
        if self.length == 0 and (self._keys is None or self._keys.shape[:-2] != k_new.shape[:-2]
                                 or self._keys.shape[-1] != d_k
                                 or self._values.shape[-1] != v_new.shape[-1]
                                 or self._keys.dtype != k_new.dtype
                                 or self._keys.device != k_new.device):
            require_size(f"max_len={self.max_len}: the (..., max_len, d) cache for k_new "
                         f"{shape(k_new)}", *batch, self.max_len, max(d_k, v_new.shape[-1]))
            self._keys = k_new.new_empty((*batch, self.max_len, d_k))
            self._values = v_new.new_empty((*batch, self.max_len, v_new.shape[-1]))
        start, self.length = self.length, self.length + t
        self._keys[..., start : self.length, :] = k_new           # no copy of what is cached
        self._values[..., start : self.length, :] = v_new

    def attend(
        self, q_new: torch.Tensor, *, scale: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of the last ``t`` positions' queries over the cache, causal within the block.

        Args:
            q_new: ``(..., t, d_k)`` queries of positions ``len-t .. len-1`` (append their keys
                and values first); its batch dims broadcast with the cache's.
            scale: score scale, ``1/sqrt(d_k)`` by default.

        Returns:
            ``(output (..., t, d_v), weights (..., t, len))``.
        """
        require_tensor("q_new", q_new, floating=True)
        require_min_dim("q_new", q_new, 2, "(..., t, d_k)")
        if not self.length:
            raise ValueError("the cache is empty: append the new keys and values before attend")
        t, length = q_new.shape[-2], self.length
        if t > length or q_new.shape[-1] != self._keys.shape[-1]:
            raise ValueError(
                f"q_new (..., t, d_k) must have t <= the {length} cached positions and the keys' "
                f"d_k, got q_new {shape(q_new)} and keys {shape(self.keys)}")
        broadcast_batch(("q_new", q_new, 2), ("the cache's keys", self.keys, 2))
        if q_new.dtype != self._keys.dtype:
            raise TypeError(f"q_new must have the cache's dtype {self._keys.dtype}, got {q_new.dtype}")
        mask = causal_mask(length, device=q_new.device)[length - t:]   # (t, len): p sees 0..p
        output, weights = scaled_dot_product_attention(q_new, self.keys, self.values, mask,
                                                       scale=scale)
        self.score_counts.append(t * length)
        return output, weights


def decode_with_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Causal attention computed one position at a time with a :class:`KVCache`.

    At step ``t`` the key and value of position ``t`` are appended and the query of position
    ``t`` attends to the ``t + 1`` cached positions. The result equals
    ``scaled_dot_product_attention(q, k, v, causal_mask(n))[0]`` to float precision.

    Args:
        q, k: ``(..., n, d_k)``; v: ``(..., n, d_v)``.

    Returns:
        ``(output (..., n, d_v), counts)`` where ``counts[t] = t + 1`` is the number of score
        entries step ``t`` computed (per batch element).
    """
    check_qkv(q, k, v, holds_scores=False)                           # one row of scores a step
    if not q.shape[:-1] == k.shape[:-1] == v.shape[:-1]:
        raise ValueError(f"q, k and v must share their batch dims and n, got q {shape(q)}, "
                         f"k {shape(k)}, v {shape(v)}")
    n = q.shape[-2]
    cache = KVCache(n)
    output = q.new_empty((*q.shape[:-1], v.shape[-1]))                   # (..., n, d_v)
    for t in range(n):
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
    """Generate step by step the way a model without a cache does: at step ``t`` the whole
    prefix ``x[:t + 1]`` goes through the layer again (projections and causal attention for every
    row), and only the last row is kept.

    Args:
        x: ``(n, d_model)`` the token embeddings, one per step; w_q, w_k: ``(d_model, d_k)``;
            w_v: ``(d_model, d_v)``.

    Returns:
        ``(n, d_v)``: row ``t`` is the attention output of token ``t`` over tokens ``0..t``.
    """
    _check_decode(x, w_q, w_k, w_v)
    n = x.shape[0]
    rows = x.new_empty((n, w_v.shape[1]))
    for t in range(n):
        prefix = x[: t + 1]                                             # (t+1, d_model)
        q, k, v = prefix @ w_q, prefix @ w_k, prefix @ w_v              # all t+1 rows, again
        rows[t] = scaled_dot_product_attention(q, k, v, causal_mask(t + 1))[0][-1]
    return rows


def generate_with_cache(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                        w_v: torch.Tensor) -> torch.Tensor:
    """The same outputs as :func:`generate_without_cache`, with a :class:`KVCache`: at step ``t``
    only the new token is projected, its key and value are appended to the cache, and its one
    query attends to the ``t + 1`` cached keys. Shapes as in :func:`generate_without_cache`."""
    _check_decode(x, w_q, w_k, w_v)
    n = x.shape[0]
    cache = KVCache(n)
    rows = x.new_empty((n, w_v.shape[1]))
    for t in range(n):
        token = x[t : t + 1]                                            # (1, d_model)
        cache.append(token @ w_k, token @ w_v)                          # one new key and value
        rows[t] = cache.attend(token @ w_q)[0][0]                       # (1, d_v): one query
    return rows
