"""Level-3 hints are skeletons (issue 24): the key line(s) are left as ``...``; the skeleton alone
does not pass, and filled with the key lines it does (so the skeleton is right)."""

from __future__ import annotations

import torch

from attn_helpers.exercises import EXERCISES


def skeleton(key: str, signature: str, fills: tuple[str, ...] = (), **namespace):
    """The level-3 hint of ``key`` as ``def f(signature)``, its ``...`` replaced by ``fills`` in
    order (none: each ``...`` stays, and running it fails)."""
    text = EXERCISES[key].hints[2]
    code = "\n".join(line.split("#", 1)[0].rstrip() for line in text.splitlines())  # no comments
    parts = code.split("...")
    assert len(parts) > 1, f"hint 3 of {key} is not a skeleton: it has no '...' outside comments"
    if fills:
        assert len(fills) == len(parts) - 1, (key, len(parts) - 1, "blanks", len(fills), "fills")
        text = parts[0] + "".join(f + rest for f, rest in zip(fills, parts[1:], strict=True))
    else:
        text = code
    body = "".join(f"    {line}\n" for line in text.splitlines())
    scope = {"torch": torch, **namespace}
    exec(f"def f({signature}):\n{body}", scope)  # noqa: S102 - the course's own hint text
    return scope["f"]


def assert_skeleton(key: str, signature: str, check, fills: tuple[str, ...], **namespace):
    assert not check(skeleton(key, signature, **namespace)), f"hint 3 of {key} passes as it is"
    result = check(skeleton(key, signature, fills, **namespace))
    assert result, result.message
