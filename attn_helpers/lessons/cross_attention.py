"""Notebook 06: alignment measures for the GRU model's cross-attention (and, later, the
Transformer decoder's): does output step ``t`` read the input it must copy?"""

from __future__ import annotations

import torch

from .._checks import require_positive_int, require_tensor, shape
from ..entropy import attention_entropy
from .rnn_bottleneck import Seq2Seq, predict
from .tasks import DATES, ISO_STEP_FIELDS, Batch, collate, date_fields, eval_batches, example

__all__ = ["antidiagonal_hits", "date_field_hits", "alignment_claims", "dates_claims"]


def antidiagonal_hits(weights: torch.Tensor, batch: Batch, tolerance: int = 0) -> torch.Tensor:
    """``(b, n_t)`` bool: for a reversal batch, whether the strongest weight of output step ``t``
    lies on source position ``L - 1 - t`` (``L`` the sequence's length), or at most
    ``tolerance`` positions from it; False at padded steps. ``weights`` ``(b, n_t, n_src)``."""
    _check_weights_for(weights, batch)
    require_positive_int("tolerance", tolerance, allow_zero=True)
    steps = torch.arange(weights.shape[1])[None, :]
    mirror = batch.src_lengths[:, None] - 1 - steps
    near = (weights.argmax(-1) - mirror).abs() <= tolerance
    return near & (steps < batch.tgt_lengths[:, None])


def date_field_hits(weights: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(b, 10)`` bool: for a dates batch, whether the strongest input word of each ISO output
    step lies in the field that step copies (:data:`tasks.ISO_STEP_FIELDS`: the year digits
    should read the year words, and so on). The two separator steps (``-``) copy nothing and are
    always False; leave them out of any share."""
    _check_weights_for(weights, batch)
    if weights.shape[1] != len(ISO_STEP_FIELDS):
        raise ValueError(f"weights must have {len(ISO_STEP_FIELDS)} output steps (an ISO date), "
                         f"got shape {shape(weights)}")
    hits = torch.zeros(weights.shape[:2], dtype=torch.bool)
    for i in range(len(batch)):
        fields = date_fields(DATES.src_vocab.decode(batch.src[i]))
        strongest = weights[i].argmax(-1).tolist()
        hits[i] = torch.tensor([fields[j] == want
                                for j, want in zip(strongest, ISO_STEP_FIELDS, strict=True)])
    return hits


def _check_weights_for(weights, batch: Batch) -> None:
    require_tensor("weights", weights, floating=True)
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    if weights.dim() != 3 or weights.shape[0] != len(batch) or weights.shape[2] != batch.src.shape[1]:
        raise ValueError(f"weights must have shape (b={len(batch)}, n_t, n_src={batch.src.shape[1]}), "
                         f"got {shape(weights)}")


def alignment_claims(attended: Seq2Seq) -> dict[str, bool]:
    """The reversal model's alignment: a band around the anti-diagonal, not a line."""
    exact, near = [], []
    for test in eval_batches("reversal", 50).values():
        _, weights = predict(attended, test)
        exact.append(antidiagonal_hits(weights, test).float().mean())
        near.append(antidiagonal_hits(weights, test, tolerance=1).float().mean())
    exact, near = torch.stack(exact), torch.stack(near)
    source, target = example("reversal", 0, 24)                 # notebook 01's widget example
    _, weights = predict(attended, collate("reversal", [(source, target)]))
    return {
        "the strongest weight sits exactly on the anti-diagonal in 40% to 85% of steps":
            0.4 < exact.mean().item() < 0.85,
        "it sits within one position of it in >= 97% of steps (>= 93% at every length)":
            near.mean().item() >= 0.97 and near.min().item() >= 0.93,
        "in the 24-digit example, every step is within one position of the anti-diagonal":
            bool(((weights[0].argmax(-1) - torch.arange(23, -1, -1)).abs() <= 1).all()),
    }


def dates_claims(model: Seq2Seq) -> dict[str, bool]:
    """Notebook 06's statements about the dates model: accuracy, alignment by field, entropy."""
    test = eval_batches("dates", 300)[None]
    predicted, weights = predict(model, test)
    accuracy = (predicted == test.tgt_out[:, :10]).float().mean().item()
    hits = date_field_hits(weights, test).float().mean(0)
    digits = [t for t, f in enumerate(ISO_STEP_FIELDS) if f != "-"]
    separators = [t for t, f in enumerate(ISO_STEP_FIELDS) if f == "-"]
    mean_entropy = attention_entropy(weights.double()).mean(0)
    words, iso = example("dates", 0)
    one = collate("dates", [(words, iso)])
    tokens, _ = model.greedy_decode(one.src, one.src_lengths, 10)
    return {
        "token accuracy >= 0.99": accuracy >= 0.99,
        "digit steps read their own field (>= 0.95 on average, >= 0.85 each)":
            hits[digits].mean().item() >= 0.95 and hits[digits].min().item() >= 0.85,
        "separator steps have over 1.5x the mean entropy of digit steps":
            mean_entropy[separators].mean().item() > 1.5 * mean_entropy[digits].mean().item(),
        "the step with the highest mean entropy is a separator":
            int(mean_entropy.argmax()) in separators,
        "the notebook's example decodes correctly": DATES.tgt_vocab.decode(tokens[0]) == iso,
    }
