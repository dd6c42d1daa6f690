"""Notebook 02's widget: one 2-D query among labelled 2-D keys, with a temperature."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch

from ..attention import scaled_dot_product_attention
from ..entropy import attention_entropy, max_entropy
from ..lessons.query_key_value import QUERY
from ..plots import to_numpy, weights_cmap
from .core import (
    BAR_COLOR,
    HIGHLIGHT_COLOR,
    AttentionFrame,
    AttentionPanel,
    BlitView,
    LiveAttentionWidget,
)

__all__ = [
    "DEMO_KEYS",
    "CURVE_TEMPERATURES",
    "LookupFrame",
    "LookupView",
    "lookup_2d_frame",
    "lookup_2d_widget",
]


@dataclass
class LookupFrame(AttentionFrame):
    """An :class:`AttentionFrame` for one 2-D query among 2-D keys (notebook 02's widget).

    ``keys_xy`` ``(n_k, 2)``, ``query_xy`` ``(2,)`` and ``output_xy`` ``(2,)`` are drawn in a plane.
    """

    keys_xy: torch.Tensor | None = None
    query_xy: torch.Tensor | None = None
    output_xy: torch.Tensor | None = None
    temperature: float = 1.0
    curve_temperatures: torch.Tensor | None = None
    curve_entropy: torch.Tensor | None = None


class LookupView(BlitView):
    """Notebook 02's view: a plane with the labelled keys, the query and the output point; the
    weights (one query row) with their entropy; and the entropy against the temperature."""

    def __init__(self, figsize: tuple[float, float] = (9.6, 5.4), limit: float = 3.0):
        super().__init__(figsize)
        figure = self.figure
        figure.set_layout_engine("none")   # the gridspec below, not the notebooks' constrained layout
        grid = figure.add_gridspec(2, 2, width_ratios=[1, 1.45], height_ratios=[1.1, 1],
                                   left=0.06, right=0.94, bottom=0.09, top=0.95, wspace=0.2,
                                   hspace=0.3)
        self.ax_plane = figure.add_subplot(grid[:, 0])
        self.ax_plane.set_xlim(-limit, limit)
        self.ax_plane.set_ylim(-limit, limit)
        self.ax_plane.set_aspect("equal")
        self.ax_plane.grid(alpha=0.3)
        self.ax_plane.set_title("keys, query and output", fontsize=10)
        self.panel = AttentionPanel(self.blit, grid[0, 1], title="weights a_j of the query q",
                                    entropy_width=1.0, entropy_title="entropy")
        self.ax_curve = figure.add_subplot(grid[1, 1])
        self.ax_curve.set_xscale("log")
        self.ax_curve.set_xlabel("temperature T", fontsize=9)
        self.ax_curve.set_ylabel("entropy (nats)", fontsize=9)
        self.ax_curve.set_title("entropy of this query's weights against T", fontsize=10)
        (self.curve_line,) = self.ax_curve.plot([], [], color=BAR_COLOR)
        (self.curve_marker,) = self.ax_curve.plot([], [], "o", color=HIGHLIGHT_COLOR,
                                                  markersize=8)
        self.ceiling_rule = self.ax_curve.axhline(0, color="#c0392b", linestyle="--")
        self.keys_artist = None
        self.query_artist = self.ax_plane.scatter([0], [0], marker="*", s=260, color="#d62728",
                                                  zorder=5, label="query q")
        self.output_artist = self.ax_plane.scatter([0], [0], marker="X", s=120,
                                                   color=HIGHLIGHT_COLOR, edgecolor="black",
                                                   zorder=6, label="output")  # above the star
        # the settings and numbers are the controls and readouts around the picture: text drawn
        # in it would cost a third of every move (Agg lays out each glyph afresh)
        self.blit.animate(self.query_artist, self.output_artist, self.curve_line,
                          self.curve_marker)
        self._keys_drawn = None

    def _draw_keys(self, keys_xy: np.ndarray, labels: Sequence[str], temperatures) -> None:
        if self.keys_artist is not None:
            self.blit.forget(self.keys_artist)
        for text in list(self.ax_plane.texts) + list(self.ax_curve.texts):
            text.remove()
        self.keys_artist = self.ax_plane.scatter(
            keys_xy[:, 0], keys_xy[:, 1], s=40, c=np.zeros(len(keys_xy)), cmap=weights_cmap(),
            vmin=0, vmax=1, edgecolor="black", zorder=3, label="key (size, colour: weight)",
        )
        self.blit.animate(self.keys_artist)
        for (x, y), label in zip(keys_xy, labels, strict=True):
            self.ax_plane.annotate(label, (x, y), xytext=(7, 7), textcoords="offset points",
                                   fontsize=10)
        self.ax_plane.legend(loc="lower left", fontsize=8, markerscale=0.6)
        ceiling = max_entropy(len(labels))
        self.ceiling_rule.set_ydata([ceiling, ceiling])
        self.ax_curve.set_xlim(float(temperatures.min()), float(temperatures.max()))
        self.ax_curve.set_ylim(0, ceiling * 1.15)
        self.ax_curve.text(float(temperatures.min()) * 1.1, ceiling * 1.02,
                           f"ceiling ln {len(labels)} = {ceiling:.2f}", color="#c0392b",
                           fontsize=8, va="bottom")
        self._keys_drawn = (keys_xy.tobytes(), tuple(labels))
        self.blit.invalidate()

    def draw(self, frame: LookupFrame) -> None:
        keys_xy = to_numpy(frame.keys_xy)
        temperatures = to_numpy(frame.curve_temperatures)
        if self._keys_drawn != (keys_xy.tobytes(), tuple(frame.key_labels)):
            self._draw_keys(keys_xy, frame.key_labels, temperatures)
        self.panel.set_frame(frame)
        weights = to_numpy(frame.weights)[0]
        self.keys_artist.set_sizes(40 + 460 * weights)
        self.keys_artist.set_array(weights)
        self.query_artist.set_offsets(to_numpy(frame.query_xy)[None, :])
        self.output_artist.set_offsets(to_numpy(frame.output_xy)[None, :])
        self.curve_line.set_data(temperatures, to_numpy(frame.curve_entropy))
        self.curve_marker.set_data([frame.temperature], [frame.entropy[0].item()])


DEMO_KEYS = {
    "cat": (1.8, 1.2),
    "dog": (1.3, 1.9),
    "car": (-1.9, 0.8),
    "bus": (-1.5, 1.6),
    "apple": (0.4, -2.0),
    "pear": (1.1, -1.6),
}


CURVE_TEMPERATURES = torch.logspace(-1.3, 1.0, 60, dtype=torch.float64)


def lookup_2d_frame(
    query_x: float,
    query_y: float,
    temperature: float,
    keys: Mapping[str, tuple[float, float]] = DEMO_KEYS,
) -> LookupFrame:
    r"""One soft lookup in the plane: the keys are 2-D points and each value is its key's own
    position, so the output :math:`\sum_j a_j k_j` is a point in the same picture.

    Scores are :math:`q \cdot k_j / (\sqrt{2}\,T)`: scaled dot products divided by a temperature
    ``T``. The frame also holds the entropy of this query's weights for a range of temperatures.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    labels = list(keys)
    keys_xy = torch.tensor([keys[name] for name in labels], dtype=torch.float64)
    query = torch.tensor([query_x, query_y], dtype=torch.float64)
    output, weights = scaled_dot_product_attention(
        query[None, :], keys_xy, keys_xy, scale=1.0 / (math.sqrt(2.0) * temperature)
    )
    raw_scores = keys_xy @ query / math.sqrt(2.0)
    curve = attention_entropy(torch.softmax(raw_scores / CURVE_TEMPERATURES[:, None], dim=-1))
    entropy = attention_entropy(weights)[0]
    best = int(weights[0].argmax())
    return LookupFrame(
        weights=weights,
        query_labels=["q"],
        key_labels=labels,
        keys_xy=keys_xy,
        query_xy=query,
        output_xy=output[0],
        temperature=float(temperature),
        curve_temperatures=CURVE_TEMPERATURES,
        curve_entropy=curve,
        readouts={
            "strongest key": f"{labels[best]} ({weights[0, best].item():.4f})",
            "entropy (nats)": entropy.item(),
            "ceiling ln n": max_entropy(len(labels)),
            "output point": f"({output[0, 0].item():.4f}, {output[0, 1].item():.4f})",
        },
    )


def lookup_2d_widget(keys: Mapping[str, tuple[float, float]] = DEMO_KEYS, *,
                     query: tuple[float, float] = QUERY) -> LiveAttentionWidget:
    """The live widget of notebook 02: move a query among labelled keys, change the temperature.
    It opens on ``query`` (by default section 1's, so the first picture shows its weights)."""
    slider = dict(min=-3.0, max=3.0, step=0.1, continuous_update=True,
                  layout=widgets.Layout(width="300px"))
    controls = {
        "query_x": widgets.FloatSlider(value=query[0], description="query x", **slider),
        "query_y": widgets.FloatSlider(value=query[1], description="query y", **slider),
        "temperature": widgets.FloatLogSlider(value=1.0, base=10, min=-1.3, max=1.0, step=0.05,
                                              description="temperature",
                                              layout=widgets.Layout(width="300px")),
    }

    def compute(query_x, query_y, temperature):
        return lookup_2d_frame(query_x, query_y, temperature, keys)

    return LiveAttentionWidget(compute, controls, LookupView(),
                               title="Soft lookup: move the query, change the temperature")

