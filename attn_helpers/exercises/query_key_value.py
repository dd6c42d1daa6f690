"""Checkers for notebook 02 (query, key, value): softmax, attention, entropy."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from .core import CheckResult, Mistake, check_function, seeded

__all__ = ["check_softmax", "check_attention", "check_entropy"]


def _softmax_cases() -> list[dict]:
    g = seeded(2)
    cases = [{"x": torch.randn(shape, generator=g)} for shape in [(5,), (3, 4), (2, 3, 6)]]
    cases.append({"x": torch.zeros(2, 4)})
    cases.append({"x": torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1000.0, -999.0]])})
    cases.append({"x": 50 * torch.randn(4, 7, generator=g)})
    return cases


def check_softmax(softmax: Callable) -> CheckResult:
    """Exercise: ``softmax(x)`` over the last dimension, stable for large logits."""

    return check_function(
        softmax, lambda x: torch.softmax(x.double(), -1).to(x.dtype), _softmax_cases(),
        what="softmax", output_names=("softmax(x)",),
        mistakes=[
            Mistake(lambda x: torch.softmax(x, 0),
                    "you normalised over the first dimension; each *row* (the last dimension, "
                    "dim=-1) must sum to one."),
        ],
        nan_hint="exp(1000) overflows to inf, and inf/inf is NaN. Subtract each row's maximum "
                 "before exp: softmax(x) = softmax(x - max(x)), because the constant cancels in "
                 "the ratio.",
    )


def _attention_cases() -> list[dict]:
    g = seeded(3)
    cases = []
    for batch, n_q, n_k, d_k, d_v in [((), 3, 4, 8, 5), ((2,), 5, 5, 16, 4), ((2, 2), 4, 6, 4, 3)]:
        cases.append({
            "q": torch.randn(*batch, n_q, d_k, generator=g),
            "k": torch.randn(*batch, n_k, d_k, generator=g),
            "v": torch.randn(*batch, n_k, d_v, generator=g),
            "mask": None,
        })
    q, k, v = (torch.randn(6, 8, generator=g) for _ in range(3))
    cases.append({"q": q, "k": k, "v": v, "mask": torch.ones(6, 6, dtype=torch.bool).tril()})
    return cases


def check_attention(attention: Callable) -> CheckResult:
    """Exercise: ``attention(q, k, v, mask=None) -> output``, scaled dot-product attention with
    an optional boolean mask (True = may attend)."""

    def reference(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, mask)[0]

    def with_scale(scale):
        return lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, mask, scale=scale(q))[0]

    def wrong_dim(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-2) @ v

    def inverted_mask(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, None if mask is None else ~mask)[0]

    return check_function(
        attention, reference, _attention_cases(), what="attention", output_names=("the output",),
        mistakes=[
            Mistake(with_scale(lambda q: 1.0),
                    "the scores were not scaled: divide q @ k^T by sqrt(d_k) before the softmax."),
            Mistake(with_scale(lambda q: 1.0 / q.shape[-1]),
                    "you divided by d_k; the scale is 1/sqrt(d_k)."),
            Mistake(wrong_dim, "the softmax ran over the queries (dim=-2); each query's weights "
                               "over the keys (dim=-1) must sum to one."),
            Mistake(inverted_mask, "the mask is inverted: True means 'may attend', so fill the "
                                   "scores with -inf where the mask is False (~mask)."),
        ],
        nan_hint="NaN comes from a softmax over a row whose scores are all -inf. A causal mask "
                 "leaves every query at least itself, unless the mask is inverted: True means "
                 "'may attend', so fill the scores with -inf where the mask is False (~mask).",
    )


def _entropy_cases() -> list[dict]:
    g = seeded(4)
    cases = [{"weights": torch.softmax(torch.randn(shape, generator=g), -1)}
             for shape in [(6,), (3, 5), (2, 2, 4)]]
    cases.append({"weights": torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])})
    return cases


def check_entropy(entropy: Callable) -> CheckResult:
    """Exercise: ``entropy(weights)`` in nats over the last dimension, with ``0 ln 0 = 0``."""

    def reference(weights):
        return torch.special.entr(weights).sum(-1)

    return check_function(
        entropy, reference, _entropy_cases(), what="entropy", output_names=("the entropy",),
        mistakes=[
            Mistake(lambda weights: reference(weights) / math.log(2),
                    "that is the entropy in bits (log base 2); use the natural log for nats."),
            Mistake(lambda weights: -reference(weights),
                    "the sign is flipped: H = -sum_j a_j ln a_j is never negative."),
        ],
        nan_hint="0 * ln 0 is NaN in floating point, but its limit is 0: a key with zero weight "
                 "adds nothing. Use torch.where(weights > 0, ...) or torch.special.entr.",
    )
