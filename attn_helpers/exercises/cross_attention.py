r"""Checkers for notebook 06 (cross-attention), in its row-vector notation: one decoding step over
the encoder's keys and values, padding masked (``cross_attention.step``), and every step of a
decoder with those keys and values projected once (``cross_attention.decode``). (The additive
score is notebook 01's exercise.)"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..masks import padding_mask
from .core import CheckResult, Mistake, _as_tuple, _clone, check_function, seeded
from .workflow import exercise

__all__ = ["CountingLinear",
           "check_cross_attention_step", "check_decode_contexts", "cross_attention_step_reference",
           "decode_contexts_reference"]


def _same(got, wrong, atol, rtol) -> bool:
    """``got`` equals a known mistake's output, NaN where it has NaN."""
    got, wrong = _as_tuple(got), _as_tuple(wrong)
    return len(got) == len(wrong) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
        and torch.allclose(x.double(), y.double(), atol=atol, rtol=rtol, equal_nan=True)
        for x, y in zip(got, wrong, strict=True))


def _check_stages(candidate, reference, stages, *, what, output_names, atol=1e-5, rtol=1e-4):
    """:func:`check_function` over groups of cases ``(cases, mistakes, nan_hint)``, so that each
    group names its own mistakes; the first miss is reported, else one verdict for all cases.
    A miss that no hint explains is compared once more with the group's mistakes, NaN for NaN."""
    total, done = sum(len(cases) for cases, _, _ in stages), 0
    for cases, mistakes, nan_hint in stages:
        result = check_function(candidate, reference, cases, what=what, output_names=output_names,
                                mistakes=mistakes, nan_hint=nan_hint, atol=atol, rtol=rtol)
        if result:
            done += len(cases)
            continue
        if "not implemented yet" in result.message:
            return result
        message = re.sub(r"on case (\d+) of \d+ \(", lambda m, done=done: (
            f"on case {int(m[1]) + done} of {total} ("), result.message, count=1)
        for case in [] if "\nHint:" in message else cases:
            got = candidate(*_clone(case).values())  # it ran without error in check_function
            if not _same(got, reference(*_clone(case).values()), atol, rtol):
                hints = [m.hint for m in mistakes
                         if _same(got, m.produce(*_clone(case).values()), atol, rtol)]
                message += f"\nHint: {hints[0]}" if hints else ""
                break
        return CheckResult(False, message)
    return CheckResult(True, f"Passed: {what} matches the reference on all {total} cases, "
                             "edge cases included.")


# --- shared ------------------------------------------------------------------------------------


def _sizes(g: torch.Generator, k: int, high: int = 8) -> list[int]:  # a case's random shapes
    return torch.randint(1, high + 1, (k,), generator=g).tolist()


# --- exercise 1: one decoding step -----------------------------------------------------------


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


def cross_attention_step_reference(s_t, K, V, lengths, q_proj):
    """One decoding step: ``(context (b, d_v), weights (b, n))`` for ``s_t (b, d)``, the encoder's
    ``K (b, n, d_k)`` and ``V (b, n, d_v)``, ``lengths (b,)`` and ``q_proj`` (``d -> d_k``)."""
    q = q_proj(s_t)[:, None, :]  # (b, 1, d_k): q_t = s_t W_q
    real = padding_mask(lengths, K.shape[1])[:, None, :]  # (b, 1, n): j < lengths[i]
    context, weights = scaled_dot_product_attention(q, K, V, real)  # (b, 1, d_v), (b, 1, n)
    return context[:, 0], weights[:, 0]


def _step_case(g, b, n, d, d_k, d_v, lengths, *, dtype=torch.float32, size=1.0, bias=True):
    return {
        "s_t": size * torch.randn(b, d, generator=g).to(dtype),
        "K": size * torch.randn(b, n, d_k, generator=g).to(dtype),
        "V": torch.randn(b, n, d_v, generator=g).to(dtype),
        "lengths": torch.tensor(lengths),
        "q_proj": CountingLinear(d, d_k, bias=bias, generator=g, dtype=dtype),
    }


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


def _step_mistakes() -> list[Mistake]:
    def attending(keep):  # keep(j (1, n), lengths (b, 1)) -> the positions the mistake attends to
        return lambda s, K, V, L, q: _step_with(s, K, V, L, q, real=keep(
            torch.arange(K.shape[1])[None, :], L[:, None]))

    return [
        Mistake(attending(lambda j, L: j >= 0),
                "padded encoder positions received weight: mask every position j >= lengths[i] "
                "(scores -inf, or give the mask to ah.scaled_dot_product_attention)."),
        Mistake(attending(lambda j, L: j >= L),
                "the mask is inverted: only the padding got weight. Position j is a real token "
                "when j < lengths[i]; those are the ones to keep."),
        Mistake(attending(lambda j, L: j <= L),
                "off by one: position j = lengths[i] is already padding. The real positions are "
                "j < lengths[i], not j <= lengths[i]."),
        Mistake(lambda *a: _step_with(*a, scale=1.0),
                "the scores were not scaled: divide q_t . k_j by sqrt(d_k)."),
        Mistake(lambda *a: _step_with(*a, scale=a[0].shape[-1] ** -0.5),
                "the scale uses the decoder state's width d; it is sqrt(d_k), the width of the "
                "query q_t and the keys, after the projection."),
        Mistake(lambda *a: _step_with(*a, dim=0),
                "the softmax ran over the batch (dim=0); each sentence's weights over its encoder "
                "positions (the last dim) must sum to one."),
        Mistake(lambda *a: _step_with(*a, values=a[1]),
                "the context is a weighted sum of the values V, not of the keys K: the keys only "
                "decide the weights."),
        Mistake(lambda s, K, V, L, q: cross_attention_step_reference(
                    s, K, V, L, lambda x: x @ q.weight.T),
                "the projection's bias is missing: compute q_t = q_proj(s_t), which adds it."),
    ]


def _step_stages() -> list[tuple]:
    g = seeded(62)
    regular = [_step_case(g, 2, 6, 5, 4, 3, [4, 2]),          # every sentence padded
               _step_case(g, 3, 5, 8, 8, 8, [5, 1, 3], bias=False),
               _step_case(g, 1, 1, 4, 6, 2, [1]),             # one encoder token
               _step_case(g, 2, 7, 6, 4, 5, [7, 6], dtype=torch.float64)]
    b, n, d, d_k, d_v = _sizes(g, 5)
    regular.append(_step_case(g, b, n, d, d_k, d_v, _sizes(g, b, high=n)))  # random shapes
    large = [_step_case(g, 2, 5, 8, 8, 4, [5, 3], dtype=torch.float64, size=30.0)]
    empty = [_step_case(g, 3, 4, 4, 4, 3, [4, 0, 2])]
    uniform = Mistake(lambda *a: _step_with(*a, fill=-1e9),
                      "a sentence with no real token (length 0) got uniform weights over its "
                      "padding; it must get zero weights and a zero context.")
    overflow = "exp overflowed on large scores: subtract each row's largest score before exp "
    zeroed = Mistake(lambda *a: _step_with(*a, softmax=lambda e, dim: (
        e.exp() / e.exp().sum(dim, keepdim=True)).nan_to_num(0.0)), overflow + (
        "(torch.softmax does this for you); the NaN it gave were then turned into zeros."))
    return [
        (regular, _step_mistakes(), None),
        (large, [zeroed], overflow + "(torch.softmax does this for you)."),
        (empty, [uniform], "a sentence with no real token (length 0) has every score masked, and "
                           "a softmax over all -inf is 0/0 = NaN: give such a row zero weights and "
                           "a zero context (as ah.scaled_dot_product_attention does)."),
    ]


@exercise("cross_attention.step", "one cross-attention decoding step", hints=(
    "The query is the decoder's state s_t, projected; the keys and values are the encoder's, "
    "already projected. Which encoder positions may s_t look at?",
    "q_t = q_proj(s_t); e_tj = q_t . k_j / sqrt(d_k), -inf where j >= lengths[i]; a_t = "
    "softmax_j(e_tj), all zero when lengths[i] = 0; c_t = sum_j a_tj v_j.",
    "q = q_proj(s_t)[:, None, :]                                   # (b, 1, d_k)\n"
    "real = torch.arange(K.shape[1])[None, :] < lengths[:, None]   # (b, n)\n"
    "context, weights = ah.scaled_dot_product_attention(q, K, V, real[:, None, :])\n"
    "return context[:, 0], weights[:, 0]                          # (b, d_v), (b, n)"))
def check_cross_attention_step(cross_attention_step: Callable) -> CheckResult:
    """Exercise: ``cross_attention_step(s_t (b, d), K (b, n, d_k), V (b, n, d_v), lengths (b,),
    q_proj) -> (context (b, d_v), weights (b, n))``; ``q_proj`` is an ``nn.Linear(d, d_k)``,
    positions ``j >= lengths[i]`` are padding."""
    return _check_stages(cross_attention_step, cross_attention_step_reference, _step_stages(),
                         what="cross_attention_step", output_names=("the context", "the weights"))


# --- exercise 2: every step, keys and values projected once ----------------------------------


def decode_contexts_reference(S, H, lengths, q_proj, k_proj, v_proj):
    """Every decoding step: ``(contexts (b, T, d_v), weights (b, T, n))`` for decoder states
    ``S (b, T, d)`` over encoder states ``H (b, n, d_m)``; ``K``, ``V`` projected once."""
    K, V = k_proj(H), v_proj(H)  # (b, n, d_k), (b, n, d_v): once per sentence
    steps = [cross_attention_step_reference(S[:, t], K, V, lengths, q_proj)
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
    "K = H W_K and V = H W_V once; then for t = 0 .. T-1: (c_t, a_t) = step(s_t, K, V); stack "
    "the c_t and the a_t along the step axis (dim 1).",
    "K, V = k_proj(H), v_proj(H)                                    # once\n"
    "steps = [cross_attention_step(S[:, t], K, V, lengths, q_proj) for t in range(S.shape[1])]\n"
    "return (torch.stack([c for c, _ in steps], 1),                 # (b, T, d_v)\n"
    "        torch.stack([a for _, a in steps], 1))                 # (b, T, n)"))
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
