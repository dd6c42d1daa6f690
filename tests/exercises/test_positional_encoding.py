"""The checkers of notebook 07 (``exercises.positional_encoding``): each accepts the reference and a
learner's other correct solutions, and rejects plausible wrong answers with a message that names
the mistake. The references are checked against the papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.exercises import positional_encoding as ex
from attn_helpers.exercises.workflow import EXERCISES
from attn_helpers.positional import sinusoidal_encoding

CHECKERS = [(ex.check_sinusoidal, "sinusoidal", "positional_encoding.sinusoidal"),
            (ex.check_rope, "rope_step", "positional_encoding.rope"),
            (ex.check_relative_gap, "relative_gap", "positional_encoding.relative_gap")]


@pytest.mark.parametrize("check, what, key", CHECKERS)
def test_a_stub_is_not_implemented_yet_and_nothing_more(check, what, key):
    def stub(*args):
        raise NotImplementedError

    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key == key and key in EXERCISES


# --- exercise 1: the sinusoidal table ---------------------------------------------------------


def learner_sinusoidal(n, d, *, start=0, exponent=lambda j, d: j / d, layout="interleave"):
    """A learner's table, loop by loop; each keyword plants one mistake. ``exponent(j, d)`` is
    the exponent of dimension j's frequency (right: 2i/d for both 2i and 2i+1)."""
    pe = torch.zeros(n, d, dtype=torch.float64)
    for p in range(n):
        for i in range(d // 2):
            sin_at, cos_at = {"swapped": (2 * i + 1, 2 * i), "halves": (i, d // 2 + i)}.get(
                layout, (2 * i, 2 * i + 1))
            pe[p, sin_at] = math.sin((p + start) / 10000 ** exponent(2 * i, d))
            pe[p, cos_at] = math.cos((p + start) / 10000 ** exponent(2 * i + (layout == "odd"), d))
    return pe.float()


def test_sinusoidal_checker_accepts_a_loop_and_blocks_the_course_helper():
    assert ex.check_sinusoidal(learner_sinusoidal)
    assert not ex.check_sinusoidal(lambda n, d: sinusoidal_encoding(n, d))


SINUSOIDAL_WRONG = {
    "sin and cos are swapped": dict(layout="swapped"),
    "they alternate: sin, cos, sin, cos": dict(layout="halves"),
    "not 10000^(-i/d)": dict(exponent=lambda j, d: (j // 2) / d),
    "its own exponent (2i+1)/d": dict(layout="odd"),
    "the first row is position p = 0": dict(start=1),
    "the frequencies grow instead of shrinking": dict(exponent=lambda j, d: -j / d),
}


@pytest.mark.parametrize("phrase", SINUSOIDAL_WRONG)
def test_sinusoidal_checker_names_the_mistake(phrase):
    verdict = ex.check_sinusoidal(lambda n, d: learner_sinusoidal(n, d, **SINUSOIDAL_WRONG[phrase]))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


# --- exercise 2: RoPE on a vector -------------------------------------------------------------


def rope_matrix(x, p, base=10000.0):
    """RoFormer's eq. 34 for one vector: the block-diagonal rotation matrix, built explicitly."""
    d = x.shape[-1]
    rotation = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = p * base ** (-2 * i / d)
        rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor(
            [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    return (x.double() @ rotation.T).to(x.dtype)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(half=st.integers(1, 8), p=st.integers(-50, 2000), heads=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_rope_reference_is_the_rotation_matrix_and_keeps_the_norm(half, p, heads, seed):
    x = torch.randn(heads, 2 * half, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    rotated = ex.rope_reference(x, p)
    assert torch.allclose(rotated, rope_matrix(x, p), atol=1e-9)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-10)


def learner_rope_complex(x, p):
    """A correct solution the other way round: each pair is a complex number times e^(i p w)."""
    d = x.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(omega), p * omega)) \
        .flatten(-2).to(x.dtype)


def step_with(rotate):
    """A decoding step built from a one-vector rotation, token by token (a learner's loop)."""
    def step(q, k, t):
        qs, ks = q.clone(), k.clone()
        for m in range(q.shape[-2]):
            qs[..., m, :], ks[..., m, :] = rotate(q[..., m, :], t + m), rotate(k[..., m, :], t + m)
        return qs, ks
    return step


def test_rope_checker_accepts_a_loop_over_the_matrix_and_the_complex_form():
    assert ex.check_rope(step_with(rope_matrix))
    assert ex.check_rope(step_with(learner_rope_complex))


def test_rope_checker_blocks_the_package_functions():
    from attn_helpers import positional

    def with_apply_rope(q, k, t):
        positions = t + torch.arange(q.shape[-2])
        return positional.apply_rope(q, positions), positional.apply_rope(k, positions)

    for answer in (ex.rope_step_reference, with_apply_rope):
        verdict = ex.check_rope(answer)
        assert not verdict and "does this exercise for you" in verdict.message
    verdict = ex.check_sinusoidal(sinusoidal_encoding)
    assert not verdict and "sinusoidal_encoding" in verdict.message


def learner_rope(q, k, t, *, sign=1, pairs="neighbours", back="interleave", exponent=None, shift=0,
                 reverse=False, start=None, axis=-2, keys=True):
    """A learner's decoding-step RoPE; each keyword plants one mistake."""
    def turn(x):
        d, n = x.shape[-1], x.shape[axis]
        i = torch.arange(d // 2, dtype=torch.float64)
        omega = 10000.0 ** (-(2 * i / d if exponent is None else exponent(i, d)))
        omega = omega.flip(0) if reverse else omega
        positions = (t if start is None else start) + shift + torch.arange(n, dtype=torch.float64)
        theta = sign * positions.view(-1, *([1] * (-axis - 2)), 1) * omega
        cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
        halves = (x[..., :d // 2], x[..., d // 2:])
        a, b = (x[..., 0::2], x[..., 1::2]) if pairs == "neighbours" else halves
        first, second = a * cos - b * sin, a * sin + b * cos
        if back == "interleave":
            return torch.stack([first, second], -1).flatten(-2)
        return torch.cat([first, second], -1)
    return turn(q), (turn(k) if keys else k)


def test_the_learner_model_without_mistakes_passes():
    assert ex.check_rope(learner_rope)


ROPE_WRONG = {
    "you started the positions at 0": dict(start=0),
    "the wrong way": dict(sign=-1),
    "the split-halves layout": dict(pairs="halves", back="concatenate"),
    "were not put back in place": dict(back="concatenate"),
    "not 10000^(-i/d)": dict(exponent=lambda i, d: i / d),
    "off by one": dict(shift=1),
    "along the heads axis": dict(axis=-3),
    "you rotated the queries only": dict(keys=False),
    "the frequencies run the wrong way": dict(reverse=True),
}


@pytest.mark.parametrize("phrase", ROPE_WRONG)
def test_rope_checker_names_the_mistake(phrase):
    verdict = ex.check_rope(lambda q, k, t: learner_rope(q, k, t, **ROPE_WRONG[phrase]))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_rope_checker_says_when_scores_depend_on_more_than_the_offset():
    verdict = ex.check_rope(lambda q, k, t: learner_rope(q, k, t, keys=False))
    assert "depend only on the offsets" in verdict.message


def test_rope_cases_cover_the_edge_cases():
    cases = ex._rope_cases()
    assert all(c["q"].dim() == 4 and c["q"].shape == c["k"].shape for c in cases)
    assert {c["q"].dtype for c in cases} == {torch.float32, torch.float64}
    assert any(c["t"] == 0 for c in cases) and any(c["t"] >= 1000 for c in cases)
    assert any(c["q"].shape[-1] == 2 for c in cases) and any(c["q"].shape[1] > 1 for c in cases)


# --- exercise 3: the relative-position check --------------------------------------------------


@settings(max_examples=30, deadline=None, derandomize=True)
@given(p=st.integers(0, 500), offset=st.integers(-100, 100), half=st.integers(1, 8),
       seed=st.integers(0, 1000))
def test_the_reference_gap_is_zero_for_rope_and_no_positions(p, offset, half, seed):
    q, k = torch.randn(2, 3, 2 * half, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)
    assert ex.relative_gap_reference(ex.SCHEMES["rope"], q, k, p, offset) < 1e-9
    assert ex.relative_gap_reference(ex.SCHEMES["none"], q, k, p, offset) == 0


def test_the_reference_gap_is_large_for_added_sinusoids():
    # notebook 07, section 4.1: added before the projection, position is not relative
    cases = [c for c in ex._gap_cases() if repr(c["encode"]) == "sinusoids added"]
    gaps = [ex.relative_gap_reference(*c.values()).item() for c in cases]
    assert len(gaps) == 4 and min(gaps) > 0.1
    q, k = torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sinusoid = torch.stack([sinusoidal_encoding(20, 8, dtype=torch.float64)[p] for p in (3, 7)])
    expected = ((q + sinusoid[0]) * (k + sinusoid[1])).sum() - (
        (q + sinusoidal_encoding(5, 8, dtype=torch.float64)[0])
        * (k + sinusoidal_encoding(5, 8, dtype=torch.float64)[4])).sum()
    assert torch.isclose(ex.relative_gap_reference(ex.SCHEMES["added"], q, k, 3, 4),
                         expected.abs())


def test_relative_gap_checker_accepts_the_reference_and_a_loop():
    assert ex.check_relative_gap(ex.relative_gap_reference, solution=True)

    def loop(encode, q, k, p, offset):
        gaps = [(encode(q[h], p) @ encode(k[h], p + offset)
                 - encode(q[h], 0) @ encode(k[h], offset)).abs() for h in range(q.shape[0])]
        return torch.stack(gaps).max()

    assert ex.check_relative_gap(loop)


def _score(encode, q, k, m, n):
    return (encode(q, m) * encode(k, n)).sum(-1)


RELATIVE_WRONG = {
    "the key must move with the query":
        lambda f, q, k, p, o: (_score(f, q, k, p, o) - _score(f, q, k, 0, o)).abs().max(),
    "not both at 0":
        lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, 0)).abs().max(),
    "take .abs() before .max()":
        lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, o)).max(),
    "that is the sum over the heads":
        lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, o)).abs().sum(),
    "the key needs its position too":
        lambda f, q, k, p, o: ((f(q, p) * k).sum(-1) - (f(q, 0) * k).sum(-1)).abs().max(),
    "compare the scores":
        lambda f, q, k, p, o: (f(q, p) - f(q, 0)).abs().max(),
}


@pytest.mark.parametrize("phrase", RELATIVE_WRONG)
def test_relative_gap_checker_names_the_mistake(phrase):
    verdict = ex.check_relative_gap(RELATIVE_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_relative_gap_returning_zero_is_rejected():
    verdict = ex.check_relative_gap(lambda *a: torch.zeros((), dtype=torch.float64))
    assert not verdict and "sinusoids added" in verdict.message
