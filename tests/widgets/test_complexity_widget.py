"""Notebook 08's widget (``widgets.complexity``): the FlashAttention tile stepper. Its frames follow
the core's online softmax tile by tile and end at the softmax, every step changes the picture by
blitting only, and bad input is shown in the widget."""

from __future__ import annotations

import html

import numpy as np
import pytest
import torch
from _reference import decode_png

from attn_helpers.efficient import init_state, online_softmax_step
from attn_helpers.entropy import attention_entropy
from attn_helpers.widgets import complexity as wx


def reference_states(scores, block, causal):
    """Row block by row block, the core's online_softmax_step over the same tiles: the tile and
    (m, l) after every tile, in FlashAttention-2's order (causal: none wholly above the diagonal)."""
    n, states = scores.shape[0], []
    for i in range(0, n, block):
        rows = slice(i, min(i + block, n))
        state = init_state((), rows.stop - rows.start, 1, dtype=torch.float64)
        for j in range(0, rows.stop if causal else n, block):
            cols = slice(j, min(j + block, n))
            state = online_softmax_step(state, scores[rows, cols],
                                        torch.ones(cols.stop - cols.start, 1, dtype=torch.float64))
            states.append((rows, cols, state.max.squeeze(-1), state.total.squeeze(-1)))
    return states


@pytest.mark.parametrize("n, block, causal", [(12, 4, False), (10, 3, False), (12, 4, True),
                                              (8, 8, False), (9, 2, True)])
def test_frames_follow_the_online_softmax(n, block, causal):
    scores = wx.tile_scores(n, causal=causal)
    states = reference_states(scores, block, causal)
    assert len(states) == wx.tile_stepper_frame(n, block, causal, 0).n_steps
    for step, (rows, cols, m, l) in enumerate(states, start=1):
        frame = wx.tile_stepper_frame(n, block, causal, step)
        assert frame.tile == (rows.start, rows.stop, cols.start, cols.stop)
        np.testing.assert_allclose(frame.m[rows], m.numpy())
        np.testing.assert_allclose(frame.l[rows], l.numpy())
        previous = wx.tile_stepper_frame(n, block, causal, step - 1)
        expected = np.where(np.isfinite(previous.m[rows]), np.exp(previous.m[rows] - m.numpy()), 0)
        np.testing.assert_allclose(frame.rescale[rows], expected)
        untouched = np.ones(n, bool)
        untouched[rows] = False
        assert (frame.rescale[untouched] == 1).all()
        r0, r1, c0, c1 = frame.tile
        moved = int(((frame.rescale[rows] > 0) & (frame.rescale[rows] < 1)).sum())
        assert frame.readouts["step"] == f"{step} of {len(states)}"
        assert frame.readouts["tile"] == f"queries {r0}..{r1 - 1} x keys {c0}..{c1 - 1}"
        assert frame.readouts["rows rescaled by this tile"].startswith(f"{moved} of {r1 - r0}")
        assert frame.readouts["rows finished"] == f"{int(frame.finished.sum())} of {n}"


@pytest.mark.parametrize("causal", [False, True])
def test_the_last_frame_is_the_softmax_and_its_entropy(causal):
    n, block = 13, 4
    first = wx.tile_stepper_frame(n, block, causal, 0)
    assert first.tile is None and np.isnan(first.weights).all() and not first.finished.any()
    last = wx.tile_stepper_frame(n, block, causal, first.n_steps)
    weights = torch.softmax(wx.tile_scores(n, causal=causal), dim=-1)
    np.testing.assert_allclose(np.nan_to_num(last.weights, nan=0.0), weights.numpy(), atol=1e-12)
    np.testing.assert_allclose(last.entropy, attention_entropy(weights).numpy())
    visible = np.arange(1, n + 1) if causal else np.full(n, n)
    np.testing.assert_allclose(last.ceiling, np.log(visible))


def test_every_step_changes_the_picture_by_blitting_only():
    widget = wx.tile_stepper_widget(n=16, block_size=4, causal=False, step=0)
    view = widget.view
    assert isinstance(view, wx.TileStepperView) and widget.error is None
    background = view.blit._background
    pictures = [decode_png(widget.image.value, "RGB")]
    grey = np.array([217, 217, 217])                                   # MASKED_COLOR: unseen keys
    unseen = [(np.abs(pictures[0] - grey).max(-1) <= 2).sum()]
    for step in range(1, widget.controls["step"].max + 1):
        widget.controls["step"].value = step
        assert widget.error is None and widget.frame.step == step
        pictures.append(decode_png(widget.image.value, "RGB"))
        unseen.append((np.abs(pictures[-1] - grey).max(-1) <= 2).sum())
    assert all((a != b).any() for a, b in zip(pictures, pictures[1:], strict=False))
    assert all(a > b for a, b in zip(unseen, unseen[1:], strict=False))   # one tile less each step
    widget.set(n=40, block_size=8, causal=True)                        # other sizes: still a blit
    assert view.blit._background is background and widget.error is None


def test_the_step_slider_spans_the_tiles_and_an_ended_stepper_stays_at_the_end():
    widget = wx.tile_stepper_widget(n=16, block_size=4, causal=False, step=5)
    step, block = widget.controls["step"], widget.controls["block_size"]
    assert step.max == 16 and block.max == 16
    widget.set(n=10, block_size=3, causal=True, step=4)
    assert step.max == len(wx.tile_schedule(10, 3, causal=True)) and block.max == 10
    assert widget.frame.step == 4
    assert widget.frame.tile == wx.tile_schedule(10, 3, causal=True)[3]
    widget.set(step=step.max)
    widget.controls["block_size"].value = 2                              # more tiles: still at the end
    assert step.value == step.max == len(wx.tile_schedule(10, 2, causal=True))
    assert widget.frame.finished.all()
    widget.controls["n"].value = 8
    assert block.max == 8 and widget.error is None


def test_bad_input_is_shown_in_the_widget_and_moves_nothing():
    widget = wx.tile_stepper_widget()

    def ranges():
        return widget.values, widget.controls["block_size"].max, widget.controls["step"].max

    before, picture = ranges(), widget.image.value
    for values, message in [
        ({"n": 100}, "n must be between 8 and 48, got 100"),
        ({"step": 99}, "step must be between 0 and 16, got 99"),
        ({"n": 8, "block_size": 12}, "block_size must be between 2 and 8, got 12"),
        ({"causal": "yes"}, "causal must be True or False, got 'yes'"),
        ({"block_size": 0}, "block_size must be between 2 and 16, got 0"),
        ({"step": 1.0}, "step must be a whole number, got 1.0"),
    ]:
        with pytest.raises(ValueError, match=message.split(",")[0]):
            widget.set(**values)
        assert widget.error is not None and message in widget.error
        assert html.escape(message) in widget.error_html.value
        assert ranges() == before and widget.image.value == picture   # the ranges went back too
    widget.set(step=3)
    assert widget.error is None and widget.error_html.value == ""


@pytest.mark.parametrize("n", [8, 13, 16])
def test_a_tile_as_wide_as_n_never_rescales(n):
    """What the notebook suggests trying: one tile per row block, so nothing to rescale."""
    for causal in (False, True):
        for step in range(1, len(wx.tile_schedule(n, n, causal=causal)) + 1):
            frame = wx.tile_stepper_frame(n, n, causal, step)
            assert set(np.unique(frame.rescale)) <= {0.0, 1.0}
            assert frame.readouts["rows rescaled by this tile"] == f"0 of {n}"
    assert any(not wx.tile_stepper_frame(n, 4, False, s).readouts["rows rescaled by this tile"]
               .startswith("0 of") for s in range(1, len(wx.tile_schedule(n, 4)) + 1))  # 4 x 4 tiles do
