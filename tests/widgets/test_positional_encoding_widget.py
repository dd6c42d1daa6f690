"""Notebook 07's widget (``widgets.positional_encoding``): the pure frame function against
``lessons.rope`` and the trained models, and the view over it."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import positional_encoding as lesson
from attn_helpers.lessons import rope
from attn_helpers.positional import frequencies
from attn_helpers.widgets.positional_encoding import (
    ENCODINGS,
    MAX_OFFSET,
    N_POSITIONS,
    positional_frame,
    positional_widget,
    queries_and_keys,
)

SINUSOIDAL, LEARNED, ADD, ROPE = ENCODINGS
RELATIVE = (SINUSOIDAL, ROPE)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("head", [0, 2])
def test_relative_modes_keep_s_p_p_plus_k_equal_to_s_0_k(encoding, head):
    frame = positional_frame(encoding, 9, 4, 1, head)
    n = N_POSITIONS
    assert frame.weights.shape == frame.scores.shape == (n, n)
    assert torch.allclose(frame.weights.sum(-1), torch.ones(n, dtype=frame.weights.dtype))
    assert frame.scores.abs().max().item() == pytest.approx(1.0)
    spread = frame.readouts["largest spread of S along one diagonal (0: relative)"]
    same = [positional_frame(encoding, p, 4, 1, head).readouts["S[p, p+k]"] for p in range(n)]
    angles = [positional_frame(encoding, p, 4, 1, head).readouts[
        "pair i: angle from query p to key p+k (rad)"] for p in range(n)]
    if encoding in RELATIVE:
        assert spread < 1e-9
        assert len(set(same)) == 1 and same[0] == frame.readouts["S[0, k]"]
        assert max(angles) - min(angles) < 1e-3  # the two hands turn together
        assert torch.allclose(frame.diagonal, frame.diagonal[0].expand_as(frame.diagonal))
    else:
        assert spread > 1
        assert max(same) - min(same) > 1
        assert max(angles) - min(angles) > 0.1


def test_projected_modes_match_lessons_rope_with_the_trained_heads():
    models, _ = lesson.load_models()
    for encoding, order, scheme in ((ADD, "add, then project", "sinusoidal"),
                                    (ROPE, "project, then rotate", "rope")):
        model = models[lesson.model_key(scheme, 0)]
        for head in range(lesson.NUM_HEADS):
            W_Q, W_K = rope.head_projections(model.qkv.weight, lesson.NUM_HEADS, head)
            x = model.embed.weight[0].detach().double()
            expected = rope.position_scores(order, W_Q, W_K, x, N_POSITIONS + MAX_OFFSET)
            queries, keys = queries_and_keys(encoding, head)
            assert torch.allclose(queries @ keys.T, expected, atol=1e-10)
            frame = positional_frame(encoding, 3, 5, 0, head)
            assert float(frame.readouts["S[p, p+k]"]) == pytest.approx(expected[3, 8].item(),
                                                                       abs=1e-4)
            grid = expected[:N_POSITIONS, :N_POSITIONS]
            assert float(frame.readouts["largest spread of S along one diagonal (0: relative)"]) \
                == pytest.approx(rope.diagonal_spread(grid), abs=1e-4)


def test_sinusoidal_angle_is_k_omega_and_rope_angle_moves_by_k_omega():
    for pair in range(4):
        omega = float(frequencies(8)[pair])
        frame = positional_frame(SINUSOIDAL, 2, 3, pair)
        turned = float(frame.readouts["pair i: angle from query p to key p+k (rad)"])
        # (sin, cos) turns clockwise: -k omega, modulo 2 pi
        assert math.remainder(turned + 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-4)
        at_0 = float(positional_frame(ROPE, 2, 0, pair).readouts[
            "pair i: angle from query p to key p+k (rad)"])
        at_3 = float(positional_frame(ROPE, 2, 3, pair).readouts[
            "pair i: angle from query p to key p+k (rad)"])
        assert math.remainder(at_3 - at_0 - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-3)


def test_positional_frame_errors():
    for kwargs in ({"position": 24}, {"offset": 9}, {"pair": 4}, {"head": 3}, {"position": True},
                   {"encoding": "rope"}):
        args = {"encoding": SINUSOIDAL, "position": 0, "offset": 1, "pair": 0, **kwargs}
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            positional_frame(**args)


def test_positional_widget_moves_and_matches_the_pure_function():
    widget = positional_widget()
    assert widget.error is None
    first = widget.image.value
    readouts = widget.set(encoding=ROPE, position=10, offset=2, pair=2, head=1)
    assert widget.error is None and widget.image.value != first
    assert widget.frame.position == 10
    expected = positional_frame(ROPE, 10, 2, 2, 1).readouts
    assert readouts == {k: f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in expected.items()}
    widget.set(encoding=ADD)
    assert widget.readouts["S[p, p+k]"] != widget.readouts["S[0, k]"]
