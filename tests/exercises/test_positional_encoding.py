"""The checkers of notebook 07 (``exercises.positional_encoding``): each accepts the reference and a
learner's other correct solutions, and rejects plausible wrong answers with a message that names
the mistake. The references are checked against the papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import as_learner_code, skeleton
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers.exercises import positional_encoding as ex
from attn_helpers.exercises.workflow import EXERCISES
from attn_helpers.positional import sinusoidal_encoding

CHECKERS = [(ex.check_sinusoidal, "shift_matrix", "positional_encoding.sinusoidal"),
            (ex.check_rope, "rope_score", "positional_encoding.rope"),
            (ex.check_alibi, "alibi", "positional_encoding.alibi")]


@pytest.mark.parametrize("check, what, key", CHECKERS)
def test_a_stub_is_not_implemented_yet_and_nothing_more(check, what, key):
    def stub(*args):
        raise NotImplementedError

    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key == key and key in EXERCISES


# --- exercise 1: moving by k is a matrix -------------------------------------------------------


@pytest.mark.parametrize("k, d", [(1, 8), (5, 16), (-3, 4), (250, 32), (0, 2)])
def test_the_shift_matrix_moves_the_table_by_k(k, d):
    PE = sinusoidal_encoding(300, d).double()                                 # (n, d)
    M = ex.shift_matrix_reference(k, d)
    start = max(0, -k)
    moved = PE[start:300 - max(k, 0)] @ M.T                                   # rows: M_k PE(p)
    assert torch.allclose(moved, PE[start + k:300 - max(k, 0) + k], atol=1e-5)
    assert torch.allclose(M.T @ M, torch.eye(d, dtype=torch.float64), atol=1e-12)  # a rotation


def learner_shift(k, d, *, sign=1, exponent=None, reverse=False, halves=False, same_angle=False,
                  cos_only=False, transpose=False):
    """A learner's M_k, pair by pair with math; each keyword plants one mistake."""
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        j = (d // 2 - 1 - i) if reverse else i
        b = k * (1.0 if same_angle else 10000.0 ** -(2 * j / d if exponent is None else exponent(j, d)))
        a, c = (i, i + d // 2) if halves else (2 * i, 2 * i + 1)
        sin = 0.0 if cos_only else sign * math.sin(b)
        M[a, a], M[a, c], M[c, a], M[c, c] = math.cos(b), sin, -sin, math.cos(b)
    return M.T if transpose else M


def test_shift_checker_wants_the_float64_matrix_the_exercise_names():
    verdict = ex.check_sinusoidal(lambda k, d: learner_shift(k, d).float())
    assert not verdict and "as torch.float32; the right answer is torch.float64" in verdict.message


def test_shift_checker_accepts_a_loop_and_blocks_the_package():
    from attn_helpers import positional

    assert ex.check_sinusoidal(learner_shift)
    assert ex.check_sinusoidal(ex.shift_matrix_reference, solution=True)

    def from_pair_rotation(k, d):
        return torch.block_diag(*[positional.pair_rotation(k, d, i) for i in range(d // 2)])

    verdict = ex.check_sinusoidal(from_pair_rotation)
    assert not verdict and "pair_rotation" in verdict.message, verdict.message
    verdict = ex.check_sinusoidal(ex.shift_matrix_reference)
    assert not verdict and "the checker's own reference" in verdict.message, verdict.message


# --- exercise 2: the RoPE score from the offset alone -------------------------------------------


def rope_matrix(x, p, base=10000.0):
    """RoFormer's eq. 34 for one vector: the block-diagonal rotation matrix, built explicitly."""
    d = x.shape[-1]
    rotation = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = p * base ** (-2 * i / d)
        rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor(
            [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    return x.double() @ rotation.T


@settings(max_examples=30, deadline=None, derandomize=True)
@given(half=st.integers(1, 8), m=st.integers(-50, 2000), delta=st.integers(-50, 2000),
       seed=st.integers(0, 1000))
def test_rope_reference_is_the_score_of_the_rotation_matrices_at_any_position(half, m, delta, seed):
    q, k = torch.randn(2, 2 * half, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    direct = rope_matrix(q, m) @ rope_matrix(k, m - delta)
    assert torch.allclose(ex.rope_reference(q, k, torch.tensor([delta])), direct.reshape(1), atol=1e-9)


def loop_over_pairs(q, k, delta):
    """A learner's loop: pair by pair, turn the key's pair by -delta omega_i and take the dot."""
    d = q.shape[-1]
    out = torch.zeros(*q.shape[:-1], len(delta), dtype=torch.float64)
    for j, dl in enumerate(delta.tolist()):
        for i in range(d // 2):
            theta = -dl * 10000.0 ** (-2 * i / d)
            c, e = k[..., 2 * i].double(), k[..., 2 * i + 1].double()
            c, e = c * math.cos(theta) - e * math.sin(theta), c * math.sin(theta) + e * math.cos(theta)
            out[..., j] += q[..., 2 * i].double() * c + q[..., 2 * i + 1].double() * e
    return out.to(q.dtype)


def complex_form(q, k, delta):
    """Another correct answer: pairs as complex numbers, score = Re(sum q conj(k) e^(i delta w))."""
    d = q.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    zq = torch.view_as_complex(q.double().reshape(*q.shape[:-1], d // 2, 2).contiguous())
    zk = torch.view_as_complex(k.double().reshape(*k.shape[:-1], d // 2, 2).contiguous())
    turn = torch.polar(torch.ones(len(delta), d // 2, dtype=torch.float64),
                       delta.double()[:, None] * omega)
    return ((zq * zk.conj())[..., None, :] * turn).real.sum(-1).to(q.dtype)


def query_at_zero(q, k, delta):
    """Another correct answer: section 4's rotation written out, query at 0, key at -delta."""
    d = q.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = -delta.double()[:, None] * omega                                   # (n, d/2)
    even, odd = k.double()[..., None, 0::2], k.double()[..., None, 1::2]       # (..., 1, d/2)
    k_at = torch.stack([even * angles.cos() - odd * angles.sin(),
                        even * angles.sin() + odd * angles.cos()], -1).flatten(-2)  # (..., n, d)
    return (q.double()[..., None, :] * k_at).sum(-1).to(q.dtype)


@pytest.mark.parametrize("answer", [loop_over_pairs, complex_form, query_at_zero])
def test_rope_checker_accepts_other_correct_answers(answer):
    verdict = ex.check_rope(answer)
    assert verdict, verdict.message


def test_rope_checker_blocks_the_package_functions():
    from attn_helpers import positional

    def with_apply_rope(q, k, delta):
        n = len(delta)
        q_at = positional.apply_rope(q[..., None, :].expand(*q.shape[:-1], n, q.shape[-1]),
                                     torch.zeros(n))
        return (q_at * positional.apply_rope(k[..., None, :].expand_as(q_at), -delta)).sum(-1)

    for answer in (ex.rope_reference, with_apply_rope):
        verdict = ex.check_rope(answer)
        assert not verdict and "does this exercise for you" in verdict.message, verdict.message
    verdict = ex.check_sinusoidal(sinusoidal_encoding)
    assert not verdict and "sinusoidal_encoding" in verdict.message


def learner_score(q, k, delta, *, sign=1, halves=False, exponent=None, reverse=False, cos_only=False,
                  same_angle=False, both=False):
    """A learner's score by offset, written out; each keyword plants one mistake."""
    d = q.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    omega = 10000.0 ** (-(2 * i / d if exponent is None else exponent(i, d)))
    omega = omega.flip(0) if reverse else omega
    omega = torch.ones_like(omega) if same_angle else omega
    angles = delta.double()[:, None] * omega
    pick = (lambda x: (x[..., :d // 2], x[..., d // 2:])) if halves else (
        lambda x: (x[..., 0::2], x[..., 1::2]))
    (a, b), (c, e) = pick(q.double()), pick(k.double())
    dot, cross = (a * c + b * e)[..., None, :], (a * e - b * c)[..., None, :]
    if both:
        angles = torch.zeros_like(angles)
    score = dot * angles.cos() + (0 if cos_only else sign * cross * angles.sin())
    return score.sum(-1).to(q.dtype)


def test_the_learner_model_without_mistakes_passes():
    assert ex.check_rope(learner_score)


#: Exercises 1 and 2: a learner's answer with one planted mistake, and the phrase naming it.
NAMED_MISTAKES = [
    (ex.check_sinusoidal, learner_shift, "the sin terms have the wrong signs", dict(sign=-1)),
    (ex.check_sinusoidal, learner_shift, "only the cos terms", dict(cos_only=True)),
    (ex.check_sinusoidal, learner_shift, "not 10000^(-i/d)", dict(exponent=lambda j, d: j / d)),
    (ex.check_sinusoidal, learner_shift, "the frequencies run the wrong way", dict(reverse=True)),
    (ex.check_sinusoidal, learner_shift, "every pair turned by the same angle k", dict(same_angle=True)),
    (ex.check_sinusoidal, learner_shift, "you paired dimension i with i + d/2", dict(halves=True)),
    (ex.check_sinusoidal, learner_shift, "(or M_k is transposed)", dict(transpose=True)),
    (ex.check_rope, learner_score, "the sin term has the wrong sign", dict(sign=-1)),
    (ex.check_rope, learner_score, "the split-halves layout", dict(halves=True)),
    (ex.check_rope, learner_score, "not 10000^(-i/d)", dict(exponent=lambda i, d: i / d)),
    (ex.check_rope, learner_score, "the frequencies run the wrong way", dict(reverse=True)),
    (ex.check_rope, learner_score, "you kept only the cos term", dict(cos_only=True)),
    (ex.check_rope, learner_score, "every pair turned by the same angle", dict(same_angle=True)),
    (ex.check_rope, learner_score, "a shared rotation cancels", dict(both=True)),
]


@pytest.mark.parametrize("check, learner, phrase, flaw", NAMED_MISTAKES)
def test_exercises_1_and_2_name_the_mistake(check, learner, phrase, flaw):
    verdict = check(lambda *args: learner(*args, **flaw))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message


def test_rope_cases_cover_the_edge_cases():
    cases = ex._rope_cases()
    assert all(c["q"].shape == c["k"].shape and c["delta"].dim() == 1 for c in cases)
    assert {c["q"].dtype for c in cases} == {torch.float32, torch.float64}
    assert any((c["delta"] == 0).any() for c in cases) and any((c["delta"] < 0).any() for c in cases)
    assert any(c["delta"].max() >= 1000 for c in cases)
    assert any(c["q"].shape[-1] == 2 for c in cases) and any(c["q"].dim() == 2 for c in cases)


# --- exercise 3: the ALiBi bias ------------------------------------------------------------------


def learner_alibi(n, H):  # noqa: N803 - a learner's loop, the paper's formula entry by entry
    bias = torch.empty(H, n, n)
    for h in range(1, H + 1):
        for i in range(n):
            for j in range(n):
                bias[h - 1, i, j] = -(2 ** (-8 * h / H)) * (i - j) if j <= i else -math.inf
    return bias


def test_the_alibi_reference_is_the_papers_bias():
    """Press, Smith & Lewis (2022): 8 heads get the slopes 1/2, 1/4, ..., 1/256; 16 heads the
    geometric sequence with ratio 2^(-1/2); the bias is -m (i - j) on the keys a query sees."""
    assert torch.allclose(ex.alibi_reference(3, 8)[:, 2, 0].double(),
                          -2 * 2.0 ** -torch.arange(1, 9, dtype=torch.float64))
    slopes = -ex.alibi_reference(2, 16)[:, 1, 0].double()
    assert torch.allclose(slopes[1:] / slopes[:-1], torch.full((15,), 2 ** -0.5, dtype=torch.float64))
    assert torch.isinf(ex.alibi_reference(4, 2)[:, 0, 1]).all()
    assert torch.equal(ex.alibi_reference(6, 4), learner_alibi(6, 4))


def test_alibi_checker_accepts_a_loop_and_a_vectorised_answer():
    assert ex.check_alibi(learner_alibi)

    def vectorised(n, H):  # noqa: N803
        m = torch.logspace(-8 / H, -8, H, base=2)                                # (H,)
        distance = torch.arange(n)[:, None] - torch.arange(n)                     # (n, n): i - j
        return (-m[:, None, None] * distance).masked_fill(distance < 0, -torch.inf)

    assert ex.check_alibi(vectorised)


def _wrong(**flaw):
    alibi = as_learner_code(ex._alibi)               # made before the checker runs
    return lambda n, H: alibi(n, H, **flaw)  # noqa: N803


ALIBI_WRONG = {
    "numbered from 0": _wrong(first=0),
    "the sign is flipped": _wrong(sign=1.0),
    "got the distance penalty -m_h |i - j| instead of the causal mask":
        _wrong(distance="abs", future=None),
    "there is no causal mask": _wrong(future=None),
    "the future keys got bias 0": _wrong(future=0.0),
    "the slopes went along the query rows": _wrong(per="query"),
    "the slopes went along the key columns": _wrong(per="key"),
    "right for H = 8 only": _wrong(H_for_ratio=8),
    "use e instead of 2": _wrong(base=math.e),
    "the slopes run backwards": _wrong(order="down"),
    "the diagonal (j = i, the query's own token) is masked too": _wrong(diagonal=False),
    "the bias is transposed": _wrong(transpose=True),
}


@pytest.mark.parametrize("phrase", ALIBI_WRONG)
def test_alibi_checker_names_the_mistake(phrase):
    verdict = ex.check_alibi(ALIBI_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message


def test_the_alibi_mistakes_come_from_learner_code_too():
    """Two of the named mistakes, written as a learner would."""
    def from_zero(n, H):  # noqa: N803
        m = 2.0 ** (-8.0 * torch.arange(H) / H)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (-m[:, None, None] * (i - j)).masked_fill(j > i, -math.inf)

    def per_query(n, H):  # noqa: N803
        m = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (-m[:, None] * (i - j)).masked_fill(j > i, -math.inf)

    assert "numbered from 0" in ex.check_alibi(from_zero).message
    assert "along the query rows" in ex.check_alibi(per_query).message


@pytest.mark.parametrize("shortcut, name", [
    (lambda n, H: ah.alibi_bias(n, H).masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf),
     "alibi_bias"),
    (lambda n, H: -ah.alibi_slopes(H)[:, None, None] * (torch.arange(n)[:, None] - torch.arange(n))
     .clamp_min(0).double(), "alibi_slopes"),
    (ex.alibi_reference, "the checker's own reference"),
    (ex._alibi, "the checker's own bias"),
])
def test_alibi_checker_blocks_the_package(shortcut, name):
    verdict = ex.check_alibi(shortcut)
    assert not verdict and name in verdict.message, verdict.message
    assert "does this exercise" in verdict.message
    assert ah.alibi_bias(2, 2).shape == (2, 2, 2)                                 # restored after


def test_the_level_3_skeletons_filled_in_pass():
    omega = "10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)"
    shift = skeleton("positional_encoding.sinusoidal", "k, d_model", (
        omega, "(k * omega).cos(), (k * omega).sin()", "c, s", "-s, c"))
    assert ex.check_sinusoidal(shift)
    rope = skeleton("positional_encoding.rope", "q, k, delta", (
        "10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)",
        "delta.to(torch.float64)[:, None] * omega",
        "(a * c + b * e)[..., None, :]", "(a * e - b * c)[..., None, :]",
        "(dot * angles.cos() + cross * angles.sin()).sum(-1).to(q.dtype)"))
    assert ex.check_rope(rope)
    alibi = skeleton("positional_encoding.alibi", "n, H", (
        "2.0 ** (-8.0 * h / H)", "-m[:, None, None] * (i - j)"))
    assert ex.check_alibi(alibi)
