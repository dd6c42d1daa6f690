"""Checkers for notebook 02 (query, key, value): masked attention, written by hand.

1. ``masked_softmax(scores (..., n_q, n_k), mask) -> weights (..., n_q, n_k)``: a numerically
   stable softmax over the keys that gives masked keys (``mask`` False) exactly 0, and a row with
   no allowed key all zeros, not NaN.
2. ``masked_attention(q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask) ->
   (output (..., n_q, d_v), weights (..., n_q, n_k))``: scaled dot-product attention with a
   boolean mask (True = may attend); a fully masked query reads nothing (zeros), as
   :func:`attn_helpers.scaled_dot_product_attention` does.
3. ``entropy(weights (..., n)) -> (...)``: the entropy of each row in nats, with ``0 ln 0 = 0``.

The stored notebook calls each checker on a stub that raises ``NotImplementedError``; the
checker then says only "... is not implemented yet.". Hints come on demand, in three levels:
``exercises.hint("query_key_value.masked_attention", 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..attention import masked_softmax as _masked_softmax
from ..attention import scaled_dot_product_attention
from .core import CheckResult, Mistake, check_function, seeded
from .start_here import OVERFLOW_HINT, check_cases, size
from .workflow import exercise, hint, progress

__all__ = ["check_entropy", "check_masked_attention", "check_masked_softmax", "hint",
           "masked_attention_reference", "progress"]

FULLY_MASKED = (
    "a row whose keys are all masked is all -inf, and softmax gives 0 / 0 = NaN there. Such a "
    "query may read nothing: give it all-zero weights, e.g. multiply the weights by "
    "mask.any(dim=-1, keepdim=True), or torch.nan_to_num(weights, nan=0.0).")


def _random_mask(g: torch.Generator, *shape: int) -> torch.Tensor:
    """A boolean mask in which every row allows at least one key and forbids at least one."""
    mask = torch.rand(*shape, generator=g) < 0.5
    n_k = shape[-1]
    first = torch.randint(0, n_k, shape[:-1], generator=g)
    mask.scatter_(-1, first[..., None], True)
    mask.scatter_(-1, ((first + 1) % n_k)[..., None], False)
    return mask


# --- exercise 1: a masked, numerically stable softmax -------------------------------------------


def _softmax_cases() -> list[dict]:
    g = seeded(120)
    fully = _random_mask(g, 4, 5)
    fully[2] = False                                           # query 2 may see nothing
    return [
        {"scores": torch.randn(3, 5, generator=g), "mask": _random_mask(g, 3, 5)},
        {"scores": torch.randn(2, 4, 6, generator=g, dtype=torch.float64),
         "mask": _random_mask(g, 2, 4, 6)},
        {"scores": torch.randn(2, 2, 3, 4, generator=g), "mask": _random_mask(g, 3, 4)},  # broadcast
        {"scores": torch.randn(1, 1, generator=g), "mask": torch.ones(1, 1, dtype=torch.bool)},
        {"scores": torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1000.0, -999.0]]),
         "mask": torch.tensor([[True, True, False], [True, False, True]])},
        {"scores": torch.randn(4, 5, generator=g), "mask": fully},
        {"scores": torch.randn(size(g, 1, 3), n_q := size(g, 1, 6), n_k := size(g, 2, 9),
                               generator=g), "mask": _random_mask(g, n_q, n_k)},  # random shape
    ]


@exercise("query_key_value.masked_softmax", "a masked, numerically stable softmax", hints=(
    "Three things: a masked key must get weight exactly 0; scores of 1000 must not overflow; and "
    "a row in which every key is masked must come out as zeros, not NaN.",
    "a_ij = exp(s_ij - m_i) / sum_{k allowed} exp(s_ik - m_i) for allowed j, else 0, with m_i "
    "the largest allowed score of row i; rows with no allowed key: all 0.",
    "filled = scores.masked_fill(~mask, float('-inf'))\n"
    "weights = torch.softmax(filled, dim=-1)                    # NaN where a row is all -inf\n"
    "return torch.nan_to_num(weights, nan=0.0)"))
def check_masked_softmax(masked_softmax: Callable) -> CheckResult:
    """Exercise: ``masked_softmax(scores (..., n_q, n_k), mask) -> (..., n_q, n_k)``, ``mask``
    boolean and broadcastable to ``scores``, True = may attend."""

    def filled(s, m, value):
        return s.masked_fill(~m, value)

    return check_cases(
        masked_softmax, _masked_softmax, _softmax_cases(), what="masked_softmax",
        output_names=("the weights",),
        mistakes=[
            Mistake(lambda s, m: torch.softmax(s, -1),
                    "the mask was ignored: masked keys (mask False) must get weight exactly 0."),
            Mistake(lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), -1),
                    "the mask is inverted: True means 'may attend', so fill the scores where "
                    "the mask is False (~mask)."),
            Mistake(lambda s, m: torch.softmax(filled(s, m, 0.0), -1),
                    "masked scores were set to 0, and exp(0) = 1 still gives them weight: set "
                    "them to -inf."),
            Mistake(lambda s, m: torch.softmax(filled(s, m, float("-inf")), -2),
                    "the softmax ran over the queries (dim=-2); each query's weights over the "
                    "keys (dim=-1) must sum to one."),
            Mistake(lambda s, m: torch.softmax(s, -1) * m,
                    "zeroing the masked weights after the softmax leaves rows that no longer sum "
                    "to one: mask the scores (with -inf) before the softmax."),
            Mistake(lambda s, m: torch.softmax(filled(s, m, -1e9), -1),
                    "a row with no allowed key came out uniform over keys it may not see (a "
                    "large negative fill, or subtracting the row's maximum, makes all its "
                    "scores equal); such a row must be all zeros: multiply by "
                    "mask.any(dim=-1, keepdim=True)."),
            Mistake(lambda s, m: torch.softmax(filled(s, m, float("-inf")), -1),
                    FULLY_MASKED),
            Mistake(lambda s, m: torch.nan_to_num(s.exp() * m / (s.exp() * m).sum(-1, True)),
                    "a row of large scores came out as zeros: " + OVERFLOW_HINT),
        ],
        nan_hint=OVERFLOW_HINT,
    )


# --- exercise 2: masked attention, returning the weights too ---------------------------------


def _attention_cases() -> list[dict]:
    g = seeded(121)
    cases = []
    for batch, n_q, n_k, d_k, d_v, dtype in [((), 3, 4, 8, 5, torch.float32),
                                              ((2,), 5, 5, 16, 4, torch.float32),
                                              ((2, 3), 4, 6, 4, 3, torch.float64),  # heads
                                              ((), 1, 1, 4, 2, torch.float32)]:     # one token
        cases.append({"q": torch.randn(*batch, n_q, d_k, generator=g, dtype=dtype),
                      "k": torch.randn(*batch, n_k, d_k, generator=g, dtype=dtype),
                      "v": torch.randn(*batch, n_k, d_v, generator=g, dtype=dtype),
                      "mask": _random_mask(g, n_q, n_k) if n_k > 1 else torch.ones(1, 1).bool()})
    q, k, v = (torch.randn(2, 6, 8, generator=g) for _ in range(3))
    cases.append({"q": q, "k": k, "v": v, "mask": torch.ones(6, 6, dtype=torch.bool).tril()})
    padding = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    fully = padding[:, None, :] & padding[:, :, None]      # (2, 6, 6): padded queries see nothing
    cases.append({"q": q, "k": k, "v": v, "mask": fully})
    batch, (n_q, n_k, d_k, d_v) = size(g, 1, 3), (size(g, 2, 8) for _ in range(4))  # random shapes
    cases.append({"q": torch.randn(batch, n_q, d_k, generator=g),
                  "k": torch.randn(batch, n_k, d_k, generator=g),
                  "v": torch.randn(batch, n_k, d_v, generator=g),
                  "mask": _random_mask(g, batch, n_q, n_k)})
    return cases


def masked_attention_reference(q, k, v, mask):
    """``(output (..., n_q, d_v), weights (..., n_q, n_k))``; fully masked queries get zeros."""
    return scaled_dot_product_attention(q, k, v, mask)


def _attention(*, scale=None, dim=-1, fill=float("-inf"), invert=False, mix="v", zero_empty=True):
    """A learner's attention with one thing changed, for the known mistakes."""
    def attention(q, k, v, mask):
        factor = 1 / math.sqrt(q.shape[-1]) if scale is None else scale(q, v)
        scores = q @ k.transpose(-2, -1) * factor
        scores = scores.masked_fill(mask if invert else ~mask, fill)
        weights = torch.softmax(scores, dim=dim)
        if zero_empty and fill == float("-inf"):
            weights = torch.nan_to_num(weights, nan=0.0)
        return weights @ (v if mix == "v" else k), weights
    return attention


@exercise("query_key_value.masked_attention", "masked attention, returning its weights", hints=(
    "Four steps: scores q . k_j, scaled by 1/sqrt(d_k); masked keys get -inf; a softmax over the "
    "keys; the weighted sum of the values. A query with no allowed key must read nothing (zeros).",
    "A = softmax(Q K^T / sqrt(d_k) + M), with M = 0 where allowed and -inf where not (rows with "
    "no allowed key: A = 0);  O = A V.",
    "scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5        # (..., n_q, n_k)\n"
    "weights = masked_softmax(scores, mask)                          # exercise 1\n"
    "return weights @ v, weights                                     # (..., n_q, d_v), weights"))
def check_masked_attention(masked_attention: Callable) -> CheckResult:
    """Exercise: ``masked_attention(q, k, v, mask) -> (output, weights)``; ``q (..., n_q, d_k)``,
    ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)``, ``mask`` boolean broadcastable to
    ``(..., n_q, n_k)``, True = may attend; fully masked queries get zero weights and output."""
    return check_cases(
        masked_attention, masked_attention_reference, _attention_cases(), what="masked_attention",
        output_names=("the output", "the weights"),
        mistakes=[
            Mistake(_attention(scale=lambda q, v: 1.0),
                    "the scores were not scaled: divide q @ k^T by sqrt(d_k) before the softmax."),
            Mistake(_attention(scale=lambda q, v: 1 / q.shape[-1]),
                    "you divided by d_k; the scale is 1 / sqrt(d_k)."),
            Mistake(_attention(scale=lambda q, v: 1 / math.sqrt(v.shape[-1])),
                    "you scaled by sqrt(d_v), the size of the values; the scale is 1 / sqrt(d_k)."),
            *(Mistake(_attention(dim=-2, zero_empty=zero),
                      "the softmax ran over the queries (dim=-2); each query's weights over the "
                      "keys (dim=-1) must sum to one.") for zero in (True, False)),
            Mistake(_attention(invert=True),
                    "the mask is inverted: True means 'may attend', so fill the scores with -inf "
                    "where the mask is False (~mask)."),
            Mistake(_attention(fill=0.0),
                    "masked scores were set to 0, and exp(0) = 1 still gives them weight: set "
                    "them to -inf."),
            Mistake(_attention(mix="k"),
                    "the output mixes the keys; it must mix the values: output = weights @ v."),
            Mistake(_attention(fill=-1e9),
                    "a query with no allowed key came out with uniform weights over keys it may "
                    "not see (the large negative fill makes all its scores equal); it must read "
                    "nothing: zero weights, zero output."),
            Mistake(_attention(zero_empty=False), FULLY_MASKED),
        ],
        nan_hint=FULLY_MASKED,
    )


# --- exercise 3: entropy of attention rows ------------------------------------------------------


def _entropy_cases() -> list[dict]:
    g = seeded(122)
    cases = [{"weights": torch.softmax(torch.randn(shape, generator=g), -1)}
             for shape in [(6,), (4, 4), (3, 5), (2, 2, 4)]]
    cases.append({"weights": torch.softmax(torch.randn(2, 7, generator=g, dtype=torch.float64), -1)})
    cases.append({"weights": torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])})
    shape = (size(g, 1, 5), size(g, 1, 9))                                      # random shape
    cases.append({"weights": torch.softmax(2 * torch.randn(shape, generator=g), -1)})
    return cases


def _entropy_reference(weights):
    return torch.special.entr(weights).sum(-1)


@exercise("query_key_value.entropy", "the entropy of attention rows", hints=(
    "Entropy measures how spread out a row is: 0 when one key takes all the weight, ln n when "
    "all n keys share it equally. A key with weight 0 adds nothing.",
    "H = -sum_j a_j ln a_j over the last dimension, in nats (natural log), with 0 ln 0 = 0.",
    "terms = torch.where(weights > 0, weights * torch.log(weights), torch.zeros_like(weights))\n"
    "return -terms.sum(dim=-1)"))
def check_entropy(entropy: Callable) -> CheckResult:
    """Exercise: ``entropy(weights (..., n)) -> (...)`` in nats, with ``0 ln 0 = 0``."""
    ref = _entropy_reference
    return check_function(
        entropy, ref, _entropy_cases(), what="entropy", output_names=("the entropy",),
        mistakes=[
            Mistake(lambda w: ref(w) / math.log(2),
                    "that is the entropy in bits (log base 2); use the natural log for nats."),
            Mistake(lambda w: ref(w) / math.log(10),
                    "that is log base 10; use the natural log (torch.log) for nats."),
            Mistake(lambda w: -ref(w),
                    "the sign is flipped: H = -sum_j a_j ln a_j is never negative."),
            Mistake(lambda w: ref(w) / w.shape[-1],
                    "you averaged over the keys; the entropy is the sum over j."),
            Mistake(lambda w: torch.special.entr(w).sum(0),
                    "you summed over the first dimension; sum over the keys (dim=-1)."),
            Mistake(lambda w: torch.where(w > 0, -torch.log(w), torch.zeros_like(w)).sum(-1),
                    "each term is -a_j ln a_j: the log must be weighted by a_j."),
        ],
        nan_hint="0 * ln 0 is NaN in floating point, but its limit is 0: a key with zero weight "
                 "adds nothing. Use torch.where(weights > 0, ...) or torch.special.entr.",
    )
