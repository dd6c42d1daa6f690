"""Notebook 05's lesson module: the associative-recall task (the training runs in the notebook)."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import masking


def test_recall_batch_answers_are_the_stored_values():
    tokens, answers = masking.recall_batch(64, torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 7) and answers.shape == (64,)
    pairs, query = tokens[:, :-1], tokens[:, -1] - 16 * 8
    keys, values = pairs // 8, pairs % 8
    assert all(len(set(row.tolist())) == 6 for row in keys)            # distinct keys
    for i in range(64):
        assert answers[i] == values[i][keys[i] == query[i]].item()
    with pytest.raises(ValueError, match="batch_size"):
        masking.recall_batch(0, torch.Generator())


def _record(accuracy_by_g):
    seeds = list(range(len(accuracy_by_g[4])))
    rows = [{"g": g, "seed": s, "accuracy": accuracy_by_g[g][s], "final_loss": 0.5}
            for g in (4, 2, 1) for s in seeds]
    return {"gs": [4, 2, 1], "seeds": seeds, "rows": rows, "summary": masking.summary(rows)}


def test_gqa_claims_hold_on_a_small_cost_and_fail_without_one():
    high = [0.9 + 0.004 * s for s in range(20)]              # g = 4: 0.90..0.976, a range of 0.076
    near_g1 = [a - 0.05 + (0.021 if s % 2 else -0.019) for s, a in enumerate(high)]  # g2 - g1 ~ 0
    cost = _record({4: high, 2: near_g1, 1: [a - 0.05 for a in high]})
    assert all(masking.gqa_claims(cost).values())
    assert cost["summary"]["1"] == pytest.approx({"mean": 0.888, "min": 0.85, "max": 0.926})
    free = masking.gqa_claims(_record({4: high, 2: high, 1: high}))     # no run below g = 4
    assert not free["g = 1 (multi-query) scores below g = 4 on at least 18 of the 20 seeds"]
    spread = [0.001] * 19 + [0.5]                    # g = 1 below g = 4 on every seed, one big gap
    noisy = masking.gqa_claims(_record({4: high, 2: [a - 0.03 for a in high],
                                        1: [a - d for a, d in zip(high, spread, strict=True)]}))
    assert noisy["g = 1 (multi-query) scores below g = 4 on at least 18 of the 20 seeds"]
    assert not noisy["paired per seed, g = 4 minus g = 1 has a mean over 3 standard errors "
                     "(sd / sqrt(seeds))"]
    few = masking.gqa_claims(_record({4: high[:5], 2: high[:5], 1: high[:5]}))
    assert not next(iter(few.values()))                                 # fewer than 10 seeds
