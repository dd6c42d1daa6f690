"""Notebook 08's committed benchmark records, the live harness and the bandwidth measurement.
(The tile stepper: tests/widgets/test_complexity_widget.py; the checkers: tests/exercises/.)"""

from __future__ import annotations

import pytest
import torch

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


def test_copy_bandwidth_takes_the_best_of_its_repeats_and_rejects_a_bad_count():
    assert 0.1 < cx.copy_bandwidth_gbps(n_bytes=2**20, budget_s=0.01, repeats=2) < 10_000
    with pytest.raises((ValueError, TypeError), match="repeats"):
        cx.copy_bandwidth_gbps(n_bytes=2**20, repeats=0)


def test_benchmark_measures_every_planned_call_and_slope_reads_the_exponent():
    ms, peak = cx.benchmark({"qk": lambda q, k, v: q @ k.mT}, {"qk": {64: 2, 128: 1}}, torch.Generator())
    assert set(ms) == set(peak) == {("qk", 64), ("qk", 128)} and min(ms.values()) >= 0
    assert peak[("qk", 128)] == 4 * peak[("qk", 64)] == 4 * 8 * 64 * 64 * 4   # (1, 8, n, n) float32
    assert cx.slope({("m", n): 3 * n**2 for n in (256, 512, 1024)}, "m") == pytest.approx(2.0)
