"""Notebook 07's widget: the pure frame against the trained models' scores and the rotation
angles, and the live view."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import positional_encoding as lesson
from attn_helpers.positional import frequencies
from attn_helpers.widgets.positional_encoding import (
    BASES,
    ENCODINGS,
    INPUTS,
    N_POSITIONS,
    PROBE,
    positional_frame,
    positional_widget,
)

SINUSOIDAL, LEARNED, ADD, ROPE = ENCODINGS
SPREAD = "largest spread of S along one diagonal (0: relative)"
WAVELENGTH = "pair i's wavelength 2 pi / omega_i (positions)"
ANGLE = "pair i: angle from query m to key m-k (rad)"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_s_p_p_minus_k_equals_s_k_0_in_the_relative_modes_only(encoding):
    for head in (0, 2):
        frame, n = positional_frame(encoding, 9, 4, 1, head), N_POSITIONS
        assert torch.allclose(frame.weights.sum(-1), torch.ones(n, dtype=frame.weights.dtype))
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # q > p: hidden from a causal head
        assert (frame.weights[future] == 0).all() and frame.scores[future].isnan().all()
        frames = [positional_frame(encoding, p, 4, 1, head) for p in range(4, n)]
        same = [f.readouts["S[m, m-k]"] for f in frames]
        angles = [f.readouts[ANGLE] for f in frames]
        if encoding in (SINUSOIDAL, ROPE):
            assert frame.readouts[SPREAD] < 1e-9 and set(same) == {frame.readouts["S[k, 0]"]}
            assert max(angles) - min(angles) < 1e-3  # the two hands turn together
        else:
            assert frame.readouts[SPREAD] > 1 and max(same) - min(same) > 1
            assert max(angles) - min(angles) > 0.1


def test_no_key_k_back_before_position_k():
    frame = positional_frame(ROPE, 2, 5, 0, 1)
    assert frame.readouts["S[m, m-k]"] is None and frame.readouts[ANGLE] is None
    assert frame.readouts["S[k, 0]"] == positional_frame(ROPE, 9, 5, 0, 1).readouts["S[m, m-k]"]


@pytest.mark.parametrize("tokens", INPUTS)
def test_trained_modes_are_the_heads_own_attention_and_relative_only_for_rope_on_one_token(tokens):
    models, _ = lesson.load_models()
    ids = PROBE if tokens == INPUTS[1] else torch.zeros(N_POSITIONS, dtype=torch.long)
    for encoding, scheme, bases in ((ADD, "sinusoidal", [lesson.BASE]), (ROPE, "rope", BASES)):
        for base in bases:
            model = models[lesson.model_key(scheme, 0, base)]
            with torch.no_grad():
                model(ids[None])
            for head in range(lesson.NUM_HEADS):
                frame = positional_frame(encoding, 9, 3, 1, head, base, tokens)
                assert torch.allclose(frame.weights.float(), model.last_weights[0, head], atol=1e-5)
                relative = frame.readouts[SPREAD] < 1e-9
                assert relative == (encoding == ROPE and tokens == INPUTS[0])


def test_sinusoidal_angle_is_k_omega_and_rope_angle_moves_by_k_omega():
    for pair in range(4):
        omega = float(frequencies(8)[pair])
        turned = positional_frame(SINUSOIDAL, 7, 3, pair).readouts[ANGLE]
        # the pair is (sin, cos): going k back turns it by +k omega, modulo 2 pi
        assert math.remainder(turned - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-4)
        at_0 = positional_frame(ROPE, 7, 0, pair).readouts[ANGLE]
        at_3 = positional_frame(ROPE, 7, 3, pair).readouts[ANGLE]
        assert math.remainder(at_0 - at_3 - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-3)


@pytest.mark.parametrize("base", BASES)
def test_base_sets_the_frequencies(base):
    for pair in range(4):
        omega = float(frequencies(8, base)[pair])
        readouts = positional_frame(SINUSOIDAL, 7, 3, pair, 0, base).readouts
        assert readouts[SPREAD] < 1e-9
        assert readouts[WAVELENGTH] == round(2 * math.pi / omega, 1)
        assert math.remainder(readouts[ANGLE] - 3 * omega, 2 * math.pi) == pytest.approx(0, abs=1e-4)
    random_table = positional_frame(LEARNED, 7, 3, 1, 0, base, INPUTS[1])  # no base, no tokens
    assert random_table.readouts == positional_frame(LEARNED, 7, 3, 1, 0).readouts


def test_bases_differ_where_they_should():
    slow, fast = (positional_frame(ROPE, 20, 3, 1, 2, b) for b in (BASES[2], BASES[0]))
    assert not torch.allclose(slow.weights, fast.weights, atol=1e-3)
    assert slow.readouts[WAVELENGTH] == pytest.approx(4 * fast.readouts[WAVELENGTH], abs=0.2)


def test_positional_frame_errors():
    for kwargs in ({"position": 24}, {"offset": 9}, {"pair": 4}, {"head": 3}, {"position": True},
                   {"encoding": "rope"}, {"tokens": "random"}):
        args = {"encoding": SINUSOIDAL, "position": 0, "offset": 1, "pair": 0, **kwargs}
        with pytest.raises((TypeError, ValueError), match=next(iter(kwargs))):  # a bool: TypeError
            positional_frame(**args)
    with pytest.raises(ValueError, match="position"):
        positional_widget(position=99)
    for base in (1000.0, True, "625", None):
        with pytest.raises(ValueError, match=r"base must be one of \['625', '10000', '160000'\]"):
            positional_frame(ROPE, 5, 1, 1, 1, base)
    with pytest.raises(ValueError, match="base 625 has no trained model in mode 'add PE"):
        positional_frame(ADD, 5, 1, 1, 1, 625.0)
    with pytest.raises(ValueError, match="base 625 has no trained model"):
        positional_widget(encoding=ADD, base=625.0)


def test_positional_widget_opens_where_asked_and_moves_as_the_pure_function():
    widget = positional_widget(encoding=ROPE, position=12, offset=1, pair=1, head=1)
    assert widget.values == {"encoding": ROPE, "position": 12, "offset": 1, "pair": 1, "head": 1,
                             "base": 10000.0, "tokens": INPUTS[0]}
    assert widget.error is None and widget.readouts["key with the largest weight in row m"] == "11"
    first = widget.image.value
    readouts = widget.set(position=10, offset=2, pair=2)
    assert widget.error is None and widget.image.value != first and widget.frame.position == 10
    expected = positional_frame(ROPE, 10, 2, 2, 1).readouts
    assert readouts == {k: f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in expected.items()}
    widget.set(position=1, offset=4)  # no key 4 back: hidden, not an error
    assert widget.error is None and widget.readouts["S[m, m-k]"] == "None"
    shown = widget.image.value
    widget.set(base=625.0)                         # the base-625 model: a new picture, no error
    assert widget.error is None and widget.image.value != shown
    assert widget.readouts == {k: f"{v:.4f}" if isinstance(v, float) else str(v)
                               for k, v in positional_frame(ROPE, 1, 4, 2, 1, 625.0).readouts.items()}
    shown = widget.image.value
    widget.set(encoding=ADD)                       # no sinusoidal model at 625: said, picture kept
    assert "picture keeps the last setting" in widget.error and widget.image.value == shown
    widget.set(base=10000.0)
    assert widget.error is None and widget.image.value != shown
    shown = widget.image.value
    widget.set(tokens=INPUTS[1])                   # random tokens: the head's attention on them
    assert widget.error is None and widget.image.value != shown
