"""Checkers for notebook 04 (multi-head attention): split and merge heads, count parameters."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..multihead import merge_heads, parameter_count, split_heads
from .core import CheckResult, Mistake, check_function, seeded
from .scaling import as_number_function

__all__ = ["check_split_heads", "check_merge_heads", "check_parameter_count"]


def _split_cases() -> list[dict]:
    g = seeded(41)
    return [{"x": torch.randn(b, n, d, generator=g), "num_heads": h}
            for b, n, d, h in [(2, 5, 8, 2), (1, 3, 12, 4), (3, 4, 6, 3), (2, 6, 8, 1)]]


def check_split_heads(split: Callable) -> CheckResult:
    """Exercise: ``split(x (b, n, d_model), num_heads) -> (b, h, n, d_head)``."""

    def no_transpose(x, h):
        b, n, d = x.shape
        return x.reshape(b, h, n, d // h)

    def interleaved(x, h):
        b, n, d = x.shape
        return x.reshape(b, n, d // h, h).permute(0, 3, 1, 2)

    return check_function(
        split, split_heads, _split_cases(), what="split", output_names=("the split tensor",),
        mistakes=[
            Mistake(no_transpose,
                    "the shape is right but the numbers are scrambled: reshaping (b, n, d_model) "
                    "straight to (b, h, n, d_head) mixes positions into heads. Reshape to "
                    "(b, n, h, d_head) first, then swap the n and h axes (transpose(1, 2))."),
            Mistake(interleaved,
                    "head i must get the consecutive features i*d_head .. (i+1)*d_head - 1, not "
                    "every h-th feature: reshape to (b, n, h, d_head), not (b, n, d_head, h)."),
        ],
    )


def _merge_cases() -> list[dict]:
    g = seeded(42)
    return [{"x": torch.randn(b, h, n, d, generator=g)}
            for b, h, n, d in [(2, 2, 5, 4), (1, 4, 3, 3), (3, 3, 4, 2), (2, 1, 6, 8)]]


def check_merge_heads(merge: Callable) -> CheckResult:
    """Exercise: ``merge(x (b, h, n, d_head)) -> (b, n, h * d_head)``, the inverse of split."""

    def no_transpose(x):
        b, h, n, d = x.shape
        return x.reshape(b, n, h * d)

    return check_function(
        merge, merge_heads, _merge_cases(), what="merge", output_names=("the merged tensor",),
        mistakes=[
            Mistake(no_transpose,
                    "the shape is right but the numbers are scrambled: move the head axis next to "
                    "d_head first (x.transpose(1, 2) gives (b, n, h, d_head)), then reshape."),
        ],
    )


def check_parameter_count(count: Callable) -> CheckResult:
    """Exercise: ``count(d_model, num_heads, kdim, vdim, bias) -> int``, the parameters of
    multi-head attention (the same as ``torch.nn.MultiheadAttention``)."""
    cases = [{"d_model": d, "num_heads": h, "kdim": k, "vdim": v, "bias": bias}
             for d, h, k, v, bias in [(768, 12, 768, 768, True), (512, 8, 512, 512, False),
                                      (64, 4, 32, 16, True), (6, 3, 2, 5, False)]]

    def number(f):
        return lambda *args: torch.tensor(float(f(*args)), dtype=torch.float64)

    def reference(d, h, k, v, bias):
        return parameter_count(d, h, kdim=k, vdim=v, bias=bias)

    return check_function(
        as_number_function(count, "count"), number(reference), cases,
        what="count", output_names=("the parameter count",), atol=0.0, rtol=0.0,
        mistakes=[
            Mistake(number(lambda d, h, k, v, bias: 4 * d * d + 4 * d),
                    "W_K reads vectors of size kdim and W_V vectors of size vdim: they are "
                    "kdim x d_model and vdim x d_model; and with bias=False there are no biases."),
            Mistake(number(lambda d, h, k, v, bias: h * reference(d, h, k, v, bias)),
                    "the heads share the same matrices: head i uses columns i*d_head..(i+1)*d_head "
                    "of W_Q, W_K, W_V, so the count does not grow with the number of heads."),
            Mistake(number(lambda d, h, k, v, bias: d * (d + k + v) + (3 * d if bias else 0)),
                    "you left out the output projection W_O (d_model x d_model, plus its bias)."),
            Mistake(number(lambda d, h, k, v, bias: d * (2 * d + k + v) + 4 * d),
                    "with bias=False there are no biases."),
        ],
    )
