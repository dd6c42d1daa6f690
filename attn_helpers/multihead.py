r"""Multi-head attention, batch-first, with per-head weights; equal to ``torch.nn.MultiheadAttention``.

With ``h`` heads of size ``d_head = d_model / h`` (Vaswani et al., 2017):

.. math::
    \mathrm{head}_i = \mathrm{Attention}(Q W^Q_i, K W^K_i, V W^V_i), \qquad
    \mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O .

All heads' projections are stored side by side in one ``(d_model, d_model)`` matrix per role, so
the heads cost no more parameters than one head of size ``d_model``: :func:`split_heads` cuts the
projected ``(b, n, d_model)`` tensor into ``(b, h, n, d_head)`` and :func:`merge_heads` glues the
heads' outputs back together.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import require_positive_int, require_tensor, shape
from .attention import scaled_dot_product_attention

__all__ = [
    "MultiHeadAttention",
    "split_heads",
    "merge_heads",
    "parameter_count",
    "to_torch_attn_mask",
    "to_torch_key_padding_mask",
]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(b, n, h * d_head) -> (b, h, n, d_head)``: head ``i`` gets the consecutive features
    ``i*d_head .. (i+1)*d_head - 1``."""
    require_tensor("x", x)
    require_positive_int("num_heads", num_heads)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (b, n, d_model), got shape {shape(x)}")
    b, n, d_model = x.shape
    if d_model % num_heads:
        raise ValueError(
            f"the last dimension of x (d_model={d_model}, x shape {shape(x)}) must be divisible by "
            f"num_heads={num_heads}"
        )
    return x.reshape(b, n, num_heads, d_model // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, d_head) -> (b, n, h * d_head)``: the inverse of :func:`split_heads`."""
    require_tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (b, h, n, d_head), got shape {shape(x)}")
    b, h, n, d_head = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d_head)


def parameter_count(
    d_model: int, num_heads: int, *, bias: bool = True, kdim: int | None = None,
    vdim: int | None = None,
) -> int:
    r"""Number of parameters of :class:`MultiHeadAttention` (and of ``nn.MultiheadAttention``).

    :math:`W^Q` is ``d_model x d_model``, :math:`W^K` ``kdim x d_model``, :math:`W^V`
    ``vdim x d_model``, :math:`W^O` ``d_model x d_model``, plus one bias of ``d_model`` per
    matrix. It does not depend on ``num_heads`` (which must divide ``d_model``).
    """
    require_positive_int("d_model", d_model)
    require_positive_int("num_heads", num_heads)
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
    kdim = d_model if kdim is None else require_positive_int("kdim", kdim)
    vdim = d_model if vdim is None else require_positive_int("vdim", vdim)
    weights = d_model * (d_model + kdim + vdim + d_model)
    return weights + (4 * d_model if bias else 0)


def to_torch_attn_mask(mask: torch.Tensor) -> torch.Tensor:
    """Our boolean mask (True = may attend) as ``nn.MultiheadAttention``'s boolean ``attn_mask``,
    where True means the opposite (NOT allowed)."""
    require_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor, got dtype {mask.dtype}")
    return ~mask


def to_torch_key_padding_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """A ``(b, n_k)`` padding mask (True = real token, see ``padding_mask``) as torch's
    ``key_padding_mask`` (True = ignore this key)."""
    require_tensor("key_padding", key_padding)
    if key_padding.dtype != torch.bool or key_padding.dim() != 2:
        raise ValueError(f"key_padding must be a bool tensor (b, n_k), got {key_padding.dtype} "
                         f"shape {shape(key_padding)}")
    return ~key_padding


class MultiHeadAttention(nn.Module):
    """Multi-head attention that returns every head's weights.

    Args:
        d_model: size of the queries and of the output; split into ``num_heads`` heads.
        num_heads: number of heads ``h``; must divide ``d_model``.
        bias: add a bias to the four projections.
        kdim, vdim: sizes of the key and value inputs (default ``d_model``).

    ``forward(query (b, n_q, d_model), key (b, n_k, kdim), value (b, n_k, vdim), mask=None)``
    returns ``(output (b, n_q, d_model), weights (b, h, n_q, n_k))``. ``mask`` is boolean, True =
    may attend, of shape ``(n_q, n_k)``, ``(b, n_q, n_k)`` (e.g. a padding mask from
    ``key_padding_to_attention_mask``) or ``(b, h, n_q, n_k)``.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None):
        super().__init__()
        parameter_count(d_model, num_heads, bias=bias, kdim=kdim, vdim=vdim)  # validates
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
        self.d_model, self.num_heads = d_model, num_heads
        self.d_head = d_model // num_heads
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(self.kdim, d_model, bias=bias)
        self.v_proj = nn.Linear(self.vdim, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}, "
                f"kdim={self.kdim}, vdim={self.vdim}")

    def _check_inputs(self, query, key, value, mask):
        for name, t, last in (("query", query, self.d_model), ("key", key, self.kdim),
                              ("value", value, self.vdim)):
            require_tensor(name, t, floating=True)
            if t.dim() != 3 or t.shape[-1] != last:
                raise ValueError(f"{name} must have shape (b, n, {last}) (batch first), got "
                                 f"{shape(t)}")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key {shape(key)} and value {shape(value)} must share (b, n_k)")
        if query.shape[0] != key.shape[0]:
            raise ValueError(f"query {shape(query)} and key {shape(key)} must share the batch size")
        if mask is None:
            return None
        require_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        b, n_q, n_k = query.shape[0], query.shape[1], key.shape[1]
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (b, 1, n_q, n_k): the same mask for every head
        target = (b, self.num_heads, n_q, n_k)
        try:
            ok = mask.dim() in (2, 4) and torch.broadcast_shapes(mask.shape, target) == target
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"mask of shape {shape(mask)} does not broadcast to (b, h, n_q, n_k) = "
                             f"{target}; pass (n_q, n_k), (b, n_q, n_k) or (b, h, n_q, n_k)")
        return mask

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        head_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Multi-head attention; see the class docstring for shapes.

        ``head_mask`` (optional, ``(h,)`` bool or float) multiplies each head's output before the
        output projection: ``False``/0 switches a head off (head ablation).
        """
        mask = self._check_inputs(query, key, value, mask)
        q = split_heads(self.q_proj(query), self.num_heads)    # (b, h, n_q, d_head)
        k = split_heads(self.k_proj(key), self.num_heads)      # (b, h, n_k, d_head)
        v = split_heads(self.v_proj(value), self.num_heads)    # (b, h, n_k, d_head)
        heads, weights = scaled_dot_product_attention(q, k, v, mask)
        if head_mask is not None:
            require_tensor("head_mask", head_mask)
            if head_mask.shape != (self.num_heads,):
                raise ValueError(f"head_mask must have shape (num_heads,) = ({self.num_heads},), "
                                 f"got {shape(head_mask)}")
            heads = heads * head_mask.to(heads.dtype)[:, None, None]
        return self.out_proj(merge_heads(heads)), weights

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``torch.nn.MultiheadAttention`` ``m`` (either ``batch_first`` setting; ours
        is always batch-first). ``add_bias_kv`` and ``add_zero_attn`` are not supported."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"m must be a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv=True or add_zero_attn=True")
        d = m.embed_dim
        bias = m.in_proj_bias is not None
        ours = cls(d, m.num_heads, bias=bias, kdim=m.kdim, vdim=m.vdim)
        if m._qkv_same_embed_dim:
            w_q, w_k, w_v = m.in_proj_weight.detach().split(d)
        else:
            w_q, w_k, w_v = (m.q_proj_weight.detach(), m.k_proj_weight.detach(),
                             m.v_proj_weight.detach())
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
