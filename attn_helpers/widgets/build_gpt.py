"""Notebook 10's widgets: :func:`gpt_widget`, one head of a trained GPT on any prompt, heads zeroed
or not (each new prompt or set runs the model once, :func:`run_prompt`; a move redraws), and
:class:`Sampler`. Layers and heads count from 1. Also the notebook's loss curves."""

from __future__ import annotations

import base64
import html
import io
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import IdentityTransform

from .._checks import require_int_in
from ..entropy import attention_entropy
from ..lessons import build_gpt as bg
from ..masks import causal_mask
from ..training import single_thread
from .core import AttentionFrame, BlitView, LiveAttentionWidget
from .panels import TITLE_PT, AttentionPanel, EntropyBars, TextSprites

SHOWN = {" ": "␣", "\n": "⏎", "\t": "⇥"}        # space, newline and tab made visible on the axes


@dataclass(frozen=True)
class PromptRun:
    """One prompt through the model, heads ``zeroed``: ``weights (L, h, n, n)``, entropy ``(L, h)``,
    the mean ceiling ln(i + 1), head scores, the loss on the prompt and a greedy continuation."""

    text: str
    labels: list
    weights: torch.Tensor
    head_entropy: torch.Tensor
    ceiling: float
    scores: dict
    truncated: bool
    zeroed: tuple
    loss: float
    continuation: str


@torch.no_grad()
def head_weights(model: bg.GPT, ids: torch.Tensor) -> torch.Tensor:
    """``(L, h, b, n, n)``: every head's attention weights on ``ids (b, n)``."""
    model.keep_weights(True)
    try:
        model(ids)
        return torch.stack([b.attn.weights for b in model.blocks]).transpose(1, 2)
    finally:
        model.keep_weights(False)


def parse_heads(text: str, cfg: bg.GPTConfig) -> tuple:
    """``"L1H2 L1H3"`` -> ``((1, 2), (1, 3))``: the heads to zero, (layer, head) from 1."""
    if not isinstance(text, str):
        raise TypeError(f"zero must be a str such as 'L1H2 L1H3', got {type(text).__name__}")
    heads = set()
    for word in text.replace(",", " ").split():
        if not (match := re.fullmatch(r"L(\d+)H(\d+)", word, re.IGNORECASE)):
            raise ValueError(f"zero: write each head as L<layer>H<head>, e.g. 'L1H2 L1H3'; got {word!r}")
        layer, head = int(match[1]), int(match[2])
        require_int_in("zero's layer", layer, 1, cfg.num_layers)
        heads.add((layer, require_int_in("zero's head", head, 1, cfg.num_heads)))
    return tuple(sorted(heads))


@contextmanager
def ablated(model: bg.GPT, heads=()):
    """Inside it, heads ``(layer, head)`` output zeros: their slice of the merged heads, before W_O.
    With a dict ``{(layer, head): value}``, each slice is set to its ``value`` (a ``(d_h,)`` mean)."""
    d_h = model.cfg.d_model // model.cfg.num_heads
    values = heads if isinstance(heads, dict) else dict.fromkeys(heads, 0.0)

    def hook(head, value):                           # on the merged heads (b, n, d)
        cols = torch.arange((head - 1) * d_h, head * d_h)
        return lambda _module, args: (args[0].index_copy(-1, cols, torch.as_tensor(
            value, dtype=args[0].dtype).expand(*args[0].shape[:-1], d_h)),)

    handles = [model.blocks[layer - 1].attn.out.register_forward_pre_hook(hook(head, value))
               for (layer, head), value in values.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def run_prompt(model: bg.GPT, corpus: bg.Corpus, text: str, heads=()) -> PromptRun:
    """Run ``text`` (its last ``context`` characters) through ``model`` once, ``heads`` zeroed; then
    32 greedy characters after the last ``context // 2`` (the same seed for every run)."""
    if not isinstance(text, str):
        raise TypeError(f"the prompt must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("the prompt is empty: type a few characters. The last picture stays.")
    shown = text[-model.cfg.context:]
    ids = corpus.encode(shown)[None]                                 # (1, n)
    with ablated(model, heads):
        weights = head_weights(model, ids)[:, :, 0]                  # (L, h, n, n)
        loss = bg.next_token_loss(model, ids).item() if ids.shape[1] > 1 else float("nan")
        start = ids[:, -(model.cfg.context // 2):]
        tokens = bg.generate(model, start, 32, top_k=1, generator=torch.Generator().manual_seed(0))
    n = weights.shape[-1]
    entropy = attention_entropy(weights.double()).mean(-1)           # (L, h)
    ceiling = float(torch.log(torch.arange(1, n + 1, dtype=torch.float64)).mean())
    continuation = corpus.decode(tokens[0, start.shape[1]:]).replace("\n", SHOWN["\n"])
    return PromptRun(shown, [SHOWN.get(c, c) for c in shown], weights, entropy, ceiling,
                     bg.head_scores(weights[:, :, None], shown), len(text) > len(shown),
                     tuple(heads), loss, continuation)


def plot_curves(curves: dict, title: str, *, ends: dict | None = None,
                target: float | None = None, note: str | None = None,
                target_label: str = "target") -> None:
    """``curves {label: [(step, training, held out), ...]}``: held out solid, training dashed, each
    curve its own hollow marker; ``ends {label: (step, losses)}`` diamonds; ``target`` dotted."""
    _, ax = plt.subplots(figsize=(7, 3.6))
    for i, (label, curve) in enumerate(curves.items()):   # curve i takes colour Ci
        steps, training, held_out = zip(*curve, strict=True)
        style = {"marker": "os^vP"[i % 5], "markersize": 7 - i % 5, "markerfacecolor": "none"}
        (line,) = ax.plot(steps, held_out, "-", label=label, **style)
        if None not in training:
            ax.plot(steps, training, "--", color=line.get_color(), alpha=0.8, **style)
    for style, what in (("-", "held out"), ("--", "training")):   # each line style, once
        ax.plot([], [], style, color="black", label=what)
    for label, (step, losses) in (ends or {}).items():
        for i, loss in enumerate(losses):      # 2% of the step apart: none hides another
            ax.plot(step * (1 + 0.02 * (i - (len(losses) - 1) / 2)), loss, "D", markersize=6,
                    color=f"C{i}", markeredgecolor="black", label=None if i else label)
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle=":")
        ax.text(0.03, target, f"{target_label} {target}", va="top", transform=ax.get_yaxis_transform())
    if note:
        ax.text(0.02, 0.12, note, transform=ax.transAxes, fontsize=8)
    ax.set(xlabel="step", ylabel="loss (nats per character)", title=title)
    ax.legend(fontsize=8, ncol=2)
    plt.show()


@dataclass
class GPTFrame(AttentionFrame):
    """One head's frame, its layer's mean entropy per head ``(h,)`` and the zeroed heads ("L1H2")."""

    layer_entropy: torch.Tensor | None = None
    layer_ceiling: float = 0.0
    head: int = 0
    layer: int = 0
    zeroed: str = ""


def gpt_frame(run: PromptRun, layer: int, head: int, intact: PromptRun | None = None) -> GPTFrame:
    """The frame of head ``head`` of layer ``layer`` (both 1-based) on ``run``; ``intact``: the
    same prompt with no head zeroed, to compare with."""
    require_int_in("layer", layer, 1, run.head_entropy.shape[0])
    require_int_in("head", head, 1, run.head_entropy.shape[1])
    l, i, n = layer - 1, head - 1, len(run.labels)
    zero = ", ".join(f"L{a}H{b}" for a, b in run.zeroed)
    readouts = {"characters n": n, "head": f"layer {layer}, head {head}",
                "mean entropy (nats)": f"{run.head_entropy[l, i]:.2f}",
                "mean ceiling ln(visible keys)": f"{run.ceiling:.2f}",
                **{f"weight on {name}": f"{grid[l, i]:.2f}" for name, grid in run.scores.items()
                   if isinstance(grid, torch.Tensor)},
                "heads zeroed": zero or "none",
                "loss on the prompt (nats per character)": f"{run.loss:.2f}",
                "greedy continuation": run.continuation}
    if intact is not None:
        readouts["loss on the prompt (nats per character)"] += (
            f", intact {intact.loss:.2f} ({run.loss - intact.loss:+.2f})")
        readouts["greedy continuation, intact"] = intact.continuation
    if run.truncated:
        readouts["note"] = f"only the last {n} characters fit the model's context"
    return GPTFrame(run.weights[l, i], run.labels, run.labels, mask=causal_mask(n),
                    readouts=readouts, layer_entropy=run.head_entropy[l],
                    layer_ceiling=run.ceiling, head=i, layer=l, zeroed=zero)


class GPTView(BlitView):
    """The head's heatmap and entropy per query (left), every head of the layer (right); the
    title, new at every move, is pasted text."""

    def __init__(self, num_heads: int, context: int):
        super().__init__((11.0, 7.0))
        grid = self.figure.add_gridspec(1, 2, width_ratios=[4.2, 1.0], left=0.01, right=0.98,
                                        bottom=0.1, top=0.9, wspace=0.25)
        self.panel = AttentionPanel(self.blit, grid[0], title=" ")   # room for the pasted title
        self.heads = EntropyBars(self.blit, self.figure.add_subplot(grid[1]),
                                 title="this layer's heads:\nmean entropy",
                                 xlabel="nats (dashes: mean\nln visible keys)",
                                 labels=[f"head {j + 1}" for j in range(num_heads)])
        self.heads.layout(num_heads, float(torch.log(torch.tensor(float(context)))))
        self.title = TextSprites(self.blit, IdentityTransform(), size=TITLE_PT, va="bottom")
        self.title_xy = (0.0, 0.0)
        self.blit.on_layout(self._place_title)

    def _place_title(self) -> None:
        title = self.panel.ax_map.title
        self.title_xy = tuple(title.get_transform().transform(title.get_position()))
        self.title.set(self.title.texts, [self.title_xy] * len(self.title.texts))

    def draw(self, frame: GPTFrame) -> None:
        self.panel.set_frame(frame)
        zeroed = f" ({frame.zeroed} zeroed)" if frame.zeroed else ""
        self.title.set([f"layer {frame.layer + 1}, head {frame.head + 1}: attention weights{zeroed}"],
                       [self.title_xy])
        h = len(frame.layer_entropy)
        self.heads.set(frame.layer_entropy, [frame.layer_ceiling] * h, highlight=frame.head)


def gpt_widget(model: bg.GPT, corpus: bg.Corpus | None = None,
               prompt: str = "The for statement loops over", *, layer: int = 1,
               head: int = 1) -> LiveAttentionWidget:
    """The widget on a trained GPT, opened on ``layer`` and ``head`` (counted from 1); heads typed
    into ``zero`` (``L1H2 L1H3``) are zeroed."""
    corpus, cfg = bg.load_corpus() if corpus is None else corpus, model.cfg
    require_int_in("layer", layer, 1, cfg.num_layers)
    require_int_in("head", head, 1, cfg.num_heads)
    run = lru_cache(maxsize=16)(lambda text, heads: run_prompt(model, corpus, text, heads))

    def compute(prompt, layer, head, zero):
        heads = parse_heads(zero, cfg)
        return gpt_frame(run(prompt, heads), layer, head, run(prompt, ()) if heads else None)

    controls = {
        "prompt": widgets.Text(prompt, description="prompt", continuous_update=False,
                               layout=widgets.Layout(width="640px")),
        "layer": widgets.IntSlider(layer, min=1, max=cfg.num_layers, description="layer"),
        "head": widgets.IntSlider(head, min=1, max=cfg.num_heads, description="head"),
        "zero": widgets.Text("", description="zero heads", placeholder="e.g. L1H2 L1H3",
                             continuous_update=False),
    }
    return LiveAttentionWidget(compute, controls, GPTView(cfg.num_heads, cfg.context),
                               title="the stored GPT (study seed 0): any prompt, any layer and head, "
                                     "heads zeroed or not")


class Sampler:
    """Temperature and top-k over three samples drawn by ``generate`` (the notebook's)."""

    def __init__(self, model: bg.GPT, corpus: bg.Corpus, generate, prompt: str = "The "):
        self.model, self.corpus, self.generate, self.samples = model, corpus, generate, []
        self.controls = {
            "prompt": widgets.Text(prompt, description="prompt", continuous_update=False),
            "temperature": widgets.FloatSlider(1.0, min=0.1, max=2.0, step=0.1,
                                               description="temperature"),
            "top_k": widgets.IntSlider(0, min=0, max=20, description="top-k (0: off)"),
        }
        self.output = widgets.HTML()
        for control in self.controls.values():
            control.observe(lambda _change: self.refresh(), names="value")
        self.ui = widgets.VBox([widgets.HBox(list(self.controls.values()),
                                             layout=widgets.Layout(flex_flow="row wrap")),
                                self.output])
        self.refresh()

    def set(self, **values) -> list[str]:
        for name, value in values.items():
            self.controls[name].value = value
        return self.samples

    def refresh(self) -> None:
        v = {name: c.value for name, c in self.controls.items()}
        try:
            prompt = self.corpus.encode(v["prompt"] or "\n")[None, -(self.model.cfg.context // 2):]
            with single_thread():    # tiny steps: a second thread only waits for its core
                tokens = self.generate(self.model, prompt.repeat(3, 1),
                                       self.model.cfg.context - prompt.shape[1], v["temperature"],
                                       v["top_k"] or None, True, torch.Generator().manual_seed(0))
            self.samples = [self.corpus.decode(row) for row in tokens]
            self.output.value = "".join(f"<pre style='margin:2px'>{html.escape(s)}</pre>"
                                        for s in self.samples)
        except Exception as exc:      # shown in the widget, never swallowed
            self.output.value = (f"<pre style='color:#b00020'>{html.escape(type(exc).__name__)}: "
                                 f"{html.escape(str(exc))}</pre>")

    def _repr_mimebundle_(self, **kwargs):
        """The widget, plus the samples as a picture and as text for places with no kernel."""
        bundle = self.ui._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        v = {name: c.value for name, c in self.controls.items()}
        lines = [f"temperature {v['temperature']:.1f}, top-k {v['top_k'] or 'off'} (a line break "
                 "shows as \\n):", *(s.replace("\n", "\\n") for s in self.samples)]
        figure = Figure(figsize=(8.0, 0.1 + 0.2 * len(lines)), dpi=80)
        figure.text(0.01, 0.97, "\n".join(lines), va="top", family="monospace", fontsize=9,
                    linespacing=1.6)
        png = io.BytesIO()
        FigureCanvasAgg(figure).print_png(png)
        data["image/png"] = base64.b64encode(png.getvalue()).decode("ascii")
        data["text/plain"] = "\n".join(["Samples (static here; run the notebook to move the "
                                        "controls):", *lines])
        return bundle
