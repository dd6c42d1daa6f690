"""Notebook 04's two-relation task: data, model, relation scores, ablations, the seed study's claims
(each can fail), the shipped checkpoints. The notebook asserts its claims (nbval); the study retrains."""

from __future__ import annotations

import copy

import pytest
import torch

from attn_helpers.lessons import multi_head as heads_task


def test_make_batch_targets_and_labels(gen):
    tokens, targets = heads_task.make_batch(4, gen, vocab=5, length=6)
    assert tokens.shape == (4, 6) and targets.shape == (4, 6, 2)
    assert tokens.min() >= 0 and tokens.max() < 5
    assert torch.all(targets[:, 0] == -100)
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1])                   # the previous letter
    assert torch.equal(targets[:, 1:, 1], tokens[:, :1].expand(4, 5))       # the first letter
    assert heads_task.token_labels(torch.tensor([2, 0, 7])) == ["C0", "A1", "H2"]


def test_model_is_causal(gen):
    torch.manual_seed(0)
    model = heads_task.TwoRelationModel().eval()
    tokens, _ = heads_task.make_batch(3, gen)
    logits, weights = model(tokens)
    config = heads_task.CONFIG
    assert logits.shape == (3, config.length, 2, config.vocab)
    assert weights.shape == (3, config.num_heads, config.length, config.length)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % config.vocab             # the future cannot leak back
    assert torch.allclose(model(changed)[0][:, :-1], logits[:, :-1], atol=1e-6)


def test_head_relation_scores_on_known_patterns():
    previous, first = torch.eye(5).roll(-1, dims=1), torch.eye(5)[[0] * 5]   # row i: key i-1; key 0
    scores = heads_task.head_relation_scores(torch.stack([previous, first])[None])
    assert torch.equal(scores, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert heads_task.heads_split(scores) and not heads_task.heads_split([[0.6, 0.33], [0.15, 0.78]])


@pytest.fixture(scope="module")
def shipped():
    model, meta = heads_task.load_two_relations()
    one_head, one_meta = heads_task.load_one_head()
    return model, meta, one_head, one_meta


def test_shipped_checkpoints_have_the_same_task_and_parameter_budget(shipped):
    model, meta, one_head, one_meta = shipped
    assert meta["config"] == heads_task.CONFIG.__dict__
    assert one_meta["config"] == heads_task.ONE_HEAD.__dict__ and one_head.attention.num_heads == 1
    assert sum(p.numel() for p in one_head.parameters()) == sum(p.numel() for p in model.parameters())
    assert sorted((r["num_heads"], r["seed"]) for r in one_meta["study"]) == [
        (h, s) for h in (1, 2) for s in heads_task.STUDY_SEEDS]


def test_study_claims_hold_on_the_shipped_study_and_each_can_fail(shipped):
    study = shipped[3]["study"]

    def failing(fabricated):
        return [claim for group in heads_task.study_claims(fabricated).values()
                for claim, holds in group.items() if not holds]

    assert failing(study) == []
    no_split = [r["seed"] for r in study
                if r["num_heads"] == 2 and not heads_task.heads_split(r["relation_scores"])]
    cases = [   # (claims that must fail, heads, key, fabricated value, seeds: None = every seed)
        (["one head also names"], 1, "accuracy", {"previous": 0.5, "first": 1.0}, None),
        (["two heads name both letters"], 2, "accuracy", {"previous": 1.0, "first": 0.9}, None),
        (["unequally"], 1, "relation_scores", [[0.45, 0.45]], None),     # blends, but equal weights
        (["the single head blends"], 1, "relation_scores", [[0.0, 1.0]], None),
        (["not on every seed", "which head takes which", "ablation"], 2, "relation_scores",
         [[0.8, 0.0], [0.0, 0.99]], None),     # the same split on every seed, 2 with no ablation drop
        (["split the relations on", "which head takes which", "goes with the split"], 2,
         "relation_scores", [[0.5, 0.5], [0.5, 0.5]], None),             # blurred on every seed
        (["ablation"], 2, "ablation", {"zero": 2 * [{"previous": 1.0, "first": 1.0}], "mean": []}, None),
        (["lower training loss"], 2, "final_loss", 1.0, None),
        (["50 steps sooner", "goes with the split"], 2, "loss_curve", [1.0] * 60, None),
        (["goes with the split"], 2, "loss_curve", [1e-3] * 60, no_split),   # no split, yet fast
    ]
    for names, heads, key, value, seeds in cases:
        fabricated = copy.deepcopy(study)
        for run in fabricated:
            if run["num_heads"] == heads and (seeds is None or run["seed"] in seeds):
                run[key] = value
        result = failing(fabricated)
        assert result == [c for c in result if any(n in c for n in names)] and all(
            any(n in c for c in result) for n in names), (names, result)


def test_steps_to():
    run = {"loss_curve": [1.0, 0.5, 0.009, 0.001]}
    assert heads_task.steps_to(run, 0.01) == 30
    assert heads_task.steps_to(run, 1e-9) == heads_task.CONFIG.steps + heads_task.LOSS_EVERY


def test_ablation_data_and_frames_match_the_model(shipped):
    model = shipped[0]
    tokens, targets = (t[:64] for t in heads_task.evaluation_batch())
    data = heads_task.ablation_data(model, tokens, targets)
    assert data.accuracy[(False, True)] == heads_task.relation_accuracy(
        model, tokens, targets, torch.tensor([0.0, 1.0])) == heads_task.ablated_accuracy(
        model, tokens, targets, 0, "zero")
    mean = [heads_task.ablated_accuracy(model, tokens, targets, head, "mean") for head in (0, 1)]
    assert heads_task.ablation_falls({"mean": mean}, 1 / 8 + 0.03) == {"mean": True}   # hook gone:
    assert data.accuracy[(True, True)] == heads_task.relation_accuracy(model, tokens, targets)
    frame = heads_task.ablation_frame(data, 3, (True, False))
    with torch.no_grad():
        logits, weights = model(tokens[3:4], head_mask=torch.tensor([1.0, 0.0]))
    assert torch.equal(frame.predictions, logits[0].argmax(-1))
    torch.testing.assert_close(frame.weights, weights[0])
    assert not frame.correct[0].any()                                # no target at position 0
    assert torch.equal(frame.correct[1:], frame.predictions[1:] == targets[3, 1:])


@pytest.mark.parametrize("call, pattern", [
    (lambda g, data, model: heads_task.make_batch(2, g, length=2), "length"),
    (lambda g, data, model: heads_task.make_batch(0, g), "batch"),
    (lambda g, data, model: heads_task.token_labels(torch.zeros(2, 3, dtype=torch.long)),
     r"1-D.*\(2, 3\)"),
    (lambda g, data, model: heads_task.head_relation_scores(torch.zeros(2, 3, 3)),
     r"weights must be \(b, h, n, n\).*\(2, 3, 3\)"),
    (lambda g, data, model: model(torch.zeros(2, heads_task.CONFIG.length + 1, dtype=torch.long)),
     "tokens"),
    (lambda g, data, m: heads_task.ablated_accuracy(m, data.tokens, data.targets, 0, "x"), "kind"),
    (lambda g, data, model: heads_task.ablation_frame(data, 4, (True, True)), "example"),
    (lambda g, data, model: heads_task.ablation_frame(data, 0, (True,)), r"heads_on must be 2 bools"),
    (lambda g, data, model: heads_task.ablation_data(model, *torch.zeros(2, 4, 10, dtype=torch.long)),
     r"targets \(m, n, 2\)"),
])
def test_bad_inputs(gen, shipped, call, pattern):
    tokens, targets = heads_task.evaluation_batch()
    data = heads_task.ablation_data(shipped[0], tokens[:4], targets[:4])
    with pytest.raises(ValueError, match=pattern):
        call(gen, data, shipped[0])
