"""Static figures: heatmap, entropy bars, attention_figure."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from _reference import entropy as reference_entropy
from matplotlib.collections import QuadMesh
from matplotlib.colors import to_rgba

from attn_helpers.plots import (
    MASKED_COLOR,
    SCORES_CMAP,
    WEIGHTS_CMAP,
    attention_figure,
    entropy_bars,
    heatmap,
    to_numpy,
)


def tick_texts(labels):
    return [t.get_text() for t in labels]


def test_heatmap_defaults(gen):
    weights = torch.softmax(torch.randn(3, 4, generator=gen), -1)
    image = heatmap(weights, ["a", "b", "c", "d"], ["x", "y", "z"])
    assert isinstance(image, QuadMesh)  # seaborn draws it
    assert image.get_clim() == (0.0, 1.0)
    assert image.get_cmap().name.startswith(WEIGHTS_CMAP)
    ax = image.axes
    assert tick_texts(ax.get_xticklabels()) == ["a", "b", "c", "d"]
    assert tick_texts(ax.get_yticklabels()) == ["x", "y", "z"]
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    np.testing.assert_allclose(np.asarray(image.get_array()), weights.numpy(), atol=1e-7)
    assert len(image.figure.axes) == 2  # the map and its colour bar


def test_heatmap_default_labels_colour_scales_and_axes():
    image = heatmap(np.full((2, 5), 0.2), colorbar=False)
    assert tick_texts(image.axes.get_xticklabels()) == ["0", "1", "2", "3", "4"]
    assert tick_texts(image.axes.get_yticklabels()) == ["0", "1"]
    assert len(image.figure.axes) == 1
    image = heatmap(np.array([[0.5, -3.0, 1.0], [2.0, 0.0, -0.25]]), vmin=None, vmax=None)
    assert image.get_clim() == (-3.0, 3.0) and image.get_cmap().name.startswith(SCORES_CMAP)
    assert heatmap(np.zeros((2, 2)), vmin=None, vmax=None).get_clim() == (-1.0, 1.0)
    fig, ax = plt.subplots()
    image = heatmap(np.eye(3), ax=ax, vmin=-2, vmax=5, title="scores")
    assert image.axes is ax and image.get_clim() == (-2, 5) and ax.get_title() == "scores"


def test_heatmap_mask_greys_cells():
    mask = torch.tensor([[True, False], [True, True]])
    image = heatmap(torch.full((2, 2), 0.5), mask=mask)
    array = image.get_array()
    assert np.ma.isMaskedArray(array)
    assert np.array_equal(np.ma.getmaskarray(array), ~mask.numpy())
    assert image.get_cmap().get_bad() == pytest.approx(to_rgba(MASKED_COLOR))


def test_heatmap_annotations():
    weights = np.array([[0.25, 0.75], [0.001, 0.999]])
    image = heatmap(weights, annotate=True, mask=np.array([[True, True], [False, True]]))
    texts = sorted(t.get_text() for t in image.axes.texts)
    assert texts == ["0.25", "0.75", "1.00"]  # the masked cell has no number


@pytest.mark.parametrize("shape, x_labels, y_labels, pattern", [
    ((2, 3), ["a", "b"], None, r"x_labels.*2 labels.*3"),
    ((4, 4), list("abcd"), list("abcde"), r"y_labels.*5 labels.*4"),
    ((2, 2, 2), None, None, r"matrix.*\(2, 2, 2\)"),
])
def test_heatmap_bad_input(shape, x_labels, y_labels, pattern):
    with pytest.raises(ValueError, match=pattern):
        heatmap(np.zeros(shape), x_labels, y_labels)


def test_entropy_bars_widths(gen):
    logits = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    logits[1, 1:] = -torch.inf  # one-hot row: entropy 0
    weights = torch.softmax(logits, -1)
    bars = entropy_bars(weights, list("abcde"))
    widths = np.array([patch.get_width() for patch in bars])
    assert len(widths) == 5
    np.testing.assert_allclose(widths, reference_entropy(weights), atol=1e-12)
    assert widths[1] == 0.0
    ax = bars.patches[0].axes
    assert tick_texts(ax.get_yticklabels()) == list("abcde")
    # the ceiling ln 6 is drawn for every row
    (ceiling,) = ax.get_lines()
    np.testing.assert_allclose(ceiling.get_xdata(), math.log(6))


def test_entropy_bars_mask_ceiling():
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    bars = entropy_bars(weights, mask=mask)
    widths = [patch.get_width() for patch in bars]
    np.testing.assert_allclose(widths, reference_entropy(weights), atol=1e-6)
    (ceiling,) = bars.patches[0].axes.get_lines()
    # each row's ceiling is ln(number of visible keys): ln 1, ln 2, ln 3
    xs = np.asarray(ceiling.get_xdata())
    ys = np.asarray(ceiling.get_ydata())
    for row, visible in enumerate([1, 2, 3]):
        # some vertical piece of the dashed line sits at x = ln(visible) across the row's height
        covered = [
            np.isclose(xs[i], math.log(visible)) and np.isclose(xs[i + 1], math.log(visible))
            and min(ys[i], ys[i + 1]) <= row - 0.4 and max(ys[i], ys[i + 1]) >= row + 0.4
            for i in range(len(xs) - 1)
        ]
        assert any(covered), row


def test_attention_figure(gen):
    weights = torch.softmax(torch.randn(3, 5, generator=gen), -1)
    fig = attention_figure(weights, ["q0", "q1", "q2"], list("abcde"), title="demo")
    assert len(fig.axes) >= 2
    ax_map = fig.axes[0]
    assert isinstance(ax_map.collections[0], QuadMesh)
    assert ax_map.collections[0].get_clim() == (0.0, 1.0)
    assert ax_map.get_title() == "demo"
    assert tick_texts(ax_map.get_xticklabels()) == list("abcde")
    assert tick_texts(ax_map.get_yticklabels()) == ["q0", "q1", "q2"]
    bars = [ax for ax in fig.axes if ax.patches]
    assert len(bars) == 1 and len(bars[0].patches) == 3


def test_to_numpy():
    t = torch.tensor([[1.0, 2.0]], requires_grad=True)
    out = to_numpy(t)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert np.array_equal(out, [[1.0, 2.0]])
    assert to_numpy([[1, 2]]).dtype == np.float64
