"""Notebook 05's widget (masks on a padded batch of two sentences) and its figures."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from .. import plots
from .._checks import require_int_in
from ..attention import masked_softmax
from ..masks import causal_mask, padding_mask, sliding_window_mask
from .core import AttentionFrame, BlitView, LiveAttentionWidget
from .panels import AttentionPanel, TextSprites


class CaptionedView(BlitView):
    """An attention heatmap and its entropy view over the frame's two ``caption`` lines."""

    CAPTION_PT, LINE_SPACING = 9, 1.35

    def __init__(self, figsize: tuple[float, float], *, title: str,
                 max_shape: tuple[int, int] | None = None,
                 axis_names: tuple[str, str] = ("key", "query"),
                 entropy_title: str = "entropy per query"):
        super().__init__(figsize)
        bottom = (2 * 12 + 8) / (figsize[1] * 72)                     # room for the caption
        grid = self.figure.add_gridspec(1, 1, left=0.01, right=0.99, bottom=bottom, top=0.99)
        self.panel = AttentionPanel(self.blit, grid[0], title=title, max_shape=max_shape,
                                    entropy_title=entropy_title)
        self.axis_names = axis_names
        self.caption = TextSprites(self.blit, self.figure.transFigure, size=self.CAPTION_PT,
                                   ha="left", va="bottom")
        self._pitch = self.CAPTION_PT * self.LINE_SPACING / 72 / figsize[1]  # a line, in figure

    def draw(self, frame: AttentionFrame) -> None:
        self.panel.set_frame(frame)                      # a relayout names the axes key and query
        self.panel.cells.colors[torch.as_tensor(frame.weights).isnan().numpy()] = NAN_RGBA
        self.panel.ax_map.set(xlabel=self.axis_names[0], ylabel=self.axis_names[1])
        lines = frame.caption
        self.caption.set(lines, [(0.015, 0.012 + (len(lines) - 1 - i) * self._pitch)
                                 for i in range(len(lines))])


PAD, NAN_RGBA = "<pad>", (214, 39, 40, 255)             # NaN cells red, not the colour of 0
BATCH_SENTENCES = (("the", "cat", "sat", "on", "the", "warm", "mat", "today"),
                   ("dogs", "bark", "at", "night", "too", "loudly", "again", "now"))
MASK_TYPES = ("none", "causal", "padding", "causal + padding", "sliding window (causal)",
              "sliding window (both sides)", "sliding window (causal) + padding")
PLACEMENTS = ("mask before the softmax", "zero after", "zero after, renormalise")   # section 2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_mask(mask_type: str, n: int, window: int, length: int) -> torch.Tensor | None:
    """``(n, n)`` bool mask of ``length`` real tokens padded to ``n`` (``None``: "none"), parts ANDed."""
    if mask_type not in MASK_TYPES:
        raise ValueError(f"mask_type must be one of {MASK_TYPES}, got {mask_type!r}")
    if mask_type == "none":
        return None
    mask = causal_mask(n) if mask_type.startswith("causal") else torch.ones(n, n, dtype=torch.bool)
    if "window" in mask_type:
        mask = mask & sliding_window_mask(n, window, causal="causal" in mask_type)
    if "padding" in mask_type:
        mask = mask & padding_mask([length], n)          # (1, n): keys beyond length, every row
    return mask


class MaskingFrame(AttentionFrame):
    @property
    def entropy(self) -> torch.Tensor:
        """``-sum a ln a`` of each row; NaN for a row that sums to neither 1 nor 0 (within 1e-2)."""
        w = torch.as_tensor(self.weights, dtype=torch.float64)
        ok = ((w.sum(-1) - 1).abs() <= 1e-2) | (w.sum(-1) == 0)
        return torch.where(ok, -(w * w.clamp_min(1e-300).log()).sum(-1), torch.nan)


def masking_frame(mask_type: str, window: int, length_a: int, length_b: int, sequence: str = "A",
                  placement: str = PLACEMENTS[0], dtype: str = "float32", scale: int = 1
                  ) -> MaskingFrame:
    """Sentence ``sequence``'s weights in a batch of two of ``length_a``, ``length_b`` (1..8) tokens
    padded to the longer: ``mask_type`` applied by ``placement``, in ``dtype``, scores x ``scale``."""
    for name, value, allowed in (("sequence", sequence, ("A", "B")), ("dtype", dtype, tuple(DTYPES)),
                                 ("placement", placement, PLACEMENTS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    for name, value, most in (("length_a", length_a, 8), ("length_b", length_b, 8),
                              ("window", window, float("inf")), ("scale", scale, float("inf"))):
        require_int_in(name, value, 1, most)
    index = "AB".index(sequence)
    n, length = max(length_a, length_b), (length_a, length_b)[index]
    labels = [*BATCH_SENTENCES[index][:length], *[PAD] * (n - length)]
    mask = build_mask(mask_type, n, window, length)
    shown = torch.ones(n, n, dtype=torch.bool) if mask is None else mask
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, n, 8, generator=g, dtype=torch.float64)[index] for _ in range(2))
    scores = (q @ k.T * scale / 8**0.5).to(DTYPES[dtype])                # (n, n), in dtype
    weights = torch.softmax(scores, -1) * shown                          # zeroed after the softmax
    if placement == PLACEMENTS[0]:
        weights = masked_softmax(scores, mask)
    elif placement == PLACEMENTS[2]:
        weights = weights / weights.sum(-1, keepdim=True)                # an empty row: 0 / 0
    frame = MaskingFrame(weights.double(), labels, labels, mask=shown)
    visible, masked = shown.sum(-1).tolist(), int((~shown).sum())
    rows = int((frame.entropy.isfinite() & shown.any(-1)).sum())          # sum to 1 within 1e-2
    nan_rows = int(weights.isnan().any(-1).sum())
    frame.readouts = {"padded length n": n, "visible keys per query": visible, "masked cells": masked,
                      "entropy ceilings ln(visible)": [round(x, 3) for x in frame.ceiling.tolist()],
                      "rows summing to 1": rows, "rows with NaN": nan_rows,
                      "mean entropy over real queries (nats)": frame.entropy[:length].nanmean().item()}
    frame.caption = (f"mask: {mask_type}  |  window w = {window}  |  lengths A = {length_a}, "
                     f"B = {length_b}  |  showing {sequence}",
                     f"{placement}, {dtype}, scores x {scale}  |  rows summing to 1: {rows} of {n}"
                     f"  |  rows with NaN (red): {nan_rows}")
    return frame


def masking_widget() -> LiveAttentionWidget:
    """Notebook 05's widget: mask, window, lengths, where the mask goes, dtype, a factor on scores."""
    full = len(BATCH_SENTENCES[0])
    controls = {
        "mask_type": widgets.Dropdown(options=MASK_TYPES, value="causal", description="mask"),
        "window": widgets.IntSlider(value=3, min=1, max=full, description="window"),
        "length_a": widgets.IntSlider(value=full, min=1, max=full, description="length A"),
        "length_b": widgets.IntSlider(value=5, min=1, max=full, description="length B"),
        "sequence": widgets.ToggleButtons(options=["A", "B"], value="A", description="show"),
        "placement": widgets.Dropdown(options=PLACEMENTS, value=PLACEMENTS[0], description="softmax"),
        "dtype": widgets.Dropdown(options=tuple(DTYPES), value="float32", description="dtype"),
        "scale": widgets.IntSlider(value=1, min=1, max=60, description="scores x"),
    }
    view = CaptionedView((7.0, 5.0), title="attention weights (grey: masked, red: NaN)",
                         max_shape=(full, full))
    return LiveAttentionWidget(masking_frame, controls, view,
                               title="Masks: who may see whom (grey cells are masked)")


# The notebook's figures, out of its main path (their source: Going deeper).

def plot_masks(masks: dict[str, torch.Tensor], tokens: list[str]) -> None:
    """Section 1: boolean ``(n, n)`` masks on a 2 x 2 grid, True = may attend."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 8))
    for ax, (title, mask) in zip(axes.flat, masks.items(), strict=True):
        plots.heatmap(mask.float(), tokens, tokens, ax=ax, mask=mask, title=title, colorbar=False)
        ax.tick_params(axis="x", labelrotation=45)
    fig.suptitle("yellow = may attend, grey = masked")
    plt.show()


def plot_weights(maps: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Section 2: attention weights ``(n, n)`` side by side on one colour scale."""
    positions = [str(p) for p in range(mask.shape[-1])]
    fig, axes = plt.subplots(1, len(maps), figsize=(12.5, 3.6), layout="constrained")
    for ax, (title, weights) in zip(axes, maps.items(), strict=True):
        mesh = plots.heatmap(weights, positions, positions, ax=ax, mask=mask, title=title,
                             colorbar=False)
    fig.colorbar(mesh, ax=axes, label="attention weight (one scale for all three maps)")
    plt.show()

