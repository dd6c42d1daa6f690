"""Checkers for the "check yourself" exercises.

``core`` holds the framework (:func:`check_function` runs a learner's function against a reference
on seeded cases and explains the first mismatch), ``workflow`` the registry, hints and progress;
each other module holds one notebook's checkers, named by the notebook's slug. Importing the
package registers every exercise, so :func:`hint` and :func:`progress` know them all.
"""

from . import (  # noqa: F401  (each registers its notebook's exercises)
    build_gpt,
    complexity,
    cross_attention,
    masking,
    multi_head,
    positional_encoding,
    query_key_value,
    real_model,
    rnn_bottleneck,
    scaling,
    start_here,
)
from .core import CheckResult, Mistake, check_function, describe, seeded
from .workflow import EXERCISES, Exercise, exercise, hint, passed, progress

__all__ = ["EXERCISES", "Exercise", "exercise", "hint", "passed", "progress", "CheckResult",
           "Mistake", "check_function", "describe", "seeded"]
