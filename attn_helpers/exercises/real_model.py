"""Checkers for notebook 09: every head's previous-token score in each sentence of a padded batch,
pooled over that sentence's real queries, and Kobayashi et al.'s value-weighted norms
``||a_ij f_h(x_j)||``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_previous_token_scores", "check_value_norms", "previous_token_reference",
           "value_norms_reference"]


def _softmax_rows(g: torch.Generator, L: int, lengths: list[int], h: int, n: int) -> torch.Tensor:
    """``(L, b, h, n, n)``: every row (padding queries too) a distribution over real keys."""
    scores = torch.randn(L, len(lengths), h, n, n, generator=g) * 3
    real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]      # (b, n)
    scores = scores.masked_fill(~real[None, :, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def make_cases(seed: int) -> list[dict]:
    """Padded batches of several lengths, and one sentence with no padding. In the first case no
    sentence has ``n - 1`` real tokens, so dividing by ``n - 1`` and counting query 0 differ."""
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


def _mean(x, valid):                                               # (L, b, h): over the queries
    return (x * valid).sum(dim=3) / valid.sum(dim=3)


def _diagonal(weights, offset):
    n = weights.shape[-1]
    i = torch.arange(max(0, -offset), min(n, n - offset))
    out = torch.zeros(weights.shape[:-1])
    out[..., i] = weights[..., i, i + offset]
    return out                                                     # (L, b, h, n)


def previous_token_reference(weights, mask):
    """``(L, b, h)``: in each sentence, the mean weight on key ``i - 1`` over its real queries
    ``i >= 1``."""
    return _mean(_diagonal(weights, -1), _real_queries(mask, 1))


@exercise("real_model.previous_token", "previous-token scores, sentence by sentence", hints=(
    "A previous-token head puts (almost) all the weight of query i on key i - 1, just left of "
    "the diagonal. Its score in one sentence is the mean of that entry over the sentence's real "
    "queries i >= 1: one score per layer, sentence and head.",
    "The entries (i, i - 1) form one diagonal of each (n, n) matrix: indexing the last two axes "
    "with two index tensors picks them all. Which of mask's columns are those queries, and "
    "which axes must it gain to broadcast?",
    "n = weights.shape[-1]\n"
    "i = torch.arange(1, n)\n"
    "on_previous = ...                               # (L, b, h, n - 1): row i, column i - 1\n"
    "valid = ...                                     # (1, b, 1, n - 1): real queries i >= 1\n"
    "return pooled(on_previous, valid)               # (L, b, h): the stub's mean over queries"))
def check_previous_token_scores(candidate: Callable) -> CheckResult:
    """Exercise: ``previous_token_scores(weights, mask) -> (L, b, h)``."""

    def shifted(offset, first, valid_mask=None):
        def produce(w, m):
            return _mean(_diagonal(w, offset), _real_queries(m if valid_mask is None else
                                                            valid_mask(m), first))
        return produce

    def query_0_reads(key):                              # query 0 counted, reading key `key`
        def produce(w, m):
            i = torch.arange(w.shape[-1])
            return _mean(w[..., i, torch.where(i == 0, key, i - 1)], _real_queries(m, 0))
        return produce

    def key_real(m):                                     # (1, b, 1, n - 1): KEY i - 1 is real
        return m[:, :-1][None, :, None, :].float()

    def over_sentences(w, m):                            # 4.3's score: sentences pooled too
        valid = _real_queries(m, 1)                                  # (1, b, 1, n)
        return (_diagonal(w, -1) * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))   # (L, h)

    def batch_mean(w, m):                                # per-sentence scores, then their mean
        return shifted(-1, 1)(w, m).mean(dim=1, keepdim=True).expand(-1, m.shape[0], -1)

    def by_n_minus_1(w, m):                              # every query i >= 1 of the padded row
        return (_diagonal(w, -1) * _real_queries(m, 1)).sum(dim=3) / (w.shape[-1] - 1)

    no_axes = ("the mask is (b, n - 1) but the entries are (L, b, h, n - 1): index it with None "
               "where the layer and head axes go (and .float() to multiply).")
    return check_function(
        candidate, previous_token_reference, make_cases(91),
        what="previous_token_scores", output_names=("the scores",),
        error_hints=[("must match the size of tensor", no_axes), ("Dimension out of range", no_axes)],
        mistakes=[
            Mistake(lambda w, m: _mean(w.diagonal(offset=1, dim1=-2, dim2=-1), key_real(m)),
                    "you took w.diagonal(offset=+1), a[i, i + 1]: the NEXT token, the diagonal "
                    "ABOVE the main one. The previous token is offset=-1."),
            Mistake(shifted(+1, 0), "you read a[i, i + 1], the NEXT token: the previous is key i - 1."),
            Mistake(shifted(0, 0),
                    "you read the diagonal a[i, i], the weight a token puts on itself: the "
                    "previous token is one column to the left."),
            Mistake(lambda w, m: _mean(torch.tril(w, -1).sum(-1), _real_queries(m, 1)),
                    "you summed the weight on ALL previous tokens (tril): the previous token is "
                    "key i - 1 alone."),
            Mistake(lambda w, m: shifted(-1, 1)(w.transpose(-1, -2), m),
                    "you read a[i - 1, i], the NEXT token (row and column swapped). Rows are "
                    "queries and columns keys."),
            Mistake(shifted(-1, 1, torch.ones_like),
                    "you also averaged over padding queries: average only over the real "
                    "queries i >= 1."),
            Mistake(shifted(-1, 0),
                    "the first token ([CLS], i = 0) has no previous token: leave it out of the "
                    "mean instead of counting it as 0."),
            Mistake(lambda w, m: _mean(_diagonal(w, -1)[..., 1:], key_real(m)),  # the KEY's validity
                    "you took each query's validity from its key (token i - 1), so the first "
                    "padding query was counted: query i counts where token i is real."),
            Mistake(query_0_reads(-1),
                    "query 0 ([CLS]) was counted: it has no previous token (key -1 is the LAST "
                    "key, wrapped around). Start at query i = 1."),
            Mistake(query_0_reads(0),
                    "query 0 ([CLS]) was counted, reading itself (key i - 1 clamped at 0): it has "
                    "no previous token. Start at query i = 1."),
            Mistake(over_sentences,
                    "you pooled over the sentences too, as 4.3 does: keep one score per sentence, "
                    "an (L, b, h) grid, and take the mean over each sentence's queries only."),
            Mistake(batch_mean,
                    "every sentence got the same score, the mean over the batch: keep each "
                    "sentence's own mean over its queries."),
            Mistake(by_n_minus_1,
                    "you divided by n - 1, every query i >= 1 of the padded sentence: divide by "
                    "the number of its REAL queries i >= 1."),
            Mistake(lambda w, m: shifted(-1, 1)(w, m) * _real_queries(m, 1).sum(dim=3),
                    "you summed over the queries: divide by how many you counted."),
        ],
    )


# --- exercise 2: value-weighted norms --------------------------------------------------------

def make_norm_cases(seed: int) -> list[dict]:
    """Weights, values and ``W_O (d, h * d_head)``, ``d`` once unequal to ``h * d_head``."""
    g = seeded(seed)
    cases = []
    for lengths, h, n, d_head, d in [([5, 3], 3, 5, 4, 12), ([4], 2, 4, 3, 6), ([6, 2, 4], 4, 6, 2, 8),
                                     ([3, 3], 2, 3, 4, 5)]:
        weights = _softmax_rows(g, 1, lengths, h, n)[0]                # (b, h, n, n)
        values = torch.randn(len(lengths), h, n, d_head, generator=g)
        cases.append({"weights": weights, "values": values,
                      "W_O": torch.randn(d, h * d_head, generator=g)})
    return cases


def _f(values, W_O, slice_of=None):
    b, h, n, d_head = values.shape
    W_h = (W_O.view(W_O.shape[0], h, d_head).permute(1, 2, 0) if slice_of is None      # (h, d_head, d)
           else slice_of(W_O, h, d_head))
    return torch.einsum("bhjk,hkd->bhjd", values, W_h)               # (b, h, n, d)


def value_norms_reference(weights, values, W_O):
    """``(b, h, n, n)``: ``a_ij ||f_h(x_j)||``, ``f_h(x_j)`` the value through head h's columns."""
    return weights * _f(values, W_O).norm(dim=-1)[:, :, None, :]


@exercise("real_model.value_norms", "value-weighted norms ||a_ij f(x_j)|| (Kobayashi et al.)",
          hints=(
    "Head h adds sum_j a_ij f_h(x_j) to token i, f_h(x_j) being head h's value v_j times head h's "
    "part of W_O. Its norm times a_ij is what key j contributes, for every (b, h, i, j).",
    "nn.Linear stores W_O as (out, in) = (d, h * d_head): give the heads an axis of their own in "
    "W_O. ||a_ij f_h(x_j)|| = a_ij ||f_h(x_j)||: how many norms is that, broadcast over which "
    "axis?",
    "b, h, n, d_head = values.shape\n"
    "W_h = ...                                         # (h, d_head, d): head h's columns of W_O\n"
    "f = ...                                           # (b, h, n, d): f_h(x_j), summed over d_head\n"
    "return ...                                        # (b, h, n, n): a_ij ||f_h(x_j)||"))
def check_value_norms(candidate: Callable) -> CheckResult:
    """Exercise: ``value_norms(weights (b, h, n, n), values (b, h, n, d_head), W_O) -> (b, h, n, n)``."""

    def times(w, norm):                                  # a_ij * norm_j, norm (b, h, n)
        return w * norm[:, :, None, :]

    def rows_slice(W, h, d_head):                        # W_O[h*dh:(h+1)*dh, :] (rows, not columns)
        if W.shape[0] < h * d_head:                      # that code crashes here: nothing to match
            return torch.full((h, d_head, 1), float("nan"))
        return W[: h * d_head].view(h, d_head, -1)

    def merged(w, v, W):                                 # heads merged, the whole W_O: (b, n, d)
        b, h, n, d_head = v.shape
        f = v.transpose(1, 2).reshape(b, n, h * d_head) @ W.T
        return w * f.norm(dim=-1)[:, None, None, :]

    def through(slice_of):                               # W_O sliced per head another way
        return lambda w, v, W: times(w, _f(v, W, slice_of).norm(dim=-1))

    return check_function(
        candidate, value_norms_reference, make_norm_cases(93), what="value_norms",
        output_names=("the norms",),
        error_hints=[(fragment, "a matrix product did not fit. nn.Linear stores W_O as (out, in) = "
                      "(d, h * d_head), so head h's columns W_O[:, h*d_head:(h+1)*d_head] are "
                      "(d, d_head): transpose them to (d_head, d) before v_j @ them.")
                     for fragment in ("first two dimensions of batch2", "cannot be multiplied")]
                    + [("must match the size of tensor", "two tensors did not broadcast. f_h(x_j) "
                        "is (b, h, n, d): its norm runs over the last axis, d, and leaves one "
                        "length per key j, (b, h, n). That length scales column j of a_ij.")],
        mistakes=[
            Mistake(merged,
                    "you merged the heads and applied the whole W_O, one norm for all heads: "
                    "measure each head on its own, through its block of W_O only."),
            Mistake(lambda w, v, W: times(w, v.norm(dim=-1)),
                    "you took the norm of v_j itself: project it through the head's block of the "
                    "output projection first: the row vector f_h(x_j) = v_j W_O^(h)."),
            Mistake(through(rows_slice),
                    "you sliced W_O's rows: its weight is (out, in) = (d, h * d_head), so head "
                    "h owns the COLUMNS h*d_head .. (h+1)*d_head - 1."),
            *(Mistake(lambda w, v, W, o=o: times(w, v.norm(dim=-1) * torch.linalg.matrix_norm(
                          W.view(len(W), v.shape[1], -1).permute(1, 0, 2), ord=o)[:, None]),
                      "you multiplied the two norms, ||v_j|| ||W_O^(h)||: by Cauchy-Schwarz that is "
                      "only an upper bound. Project first, f_h(x_j) = v_j W_O^(h), then take its "
                      "norm.") for o in ("fro", 2)),
            Mistake(through(lambda W, h, d_head: W[:, :d_head].T.expand(h, d_head, len(W))),
                    "every head went through the first head's columns of W_O."),
            Mistake(through(lambda W, h, d_head: W.view(-1, d_head, h).permute(2, 1, 0)),
                    "you split W_O's columns as (d_head, h), so head h got every h-th column: "
                    "head h owns one block of d_head columns, W_O.view(d, h, d_head)."),
            Mistake(lambda w, v, W: _f(v, W).norm(dim=-1)[:, :, None, :].expand_as(w),
                    "you returned ||f_h(x_j)|| without the attention weight: multiply by a_ij."),
            Mistake(lambda w, v, W: times(w, _f(v, W).pow(2).sum(dim=-1)),
                    "you returned the squared norm: take the square root."),
            Mistake(lambda w, v, W: (lambda x: x / x.sum(dim=-1, keepdim=True))(
                        times(w, _f(v, W).norm(dim=-1))),
                    "you divided each row by its sum: those are section 4.4's shares; return "
                    "the norms themselves."),
            Mistake(lambda w, v, W: w * _f(v, W).norm(dim=-1)[:, :, :, None],
                    "you scaled row i by the norm of the QUERY's vector f(x_i): key j "
                    "contributes f(x_j), so the norm varies along the last axis."),
            Mistake(lambda w, v, W: (w @ _f(v, W)).norm(dim=-1)[..., None].expand_as(w),
                    "you took the norm of the weighted SUM, ||sum_j a_ij f_h(x_j)||, the head's "
                    "whole output for query i: the exercise wants each key's term, ||a_ij f_h(x_j)||."),
        ],
    )
