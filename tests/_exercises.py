"""Helpers shared by the checker tests in ``tests/exercises/``: a stub, the rejection assert, and
the level-3 hint turned into code ("nearly the code" must be the code once it sits in the stub)."""

from __future__ import annotations

import torch

from attn_helpers.exercises import EXERCISES, CheckResult


def stub(*args):
    raise NotImplementedError


def assert_rejected(result, *fragments):
    assert isinstance(result, CheckResult)
    assert not result and result.message.startswith("Not yet"), result.message
    for fragment in fragments:
        assert fragment in result.message, (fragment, result.message)


def from_hint(key, signature, **namespace):
    """The level-3 hint of ``key`` as the body of ``def f(signature)``."""
    body = "".join(f"    {line}\n" for line in EXERCISES[key].hints[2].splitlines())
    scope = {"torch": torch, **namespace}
    exec(f"def f({signature}):\n{body}", scope)  # noqa: S102 - the course's own hint text
    return scope["f"]
