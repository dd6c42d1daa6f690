"""Notebook 03's widget: the pure frame against an independent computation, and the live view."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.entropy import attention_entropy
from attn_helpers.widgets.scaling import D_K_OPTIONS, scaling_frame, scaling_widget


@pytest.mark.parametrize("d_k, scaled, temperature", [(1024, False, 1.0), (4, True, 0.2)])
def test_scaling_frame_independent(d_k, scaled, temperature):
    frame = scaling_frame(d_k, scaled, temperature, seed=3)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(8, 1024, generator=g, dtype=torch.float64)[:, :d_k] for _ in range(2))
    divisor = (math.sqrt(d_k) if scaled else 1.0) * temperature
    weights = torch.softmax(q @ k.T / divisor, -1)
    torch.testing.assert_close(frame.weights, weights)
    r = {name: pytest.approx(float(text), rel=0.05) for name, text in frame.readouts.items()}  # 2 digits
    assert r["scores divided by"] == divisor
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


def test_the_widget_opens_as_asked_and_the_picture_states_the_settings():
    """The stored picture opens on the state the notebook asks for; the line pasted into it names
    the settings, the readouts are the widget's table only."""
    widget = scaling_widget(d_k=1024, scaled=False)
    assert widget.error is None and widget.renders == 1
    assert widget.values == {"d_k": 1024, "scaled": False, "temperature": 1.0}
    assert list(widget.controls["d_k"].options) == list(D_K_OPTIONS)
    assert 10 ** widget.controls["temperature"].max > math.sqrt(1024)   # T can undo unscaled 1024
    assert widget.view.lines.texts == ["d_k = 1024   |   divided by sqrt(d_k): no   |   "
                                       "temperature T = 1"]
    assert float(widget.readouts["largest weight (mean over rows)"]) > 0.95
    assert "largest weight" in widget.readout_html.value
    before = widget.image.value
    widget.set(scaled=True)
    assert "divided by sqrt(d_k): yes" in widget.view.lines.texts[0]
    assert float(widget.readouts["largest weight (mean over rows)"]) < 0.5
    assert widget.image.value != before
