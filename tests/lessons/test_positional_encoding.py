"""The previous-token task, the model with pluggable position schemes, the shipped checkpoint and
a re-training from scratch that must support the same claims as notebook 07."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import positional_encoding as pt
from attn_helpers.training import RECIPES, checkpoint_path, run_recipe


def test_batch_targets_are_the_previous_tokens():
    tokens, targets = pt.previous_token_batch(3, 6, torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == (3, 6)
    assert torch.all(targets[:, 0] == -1) and torch.equal(targets[:, 1:], tokens[:, :-1])
    with pytest.raises(ValueError, match="n must be"):
        pt.previous_token_batch(3, 0, torch.Generator())


@pytest.mark.parametrize("scheme", pt.SCHEMES)
def test_model_shapes_and_causality(scheme):
    torch.manual_seed(0)
    model = pt.PositionTaskModel(scheme).eval()
    tokens = torch.randint(0, pt.VOCAB, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, pt.VOCAB)
    assert model.last_weights.shape == (2, 4, 10, 10)
    assert torch.all(model.last_weights.triu(1) == 0)
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % pt.VOCAB
    assert torch.allclose(model(changed)[:, :6], logits[:, :6], atol=1e-6)


def test_without_positions_scores_see_content_only():
    """With scheme 'none', the attention row of the last token over an all-equal prefix is
    uniform: nothing distinguishes the positions."""
    torch.manual_seed(0)
    model = pt.PositionTaskModel("none").eval()
    model(torch.full((1, 8), 3))
    assert torch.allclose(model.last_weights[0, :, -1], torch.full((4, 8), 1 / 8), atol=1e-6)


def test_model_bad_inputs():
    with pytest.raises(ValueError, match="scheme"):
        pt.PositionTaskModel("relative")
    with pytest.raises(ValueError, match="heads of even size"):
        pt.PositionTaskModel("rope", d_model=12, num_heads=4)
    model = pt.PositionTaskModel("learned")
    with pytest.raises(ValueError, match="longer than max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 5))


def test_recipe_is_registered_and_checkpoint_is_small():
    assert pt.CHECKPOINT in RECIPES
    assert pt.CHECKPOINT.startswith("positional_")
    assert checkpoint_path(pt.CHECKPOINT).stat().st_size < 200_000


def test_shipped_checkpoint_supports_the_notebook_claims():
    models, metadata = pt.load_models()
    table = pt.extrapolation_table(models)
    claims = pt.extrapolation_claims(table)
    assert all(claims.values()), {k: v for k, v in claims.items() if not v}
    assert metadata["task"] == "previous token"
    for scheme, row in table.items():
        for n, accuracy in row.items():
            assert accuracy == pytest.approx(metadata["accuracy"][scheme][str(n)], abs=0.01)


def test_claims_can_fail():
    models, _ = pt.load_models()
    table = pt.extrapolation_table(models)
    table["none"][16] = 0.99
    assert not pt.extrapolation_claims(table)["without positions the model stays below 0.5 at the "
                                              "training length"]


@pytest.mark.slow
def test_retraining_from_scratch_supports_the_same_claims():
    models, metadata, _ = run_recipe(pt.CHECKPOINT, save=False)
    claims = pt.extrapolation_claims(pt.extrapolation_table(models))
    assert all(claims.values()), {k: v for k, v in claims.items() if not v}
