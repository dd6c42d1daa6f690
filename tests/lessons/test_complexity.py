"""Notebook 08's committed benchmark records, and the tile stepper against the core's online softmax.
(The widget: tests/widgets/test_complexity_widget.py; the checkers: tests/exercises/.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_helpers.efficient import init_state, online_softmax_step
from attn_helpers.entropy import attention_entropy
from attn_helpers.lessons import complexity as cx


def test_committed_benchmark_holds_every_method_and_the_machine():
    records = cx.load_benchmark()
    assert {r["method"] for r in records} == set(cx.ATTENTION_METHODS + cx.FWD_BWD_METHODS) | {
        "matmul_peak", "machine"}
    for m in cx.ATTENTION_METHODS:
        assert cx.series(records, m, "median_ms")[0] == [128 * 2**i for i in range(7)]
    for m in cx.FWD_BWD_METHODS:
        assert cx.series(records, m, "median_ms")[0] == [128 * 2**i for i in range(6)]
    assert cx.machine(records)["cache_bytes"]["L3"] >= 2**20
    assert sorted(cx.fit_methods(records, n_min=cx.FIT_N_MIN)) == sorted(cx.ATTENTION_METHODS)


def test_validate_records_names_the_bad_record():
    good = [{"method": "naive", "n": 128, "median_ms": 1.0, "peak_bytes": 10, "gflops": 1.0},
            {"method": "matmul_peak", "gflops": 5.0},
            {"method": "machine", "cache_bytes": {"L3": 2**25}, "copy_gbps": 10.0}]
    assert cx.validate_records(good) == good
    assert cx.validate_records(good[:2]) == good[:2]          # the machine record is optional
    for bad, match in (([{"method": "naive", "n": 128}, good[1]], "record 0"),
                       (good[:1], "matmul_peak"), ([], "non-empty"),
                       ([{**good[0], "method": "fast"}, good[1]], "record 0"),
                       ([*good[:2], {**good[2], "cache_bytes": {"L3": "32M"}}], "record 2"),
                       ([*good, good[2]], "at most one 'machine'")):
        with pytest.raises(ValueError, match=match):
            cx.validate_records(bad)


# The tile stepper

def reference_states(scores, block, causal):
    """Row block by row block, the core's online_softmax_step over the same tiles: the (m, l)
    after every tile, in FlashAttention-2's order."""
    n, states = scores.shape[0], []
    for i in range(0, n, block):
        rows = slice(i, min(i + block, n))
        state = init_state((), rows.stop - rows.start, 1, dtype=torch.float64)
        for j in range(0, rows.stop if causal else n, block):
            cols = slice(j, min(j + block, n))
            state = online_softmax_step(state, scores[rows, cols],
                                        torch.ones(cols.stop - cols.start, 1, dtype=torch.float64))
            states.append((rows, state.max.squeeze(-1), state.total.squeeze(-1)))
    return states


@pytest.mark.parametrize("n, block, causal", [(12, 4, False), (10, 3, False), (11, 4, True),
                                              (7, 7, False), (9, 1, True)])
def test_tile_stepper_follows_the_online_softmax(n, block, causal):
    scores = cx.tile_scores(n, causal=causal)
    states = reference_states(scores, block, causal)
    assert len(states) == cx.tile_stepper(n, block, 0, causal=causal).n_steps
    for step, (rows, m, l) in enumerate(states, start=1):
        frame = cx.tile_stepper(n, block, step, causal=causal)
        assert frame.tile[:2] == (rows.start, rows.stop)
        np.testing.assert_allclose(frame.m[rows], m.numpy())
        np.testing.assert_allclose(frame.l[rows], l.numpy())
        previous = cx.tile_stepper(n, block, step - 1, causal=causal)
        expected = np.where(np.isfinite(previous.m[rows]), np.exp(previous.m[rows] - m.numpy()), 0)
        np.testing.assert_allclose(frame.rescale[rows], expected)
        untouched = np.ones(n, bool)
        untouched[rows] = False
        assert (frame.rescale[untouched] == 1).all()


@pytest.mark.parametrize("causal", [False, True])
def test_tile_stepper_ends_at_softmax_and_its_entropy(causal):
    n, block = 13, 4
    first = cx.tile_stepper(n, block, 0, causal=causal)
    assert first.tile is None and np.isnan(first.weights).all() and not first.finished.any()
    last = cx.tile_stepper(n, block, first.n_steps, causal=causal)
    weights = torch.softmax(cx.tile_scores(n, causal=causal), dim=-1)
    np.testing.assert_allclose(np.nan_to_num(last.weights, nan=0.0), weights.numpy(), atol=1e-12)
    np.testing.assert_allclose(last.entropy, attention_entropy(weights).numpy())
    visible = np.arange(1, n + 1) if causal else np.full(n, n)
    np.testing.assert_allclose(last.ceiling, np.log(visible))


def test_tile_schedule_is_flashattention2s_order():
    assert cx.tile_schedule(5, 2, causal=True) == [(0, 2, 0, 2), (2, 4, 0, 2), (2, 4, 2, 4),
                                                   (4, 5, 0, 2), (4, 5, 2, 4), (4, 5, 4, 5)]
    assert len(cx.tile_schedule(5, 2)) == 9 and cx.tile_schedule(5, 2)[:2] == [(0, 2, 0, 2),
                                                                               (0, 2, 2, 4)]
    assert len(cx.tile_schedule(12, 4, causal=True)) == 6                    # not 9


def test_tile_stepper_checks_its_controls():
    with pytest.raises(ValueError, match="n must be between 2 and 64"):
        cx.tile_stepper(65, 4, 0)
    with pytest.raises(ValueError, match="block_size must be between 1 and 8"):
        cx.tile_stepper(8, 9, 0)
    with pytest.raises(ValueError, match="step must be between 0 and 4"):
        cx.tile_stepper(8, 4, 5)
    with pytest.raises(TypeError, match="step must be an int"):
        cx.tile_stepper(8, 4, 1.0)


def test_copy_bandwidth_takes_the_best_of_its_repeats_and_rejects_a_bad_count():
    assert 0.1 < cx.copy_bandwidth_gbps(n_bytes=2**20, budget_s=0.01, repeats=2) < 10_000
    with pytest.raises((ValueError, TypeError), match="repeats"):
        cx.copy_bandwidth_gbps(n_bytes=2**20, repeats=0)
