r"""Checkers for notebook 06 (cross-attention), in its row-vector notation: every step of a decoder
with the encoder's keys and values projected once (``cross_attention.decode``), and the hard
alignment read off trained cross-attention weights, scored against a gold alignment with padded
sources and targets (``cross_attention.alignment``). (The attention step itself is notebook 02's
exercise; the additive score is notebook 01's.)"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..masks import padding_mask
from .core import CheckResult, Mistake, check_function, describe, seeded
from .workflow import exercise

__all__ = ["CountingLinear", "check_decode_contexts", "decode_contexts_reference",
           "check_alignment_accuracy", "alignment_accuracy_reference"]


# --- shared ------------------------------------------------------------------------------------


def _sizes(g: torch.Generator, k: int, high: int = 8) -> list[int]:  # a case's random shapes
    return torch.randint(1, high + 1, (k,), generator=g).tolist()


# --- exercise 1: decode every step, keys and values projected once -----------------------


class CountingLinear(nn.Linear):
    """``nn.Linear`` that counts its calls (``calls``); printed briefly in a case's description."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool, generator: torch.Generator,
                 dtype=torch.float32):
        super().__init__(d_in, d_out, bias=bias, dtype=dtype)
        with torch.no_grad():
            self.weight.copy_(torch.randn(d_out, d_in, generator=generator) / math.sqrt(d_in))
            if bias:
                self.bias.copy_(0.5 * torch.randn(d_out, generator=generator))
        self.requires_grad_(False)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)

    def __repr__(self) -> str:
        return f"nn.Linear({self.in_features} -> {self.out_features})"


def _step_reference(s_t, K, V, lengths, q_proj):
    """One decoding step: ``(context (b, d_v), weights (b, n))`` for ``s_t (b, d)``, the encoder's
    ``K (b, n, d_k)`` and ``V (b, n, d_v)``, ``lengths (b,)`` and ``q_proj`` (``d -> d_k``)."""
    q = q_proj(s_t)[:, None, :]  # (b, 1, d_k): q_t = s_t W_q
    real = padding_mask(lengths, K.shape[1])[:, None, :]  # (b, 1, n): j < lengths[i]
    context, weights = scaled_dot_product_attention(q, K, V, real)  # (b, 1, d_v), (b, 1, n)
    return context[:, 0], weights[:, 0]


def _step_with(s_t, K, V, lengths, q_proj, *, real=None, scale=None, dim=-1, values=None,
               fill=-math.inf, softmax=torch.softmax):
    """The step with one thing changed, for the known mistakes."""
    q = q_proj(s_t)[:, None, :]
    scale = 1 / math.sqrt(K.shape[-1]) if scale is None else scale
    scores = (q @ K.transpose(-2, -1))[:, 0] * scale  # (b, n)
    if real is None:
        real = padding_mask(lengths, K.shape[1])
    weights = softmax(scores.masked_fill(~real, fill), dim=dim)  # (b, n)
    values = V if values is None else values
    return (weights[:, :, None] * values).sum(1), weights  # (b, d_v), (b, n)




def decode_contexts_reference(S, H, lengths, q_proj, k_proj, v_proj):
    """Every decoding step: ``(contexts (b, T, d_v), weights (b, T, n))`` for decoder states
    ``S (b, T, d)`` over encoder states ``H (b, n, d_m)``; ``K``, ``V`` projected once."""
    K, V = k_proj(H), v_proj(H)  # (b, n, d_k), (b, n, d_v): once per sentence
    steps = [_step_reference(S[:, t], K, V, lengths, q_proj)
             for t in range(S.shape[1])]
    return (torch.stack([c for c, _ in steps], 1),  # (b, T, d_v)
            torch.stack([a for _, a in steps], 1))  # (b, T, n)


def _decode_cases() -> list[dict]:
    g = seeded(63)
    cases, sizes = [], _sizes(g, 6)  # the last case's shapes: b, T, n, d, d_m, d_k
    for b, T, n, d, d_m, d_k, lengths, dtype in [
            (2, 3, 5, 6, 4, 4, [5, 2], torch.float32), (1, 1, 4, 4, 4, 4, [3], torch.float32),
            (3, 4, 6, 5, 7, 6, [6, 1, 4], torch.float64),
            (*sizes, _sizes(g, sizes[0], sizes[2]), torch.float32)]:
        cases.append({
            "S": torch.randn(b, T, d, generator=g).to(dtype),
            "H": torch.randn(b, n, d_m, generator=g).to(dtype),
            "lengths": torch.tensor(lengths),
            "q_proj": CountingLinear(d, d_k, bias=True, generator=g, dtype=dtype),
            "k_proj": CountingLinear(d_m, d_k, bias=True, generator=g, dtype=dtype),
            "v_proj": CountingLinear(d_m, d_k, bias=True, generator=g, dtype=dtype),
        })
    return cases


def _decode_with(S, H, lengths, q_proj, k_proj, v_proj, *, query=None, swap=False, **changes):
    K, V = (v_proj(H), k_proj(H)) if swap else (k_proj(H), v_proj(H))
    steps = [_step_with(S[:, t if query is None else query], K, V, lengths, q_proj, **changes)
             for t in range(S.shape[1])]
    return torch.stack([c for c, _ in steps], 1), torch.stack([a for _, a in steps], 1)


@exercise("cross_attention.decode", "decode every step, encoder keys and values projected once",
          hints=(
    "The encoder states H do not change while the decoder writes, so neither do their keys and "
    "values. Only the query changes from step to step.",
    "K = H W_K and V = H W_V once; then for t = 0 .. T-1: q_t = s_t W_Q and (c_t, a_t) = "
    "attention(q_t, K, V) with the padded positions j >= lengths[i] masked "
    "(ah.scaled_dot_product_attention takes the mask); stack the c_t and the a_t along dim 1.",
    "K, V = k_proj(H), v_proj(H)                                    # once, (b, n, d_k), (b, n, d_v)\n"
    "real = (torch.arange(H.shape[1])[None, :] < lengths[:, None])[:, None, :]   # (b, 1, n)\n"
    "steps = [ah.scaled_dot_product_attention(q_proj(S[:, t : t + 1]), K, V, real)\n"
    "         for t in range(S.shape[1])]                       # each (b, 1, d_v), (b, 1, n)\n"
    "return (torch.cat([c for c, _ in steps], 1),                   # (b, T, d_v)\n"
    "        torch.cat([a for _, a in steps], 1))                   # (b, T, n)"))
def check_decode_contexts(decode_contexts: Callable) -> CheckResult:
    """Exercise: ``decode_contexts(S (b, T, d), H (b, n, d_m), lengths (b,), q_proj, k_proj,
    v_proj) -> (contexts (b, T, d_v), weights (b, T, n))``, the encoder's ``K = k_proj(H)`` and
    ``V = v_proj(H)`` computed once (each projection called at most once per call)."""
    mistakes = [
        Mistake(lambda *a: tuple(x.transpose(0, 1) for x in decode_contexts_reference(*a)),
                "the steps were stacked along dim 0, giving (T, b, ...); stack them along dim 1, "
                "so the batch stays first: (b, T, d_v) and (b, T, n)."),
        Mistake(lambda *a: _decode_with(*a, query=0),
                "every step used the same query s_0; step t's query is its own state S[:, t]."),
        Mistake(lambda *a: _decode_with(*a, swap=True),
                "keys and values are swapped: the keys are k_proj(H), the values v_proj(H)."),
        Mistake(lambda *a: _decode_with(*a, real=torch.ones(a[2].shape[0], a[1].shape[1],
                                                            dtype=torch.bool)),
                "padded encoder positions received weight: mask every j >= lengths[i]."),
        Mistake(lambda *a: _decode_with(*a, scale=1.0),
                "the scores were not scaled: divide q_t . k_j by sqrt(d_k)."),
    ]
    result = check_function(decode_contexts, decode_contexts_reference, _decode_cases(),
                            what="decode_contexts", output_names=("the contexts", "the weights"),
                            mistakes=mistakes)
    if not result:  # wrong numbers first; then how often the encoder was projected
        return result
    case = _decode_cases()[2]  # T = 4 steps
    with torch.no_grad():
        decode_contexts(*case.values())
    T = case["S"].shape[1]
    for name in ("k_proj", "v_proj"):
        if case[name].calls > 1:
            return CheckResult(False, (
                f"Not yet: the numbers are right, but for {T} decoding steps {name} ran "
                f"{case[name].calls} times. The encoder states do not change while the decoder "
                "writes: compute K = k_proj(H) and V = v_proj(H) once, before the loop, and "
                "reuse them."))
    return result


# --- exercise 2: the hard alignment and its accuracy against a gold alignment ------------------


def alignment_accuracy_reference(weights, src_real, gold, tgt_real):
    """``(alignment (b, n_out) long, accuracy 0-dim float)``: the strongest *real* source position
    of each output step (``-1`` at padded steps), and the share of real output steps, pooled over
    the batch, whose alignment equals ``gold``. ``weights (b, n_out, n_src)``, ``src_real (b,
    n_src)`` and ``tgt_real (b, n_out)`` bool (True = real), ``gold (b, n_out)`` long."""
    scores = weights.masked_fill(~src_real[:, None, :], -math.inf)       # padding never wins
    alignment = scores.argmax(-1).masked_fill(~tgt_real, -1)             # (b, n_out)
    hits = (alignment == gold) & tgt_real                                # real steps only
    return alignment, hits.sum() / tgt_real.sum()


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


def _same_answer(got, expected, *, alignment_only: bool = False) -> bool:
    (a, acc), (b, acc_b) = got, expected
    return (isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a.long(), b)
            and (alignment_only or abs(float(acc) - float(acc_b)) < 1e-6))


@exercise("cross_attention.alignment", "the hard alignment and its accuracy", hints=(
    "Each output step reads the source position with the most weight, but a padded source "
    "position is never an answer, and a padded output step is never scored.",
    "alignment[i, t] = argmax over j with src_real[i, j] of weights[i, t, j] (-1 where tgt_real is "
    "False); accuracy = #(real steps with alignment == gold) / #(real steps), over the whole batch.",
    "scores = weights.masked_fill(~src_real[:, None, :], float('-inf'))\n"
    "alignment = scores.argmax(-1).masked_fill(~tgt_real, -1)         # (b, n_out)\n"
    "hits = (alignment == gold) & tgt_real\n"
    "return alignment, hits.sum() / tgt_real.sum()"))
def check_alignment_accuracy(alignment_accuracy: Callable) -> CheckResult:
    """Exercise: ``alignment_accuracy(weights (b, n_out, n_src), src_real (b, n_src), gold (b,
    n_out), tgt_real (b, n_out)) -> (alignment (b, n_out) long, accuracy)``; see
    :func:`alignment_accuracy_reference`."""
    what = "alignment_accuracy"
    if not callable(alignment_accuracy):
        return CheckResult(False, f"Not yet: {what} is not a function.")
    cases = _alignment_cases()
    for number, case in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({describe(case)})"
        try:
            got = alignment_accuracy(*(v.clone() for v in case.values()))
        except NotImplementedError:
            return CheckResult(False, f"{what} is not implemented yet.")
        except Exception as exc:
            return CheckResult(False, f"Not yet: on {where}, {what} raised {type(exc).__name__}: {exc}")
        if got is None and number == 1:
            return CheckResult(False, f"{what} is not implemented yet (it returned None).")
        expected = alignment_accuracy_reference(*case.values())
        if not (isinstance(got, tuple) and len(got) == 2):
            return CheckResult(False, f"Not yet: on {where}, return a pair (alignment, accuracy).")
        alignment, accuracy = got
        if not isinstance(alignment, torch.Tensor) or alignment.is_floating_point():
            return CheckResult(False, f"Not yet: on {where}, the alignment must be an integer "
                                      "tensor of source positions (argmax gives one), not the weights.")
        if _same_answer(got, expected):
            continue
        message = (f"Not yet: on {where}, you gave alignment {alignment.tolist()} and accuracy "
                   f"{float(accuracy):.4f}; expected {expected[0].tolist()} and "
                   f"{float(expected[1]):.4f}.")
        for hint, produce in _alignment_mistakes():
            wrong = produce(*case.values())
            if _same_answer(got, wrong, alignment_only=alignment.shape != expected[0].shape):
                return CheckResult(False, f"{message}\nHint: {hint}")
        return CheckResult(False, message)
    return CheckResult(True, f"Passed: {what} matches the reference on all {len(cases)} cases, "
                             "edge cases included.")
