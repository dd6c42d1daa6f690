"""Notebook 05: the masking widget (pure function, grey masked cells, entropy ceilings)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from PIL import Image

from attn_helpers.masks import causal_mask, sliding_window_mask
from attn_helpers.plots import MASKED_COLOR
from attn_helpers.widgets import masking as mw
from attn_helpers.widgets.masking import MASK_TYPES, PAD, build_mask, masking_frame, masking_widget


@pytest.mark.parametrize("mask_type", MASK_TYPES)
@pytest.mark.parametrize("length_a, length_b, sequence", [(8, 5, "A"), (8, 5, "B"), (3, 6, "A")])
def test_frame_rows_ceilings_and_labels(mask_type, length_a, length_b, sequence):
    frame = masking_frame(mask_type, 3, length_a, length_b, sequence)
    n = max(length_a, length_b)
    length = length_a if sequence == "A" else length_b
    assert frame.weights.shape == (n, n)
    assert list(frame.key_labels[length:]) == [PAD] * (n - length)
    visible = frame.mask.sum(-1)
    assert torch.all(frame.weights[~frame.mask] == 0)
    rows = frame.weights.sum(-1)
    assert torch.allclose(rows[visible > 0], torch.ones_like(rows[visible > 0]))
    assert torch.allclose(frame.ceiling, torch.log(visible.clamp_min(1).double()))
    assert torch.all(frame.entropy <= frame.ceiling + 1e-9)
    real_rows = frame.weights[:length]                # the readout skips the pad queries
    assert frame.readouts["mean entropy over real queries (nats)"] == pytest.approx(
        float(-(real_rows * real_rows.clamp_min(1e-300).log()).sum(-1).mean()))
    if "padding" in mask_type:
        assert not frame.mask[:, length:].any()


def test_build_mask_is_the_and_of_its_parts():
    n = 6
    padding = torch.arange(n) < 4
    assert build_mask("none", n, 2, 4) is None
    assert torch.equal(build_mask("causal", n, 2, 4), causal_mask(n))
    assert torch.equal(build_mask("causal + padding", n, 2, 4), causal_mask(n) & padding)
    assert torch.equal(build_mask("sliding window (both sides)", n, 2, 4),
                       sliding_window_mask(n, 2, causal=False))
    assert torch.equal(build_mask("sliding window (causal) + padding", n, 2, 4),
                       sliding_window_mask(n, 2) & padding)


@pytest.mark.parametrize("kwargs, match", [
    ({"mask_type": "diagonal"}, "mask_type"), ({"window": 0}, "window"),
    ({"length_a": 0}, "length_a"), ({"length_b": 9}, "length_b"), ({"sequence": "C"}, "sequence"),
    ({"placement": "after"}, "placement"), ({"dtype": "float64"}, "dtype"), ({"scale": 0}, "scale"),
])
def test_frame_bad_inputs(kwargs, match):
    args = {"mask_type": "causal", "window": 2, "length_a": 8, "length_b": 5, "sequence": "A", **kwargs}
    with pytest.raises(ValueError, match=match):
        masking_frame(**args)


def test_float16_rows_turn_nan_only_when_zeroed_and_renormalised():
    frames = [masking_frame("causal", 3, 8, 5, "A", p, "float16", 30) for p in mw.PLACEMENTS]
    assert [f.readouts["rows with NaN"] for f in frames] == [0, 0, 1]
    assert frames[1].readouts["rows summing to 1"] < frames[0].readouts["rows summing to 1"] == 8


def test_cells_grey_where_masked_red_where_nan_and_the_caption_pasted_by_blitting():
    """Masked cells grey; NaN cells red; the caption lines (settings and readouts) are in the
    picture, one sprite a line, and a move redraws them without a full redraw of the figure."""
    widget = masking_widget()
    view = widget.view
    background = view.blit._background
    widget.set(mask_type="causal + padding", length_b=3)
    assert widget.error is None and view.blit._background is background
    assert widget.frame.readouts["masked cells"] == int((~widget.frame.mask).sum())
    assert view.caption.texts == list(widget.frame.caption) and len(view.caption.texts) == 2
    assert "mask: causal + padding" in view.caption.texts[0]

    def pixels(rgba) -> int:                          # how many pixels have this colour
        image = np.asarray(Image.open(io.BytesIO(widget.image.value)).convert("RGBA")).astype(int)
        return int((np.abs(image - np.array(rgba)).max(-1) <= 2).sum())

    def strip(png: bytes) -> np.ndarray:            # the caption's rows, under the panels
        return np.asarray(Image.open(io.BytesIO(png)).convert("L")).astype(int)[-32:]

    assert pixels([round(255 * c) for c in to_rgba(MASKED_COLOR)]) > 500   # masked cells
    before = strip(widget.image.value)
    assert (before < 100).sum() > 300                 # dark text pixels
    widget.set(mask_type="causal", length_b=6, placement=mw.PLACEMENTS[2], dtype="float16", scale=30)
    assert np.abs(strip(widget.image.value) - before).max() > 100   # the caption changed
    assert pixels(mw.NAN_RGBA) > 500                  # one NaN row, red
