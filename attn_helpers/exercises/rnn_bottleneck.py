r"""Checkers for notebook 01 (RNN bottleneck): the attention step of the decoder, written by hand.

1. ``context_vector(H (b, n, d), e (b, n), src_mask (b, n)) -> (c_t (b, d), a_t (b, n))``: the
   weights :math:`a_t = \mathrm{softmax}_j(e_{tj})` over the real source tokens (padding gets 0)
   and the context :math:`c_t = \sum_j a_{tj} h_j`.
2. ``additive_scores(s (b, d_dec), H (b, n, d_enc), U_q (d_dec, d_a), U_k (d_enc, d_a),
   v_a (d_a,)) -> e (b, n)``: Bahdanau's score :math:`e_{tj} = \tanh(s_t U_q + h_j U_k)\,
   v_a^\top` of one decoder state against every encoder state.

The stored notebook calls each checker on a stub that raises ``NotImplementedError``; the
checker then says only "... is not implemented yet.". Hints come on demand, in three levels:
``exercises.hint("rnn_bottleneck.context_vector", 1)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import additive_scores as _additive_scores
from .core import CheckResult, Mistake, check_function, seeded
from .start_here import OVERFLOW_HINT, check_cases, size
from .workflow import exercise, hint, progress

__all__ = ["additive_scores_reference", "check_additive_scores", "check_context_vector",
           "context_vector_reference", "hint", "progress"]


# --- exercise 1: the context vector c_t ----------------------------------------------------------


def _context_cases() -> list[dict]:
    g = seeded(110)
    cases = []
    for lengths, d, scale, dtype in [([3, 5], 4, 1.0, torch.float32),     # every row padded
                                     ([6, 6, 2], 3, 1.0, torch.float32),  # no padding in two rows
                                     ([1, 4], 5, 1.0, torch.float32),     # one real token
                                     ([4, 7, 5], 8, 1.0, torch.float64),
                                     ([5, 2], 4, 400.0, torch.float32)]:  # scores in the 1000s
        n = 6 if lengths == [3, 5] else max(lengths)
        cases.append({
            "H": torch.randn(len(lengths), n, d, generator=g, dtype=dtype),
            "e": scale * torch.randn(len(lengths), n, generator=g, dtype=dtype),
            "src_mask": torch.arange(n)[None, :] < torch.tensor(lengths)[:, None],
        })
    b, n, d = size(g, 1, 4), size(g, 1, 9), size(g, 1, 8)                     # random shapes
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    cases.append({"H": torch.randn(b, n, d, generator=g), "e": torch.randn(b, n, generator=g),
                  "src_mask": torch.arange(n)[None, :] < lengths[:, None]})
    return cases


def context_vector_reference(H: torch.Tensor, e: torch.Tensor, src_mask: torch.Tensor):  # noqa: N803
    """``H (b, n, d), e (b, n), src_mask (b, n) -> (c_t (b, d), a_t (b, n))``."""
    a = torch.softmax(e.masked_fill(~src_mask, float("-inf")), dim=-1)   # (b, n): padding -> 0
    c = (a[:, :, None] * H).sum(dim=1)                                   # (b, d): sum_j a_tj h_j
    return c, a


def _weights_then_mix(weights: Callable) -> Callable:
    def wrong(H, e, src_mask):  # noqa: N803
        a = weights(e, src_mask)
        return (a[:, :, None] * H).sum(dim=1), a
    return wrong


def _mean_of_real(H, e, src_mask):  # noqa: N803
    a = src_mask.to(H.dtype) / src_mask.sum(-1, keepdim=True)
    return (a[:, :, None] * H).sum(dim=1), a


@exercise("rnn_bottleneck.context_vector", "the context vector c_t of one decoder step", hints=(
    "Turn the scores into weights that are positive and sum to one over each sequence's real "
    "tokens only (padding must get exactly 0), then average the encoder states with them.",
    "a_tj = exp(e_tj) / sum_{k real} exp(e_tk) for real j, 0 for padding;  "
    "c_t = sum_j a_tj h_j.",
    "a = torch.softmax(e.masked_fill(~src_mask, float('-inf')), dim=-1)   # (b, n)\n"
    "c = (a[:, :, None] * H).sum(dim=1)                                  # (b, d)\n"
    "return c, a"))
def check_context_vector(context_vector: Callable) -> CheckResult:
    """Exercise: ``context_vector(H (b, n, d), e (b, n), src_mask (b, n)) -> (c_t (b, d),
    a_t (b, n))``, ``src_mask`` True at real source tokens."""
    return check_cases(
        context_vector, context_vector_reference, _context_cases(), what="context_vector",
        output_names=("the context c_t", "the weights a_t"),
        mistakes=[
            Mistake(_weights_then_mix(lambda e, m: torch.softmax(e, -1)),
                    "padding positions received weight: set their scores to -inf (where src_mask "
                    "is False) before the softmax, so their weight is exactly 0."),
            Mistake(_weights_then_mix(lambda e, m: torch.softmax(e.masked_fill(m, float("-inf")),
                                                                 -1)),
                    "the mask is inverted: src_mask is True at the real tokens, so fill the "
                    "scores where it is False (~src_mask)."),
            Mistake(_weights_then_mix(lambda e, m: torch.softmax(e.masked_fill(~m, 0.0), -1)),
                    "padding scores were set to 0, and exp(0) = 1 still gives padding weight: "
                    "set them to -inf."),
            Mistake(_weights_then_mix(lambda e, m: torch.softmax(e.masked_fill(~m, float("-inf")),
                                                                 0)),
                    "the softmax ran over the batch (dim=0); each sequence's weights over its "
                    "source positions (dim=-1) must sum to one."),
            Mistake(_weights_then_mix(lambda e, m: e * m),
                    "the weights are the raw scores: pass them through a softmax so they are "
                    "positive and sum to one."),
            Mistake(_mean_of_real,
                    "every real token got the same weight: the weights must come from the "
                    "scores, a_t = softmax(e_t)."),
        ],
        nan_hint=OVERFLOW_HINT + " With padding, take the maximum over the real tokens, or use "
                 "torch.softmax on scores filled with -inf.",
    )


# --- exercise 2: the additive score e_tj -------------------------------------------------------


def _additive_cases() -> list[dict]:
    g = seeded(111)
    cases = []
    for b, n, d_dec, d_enc, d_a, dtype in [(2, 5, 4, 4, 3, torch.float32),
                                           (3, 4, 6, 8, 5, torch.float32),
                                           (1, 1, 3, 2, 4, torch.float32),       # one source token
                                           (2, 6, 5, 3, 7, torch.float64)]:
        cases.append({
            "s": torch.randn(b, d_dec, generator=g, dtype=dtype),
            "H": torch.randn(b, n, d_enc, generator=g, dtype=dtype),
            "U_q": torch.randn(d_dec, d_a, generator=g, dtype=dtype) / d_dec ** 0.5,
            "U_k": torch.randn(d_enc, d_a, generator=g, dtype=dtype) / d_enc ** 0.5,
            "v_a": torch.randn(d_a, generator=g, dtype=dtype),
        })
    b, n, d_dec, d_enc, d_a = (size(g, 1, 8) for _ in range(5))                # random shapes
    cases.append({"s": torch.randn(b, d_dec, generator=g),
                  "H": torch.randn(b, n, d_enc, generator=g),
                  "U_q": torch.randn(d_dec, d_a, generator=g),
                  "U_k": torch.randn(d_enc, d_a, generator=g),
                  "v_a": torch.randn(d_a, generator=g)})
    return cases


def additive_scores_reference(s, H, U_q, U_k, v_a):  # noqa: N803
    """``s (b, d_dec), H (b, n, d_enc), U_q (d_dec, d_a), U_k (d_enc, d_a), v_a (d_a,)
    -> e (b, n)``: the core's :func:`~attn_helpers.attention.additive_scores` with one query."""
    return _additive_scores(s[:, None, :], H, U_q.T, U_k.T, v_a)[:, 0, :]


def _features(f: Callable, combine: Callable = torch.add) -> Callable:
    def wrong(s, H, U_q, U_k, v_a):  # noqa: N803
        return f(combine((s @ U_q)[:, None, :], H @ U_k), v_a)
    return wrong


@exercise("rnn_bottleneck.additive_scores", "the additive score e_tj", hints=(
    "Project the decoder state and every encoder state into the same d_a-dimensional space, add "
    "them, squash with tanh, and let v_a turn each d_a-vector into one number.",
    "e_tj = tanh(s_t U_q + h_j U_k) v_a^T: s_t U_q is (b, d_a), H U_k is (b, n, d_a); add them "
    "with a new axis for j.",
    "features = torch.tanh((s @ U_q)[:, None, :] + H @ U_k)   # (b, n, d_a)\n"
    "return features @ v_a                                     # (b, n)"))
def check_additive_scores(additive_scores: Callable) -> CheckResult:
    """Exercise: ``additive_scores(s (b, d_dec), H (b, n, d_enc), U_q (d_dec, d_a),
    U_k (d_enc, d_a), v_a (d_a,)) -> e (b, n)``."""
    return check_function(
        additive_scores, additive_scores_reference, _additive_cases(), what="additive_scores",
        output_names=("the scores e",),
        mistakes=[
            Mistake(_features(lambda x, v: x @ v),
                    "the tanh is missing: without it the score is linear, s_t U_q v_a^T + "
                    "h_j U_k v_a^T, and the query part is the same for every j."),
            Mistake(_features(lambda x, v: torch.tanh(x @ v)),
                    "tanh comes before v_a: e_tj = tanh(s_t U_q + h_j U_k) v_a^T, not "
                    "tanh((s_t U_q + h_j U_k) v_a^T)."),
            Mistake(_features(lambda x, v: torch.tanh(x) @ v, torch.mul),
                    "you multiplied the two projections; the additive score adds them: "
                    "s_t U_q + h_j U_k."),
            Mistake(lambda s, H, U_q, U_k, v_a: torch.tanh(H @ U_k) @ v_a,
                    "the decoder state s_t is missing: add s_t U_q to every h_j U_k."),
            Mistake(lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_k)[:, None, :] + H @ U_q) @ v_a,
                    "U_q and U_k are swapped: the decoder state s_t goes through U_q, the "
                    "encoder states h_j through U_k."),
            Mistake(_features(lambda x, v: torch.relu(x) @ v),
                    "that is a ReLU; the additive score squashes with tanh."),
            Mistake(_features(lambda x, v: torch.softmax(torch.tanh(x) @ v, -1)),
                    "those are the weights (after a softmax); return the raw scores e_tj."),
        ],
    )
