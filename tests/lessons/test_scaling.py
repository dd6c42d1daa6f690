"""Notebook 03's lesson module: the softmax Jacobian against autograd, the retrieval model,
exercise 3's gradient table, and the claims functions (on the shipped record, and made false)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.lessons import scaling


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


def test_retrieval_model_refuses_a_non_bool_scaled():
    with pytest.raises(TypeError, match="scaled"):
        scaling.RetrievalModel(4, 4, scaled=1)


def test_retrieval_batch_target_is_the_value_of_the_copied_key(gen):
    query, keys, values, target = scaling.retrieval_batch(5, gen, n_keys=6, d_in=10, d_v=3,
                                                          noise=0.0)
    index = (keys == query[:, None, :]).all(-1).float().argmax(-1)
    torch.testing.assert_close(target, values[torch.arange(5), index])


def test_retrieval_model_differs_only_by_the_scale(gen):
    scaled, unscaled = (scaling.retrieval_model(flag, 0, d_k=16, d_in=8) for flag in (True, False))
    assert all(torch.equal(a, b) for a, b in zip(scaled.parameters(), unscaled.parameters(),
                                                 strict=True))
    query, keys, values, _ = scaling.retrieval_batch(3, gen, n_keys=5, d_in=8, d_v=2)
    q, k = scaled.w_q(query), scaled.w_k(keys)
    scores = (q[:, None] * k).sum(-1)
    torch.testing.assert_close(scaled(query, keys, values),
                               (torch.softmax(scores / 4.0, -1)[..., None] * values).sum(1))
    torch.testing.assert_close(
        unscaled(query, keys, values), (torch.softmax(scores, -1)[..., None] * values).sum(1))


def test_spikes_and_mean_loss():
    assert scaling.spikes([5.0] * 3 + [0.0, 0.02, 0.5, 0.001], 0.01, start=3) == 2
    assert scaling.spikes([0.5, 0.5], 0.01, start=2) == 0
    with pytest.raises(ValueError, match="no losses"):
        scaling.mean_loss([1.0, 2.0], 5)


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


def _failing(claims: dict) -> list[str]:
    return [statement for statement, holds in claims.items() if not holds]


def _adam_runs(end_std: float) -> dict:
    """Two made-up Adam runs of 300 steps that meet section 4's statements when ``end_std > 2``."""
    scaled = [0.5] * 49 + [0.001] * 251
    unscaled = [1.0] * 100 + [0.0] * 170 + [0.5] * 30                  # 30 spikes, median 0
    return {True: {"losses": scaled, "score std": [1.0, end_std]},
            False: {"losses": unscaled, "score std": [16.0, 16.0]}}


def test_training_claims_fail_when_one_is_made_false():
    assert _failing(scaling.training_claims(_adam_runs(3.0))) == []
    failing = _failing(scaling.training_claims(_adam_runs(1.5)))
    assert len(failing) == 1 and failing[0].startswith("training multiplies")


def test_every_claim_holds_on_the_record_and_fails_when_one_is_made_false():
    record = json.loads(scaling.RECORD.read_text())
    adam, sweep = record["adam"], record["sweep"]
    for seed in range(5):
        assert _failing(scaling.training_claims(
            {flag: scaling.adam_arm(adam, flag, 1.0, 3e-3)[seed] for flag in (True, False)})) == []
    for claims in (scaling.sgd_claims(record["sgd"]), scaling.lr_claims(sweep),
                   scaling.crossed_claims(adam), scaling.spike_claims(adam), scaling.dk_claims(
                       record["dk_sweep"]), scaling.matched_claims(sweep, record["matched"]),
                   scaling.projection_claims(record["projection"])):
        assert _failing(claims) == []
    sgd = copy.deepcopy(record["sgd"])
    run = next(r for r in sgd if r["lr"] == 3.0 and r["seed"] == 0 and not r["scaled"])
    run["losses"][-50:] = [0.0] * 50                                  # the unscaled run learns
    failing = _failing(scaling.sgd_claims(sgd))
    assert len(failing) == 1 and failing[0].startswith("SGD, lr 3:")
    sweep = [r | {"end": 0.0} if r["lr"] == 0.03 and not r["scaled"] else r for r in sweep]
    failing = _failing(scaling.lr_claims(sweep))                      # best rate at the edge
    assert len(failing) == 1 and failing[0].startswith("SGD at 7 rates")
    calm = [r | {"losses": [0.0] * 300} if r["init"] == 4.0 and r["lr"] > 3e-3 else r for r in adam]
    failing = _failing(scaling.crossed_claims(calm))                  # the 4x start stops spiking
    assert len(failing) == 1 and failing[0].startswith("4x start at 4 x 3e-3")
    flat = [r | {"end": r["end"] / 100} if r["d_k"] == 1024 and not r["scaled"] else r
            for r in record["dk_sweep"]]
    assert [c[:26] for c in _failing(scaling.dk_claims(flat))] == ["each at its own best rate,"]


def test_projection_claims_hold_on_one_seed_and_fail_when_one_is_made_false():
    table = scaling.projection_gradient_table(None, scaling.D_KS, (0,))
    assert _failing(scaling.projection_claims(table)) == []
    assert _failing(scaling.projection_claims(table, why=True)) == []
    steep = [r | {"W_Q": 1.3 * r["W_Q"]} if r["d_k"] == 1024 and r["scaled"] else r for r in table]
    failing = _failing(scaling.projection_claims(steep))
    assert len(failing) == 1 and failing[0].startswith("scaled: |dW_Q| flat")
    spread = [r | {"top share": 0.5} if r["d_k"] == 1024 and not r["scaled"] else r for r in table]
    failing = _failing(scaling.projection_claims(spread, why=True))
    assert len(failing) == 1 and failing[0].startswith("d_k = 1024: the top 10%")
