r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the matrix :math:`M_k` with
  :math:`PE(p + k) = M_k\,PE(p)` for the sinusoidal table (section 2 only fits it numerically;
  a numerical fit is refused here).
* ``positional_encoding.rope_layout``: :func:`check_rope_layout`, loading a checkpoint trained with
  RoPE's other layout (``to_interleaved(W_Q, W_K, h, g) -> (W_Q', W_K')``): the rows of each head
  of a layer's query and key weights moved from split-half RoPE (GPT-NeoX, Hugging Face's
  ``rotate_half``) to the course's interleaved pairs, so that every head keeps its scores (each
  message measures what the learner's weights do to them).
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
from ..lessons import positional_encoding as _reach_lesson
from ..lessons import positional_encoding as _rope
from .core import CheckResult, Mistake, Refused, check_function, refusing_ops, seeded
from .positional_mistakes import (
    LAYOUT_MISTAKES,
    REACH_MARGIN,
    SCORE_POSITIONS,
    _layout,
    _layout_cases,
    _no_row_sum,
    _reach,
    _reach_cases,
    _score_line,
    _scores,
    _shift,
)
from .workflow import exercise

__all__ = ["FORBID", "LAYOUT_FORBID", "REACH_MARGIN", "check_reach", "check_rope_layout",
           "check_sinusoidal", "half_weight_reach_reference", "shift_matrix_reference",
           "to_interleaved_reference"]

#: The package functions that would do exercise 1 for the learner (exercise 2 refuses more):
#: calling one (under any name, imported into the notebook too) while the learner's function runs
#: fails the check.
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


# --- exercise 2: a checkpoint trained with RoPE's other layout ----------------------------------


#: Exercise 2 refuses, on top of :data:`FORBID`'s rotations, the lesson's own layout code: the
#: reordering itself (the other way round) and a layer's scores in either layout (a search).
LAYOUT_FORBID = FORBID + [(_rope, name) for name in (
    "interleaved_to_half", "permute_rows", "layer_scores") if hasattr(_rope, name)]
_LAYOUT_INSTEAD = "Work out from the two layouts which row goes where, and move the rows yourself"


def to_interleaved_reference(W_Q: torch.Tensor, W_K: torch.Tensor, h: int, g: int):
    """``(W_Q', W_K')``: the rows of each of the ``h`` query heads of ``W_Q`` and ``g`` key/value
    heads of ``W_K`` moved from split-half RoPE (pair ``i`` = rows ``i, i + d/2`` of a head) to the
    interleaved layout (rows ``2i, 2i+1``), so that :func:`~attn_helpers.positional.apply_rope`
    gives the layer's scores."""
    return _layout(W_Q, W_K, h, g)


@exercise("positional_encoding.rope_layout", "loading weights trained with RoPE's other layout",
          hints=(
    "Reordering the rows of W_Q and W_K alike reorders the numbers of every query and key alike, "
    "and a dot product does not care about order; the rotation does care which two numbers form "
    "a pair, at which omega_i, and which of the two comes first. Take one head: for each row of "
    "the interleaved head, which row of the split-half head holds the number that belongs there?",
    "Work head by head: W_Q is h blocks of d_head = W_Q.shape[0] / h rows, W_K g blocks of the same "
    "d_head. Inside a block, write an index of d_head entries with new rows = old_rows[index]: "
    "index[r] is the old row that new row r copies, the same in every head. Its inverse reorders "
    "the other way (the two agree for d_head = 4, not for 6 or more: check yours by hand for "
    "d_head = 8), and swapping a pair's two members turns the rotation backwards.",
    "def convert(W, heads):                      # one weight: heads blocks of d_head rows\n"
    "    d_head = ...                            # rows per head\n"
    "    index = ...                             # (d_head,) long: new row r copies old row index[r]\n"
    "    blocks = W.view(heads, d_head, -1)      # (heads, d_head, d_in): head after head\n"
    "    return blocks[:, index].reshape(W.shape)\n"
    "return convert(W_Q, h), convert(W_K, g)"))
def check_rope_layout(to_interleaved: Callable) -> CheckResult:
    """Exercise: ``to_interleaved(W_Q (h d_head, d_in), W_K (g d_head, d_in), h, g) -> (W_Q', W_K')``:
    the ``nn.Linear`` weights of a layer trained with split-half RoPE (GPT-NeoX, Hugging Face's
    ``rotate_half``; pair ``i`` = rows ``i, i + d/2`` of a head), their rows reordered per head so
    that interleaved RoPE (:func:`~attn_helpers.positional.apply_rope`) gives every head the same
    scores. Compared with the reference's rows (to 1e-12: exactly), in the input's dtype, on
    layers with one head, ``g = h``, ``g < h`` and ``g = 1``; each message also measures what the
    learner's weights do to the layer's scores. The package's rotations and layout code are
    refused."""
    if getattr(to_interleaved, "__code__", None) is _layout.__code__:
        return CheckResult(False, "Not yet: that is the checker's own code, which does this exercise "
                                  f"for you. {_LAYOUT_INSTEAD}.")
    for owner, name in LAYOUT_FORBID:
        if to_interleaved is getattr(owner, name, None):
            return _handed_in(f"rope.{name}" if owner is _rope else name, "own layout code")
    answers = []

    def run(W_Q, W_K, h, g):  # the learner's function; its answers are kept for the Scores line
        out = to_interleaved(W_Q, W_K, h, g)
        if out is None:
            return None
        if not (isinstance(out, tuple | list) and len(out) == 2
                and all(isinstance(t, torch.Tensor) for t in out)):
            got = type(out).__name__ if not isinstance(out, tuple | list) else f"{len(out)} values"
            raise Refused(f"to_interleaved must return two tensors (W_Q', W_K'), got {got}.")
        answers.append(((W_Q, W_K, h, g), tuple(out)))
        return tuple(out)

    result = check_function(
        run, to_interleaved_reference, _layout_cases(), what="to_interleaved",
        output_names=("W_Q'", "W_K'"), forbid=LAYOUT_FORBID, instead=_LAYOUT_INSTEAD, atol=1e-12,
        rtol=0.0, same_dtype=True, mistakes=LAYOUT_MISTAKES)  # rows only move: exact, in effect
    if result.passed:
        gaps = [(_scores(*mine, h, g, layout="interleaved") - _scores(W_Q, W_K, h, g, layout="half"))
                .abs().max().item() for (W_Q, W_K, h, g), mine in answers]
        return CheckResult(True, f"{result.message} Scores: with your weights, apply_rope gives every "
                                 "head of every layer the original model's scores (split-half RoPE "
                                 "on W_Q, W_K) for every pair of 16 positions from 0 to "
                                 f"{int(SCORE_POSITIONS[-1])} (largest difference {max(gaps):.1g}).")
    if "with wrong values" not in result.message or not answers:
        return result
    (W_Q, W_K, h, g), mine = answers[-1]
    try:
        return CheckResult(False, result.message + _score_line(W_Q, W_K, h, g, mine))
    except Exception:  # noqa: BLE001 - the other weight has a wrong shape: no scores to measure
        return result


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
