"""Notebook 05's experiments: masked gradients, generation with and without the KV cache, the
cache's memory, grouped-query attention against torch, and the GQA trade-off; ``claims()`` on
freshly computed results."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.decoder_lm import TinyCausalLM
from attn_helpers.kv_cache import kv_cache_bytes
from attn_helpers.lessons import masking


@pytest.fixture(scope="module")
def comparison():
    torch.manual_seed(0)
    model = TinyCausalLM(32, 128, 4, 4, 512, max_len=256).eval()
    prompt = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(0))
    return masking.compare_generation(model, prompt, 200)


def test_masked_gradients_are_exactly_zero():
    grads = masking.masked_gradients()
    assert grads["masked"] == 0 and grads["empty row"] == 0 and not grads["nan"]
    assert grads["visible"] > 0


def test_generation_same_tokens_and_costs(comparison):
    assert comparison.same_tokens and comparison.logit_gap < 1e-4
    assert comparison.steps == 200
    with_costs, without_costs = comparison.with_cache.costs, comparison.without_cache.costs
    layers_heads = 4 * 4
    assert with_costs[0].positions == 8 and with_costs[0].scores == layers_heads * 8 * 8
    for t, (c_with, c_without) in enumerate(zip(with_costs, without_costs, strict=True)):
        assert c_without.positions == 8 + t and c_without.scores == layers_heads * (8 + t) ** 2
        if t:                                      # one new position, one row of 8 + t scores
            assert c_with.positions == 1 and c_with.scores == layers_heads * (8 + t)
    assert comparison.without_cache.cache_bytes == 0
    # 4 layers x keys and values x (b=1, g=4, 1, max_len=256, d_head=32) float32
    assert comparison.with_cache.cache_bytes == 4 * 2 * 4 * 256 * 32 * 4
    with_rate, without_rate = comparison.tokens_per_s
    assert with_rate / without_rate == pytest.approx(comparison.speedup)


def test_cache_examples_match_the_formula():
    ex = masking.cache_examples()
    assert ex["bytes per token"] == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert ex["bytes per token, 8 kv heads"] == ex["bytes per token"] // 4
    assert ex["weight bytes"] == pytest.approx(13.48e9, rel=1e-3)
    n = ex["tokens to outweigh the weights"]
    assert kv_cache_bytes(int(n), **masking.LLAMA2_7B) < ex["weight bytes"]
    assert kv_cache_bytes(int(n) + 1, **masking.LLAMA2_7B) > ex["weight bytes"]
    assert ex["tokens to outweigh the weights, 8 kv heads"] == pytest.approx(4 * n)


@pytest.mark.parametrize("g", [8, 4, 2, 1])
def test_gqa_equals_torch_enable_gqa(g):
    assert masking.gqa_torch_gap(g) < 1e-5


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


def test_compare_generation_rejects_a_non_model():
    with pytest.raises(TypeError, match="TinyCausalLM"):
        masking.compare_generation(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), 3)


def test_claims_fail_when_the_cache_changes_the_tokens(comparison):
    """A claim that cannot fail is a defect: corrupt one token and the claim must say so."""
    tradeoff = {4: [{"accuracy": 0.9, "loss": 0.3}] * 2, 1: [{"accuracy": 0.9, "loss": 0.3}] * 2}
    broken = masking.GenerationComparison(comparison.with_cache, comparison.without_cache,
                                          comparison.seconds_with, comparison.seconds_with)
    broken.without_cache = type(comparison.without_cache)(
        comparison.without_cache.tokens.clone(), comparison.without_cache.logits,
        comparison.without_cache.costs, 0)
    broken.without_cache.tokens[0, -1] += 1
    result = masking.claims(broken, tradeoff)
    assert not result["with and without the cache, the generated tokens are identical"]
    assert not result[f"with the cache, generation is over {masking.SPEEDUP_MIN}x faster (same run)"]
    worse = {4: [{"accuracy": 0.9}] * 2, 1: [{"accuracy": 0.5}] * 2}
    assert not all(masking.claims(comparison, worse).values())


def test_claims_hold_on_a_fresh_generation(comparison):
    """claims() on this module's fresh generation, with a trade-off given: the cache claims hold,
    and the trade-off's claims are gqa_claims() unchanged. The GQA claims on fresh trainings
    (gqa_tradeoff(): g = 4, 2, 1 x seeds 0-2, nine runs) are asserted by notebook 05 itself, same
    function and defaults, in both strict nbval passes of CI; not re-trained here a third time."""
    tradeoff = {4: _runs(0.9, 0.92, 0.91), 2: _runs(0.91, 0.9, 0.9), 1: _runs(0.9, 0.91, 0.9)}
    result = masking.claims(comparison, tradeoff)
    assert result == {**masking.claims(comparison), **masking.gqa_claims(tradeoff)}
    # The speed claim is a timing: the notebook asserts it, the tests do not (issue 20); its logic
    # is tested with forced timings in test_claims_fail_when_the_cache_changes_the_tokens.
    result.pop(f"with the cache, generation is over {masking.SPEEDUP_MIN}x faster (same run)")
    assert all(result.values()), [name for name, holds in result.items() if not holds]


DROP_CLAIM = "each g < h loses no more mean accuracy than the spread of its own seeds"
PAIR_CLAIM = "any two g < h: their means differ by no more than the smaller of their seed spreads"


def _runs(*accuracies):
    return [{"accuracy": a, "loss": 0.5} for a in accuracies]


def test_gqa_claims_compare_each_gap_with_the_seed_spread(comparison):
    """The notebook's reading ("within the seed spread") holds for wide spreads, fails for tight."""
    wide = {4: _runs(0.9, 0.9, 0.9), 2: _runs(0.7, 0.8, 0.9), 1: _runs(0.75, 0.85, 0.95)}
    result = masking.claims(comparison, wide)      # drops 0.10 and 0.05, spreads 0.2, gap 0.05
    assert result[DROP_CLAIM] and result[PAIR_CLAIM]
    tight = {4: _runs(0.9, 0.9, 0.9), 2: _runs(0.79, 0.8, 0.81), 1: _runs(0.85, 0.86, 0.87)}
    result = masking.claims(comparison, tight)     # drop 0.10 > spread 0.02, gap 0.06 > 0.02
    assert not result[DROP_CLAIM] and not result[PAIR_CLAIM]
    one_sided = {4: _runs(0.9, 0.9, 0.9), 2: _runs(0.6, 0.8, 1.0), 1: _runs(0.5, 0.51, 0.52)}
    assert not masking.claims(comparison, one_sided)[PAIR_CLAIM]   # the smaller spread decides


def test_top_left_causal_demo_shows_torchs_anchor_and_the_bottom_right_rule():
    demo = masking.top_left_causal_demo(n_q=2, n_k=5)
    assert demo["top-left"].tolist() == [[True, False, False, False, False],
                                         [True, True, False, False, False]]
    assert demo["bottom-right"].sum(-1).tolist() == [4, 5]
    assert demo["torch == top-left"] < 1e-6 and demo["bottom-right gap"] < 1e-6
    assert demo["torch gap"] > 1e-2
    square = masking.top_left_causal_demo(n_q=5, n_k=5)              # n_q == n_k: both agree
    assert torch.equal(square["top-left"], square["bottom-right"]) and square["torch gap"] < 1e-6


def test_overhead_claims_hold_and_can_fail():
    (claim,) = masking.overhead_claims({1: 1.0, 200: 60.0}).values()
    assert claim
    (claim,) = masking.overhead_claims({1: 1.0, 200: 120.0}).values()
    assert not claim
    lm = TinyCausalLM(vocab_size=8, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=32)
    seconds = masking.forward_seconds(lm.eval(), (1, 16), repeats=1)
    assert set(seconds) == {1, 16} and all(s > 0 for s in seconds.values())
