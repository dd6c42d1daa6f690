"""``python -m attn_helpers bench widget``: the cost of one slider move in the kernel.

One move = the pure compute + rendering + PNG into the ``ipywidgets.Image``. The generic live view
is measured beside the naive approach of re-creating a seaborn heatmap figure on every change,
in the same run. Records ``{"tokens", "method", "median_ms", "p90_ms"}``.
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable

import ipywidgets as widgets
import numpy as np
import seaborn as sns
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..entropy import attention_entropy
from ..widgets import AttentionFrame, AttentionView, LiveAttentionWidget

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
