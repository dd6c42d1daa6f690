"""Notebook 03's widget: the pure frame against an independent computation, and the live view."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.entropy import attention_entropy
from attn_helpers.widgets.scaling import D_K_OPTIONS, STD, TAU, scaling_frame, scaling_widget


@pytest.mark.parametrize("d_k, scaled, temperature", [(1024, False, 1.0), (4, True, 0.2)])
def test_scaling_frame_independent(d_k, scaled, temperature):
    frame = scaling_frame(d_k, scaled, temperature, seed=3)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(8, 1024, generator=g, dtype=torch.float64)[:, :d_k] for _ in range(2))
    tau = (math.sqrt(d_k) if scaled else 1.0) * temperature     # notebook 03's tau = sqrt(d_k) T or T
    scores = q @ k.T / tau
    weights = torch.softmax(scores, -1)
    torch.testing.assert_close(frame.weights, weights)
    r = {name: pytest.approx(float(text), rel=0.05) for name, text in frame.readouts.items()}  # 2 digits
    assert r[TAU] == tau
    assert r[STD] == scores.std().item()
    assert r["largest weight (mean over rows)"] == weights.amax(-1).mean().item()
    jac = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]
    assert r["softmax gain |J| (mean over rows)"] == jac.square().sum((-2, -1)).sqrt().mean().item()
    assert r["entropy (mean, nats)"] == attention_entropy(weights).mean().item()


def test_scaling_frame_bad_inputs():
    with pytest.raises(ValueError, match="d_k"):
        scaling_frame(3, True, 1.0)
    with pytest.raises(TypeError, match="scaled"):
        scaling_frame(4, "yes", 1.0)
    with pytest.raises(ValueError, match="temperature"):
        scaling_frame(4, True, -1.0)


def test_the_widget_names_t_and_tau_as_notebook_03_does():
    """Notebook 03 calls the slider's temperature T and the whole divisor tau = sqrt(d_k) T (scaled)
    or T (unscaled): the slider, the title and the readouts use those symbols, nothing else."""
    widget = scaling_widget(d_k=64, scaled=True, temperature=0.5)
    assert widget.controls["temperature"].description == "temperature T"
    assert "temperature T" in widget.title and "tau" not in widget.title.lower()
    assert TAU.startswith("divisor τ") and STD.endswith("/ τ") and TAU in widget.readouts
    assert float(widget.readouts[TAU]) == pytest.approx(math.sqrt(64) * 0.5)
    widget.set(scaled=False)
    assert float(widget.readouts[TAU]) == pytest.approx(0.5)
    assert not any("temperature" in name or "tau" in name for name in widget.readouts)


def test_the_widget_opens_as_asked_and_the_picture_states_the_settings():
    """The stored picture opens on the state the notebook asks for; the line pasted into it names
    the settings, the readouts are the widget's table only."""
    widget = scaling_widget(d_k=1024, scaled=False)
    assert widget.error is None and widget.renders == 1
    assert widget.values == {"d_k": 1024, "scaled": False, "temperature": 1.0}
    assert list(widget.controls["d_k"].options) == list(D_K_OPTIONS)
    assert 10 ** widget.controls["temperature"].max > math.sqrt(1024)   # T can undo unscaled 1024
    assert widget.view.lines.texts == ["d_k = 1024   |   divided by sqrt(d_k): no   |   "
                                       "temperature T = 1   |   τ = 1"]
    assert float(widget.readouts["largest weight (mean over rows)"]) > 0.95
    assert "largest weight" in widget.readout_html.value
    before = widget.image.value
    widget.set(scaled=True)
    assert "divided by sqrt(d_k): yes" in widget.view.lines.texts[0]
    assert widget.view.lines.texts[0].endswith("temperature T = 1   |   τ = 32")   # tau = sqrt(1024) T
    assert widget.readouts[TAU] == "32"
    assert float(widget.readouts["largest weight (mean over rows)"]) < 0.5
    assert widget.image.value != before
