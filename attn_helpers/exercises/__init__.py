"""Checkers for the "check yourself" exercises.

``core`` holds the framework (:func:`check_function` runs a learner's function against a reference
on seeded cases and explains the first mismatch); each other module holds one
notebook's checkers, named by the notebook's slug.
"""

from .core import CheckResult, Mistake, check_function, describe, seeded
from .workflow import EXERCISES, Exercise, exercise, hint, progress

__all__ = [
    "EXERCISES",
    "Exercise",
    "exercise",
    "hint",
    "progress",
    "CheckResult",
    "Mistake",
    "check_function",
    "describe",
    "seeded",
]
