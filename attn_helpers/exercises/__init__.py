"""Checkers for the "check yourself" exercises.

``core`` holds the framework (:func:`check_function` runs a learner's function against a reference
on seeded cases and explains the first mismatch); each other module holds one
notebook's checkers, named by the notebook's slug.
"""

from .core import CheckResult, Mistake, check_function, describe, seeded

__all__ = [
    "CheckResult",
    "Mistake",
    "check_function",
    "describe",
    "seeded",
]
