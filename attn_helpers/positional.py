"""Position information for attention: sinusoidal (Vaswani et al., 2017) and learned encodings
are added to the embeddings, RoPE (Su et al., 2021) rotates queries and keys by ``p * omega_i`` on
pairs ``(2i, 2i+1)``, ALiBi (Press et al., 2022) adds ``-slope * distance`` to the scores.
``omega_i = base^(-2i/d)``, ``PE[p, 2i] = sin(p omega_i)``, ``PE[p, 2i+1] = cos(p omega_i)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import require_int_in, require_number, require_positive_int, require_tensor, shape

__all__ = ["frequencies", "sinusoidal_encoding", "pair_rotation", "LearnedPositionalEmbedding",
           "apply_rope", "alibi_slopes", "alibi_bias"]


def _check(base, d_model=None) -> float:
    """Check ``d_model`` (when given) positive and even, and ``base > 1``; return ``base``."""
    if d_model is not None and require_positive_int("d_model", d_model) % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    base = require_number("base", base)
    if not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return base


def _omega(d_model: int, base: float, device=None) -> torch.Tensor:
    """``(d_model / 2,)`` float64 ``omega_i = base^(-2i / d_model)``."""
    return base ** -(torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)


def frequencies(d_model: int, base: float = 10000.0, *, dtype=torch.float64) -> torch.Tensor:
    """``(d_model // 2,)`` angular frequencies ``omega_i = base^(-2i / d_model)``, fastest first."""
    return _omega(d_model, _check(base, d_model)).to(dtype)


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """:func:`sinusoidal_encoding` on checked arguments, in float64."""
    p = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (n, 1)
    angles = p * _omega(d_model, base)  # (n, d/2): p omega_i
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)  # (n, d)
    pe[:, 0::2] = torch.sin(angles)  # PE[p, 2i]
    pe[:, 1::2] = torch.cos(angles)  # PE[p, 2i+1]
    return pe


def sinusoidal_encoding(n_positions: int, d_model: int, *, base: float = 10000.0,
                        dtype=torch.float32) -> torch.Tensor:
    """``(n_positions, d_model)``: ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] =
    cos(p / base^(2i/d))``, computed in float64 and returned in ``dtype``."""
    require_positive_int("n_positions", n_positions)
    base = _check(base, d_model)
    return sinusoidal_table(n_positions, d_model, base).to(dtype)


def pair_rotation(offset: float, d_model: int, pair: int, *, base: float = 10000.0) -> torch.Tensor:
    """The float64 ``(2, 2)`` rotation ``R`` with ``R @ PE[p, 2i:2i+2] = PE[p + offset, 2i:2i+2]``
    for every ``p``: ``[[cos b, sin b], [-sin b, cos b]]``, ``b = offset * omega_i``."""
    offset = require_number("offset", offset)
    base = _check(base, d_model)
    require_int_in("pair", pair, 0, d_model // 2 - 1)
    b = offset * base ** (-2 * pair / d_model)  # offset * omega_i
    c, s = math.cos(b), math.sin(b)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


class LearnedPositionalEmbedding(nn.Module):
    """One trainable vector per position (BERT, GPT-2), ``N(0, init_std^2)`` at first:
    ``forward(x (..., n <= max_len, d_model)) -> x + P[:n]``."""

    def __init__(self, max_len: int, d_model: int, *, init_std: float = 0.02):
        super().__init__()
        require_positive_int("max_len", max_len)
        require_positive_int("d_model", d_model)
        self.max_len, self.d_model = max_len, d_model
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * init_std)  # (max_len, d_model)

    def encoding(self, n: int) -> torch.Tensor:
        """``(n, d_model)``: the rows for positions ``0..n-1``."""
        require_int_in("n", n, 1, self.max_len)
        return self.weight[:n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x, floating=True)
        if x.dim() < 2 or x.shape[-1] != self.d_model or x.shape[-2] > self.max_len:
            raise ValueError(f"x must be (..., n <= max_len={self.max_len}, "
                             f"d_model={self.d_model}), got shape {shape(x)}")
        return x + self.weight[: x.shape[-2]].to(x.dtype)  # (..., n, d_model): x + P[:n]


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """:func:`apply_rope` on checked arguments."""
    omega = _omega(x.shape[-1], base, x.device)  # (d/2,): omega_i
    angles = positions.to(torch.float64)[..., None] * omega  # (..., n, d/2): p omega_i
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2): x[2i], x[2i+1]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (..., n, d/2, 2)
    return rotated.flatten(-2)  # (..., n, d), pairs back in place


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, *,
               base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding: rotate each pair ``(x[2i], x[2i+1])`` of ``x (..., n, d)`` (``d`` even) by
    ``p * omega_i``; ``positions`` broadcast to ``(..., n)``, default ``0..n-1``. Same shape, dtype."""
    require_tensor("x", x, floating=True)
    if x.dim() < 2 or x.shape[-1] == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., n, d) with d even (pairs), got shape {shape(x)}")
    base = _check(base)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)
    require_tensor("positions", positions)
    if positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be integer or real, got dtype {positions.dtype}")
    try:
        ok = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"positions of shape {shape(positions)} do not broadcast to x's "
                         f"(..., n) = {tuple(x.shape[:-1])}")
    return rope(x, positions, base)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """``(num_heads,)`` float64 ALiBi slopes ``2^(-8/h), 2^(-16/h), ..., 2^(-8)``; for ``h`` not a
    power of two, the paper's: those of ``c < h`` heads, then every other one of ``2c`` heads."""
    require_positive_int("num_heads", num_heads)

    def geometric(h: int) -> torch.Tensor:  # (h,): 2^(-8/h), 2^(-16/h), ..., 2^(-8)
        return 2.0 ** (-8.0 / h * torch.arange(1, h + 1, dtype=torch.float64))

    c = 2 ** (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    return torch.cat([geometric(c), geometric(2 * c)[0::2][: num_heads - c]])


def alibi_bias(n: int, num_heads: int, *, dtype=torch.float32) -> torch.Tensor:
    """``(num_heads, n, n)`` ALiBi bias ``-m_h * |i - j|``, added to the scores (below the
    diagonal, the paper's ``-m_h * (i - j)``)."""
    require_positive_int("n", n)
    m = alibi_slopes(num_heads)[:, None, None]  # (h, 1, 1)
    positions = torch.arange(n, dtype=torch.float64)
    distance = (positions[:, None] - positions[None, :]).abs()  # (n, n): |i - j|
    return (-m * distance).to(dtype)  # (h, n, n)
