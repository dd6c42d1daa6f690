"""Checkers for notebook 08 (complexity): one online-softmax step, and the memory of the score
matrix."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..efficient import OnlineSoftmaxState, block_state, online_softmax_step
from ..lessons.complexity import score_matrix_bytes
from .core import CheckResult, Mistake, check_function, seeded

__all__ = ["check_online_softmax_step", "check_score_matrix_bytes"]


def _step_cases() -> list[dict]:
    g = seeded(8)
    cases = []
    for n_q, first, block, d_v, spread in [(3, 4, 4, 2, 1.0), (5, 6, 3, 4, 3.0),
                                            (2, 5, 7, 3, 30.0)]:
        previous = block_state(spread * torch.randn(n_q, first, generator=g, dtype=torch.float64),
                               torch.randn(first, d_v, generator=g, dtype=torch.float64))
        scores = spread * torch.randn(n_q, block, generator=g, dtype=torch.float64)
        scores[0] += 5.0 * spread  # the first query's maximum moves up with the new block
        cases.append({"m": previous.max, "l": previous.total, "acc": previous.acc,
                      "scores": scores,
                      "values": torch.randn(block, d_v, generator=g, dtype=torch.float64)})
    start = block_state(torch.tensor([[1000.0, 999.0]], dtype=torch.float64),
                        torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    cases.append({"m": start.max, "l": start.total, "acc": start.acc,
                  "scores": torch.tensor([[1001.0, 998.0, 1000.5]], dtype=torch.float64),
                  "values": torch.tensor([[2.0, 2.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)})
    return cases


def check_online_softmax_step(step: Callable) -> CheckResult:
    """Exercise: ``step(m, l, acc, scores, values) -> (m, l, acc)``, one online-softmax update.

    ``m``, ``l``: ``(n_q, 1)`` running max and running sum; ``acc``: ``(n_q, d_v)`` running
    unnormalised output; ``scores``: ``(n_q, block)``; ``values``: ``(block, d_v)``.
    """

    def reference(m, l, acc, scores, values):
        return tuple(online_softmax_step(OnlineSoftmaxState(m, l, acc), scores, values))

    def no_acc_rescale(m, l, acc, scores, values):
        new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - new_m)
        return new_m, l * torch.exp(m - new_m) + p.sum(-1, keepdim=True), acc + p @ values

    def no_rescale(m, l, acc, scores, values):
        new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - new_m)
        return new_m, l + p.sum(-1, keepdim=True), acc + p @ values

    def block_max_only(m, l, acc, scores, values):
        block_m = scores.amax(-1, keepdim=True)
        new_m = torch.maximum(m, block_m)
        p = torch.exp(scores - block_m)
        c = torch.exp(m - new_m)
        return new_m, l * c + p.sum(-1, keepdim=True), acc * c + p @ values

    return check_function(
        step, reference, _step_cases(), what="your online-softmax step",
        output_names=("m (running max)", "l (running sum)", "acc (running output)"),
        mistakes=[
            Mistake(no_acc_rescale,
                    "the running sum l is rescaled, but acc is not: the old terms of acc were "
                    "computed relative to the old maximum, so acc needs the same factor "
                    "exp(m - m_new) as l."),
            Mistake(no_rescale,
                    "neither l nor acc was rescaled. When the maximum grows from m to m_new, every "
                    "old term exp(s - m) must become exp(s - m_new): multiply both by exp(m - m_new)."),
            Mistake(block_max_only,
                    "the new block was exponentiated relative to its own maximum, but l and acc "
                    "are kept relative to the running maximum m_new: use exp(scores - m_new)."),
        ],
        nan_hint="exp of a score near 1000 overflows to inf: subtract the new running maximum "
                 "m_new = max(m, max(scores)) before exponentiating.",
        atol=1e-8, rtol=1e-6,
    )


def _memory_cases() -> list[dict]:
    return [
        {"n": 1024, "heads": 8, "dtype": torch.float32},
        {"n": 4096, "heads": 12, "dtype": torch.float16},
        {"n": 300, "heads": 1, "dtype": torch.float64},
        {"n": 32768, "heads": 32, "dtype": torch.bfloat16},
    ]


def check_score_matrix_bytes(score_bytes: Callable) -> CheckResult:
    """Exercise: ``score_bytes(n, heads, dtype) -> int``, the bytes of the ``(heads, n, n)``
    score matrix of one sequence."""

    def as_tensor(fn):
        def wrapped(n, heads, dtype):
            value = fn(n, heads, dtype)
            if isinstance(value, torch.Tensor):
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"expected a number of bytes, got {type(value).__name__}")
            return torch.tensor(float(value), dtype=torch.float64)
        return wrapped

    def reference(n, heads, dtype):
        return score_matrix_bytes(n, heads=heads, dtype=dtype)

    return check_function(
        as_tensor(score_bytes), as_tensor(reference), _memory_cases(),
        what="your score-matrix size", output_names=("the number of bytes",),
        mistakes=[
            Mistake(as_tensor(lambda n, heads, dtype: heads * n * n * 4),
                    "you assumed 4 bytes per number; float16 and bfloat16 take 2, float64 takes 8. "
                    "torch.empty((), dtype=dtype).element_size() gives the size of any dtype."),
            Mistake(as_tensor(lambda n, heads, dtype: heads * n * n),
                    "that is the number of scores, not of bytes: multiply by the bytes per "
                    "element of the dtype."),
            Mistake(as_tensor(lambda n, heads, dtype: n * n * reference(1, 1, dtype)),
                    "every head has its own n x n score matrix: multiply by the number of heads."),
        ],
        atol=0.0, rtol=0.0,
    )
