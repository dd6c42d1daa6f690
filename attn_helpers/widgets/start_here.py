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
READOUT_NORMALISED = "mean H / ln(keys seen) (rows seeing 2+ keys)"   # a row seeing 1 key has no spread
READOUT_SCALING = "T / √8 (1 = Transformer scaling)"   # marks T = sqrt(d_k), d_k = 8, on the slider
READOUT_SLOPE = "softmax slope (mean largest |∂a/∂z|, z = s / T)"   # J = diag(a) - a a^T, <= 1/4


def warmup_scores(seed: int = WARMUP_SEED) -> torch.Tensor:
    """``(6, 6)`` seeded scores ``q @ k^T`` of random 8-d queries and keys (not a model's)."""
    generator = torch.Generator().manual_seed(seed)
    queries, keys = torch.randn(2, len(WARMUP_TOKENS), 8, generator=generator, dtype=torch.float64)
    return queries @ keys.T


def warmup_frame(temperature: float, causal: bool = False) -> AttentionFrame:
    """Weights ``softmax(scores / temperature)``, optionally with a causal mask."""
    require_number("temperature", temperature, positive=True)
    mask = causal_mask(len(WARMUP_TOKENS)) if causal else None
    weights = masked_softmax(warmup_scores() / temperature, mask)
    frame = AttentionFrame(weights, WARMUP_TOKENS, WARMUP_TOKENS, mask=mask)
    jacobian = torch.diag_embed(weights) - weights[:, :, None] * weights[:, None, :]   # (n, n, n)
    frame.readouts = {  # two decimals: the digits every CPU agrees on (notebook 00 prints them)
        "mean entropy (nats)": f"{frame.entropy.mean().item():.2f}",
        READOUT_NORMALISED: f"{normalised_entropy(frame.entropy, mask).item():.2f}",
        "mean largest weight": f"{max_weight(weights).mean().item():.2f}",
        "effective keys (mean e^H)": f"{frame.entropy.exp().mean().item():.2f}",
        READOUT_SLOPE: f"{jacobian.abs().amax((-2, -1)).mean().item():.2f}",   # per row, then mean
        READOUT_SCALING: f"{temperature / 8 ** 0.5:.2f}"}
    return frame


def normalised_entropy(entropy: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``entropy (..., n_q)``, one per row, ``mask (n_q, n_k)`` (None: ``n_k = n_q`` keys seen)
    -> ``(...)``: the mean of ``H_i / ln(keys row i sees)`` over the rows that see 2+ keys."""
    if not isinstance(entropy, torch.Tensor) or entropy.dim() < 1:
        got = getattr(entropy, "shape", entropy)
        raise ValueError(f"entropy must be a (..., n_q) tensor, got {got}")
    n_q = entropy.shape[-1]
    if mask is not None and (mask.dim() != 2 or mask.shape[0] != n_q):
        raise ValueError(f"mask must be (n_q, n_k) with n_q = {n_q}, got {tuple(mask.shape)}")
    seen = torch.full((n_q,), n_q) if mask is None else mask.sum(-1)
    rows = seen > 1
    if not rows.any():
        raise ValueError("every row sees one key: no row has a ceiling above ln 1 = 0")
    return (entropy[..., rows] / seen[rows].to(entropy.dtype).log()).mean(-1)


def warmup_widget() -> LiveAttentionWidget:
    """A temperature slider and a causal toggle over a six-token attention heatmap."""
    controls = {"temperature": widgets.FloatLogSlider(value=1.0, base=10, min=-2.0, max=1.0,
                                                      step=0.05, description="temperature"),
                "causal": widgets.Checkbox(value=False, description="causal mask")}
    view = AttentionView(figsize=(6.6, 4.0), title="weights from random scores (words are labels)")
    return LiveAttentionWidget(warmup_frame, controls, view,
                               title="Warm-up: sharpen or flatten the attention (random scores)")
