"""Notebook 00's warm-up widget: its five readouts and its temperature slider."""

from __future__ import annotations

import pytest
import torch

import attn_helpers as ah
from attn_helpers.widgets import start_here as warmup


def test_the_widget_reads_out_its_rows_under_the_causal_mask_the_score_std_and_t_over_root_8():
    frame = warmup.warmup_frame(1.0, causal=True)
    weights = ah.masked_softmax(warmup.warmup_scores(), ah.causal_mask(6))
    entropy = ah.attention_entropy(weights)
    assert frame.readouts == {
        "mean entropy (nats)": f"{entropy.mean():.2f}",
        "mean largest weight": f"{weights.amax(-1).mean():.2f}",
        "effective keys (mean e^H)": f"{entropy.exp().mean():.2f}",
        "std of s / T (all scores)": f"{warmup.warmup_scores().std():.2f}",   # the mask does not enter
        warmup.READOUT_SCALING: "0.35"}
    root_8 = warmup.warmup_frame(8 ** 0.5).readouts                           # T = sqrt(d_k)
    assert (root_8["std of s / T (all scores)"], root_8[warmup.READOUT_SCALING]) == ("0.82", "1.00")
    assert torch.equal(frame.weights, weights)


def test_the_slider_reaches_a_temperature_of_0_05_and_refuses_one_below_its_minimum():
    widget = warmup.warmup_widget()
    readouts = widget.set(temperature=0.05)
    assert widget.controls["temperature"].value == pytest.approx(0.05)
    assert float(readouts["mean largest weight"]) > 0.9                    # T = 0.05: sharp rows
    with pytest.raises(ValueError, match="temperature must be between 0.01 and 10"):
        widget.set(temperature=0.005)
    assert widget.controls["temperature"].value == pytest.approx(0.05)           # not moved
