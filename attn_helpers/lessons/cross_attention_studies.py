"""Notebook 06's measurements of trained cross-attention: where the reversal model's strongest
weight sits relative to the mirror position, whether each ISO date step reads its own field, and
the GRU-versus-Transformer alignment table. The claims built on them live in
:mod:`attn_helpers.lessons.cross_attention`."""

from __future__ import annotations

import torch

from .._checks import require_positive_int, require_tensor, shape
from ..entropy import attention_entropy
from .rnn_bottleneck import Seq2Seq, predict
from .tasks import DATES, ISO_STEP_FIELDS, Batch, date_fields, eval_batches

__all__ = ["mirror_offsets", "antidiagonal_hits", "date_field_hits", "reversal_alignment_stats",
           "neighbour_steps", "alignment_table", "digit_step_margin"]

_DIGITS = [t for t, f in enumerate(ISO_STEP_FIELDS) if f != "-"]


def mirror_offsets(weights: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(b, n_t)`` long: for a reversal batch, the source position of output step ``t``'s
    strongest weight minus the mirror position ``L - 1 - t`` (``L`` the sequence's length).
    ``0`` is on the anti-diagonal; ``+1`` is position ``L - t``, the digit step ``t - 1`` copies.
    Padded steps hold garbage: mask them with ``batch.tgt_lengths``. ``weights`` ``(b, n_t, n_src)``.
    """
    _check_weights_for(weights, batch)
    steps = torch.arange(weights.shape[1])[None, :]                    # (1, n_t)
    return weights.argmax(-1) - (batch.src_lengths[:, None] - 1 - steps)


def antidiagonal_hits(weights: torch.Tensor, batch: Batch, tolerance: int = 0) -> torch.Tensor:
    """``(b, n_t)`` bool: for a reversal batch, whether the strongest weight of output step ``t``
    lies on source position ``L - 1 - t`` (``L`` the sequence's length), or at most
    ``tolerance`` positions from it; False at padded steps. ``weights`` ``(b, n_t, n_src)``."""
    offsets = mirror_offsets(weights, batch)
    require_positive_int("tolerance", tolerance, allow_zero=True)
    steps = torch.arange(weights.shape[1])[None, :]
    return (offsets.abs() <= tolerance) & (steps < batch.tgt_lengths[:, None])


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


def digit_step_margin(weights: torch.Tensor) -> float:
    """The smallest gap, over a dates batch's digit steps, between the strongest and the second
    strongest input word's weight: far above float32 noise, the argmax counts of
    :func:`date_field_hits` come out the same on any CPU."""
    top2 = weights[:, _DIGITS].topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


def _check_weights_for(weights, batch: Batch) -> None:
    require_tensor("weights", weights, floating=True)
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    if weights.dim() != 3 or weights.shape[0] != len(batch) or weights.shape[2] != batch.src.shape[1]:
        raise ValueError(f"weights must have shape (b={len(batch)}, n_t, n_src={batch.src.shape[1]}), "
                         f"got {shape(weights)}")


def reversal_alignment_stats(attended: Seq2Seq) -> dict:
    """Over the reversal test set (50 sequences of every length 4..24), pooled over all real
    steps: ``steps``; ``exact`` and ``near``, the shares whose strongest weight is on the mirror
    position and within one of it; ``near, lowest length``, the lowest per-length ``near`` share;
    ``offsets``, the number of steps at each :func:`mirror_offsets` value (``"<= -2"``, ``"-1"``,
    ``"0"``, ``"+1"``, ``">= +2"``)."""
    pooled, near_by_length = [], []
    for test in eval_batches("reversal", 50).values():
        _, weights = predict(attended, test)                          # (b, n_t, n_src)
        real = torch.arange(weights.shape[1])[None, :] < test.tgt_lengths[:, None]
        offsets = mirror_offsets(weights, test)[real]                 # (real steps,)
        pooled.append(offsets)
        near_by_length.append((offsets.abs() <= 1).float().mean())
    offsets = torch.cat(pooled)
    return {"steps": len(offsets), "exact": (offsets == 0).float().mean().item(),
            "near": (offsets.abs() <= 1).float().mean().item(),
            "near, lowest length": torch.stack(near_by_length).min().item(),
            "offsets": {"<= -2": int((offsets <= -2).sum()), "-1": int((offsets == -1).sum()),
                        "0": int((offsets == 0).sum()), "+1": int((offsets == 1).sum()),
                        ">= +2": int((offsets >= 2).sum())}}


def neighbour_steps(attended: Seq2Seq) -> dict[str, float]:
    """Over the reversal test set (50 sequences of every length), the steps whose strongest weight
    is *next to* the mirror position ``L - 1 - t`` (off by exactly one): how many, how many of
    them one *after* it (on ``L - t``, the digit the previous step copied), the share whose output
    digit is still correct, the mean weight left on the mirror position, and the mean strongest
    weight."""
    count = after = correct = 0
    mirror_weight, peak_weight = [], []
    for test in eval_batches("reversal", 50).values():
        predicted, weights = predict(attended, test)                  # (b, n_t), (b, n_t, n_src)
        off = antidiagonal_hits(weights, test, tolerance=1) & ~antidiagonal_hits(weights, test)
        steps = torch.arange(weights.shape[1])[None, :]
        mirror = (test.src_lengths[:, None] - 1 - steps).clamp(min=0)  # (b, n_t)
        count += int(off.sum())
        after += int((off & (mirror_offsets(weights, test) == 1)).sum())
        correct += int((off & (predicted == test.tgt_out[:, : predicted.shape[1]])).sum())
        mirror_weight.append(weights.gather(-1, mirror[..., None])[..., 0][off])
        peak_weight.append(weights.max(-1).values[off])
    return {"steps": count, "one after": after, "correct": correct / count,
            "mirror weight": torch.cat(mirror_weight).mean().item(),
            "peak weight": torch.cat(peak_weight).mean().item()}


def _row(tokens, weights, test) -> dict[str, float]:
    return {"token accuracy": (tokens == test.tgt_out[:, :10]).float().mean().item(),
            "digit steps on their field": date_field_hits(weights, test)[:, _DIGITS]
            .float().mean().item(),
            "digit-step entropy (nats)": attention_entropy(weights[:, _DIGITS].double())
            .mean().item()}


def alignment_table(gru: Seq2Seq, transformer) -> dict[str, dict]:
    """On the 300 test dates: token accuracy, the share of digit steps whose strongest input word
    is in the right field, and the digit steps' mean entropy, for the GRU model and for every
    head of the Transformer's cross-attention (and their mean weights). ``transformer`` is a
    :class:`~attn_helpers.lessons.cross_attention.TransformerSeq2Seq`."""
    test = eval_batches("dates", 300)[None]
    table = {"GRU (1 head)": _row(*predict(gru, test), test)}
    tokens, weights = transformer.greedy_decode(test.src, test.src_lengths, 10)
    for head in range(weights.shape[1]):
        table[f"Transformer head {head}"] = _row(tokens, weights[:, head], test)
    table["Transformer, heads averaged"] = _row(tokens, weights.mean(1), test)
    return table
