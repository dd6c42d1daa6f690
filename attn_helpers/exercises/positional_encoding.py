"""Checkers for notebook 07 (positional encoding): the sinusoidal encoding, and measuring whether
a function of a sequence is permutation-equivariant."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..positional import apply_rope, sinusoidal_encoding
from .core import CheckResult, Mistake, check_function, seeded

__all__ = ["check_sinusoidal", "check_equivariance_gap", "SequenceFunction"]


def check_sinusoidal(encoding: Callable) -> CheckResult:
    """Exercise: ``encoding(n_positions, d_model) -> (n_positions, d_model)`` with
    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``."""
    cases = [{"n_positions": n, "d_model": d} for n, d in [(4, 2), (6, 8), (50, 16), (1, 4)]]

    def concatenated(n, d):
        pe = sinusoidal_encoding(n, d)
        return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=-1)

    def exponent_without_two(n, d):
        omega = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * omega
        return torch.stack([angles.sin(), angles.cos()], -1).reshape(n, d).float()

    return check_function(
        encoding, sinusoidal_encoding, cases, what="your encoding", output_names=("PE",),
        mistakes=[
            Mistake(lambda n, d: sinusoidal_encoding(n, d).view(n, d // 2, 2).flip(-1).reshape(n, d),
                    "sin and cos are swapped: even dimensions 2i hold the sine, odd ones 2i+1 the "
                    "cosine."),
            Mistake(concatenated, "you put all sines first and all cosines after; in this "
                                  "course's layout they alternate: sin, cos, sin, cos, ..."),
            Mistake(exponent_without_two, "the exponent is 2i/d, where 2i is the even dimension "
                                          "index (0, 2, 4, ...): pair i has frequency "
                                          "10000^(-2i/d), not 10000^(-i/d)."),
        ],
        atol=1e-4,
    )


class SequenceFunction:
    """A named function of a sequence ``x (n, d) -> (n, d)``, used as an exercise input."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.name, self.fn = name, fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def __repr__(self) -> str:
        return self.name


def _self_attention(x):
    return scaled_dot_product_attention(x, x, x)[0]


def _rope_attention(x):
    return scaled_dot_product_attention(apply_rope(x), apply_rope(x), x)[0]


def _added_sinusoid(x):
    x = x + sinusoidal_encoding(*x.shape).to(x.dtype)
    return scaled_dot_product_attention(x, x, x)[0]


FUNCTIONS = (
    SequenceFunction("self-attention, no positions", _self_attention),
    SequenceFunction("self-attention with RoPE", _rope_attention),
    SequenceFunction("self-attention with sinusoids added", _added_sinusoid),
    SequenceFunction("tanh, token by token", torch.tanh),
)


def check_equivariance_gap(gap: Callable) -> CheckResult:
    """Exercise: ``gap(f, x, perm) -> scalar tensor``, the largest ``|f(x[perm]) - f(x)[perm]|``:
    zero (to rounding) exactly when permuting the input permutes ``f``'s output the same way."""
    g = seeded(11)
    cases = []
    for number, f in enumerate(FUNCTIONS):
        n = 5 + number
        x = torch.randn(n, 4, generator=g, dtype=torch.float64)
        cases.append({"f": f, "x": x, "perm": torch.randperm(n, generator=g)})

    def reference(f, x, perm):
        return (f(x[perm]) - f(x)[perm]).abs().max()

    return check_function(
        gap, reference, cases, what="gap", output_names=("the gap",),
        mistakes=[
            Mistake(lambda f, x, perm: (f(x[perm]) - f(x)).abs().max(),
                    "you compared f(x[perm]) with the unpermuted f(x); an equivariant f moves its "
                    "outputs along with its inputs, so compare with f(x)[perm]."),
            Mistake(lambda f, x, perm: (f(x[perm]) - f(x)[perm]).abs().sum(),
                    "that is the sum of the differences; take the largest one (.max())."),
        ],
        atol=1e-8,
        rtol=1e-6,
    )

