"""Live widgets without a browser: set controls from Python, decode the PNG, compare with the
pure compute function."""

from __future__ import annotations

import html
import io
import math

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from _reference import decode_png
from matplotlib.colors import to_rgba
from PIL import Image

from attn_helpers.plots import MASKED_COLOR, weights_cmap
from attn_helpers.widgets import AttentionFrame, AttentionView, LiveAttentionWidget, encode_png
from attn_helpers.widgets.query_key_value import DEMO_KEYS, lookup_2d_frame, lookup_2d_widget


def expected_readouts(frame) -> dict:
    """The frame's readouts as text: floats to 4 decimals, everything else as str."""
    return {k: f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in frame.readouts.items()}


def uniform_frame(n, labels=None, **kwargs):
    labels = labels or [f"t{i}" for i in range(n)]
    return AttentionFrame(torch.full((n, n), 1.0 / n), labels, labels, **kwargs)


@pytest.fixture(scope="module")
def lookup():
    return lookup_2d_widget()


@pytest.mark.parametrize("qx, qy, temperature", [(1.5, 1.5, 1.0), (-2.0, 0.3, 0.2), (0.0, 0.0, 5.0)])
def test_lookup_2d_frame_independent(qx, qy, temperature):
    frame = lookup_2d_frame(qx, qy, temperature)
    labels = list(DEMO_KEYS)
    keys = np.array([DEMO_KEYS[name] for name in labels])
    scores = keys @ np.array([qx, qy]) / (math.sqrt(2) * temperature)
    e = np.exp(scores - scores.max())
    weights = e / e.sum()
    np.testing.assert_allclose(frame.weights.numpy()[0], weights, atol=1e-12)
    np.testing.assert_allclose(frame.output_xy.numpy(), weights @ keys, atol=1e-12)
    entropy = -(weights * np.log(weights)).sum()
    assert frame.readouts["entropy (nats)"] == pytest.approx(entropy, abs=1e-12)
    assert frame.readouts["ceiling ln n"] == pytest.approx(math.log(len(labels)))
    best = int(np.argmax(weights))
    assert frame.readouts["strongest key"] == f"{labels[best]} ({weights[best]:.4f})"
    assert frame.key_labels == labels and list(frame.query_labels) == ["q"]


def test_image_is_png_and_changes_after_a_move(lookup):
    lookup.set(query_x=1.5, query_y=1.5, temperature=1.0)
    before = decode_png(lookup.image.value)
    size = lookup.view.figure.get_size_inches() * lookup.view.figure.dpi
    assert before.shape == (round(size[1]), round(size[0]), 4)
    lookup.controls["query_x"].value = -2.0
    after = decode_png(lookup.image.value)
    assert after.shape == before.shape and np.abs(after - before).sum() > 0
    # moving back reproduces the first picture exactly: nothing stale is left on the canvas
    lookup.controls["query_x"].value = 1.5
    assert np.array_equal(decode_png(lookup.image.value), before)


def test_readouts_match_the_pure_function_via_set_and_via_the_controls(lookup):
    lookup.set(query_x=1.5, query_y=1.5, temperature=1.0)
    first = dict(lookup.readouts)
    returned = lookup.set(query_y=-2.5, temperature=0.3)
    frame = lookup_2d_frame(1.5, -2.5, 0.3)
    assert lookup.values == pytest.approx({"query_x": 1.5, "query_y": -2.5, "temperature": 0.3})
    assert torch.allclose(lookup.frame.weights, frame.weights, atol=1e-12)
    assert returned == lookup.readouts == expected_readouts(frame) != first
    for name, text in expected_readouts(frame).items():
        assert name in lookup.readout_html.value and text in lookup.readout_html.value
    lookup.controls["query_y"].value = -1.7     # a move of one control, as the browser makes it
    lookup.controls["temperature"].value = 0.5
    frame = lookup_2d_frame(1.5, -1.7, 0.5)
    assert torch.allclose(lookup.frame.weights, frame.weights, atol=1e-12)
    assert lookup.readouts == expected_readouts(frame)
    assert lookup.readouts["strongest key"].startswith("pear")


def test_one_render_per_set_call(lookup):
    start = lookup.renders
    lookup.set(query_x=0.1, query_y=-0.4, temperature=2.0)
    lookup.set(query_x=-0.3)
    lookup.controls["query_x"].value = 0.9  # each direct assignment renders once
    lookup.controls["query_y"].value = 0.9
    assert lookup.renders == start + 4


def failing_compute(n):
    if n == 3:
        raise ValueError("n=3 is <not> allowed")
    return uniform_frame(n)


@pytest.mark.parametrize("compute, bad, error", [
    (failing_compute, 3, "ValueError: n=3 is <not> allowed"),
    (lambda n: uniform_frame(4, highlight_row=n), 7, "ValueError: highlight_row must lie in 0..3"),
], ids=["in compute", "in the view"])
def test_an_error_is_shown_in_the_widget_and_the_picture_kept(compute, bad, error):
    w = LiveAttentionWidget(compute, {"n": widgets.IntSlider(value=2, min=0, max=10)})
    assert w.error is None and w.error_html.value == ""
    good_png, good_frame, renders = w.image.value, w.frame, w.renders
    w.controls["n"].value = bad
    assert w.error.startswith(error) and html.escape(error) in w.error_html.value
    assert w.image.value == good_png and w.frame is good_frame and w.renders == renders
    w.set(n=1)
    assert w.error is None and w.error_html.value == ""
    assert w.image.value != good_png and w.renders == renders + 1


def cell_pixel(view, image, i, j):
    """The RGBA pixel at the centre of heatmap cell (row i, column j)."""
    x, y = view.panel.ax_map.transData.transform((j, i))
    height = view.figure.bbox.height  # display y goes up from the bottom, PNG rows go down
    return image[int(round(height - y)), int(round(x))]


def colour(spec) -> np.ndarray:
    return np.round(np.array(to_rgba(spec)) * 255).astype(int)


@pytest.fixture(scope="module")
def view():
    return AttentionView()


@pytest.mark.parametrize("n", [8, 32, 64])
def test_view_renders_sizes_with_mask(view, n, gen):
    labels = [f"w{i}" for i in range(n)]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    logits = torch.randn(n, n, generator=gen).masked_fill(~mask, -torch.inf)
    weights = torch.softmax(logits, -1)
    frame = AttentionFrame(weights, labels, labels, mask=mask, highlight_row=n // 2)
    image = decode_png(view.update(frame))
    size = view.figure.get_size_inches() * view.figure.dpi
    assert image.shape == (round(size[1]), round(size[0]), 4)
    # the pasted labels are this frame's: every one, or every k-th where cells are too small
    every = view.panel.xlabels.every
    assert view.panel.xlabels.sprites.texts == labels[::every] and 1 <= every <= 2 + (n > 32)
    assert view.panel.ylabels.sprites.texts == labels[::view.panel.ylabels.every]
    grey = colour(MASKED_COLOR)
    for i, j in [(0, n - 1), (0, 1), (n - 2, n - 1)]:  # above the diagonal: masked
        assert np.abs(cell_pixel(view, image, i, j) - grey).max() <= 1, (i, j)
    cmap = weights_cmap()
    for i, j in [(n - 1, 0), (n - 1, n - 3), (3, 2)]:  # visible: the colormap's colour
        expected = colour(cmap(float(weights[i, j])))
        assert np.abs(cell_pixel(view, image, i, j) - expected).max() <= 3, (i, j)
        assert np.abs(cell_pixel(view, image, i, j) - grey).max() > 10


def test_new_labels_only_blit():
    view = AttentionView()
    view.update(uniform_frame(5, ["a", "b", "c", "d", "e"]))
    first = decode_png(view.update(uniform_frame(5, ["a", "b", "c", "d", "e"])))
    background = view.blit._background
    second = decode_png(view.update(uniform_frame(5, ["e", "d", "c", "b", "a"])))  # no wider
    assert view.panel.xlabels.sprites.texts == list("edcba") == view.panel.ylabels.sprites.texts
    assert view.blit._background is background  # no full redraw for other labels
    assert np.abs(second - first).sum() > 0  # same weights, other labels
    assert np.array_equal(decode_png(view.update(uniform_frame(5, list("abcde")))), first)
    # a smaller frame still only blits: its cells fill the top-left corner of the same axes
    view.update(uniform_frame(3, ["c", "a", "b"]))
    assert view.blit._background is background
    assert view.panel.xlabels.sprites.texts == ["c", "a", "b"]
    view.update(uniform_frame(3, ["longer", "q", "r"]))  # longer labels need more room
    assert view.blit._background is not background


@pytest.mark.parametrize("row", [-1, 4, 100])
def test_highlight_row_out_of_range(view, row):
    with pytest.raises(ValueError, match=rf"highlight_row.*0\.\.3.*{row}"):
        view.update(uniform_frame(4, highlight_row=row))


def test_encode_png_round_trip_and_bad_input():
    rgba = np.random.default_rng(0).integers(0, 256, size=(9, 13, 4), dtype=np.uint8)
    for array in (rgba, rgba[:1, :1], rgba.transpose(1, 0, 2)[::-1]):   # the last not contiguous
        image = Image.open(io.BytesIO(encode_png(array)))
        assert image.mode == "RGBA" and np.array_equal(np.asarray(image), array)
    for bad in (rgba.astype(np.float32), rgba.astype(np.uint16), rgba[..., :3], rgba[..., 0]):
        with pytest.raises(ValueError, match=r"rgba.*uint8.*\(h, w, 4\)") as info:
            encode_png(bad)
        assert str(bad.shape) in str(info.value)
