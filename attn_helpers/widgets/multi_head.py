"""Notebook 04's widget: an example and a head (or all heads in a grid) with each head's mean
entropy; given the model, switch heads off and read the held-out accuracy and the letters named."""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.transforms import offset_copy

from .._checks import require_int_in, shape
from ..entropy import attention_entropy
from ..lessons import multi_head as lesson
from ..plots import to_numpy
from .core import AttentionFrame, AttentionPanel, BlitFigure, BlitView, EntropyBars, LiveAttentionWidget
from .panels import TextSprites

ALL_HEADS = "all"
OFF_CONTRAST = 0.25  # a switched-off head's heatmap keeps this share of its contrast with white


@dataclass
class MultiHeadFrame(AttentionFrame):
    """Every head's ``head_weights (h, n_q, n_k)``, ``head`` shown (``None``: all, averaged), one
    bool per head in ``heads_on``, and given the model its ``ablation``."""

    head_weights: torch.Tensor | None = None
    head: int | None = None
    head_names: Sequence[str] = ()
    heads_on: tuple = ()
    ablation: lesson.AblationFrame | None = None

    @property
    def head_entropy(self) -> torch.Tensor:
        """``(h,)`` mean entropy (nats) of each head's rows."""
        return attention_entropy(self.head_weights.double()).mean(-1)


def multihead_frame(weights: torch.Tensor, labels: Sequence[Sequence[str]], example: int,
                    head: int | str, *, head_names: Sequence[str] | None = None,
                    mask: torch.Tensor | None = None, ablation: lesson.AblationData | None = None,
                    heads_on: Sequence[bool] | None = None) -> MultiHeadFrame:
    """One example and one head (or :data:`ALL_HEADS`) of ``weights (examples, h, n, n)``, ``n``
    labels per example, an optional ``(n, n)`` mask; with ``ablation`` (``ablation_data``),
    ``heads_on`` picks the heads switched on."""
    weights = torch.as_tensor(weights)
    if weights.dim() != 4 or len(labels) != weights.shape[0]:
        raise ValueError(f"weights must be (examples, h, n, n) with one row of labels per example, "
                         f"got shape {shape(weights)} and {len(labels)} rows of labels")
    h = weights.shape[1]
    require_int_in("example", example, 0, len(labels) - 1)
    head = None if head == ALL_HEADS else require_int_in("head", head, 0, h - 1)
    names = list(head_names) if head_names is not None else [f"head {i}" for i in range(h)]
    if len(names) != h:
        raise ValueError(f"head_names has {len(names)} names for {h} heads")
    if heads_on is not None and ablation is None:
        raise ValueError("heads_on needs ablation data (ablation=ablation_data(model, ...))")
    a = None if ablation is None else lesson.ablation_frame(
        ablation, example, (True,) * h if heads_on is None else heads_on)
    per_head, tokens = weights[example], list(labels[example])
    frame = MultiHeadFrame(per_head.mean(0) if head is None else per_head[head], tokens, tokens,
                           mask=mask, head_weights=per_head, head=head, head_names=names,
                           heads_on=(True,) * h if a is None else a.heads_on, ablation=a)
    shown = range(h) if head is None else [head]
    last = per_head[:, -1, :].argmax(-1)
    frame.readouts = {
        "example": " ".join(tokens),
        "showing": "all heads" if head is None else names[head],
        "mean entropy per head (nats)": ", ".join(
            f"{name}: {e:.4f}" for name, e in zip(names, frame.head_entropy.tolist(), strict=True)),
        "last query's strongest key": ", ".join(f"{names[i]}: {tokens[int(last[i])]}" for i in shown),
    }
    if a is None:
        return frame
    # per relation, the accuracy and the letters named at i >= 2 (✓ or ✗): the positions the
    # accuracy counts (at i = 1 the previous letter is the first)
    off = [name for name, on in zip(names, a.heads_on, strict=True) if not on]
    frame.readouts["heads switched off"] = ", ".join(off) or "none"
    for r, relation in enumerate(lesson.RELATIONS):
        frame.readouts[f"held-out accuracy at positions 2.., {relation} letter "
                       f"(chance {1 / lesson.CONFIG.vocab:.3f})"] = float(a.accuracy[relation])
        frame.readouts[f"{relation} letter named at positions 2.. (✓ right, ✗ wrong)"] = " ".join(
            f"{string.ascii_uppercase[p]}{'✓' if ok else '✗'}"
            for p, ok in zip(a.predictions[2:, r].tolist(), a.correct[2:, r].tolist(), strict=True))
    return frame


class _HeadsFigure(BlitFigure):
    """``panels`` heatmaps side by side and each head's mean entropy as bars; marks and lines pasted."""

    def __init__(self, num_heads: int, panels: int, size, ratios, *, right: float, bottom: float,
                 top: float, wspace: float, **panel):
        super().__init__(size)
        grid = self.figure.add_gridspec(1, panels + 1, width_ratios=ratios, left=0.01, right=right,
                                        bottom=bottom, top=top, wspace=wspace)
        self.panels = [AttentionPanel(self, grid[i], **panel) for i in range(panels)]
        self.bars = EntropyBars(self, self.figure.add_subplot(
            grid[-1].subgridspec(3, 1, height_ratios=[1, 2, 1])[1]), title="mean entropy\nper head",
            labels=[str(i) for i in range(num_heads)], xlabel="nats; dashed:\nmean ln(keys seen)")
        self.bars.ax.set_ylabel("head", fontsize=9)
        self.values = TextSprites(self, self.bars.ax.transData, size=8, ha="left")
        self.off = [TextSprites(self, p.ax_map.transAxes, size=13, color="#b00020", zorder=4.0)
                    for p in self.panels]
        self.lines = TextSprites(self, self.figure.transFigure, size=9, ha="left")

    def mark(self, i: int, on: bool) -> None:
        """Panel ``i``'s head on, or off (faded)."""
        if not on:
            colors = self.panels[i].cells.colors.astype(np.float32)
            colors[..., :3] = 255 - (255 - colors[..., :3]) * OFF_CONTRAST
            self.panels[i].cells.colors = colors.astype(np.uint8)
        self.off[i].set([] if on else ["switched off"], [(0.5, 0.5)])

    def set_bars(self, frame: MultiHeadFrame, lines: list[str]) -> None:
        entropy = to_numpy(frame.head_entropy)
        ceiling = float(frame.ceiling.mean())                        # mean ln(visible keys)
        self.bars.layout(len(entropy), ceiling)
        self.bars.set(entropy, np.full(len(entropy), ceiling), frame.head)
        self.values.set([f"{e:.2f}" for e in entropy], [(e + 0.08, i) for i, e in enumerate(entropy)])
        self.lines.set(lines, [(0.015, 0.075 if len(lines) > 1 else 0.04), (0.015, 0.03)][:len(lines)])


class MultiHeadView(BlitView):
    """Two persistent figures: one head, or all heads side by side. A frame given to :meth:`warm`
    shows the picture stored for it; any other is drawn."""

    def __init__(self, num_heads: int):
        self.single = _HeadsFigure(num_heads, 1, (8.4, 4.6), [4.4, 0.8], right=0.97, bottom=0.17,
                                   top=0.9, wspace=0.3, title=" ")
        self.single_title = TextSprites(self.single, self.single.figure.transFigure, size=10,
                                        va="bottom")
        self.grid = _HeadsFigure(num_heads, num_heads, (5.0 * num_heads + 1.2, 4.8),
                                 [5.0] * num_heads + [0.7], right=0.96, bottom=0.18, top=0.88,
                                 wspace=0.12, entropy_width=1.1, entropy_title="entropy")
        self.blit = self.grid
        self.pictures: dict[int, tuple] = {}   # id(frame) -> (frame, PNG)

    def warm(self, frames: Sequence[MultiHeadFrame]) -> None:
        """Lay out for every frame, then store each one's picture: a move only looks it up."""
        for frame in frames:
            self.draw(frame)
        self.pictures = {id(frame): (frame, BlitView.update(self, frame)) for frame in frames}

    def update(self, frame: MultiHeadFrame) -> bytes:
        stored = self.pictures.get(id(frame))
        return stored[1] if stored and stored[0] is frame else super().update(frame)

    @staticmethod
    def picture_lines(frame: MultiHeadFrame) -> list[str]:
        """The lines under the maps: example, head shown, heads off and accuracy."""
        r = frame.readouts
        lines = [f"example: {r['example']}   |   showing: {r['showing']}"]
        if frame.ablation is not None:
            accuracy = ", ".join(f"{relation} letter {frame.ablation.accuracy[relation]:.2f}"
                                 for relation in lesson.RELATIONS)
            lines.append(f"switched off: {r['heads switched off']}   |   held-out accuracy: "
                         f"{accuracy} (chance {1 / lesson.CONFIG.vocab:.3f})")
        return lines

    def draw(self, frame: MultiHeadFrame) -> None:
        if frame.head is None:
            self.blit = self.grid
            for i, panel in enumerate(self.grid.panels):
                panel.set_title(frame.head_names[i])
                panel.set_frame(AttentionFrame(frame.head_weights[i], frame.query_labels,
                                               frame.key_labels, mask=frame.mask))
                self.grid.mark(i, frame.heads_on[i])
        else:
            self.blit, panel, on = self.single, self.single.panels[0], frame.heads_on[frame.head]
            panel.set_frame(frame)
            self.single_title.transform = offset_copy(  # where the panel's title goes
                panel.ax_map.transAxes, fig=self.single.figure, y=panel.title_pad + 2, units="points")
            self.single_title.set([frame.head_names[frame.head] + ("" if on else " (off)")],
                                  [(0.5, 1.0)])
            self.single.mark(0, on)
        self.blit.set_bars(frame, self.picture_lines(frame))


def multihead_widget(weights: torch.Tensor, labels: Sequence[Sequence[str]], *,
                     head_names: Sequence[str] | None = None, mask: torch.Tensor | None = None,
                     model: torch.nn.Module | None = None, eval_tokens: torch.Tensor | None = None,
                     eval_targets: torch.Tensor | None = None, example: int = 0,
                     head: int | str = ALL_HEADS,
                     heads_on: Sequence[bool] | None = None) -> LiveAttentionWidget:
    """Notebook 04's widget over ``weights (examples, h, n, n)``: example slider, head selector and,
    given the ``model`` with ``eval_tokens (m, n)``, ``eval_targets (m, n, 2)``, one checkbox per
    head. Every setting is evaluated and drawn once, here: a move only shows its picture."""
    names = multihead_frame(weights, labels, example, head, head_names=head_names,
                            mask=mask).head_names                     # checks the arguments
    h, data = len(names), None
    if any(arg is not None for arg in (model, eval_tokens, eval_targets)):
        if model is None or eval_tokens is None or eval_targets is None:
            raise ValueError("switching heads off needs model, eval_tokens (m, n) and eval_targets "
                             "(m, n, 2), all three")
        data = lesson.ablation_data(model, eval_tokens, eval_targets)
        if data.weights.shape[1] != h:
            raise ValueError(f"weights has {h} heads, the model {data.weights.shape[1]}")
    if heads_on is not None and (data is None or len(heads_on) != h):
        raise ValueError(f"heads_on needs the model and one bool per head ({h}), got {heads_on!r}")
    controls = {
        "example": widgets.IntSlider(value=example, min=0, max=len(labels) - 1, description="example",
                                     layout=widgets.Layout(width="320px")),
        "head": widgets.Dropdown(options=[("all heads (grid)", ALL_HEADS)]
                                 + [(name, i) for i, name in enumerate(names)],
                                 value=head, description="head", layout=widgets.Layout(width="300px")),
    }
    for i in range(0 if data is None else h):   # given the model, a box per head
        controls[f"head_{i}_on"] = widgets.Checkbox(
            value=heads_on is None or bool(heads_on[i]), description=f"head {i} on", indent=False,
            layout=widgets.Layout(width="110px"))
    subsets = [None] if data is None else list(itertools.product((True, False), repeat=h))
    frames = {(e, shown, on): multihead_frame(weights, labels, e, shown, head_names=names, mask=mask,
                                              ablation=data, heads_on=on)
              for e in range(len(labels)) for shown in (ALL_HEADS, *range(h)) for on in subsets}
    view = MultiHeadView(h)
    view.warm(list(frames.values()))

    def compute(example, head, **switches):
        return frames[example, head, None if data is None else
                      tuple(switches[f"head_{i}_on"] for i in range(h))]

    title = "Which head looks where? Pick an example and a head" + (
        "" if data is None else ", and switch heads off")
    return LiveAttentionWidget(compute, controls, view, title=title)
