"""The benchmarks' commands: ``bench attention`` (JSON records on small n, memory accounting, the
targets), ``bench gpt`` run tiny, and the tools' entry points."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from attn_helpers import bench, measure
from attn_helpers.__main__ import main as tools_main
from attn_helpers.bench import gpt
from attn_helpers.bench.attention import attention_verdict
from attn_helpers.lessons import complexity as cx


def test_cli_prints_the_schema_on_small_n(capsys):
    threads = torch.get_num_threads()       # in this process: a new one spent 3.5 s importing torch
    assert bench.main(["attention", "--max-n", "256", "--threads", "1", "--budget-s", "0.02"]) == 0
    torch.set_num_threads(threads)
    done = capsys.readouterr()
    *timings, peak, machine = json.loads(done.out)
    assert {(r["method"], r["n"]) for r in timings} == {
        (m, n) for m in cx.ATTENTION_METHODS + cx.FWD_BWD_METHODS for n in (128, 256)}
    assert all(set(r) == {"method", "n", "median_ms", "peak_bytes", "gflops"} for r in timings)
    assert set(peak) == {"method", "gflops"} and peak["method"] == "matmul_peak"
    assert machine["method"] == "machine" and machine["copy_gbps"] > 0 and machine["threads"] == 1
    assert done.err.count("not measured") == 3  # the targets at 4096/8192 are not checked


def test_peak_bytes_counts_the_buffers_alive_at_once():
    size = 4 * 2**20
    assert measure.peak_bytes(lambda: torch.empty(size // 4)) >= size
    assert measure.peak_bytes(lambda: (torch.empty(size // 4), torch.empty(size // 4))) >= 2 * size
    assert measure.peak_bytes(lambda: [torch.empty(size // 4).sum() for _ in range(3)]) < 2 * size


def test_naive_materialises_the_scores_and_tiled_does_not():
    q, k, v = (torch.randn(1, 8, 1024, 64) for _ in range(3))
    naive = measure.peak_bytes(lambda: cx.ATTENTION_FUNCTIONS["naive"](q, k, v))
    tiled = measure.peak_bytes(lambda: cx.ATTENTION_FUNCTIONS["tiled"](q, k, v))
    assert naive >= 8 * 1024 * 1024 * 4 and tiled < naive       # the (8, n, n) scores
    for method, fn in cx.ATTENTION_FUNCTIONS.items():
        assert fn(q[..., :200, :], k[..., :200, :], v[..., :200, :]).shape == (1, 8, 200, 64), method


def test_flop_counts():
    assert cx.attention_flops("naive", 1024) == 4 * 8 * 1024**2 * 64
    assert cx.attention_flops("tiled_fwd_bwd", 1024) == 12 * 8 * 1024**2 * 64
    assert cx.attention_flops("linear", 1024) == 4 * 8 * 1024 * 64**2
    assert cx.attention_flops("local", 1024) == 4 * 8 * 1024 * cx.LOCAL_WINDOW * 64


def test_fwd_bwd_call_gives_sdpas_gradients_and_saved_bytes_count_the_saved_tensors():
    g = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(1, 2, 100, 16, generator=g) for _ in range(4))
    grads = {m: cx.fwd_bwd_call(cx.ATTENTION_FUNCTIONS[m], q, k, v, d_out)()
             for m in cx.FWD_BWD_METHODS}
    for m in ("naive_fwd_bwd", "tiled_fwd_bwd"):
        for ours, ref in zip(grads[m], grads["sdpa_fwd_bwd"], strict=True):
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)
    assert not q.requires_grad                                  # the inputs are left alone
    tiled = cx.saved_bytes(cx.ATTENTION_FUNCTIONS["tiled_fwd_bwd"], q, k, v)
    assert tiled == 4 * (4 * 2 * 100 * 16 + 2 * 100)             # q, k, v, O and lse
    assert cx.saved_bytes(cx.ATTENTION_FUNCTIONS["naive_fwd_bwd"], q, k, v) >= 4 * 2 * 100 * 100
    assert cx.saved_bytes(lambda q, k, v: q + k, q, k, v) == 0


def test_bench_records_forward_and_backward_up_to_their_limit_and_rejects_bad_arguments():
    records = cx.bench_attention(300, methods=("sdpa", "tiled_fwd_bwd"), budget_s=0.01,
                                 fwd_bwd_max_n=128, references=False)
    assert [(r["method"], r["n"]) for r in records] == [                # n = 128, 256 (<= 300)
        ("sdpa", 128), ("tiled_fwd_bwd", 128), ("sdpa", 256)]
    assert records[1]["peak_bytes"] > records[0]["peak_bytes"]   # gradients cost memory
    with pytest.raises(ValueError, match="methods"):
        cx.bench_attention(128, methods=("fast",))
    with pytest.raises(ValueError, match="device"):
        cx.bench_attention(128, device="tpu")
    for bad in (["--max-n", "64"], ["--budget-s", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            bench.main(["attention", *bad])


def test_cache_sizes():
    sizes = cx.cache_sizes()
    assert all(isinstance(v, int) and v > 0 for v in sizes.values())
    if sizes:                                                    # Linux (sysfs) or macOS
        assert "L1d" in sizes and "L1i" not in sizes


def test_verdict_checks_the_three_targets():
    rows = [{"method": m, "n": n, "median_ms": ms, "peak_bytes": b, "gflops": 1.0}
            for m, n, ms, b in [("naive", 8192, 9.0, 1000), ("tiled", 8192, 9.0, 40),
                                ("sdpa", 4096, 1.0, 10), ("tiled", 4096, 2.5, 10),
                                ("naive_fwd_bwd", 4096, 5.0, 1000),
                                ("tiled_fwd_bwd", 4096, 5.0, 30)]]
    rows += [{"method": "matmul_peak", "gflops": 10.0}]
    ok, text = attention_verdict(rows)
    assert ok and "4.00% of naive's" in text and "2.50x sdpa's" in text
    assert "3.00% of naive_fwd_bwd's" in text
    rows[3]["median_ms"] = 3.5
    assert not attention_verdict(rows)[0]
    rows[3]["median_ms"] = 2.5
    rows[5]["peak_bytes"] = 60
    ok, text = attention_verdict(rows)
    assert not ok and "6.00% of naive_fwd_bwd's (target <= 5%): NOT met" in text


def test_bench_gpt_runs_tiny_and_reports_the_ratio(capsys):
    assert gpt.main(["--tiny", "--steps", "3"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["ratio"] > 0 and set(result["median_step_ms"]) == {"course", "torch"}
    assert result["params"]["course"] == result["params"]["torch"]
    assert f"{result['ratio']:.2f}x (target <= 1.5x)" in out.err


def test_every_command_is_registered(capsys):
    for name in bench.COMMANDS:
        with pytest.raises(SystemExit) as info:
            bench.main([name, "--help"])
        assert info.value.code == 0 and "--check" in capsys.readouterr().out, name
    assert bench.main(["nothing"]) == 2 and "widget" in capsys.readouterr().out
    assert tools_main([]) == 2 and "bench" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        bench.main(["widget", "--repeats", "0"])
    assert info.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err


def test_import_attn_helpers_stays_light():
    """Only what the package adds beyond torch counts."""
    code = ("import sys, torch; before = set(sys.modules); import attn_helpers; "
            "print(sorted(set(sys.modules) - before))")
    added = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    for heavy in ("seaborn", "tqdm", "ipywidgets", "attn_helpers.training", "attn_helpers.lessons",
                  "attn_helpers.widgets", "transformers", "tokenizers"):
        assert f"'{heavy}" not in added, (heavy, added)
