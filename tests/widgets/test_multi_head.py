"""Notebook 04's widget (``widgets.multi_head``): frames, the view, moves, errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from attn_helpers.masks import causal_mask
from attn_helpers.widgets.multi_head import (
    ALL_HEADS,
    MultiHeadView,
    multihead_frame,
    multihead_widget,
)

# --- notebook 04's widget -------------------------------------------------------------------


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA")).astype(int)


@pytest.fixture
def example_weights(gen):
    weights = torch.softmax(torch.randn(3, 2, 4, 4, generator=gen, dtype=torch.float64), -1)
    labels = [[f"{c}{i}" for i in range(4)] for c in "ABC"]
    return weights, labels


def test_multihead_frame_is_pure_and_correct(example_weights):
    weights, labels = example_weights
    frame = multihead_frame(weights, labels, 1, 0)
    assert torch.equal(frame.weights, weights[1, 0]) and frame.head == 0
    grid = multihead_frame(weights, labels, 1, ALL_HEADS)
    assert grid.head is None and torch.allclose(grid.weights, weights[1].mean(0))
    entropy = -(weights[1] * weights[1].log()).sum(-1).mean(-1)
    torch.testing.assert_close(grid.head_entropy, entropy)
    assert grid.readouts["mean entropy per head (nats)"] == (
        f"head 0: {entropy[0].item():.4f}, head 1: {entropy[1].item():.4f}")
    strongest = labels[1][int(weights[1, 1, -1].argmax())]
    assert multihead_frame(weights, labels, 1, 1).readouts["last query's strongest key"] == (
        f"head 1: {strongest}")


@pytest.mark.parametrize("example, head, pattern", [
    (3, 0, "example"), (0, 2, "head"), (0, "some", "head"), (True, 0, "example"),
])
def test_multihead_frame_bad_inputs(example_weights, example, head, pattern):
    weights, labels = example_weights
    with pytest.raises(ValueError, match=pattern):
        multihead_frame(weights, labels, example, head)


def test_multihead_frame_bad_shapes(example_weights):
    weights, labels = example_weights
    with pytest.raises(ValueError, match="4-D"):
        multihead_frame(weights[0], labels, 0, 0)
    with pytest.raises(ValueError, match="labels"):
        multihead_frame(weights, labels[:2], 0, 0)
    with pytest.raises(ValueError, match="head_names"):
        multihead_frame(weights, labels, 0, 0, head_names=["a"])


def test_multihead_widget_switches_between_grid_and_single(example_weights):
    weights, labels = example_weights
    widget = multihead_widget(weights, labels, mask=causal_mask(4))
    assert widget.view.last_mode == "grid" and widget.error is None
    grid_png = decode(widget.image.value)
    figure = widget.view.grid.figure
    assert grid_png.shape[:2] == (round(figure.get_size_inches()[1] * figure.dpi),
                                  round(figure.get_size_inches()[0] * figure.dpi))
    widget.set(head=1)
    assert widget.view.last_mode == "single"
    single = decode(widget.image.value)
    assert single.shape != grid_png.shape
    widget.set(example=2)
    assert not np.array_equal(single, decode(widget.image.value))
    assert torch.equal(widget.frame.weights, weights[2, 1])
    widget.set(head=ALL_HEADS)
    assert widget.view.last_mode == "grid" and widget.renders == 4


def test_multihead_view_rejects_wrong_number_of_heads(example_weights):
    weights, labels = example_weights
    view = MultiHeadView(3)
    with pytest.raises(ValueError, match="3 heads"):
        view.update(multihead_frame(weights, labels, 0, 0))
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadView(0)


