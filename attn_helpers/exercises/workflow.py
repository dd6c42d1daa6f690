"""The exercise workflow: the registry of every "check yourself" exercise, hints in three levels,
and the learner's progress, kept across notebooks in a small JSON file (:func:`progress_file`).
A checker registers with ``@exercise("masking.rolling_cache_step", title, hints=(h1, h2, h3))``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..course_map import COURSE
from ..training import single_thread


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``key`` is ``"<notebook slug>.<name>"``; three hints, vaguest first."""

    key: str
    title: str
    hints: tuple[str, str, str]

    @property
    def slug(self) -> str:
        return self.key.split(".", 1)[0]


#: Every registered exercise, by key, in the order the checker modules are imported.
EXERCISES: dict[str, Exercise] = {}
_RESULTS: dict[str, bool] = {}  # key -> did the learner's last check in this kernel pass?


def progress_file() -> Path:
    """``$ATTN_COURSE_PROGRESS_DIR/progress.json`` if set, else ``progress.json`` in the user data
    directory (``~/.local/share``, ``~/Library/Application Support`` or ``%APPDATA%``)."""
    if folder := os.environ.get("ATTN_COURSE_PROGRESS_DIR"):
        return Path(folder) / "progress.json"
    base = {"win32": os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming",
            "darwin": Path.home() / "Library" / "Application Support"}.get(
        sys.platform, os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return Path(base) / "attention-step-by-step" / "progress.json"


def _read_passes() -> dict[str, str]:
    """``{key: ISO time of the pass}``; an unreadable file reads as empty."""
    try:
        data = json.loads(progress_file().read_text())
    except (OSError, ValueError):
        return {}
    passes = data.get("passed", {}) if isinstance(data, dict) else {}
    return {k: v for k, v in passes.items() if isinstance(k, str) and isinstance(v, str)}


def _record(key: str, passed: bool) -> None:
    """Save the latest verdict: a pass adds the key, a failure removes it."""
    passes = _read_passes()
    if passed == (key in passes):
        return
    if passed:
        passes[key] = datetime.now(UTC).isoformat(timespec="seconds")
    else:
        del passes[key]
    path = progress_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"passed": passes}, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: the pass still counts in this kernel
        print(f"(could not save your progress to {path}: {exc})")


def reset_progress() -> Path:
    """Forget every recorded pass (the file and this kernel's); returns the file's path."""
    path = progress_file()
    path.unlink(missing_ok=True)
    _RESULTS.clear()
    return path


def exercise(key: str, title: str, *, hints: tuple[str, str, str]) -> Callable:
    """Register the decorated checker as exercise ``key``. ``check(fn)`` records the learner's
    verdict; ``check(fn_solution, solution=True)`` records nothing and raises ``AssertionError``
    if the reference solution fails."""
    EXERCISES[key] = Exercise(key, title, tuple(hints))

    def register(checker: Callable) -> Callable:
        @functools.wraps(checker)
        def checked(*args, solution: bool = False, **kwargs):
            with single_thread():  # tiny cases: a second thread on a busy machine only waits
                result = checker(*args, **kwargs)
            if solution:
                if not result:
                    raise AssertionError(f"the reference solution of {key} fails its checker: "
                                         f"{result.message}")
                return type(result)(True, "Reference solution: it passes the checker. This does "
                                          "not count as your pass; your own function does.")
            _RESULTS[key] = bool(result)
            _record(key, bool(result))
            return result

        checked.exercise_key = key
        return checked

    return register


def passed(key: str) -> bool:
    """Did the learner's own function pass exercise ``key`` in this kernel?"""
    return bool(_RESULTS.get(key))


def hint(key: str, level: int = 1) -> None:
    """Print hint ``level`` (1: what to think about, 2: the formula, 3: a skeleton) of ``key``."""
    if not isinstance(key, str):
        raise TypeError("key must be a string like 'masking.rolling_cache_step', got "
                        f"{type(key).__name__}")
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 3:
        raise ValueError(f"level must be 1, 2 or 3, got {level!r}")
    if key not in EXERCISES:
        slug = key.partition(".")[0]
        known = [k for k in EXERCISES if k.startswith(slug + ".")] or list(EXERCISES)
        raise ValueError(f"no exercise {key!r}; known: {', '.join(known)}")
    ex = EXERCISES[key]
    print(f"Hint {level} of 3 for '{ex.title}' ({key}):\n{ex.hints[level - 1]}")


def progress(slug: str | None = None, *, show: bool = True) -> dict[str, dict[str, bool | None]]:
    """``{slug: {key: True (passed), False (not yet) or None (not tried)}}`` for one notebook or
    the course, printed unless ``show=False``. This kernel's verdict wins, else the saved one."""
    slugs = [lesson.slug for lesson in COURSE]
    if slug is not None and slug not in slugs:
        raise ValueError(f"slug must be one of {', '.join(slugs)}, got {slug!r}")
    saved = _read_passes()
    table: dict[str, dict[str, bool | None]] = {}
    for key, ex in EXERCISES.items():
        if slug in (None, ex.slug):
            table.setdefault(ex.slug, {})[key] = _RESULTS.get(key, True if key in saved else None)
    for lesson in COURSE if show else ():
        if slug in (None, lesson.slug):
            rows = table.get(lesson.slug, {})
            done = sum(map(bool, rows.values()))
            print(f"{lesson.number} {lesson.slug}: {done} of {len(rows)} passed")
            for key, state in rows.items():
                mark = {True: "passed", False: "not yet", None: "not tried"}[state]
                print(f"    {mark:>9}  {EXERCISES[key].title} ({key})")
    return table
