"""Notebook 02's widget: one 2-D query among labelled 2-D keys, with a temperature."""

from __future__ import annotations

import math
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch

from .._checks import require_number
from ..attention import scaled_dot_product_attention
from ..entropy import attention_entropy, max_entropy
from ..lessons.query_key_value import QUERY, hull_corners
from ..plots import to_numpy, weights_cmap
from .core import AttentionFrame, BlitView, LiveAttentionWidget
from .panels import BAR_COLOR, HIGHLIGHT_COLOR, AttentionPanel

DEMO_KEYS = {"cat": (1.8, 1.2), "dog": (1.3, 1.9), "car": (-1.9, 0.8), "bus": (-1.5, 1.6),
             "apple": (0.4, -2.0), "pear": (1.1, -1.6)}
CURVE_TEMPERATURES = torch.logspace(-1.3, 1.0, 60, dtype=torch.float64)


@dataclass
class LookupFrame(AttentionFrame):
    """One query: ``query_xy``, ``output_xy`` ``(2,)``; ``curve_entropy`` at ``CURVE_TEMPERATURES``."""

    query_xy: torch.Tensor | None = None
    output_xy: torch.Tensor | None = None
    temperature: float = 1.0
    curve_entropy: torch.Tensor | None = None


class LookupView(BlitView):
    """The plane with the keys, the query and the output; the weights; the entropy against T."""

    def __init__(self):
        super().__init__((9.6, 5.4))
        grid = self.figure.add_gridspec(2, 2, width_ratios=[1, 1.45], height_ratios=[1.1, 1],
                                        left=0.06, right=0.94, bottom=0.09, top=0.95, wspace=0.2,
                                        hspace=0.3)
        plane = self.figure.add_subplot(grid[:, 0])
        plane.set(xlim=(-3, 3), ylim=(-3.9, 3), aspect="equal")   # the legend below the keys
        plane.grid(alpha=0.3)
        plane.set_title("keys, query and output", fontsize=10)
        xy = np.array(list(DEMO_KEYS.values()))                                    # (n_k, 2)
        self.query_artist = plane.scatter([0], [0], marker="*", s=260, color="#d62728", zorder=5,
                                          label="query q")
        self.output_artist = plane.scatter([0], [0], marker="X", s=120, color=HIGHLIGHT_COLOR,
                                           edgecolor="black", zorder=6, label="output")  # over q
        self.keys_artist = plane.scatter(*xy.T, s=40, c=np.zeros(len(xy)), cmap=weights_cmap(),
                                         vmin=0, vmax=1, edgecolor="black", zorder=3,
                                         label="key (size, colour: weight)")
        hull = xy[hull_corners(torch.from_numpy(xy))]                              # its corners
        plane.fill(*hull.T, color=BAR_COLOR, alpha=0.12, zorder=1, label="hull of the keys")
        for (x, y), label in zip(xy, DEMO_KEYS, strict=True):
            right = label == "apple"                   # beside it: pear sits above and right
            plane.annotate(label, (x, y), xytext=(9, -7) if right else (7, 7), fontsize=10,
                           textcoords="offset points")
        plane.legend(loc="lower left", fontsize=7.5, markerscale=0.6, ncol=2, columnspacing=0.8)
        self.panel = AttentionPanel(self.blit, grid[0, 1], title="weights a_j of the query q",
                                    entropy_width=1.0, entropy_title="entropy",
                                    entropy_xlabel="nats (dashes: ln n)")
        curve = self.figure.add_subplot(grid[1, 1])
        t_min, t_max = CURVE_TEMPERATURES.min().item(), CURVE_TEMPERATURES.max().item()
        ceiling = max_entropy(len(DEMO_KEYS))      # the margins below keep the end markers whole
        curve.set(xscale="log", xlim=(t_min / 1.25, t_max * 1.25), ylim=(0, ceiling * 1.15))
        curve.set_xlabel("temperature T", fontsize=9)
        curve.set_ylabel("entropy (nats)", fontsize=9)
        curve.set_title("entropy of this query's weights against T (dot: current T)", fontsize=10)
        curve.axhline(ceiling, color="#c0392b", linestyle="--")
        curve.text(t_min * 1.1, ceiling * 1.02, f"ceiling ln {len(DEMO_KEYS)} = {ceiling:.2f}",
                   color="#c0392b", fontsize=8, va="bottom")
        (self.curve_line,) = curve.plot([], [], color=BAR_COLOR)
        (self.curve_marker,) = curve.plot([], [], "o", color=HIGHLIGHT_COLOR, markersize=8)
        # numbers are readouts, not text in the picture: Agg would lay out each glyph every move
        self.blit.animate(self.keys_artist, self.query_artist, self.output_artist,
                          self.curve_line, self.curve_marker)

    def draw(self, frame: LookupFrame) -> None:
        self.panel.set_frame(frame)
        weights = to_numpy(frame.weights)[0]
        self.keys_artist.set_sizes(40 + 460 * weights)
        self.keys_artist.set_array(weights)
        self.query_artist.set_offsets(to_numpy(frame.query_xy)[None, :])
        self.output_artist.set_offsets(to_numpy(frame.output_xy)[None, :])
        self.curve_line.set_data(to_numpy(CURVE_TEMPERATURES), to_numpy(frame.curve_entropy))
        self.curve_marker.set_data([frame.temperature], [frame.entropy[0].item()])


def lookup_2d_frame(query_x: float, query_y: float, temperature: float) -> LookupFrame:
    r"""One soft lookup in the plane, values = keys, so the output :math:`\sum_j a_j k_j` is a
    point. Scores: :math:`q \cdot k_j / (\sqrt{2}\,T)`."""
    require_number("temperature", temperature, positive=True)
    labels = list(DEMO_KEYS)
    keys_xy = torch.tensor(list(DEMO_KEYS.values()), dtype=torch.float64)         # (n_k, 2)
    query = torch.tensor([query_x, query_y], dtype=torch.float64)                  # (2,)
    output, weights = scaled_dot_product_attention(
        query[None, :], keys_xy, keys_xy, scale=1.0 / (math.sqrt(2.0) * temperature))
    raw_scores = keys_xy @ query / math.sqrt(2.0)                                  # (n_k,)
    best = int(weights[0].argmax())
    return LookupFrame(
        weights=weights, query_labels=["q"], key_labels=labels, query_xy=query,
        output_xy=output[0], temperature=float(temperature),
        curve_entropy=attention_entropy(torch.softmax(raw_scores / CURVE_TEMPERATURES[:, None], -1)),
        readouts={
            "strongest key": f"{labels[best]} ({weights[0, best].item():.4f})",
            "entropy (nats)": attention_entropy(weights)[0].item(),
            "ceiling ln n": max_entropy(len(labels)),
            "output point": f"({output[0, 0].item():.4f}, {output[0, 1].item():.4f})",
        },
    )


def lookup_2d_widget(*, query: tuple[float, float] = QUERY) -> LiveAttentionWidget:
    """Move a query among ``DEMO_KEYS`` and change the temperature; opens on ``query``."""
    wide = widgets.Layout(width="300px")
    slider = dict(min=-3.0, max=3.0, step=0.1, continuous_update=True, layout=wide)
    controls = {
        "query_x": widgets.FloatSlider(value=query[0], description="query x", **slider),
        "query_y": widgets.FloatSlider(value=query[1], description="query y", **slider),
        "temperature": widgets.FloatLogSlider(value=1.0, base=10, min=-1.3, max=1.0, step=0.05,
                                              description="temperature", layout=wide),
    }
    return LiveAttentionWidget(lookup_2d_frame, controls, LookupView(), title="Where the weights "
                               "go as the query moves: weights, output, entropy vs T")
