"""Notebook 01's widget: one reversal's token strips (errors in orange) above its attention weights,
or each output's gradient share over the inputs, with their entropy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.transforms import blended_transform_factory, offset_copy

from ..entropy import attention_entropy
from ..lessons.rnn_bottleneck import Seq2Seq, input_gradient_norms, predict
from ..lessons.tasks import collate, example, get_task
from ..training import single_thread
from .core import AttentionFrame, AttentionPanel, BlitView, LiveAttentionWidget
from .panels import CellPainter, TextSprites

WEIGHTS, SHARES = "attention weights", "gradient share"   # the menu 'show'
#: each mode's map title, entropy title and entropy axis label
TEXTS = {WEIGHTS: ("attention weights: output step t x input position j", "entropy per output step",
                   "nats (dashes: ln n, uniform weights)"),
         SHARES: ("gradient share |d log p(y_t) / d x_j|, each row sums to 1",
                  "entropy of each row's share", "nats (dashes: ln n, equal shares)")}
SHARE_ENTROPY = "mean gradient-share entropy (nats)"   # the readout in place of the weights' entropy
SCALES = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)   # a share map's colour scale: 0 .. the first >= its max
SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
PLAIN, RIGHT, WRONG = range(3)      # strip cells: a token, a right output, a wrong one (orange)
LENGTHS, EXAMPLES = (4, 24), 20     # the length slider's range; examples per length
NO_WEIGHTS = ("No attention, so no weights to draw.", "Every output step t reads the same",
              "context vector c. Input j reaches it only", "through the encoder's recurrence,",
              "over t or n-1-t steps: set show to", "'gradient share' to see that path.")


@dataclass
class DecodeFrame(AttentionFrame):
    """A decoded example, its map in mode ``show``; without attention every weight is masked."""

    source: Sequence[str] = ()
    target: Sequence[str] = ()
    output: Sequence[str] = ()
    correct: Sequence[bool] = ()
    title: str = ""
    show: str = WEIGHTS

    has_attention = property(lambda self: self.mask is None)


def draw_seq2seq() -> None:
    """Section 2's diagram: encoder, context vector c and decoder for n = 4, and attention at t = 2."""
    fig, ax = plt.subplots(figsize=(9, 3.2), layout="none")
    h, s, c = [(j, 0) for j in range(4)], [(4.5 + t, 2) for t in range(5)], (4.5, 0)   # s: s_-1 .. s_3
    boxes = [(*c, "c", "#f4cccc"), (*s[0], "s₋₁", "#fde0b6")]    # (x, y, text, fill)
    arrows = [*zip(h[:-1], h[1:], strict=True), *zip(h[1:], h[:-1], strict=True),
              *zip(s[:-1], s[1:], strict=True), (h[3], c), (c, s[0])]
    for j, sub in enumerate("₀₁₂₃"):
        boxes += [(*h[j], "h" + sub, "#cde3f5"), (j, -1.1, "x" + sub, "none"),
                  (*s[j + 1], "s" + sub, "#fde0b6"), (j + 5.5, 3.2, "y" + sub, "none")]
        arrows += [((j, -1.1), h[j]), (s[j + 1], (j + 5.5, 3.2))]
    for x, y, text, fill in boxes:
        ax.text(x, y, text, ha="center", va="center", fontsize=12,
                bbox={"boxstyle": "round", "fc": fill, "ec": "black" if fill != "none" else "none"})
    for start, end, bend in [*((a, b, 0) for a, b in arrows), (h[0], c, 0.25)]:   # bent: h_0 to c
        ax.annotate("", end, start, arrowprops={"arrowstyle": "-|>", "shrinkA": 9, "shrinkB": 9,
                                                "connectionstyle": f"arc3,rad={bend}"})
    ax.plot([range(4), [7] * 4], [[0.3] * 4, [1.3] * 4], color="#d55e00", alpha=0.6)   # h_j, then up
    ax.plot([7, 7, 7.5], [1.3, 2.5, 2.5], color="#d55e00", linewidth=2.5)   # to t = 2's dot
    ax.plot([4.8, 9.2, 9.2, 8.5, 7.5, 6.5, 5.5], [0, 0] + [2.5] * 5, "o-", c="#c00",
            markevery=[3, 4, 5, 6])
    ax.text(9.5, 1.2, "without attention: cₜ = c joins\nevery readout sₜ → yₜ (red dots)", color="#c00")
    ax.text(9.5, -0.6, "with attention (orange, t = 2):\ncₜ = Σ aₜⱼ hⱼ joins the readout",
            color="#d55e00")
    ax.set(xlim=(-0.5, 16), ylim=(-1.5, 3.5), xticks=[], yticks=[], frame_on=False,
           title="encoder (bottom), context vector c, decoder (top) from s₋₁ = tanh(c W_b)")
    ax.text(5, -0.3, "c: the forward half of h₃ and\nthe backward half of h₀", va="top", fontsize=8)
    ax.text(9.5, 2.9, "each sₜ also reads yₜ₋₁ (not drawn)", fontsize=8, color="grey")
    plt.show()


def plot_runs(ax, runs: Mapping, title: str, lengths: Sequence[int]) -> None:
    """``runs`` ``{label: (a study's record {seed: row}, color)}``: one band per label, min to max
    over its seeds, of token accuracy against input length; the legend gives the seeds' mean at the
    longest length."""
    for label, (rows, color) in runs.items():
        acc = torch.tensor([[row["accuracy"][str(n)] for row in rows.values()] for n in lengths])
        ax.fill_between(lengths, acc.min(1).values, acc.max(1).values, color=color, alpha=0.35,
                        linewidth=1.5, edgecolor=color, label=f"{label}: {acc[-1].mean():.2f}")
    ax.axhline(0.1, color="grey", linestyle=":", label="chance (1 digit in 10)")
    ax.set(xlabel="input length n (tokens)", ylabel="greedy token accuracy", ylim=(0, 1.02),
           xticks=range(4, lengths[-1] + 1, 4), title=title)
    ax.legend(fontsize=8, loc="lower left", title=f"name: mean of the seeds at n = {lengths[-1]}",
              title_fontsize=8)


def check_model(model) -> None:
    """A TypeError unless ``model`` is a ``Seq2Seq`` (notebooks 01 and 06)."""
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"model must be an rnn_bottleneck.Seq2Seq, got {type(model).__name__}")


def gradient_frame(model: Seq2Seq, frame: DecodeFrame) -> DecodeFrame:
    r"""``frame`` showing gradient shares (any model): row ``t`` is ``input_gradient_norms``'
    :math:`\lVert \partial \log p(y_t) / \partial x_j \rVert` over ``j``, divided by its sum."""
    check_model(model)
    batch = collate("reversal", [(list(frame.source), list(frame.target))])
    with torch.enable_grad():                         # the widget may call this under no_grad
        norms = input_gradient_norms(model, batch)[0]                   # (n_t, n): [t, j]
    shares = norms / norms.sum(-1, keepdim=True)
    readouts = {k: v for k, v in frame.readouts.items() if k != "mean entropy (nats)"}
    readouts[SHARE_ENTROPY] = attention_entropy(shares.double()).mean().item()
    return replace(frame, weights=shares, mask=None, show=SHARES, readouts=readouts)


def colour_scale(frame: DecodeFrame) -> float:
    """The top of ``frame``'s colour scale: 1 for weights; for shares, the first of ``SCALES`` at or
    above the largest (nothing is clipped)."""
    if frame.show != SHARES:
        return 1.0
    top = float(torch.as_tensor(frame.weights).max())
    return next(scale for scale in SCALES if scale >= top - 1e-6)


def _positioned(tokens) -> list[str]:
    """``9₀ 5₁ 9₂``: digits repeat, positions do not."""
    return [f"{token}{str(i).translate(SUBSCRIPTS)}" for i, token in enumerate(tokens)]


def decode_examples(model: Seq2Seq, task, pairs):
    """Greedy-decode ``(source, target)`` pairs, padded into one batch: ``[(tokens, weights)]``."""
    task = get_task(task)
    with torch.inference_mode():
        tokens, weights = predict(model, collate(task, pairs))
    return [([task.tgt_vocab.itos[i] for i in tokens[b, :len(t)].tolist()],
             None if weights is None else weights[b, :len(t), :len(s)])
            for b, (s, t) in enumerate(pairs)]


def decode_frames(models: Mapping[str, Seq2Seq], model_name: str, lengths) -> dict:
    """``{n: frames}``: reversal examples ``0..EXAMPLES-1`` of each of ``lengths`` greedily decoded
    by ``models[model_name]`` in one padded batch, with the token accuracy, errors and mean entropy."""
    check_model(models[model_name])
    pairs = [example("reversal", i, n) for n in lengths for i in range(EXAMPLES)]
    decoded = decode_examples(models[model_name], "reversal", pairs)
    frames = {n: [] for n in lengths}
    for (source, target), (output, weights) in zip(pairs, decoded, strict=True):
        n, correct = len(source), [o == t for o, t in zip(output, target, strict=True)]
        no_weights = torch.zeros(n, n, dtype=torch.bool)     # every weight masked
        errors = n - sum(correct)
        readouts = {"model": model_name, "token accuracy": sum(correct) / n,
                    "errors": f"{errors} of {n}", "mean entropy (nats)": "none (no weights)"
                    if weights is None else attention_entropy(weights.double()).mean().item()}
        frames[n].append(DecodeFrame(
            weights=no_weights.float() if weights is None else weights,
            query_labels=_positioned(output), key_labels=_positioned(source),
            mask=no_weights if weights is None else None, readouts=readouts, source=source,
            target=target, output=output, correct=correct,
            title=f"{model_name}: {n} tokens, {errors} wrong output tokens"))
    return frames


class DecodeView(BlitView):
    """Token strips (source, target, output) above an attention panel laid out for the longest
    example; a shorter one zooms all three (new axis limits only: every move blits)."""

    def __init__(self):
        super().__init__((8.4, 6.9))
        max_len = LENGTHS[1]
        figure = self.figure
        grid = figure.add_gridspec(2, 1, height_ratios=[1, 5.4], left=0.1, right=0.97,
                                   bottom=0.01, top=0.95, hspace=0.2)
        self.ax_strip = ax = figure.add_subplot(grid[0])
        ax.set(xlim=(-0.5, max_len - 0.5), ylim=(2.5, -0.5), xticks=[])   # positions: sprites
        ax.set_yticks(range(3), ["source", "target", "output"], fontsize=9)
        ax.set_xlabel("position (output errors in orange)", fontsize=9, labelpad=13)
        ax.tick_params(length=0)
        self.strip = CellPainter(self.blit, ax, ListedColormap(["#e8eef6", "#cde3f5", "#e69f00"]),
                                 Normalize(-0.5, 2.5))
        self.tokens = TextSprites(self.blit, ax.transData, size=9)
        self.positions = TextSprites(self.blit, offset_copy(blended_transform_factory(
            ax.transData, ax.transAxes), fig=figure, y=-3, units="points"), size=8, va="top")
        self.strip_title = TextSprites(self.blit, offset_copy(
            ax.transAxes, fig=figure, y=4, units="points"), size=10, va="bottom")
        title, entropy_title, entropy_xlabel = TEXTS[WEIGHTS]   # notebook 01's symbols: no keys yet
        self.panel = panel = AttentionPanel(
            self.blit, grid[1], max_shape=(max_len, max_len), title=title, entropy_title=entropy_title,
            entropy_xlabel=entropy_xlabel, axis_names=("input position j", "output step t"))
        self.scale = panel.scale
        self.notice = TextSprites(self.blit, panel.ax_map.transAxes, size=10)
        self.notice.set(NO_WEIGHTS, [(0.5, 0.62 - 0.08 * i) for i in range(len(NO_WEIGHTS))])
        self.no_entropy = TextSprites(self.blit, panel.ax_entropy.transAxes, size=9)
        self.no_entropy.set(["no weights,", "so no", "entropy"], [(0.5, 0.56), (0.5, 0.5), (0.5, 0.44)])

    def _zoom(self, n: int) -> None:
        for set_xlim in (self.ax_strip.set_xlim, self.panel.ax_map.set_xlim):
            set_xlim(-0.5, n - 0.5)
        for ax in (self.panel.ax_map, self.panel.ax_entropy):
            ax.set_ylim(n - 0.5, -0.5)
        self.positions.set([str(i) for i in range(n)], [(i, 0.0) for i in range(n)])
        self.panel.entropy.fit_width()

    def draw(self, frame: DecodeFrame) -> None:
        n, panel = len(frame.source), self.panel          # = len(target) = len(output): a reversal
        self.tokens.set([*frame.source, *frame.target, *frame.output],
                        [(j, i) for i in range(3) for j in range(n)])
        self.strip.set(np.stack([np.full(n, PLAIN), np.full(n, PLAIN),
                                 np.where(frame.correct, RIGHT, WRONG)]))
        self.strip_title.set([frame.title], [(0.5, 1.0)])
        self.notice.visible = self.no_entropy.visible = not frame.has_attention
        title, entropy_title, entropy_label = TEXTS[frame.show]
        panel.set_title(title)                       # a new title: one full redraw, only on 'show'
        if panel.ax_entropy.get_title() != entropy_title:
            panel.ax_entropy.title.set_text(entropy_title)
            panel.ax_entropy.xaxis.label.set_text(entropy_label)
            self.blit.invalidate()
        top = colour_scale(frame)         # shares: a scale per map; a new one redraws the colour bar
        if top != self.scale.norm.vmax:
            panel.cells.norm = Normalize(0.0, top, clip=True)
            self.scale.set_clim(0.0, top)
            self.blit.invalidate()
        panel.set_frame(frame)               # may lay the panel out again, for the longest example
        if not frame.has_attention:          # blanked by data, not hidden: the move still blits
            panel.entropy.ceiling.set_data([], [])
        if panel.ax_map.get_xlim() != (-0.5, n - 0.5):    # a new length, or a new layout
            self._zoom(n)

    def warm(self, frames: Sequence[DecodeFrame]) -> None:
        """Lay out for the widest labels among ``frames`` and cache every text they show, so that
        no move lays the figure out again or renders a glyph: each move only blits."""
        rows, columns = self.panel.ylabels, self.panel.xlabels
        self.draw(max(frames, key=lambda f: rows.widest(f.query_labels)))
        self.draw(max(frames, key=lambda f: columns.widest(f.key_labels)))
        rows.sprites.warm({t for f in frames for t in f.query_labels})
        columns.sprites.warm({t for f in frames for t in f.key_labels})
        self.tokens.warm({t for f in frames for t in (*f.source, *f.target, *f.output)})
        self.strip_title.warm({f.title for f in frames})


def bottleneck_widget(models: Mapping[str, Seq2Seq], *, length: int = 20,
                      model_name: str | None = None) -> LiveAttentionWidget:
    """Sliders for the length and the example, a menu of ``models`` (opens on the first, or
    ``model_name``) and a menu ``show``: the attention weights, or :func:`gradient_frame`'s shares
    (any model). Every length is decoded here, once; a share map when first shown, then kept."""
    names = list(models)     # decode_frames checks each model
    if model_name is not None and model_name not in names:
        raise ValueError(f"model_name must be one of {names}, got {model_name!r}")
    controls = {
        "length": widgets.IntSlider(value=length, min=LENGTHS[0], max=LENGTHS[1],
                                    description="length", continuous_update=False),
        "model_name": widgets.Dropdown(options=names, value=model_name or names[0],
                                       description="model"),
        "index": widgets.IntSlider(value=0, min=0, max=EXAMPLES - 1, description="index",
                                   continuous_update=False),
        "show": widgets.Dropdown(options=[WEIGHTS, SHARES], value=WEIGHTS, description="show"),
    }
    with single_thread():   # every (model, length) decoded now, one batch per model
        decoded = {(name, n): frames for name in names for n, frames in
                   decode_frames(models, name, range(LENGTHS[0], LENGTHS[1] + 1)).items()}
    shares = {}   # {(model_name, length, index): frame}, filled as they are first shown

    def compute(length, model_name, index, show):
        key = model_name, length, index
        if show == WEIGHTS:
            return decoded[model_name, length][index]
        if key not in shares:
            with single_thread():
                shares[key] = gradient_frame(models[model_name], decoded[model_name, length][index])
        return shares[key]

    view = DecodeView()
    view.warm([frame for frames in decoded.values() for frame in frames])
    return LiveAttentionWidget(compute, controls, view,
                               title="Reverse a digit sequence: where do the errors start, and "
                                     "where does each output step look?")
