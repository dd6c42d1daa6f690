"""Notebook 03's widget: random queries and keys of size d_k, with or without the 1/sqrt(d_k)
scaling, and a temperature."""

from __future__ import annotations

import math

import ipywidgets as widgets
import torch

from ..lessons.scaling import jacobian_norm
from .core import AttentionFrame, AttentionView, LiveAttentionWidget

__all__ = ["D_K_OPTIONS", "scaling_frame", "scaling_widget"]

D_K_OPTIONS = tuple(2 ** i for i in range(11))  # 1 .. 1024
N_TOKENS = 8


def _vectors(seed: int, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_tokens, D_K_OPTIONS[-1], generator=g, dtype=torch.float64)
    k = torch.randn(n_tokens, D_K_OPTIONS[-1], generator=g, dtype=torch.float64)
    return q, k


def scaling_frame(
    d_k: int, scaled: bool, temperature: float, *, n_tokens: int = N_TOKENS, seed: int = 0,
) -> AttentionFrame:
    """Self-attention weights of ``n_tokens`` random standard-normal queries and keys, using the
    first ``d_k`` components (so growing ``d_k`` adds components to the same vectors).

    Scores are ``q . k / (sqrt(d_k) if scaled else 1) / temperature``. Readouts: the divisor, the
    standard deviation of the scores, the mean largest weight, the mean entropy and the mean
    Frobenius norm of the softmax Jacobian (how much gradient can reach the scores).
    """
    if d_k not in D_K_OPTIONS:
        raise ValueError(f"d_k must be a power of two in {D_K_OPTIONS}, got {d_k!r}")
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {type(scaled).__name__}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q, k = _vectors(seed, n_tokens)
    q, k = q[:, :d_k], k[:, :d_k]
    divisor = (math.sqrt(d_k) if scaled else 1.0) * temperature
    scores = q @ k.T / divisor
    weights = torch.softmax(scores, dim=-1)
    frame = AttentionFrame(
        weights=weights,
        query_labels=[f"q{i}" for i in range(n_tokens)],
        key_labels=[f"k{i}" for i in range(n_tokens)],
    )
    frame.readouts = {
        "scores divided by": round(divisor, 4),
        "std of scores": scores.std().item(),
        "largest weight (mean over rows)": weights.amax(-1).mean().item(),
        "entropy (mean, nats)": frame.entropy.mean().item(),
        "gradient norm |J| (mean over rows)": jacobian_norm(weights).mean().item(),
    }
    return frame


def scaling_widget(seed: int = 0) -> LiveAttentionWidget:
    """The live widget of notebook 03: d_k (powers of two), scaling on/off, temperature."""
    controls = {
        "d_k": widgets.SelectionSlider(options=list(D_K_OPTIONS), value=64, description="d_k",
                                       continuous_update=True,
                                       layout=widgets.Layout(width="320px")),
        "scaled": widgets.Checkbox(value=True, description="divide by sqrt(d_k)"),
        "temperature": widgets.FloatLogSlider(value=1.0, base=10, min=-1.0, max=1.0, step=0.05,
                                              description="temperature",
                                              layout=widgets.Layout(width="320px")),
    }

    def compute(d_k, scaled, temperature):
        return scaling_frame(d_k, scaled, temperature, seed=seed)

    return LiveAttentionWidget(compute, controls, AttentionView(figsize=(6.8, 4.3)),
                               title="Scores of size d_k: with and without the scaling")
