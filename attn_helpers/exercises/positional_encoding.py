r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the matrix :math:`M_k` with
  :math:`PE(p + k) = M_k\,PE(p)` for the sinusoidal table (section 2 only fits it numerically;
  a numerical fit is refused here).
* ``positional_encoding.rope``: :func:`check_rope`, the RoPE score from the offset alone
  (``rope_score(q, k, delta)``): :math:`\mathrm{rope}(q, m)\cdot\mathrm{rope}(k, m - \delta)`
  for any :math:`m`, written with :math:`R(m)^\top R(n) = R(n - m)` (section 4's property).
* ``positional_encoding.reach``: :func:`check_reach`, how far back an ALiBi head looks (section
  5's bias alone): the half-weight reach ``ceil(-ln((1 + r^n) / 2) / m)``, ``r = e^{-m}``, the
  fewest nearest keys that carry half a causal row's weight (:mod:`..lessons.positional_reach`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy
import torch

from .. import positional as _positional
from ..lessons import positional_reach as _reach_lesson
from ..lessons import rope as _rope
from ..positional import apply_rope
from .core import CheckResult, Mistake, check_function, refusing_ops, seeded
from .positional_mistakes import _reach, _shift
from .workflow import exercise

__all__ = ["FORBID", "REACH_MARGIN", "check_reach", "check_rope", "check_sinusoidal",
           "half_weight_reach_reference", "rope_reference", "shift_matrix_reference"]

#: The package functions that would do exercises 1 and 2 for the learner: calling one (under any
#: name, imported into the notebook too) while the learner's function runs fails the check.
FORBID = [(_positional, name) for name in (
    "sinusoidal_encoding", "apply_rope", "frequencies", "_omega", "pair_rotation",
    "SinusoidalPositionalEncoding", "RotaryEmbedding") if hasattr(_positional, name)] + [
    (_rope, name) for name in ("apply_rope_half", "position_scores") if hasattr(_rope, name)]


# --- exercise 1: moving by k is a matrix ---------------------------------------------------------


#: Section 2 fits M_k by least squares: the same fit (or any solver or inverse) would hand the learner
#: M_k without the derivation the exercise asks for, so exercise 1 refuses them while it runs.
_NO_FIT = refusing_ops(["linalg_lstsq", "linalg_solve*", "_linalg_solve*", "linalg_inv*", "inverse",
                        "linalg_pinv", "pinverse", "linalg_svd", "_linalg_svd", "svd", "linalg_qr",
                        "qr", "geqrf", "triangular_solve", "linalg_lu*", "lu_solve", "_lu_with_info",
                        "cholesky_*", "linalg_cholesky*", "linalg_tensor*", "linalg_ldl*"],
                       "shift_matrix fitted M_k numerically (section 2's least squares, a solver or "
                       "an inverse), which does this exercise for you: write M_k from the "
                       "angle-addition formulas")
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


# --- exercise 2: the RoPE score from the offset alone --------------------------------------------


def rope_reference(q: torch.Tensor, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``q, k (..., d)``, ``delta (n,)`` -> ``(..., n)``: ``rope(q, m) . rope(k, m - delta_j)``, the
    score of a query at any position ``m`` for a key ``delta_j`` positions back, rotated with
    :func:`attn_helpers.positional.apply_rope` in float64 (here ``m = 0``)."""
    n = delta.shape[0]
    q_at = apply_rope(q.double()[..., None, :].expand(*q.shape[:-1], n, q.shape[-1]),
                      torch.zeros(n, dtype=torch.long))
    k_at = apply_rope(k.double()[..., None, :].expand(*k.shape[:-1], n, k.shape[-1]), -delta)
    return (q_at * k_at).sum(-1).to(q.dtype)


def _rope_cases() -> list[dict]:
    g = seeded(71)
    specs = [((8,), [0, 1, 2, 3, 5], torch.float32), ((3, 16), [0, 4, 9, 1, 30, 2], torch.float64),
             ((2,), [1, 0, 7], torch.float32), ((4, 8), [-3, -1, 0, 2], torch.float64),
             ((2, 6), [1000, 1001, 4096], torch.float64)]
    h, half = _sizes(g, 2, high=6)
    specs.append(((h, 2 * half), torch.randint(0, 200, (5,), generator=g).tolist(), torch.float64))
    return [{"q": torch.randn(*shape, generator=g).to(dtype), "k": torch.randn(*shape, generator=g)
             .to(dtype), "delta": torch.tensor(delta)} for shape, delta, dtype in specs]


def _score(q, k, delta, *, sign=1.0, exponents=None, halves=False, no_sin=False, omega_one=False,
           both=False, single=False):
    """The score by offset with one thing changed, for the known mistakes: ``sum_i (q_2i k_2i +
    q_2i+1 k_2i+1) cos(delta w_i) + (q_2i k_2i+1 - q_2i+1 k_2i) sin(delta w_i)``."""
    d = q.shape[-1]
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    omega = torch.ones(d // 2, dtype=torch.float64) if omega_one else 10000.0 ** (-exponents)
    angles = delta.to(torch.float64)[:, None] * omega                                # (n, d/2)
    if single:                        # omega and the angles in float32, as torch's default gives
        angles = (delta[:, None] * 10000.0 ** (-(torch.arange(0, d, 2) / d))).double()
    q, k = q.double(), k.double()
    split = (lambda x: (x[..., :d // 2], x[..., d // 2:])) if halves else (
        lambda x: (x[..., 0::2], x[..., 1::2]))
    (q0, q1), (k0, k1) = split(q), split(k)
    dot, cross = (q0 * k0 + q1 * k1)[..., None, :], (q0 * k1 - q1 * k0)[..., None, :]  # (..., 1, d/2)
    if both:
        return dot.sum(-1).expand(*q.shape[:-1], len(delta)).to(q.dtype)
    sin_term = 0.0 if no_sin else sign * cross * angles.sin()
    return (dot * angles.cos() + sin_term).sum(-1)                                     # (..., n)


@exercise("positional_encoding.rope", "the RoPE score from the offset alone", hints=(
    "Write the score as a product of matrices, q^T R(m)^T R(m - delta_j) k, and use section 4's "
    "identity on the middle. R is block-diagonal: look at what it does to one pair.",
    "R(m)^T R(n) = R(n - m): the score depends on the offset only, so no position is needed. Turn "
    "one vector by the offset's rotation (k by R(-delta_j), each pair by its own angle) and dot "
    "it with the other, unturned. The pairs are independent, so the score is a sum over the d/2 "
    "pairs; compute the angles in float64.",
    "d = q.shape[-1]\n"
    "omega = ...                           # (d/2,) float64: omega_i = 10000^(-2i/d)\n"
    "angles = ...                          # (n, d/2) float64: delta_j omega_i\n"
    "a, b = q.double()[..., 0::2], q.double()[..., 1::2]                   # (..., d/2) each\n"
    "c, e = k.double()[..., 0::2], k.double()[..., 1::2]\n"
    "dot = ...                             # (..., 1, d/2): the part that goes with cos\n"
    "cross = ...                           # (..., 1, d/2): the part that goes with sin\n"
    "return ...                            # (..., n): summed over the pairs, in q's dtype"))
def check_rope(rope_score: Callable) -> CheckResult:
    """Exercise: ``rope_score(q (..., d), k (..., d), delta (n,)) -> (..., n)``: the score
    ``rope(q, m) . rope(k, m - delta_j)`` of section 4 (interleaved pairs, ``omega_i =
    10000^(-2i/d)``) for a key ``delta_j`` positions back, written from the offset alone (the
    package's rotations are blocked while it runs)."""
    if rope_score is rope_reference:
        return _handed_in("rope_score", "rope_reference")
    return check_function(
        rope_score, rope_reference, _rope_cases(), what="rope_score", output_names=("the scores",),
        forbid=FORBID, atol=1e-5, rtol=1e-4,
        mistakes=[
            Mistake(lambda q, k, delta: _score(q, k, delta, sign=-1.0),
                    "the sin term has the wrong sign: you put the key delta positions AFTER the "
                    "query (or turned the query instead of the key). With the key at m - delta, "
                    "R(m)^T R(m - delta) = R(-delta)."),
            Mistake(lambda q, k, delta: _score(q, k, delta, no_sin=True),
                    "you kept only the cos term (q_2i k_2i + q_2i+1 k_2i+1) cos(delta w_i): "
                    "turning a pair also mixes its two components, which gives the sin term "
                    "(q_2i k_2i+1 - q_2i+1 k_2i) sin(delta w_i)."),
            Mistake(lambda q, k, delta: _score(q, k, delta, both=True),
                    "you turned the query and the key by the same angle: a shared rotation "
                    "cancels in the dot product, so the score would not depend on delta at all. "
                    "Only the difference of their positions turns one against the other."),
            Mistake(lambda q, k, delta: _score(q, k, delta, halves=True),
                    "you paired dimension i with i + d/2 (the split-halves layout of GPT-NeoX and "
                    "LLaMA's Hugging Face code); here the pairs are neighbours (x[2i], x[2i+1])."),
            Mistake(lambda q, k, delta: _score(
                        q, k, delta, exponents=torch.arange(q.shape[-1] // 2) / q.shape[-1]),
                    "the frequency of pair i is 10000^(-2i/d), not 10000^(-i/d)."),
            Mistake(lambda q, k, delta: _score(
                        q, k, delta, exponents=torch.arange(0, q.shape[-1], 2).flip(0) / q.shape[-1]),
                    "the frequencies run the wrong way: pair 0 turns fastest (omega_0 = 1), the "
                    "last pair slowest."),
            Mistake(lambda q, k, delta: _score(q, k, delta, omega_one=True),
                    "every pair turned by the same angle delta: pair i turns by delta omega_i, "
                    "with omega_i = 10000^(-2i/d)."),
            Mistake(lambda q, k, delta: _score(q, k, delta, single=True),
                    "the angles were computed in float32 (torch.arange gives integers, and "
                    "dividing them gives float32): at offsets in the thousands, delta omega_i "
                    "keeps only about 7 digits, an error of about 1e-4 of a radian at delta = "
                    "4096, which moves the score. Compute omega and the angles in float64 "
                    "(torch.arange(0, d, 2, dtype=torch.float64)) and cast the score back to "
                    "q's dtype."),
        ],
    )


# --- exercise 3: how far back an ALiBi head looks ----------------------------------------------


def half_weight_reach_reference(m: torch.Tensor, n: int) -> torch.Tensor:
    """``(H,)`` long: the package's :func:`~attn_helpers.lessons.positional_reach.half_weight_reach`,
    ``ceil(-ln((1 + r^n) / 2) / m)`` with ``r = e^{-m}``."""
    return _reach_lesson.half_weight_reach(m, n)


#: Every case keeps each head's real-valued k, x = -ln((1 + r^n) / 2) / m, at least this far from a
#: whole number >= 1 (tested), so a float64 running sum and the closed form round it alike.
REACH_MARGIN = 0.01


def _reach_cases() -> list[dict]:
    """ALiBi's slopes for 8, 4 and 12 heads in rows of 1 to 3000 keys, tiny and large slopes (the
    limits ceil(n / 2) and 1), and a random case; none within :data:`REACH_MARGIN` of a tie."""
    g = seeded(72)
    heads = int(torch.randint(2, 7, (1,), generator=g))
    log_m = torch.empty(heads, dtype=torch.float64).uniform_(math.log(1e-3), math.log(2.0), generator=g)
    n = int(torch.randint(2, 4001, (1,), generator=g))
    slopes = _positional.alibi_slopes
    return [{"m": m, "n": n} for m, n in [
        (slopes(8), 24), (slopes(4), 1), (slopes(12), 100), (slopes(4), 7), (slopes(8), 3000),
        (torch.tensor([1e-6, 1e-4, 1e-3], dtype=torch.float64), 1001),
        (torch.tensor([0.3, 3.0, 40.0], dtype=torch.float64), 50), (log_m.exp(), n)]]


def _reach_forbid() -> list[tuple[object, str]]:
    """The package's own reach, in its module and as 07's lesson re-exports it (looked up when the
    checker runs: this module is imported while ``attn_helpers`` itself is still being imported)."""
    import importlib

    lesson = importlib.import_module("attn_helpers.lessons.positional_encoding")
    return [(_reach_lesson, "half_weight_reach"), (lesson, "half_weight_reach")]


REACH_INSTEAD = "Write the reach from the geometric series, or add up the row's weights yourself"
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
    "and take the smallest whole k where the share reaches 1/2. Or add up the row's softmax "
    "weights in float64 and count keys until the running sum reaches 1/2.",
    "r_n = torch.exp(-m * n)                     # (H,): r^n, r = e^{-m}\n"
    "x = ...                                     # (H,) float: the k where share(k) is exactly 1/2\n"
    "return ...                                  # (H,) long: the smallest whole k >= x"))
def check_reach(half_weight_reach: Callable) -> CheckResult:
    """Exercise: ``half_weight_reach(m (H,), n) -> (H,)`` long, each head's half-weight reach: the
    smallest ``k`` such that the keys at distances ``0 .. k - 1`` carry at least half the weight
    of a causal row of ``n`` keys under ALiBi's bias ``-m delta`` (equal content scores); ``m``
    float64, ``> 0``. The closed form ``ceil(-ln((1 + r^n) / 2) / m)`` and a float64 running sum
    over the row both pass: no case is within :data:`REACH_MARGIN` of a tie."""
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
        rtol=0.0, mistakes=[
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
