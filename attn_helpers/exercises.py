"""Checkers for the "check yourself" exercises.

:func:`check_function` runs a learner's function and a reference on the same seeded inputs,
edge cases included, and explains the first mismatch in plain words: which case, which input
shapes, what went wrong (an exception, a wrong shape, NaN, a wrong number) and, when the answer
matches a known mistake, a hint. The exercise checkers below (``check_softmax`` ...) are thin
wrappers that fix the reference, the cases and the known mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .attention import scaled_dot_product_attention

__all__ = [
    "CheckResult",
    "Mistake",
    "check_function",
    "check_softmax",
    "check_attention",
    "check_entropy",
]


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a checker; its text is what the learner sees. Truthy when passed."""

    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer: ``produce(*inputs)`` computes what that mistake gives, and
    ``hint`` explains it. A learner whose output equals ``produce``'s gets the hint."""

    produce: Callable
    hint: str


def describe(inputs: dict) -> str:
    """``q: float32 (2, 3, 4), mask: bool (3, 3)``: what a case's inputs look like."""
    parts = []
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            parts.append(f"{name}: {dtype} {tuple(value.shape)}")
        else:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> bool:
    return torch.allclose(got.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=False)


def _compare(got, expected, name: str, atol: float, rtol: float) -> str | None:
    """None if ``got`` matches ``expected``, else a sentence saying how it differs."""
    if not isinstance(got, torch.Tensor):
        return f"{name} should be a torch.Tensor, but it is a {type(got).__name__}."
    if got.shape != expected.shape:
        return (f"{name} has shape {tuple(got.shape)}, but the right answer has shape "
                f"{tuple(expected.shape)}.")
    if not got.is_floating_point():
        return f"{name} has dtype {got.dtype}; expected a floating-point tensor."
    bad = ~torch.isfinite(got) & torch.isfinite(expected)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        return (f"{name} contains {got[index].item()} at index {index}, where the right answer is "
                f"{expected[index].item():.4g}.")
    if not _close(got, expected, atol, rtol):
        diff = (got.double() - expected.double()).abs()
        index = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
        return (f"{name} differs from the right answer: at index {index} you gave "
                f"{got[index].item():.4f}, expected {expected[index].item():.4f} "
                f"(largest difference {diff.max().item():.2g}).")
    return None


def check_function(
    candidate: Callable,
    reference: Callable,
    cases: Iterable[dict],
    *,
    what: str = "your function",
    output_names: Sequence[str] = ("the output",),
    mistakes: Sequence[Mistake] = (),
    nan_hint: str | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> CheckResult:
    """Run ``candidate(*case.values())`` and the reference on every case; explain the first miss.

    Arguments are passed by position, in the order of each case's keys, so the learner may name
    their parameters as they like.

    Args:
        candidate: the learner's function.
        reference: the correct function; may return a tensor or a tuple of tensors.
        cases: keyword-argument dicts, deterministic so the verdict is reproducible.
        what: how to name the candidate in messages.
        output_names: names of the returned tensors, in order, for messages.
        mistakes: known wrong answers, checked in order, whose hint is added on a mismatch.
        nan_hint: added when the candidate gives NaN or inf where the answer is finite.
    """
    if not callable(candidate):
        return CheckResult(False, f"Not yet: {what} is not a function (got {type(candidate).__name__}).")
    cases = list(cases)
    for number, case in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({describe(case)})"
        inputs = _clone(case)
        try:
            got = candidate(*inputs.values())
        except Exception as exc:  # the learner's bug, reported in words
            return CheckResult(False, f"Not yet: on {where}, {what} raised "
                                      f"{type(exc).__name__}: {exc}")
        for name, value in case.items():
            if isinstance(value, torch.Tensor) and not torch.equal(
                    torch.nan_to_num(inputs[name]), torch.nan_to_num(value)):
                return CheckResult(False, f"Not yet: on {where}, {what} changed its input "
                                          f"'{name}' in place; work on a copy instead.")
        expected = _as_tuple(reference(*_clone(case).values()))
        got = _as_tuple(got)
        if len(got) != len(expected):
            return CheckResult(False, f"Not yet: on {where}, {what} returned {len(got)} value(s); "
                                      f"expected {len(expected)} ({', '.join(output_names)}).")
        for name, g, e in zip(output_names, got, expected, strict=False):
            problem = _compare(g, e, name, atol, rtol)
            if problem is None:
                continue
            message = f"Not yet: on {where}, {problem}"
            if nan_hint and isinstance(g, torch.Tensor) and g.shape == e.shape and (
                    ~torch.isfinite(g) & torch.isfinite(e)).any():
                return CheckResult(False, f"{message}\nHint: {nan_hint}")
            for mistake in mistakes:
                wrong = _as_tuple(mistake.produce(*_clone(case).values()))
                if all(isinstance(x, torch.Tensor) and x.shape == y.shape
                       and _close(y, x, atol, rtol) for x, y in zip(wrong, got, strict=False)):
                    message += f"\nHint: {mistake.hint}"
                    break
            return CheckResult(False, message)
    return CheckResult(True, f"Passed: {what} matches the reference on all {len(cases)} cases, "
                             "edge cases included.")


# --- notebook 02 -----------------------------------------------------------------------------

def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _softmax_cases() -> list[dict]:
    g = _generator(2)
    cases = [{"x": torch.randn(shape, generator=g)} for shape in [(5,), (3, 4), (2, 3, 6)]]
    cases.append({"x": torch.zeros(2, 4)})
    cases.append({"x": torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1000.0, -999.0]])})
    cases.append({"x": 50 * torch.randn(4, 7, generator=g)})
    return cases


def check_softmax(softmax: Callable) -> CheckResult:
    """Exercise: ``softmax(x)`` over the last dimension, stable for large logits."""

    return check_function(
        softmax, lambda x: torch.softmax(x.double(), -1).to(x.dtype), _softmax_cases(),
        what="softmax", output_names=("softmax(x)",),
        mistakes=[
            Mistake(lambda x: torch.softmax(x, 0),
                    "you normalised over the first dimension; each *row* (the last dimension, "
                    "dim=-1) must sum to one."),
        ],
        nan_hint="exp(1000) overflows to inf, and inf/inf is NaN. Subtract each row's maximum "
                 "before exp: softmax(x) = softmax(x - max(x)), because the constant cancels in "
                 "the ratio.",
    )


def _attention_cases() -> list[dict]:
    g = _generator(3)
    cases = []
    for batch, n_q, n_k, d_k, d_v in [((), 3, 4, 8, 5), ((2,), 5, 5, 16, 4), ((2, 2), 4, 6, 4, 3)]:
        cases.append({
            "q": torch.randn(*batch, n_q, d_k, generator=g),
            "k": torch.randn(*batch, n_k, d_k, generator=g),
            "v": torch.randn(*batch, n_k, d_v, generator=g),
            "mask": None,
        })
    q, k, v = (torch.randn(6, 8, generator=g) for _ in range(3))
    cases.append({"q": q, "k": k, "v": v, "mask": torch.ones(6, 6, dtype=torch.bool).tril()})
    return cases


def check_attention(attention: Callable) -> CheckResult:
    """Exercise: ``attention(q, k, v, mask=None) -> output``, scaled dot-product attention with
    an optional boolean mask (True = may attend)."""

    def reference(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, mask)[0]

    def with_scale(scale):
        return lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, mask, scale=scale(q))[0]

    def wrong_dim(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-2) @ v

    def inverted_mask(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, None if mask is None else ~mask)[0]

    return check_function(
        attention, reference, _attention_cases(), what="attention", output_names=("the output",),
        mistakes=[
            Mistake(with_scale(lambda q: 1.0),
                    "the scores were not scaled: divide q @ k^T by sqrt(d_k) before the softmax."),
            Mistake(with_scale(lambda q: 1.0 / q.shape[-1]),
                    "you divided by d_k; the scale is 1/sqrt(d_k)."),
            Mistake(wrong_dim, "the softmax ran over the queries (dim=-2); each query's weights "
                               "over the keys (dim=-1) must sum to one."),
            Mistake(inverted_mask, "the mask is inverted: True means 'may attend', so fill the "
                                   "scores with -inf where the mask is False (~mask)."),
        ],
        nan_hint="NaN comes from a softmax over a row whose scores are all -inf. A causal mask "
                 "leaves every query at least itself, unless the mask is inverted: True means "
                 "'may attend', so fill the scores with -inf where the mask is False (~mask).",
    )


def _entropy_cases() -> list[dict]:
    g = _generator(4)
    cases = [{"weights": torch.softmax(torch.randn(shape, generator=g), -1)}
             for shape in [(6,), (3, 5), (2, 2, 4)]]
    cases.append({"weights": torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])})
    return cases


def check_entropy(entropy: Callable) -> CheckResult:
    """Exercise: ``entropy(weights)`` in nats over the last dimension, with ``0 ln 0 = 0``."""

    def reference(weights):
        return torch.special.entr(weights).sum(-1)

    return check_function(
        entropy, reference, _entropy_cases(), what="entropy", output_names=("the entropy",),
        mistakes=[
            Mistake(lambda weights: reference(weights) / math.log(2),
                    "that is the entropy in bits (log base 2); use the natural log for nats."),
            Mistake(lambda weights: -reference(weights),
                    "the sign is flipped: H = -sum_j a_j ln a_j is never negative."),
        ],
        nan_hint="0 * ln 0 is NaN in floating point, but its limit is 0: a key with zero weight "
                 "adds nothing. Use torch.where(weights > 0, ...) or torch.special.entr.",
    )
