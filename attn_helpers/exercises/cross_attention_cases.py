"""The cases and known mistakes of notebook 06's alignment exercise (see
:func:`.cross_attention.check_alignment_accuracy`): batches of trained-looking cross-attention
weights with padded sources and targets, a gold alignment right 60% of the time, and the
plausible wrong answers, each with the hint that names it."""

from __future__ import annotations

import math

import torch

from .core import seeded

__all__: list[str] = []


def _alignment_case(g, b, n_out, n_src, *, pad_weight=0.0, dtype=torch.float32):
    src_len = torch.randint(1, n_src + 1, (b,), generator=g)
    src_len[0] = n_src - 1 if n_src > 1 else 1                         # one padded source at least
    tgt_len = torch.randint(1, n_out + 1, (b,), generator=g)
    tgt_len[-1] = n_out                                                # lengths differ by sentence
    tgt_len[0] = max(1, n_out - 2)
    src_real = torch.arange(n_src)[None, :] < src_len[:, None]
    tgt_real = torch.arange(n_out)[None, :] < tgt_len[:, None]
    logits = 3 * torch.randn(b, n_out, n_src, generator=g)
    logits = logits.masked_fill(~src_real[:, None, :], math.log(pad_weight) if pad_weight else -math.inf)
    weights = torch.softmax(logits, -1)
    if pad_weight:                                # an unmasked model: padding may hold the most weight
        weights = weights + (~src_real[:, None, :]) * pad_weight
    best = weights.masked_fill(~src_real[:, None, :], -1).argmax(-1)
    other = (best + 1) % src_len[:, None]
    right = torch.rand(b, n_out, generator=g) < 0.6
    gold = torch.where(right, best, other)
    gold = gold.masked_fill(~tgt_real, -1)                   # padded steps: -1, like the answer
    return {"weights": weights.to(dtype), "src_real": src_real, "gold": gold, "tgt_real": tgt_real}


def _alignment_cases() -> list[dict]:
    g = seeded(64)
    return [_alignment_case(g, 3, 5, 6, pad_weight=0.9), _alignment_case(g, 2, 4, 4),
            _alignment_case(g, 4, 7, 5, pad_weight=0.6, dtype=torch.float64),
            _alignment_case(g, 1, 3, 8, pad_weight=0.9)]


def _alignment_mistakes():
    def pooled(alignment, gold, tgt_real):
        return ((alignment == gold) & tgt_real).sum() / tgt_real.sum()

    def unmasked(w, s, gold, t):
        return w.argmax(-1).masked_fill(~t, -1)

    def masked(w, s, gold, t):
        return w.masked_fill(~s[:, None, :], -math.inf).argmax(-1).masked_fill(~t, -1)

    return [
        ("padding won the argmax: take it over the real source positions only (weights at "
         "padded positions set to -inf first).", lambda w, s, g, t: (a := unmasked(w, s, g, t),
                                                                    pooled(a, g, t))),
        ("the mask is inverted: the argmax ran over the padded source positions.",
         lambda w, s, g, t: (a := masked(w, ~s, g, t), pooled(a, g, t))),
        ("the argmax ran over the output steps (dim 1); each output step's alignment is the "
         "source position (the last dim) with the most weight.",
         lambda w, s, g, t: (w.masked_fill(~s[:, None, :], -math.inf).argmax(1), math.nan)),
        ("padded output steps counted in the accuracy: divide the hits on real steps by the "
         "number of real steps.", lambda w, s, g, t: (a := masked(w, s, g, t),
                                                     (a == g).float().mean())),
        ("padded output steps counted as misses: divide by the number of real steps, not by "
         "all b * n_out steps.", lambda w, s, g, t: (a := masked(w, s, g, t),
                                                    ((a == g) & t).float().mean())),
        ("the accuracy is a mean of per-sentence accuracies; pool the real steps of the whole "
         "batch (every step counts the same).", lambda w, s, g, t: (
             a := masked(w, s, g, t), (((a == g) & t).sum(1) / t.sum(1)).mean())),
        ("padded output steps must be marked -1 in the alignment.",
         lambda w, s, g, t: (a := w.masked_fill(~s[:, None, :], -math.inf).argmax(-1),
                             pooled(a.masked_fill(~t, -1), g, t))),
    ]
