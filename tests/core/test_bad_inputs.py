"""Bad input gets a ValueError or TypeError that names the argument and the shapes it got
(COURSE_DESIGN.md, "Public contract"), never a deep error from inside torch nor a silent answer."""

from __future__ import annotations

import re

import pytest
import torch

from attn_helpers import (
    additive_scores,
    attention_entropy,
    causal_mask,
    dot_product_scores,
    effective_keys,
    key_padding_to_attention_mask,
    masked_softmax,
    max_entropy,
    normalized_entropy,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from attn_helpers.notebook import setup
from attn_helpers.widgets import AttentionFrame


def t(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


def sdpa(q, k, v, mask=None, **kwargs):
    return lambda: scaled_dot_product_attention(q, k, v, mask, **kwargs)


CASES = {
    # name: (callable, expected exception, regex on the message)
    "q not a tensor": (
        sdpa([[1.0, 2.0]], t(3, 2), t(3, 2)), TypeError, r"q must be a torch\.Tensor.*list"),
    "integer q": (
        sdpa(t(3, 4, dtype=torch.int64), t(5, 4), t(5, 2)), TypeError, r"\bq\b.*torch\.int64"),
    "q 1-D": (sdpa(t(4), t(5, 4), t(5, 2)), ValueError, r"\bq\b.*\(4,\)"),
    "k 1-D": (sdpa(t(3, 4), t(4), t(5, 2)), ValueError, r"\bk\b.*\(4,\)"),
    "v not a tensor": (sdpa(t(3, 4), t(5, 4), 1.0), TypeError, r"\bv\b.*torch\.Tensor.*float"),
    "q and k last dim mismatch": (
        sdpa(t(2, 3, 4), t(2, 5, 6), t(2, 5, 2)),
        ValueError, r"\bq\b.*\(2, 3, 4\).*\bk\b.*\(2, 5, 6\)"),
    "k and v n_k mismatch": (
        sdpa(t(3, 4), t(5, 4), t(6, 2)), ValueError, r"\bk\b.*\(5, 4\).*\bv\b.*\(6, 2\)"),
    "mask float dtype": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), t(3, 5)), TypeError, r"mask.*bool.*torch\.float32"),
    "mask int dtype": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), t(3, 5, dtype=torch.int64)), TypeError, r"mask.*int64"),
    "mask not broadcastable": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), t(4, 5, dtype=torch.bool)),
        ValueError, r"mask.*\(4, 5\).*\(3, 5\)"),
    "mask with too many batch dims": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), t(2, 3, 5, dtype=torch.bool)),
        ValueError, r"mask.*\(2, 3, 5\).*\(3, 5\)"),
    "batch dims of q and k do not broadcast": (
        sdpa(t(2, 3, 4), t(3, 5, 4), t(3, 5, 2)), ValueError, r"q \(2, 3, 4\).*k \(3, 5, 4\)"),
    "batch dims of v do not broadcast": (
        sdpa(t(2, 3, 4), t(2, 5, 4), t(3, 5, 2)), ValueError, r"\bv\b \(3, 5, 2\)"),
    "q and k dtype mismatch": (
        sdpa(t(3, 4), t(5, 4, dtype=torch.float64), t(5, 2)),
        TypeError, r"q and k.*torch\.float32.*torch\.float64"),
    "v dtype mismatch": (
        sdpa(t(3, 4), t(5, 4), t(5, 2, dtype=torch.float64)), TypeError, r"\bv\b.*float64"),
    "negative scale": (sdpa(t(3, 4), t(5, 4), t(5, 2), scale=-0.5), ValueError, r"scale.*-0\.5"),
    "zero scale": (sdpa(t(3, 4), t(5, 4), t(5, 2), scale=0.0), ValueError, r"scale.*0\.0"),
    "nan scale": (sdpa(t(3, 4), t(5, 4), t(5, 2), scale=float("nan")), ValueError, r"scale.*nan"),
    "tensor scale": (
        sdpa(t(3, 4), t(5, 4), t(5, 2), scale=torch.tensor(0.5)), TypeError, r"scale.*Tensor"),
    "dot_product_scores k not a tensor": (
        lambda: dot_product_scores(t(3, 4), [[1.0] * 4]), TypeError, r"\bk\b.*torch\.Tensor"),
    "masked_softmax integer scores": (
        lambda: masked_softmax(t(3, 4, dtype=torch.int32)), TypeError, r"scores.*int32"),
    "masked_softmax mask shape": (
        lambda: masked_softmax(t(3, 4), t(3, 5, dtype=torch.bool)),
        ValueError, r"mask.*\(3, 5\).*\(3, 4\)"),
    "causal_mask(0)": (lambda: causal_mask(0), ValueError, r"\bn\b.*>= 1.*\b0\b"),
    "causal_mask(-3)": (lambda: causal_mask(-3), ValueError, r"\bn\b.*-3"),
    "causal_mask(2.5)": (lambda: causal_mask(2.5), TypeError, r"\bn\b.*int.*float"),
    "causal_mask(True)": (lambda: causal_mask(True), TypeError, r"\bn\b.*int.*bool"),
    "padding_mask length > max_len": (
        lambda: padding_mask([1, 5], 3), ValueError, r"max_len=3.*\[1, 5\]"),
    "padding_mask negative length": (
        lambda: padding_mask(torch.tensor([2, -1])), ValueError, r"lengths.*\[2, -1\]"),
    "padding_mask 2-D lengths": (
        lambda: padding_mask(torch.tensor([[1, 2], [2, 1]])), ValueError, r"lengths.*\(2, 2\)"),
    "padding_mask float tensor lengths": (
        lambda: padding_mask(torch.tensor([1.5, 2.0])), TypeError, r"lengths.*float32"),
    "padding_mask float list lengths": (
        # torch.tensor([1.5, 2.0], dtype=long) would silently truncate 1.5 to 1
        lambda: padding_mask([1.5, 2.0]), TypeError, r"lengths"),
    "padding_mask negative max_len": (
        lambda: padding_mask([0, 0], -1), ValueError, r"max_len.*-1"),
    "sliding_window_mask window 0": (
        lambda: sliding_window_mask(4, 0), ValueError, r"window.*>= 1.*\b0\b"),
    "sliding_window_mask negative window": (
        lambda: sliding_window_mask(4, -2, causal=False), ValueError, r"window.*-2"),
    "sliding_window_mask float n": (
        lambda: sliding_window_mask(4.0, 2), TypeError, r"\bn\b.*float"),
    "key_padding_to_attention_mask 1-D": (
        lambda: key_padding_to_attention_mask(t(4, dtype=torch.bool)),
        ValueError, r"key_padding.*\(4,\)"),
    "additive_scores wrong w_q shape": (
        lambda: additive_scores(t(3, 4), t(5, 6), t(3, 5), t(3, 6), t(3)),
        ValueError, r"w_q.*\(3, 5\)"),
    "additive_scores wrong w_k shape": (
        lambda: additive_scores(t(3, 4), t(5, 6), t(3, 4), t(3, 4), t(3)),
        ValueError, r"w_k.*\(3, 4\)"),
    "additive_scores wrong v_a shape": (
        lambda: additive_scores(t(3, 4), t(5, 6), t(3, 4), t(3, 6), t(3, 1)),
        ValueError, r"v_a.*\(3, 1\)"),
    "additive_scores d_a mismatch": (
        lambda: additive_scores(t(3, 4), t(5, 6), t(3, 4), t(2, 6), t(3)),
        ValueError, r"w_k \(2, 6\)"),
    "additive_scores dtype mismatch": (
        # float64 q and k with float32 weights: torch's matmul raises a RuntimeError otherwise
        lambda: additive_scores(t(3, 4, dtype=torch.float64), t(5, 6, dtype=torch.float64),
                                t(3, 4), t(3, 6), t(3)),
        TypeError, r"w_q.*float"),
    "max_entropy(0)": (lambda: max_entropy(0), ValueError, r"\bn\b.*>= 1.*\b0\b"),
    "max_entropy(2.0)": (lambda: max_entropy(2.0), TypeError, r"\bn\b.*float"),
    "attention_entropy non-tensor": (
        lambda: attention_entropy([0.5, 0.5]), TypeError, r"weights.*torch\.Tensor.*list"),
    "attention_entropy integer weights": (
        lambda: attention_entropy(t(2, 3, dtype=torch.int64)), TypeError, r"weights.*int64"),
    "attention_entropy 0-D": (
        lambda: attention_entropy(torch.tensor(1.0)), ValueError, r"weights.*\(\)"),
    "effective_keys non-tensor": (
        lambda: effective_keys(0.5), TypeError, r"weights.*torch\.Tensor"),
    "normalized_entropy mask shape": (
        # broadcast_to raises a RuntimeError from inside torch otherwise
        lambda: normalized_entropy(t(3, 5) / 5, t(4, 5, dtype=torch.bool)),
        ValueError, r"mask.*\(4, 5\).*\(3, 5\)"),
    "AttentionFrame wrong label counts": (
        lambda: AttentionFrame(t(3, 4) / 4, ["a", "b"], ["w", "x", "y", "z"]),
        ValueError, r"2 query labels.*4 key labels.*\(3, 4\)"),
    "AttentionFrame wrong key label count": (
        lambda: AttentionFrame(t(3, 4) / 4, ["a", "b", "c"], ["w", "x"]),
        ValueError, r"2 key labels.*\(3, 4\)"),
    "AttentionFrame 1-D weights": (
        lambda: AttentionFrame(t(4) / 4, ["a"], ["w", "x", "y", "z"]),
        ValueError, r"weights.*\(4,\)"),
    "AttentionFrame mask shape": (
        lambda: AttentionFrame(t(2, 3) / 3, ["a", "b"], ["x", "y", "z"], mask=t(3, 2, dtype=bool)),
        ValueError, r"mask.*\(2, 3\).*\(3, 2\)"),
    "setup('x')": (lambda: setup("x"), TypeError, r"seed.*int.*str"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_clear_error(name):
    call, error, pattern = CASES[name]
    with pytest.raises(error, match=pattern) as info:
        call()
    # the message is one of ours, not a torch internal error re-raised
    assert not re.search(r"RuntimeError|Traceback", str(info.value))


def test_enough_cases():
    assert len(CASES) >= 14
