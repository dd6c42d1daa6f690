"""Checkers for notebook 05 (masking): a causal sliding-window mask, and causal attention that
does not leak the future."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, sliding_window_mask
from .core import CheckResult, Mistake, check_function, seeded

__all__ = ["check_window_mask", "check_causal_attention", "leak_report"]


def _as_float(fn: Callable) -> Callable:
    """Masks are bool; the comparison machinery wants floats. Non-bool answers are reported."""

    def wrapped(*args):
        out = fn(*args)
        if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
            raise TypeError(f"the mask must be a bool tensor (True = may attend), got dtype {out.dtype}")
        return out.double() if isinstance(out, torch.Tensor) else out

    return wrapped


def check_window_mask(window_mask: Callable) -> CheckResult:
    """Exercise: ``window_mask(n, window) -> (n, n) bool``, True where ``0 <= i - j < window``."""
    cases = [{"n": n, "window": w} for n, w in [(5, 2), (6, 1), (7, 3), (4, 4), (3, 6)]]

    def reference(n, window):
        return sliding_window_mask(n, window).double()

    return check_function(
        _as_float(window_mask), reference, cases, what="window_mask", output_names=("the mask",),
        mistakes=[
            Mistake(lambda n, w: sliding_window_mask(n, w, causal=False).double(),
                    "your window looks both ways; a causal window sees only the present and the "
                    "past: require i - j >= 0 as well."),
            Mistake(lambda n, w: sliding_window_mask(n, w + 1).double(),
                    "off by one: with window w each query sees itself and the w - 1 keys before "
                    "it, so the condition is i - j < w, not i - j <= w."),
            Mistake(lambda n, w: sliding_window_mask(n, w).T.double(),
                    "the mask is transposed: rows are queries i, columns are keys j, and a query "
                    "looks back, at keys j <= i."),
            Mistake(lambda n, w: causal_mask(n).double(),
                    "that is the plain causal mask: also hide the keys that are window or more "
                    "positions back."),
        ],
    )


def leak_report(attention: Callable, n: int = 6, d: int = 4, seed: int = 0) -> str | None:
    """``None`` if ``attention(q, k, v)`` ``(n, d) -> (n, d)`` keeps every output blind to later
    positions; else a sentence naming the first output that changed when a later token did."""
    g = seeded(seed)
    q, k, v = (torch.randn(n, d, generator=g) for _ in range(3))
    base = attention(q, k, v)
    for t in range(1, n):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for x in (q2, k2, v2):
            x[t:] = torch.randn(n - t, d, generator=g) * 3
        changed = ~torch.isclose(attention(q2, k2, v2)[:t], base[:t], atol=1e-6, equal_nan=True).all(-1)
        if changed.any():
            first = int(changed.nonzero()[0])
            return (f"the output at position {first} changed when only positions {t}..{n - 1} "
                    "changed: it sees the future.")
    return None


def check_causal_attention(causal_attention: Callable) -> CheckResult:
    """Exercise: ``causal_attention(q, k, v) -> output`` for ``(n, d)`` inputs, each position
    attending to itself and earlier positions only. First checks for leakage, then the values."""
    if not callable(causal_attention):
        return CheckResult(False, "Not yet: causal_attention is not a function.")
    try:
        leak = leak_report(causal_attention)
    except Exception as exc:  # the learner's bug, reported in words
        return CheckResult(False, f"Not yet: causal_attention raised {type(exc).__name__}: {exc}")
    if leak is not None:
        return CheckResult(False, f"Not yet: {leak}\nHint: either the mask lets queries see later "
                                  "keys (True means 'may attend': position i may see keys j <= i, "
                                  "the lower triangle, torch.ones(n, n, dtype=torch.bool).tril(), "
                                  "not triu), or the future weights were zeroed after the softmax "
                                  "without renormalising, so the future still enters through the "
                                  "softmax's denominator.")
    g = seeded(8)
    cases = [{name: torch.randn(n, d, generator=g) for name in "qkv"}
             for n, d in [(5, 4), (8, 6), (1, 3)]]

    def reference(q, k, v):
        return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[0]))[0]

    return check_function(
        causal_attention, reference, cases, what="causal_attention", output_names=("the output",),
        mistakes=[
            Mistake(lambda q, k, v: scaled_dot_product_attention(q, k, v, causal_mask(q.shape[0]),
                                                                 scale=1.0)[0],
                    "the scores were not scaled by 1/sqrt(d_k)."),
        ],
        nan_hint="a row with every key masked gives softmax(-inf, ..., -inf) = NaN. Position i "
                 "must always see itself: keep the diagonal (tril with diagonal=0).",
    )
