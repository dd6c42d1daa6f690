"""Notebook 07's wrap-around study: where RoPE models trained on short sequences collapse, for
three rotation bases, and a direct test of why (:func:`offset_head_crossing`). Reachable from
:mod:`.positional_encoding` as well."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..positional import apply_rope
from ..training import single_thread
from . import rope
from .positional_encoding import (
    D_MODEL,
    NUM_HEADS,
    SEEDS,
    TRAIN_MAX_LEN,
    WRAP_BASES,
    WRAP_LENGTH,
    PositionTaskModel,
    model_key,
    offset_copy_batch,
    position_accuracy,
)
from .rope import collapse_position, wavelength

__all__ = ["wrap_study", "offset_head_crossing", "wrap_claims", "CROSSING_TOLERANCE"]


def wrap_study(models: nn.ModuleDict, *, n: int = WRAP_LENGTH) -> dict[float, dict]:
    """Per RoPE base: the second pair's wavelength, each seed's accuracy curve and collapse point,
    and the direct test :func:`offset_head_crossing` (``"crossing"``)."""
    study = {}
    for base in WRAP_BASES:
        curves = [position_accuracy(models[model_key("rope", seed, base)], n, batch=64)
                  for seed in SEEDS]
        study[base] = {"wavelength": wavelength(base, D_MODEL // NUM_HEADS), "curves": curves,
                       "collapse": [collapse_position(c) for c in curves],
                       "crossing": [offset_head_crossing(models[model_key("rope", seed, base)])
                                    for seed in SEEDS]}
    return study


@torch.no_grad()
def offset_head_crossing(model: PositionTaskModel, *, offset: int = 3, max_distance: int = 128,
                         seed: int = 1) -> int | None:
    """A direct test of the wrap-around reading of the collapse. Take the head that puts the most
    weight on the key ``offset`` back (on 64 seeded sequences of the training length), and its
    score for the mean query and the mean key token as a function of the distance ``delta``,
    ``rope(q, m) . rope(k, m - delta)``. Returns the first ``delta > offset`` that scores above
    ``delta = offset`` (a distant key that beats the right one), None if none up to
    ``max_distance``."""
    tokens, _ = offset_copy_batch(64, TRAIN_MAX_LEN, torch.Generator().manual_seed(seed))
    model.eval()
    with single_thread():
        model(tokens)
    h, d_head, d = model.num_heads, model.d_model // model.num_heads, model.d_model
    head = int(model.last_weights.mean(0).diagonal(-offset, -2, -1).mean(-1).argmax())
    W, E = model.qkv.weight.double(), model.embed.weight.double()
    q = (E @ W[:d].view(h, d_head, d)[head].T).mean(0)                 # (d_head,) mean query
    k = (E @ W[d:2 * d].view(h, d_head, d)[head].T).mean(0)            # (d_head,) mean key
    delta = torch.arange(max_distance + 1)
    at = torch.full_like(delta, max_distance)                          # the query's position
    scores = (apply_rope(q.expand(len(delta), d_head), at, base=model.base)
              * apply_rope(k.expand(len(delta), d_head), at - delta, base=model.base)).sum(-1)
    beyond = (scores[offset + 1:] > scores[offset]).nonzero()
    return int(beyond[0]) + offset + 1 if len(beyond) else None


CROSSING_TOLERANCE = 6  # the direct test's largest miss on the shipped runs is 5 positions


def wrap_claims(wrap: dict[float, dict]) -> dict[str, bool]:
    """What notebook 07 says about :func:`wrap_study`, each claim with its verdict (every seed).
    A collapse point is a window's start (:func:`~.rope.collapse_position`); the slope's meaning:
    :func:`~.rope.collapse_slope` (0.25 if it tracks the second pair, 0.5 the third, 0 no base)."""
    collapse = {base: w["collapse"] for base, w in sorted(wrap.items())}
    bases = list(collapse)
    turns = {b: [c / wrap[b]["wavelength"] for c in collapse[b]] for b in bases}
    mean_turn = [sum(t) / len(t) for t in turns.values()]
    slow = [collapse_position(c, threshold=0.9) for c in wrap[bases[-1]]["curves"]]
    crossing = {b: [math.inf if c is None else c for c in wrap[b]["crossing"]] for b in bases}
    first_below = {b: [int((c.nanmean(-1) < 0.5).nonzero()[0]) for c in wrap[b]["curves"]]
                   for b in bases}
    return {
        "RoPE's collapse point moves with the base: later for a larger base (every seed, in order)":
            all(max(collapse[a]) < min(collapse[b]) for a, b in zip(bases, bases[1:], strict=False)),
        "every collapse point lies between 0.45 and 0.7 of the second pair's wavelength "
        "(these nine runs)":
            all(0.45 < t < 0.7 for ts in turns.values() for t in ts),
        "that fraction shrinks as the base grows (mean of the seeds)":
            all(a > b for a, b in zip(mean_turn, mean_turn[1:], strict=False)),
        "collapse point ~ base^s with 0.1 < s < 0.35 (second pair: 0.25, third: 0.5, none: 0)":
            0.1 < rope.collapse_slope(collapse) < 0.35,
        "smallest base: every seed collapses before twice the training length":
            max(collapse[bases[0]]) < 2 * TRAIN_MAX_LEN,
        "largest base: every seed above 0.9 on windows starting before 48, collapses at 60-63":
            min(slow) >= 48 and all(60 <= c <= 63 for c in collapse[bases[-1]]),
        "every base is still above 0.9 on positions 16-19, just past the trained offsets":
            all(c[16:20].nanmean().item() > 0.9 for w in wrap.values() for c in w["curves"]),
        "direct test: the distance where a farther key first outscores 3 back (offset-3 head, "
        "mean tokens) grows with the base (every seed, in order)":
            all(max(crossing[a]) < min(crossing[b]) for a, b in zip(bases, bases[1:], strict=False)),
        f"it lies within {CROSSING_TOLERANCE} positions of each seed's first position below 0.5 "
        "(these nine runs)":
            all(abs(c - f) <= CROSSING_TOLERANCE for b in bases
                for c, f in zip(crossing[b], first_below[b], strict=True)),
    }
