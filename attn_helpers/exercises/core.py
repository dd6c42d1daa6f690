"""The framework of the exercises: :func:`check_function` runs a learner's function and a
reference on seeded cases and explains the first mismatch (and the known mistake it matches);
:class:`AllocationWatch` is the one watcher of the constraints that are a lesson."""

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
    """A known wrong answer: a learner whose output equals ``produce(*inputs)`` gets ``hint``."""

    produce: Callable
    hint: str


class Refused(Exception):
    """A learner's function broke a constraint that is the lesson; the text explains it."""


def seeded(seed: int) -> torch.Generator:
    """A seeded generator for an exercise's cases."""
    return torch.Generator().manual_seed(seed)


def size(g: torch.Generator, low: int, high: int) -> int:
    """A seeded random size in ``[low, high]``."""
    return int(torch.randint(low, high + 1, (), generator=g))


def describe(inputs: dict) -> str:
    """``q: float32 (2, 3, 4), mask: bool (3, 3)``."""
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
    """None if ``got`` matches ``expected``, else a sentence saying how it differs (``name``, as
    "the output" or "the tokens", is never its subject)."""
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
        mine, right = got[index].item(), expected[index].item()
        digits = next((d for d in (4, 6, 8, 12, 17) if f"{mine:.{d}g}" != f"{right:.{d}g}"), 4)
        form = ".0f" if whole else f".{digits}g"  # whole numbers as such; else digits that differ
        return (f"you returned {name} with wrong values: at index {index} you gave "
                f"{mine:{form}}, expected {right:{form}} "
                f"(largest difference {diff.max().item():.2g}).")
    return None


_WHY = ((("dtype", "scalar type"), "the dtypes do not match"),
        (("out of bounds", "out of range"), "an index is out of range"),
        (("size", "shape", "dimension"), "the shapes do not fit"))


def _why(exc: Exception) -> str:
    """An exception from a learner's function, in words."""
    return next((why for words, why in _WHY if any(w in str(exc) for w in words)),
                f"it raised {type(exc).__name__}")


class AllocationWatch(torch.overrides.TorchFunctionMode):
    """While entered, every tensor a torch call in the learner's code returns (``q @ k.mT``,
    ``k.repeat_interleave(...)``) goes to ``refuse(tensor, call_name)``: None, or the text of a
    :class:`Refused`; so do the intermediates of an einsum of three or more operands. What another
    library call allocates inside itself is not seen."""

    def __init__(self, refuse: Callable[[torch.Tensor, str], str | None]):
        super().__init__()
        self.refuse = refuse

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = _einsum_steps(*args) if func is torch.einsum else []
        name = getattr(func, "__name__", str(func))
        for t in seen + list(out if isinstance(out, tuple | list) else (out,)):
            if isinstance(t, torch.Tensor) and (why := self.refuse(t, name)):
                raise Refused(why)
        return out


def _einsum_steps(equation, *operands) -> list[torch.Tensor]:
    """The partial products torch.einsum builds inside one call: without opt_einsum it contracts the
    operands left to right, keeping each index a later operand or the output still needs."""
    operands = operands[0] if len(operands) == 1 and isinstance(operands[0], list | tuple) else operands
    if not isinstance(equation, str) or len(operands) < 3 or torch.backends.opt_einsum.enabled:
        return []
    inputs, arrow, out = equation.replace(" ", "").replace("...", ".").partition("->")
    terms = inputs.split(",")
    out = out if arrow else "." + "".join(c for c in inputs if inputs.count(c) == 1)
    steps, term = [operands[0]], terms[0]
    for i in range(1, len(terms) - 1):                     # the last product is the output itself
        needed = "".join(terms[i + 1:]) + out
        kept = "".join(dict.fromkeys(c for c in term + terms[i] if c in needed))
        steps.append(torch.einsum(f"{term},{terms[i]}->{kept}".replace(".", "..."), steps[-1],
                                  operands[i]))
        term = kept
    return steps[1:]


def check_function(candidate: Callable, reference: Callable, cases: Iterable[dict], *,
                   what: str = "your function", output_names: Sequence[str] = ("the output",),
                   mistakes: Sequence[Mistake] = (), nan_hint: str | None = None,
                   atol: float = 1e-5, rtol: float = 1e-4,
                   watch: Callable[[dict], contextlib.AbstractContextManager] | None = None,
                   error_hints: Sequence[tuple[str, str]] = (), same_dtype: bool = False) -> CheckResult:
    """Run ``candidate(*case.values())`` and the reference on every case; explain the first miss.
    ``mistakes``: the first whose output equals the candidate's gives its hint; ``nan_hint``: for
    NaN or inf where the answer is finite; ``watch(inputs)``: a context around each call (an
    :class:`AllocationWatch`); ``error_hints``: ``(fragment, hint)`` for an exception's text;
    ``same_dtype``: the dtype must be the reference's too."""
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
            hint = _named_mistake(mistakes, case, got, expected, atol, rtol, candidate, cases)
            if hint is None and nan_hint and isinstance(g, torch.Tensor) and g.shape == e.shape \
                    and (~torch.isfinite(g) & torch.isfinite(e)).any():
                hint = nan_hint
            return CheckResult(False, f"{where} {problem}" + ("" if hint is None else f"\nHint: {hint}"))
    return CheckResult(True, f"Passed: {what} matches the reference on all {len(cases)} cases, "
                             "edge cases included.")


def _empty_rows_as_zeros(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """0 in each row (last axis) that is all NaN in one of ``x``, ``y`` and all 0 in the other."""
    if not (x.dim() and x.is_floating_point() and y.is_floating_point()):
        return x, y
    empty = ((x.isnan().all(-1) & (y == 0).all(-1)) | (y.isnan().all(-1) & (x == 0).all(-1)))[..., None]
    return x.masked_fill(empty, 0), y.masked_fill(empty, 0)


def _named_mistake(mistakes, case, got, expected, atol, rtol, candidate=None, cases=()) -> str | None:
    """The hint of the first mistake whose output equals ``got``, not ``expected`` (NaN equals NaN;
    against ``got``, a row all NaN also equals one all 0: a row with nothing to attend to, from a
    softmax written out or from ah's attention). When several do, the first that also equals
    ``candidate`` on every other case both run on. A lone match names its mistake only when the
    output holds more than one number: one number can equal a mistake's by chance."""
    def same(xs, ys, rows=True) -> bool:
        return all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                   and _close(*(_empty_rows_as_zeros(y, x) if rows else (y, x)), atol, rtol,
                              equal_nan=True) for x, y in zip(xs, ys, strict=False))

    def run(f, on):
        try:
            return _as_tuple(f(*clone_inputs(on).values()))
        except Exception:  # noqa: BLE001 - a mistake (or an answer) that cannot run on this case
            return None

    matching = [m for m in mistakes if (wrong := run(m.produce, case)) is not None
                and same(wrong, got) and not same(wrong, expected, rows=False)]
    several = any(isinstance(g, torch.Tensor) and g.numel() > 1 for g in got)
    if not matching or candidate is None or (len(matching) == 1 and several):
        return matching[0].hint if matching else None
    answers = [run(candidate, other) for other in cases]
    for mistake in matching:
        wrongs = (run(mistake.produce, other) for other in cases)
        if all(a is None or w is None or same(w, a) for a, w in zip(answers, wrongs, strict=True)):
            return mistake.hint
    return matching[0].hint if several else None


def gradient_mismatch(mine: nn.Module, reference: nn.Module, run: Callable, x: torch.Tensor,
                      *, atol: float = 1e-5, rtol: float = 1e-4) -> dict:
    """One backward of ``run(module, x)`` (summed with fixed random weights) through each module:
    ``{name: (got, expected)}`` for each gradient that differs, ``"x"`` then the parameters."""
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
    """Which of query, key and value have wrong gradients, read off the thirds of the fused
    projection ``fused`` (``"qkv.weight"``) in :func:`gradient_mismatch`'s answer."""
    if fused not in wrong:
        return []
    got, expected = (t.reshape(3, -1) for t in wrong[fused])
    return [name for name, g, e in zip(("query", "key", "value"), got, expected, strict=True)
            if not _close(g, e, 1e-5, 1e-4)]
