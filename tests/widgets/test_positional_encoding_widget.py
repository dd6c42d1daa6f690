"""Notebook 07's widget (``widgets.positional_encoding``): the pure frame function and the view
over it (moved from tests/core/test_positional.py)."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.widgets.positional_encoding import ENCODINGS, positional_frame, positional_widget


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_positional_frame(encoding):
    frame = positional_frame(encoding, 4, 3, 1)
    assert frame.weights.shape == (24, 24)
    assert torch.allclose(frame.weights.sum(-1), torch.ones(24, dtype=frame.weights.dtype))
    spread = float(frame.readouts["spread of PE(p) . PE(p+k) over all p"])
    if encoding == "learned (untrained)":
        assert spread > 1
    else:
        assert spread < 1e-9
        assert frame.readouts["PE(p) . PE(p+k)"] == frame.readouts["PE(0) . PE(k)"]
        assert torch.allclose(frame.pair_points.norm(dim=-1),
                              torch.ones(2, dtype=torch.float64))


def test_positional_frame_rotation_angle_and_errors():
    frame = positional_frame("sinusoidal", 0, 5, 0)
    assert float(frame.readouts["pair angle k * omega_i (rad)"]) == pytest.approx(5.0)
    for kwargs in ({"position": 24}, {"offset": 9}, {"pair": 8}, {"encoding": "cosine"}):
        args = {"encoding": "sinusoidal", "position": 0, "offset": 1, "pair": 0, **kwargs}
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            positional_frame(**args)


def test_positional_widget_moves_and_matches_the_pure_function():
    widget = positional_widget()
    assert widget.error is None
    first = widget.image.value
    readouts = widget.set(encoding="rope", position=10, offset=2, pair=2)
    assert widget.error is None and widget.image.value != first
    expected = positional_frame("rope", 10, 2, 2).readouts
    assert readouts == {k: f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in expected.items()}
