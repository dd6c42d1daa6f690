"""Notebook 07's widget (``widgets.positional_encoding``): the pure frame function against the
scores computed directly from the trained models, and the view over it."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import positional_encoding as lesson
from attn_helpers.positional import apply_rope, frequencies, sinusoidal_encoding
from attn_helpers.widgets.positional_encoding import (
    ENCODINGS,
    N_POSITIONS,
    causal_diagonal_spread,
    positional_frame,
    positional_widget,
    queries_and_keys,
)

SINUSOIDAL, LEARNED, ADD, ROPE = ENCODINGS
RELATIVE = (SINUSOIDAL, ROPE)
SPREAD = "largest spread of S along one diagonal (0: relative)"
ANGLE = "pair i: angle from query p to key p-k (rad)"


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("head", [0, 1, 2])
def test_s_p_p_minus_k_equals_s_k_0_in_the_relative_modes_only(encoding, head):
    frame = positional_frame(encoding, 9, 4, 1, head)
    n = N_POSITIONS
    assert frame.weights.shape == frame.scores.shape == (n, n)
    assert torch.allclose(frame.weights.sum(-1), torch.ones(n, dtype=frame.weights.dtype))
    future = torch.ones(n, n, dtype=torch.bool).triu(1)  # q > p: hidden from a causal head
    assert (frame.weights[future] == 0).all() and frame.scores[future].isnan().all()
    assert frame.scores[~future].abs().max().item() == pytest.approx(1.0)
    frames = [positional_frame(encoding, p, 4, 1, head) for p in range(4, n)]
    same = [f.readouts["S[p, p-k]"] for f in frames]
    angles = [f.readouts[ANGLE] for f in frames]
    if encoding in RELATIVE:
        assert frame.readouts[SPREAD] < 1e-9
        assert len(set(same)) == 1 and same[0] == frame.readouts["S[k, 0]"]
        assert max(angles) - min(angles) < 1e-3  # the two hands turn together
        assert torch.allclose(frame.diagonal, frame.diagonal[0].expand_as(frame.diagonal))
    else:
        assert frame.readouts[SPREAD] > 1
        assert max(same) - min(same) > 1
        assert max(angles) - min(angles) > 0.1


def test_no_key_k_back_before_position_k():
    frame = positional_frame(ROPE, 2, 5, 0, 1)
    assert frame.readouts["S[p, p-k]"] is None and frame.readouts[ANGLE] is None
    assert frame.readouts["S[k, 0]"] == positional_frame(ROPE, 9, 5, 0, 1).readouts["S[p, p-k]"]


def diagonal_spread(S):
    return max((S.diagonal(k).max() - S.diagonal(k).min()).item() for k in range(1 - len(S), len(S)))


def test_projected_modes_match_the_trained_heads():
    models, _ = lesson.load_models()
    d, n = lesson.D_MODEL, N_POSITIONS
    for encoding, scheme in ((ADD, "sinusoidal"), (ROPE, "rope")):
        model = models[lesson.model_key(scheme, 0)]
        W = model.qkv.weight.detach().double()                              # Q, K, V heads' rows
        X = model.embed.weight[0].detach().double().expand(n, d)            # token 0 everywhere
        for head in range(lesson.NUM_HEADS):
            rows = slice(8 * head, 8 * head + 8)
            W_Q, W_K = W[:d][rows], W[d:2 * d][rows]
            if encoding == ADD:
                P = X + sinusoidal_encoding(n, d, dtype=torch.float64)
                expected = (P @ W_Q.T) @ (P @ W_K.T).T
            else:
                expected = apply_rope(X @ W_Q.T) @ apply_rope(X @ W_K.T).T
            queries, keys = queries_and_keys(encoding, head)
            assert torch.allclose(queries @ keys.T, expected, atol=1e-10)
            frame = positional_frame(encoding, 8, 5, 0, head)
            assert float(frame.readouts["S[p, p-k]"]) == pytest.approx(expected[8, 3].item(),
                                                                       abs=1e-4)
            # the causal spread is the spread of the lower triangle mirrored upwards
            mirrored = expected.tril() + expected.tril(-1).T
            assert frame.readouts[SPREAD] == pytest.approx(diagonal_spread(mirrored), abs=1e-4)
            assert causal_diagonal_spread(expected) == pytest.approx(diagonal_spread(mirrored))


def test_sinusoidal_angle_is_k_omega_and_rope_angle_moves_by_k_omega():
    for pair in range(4):
        omega = float(frequencies(8)[pair])
        turned = positional_frame(SINUSOIDAL, 7, 3, pair).readouts[ANGLE]
        # the pair is (sin, cos): going k back turns it by +k omega, modulo 2 pi
        assert math.remainder(turned - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-4)
        at_0 = positional_frame(ROPE, 7, 0, pair).readouts[ANGLE]
        at_3 = positional_frame(ROPE, 7, 3, pair).readouts[ANGLE]
        assert math.remainder(at_0 - at_3 - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-3)


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
    assert widget.readouts["S[p, p-k]"] != widget.readouts["S[k, 0]"]
    widget.set(position=1, offset=4)  # no key 4 back: hidden, not an error
    assert widget.error is None and widget.readouts["S[p, p-k]"] == "None"


def test_the_widget_opens_where_asked():
    widget = positional_widget(encoding=ENCODINGS[3], position=12, offset=1, pair=1, head=1)
    assert widget.values == {"encoding": ENCODINGS[3], "position": 12, "offset": 1, "pair": 1,
                             "head": 1}
    assert widget.readouts["key with the largest weight in row p"] == "11"
    with pytest.raises(ValueError, match="position"):
        positional_widget(position=99)
