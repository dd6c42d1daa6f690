"""What notebook 10's checkers share: the learner's own work only (course code and reference
solutions refused while the learner's object runs, partials and bound methods unwrapped), building
a learner's module with the reference's weights, and the seeded cases (see :mod:`.build_gpt`)."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable

import torch
from torch import nn

from ..lessons import build_gpt as bg
from ..lessons import build_gpt_train as bgt
from .core import (
    CHECKING_A_SOLUTION,
    LEARNER,
    CheckResult,
    seeded,
)

# --- the learner's own work only ---------------------------------------------------------------
# While the learner's object runs, the course's own code that does a whole exercise raises
# (patched and restored around each call by core.blocking); the reference the checker compares
# against runs outside that window. Before anything runs, a class that derives from a course class
# or a *_solution class, or that takes a method from one, is refused, as is a partial or bound
# method of a solution or of the course's code.

#: Private helpers the checking runs while the learner's code does (see borrowing._checker_helper).
CALLED_WHILE_CHECKING = ("_in_pieces",)

#: What does each exercise for the learner: the course's classes' forward, whole-exercise functions.
COURSE_CODE = {
    "attention": [(bg.CausalSelfAttention, "forward")],
    "block": [(bg.Block, "forward")],
    "model": [(bg.GPT, "forward")],
    "train_step": [(bg, "next_token_loss"), (bgt, "train_step"), (bgt, "next_token_loss")],
    "generate": [(bg, "generate")],
}
_INSTEAD = ("This is the course's own code: write it yourself (the course's classes and functions "
            "that do the exercise are refused while yours runs)")
_COURSE_MODULES = ("attn_helpers.lessons.build_gpt", "attn_helpers.exercises")


def _own_work() -> bool:
    """True while a registered checker runs the learner's object (not a reference solution, not
    the tests' direct calls of the bare checker with the course's known mistakes)."""
    return LEARNER.get() is not None and not CHECKING_A_SOLUTION.get()


def _unwrap(obj):
    """The function behind partials, bound methods, static/class methods and decorators."""
    for _ in range(20):
        if isinstance(obj, functools.partial | functools.partialmethod):
            obj = obj.func
        elif isinstance(obj, staticmethod | classmethod) or inspect.ismethod(obj):
            obj = obj.__func__
        elif getattr(obj, "__wrapped__", None) is not None:
            obj = obj.__wrapped__
        else:
            return obj
    return obj


def _not_yours(obj) -> str | None:
    """Why ``obj`` (after unwrapping) is someone else's code, or None."""
    obj = _unwrap(obj)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")
    name = name if isinstance(name, str) else ""
    module = getattr(obj, "__module__", "")
    module = module if isinstance(module, str) else ""
    if any(part.endswith("_solution") for part in name.split(".")):
        return f"{name} comes from the reference solution in the collapsed cell"
    if module.startswith(_COURSE_MODULES):
        return f"{name} is the course's own {module}.{name}"
    return None


def _refuse_borrowed(obj, what: str) -> CheckResult | None:
    """A refusal when the learner's ``obj`` is, derives from or takes its code from a solution or
    the course's own code; None for the learner's own work (or outside a learner's check)."""
    if not _own_work():
        return None
    why = None
    if isinstance(obj, type):
        for base in obj.__mro__[1:]:
            base_module = getattr(base, "__module__", "")
            if base.__name__.endswith("_solution") or (
                    isinstance(base_module, str) and base_module.startswith("attn_helpers")):
                why = (f"{what} derives from {base.__qualname__}, "
                       + ("the reference solution in the collapsed cell" if base.__name__.endswith(
                           "_solution") else f"the course's own {base_module}.{base.__qualname__}"))
                break
        for key, value in vars(obj).items():
            if why is None and (key == "forward" or callable(_unwrap(value))):
                reason = _not_yours(value)
                if reason:
                    why = f"{what}.{key} is not your code: {reason}"
    else:
        reason = _not_yours(obj)
        if reason:
            why = f"{what} is not your code: {reason}"
    if why is None:
        return None
    return CheckResult(False, f"Not yet: {why}. Passing it never counts as your pass; write "
                              f"{what} yourself.")


def _function_or_refusal(fn, what: str) -> CheckResult | None:
    """A refusal when the learner's ``fn`` is not a function or is borrowed (see
    :func:`_refuse_borrowed`); None when it may be checked."""
    if not callable(fn):
        return CheckResult(False, f"Not yet: {what} is not a function (got {type(fn).__name__}).")
    return _refuse_borrowed(fn, what)


def _in_pieces(call: Callable, x: torch.Tensor, split: int, step: int):
    """``call(x[:, :split], 0)``, then ``call(x[:, t:t + step], t)`` for ``t = split, split +
    step, ...``: the outputs concatenated along the positions (None if any call returned None).
    The checkers run a cache this way: a prompt, then new tokens a few at a time."""
    starts = [0, *range(split, x.shape[1], step)]
    outs = [call(x[:, s:e], s) for s, e in zip(starts, [*starts[1:], x.shape[1]], strict=True)]
    if any(o is None for o in outs):
        return None
    return torch.cat(outs, dim=1)


def _forbid(exercise_name: str) -> list:
    return COURSE_CODE[exercise_name] if _own_work() else []


def _safe(produce: Callable) -> Callable:
    """A mistake that crashes on a case simply does not match it."""

    def run(*args):
        try:
            return produce(*args)
        except Exception:
            return None

    return run


def _first_failure(results, what: str = "it") -> CheckResult:
    """The first failed result, else one verdict: ``what`` matched the reference on every case of
    every model size."""
    results = list(results)
    for result in results:
        if not result:
            return result
    counts = [int(r.message.split(" all ")[1].split()[0]) for r in results]
    sizes = f" ({counts[0]} cases at each of {len(counts)} model sizes)" if len(set(counts)) == 1 \
        and len(counts) > 1 else ""
    return CheckResult(True, f"Passed: {what} matches the reference on all {sum(counts)} "
                             f"cases{sizes}, edge cases included.")


def _build(cls, args: tuple, reference: nn.Module, what: str, swap: dict | None = None):
    """The learner's module ``cls(*args)`` with the reference's weights, or a CheckResult."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return CheckResult(False, f"Not yet: {what} should be an nn.Module class, got "
                                  f"{type(cls).__name__}.")
    try:
        module = cls(*args)
        for name, part in (swap or {}).items():
            setattr(module, name, copy.deepcopy(part))
        module.load_state_dict(reference.state_dict())
    except NotImplementedError:
        return CheckResult(False, f"{what} is not implemented yet.")
    except Exception as exc:
        return CheckResult(False, f"Not yet: building {what}{args} and loading the reference's "
                                  f"weights failed ({type(exc).__name__}: {exc}). Keep the stub's "
                                  "__init__: the checker relies on its layer names.")
    module.eval()
    return module


def _randomise(module: nn.Module, seed: int, std: float = 0.5) -> nn.Module:
    """Weights far from the tiny training init, so every mistake shows in the output."""
    g = seeded(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() > 1 else 0.3))
    return module.eval()


def _x_cases(d: int, seed: int) -> list[dict]:
    g = seeded(seed)
    return [{"x": torch.randn(b, n, d, generator=g)} for b, n in [(1, 5), (2, 7), (3, 1), (2, 12)]]
