"""Checkers for the "check yourself" exercises.

``core`` holds the framework (:func:`check_function` runs a learner's function against a reference
on seeded cases and explains the first mismatch); each other module holds one notebook's checkers.
"""

from .core import CheckResult, Mistake, check_function, describe, seeded
from .qkv import check_attention, check_entropy, check_softmax

__all__ = [
    "CheckResult",
    "Mistake",
    "check_function",
    "describe",
    "seeded",
    "check_attention",
    "check_entropy",
    "check_softmax",
]
