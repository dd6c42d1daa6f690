"""Checkers for the "check yourself" exercises: ``core`` is the framework, ``workflow`` the
registry, hints and progress, each other module one notebook's checkers (importing registers them)."""

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
