"""Notebook 02's widget picture (``widgets.query_key_value``): nothing is cut at the edges, in
the notebooks' plot style (whose constrained layout the view must not follow)."""

from __future__ import annotations

import matplotlib as mpl

from attn_helpers.lessons.query_key_value import QUERY
from attn_helpers.notebook import PLOT_STYLE
from attn_helpers.widgets.query_key_value import CURVE_TEMPERATURES, lookup_2d_widget


def test_nothing_is_cut_at_the_edges():
    with mpl.rc_context(PLOT_STYLE):
        widget = lookup_2d_widget()
    figure = widget.view.figure
    renderer = widget.view.blit.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    for ax in figure.axes:
        box = ax.get_tightbbox(renderer)
        assert box.x0 >= 0 and box.y0 >= 0, ax.get_title()
        assert box.x1 <= width - 2 and box.y1 <= height, (ax.get_title(), box.x1, width)
    low, high = figure.axes[-1].get_xlim()          # the T axis: its end markers show whole
    assert low < CURVE_TEMPERATURES.min() / 1.1 and high > CURVE_TEMPERATURES.max() * 1.1


def test_the_widget_opens_on_section_1s_query_with_the_output_above_the_star():
    w = lookup_2d_widget()
    assert w.error is None and tuple(w.frame.query_xy.tolist()) == QUERY
    assert w.view.output_artist.get_zorder() > w.view.query_artist.get_zorder()
    assert w.values["temperature"] == 1.0          # moves: tests/widgets/test_widgets.py
