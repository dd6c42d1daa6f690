"""Checkers for notebook 06 (cross-attention): :func:`check_cross_attention` (decoder queries
over padded encoder states) and :func:`check_antidiagonal_share` (how often the strongest weight
lies on the anti-diagonal)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..masks import padding_mask
from .core import CheckResult, Mistake, check_function, seeded
from .rnn_bottleneck import _as_float

__all__ = ["check_cross_attention", "check_antidiagonal_share"]


def _cross_cases() -> list[dict]:
    g = seeded(13)
    cases = []
    for b, n_q, n_k, d, lengths in [(1, 3, 5, 4, [5]), (2, 4, 6, 8, [6, 3]),
                                    (3, 2, 7, 4, [2, 7, 5])]:
        cases.append({
            "decoder_states": torch.randn(b, n_q, d, generator=g),
            "encoder_states": torch.randn(b, n_k, d, generator=g),
            "lengths": torch.tensor(lengths),
        })
    return cases


def _cross_reference(decoder_states, encoder_states, lengths):
    mask = padding_mask(lengths, encoder_states.shape[1])[:, None, :]
    return scaled_dot_product_attention(decoder_states, encoder_states, encoder_states, mask)


def check_cross_attention(cross_attention: Callable) -> CheckResult:
    """Exercise: ``cross_attention(decoder_states (b, n_q, d), encoder_states (b, n_k, d),
    lengths (b,)) -> (output (b, n_q, d), weights (b, n_q, n_k))``: queries from the decoder,
    keys and values from the encoder, padded encoder positions never attended."""

    def unmasked(decoder_states, encoder_states, lengths):
        return scaled_dot_product_attention(decoder_states, encoder_states, encoder_states)

    def unscaled(decoder_states, encoder_states, lengths):
        mask = padding_mask(lengths, encoder_states.shape[1])[:, None, :]
        return scaled_dot_product_attention(decoder_states, encoder_states, encoder_states, mask,
                                            scale=1.0)

    def softmax_over_queries(decoder_states, encoder_states, lengths):
        mask = padding_mask(lengths, encoder_states.shape[1])[:, None, :]
        scores = decoder_states @ encoder_states.transpose(-2, -1) / math.sqrt(
            decoder_states.shape[-1])
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-2).nan_to_num(0.0)
        return weights @ encoder_states, weights

    return check_function(
        cross_attention, _cross_reference, _cross_cases(), what="cross_attention",
        output_names=("the output", "the weights"),
        mistakes=[
            Mistake(unmasked,
                    "padded encoder positions received weight. Build a (b, n_k) mask that is True "
                    "where j < lengths[i] and give it to the attention as mask[:, None, :], so it "
                    "broadcasts over the decoder steps."),
            Mistake(unscaled, "the scores were not scaled: divide them by sqrt(d)."),
            Mistake(softmax_over_queries,
                    "the softmax ran over the decoder steps (dim=-2); each decoder step's weights "
                    "over the encoder positions (dim=-1) must sum to one."),
        ],
    )


def _diagonal_cases() -> list[dict]:
    g = seeded(14)
    cases = []
    for lengths in ([5], [6, 4], [3, 6, 2]):
        n = max(lengths)
        lengths_t = torch.tensor(lengths)
        real = padding_mask(lengths_t, n)
        scores = torch.randn(len(lengths), n, n, generator=g)
        anti = (torch.arange(n)[None, None, :] ==
                (lengths_t[:, None, None] - 1 - torch.arange(n)[None, :, None]))
        scores = scores + 2.5 * anti
        scores = scores.masked_fill(~real[:, None, :], float("-inf"))
        weights = torch.softmax(scores, -1) * real[:, :, None]
        cases.append({"weights": weights, "lengths": lengths_t})
    return cases


def antidiagonal_share_reference(weights: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Share of real decoder steps ``t < L`` whose strongest source position is ``L - 1 - t``
    (a 0-d float64 tensor). ``weights`` ``(b, n_t, n_src)``, ``lengths`` ``(b,)``."""
    n_t = weights.shape[1]
    steps = torch.arange(n_t)[None, :]
    real = steps < lengths[:, None]
    hit = (weights.argmax(-1) == lengths[:, None] - 1 - steps) & real
    return hit.sum().double() / real.sum()


def check_antidiagonal_share(share: Callable) -> CheckResult:
    """Exercise: ``share(weights (b, n, n), lengths (b,)) -> scalar``, the share of real decoder
    steps whose strongest weight lies on the anti-diagonal ``j = L - 1 - t``."""

    def padded_width(weights, lengths):
        n = weights.shape[1]
        steps = torch.arange(n)[None, :]
        real = steps < lengths[:, None]
        return ((weights.argmax(-1) == n - 1 - steps) & real).sum().double() / real.sum()

    def diagonal(weights, lengths):
        steps = torch.arange(weights.shape[1])[None, :]
        real = steps < lengths[:, None]
        return ((weights.argmax(-1) == steps) & real).sum().double() / real.sum()

    return check_function(
        _as_float(share), antidiagonal_share_reference, _diagonal_cases(), what="share",
        output_names=("the share",), atol=1e-6,
        mistakes=[
            Mistake(padded_width,
                    "the anti-diagonal of a sequence of length L is j = L - 1 - t, not n - 1 - t "
                    "with the padded width n: use each sequence's own length."),
            Mistake(diagonal, "that is the diagonal j = t (a copy task); reversal puts output "
                              "step t on source position L - 1 - t."),
        ],
    )
