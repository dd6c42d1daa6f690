"""Notebook 01's widget: a trained sequence-to-sequence model decodes one example.

:func:`decode_frame` / :func:`bottleneck_widget`: pick a sequence length, a model and an example;
the source, the target and the model's output are drawn as token strips with the errors
highlighted, and below them the model's cross-attention (for a model with attention) with the
entropy of every decoder step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.colors import ListedColormap

from ..entropy import attention_entropy
from ..lessons.rnn_bottleneck import Seq2Seq, predict
from ..lessons.tasks import collate, example, get_task
from .core import AttentionFrame, AttentionPanel, BlitFigure, LiveAttentionWidget

__all__ = [
    "DecodeFrame",
    "DecodeView",
    "decode_frame",
    "bottleneck_widget",
]

# Token-strip cell colours: empty, plain token, correct output, wrong output (Okabe-Ito orange).
STRIP_COLORS = ["#ffffff", "#e8eef6", "#cde3f5", "#e69f00"]
EMPTY, PLAIN, RIGHT, WRONG = range(4)


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
    extra: dict = field(default_factory=dict)


def _decode_one(model: Seq2Seq, task, source, target):
    batch = collate(task, [(source, target)])
    tokens, weights = predict(model, batch)
    output = [task.tgt_vocab.itos[i] for i in tokens[0].tolist()]
    return output, (None if weights is None else weights[0])


def _check_model(model) -> None:
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"model must be a seq2seq.Seq2Seq, got {type(model).__name__}")


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
    _check_model(model)
    task = get_task(task)
    source, target = example(task, index, length)
    output, weights = _decode_one(model, task, source, target)
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
    return DecodeFrame(weights=weights, query_labels=output, key_labels=source, mask=mask,
                       readouts=readouts, source=source, target=target, output=output,
                       correct=correct, has_attention=mask is None,
                       title=f"{model_name}: {len(source)} tokens")


class DecodeView:
    """Token strips (source, target, output with errors in orange) above an attention panel."""

    def __init__(self, max_len: int = 24, figsize: tuple[float, float] = (10.0, 7.0)):
        self.max_len = max_len
        self.blit = BlitFigure(figsize)
        figure = self.blit.figure
        grid = figure.add_gridspec(2, 1, height_ratios=[1, 4.2], left=0.1, right=0.97,
                                   bottom=0.1, top=0.95, hspace=0.3)
        self.ax_strip = figure.add_subplot(grid[0])
        self.strip = self.ax_strip.imshow(
            np.zeros((3, max_len)), cmap=ListedColormap(STRIP_COLORS), vmin=-0.5, vmax=3.5,
            aspect="auto", interpolation="nearest")
        self.ax_strip.set_yticks(range(3), ["source", "target", "output"])
        self.ax_strip.set_xticks(range(max_len), [str(i) for i in range(max_len)], fontsize=7)
        self.ax_strip.set_xlabel("position (output errors in orange)", fontsize=9)
        self.ax_strip.tick_params(length=0)
        self.texts = [[self.ax_strip.text(j, i, "", ha="center", va="center", fontsize=9)
                       for j in range(max_len)] for i in range(3)]
        self.strip_title = self.ax_strip.set_title(" ", fontsize=11)
        self.panel = AttentionPanel(self.blit, grid[1], title="cross-attention: output step x source")
        self.notice = self.panel.ax_map.text(
            0.5, 0.5, "no attention:\nevery step reads the same context vector",
            transform=self.panel.ax_map.transAxes, ha="center", va="center", fontsize=11,
            bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": "#888888"})
        self.blit.animate(self.strip, self.strip_title, self.notice,
                          *[t for row in self.texts for t in row])

    @property
    def figure(self):
        return self.blit.figure

    def update(self, frame: DecodeFrame) -> bytes:
        n = len(frame.source)
        if n > self.max_len or len(frame.output) > self.max_len:
            raise ValueError(f"the view holds at most {self.max_len} tokens, got {n}")
        cells = np.full((3, self.max_len), EMPTY)
        rows = [frame.source, frame.target, frame.output]
        for i, tokens in enumerate(rows):
            cells[i, :len(tokens)] = PLAIN
            for j in range(self.max_len):
                self.texts[i][j].set_text(tokens[j] if j < len(tokens) else "")
        cells[2, :len(frame.correct)] = np.where(frame.correct, RIGHT, WRONG)
        self.strip.set_data(cells)
        self.strip_title.set_text(frame.title)
        self.notice.set_visible(not frame.has_attention)
        self.panel.set_frame(frame)
        return self.blit.render()


def bottleneck_widget(models: Mapping[str, Seq2Seq], *, lengths: tuple[int, int] = (4, 24),
                      examples: int = 20, length: int = 20) -> LiveAttentionWidget:
    """Notebook 01's widget: sequence length slider, model dropdown and example picker."""
    for model in models.values():
        _check_model(model)
    names = list(models)
    controls = {
        "length": widgets.IntSlider(value=length, min=lengths[0], max=lengths[1],
                                    description="length", continuous_update=False),
        "model_name": widgets.Dropdown(options=names, value=names[0], description="model"),
        "index": widgets.IntSlider(value=0, min=0, max=examples - 1, description="example",
                                   continuous_update=False),
    }

    def compute(length, model_name, index):
        return decode_frame(length, model_name, index, models)

    return LiveAttentionWidget(compute, controls, DecodeView(max_len=lengths[1]),
                               title="Reverse a digit sequence: where do the errors start?")
