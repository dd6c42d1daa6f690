r"""Multi-head attention, batch-first, with per-head weights (Vaswani et al., 2017), and
grouped-query attention (Ainslie et al., 2023): ``h`` query heads share ``g`` key/value heads, query
head ``i`` using head ``i // (h / g)`` as ``F.scaled_dot_product_attention(..., enable_gqa=True)``
does; ``g = 1`` is multi-query attention (Shazeer, 2019).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (
    require_bool,
    require_int_in,
    require_mask,
    require_positive_int,
    require_tensor,
    shape,
)
from .attention import scaled_dot_product_attention
from .kv_cache import KVCache

__all__ = ["MultiHeadAttention", "split_heads", "merge_heads", "parameter_count",
           "to_torch_attn_mask", "to_torch_key_padding_mask"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(b, n, h * d_head) -> (b, h, n, d_head)``: head ``i`` gets features ``i*d_head`` onwards."""
    require_tensor("x", x)
    require_positive_int("num_heads", num_heads)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (b, n, d_model), got shape {shape(x)}")
    b, n, d_model = x.shape
    if d_model % num_heads:
        raise ValueError(f"the last dimension of x (d_model={d_model}, x shape {shape(x)}) must be "
                         f"divisible by num_heads={num_heads}")
    return x.reshape(b, n, num_heads, d_model // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, d_head) -> (b, n, h * d_head)``: the inverse of :func:`split_heads`."""
    require_tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (b, h, n, d_head), got shape {shape(x)}")
    b, h, n, d_head = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d_head)


def _check_sizes(d_model, num_heads, num_kv_heads, kdim, vdim) -> tuple[int, int, int]:
    """Validate the sizes; return ``(g, kdim, vdim)`` with the defaults filled in."""
    require_positive_int("d_model", d_model)
    require_positive_int("num_heads", num_heads)
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
    g = num_heads if num_kv_heads is None else num_kv_heads
    require_int_in("num_kv_heads", g, 1, num_heads)
    if num_heads % g:
        raise ValueError(f"num_kv_heads={g} must divide num_heads={num_heads}")
    kdim = d_model if kdim is None else require_positive_int("kdim", kdim)
    vdim = d_model if vdim is None else require_positive_int("vdim", vdim)
    return g, kdim, vdim


def parameter_count(d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                    bias: bool = True, kdim: int | None = None, vdim: int | None = None) -> int:
    """Parameters of :class:`MultiHeadAttention` (and ``nn.MultiheadAttention``): ``W^Q``, ``W^O``
    ``d_model x d_model``, ``W^K``, ``W^V`` ``kdim``/``vdim x g * d_head``, plus the biases."""
    g, kdim, vdim = _check_sizes(d_model, num_heads, num_kv_heads, kdim, vdim)
    require_bool("bias", bias)
    d_kv = g * (d_model // num_heads)
    weights = d_model * d_model + kdim * d_kv + vdim * d_kv + d_model * d_model
    return weights + (2 * d_model + 2 * d_kv if bias else 0)


def to_torch_attn_mask(mask: torch.Tensor) -> torch.Tensor:
    """Our bool mask (True = may attend) as ``nn.MultiheadAttention``'s (True = may NOT attend)."""
    require_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor, got dtype {mask.dtype}")
    return ~mask


def to_torch_key_padding_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """A ``(b, n_k)`` padding mask (True = real token) as torch's (True = ignore this key)."""
    require_tensor("key_padding", key_padding)
    if key_padding.dtype != torch.bool or key_padding.dim() != 2:
        raise ValueError(f"key_padding must be a bool tensor (b, n_k), got {key_padding.dtype} "
                         f"shape {shape(key_padding)}")
    return ~key_padding


class MultiHeadAttention(nn.Module):
    """Multi-head (or grouped-query) attention that returns every head's weights.

    ``num_heads`` ``h`` divides ``d_model``; ``num_kv_heads`` ``g`` (default ``h``) divides ``h``;
    ``kdim``, ``vdim`` the key and value widths (default ``d_model``). Projections ``q_proj``,
    ``k_proj``, ``v_proj`` (to ``g * d_head``), ``out_proj``. ``forward(query (b, n_q, d_model),
    key (b, n_k, kdim), value (b, n_k, vdim), mask=None)`` returns ``(output (b, n_q, d_model),
    weights (b, h, n_q, n_k))``; ``mask`` bool, True = may attend, ``(n_q, n_k)``, ``(b, n_q,
    n_k)`` or ``(b, h, n_q, n_k)``.
    """

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 bias: bool = True, kdim: int | None = None, vdim: int | None = None):
        super().__init__()
        g, kdim, vdim = _check_sizes(d_model, num_heads, num_kv_heads, kdim, vdim)
        require_bool("bias", bias)
        d_head = d_model // num_heads
        self.d_model, self.num_heads, self.num_kv_heads, self.d_head = d_model, num_heads, g, d_head
        self.kdim, self.vdim = kdim, vdim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(kdim, g * d_head, bias=bias)
        self.v_proj = nn.Linear(vdim, g * d_head, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, d_head={self.d_head}, kdim={self.kdim}, "
                f"vdim={self.vdim}")

    def _check_inputs(self, query, key, value, mask, head_mask, cache):
        """Validate; return the mask broadcastable to the grouped scores (b, g, h/g, n_q, n_k)."""
        for name, t, last in (("query", query, self.d_model), ("key", key, self.kdim),
                              ("value", value, self.vdim)):
            require_tensor(name, t, floating=True)
            if t.dim() != 3 or t.shape[-1] != last or t.shape[1] == 0:
                raise ValueError(f"{name} must have shape (b, n >= 1, {last}) (batch first), got "
                                 f"{shape(t)}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"query {shape(query)}, key {shape(key)} and value {shape(value)} "
                             f"must share the batch size b, key and value their n_k")
        h, g = self.num_heads, self.num_kv_heads
        if head_mask is not None:
            require_tensor("head_mask", head_mask)
            if head_mask.shape != (h,):
                raise ValueError(f"head_mask must have shape (num_heads,) = ({h},), "
                                 f"got {shape(head_mask)}")
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
            if mask is not None:
                raise ValueError("with a cache, mask must be None: the cache applies the causal mask")
            if query.shape[1] != key.shape[1]:
                raise ValueError(f"with a cache, query {shape(query)} and key {shape(key)} must be "
                                 f"the same new positions (the same n)")
        if mask is None:
            return None
        b, n_q, n_k = query.shape[0], query.shape[1], key.shape[1]
        if require_tensor("mask", mask).dim() == 3:
            mask = mask.unsqueeze(1)  # (b, 1, n_q, n_k): the same mask for every head
        require_mask("mask", mask, (b, h, n_q, n_k), "(b, h, n_q, n_k) (a 3-D mask (b, n_q, n_k) "
                     "is read as (b, 1, n_q, n_k))")
        # to the layout of the scores, a group's h/g heads stacked as rows: (..., h/g * n_q, n_k)
        if mask.dim() <= 2:
            return mask.expand(n_q, n_k).repeat(h // g, 1)
        return mask.expand(mask.shape[0], h, n_q, n_k).reshape(mask.shape[0], g, h // g * n_q, n_k)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None, *, head_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes in the class docstring. ``head_mask`` ``(h,)`` scales each head's output (0 =
        off). ``cache``: the new positions' keys and values are appended to a :class:`KVCache`
        and their queries attend causally to all of it (``n_k = len(cache)``, ``mask`` None)."""
        mask = self._check_inputs(query, key, value, mask, head_mask, cache)
        h, g, d_head = self.num_heads, self.num_kv_heads, self.d_head
        b, n_q = query.shape[:2]
        # the h/g query heads of group j, which share key/value head j, are stacked as rows: one
        # matmul per group against its own K and V, never copied h/g times
        q = split_heads(self.q_proj(query), h).reshape(b, g, h // g * n_q, d_head)
        k = split_heads(self.k_proj(key), g)                    # (b, g, n_k, d_head)
        v = split_heads(self.v_proj(value), g)                  # (b, g, n_k, d_head)
        if cache is None:
            heads, weights = scaled_dot_product_attention(q, k, v, mask)
        else:
            cache.append(k, v)                                  # now holds (b, g, len, d_head)
            heads, weights = cache.attend(q, group=h // g)      # the new queries over the cache
        heads = heads.reshape(b, h, n_q, d_head)                # (b, h, n_q, d_head)
        weights = weights.reshape(b, h, n_q, -1)                # (b, h, n_q, n_k)
        if head_mask is not None:
            heads = heads * head_mask.to(heads.dtype)[:, None, None]
        return self.out_proj(merge_heads(heads)), weights       # (b, n_q, d_model)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``torch.nn.MultiheadAttention`` ``m`` (without ``add_bias_kv`` or
        ``add_zero_attn``); ours is always batch-first."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"m must be a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv=True or add_zero_attn=True")
        d = m.embed_dim
        bias = m.in_proj_bias is not None
        if m._qkv_same_embed_dim:
            w_q, w_k, w_v = m.in_proj_weight.detach().split(d)
        else:
            w_q, w_k, w_v = (m.q_proj_weight.detach(), m.k_proj_weight.detach(),
                             m.v_proj_weight.detach())
        ours = cls(d, m.num_heads, bias=bias, kdim=m.kdim, vdim=m.vdim)
        ours = ours.to(dtype=w_q.dtype, device=w_q.device)
        with torch.no_grad():
            for proj, w in ((ours.q_proj, w_q), (ours.k_proj, w_k), (ours.v_proj, w_v)):
                proj.weight.copy_(w)
            if bias:
                for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj),
                                   m.in_proj_bias.detach().split(d), strict=True):
                    proj.bias.copy_(b)
                ours.out_proj.bias.copy_(m.out_proj.bias.detach())
            ours.out_proj.weight.copy_(m.out_proj.weight.detach())
        return ours
