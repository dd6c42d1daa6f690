"""Notebook 00's warm-up readout: the mean entropy over each row's own ceiling."""

from __future__ import annotations

import math

import pytest
import torch

import attn_helpers as ah
from attn_helpers.widgets import start_here as warmup


def test_normalised_entropy_is_one_for_rows_spread_evenly_over_the_keys_they_see():
    mask = ah.causal_mask(5)
    weights = ah.masked_softmax(torch.zeros(5, 5, dtype=torch.float64), mask)  # even over seen
    entropy = ah.attention_entropy(weights)
    assert warmup.normalised_entropy(entropy, mask) == pytest.approx(1.0, abs=1e-12)
    assert warmup.normalised_entropy(entropy) == pytest.approx(                 # ln 5 ceilings
        float(entropy.mean()) / math.log(5), abs=1e-12)


def test_the_widget_reads_out_the_normalised_entropy_under_the_causal_mask():
    frame = warmup.warmup_frame(1.0, causal=True)
    seen = torch.arange(1, 7, dtype=torch.float64)
    expected = (frame.entropy[1:] / seen[1:].log()).mean().item()           # rows 1-5
    assert frame.readouts["mean H / ln(keys seen)"] == f"{expected:.2f}"


@pytest.mark.parametrize("entropy, mask, fragment", [
    (torch.ones(2, 3), None, "entropy must be a (n_q,) tensor"),
    (torch.ones(3), torch.ones(4, 4, dtype=torch.bool), "mask must be (n_q, n_k) with n_q = 3"),
])
def test_normalised_entropy_names_a_wrong_argument(entropy, mask, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        warmup.normalised_entropy(entropy, mask)
