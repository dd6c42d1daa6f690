"""Checkers for notebook 09: previous-token scores per sentence; norms ||a_ij f_h(x_j)||."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise


def _softmax_rows(g: torch.Generator, L: int, lengths: list[int], h: int, n: int) -> torch.Tensor:
    """``(L, b, h, n, n)``: every row (padding queries too) a distribution over real keys."""
    real = torch.arange(n) < torch.tensor(lengths)[:, None]               # (b, n)
    scores = torch.randn(L, len(lengths), h, n, n, generator=g) * 3
    return torch.softmax(scores.masked_fill(~real[:, None, None, :], float("-inf")), dim=-1)


# --- exercise 1: previous-token scores ---------------------------------------------------------

def _cases() -> list[dict]:  # padded batches, then one unpadded; case 1: n - 1 against query 0,
    g = seeded(91)                # L != b and h != b, so (b, L, h) and an unexpanded mask fail on shape
    return [{"weights": _softmax_rows(g, L, lengths, h, n),
             "mask": torch.arange(n) < torch.tensor(lengths)[:, None]}
            for L, lengths, h, n in [(3, [6, 4], 3, 6), (1, [5, 2, 3], 2, 5), (3, [4], 4, 4),
                                     (2, [7, 3], 2, 8)]]


def _pooled(x, valid):                               # mean of x (L, b, h, m) where valid (b, m)
    valid = valid[None, :, None, :].float()
    return (x * valid).sum(dim=3) / valid.sum(dim=3)


def _diagonal(w, offset):                            # a[i, i + offset] (L, b, h, n), 0 where no key
    return F.pad(w.diagonal(offset, dim1=-2, dim2=-1), (max(0, -offset), max(0, offset)))


def previous_token_reference(weights, mask):
    """``(L, b, h)``: in each sentence, the mean weight on key ``i - 1`` over real queries ``i >= 1``."""
    return _pooled(weights.diagonal(-1, dim1=-2, dim2=-1), mask[:, 1:])


def _summed(w, m):                                   # over the real queries i >= 1, not divided
    return (_diagonal(w, -1) * (m & (torch.arange(m.shape[1]) > 0))[None, :, None, :]).sum(dim=3)


_NO_AXES = ("the mask is (b, n - 1) but the entries are (L, b, h, n - 1): index it with None "
            "where the layer and head axes go (and .float() to multiply).")
PREVIOUS_MISTAKES = [
    Mistake(lambda w, m: _pooled(w.diagonal(offset=1, dim1=-2, dim2=-1), m[:, :-1]), "you took "
            "w.diagonal(offset=+1), a[i, i + 1], the NEXT token, above the diagonal: use offset=-1."),
    Mistake(lambda w, m: _pooled(_diagonal(w, 1), m),
            "you read a[i, i + 1], the NEXT token: the previous is key i - 1."),
    Mistake(lambda w, m: _pooled(_diagonal(w, 0), m), "you read the diagonal a[i, i], the weight "
            "a token puts on itself: the previous token is one column to the left."),
    Mistake(lambda w, m: _pooled(torch.tril(w, -1).sum(-1)[..., 1:], m[:, 1:]), "you summed the "
            "weight on ALL previous tokens (tril): the previous token is key i - 1 alone."),
    Mistake(lambda w, m: previous_token_reference(w.mT, m), "you read a[i - 1, i], the NEXT token "
            "(row and column swapped). Rows are queries and columns keys."),
    Mistake(lambda w, m: _pooled(_diagonal(w, -1)[..., 1:], torch.ones_like(m[:, 1:])),
            "you also averaged over padding queries: average only over the real queries i >= 1."),
    Mistake(lambda w, m: _pooled(_diagonal(w, -1), m), "the first token ([CLS], i = 0) has no "
            "previous token: leave it out of the mean instead of counting it as 0."),
    Mistake(lambda w, m: _pooled(_diagonal(w, -1)[..., 1:], m[:, :-1]), "you took each query's "
            "validity from its key (token i - 1): query i counts where token i is real."),
    Mistake(lambda w, m: _pooled(_diagonal(w, -1)[..., 2:], m[:, 2:]), "you started at query i = 2: "
            "query 1 has a previous token too (key 0, [CLS]). Start at i = 1."),
    Mistake(lambda w, m: _pooled(_diagonal(w, -1)[..., 1:], F.pad(m[:, 2:], (0, 1))), "you left out "
            "the last real query, [SEP]: it is a real token, and its previous token is real. Count it."),
    Mistake(lambda w, m: _pooled(w.roll(1, dims=-1).diagonal(dim1=-2, dim2=-1), m), "query 0 "
            "([CLS]) was counted: key -1 is the LAST key, wrapped around. Start at query i = 1."),
    Mistake(lambda w, m: _pooled(torch.cat([w[..., :1, 0], w.diagonal(-1, -2, -1)], dim=-1), m),
            "query 0 ([CLS]) was counted, reading itself (key i - 1 clamped at 0): start at i = 1."),
    Mistake(lambda w, m: _summed(w, m).sum(dim=1) / m[:, 1:].sum(), "you pooled over the "
            "sentences too, as 4.3 does: keep one score per sentence, an (L, b, h) grid."),
    Mistake(lambda w, m: previous_token_reference(w, m).mean(1, keepdim=True).expand(-1, len(m), -1),
            "every sentence got the same score, the batch's mean: keep each sentence's own mean."),
    Mistake(lambda w, m: _summed(w, m) / (w.shape[-1] - 1), "you divided by n - 1, every query "
            "i >= 1 of the padded sentence: divide by the number of its REAL queries i >= 1."),
    Mistake(_summed, "you summed over the queries: divide by how many you counted."),
]


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
    "valid = ...                                     # (1, b, 1, n - 1): 1.0 at real queries i >= 1\n"
    "return ...                                      # (L, b, h): sum where valid, / their count"))
def check_previous_token_scores(candidate: Callable) -> CheckResult:
    """Exercise: ``previous_token_scores(weights, mask) -> (L, b, h)``."""
    return check_function(
        candidate, previous_token_reference, _cases(), what="previous_token_scores",
        output_names=("the scores",), mistakes=PREVIOUS_MISTAKES,
        error_hints=[("must match the size of tensor", _NO_AXES), ("Dimension out of range", _NO_AXES)])


# --- exercise 2: value-weighted norms --------------------------------------------------------

def _norm_cases() -> list[dict]:  # weights, values, W_O_weight (d, h * d_head); d once not h * d_head
    g = seeded(93)
    return [{"weights": _softmax_rows(g, 1, lengths, h, n)[0],                # (b, h, n, n)
             "values": torch.randn(len(lengths), h, n, d_head, generator=g),
             "W_O_weight": torch.randn(d, h * d_head, generator=g)}
            for lengths, h, n, d_head, d in [([5, 3], 3, 5, 4, 12), ([4], 2, 4, 3, 6),
                                             ([6, 2, 4], 4, 6, 2, 8), ([3, 3], 2, 3, 4, 5)]]


def _blocks(W_O, h, d_head):                         # (h, d_head, d): head h's columns, transposed
    return W_O.view(len(W_O), h, d_head).permute(1, 2, 0)


def _f(values, W_O, blocks=_blocks):                 # f_h(x_j) = v_j W_O^(h): (b, h, n, d)
    return torch.einsum("bhjk,hkd->bhjd", values, blocks(W_O, *values.shape[1::2]))


def _norms(w, v, W, blocks=_blocks, norm=lambda f: f.norm(dim=-1)):  # the mistakes: other blocks, norm
    return w * norm(_f(v, W, blocks))[:, :, None, :]


def value_norms_reference(weights, values, W_O_weight):
    """``(b, h, n, n)``: ``a_ij ||f_h(x_j)||``, ``f_h(x_j)`` the value through head h's columns."""
    return _norms(weights, values, W_O_weight)


def _merged(w, v, W):                                # heads merged, the whole W_O: (b, n, d)
    b, h, n, d_head = v.shape
    return w * (v.transpose(1, 2).reshape(b, n, h * d_head) @ W.T).norm(dim=-1)[:, None, None, :]


_TRANSPOSE = ("a matrix product did not fit. W_O_weight is (d, h * d_head): head h's columns "
              "W_O_weight[:, h*d_head:(h+1)*d_head] are (d, d_head); transpose them before v_j @ them.")
NORMS_MISTAKES = [
    Mistake(_merged, "you merged the heads and applied the whole W_O, one norm for all heads: "
            "measure each head on its own, through its block of W_O only."),
    Mistake(lambda w, v, W: w * v.norm(dim=-1)[:, :, None, :], "you took the norm of v_j itself: "
            "project it through the head's block of W_O first, f_h(x_j) = v_j W_O^(h)."),
    Mistake(lambda w, v, W: _norms(w, v, W, lambda W, h, dh: W[: h * dh].view(h, dh, -1)),  # rows
            "you sliced W_O_weight's rows: it is (out, in) = (d, h * d_head), so head h owns the "
            "COLUMNS h*d_head .. (h+1)*d_head - 1."),
    *(Mistake(lambda w, v, W, o=o: _norms(w, v, W, norm=lambda f: v.norm(dim=-1) * torch.linalg.
                                          matrix_norm(_blocks(W, *v.shape[1::2]), ord=o)[:, None]),
              "you multiplied the two norms, ||v_j|| ||W_O^(h)||: by Cauchy-Schwarz that is only an "
              "upper bound. Project first, f_h(x_j) = v_j W_O^(h), then take its norm.")
      for o in ("fro", 2)),
    Mistake(lambda w, v, W: _norms(w, v, W, lambda W, h, dh: W[:, :dh].T.expand(h, dh, len(W))),
            "every head went through the first head's columns of W_O_weight."),
    Mistake(lambda w, v, W: _norms(w, v, W, lambda W, h, dh: W.view(-1, dh, h).permute(2, 1, 0)),
            "you split W_O_weight's columns as (d_head, h), so head h got every h-th column: head h "
            "owns one block of d_head columns, W_O_weight.view(d, h, d_head)."),
    Mistake(lambda w, v, W: _norms(torch.ones_like(w), v, W),
            "you returned ||f_h(x_j)|| without the attention weight: multiply by a_ij."),
    Mistake(lambda w, v, W: _norms(w, v, W, norm=lambda f: f.pow(2).sum(dim=-1)),
            "you returned the squared norm: take the square root."),
    Mistake(lambda w, v, W: _norms(w, v, W, norm=lambda f: f.abs().sum(dim=-1)),
            "you took the L1 norm, a sum of |entries|: take the Euclidean length, the default norm."),
    Mistake(lambda w, v, W: value_norms_reference(w, v, W) / v.shape[-1] ** 0.5,
            "you divided by sqrt(d_head): that scale belongs to the scores QK^T, not to f_h(x_j)."),
    Mistake(lambda w, v, W: (x := value_norms_reference(w, v, W)) / x.sum(dim=-1, keepdim=True),
            "you divided each row by its sum: those are section 4.4's shares; return the norms."),
    Mistake(lambda w, v, W: w * _f(v, W).norm(dim=-1)[:, :, :, None], "you scaled row i by the "
            "norm of the QUERY's f(x_i): key j contributes f(x_j), so the norm varies along the keys."),
    Mistake(lambda w, v, W: (w @ _f(v, W)).norm(dim=-1)[..., None].expand_as(w), "you took the norm "
            "of the weighted SUM, the head's whole output for query i: the exercise wants each key's "
            "term, ||a_ij f_h(x_j)||."),
    Mistake(lambda w, v, W: _norms(w.mT, v, W), "you used a_ji, the weights transposed: rows are "
            "queries, so query i's weight on key j is weights[..., i, j]."),
    *(Mistake(lambda w, v, W, s=s: s((w[..., None] * _f(v, W)[:, :, None]).sum(1).norm(dim=-1), w),
              "you summed the heads' terms before the norm, ||sum_h a_ij f_h(x_j)||: that is Kobayashi "
              "et al.'s per-layer measure. Here each head gets its own, a_ij ||f_h(x_j)||.")
      for s in (lambda x, w: x, lambda x, w: x[:, None], lambda x, w: x[:, None].expand_as(w))),
    Mistake(lambda w, v, W: w * _f(v, W).norm(dim=(1, 3))[:, None, None, :], "you took one norm "
            "over the heads and d together: each head has its own f_h(x_j); take the norm over d only."),
]


@exercise("real_model.value_norms", "value-weighted norms ||a_ij f(x_j)|| (Kobayashi et al.)",
          hints=(
    "Head h adds sum_j a_ij f_h(x_j) to token i, f_h(x_j) being head h's value v_j times head h's "
    "part of W_O. Its norm times a_ij is what key j contributes, for every (b, h, i, j).",
    "W_O_weight is nn.Linear's weight, W_O transposed: (out, in) = (d, h * d_head). Give the heads "
    "an axis of their own in it. ||a_ij f_h(x_j)|| = a_ij ||f_h(x_j)||: how many norms is that, "
    "broadcast over which axis?",
    "b, h, n, d_head = values.shape\n"
    "W_h = ...                                  # (h, d_head, d): head h's columns of W_O_weight\n"
    "f = ...                                    # (b, h, n, d): f_h(x_j), summed over d_head\n"
    "return ...                                 # (b, h, n, n): a_ij ||f_h(x_j)||"))
def check_value_norms(candidate: Callable) -> CheckResult:
    """Exercise: ``value_norms(weights (b, h, n, n), values (b, h, n, d_head), W_O_weight) -> ...``."""
    return check_function(
        candidate, value_norms_reference, _norm_cases(), what="value_norms",
        output_names=("the norms",), mistakes=NORMS_MISTAKES,
        error_hints=[("first two dimensions of batch2", _TRANSPOSE),
                     ("cannot be multiplied", _TRANSPOSE),
                     ("must match the size of tensor", "two tensors did not broadcast. f_h(x_j) is "
                      "(b, h, n, d): its norm runs over the last axis, d, and leaves one length per "
                      "key j, (b, h, n). That length scales column j of a_ij.")])
