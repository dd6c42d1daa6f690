"""Notebook 04's widget: pick an example and a head (or all heads in a grid); per-head entropy.

The view keeps two persistent figures, drawn once each: one head (heatmap + entropy per query)
and the all-heads grid (one heatmap + entropy panel per head). Both show the mean entropy of
every head as bars, the selected head in orange. A control change (another example, another
head) only redraws animated artists and pasted token labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.transforms import offset_copy

from .._checks import shape
from ..entropy import attention_entropy, max_entropy
from ..plots import to_numpy
from .core import (
    AttentionFrame,
    AttentionPanel,
    BlitFigure,
    BlitView,
    EntropyBars,
    LiveAttentionWidget,
)
from .panels import TextSprites

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


class MultiHeadView(BlitView):
    """Two persistent figures: one head, or all heads side by side, each with the mean entropy
    of every head as bars (the selected head in orange). ``update(frame) -> png``."""

    def __init__(self, num_heads: int, *, single_size=(8.4, 4.6), head_width: float = 4.6,
                 height: float = 4.8):
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        self.num_heads = num_heads
        heads = [str(i) for i in range(num_heads)]
        self.single = BlitFigure(single_size)
        grid = self.single.figure.add_gridspec(1, 2, width_ratios=[4.4, 0.8], left=0.01,
                                               right=0.97, bottom=0.12, top=0.9, wspace=0.3)
        self.single_panel = AttentionPanel(self.single, grid[0], title=" ")
        # The head's name changes with the selector: pasted text avoids a full redraw.
        self.single_title = TextSprites(self.single, self.single.figure.transFigure, size=10,
                                        va="bottom")
        self.single_bars = EntropyBars(self.single, self.single.figure.add_subplot(grid[1]),
                                       title="mean entropy\nper head", labels=heads)
        self.single_bars.ax.set_ylabel("head", fontsize=9)
        self.grid = BlitFigure((head_width * num_heads + 1.4, height))
        ratios = [head_width] * num_heads + [0.8]
        grid = self.grid.figure.add_gridspec(1, num_heads + 1, width_ratios=ratios, left=0.01,
                                             right=0.98, bottom=0.14, top=0.88, wspace=0.25)
        self.grid_panels = [AttentionPanel(self.grid, grid[i], title=f"head {i}",
                                           entropy_width=1.1, entropy_title="entropy")
                            for i in range(num_heads)]
        self.grid_bars = EntropyBars(self.grid, self.grid.figure.add_subplot(grid[-1]),
                                     title="mean entropy\nper head", labels=heads)
        self.grid_bars.ax.set_ylabel("head", fontsize=9)
        self.blit = self.grid
        self.last_mode: str | None = None

    def draw(self, frame: MultiHeadFrame) -> None:
        if frame.head_weights is None or frame.head_weights.shape[0] != self.num_heads:
            raise ValueError(f"this view draws {self.num_heads} heads; the frame has "
                             f"{None if frame.head_weights is None else frame.head_weights.shape[0]}")
        entropy = to_numpy(frame.head_entropy)
        ceiling = np.full(self.num_heads, max_entropy(len(frame.key_labels)))
        if frame.head is None:
            for i, panel in enumerate(self.grid_panels):
                panel.set_title(frame.head_names[i])
                panel.set_frame(frame.head_frame(i))
            bars, self.blit, self.last_mode = self.grid_bars, self.grid, "grid"
        else:
            self.single_panel.set_frame(frame)
            self.single_title.transform = offset_copy(  # where the panel's title goes
                self.single_panel.ax_map.transAxes, fig=self.single.figure,
                y=self.single_panel.title_pad + 2, units="points")
            self.single_title.set([frame.head_names[frame.head]], [(0.5, 1.0)])
            bars, self.blit, self.last_mode = self.single_bars, self.single, "single"
        bars.layout(self.num_heads, float(ceiling.max()))
        bars.set(entropy, ceiling, frame.head)


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
