"""Notebook 08's widget: measured cost curves of attention, a sequence length to explore, and the
time predicted at that length by power laws fitted to the measurements."""

from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as widgets
import numpy as np

from ..lessons.complexity import (
    PowerLaw,
    fit_methods,
    format_bytes,
    load_benchmark,
    score_matrix_bytes,
    series,
)
from .core import BlitView, LiveAttentionWidget

__all__ = [
    "METHOD_COLORS",
    "BENCH_HEADS",
    "FIT_N_MIN",
    "ComplexityFrame",
    "ComplexityView",
    "measured_methods",
    "complexity_frame",
    "complexity_widget",
]

#: Okabe-Ito colours (colour-blind safe), one per method.
METHOD_COLORS = {
    "naive": "#D55E00",
    "sdpa": "#0072B2",
    "tiled": "#009E73",
    "linear": "#CC79A7",
    "local": "#E69F00",
}
BENCH_HEADS = 8
#: power laws are fitted on the measurements with n >= FIT_N_MIN, where fixed overheads no
#: longer dominate
FIT_N_MIN = 1024


@dataclass
class ComplexityFrame:
    """One state of the complexity widget.

    Attributes:
        n: the chosen sequence length.
        methods: the methods whose curves are shown.
        predicted_ms / predicted_bytes: method -> value of the fitted power law at ``n``.
        score_bytes: bytes of the ``(1, 8, n, n)`` float32 score matrix.
        extrapolated: ``n`` lies outside the measured range.
        readouts: name -> text shown under the figure.
    """

    n: int
    methods: tuple[str, ...]
    predicted_ms: dict[str, float]
    predicted_bytes: dict[str, float]
    score_bytes: int
    extrapolated: bool
    readouts: dict = field(default_factory=dict)


def measured_methods(records: list[dict]) -> list[str]:
    """The forward attention methods (:data:`METHOD_COLORS`) measured against ``n`` in
    ``records``, sorted (other records, such as the machine's peak rates, are left out)."""
    return sorted(m for m in METHOD_COLORS if any(r["method"] == m and "n" in r for r in records))


def complexity_frame(n: float, methods, records: list[dict], *,
                     time_fits: dict[str, PowerLaw] | None = None,
                     memory_fits: dict[str, PowerLaw] | None = None) -> ComplexityFrame:
    """The widget's pure compute: predictions and readouts at sequence length ``n``.

    Args:
        n: sequence length (rounded to an int, >= 1).
        methods: the methods to show, a subset of those in ``records``.
        records: benchmark records (see :mod:`attn_helpers.complexity`).
        time_fits, memory_fits: fitted power laws per method (fitted on ``n >= FIT_N_MIN`` if
            not given).
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 1:
        raise ValueError(f"n must be a number >= 1, got {n!r}")
    n = int(round(n))
    known = measured_methods(records)
    if isinstance(methods, str):
        raise TypeError("methods must be a collection of method names, not one string")
    unknown = set(methods) - set(known)
    if unknown:
        raise ValueError(f"methods must be among {known}, got {sorted(unknown)}")
    methods = tuple(m for m in known if m in set(methods))
    time_fits = time_fits or fit_methods(records, "median_ms", n_min=FIT_N_MIN)
    memory_fits = memory_fits or fit_methods(records, "peak_bytes", n_min=FIT_N_MIN)
    ns = [r["n"] for r in records if r["method"] in known]
    predicted_ms = {m: time_fits[m].predict(n) for m in methods}
    predicted_bytes = {m: memory_fits[m].predict(n) for m in methods}
    score = score_matrix_bytes(n, heads=BENCH_HEADS)
    extrapolated = not min(ns) <= n <= max(ns)
    readouts = {
        "n": f"{n}" + (" (beyond the measured range: extrapolated)" if extrapolated else ""),
        "score matrix, 8 heads, float32": format_bytes(score),
    }
    for m in methods:
        ms = predicted_ms[m]
        shown = f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1000:.3g} s"
        readouts[f"{m}: predicted time"] = f"{shown} (~ n^{time_fits[m].slope:.2f})"
        readouts[f"{m}: predicted peak memory"] = format_bytes(predicted_bytes[m])
    return ComplexityFrame(n, methods, predicted_ms, predicted_bytes, score, extrapolated,
                           readouts)


class ComplexityView(BlitView):
    """Two log-log panels drawn once with every measured curve: time and peak memory against
    ``n``. A frame toggles the curves' visibility and moves the ``n`` marker and the predicted
    points (only these animated artists are redrawn)."""

    def __init__(self, records: list[dict], figsize: tuple[float, float] = (10.0, 4.2),
                 n_range: tuple[float, float] = (2**7, 2**16)):
        super().__init__(figsize)
        figure = self.figure
        grid = figure.add_gridspec(1, 2, left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.28)
        self.ax_time = figure.add_subplot(grid[0])
        self.ax_memory = figure.add_subplot(grid[1])
        methods = measured_methods(records)
        for ax, title, label in ((self.ax_time, "median time per call", "time (ms)"),
                                 (self.ax_memory, "peak memory per call", "peak memory (bytes)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlim(*n_range)
            ax.set_xlabel("sequence length n")
            ax.set_ylabel(label)
            ax.set_title(title, fontsize=11)
            ax.grid(alpha=0.3, which="major")
        grid_n = np.geomspace(*n_range, 50)
        score_line = score_matrix_bytes(1, heads=BENCH_HEADS) * grid_n**2
        self.ax_memory.plot(grid_n, score_line, color="grey", linestyle=":",
                            label="one score matrix")
        (self.score_marker,) = self.ax_memory.plot([], [], "s", color="grey", markersize=7)
        self.curves, self.predictions = {}, {}
        times, peaks = [], []
        for m in methods:
            color = METHOD_COLORS.get(m, "black")
            ns, ms = series(records, m, "median_ms")
            _, bts = series(records, m, "peak_bytes")
            times += ms
            peaks += [b for b in bts if b > 0]
            lines = (self.ax_time.plot(ns, ms, "o-", color=color, markersize=3, label=m)[0],
                     self.ax_memory.plot(ns, np.maximum(bts, 1), "o-", color=color,
                                         markersize=3, label=m)[0])
            marks = (self.ax_time.plot([], [], "*", color=color, markersize=13,
                                       markeredgecolor="black")[0],
                     self.ax_memory.plot([], [], "*", color=color, markersize=13,
                                         markeredgecolor="black")[0])
            self.curves[m], self.predictions[m] = lines, marks
            self.blit.animate(*lines, *marks)
        self.ax_time.set_ylim(min(times) / 3, max(times) * 30)
        self.ax_memory.set_ylim(min(peaks) / 3, float(score_line.max()) * 3)
        self.ax_memory.legend(fontsize=8, loc="upper left")
        self.cursors = (self.ax_time.axvline(n_range[0], color="black", linewidth=1),
                        self.ax_memory.axvline(n_range[0], color="black", linewidth=1))
        self.blit.animate(*self.cursors, self.score_marker)
        self.ax_time.text(0.02, 0.97, "lines: measured, stars: fitted model at n",
                          transform=self.ax_time.transAxes, fontsize=8, va="top")

    def draw(self, frame: ComplexityFrame) -> None:
        for m, (time_line, memory_line) in self.curves.items():
            shown = m in frame.methods
            time_star, memory_star = self.predictions[m]
            for artist in (time_line, memory_line, time_star, memory_star):
                artist.set_visible(shown)
            if shown:
                time_star.set_data([frame.n], [frame.predicted_ms[m]])
                memory_star.set_data([frame.n], [max(frame.predicted_bytes[m], 1.0)])
        for cursor in self.cursors:
            cursor.set_xdata([frame.n, frame.n])
        self.score_marker.set_data([frame.n], [frame.score_bytes])


def complexity_widget(records: list[dict] | None = None) -> LiveAttentionWidget:
    """Notebook 08's widget: a log-scale sequence-length slider and one checkbox per method,
    over the committed CPU benchmark by default."""
    records = load_benchmark() if records is None else records
    time_fits = fit_methods(records, "median_ms", n_min=FIT_N_MIN)
    memory_fits = fit_methods(records, "peak_bytes", n_min=FIT_N_MIN)
    methods = sorted(time_fits)
    controls = {"n": widgets.FloatLogSlider(value=2048, base=2, min=7, max=16, step=0.5,
                                            description="n", readout_format=".0f",
                                            layout=widgets.Layout(width="380px"))}
    for m in methods:
        controls[m] = widgets.Checkbox(value=True, description=m, indent=False,
                                       layout=widgets.Layout(width="90px"))

    def compute(n, **shown):
        return complexity_frame(n, [m for m, on in shown.items() if on], records,
                                time_fits=time_fits, memory_fits=memory_fits)

    return LiveAttentionWidget(compute, controls, ComplexityView(records),
                               title="Cost of attention: move n, pick the methods")
