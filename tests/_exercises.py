"""Helpers shared by the checker tests in ``tests/exercises/``: a stub, the rejection assert, and
the level-3 hint turned into code ("nearly the code" must be the code once it sits in the stub)."""

from __future__ import annotations

import re

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


def filled_skeleton(key, signature, fills, *, prefix="", **namespace):
    """The level-3 hint of ``key`` (a skeleton whose key lines are ``...``) with each ``...`` replaced,
    in order, by ``fills``, as the body of ``def f(signature)`` after the stub's given lines
    ``prefix``: the skeleton is right when the filled function passes, and it is a skeleton when
    it holds exactly ``len(fills)`` gaps."""
    text = EXERCISES[key].hints[2]
    gap = re.compile(r"(?<![\[(])\.\.\.")  # not x[..., 0::2] nor a shape (..., d)
    assert len(gap.findall(text)) == len(fills), (key, len(gap.findall(text)), len(fills))
    for fill in fills:
        text = gap.sub(lambda _, fill=fill: fill, text, count=1)
    body = "".join(f"    {line}\n" for line in (prefix + text).splitlines())
    scope = {"torch": torch, "math": __import__("math"), **namespace}
    exec(f"def f({signature}):\n{body}", scope)  # noqa: S102 - the course's own hint text
    return scope["f"]
