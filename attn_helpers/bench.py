"""Benchmarks behind the course's speed claims: ``python -m attn_helpers.bench NAME``.

``widget``: the cost of one slider move (compute + render + PNG into the ``ipywidgets.Image``)
for the live, blitted widget, beside the naive approach of re-creating a seaborn heatmap figure
on every change, measured in the same run. It prints a JSON list of records
``{"tokens", "method", "median_ms", "p90_ms"}`` on stdout and the ratios on stderr.

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

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

from .entropy import attention_entropy  # noqa: E402
from .widgets import AttentionFrame, AttentionView, LiveAttentionWidget  # noqa: E402

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
        fig, (ax_map, ax_entropy) = plt.subplots(1, 2, figsize=(9, 5),
                                                 gridspec_kw={"width_ratios": [3, 1]})
        sns.heatmap(frame.weights.numpy(), vmin=0, vmax=1, cmap="viridis", ax=ax_map,
                    xticklabels=labels, yticklabels=labels)
        ax_entropy.barh(np.arange(n), frame.entropy.numpy())
        ax_entropy.axvline(np.log(n), linestyle="--", color="#c0392b")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        plt.close(fig)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="name", required=True)
    widget = sub.add_parser("widget", help="one slider move: live widget vs seaborn re-plot")
    widget.add_argument("--repeats", type=int, default=60, help="timed moves per live case")
    widget.add_argument("--check", action="store_true",
                        help="exit with status 1 when the targets are not met")
    args = parser.parse_args(argv)
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
