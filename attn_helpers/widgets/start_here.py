"""Notebook 00's warm-up widget: how a temperature sharpens or flattens attention."""

from __future__ import annotations

import ipywidgets as widgets
import torch

from .._checks import require_number
from ..attention import masked_softmax
from ..entropy import max_weight
from ..masks import causal_mask
from .core import AttentionFrame, AttentionView, LiveAttentionWidget

WARMUP_TOKENS = ("how", "does", "attention", "really", "work", "?")
WARMUP_SEED = 5  # the smallest seed with a mean entropy below 0.1 nats at T = 0.1 (notebook 00)
READOUT_SCALING = "T / √8 (1 = Transformer scaling)"   # marks T = sqrt(d_k), d_k = 8, on the slider


def warmup_scores(seed: int = WARMUP_SEED) -> torch.Tensor:
    """``(6, 6)`` seeded scores ``q @ k^T`` of random 8-d queries and keys (not a model's)."""
    generator = torch.Generator().manual_seed(seed)
    queries, keys = torch.randn(2, len(WARMUP_TOKENS), 8, generator=generator, dtype=torch.float64)
    return queries @ keys.T


def warmup_frame(temperature: float, causal: bool = False) -> AttentionFrame:
    """Weights ``softmax(scores / temperature)``, optionally with a causal mask, and five readouts."""
    require_number("temperature", temperature, positive=True)
    mask = causal_mask(len(WARMUP_TOKENS)) if causal else None
    scores = warmup_scores() / temperature
    weights = masked_softmax(scores, mask)
    frame = AttentionFrame(weights, WARMUP_TOKENS, WARMUP_TOKENS, mask=mask)
    frame.readouts = {  # two decimals: the digits every CPU agrees on (notebook 00 prints them)
        "mean entropy (nats)": f"{frame.entropy.mean().item():.2f}",
        "mean largest weight": f"{max_weight(weights).mean().item():.2f}",
        "effective keys (mean e^H)": f"{frame.entropy.exp().mean().item():.2f}",
        "std of s / T (all scores)": f"{scores.std().item():.2f}",
        READOUT_SCALING: f"{temperature / 8 ** 0.5:.2f}"}
    return frame


def warmup_widget() -> LiveAttentionWidget:
    """A temperature slider and a causal toggle over a six-token attention heatmap."""
    controls = {"temperature": widgets.FloatLogSlider(value=1.0, base=10, min=-2.0, max=1.0,
                                                      step=0.05, description="temperature"),
                "causal": widgets.Checkbox(value=False, description="causal mask")}
    view = AttentionView(figsize=(6.6, 4.0), title="weights from random scores (words are labels)")
    return LiveAttentionWidget(warmup_frame, controls, view,
                               title="Warm-up: sharpen or flatten the attention (random scores)")
