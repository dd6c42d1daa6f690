"""Helpers shared by the checker tests in ``tests/exercises/``: a stub, the rejection assert, and
the level-3 hint turned into code. Level-3 hints are skeletons (issue 24): the key lines are left
as ``...``; the skeleton alone does not pass, and filled with the key lines it does (so "nearly the
code" is the code once it sits in the stub)."""

from __future__ import annotations

import math
import re

import torch

from attn_helpers.exercises import EXERCISES, CheckResult

#: A blank of a skeleton: ``...`` outside comments that is not an index (``x[..., 0::2]``).
GAP = re.compile(r"(?<!\[)\.\.\.")


def stub(*args):
    raise NotImplementedError


def assert_rejected(result, *fragments):
    assert isinstance(result, CheckResult)
    assert not result and result.message.startswith("Not yet"), result.message
    for fragment in fragments:
        assert fragment in result.message, (fragment, result.message)


def skeleton(key, signature, fills=None, *, prefix="", loop="", suffix="", **namespace):
    """The level-3 hint of ``key`` as the body of ``def f(signature)``, after the stub's given lines
    ``prefix``, its comments dropped and each blank ``...`` replaced, in order, by ``fills`` (none:
    the blanks stay, and running it fails). With ``fills`` the hint must hold exactly
    ``len(fills)`` blanks. ``loop``: a stub's loop line (e.g. ``for _ in range(steps):``) whose
    body the hint is; ``suffix``: the stub's given lines after it."""
    code = "\n".join(line.split("#", 1)[0].rstrip() for line in EXERCISES[key].hints[2].splitlines())
    blanks = len(GAP.findall(code))
    assert blanks, f"hint 3 of {key} is not a skeleton: it has no '...' outside comments"
    if fills is not None:
        assert blanks == len(fills), (key, blanks, "blanks", len(fills), "fills")
        for fill in fills:
            code = GAP.sub(lambda _, fill=fill: fill, code, count=1)
    if loop:
        code = loop + "".join(f"\n    {line}" for line in code.splitlines())
    body = "".join(f"    {line}\n" for line in (prefix + code + "\n" + suffix).splitlines())
    scope = {"torch": torch, "math": math, **namespace}
    exec(f"def f({signature}):\n{body}", scope)  # noqa: S102 - the course's own hint text
    return scope["f"]


def assert_skeleton(key, signature, check, fills, **namespace):
    """Hint 3 of ``key`` fails ``check`` as it is and passes once ``fills`` are written in."""
    assert not check(skeleton(key, signature, **namespace)), f"hint 3 of {key} passes as it is"
    result = check(skeleton(key, signature, fills, **namespace))
    assert result, result.message
