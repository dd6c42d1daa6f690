"""The checkers of notebook 07 (``exercises.positional_encoding``): each accepts the reference and a
learner's other correct solutions, and rejects plausible wrong answers with a message that names
the mistake. The references are checked against the papers' formulas."""

from __future__ import annotations

import math
import sys

import mpmath
import pytest
import torch
from _exercises import as_learner_code, assert_skeleton, skeleton
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers.exercises import positional_encoding as ex
from attn_helpers.exercises.positional_mistakes import ROW_GUARD_MIN
from attn_helpers.exercises.workflow import EXERCISES
from attn_helpers.lessons import positional_encoding as lesson
from attn_helpers.positional import sinusoidal_encoding

CHECKERS = [(ex.check_sinusoidal, "shift_matrix", "positional_encoding.sinusoidal"),
            (ex.check_rope, "rope_coefficients", "positional_encoding.rope"),
            (ex.check_reach, "half_weight_reach", "positional_encoding.reach")]


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


def own_table(n, d):
    """A learner's own sinusoidal table (the package's is blocked), float64."""
    angles = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.empty(n, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = angles.sin(), angles.cos()
    return table


def fitted_shift(k, d, *, how="lstsq"):
    """Section 2's demonstration turned into an answer: M_k fitted on positions far enough apart
    that every pair turns (well conditioned, so the fit matches the reference to 1e-6)."""
    start = max(0, -k)
    X, Y = own_table(200_000, d)[start:100_000], own_table(200_000, d)[start + k:100_000 + k]
    if how == "lstsq":
        return torch.linalg.lstsq(X, Y).solution.T
    if how == "normal equations":
        return (torch.linalg.inv(X.T @ X) @ X.T @ Y).T
    if how == "pinv":
        return (torch.linalg.pinv(X) @ Y).T
    import numpy as np

    return torch.from_numpy(np.linalg.lstsq(X.numpy(), Y.numpy(), rcond=None)[0].T.copy())


def test_a_least_squares_fit_would_pass_without_the_guard():
    """Why exercise 1 refuses numerical fits: section 2 shows how to fit M_k, and a well-conditioned
    fit is as close to the reference as the checker asks."""
    for k, d in [(1, 8), (100, 32), (-2, 8)]:
        assert torch.allclose(fitted_shift(k, d), ex.shift_matrix_reference(k, d), atol=1e-6)


@pytest.mark.parametrize("how, named", [
    ("lstsq", "linalg_lstsq"), ("normal equations", "linalg_inv"), ("pinv", "numerically"),
    ("numpy", "numpy.linalg.lstsq")])
def test_shift_checker_refuses_a_numerical_fit(how, named):
    verdict = ex.check_sinusoidal(lambda k, d: fitted_shift(k, d, how=how))
    assert not verdict and named in verdict.message and "angle-addition" in verdict.message, (
        verdict.message)


def test_shift_checker_accepts_a_matrix_exponential():
    """Only fits are refused: a rotation built as exp(b J) per pair is a derivation, and passes."""
    def by_exponential(k, d):
        J = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
        omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        return torch.block_diag(*[torch.linalg.matrix_exp(k * w * J) for w in omega])

    assert ex.check_sinusoidal(by_exponential)


#: Exercise 1: a learner's answer with one planted mistake, and the phrase naming it.
NAMED_MISTAKES = [
    ("the sin terms have the wrong signs", dict(sign=-1)),
    ("only the cos terms", dict(cos_only=True)),
    ("not 10000^(-i/d)", dict(exponent=lambda j, d: j / d)),
    ("the frequencies run the wrong way", dict(reverse=True)),
    ("every pair turned by the same angle k", dict(same_angle=True)),
    ("you paired dimension i with i + d/2", dict(halves=True)),
    ("(or M_k is transposed)", dict(transpose=True)),
]


@pytest.mark.parametrize("phrase, flaw", NAMED_MISTAKES)
def test_exercise_1_names_the_mistake(phrase, flaw):
    verdict = ex.check_sinusoidal(lambda *args: learner_shift(*args, **flaw))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message


# --- exercise 2: the score depends on q, k and delta through d/2 pairs of coefficients ----------


def rope_matrix(x, p, base=10000.0):
    """RoFormer's eq. 34 for one vector: the block-diagonal rotation matrix, built explicitly."""
    d = x.shape[-1]
    rotation = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = p * base ** (-2 * i / d)
        rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor(
            [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
            dtype=torch.float64)
    return x.double() @ rotation.T


def series(a, b, delta):
    """sum_i a_i cos(delta w_i) + b_i sin(delta w_i), for one offset, written out."""
    d = 2 * a.shape[-1]
    return sum(a[i] * math.cos(delta * 10000.0 ** (-2 * i / d))
               + b[i] * math.sin(delta * 10000.0 ** (-2 * i / d)) for i in range(d // 2))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(half=st.integers(1, 8), m=st.integers(-50, 2000), delta=st.integers(-2000, 2000),
       seed=st.integers(0, 1000))
def test_the_references_are_the_score_of_the_rotation_matrices_at_any_position(half, m, delta, seed):
    q, k = torch.randn(2, 2 * half, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    direct = rope_matrix(q, m) @ rope_matrix(k, m - delta)
    score = ex.rope_score_reference(q, k, torch.tensor([delta]), torch.tensor([m]))
    assert torch.allclose(score, direct.reshape(1), atol=1e-9)
    assert math.isclose(float(series(*ex.rope_coefficients_reference(q, k), delta)), direct.item(),
                        abs_tol=1e-9)


def test_the_sign_convention():
    """apply_rope turns a pair counter-clockwise, so R(m)^T R(m - delta) = R(-delta) = [[c, s], [-s, c]]
    and b_i = q_2i k_2i+1 - q_2i+1 k_2i: q = e_0, k = e_1 (a quarter turn ahead) scores sin(delta)
    for the key delta back, -sin(delta) for the key delta ahead."""
    q, k = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)
    a, b = ex.rope_coefficients_reference(q, k)
    assert a.tolist() == [0.0] and b.tolist() == [1.0]
    for delta in (1, 2, -3):
        assert math.isclose((rope_matrix(q, 5) @ rope_matrix(k, 5 - delta)).item(), math.sin(delta),
                            abs_tol=1e-12)


def test_the_cases_pin_a_and_b_down():
    """Every case has offsets enough that the (cos, sin) design matrix has full column rank, well
    conditioned: only the right (a, b) gives all its scores, so any correct answer passes and
    nothing else; the cases cover zero, negative and far offsets and many query positions."""
    cases = ex._rope_cases()
    for c in cases:
        d = c["q"].shape[-1]
        angles = c["delta"].double()[:, None] * 10000.0 ** (-torch.arange(0, d, 2).double() / d)
        design = torch.cat([angles.cos(), angles.sin()], 1)                 # (n, d)
        assert torch.linalg.svdvals(design)[-1] > 0.05, c["q"].shape
        assert c["q"].dtype == c["k"].dtype == torch.float64 and c["delta"].shape == c["m"].shape
        assert (c["delta"] == 0).any() and (c["delta"] < 0).any() and c["delta"].abs().max() >= 1000
        assert len(set(c["m"].tolist())) > 10
    assert any(c["q"].shape[-1] == 2 for c in cases) and any(c["q"].dim() == 2 for c in cases)


def by_pairs(q, k):
    q0, q1, k0, k1 = q[..., 0::2], q[..., 1::2], k[..., 0::2], k[..., 1::2]
    return q0 * k0 + q1 * k1, q0 * k1 - q1 * k0


def complex_form(q, k):
    """Pairs as complex numbers: the score is Re(z_q conj(z_k) e^(i delta w)), so a = Re, b = -Im."""
    zq = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2).contiguous())
    zk = torch.view_as_complex(k.reshape(*k.shape[:-1], -1, 2).contiguous())
    product = zq * zk.conj()
    return product.real, -product.imag


def quarter_turn(q, k):
    """a_i: the pair's score at delta = 0; b_i: with the key's pair turned a quarter turn back,
    written with the learner's own rotation (delta w_i = pi / 2)."""
    k0, k1 = k[..., 0::2], k[..., 1::2]
    turned = torch.stack([k1, -k0], -1).flatten(-2)            # R(-pi/2) on every pair
    return (q * k).reshape(*q.shape[:-1], -1, 2).sum(-1), (q * turned).reshape(
        *q.shape[:-1], -1, 2).sum(-1)


@pytest.mark.parametrize("answer", [by_pairs, complex_form, quarter_turn])
def test_rope_checker_accepts_correct_answers(answer):
    verdict = ex.check_rope(answer)
    assert verdict, verdict.message


def test_rope_checker_blocks_the_package_and_numerical_fits():
    from attn_helpers import positional

    def with_apply_rope(q, k):
        turned = positional.apply_rope(k[..., None, :], torch.zeros(1))[..., 0, :]
        return by_pairs(q, turned)

    def fitted(q, k):
        """The learner's own rotation at d offsets, then a and b solved for numerically."""
        d = q.shape[-1]
        delta = torch.arange(1, d + 1, dtype=torch.float64)
        angles = delta[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        design = torch.cat([angles.cos(), angles.sin()], 1)                          # (d, d)
        a, b = by_pairs(q, k)
        scores = torch.cat([a, b], -1) @ design.T                                    # (..., d)
        solved = torch.linalg.solve(design, scores[..., None])[..., 0]
        return solved[..., :d // 2], solved[..., d // 2:]

    for answer, phrase in [(with_apply_rope, "apply_rope"), (fitted, "numerically"),
                           (ex.rope_coefficients_reference, "the checker's own reference"),
                           (ex._coefficients, "the checker's own code")]:
        verdict = ex.check_rope(answer)
        assert not verdict and phrase in verdict.message and "does this exercise" in verdict.message, (
            verdict.message)
    assert ex.check_rope(ex.rope_coefficients_reference, solution=True)


def learner_coefficients(q, k, *, sign=1, no_b=False, swap=False, plus=False, halves=False,
                         per_dimension=False, single=False):
    """A learner's (a, b), written out; each keyword plants one mistake."""
    d = q.shape[-1]
    if per_dimension:
        return q * k, q * k.roll(1, -1)
    (q0, q1), (k0, k1) = [(x[..., :d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
                          for x in (q, k)]
    a, b = q0 * k0 + q1 * k1, sign * (q0 * k1 + q1 * k0 if plus else q0 * k1 - q1 * k0)
    b = torch.zeros_like(a) if no_b else b
    a, b = (b, a) if swap else (a, b)
    return (a.float(), b.float()) if single else (a, b)


ROPE_WRONG = {
    "key delta positions AHEAD of the query": dict(sign=-1),
    "b is zero": dict(no_b=True),
    "a and b are swapped": dict(swap=True),
    "b is a sum of the two cross terms": dict(plus=True),
    "the split-halves layout": dict(halves=True),
    "one coefficient per dimension (..., d)": dict(per_dimension=True),
    "keep a and b float64": dict(single=True),
}


def test_the_learner_model_without_mistakes_passes():
    assert ex.check_rope(learner_coefficients)


@pytest.mark.parametrize("phrase", ROPE_WRONG)
def test_rope_checker_names_the_mistake(phrase):
    verdict = ex.check_rope(lambda q, k: learner_coefficients(q, k, **ROPE_WRONG[phrase]))
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message
    others = [p for p in ROPE_WRONG if p != phrase]
    assert not any(p in verdict.message for p in others), verdict.message


@pytest.mark.parametrize("flaw, phrase", [
    (dict(sign=-1.0), "AHEAD"), (dict(no_b=True), "b is zero"), (dict(swap=True), "swapped"),
    (dict(plus=True), "a sum of the two cross terms"), (dict(halves=True), "split-halves")])
def test_each_generated_rope_mistake_gets_its_own_hint(flaw, phrase):
    coefficients = as_learner_code(ex._coefficients)
    assert ex.check_rope(lambda q, k: coefficients(q, k))  # a learner's copy of the right code
    verdict = ex.check_rope(lambda q, k: coefficients(q, k, **flaw))
    assert not verdict and phrase in verdict.message and verdict.message.count("Hint:") == 1, (
        verdict.message)


def test_rope_checker_wants_two_tensors():
    verdict = ex.check_rope(lambda q, k: torch.stack(by_pairs(q, k)))
    assert not verdict and "must return two tensors (a, b), got Tensor" in verdict.message
    verdict = ex.check_rope(lambda q, k: tuple(t.sum(-1) for t in by_pairs(q, k)))
    assert not verdict and "one number per pair" in verdict.message, verdict.message


# --- exercise 3: how far back an ALiBi head looks -----------------------------------------------

mpmath.mp.dps = 40


def exact_x(m: float, n: int) -> mpmath.mpf:
    """The real-valued k with share(k) = 1/2, to 40 digits: -ln((1 + r^n) / 2) / m, r = e^-m."""
    m = mpmath.mpf(m)
    return -mpmath.log((1 + mpmath.exp(-m * n)) / 2) / m


def summed_reach(m: float, n: int) -> int:
    """The definition itself, to 40 digits: the fewest nearest keys whose weight reaches half."""
    weights = [mpmath.exp(-mpmath.mpf(m) * delta) for delta in range(n)]
    total, running = mpmath.fsum(weights), mpmath.mpf(0)
    for k, w in enumerate(weights, start=1):
        running += w
        if running >= total / 2:
            return k
    raise AssertionError("unreachable: the whole row holds all its weight")


def test_the_reach_reference_is_the_definition_on_every_case():
    for case in ex._reach_cases():
        got = ex.half_weight_reach_reference(case["m"], case["n"])
        assert got.dtype == torch.long and got.shape == case["m"].shape
        assert got.tolist() == [summed_reach(m, case["n"]) for m in case["m"].tolist()], case


def test_the_cases_cover_the_edges_and_stay_away_from_ties():
    cases = ex._reach_cases()
    for case in cases:
        for m in case["m"].tolist():
            x = exact_x(m, case["n"])
            if x > 1:   # below 1 every route gives 1: the nearest key alone always holds half
                assert min(x - mpmath.floor(x), mpmath.ceil(x) - x) >= ex.REACH_MARGIN, (m, case["n"])
    assert {len(c["m"]) for c in cases} >= {4, 8, 12} and all(c["m"].dim() == 1 for c in cases)
    assert {c["m"].dtype for c in cases} == {torch.float64}
    assert min(c["n"] for c in cases) == 1 and max(c["n"] for c in cases) >= 3000
    assert min(c["m"].min() for c in cases) < 1e-5 and max(c["m"].max() for c in cases) > 10


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11, 1001])
def test_the_reach_limits(n):
    """One key reaches 1; a vanishing slope makes the row uniform, ceil(n / 2); a long row gives an
    endless row's ceil(ln 2 / m)."""
    tiny = torch.tensor([1e-12], dtype=torch.float64)
    assert ex.half_weight_reach_reference(tiny, n).item() == math.ceil(n / 2)
    slopes = ah.alibi_slopes(8)
    assert ex.half_weight_reach_reference(slopes, 1).tolist() == [1] * 8
    assert torch.equal(ex.half_weight_reach_reference(slopes, 10**6),
                       torch.ceil(math.log(2) / slopes).long())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(log_m=st.floats(math.log(1e-4), math.log(50.0)), n=st.integers(1, 3000))
def test_the_reach_is_between_1_and_n_and_matches_a_float64_running_sum(log_m, n):
    m = torch.tensor([math.exp(log_m)], dtype=torch.float64)
    k = ex.half_weight_reach_reference(m, n).item()
    assert 1 <= k <= n
    x = exact_x(m.item(), n)
    if min(x - mpmath.floor(x), mpmath.ceil(x) - x) > 1e-6:      # away from a tie
        assert k == summed_reach(m.item(), n)


def closed_form(m, n):
    r_n = torch.exp(-m * n)                                     # (H,): r^n
    return torch.ceil(-torch.log((1 + r_n) / 2) / m).long()


def running_sum(m, n, *, dtype=torch.float64):
    delta = torch.arange(n, dtype=dtype)                        # (n,): distances 0 .. n-1
    weights = torch.softmax(-m.to(dtype)[:, None] * delta, dim=-1)  # (H, n)
    return (weights.cumsum(-1) < 0.5).sum(-1) + 1                # keys before half, plus one


def python_loop(m, n):
    reaches = []
    for slope in m.tolist():
        weights = [math.exp(-slope * delta) for delta in range(n)]
        running = 0.0
        for k, w in enumerate(weights, start=1):
            running += w
            if running >= sum(weights) / 2:
                reaches.append(k)
                break
    return torch.tensor(reaches)


def bisection(m, n):
    """Search k in 1 .. n with the closed-form share (1 - r^k) / (1 - r^n) >= 1/2."""
    def share(k):
        return torch.expm1(-m * k) / torch.expm1(-m * n)
    low, high = torch.ones_like(m, dtype=torch.long), torch.full_like(m, n, dtype=torch.long)
    while bool((low < high).any()):
        mid = (low + high) // 2
        enough = share(mid) >= 0.5
        high, low = torch.where(enough, mid, high), torch.where(enough, low, mid + 1)
    return low


def log1p_form(m, n):
    return torch.ceil(-torch.log1p(torch.expm1(-m * n) / 2) / m).long()


@pytest.mark.parametrize("answer", [closed_form, log1p_form, bisection],
                         ids=["closed form", "log1p closed form", "bisection on the closed share"])
def test_reach_checker_accepts_correct_answers(answer):
    verdict = ex.check_reach(answer)
    assert verdict, verdict.message


def test_a_row_sum_is_right_on_every_case():
    """Why exercise 3 refuses row sums: without the guard they are right on every case."""
    for case in ex._reach_cases():
        expected = ex.half_weight_reach_reference(case["m"], case["n"])
        assert torch.equal(running_sum(case["m"], case["n"]), expected)
        assert torch.equal(python_loop(case["m"], case["n"]), expected)


@pytest.mark.parametrize("answer, phrase", [
    (running_sum, "built a tensor of shape"), (python_loop, "lines of Python"),
    (lambda m, n: running_sum(m, n, dtype=torch.float32), "built a tensor of shape"),
    (lambda m, n: torch.stack([running_sum(s[None], n)[0] for s in m]), "built a tensor of shape"),
], ids=["float64 running sum", "python loop", "float32 running sum", "one head at a time"])
def test_reach_checker_refuses_a_sum_over_the_row(answer, phrase):
    verdict = ex.check_reach(answer)
    assert not verdict and phrase in verdict.message and "a sum over the row" in verdict.message, (
        verdict.message)
    assert "even for an endless row" in verdict.message and "n = 3000" in verdict.message
    assert sys.gettrace() is None                           # the line counter is gone afterwards


def test_the_row_guard_watches_long_rows_only():
    cases = ex._reach_cases()
    assert max(c["n"] for c in cases) >= 2048 and sum(c["n"] >= ROW_GUARD_MIN for c in cases) >= 3
    assert max(len(c["m"]) for c in cases) < ROW_GUARD_MIN  # a closed form's (H,) tensors pass


def learner_reach(m, n, *, flaw=None):
    """A learner's answer with one planted mistake (``flaw``), by the route a learner would take."""
    if flaw in ("no plus one", "sign", "base 2", "n + 1 keys", "own token left out"):
        delta = {"n + 1 keys": torch.arange(n + 1), "own token left out": torch.arange(1, n)}.get(
            flaw, torch.arange(n)).double()
        scores = {"sign": m[:, None] * delta,
                  "base 2": -m[:, None] * delta * math.log(2)}.get(flaw, -m[:, None] * delta)
        running = torch.softmax(scores, dim=-1).cumsum(-1)
        return (running < 0.5).sum(-1) + (0 if flaw == "no plus one" else 1)
    if flaw in ("mean, rounded", "mean, up"):
        delta = torch.arange(n).double()
        mean = (torch.softmax(-m[:, None] * delta, dim=-1) * delta).sum(-1)
        return (mean.round() if flaw == "mean, rounded" else mean.ceil()).long()
    log = torch.log2 if flaw == "log2" else torch.log
    x = -log((1 + torch.exp(-m * n)) / 2) / m
    if flaw in ("endless", "endless, capped"):
        x = math.log(2) / m
    if flaw == "uniform":
        x = torch.full_like(m, n / 2)
    k = {"floor": x.floor(), "truncated": x, "round": x.round()}.get(flaw, x.ceil()).long()
    return k.clamp(max=n) if flaw == "endless, capped" else k


REACH_WRONG = {
    "no plus one": "one short",
    "floor": "one short",
    "truncated": "Rounding x = -ln((1 + r^n) / 2) / m down (floor, int(), .long())",
    "round": "to the nearest whole number",
    "endless": "ln 2 / m is the reach of an endless row",
    "endless, capped": "capping at n does not mend it",
    "sign": "the weights grow with the distance",
    "base 2": "you weighed the key delta back by 2^{-m delta}",
    "log2": "you took a base-2 logarithm",
    "mean, rounded": "that is the row's mean distance",
    "mean, up": "that is the row's mean distance",
    "n + 1 keys": "your row has n + 1 keys",
    "own token left out": "your row has n - 1 keys",
    "uniform": "your reaches ignore the slope",
}


def test_the_learner_model_without_a_flaw_passes():
    assert ex.check_reach(learner_reach)


@pytest.mark.parametrize("flaw", REACH_WRONG)
def test_reach_checker_names_the_mistake(flaw):
    verdict = ex.check_reach(lambda m, n: learner_reach(m, n, flaw=flaw))
    assert not verdict and "Not yet" in verdict.message and REACH_WRONG[flaw] in verdict.message, (
        verdict.message)


def _wrong(**flaw):
    reach = as_learner_code(ex._reach)               # made before the checker runs
    return lambda m, n: reach(m, n, **flaw)


#: The checker's own generator of each known mistake, copied as if a learner wrote it: every one is
#: named by its own hint (the first failing case tells them apart).
GENERATED_WRONG = {
    "one short": _wrong(rounding="floor"),
    "to the nearest whole number": _wrong(rounding="round"),
    "reaches about n / 2, not ln 2 / m": _wrong(endless=True),
    "capping at n does not mend it": _wrong(endless=True, cap=True),
    "the weights grow with the distance": _wrong(sign=1.0),
    "The slopes are powers of 2; the weights are not": _wrong(base=2.0),
    "a natural log (torch.log)": _wrong(log2=True),
    "that is the row's mean distance": _wrong(statistic="mean", rounding="floor"),
    "your row has n + 1 keys": _wrong(keys=1),
    "your row has n - 1 keys": _wrong(keys=-1),
    "your reaches ignore the slope": _wrong(statistic="uniform"),
}


@pytest.mark.parametrize("phrase", GENERATED_WRONG)
def test_each_generated_mistake_gets_its_own_hint(phrase):
    verdict = ex.check_reach(GENERATED_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message
    assert verdict.message.count("Hint:") == 1


def test_reach_checker_wants_whole_numbers_in_a_tensor():
    def as_floats(m, n):
        return torch.ceil(-torch.log((1 + torch.exp(-m * n)) / 2) / m)

    verdict = ex.check_reach(as_floats)
    assert not verdict and "return them as a LongTensor (H,)" in verdict.message, verdict.message
    verdict = ex.check_reach(lambda m, n: closed_form(m, n).tolist())
    assert not verdict and "got list" in verdict.message, verdict.message
    verdict = ex.check_reach(lambda m, n: closed_form(m, n)[:1])
    assert not verdict and "shape (1,)" in verdict.message, verdict.message


@pytest.mark.parametrize("shortcut, name", [
    (lambda m, n: lesson.half_weight_reach(m, n), "half_weight_reach, which does this exercise"),
    (lesson.half_weight_reach, "the course's own attn_helpers.lessons.positional_reach"),
    (ex.half_weight_reach_reference, "the checker's own reference"),
    (ex._reach, "the checker's own code"),
])
def test_reach_checker_blocks_the_package(shortcut, name):
    verdict = ex.check_reach(shortcut)
    assert not verdict and name in verdict.message and "does this exercise" in verdict.message, (
        verdict.message)
    assert lesson.half_weight_reach(ah.alibi_slopes(2), 4).tolist() == [2, 2]   # restored after


def test_sinusoidal_checker_refuses_its_own_mistake_generator():
    """The checker's generator of wrong answers is right with its defaults: handed in, refused."""
    verdict = ex.check_sinusoidal(ex._shift)
    assert not verdict and "the checker's own code" in verdict.message, verdict.message


def test_the_level_3_skeletons_filled_in_pass():
    omega = "10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)"
    shift = skeleton("positional_encoding.sinusoidal", "k, d_model", (
        omega, "(k * omega).cos(), (k * omega).sin()", "c, s", "-s, c"))
    assert ex.check_sinusoidal(shift)
    assert_skeleton("positional_encoding.rope", "q, k", ex.check_rope, (
        "q0 * k0 + q1 * k1", "q0 * k1 - q1 * k0"))
    assert_skeleton("positional_encoding.reach", "m, n", ex.check_reach, (
        "-torch.log((1 + r_n) / 2) / m", "torch.ceil(x).long()"))


@pytest.mark.parametrize("key, answers", [
    ("positional_encoding.rope", ("q0 * k0", "q0 * k1", "q_2i k_2i", "q_2i k_2i+1", "[[c, s]",
                                  "[[cos", "q_2i+1 k_2i")),
    ("positional_encoding.reach", ("-ln(", "1 - r^k", "(1 + r^n) / 2", "round x UP")),
])
def test_the_first_two_hints_lead_without_stating_the_answer(key, answers):
    for text in EXERCISES[key].hints[:2]:
        assert not any(answer in text for answer in answers), text
