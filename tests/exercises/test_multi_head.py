"""Notebook 04's checkers (``exercises.multi_head``)."""

from __future__ import annotations

from attn_helpers.exercises.multi_head import (
    check_merge_heads,
    check_parameter_count,
    check_split_heads,
)
from attn_helpers.multihead import (
    merge_heads,
    parameter_count,
    split_heads,
)

# --- notebook 04's checkers -----------------------------------------------------------------


def test_checkers_pass_the_references():
    assert check_split_heads(split_heads)
    assert check_merge_heads(merge_heads)
    assert check_parameter_count(
        lambda d, h, k, v, bias: parameter_count(d, h, kdim=k, vdim=v, bias=bias))


def test_checkers_explain_known_mistakes():
    verdict = check_split_heads(lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1))
    assert not verdict and "transpose" in verdict.message
    verdict = check_merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    assert not verdict and "Hint" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: 4 * d * d + 4 * d)
    assert not verdict and "kdim" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: d * (d + k + v) + (3 * d if bias else 0))
    assert not verdict and "W_O" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: "many")
    assert not verdict and "should return a number" in verdict.message
    assert not check_split_heads(3)

