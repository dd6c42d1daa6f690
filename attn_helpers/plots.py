"""Static figures into ``ax`` (or a new figure): heatmaps (weights on a fixed 0..1 scale), entropy."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib.transforms import Affine2D

from .entropy import attention_entropy

__all__ = ["WEIGHTS_CMAP", "SCORES_CMAP", "MASKED_COLOR", "weights_cmap", "ceiling_staircase",
           "to_numpy", "heatmap", "entropy_bars", "attention_figure"]

WEIGHTS_CMAP = "viridis"
SCORES_CMAP = "RdBu_r"
MASKED_COLOR = "#d9d9d9"


def weights_cmap(name: str = WEIGHTS_CMAP) -> Colormap:
    """The colormap ``name`` with masked cells in :data:`MASKED_COLOR`."""
    return plt.get_cmap(name).with_extremes(bad=MASKED_COLOR)


def to_numpy(x) -> np.ndarray:
    """A detached float64 numpy copy of a tensor, array or nested list."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float)


def _check_labels(name: str, labels, n: int) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels but the matrix has {n} along that axis")
    return labels


def label_fontsize(n: int) -> float:
    """A tick-label size that stays readable from 4 to 64 tokens."""
    return float(np.clip(11 - 0.1 * n, 5, 10))


def ceiling_staircase(ceilings) -> tuple[np.ndarray, np.ndarray]:
    """x and y of a staircase spanning each bar's row at ``x = ceilings[row]``."""
    ceilings = to_numpy(ceilings)
    rows = np.arange(len(ceilings))
    return np.repeat(ceilings, 2), np.stack([rows - 0.5, rows + 0.5], 1).ravel()


def heatmap(matrix, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
            *, ax: Axes | None = None, title: str | None = None, mask=None,
            vmin: float | None = 0.0, vmax: float | None = 1.0, cmap: str | Colormap | None = None,
            annotate: bool = False, colorbar: bool = True, xlabel: str = "key",
            ylabel: str = "query"):
    """A labelled ``(rows, cols)`` heatmap; returns its colour mesh. Weights on 0..1 by default;
    ``vmin=vmax=None`` for scores (symmetric around 0). ``mask`` False: grey. Cell ``(i, j)`` is
    centred on ``x = j, y = i``, as ``imshow`` places it."""
    import seaborn as sns  # here, not at import: the widgets use this module's small helpers

    data = to_numpy(matrix)
    if data.ndim != 2:
        raise ValueError(f"matrix must be 2-D (rows, cols), got shape {data.shape}")
    rows, cols = data.shape
    x_labels = _check_labels("x_labels", x_labels, cols)
    y_labels = _check_labels("y_labels", y_labels, rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.45 * cols, 0.8 + 0.4 * rows), layout="constrained")
    if vmin is None and vmax is None:
        bound = float(np.abs(data).max()) or 1.0
        vmin, vmax = -bound, bound
        cmap = cmap or SCORES_CMAP
    cmap = weights_cmap(cmap or WEIGHTS_CMAP) if not isinstance(cmap, Colormap) else cmap
    hidden = None if mask is None else ~to_numpy(mask).astype(bool)
    sns.heatmap(data, mask=hidden, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, cbar=False)
    mesh = ax.collections[-1]
    mesh.set_transform(Affine2D().translate(-0.5, -0.5) + ax.transData)  # centres on integers
    size = label_fontsize(max(rows, cols))
    ax.set_xticks(range(cols), x_labels, rotation=90 if cols > 8 else 0, fontsize=size)
    ax.set_yticks(range(rows), y_labels, rotation=0, fontsize=size)
    ax.set(xlim=(-0.5, cols - 0.5), ylim=(rows - 0.5, -0.5), xlabel=xlabel, ylabel=ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        position = (data - vmin) / (vmax - vmin)
        diverging = vmin < 0 < vmax
        dark = np.abs(position - 0.5) > 0.3 if diverging else position < 0.6
        for i in range(rows):
            for j in range(cols):
                if hidden is not None and hidden[i, j]:
                    continue
                colour = "white" if dark[i, j] else "black"
                value = 0.0 if abs(data[i, j]) < 0.005 else data[i, j]  # no "-0.00"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=size - 1,
                        color=colour)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02)
    return mesh


def entropy_bars(weights, labels: Sequence[str] | None = None, *, ax: Axes | None = None,
                 mask=None, title: str = "entropy per query"):
    """Bars of each query's entropy in nats, ``weights`` ``(n_q, n_k)``, and its ln(visible keys)."""
    w = torch.as_tensor(to_numpy(weights))
    if w.dim() != 2:
        raise ValueError(f"weights must be 2-D (n_q, n_k), got shape {tuple(w.shape)}")
    n_q, n_k = w.shape
    labels = _check_labels("labels", labels, n_q)
    entropy = attention_entropy(w).numpy()
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 0.8 + 0.4 * n_q), layout="constrained")
    bars = ax.barh(range(n_q), entropy, color="#3b75af", height=0.7)
    visible = np.full(n_q, n_k) if mask is None else np.broadcast_to(
        to_numpy(mask), (n_q, n_k)).sum(axis=1)
    ceilings = np.log(np.maximum(visible, 1))
    ax.plot(*ceiling_staircase(ceilings), color="#c0392b", linestyle="--",
            label="ceiling ln(visible keys)" if mask is not None else f"ln n = {np.log(n_k):.2f}")
    ax.set_yticks(range(n_q), labels, fontsize=label_fontsize(n_q))
    ax.set_ylim(n_q - 0.5, -0.5)
    ax.set_xlim(0, max(float(ceilings.max()), 1e-3) * 1.1)
    ax.set_xlabel("entropy (nats)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    return bars


def attention_figure(weights, query_labels: Sequence[str] | None = None,
                     key_labels: Sequence[str] | None = None, *, title: str | None = None,
                     mask=None):
    """A heatmap of ``(n_q, n_k)`` weights beside the per-query entropy bars; returns the figure."""
    w = to_numpy(weights)
    n_q, n_k = w.shape
    fig, (ax_map, ax_entropy) = plt.subplots(
        1, 2, figsize=(2.5 + 0.45 * n_k + 3, 1.2 + 0.4 * n_q),
        gridspec_kw={"width_ratios": [max(n_k, 3), 4]}, layout="constrained",
    )
    heatmap(w, key_labels, query_labels, ax=ax_map, title=title, mask=mask)
    entropy_bars(w, query_labels, ax=ax_entropy, mask=mask)
    return fig
