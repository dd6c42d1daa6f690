"""Notebook 01's widget: a trained sequence-to-sequence model decodes one example.

:func:`decode_frame` / :func:`bottleneck_widget`: pick a sequence length, a model and an example;
the source, the target and the model's output are drawn as token strips with the errors
highlighted, and below them the model's attention weights (for a model with attention) with the
entropy of every decoder step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.transforms import blended_transform_factory, offset_copy

from ..entropy import attention_entropy
from ..lessons.rnn_bottleneck import Seq2Seq, predict
from ..lessons.tasks import collate, example, get_task
from .core import AttentionFrame, AttentionPanel, BlitView, LiveAttentionWidget
from .panels import CellPainter, TextSprites

__all__ = [
    "DecodeFrame",
    "DecodeView",
    "decode_examples",
    "position_labels",
    "decode_frame",
    "bottleneck_widget",
]

# Token-strip cell colours: empty, plain token, correct output, wrong output (Okabe-Ito orange).
STRIP_COLORS = ["#ffffff", "#e8eef6", "#cde3f5", "#e69f00"]
EMPTY, PLAIN, RIGHT, WRONG = range(4)



class _DecodePanel(AttentionPanel):
    """An :class:`AttentionPanel` whose axes name notebook 01's symbols: rows are output steps
    ``t``, columns input positions ``j`` (queries and keys come only in notebook 02)."""

    def _layout(self, *args) -> None:
        super()._layout(*args)
        self.ax_map.xaxis.label.set_text("input position j")
        self.ax_map.yaxis.label.set_text("output step t")
        self.ax_entropy.xaxis.label.set_text("nats (dashes: ln n, uniform weights)")

@dataclass
class DecodeFrame(AttentionFrame):
    """An :class:`AttentionFrame` plus the decoded example: ``source``, ``target`` and
    ``output`` tokens and, per output step, whether it is ``correct``. ``has_attention`` is False
    for a model without attention (its weights are all masked)."""

    source: Sequence[str] = ()
    target: Sequence[str] = ()
    output: Sequence[str] = ()
    correct: Sequence[bool] = ()
    has_attention: bool = True
    title: str = ""


def decode_examples(model: Seq2Seq, task, pairs):
    """Greedy-decode a list of ``(source, target)`` pairs of one length in one batch; returns
    ``[(output tokens, weights (n_tgt, n_src) or None), ...]``."""
    task = get_task(task)
    with torch.no_grad():
        tokens, weights = predict(model, collate(task, pairs))
    return [([task.tgt_vocab.itos[i] for i in tokens[b].tolist()],
             None if weights is None else weights[b]) for b in range(len(pairs))]


def check_model(model) -> None:
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"model must be a seq2seq.Seq2Seq, got {type(model).__name__}")


_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def position_labels(tokens) -> list[str]:
    """Each token with its position as a subscript (``9₀ 5₁ …``): digits repeat, positions don't,
    so the heatmap's rows and columns say which output ``t`` and which input ``j`` they are."""
    return [f"{token}{str(i).translate(_SUBSCRIPTS)}" for i, token in enumerate(tokens)]


def _frame(model_name: str, source, target, output, weights) -> DecodeFrame:
    correct = [o == t for o, t in zip(output, target, strict=True)]
    n_q, n_k = len(target), len(source)
    if weights is None:
        weights, mask = torch.zeros(n_q, n_k), torch.zeros(n_q, n_k, dtype=torch.bool)
        entropy = "no attention"
    else:
        mask = None
        entropy = attention_entropy(weights.double()).mean().item()
    readouts = {
        "model": model_name,
        "token accuracy": sum(correct) / len(correct),
        "errors": f"{len(correct) - sum(correct)} of {len(correct)}",
        "mean entropy (nats)": entropy,
    }
    return DecodeFrame(weights=weights, query_labels=position_labels(output),
                       key_labels=position_labels(source), mask=mask,
                       readouts=readouts, source=source, target=target, output=output,
                       correct=correct, has_attention=mask is None,
                       title=f"{model_name}: {len(source)} tokens, "
                             f"{len(correct) - sum(correct)} wrong output tokens")


def decode_frame(length: int, model_name: str, index: int,
                 models: Mapping[str, Seq2Seq], task: str = "reversal") -> DecodeFrame:
    """Decode example ``index`` of ``length`` source tokens with ``models[model_name]``.

    Returns a :class:`DecodeFrame` whose weights are ``(length, length)`` (all masked for a model
    without attention) and whose readouts give the token accuracy, the number of errors and the
    mean entropy of the attention rows.
    """
    if model_name not in models:
        raise ValueError(f"model_name must be one of {sorted(models)}, got {model_name!r}")
    model = models[model_name]
    check_model(model)
    source, target = example(task, index, length)
    ((output, weights),) = decode_examples(model, task, [(source, target)])
    return _frame(model_name, source, target, output, weights)


class DecodeView(BlitView):
    """Token strips (source, target, output with errors in orange) above an attention panel
    laid out once for ``max_len`` tokens. A shorter example zooms the strips, the heatmap and
    the entropy bars to its own length (new axis limits: nothing static depends on them, so
    every length only blits, and the example fills the view). A model without attention has no
    entropy ceiling to mark: its dashes are hidden."""

    def __init__(self, max_len: int = 24, figsize: tuple[float, float] = (8.4, 6.9)):
        super().__init__(figsize)
        self.max_len = max_len
        figure = self.figure
        figure.set_layout_engine("none")   # the gridspec below, not the notebooks' constrained layout
        grid = figure.add_gridspec(2, 1, height_ratios=[1, 5.4], left=0.1, right=0.97,
                                   bottom=0.01, top=0.95, hspace=0.2)
        self.ax_strip = figure.add_subplot(grid[0])
        self.ax_strip.set(xlim=(-0.5, max_len - 0.5), ylim=(2.5, -0.5))
        self.strip = CellPainter(self.blit, self.ax_strip, ListedColormap(STRIP_COLORS),
                                 Normalize(-0.5, 3.5))
        self.ax_strip.set_yticks(range(3), ["source", "target", "output"], fontsize=9)
        self.ax_strip.set_xticks([])          # position numbers: sprites, they follow the zoom
        self.ax_strip.set_xlabel("position (output errors in orange)", fontsize=9, labelpad=13)
        self.ax_strip.tick_params(length=0)
        self.tokens = TextSprites(self.blit, self.ax_strip.transData, size=9)
        self.positions = TextSprites(self.blit, offset_copy(blended_transform_factory(
            self.ax_strip.transData, self.ax_strip.transAxes), fig=figure, y=-3, units="points"),
            size=8, va="top")
        self.strip_title = TextSprites(self.blit, offset_copy(
            self.ax_strip.transAxes, fig=figure, y=4, units="points"), size=10, va="bottom")
        self.panel = _DecodePanel(self.blit, grid[1], max_shape=(max_len, max_len),
                                  title="attention weights: output step t x input position j",
                                  entropy_title="entropy per output step")
        self.notice = TextSprites(self.blit, self.panel.ax_map.transAxes, size=10)
        self.notice.set(["no attention: every step", "reads the same context vector"],
                        [(0.5, 0.55), (0.5, 0.45)])
        self.shown = max_len
        self.blit.on_layout(self._fit_bars)   # after the panel's own: bars as thick as a row

    def _zoom(self, n: int) -> None:
        """Show positions ``0..n-1`` in the strips, the heatmap and the entropy bars."""
        self.shown = n
        self.ax_strip.set_xlim(-0.5, n - 0.5)
        self.panel.ax_map.set_xlim(-0.5, n - 0.5)
        self.panel.ax_map.set_ylim(n - 0.5, -0.5)
        self.panel.ax_entropy.set_ylim(n - 0.5, -0.5)
        self.positions.set([str(i) for i in range(n)], [(i, 0.0) for i in range(n)])
        self._fit_bars()

    def _fit_bars(self) -> None:
        row_pt = self.panel.ax_entropy.get_window_extent().height / self.shown * 72 / self.figure.dpi
        self.panel.entropy.bars.set_linewidth(0.7 * row_pt)

    def draw(self, frame: DecodeFrame) -> None:
        n = max(len(frame.source), len(frame.target), len(frame.output))
        if n > self.max_len:
            raise ValueError(f"the view holds at most {self.max_len} tokens, got {n}")
        cells = np.full((3, n), EMPTY)
        rows = [frame.source, frame.target, frame.output]
        for i, tokens in enumerate(rows):
            cells[i, :len(tokens)] = PLAIN
        self.tokens.set([t for tokens in rows for t in tokens],
                        [(j, i) for i, tokens in enumerate(rows) for j in range(len(tokens))])
        cells[2, :len(frame.correct)] = np.where(frame.correct, RIGHT, WRONG)
        self.strip.set(cells)
        self.strip_title.set([frame.title], [(0.5, 1.0)])
        self.notice.visible = not frame.has_attention
        self.panel.set_frame(frame)         # may lay the panel out again, for max_len tokens
        self.panel.entropy.ceiling.set_visible(frame.has_attention)
        self._zoom(n)


def bottleneck_widget(models: Mapping[str, Seq2Seq], *, lengths: tuple[int, int] = (4, 24),
                      examples: int = 20, length: int = 20,
                      model_name: str | None = None) -> LiveAttentionWidget:
    """Notebook 01's widget: sequence length slider, model dropdown and example picker.

    It opens on ``length`` tokens and ``model_name`` (by default the first model of ``models``).

    Each model decodes the ``examples`` examples of a length in one batch, the first time that
    length is shown; every later move to them only redraws.
    """
    for model in models.values():
        check_model(model)
    names = list(models)
    if model_name is not None and model_name not in names:
        raise ValueError(f"model_name must be one of {names}, got {model_name!r}")
    controls = {
        "length": widgets.IntSlider(value=length, min=lengths[0], max=lengths[1],
                                    description="length", continuous_update=False),
        "model_name": widgets.Dropdown(options=names, value=model_name or names[0],
                                       description="model"),
        "index": widgets.IntSlider(value=0, min=0, max=examples - 1, description="example",
                                   continuous_update=False),
    }
    decoded: dict = {}  # (model name, length) -> one frame per example

    def compute(length, model_name, index):
        if (model_name, length) not in decoded:
            pairs = [example("reversal", i, length) for i in range(examples)]
            outputs = decode_examples(models[model_name], "reversal", pairs)
            decoded[model_name, length] = [_frame(model_name, *pair, *out)
                                           for pair, out in zip(pairs, outputs, strict=True)]
        return decoded[model_name, length][index]

    return LiveAttentionWidget(compute, controls, DecodeView(max_len=lengths[1]),
                               title="Reverse a digit sequence: where do the errors start?")
