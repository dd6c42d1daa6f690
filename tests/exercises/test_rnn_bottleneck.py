"""The checkers of notebook 01 (``exercises.rnn_bottleneck``)."""

from __future__ import annotations

import torch

from attn_helpers.exercises import rnn_bottleneck as ex


def test_reverse_padded_checker():
    assert ex.check_reverse_padded(ex.reverse_padded_reference)
    verdict = ex.check_reverse_padded(lambda t, n: t.flip(-1))
    assert not verdict and "padding (0) to the front" in verdict.message
    assert not ex.check_reverse_padded(lambda t, n: t)


def test_token_accuracy_checker():
    def right(p, t, n):
        real = torch.arange(t.shape[1])[None, :] < n[:, None]
        return ((p == t) & real).sum() / real.sum()

    assert ex.check_token_accuracy(right)
    verdict = ex.check_token_accuracy(lambda p, t, n: (p == t).float().mean())
    assert not verdict and "padding positions were counted" in verdict.message
