"""The exercise workflow: a registry of every "check yourself" exercise, hints on demand in three
levels, and the learner's progress in this kernel.

Each notebook's checker module registers its exercises with :func:`exercise`::

    @exercise("masking.kv_cache_step", "one KV-cache step", hints=(
        "what to think about", "the formula", "nearly the code"))
    def check_kv_cache_step(step): ...

A stored notebook shows every exercise unsolved: the learner's function is a stub that raises
``NotImplementedError``, on which the checker says "not implemented yet" and nothing more. Hints
come only when asked for, ``hint("masking.kv_cache_step", 1)`` (1: what to think about, 2: the
formula, 3: nearly the code); :func:`progress` lists which exercises pass in this kernel.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..course_map import COURSE

__all__ = ["Exercise", "EXERCISES", "exercise", "hint", "progress"]


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``key`` is ``"<notebook slug>.<name>"``; three hints, vaguest first."""

    key: str
    title: str
    hints: tuple[str, str, str]

    @property
    def slug(self) -> str:
        return self.key.split(".", 1)[0]


#: Every registered exercise, by key, in the order the checker modules define them.
EXERCISES: dict[str, Exercise] = {}
_RESULTS: dict[str, bool] = {}  # key -> did the last check in this kernel pass?


def exercise(key: str, title: str, *, hints: tuple[str, str, str]) -> Callable:
    """Register the decorated checker as exercise ``key``; its verdicts count for
    :func:`progress`."""
    slug, _, name = key.partition(".")
    if not name or slug not in {lesson.slug for lesson in COURSE}:
        raise ValueError(f"key must be '<notebook slug>.<name>' with a slug of the course, got {key!r}")
    if len(hints) != 3 or not all(isinstance(h, str) and h for h in hints):
        raise ValueError(f"exercise {key!r} needs exactly three non-empty hints")
    EXERCISES[key] = Exercise(key, title, tuple(hints))

    def register(checker: Callable) -> Callable:
        @functools.wraps(checker)
        def checked(*args, **kwargs):
            result = checker(*args, **kwargs)
            _RESULTS[key] = bool(result)
            return result

        checked.exercise_key = key
        return checked

    return register


def _load_all() -> None:
    """Import every notebook's checker module, so that all exercises are registered."""
    for lesson in COURSE:
        try:
            importlib.import_module(f"{__package__}.{lesson.slug}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{lesson.slug}":
                raise


def hint(key: str, level: int = 1) -> None:
    """Print hint ``level`` (1: what to think about, 2: the formula, 3: nearly the code) for
    exercise ``key``, e.g. ``hint("masking.kv_cache_step", 2)``."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a string like 'masking.kv_cache_step', got {type(key).__name__}")
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 3:
        raise ValueError(f"level must be 1, 2 or 3, got {level!r}")
    _load_all()
    if key not in EXERCISES:
        slug = key.partition(".")[0]
        known = [k for k in EXERCISES if k.startswith(slug + ".")] or list(EXERCISES)
        raise ValueError(f"no exercise {key!r}; known: {', '.join(known)}")
    ex = EXERCISES[key]
    print(f"Hint {level} of 3 for '{ex.title}' ({key}):\n{ex.hints[level - 1]}")


def progress(*, show: bool = True) -> dict[str, dict[str, bool | None]]:
    """Which exercises of the course pass in this kernel, per notebook: ``{slug: {key: True
    (passed), False (last check failed) or None (not tried)}}``; printed unless ``show=False``."""
    _load_all()
    table: dict[str, dict[str, bool | None]] = {}
    for key, ex in EXERCISES.items():
        table.setdefault(ex.slug, {})[key] = _RESULTS.get(key)
    if show:
        for lesson in COURSE:
            rows = table.get(lesson.slug, {})
            done = sum(1 for v in rows.values() if v)
            print(f"{lesson.number} {lesson.slug}: {done} of {len(rows)} passed")
            for key, state in rows.items():
                mark = {True: "passed", False: "not yet", None: "not tried"}[state]
                print(f"    {mark:>9}  {EXERCISES[key].title} ({key})")
    return table
