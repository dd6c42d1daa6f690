"""Notebook 03's widget: random queries and keys of size d_k, scaling on or off, a temperature."""

from __future__ import annotations

import math
from functools import partial

import ipywidgets as widgets
import torch

from .._checks import require_bool, require_number
from ..lessons.scaling import jacobian_norm
from .core import AttentionFrame, AttentionPanel, BlitView, LiveAttentionWidget
from .panels import TextSprites

D_K_OPTIONS = tuple(2 ** i for i in range(11))  # 1 .. 1024
N_TOKENS = 8
TAU = "divisor τ (scaled: sqrt(d_k)·T, unscaled: T)"    # readout names, in the notebook's symbols
STD = "std of the scores q.k / τ"


def _two_digits(value: float) -> str:
    """Two significant figures as plain decimals, at most four places: 28, 1.7, 0.048."""
    return f"{value:.{min(4, max(0, 1 - math.floor(math.log10(abs(value) or 1.0))))}f}"


def scaling_frame(d_k: int, scaled: bool, temperature: float, *, seed: int = 0) -> AttentionFrame:
    """Weights of random N(0, 1) queries and keys cut to d_k, in notebook 03's symbols: the
    temperature T acts on top of the scaling, so q . k is divided by τ = sqrt(d_k) T if scaled,
    by τ = T if not."""
    if d_k not in D_K_OPTIONS:
        raise ValueError(f"d_k must be a power of two in {D_K_OPTIONS}, got {d_k!r}")
    require_bool("scaled", scaled)
    require_number("temperature", temperature, positive=True)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, N_TOKENS, D_K_OPTIONS[-1], generator=g, dtype=torch.float64)[..., :d_k]
    tau = (math.sqrt(d_k) if scaled else 1.0) * temperature          # the whole divisor of q . k
    scores = q @ k.T / tau
    weights = torch.softmax(scores, dim=-1)
    frame = AttentionFrame(weights=weights, query_labels=[f"q{i}" for i in range(N_TOKENS)],
                           key_labels=[f"k{i}" for i in range(N_TOKENS)])
    frame.settings = (f"d_k = {d_k}   |   divided by sqrt(d_k): {'yes' if scaled else 'no'}   |   "
                      f"temperature T = {temperature:.3g}   |   τ = {tau:.3g}")   # drawn in
    frame.readouts = {TAU: f"{tau:.3g}"} | {  # one 8 x 8 draw: two digits
        name: _two_digits(value.item()) for name, value in [
            (STD, scores.std()),
            ("largest weight (mean over rows)", weights.amax(-1).mean()),
            ("entropy (mean, nats)", frame.entropy.mean()),
            ("softmax gain |J| (mean over rows)", jacobian_norm(weights).mean())]}
    return frame


class ScalingView(BlitView):
    """The heatmap and entropy view, with the settings in a line under the map."""

    def __init__(self):
        super().__init__((6.8, 4.4))
        grid = self.figure.add_gridspec(1, 1, left=0.01, right=0.99, bottom=0.08, top=0.99)
        self.panel = AttentionPanel(self.blit, grid[0], title="attention weights of 8 random queries",
                                    entropy_xlabel="nats (dashes: ln n)")
        self.lines = TextSprites(self.blit, self.figure.transFigure, size=9, ha="left", va="center")

    def draw(self, frame: AttentionFrame) -> None:
        self.panel.set_frame(frame)
        self.lines.set([frame.settings], [(0.02, 0.035)])


def scaling_widget(seed: int = 0, *, d_k: int = 64, scaled: bool = True,
                   temperature: float = 1.0) -> LiveAttentionWidget:
    """Notebook 03's live widget: d_k (powers of two), scaling on/off, T 0.1 .. 100 (past sqrt(1024))."""
    controls = {
        "d_k": widgets.SelectionSlider(options=list(D_K_OPTIONS), value=d_k, description="d_k",
                                       continuous_update=True, layout=widgets.Layout(width="320px")),
        "scaled": widgets.Checkbox(value=scaled, description="divide by sqrt(d_k)"),
        "temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1.0, max=2.0, step=0.05,
                                              description="temperature T",
                                              style={"description_width": "initial"},
                                              layout=widgets.Layout(width="360px")),
    }
    title = "d_k, 1/sqrt(d_k) scaling, temperature T: weights of 8 queries (left), entropy (right)"
    return LiveAttentionWidget(partial(scaling_frame, seed=seed), controls, ScalingView(), title=title)
