"""Notebook 03's widget (``widgets.scaling``): the pure frame against an independent
computation, and the live widget."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.entropy import attention_entropy
from attn_helpers.widgets.scaling import (
    D_K_OPTIONS,
    scaling_frame,
    scaling_widget,
    settings_line,
)


@pytest.mark.parametrize("d_k, scaled, temperature", [(64, True, 1.0), (1024, False, 1.0),
                                                      (4, True, 0.2), (1, False, 3.0)])
def test_scaling_frame_independent(d_k, scaled, temperature):
    frame = scaling_frame(d_k, scaled, temperature, seed=3)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(8, 1024, generator=g, dtype=torch.float64)[:, :d_k]
    k = torch.randn(8, 1024, generator=g, dtype=torch.float64)[:, :d_k]
    divisor = (math.sqrt(d_k) if scaled else 1.0) * temperature
    weights = torch.softmax(q @ k.T / divisor, -1)
    torch.testing.assert_close(frame.weights, weights)
    r = frame.readouts
    assert r["scores divided by"] == pytest.approx(divisor, abs=1e-4)
    assert r["largest weight (mean over rows)"] == pytest.approx(weights.amax(-1).mean().item())
    jac = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]
    assert r["softmax gain |J| (mean over rows)"] == pytest.approx(
        jac.square().sum((-2, -1)).sqrt().mean().item())
    assert r["entropy (mean, nats)"] == pytest.approx(attention_entropy(weights).mean().item())


def test_scaling_frame_bad_inputs():
    with pytest.raises(ValueError, match="d_k"):
        scaling_frame(3, True, 1.0)
    with pytest.raises(TypeError, match="scaled"):
        scaling_frame(4, "yes", 1.0)
    with pytest.raises(ValueError, match="temperature"):
        scaling_frame(4, True, -1.0)


def test_scaling_widget_redraws_and_reports():
    widget = scaling_widget()
    assert widget.error is None and widget.renders == 1
    before = widget.image.value
    widget.set(d_k=1024, scaled=False)
    assert widget.image.value != before
    assert float(widget.readouts["largest weight (mean over rows)"]) > 0.95
    widget.set(scaled=True)
    assert float(widget.readouts["largest weight (mean over rows)"]) < 0.5
    assert list(widget.controls["d_k"].options) == list(D_K_OPTIONS)


def test_the_picture_states_the_settings_and_the_table_the_readouts():
    """The stored picture opens on the state the notebook asks for; the text pasted into it names
    the settings, and the readouts appear once, in the widget's table; the title names the three
    controls."""
    widget = scaling_widget(d_k=1024, scaled=False)
    assert widget.values == {"d_k": 1024, "scaled": False, "temperature": 1.0}
    frame = widget.frame
    assert frame.settings == {"d_k": 1024, "scaled": False, "temperature": 1.0}
    texts = widget.view.lines.texts
    assert texts == [settings_line(**frame.settings)]
    assert "d_k = 1024" in texts[0] and "divided by sqrt(d_k): no" in texts[0]
    assert "largest weight" in widget.readout_html.value and "largest weight" not in texts[0]
    assert all(word in widget.title for word in ("d_k", "scaling", "temperature", "entropy"))
    before = widget.image.value
    widget.set(scaled=True)
    assert "divided by sqrt(d_k): yes" in widget.view.lines.texts[0]
    assert widget.image.value != before
