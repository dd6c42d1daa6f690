"""Notebook 07's lessons module: the two-offset copy task and its model, and ALiBi's half-weight
reach at the extremes (against the definition: tests/exercises)."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import positional_encoding as pt


def test_batch_targets_are_the_tokens_at_each_offset():
    tokens, targets = pt.offset_copy_batch(3, 7, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 7) and targets.shape == (3, 7, 2)
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1]) and torch.all(targets[:, 0, 0] == -1)
    assert torch.equal(targets[:, 3:, 1], tokens[:, :-3]) and torch.all(targets[:, :3, 1] == -1)
    with pytest.raises(ValueError, match="n must be"):
        pt.offset_copy_batch(3, 0, torch.Generator())


@pytest.mark.parametrize("scheme", pt.SCHEMES)
def test_model_shapes_and_causality(scheme):
    torch.manual_seed(0)
    model = pt.PositionTaskModel(scheme).eval()
    tokens = torch.randint(0, pt.VOCAB, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, 2, pt.VOCAB)
    assert model.last_weights.shape == (2, 3, 10, 10)
    assert torch.all(model.last_weights.triu(1) == 0)
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % pt.VOCAB
    assert torch.allclose(model(changed)[:, :6], logits[:, :6], atol=1e-6)


def test_without_positions_scores_see_content_only_and_rope_uses_its_base():
    torch.manual_seed(0)
    model = pt.PositionTaskModel("none").eval()
    model(torch.full((1, 8), 3))            # an all-equal prefix: uniform weights in every head
    assert torch.allclose(model.last_weights[0, :, -1], torch.full((3, 8), 1 / 8), atol=1e-6)
    slow = pt.PositionTaskModel("rope", base=160000.0).eval()
    fast = pt.PositionTaskModel("rope", base=625.0).eval()
    fast.load_state_dict(slow.state_dict())
    tokens = torch.randint(0, pt.VOCAB, (1, 12))
    assert not torch.allclose(slow(tokens), fast(tokens), atol=1e-3)


def test_model_bad_inputs():
    with pytest.raises(ValueError, match="scheme"):
        pt.PositionTaskModel("relative")
    with pytest.raises(ValueError, match="heads of even size"):
        pt.PositionTaskModel("rope", d_model=12, num_heads=4)
    model = pt.PositionTaskModel("learned")
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 5))


