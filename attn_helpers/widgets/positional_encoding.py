"""Notebook 07's widget, what RoPE changes (token 0 at every position or random tokens, the scores,
one pair on a circle, the diagonal, the attention), and the notebook's figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib import colormaps as plt_colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.patches import Circle, Rectangle

from .. import plots
from .._checks import require_int_in
from ..attention import masked_softmax
from ..entropy import attention_entropy
from ..lessons import positional_encoding as lesson
from ..masks import causal_mask
from ..plots import MASKED_COLOR, SCORES_CMAP, to_numpy
from ..positional import apply_rope, sinusoidal_encoding
from .core import AttentionFrame, BlitView, LiveAttentionWidget
from .panels import HIGHLIGHT_COLOR, AttentionPanel, CellPainter

ENCODINGS = ("sinusoidal (E E^T)", "random table (E E^T)", "add PE, then project (W_Q, W_K)",
             "project, then rotate (RoPE)")
INPUTS = ("token 0 repeated", "random tokens (probe)")  # what the trained modes read
BASES = lesson.WRAP_BASES  # (625, 10000, 160000): RoPE is shipped trained at each
N_POSITIONS, MAX_OFFSET = 24, 8
D_HEAD = lesson.D_MODEL // lesson.NUM_HEADS  # 8: the trained heads' size, 4 sin/cos pairs
_TRAINED = {ENCODINGS[2]: "sinusoidal", ENCODINGS[3]: "rope"}
_LABELS = [str(i) for i in range(N_POSITIONS)]
PROBE = lesson.offset_copy_batch(1, N_POSITIONS, torch.Generator().manual_seed(1))[0][0]  # (24,)


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
    return lesson.load_models()[0]


def _check_base(encoding: str, base: float) -> float:
    if isinstance(base, bool) or base not in BASES:
        raise ValueError(f"base must be one of {[f'{b:g}' for b in BASES]} (the bases RoPE is "
                         f"shipped trained at), got {base!r}")
    if encoding == ENCODINGS[2] and base != lesson.BASE:
        raise ValueError(f"base {base:g} has no trained model in mode {encoding!r} (only base "
                         f"{lesson.BASE:g}; RoPE and the table E E^T have every base). The picture "
                         "keeps the last setting that worked.")
    return float(base)


def _check_tokens(tokens: str) -> str:
    if not isinstance(tokens, str) or tokens not in INPUTS:
        raise ValueError(f"tokens must be one of {INPUTS}, got {tokens!r}")
    return tokens


def queries_and_keys(encoding: str, head: int = 0, base: float = lesson.BASE,
                     tokens: str = INPUTS[0]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, keys)``, each ``(N_POSITIONS, D_HEAD)`` float64, at each position. ``base`` (one
    of :data:`BASES`) sets the frequencies; the random table ignores it. ``tokens`` (one of
    :data:`INPUTS`): token 0 at every position, or :data:`PROBE`; the tables have no tokens."""
    n, base, tokens = N_POSITIONS, _check_base(encoding, base), _check_tokens(tokens)
    if encoding == ENCODINGS[0]:
        table = sinusoidal_encoding(n, D_HEAD, base=base, dtype=torch.float64)
        return table, table
    if encoding == ENCODINGS[1]:
        table = torch.randn(n, D_HEAD, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        return table / 1.4, table / 1.4
    if encoding not in _TRAINED:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    model = _trained_models()[lesson.model_key(_TRAINED[encoding], 0, base)]
    W = model.qkv.weight.detach().to(torch.float64)  # (3 d_model, d_model): Q, K, V heads' rows
    rows = slice(head * D_HEAD, (head + 1) * D_HEAD)
    W_Q, W_K = W[:lesson.D_MODEL][rows], W[lesson.D_MODEL:2 * lesson.D_MODEL][rows]  # (d_head, d_model)
    ids = PROBE if tokens == INPUTS[1] else torch.zeros(n, dtype=torch.long)
    X = model.embed.weight[ids].detach().to(torch.float64)  # (n, d_model)
    if encoding == ENCODINGS[2]:
        X = X + sinusoidal_encoding(n, lesson.D_MODEL, dtype=torch.float64)
        return X @ W_Q.T, X @ W_K.T  # (n, d_head): W_Q (x + PE(m)), W_K (x + PE(n))
    return apply_rope(X @ W_Q.T, base=base), apply_rope(X @ W_K.T, base=base)  # R(m) W_Q x, R(n) W_K x


def causal_diagonal_spread(S: torch.Tensor) -> float:
    """The largest ``max - min`` of ``S (n, n)`` along one diagonal ``n = m - k >= 0``: 0 = relative."""
    return max((line.max() - line.min()).item() for line in (S.diagonal(-k) for k in range(len(S))))


@lru_cache(maxsize=len(ENCODINGS) * lesson.NUM_HEADS * len(BASES) * len(INPUTS))
def _grids(encoding: str, head: int, base: float, tokens: str) -> dict:
    """What a move does not change, once per ``(mode, head, base, tokens)``."""
    queries, keys = queries_and_keys(encoding, head, base, tokens)
    S = queries @ keys.T  # (n, n): S[m, n]
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


def positional_frame(encoding: str, position: int, offset: int, pair: int, head: int = 0,
                     base: float = lesson.BASE, tokens: str = INPUTS[0]) -> PositionalFrame:
    """What the widget shows for mode ``encoding``, query position ``m`` (``0 .. 23``), offset
    ``k`` (``0 .. 8``), pair ``i`` (``0 .. 3``), trained head ``h`` (``0 .. 2``), ``base`` and
    input ``tokens``."""
    for name, value, top in (("position", position, N_POSITIONS - 1), ("offset", offset, MAX_OFFSET),
                             ("pair", pair, D_HEAD // 2 - 1), ("head", head, lesson.NUM_HEADS - 1)):
        require_int_in(name, value, 0, top)
    g = _grids(encoding, head, _check_base(encoding, base), _check_tokens(tokens))
    S, weights, p, k, pair_of = g["S"], g["weights"], position, offset, slice(2 * pair, 2 * pair + 2)
    has_key = p >= k
    q_pair, k_pair = g["queries"][p, pair_of], g["keys"][max(p - k, 0), pair_of]
    return PositionalFrame(
        weights=weights, query_labels=_LABELS, key_labels=_LABELS, mask=g["mask"], highlight_row=p,
        scores=g["shown"], diagonal=S.diagonal(-k) / g["top"], position=p, offset=k, pair=pair,
        pair_points=torch.stack([q_pair, k_pair]) / g["radius"][pair],
        readouts={
            "S[m, m-k]": round(S[p, p - k].item(), 4) if has_key else None,
            "S[k, 0]": round(S[k, 0].item(), 4),
            "largest spread of S along one diagonal (0: relative)": round(g["spread"], 4),
            "pair i's wavelength 2 pi / omega_i (positions)": None if encoding == ENCODINGS[1]
                else round(2 * math.pi * base ** (2 * pair / D_HEAD), 1),
            "pair i: angle from query m to key m-k (rad)":
                round(_angle(q_pair, k_pair), 4) if has_key else None,
            "pair i: the same for query k, key 0 (rad)":
                round(_angle(g["queries"][k, pair_of], g["keys"][0, pair_of]), 4),
            "key with the largest weight in row m": int(weights[p].argmax()),
            "entropy of row m (nats)": round(attention_entropy(weights[p]).item(), 4),
        },
    )


def _axes(figure, cell, xlabel: str, ylabel: str, title: str, **limits):
    ax = figure.add_subplot(cell, **limits)
    ax.tick_params(labelsize=8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(title, fontsize=10)
    return ax


class PositionalView(BlitView):
    """Top: the score grid, the pair on a circle, the diagonal's scores; bottom: the attention."""

    def __init__(self):
        super().__init__((10.5, 7.8))
        figure, n, train = self.figure, N_POSITIONS, lesson.TRAIN_MAX_LEN
        grid = figure.add_gridspec(2, 3, width_ratios=[1.25, 1, 1.25], height_ratios=[1, 1.3],
                                   left=0.06, right=0.98, bottom=0.01, top=0.935, wspace=0.5,
                                   hspace=0.2)
        ax = _axes(figure, grid[0, 0], "key position n", "query position m",
                   "S[m, n] / max|S|, n <= m\n(orange: m, m-k; black: k, 0)",
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
                   "pair i of the query at m (orange)\nand the key at m-k (black)",
                   xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), aspect="equal")
        ax.add_patch(Circle((0, 0), 1, fill=False, color="grey", linestyle=":"))
        (self.spoke_p,) = ax.plot([], [], "-o", color=HIGHLIGHT_COLOR, linewidth=2)
        (self.spoke_pk,) = ax.plot([], [], "--o", color="black", linewidth=2)
        ax = _axes(figure, grid[0, 2], "query position m' (key m' - k)", "S[m', m'-k] / max|S|",
                   "along the diagonal n = m - k\n(flat: relative; dashes: S[k, 0])",
                   xlim=(-0.5, n - 0.5), ylim=(-1.1, 1.1))
        ax.axvspan(train - 0.5, n - 0.5, color="#eeeeee", zorder=0)
        ax.text((train + n - 1) / 2, -1.05, "never in\ntraining", fontsize=8, ha="center", va="bottom")
        (self.profile,) = ax.plot([], [], "-", color="#3b75af", linewidth=1.5, marker=".")
        (self.level,) = ax.plot([], [], "--", color="black", linewidth=1)
        (self.marker,) = ax.plot([], [], "o", color=HIGHLIGHT_COLOR, markersize=8)
        self.panel = AttentionPanel(self.blit, grid[1, :], max_shape=(n, n),
                                    title="softmax(S / sqrt(d_head)), n <= m: in trained modes the "
                                          "head's own weights on the input; in table modes a "
                                          "display")
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
                      pair: int = 0, head: int = 1, base: float = lesson.BASE,
                      tokens: str = INPUTS[0]) -> LiveAttentionWidget:
    """Notebook 07's live widget (mode, m, k, i, h, base, input), opening on the given values."""
    positional_frame(encoding, position, offset, pair, head, base, tokens)  # refuses bad values
    controls = {
        "encoding": widgets.Dropdown(options=ENCODINGS, value=encoding, description="mode",
                                     layout=widgets.Layout(width="360px")),
        "position": widgets.IntSlider(value=position, min=0, max=N_POSITIONS - 1,
                                      description="position m"),
        "offset": widgets.IntSlider(value=offset, min=0, max=MAX_OFFSET, description="offset k"),
        "pair": widgets.IntSlider(value=pair, min=0, max=D_HEAD // 2 - 1, description="pair i"),
        "head": widgets.IntSlider(value=head, min=0, max=lesson.NUM_HEADS - 1, description="head h"),
        "base": widgets.Dropdown(options=[(f"{b:g}", b) for b in BASES], value=float(base),
                                 description="base", layout=widgets.Layout(width="200px")),
        "tokens": widgets.Dropdown(options=INPUTS, value=tokens, description="input",
                                   layout=widgets.Layout(width="300px")),
    }
    return LiveAttentionWidget(positional_frame, controls, PositionalView(),
                               title="What RoPE changes: scores of one token at every position")


# The notebook's figures and record handling, out of its main path (their source: Going deeper).

def _image(fig, ax, M: torch.Tensor, limit: float, **labels) -> None:
    """``M`` on ``ax``, coloured from ``-limit`` to ``limit``, with its colour bar."""
    image = ax.imshow(M, cmap=SCORES_CMAP, vmin=-limit, vmax=limit, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set(**labels)


def plot_sinusoidal(PE: torch.Tensor) -> None:
    """Section 2: the table ``PE (n, d)`` as an image, and four of its waves."""
    n, d = PE.shape
    fig, (ax_map, ax_wave) = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=[1, 1.2])
    _image(fig, ax_map, PE, 1, xlabel="dimension (sin, cos, sin, cos, ...)", ylabel="position p",
           title=f"PE for n = {n}, d = {d}", aspect="auto")
    for dim in (0, 2, 6, 12):  # dots: the fast dim 0 is sampled only at whole positions p
        ax_wave.plot(range(n), PE[:, dim], marker="." if dim == 0 else None,
                     label=f"dim {dim}: sin(p w_{dim // 2})")
    ax_wave.set(xlabel="position p", ylabel="value",
                title="one wave per dimension (dim 0: period 2 pi, seen only at whole p)")
    ax_wave.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4)
    plt.show()


def plot_similarity(G: torch.Tensor, d: int) -> None:
    """Section 2: ``G[m, n] = PE(m) . PE(n)`` as an image, and its first row against the offset."""
    fig, (ax_g, ax_k) = plt.subplots(1, 2, figsize=(12, 4.2))
    _image(fig, ax_g, G, d / 2, xlabel="position n", ylabel="position m",
           title="PE(m) . PE(n): constant along diagonals")
    ax_g.images[0].set(cmap="viridis", clim=(G.min().item(), d / 2))  # G > 0: a one-sided scale
    ax_k.plot(range(len(G)), G[0], color="#3b75af")
    ax_k.axhline(d / 2, color="#c0392b", linestyle="--", label="d/2 (k = 0)")
    ax_k.set(xlabel="offset k", ylabel="PE(p) . PE(p+k)", title="similarity against distance")
    ax_k.legend()
    plt.show()


def plot_grids(grids: dict[str, torch.Tensor], xlabel: str = "key position n",
               ylabel: str = "query position m", ticks: list[str] | None = None) -> None:
    """Score grids side by side, each on its own symmetric colour scale; ``ticks``: one label a row."""
    fig, axes = plt.subplots(1, len(grids), figsize=(4.8 * len(grids), 4.3), squeeze=False)
    for ax, (name, S) in zip(axes[0], grids.items(), strict=True):
        _image(fig, ax, S, S.abs().max().item(), xlabel=xlabel, ylabel=ylabel, title=name)
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
            ax.set_yticks(range(len(ticks)), ticks, fontsize=8)
    plt.show()


def plot_alibi(weights: torch.Tensor, slopes: torch.Tensor, heads=(0, 2, 4)) -> None:
    """Section 5: the attention ``weights (H, n, n)`` of the bias alone, for heads ``h`` (from 0)."""
    n = weights.shape[-1]
    fig, axes = plt.subplots(1, len(heads), figsize=(5 * len(heads), 4.6))
    for ax, h in zip(axes, heads, strict=True):
        plots.heatmap(weights[h], list(range(n)), list(range(n)), ax=ax, mask=causal_mask(n),
                      xlabel="key position", ylabel="query position",
                      title=f"head h = {h}, slope m_h = 1/{round(1 / slopes[h].item())}")
    plt.show()


def print_table(table: dict, metadata: dict) -> None:
    """Section 6: the training setup, then ``table[scheme][span]`` (one accuracy per seed)."""
    shortest, longest = metadata["train_lengths"]
    print(f"training, each model: {metadata['steps']} Adam steps at learning rate {metadata['lr']:g}, "
          f"batches of {metadata['batch']}, a length drawn from {shortest}-{longest} per step, "
          "gradient norm clipped to 1")
    print(f"model: vocabulary {lesson.VOCAB}, d_model {lesson.D_MODEL} ({lesson.NUM_HEADS} heads of "
          f"{lesson.D_MODEL // lesson.NUM_HEADS}), one causal attention layer")
    print(f"accuracy on 128 sequences, mean [min, max] over seeds {list(lesson.SEEDS)}; "
          f"chance {1 / lesson.VOCAB:.2f}")
    spans = next(iter(table.values()))
    heads = [f"{a}-{b - 1}" + (" (trained)" if a == 0 else " (unseen)") for a, b in spans]
    print(f"{'positions':<11}" + "".join(f"{head:>18}" for head in heads))
    for scheme, row in table.items():
        print(f"{scheme:<11}" + "".join(f"{sum(v) / len(v):>6.2f} [{min(v):.2f}, {max(v):.2f}]"
                                        for v in row.values()))


def plot_accuracy(curves: dict) -> None:
    """Section 6: accuracy per position, one panel per offset: seed mean, min-to-max band."""
    colors = dict(zip(lesson.SCHEMES, ("#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"),
                      strict=True))
    fig, axes = plt.subplots(1, len(lesson.OFFSETS), figsize=(12, 4.2), sharey=True)
    for j, (ax, k) in enumerate(zip(axes, lesson.OFFSETS, strict=True)):
        for scheme in lesson.SCHEMES:
            per_seed = torch.stack([curves[lesson.model_key(scheme, s)][:, j] for s in lesson.SEEDS])
            positions = torch.arange(per_seed.shape[1])
            ax.fill_between(positions, per_seed.min(0).values, per_seed.max(0).values,
                            color=colors[scheme], alpha=0.25, linewidth=0)
            ax.plot(positions, per_seed.mean(0), color=colors[scheme], label=scheme)
        for n, name in ((lesson.TRAIN_MAX_LEN, "training length"), (2 * lesson.TRAIN_MAX_LEN, "2x")):
            ax.axvline(n - 0.5, color="black", linestyle="--", linewidth=1)
            ax.text(n, 1.02, name, fontsize=9)
        ax.axhline(1 / lesson.VOCAB, color="black", linestyle=":", linewidth=1, label="chance")
        ax.set(xlabel="position i in the sequence", ylim=(0, 1.08),
               title=f"copy from {k} back: mean of {len(lesson.SEEDS)} seeds, band = min to max")
    axes[0].set_ylabel("accuracy")
    axes[-1].legend(loc="upper right", ncol=2, fontsize=9)
    plt.show()


def plot_heads(models, tokens: torch.Tensor, shown: list[tuple[str, str, int | None]]) -> None:
    """Section 6: each ``(scheme, what, head)``'s seed-0 attention on ``tokens (1, n)``, None: mean."""
    n = tokens.shape[1]
    labels = [f"{pos}:{tok}" for pos, tok in enumerate(tokens[0].tolist())]  # token ids repeat
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 4.4))
    for ax, (scheme, what, head) in zip(axes, shown, strict=True):
        model = models[lesson.model_key(scheme, 0)]
        with torch.no_grad():
            model(tokens)
        weights = model.last_weights[0].mean(0) if head is None else model.last_weights[0, head]
        plots.heatmap(weights, labels, labels, ax=ax, mask=causal_mask(n), xlabel="key (position:token)",
                      ylabel="query (position:token)", title=f"{scheme} (seed 0): {what}")
    plt.show()
