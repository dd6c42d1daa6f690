"""Cost counting, power-law fits, the committed benchmark data and the checkers (the widget:
tests/widgets/test_complexity_widget.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.efficient import online_softmax_step
from attn_helpers.exercises.complexity import check_online_softmax_step, check_score_matrix_bytes
from attn_helpers.lessons import complexity as cx
from attn_helpers.widgets.complexity import FIT_N_MIN  # the fit range the notebook uses


def test_attention_costs_formulas():
    costs = cx.attention_costs(1024, 64, heads=8)
    assert costs["QK^T"]["flops"] == 8 * 2 * 1024**2 * 64 == costs["PV"]["flops"]
    assert costs["softmax"]["flops"] == 8 * 5 * 1024**2
    assert costs["softmax"]["bytes"] == 8 * 2 * 1024**2 * 4
    assert costs["total"]["flops"] == sum(costs[s]["flops"] for s in ("QK^T", "softmax", "PV"))
    doubled = cx.attention_costs(2048, 64, heads=8)
    assert doubled["QK^T"]["flops"] == 4 * costs["QK^T"]["flops"]
    half = cx.attention_costs(1024, 64, heads=8, dtype=torch.float16)
    assert half["total"]["bytes"] * 2 == costs["total"]["bytes"]


def test_score_matrix_bytes_and_element_size():
    assert cx.score_matrix_bytes(1024, heads=8) == 32 * 2**20
    assert cx.score_matrix_bytes(10, dtype=torch.bfloat16) == 200
    assert cx.element_size(torch.float64) == 8
    with pytest.raises(TypeError, match="dtype"):
        cx.element_size("float32")
    with pytest.raises(ValueError, match="n"):
        cx.score_matrix_bytes(0)


def test_kv_cache_flops_grow_linearly_with_cache_and_quadratically_without():
    small, large = cx.kv_cache_flops(1023, 64), cx.kv_cache_flops(2047, 64)
    assert large["with_cache"] < 2.1 * small["with_cache"]
    assert large["without_cache"] > 3.5 * small["without_cache"]
    assert cx.kv_cache_flops(0, 8)["with_cache"] == cx.kv_cache_flops(0, 8)["without_cache"]


def test_fit_power_law_recovers_exponent_and_coefficient():
    ns = [128, 256, 512, 1024]
    law = cx.fit_power_law(ns, [3.0 * n**1.7 for n in ns])
    assert math.isclose(law.slope, 1.7) and math.isclose(law.coefficient, 3.0)
    assert math.isclose(law.predict(2048), 3.0 * 2048**1.7)
    with pytest.raises(ValueError, match="two distinct"):
        cx.fit_power_law([4, 4], [1, 2])
    with pytest.raises(ValueError, match="> 0"):
        cx.fit_power_law([1, 2], [0, 1])
    with pytest.raises(ValueError, match="same length"):
        cx.fit_power_law([1, 2], [1])


def test_committed_benchmark_holds_every_method_up_to_8192():
    records = cx.load_benchmark()
    methods = {r["method"] for r in records}
    assert methods == {"naive", "sdpa", "tiled", "linear", "local", "matmul_peak"}
    for m in methods - {"matmul_peak"}:
        ns, _ = cx.series(records, m, "median_ms")
        assert ns == [128 * 2**i for i in range(7)]
    assert cx.matmul_peak(records) > 0


def test_committed_benchmark_meets_the_targets_and_slopes():
    records = cx.load_benchmark()
    by = {(r["method"], r.get("n")): r for r in records}
    assert by[("tiled", 8192)]["peak_bytes"] <= 0.05 * by[("naive", 8192)]["peak_bytes"]
    assert by[("tiled", 4096)]["median_ms"] <= 3 * by[("sdpa", 4096)]["median_ms"]
    time_fits = cx.fit_methods(records, "median_ms", n_min=FIT_N_MIN)
    memory_fits = cx.fit_methods(records, "peak_bytes", n_min=FIT_N_MIN)
    assert 1.6 <= time_fits["naive"].slope <= 2.4 and 1.7 <= memory_fits["naive"].slope <= 2.3
    for m in ("linear", "local"):
        assert 0.6 <= time_fits[m].slope <= 1.4 and memory_fits[m].slope <= 1.4
    for m in ("sdpa", "tiled"):
        assert memory_fits[m].slope <= 1.2


def test_validate_records_names_the_bad_record():
    good = [{"method": "naive", "n": 128, "median_ms": 1.0, "peak_bytes": 10, "gflops": 1.0},
            {"method": "matmul_peak", "gflops": 5.0}]
    assert cx.validate_records(good) == good
    with pytest.raises(ValueError, match="record 0"):
        cx.validate_records([{"method": "naive", "n": 128}, good[1]])
    with pytest.raises(ValueError, match="matmul_peak"):
        cx.validate_records(good[:1])
    with pytest.raises(ValueError, match="non-empty"):
        cx.validate_records([])


def test_format_bytes():
    assert cx.format_bytes(512) == "512 B"
    assert cx.format_bytes(1536) == "1.5 KiB"
    assert cx.format_bytes(32 * 2**20) == "32 MiB"


def test_checkers_accept_the_reference_and_explain_mistakes():
    def right(m, l, acc, scores, values):
        new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
        p, c = torch.exp(scores - new_m), torch.exp(m - new_m)
        return new_m, l * c + p.sum(-1, keepdim=True), acc * c + p @ values

    def wrong(m, l, acc, scores, values):
        new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - new_m)
        return new_m, l * torch.exp(m - new_m) + p.sum(-1, keepdim=True), acc + p @ values

    assert check_online_softmax_step(right)
    verdict = check_online_softmax_step(wrong)
    assert not verdict and "acc needs the same factor" in verdict.message
    assert check_online_softmax_step(lambda *a: tuple(online_softmax_step(
        __import__("attn_helpers.efficient", fromlist=["x"]).OnlineSoftmaxState(*a[:3]), *a[3:])))
    assert check_score_matrix_bytes(lambda n, h, dtype: h * n * n * cx.element_size(dtype))
    verdict = check_score_matrix_bytes(lambda n, h, dtype: h * n * n * 4)
    assert not verdict and "float16" in verdict.message
    assert "number of bytes" in check_score_matrix_bytes(lambda n, h, d: "big").message
