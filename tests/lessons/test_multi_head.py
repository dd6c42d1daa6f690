"""Notebook 04's two-relation task: data, model, ablation, the shipped checkpoint, and a re-train
from scratch that checks the notebook's claims."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import multi_head as heads_task
from attn_helpers.training import RECIPES, checkpoint_path, run_recipe


def test_make_batch_targets(gen):
    tokens, targets = heads_task.make_batch(4, gen, vocab=5, length=6)
    assert tokens.shape == (4, 6) and targets.shape == (4, 6, 2)
    assert tokens.min() >= 0 and tokens.max() < 5
    assert torch.all(targets[:, 0] == -100)
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1])
    assert torch.equal(targets[:, 1:, 1], tokens[:, :1].expand(4, 5))


def test_make_batch_and_labels_bad_inputs(gen):
    with pytest.raises(ValueError, match="length"):
        heads_task.make_batch(2, gen, length=2)
    with pytest.raises(ValueError, match="batch"):
        heads_task.make_batch(0, gen)
    with pytest.raises(ValueError, match=r"1-D.*\(2, 3\)"):
        heads_task.token_labels(torch.zeros(2, 3, dtype=torch.long))
    assert heads_task.token_labels(torch.tensor([2, 0, 7])) == ["C0", "A1", "H2"]


def test_model_shapes_and_causality(gen):
    torch.manual_seed(0)
    model = heads_task.TwoRelationModel().eval()
    tokens, _ = heads_task.make_batch(3, gen)
    logits, weights = model(tokens)
    config = heads_task.CONFIG
    assert logits.shape == (3, config.length, 2, config.vocab)
    assert weights.shape == (3, config.num_heads, config.length, config.length)
    assert torch.all(weights.triu(1) == 0)                          # causal
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % config.vocab             # the future cannot leak back
    assert torch.allclose(model(changed)[0][:, :-1], logits[:, :-1], atol=1e-6)
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(2, config.length + 1, dtype=torch.long))


def test_head_relation_scores_and_entropy_on_known_patterns():
    n = 5
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    first = torch.zeros(n, n)
    first[:, 0] = 1
    weights = torch.stack([previous, first])[None]                   # (1, 2, n, n)
    scores = heads_task.head_relation_scores(weights)
    assert torch.equal(scores, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert torch.equal(heads_task.head_entropy(weights), torch.zeros(2))
    with pytest.raises(ValueError, match="weights"):
        heads_task.head_relation_scores(torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="weights"):
        heads_task.head_entropy(torch.zeros(3, 3))


def check_claims(model):
    """The claims notebook 04 makes about the trained model."""
    tokens, targets = heads_task.evaluation_batch()
    accuracy = heads_task.relation_accuracy(model, tokens, targets)
    assert min(accuracy.values()) > 0.99
    with torch.no_grad():
        _, weights = model(tokens)
    scores = heads_task.head_relation_scores(weights)
    previous_head, first_head = int(scores[:, 0].argmax()), int(scores[:, 1].argmax())
    assert previous_head != first_head
    assert scores[previous_head, 0] > 0.7 and scores[first_head, 1] > 0.9
    assert scores[previous_head, 1] < 0.1 and scores[first_head, 0] < 0.1
    table = heads_task.ablation_table(model, tokens, targets)
    without_previous = table[f"without head {previous_head}"]
    without_first = table[f"without head {first_head}"]
    assert without_previous["previous"] < 0.25 and without_previous["first"] > 0.95
    assert without_first["first"] < 0.25 and without_first["previous"] > 0.95


def test_shipped_checkpoint_loads_and_supports_the_claims():
    path = checkpoint_path(heads_task.CHECKPOINT)
    assert path.exists() and path.stat().st_size < 200_000
    model, meta = heads_task.load_two_relations()
    assert meta["config"] == heads_task.CONFIG.__dict__
    assert meta["loss_curve"][-1] < 0.01 < 1.0 < meta["loss_curve"][0]
    check_claims(model)


def test_recipe_is_registered():
    assert heads_task.CHECKPOINT in RECIPES


@pytest.mark.slow
def test_retrain_from_scratch_reproduces_the_claims():
    """``python -m attn_helpers train multihead_two_relations``, without saving."""
    model, metadata, _seconds = run_recipe(heads_task.CHECKPOINT, save=False)
    assert min(metadata["accuracy"].values()) > 0.99
    check_claims(model)
