"""Notebook 07's widget: position encodings, the similarity of one position to all others, and the
rotation of one sin/cos pair as the position moves by an offset."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import ipywidgets as widgets
import torch
from matplotlib import colormaps as plt_colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.patches import Circle, Rectangle

from ..attention import masked_softmax
from ..entropy import attention_entropy
from ..plots import SCORES_CMAP, to_numpy
from ..positional import apply_rope, frequencies, sinusoidal_encoding
from .core import HIGHLIGHT_COLOR, AttentionFrame, AttentionPanel, BlitView, LiveAttentionWidget
from .panels import CellPainter

__all__ = [
    "ENCODINGS",
    "N_POSITIONS",
    "D_MODEL",
    "MAX_OFFSET",
    "PositionalFrame",
    "PositionalView",
    "encoding_table",
    "positional_frame",
    "positional_widget",
]

ENCODINGS = ("sinusoidal", "rope", "learned (untrained)")
N_POSITIONS, D_MODEL, MAX_OFFSET = 24, 16, 8
SHARPNESS = 2.0  # beta in softmax(beta E E^T), so that the rows are not almost uniform


@dataclass
class PositionalFrame(AttentionFrame):
    """An :class:`AttentionFrame` (weights: softmax of the position-only scores, ``(n, n)``) plus
    the encoding table ``(n, d)``, the chosen rows and the two points of one pair."""

    table: torch.Tensor | None = None
    position: int = 0
    offset: int = 0
    pair: int = 0
    pair_points: torch.Tensor | None = None  # (2, 2): the pair at position p and at p + k


def encoding_table(encoding: str, n: int = N_POSITIONS + MAX_OFFSET, d: int = D_MODEL) -> torch.Tensor:
    """``(n, d)`` float64 vectors whose dot products are the position-only scores.

    * ``sinusoidal``: :func:`sinusoidal_encoding`;
    * ``rope``: a fixed vector ``u = (1, 0, 1, 0, ...)`` rotated by :func:`apply_rope` to each
      position, i.e. what a constant query or key becomes at position ``p``;
    * ``learned (untrained)``: a seeded random table, as a learned embedding starts out.
    """
    if encoding == "sinusoidal":
        return sinusoidal_encoding(n, d, dtype=torch.float64)
    if encoding == "rope":
        u = torch.zeros(n, d, dtype=torch.float64)
        u[:, 0::2] = 1.0
        return apply_rope(u)
    if encoding == "learned (untrained)":
        return torch.randn(n, d, generator=torch.Generator().manual_seed(7), dtype=torch.float64) / 1.4
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


@lru_cache(maxsize=len(ENCODINGS))
def _position_attention(encoding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(table (n + MAX_OFFSET, d), scores (n, n), weights (n, n))``, cached per encoding (the
    tensors are never modified in place)."""
    table = encoding_table(encoding)
    shown = table[:N_POSITIONS]
    scores = SHARPNESS * (shown @ shown.T)
    return table, scores, masked_softmax(scores)


def positional_frame(encoding: str, position: int, offset: int, pair: int) -> PositionalFrame:
    """Everything the positional widget shows, from its four controls.

    Args:
        encoding: one of :data:`ENCODINGS`.
        position: ``p`` in ``0 .. N_POSITIONS - 1``.
        offset: ``k`` in ``0 .. MAX_OFFSET``.
        pair: which sin/cos pair ``i`` (dimensions ``2i, 2i+1``) to draw, ``0 .. D_MODEL/2 - 1``.

    The heatmap shows ``softmax(beta E E^T)`` (``beta = SHARPNESS``) over the first
    ``N_POSITIONS`` positions: how much each position would attend to the others on position
    information alone.
    """
    for name, value, top in (("position", position, N_POSITIONS - 1), ("offset", offset, MAX_OFFSET),
                             ("pair", pair, D_MODEL // 2 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an int in 0..{top}, got {value!r}")
    table, scores, weights = _position_attention(encoding)
    shown = table[:N_POSITIONS]
    dots = (table[:-offset or None] * table[offset:]).sum(-1)  # PE(p) . PE(p + k) for every p
    points = torch.stack([table[position, 2 * pair:2 * pair + 2],
                          table[position + offset, 2 * pair:2 * pair + 2]])
    angle = offset * float(frequencies(D_MODEL)[pair])
    labels = [str(p) for p in range(N_POSITIONS)]
    row = scores[position].clone()
    row[position] = -torch.inf
    return PositionalFrame(
        weights=weights, query_labels=labels, key_labels=labels, highlight_row=position,
        table=shown, position=position, offset=offset, pair=pair, pair_points=points,
        readouts={
            "PE(p) . PE(p+k)": round(dots[position].item(), 4),
            "PE(0) . PE(k)": round(dots[0].item(), 4),
            "spread of PE(p) . PE(p+k) over all p": round((dots.max() - dots.min()).item(), 4),
            "pair angle k * omega_i (rad)": round(angle, 4),
            "most similar other position": int(row.argmax()),
            "entropy of row p (nats)": round(attention_entropy(weights[position]).item(), 4),
        },
    )


class PositionalView(BlitView):
    """Encoding heatmap with the rows ``p`` and ``p + k`` marked, one sin/cos pair on the circle,
    and the position-only attention with its entropy view."""

    def __init__(self, figsize: tuple[float, float] = (9.0, 8.0)):
        super().__init__(figsize)
        figure = self.figure
        grid = figure.add_gridspec(2, 2, width_ratios=[1.6, 1], height_ratios=[1, 1.35],
                                   left=0.07, right=0.97, bottom=0.01, top=0.95, wspace=0.3,
                                   hspace=0.22)
        self.ax_table = figure.add_subplot(grid[0, 0])
        self.ax_table.set(xlim=(-0.5, D_MODEL - 0.5), ylim=(N_POSITIONS - 0.5, -0.5))
        self.table = CellPainter(self.blit, self.ax_table, plt_colormaps[SCORES_CMAP],
                                 Normalize(-1.0, 1.0, clip=True))
        figure.colorbar(ScalarMappable(Normalize(-1.0, 1.0), SCORES_CMAP), ax=self.ax_table,
                        fraction=0.04, pad=0.02).ax.tick_params(labelsize=8)
        self.ax_table.set_xticks(range(D_MODEL), [f"{'sin' if j % 2 == 0 else 'cos'}{j // 2}"
                                                  for j in range(D_MODEL)], rotation=90, fontsize=8)
        self.ax_table.set_yticks(range(0, N_POSITIONS, 4))
        self.ax_table.tick_params(labelsize=8)
        self.ax_table.set_xlabel("dimension (pair i: sin_i, cos_i)", fontsize=9)
        self.ax_table.set_ylabel("position p", fontsize=9)
        self.ax_table.set_title("encoding E[p, :] (green box: pair i)", fontsize=10)
        self.row_p = self.ax_table.axhline(0, color=HIGHLIGHT_COLOR, linewidth=2)
        self.row_pk = self.ax_table.axhline(0, color="black", linewidth=2, linestyle="--")
        self.column = Rectangle((-0.5, -0.5), 2, N_POSITIONS, fill=False, edgecolor="#2ca02c",
                                linewidth=2.5)
        self.ax_table.add_patch(self.column)
        self.ax_circle = figure.add_subplot(grid[0, 1])
        self.ax_circle.add_patch(Circle((0, 0), 1, fill=False, color="grey", linestyle=":"))
        self.ax_circle.set(xlim=(-1.6, 1.6), ylim=(-1.6, 1.6), aspect="equal")
        self.ax_circle.set_xlabel("dimension 2i", fontsize=9)
        self.ax_circle.set_ylabel("dimension 2i+1", fontsize=9)
        self.ax_circle.tick_params(labelsize=8)
        self.ax_circle.set_title("pair i at p (orange), p+k (black)", fontsize=10)
        (self.spoke_p,) = self.ax_circle.plot([], [], "-o", color=HIGHLIGHT_COLOR, linewidth=2)
        (self.spoke_pk,) = self.ax_circle.plot([], [], "--o", color="black", linewidth=2)
        self.panel = AttentionPanel(self.blit, grid[1, :], max_shape=(N_POSITIONS, N_POSITIONS),
                                    title="softmax(2 E E^T): attention from position alone")
        self.blit.animate(self.row_p, self.row_pk, self.column, self.spoke_p, self.spoke_pk)

    def draw(self, frame: PositionalFrame) -> None:
        self.panel.set_frame(frame)
        self.table.set(to_numpy(frame.table))
        self.row_p.set_ydata([frame.position, frame.position])
        shown = frame.position + frame.offset < N_POSITIONS
        self.row_pk.set_visible(shown)
        self.row_pk.set_ydata([frame.position + frame.offset] * 2)
        (x0, y0), (x1, y1) = to_numpy(frame.pair_points)
        self.column.set_x(2 * frame.pair - 0.5)
        self.spoke_p.set_data([0, x0], [0, y0])
        self.spoke_pk.set_data([0, x1], [0, y1])


def positional_widget() -> LiveAttentionWidget:
    """The live widget of notebook 07: encoding type, position ``p``, offset ``k`` and pair ``i``."""
    controls = {
        "encoding": widgets.Dropdown(options=ENCODINGS, value="sinusoidal", description="encoding"),
        "position": widgets.IntSlider(value=5, min=0, max=N_POSITIONS - 1, description="position p"),
        "offset": widgets.IntSlider(value=3, min=0, max=MAX_OFFSET, description="offset k"),
        "pair": widgets.IntSlider(value=0, min=0, max=D_MODEL // 2 - 1, description="pair i"),
    }
    return LiveAttentionWidget(positional_frame, controls, PositionalView(),
                               title="Positions: encodings, similarity and rotation")
