"""The 2-D convex-hull helpers of notebook 02 (``lessons.query_key_value``): attention outputs
are convex combinations of the values, so they must fall inside the values' hull."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.lessons.query_key_value import convex_hull_2d, inside_convex_hull

SQUARE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.0]])


def test_hull_of_a_square_is_its_corners_counter_clockwise():
    hull = convex_hull_2d(SQUARE)
    assert sorted(map(tuple, hull.tolist())) == [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
    # counter-clockwise: every consecutive triple turns left (positive cross product)
    a, b, c = hull, torch.roll(hull, -1, 0), torch.roll(hull, -2, 0)
    cross = (b - a)[:, 0] * (c - b)[:, 1] - (b - a)[:, 1] * (c - b)[:, 0]
    assert (cross > 0).all()


def test_inside_outside_and_boundary():
    queries = torch.tensor([[0.5, 0.5], [1.0, 0.5], [1.01, 0.5], [-0.2, 0.3], [0.0, 0.0]])
    assert inside_convex_hull(queries, SQUARE).tolist() == [True, True, False, False, True]


def test_degenerate_inputs_are_refused():
    with pytest.raises(ValueError, match="span an area"):
        inside_convex_hull(torch.zeros(1, 2), torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    with pytest.raises(ValueError, match=r"points must have shape \(n, 2\)"):
        convex_hull_2d(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="queries must be a torch.Tensor"):
        inside_convex_hull([[0.0, 0.0]], SQUARE)


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 12), st.integers(1, 20), st.integers(0, 10_000))
def test_convex_combinations_are_inside_and_far_points_outside(n, m, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, 2, generator=g, dtype=torch.float64)
    if torch.linalg.matrix_rank(values[1:] - values[0]) < 2:
        return                                               # collinear: no area to be inside
    weights = torch.softmax(torch.randn(m, n, generator=g, dtype=torch.float64) * 3, -1)
    outputs = weights @ values                               # (m, 2), like attention outputs
    assert inside_convex_hull(outputs, values).all()
    far = values.abs().max() * 3 + 1
    assert not inside_convex_hull(torch.tensor([[far, far]], dtype=torch.float64), values).any()


def test_the_hull_figure_keeps_every_point_in_view_and_names_bad_input():
    import matplotlib.pyplot as plt

    from attn_helpers.lessons.query_key_value import draw_hull_figure

    queries = torch.tensor([[-3.0, 0.5], [0.2, 2.5]])
    fig, ax = plt.subplots()
    try:
        draw_hull_figure(ax, SQUARE, [str(i) for i in range(len(SQUARE))], queries, queries / 4)
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert x0 <= -3.0 and x1 >= 1.0 and y0 <= 0.0 and y1 >= 2.5
        assert len(ax.texts) == len(SQUARE)
        with pytest.raises(ValueError, match="queries must have shape"):
            draw_hull_figure(ax, SQUARE, ["a"] * 6, queries[:, :1], queries)
    finally:
        plt.close(fig)
