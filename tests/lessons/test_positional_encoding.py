"""The two-offset copy task, the model with pluggable position schemes, the shipped checkpoint
(every scheme x 3 seeds, RoPE x 3 bases) and a re-training from scratch that must support the same
claims as notebook 07."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import positional_encoding as pt
from attn_helpers.training import RECIPES, checkpoint_path, run_recipe


@pytest.fixture(scope="module")
def shipped():
    models, metadata = pt.load_models()
    keys = [pt.model_key(scheme, seed) for scheme in pt.SCHEMES for seed in pt.SEEDS]
    curves = {key: pt.position_accuracy(models[key]) for key in keys}
    return models, metadata, curves, pt.attention_summary(models), pt.wrap_study(models)


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


def test_without_positions_scores_see_content_only():
    """With scheme 'none', the last token's attention over an all-equal prefix is uniform."""
    torch.manual_seed(0)
    model = pt.PositionTaskModel("none").eval()
    model(torch.full((1, 8), 3))
    assert torch.allclose(model.last_weights[0, :, -1], torch.full((3, 8), 1 / 8), atol=1e-6)


def test_rope_base_is_used():
    torch.manual_seed(0)
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
    with pytest.raises(ValueError, match="longer than max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 5))


def test_accuracy_helpers():
    curve = torch.tensor([[math.nan, math.nan], [1.0, math.nan], [0.5, math.nan], [0.0, 1.0]],
                         dtype=torch.float64)
    assert pt.accuracy_at(curve, 3) == 0.75
    assert pt.accuracy_at(curve, 4) == pytest.approx(2.5 / 4)
    assert pt.accuracy_at(curve, 4, offset=1) == 1.0
    with pytest.raises(ValueError, match="n must be"):
        pt.accuracy_at(curve, 5)
    flat = torch.cat([torch.ones(20, 1), torch.zeros(12, 1)]).double()
    assert pt.collapse_position(flat, window=4) == 19  # 18..21: 0.5, 19..22: 0.25 < 0.5
    assert pt.collapse_position(torch.ones(10, 1).double()) == 10
    assert pt.wavelength(10000.0) == pytest.approx(2 * math.pi / 0.1)
    assert pt.model_key("rope", 1) == "rope_s1" and pt.model_key("rope", 2, 625.0) == "rope_b625_s2"


def test_recipe_is_registered_and_checkpoint_is_small():
    assert pt.CHECKPOINT in RECIPES
    assert pt.CHECKPOINT.startswith("positional_")
    assert checkpoint_path(pt.CHECKPOINT).stat().st_size < 300_000


def test_shipped_checkpoint_supports_the_notebook_claims(shipped):
    models, metadata, curves, attention, wrap = shipped
    assert len(models) == 5 * 3 + 2 * 3
    verdicts = pt.claims(curves, attention, wrap)
    assert all(verdicts.values()), {k: v for k, v in verdicts.items() if not v}
    assert metadata["task"] == "copy from offsets 1 and 3"
    for key, curve in curves.items():
        for n in pt.TEST_LENGTHS:
            assert pt.accuracy_at(curve, n) == pytest.approx(metadata["accuracy"][key][str(n)],
                                                             abs=0.01)


def test_claims_can_fail(shipped):
    _, _, curves, attention, wrap = shipped

    def verdict(name, curves=curves, wrap=wrap):
        return pt.claims(curves, attention, wrap)[name]

    solved = dict(curves, none_s1=torch.ones_like(curves["none_s1"]))
    assert not verdict("without positions every seed stays below 0.5 at the training length",
                       curves=solved)
    weak = dict(curves, rope_s2=curves["rope_s2"] * 0.5)
    assert not verdict("sinusoidal, learned and RoPE: every seed above 0.95 at the training length",
                       curves=weak)
    swapped = dict(wrap)
    swapped[625.0] = dict(wrap[625.0], collapse=[500, 500, 500])
    assert not verdict("RoPE's collapse point moves with the base: later for a larger base (every "
                       "seed, in order)", wrap=swapped)
    assert not verdict("every collapse point lies between 0.45 and 0.7 of the second pair's "
                       "wavelength (these nine runs)", wrap=swapped)
    flat = {b: dict(w, crossing=[40, 40, 40]) for b, w in wrap.items()}
    assert not verdict("direct test: the distance where a farther key first outscores 3 back "
                       "(offset-3 head, mean tokens) grows with the base (every seed, in order)",
                       wrap=flat)
    assert not verdict("it lies within 6 positions of each seed's first position below 0.5 (these "
                       "nine runs)", wrap=flat)
    same = {b: dict(w, collapse=[40, 40, 40]) for b, w in wrap.items()}  # "unseen offsets" alone
    assert not verdict("collapse point ~ base^s with 0.1 < s < 0.35 (second pair: 0.25, third: 0.5, "
                       "none: 0)", wrap=same)
    third = {b: dict(w, collapse=[round(20 * (b / 625) ** 0.5)] * 3) for b, w in wrap.items()}
    assert not verdict("collapse point ~ base^s with 0.1 < s < 0.35 (second pair: 0.25, third: 0.5, "
                       "none: 0)", wrap=third)
    steady = {b: dict(w, collapse=[round(0.55 * w["wavelength"])] * 3) for b, w in wrap.items()}
    assert not verdict("that fraction shrinks as the base grows (mean of the seeds)", wrap=steady)
    late = dict(wrap)
    late[160000.0] = dict(wrap[160000.0], collapse=[70, 62, 60])
    assert not verdict("largest base: every seed above 0.9 on windows starting before 48, collapses "
                       "at 60-63", wrap=late)
    rope_dip = curves["rope_s2"].clone()
    rope_dip[20] = 0.5
    assert not verdict("RoPE: every seed above 0.9 on positions 16-31 alone, and above 0.65 at each "
                       "of them", curves=dict(curves, rope_s2=rope_dip))
    echo = curves["sinusoidal_s1"].clone()
    echo[40:] = 0.5
    assert not verdict("learned and sinusoidal: every seed below 0.15 on positions 24-63",
                       curves=dict(curves, sinusoidal_s1=echo))
    slow = curves["learned_s0"].clone()
    slow[16:20] = 1.0
    assert not verdict("learned: every seed below 0.15 already on positions 16-23",
                       curves=dict(curves, learned_s0=slow))
    to_first = dict(attention, none_first_key={s: w * 1.15 for s, w in
                                               attention["none_first_key"].items()})
    relative = dict(attention, sinusoidal_relative_gap={s: torch.zeros(3) for s in pt.SEEDS})
    assert not pt.extrapolation_claims(curves, relative)[
        "sinusoidal: every trained head's position term varies along its diagonals (> 0.5 max)"]
    assert not pt.extrapolation_claims(curves, to_first)[
        "without positions, key 0 gets 0.9-1.1 times the mean weight on keys 1..i-1 (i >= 2)"]


def _seed_group(seed: int) -> list[pt.PositionTaskModel]:
    group = []
    for scheme, _, base in [p for p in pt._plan() if p[1] == seed]:
        torch.manual_seed(seed)
        group.append(pt.PositionTaskModel(scheme, base=base))
    return group


def test_a_seeds_models_trained_together_equal_each_trained_alone():
    """``train_all`` trains the seven models of a seed as one stacked model
    (:mod:`attn_helpers.lessons.positional_together`): the same forward pass for every scheme and
    base, and the same training steps as :func:`train_scheme` (equal here to the last bit; the
    tolerance leaves room for another CPU's order of summation over 10 steps)."""
    from attn_helpers.lessons import positional_together

    group = _seed_group(2)
    weights = {"embed": torch.stack([m.embed.weight for m in group]),
               "qkv": torch.stack([m.qkv.weight for m in group]),
               "head": torch.stack([m.head.weight for m in group]),
               "positions": next(m for m in group if m.scheme == "learned").positions.weight}
    tokens = torch.randint(0, pt.VOCAB, (5, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        stacked = positional_together.stacked_logits(group, weights, tokens)
        for model, logits in zip(group, stacked, strict=True):
            torch.testing.assert_close(logits, model(tokens), atol=1e-6, rtol=0)
    positional_together.train_together(group, seed=2, steps=10)
    for (scheme, seed, base), together in zip([p for p in pt._plan() if p[1] == 2], group,
                                              strict=True):
        alone = pt.train_scheme(scheme, seed=seed, base=base, steps=10)
        for (name, a), b in zip(alone.named_parameters(), together.parameters(), strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=0, msg=f"{scheme} {base} {name}")
        assert not together.training


@pytest.mark.slow
def test_retraining_from_scratch_supports_the_same_claims():
    models, metadata, _ = run_recipe(pt.CHECKPOINT, save=False)
    curves = {key: pt.position_accuracy(model) for key, model in models.items()}
    verdicts = pt.claims(curves, pt.attention_summary(models), pt.wrap_study(models))
    assert all(verdicts.values()), {k: v for k, v in verdicts.items() if not v}
