"""Checkers for notebook 09 (a real pretrained model): find the previous-token heads by a score,
and measure each head's entropy against its ``ln n`` ceiling on real tokens only.

Both exercises take every head's weights of a padded batch, ``weights (L, b, h, n, n)``, and
``mask (b, n)`` (True = a real token, padding on the right), and return an ``(L, h)`` grid.
The notebook stores them unsolved, as stubs that raise ``NotImplementedError``: the checker then
says only that they are not implemented yet. ``exercises.hint("real_model.previous_token", 1)``
gives hints in levels, on demand (:mod:`attn_helpers.exercises.workflow`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..lessons.real_model import entropy_grid, offset_scores
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["HINTS", "check_head_entropy", "check_previous_token_scores", "make_cases"]


def _softmax_rows(g: torch.Generator, L: int, lengths: list[int], h: int, n: int) -> torch.Tensor:
    """``(L, b, h, n, n)`` weights as the model makes them: every row (padding queries too) is a
    distribution over the real keys of its sentence; some rows are sharp, some flat."""
    scores = torch.randn(L, len(lengths), h, n, n, generator=g) * 3
    real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]      # (b, n)
    scores = scores.masked_fill(~real[None, :, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def make_cases(seed: int) -> list[dict]:
    """Seeded cases: padded batches of several lengths, and one sentence with no padding."""
    g = seeded(seed)
    cases = []
    for L, lengths, h, n in [(2, [6, 4], 3, 6), (1, [5, 2, 3], 2, 5), (3, [4], 4, 4),
                             (2, [7, 3], 2, 8)]:
        mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
        cases.append({"weights": _softmax_rows(g, L, lengths, h, n), "mask": mask})
    return cases


# --- exercise 1: previous-token scores ---------------------------------------------------------


def _real_queries(mask, first: int) -> torch.Tensor:
    valid = mask.clone()
    valid[:, :first] = False
    return valid[None, :, None, :].float()                         # (1, b, 1, n)


def _mean(x, valid):
    return (x * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def _diagonal(weights, offset):
    n = weights.shape[-1]
    i = torch.arange(max(0, -offset), min(n, n - offset))
    out = torch.zeros(weights.shape[:-1])
    out[..., i] = weights[..., i, i + offset]
    return out                                                     # (L, b, h, n)


HINTS: dict[str, tuple[str, str, str]] = {
    "previous_token": (
        "A previous-token head puts (almost) all the weight of query i on key i - 1. Its score "
        "is the mean of weights[..., i, i - 1] over the queries that have a previous real token.",
        "i = torch.arange(1, n) and weights[..., i, i - 1] pick the entries just left of the "
        "diagonal: shape (L, b, h, n - 1), one per query 1..n-1. Which of these queries are real? "
        "mask[:, 1:] (b, n - 1).",
        "valid = mask[:, 1:][None, :, None, :].float() (1, b, 1, n - 1); then "
        "(on_previous * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3)) averages over sentences "
        "and queries at once, leaving (L, h).",
    ),
    "head_entropy": (
        "Each row i of a head is a distribution over keys: H_i = -sum_j p_ij ln p_ij (nats). "
        "Its largest possible value is ln n, n the sentence's number of real tokens. Average "
        "H_i, and H_i / ln n, over the real queries only.",
        "torch.xlogy(p, p) is p ln p with 0 ln 0 = 0 (padding keys have weight exactly 0): "
        "H = -torch.xlogy(weights, weights).sum(-1) has shape (L, b, h, n). The ceiling: "
        "torch.log(mask.sum(1).float()) (b,), broadcast as [None, :, None, None].",
        "valid = mask[None, :, None, :].float(); mean = lambda x: (x * valid).sum(dim=(1, 3)) / "
        "valid.sum(dim=(1, 3)); return mean(H), mean(H / ln_n).",
    ),
}


@exercise("real_model.previous_token", "find the previous-token heads by a score",
          hints=HINTS["previous_token"])
def check_previous_token_scores(candidate: Callable) -> CheckResult:
    """Exercise: ``previous_token_scores(weights, mask) -> (L, h)``, the mean weight that a real
    query ``i >= 1`` puts on key ``i - 1`` (query 0 has no previous token)."""

    def shifted(offset, first, valid_mask=None):
        def produce(w, m):
            return _mean(_diagonal(w, offset), _real_queries(m if valid_mask is None else
                                                            valid_mask(m), first))
        return produce

    def everyone(m):
        return torch.ones_like(m)

    return check_function(
        candidate, lambda w, m: offset_scores(w, m, -1), make_cases(91),
        what="previous_token_scores", output_names=("the scores",),
        mistakes=[
            Mistake(shifted(+1, 0),
                    "you read a[i, i + 1], the weight on the NEXT token. The previous token of "
                    "query i is key i - 1: weights[..., i, i - 1]."),
            Mistake(shifted(0, 0),
                    "you read the diagonal a[i, i]: the weight a token puts on itself. The "
                    "previous token is one step to the left: weights[..., i, i - 1]."),
            Mistake(lambda w, m: shifted(-1, 1)(w.transpose(-1, -2), m),
                    "you read weights[..., i - 1, i]: what query i - 1 puts on key i, the NEXT "
                    "token. Rows are queries and columns keys: the previous token of query i is "
                    "weights[..., i, i - 1]."),
            Mistake(shifted(-1, 1, everyone),
                    "you also averaged over padding queries: their rows mean nothing. Average only "
                    "over the real queries (mask True), from the second one on."),
            Mistake(shifted(-1, 0),
                    "the first token ([CLS], i = 0) has no previous token: leave it out of the "
                    "mean instead of counting it as 0."),
            Mistake(lambda w, m: shifted(-1, 1)(w, m) * _real_queries(m, 1).sum(dim=(1, 3)),
                    "you summed over the queries: divide by how many real queries you counted, "
                    "so that a perfect previous-token head scores 1."),
        ],
    )


# --- exercise 2: entropy against ln n ----------------------------------------------------------


@exercise("real_model.head_entropy", "each head's entropy against ln n",
          hints=HINTS["head_entropy"])
def check_head_entropy(candidate: Callable) -> CheckResult:
    """Exercise: ``head_entropy(weights, mask) -> (entropy (L, h), fraction (L, h))``: the mean,
    over real queries, of each row's entropy in nats, and of that entropy divided by ``ln n``,
    ``n`` the number of real tokens of the row's sentence."""

    def rows(w, log=torch.log, dim=-1):
        return -(w * log(w.clamp_min(1e-30))).sum(dim=dim)         # (L, b, h, n)

    def ceiling(m):
        return torch.log(m.sum(dim=1).float())[None, :, None, None]  # (1, b, 1, 1)

    def made(entropy, fraction_of, queries):
        def produce(w, m):
            H = entropy(w)
            valid = queries(m)[None, :, None, :].float()
            return _mean(H, valid), _mean(fraction_of(H, m), valid)
        return produce

    def real(m):
        return m

    def by_ceiling(H, m):
        return H / ceiling(m)

    def padded_ceiling(H, m):
        return H / math.log(m.shape[1])

    def ratio_of_means(w, m):
        valid = m[None, :, None, :].float()
        H = rows(w)
        n = m.sum(dim=1).float()
        return _mean(H, valid), _mean(H, valid) / (n * n.log()).sum().div(n.sum())

    return check_function(
        candidate, entropy_grid, make_cases(92), what="head_entropy",
        output_names=("the entropy", "the fraction of ln n"),
        nan_hint="0 * log 0 counts as 0: padding keys have weight exactly 0, and 0 * log(0) is "
                 "0 * (-inf) = nan in floating point. Use torch.xlogy(p, p), or clamp p before "
                 "the log.",
        mistakes=[
            Mistake(made(lambda w: rows(w, dim=-2), by_ceiling, real),
                    "the entropy of a query is over its row: sum over the keys (the last axis, "
                    "dim=-1), not over the queries."),
            Mistake(made(lambda w: -rows(w), by_ceiling, real),
                    "entropy is H = -sum p log p: you left out the minus sign (your entropies are "
                    "negative)."),
            Mistake(made(lambda w: rows(w, torch.log2), by_ceiling, real),
                    "the course measures entropy in nats: use the natural log (torch.log), not "
                    "log2."),
            Mistake(made(rows, by_ceiling, torch.ones_like),
                    "you averaged over padding queries too: their rows mean nothing. Average only "
                    "over the real queries (mask True)."),
            Mistake(made(rows, padded_ceiling, real),
                    "the ceiling is ln of the number of REAL tokens of that sentence "
                    "(mask.sum(1)), not ln of the padded length n: a row can only spread over "
                    "real keys."),
            Mistake(ratio_of_means,
                    "divide each row's entropy by its own sentence's ln n, then average; the mean "
                    "entropy divided by a mean ln n weighs long and short sentences differently."),
        ],
    )
