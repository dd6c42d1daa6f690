"""Notebook 08's widget (``widgets.complexity``): predictions from the fitted power laws and
the live widget."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from attn_helpers.lessons import complexity as cx
from attn_helpers.widgets.complexity import (
    FIT_N_MIN,
    ComplexityView,
    complexity_frame,
    complexity_widget,
)


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA")).astype(int)


def test_complexity_frame_is_pure_and_predicts_from_the_fits():
    records = cx.load_benchmark()
    fits = cx.fit_methods(records, "median_ms", n_min=FIT_N_MIN)
    frame = complexity_frame(4096, ["naive", "linear"], records)
    assert frame.methods == ("linear", "naive") and frame.n == 4096 and not frame.extrapolated
    assert math.isclose(frame.predicted_ms["naive"], fits["naive"].predict(4096))
    assert frame.score_bytes == cx.score_matrix_bytes(4096, heads=8)
    assert frame.readouts["score matrix, 8 heads, float32"] == "512 MiB"
    assert complexity_frame(65536, ["naive"], records).extrapolated
    with pytest.raises(ValueError, match="methods"):
        complexity_frame(1024, ["fast"], records)
    with pytest.raises(ValueError, match="n must be"):
        complexity_frame(0, ["naive"], records)


def test_widget_moves_and_toggles_curves():
    w = complexity_widget()
    assert w.error is None and w.frame.n == 2048
    before = decode(w.image.value)
    readouts = w.set(n=16384.0, naive=False)
    assert w.error is None and w.frame.n == 16384 and "naive" not in w.frame.methods
    assert "naive: predicted time" not in readouts and "tiled: predicted time" in readouts
    after = decode(w.image.value)
    assert before.shape == after.shape and (before != after).any()
    view = w.view
    assert isinstance(view, ComplexityView) and not view.curves["naive"][0].get_visible()
