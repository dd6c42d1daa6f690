"""Checkers for the "check yourself" exercises.

:func:`check_function` runs a learner's function and a reference on the same seeded inputs,
edge cases included, and explains the first mismatch in plain words: which case, which input
shapes, what went wrong (an exception, a wrong shape, NaN, a wrong number) and, when the answer
matches a known mistake, a hint. Each notebook's checkers live in their own module of this
package and are thin wrappers that fix the reference, the cases and the known mistakes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .borrowing import (  # noqa: F401  (re-exported: checkers import them from here)
    BlockedCall,
    BorrowedCall,
    _borrowable,
    _checker_modules,
    _closure_cells,
    _defined_in_checkers,
    _namespaces,
    blocking,
)

__all__ = ["BORROWED", "CheckResult", "Mistake", "Refused", "as_number", "blocking", "check_function",
           "describe", "own_work_guard", "refusing_ops", "seeded"]


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


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, *,
           equal_nan: bool = False) -> bool:
    return torch.allclose(got.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)


def _compare(got, expected, name: str, atol: float, rtol: float, *,
             same_dtype: bool = False) -> str | None:
    """None if ``got`` matches ``expected``, else a sentence saying how it differs. ``name`` may
    be singular or plural ("the output", "the tokens"), so no sentence has it as its subject."""
    if not isinstance(got, torch.Tensor):
        return f"you returned {name} as a {type(got).__name__}; return a torch.Tensor."
    if got.shape != expected.shape:
        return (f"you returned {name} with shape {tuple(got.shape)}, but the right answer has "
                f"shape {tuple(expected.shape)}.")
    if not got.is_floating_point():
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
        over = torch.where(diff > 0, torch.nan_to_num(over, nan=float("inf")), 0)  # 0/0, inf/inf
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


class Refused(Exception):
    """Raised by a checker's ``guard`` (see :func:`check_function`) when the learner's function
    does something the exercise rules out (builds the matrix it must avoid); its text is the
    whole explanation the learner sees."""


#: True while a checker runs a reference solution (``check(fn_solution, solution=True)``, set by
#: the workflow): then a solution may call another, and nothing is refused as borrowed.
CHECKING_A_SOLUTION: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "checking_a_solution", default=False)

#: The object the learner handed to a registered checker (set by the workflow while it runs):
#: its globals and closure are searched for solutions even when the checker wraps it.
LEARNER: contextvars.ContextVar[object] = contextvars.ContextVar("learner", default=None)


def own_work_guard(candidate: Callable, reference: Callable) -> Callable[[], object]:
    """For a checker that calls the learner's function itself (not through
    :func:`check_function`): ``guard()`` gives the context to enter around each call, in which,
    as in :func:`check_function`, the collapsed cells' solutions, ``reference`` and the checkers'
    own code are refused however they are reached (a wrapper, an alias), unless a reference
    solution is being checked. A refusal raises :class:`BorrowedCall` (or :class:`BlockedCall`)."""
    root = LEARNER.get() if LEARNER.get() is not None else candidate
    own_work = not CHECKING_A_SOLUTION.get() and not _defined_in_checkers(root)
    borrowed = _borrowable(root, reference, ()) if own_work else {}
    namespaces = ([*_namespaces(root), *(vars(m) for m in _checker_modules())]
                  if own_work else [])
    cells = _closure_cells(root) if own_work else ()
    return lambda: blocking((), namespaces=namespaces, borrowed=borrowed, cells=cells)


BORROWED = ("Wrapping it does the exercise for you and never counts as your pass; write the steps "
            "yourself.")


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
    forbid: Sequence[tuple[object, str]] = (),
    instead: str = "Write the steps yourself",
    guard: Callable[[dict], contextlib.AbstractContextManager] | None = None,
    error_hints: Sequence[tuple[str, str]] = (),
    same_dtype: bool = False,
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
        forbid: ``(owner, name)`` pairs of library functions that would do the exercise for the
            learner; calling one while the candidate runs fails the check with a message naming
            it (see :func:`blocking`), and so does handing one in as the answer itself. The
            reference and the known mistakes may use them.
        instead: what the learner should write instead of a forbidden call (said in its message).
        guard: ``guard(inputs)`` returns a context manager entered around each candidate call; it
            raises :class:`Refused` to fail the check with its own message (used to watch for a
            tensor the exercise says not to build).
        error_hints: ``(fragment, hint)`` pairs: when the candidate raises an exception whose
            text contains ``fragment``, the likely mistake ``hint`` is named after it.
        same_dtype: each returned tensor must have the reference's dtype (where the exercise
            promises one: the input's, or a named one).
    """
    if not callable(candidate):
        return CheckResult(False, f"Not yet: {what} is not a function (got {type(candidate).__name__}).")
    for owner, name in forbid:
        if candidate is getattr(owner, name, None):
            label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
            return CheckResult(False, f"Not yet: {what} is {label}, which does this exercise for "
                                      f"you. {instead}; the checker refuses it here.")
    cases = list(cases)
    # The learner's own work only: while it runs, the collapsed cells' solutions, the checkers'
    # references and known mistakes are refused, however they are reached (a wrapper, an alias).
    # Not for a reference solution, nor for the checkers' own known mistakes that tests hand in.
    root = LEARNER.get() if LEARNER.get() is not None else candidate
    own_work = not CHECKING_A_SOLUTION.get() and not _defined_in_checkers(root)
    borrowed = _borrowable(root, reference, mistakes) if own_work else {}
    namespaces = [*_namespaces(candidate), *(ns for ns in _namespaces(root) if all(
        ns is not n for n in _namespaces(candidate)))] if (forbid or own_work) else []
    if own_work:
        namespaces += [vars(m) for m in _checker_modules()]
    cells = _closure_cells(root) if own_work else ()
    for number, case in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({describe(case)})"
        inputs = _clone(case)
        try:
            watch = guard(inputs) if guard is not None else contextlib.nullcontext()
            with blocking(forbid, namespaces=namespaces, borrowed=borrowed, cells=cells), watch:
                got = candidate(*inputs.values())
        except NotImplementedError:  # the stored stub: say so, and nothing more
            return CheckResult(False, f"{what} is not implemented yet.")
        except BorrowedCall as exc:
            return CheckResult(False, f"Not yet: {what} called {exc}. {BORROWED}")
        except BlockedCall as exc:
            return CheckResult(False, f"Not yet: {what} called {exc}, which does this exercise for "
                                      f"you. {instead}; the checker blocks it here.")
        except Refused as exc:
            return CheckResult(False, f"Not yet: on {where}, {exc}")
        except Exception as exc:  # the learner's bug, reported in words
            for fragment, hint in error_hints:
                if fragment in str(exc):
                    return CheckResult(False, f"Not yet: on {where}, {what} failed: "
                                              f"{_why(exc)} ({exc}).\nHint: {hint}")
            return CheckResult(False, f"Not yet: on {where}, {what} raised "
                                      f"{type(exc).__name__}: {exc}")
        for name, value in case.items():
            if isinstance(value, torch.Tensor) and not torch.equal(
                    torch.nan_to_num(inputs[name]), torch.nan_to_num(value)):
                return CheckResult(False, f"Not yet: on {where}, {what} changed its input "
                                          f"'{name}' in place; work on a copy instead.")
        if got is None and number == 1:
            return CheckResult(False, f"{what} is not implemented yet (it returned None).")
        expected = _as_tuple(reference(*_clone(case).values()))
        got = tuple(got) if isinstance(got, list) and len(expected) > 1 else _as_tuple(got)
        if len(got) != len(expected):
            return CheckResult(False, f"Not yet: on {where}, {what} returned {len(got)} value(s); "
                                      f"expected {len(expected)} ({', '.join(output_names)}).")
        names = [*output_names, *(f"output {i + 1}" for i in range(len(output_names), len(got)))]
        for name, g, e in zip(names, got, expected, strict=False):
            problem = _compare(g, e, name, atol, rtol, same_dtype=same_dtype)
            if problem is None:
                continue
            message = f"Not yet: on {where}, {problem}"
            if same_dtype and _compare(g, e, name, atol, rtol) is None:
                return CheckResult(False, message)           # right values, only the dtype is not

            def same(xs, ys) -> bool:
                return all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                           and x.shape == y.shape and _close(y, x, atol, rtol, equal_nan=True)
                           for x, y in zip(xs, ys, strict=False))

            for mistake in mistakes:  # a known mistake first, NaN equal to NaN: it may give NaN
                try:
                    wrong = _as_tuple(mistake.produce(*_clone(case).values()))
                except Exception:  # noqa: BLE001 - a mistake that cannot be made on this case
                    continue
                if same(wrong, got) and not same(wrong, expected):  # named only where it shows
                    return CheckResult(False, f"{message}\nHint: {mistake.hint}")
            if nan_hint and isinstance(g, torch.Tensor) and g.shape == e.shape and (
                    ~torch.isfinite(g) & torch.isfinite(e)).any():
                return CheckResult(False, f"{message}\nHint: {nan_hint}")
            return CheckResult(False, message)
    return CheckResult(True, f"Passed: {what} matches the reference on all {len(cases)} cases, "
                             "edge cases included.")


def seeded(seed: int) -> torch.Generator:
    """A generator for building an exercise's cases, so its verdicts are reproducible."""
    return torch.Generator().manual_seed(seed)


def as_number(fn: Callable, expected: str) -> Callable:
    """Wrap a learner's function that returns a plain number so :func:`check_function` can
    compare it: the number comes back as a float64 scalar tensor (``None``, a stub's answer,
    stays ``None``). Anything else raises a ``TypeError`` saying ``expected``, which the checker
    reports in words."""
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


# The low-level guards (refusing aten ops however they are reached) live in .guards.
from .guards import refusing_ops  # noqa: E402
