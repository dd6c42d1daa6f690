"""Notebook 05's lesson module: the associative-recall task and the model that Going deeper trains
with fewer key/value heads. (The masks, the cache and the timings are asserted in the notebook's
cells; grouped-query attention against torch is tested in tests/core.)"""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import masking


def test_recall_batch_answers_are_the_stored_values():
    tokens, answers = masking.recall_batch(64, torch.Generator().manual_seed(0))
    c = masking.RECALL
    assert tokens.shape == (64, c["pairs"] + 1) and answers.shape == (64,)
    pairs, query = tokens[:, :-1], tokens[:, -1] - c["num_keys"] * c["num_values"]
    keys, values = pairs // c["num_values"], pairs % c["num_values"]
    assert all(len(set(row.tolist())) == c["pairs"] for row in keys)    # distinct keys
    for i in range(64):
        assert answers[i] == values[i][keys[i] == query[i]].item()
    with pytest.raises(ValueError, match="batch_size"):
        masking.recall_batch(0, torch.Generator())


def test_train_recall_learns_with_one_kv_head():
    """Going deeper's premise: even multi-query attention (g = 1) learns the task far above chance
    (1/8) in the notebook's 300 steps."""
    run = masking.train_recall(num_kv_heads=1, seed=3)
    assert set(run) == {"loss", "accuracy"} and run["accuracy"] > 4 / masking.RECALL["num_values"]
