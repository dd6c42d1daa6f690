"""The Transformer decoder layer (Vaswani et al., 2017) from the course's parts, equal to
``torch.nn.TransformerDecoderLayer``: causal self-attention, cross-attention to ``memory``, then a
feed-forward block, each with its residual and LayerNorm (post-norm ``LN(x + block(x))`` or pre-norm
``x + block(LN(x))``). ``cross_attention=False`` gives a decoder-only (GPT) layer. No dropout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import require_bool, require_number, require_positive_int, require_tensor, shape
from .kv_cache import KVCache
from .masks import causal_mask
from .multihead import MultiHeadAttention

__all__ = ["FeedForward", "DecoderLayer", "DecoderWeights", "ACTIVATIONS"]

#: The feed-forward activations, by the names ``torch.nn.TransformerDecoderLayer`` accepts.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _require_activation(activation) -> str:
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string, one of {sorted(ACTIVATIONS)}, got "
                        f"{type(activation).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return activation


class FeedForward(nn.Module):
    """``linear2(act(linear1(x)))`` at every position: ``(..., d_model) -> (..., d_model)``."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", bias: bool = True):
        super().__init__()
        require_positive_int("d_model", d_model)
        require_positive_int("d_ff", d_ff)
        self.activation = _require_activation(activation)
        require_bool("bias", bias)
        self.d_model = d_model
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def _check_inputs(self, x):
        require_tensor("x", x, floating=True)
        if x.dim() == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., d_model={self.d_model}), got {shape(x)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., d_model) -> (..., d_model)``."""
        self._check_inputs(x)
        hidden = ACTIVATIONS[self.activation](self.linear1(x))    # (..., d_ff)
        return self.linear2(hidden)                               # (..., d_model)


class DecoderWeights(NamedTuple):
    """``self_attention`` ``(b, h, n, n)`` and ``cross_attention`` ``(b, h, n, n_m)`` (or None)."""

    self_attention: torch.Tensor
    cross_attention: torch.Tensor | None


class DecoderLayer(nn.Module):
    """One Transformer decoder layer, batch-first, dropout-free. ``activation``: ``"relu"`` or
    ``"gelu"`` (exact); ``num_kv_heads``: grouped-query heads of both attentions; ``memory_dim``:
    the width of ``memory`` (default ``d_model``). Submodules ``self_attn``, ``cross_attn``,
    ``feed_forward``, ``norm1..3``, in the roles of torch's ``self_attn``, ``multihead_attn``,
    ``linear1/2``, ``norm1..3``."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, norm_first: bool = False,
                 activation: str = "relu", num_kv_heads: int | None = None,
                 memory_dim: int | None = None, cross_attention: bool = True,
                 layer_norm_eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.norm_first = require_bool("norm_first", norm_first)
        require_bool("cross_attention", cross_attention)
        eps = require_number("layer_norm_eps", layer_norm_eps, positive=True)
        heads = dict(num_kv_heads=num_kv_heads, bias=bias)
        self.d_model = d_model
        self.self_attn = MultiHeadAttention(d_model, num_heads, **heads)
        if memory_dim is not None:                              # named here, not as kdim below
            require_positive_int("memory_dim", memory_dim)
        self.cross_attn = (MultiHeadAttention(d_model, num_heads, kdim=memory_dim,
                                              vdim=memory_dim, **heads) if cross_attention else None)
        self.feed_forward = FeedForward(d_model, d_ff, activation=activation, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias) if cross_attention else None
        self.norm3 = nn.LayerNorm(d_model, eps=eps, bias=bias)

    def _check_inputs(self, x, memory, causal, memory_padding, need_weights, cache):
        require_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] == 0:
            raise ValueError(f"x must have shape (b, n >= 1, d_model={self.d_model}), got {shape(x)}")
        require_bool("causal", causal)
        require_bool("need_weights", need_weights)
        if cache is not None and not causal:
            raise ValueError("a cache is for causal decoding: pass causal=True with a cache")
        if self.cross_attn is None:
            if memory is not None or memory_padding is not None:
                raise ValueError("this layer has no cross-attention (cross_attention=False): "
                                 "memory and memory_padding must be None")
            return None
        require_tensor("memory", memory, floating=True)
        b, width = x.shape[0], self.cross_attn.kdim
        if memory.dim() != 3 or memory.shape[0] != b or memory.shape[-1] != width or not memory.shape[1]:
            raise ValueError(f"memory must have shape (b={b}, n_m >= 1, memory_dim={width}), got "
                             f"{shape(memory)} (x {shape(x)})")
        if memory_padding is None:
            return None
        require_tensor("memory_padding", memory_padding)
        if memory_padding.dtype != torch.bool or memory_padding.shape != memory.shape[:2]:
            raise ValueError(f"memory_padding must be a bool tensor (b, n_m) = "
                             f"{tuple(memory.shape[:2])}, True = real token, got "
                             f"{memory_padding.dtype} shape {shape(memory_padding)}")
        return memory_padding[:, None, :]                       # (b, 1, n_m): for every query

    def _residual(self, x, norm, block):
        """One sub-layer with its residual and LayerNorm; ``block`` returns ``(out, weights)``."""
        if self.norm_first:
            out, weights = block(norm(x))
            return x + out, weights                             # pre-norm: x + block(LN(x))
        out, weights = block(x)
        return norm(x + out), weights                           # post-norm: LN(x + block(x))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, *, causal: bool = True,
                memory_padding: torch.Tensor | None = None, need_weights: bool = False,
                cache: KVCache | None = None):
        """``x (b, n, d_model)``, ``memory (b, n_m, memory_dim)``, ``memory_padding (b, n_m)``
        (True = real) -> ``(b, n, d_model)``, with ``need_weights`` also the
        :class:`DecoderWeights`. ``cache``: a :class:`KVCache` for the new positions ``x``."""
        memory_mask = self._check_inputs(x, memory, causal, memory_padding, need_weights, cache)
        self_mask = causal_mask(x.shape[1], device=x.device) if causal and cache is None else None

        def self_attention(h):                                  # (b, n, d) -> (b, n, d), (b, h, n, n)
            return self.self_attn(h, h, h, self_mask, cache=cache)

        def cross_attention(h):                                 # (b, n, d) -> (b, n, d), (b, h, n, n_m)
            return self.cross_attn(h, memory, memory, memory_mask)

        x, self_weights = self._residual(x, self.norm1, self_attention)
        cross_weights = None
        if self.cross_attn is not None:
            x, cross_weights = self._residual(x, self.norm2, cross_attention)
        x, _ = self._residual(x, self.norm3, lambda h: (self.feed_forward(h), None))
        return (x, DecoderWeights(self_weights, cross_weights)) if need_weights else x

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A copy of ``torch.nn.TransformerDecoderLayer`` ``layer`` (relu or gelu); equal to it in
        eval mode. Ours is always batch-first."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"layer must be a torch.nn.TransformerDecoderLayer, got "
                            f"{type(layer).__name__}")
        act = layer.activation
        if act is F.relu or type(act) is nn.ReLU:
            activation = "relu"
        elif act is F.gelu or (type(act) is nn.GELU and act.approximate == "none"):
            activation = "gelu"
        else:
            raise ValueError(f"from_torch supports the relu and gelu activations, got {act!r}")
        d_model, heads = layer.self_attn.embed_dim, layer.self_attn.num_heads
        ours = cls(d_model, heads, layer.linear1.out_features, norm_first=layer.norm_first,
                   activation=activation, memory_dim=layer.multihead_attn.kdim,
                   layer_norm_eps=layer.norm1.eps, bias=layer.linear1.bias is not None)
        weight = layer.linear1.weight
        ours = ours.to(dtype=weight.dtype, device=weight.device)
        ours.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        ours.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        for mine, theirs in ((ours.feed_forward.linear1, layer.linear1),
                             (ours.feed_forward.linear2, layer.linear2), (ours.norm1, layer.norm1),
                             (ours.norm2, layer.norm2), (ours.norm3, layer.norm3)):
            mine.load_state_dict(theirs.state_dict())
        return ours
