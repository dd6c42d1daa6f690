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
