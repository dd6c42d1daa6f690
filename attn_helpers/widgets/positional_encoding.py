r"""Notebook 07's widget, what RoPE changes: token 0 at every position, its causal scores ``S[p, q]
= query_p . key_q``, one sin/cos pair of query ``p`` and key ``p - k`` on a circle, the diagonal
``q = p - k`` and ``softmax(S / sqrt(d_head))``, for each mode of :data:`ENCODINGS`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib import colormaps as plt_colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.patches import Circle, Rectangle

from ..attention import masked_softmax
from ..entropy import attention_entropy
from ..lessons import positional_encoding as lesson
from ..masks import causal_mask
from ..plots import MASKED_COLOR, SCORES_CMAP, to_numpy
from ..positional import apply_rope, sinusoidal_encoding
from .core import HIGHLIGHT_COLOR, AttentionFrame, AttentionPanel, BlitView, LiveAttentionWidget
from .panels import CellPainter

__all__ = ["ENCODINGS", "N_POSITIONS", "queries_and_keys", "causal_diagonal_spread",
           "positional_frame", "positional_widget"]

ENCODINGS = ("sinusoidal (E E^T)", "learned, untrained (E E^T)", "add PE, then project (W_Q, W_K)",
             "project, then rotate (RoPE)")
N_POSITIONS, MAX_OFFSET = 24, 8
D_HEAD = lesson.D_MODEL // lesson.NUM_HEADS  # 8: the trained heads' size, 4 sin/cos pairs
_TRAINED = {ENCODINGS[2]: "sinusoidal", ENCODINGS[3]: "rope"}


@dataclass
class PositionalFrame(AttentionFrame):
    """An :class:`AttentionFrame` plus what the top row draws."""

    scores: torch.Tensor | None = None  # (n, n): S / max |S|, NaN where q > p
    diagonal: torch.Tensor | None = None  # (n - k,): S[p', p' - k] / max |S| for p' = k .. n-1
    position: int = 0
    offset: int = 0
    pair: int = 0
    pair_points: torch.Tensor | None = None  # (2, 2): pair i of query_p, key_{p-k}; longest = 1


@lru_cache(maxsize=1)
def _trained_models():
    models, _ = lesson.load_models()
    return models


def queries_and_keys(encoding: str, head: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, keys)``, each ``(N_POSITIONS, D_HEAD)`` float64: token 0's query (key) at each
    position in mode ``encoding``."""
    n = N_POSITIONS
    if encoding == ENCODINGS[0]:
        table = sinusoidal_encoding(n, D_HEAD, dtype=torch.float64)
        return table, table
    if encoding == ENCODINGS[1]:
        table = torch.randn(n, D_HEAD, generator=torch.Generator().manual_seed(7),
                            dtype=torch.float64) / 1.4
        return table, table
    if encoding not in _TRAINED:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    model = _trained_models()[lesson.model_key(_TRAINED[encoding], 0)]
    W = model.qkv.weight.detach().to(torch.float64)  # (3 d_model, d_model): Q, K, V heads' rows
    rows = slice(head * D_HEAD, (head + 1) * D_HEAD)
    W_Q, W_K = W[:lesson.D_MODEL][rows], W[lesson.D_MODEL:2 * lesson.D_MODEL][rows]  # (d_head, d_model)
    X = model.embed.weight[0].detach().to(torch.float64).expand(n, lesson.D_MODEL)  # (n, d_model)
    if encoding == ENCODINGS[2]:
        X = X + sinusoidal_encoding(n, lesson.D_MODEL, dtype=torch.float64)
        return X @ W_Q.T, X @ W_K.T  # (n, d_head): W_Q (x + PE_p), W_K (x + PE_q)
    return apply_rope(X @ W_Q.T), apply_rope(X @ W_K.T)  # (n, d_head): R_p W_Q x, R_q W_K x


def causal_diagonal_spread(S: torch.Tensor) -> float:
    """The largest ``max - min`` of ``S (n, n)`` along one diagonal ``q = p - k``, ``k >= 0``:
    zero when the causal part depends on ``q - p`` only."""
    return max((line.max() - line.min()).item() for line in (S.diagonal(-k) for k in range(len(S))))


@lru_cache(maxsize=len(ENCODINGS) * lesson.NUM_HEADS)
def _grids(encoding: str, head: int) -> dict:
    """What a move does not change, once per ``(mode, head)``."""
    queries, keys = queries_and_keys(encoding, head)
    S = queries @ keys.T  # (n, n): S[p, q]
    visible = causal_mask(N_POSITIONS)  # (n, n): q <= p
    top = S[visible].abs().max().item()
    pairs = torch.cat([queries, keys]).view(-1, D_HEAD // 2, 2)  # (2 n, pairs, 2)
    return {"S": S, "top": top, "spread": causal_diagonal_spread(S), "mask": visible,
            "shown": torch.where(visible, S / top, torch.nan),
            "weights": masked_softmax(S / math.sqrt(D_HEAD), visible),  # the model's own scale
            "queries": queries, "keys": keys, "radius": pairs.norm(dim=-1).amax(0)}  # (pairs,)


def _angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Signed angle in ``(-pi, pi]`` that turns the 2-vector ``a`` onto ``b``."""
    return math.atan2(a[0] * b[1] - a[1] * b[0], a[0] * b[0] + a[1] * b[1])


def positional_frame(encoding: str, position: int, offset: int, pair: int,
                     head: int = 0) -> PositionalFrame:
    """What the widget shows for mode ``encoding``, query position ``p`` (``0 .. 23``), offset
    ``k`` (``0 .. 8``), pair ``i`` (``0 .. 3``) and trained head ``h`` (``0 .. 2``)."""
    for name, value, top in (("position", position, N_POSITIONS - 1), ("offset", offset, MAX_OFFSET),
                             ("pair", pair, D_HEAD // 2 - 1), ("head", head, lesson.NUM_HEADS - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an int in 0..{top}, got {value!r}")
    g = _grids(encoding, head)
    S, weights, p, k = g["S"], g["weights"], position, offset
    pair_of = slice(2 * pair, 2 * pair + 2)
    has_key = p >= k
    q_pair, k_pair = g["queries"][p, pair_of], g["keys"][max(p - k, 0), pair_of]
    labels = [str(i) for i in range(N_POSITIONS)]
    return PositionalFrame(
        weights=weights, query_labels=labels, key_labels=labels, mask=g["mask"], highlight_row=p,
        scores=g["shown"], diagonal=S.diagonal(-k) / g["top"], position=p, offset=k, pair=pair,
        pair_points=torch.stack([q_pair, k_pair]) / g["radius"][pair],
        readouts={
            "S[p, p-k]": round(S[p, p - k].item(), 4) if has_key else None,
            "S[k, 0]": round(S[k, 0].item(), 4),
            "largest spread of S along one diagonal (0: relative)": round(g["spread"], 4),
            "pair i: angle from query p to key p-k (rad)":
                round(_angle(q_pair, k_pair), 4) if has_key else None,
            "pair i: the same for query k, key 0 (rad)":
                round(_angle(g["queries"][k, pair_of], g["keys"][0, pair_of]), 4),
            "key with the largest weight in row p": int(weights[p].argmax()),
            "entropy of row p (nats)": round(attention_entropy(weights[p]).item(), 4),
        },
    )


def _axes(figure, cell, xlabel: str, ylabel: str, title: str, **limits):
    ax = figure.add_subplot(cell)
    ax.set(**limits)
    ax.tick_params(labelsize=8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(title, fontsize=10)
    return ax


class PositionalView(BlitView):
    """Top: the score grid, the pair on a circle, the diagonal's scores; bottom: the attention."""

    def __init__(self, figsize: tuple[float, float] = (10.5, 7.8)):
        super().__init__(figsize)
        figure, n, train = self.figure, N_POSITIONS, lesson.TRAIN_MAX_LEN
        grid = figure.add_gridspec(2, 3, width_ratios=[1.25, 1, 1.25], height_ratios=[1, 1.3],
                                   left=0.06, right=0.98, bottom=0.01, top=0.935, wspace=0.42,
                                   hspace=0.2)
        ax = _axes(figure, grid[0, 0], "key position q", "query position p",
                   "S[p, q] / max|S|, q <= p\n(orange: p, p-k; black: k, 0)",
                   xlim=(-0.5, n - 0.5), ylim=(n - 0.5, -0.5), aspect="equal",
                   xticks=range(0, n, 4), yticks=range(0, n, 4))
        self.cells = CellPainter(self.blit, ax, plt_colormaps[SCORES_CMAP].with_extremes(
            bad=MASKED_COLOR), Normalize(-1.0, 1.0, clip=True))
        figure.colorbar(ScalarMappable(Normalize(-1.0, 1.0), SCORES_CMAP), ax=ax, fraction=0.046,
                        pad=0.03).ax.tick_params(labelsize=8)
        self.box_p = ax.add_patch(Rectangle((0, 0), 1, 1, fill=False, edgecolor=HIGHLIGHT_COLOR,
                                            linewidth=3))
        self.box_0 = ax.add_patch(Rectangle((0, 0), 1, 1, fill=False, edgecolor="black", linewidth=2))
        (self.diagonal_line,) = ax.plot([], [], color="black", linestyle=":", linewidth=1.2)
        ax = _axes(figure, grid[0, 1], "dimension 2i", "dimension 2i+1",
                   "pair i of the query at p (orange)\nand the key at p-k (black)",
                   xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), aspect="equal")
        ax.add_patch(Circle((0, 0), 1, fill=False, color="grey", linestyle=":"))
        (self.spoke_p,) = ax.plot([], [], "-o", color=HIGHLIGHT_COLOR, linewidth=2)
        (self.spoke_pk,) = ax.plot([], [], "--o", color="black", linewidth=2)
        ax = _axes(figure, grid[0, 2], "query position p' (key p' - k)", "S[p', p'-k] / max|S|",
                   "along the diagonal q = p - k\n(flat: relative; dashes: S[k, 0])",
                   xlim=(-0.5, n - 0.5), ylim=(-1.1, 1.1))
        ax.axvspan(train - 0.5, n - 0.5, color="#eeeeee", zorder=0)
        ax.text((train + n - 1) / 2, -1.05, "never in\ntraining", fontsize=8, ha="center", va="bottom")
        (self.profile,) = ax.plot([], [], "-", color="#3b75af", linewidth=1.5, marker=".")
        (self.level,) = ax.plot([], [], "--", color="black", linewidth=1)
        (self.marker,) = ax.plot([], [], "o", color=HIGHLIGHT_COLOR, markersize=8)
        self.panel = AttentionPanel(self.blit, grid[1, :], max_shape=(n, n),
                                    title="attention softmax(S / sqrt(d_head)), causal: in the trained "
                                          "modes, the head's own weights on token 0 repeated")
        self.blit.animate(self.box_p, self.box_0, self.diagonal_line, self.spoke_p, self.spoke_pk,
                          self.profile, self.level, self.marker)

    def draw(self, frame: PositionalFrame) -> None:
        self.panel.set_frame(frame)
        self.cells.set(to_numpy(frame.scores))
        p, k, n = frame.position, frame.offset, N_POSITIONS
        for artist in (self.box_p, self.spoke_pk, self.marker):
            artist.set_visible(p >= k)  # no key k back of a query before position k
        self.box_p.set_bounds(p - k - 0.5, p - 0.5, 1, 1)
        self.box_0.set_bounds(-0.5, k - 0.5, 1, 1)
        self.diagonal_line.set_data([-0.5, n - k - 0.5], [k - 0.5, n - 0.5])
        (x0, y0), (x1, y1) = to_numpy(frame.pair_points)
        self.spoke_p.set_data([0, x0], [0, y0])
        self.spoke_pk.set_data([0, x1], [0, y1])
        values = to_numpy(frame.diagonal)  # (n - k,): queries k .. n-1
        self.profile.set_data(np.arange(k, n), values)
        self.level.set_data([-0.5, n - 0.5], [values[0]] * 2)
        self.marker.set_data([p], [values[max(p - k, 0)]])


def positional_widget(encoding: str = ENCODINGS[0], position: int = 5, offset: int = 3,
                      pair: int = 0, head: int = 1) -> LiveAttentionWidget:
    """Notebook 07's live widget (mode, p, k, i, h), opening on the given values."""
    positional_frame(encoding, position, offset, pair, head)  # refuses bad opening values
    controls = {
        "encoding": widgets.Dropdown(options=ENCODINGS, value=encoding, description="mode",
                                     layout=widgets.Layout(width="360px")),
        "position": widgets.IntSlider(value=position, min=0, max=N_POSITIONS - 1,
                                      description="position p"),
        "offset": widgets.IntSlider(value=offset, min=0, max=MAX_OFFSET, description="offset k"),
        "pair": widgets.IntSlider(value=pair, min=0, max=D_HEAD // 2 - 1, description="pair i"),
        "head": widgets.IntSlider(value=head, min=0, max=lesson.NUM_HEADS - 1, description="head h"),
    }
    return LiveAttentionWidget(positional_frame, controls, PositionalView(),
                               title="What RoPE changes: scores of one token at every position")
