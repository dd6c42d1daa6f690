"""Helpers of the checker tests: a stub, a wrong answer two files read, the rejection assert, and the
level-3 hint (a skeleton whose key lines are ``...``) turned into code, which fails as it is and
passes once filled."""

from __future__ import annotations

import math
import re

import torch

from attn_helpers.exercises import EXERCISES, CheckResult

#: A blank of a skeleton: ``...`` outside comments that is not an index (``x[..., 0::2]``).
GAP = re.compile(r"(?<!\[)\.\.\.")


def stub(*args):
    raise NotImplementedError


def one_hot_only(X):  # noqa: N803 - notebook 02, exercise 2: right for X = I only (no embedding)
    n, d = X.shape
    W_Q = torch.zeros(d, n, dtype=X.dtype)                                    # noqa: N806
    W_Q[:n] = 10 * torch.eye(n, dtype=X.dtype)
    return W_Q, W_Q @ torch.roll(torch.eye(n, dtype=X.dtype), 1, dims=1).T


def assert_rejected(result, *fragments):
    assert isinstance(result, CheckResult)
    assert not result and result.message.startswith("Not yet"), result.message
    for fragment in fragments:
        assert fragment in result.message, (fragment, result.message)


def skeleton(key, signature, fills=None, *, prefix="", loop="", suffix="", **namespace):
    """Hint 3 of ``key`` as the body of ``def f(signature)`` after ``prefix``, comments dropped, its
    blanks ``...`` replaced in order by ``fills`` (exactly as many; none: left as they are);
    ``loop``: a loop line (``for _ in range(steps):``) the hint is the body of; ``suffix`` after."""
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
