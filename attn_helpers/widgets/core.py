"""Live attention widgets: sliders in, a redrawn heatmap and entropy view out.

Architecture (see COURSE_DESIGN.md, "Live widgets"):

* A pure *compute* function turns control values into an :class:`AttentionFrame` (weights,
  labels, readouts). Tests call it directly.
* A *view* owns one matplotlib figure, drawn once with its labels, ticks and colour bar. On each
  change only the animated artists (image data, bar widths, markers) are redrawn over the saved
  background (blitting) and the canvas is encoded as PNG.
* :class:`LiveAttentionWidget` glues controls, compute and view together and pushes the PNG into an
  ``ipywidgets.Image``. No figure is created on a slider move, no JupyterLab extension is needed.
"""

from __future__ import annotations

import html
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..entropy import attention_entropy, max_entropy
from ..plots import ceiling_staircase, label_fontsize, to_numpy, weights_cmap
from ..training import single_thread

__all__ = [
    "AttentionFrame",
    "BlitFigure",
    "AttentionPanel",
    "AttentionView",
    "LiveAttentionWidget",
    "encode_png",
    "BAR_COLOR",
    "HIGHLIGHT_COLOR",
]


BAR_COLOR = "#3b75af"
HIGHLIGHT_COLOR = "#ff7f0e"


@dataclass
class AttentionFrame:
    """Everything a view needs to draw one state of an attention widget.

    Attributes:
        weights: ``(n_q, n_k)`` attention weights in 0..1.
        query_labels, key_labels: token labels for the rows and columns.
        mask: optional ``(n_q, n_k)`` bool, False cells are drawn grey and lower the entropy ceiling.
        highlight_row: optional row index drawn with a frame (e.g. the current decoder step).
        readouts: name -> value shown under the figure (numbers are rounded to 4 decimals).
    """

    weights: torch.Tensor
    query_labels: Sequence[str]
    key_labels: Sequence[str]
    mask: torch.Tensor | None = None
    highlight_row: int | None = None
    readouts: dict = field(default_factory=dict)

    def __post_init__(self):
        w = torch.as_tensor(self.weights)
        if w.dim() != 2:
            raise ValueError(f"weights must be 2-D (n_q, n_k), got shape {tuple(w.shape)}")
        n_q, n_k = w.shape
        if len(self.query_labels) != n_q or len(self.key_labels) != n_k:
            raise ValueError(
                f"got {len(self.query_labels)} query labels and {len(self.key_labels)} key labels "
                f"for weights of shape (n_q, n_k) = {(n_q, n_k)}"
            )
        if self.mask is not None and tuple(torch.as_tensor(self.mask).shape) != (n_q, n_k):
            raise ValueError(
                f"mask must have the weights' shape {(n_q, n_k)}, got {tuple(self.mask.shape)}"
            )

    @property
    def entropy(self) -> torch.Tensor:
        """``(n_q,)`` entropy of each query row in nats."""
        return attention_entropy(torch.as_tensor(self.weights, dtype=torch.float64))

    @property
    def ceiling(self) -> torch.Tensor:
        """``(n_q,)`` largest attainable entropy of each row: ``ln`` of its number of visible keys."""
        n_q, n_k = torch.as_tensor(self.weights).shape
        if self.mask is None:
            visible = torch.full((n_q,), float(n_k), dtype=torch.float64)
        else:
            visible = torch.as_tensor(self.mask).sum(-1).double()
        return torch.log(visible.clamp_min(1.0))


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


def encode_png(rgba: np.ndarray) -> bytes:
    """Encode an ``(h, w, 4)`` uint8 canvas buffer as an RGBA PNG.

    A minimal encoder (no row filters, zlib level 1): a plot with large flat areas compresses
    well anyway, and it is about three times faster than Pillow's, which matters at every slider
    move.
    """
    if rgba.dtype != np.uint8 or rgba.ndim != 3 or rgba.shape[2] != 4:
        raise ValueError(f"rgba must be a uint8 array (h, w, 4), got {rgba.dtype} {rgba.shape}")
    height, width = rgba.shape[:2]
    rows = np.zeros((height, 1 + 4 * width), dtype=np.uint8)  # first byte of a row: filter 0
    rows[:, 1:] = rgba.reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + _png_chunk(b"IEND", b"")
    )


class BlitFigure:
    """A figure drawn once, whose *animated* artists are redrawn over the saved background."""

    def __init__(self, figsize: tuple[float, float], dpi: int = 80):
        self.figure = Figure(figsize=figsize, dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        self._background = None
        self._animated: list = []

    def animate(self, *artists) -> None:
        """Mark artists as animated: they are left out of the background and redrawn each frame."""
        for artist in artists:
            artist.set_animated(True)
            self._animated.append(artist)

    def forget(self, *artists) -> None:
        """Remove artists from the figure and from the animated list."""
        for artist in artists:
            if artist in self._animated:
                self._animated.remove(artist)
            artist.remove()

    def invalidate(self) -> None:
        """Ask for a full redraw of the background at the next :meth:`render` (after a relayout)."""
        self._background = None

    def render(self) -> bytes:
        """Redraw the animated artists over the background and return the canvas as PNG."""
        if self._background is None:
            self.canvas.draw()
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        self.canvas.restore_region(self._background)
        for artist in sorted(self._animated, key=lambda a: a.get_zorder()):
            if artist.get_visible():
                self.figure.draw_artist(artist)
        return encode_png(np.asarray(self.canvas.buffer_rgba()))


class AttentionPanel:
    """A heatmap (token labels, fixed 0..1 colour scale) and an entropy view with its ``ln``
    ceiling, laid out inside one region of a :class:`BlitFigure`."""

    def __init__(self, blit: BlitFigure, region, *, title: str = "attention weights"):
        self.blit = blit
        grid = region.subgridspec(1, 3, width_ratios=[10, 0.4, 4], wspace=0.35)
        figure = blit.figure
        self.ax_map = figure.add_subplot(grid[0])
        self.ax_bar = figure.add_subplot(grid[1])
        self.ax_entropy = figure.add_subplot(grid[2])
        self.ax_map.set_title(title, fontsize=11)
        self.image = self.ax_map.imshow(
            np.zeros((1, 1)), cmap=weights_cmap(), vmin=0, vmax=1, aspect="auto",
            interpolation="nearest",
        )
        figure.colorbar(self.image, cax=self.ax_bar)
        self.ax_bar.tick_params(labelsize=8)
        self.ax_entropy.set_title("entropy per query", fontsize=11)
        self.highlight = Rectangle((0, 0), 1, 1, fill=False, edgecolor=HIGHLIGHT_COLOR,
                                   linewidth=2.5)
        self.ax_map.add_patch(self.highlight)
        (self.ceiling_line,) = self.ax_entropy.plot([], [], color="#c0392b", linestyle="--")
        blit.animate(self.image, self.highlight, self.ceiling_line)
        self.bars = LineCollection([], colors=BAR_COLOR, capstyle="butt")
        self.ax_entropy.add_collection(self.bars)
        blit.animate(self.bars)
        self.shape: tuple[int, int] | None = None
        self.labels: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def _layout(self, query_labels: Sequence[str], key_labels: Sequence[str]) -> None:
        n_q, n_k = len(query_labels), len(key_labels)
        self.image.set_data(np.zeros((n_q, n_k)))
        self.image.set_extent((-0.5, n_k - 0.5, n_q - 0.5, -0.5))
        size = label_fontsize(max(n_q, n_k))
        self.ax_map.set_xticks(range(n_k), key_labels, rotation=90 if n_k > 8 else 0, fontsize=size)
        self.ax_map.set_yticks(range(n_q), query_labels, fontsize=size)
        self.ax_map.set_xlabel("key")
        self.ax_map.set_ylabel("query")
        self.ax_entropy.set_ylim(n_q - 0.5, -0.5)
        # One LineCollection of thick horizontal segments draws much faster than n_q bar patches.
        row_height_pt = self.ax_entropy.get_window_extent().height / n_q * 72 / self.blit.figure.dpi
        self.bars.set_linewidth(0.7 * row_height_pt)
        self.bars.set_segments([[(0, i), (0, i)] for i in range(n_q)])
        self.ax_entropy.set_yticks(range(n_q), [""] * n_q)
        self.ax_entropy.set_xlim(0, max(max_entropy(n_k), 0.1) * 1.12)
        self.ax_entropy.set_xlabel(f"nats\nceiling ln {n_k} = {max_entropy(n_k):.2f}", fontsize=8)
        self.shape = (n_q, n_k)
        self.labels = (tuple(query_labels), tuple(key_labels))
        self.blit.invalidate()

    def set_frame(self, frame: AttentionFrame) -> None:
        """Update the animated artists from ``frame`` (relayout first if the labels changed)."""
        labels = (tuple(map(str, frame.query_labels)), tuple(map(str, frame.key_labels)))
        if labels != self.labels:
            self._layout(*labels)
        n_q, n_k = self.shape
        weights = to_numpy(frame.weights)
        if frame.mask is not None:
            weights = np.ma.masked_where(~to_numpy(frame.mask).astype(bool), weights)
        self.image.set_data(weights)
        rows = np.arange(n_q)
        entropy = to_numpy(frame.entropy)
        self.bars.set_segments(np.stack([np.stack([np.zeros(n_q), rows], 1),
                                         np.stack([entropy, rows], 1)], 1))
        colors = [BAR_COLOR] * n_q
        self.ceiling_line.set_data(*ceiling_staircase(frame.ceiling))
        if frame.highlight_row is None:
            self.highlight.set_visible(False)
        else:
            if not 0 <= frame.highlight_row < n_q:
                raise ValueError(f"highlight_row must lie in 0..{n_q - 1}, got {frame.highlight_row}")
            self.highlight.set_visible(True)
            self.highlight.set_bounds(-0.5, frame.highlight_row - 0.5, n_k, 1)
            colors[frame.highlight_row] = HIGHLIGHT_COLOR
        self.bars.set_colors(colors)


class AttentionView:
    """One live attention heatmap with its entropy view. ``update(frame) -> PNG bytes``."""

    def __init__(self, figsize: tuple[float, float] = (9.0, 5.0), *, title: str = "attention weights"):
        self.blit = BlitFigure(figsize)
        grid = self.blit.figure.add_gridspec(1, 1, left=0.1, right=0.97, bottom=0.16, top=0.9)
        self.panel = AttentionPanel(self.blit, grid[0], title=title)

    @property
    def figure(self) -> Figure:
        return self.blit.figure

    def update(self, frame: AttentionFrame) -> bytes:
        self.panel.set_frame(frame)
        return self.blit.render()


def _format_readout(value) -> str:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


class LiveAttentionWidget:
    """Controls + pure compute function + view, shown as one ipywidgets box.

    Args:
        compute: ``compute(**control_values) -> AttentionFrame``; must be pure (tests call it).
        controls: name -> ipywidgets control; each name is a keyword argument of ``compute``.
        view: an object with ``update(frame) -> png bytes``; an :class:`AttentionView` by default.

    After every change, :attr:`frame` holds the frame shown, :attr:`readouts` its readouts and
    :attr:`error` the last error message (also shown in red in the widget), or ``None``.
    """

    def __init__(
        self,
        compute: Callable[..., AttentionFrame],
        controls: Mapping[str, widgets.ValueWidget],
        view=None,
        *,
        title: str | None = None,
    ):
        if not callable(compute):
            raise TypeError(f"compute must be callable, got {type(compute).__name__}")
        if not controls:
            raise ValueError("controls must name at least one control")
        self.compute = compute
        self.controls = dict(controls)
        self.view = view if view is not None else AttentionView()
        # natural size, not stretched by the flex box; shrinks on narrow screens
        self.image = widgets.Image(format="png", layout=widgets.Layout(
            width="auto", max_width="100%", height="auto", align_self="flex-start"))
        self.readout_html = widgets.HTML()
        self.error_html = widgets.HTML()
        self.frame: AttentionFrame | None = None
        self.error: str | None = None
        self.renders = 0
        self._holding = False
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        self.ui = widgets.VBox(
            [*header, widgets.HBox(list(self.controls.values()),
                                   layout=widgets.Layout(flex_flow="row wrap")),
             self.image, self.readout_html, self.error_html]
        )
        self.refresh()

    @property
    def values(self) -> dict:
        """The current control values, by name."""
        return {name: control.value for name, control in self.controls.items()}

    @property
    def readouts(self) -> dict:
        """The readouts of the frame on show, formatted as text. Every widget reports entropy:
        when the frame's readouts name none, the mean entropy over its query rows is added."""
        if self.frame is None:
            return {}
        readouts = dict(self.frame.readouts)
        if not any("entropy" in name for name in readouts):
            readouts["mean entropy (nats)"] = self.frame.entropy.mean().item()
        return {name: _format_readout(value) for name, value in readouts.items()}

    def _on_change(self, _change) -> None:
        if not self._holding:
            self.refresh()

    def refresh(self) -> None:
        """Recompute the frame from the controls and redraw; errors are shown, not swallowed."""
        try:
            with single_thread():  # tiny tensors: threads only add waiting, and results vary
                frame = self.compute(**self.values)
                png = self.view.update(frame)
        except Exception as exc:  # shown to the learner inside the widget
            self.error = f"{type(exc).__name__}: {exc}"
            self.error_html.value = (
                f"<pre style='color:#b00020;white-space:pre-wrap'>{html.escape(self.error)}</pre>"
            )
            return
        self.frame, self.error = frame, None
        self.error_html.value = ""
        self.image.value = png
        self.renders += 1
        rows = "".join(
            f"<tr><td style='padding-right:1em'>{html.escape(k)}</td>"
            f"<td><code>{html.escape(v)}</code></td></tr>"
            for k, v in self.readouts.items()
        )
        self.readout_html.value = f"<table class='attn-readouts'>{rows}</table>"

    def set(self, **values) -> dict:
        """Move several controls at once (one redraw) and return the new readouts."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; known: {sorted(self.controls)}")
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.refresh()
        return self.readouts

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
