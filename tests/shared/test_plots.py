"""Static figures: labelled heatmaps on a fixed 0..1 scale with a colour bar, and entropy bars
with each query's ceiling ln(visible keys)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference import entropy as reference_entropy
from matplotlib.colors import to_rgba

from attn_helpers.plots import MASKED_COLOR, attention_figure, entropy_bars, heatmap


def tick_texts(labels):
    return [t.get_text() for t in labels]


def test_heatmap_labels_scale_colour_bar_and_masked_cells(gen):
    weights = torch.softmax(torch.randn(3, 4, generator=gen), -1)
    mask = torch.tensor([[True, False, True, True]] * 3)
    image = heatmap(weights, ["a", "b", "c", "d"], ["x", "y", "z"], mask=mask, annotate=True)
    ax = image.axes
    assert tick_texts(ax.get_xticklabels()) == ["a", "b", "c", "d"]
    assert tick_texts(ax.get_yticklabels()) == ["x", "y", "z"]
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert image.get_clim() == (0.0, 1.0) and len(image.figure.axes) == 2  # the map, its colour bar
    np.testing.assert_allclose(np.ma.getdata(image.get_array()), weights.numpy(), atol=1e-7)
    assert np.array_equal(np.ma.getmaskarray(image.get_array()), ~mask.numpy())  # grey cells
    assert image.get_cmap().get_bad() == pytest.approx(to_rgba(MASKED_COLOR))
    assert len(ax.texts) == 9                                 # a number in every visible cell
    # raw scores: a scale symmetric around zero
    assert heatmap(np.array([[0.5, -3.0], [2.0, 0.0]]), vmin=None, vmax=None).get_clim() == (-3, 3)


@pytest.mark.parametrize("shape, x_labels, y_labels, pattern", [
    ((2, 3), ["a", "b"], None, r"x_labels.*2 labels.*3"),
    ((4, 4), list("abcd"), list("abcde"), r"y_labels.*5 labels.*4"),
    ((2, 2, 2), None, None, r"matrix.*\(2, 2, 2\)"),
])
def test_heatmap_bad_input(shape, x_labels, y_labels, pattern):
    with pytest.raises(ValueError, match=pattern):
        heatmap(np.zeros(shape), x_labels, y_labels)


def test_entropy_bars_and_each_rows_ceiling():
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    bars = entropy_bars(weights, list("abc"), mask=mask)
    np.testing.assert_allclose([p.get_width() for p in bars], reference_entropy(weights), atol=1e-6)
    ax = bars.patches[0].axes
    assert tick_texts(ax.get_yticklabels()) == list("abc")
    (ceiling,) = ax.get_lines()
    xs, ys = np.asarray(ceiling.get_xdata()), np.asarray(ceiling.get_ydata())
    for row, visible in enumerate([1, 2, 3]):
        # a vertical piece of the dashed line sits at x = ln(visible keys) across the row's height
        assert any(np.isclose(xs[i], math.log(visible)) and np.isclose(xs[i + 1], math.log(visible))
                   and min(ys[i], ys[i + 1]) <= row - 0.4 and max(ys[i], ys[i + 1]) >= row + 0.4
                   for i in range(len(xs) - 1)), row


def test_attention_figure_is_the_heatmap_beside_the_entropy_bars(gen):
    weights = torch.softmax(torch.randn(3, 5, generator=gen), -1)
    fig = attention_figure(weights, ["q0", "q1", "q2"], list("abcde"), title="demo")
    ax_map = fig.axes[0]
    assert ax_map.get_title() == "demo" and ax_map.collections[0].get_clim() == (0.0, 1.0)
    assert tick_texts(ax_map.get_xticklabels()) == list("abcde")
    assert [len(ax.patches) for ax in fig.axes if ax.patches] == [3]
