"""The checkers of notebook 06 (``exercises.cross_attention``)."""

from __future__ import annotations

import torch

from attn_helpers.exercises import cross_attention as ex_cross


def test_cross_attention_checker():
    def right(dec, enc, lengths):
        mask = torch.arange(enc.shape[1])[None, None, :] < lengths[:, None, None]
        scores = dec @ enc.transpose(-2, -1) / dec.shape[-1] ** 0.5
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        return weights @ enc, weights

    assert ex_cross.check_cross_attention(right)

    def unmasked(dec, enc, lengths):
        weights = torch.softmax(dec @ enc.transpose(-2, -1) / dec.shape[-1] ** 0.5, -1)
        return weights @ enc, weights

    verdict = ex_cross.check_cross_attention(unmasked)
    assert not verdict and "padded encoder positions received weight" in verdict.message


def test_antidiagonal_checker():
    assert ex_cross.check_antidiagonal_share(ex_cross.antidiagonal_share_reference)

    def padded_width(weights, lengths):
        n = weights.shape[1]
        steps = torch.arange(n)[None, :]
        real = steps < lengths[:, None]
        return ((weights.argmax(-1) == n - 1 - steps) & real).sum() / real.sum()

    verdict = ex_cross.check_antidiagonal_share(padded_width)
    assert not verdict and "use each sequence's own length" in verdict.message
    # the reference on a perfect anti-diagonal is 1, on a perfect diagonal of length > 1 lower
    eye = torch.eye(4)[None]
    assert ex_cross.antidiagonal_share_reference(eye.flip(-1), torch.tensor([4])).item() == 1.0
    assert ex_cross.antidiagonal_share_reference(eye, torch.tensor([4])).item() == 0.0
