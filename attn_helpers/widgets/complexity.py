"""Notebook 08's widget: FlashAttention-2's forward tile by tile, with each row's m, l, e^(m - m')."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import PowerNorm, to_rgba
from matplotlib.patches import Rectangle
from matplotlib.transforms import blended_transform_factory, offset_copy

from .._checks import require_bool, require_int_in
from ..entropy import attention_entropy
from ..plots import weights_cmap
from .controls import control_problem
from .core import BlitView, LiveAttentionWidget
from .panels import BAR_COLOR, HIGHLIGHT_COLOR, CellPainter, EntropyBars, TextSprites

N_RANGE, MAX_BLOCK = (8, 48), 16          # tokens n, and the largest tile (at most n)
FUTURE_COLOR = "#ffffff"                  # causal: keys a query may never see
M_LIMITS, L_LIMITS = (-3.0, 8.0), (0.0, 16.0)   # every (n, block, step) of the stepper fits


@dataclass
class TileStepperFrame:
    """The tiled forward after ``step`` of ``n_steps`` tiles; arrays ``(n, n)`` or ``(n,)``."""

    n: int
    block_size: int
    causal: bool
    step: int
    n_steps: int
    scores: np.ndarray
    weights: np.ndarray                   # exp(s - m) / l, NaN on unseen keys
    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the paper's name
    rescale: np.ndarray                   # exp(m_before - m): 1 untouched, 0 at a row's first tile
    tile: tuple[int, int, int, int] | None    # (row_start, row_stop, col_start, col_stop)
    finished: np.ndarray
    entropy: np.ndarray                   # NaN until the row is finished
    ceiling: np.ndarray
    rows: np.ndarray                      # the last tile's rows
    readouts: dict = field(default_factory=dict)


def tile_schedule(n: int, block_size: int, *, causal: bool = False
                  ) -> list[tuple[int, int, int, int]]:
    """FlashAttention-2's order: query blocks outside, key blocks inside; ``causal`` skips the tiles
    wholly above the diagonal."""
    starts = range(0, n, block_size)
    return [(i, min(i + block_size, n), j, min(j + block_size, n))
            for i in starts for j in starts if not (causal and j >= i + block_size)]


def tile_scores(n: int, *, causal: bool = False) -> torch.Tensor:
    """Seeded float64 scores ``(n, n)``: ``q k^T / sqrt(d)`` plus a ramp along the keys (so the
    running max moves); ``-inf`` above the diagonal with ``causal``."""
    g, d = torch.Generator().manual_seed(0), 16
    q, k = (torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2))
    s = q @ k.T / math.sqrt(d) + torch.linspace(0.0, 3.0, n, dtype=torch.float64)
    return s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf) if causal else s


def _running(s: torch.Tensor, seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row over the ``seen`` entries: ``m``, ``p = exp(s - m)`` (0 unseen) and ``l = sum p``."""
    m = s.masked_fill(~seen, -math.inf).amax(dim=-1)                   # (n,)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.where(seen, torch.exp(s - safe[:, None]), 0.0)          # (n, n)
    return m, p, p.sum(dim=-1)


def tile_stepper_frame(n: int, block_size: int, causal: bool, step: int) -> TileStepperFrame:
    """``n`` in :data:`N_RANGE`, ``block_size`` in ``2..min(MAX_BLOCK, n)``, ``step`` in ``0..tiles``."""
    n, causal = require_int_in("n", n, *N_RANGE), require_bool("causal", causal)
    block_size = require_int_in("block_size", block_size, 2, min(MAX_BLOCK, n))
    tiles = tile_schedule(n, block_size, causal=causal)
    step = require_int_in("step", step, 0, len(tiles))
    s, block = tile_scores(n, causal=causal), torch.arange(n) // block_size
    bi, bj = block[:, None], block[None, :]                           # tile row and column
    order = bi * (bi + 1) // 2 + bj if causal else bi * math.ceil(n / block_size) + bj
    order = order.masked_fill(causal & (bj > bi), len(tiles))         # position in tile_schedule
    seen, before = order < step, order < step - 1
    (m_before, _, _), (m, p, l) = _running(s, before), _running(s, seen)   # noqa: E741
    touched = (seen != before).any(dim=-1)                            # the rows of the last tile
    rescale = torch.where(touched, torch.exp(m_before - m).nan_to_num(0.0), 1.0)   # e^{m - m'}
    weights = (p / l.clamp_min(1e-300)[:, None]).masked_fill(~seen, math.nan)   # p / l, seen keys
    finished = (seen | torch.isinf(s)).all(dim=-1)
    entropy = attention_entropy(torch.softmax(s, dim=-1)).masked_fill(~finished, math.nan)
    frame = TileStepperFrame(n, block_size, causal, step, len(tiles), s.numpy(), weights.numpy(),
                             m.numpy(), l.numpy(), rescale.numpy(), tiles[step - 1] if step else None,
                             finished.numpy(), entropy.numpy(),
                             np.log(torch.isfinite(s).sum(dim=-1).numpy().astype(float)),
                             touched.numpy())
    frame.readouts = _readouts(frame)
    return frame


def _readouts(t: TileStepperFrame) -> dict:
    rows, done, (r0, r1, c0, c1) = t.rows, t.finished, t.tile or (0, 0, 0, 0)
    moved = rows & (t.rescale > 0) & (t.rescale < 1)       # rows whose maximum rose
    factors = t.rescale[moved]
    return {
        "step": f"{t.step} of {t.n_steps}",
        "tile": (f"queries {r0}..{r1 - 1} x keys {c0}..{c1 - 1}" if t.tile
                 else "none yet: every key is unseen"),
        "rows rescaled by this tile": f"{int(moved.sum())} of {int(rows.sum())}" + (
            "" if not moved.any() else f", by e^(m - m') = {factors[0]:.4f}" if len(factors) == 1
            else f", by e^(m - m') = {factors.min():.4f}..{factors.max():.4f}"),
        "rows starting here (first tile, nothing to rescale)": int((rows & (t.rescale == 0)).sum()),
        "rows finished": f"{int(done.sum())} of {len(done)}",
        "mean entropy of finished rows (nats)": (
            f"{t.entropy[done].mean():.4f} (ceiling ln(visible keys): {t.ceiling[done].mean():.4f})"
            if done.any() else "none finished yet"),
    }


def _row_bars(blit, ax) -> LineCollection:              # animated horizontal bars, one a row
    bars = LineCollection([], capstyle="butt")
    ax.add_collection(bars)
    blit.animate(bars)
    return bars


def _set_bars(bars: LineCollection, start, stop, colors, width: float) -> None:
    rows = np.arange(len(stop), dtype=float)
    bars.set_segments(np.stack([np.stack([start, rows], 1), np.stack([stop, rows], 1)], 1))
    bars.set_colors(colors)
    bars.set_linewidth(width)


class TileStepperView(BlitView):
    """The matrix revealed tile by tile (grey: unseen, white: causal future, orange: the last
    tile), then per row: ``m`` (hollow: before the tile), ``l``, ``e^(m - m')`` and the entropy
    against ``ln(visible keys)``. Laid out once for any ``n``; a move only blits."""

    SIZE, LEFT, BOTTOM = 3.7, 0.72, 0.45          # the square map and its corner, in inches

    def __init__(self):
        super().__init__((11.0, 5.0))
        fig = self.figure
        fig.set_layout_engine("none")                 # every axes is placed by hand, once
        width, height = fig.get_size_inches()

        def axes(x0, w):
            return fig.add_axes((x0 / width, self.BOTTOM / height, w / width, self.SIZE / height))

        self.ax_map = axes(self.LEFT, self.SIZE)
        self.ax_map.set(xticks=[], yticks=[])
        self.ax_map.set_xlabel("key", fontsize=9, labelpad=14)
        self.ax_map.xaxis.set_label_position("top")
        self.ax_map.set_ylabel("query", fontsize=9, labelpad=18)
        self.ax_map.set_title("weights exp(s - m) / ℓ tile by tile (never stored by FlashAttention)",
                              fontsize=9, pad=30)
        #: a square-root colour scale on the fixed 0..1 range: a weight near 1/48 stays visible
        weight_norm = PowerNorm(0.5, 0.0, 1.0, clip=True)
        self.cells = CellPainter(self.blit, self.ax_map, weights_cmap(), weight_norm)
        cbar = axes(self.LEFT + self.SIZE + 0.1, 0.13)
        fig.colorbar(ScalarMappable(weight_norm, weights_cmap()), cax=cbar)
        cbar.set_yticks([0, 0.05, 0.25, 0.5, 1])
        cbar.tick_params(labelsize=8)
        cbar.set_title("√ scale", fontsize=7)          # nonlinear: the ticks are not evenly spaced
        self.grid = LineCollection([], colors="white", linewidths=0.8, zorder=4)
        self.frame_box = Rectangle((0, 0), 1, 1, fill=False, edgecolor=HIGHLIGHT_COLOR,
                                   linewidth=2.5, zorder=5)
        self.ax_map.add_collection(self.grid)
        self.ax_map.add_patch(self.frame_box)
        above = blended_transform_factory(self.ax_map.transData, self.ax_map.transAxes)   # x: keys
        left = blended_transform_factory(self.ax_map.transAxes, self.ax_map.transData)    # y: queries
        self.key_labels = TextSprites(self.blit, offset_copy(above, fig=fig, y=3, units="points"),
                                      size=8, va="bottom")
        self.query_labels = TextSprites(self.blit, offset_copy(left, fig=fig, x=-4, units="points"),
                                        size=8, ha="right")
        titles = ("running max m\n(o: before this tile)", "running sum ℓ",
                  "rescale e^(m - m'),\nthis tile's rows", "entropy per query\n(finished rows)")
        limits = (M_LIMITS, L_LIMITS, (0, 1.08), (0, np.log(N_RANGE[1]) * 1.08))
        self.side = [axes(self.LEFT + self.SIZE + 0.68 + i * 1.43, 1.2) for i in range(4)]
        for ax, title, xlim in zip(self.side, titles, limits, strict=True):
            ax.set_title(title, fontsize=9)
            ax.set(xlim=xlim, yticks=[])
            ax.tick_params(labelsize=8)
            ax.grid(axis="x", alpha=0.3)
        ax_m, ax_l, ax_r, ax_h = self.side
        ax_m.axvline(0, color="grey", linewidth=0.8)
        ax_r.axvline(1, color="grey", linewidth=0.8, linestyle=":")
        self.m_moves, self.l_bars, self.r_bars = (_row_bars(self.blit, ax) for ax in (ax_m, ax_l, ax_r))
        (self.m_dots,) = ax_m.plot([], [], "o", color=BAR_COLOR)
        (self.m_tile,) = ax_m.plot([], [], "o", color=HIGHLIGHT_COLOR)
        (self.m_before,) = ax_m.plot([], [], "o", mfc="none", color=HIGHLIGHT_COLOR)
        (self.r_dots,) = ax_r.plot([], [], "o", color=HIGHLIGHT_COLOR)
        self.dots = (self.m_dots, self.m_tile, self.m_before, self.r_dots)
        self.blit.animate(self.grid, self.frame_box, *self.dots)
        self.entropy = EntropyBars(self.blit, ax_h, title=titles[-1],
                                   xlabel="nats (dashes: ln visible keys)")
        ax_h.title.set_fontsize(9)
        self.future = np.array(to_rgba(FUTURE_COLOR)) * 255
        self.n = 0

    def _resize(self, n: int) -> None:
        """Data limits for ``n`` tokens: every axis keeps its box, so nothing is redrawn."""
        self.n = n
        self.ax_map.set_xlim(-0.5, n - 0.5)
        for ax in (self.ax_map, *self.side):
            ax.set_ylim(n - 0.5, -0.5)
        row_pt = self.SIZE * 72 / n
        self.every = max(1, int(np.ceil(10 / row_pt)))        # labels >= 10 pt apart
        for labels in (self.key_labels, self.query_labels):
            labels.size = float(np.clip(0.7 * row_pt, 8, 10))
        for dots in self.dots:
            dots.set_markersize(min(5.0, 0.6 * row_pt))
        self.width = 0.7 * row_pt

    def draw(self, t: TileStepperFrame) -> None:
        n, rows = t.n, t.rows
        if n != self.n:
            self._resize(n)
        colors = self.cells.cmap(self.cells.norm(np.ma.masked_invalid(t.weights)), bytes=True)
        colors[~np.isfinite(t.scores)] = self.future
        self.cells.colors = colors                                      # (n, n, 4)
        edges = np.arange(t.block_size, n, t.block_size) - 0.5
        self.grid.set_segments([[(x, -0.5), (x, n - 0.5)] for x in edges]
                               + [[(-0.5, y), (n - 0.5, y)] for y in edges])
        self.frame_box.set_visible(t.tile is not None)
        if t.tile is not None:
            r0, r1, c0, c1 = t.tile
            self.frame_box.set_bounds(c0 - 0.5, r0 - 0.5, c1 - c0, r1 - r0)
        shown = np.arange(0, n, self.every)
        labels = [str(i) for i in shown]
        self.key_labels.set(labels, np.stack([shown, np.ones_like(shown)], 1))      # top edge
        self.query_labels.set(labels, np.stack([np.zeros_like(shown), shown], 1))   # left edge
        index = np.arange(n, dtype=float)
        m = np.where(np.isfinite(t.m), t.m, np.nan)
        moved = rows & (t.rescale > 0) & (t.rescale < 1)
        # the max before the tile: m = m' + ln e^(m - m')
        before = np.where(moved, m + np.log(np.where(moved, t.rescale, 1.0)), np.nan)
        self.m_dots.set_data(np.where(rows, np.nan, m), index)
        self.m_tile.set_data(np.where(rows, m, np.nan), index)
        self.m_before.set_data(before, index)
        _set_bars(self.m_moves, np.nan_to_num(before, nan=0.0), np.where(moved, m, 0.0),
                  HIGHLIGHT_COLOR, 1.5)
        _set_bars(self.l_bars, np.zeros_like(t.l), t.l, np.where(rows, HIGHLIGHT_COLOR, BAR_COLOR),
                  self.width)
        _set_bars(self.r_bars, np.zeros_like(t.l), np.where(rows, t.rescale, 0.0),   # grey: factor 1
                  np.where(moved, HIGHLIGHT_COLOR, "#bbbbbb"), self.width)
        self.r_dots.set_data(np.where(moved, t.rescale, np.nan), index)
        self.entropy.set(np.nan_to_num(t.entropy, nan=0.0), t.ceiling)
        self.entropy.bars.set_linewidth(self.width)


class TileStepperWidget(LiveAttentionWidget):
    """The tile-size and step ranges follow ``n``, the tile size and ``causal`` (a step at its end
    stays there); :meth:`set` fits them to the new values, then the core's :meth:`set` checks these."""

    def refresh(self) -> None:
        self._fit(self.values)
        super().refresh()

    def _fit(self, values: dict) -> None:
        """The tile-size and step ranges for the control ``values``, without a redraw."""
        block, step = self.controls["block_size"], self.controls["step"]
        held, self._holding = self._holding, True
        try:
            at_end = step.value == step.max
            block.max = min(MAX_BLOCK, values["n"])
            step.max = len(tile_schedule(values["n"], values["block_size"], causal=values["causal"]))
            step.value = step.max if at_end else min(step.max, values["step"])
        finally:
            self._holding = held

    def set(self, **values) -> dict:
        ranges = {name: (self.controls[name].max, self.controls[name].value)
                  for name in ("block_size", "step")}
        wanted = {**self.values, **values}
        if control_problem("n", self.controls["n"], wanted["n"]) is None:   # else no range fits
            with contextlib.suppress(TypeError, ValueError):   # a bad tile size or step: refused below
                self._fit(wanted)
        try:
            return super().set(**values)
        except ValueError:                        # refused: the ranges go back, nothing moved
            self._holding = True
            try:
                for name, (high, value) in ranges.items():
                    self.controls[name].max, self.controls[name].value = high, value
            finally:
                self._holding = False
            raise


def tile_stepper_widget(n: int = 16, block_size: int = 4, causal: bool = False,
                        step: int = 6) -> TileStepperWidget:
    """Notebook 08's widget: sliders for ``n``, the tile size and the step, a causal toggle."""
    frame = tile_stepper_frame(n, block_size, causal, step)           # checks the start values
    wide = widgets.Layout(width="300px")
    controls = {
        "n": widgets.IntSlider(value=n, min=N_RANGE[0], max=N_RANGE[1], description="n",
                               layout=wide),
        "block_size": widgets.IntSlider(value=block_size, min=2, max=min(MAX_BLOCK, n),
                                        description="tile size", layout=wide),
        "causal": widgets.Checkbox(value=causal, description="causal", indent=False,
                                   layout=widgets.Layout(width="90px")),
        "step": widgets.IntSlider(value=step, min=0, max=frame.n_steps, description="step",
                                  layout=widgets.Layout(width="420px")),
    }
    return TileStepperWidget(tile_stepper_frame, controls, TileStepperView(),
                             title="FlashAttention, one tile at a time: move the step")
