"""What a learner's function may not call while it is checked: :func:`blocking` swaps library
functions (and, in the learner's own globals and closures, the reference solutions, the checkers'
references and their known mistakes) for stand-ins that raise, and restores them afterwards;
:func:`_borrowable` finds what counts as borrowed. Used by :func:`.core.check_function`."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import Mistake

__all__ = ["BlockedCall", "BorrowedCall", "blocking"]


class BlockedCall(Exception):
    """Raised when a learner's function calls a library function the exercise asks them to write."""


class BorrowedCall(BlockedCall):
    """Raised when a learner's function calls a reference solution, a checker's reference or one
    of its known mistakes: code that answers the exercise without the learner writing it."""


@contextlib.contextmanager
def blocking(targets: Sequence[tuple[object, str]], *, namespaces: Sequence[dict] = (),
             borrowed: dict[int, tuple[Callable, str]] | None = None,
             cells: Sequence = ()) -> Iterator[None]:
    """While the block runs, every ``getattr(owner, name)`` in ``targets`` raises
    :class:`BlockedCall` when called: the library functions that would do the exercise for the
    learner (``(attn_helpers, "scaled_dot_product_attention")``, ``(torch.nn.functional,
    "scaled_dot_product_attention")``). ``namespaces`` (a learner's function's globals: the
    notebook's) are searched too, so a name imported with ``from ... import`` is blocked as well.
    ``borrowed`` (``{id(fn): (fn, why)}``) names more objects refused wherever ``namespaces`` or the
    closure ``cells`` hold them, with :class:`BorrowedCall` and the reason ``why``.
    Everything is restored afterwards, whatever happens."""
    saved: list[tuple[object, str, object]] = []
    blocked_objects: dict[int, str] = {}
    borrowed = borrowed or {}
    try:
        for owner, name in targets:
            original = getattr(owner, name)
            label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
            blocked_objects.setdefault(id(original), label)
            saved.append((owner, name, original))
            setattr(owner, name, _blocker(label))
        for namespace in namespaces:
            for name, value in list(namespace.items()):
                if id(value) in blocked_objects:
                    saved.append((namespace, name, value))
                    namespace[name] = _blocker(blocked_objects[id(value)])
                elif id(value) in borrowed and borrowed[id(value)][0] is value:
                    saved.append((namespace, name, value))
                    namespace[name] = _borrowed_blocker(borrowed[id(value)][1])
        for cell in cells:
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if id(value) in blocked_objects:
                saved.append((cell, "cell_contents", value))
                cell.cell_contents = _blocker(blocked_objects[id(value)])
            elif id(value) in borrowed and borrowed[id(value)][0] is value:
                saved.append((cell, "cell_contents", value))
                cell.cell_contents = _borrowed_blocker(borrowed[id(value)][1])
        for fn, why in borrowed.values():  # every other alias too: a default argument, a list,
            if _own_code(fn):              # functools.partial, a class attribute
                saved.append((fn, "__code__", fn.__code__))
                fn.__code__ = _refusing_code(why, len(fn.__code__.co_freevars))
        yield
    finally:
        for owner, name, original in reversed(saved):
            if isinstance(owner, dict):
                owner[name] = original
            else:
                setattr(owner, name, original)


def _blocker(label: str) -> Callable:
    def blocked(*args, **kwargs):
        raise BlockedCall(label)

    return blocked


def _borrowed_blocker(why: str) -> Callable:
    def blocked(*args, **kwargs):
        raise BorrowedCall(why)

    return blocked


def _own_code(fn) -> bool:
    """A reference solution from the notebook, or a function of a checker module (its references
    and known mistakes): code that may be swapped while a learner's function runs. The package's
    library functions are left alone (they are blocked by name where an exercise forbids them)."""
    return isinstance(fn, types.FunctionType) and (
        fn.__name__.endswith("_solution") or _defined_in_checkers(fn))


def _refusing_code(why: str, free: int) -> types.CodeType:
    """A code object that raises :class:`BorrowedCall` with ``why``, with ``free`` free variables
    (a function's ``__code__`` may only be swapped for one with as many)."""
    names = [f"_v{i}" for i in range(free)]
    lines = [f"def _outer({', '.join(names)}):", "    def refused(*args, **kwargs):",
             f"        ({', '.join(names)}{',' if names else ''})",
             "        raise __import__('attn_helpers.exercises.borrowing', fromlist=['_']"
             f").BorrowedCall({why!r})", "    return refused"]
    scope: dict = {}
    exec("\n".join(lines), scope)  # noqa: S102 - the course's own text
    return scope["_outer"](*([None] * free)).__code__


_PACKAGE = __name__.rpartition(".")[0]  # attn_helpers.exercises
_FRAMEWORK = {f"{_PACKAGE}.{m}" for m in ("core", "workflow", "borrowing", "guards")}


def _checker_modules() -> list:
    return [m for name, m in list(sys.modules.items())
            if name.startswith(_PACKAGE + ".") and name not in _FRAMEWORK and m is not None]


def _defined_in_checkers(obj) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.startswith(_PACKAGE + ".") and module not in _FRAMEWORK


def _functions(candidate) -> list:
    """The candidate and, for a class, its own methods: where its code looks names up."""
    found = [candidate]
    if isinstance(candidate, type):
        found += [v for k, v in vars(candidate).items() if callable(v) and not k.startswith("__")
                  or k in ("__init__", "__call__")]
    else:
        found += [getattr(candidate, "forward", None), getattr(candidate, "__init__", None)]
    return [getattr(f, "__func__", f) for f in found if f is not None]


def _closure_cells(candidate) -> list:
    cells = []
    for fn in _functions(candidate):
        cells += list(getattr(fn, "__closure__", None) or ())
    return cells


def _borrowable(root, reference: Callable, mistakes: Sequence[Mistake]
                ) -> dict[int, tuple[Callable, str]]:
    """What the learner's function must not call while it is checked: every ``*_solution`` in its
    globals or closure (the collapsed cells' reference solutions), every checker module's
    ``*_reference`` and the names in its ``REFUSED_WHILE_CHECKING`` (e.g. a mistake generator
    that is right with its default arguments), this check's reference and its known mistakes."""
    found: dict[int, tuple[Callable, str]] = {}

    def add(obj, why):
        if callable(obj):
            found.setdefault(id(obj), (obj, why))

    values = [v for ns in _namespaces(root) for v in ns.values()]
    for cell in _closure_cells(root):
        with contextlib.suppress(ValueError):
            values.append(cell.cell_contents)
    for value in values:
        name = getattr(value, "__name__", "")
        if isinstance(name, str) and name.endswith("_solution") and callable(value):
            add(value, f"{name}, the reference solution from the collapsed cell")
    for module in _checker_modules():
        extra = set(getattr(module, "REFUSED_WHILE_CHECKING", ()))
        short = module.__name__.rpartition(".")[2]
        for name, value in list(vars(module).items()):
            if (name.endswith("_reference") or name in extra) and callable(value) and not (
                    isinstance(value, type) or getattr(value, "exercise_key", None)):
                add(value, f"{short}.{name}, the checker's own reference")
            elif _checker_helper(module, name, value):
                add(value, f"{short}.{name}, the checker's own code")
    add(reference, f"{getattr(reference, '__name__', 'the reference')}, the checker's reference")
    for mistake in mistakes:
        add(mistake.produce, "one of the checker's known mistakes")
    return found


def _checker_helper(module, name: str, value) -> bool:
    """A private function of a checker module (a mistake generator, a scorer, a case builder;
    not in its ``__all__``): reaching it from a learner's function borrows the checker's answer.
    Public names stay callable (``given_self_attention``: the stub calls it), and so do the
    private helpers the checking itself runs around the learner's function (the module's
    ``CALLED_WHILE_CHECKING``)."""
    return (isinstance(value, types.FunctionType) and value.__module__ == module.__name__
            and name not in getattr(module, "__all__", ()) and not name.startswith("check_")
            and not getattr(value, "exercise_key", None)
            and name not in getattr(module, "CALLED_WHILE_CHECKING", ()))


def _namespaces(candidate: Callable) -> list[dict]:
    """The globals a learner's function (or a class's methods) looks names up in."""
    found = []
    for fn in _functions(candidate):
        namespace = getattr(fn, "__globals__", None)
        if isinstance(namespace, dict) and all(namespace is not n for n in found):
            found.append(namespace)
    return found
