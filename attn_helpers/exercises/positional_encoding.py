r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the matrix :math:`M_k` with
  :math:`PE(p + k) = M_k\,PE(p)` for the sinusoidal table (section 2 only fits it numerically;
  a numerical fit is refused here).
* ``positional_encoding.rope``: :func:`check_rope`, RoPE's relative property made explicit
  (``rope_coefficients(q, k) -> (a, b)``, each ``(..., d/2)``): for every offset :math:`\delta`,
  :math:`\mathrm{rope}(q, m)\cdot\mathrm{rope}(k, m - \delta) = \sum_i a_i\cos\delta\omega_i +
  b_i\sin\delta\omega_i`, no position entering (section 4's :math:`R(m)^\top R(n) = R(n - m)`).
* ``positional_encoding.reach``: :func:`check_reach`, how far back an ALiBi head looks (section
  5's bias alone): the half-weight reach ``ceil(-ln((1 + r^n) / 2) / m)``, ``r = e^{-m}``, the
  fewest nearest keys that carry half a causal row's weight (:mod:`..lessons.positional_reach`),
  from the geometric series: a sum over a long row is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy
import torch

from .. import positional as _positional
from ..lessons import positional_reach as _reach_lesson
from ..lessons import rope as _rope
from ..positional import apply_rope
from .core import CheckResult, Mistake, Refused, check_function, refusing_ops, seeded
from .positional_mistakes import (
    REACH_MARGIN,
    _coefficients,
    _no_row_sum,
    _reach,
    _reach_cases,
    _rope_cases,
    _series,
    _shift,
)
from .workflow import exercise

__all__ = ["FORBID", "REACH_MARGIN", "check_reach", "check_rope", "check_sinusoidal",
           "half_weight_reach_reference", "rope_coefficients_reference", "rope_score_reference",
           "shift_matrix_reference"]

#: The package functions that would do exercises 1 and 2 for the learner: calling one (under any
#: name, imported into the notebook too) while the learner's function runs fails the check.
FORBID = [(_positional, name) for name in (
    "sinusoidal_encoding", "apply_rope", "frequencies", "_omega", "pair_rotation",
    "SinusoidalPositionalEncoding", "RotaryEmbedding") if hasattr(_positional, name)] + [
    (_rope, name) for name in ("apply_rope_half", "position_scores") if hasattr(_rope, name)]


# --- exercise 1: moving by k is a matrix ---------------------------------------------------------


#: Section 2 fits M_k by least squares: the same fit (or any solver or inverse) would hand the learner
#: M_k without the derivation the exercise asks for, so exercise 1 refuses them while it runs.
_FIT_OPS = ["linalg_lstsq", "linalg_solve*", "_linalg_solve*", "linalg_inv*", "inverse", "linalg_pinv",
            "pinverse", "linalg_svd", "_linalg_svd", "svd", "linalg_qr", "qr", "geqrf",
            "triangular_solve", "linalg_lu*", "lu_solve", "_lu_with_info", "cholesky_*",
            "linalg_cholesky*", "linalg_tensor*", "linalg_ldl*"]
_NO_FIT = refusing_ops(_FIT_OPS, "shift_matrix fitted M_k numerically (section 2's least squares, "
                       "a solver or an inverse), which does this exercise for you: write M_k from "
                       "the angle-addition formulas")
_NO_FIT_NUMPY = [(numpy.linalg, name) for name in ("lstsq", "solve", "inv", "pinv", "svd", "qr")]


def _sizes(g: torch.Generator, k: int, high: int = 8) -> list[int]:  # a case's random shapes
    return torch.randint(1, high + 1, (k,), generator=g).tolist()


def shift_matrix_reference(k: int, d_model: int) -> torch.Tensor:
    """``(d, d)`` float64 ``M_k`` with ``PE(p + k) = M_k PE(p)`` for every ``p`` (section 2)."""
    return _shift(k, d_model)


@exercise("positional_encoding.sinusoidal", "moving the sinusoidal encoding by k: the matrix M_k",
          hints=(
    "PE(p) is d/2 pairs (sin a, cos a) with a = p omega_i. Moving k positions adds b = k omega_i "
    "to each angle: which 2x2 matrix turns (sin a, cos a) into (sin(a + b), cos(a + b))? It must "
    "not depend on a.",
    "Write sin(a + b) and cos(a + b) with the angle-addition formulas: each is sin a times "
    "something plus cos a times something, and those somethings depend on b alone: they are the "
    "block's entries, in the pair's order (sin first). Pair i sits on rows and columns 2i, 2i+1, "
    "with b = k omega_i (section 2's frequencies); nothing couples two pairs.",
    "omega = ...                                    # (d/2,) float64: omega_i = 10000^(-2i/d)\n"
    "c, s = ...                                     # (d/2,) each: cos b, sin b, b = k omega_i\n"
    "M = torch.zeros(d_model, d_model, dtype=torch.float64)\n"
    "even = torch.arange(0, d_model, 2)                                   # rows 2i\n"
    "M[even, even], M[even, even + 1] = ...                              # the sin row of each pair\n"
    "M[even + 1, even], M[even + 1, even + 1] = ...                      # the cos row\n"
    "return M"))
def check_sinusoidal(shift_matrix: Callable) -> CheckResult:
    """Exercise: ``shift_matrix(k, d_model) -> M_k (d_model, d_model)`` float64 with ``PE(p + k) =
    M_k PE(p)`` for every ``p`` (section 2's table, derived by the learner; the package's
    encoding and any numerical fit are refused while it runs)."""
    if getattr(shift_matrix, "__code__", None) is _shift.__code__:
        return CheckResult(False, "Not yet: that is the checker's own code, which does this exercise "
                                  "for you. Write M_k from the angle-addition formulas.")
    k, half = _sizes(seeded(70), 2, high=40)  # and a case with random sizes
    cases = [{"k": k, "d_model": d} for k, d in [(1, 8), (3, 16), (0, 4), (-2, 8), (100, 32),
                                                 (7, 2), (k, 2 * half)]]
    return check_function(
        shift_matrix, shift_matrix_reference, cases, what="shift_matrix", output_names=("M_k",),
        forbid=FORBID + _NO_FIT_NUMPY, instead="Write M_k from the angle-addition formulas",
        guard=_NO_FIT, atol=1e-6, same_dtype=True, mistakes=[
            Mistake(lambda k, d: _shift(k, d, sign=-1.0),
                    "the sin terms have the wrong signs (or M_k is transposed): that block is "
                    "RoPE's rotation of a pair (x_2i, x_2i+1), which here moves PE(p) to PE(p - k). "
                    "The pair is (sin, cos): sin(a + b) = sin a cos b + cos a sin b gives the row "
                    "[cos b, sin b]."),
            Mistake(lambda k, d: _shift(k, d, no_sin=True),
                    "only the cos terms: moving the angle mixes the sine and the cosine of a pair, "
                    "so each block also has sin b off its diagonal."),
            Mistake(lambda k, d: _shift(k, d, exponents=torch.arange(d // 2) / d),
                    "the frequency of pair i is 10000^(-2i/d), not 10000^(-i/d)."),
            Mistake(lambda k, d: _shift(k, d, exponents=torch.arange(0, d, 2).flip(0) / d),
                    "the frequencies run the wrong way: pair 0 turns fastest (omega_0 = 1), the "
                    "last pair slowest."),
            Mistake(lambda k, d: _shift(k, d, same_angle=True),
                    "every pair turned by the same angle k: pair i turns by k omega_i."),
            Mistake(lambda k, d: _shift(k, d, halves=True),
                    "you paired dimension i with i + d/2; in PE the pair of frequency omega_i is "
                    "(2i, 2i+1), side by side."),
        ],
    )


def _handed_in(what: str, label: str) -> CheckResult:
    return CheckResult(False, f"Not yet: {what} is the package's {label}, which does this exercise "
                              "for you. Write the steps yourself; the checker blocks it here.")


# --- exercise 2: the score depends on q, k and the offset through d/2 pairs of coefficients ------


def rope_score_reference(q: torch.Tensor, k: torch.Tensor, delta: torch.Tensor,
                         m: torch.Tensor) -> torch.Tensor:
    """``q, k (..., d)``, ``delta, m (n,)`` -> ``(..., n)``: ``rope(q, m_j) . rope(k, m_j - delta_j)``,
    the score of a query at ``m_j`` for a key ``delta_j`` back, with section 4's rotations
    (:func:`attn_helpers.positional.apply_rope`) in float64."""
    n, d = delta.shape[0], q.shape[-1]
    q_at = apply_rope(q.double()[..., None, :].expand(*q.shape[:-1], n, d), m)
    k_at = apply_rope(k.double()[..., None, :].expand(*k.shape[:-1], n, d), m - delta)
    return (q_at * k_at).sum(-1)


def rope_coefficients_reference(q: torch.Tensor, k: torch.Tensor):
    """``(a, b)``, each ``(..., d/2)`` float64: ``a_i = q_2i k_2i + q_2i+1 k_2i+1`` and ``b_i =
    q_2i k_2i+1 - q_2i+1 k_2i``, so the score of a key ``delta`` back is ``sum_i a_i cos(delta w_i)
    + b_i sin(delta w_i)`` at every query position."""
    return _coefficients(q, k)


_ROPE_INSTEAD = "Write a and b from one pair's rotation; no position enters rope_coefficients"
_NO_ROPE_FIT = refusing_ops(_FIT_OPS, "rope_coefficients solved for a and b numerically (a solver, a "
                                      f"fit or an inverse), which does this exercise for you. "
                                      f"{_ROPE_INSTEAD}")
_PER_DIMENSION = ("one coefficient per dimension (..., d): the score mixes the two numbers of a "
                  "pair, so there is one a_i and one b_i per pair (x_2i, x_2i+1): (..., d/2) each.")


@exercise("positional_encoding.rope", "the RoPE score: d/2 coefficients for every offset", hints=(
    "Take one pair: its part of the score is q_pair^T R(m w_i)^T R((m - delta) w_i) k_pair, with "
    "section 4's 2x2 rotation. What does R(m)^T R(m - delta) reduce to, and is m still there? "
    "Write that 2x2 matrix out, with cos(delta w_i) and sin(delta w_i) as its entries.",
    "The rotation by -delta w_i of k's pair, dotted with q's pair, is cos(delta w_i) times one "
    "product of the pair's four numbers plus sin(delta w_i) times another: a dot product and a "
    "cross product (a 2x2 determinant). Which two, with which sign? Multiply the matrix out; "
    "those two numbers per pair are a_i and b_i.",
    "q0, q1 = q[..., 0::2], q[..., 1::2]         # (..., d/2) each: q's pairs (q_2i, q_2i+1)\n"
    "k0, k1 = k[..., 0::2], k[..., 1::2]         # k's pairs\n"
    "a = ...                                     # (..., d/2): what multiplies cos(delta w_i)\n"
    "b = ...                                     # (..., d/2): what multiplies sin(delta w_i)\n"
    "return a, b"))
def check_rope(rope_coefficients: Callable) -> CheckResult:
    """Exercise: ``rope_coefficients(q (..., d), k (..., d))`` float64 -> ``(a, b)``, each ``(...,
    d/2)`` float64, such that ``rope(q, m) . rope(k, m - delta) = sum_i a_i cos(delta w_i) + b_i
    sin(delta w_i)`` for every ``delta`` and ``m`` (interleaved pairs, ``w_i = 10000^(-2i/d)``).
    The checker scores each case with section 4's rotations at several ``(m, delta)`` and
    compares; the package's rotations and numerical fits are blocked while it runs."""
    if getattr(rope_coefficients, "__code__", None) is _coefficients.__code__:
        return CheckResult(False, "Not yet: that is the checker's own code, which does this exercise "
                                  f"for you. {_ROPE_INSTEAD}.")

    def scores(q, k, delta, m):  # the learner's (a, b) as scores, for check_function to compare
        out = rope_coefficients(q, k)
        if out is None:
            return None
        if not (isinstance(out, tuple | list) and len(out) == 2
                and all(isinstance(t, torch.Tensor) for t in out)):
            raise Refused("rope_coefficients must return two tensors (a, b), got "
                          f"{type(out).__name__}.")
        want = (*q.shape[:-1], q.shape[-1] // 2)
        for name, t in zip("ab", out, strict=True):
            if t.shape == q.shape:
                raise Refused(f"{name} has shape {tuple(t.shape)}, {_PER_DIMENSION}")
            if t.shape != want:
                raise Refused(f"{name} has shape {tuple(t.shape)}; expected {want}, one number per "
                              "pair (x_2i, x_2i+1).")
            if t.dtype != torch.float64:
                raise Refused(f"{name} is {t.dtype}; q and k are float64, keep a and b float64.")
        return _series(*out, delta)

    def wrong(**flaw):
        return lambda q, k, delta, m: _series(*_coefficients(q, k, **flaw), delta)

    return check_function(
        scores, rope_score_reference, _rope_cases(), what="rope_coefficients",
        output_names=("the scores sum_i a_i cos(delta w_i) + b_i sin(delta w_i)",),
        forbid=FORBID, instead=_ROPE_INSTEAD, guard=_NO_ROPE_FIT, atol=1e-8, rtol=1e-8,
        mistakes=[
            Mistake(wrong(sign=-1.0),
                    "b has the wrong sign: your coefficients score the key delta positions AHEAD of "
                    "the query, at m + delta. apply_rope turns a pair counter-clockwise, so "
                    "R(m)^T R(m - delta) = R(-delta): multiply R(-delta w_i) out and read off the "
                    "sign of the sin terms."),
            Mistake(wrong(no_b=True),
                    "b is zero: that keeps only the cos part, the pair's dot product. Turning a pair "
                    "also mixes its two components, which is the sin part, the pair's cross "
                    "product."),
            Mistake(wrong(swap=True),
                    "a and b are swapped: at delta = 0 the score is the plain dot product q . k, so "
                    "a, the cos coefficient, must sum to it."),
            Mistake(wrong(plus=True),
                    "b is a sum of the two cross terms: it is a difference, q_2i k_2i+1 minus the "
                    "other product, as a 2x2 determinant is."),
            Mistake(wrong(halves=True),
                    "you paired dimension i with i + d/2 (the split-halves layout of GPT-NeoX and "
                    "LLaMA's Hugging Face code); here the pairs are neighbours (x[2i], x[2i+1])."),
        ],
    )


# --- exercise 3: how far back an ALiBi head looks ----------------------------------------------


def half_weight_reach_reference(m: torch.Tensor, n: int) -> torch.Tensor:
    """``(H,)`` long: the package's :func:`~attn_helpers.lessons.positional_reach.half_weight_reach`,
    ``ceil(-ln((1 + r^n) / 2) / m)`` with ``r = e^{-m}``."""
    return _reach_lesson.half_weight_reach(m, n)


def _reach_forbid() -> list[tuple[object, str]]:
    """The package's own reach, in its module and as 07's lesson re-exports it (looked up when the
    checker runs: this module is imported while ``attn_helpers`` itself is still being imported)."""
    import importlib

    lesson = importlib.import_module("attn_helpers.lessons.positional_encoding")
    return [(_reach_lesson, "half_weight_reach"), (lesson, "half_weight_reach")]


REACH_INSTEAD = "Write the reach from the geometric series"
_ONE_SHORT = ("one short: k counts the keys at distances 0 .. k - 1, one more than the distance of "
              "the farthest of them (the index where the running sum first reaches 1/2, plus 1). "
              "Rounding x = -ln((1 + r^n) / 2) / m down (floor, int(), .long()) misses the same way: "
              "the smallest whole k >= x is its ceiling.")
_ENDLESS = ("ln 2 / m is the reach of an endless row (and the distance at which one key's weight "
            "halves), but this row ends after n keys: share(k) = (1 - r^k) / (1 - r^n). A shallow "
            "head in a short row reaches about n / 2, not ln 2 / m.")
_MEAN = ("that is the row's mean distance, sum of delta w_delta, rounded: the reach is where the "
         "nearest keys first hold half the weight, another statistic of the same row (in a long row "
         "about ln 2 / m, against a mean of about 1 / m).")


@exercise("positional_encoding.reach", "how far back an ALiBi head looks: its half-weight reach",
          hints=(
    "With equal content scores the bias -m (i - j) alone sets the row: the key delta back weighs "
    "r^delta, r = e^{-m}, for delta = 0 .. n - 1. The definition compares two sums of these "
    "powers: what kind of sums are they, and must you add them term by term?",
    "The weights r^delta of a causal row form a geometric series, so both sums of the definition "
    "are partial sums with a closed form, and the share held by the nearest k keys is their "
    "ratio. Solve share = 1/2 for k (ln r = -m is negative: mind which way the inequality turns) "
    "and take the smallest whole k where the share reaches 1/2. No sum over the row is needed, "
    "and the checker refuses one.",
    "# To check yourself on a short row (not in here): count keys until the row's cumsum >= 1/2.\n"
    "r_n = torch.exp(-m * n)                     # (H,): r^n, r = e^{-m}\n"
    "x = ...                                     # (H,) float: the k where share(k) is exactly 1/2\n"
    "return ...                                  # (H,) long: the smallest whole k >= x"))
def check_reach(half_weight_reach: Callable) -> CheckResult:
    """Exercise: ``half_weight_reach(m (H,), n) -> (H,)`` long, each head's half-weight reach: the
    smallest ``k`` such that the keys at distances ``0 .. k - 1`` carry at least half the weight
    of a causal row of ``n`` keys under ALiBi's bias ``-m delta`` (equal content scores); ``m``
    float64, ``> 0``, from the closed form ``ceil(-ln((1 + r^n) / 2) / m)``: on rows of
    ``ROW_GUARD_MIN`` keys or more a sum over the row (a tensor as long as the row, or a loop over
    it) is refused while it runs. No case is within :data:`REACH_MARGIN` of a tie."""
    if getattr(half_weight_reach, "__code__", None) is _reach.__code__:
        return CheckResult(False, "Not yet: that is the checker's own code, which does this exercise "
                                  f"for you. {REACH_INSTEAD}.")

    def whole(m, n):  # the learner's reaches as float64, for check_function to compare
        k = half_weight_reach(m, n)
        if k is not None and not (isinstance(k, torch.Tensor) and not k.is_floating_point()
                                  and not k.is_complex() and k.dtype != torch.bool):
            got = f"dtype {k.dtype}" if isinstance(k, torch.Tensor) else type(k).__name__
            raise TypeError(f"the reaches count keys: return them as a LongTensor (H,) of whole "
                            f"numbers (.long()), got {got}")
        return None if k is None else k.double()

    return check_function(
        whole, half_weight_reach_reference, _reach_cases(), what="half_weight_reach",
        output_names=("the reaches",), forbid=_reach_forbid(), instead=REACH_INSTEAD, atol=0.0,
        rtol=0.0, guard=_no_row_sum, mistakes=[
            Mistake(lambda m, n: _reach(m, n, rounding="floor"), _ONE_SHORT),
            Mistake(lambda m, n: _reach(m, n, rounding="round"),
                    "you rounded x = -ln((1 + r^n) / 2) / m to the nearest whole number: share(k) "
                    "grows with k, so the smallest k with share(k) >= 1/2 is x rounded UP "
                    "(torch.ceil)."),
            Mistake(lambda m, n: _reach(m, n, endless=True), _ENDLESS),
            Mistake(lambda m, n: _reach(m, n, endless=True, cap=True),
                    f"capping at n does not mend it: {_ENDLESS}"),
            Mistake(lambda m, n: _reach(m, n, sign=1.0),
                    "the weights grow with the distance (e^{+m delta}): the bias is -m (i - j), so "
                    "the key delta back gets e^{-m delta} and the nearest key weighs most."),
            Mistake(lambda m, n: _reach(m, n, base=2.0),
                    "you weighed the key delta back by 2^{-m delta}: the softmax exponentiates "
                    "with e, so its weight is e^{-m delta} (r = e^{-m}). The slopes are powers of "
                    "2; the weights are not."),
            Mistake(lambda m, n: _reach(m, n, log2=True),
                    "you took a base-2 logarithm: with r = e^{-m}, r^k <= (1 + r^n) / 2 gives "
                    "k >= -ln((1 + r^n) / 2) / m, a natural log (torch.log)."),
            *[Mistake(lambda m, n, r=r: _reach(m, n, statistic="mean", rounding=r), _MEAN)
              for r in ("round", "ceil", "floor")],
            Mistake(lambda m, n: _reach(m, n, keys=1),
                    "your row has n + 1 keys (distances 0 .. n): a query that sees n keys has them "
                    "at distances 0 .. n - 1, so the row's total is (1 - r^n) / (1 - r)."),
            Mistake(lambda m, n: _reach(m, n, keys=-1),
                    "your row has n - 1 keys (distances 0 .. n - 2, or 1 .. n - 1 without the "
                    "query's own token): the query sees n keys, its own token at distance 0 "
                    "included."),
            Mistake(lambda m, n: _reach(m, n, statistic="uniform"),
                    "your reaches ignore the slope: ceil(n / 2) is the reach of a uniform row, the "
                    "limit m -> 0. The bias weighs the key delta back by e^{-m delta}, so a "
                    "steeper head reaches less far."),
        ],
    )
