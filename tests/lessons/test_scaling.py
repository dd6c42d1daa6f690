"""Notebook 03's measurements: score variance, saturation, the softmax Jacobian, temperature, the
training experiment across seeds and the widget."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.attention import scaled_dot_product_attention
from attn_helpers.entropy import attention_entropy
from attn_helpers.lessons import scaling

# --- variance -------------------------------------------------------------------------------


@pytest.mark.parametrize("d_k", scaling.D_KS)
def test_variance_is_d_k_unscaled_and_one_scaled(d_k):
    g = torch.Generator().manual_seed(d_k + 7)
    assert scaling.dot_products(d_k, 10_000, generator=g).var().item() == pytest.approx(d_k, rel=0.1)
    scaled = scaling.dot_products(d_k, 10_000, scaled=True, generator=g)
    assert scaled.var().item() == pytest.approx(1, rel=0.1)


def test_variance_table_and_loglog_slopes():
    table = scaling.variance_table(n_samples=4000, seed=3)
    assert [row["d_k"] for row in table] == list(scaling.D_KS)
    for row in table:
        assert row["scaled variance"] == pytest.approx(row["variance"] / row["d_k"])
    d_ks = [row["d_k"] for row in table]
    assert scaling.loglog_slope(d_ks, [row["variance"] for row in table]) == pytest.approx(1, abs=0.06)
    assert abs(scaling.loglog_slope(d_ks, [row["scaled variance"] for row in table])) < 0.06


def test_loglog_slope_of_exact_power_laws():
    xs = [1, 2, 4, 8]
    assert scaling.loglog_slope(xs, [3 * x ** -0.5 for x in xs]) == pytest.approx(-0.5)
    assert scaling.loglog_slope(xs, [7.0] * 4) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="same length"):
        scaling.loglog_slope([1, 2], [1])


# --- saturation and the Jacobian ------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, pytest.param(5, marks=pytest.mark.slow)])
def test_notebook_claims_hold_on_fresh_measurements(seed):
    """The notebook's statements about variance, saturation, gradients and the default init,
    re-measured with other seeds: the same claims() and thresholds."""
    rows = scaling.saturation_table(n_queries=2000, seed=seed)
    result = scaling.claims(
        variance=scaling.variance_table(n_samples=10_000, seed=seed), saturation=rows,
        gradients=rows, curve=scaling.jacobian_curve(seed=seed),
        init_stds={d: scaling.default_init_score_std(d, seed=seed) for d in scaling.D_KS},
        mha_init_stds={d: scaling.default_init_score_std(d, d_model=1024, module="multihead",
                                                         seed=seed) for d in scaling.D_KS})
    assert len(result) == 17
    assert all(result.values()), [claim for claim, holds in result.items() if not holds]


def test_claims_can_fail():
    rows = scaling.saturation_table(n_queries=500)
    swapped = [{**r, "scaled": not r["scaled"]} for r in rows]      # scaled and unscaled swapped
    assert not any(scaling.claims(saturation=swapped).values())
    assert not all(scaling.claims(gradients=swapped).values())
    init = {d: math.sqrt(d) for d in scaling.D_KS}                   # unit-variance, not the default
    assert not any(scaling.claims(init_stds=init).values())
    assert not any(scaling.claims(mha_init_stds=init).values())
    linear = {d: math.sqrt(d) / 3 for d in scaling.D_KS}             # nn.Linear's, not MHA's
    assert not any(scaling.claims(mha_init_stds=linear).values())
    flat = [0.3] * len(scaling.SPREADS)
    assert not all(scaling.claims(curve=flat).values())
    assert scaling.claims() == {}


def test_example_claims_count_the_sharp_rows():
    sharp = torch.eye(8, dtype=torch.float64) * 0.97 + 0.03 / 8      # every row > 0.95 on one key
    soft = torch.softmax(torch.eye(8, dtype=torch.float64), -1)       # same best key, spread out
    assert all(scaling.claims(example=(sharp, soft)).values())
    mixed = sharp.clone()          # 3 rows at 0.9: the mean largest weight stays above 0.9, but
    mixed[:3] = torch.eye(8, dtype=torch.float64)[:3] * (0.9 - 0.1 / 7) + 0.1 / 7  # 5 of 8 sharp
    result = scaling.claims(example=(mixed, soft))
    assert [claim for claim, holds in result.items() if not holds] == [
        "at least 75% of the raw rows put > 0.95 on one key"]


def test_widget_claims_hold_on_the_widget_and_can_fail():
    from attn_helpers.widgets.scaling import scaling_widget

    explorer = scaling_widget()
    explorer.set(d_k=4, scaled=False, temperature=1.0)
    unscaled = []
    for d_k in (4, 64, 1024):
        explorer.set(d_k=d_k)
        unscaled.append(dict(explorer.frame.readouts))
    explorer.set(scaled=True)
    scaled = dict(explorer.frame.readouts)
    explorer.set(temperature=0.1)
    cold = dict(explorer.frame.readouts)
    result = scaling.claims(widget=(unscaled, scaled, cold))
    assert len(result) == 2 and all(result.values()), result
    assert not any(scaling.claims(widget=(unscaled[::-1], cold, scaled)).values())


@pytest.mark.parametrize("d_k", [4, 64])
def test_default_init_score_std_of_multihead_attention_is_sqrt_d_k_over_2(d_k):
    std = scaling.default_init_score_std(d_k, d_model=256, module="multihead", seed=d_k)
    assert std == pytest.approx(math.sqrt(d_k) / 2, rel=0.1)
    torch.manual_seed(0)                                     # the premise: xavier_uniform_, no bias
    m = torch.nn.MultiheadAttention(256, 4)
    assert m.in_proj_weight.var().item() == pytest.approx(1 / 512, rel=0.05)
    assert torch.all(m.in_proj_bias == 0)
    with pytest.raises(ValueError, match="module"):
        scaling.default_init_score_std(48, d_model=256, module="multihead")
    with pytest.raises(ValueError, match="module"):
        scaling.default_init_score_std(4, module="conv")


def test_median_row_gradient_is_far_below_the_mean_for_large_unscaled_heads():
    for r in scaling.saturation_table((256, 1024), n_queries=2000, seed=2):
        if not r["scaled"]:
            assert r["median jacobian norm"] < scaling.TYPICAL_ROW * r["jacobian norm"]


def test_jacobian_curve_ends_and_peak():
    curve = scaling.jacobian_curve(n_keys=16, n_queries=1000, seed=4)
    assert len(curve) == len(scaling.SPREADS)
    assert curve[0] == pytest.approx(math.sqrt(15) / 16, rel=0.01)    # near-uniform rows
    assert curve[-1] < 0.1 * max(curve)                              # near-one-hot rows
    assert 1 < scaling.SPREADS[curve.index(max(curve))] < 4
    assert scaling.jacobian_curve([0.5], n_keys=2, n_queries=3) == pytest.approx(
        [scaling.jacobian_norm(torch.softmax(
            0.5 * torch.randn(3, 2, generator=torch.Generator().manual_seed(0),
                              dtype=torch.float64), -1)).mean().item()])


@pytest.mark.parametrize("d_k", [4, 64, 256])
def test_default_init_score_std_is_sqrt_d_k_over_3(d_k):
    std = scaling.default_init_score_std(d_k, d_model=128, seed=d_k)
    assert std == pytest.approx(math.sqrt(d_k) / 3, rel=0.1)
    torch.manual_seed(0)                                             # and the formula's premise:
    w = torch.nn.Linear(128, d_k).weight                             # uniform in +-1/sqrt(128)
    assert w.abs().max() <= 1 / math.sqrt(128) and w.var().item() == pytest.approx(1 / 384, rel=0.1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), spread=st.floats(0.01, 30.0), seed=st.integers(0, 10_000))
def test_softmax_jacobian_equals_autograd(n, spread, seed):
    s = spread * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)
    J = scaling.softmax_jacobian(torch.softmax(s, -1))
    torch.testing.assert_close(J, expected, atol=1e-12, rtol=1e-9)
    assert torch.allclose(J, J.T)                                     # symmetric
    assert torch.allclose(J.sum(-1), torch.zeros(n, dtype=torch.float64), atol=1e-12)


def test_jacobian_batched_and_norm_extremes():
    a = torch.softmax(torch.randn(2, 3, 5, dtype=torch.float64), -1)
    J = scaling.softmax_jacobian(a)
    assert J.shape == (2, 3, 5, 5)
    torch.testing.assert_close(J[1, 2], scaling.softmax_jacobian(a[1, 2]))
    assert scaling.jacobian_norm(torch.tensor([0.0, 1.0, 0.0])) == 0
    n = 4
    uniform = torch.full((n,), 1 / n, dtype=torch.float64)
    assert scaling.jacobian_norm(uniform).item() == pytest.approx(math.sqrt(n - 1) / n)
    tie = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert scaling.jacobian_norm(tie).item() == pytest.approx(0.5)   # more than the uniform row
    with pytest.raises(TypeError, match="floating"):
        scaling.softmax_jacobian(torch.ones(3, dtype=torch.long))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 12), concentration=st.floats(0.05, 5.0), seed=st.integers(0, 10_000))
def test_jacobian_norm_never_exceeds_one_half(n, concentration, seed):
    """The docstring's bound: 1/2, reached by a two-way tie (so not by the uniform row)."""
    torch.manual_seed(seed)
    a = torch.distributions.Dirichlet(torch.full((n,), concentration)).sample((200,)).double()
    a = a / a.sum(-1, keepdim=True)   # float32 rows sum to 1 only within ~1e-7: the bound needs 1
    assert scaling.jacobian_norm(a).max().item() <= 0.5 + 1e-12


# --- temperature ----------------------------------------------------------------------------


def test_scaled_attention_is_raw_softmax_at_temperature_sqrt_d_k(gen):
    q = torch.randn(4, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, k)
    torch.testing.assert_close(scaling.temperature_softmax(q @ k.T, 4.0), weights)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), fraction=st.floats(0.05, 0.95), seed=st.integers(0, 10_000))
def test_temperature_for_entropy_hits_the_target(n, fraction, seed):
    scores = 3 * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    target = fraction * math.log(n)
    T = scaling.temperature_for_entropy(scores, target)
    entropy = attention_entropy(torch.softmax(scores / T, -1)).item()
    assert entropy == pytest.approx(target, abs=1e-6)


def test_temperature_bad_inputs():
    with pytest.raises(ValueError, match="all equal"):
        scaling.temperature_for_entropy(torch.ones(4), 0.5)
    with pytest.raises(ValueError, match="outside"):
        scaling.temperature_for_entropy(torch.tensor([1.0, 0.0]), 2.0)
    with pytest.raises(ValueError, match=r"one row.*\(2, 2\)"):
        scaling.temperature_for_entropy(torch.ones(2, 2), 0.5)
    with pytest.raises(ValueError, match="temperature"):
        scaling.temperature_softmax(torch.ones(3), 0.0)
    with pytest.raises(TypeError, match="temperature"):
        scaling.temperature_softmax(torch.ones(3), "hot")
    with pytest.raises(TypeError, match="scaled"):
        scaling.random_scores(4, 2, 2, scaled=1)
    with pytest.raises(ValueError, match="d_k"):
        scaling.dot_products(0, 10)


# --- the training experiment ----------------------------------------------------------------


def test_retrieval_batch_target_is_the_value_of_the_copied_key(gen):
    query, keys, values, target = scaling.retrieval_batch(5, gen, n_keys=6, d_in=10, d_v=3,
                                                          noise=0.0)
    index = (keys == query[:, None, :]).all(-1).float().argmax(-1)
    torch.testing.assert_close(target, values[torch.arange(5), index])


def test_retrieval_model_differs_only_by_the_scale(gen):
    torch.manual_seed(0)
    scaled = scaling.RetrievalModel(8, 16, scaled=True)
    torch.manual_seed(0)
    unscaled = scaling.RetrievalModel(8, 16, scaled=False)
    assert all(torch.equal(a, b) for a, b in zip(scaled.parameters(), unscaled.parameters(),
                                                 strict=True))
    query, keys, values, _ = scaling.retrieval_batch(3, gen, n_keys=5, d_in=8, d_v=2)
    q, k = scaled.w_q(query), scaled.w_k(keys)
    scores = (q[:, None] * k).sum(-1)
    torch.testing.assert_close(
        scaled(query, keys, values),
        (torch.softmax(scores / 4.0, -1)[..., None] * values).sum(1))
    torch.testing.assert_close(
        unscaled(query, keys, values), (torch.softmax(scores, -1)[..., None] * values).sum(1))


@pytest.mark.parametrize("seed", [1, *(pytest.param(s, marks=pytest.mark.slow) for s in (0, 2, 3, 4))])
def test_training_claims_hold_across_seeds(seed):
    """The notebook's training claims (slow start, spikes, not a worse end, growing scores) with
    the notebook's settings, on five seeds."""
    runs = {flag: scaling.train_retrieval(scaled=flag, seed=seed) for flag in (True, False)}
    result = scaling.claims(runs=runs)
    assert len(result) == 6
    assert all(result.values()), [claim for claim, holds in result.items() if not holds]
    steps = [step for step, _ in runs[True].evaluations]
    assert steps == list(range(0, 301, 50))
    swapped = scaling.claims(runs={True: runs[False], False: runs[True]})
    assert not any(list(swapped.values())[:5])


def test_spikes_counts_losses_above_the_threshold_after_start():
    assert scaling.spikes([5.0] * 3 + [0.0, 0.02, 0.5, 0.001], 0.01, start=3) == 2
    assert scaling.spikes([0.5, 0.5], 0.01, start=2) == 0


def test_mean_loss_bad_range():
    with pytest.raises(ValueError, match="no losses"):
        scaling.mean_loss([1.0, 2.0], 5)


# --- the SGD study ---------------------------------------------------------------------------


@pytest.mark.parametrize("seeds", [(3,), pytest.param((4, 5, 6), marks=pytest.mark.slow)])
def test_sgd_claims_hold_on_other_seeds(seeds):
    """Notebook 03's SGD claims (gradients at the scores and at the weights, the two learning
    rates), re-measured on seeds the notebook does not use."""
    rows = scaling.sgd_study(seeds=seeds)
    result = scaling.claims(sgd=rows)
    assert len(result) == 4
    assert all(result.values()), [claim for claim, holds in result.items() if not holds]
    swapped = list(scaling.claims(sgd=[{**r, "scaled": not r["scaled"]} for r in rows]).values())
    assert not any(swapped[:2]) and not swapped[3]       # the lr 0.3 claim is symmetric


def test_sgd_runs_use_plain_sgd_and_share_the_first_batch():
    """The first SGD step is the initial loss; the run is deterministic for a seed."""
    a = scaling.train_retrieval_sgd(scaled=True, lr=0.3, seed=0, steps=3)
    b = scaling.train_retrieval_sgd(scaled=True, lr=0.3, seed=0, steps=3)
    assert a == b and len(a) == 3
    unscaled = scaling.train_retrieval_sgd(scaled=False, lr=0.3, seed=0, steps=1)
    assert unscaled[0] != a[0]                      # same weights and batch, other scores
    grads = scaling.init_gradients(scaled=True, seed=0)
    assert set(grads) == {"scores", "weights"} and all(v > 0 for v in grads.values())
    with pytest.raises(ValueError, match="lr"):
        scaling.train_retrieval_sgd(scaled=True, lr=0.0)


# --- after exercise 3: the gradient that reaches W_Q ----------------------------------------


@pytest.mark.parametrize("seeds", [(5, 6, 7, 8, 9),
                                   pytest.param(tuple(range(10, 30)), marks=pytest.mark.slow)])
def test_projection_claims_hold_on_other_seeds_and_can_fail(seeds):
    """What the notebook says after exercise 3, re-measured on seeds it does not use; with the
    scaled and unscaled rows swapped, no claim holds."""
    rows = scaling.projection_gradient_table(None, scaling.D_KS, seeds)
    for part in ("projections", "projection_parts"):
        result = scaling.claims(**{part: rows})
        assert len(result) == 3
        assert all(result.values()), [claim for claim, holds in result.items() if not holds]
        swapped = scaling.claims(**{part: [{**r, "scaled": not r["scaled"]} for r in rows]})
        assert not any(swapped.values()), swapped


def _written_out(x, W_Q, W_K, scale, g):
    """Exercise 3's chain by hand, on a batch."""
    Q, K = x @ W_Q, x @ W_K
    a = torch.softmax(scale * Q @ K.mT, dim=-1)
    dS = a * (g - (a * g).sum(-1, keepdim=True))
    return (x.mT @ (scale * dS @ K)).sum(0), (x.mT @ (scale * dS.mT @ Q)).sum(0)


def test_projection_table_runs_a_learners_function_and_equals_autograd():
    mine = scaling.projection_gradient_table(_written_out, (4, 256), (0, 1), batch=4)
    auto = scaling.projection_gradient_table(None, (4, 256), (0, 1), batch=4)
    assert [(r["d_k"], r["seed"], r["scaled"]) for r in mine] == [
        (d, s, scaled) for d in (4, 256) for s in (0, 1) for scaled in (False, True)]
    for a, b in zip(mine, auto, strict=True):
        assert (a["W_Q"], a["W_K"]) == pytest.approx((b["W_Q"], b["W_K"]), rel=1e-10)
        assert {k: v for k, v in a.items() if k not in ("W_Q", "W_K")} == {
            k: v for k, v in b.items() if k not in ("W_Q", "W_K")}
        assert 0 < a["median row"] <= a["scores"] and 0.1 <= a["top share"] <= 1
    wrong = scaling.projection_gradient_table(                       # the scale left out of dQ
        lambda x, W_Q, W_K, c, g: tuple(t / c for t in _written_out(x, W_Q, W_K, c, g)),
        (256,), (0,), batch=4)
    scaled_256 = next(r for r in auto if r["d_k"] == 256 and r["seed"] == 0 and r["scaled"])
    assert wrong[1]["scaled"] and wrong[1]["W_Q"] == pytest.approx(16 * scaled_256["W_Q"])
