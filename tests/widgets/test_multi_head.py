"""Notebook 04's widget (``widgets.multi_head``): frames, the view, moves, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _reference import decode_png

from attn_helpers.lessons import multi_head as heads_task
from attn_helpers.lessons.multi_head import ablation_data, ablation_frame
from attn_helpers.masks import causal_mask
from attn_helpers.widgets.multi_head import ALL_HEADS, MultiHeadView, multihead_frame, multihead_widget

# --- notebook 04's widget -------------------------------------------------------------------


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


@pytest.mark.parametrize("call, pattern", [
    (lambda w, labels: multihead_frame(w, labels, 3, 0), "example"),
    (lambda w, labels: multihead_frame(w, labels, True, 0), "example"),
    (lambda w, labels: multihead_frame(w, labels, 0, 2), "head"),
    (lambda w, labels: multihead_frame(w, labels, 0, "some"), "head"),
    (lambda w, labels: multihead_frame(w[0], labels, 0, 0), r"h, n, n\).*\(2, 4, 4\) and 3 rows"),
    (lambda w, labels: multihead_frame(w, labels[:2], 0, 0), r"\(3, 2, 4, 4\) and 2 rows of labels"),
    (lambda w, labels: multihead_frame(w, labels, 0, 0, head_names=["a"]), "head_names"),
    (lambda w, labels: multihead_frame(w, labels, 0, 0, heads_on=(True, False)), "heads_on needs abl"),
    (lambda w, labels: multihead_widget(w, labels, heads_on=[True, False]), "heads_on needs the model"),
])
def test_bad_inputs_name_the_argument(example_weights, call, pattern):
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(*example_weights)


def test_multihead_widget_switches_between_grid_and_single(example_weights):
    weights, labels = example_weights
    widget = multihead_widget(weights, labels, mask=causal_mask(4))
    assert widget.error is None
    grid_png = decode_png(widget.image.value)
    figure = widget.view.grid.figure
    assert grid_png.shape[:2] == (round(figure.get_size_inches()[1] * figure.dpi),
                                  round(figure.get_size_inches()[0] * figure.dpi))
    widget.set(head=1)
    single = decode_png(widget.image.value)
    assert single.shape != grid_png.shape
    widget.set(example=2)
    assert not np.array_equal(single, decode_png(widget.image.value))
    assert torch.equal(widget.frame.weights, weights[2, 1])
    widget.set(head=ALL_HEADS)
    assert decode_png(widget.image.value).shape == grid_png.shape and widget.renders == 4


# --- the live head ablation (notebook 04's trained model) ----------------------------------


@pytest.fixture(scope="module")
def trained():
    model, _ = heads_task.load_two_relations()
    tokens, targets = heads_task.evaluation_batch()
    with torch.no_grad():
        scores = heads_task.head_relation_scores(model(tokens)[1])
        _, weights = model(tokens[:3])                   # examples 0-2: the tests use 1 and 2
    heads = {"previous": int(scores[:, 0].argmax()), "first": int(scores[:, 1].argmax())}
    widget = multihead_widget(weights, [heads_task.token_labels(t) for t in tokens[:3]],
                              mask=causal_mask(tokens.shape[1]), model=model,
                              eval_tokens=tokens, eval_targets=targets)
    return widget, ablation_data(model, tokens, targets), heads


def test_the_widget_shows_the_pure_functions_ablation_and_states_it_in_the_picture(trained):
    """A checkbox move looks up ablation_frame's answer (notebook 04 asserts the accuracies); the
    text pasted under the maps names the example, the head shown, the heads off and the accuracy."""
    widget, data, heads = trained
    off = heads["previous"]
    widget.set(example=2, head=ALL_HEADS, **{f"head_{i}_on": i != off for i in range(2)})
    expected, shown = ablation_frame(data, 2, widget.frame.heads_on), widget.frame.ablation
    assert widget.frame.heads_on == tuple(i != off for i in range(2))
    assert torch.equal(shown.predictions, expected.predictions) and shown.accuracy == expected.accuracy
    assert widget.readouts["heads switched off"] == f"head {off}"
    strip = widget.readouts["previous letter named at positions 2.. (✓ right, ✗ wrong)"].split()
    assert [s[1] == "✓" for s in strip] == expected.correct[2:, 0].tolist()
    lines = widget.view.picture_lines(widget.frame)
    assert lines[0].startswith(f"example: {widget.readouts['example']}   |   showing: all heads")
    assert f"switched off: head {off}" in lines[1]
    assert f"previous letter {expected.accuracy['previous']:.2f}" in lines[1] and widget.readouts[
        "held-out accuracy at positions 2.., previous letter (chance 0.125)"] == (
        f"{expected.accuracy['previous']:.4f}")
    widget.set(head=heads["first"])
    assert f"showing: head {heads['first']}" in widget.view.picture_lines(widget.frame)[0]
    widget.set(head_0_on=True, head_1_on=True, head=ALL_HEADS)
    assert "switched off: none" in widget.view.picture_lines(widget.frame)[1] and widget.error is None


def test_a_switched_off_head_is_marked_and_only_blitted(trained):
    """Every picture is stored when the widget is built; drawing a frame again gives it exactly."""
    widget, _, heads = trained
    off, view = heads["previous"], widget.view
    def redraw():   # a new frame object: drawn, not looked up
        return view.update(dataclasses.replace(widget.frame))
    widget.set(example=1, head=ALL_HEADS, head_0_on=True, head_1_on=True)
    assert redraw() == widget.image.value
    panel, sprites, background = view.grid.panels[off], view.grid.off[off], view.grid._background
    before, png_on = panel.cells.colors.copy(), decode_png(widget.image.value)
    widget.set(**{f"head_{off}_on": False})
    assert redraw() == widget.image.value and view.grid._background is background  # only blitted
    assert sprites.texts == ["switched off"] and view.grid.off[1 - off].texts == []
    faded = panel.cells.colors.astype(int)
    assert (faded[..., :3] >= before[..., :3]).all() and faded[..., :3].mean() > 200
    assert not np.array_equal(png_on, decode_png(widget.image.value))
    widget.set(head=off)                                               # one head: its title says so
    assert redraw() == widget.image.value and view.single_title.texts == [f"head {off} (off)"]
    assert view.single.off[0].texts == ["switched off"]
    widget.set(**{f"head_{off}_on": True})
    assert redraw() == widget.image.value and view.single_title.texts == [f"head {off}"]
    assert view.single.off[0].texts == [] and widget.error is None


def test_ablation_inputs_are_checked(trained, example_weights):
    weights, labels = example_weights
    _, data, _ = trained
    with pytest.raises(ValueError, match="heads_on must be 2 bools"):
        multihead_frame(data.weights[:3], [heads_task.token_labels(t) for t in data.tokens[:3]],
                        0, 0, ablation=data, heads_on=(True,))
    model, _ = heads_task.load_two_relations()
    with pytest.raises(ValueError, match="eval_tokens"):
        multihead_widget(weights, labels, model=model)
    with pytest.raises(ValueError, match="needs model, eval_tokens"):
        multihead_widget(weights, labels, eval_tokens=data.tokens, eval_targets=data.targets)


def test_entropy_bars_ceiling_is_the_mean_of_each_rows_ceiling(example_weights):
    weights, labels = example_weights
    view = MultiHeadView(2)
    view.update(multihead_frame(weights, labels, 0, 0))
    assert np.allclose(view.single.bars.ceiling.get_xdata(), np.log(4))
    view.update(multihead_frame(weights, labels, 0, ALL_HEADS, mask=causal_mask(4)))
    # rows see 1, 2, 3, 4 keys: the mean of ln 1 .. ln 4 is ln(4!) / 4, below ln 4
    assert np.allclose(view.grid.bars.ceiling.get_xdata(), np.log(24) / 4)
