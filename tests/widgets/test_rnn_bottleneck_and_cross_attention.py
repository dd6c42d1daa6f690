"""The widgets of notebooks 01 and 06 (``widgets.rnn_bottleneck``, ``widgets.cross_attention``)."""

from __future__ import annotations

from dataclasses import replace

import matplotlib as mpl
import pytest
import torch

from attn_helpers.lessons import tasks
from attn_helpers.lessons.rnn_bottleneck import Seq2Seq, input_gradient_norms
from attn_helpers.notebook import PLOT_STYLE
from attn_helpers.widgets import cross_attention as wd_cross
from attn_helpers.widgets import rnn_bottleneck as wd


@pytest.fixture(scope="module")
def models():
    def small_model(kind: str) -> Seq2Seq:
        torch.manual_seed(0)
        return Seq2Seq(13, 13, attention=kind, d_emb=8, d_enc=6, d_attn=5).eval()

    return {"no attention": small_model("none"), "additive attention": small_model("additive")}


@pytest.fixture(scope="module")
def widget(models):
    with mpl.rc_context(PLOT_STYLE):            # the notebooks' style, constrained layout included
        return wd.bottleneck_widget(models, model_name="additive attention", length=24)


def test_decode_frames_and_the_widget(models, widget):
    frames = wd.decode_frames(models, "additive attention", [12, 9])    # one batch, padded to 12
    frame, alone = frames[9][2], wd.decode_frames(models, "additive attention", [9])[9][2]
    source, target = tasks.example("reversal", 2, 9)
    assert len(frames[9]) == wd.EXAMPLES and (list(frame.source), list(frame.target)) == (source, target)
    assert frame.weights.shape == (9, 9) and frame.has_attention and frame.mask is None
    assert frame.output == alone.output and torch.allclose(frame.weights, alone.weights, atol=1e-6)
    assert frame.readouts["token accuracy"] == sum(frame.correct) / 9
    assert [o == t for o, t in zip(frame.output, target, strict=True)] == list(frame.correct)
    assert frame.key_labels[:2] == [f"{source[0]}₀", f"{source[1]}₁"]    # digits repeat: positions
    plain = wd.decode_frames(models, "no attention", [9])[9][2]
    assert not plain.has_attention and not plain.mask.any()
    assert plain.readouts["mean entropy (nats)"] == "none (no weights)"
    with pytest.raises(ValueError, match="model_name must be one of"):
        wd.bottleneck_widget(models, model_name="general")
    assert widget.error is None and widget.frame.has_attention and widget.frame.weights.shape == (24, 24)
    readouts = widget.set(length=6, model_name="no attention", index=3)
    assert widget.error is None and readouts["model"] == "no attention"
    assert widget.frame.readouts == wd.decode_frames(models, "no attention", [6])[6][3].readouts


def test_gradient_frame_shows_each_rows_share_of_the_lessons_gradient_norms(models):
    """Row t: ``input_gradient_norms`` over j over its sum, either model; no grad or training left."""
    for name, model in models.items():
        frame = wd.decode_frames(models, name, [7])[7][3]
        shown = wd.gradient_frame(model, frame)
        one = tasks.collate("reversal", [tasks.example("reversal", 3, 7)])
        norms = input_gradient_norms(model, one)[0]                          # (n_t, n)
        assert torch.allclose(shown.weights, norms / norms.sum(-1, keepdim=True))
        assert shown.has_attention and shown.show == wd.SHARES
        assert shown.readouts["errors"] == frame.readouts["errors"]
        assert model.training is False and shown.weights.grad_fn is None
    with torch.no_grad():                                  # the widget may draw under no_grad
        assert wd.gradient_frame(models["no attention"], frame).weights.shape == (7, 7)
    with pytest.raises(TypeError, match="model must be an rnn_bottleneck.Seq2Seq"):
        wd.gradient_frame("model", frame)


def test_the_menu_show_draws_gradient_shares_for_either_model(models, widget):
    view, titles = widget.view, [wd.TEXTS[mode] for mode in (wd.WEIGHTS, wd.SHARES)]
    widget.set(model_name="no attention", length=9, index=0, show=wd.WEIGHTS)
    assert not widget.frame.has_attention and view.notice.visible
    widget.set(show=wd.SHARES, index=2)
    plain = wd.decode_frames(models, "no attention", [9])[9][2]
    expected = wd.gradient_frame(models["no attention"], plain).weights
    assert widget.error is None and widget.frame.has_attention and not view.notice.visible
    assert torch.allclose(widget.frame.weights, expected, atol=1e-6)
    assert widget.frame.readouts["errors"] == plain.readouts["errors"]
    assert wd.SHARE_ENTROPY in widget.readouts and "mean entropy (nats)" not in widget.readouts
    entropy = view.panel.ax_entropy
    assert (view.panel.ax_map.get_title(), entropy.get_title(), entropy.get_xlabel()) == titles[1]
    top = wd.colour_scale(widget.frame)           # the map's own colour scale, nothing clipped
    assert widget.frame.weights.max() <= top < 1
    assert view.scale.norm.vmax == view.panel.cells.norm.vmax == top
    frames = wd.decode_frames(models, "no attention", [9])[9]
    same = next(i for i in range(3, wd.EXAMPLES)  # another example on the same scale: blits
                if wd.colour_scale(wd.gradient_frame(models["no attention"], frames[i])) == top)
    background = view.blit._background
    widget.set(index=same)
    assert view.blit._background is background and widget.error is None
    widget.set(show=wd.WEIGHTS, model_name="additive attention")
    assert (view.panel.ax_map.get_title(), entropy.get_title(), entropy.get_xlabel()) == titles[0]
    assert view.scale.norm.vmax == view.panel.cells.norm.vmax == 1.0 and widget.frame.mask is None
    assert "mean entropy (nats)" in widget.frame.readouts


def test_colour_scale_is_the_first_step_at_or_above_the_largest_share(models):
    frame = wd.decode_frames(models, "additive attention", [5])[5][0]
    assert wd.colour_scale(frame) == 1.0                                     # attention weights
    for largest, top in ((0.04, 0.05), (0.05, 0.05), (0.17, 0.2), (0.31, 0.5), (0.9, 1.0)):
        weights = torch.full((5, 5), 0.01)
        weights[0, 0] = largest
        assert wd.colour_scale(replace(frame, weights=weights, show=wd.SHARES)) == top


def test_alignment_frame_and_widget(models):
    model = models["additive attention"]
    frame = wd_cross.alignment_frame(model, "reversal", 1, 2)
    n = len(tasks.example("reversal", 1)[0])
    assert frame.weights.shape == (n, n) and frame.highlight_row == 2
    assert frame.mask[:3].all() and not frame.mask[3:].any()
    last = wd_cross.alignment_frame(model, "reversal", 1, 99)
    assert last.highlight_row == n - 1 and last.mask.all()
    w = wd_cross.alignment_widget(model, "reversal")
    w.set(index=1, step=2)
    assert w.error is None and w.frame.readouts == frame.readouts
    panel = w.view.panel                                      # the axes say what rows and columns are
    assert panel.ax_map.get_xlabel().startswith("input position")
    assert panel.ax_map.get_ylabel().startswith("output step")
    with pytest.raises(ValueError, match="no attention"):
        wd_cross.alignment_frame(models["no attention"], "reversal", 0, 0)
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        wd_cross.alignment_frame(model, "reversal", 0, -1)
    with pytest.raises(TypeError, match="model must be an rnn_bottleneck.Seq2Seq"):
        wd_cross.alignment_frame("model", "reversal", 0, 0)


def test_bottleneck_view_zooms_to_the_example_and_blanks_a_missing_ceiling(widget):
    """A shorter example fills the view (strips, heatmap and entropy bars zoom to its length,
    with no full redraw); a model without attention blanks its entropy panel, also by blitting."""
    w, view = widget, widget.view
    w.set(length=24, model_name="additive attention", index=0, show=wd.WEIGHTS)
    background = view.blit._background
    for n in (5, 20, 24):
        w.set(length=n)
        assert w.error is None
        for limits in (view.ax_strip.get_xlim(), view.panel.ax_map.get_xlim()):
            assert limits == pytest.approx((-0.5, n - 0.5))
        for ax in (view.panel.ax_map, view.panel.ax_entropy):
            assert ax.get_ylim() == pytest.approx((n - 0.5, -0.5))
        assert view.positions.texts == [str(i) for i in range(n)]
        assert view.panel.entropy.ceiling.get_visible()
    assert view.blit._background is background     # zooming only blits
    for name, shown in (("no attention", False), ("additive attention", True)):
        w.set(model_name=name)              # no weights: blank entropy panel and a notice, blitted
        assert view.blit._background is background and view.no_entropy.visible is not shown
        assert view.notice.visible is not shown and view.notice.texts == list(wd.NO_WEIGHTS)
        assert len(view.panel.entropy.ceiling.get_xdata()) == (2 * 24 if shown else 0)
    # the gridspec holds, not the notebooks' constrained layout: the strip title has room above
    top = view.ax_strip.get_position().y1 * view.figure.get_figheight() * 72
    assert view.figure.get_figheight() * 72 - top > 12


def test_toy_frame_moves_the_row_masks_the_pads_and_the_widget_refuses_bad_values():
    month, year = wd_cross.toy_frame(0.0, 10.0, 2), wd_cross.toy_frame(1.0, 10.0, 0)
    assert month.weights.shape == (1, 6) and month.weights[0, 1] > 0.95
    assert month.weights[0, 4:].sum() == 0                                  # the pads, masked
    assert month.readouts["value read"] == pytest.approx(5, abs=0.5)
    assert year.weights[0, 2] == pytest.approx(year.weights[0, 3].item())          # 19 and 80: the mean
    assert year.readouts["value read"] == pytest.approx(49.5, abs=1)
    flat = wd_cross.toy_frame(0.5, 0.0, 2, mask_pads=False)              # scale 0: every key alike
    assert torch.allclose(flat.weights, torch.full((1, 6), 1 / 6, dtype=torch.float64))
    assert (flat.ceiling.exp().item(), month.ceiling.exp().item()) == pytest.approx((6, 4))
    assert flat.readouts["weight on padding"] == pytest.approx(1 / 3)
    w = wd_cross.toy_widget()
    assert float(w.set(mix=1.0, pads=4, mask_pads=False)["weight on padding"]) > 0 and w.error is None
    for bad, message in (({"mix": 1.5}, "mix must lie in 0..1"), ({"scale": -1.0}, "scale be >= 0"),
                         ({"pads": 5}, "pads must be between 0 and 4")):
        with pytest.raises(ValueError, match=message):
            wd_cross.toy_frame(**{"mix": 0.0, "scale": 1.0, "pads": 0} | bad)
    with pytest.raises(ValueError, match="mix must be between 0 and 1"):
        w.set(mix=2.0)                                        # refused in the widget, picture kept
    assert "mix must be between 0 and 1" in w.error and w.frame.readouts["weight on padding"] > 0
