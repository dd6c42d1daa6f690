"""Benchmarks behind the course's speed claims: ``python -m attn_helpers.bench NAME``.

``widget``: the cost of one slider move (compute + render + PNG into the ``ipywidgets.Image``)
for the live, blitted widget, beside the naive approach of re-creating a seaborn heatmap figure
on every change, measured in the same run. It prints a JSON list of records
``{"tokens", "method", "median_ms", "p90_ms"}`` on stdout and the ratios on stderr.

``attention``: time and peak memory of one attention call (batch 1, 8 heads, head dimension 64,
float32) against the sequence length ``n`` for ``naive`` (materialises the ``n x n`` scores),
``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``), ``tiled``, ``linear`` and
``local`` (from :mod:`attn_helpers.efficient`), ``n`` doubling from 128 to ``--max-n``. It prints a
JSON list of records ``{"method", "n", "median_ms", "peak_bytes", "gflops"}`` plus one
``{"method": "matmul_peak", "gflops"}``, the best rate of a large matrix product measured in the
same run, and the targets' ratios on stderr.

Timings are medians over many repeats, so a busy machine moves them little; the targets are
checked against a baseline measured in the same process, never against a fixed number in a test.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections.abc import Callable

import ipywidgets as widgets
import numpy as np
import seaborn as sns
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .complexity import (  # noqa: F401  (the attention benchmark lives in complexity)
    ATTENTION_FUNCTIONS,
    ATTENTION_HEAD_DIM,
    ATTENTION_HEADS,
    ATTENTION_METHODS,
    LOCAL_WINDOW,
    TILED_KEY_BLOCK,
    TILED_QUERY_BLOCK,
    attention_flops,
    attention_sizes,
    bench_attention,
    matmul_peak_gflops,
    naive_attention,
    peak_bytes,
    time_call,
)
from .entropy import attention_entropy
from .widgets import AttentionFrame, AttentionView, LiveAttentionWidget

WIDGET_TOKENS = (8, 32, 64)
WIDGET_TARGET_MS = 15.0
WIDGET_TARGET_SPEEDUP = 10.0


def time_calls(step: Callable[[int], object], repeats: int, warmup: int = 3) -> list[float]:
    """Run ``step(i)`` ``warmup + repeats`` times; return the last ``repeats`` durations in ms."""
    for i in range(warmup):
        step(i)
    durations = []
    for i in range(repeats):
        start = time.perf_counter()
        step(warmup + i)
        durations.append((time.perf_counter() - start) * 1000.0)
    return durations


def summarize(durations: list[float]) -> dict:
    """Median and 90th percentile of a list of durations (ms), rounded to 3 decimals."""
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(p90, 3)}


def temperature_frame(scores: torch.Tensor, labels: list[str], temperature: float) -> AttentionFrame:
    """The benchmark's pure compute: softmax of fixed scores at a temperature."""
    weights = torch.softmax(scores / temperature, dim=-1)
    return AttentionFrame(weights, labels, labels,
                          readouts={"mean entropy": attention_entropy(weights).mean().item()})


def temperatures(i: int) -> float:
    """A sweep of temperatures that never repeats two moves in a row."""
    return 0.2 + (i % 40) * 0.05


def live_widget_step(n: int) -> Callable[[int], object]:
    scores = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) * 2
    labels = [f"t{i}" for i in range(n)]
    slider = widgets.FloatSlider(value=1.0, min=0.1, max=5.0, step=0.01)
    widget = LiveAttentionWidget(
        lambda temperature: temperature_frame(scores, labels, temperature),
        {"temperature": slider}, AttentionView(),
    )

    def step(i: int):
        slider.value = temperatures(i)
        if widget.error:
            raise RuntimeError(widget.error)

    return step


def seaborn_step(n: int) -> Callable[[int], object]:
    scores = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) * 2
    labels = [f"t{i}" for i in range(n)]
    image = widgets.Image(format="png")

    def step(i: int):
        frame = temperature_frame(scores, labels, temperatures(i))
        fig = Figure(figsize=(9, 5))  # a new figure every move: what the live widget avoids
        FigureCanvasAgg(fig)
        ax_map, ax_entropy = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
        sns.heatmap(frame.weights.numpy(), vmin=0, vmax=1, cmap="viridis", ax=ax_map,
                    xticklabels=labels, yticklabels=labels)
        ax_entropy.barh(np.arange(n), frame.entropy.numpy())
        ax_entropy.axvline(np.log(n), linestyle="--", color="#c0392b")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        image.value = buffer.getvalue()

    return step


def bench_widget(repeats_live: int = 60, repeats_seaborn: int = 12) -> list[dict]:
    records = []
    for n in WIDGET_TOKENS:
        records.append({"tokens": n, "method": "live",
                        **summarize(time_calls(live_widget_step(n), repeats_live))})
        records.append({"tokens": n, "method": "seaborn",
                        **summarize(time_calls(seaborn_step(n), repeats_seaborn))})
    return records


def widget_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check the widget targets (median at 32 tokens, speed-up over seaborn) on one run."""
    by = {(r["tokens"], r["method"]): r for r in records}
    lines, ok = [], True
    for n in WIDGET_TOKENS:
        live, naive = by[(n, "live")]["median_ms"], by[(n, "seaborn")]["median_ms"]
        lines.append(f"{n:3d} tokens: live {live:7.2f} ms, seaborn {naive:8.2f} ms, "
                     f"speed-up x{naive / live:.1f}")
    live32, naive32 = by[(32, "live")]["median_ms"], by[(32, "seaborn")]["median_ms"]
    ok = live32 <= WIDGET_TARGET_MS and naive32 / live32 >= WIDGET_TARGET_SPEEDUP
    lines.append(f"target at 32 tokens: live <= {WIDGET_TARGET_MS} ms and >= "
                 f"x{WIDGET_TARGET_SPEEDUP:.0f} faster than seaborn: {'met' if ok else 'NOT met'}")
    return ok, "\n".join(lines)


TARGET_MEMORY_N, TARGET_MEMORY_FRACTION = 8192, 0.05
TARGET_TIME_N, TARGET_TIME_RATIO = 4096, 3.0


def attention_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check the targets on one run: tiled peak memory <= 5% of naive's at n = 8192, tiled
    median time <= 3x sdpa's at n = 4096 (each only when that ``n`` was measured)."""
    by = {(r["method"], r.get("n")): r for r in records}
    lines, ok = [], True
    if ("tiled", TARGET_MEMORY_N) in by and ("naive", TARGET_MEMORY_N) in by:
        fraction = (by[("tiled", TARGET_MEMORY_N)]["peak_bytes"]
                    / by[("naive", TARGET_MEMORY_N)]["peak_bytes"])
        met = fraction <= TARGET_MEMORY_FRACTION
        ok &= met
        lines.append(f"n={TARGET_MEMORY_N}: tiled peak memory = {100 * fraction:.2f}% of naive's "
                     f"(target <= {100 * TARGET_MEMORY_FRACTION:.0f}%): {'met' if met else 'NOT met'}")
    else:
        lines.append(f"n={TARGET_MEMORY_N} not measured: memory target not checked")
    if ("tiled", TARGET_TIME_N) in by and ("sdpa", TARGET_TIME_N) in by:
        ratio = by[("tiled", TARGET_TIME_N)]["median_ms"] / by[("sdpa", TARGET_TIME_N)]["median_ms"]
        met = ratio <= TARGET_TIME_RATIO
        ok &= met
        lines.append(f"n={TARGET_TIME_N}: tiled median time = {ratio:.2f}x sdpa's "
                     f"(target <= {TARGET_TIME_RATIO:.0f}x): {'met' if met else 'NOT met'}")
    else:
        lines.append(f"n={TARGET_TIME_N} not measured: time target not checked")
    peak = next((r["gflops"] for r in records if r["method"] == "matmul_peak"), None)
    for r in records:
        if r["method"] != "matmul_peak" and r["n"] == max(x.get("n", 0) for x in records):
            share = f", {100 * r['gflops'] / peak:.1f}% of the matmul peak" if peak else ""
            lines.append(f"n={r['n']} {r['method']:>6}: {r['median_ms']:10.2f} ms, "
                         f"{r['peak_bytes'] / 2**20:9.1f} MiB, {r['gflops']:7.2f} GFLOP/s{share}")
    return bool(ok), "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="name", required=True)
    widget = sub.add_parser("widget", help="one slider move: live widget vs seaborn re-plot")
    widget.add_argument("--repeats", type=int, default=60, help="timed moves per live case")
    widget.add_argument("--check", action="store_true",
                        help="exit with status 1 when the targets are not met")
    attention = sub.add_parser("attention", help="time and peak memory of attention against n")
    attention.add_argument("--max-n", type=int, default=8192, help="largest sequence length")
    attention.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    attention.add_argument("--threads", type=int, default=None,
                           help="torch CPU threads (default: torch's own choice)")
    attention.add_argument("--check", action="store_true",
                           help="exit with status 1 when the targets are not met")
    args = parser.parse_args(argv)
    if args.name == "attention":
        if args.max_n < 128:
            parser.error("--max-n must be >= 128")
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
        if args.threads is not None:
            if args.threads < 1:
                parser.error("--threads must be >= 1")
            torch.set_num_threads(args.threads)
        records = bench_attention(args.max_n, args.device)
        print(json.dumps(records, indent=1))
        ok, verdict = attention_verdict(records)
        print(verdict, file=sys.stderr)
        return 0 if ok or not args.check else 1
    if args.name == "widget":
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        records = bench_widget(args.repeats, max(3, args.repeats // 5))
        print(json.dumps(records, indent=1))
        ok, verdict = widget_verdict(records)
        print(verdict, file=sys.stderr)
        return 0 if ok or not args.check else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
