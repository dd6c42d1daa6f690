"""A key/value cache for incremental (autoregressive) decoding.

A causal model generating token ``t`` needs the keys and values of tokens ``0..t``; those of
``0..t-1`` were already computed at earlier steps and never change (the causal mask guarantees
that no earlier position depends on a later one). So we keep them in a cache, append the new
token's key and value at each step, and score only the new query against the cached keys: a step
costs ``O(t)`` score entries instead of the ``O(t^2)`` of recomputing the whole sequence.

Public API (other notebooks import it; keep it stable)::

    cache = KVCache()
    cache.append(k_new, v_new)          # k_new (..., t, d_k), v_new (..., t, d_v)
    output, weights = cache.attend(q_new)   # q_new (..., t, d_k) -> (..., t, d_v), (..., t, len)
    len(cache)                          # number of cached positions
    cache.score_counts                  # score entries computed by each attend call

    output, counts = decode_with_cache(q, k, v)   # one token at a time == full causal attention
"""

from __future__ import annotations

import torch

from ._checks import require_min_dim, require_tensor, shape
from .attention import scaled_dot_product_attention

__all__ = ["KVCache", "decode_with_cache"]


class KVCache:
    """Keys ``(..., L, d_k)`` and values ``(..., L, d_v)`` of the ``L`` positions decoded so far.

    :meth:`append` adds the keys and values of ``t`` new positions; :meth:`attend` lets the
    queries of the *last* ``t`` positions attend causally: the query at absolute position ``p``
    sees cached positions ``0..p``. The usual step is ``append`` then ``attend`` with ``t = 1``.

    Attributes:
        keys, values: the cached tensors, or ``None`` while empty.
        score_counts: one int per :meth:`attend` call, the number of query-key scores it computed
            per batch element (``t * len(cache)``).
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.score_counts: list[int] = []

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def __repr__(self) -> str:
        if self.keys is None:
            return "KVCache(empty)"
        return f"KVCache(len={len(self)}, keys {shape(self.keys)}, values {shape(self.values)})"

    def reset(self) -> None:
        """Empty the cache and its counts."""
        self.keys = self.values = None
        self.score_counts = []

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Add ``t`` positions: ``k_new (..., t, d_k)``, ``v_new (..., t, d_v)``.

        The batch dimensions and feature sizes must match what is already cached.
        """
        require_tensor("k_new", k_new, floating=True)
        require_tensor("v_new", v_new, floating=True)
        require_min_dim("k_new", k_new, 2, "(..., t, d_k)")
        require_min_dim("v_new", v_new, 2, "(..., t, d_v)")
        if k_new.shape[:-1] != v_new.shape[:-1]:
            raise ValueError(
                f"k_new and v_new must share their batch dims and t, got k_new {shape(k_new)} "
                f"and v_new {shape(v_new)}"
            )
        if self.keys is not None:
            if (k_new.shape[:-2] != self.keys.shape[:-2] or k_new.shape[-1] != self.keys.shape[-1]
                    or v_new.shape[-1] != self.values.shape[-1]):
                raise ValueError(
                    f"k_new {shape(k_new)} and v_new {shape(v_new)} do not fit the cache's keys "
                    f"{shape(self.keys)} and values {shape(self.values)}"
                )
            k_new = torch.cat([self.keys, k_new], dim=-2)
            v_new = torch.cat([self.values, v_new], dim=-2)
        self.keys, self.values = k_new, v_new

    def attend(
        self, q_new: torch.Tensor, *, scale: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of the last ``t`` positions' queries over the cache, causal within the block.

        Args:
            q_new: ``(..., t, d_k)`` queries of positions ``len-t .. len-1`` (append their keys
                and values first).

        Returns:
            ``(output (..., t, d_v), weights (..., t, len))``.
        """
        require_tensor("q_new", q_new, floating=True)
        require_min_dim("q_new", q_new, 2, "(..., t, d_k)")
        if self.keys is None:
            raise ValueError("the cache is empty: append the new keys and values before attend")
        t, length = q_new.shape[-2], len(self)
        if t > length:
            raise ValueError(
                f"q_new has t={t} queries but the cache holds only {length} positions "
                f"(q_new {shape(q_new)}, keys {shape(self.keys)})"
            )
        rows = torch.arange(length - t, length, device=q_new.device)
        mask = torch.arange(length, device=q_new.device)[None, :] <= rows[:, None]  # (t, len)
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
    for name, x, layout in (("q", q, "(..., n, d_k)"), ("k", k, "(..., n, d_k)"),
                            ("v", v, "(..., n, d_v)")):
        require_tensor(name, x, floating=True)
        require_min_dim(name, x, 2, layout)
    if not (q.shape[:-1] == k.shape[:-1] == v.shape[:-1]) or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q, k and v must share their batch dims and n (and q, k their d_k), got "
            f"q {shape(q)}, k {shape(k)}, v {shape(v)}"
        )
    cache = KVCache()
    outputs = []
    for step in range(q.shape[-2]):
        cache.append(k[..., step:step + 1, :], v[..., step:step + 1, :])
        output, _ = cache.attend(q[..., step:step + 1, :], scale=scale)
        outputs.append(output)
    return torch.cat(outputs, dim=-2), cache.score_counts
