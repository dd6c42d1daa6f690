"""Notebook 00's warm-up readout: the mean entropy over each row's own ceiling."""

from __future__ import annotations

import math

import pytest
import torch

import attn_helpers as ah
from attn_helpers.widgets import start_here as warmup


def test_normalised_entropy_is_one_for_even_rows_and_a_mean_per_draw_in_a_batch():
    mask = ah.causal_mask(5)
    weights = ah.masked_softmax(torch.zeros(5, 5, dtype=torch.float64), mask)  # even over seen
    entropy = ah.attention_entropy(weights)
    assert float(warmup.normalised_entropy(entropy, mask)) == pytest.approx(1.0, abs=1e-12)
    assert float(warmup.normalised_entropy(entropy)) == pytest.approx(          # ln 5 ceilings
        float(entropy.mean()) / math.log(5), abs=1e-12)
    entropy = torch.rand(3, 2, 5, dtype=torch.float64)                          # (draws..., n_q)
    batched = warmup.normalised_entropy(entropy, mask)
    assert batched.shape == (3, 2)
    assert float(batched[0, 0]) == pytest.approx(                               # rows 1-4 only
        float((entropy[0, 0, 1:] / torch.arange(2, 6, dtype=torch.float64).log()).mean()))
    assert torch.equal(batched[2, 1], warmup.normalised_entropy(entropy[2, 1], mask))


def test_the_widget_reads_out_the_normalised_entropy_under_the_causal_mask():
    frame = warmup.warmup_frame(1.0, causal=True)
    expected = (frame.entropy[1:] / torch.arange(2, 7, dtype=torch.float64).log()).mean().item()
    assert frame.readouts[warmup.READOUT_NORMALISED] == f"{expected:.2f}"
    assert warmup.warmup_frame(8 ** 0.5).readouts[warmup.READOUT_SCALING] == "1.00"   # T = sqrt(d_k)
    slopes = torch.stack([torch.autograd.functional.jacobian(torch.nn.Softmax(-1), z).abs().amax()
                          for z in warmup.warmup_scores() / 0.5])            # autograd's, T = 0.5
    assert warmup.warmup_frame(0.5).readouts[warmup.READOUT_SLOPE] == f"{slopes.mean():.2f}"


def test_the_slider_reaches_a_temperature_of_0_05_and_refuses_one_below_its_minimum():
    widget = warmup.warmup_widget()
    readouts = widget.set(temperature=0.05)
    assert widget.controls["temperature"].value == pytest.approx(0.05)
    assert float(readouts["mean largest weight"]) > 0.9                    # T = 0.05: sharp rows
    with pytest.raises(ValueError, match="temperature must be between 0.01 and 10"):
        widget.set(temperature=0.005)
    assert widget.controls["temperature"].value == pytest.approx(0.05)           # not moved


@pytest.mark.parametrize("entropy, mask, fragment", [
    (torch.tensor(1.0), None, "entropy must be a (..., n_q) tensor"),
    ([1.0, 2.0], None, "entropy must be a (..., n_q) tensor"),
    (torch.ones(3), torch.ones(4, 4, dtype=torch.bool), "mask must be (n_q, n_k) with n_q = 3"),
    (torch.ones(1), torch.ones(1, 1, dtype=torch.bool), "every row sees one key"),
])
def test_normalised_entropy_names_a_wrong_argument(entropy, mask, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        warmup.normalised_entropy(entropy, mask)
