"""Checkers for notebook 01 (RNN bottleneck): :func:`check_reverse_padded` (the reversal
targets of a padded batch) and :func:`check_token_accuracy` (accuracy over real tokens only)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..masks import padding_mask
from .core import CheckResult, Mistake, check_function, seeded

__all__ = [
    "check_reverse_padded",
    "check_token_accuracy",
]


def _as_float(fn: Callable) -> Callable:
    """Wrap ``fn`` so integer tensors it returns are compared as floats by the checker."""
    if not callable(fn):
        return fn

    def wrapped(*args):
        out = fn(*args)
        if isinstance(out, torch.Tensor) and not out.is_floating_point():
            return out.double()
        return out

    return wrapped


def _padded_digits(g: torch.Generator, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths_t = torch.tensor(lengths)
    tokens = torch.randint(3, 13, (len(lengths), max(lengths)), generator=g)
    return tokens * padding_mask(lengths_t, max(lengths)), lengths_t


def _reverse_cases() -> list[dict]:
    g = seeded(11)
    cases = []
    for lengths in ([5, 5, 5], [6, 3, 1, 4], [1], [7, 2]):
        tokens, lengths_t = _padded_digits(g, lengths)
        cases.append({"tokens": tokens, "lengths": lengths_t})
    return cases


def reverse_padded_reference(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(b, n)`` ids padded with 0 -> each row's first ``lengths[i]`` ids reversed, padding kept
    at the end."""
    n = tokens.shape[1]
    positions = torch.arange(n)[None, :]
    source = (lengths[:, None] - 1 - positions).clamp_min(0)
    reversed_ = tokens.gather(1, source)
    return torch.where(positions < lengths[:, None], reversed_, torch.zeros_like(tokens))


def check_reverse_padded(reverse: Callable) -> CheckResult:
    """Exercise: ``reverse(tokens (b, n), lengths (b,)) -> (b, n)``, the reversal targets of a
    padded batch (padding stays at the end)."""
    return check_function(
        _as_float(reverse), lambda t, n: reverse_padded_reference(t, n).double(), _reverse_cases(),
        what="reverse", output_names=("the reversed tokens",),
        mistakes=[
            Mistake(lambda t, n: t.flip(-1).double(),
                    "flipping the whole padded row moves the padding (0) to the front. Reverse "
                    "only the first lengths[i] tokens of each row and keep the padding at the end."),
        ],
    )


def _accuracy_cases() -> list[dict]:
    g = seeded(12)
    cases = []
    for lengths in ([4, 4], [6, 2, 3], [5, 1, 2, 5]):
        targets, lengths_t = _padded_digits(g, lengths)
        noise = torch.randint(3, 13, targets.shape, generator=g)
        keep = torch.rand(targets.shape, generator=g) < 0.6
        predictions = torch.where(keep, targets, noise) * padding_mask(lengths_t, targets.shape[1])
        cases.append({"predictions": predictions, "targets": targets, "lengths": lengths_t})
    return cases


def _accuracy_reference(predictions, targets, lengths):
    real = padding_mask(lengths, targets.shape[1])
    return ((predictions == targets) & real).sum().double() / real.sum()


def check_token_accuracy(accuracy: Callable) -> CheckResult:
    """Exercise: ``accuracy(predictions (b, n), targets (b, n), lengths (b,)) -> scalar``, the
    share of correct tokens among the real (non-padding) positions."""

    def all_positions(predictions, targets, lengths):
        return (predictions == targets).double().mean()

    def mean_of_rows(predictions, targets, lengths):
        real = padding_mask(lengths, targets.shape[1])
        per_row = ((predictions == targets) & real).sum(1).double() / lengths
        return per_row.mean()

    return check_function(
        _as_float(accuracy), _accuracy_reference, _accuracy_cases(), what="accuracy",
        output_names=("the accuracy",), atol=1e-6,
        mistakes=[
            Mistake(all_positions,
                    "padding positions were counted: the prediction and the target are both 0 "
                    "there, so every pad looks like a correct token. Count only positions "
                    "j < lengths[i]."),
            Mistake(mean_of_rows,
                    "you averaged the accuracy of each sequence, which gives a short sequence as "
                    "much say as a long one. Divide the number of correct real tokens by the "
                    "number of real tokens in the whole batch."),
        ],
    )
