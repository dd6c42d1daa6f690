"""What the views draw with: a heatmap with token labels, colour bar and entropy view
(:class:`AttentionPanel`), entropy bars (:class:`EntropyBars`), and the painters that make a move
cheap: text from cached glyph bitmaps (:class:`TextSprites`) and heatmap cells (:class:`CellPainter`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize, to_rgb
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.patches import Rectangle
from matplotlib.transforms import blended_transform_factory, offset_copy
from mpl_toolkits.axes_grid1 import make_axes_locatable
from mpl_toolkits.axes_grid1.axes_size import Fixed

from ..plots import ceiling_staircase, to_numpy, weights_cmap

BAR_COLOR = "#3b75af"
HIGHLIGHT_COLOR = "#ff7f0e"
CEILING_COLOR = "#c0392b"
TITLE_PT, LABEL_PT, MIN_PT, MAX_PT = 10, 9, 8, 10


class EntropyBars:
    """One horizontal bar per row (segments of a ``LineCollection``, faster than patches), each
    row's ceiling as a dashed staircase, one row highlighted; ``labels``: row labels or none."""

    def __init__(self, blit, ax, *, title: str, xlabel: str = "nats",
                 labels: Sequence[str] | None = None):
        self.blit, self.ax = blit, ax
        ax.set_title(title, fontsize=TITLE_PT)
        ax.set_xlabel(xlabel, fontsize=MIN_PT)
        ax.tick_params(labelsize=MIN_PT)
        if labels is None:
            ax.set_yticks([])
        else:
            ax.set_yticks(range(len(labels)), labels, fontsize=MIN_PT)
        self.bars = LineCollection([], colors=BAR_COLOR, capstyle="butt")
        ax.add_collection(self.bars)
        (self.ceiling,) = ax.plot([], [], color=CEILING_COLOR, linestyle="--", linewidth=1.2)
        blit.animate(self.bars, self.ceiling)
        blit.on_layout(self.fit_width)
        self.rows, self.x_max = 0, 0.0

    def layout(self, rows: int, x_max: float) -> None:
        """Room for ``rows`` bars up to ``x_max`` nats (grows only, with a full redraw)."""
        if rows > self.rows or x_max > self.x_max:
            self.rows, self.x_max = max(rows, self.rows), max(x_max, self.x_max)
            self.ax.set_ylim(self.rows - 0.5, -0.5)
            self.ax.set_xlim(0, max(self.x_max, 0.1) * 1.1)
            self.blit.invalidate()

    def fit_width(self) -> None:
        """Bars 0.7 of a row thick, for the rows the y limits show (a view may zoom in)."""
        if self.rows:
            bottom, top = self.ax.get_ylim()
            row_pt = self.ax.get_window_extent().height / abs(bottom - top) * 72 / self.blit.figure.dpi
            self.bars.set_linewidth(0.7 * row_pt)

    def set(self, values, ceilings, highlight: int | None = None) -> None:
        values, ceilings = to_numpy(values).astype(float), to_numpy(ceilings).astype(float)
        rows = np.arange(len(values))
        self.bars.set_segments(np.stack([np.stack([np.zeros(len(values)), rows], 1),
                                         np.stack([values, rows], 1)], 1))
        colors = [BAR_COLOR] * len(values)
        if highlight is not None:
            colors[highlight] = HIGHLIGHT_COLOR
        self.bars.set_colors(colors)
        self.ceiling.set_data(*ceiling_staircase(ceilings))


@functools.lru_cache(maxsize=4096)
def _coverage(text: str, size: float, rotate: bool, dpi: float) -> np.ndarray:
    """``(h, w)`` coverage in 0..1 of ``text``, drawn by FreeType as Agg draws text."""
    font = get_font(findfont(FontProperties()))
    font.clear()
    font.set_size(size, dpi)
    font.set_text(text, 0.0)
    font.draw_glyphs_to_bitmap(antialiased=True)
    alpha = np.asarray(font.get_image(), dtype=np.float32) / 255
    return np.ascontiguousarray(np.rot90(alpha) if rotate else alpha)


class TextSprites:
    """Text pasted into the canvas from cached glyph bitmaps: microseconds a label where a
    ``Text`` artist takes a fraction of a millisecond. ``set(texts, xy)``: one text per point of
    ``xy`` ``(n, 2)`` in ``transform``'s coordinates, anchored by ``ha`` and ``va``."""

    def __init__(self, blit, transform, *, size: float = 9, rotate: bool = False,
                 ha: str = "center", va: str = "center", color: str = "black",
                 zorder: float = 3.0):
        self.blit, self.transform = blit, transform
        self.size, self.rotate, self.ha, self.va = size, rotate, ha, va
        self.color = np.array(to_rgb(color)) * 255
        self.texts, self.xy, self.visible, self._blends = [], np.zeros((0, 2)), True, {}
        blit.overlay(self.paint, zorder)

    def set(self, texts: Sequence[str], xy) -> None:
        self.texts, self.xy = list(texts), np.asarray(xy, dtype=float).reshape(-1, 2)

    def warm(self, texts) -> None:
        """Cache the bitmaps of ``texts`` at the size set now: showing them later needs no font."""
        for text in texts:
            self._blend(text)

    def _blend(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(1 - a, colour * a)`` of ``text``'s coverage ``a``: a paint is two operations."""
        key = (text, self.size, self.rotate)
        if key not in self._blends:
            if len(self._blends) >= 4096:   # free text (a prompt) must not grow it forever
                self._blends.clear()
            a = _coverage(text, self.size, self.rotate, self.blit.figure.dpi)[:, :, None]
            self._blends[key] = (1 - a, self.color * a)
        return self._blends[key]

    def paint(self, buffer: np.ndarray) -> None:
        if not self.visible or not self.texts:
            return
        height, width = buffer.shape[:2]
        anchors = self.transform.transform(self.xy)
        fx = {"left": 0.0, "center": 0.5, "right": 1.0}[self.ha]
        fy = {"top": 0.0, "center": 0.5, "bottom": 1.0}[self.va]
        for text, (x, y) in zip(self.texts, anchors.tolist(), strict=False):
            if not text:
                continue
            keep, ink = self._blend(text)
            h, w = keep.shape[:2]
            top, left = int(round(height - y - fy * h)), int(round(x - fx * w))
            r0, c0, r1, c1 = max(top, 0), max(left, 0), min(top + h, height), min(left + w, width)
            if r0 >= r1 or c0 >= c1:
                continue
            rows, cols = slice(r0 - top, r1 - top), slice(c0 - left, c1 - left)
            region = buffer[r0:r1, c0:c1, :3]
            np.add(region * keep[rows, cols], ink[rows, cols], out=region, casting="unsafe")


class CellPainter:
    """An ``(n_q, n_k)`` grid of weights painted into the canvas (``imshow`` with nearest
    interpolation, in a fraction of its time); cell ``(i, j)`` covers data ``[j +- 0.5] x
    [i +- 0.5]``; masked cells get the colormap's "bad" colour."""

    def __init__(self, blit, ax, cmap, norm: Normalize | None = None, zorder: float = 0.5):
        self.ax, self.cmap, self.norm = ax, cmap, norm or Normalize(0.0, 1.0, clip=True)
        self.colors = np.zeros((0, 0, 4), dtype=np.uint8)  # (n_q, n_k, RGBA)
        blit.overlay(self.paint, zorder)

    def set(self, weights) -> None:
        self.colors = self.cmap(self.norm(weights), bytes=True)

    def paint(self, buffer: np.ndarray) -> None:
        n_q, n_k = self.colors.shape[:2]
        if not self.colors.size:
            return
        height, width = buffer.shape[:2]
        edges = self.ax.transData.transform(np.arange(max(n_q, n_k) + 1)[:, None] - [0.5, 0.5])
        x = np.clip(np.rint(edges[:n_k + 1, 0]).astype(int), 0, width)
        y = np.clip(np.rint(height - edges[:n_q + 1, 1]).astype(int), 0, height)
        cells = np.repeat(self.colors, np.diff(y), axis=0)           # each row of cells, its pixels
        buffer[y[0]:y[-1], x[0]:x[-1]] = np.repeat(cells, np.diff(x), axis=1)


class _Labels:
    """Token labels above the heatmap (keys) or left of it (queries), none overlapping."""

    def __init__(self, blit, ax, axis: str):
        self.ax, self.axis, self.every = ax, axis, 1
        if axis == "x":  # above the axes, x in data units
            self.sprites = TextSprites(blit, offset_copy(blended_transform_factory(
                ax.transData, ax.transAxes), fig=ax.figure, y=3, units="points"), va="bottom")
        else:  # left of the axes, y in data units
            self.sprites = TextSprites(blit, offset_copy(blended_transform_factory(
                ax.transAxes, ax.transData), fig=ax.figure, x=-4, units="points"), ha="right")

    def widest(self, labels: Sequence[str]) -> float:
        """Width in points of the widest label at 10 pt."""
        dpi = self.ax.figure.dpi
        px = max((_coverage(label, 10.0, False, dpi).shape[1] for label in labels if label),
                 default=0)
        return px * 72 / dpi

    def style(self, cell_pt: float, widest: float) -> float:
        """Choose the size (8 to 10 pt), rotation and which labels to show (every one, every
        second...) so none overlap; return the room they take beside the axes, in points."""
        size = float(np.clip(0.8 * cell_pt, MIN_PT, MAX_PT))
        self.every = max(1, math.ceil(1.15 * MIN_PT / cell_pt))
        width = max(widest, 4.0) * size / 10 + 1
        rotate = self.axis == "x" and width > cell_pt * self.every - 2  # 2 pt between labels
        self.sprites.size, self.sprites.rotate = size, rotate
        return width + 4 if self.axis == "y" or rotate else 1.2 * size + 3

    def set(self, labels: Sequence[str]) -> None:
        shown = range(0, len(labels), self.every)
        at = np.zeros((len(shown), 2)) + (0.0, 1.0 if self.axis == "x" else 0.0)  # x: the axes' top
        at[:, 0 if self.axis == "x" else 1] = shown
        self.sprites.set([labels[i] for i in shown], at)


class AttentionPanel:
    """A heatmap (square cells, 0..1 colour scale, token labels, colour bar) and each query's
    entropy with its ``ln(visible keys)`` ceiling, in one region of a :class:`BlitFigure`; room
    made for the largest frame so far (or ``max_shape`` ``(n_q, n_k)``), so smaller ones only blit."""

    def __init__(self, blit, region, *, title: str = "attention weights",
                 max_shape: tuple[int, int] | None = None, entropy_width: float = 1.5,
                 entropy_title: str = "entropy per query",
                 entropy_xlabel: str = "nats (dashes: ln visible keys)",
                 axis_names: tuple[str, str] = ("key", "query")):
        self.blit, self.title, self.axis_names = blit, title, axis_names
        figure = blit.figure
        self.ax_map = ax = figure.add_subplot(region)
        ax.set_title(title, fontsize=TITLE_PT)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        self.cells = CellPainter(blit, ax, weights_cmap())
        divider = make_axes_locatable(ax)
        self.ax_bar = divider.append_axes("right", size=Fixed(0.12), pad=Fixed(0.08))
        self.scale = ScalarMappable(Normalize(0, 1), weights_cmap())   # set_clim rescales the bar
        figure.colorbar(self.scale, cax=self.ax_bar)
        self.ax_bar.tick_params(labelsize=MIN_PT)
        self.ax_entropy = divider.append_axes("right", size=Fixed(entropy_width), pad=Fixed(0.45))
        self.entropy = EntropyBars(blit, self.ax_entropy, title=entropy_title, xlabel=entropy_xlabel)
        # room for the token labels, axis names and titles, resized at each layout
        self.room = {side: Fixed(0.3) for side in ("left", "top", "bottom")}
        for side, size in self.room.items():
            divider.append_axes(side, size=size, pad=0).set_axis_off()
        self.highlight = Rectangle((0, 0), 1, 1, fill=False, edgecolor=HIGHLIGHT_COLOR,
                                   linewidth=2.5)
        ax.add_patch(self.highlight)
        blit.animate(self.highlight)
        self.xlabels, self.ylabels = _Labels(blit, ax, "x"), _Labels(blit, ax, "y")
        self.shape, self.longest, self.title_pad = (0, 0), (0.0, 0.0), 0.0
        if max_shape is not None:
            self._layout(*max_shape, (1, 1))

    def set_title(self, title: str) -> None:
        """A new title for the heatmap (one full redraw)."""
        if title != self.title:
            self.title = title
            self.ax_map.title.set_text(title)
            self.blit.invalidate()

    def _cell_pt(self) -> tuple[float, float]:
        """Width and height of one cell in points, in the box the map really gets."""
        ax = self.ax_map
        ax.apply_aspect(ax.get_axes_locator()(ax, self.blit.canvas.get_renderer()))
        box = ax.get_position(original=False)
        size_pt = np.array(self.blit.figure.get_size_inches()) * 72 * (box.width, box.height)
        return size_pt[0] / self.shape[1], size_pt[1] / self.shape[0]

    def _layout(self, n_q: int, n_k: int, longest: tuple[float, float]) -> None:
        self.shape, self.longest = (n_q, n_k), longest
        ax = self.ax_map
        ax.set_xlim(-0.5, n_k - 0.5)
        ax.set_ylim(n_q - 0.5, -0.5)
        for side in self.room.values():
            side.fixed_size = 0.2
        for _ in range(3):  # the label size depends on the cell size, which depends on the room
            cell_w, cell_h = self._cell_pt()
            above = self.xlabels.style(cell_w, longest[1])
            left = self.ylabels.style(cell_h, longest[0])
            self.room["top"].fixed_size = (above + 2.2 * LABEL_PT + 1.6 * TITLE_PT) / 72
            self.room["left"].fixed_size = (left + 2 * LABEL_PT + 2) / 72
            self.room["bottom"].fixed_size = 3.2 * MIN_PT / 72
        ax.xaxis.set_label_position("top")
        ax.set_xlabel(self.axis_names[0], fontsize=LABEL_PT, labelpad=above + 2)
        ax.set_ylabel(self.axis_names[1], fontsize=LABEL_PT, labelpad=left + 2)
        self.title_pad = above + 4 + 1.6 * LABEL_PT  # points above the map
        ax.set_title(self.title, fontsize=TITLE_PT, pad=self.title_pad)
        self.entropy.layout(n_q, math.log(max(n_k, 1)))
        self.blit.invalidate()

    def set_frame(self, frame) -> None:
        """Draw an ``AttentionFrame``; raises ValueError if its ``highlight_row`` is no row."""
        weights = to_numpy(frame.weights)
        n_q, n_k = weights.shape
        if frame.highlight_row is not None and not 0 <= frame.highlight_row < n_q:
            raise ValueError(f"highlight_row must lie in 0..{n_q - 1}, got {frame.highlight_row}")
        query_labels = [str(label) for label in frame.query_labels]
        key_labels = [str(label) for label in frame.key_labels]
        shape = (max(n_q, self.shape[0]), max(n_k, self.shape[1]))
        longest = (max(self.ylabels.widest(query_labels), self.longest[0]),
                   max(self.xlabels.widest(key_labels), self.longest[1]))
        if shape != self.shape or longest != self.longest:   # grown: lay out again
            self._layout(*shape, longest)
        if frame.mask is not None:
            weights = np.ma.masked_where(~to_numpy(frame.mask).astype(bool), weights)
        self.cells.set(weights)
        self.xlabels.set(key_labels)
        self.ylabels.set(query_labels)
        entropy = to_numpy(frame.entropy)
        if frame.mask is not None:  # a row with no visible key has no distribution to show
            entropy = np.where(to_numpy(frame.mask).any(-1), entropy, 0.0)
        self.entropy.set(entropy, frame.ceiling, frame.highlight_row)
        self.highlight.set_visible(frame.highlight_row is not None)
        if frame.highlight_row is not None:
            self.highlight.set_bounds(-0.5, frame.highlight_row - 0.5, n_k, 1)
