"""Notebook 10's recorded comparisons: the stored measurement of nanoGPT's CPU recipe on this
split, the final recipe's stored seeds, the FLOP count the notebook compares, and (slow) nanoGPT's
settings re-measured. The final recipe's seed 0 is re-trained by notebook 10 itself, in both strict
nbval passes, which asserts its claims, its heads' claims and that it lands on the stored seed
(``build_gpt_compare.rerun_claims``)."""

from __future__ import annotations

import pytest

from attn_helpers.lessons import build_gpt as bg
from attn_helpers.lessons import build_gpt_compare as cmp
from attn_helpers.lessons import build_gpt_train as bgt


def test_the_stored_bar_is_the_package_recipe_on_this_split():
    bar = cmp.load_nanogpt_bar()
    assert len(bar["nats"]) == len(bar["seeds"]) >= 2
    assert bar["mean"] <= bgt.BAR_NATS
    assert bar["recipe"]["steps"] == bgt.NANOGPT.steps and bar["recipe"]["lr"] == bgt.NANOGPT.lr
    assert bar["recipe"]["batch"] == bgt.NANOGPT.batch
    assert bar["config"]["d_ff"] == bg.GPTConfig(0).d_ff == 512


def test_the_stored_seeds_are_the_final_recipe_and_hold_the_target():
    seeds = cmp.load_final_seeds()
    assert len(seeds["nats"]) == len(seeds["seeds"]) >= 3
    assert seeds["recipe"] == cmp._recipe(bgt.FINAL) and seeds["size"] == bgt.FINAL_SIZE
    assert all(cmp.seed_claims(seeds).values())
    assert all(cmp.nanogpt_claims().values())
    assert cmp.flop_checks(bgt.final_config(bg.load_corpus().vocab_size)) != {}


def test_the_final_recipe_costs_under_two_fifths_of_nanogpts_flops():
    v = bg.load_corpus().vocab_size
    share = (bgt.train_flops(bgt.final_config(v), bgt.FINAL)
             / bgt.train_flops(bg.GPTConfig(v), bgt.NANOGPT))
    assert 0.3 < share <= 0.4
    assert bgt.FINAL.steps * bgt.FINAL.batch < bgt.NANOGPT.steps * bgt.NANOGPT.batch


@pytest.mark.slow
def test_nanogpts_recipe_re_measured_matches_the_stored_bar():
    bar = cmp.load_nanogpt_bar()
    fresh = cmp.measure_nanogpt_bar(seeds=(0,))
    assert fresh["nats"][0] == pytest.approx(bar["nats"][0], abs=0.03)
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in fresh["recipe"].items()} \
        == bar["recipe"]
    assert fresh["config"] == bar["config"]

