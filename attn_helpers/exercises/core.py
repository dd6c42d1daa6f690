"""The framework of the "check yourself" exercises.

:func:`check_function` runs a learner's function and a reference on the same seeded inputs, edge
cases included, and explains the first mismatch in plain words: which case, which input shapes,
what went wrong (an exception, a wrong shape, NaN, a wrong number) and, when the answer matches a
known mistake, what that mistake is. :func:`gradient_mismatch` compares a module's gradients after
one backward. :class:`AllocationWatch` is the one watcher of the constraints that are a lesson
itself (no n x n scores where the lesson is memory, no K/V copied to every head).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


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


class Refused(Exception):
    """Raised while a learner's function runs when it breaks a constraint that is the lesson
    (builds the matrix it must avoid); its text is the whole explanation the learner sees."""


def seeded(seed: int) -> torch.Generator:
    """A generator for building an exercise's cases, so its verdicts are reproducible."""
    return torch.Generator().manual_seed(seed)


def size(g: torch.Generator, low: int, high: int) -> int:
    """A seeded random size in ``[low, high]``, for cases with random shapes."""
    return int(torch.randint(low, high + 1, (), generator=g))


def describe(inputs: dict) -> str:
    """``q: float32 (2, 3, 4), mask: bool (3, 3)``: what a case's inputs look like."""
    return ", ".join(f"{name}: {str(v.dtype).removeprefix('torch.')} {tuple(v.shape)}"
                     if isinstance(v, torch.Tensor) else f"{name}={v!r}" for name, v in inputs.items())


def clone_inputs(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, *,
           equal_nan: bool = False) -> bool:
    return torch.allclose(got.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)


def compare(got, expected, name: str, atol: float = 1e-5, rtol: float = 1e-4, *,
            same_dtype: bool = False) -> str | None:
    """None if ``got`` matches ``expected``, else a sentence saying how it differs. ``name`` may
    be singular or plural ("the output", "the tokens"), so no sentence has it as its subject."""
    if not isinstance(got, torch.Tensor):
        return f"you returned {name} as a {type(got).__name__}; return a torch.Tensor."
    if got.shape != expected.shape:
        return (f"you returned {name} with shape {tuple(got.shape)}, but the right answer has "
                f"shape {tuple(expected.shape)}.")
    if expected.is_floating_point() and not got.is_floating_point():
        return f"you returned {name} with dtype {got.dtype}; expected a floating-point tensor."
    if same_dtype and got.dtype != expected.dtype:
        return (f"you returned {name} as {got.dtype}; the right answer is {expected.dtype} (the "
                "exercise says which: keep the input's dtype, or the one it names).")
    bad = ~torch.isfinite(got) & torch.isfinite(expected)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        return (f"you returned {name} with {got[index].item()} at index {index}, where the right "
                f"answer is {expected[index].item():.4g}.")
    if not _close(got, expected, atol, rtol):
        diff = (got.double() - expected.double()).abs()
        diff = diff.masked_fill(got.double() == expected.double(), 0)  # equal infinities: no gap
        over = diff / (atol + rtol * expected.double().abs())  # > 1 where the tolerance breaks
        over = torch.where(diff > 0, torch.nan_to_num(over, nan=float("inf")), 0)
        index = tuple(int(i) for i in (over == over.max()).nonzero()[0])
        whole = bool((expected == expected.round()).all() and (got == got.round()).all())
        form = ".0f" if whole else ".4g"                  # token ids and counts as whole numbers
        return (f"you returned {name} with wrong values: at index {index} you gave "
                f"{got[index].item():{form}}, expected {expected[index].item():{form}} "
                f"(largest difference {diff.max().item():.2g}).")
    return None


def _why(exc: Exception) -> str:
    """What an exception from a learner's function says, in words, before its own text."""
    text = str(exc)
    if "dtype" in text or "scalar type" in text:
        return "the dtypes do not match"
    if "out of bounds" in text or "out of range" in text:
        return "an index is out of range"
    if any(word in text for word in ("size", "shape", "dimension")):
        return "the shapes do not fit"
    return f"it raised {type(exc).__name__}"


class AllocationWatch(torch.overrides.TorchFunctionMode):
    """The one watcher of allocated tensors: while it is entered, every tensor that a torch call
    in the learner's own Python returns (``q @ k.mT``, ``k.repeat_interleave(...)``, an
    ``nn.Linear``'s output) is handed to ``refuse(tensor, call_name)``, which returns None or the
    text of a :class:`Refused`. What a library call allocates inside itself (``matmul``
    broadcasting a size-1 axis) is not seen: only what the learner's code holds."""

    def __init__(self, refuse: Callable[[torch.Tensor, str], str | None]):
        super().__init__()
        self.refuse = refuse

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                why = self.refuse(t, getattr(func, "__name__", str(func)))
                if why:
                    raise Refused(why)
        return out


def held(t: torch.Tensor) -> int:
    """How many numbers the storage behind ``t`` holds (a view holds its base's)."""
    try:
        return t.untyped_storage().nbytes() // t.element_size()
    except (RuntimeError, NotImplementedError):   # no storage to read (a meta or sparse tensor)
        return 0


def check_function(candidate: Callable, reference: Callable, cases: Iterable[dict], *,
                   what: str = "your function", output_names: Sequence[str] = ("the output",),
                   mistakes: Sequence[Mistake] = (), nan_hint: str | None = None,
                   atol: float = 1e-5, rtol: float = 1e-4,
                   watch: Callable[[dict], contextlib.AbstractContextManager] | None = None,
                   error_hints: Sequence[tuple[str, str]] = (), same_dtype: bool = False) -> CheckResult:
    """Run ``candidate(*case.values())`` (by position, so the learner names the parameters) and
    the reference on every case; explain the first miss. The first of ``mistakes`` whose output
    equals the candidate's names what went wrong; ``nan_hint`` is added for NaN or inf where the
    answer is finite; ``watch(inputs)`` is a context around each call (an :class:`AllocationWatch`,
    whose :class:`Refused` fails the check with its text); ``error_hints`` are ``(fragment, hint)``
    for an exception whose text holds the fragment; ``same_dtype``: keep the reference's dtype."""
    if not callable(candidate):
        return CheckResult(False, f"Not yet: {what} is not a function (got {type(candidate).__name__}).")
    cases = list(cases)
    for number, case in enumerate(cases, start=1):
        where = f"Not yet: on case {number} of {len(cases)} ({describe(case)}),"
        inputs = clone_inputs(case)
        try:
            with watch(inputs) if watch is not None else contextlib.nullcontext():
                got = candidate(*inputs.values())
        except NotImplementedError:  # the stored stub: say so, and nothing more
            return CheckResult(False, f"{what} is not implemented yet.")
        except Refused as exc:
            return CheckResult(False, f"{where} {exc}")
        except Exception as exc:  # the learner's bug, reported in words
            hint = next((hint for fragment, hint in error_hints if fragment in str(exc)), None)
            if hint is None:
                return CheckResult(False, f"{where} {what} raised {type(exc).__name__}: {exc}")
            return CheckResult(False, f"{where} {what} failed: {_why(exc)} ({exc}).\nHint: {hint}")
        for name, value in case.items():
            if isinstance(value, torch.Tensor) and not torch.equal(
                    torch.nan_to_num(inputs[name]), torch.nan_to_num(value)):
                return CheckResult(False, f"{where} {what} changed its input '{name}' in place; "
                                          "work on a copy instead.")
        if got is None and number == 1:
            return CheckResult(False, f"{what} is not implemented yet (it returned None).")
        expected = _as_tuple(reference(*clone_inputs(case).values()))
        got = tuple(got) if isinstance(got, list) and len(expected) > 1 else _as_tuple(got)
        if len(got) != len(expected):
            return CheckResult(False, f"{where} {what} returned {len(got)} value(s); "
                                      f"expected {len(expected)} ({', '.join(output_names)}).")
        names = [*output_names, *(f"output {i + 1}" for i in range(len(output_names), len(got)))]
        for name, g, e in zip(names, got, expected, strict=False):
            problem = compare(g, e, name, atol, rtol, same_dtype=same_dtype)
            if problem is None:
                continue
            if same_dtype and compare(g, e, name, atol, rtol) is None:
                return CheckResult(False, f"{where} {problem}")  # right values, only the dtype is not
            hint = _named_mistake(mistakes, case, got, expected, atol, rtol)
            if hint is None and nan_hint and isinstance(g, torch.Tensor) and g.shape == e.shape \
                    and (~torch.isfinite(g) & torch.isfinite(e)).any():
                hint = nan_hint
            return CheckResult(False, f"{where} {problem}" + ("" if hint is None else f"\nHint: {hint}"))
    return CheckResult(True, f"Passed: {what} matches the reference on all {len(cases)} cases, "
                             "edge cases included.")


def _named_mistake(mistakes, case, got, expected, atol, rtol) -> str | None:
    """The hint of the first mistake whose output equals ``got`` (NaN equal to NaN: a mistake may
    give NaN) and differs from ``expected`` on this case."""
    def same(xs, ys) -> bool:
        return all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                   and x.shape == y.shape and _close(y, x, atol, rtol, equal_nan=True)
                   for x, y in zip(xs, ys, strict=False))

    for mistake in mistakes:
        try:
            wrong = _as_tuple(mistake.produce(*clone_inputs(case).values()))
        except Exception:  # noqa: BLE001 - a mistake that cannot be made on this case
            continue
        if same(wrong, got) and not same(wrong, expected):
            return mistake.hint
    return None


def gradient_mismatch(mine: nn.Module, reference: nn.Module, run: Callable, x: torch.Tensor,
                      *, atol: float = 1e-5, rtol: float = 1e-4) -> dict:
    """One backward through each module (``run(module, x)``, weighted by fixed random numbers and
    summed) holding the same weights: ``{name: (got, expected)}`` for every gradient that differs,
    ``"x"`` (the input) then the parameters; a missing gradient counts as zeros."""
    grads = []
    for module in (mine, reference):
        module.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_(x.is_floating_point())
        out = run(module, xi)
        weight = torch.randn(out.shape, generator=seeded(0), dtype=out.dtype)
        if out.requires_grad:
            (out * weight).sum().backward()
        grads.append({"x": xi.grad, **{n: p.grad for n, p in module.named_parameters()}})
    wrong = {}
    for name, expected in grads[1].items():
        if expected is None:
            continue
        got = grads[0].get(name)
        got = torch.zeros_like(expected) if got is None else got
        if got.shape != expected.shape or not _close(got, expected, atol, rtol):
            wrong[name] = (got, expected)
    return wrong


def detached_parts(wrong: dict, fused: str) -> list[str]:
    """Which of the query, key and value went wrong, read off the gradient of a fused projection
    ``fused`` (``"qkv.weight"``: its rows are W_Q, W_K, W_V stacked) in :func:`gradient_mismatch`'s
    answer: the thirds whose gradients differ."""
    if fused not in wrong:
        return []
    got, expected = (t.reshape(3, -1) for t in wrong[fused])
    return [name for name, g, e in zip(("query", "key", "value"), got, expected, strict=True)
            if not _close(g, e, 1e-5, 1e-4)]


def as_number(fn: Callable, expected: str) -> Callable:
    """Wrap a learner's function that returns a plain number so :func:`check_function` can
    compare it: the number comes back as a float64 scalar tensor (``None``, a stub's answer,
    stays ``None``). Anything else raises a ``TypeError`` saying ``expected``."""
    if not callable(fn):
        return fn

    def wrapped(*args):
        value = fn(*args)
        if value is None:
            return None
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{expected}, got {type(value).__name__}")
        return torch.tensor(float(value), dtype=torch.float64)

    return wrapped
