"""Notebook 09's widget: one head of all-MiniLM-L6-v2 on a sentence, and the similarity to a second
sentence with that head off. A sentence runs once, a move redraws, an ablation runs once per layer."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import ipywidgets as widgets
import torch
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.patches import Rectangle
from mpl_toolkits.axes_grid1 import make_axes_locatable
from mpl_toolkits.axes_grid1.axes_size import Fixed

from .._checks import require_int_in
from ..entropy import max_entropy
from ..lessons import real_model as rm
from ..plots import to_numpy, weights_cmap
from ..pretrained import Encoder, load_encoder, mean_pool
from .core import AttentionFrame, BlitView, LiveAttentionWidget
from .panels import HIGHLIGHT_COLOR, AttentionPanel, CellPainter, TextSprites

CACHE_SIZE = 16  # sentence runs kept (a 512-piece sentence holds 75 MB of weights)


class SentenceError(ValueError):
    """A text the widget cannot show (empty, only spaces, no word pieces)."""


def token_label(token: str) -> str:
    """The token as the plot can draw it: characters the plot font lacks become ``?``."""
    font = get_font(findfont(FontProperties()))                 # both cached by matplotlib
    return "".join(c if font.get_char_index(ord(c)) else "?" for c in token)


@dataclass(frozen=True)
class SentenceRun:
    """One sentence through the model: ``n <= 512`` word pieces' ``labels``, ``weights (L, h, n, n)``,
    ``(L, h)`` head scores, ``embedding (d,)`` as ``encode``, ``layer_inputs (L, 1, n_e, d)``, notes."""

    labels: list
    weights: torch.Tensor
    entropy: torch.Tensor
    fraction: torch.Tensor
    cls: torch.Tensor
    previous: torch.Tensor
    following: torch.Tensor
    embedding: torch.Tensor
    layer_inputs: torch.Tensor
    notes: str


def _layers(enc: Encoder, ids: torch.Tensor):
    """``ids (1, n)`` -> ``hidden (1, n, d), weights (L, 1, h, n, n), layer inputs (L, 1, n, d)``."""
    x, inputs, weights = enc.embeddings(ids), [], []
    for layer in enc.layers:
        inputs.append(x)
        x, w = layer(x, None)
        weights.append(w)
    return x, torch.stack(weights), torch.stack(inputs)


@torch.no_grad()
def run_sentence(enc: Encoder, text: str, *, name: str = "sentence") -> SentenceRun:
    """Tokenise ``text`` (at most 512 word pieces) and run the model once."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    if not text.strip():
        raise SentenceError(f"{name} is empty: type a sentence (or pick an example). "
                            "The last picture stays on show.")
    batch = enc.tokenize([text])
    tokens, ids = batch["tokens"][0], batch["input_ids"]        # ids (1, n)
    if len(tokens) <= 2:
        raise SentenceError(f"{name} {text!r} gives no word pieces, only [CLS] and [SEP]: "
                            "type some words.")
    hidden, w, inputs = _layers(enc, ids)                       # w (L, 1, h, n, n)
    if ids.shape[1] > enc.cfg.sentence_max_tokens:              # encode() reads 256 pieces
        hidden, _, inputs = _layers(enc, enc.tokenize(
            [text], max_length=enc.cfg.sentence_max_tokens)["input_ids"])
    mask = torch.ones(ids.shape, dtype=torch.bool)
    labels, unknown = [token_label(t) for t in tokens], tokens.count("[UNK]")
    notes = [note for note, shown in [
        ("the text is longer than 512 word pieces, the most the model reads: only the first 512 "
         "are shown (the similarity reads the first 256, as encode does)", batch["truncated"][0]),
        (f"{unknown} word piece(s) are [UNK]: the tokenizer does not know those characters "
         "(emoji, some scripts), the model sees one unknown token", unknown),
        ("? in a label: a character the plot font cannot draw", labels != tokens)] if shown]
    return SentenceRun(
        labels, w[:, 0], *rm.entropy_grid(w, mask), rm.sink_shares(w, mask, ids, enc.cls_id),
        rm.offset_scores(w, mask, -1), rm.offset_scores(w, mask, +1),
        mean_pool(hidden, torch.ones(hidden.shape[:2], dtype=torch.bool))[0], inputs,
        "; ".join(notes) or "none")


def ablated_embeddings(enc: Encoder, run: SentenceRun, layer: int) -> torch.Tensor:
    """``(h, d)``: row ``i``, the embedding with head ``i + 1`` of ``layer`` (1-based) off."""
    x = run.layer_inputs[layer - 1]                                        # (1, n, d)
    keep = ~torch.eye(enc.cfg.num_heads, dtype=torch.bool)                 # row i: head i off
    return rm.heads_off(enc, x, torch.ones(x.shape[:2], dtype=torch.bool), layer - 1, keep)[:, 0]


@dataclass
class RealModelFrame(AttentionFrame):
    """One head's frame, plus every head's mean entropy / ``ln n``, ``head_map (L, h)``."""

    head_map: torch.Tensor | None = None
    cell: tuple = (0, 0)
    title: str = ""


def real_model_frame(run: SentenceRun, partner: SentenceRun, layer: int, head: int,
                     ablate: bool = False, ablated: tuple | None = None) -> RealModelFrame:
    """Head ``head`` of ``layer`` (1-based) on ``run``; ``ablated``: both embeddings, head off."""
    require_int_in("layer", layer, 1, run.entropy.shape[0])
    require_int_in("head", head, 1, run.entropy.shape[1])
    if ablate and ablated is None:
        raise ValueError("ablate=True needs ablated = (embedding, partner embedding) with the head off")
    l, i, n = layer - 1, head - 1, len(run.labels)
    similarity = float(run.embedding @ partner.embedding)
    readouts = {"word pieces n": n, "head": f"L{layer}H{head}",
                "mean entropy (nats)": run.entropy[l, i].item(), "ceiling ln n": max_entropy(n),
                "mean entropy / ln n": run.fraction[l, i].item(),
                "weight on [CLS]": run.cls[l, i].item(), "weight on previous token":
                run.previous[l, i].item(), "weight on next token": run.following[l, i].item(),
                "similarity to the second sentence": similarity}
    if ablate:
        off = float(ablated[0] @ ablated[1])
        readouts |= {"similarity with this head off": off, "change": off - similarity}
    readouts["notes"] = run.notes
    title = (f"weights a_ij of L{layer}H{head}" + (" (switched off)" if ablate else "")
             + f", rows: queries; entropy/ln n {run.fraction[l, i]:.2f}, on [CLS] {run.cls[l, i]:.2f}")
    return RealModelFrame(run.weights[l, i], run.labels, run.labels, readouts=readouts,
                          head_map=run.fraction, cell=(l, i), title=title)


class RealModelView(BlitView):
    """One head's heatmap and entropies (left); every head's mean entropy / ln n, framed (right)."""

    def __init__(self, shape: tuple[int, int]):
        super().__init__((12.0, 5.0))
        grid = self.figure.add_gridspec(1, 2, width_ratios=[3.2, 1.8], left=0.01, right=0.94,
                                        bottom=0.02, top=0.97, wspace=0.08)
        self.panel = AttentionPanel(self.blit, grid[0], title=" ")
        # the heatmap's title changes with every move: pasted text, not a redraw
        self.title = TextSprites(self.blit, self.figure.transFigure, size=10, ha="left", va="top")
        ax, (L, h) = self.figure.add_subplot(grid[1]), shape
        ax.set(xlim=(-0.5, h - 0.5), ylim=(L - 0.5, -0.5), aspect="equal")
        ax.set_xticks(range(h), [str(j + 1) for j in range(h)], fontsize=8)
        ax.set_yticks(range(L), [str(j + 1) for j in range(L)], fontsize=8)
        ax.set_xlabel("head", fontsize=9)
        ax.set_ylabel("layer", fontsize=9)
        ax.set_title("every head: mean entropy / ln n\non this sentence", fontsize=10)
        norm = Normalize(0.0, 1.0, clip=True)
        self.cells, self.values = CellPainter(self.blit, ax, weights_cmap(), norm), None
        bar = make_axes_locatable(ax).append_axes("bottom", size=Fixed(0.12), pad=Fixed(0.55))
        self.figure.colorbar(ScalarMappable(norm, weights_cmap()), cax=bar, orientation="horizontal")
        bar.tick_params(labelsize=8)
        self.box = ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, fill=False, edgecolor=HIGHLIGHT_COLOR,
                                          linewidth=2.5))
        self.blit.animate(self.box)

    def draw(self, frame: RealModelFrame) -> None:
        self.panel.set_frame(frame)
        self.title.set([frame.title], [(0.01, 0.995)])
        if self.values is None or not torch.equal(frame.head_map, self.values):
            self.values = frame.head_map
            self.cells.set(to_numpy(frame.head_map))
        self.box.set_xy((frame.cell[1] - 0.5, frame.cell[0] - 0.5))


def example_pairs() -> list[tuple[str, str]]:
    """Section 3's sentence and a paraphrase, the shipped paraphrases, then two non-paraphrases."""
    data = rm.load_sentences()
    first = ("The animal didn't cross the street because it was too tired.",
             "The animal was too tired to cross the road.")
    return [first, *(tuple(p) for p in data["paraphrases"] + data["non_paraphrases"][:2])]


class RealModelWidget(LiveAttentionWidget):
    """Notebook 09's widget; the ``examples`` dropdown fills both text boxes with one redraw."""

    def __init__(self, enc: Encoder, pairs: list[tuple[str, str]], layer: int = 1, head: int = 1):
        self.run = functools.lru_cache(CACHE_SIZE)(
            lambda text, name: run_sentence(enc, text, name=name))
        self.off = functools.lru_cache(4 * CACHE_SIZE)(         # every head of a layer at once
            lambda text, name, layer: ablated_embeddings(enc, self.run(text, name), layer))
        L, h = enc.cfg.num_layers, enc.cfg.num_heads
        wide = widgets.Layout(width="640px")
        controls = {
            "sentence": widgets.Text(pairs[0][0], description="sentence", layout=wide,
                                     continuous_update=False),
            "partner": widgets.Text(pairs[0][1], description="second sentence", layout=wide,
                                    continuous_update=False),
            "layer": widgets.IntSlider(layer, min=1, max=L, description="layer"),
            "head": widgets.IntSlider(head, min=1, max=h, description="head"),
            "ablate": widgets.Checkbox(False, description="switch this head off"),
        }
        super().__init__(self._compute, controls, RealModelView((L, h)),
                         title="all-MiniLM-L6-v2: any sentence, any of its 72 heads")
        self.pairs = pairs
        self.examples = widgets.Dropdown(
            options=[(f"{a}  |  {b}", k) for k, (a, b) in enumerate(pairs)], value=0,
            description="examples", layout=wide)
        for box in (controls["sentence"], controls["partner"], self.examples):
            box.style.description_width = "110px"
        self.examples.observe(lambda change: self.set(sentence=pairs[change["new"]][0],
                                                      partner=pairs[change["new"]][1]), names="value")
        self.ui.children = (self.ui.children[0], self.examples, *self.ui.children[1:])

    def _compute(self, sentence, partner, layer, head, ablate):
        a, b = (sentence, "sentence"), (partner, "the second sentence")
        ablated = (self.off(*a, layer)[head - 1], self.off(*b, layer)[head - 1]) if ablate else None
        return real_model_frame(self.run(*a), self.run(*b), layer, head, ablate, ablated)


def real_model_widget(enc: Encoder | None = None,
                      pairs: list[tuple[str, str]] | None = None, *, layer: int = 1,
                      head: int = 1) -> RealModelWidget:
    """Notebook 09's widget, opening on ``layer`` and ``head`` (1-based)."""
    enc = load_encoder() if enc is None else enc
    pairs = example_pairs() if pairs is None else [tuple(p) for p in pairs]
    if not pairs or any(len(p) != 2 or not all(isinstance(s, str) for s in p) for p in pairs):
        raise ValueError("pairs must be a non-empty list of (sentence, sentence) pairs of str")
    require_int_in("layer", layer, 1, enc.cfg.num_layers)
    require_int_in("head", head, 1, enc.cfg.num_heads)
    return RealModelWidget(enc, pairs, layer, head)
