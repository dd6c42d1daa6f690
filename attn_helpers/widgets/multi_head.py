"""Notebook 04's widget: pick an example and a head (or all heads in a grid); per-head entropy.

The view keeps two persistent figures, drawn once each: one head (heatmap + entropy per query)
and the all-heads grid (one heatmap + entropy panel per head). Both show the mean entropy of
every head as bars, the selected head in orange. A control change only redraws animated artists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.collections import LineCollection

from .._checks import shape
from ..entropy import attention_entropy, max_entropy
from ..plots import to_numpy
from .core import (
    BAR_COLOR,
    HIGHLIGHT_COLOR,
    AttentionFrame,
    AttentionPanel,
    BlitFigure,
    LiveAttentionWidget,
)

__all__ = ["ALL_HEADS", "MultiHeadFrame", "MultiHeadView", "multihead_frame", "multihead_widget"]

ALL_HEADS = "all"


@dataclass
class MultiHeadFrame(AttentionFrame):
    """An :class:`AttentionFrame` holding every head.

    ``head_weights`` ``(h, n_q, n_k)``; ``head`` the head shown (``None`` = all heads in a grid,
    then ``weights`` is the head average, what ``nn.MultiheadAttention`` returns by default);
    ``head_names`` one name per head.
    """

    head_weights: torch.Tensor | None = None
    head: int | None = None
    head_names: Sequence[str] = ()

    @property
    def head_entropy(self) -> torch.Tensor:
        """``(h,)`` mean entropy (nats) of each head's query rows."""
        return attention_entropy(torch.as_tensor(self.head_weights, dtype=torch.float64)).mean(-1)

    def head_frame(self, head: int) -> AttentionFrame:
        """The plain frame of one head."""
        return AttentionFrame(self.head_weights[head], self.query_labels, self.key_labels,
                              mask=self.mask)


def multihead_frame(
    weights: torch.Tensor,
    labels: Sequence[Sequence[str]],
    example: int,
    head: int | str,
    *,
    head_names: Sequence[str] | None = None,
    mask: torch.Tensor | None = None,
) -> MultiHeadFrame:
    """The frame for one example and one head (or :data:`ALL_HEADS`).

    Args:
        weights: ``(examples, h, n, n)`` self-attention weights of every example and head.
        labels: one list of ``n`` token labels per example.
        example: which example; ``head``: a head index or ``"all"``.
        mask: optional ``(n, n)`` bool (True = may attend), e.g. the causal mask.
    """
    weights = torch.as_tensor(weights)
    if weights.dim() != 4:
        raise ValueError(f"weights must be 4-D (examples, h, n, n), got shape {shape(weights)}")
    n_examples, h = weights.shape[:2]
    if len(labels) != n_examples:
        raise ValueError(f"labels has {len(labels)} entries for {n_examples} examples")
    if isinstance(example, bool) or not isinstance(example, int) or not 0 <= example < n_examples:
        raise ValueError(f"example must be an int in 0..{n_examples - 1}, got {example!r}")
    if head != ALL_HEADS and (isinstance(head, bool) or not isinstance(head, int)
                              or not 0 <= head < h):
        raise ValueError(f"head must be an int in 0..{h - 1} or {ALL_HEADS!r}, got {head!r}")
    names = list(head_names) if head_names is not None else [f"head {i}" for i in range(h)]
    if len(names) != h:
        raise ValueError(f"head_names has {len(names)} names for {h} heads")
    per_head = weights[example]
    shown = per_head.mean(0) if head == ALL_HEADS else per_head[head]
    tokens = list(labels[example])
    frame = MultiHeadFrame(
        weights=shown, query_labels=tokens, key_labels=tokens, mask=mask,
        head_weights=per_head, head=None if head == ALL_HEADS else head, head_names=names,
    )
    last = per_head[:, -1, :].argmax(-1)
    frame.readouts = {
        "example": " ".join(tokens),
        "showing": "all heads" if head == ALL_HEADS else names[head],
        "mean entropy per head (nats)": ", ".join(
            f"{name}: {value:.4f}" for name, value in zip(names, frame.head_entropy.tolist(),
                                                          strict=True)),
        "last query's strongest key": ", ".join(
            f"{name}: {tokens[int(j)]}" for i, (name, j) in enumerate(zip(names, last, strict=True))
            if head in (ALL_HEADS, i)),
    }
    return frame


class _HeadEntropyBars:
    """Horizontal bars of each head's mean entropy (animated), with the ln n ceiling."""

    def __init__(self, blit: BlitFigure, ax, num_heads: int):
        self.ax = ax
        self.num_heads = num_heads
        ax.set_title("mean entropy per head", fontsize=11)
        ax.set_ylim(num_heads - 0.5, -0.5)
        ax.set_xlabel("nats")
        self.bars = LineCollection([], colors=BAR_COLOR, capstyle="butt")
        ax.add_collection(self.bars)
        (self.ceiling,) = ax.plot([], [], color="#c0392b", linestyle="--")
        blit.animate(self.bars, self.ceiling)
        self.names: tuple[str, ...] | None = None
        self.n_k: int | None = None
        self.blit = blit

    def set(self, entropy: np.ndarray, names: Sequence[str], n_k: int, selected: int | None):
        if (tuple(names), n_k) != (self.names, self.n_k):
            self.ax.set_yticks(range(self.num_heads), [str(i) for i in range(self.num_heads)])
            self.ax.set_ylabel("head")
            ceiling = max_entropy(n_k)
            self.ax.set_xlim(0, max(ceiling, 0.1) * 1.12)
            self.ceiling.set_data([ceiling, ceiling], [-0.5, self.num_heads - 0.5])
            height = self.ax.get_window_extent().height / self.num_heads * 72 / self.blit.figure.dpi
            self.bars.set_linewidth(0.6 * height)
            self.names, self.n_k = tuple(names), n_k
            self.blit.invalidate()
        rows = np.arange(self.num_heads)
        self.bars.set_segments(np.stack([np.stack([np.zeros(self.num_heads), rows], 1),
                                         np.stack([entropy, rows], 1)], 1))
        self.bars.set_colors([HIGHLIGHT_COLOR if i == selected else BAR_COLOR
                              for i in range(self.num_heads)])


class MultiHeadView:
    """Two persistent figures: one head, or all heads side by side; ``update(frame) -> png``."""

    def __init__(self, num_heads: int, *, single_size=(10.5, 4.6), head_width: float = 5.2,
                 height: float = 4.6):
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        self.num_heads = num_heads
        self.single = BlitFigure(single_size)
        grid = self.single.figure.add_gridspec(1, 2, width_ratios=[3.2, 1], left=0.08, right=0.97,
                                               bottom=0.17, top=0.9, wspace=0.35)
        self.single_panel = AttentionPanel(self.single, grid[0], title=" ")
        # The head's name changes with the selector: an animated title avoids a full redraw.
        self.single_title = self.single_panel.ax_map.text(
            0.5, 1.02, "", transform=self.single_panel.ax_map.transAxes, ha="center",
            va="bottom", fontsize=11)
        self.single.animate(self.single_title)
        self.single_bars = _HeadEntropyBars(self.single, self.single.figure.add_subplot(grid[1]),
                                            num_heads)
        self.grid = BlitFigure((head_width * num_heads + 2.2, height))
        ratios = [3.2] * num_heads + [1]
        grid = self.grid.figure.add_gridspec(1, num_heads + 1, width_ratios=ratios, left=0.05,
                                             right=0.98, bottom=0.17, top=0.9, wspace=0.3)
        self.grid_panels = [AttentionPanel(self.grid, grid[i], title=f"head {i}")
                            for i in range(num_heads)]
        self.grid_bars = _HeadEntropyBars(self.grid, self.grid.figure.add_subplot(grid[-1]),
                                          num_heads)
        self.last_mode: str | None = None

    def update(self, frame: MultiHeadFrame) -> bytes:
        if frame.head_weights is None or frame.head_weights.shape[0] != self.num_heads:
            raise ValueError(f"this view draws {self.num_heads} heads; the frame has "
                             f"{None if frame.head_weights is None else frame.head_weights.shape[0]}")
        entropy = to_numpy(frame.head_entropy)
        n_k = len(frame.key_labels)
        if frame.head is None:
            for i, panel in enumerate(self.grid_panels):
                title = frame.head_names[i]
                if panel.ax_map.get_title() != title:
                    panel.ax_map.set_title(title, fontsize=11)
                    self.grid.invalidate()
                panel.set_frame(frame.head_frame(i))
            self.grid_bars.set(entropy, frame.head_names, n_k, None)
            self.last_mode = "grid"
            return self.grid.render()
        self.single_title.set_text(frame.head_names[frame.head])
        self.single_panel.set_frame(frame)
        self.single_bars.set(entropy, frame.head_names, n_k, frame.head)
        self.last_mode = "single"
        return self.single.render()


def multihead_widget(
    weights: torch.Tensor,
    labels: Sequence[Sequence[str]],
    *,
    head_names: Sequence[str] | None = None,
    mask: torch.Tensor | None = None,
) -> LiveAttentionWidget:
    """The live widget of notebook 04 over precomputed ``(examples, h, n, n)`` weights: an example
    slider and a head selector with an all-heads grid."""
    weights = torch.as_tensor(weights)
    if weights.dim() != 4:
        raise ValueError(f"weights must be 4-D (examples, h, n, n), got shape {shape(weights)}")
    h = weights.shape[1]
    names = list(head_names) if head_names is not None else [f"head {i}" for i in range(h)]
    controls = {
        # a slider, so a learner can step through the examples; the readouts name the tokens
        "example": widgets.IntSlider(value=0, min=0, max=len(labels) - 1, description="example",
                                     layout=widgets.Layout(width="320px")),
        "head": widgets.Dropdown(options=[("all heads (grid)", ALL_HEADS)]
                                 + [(name, i) for i, name in enumerate(names)],
                                 value=ALL_HEADS, description="head",
                                 layout=widgets.Layout(width="300px")),
    }

    def compute(example, head):
        return multihead_frame(weights, labels, example, head, head_names=names, mask=mask)

    return LiveAttentionWidget(compute, controls, MultiHeadView(h),
                               title="Which head looks where? Pick an example and a head")
