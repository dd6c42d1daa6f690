r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the matrix :math:`M_k` with
  :math:`PE(p + k) = M_k\,PE(p)` for the sinusoidal table (section 2's :math:`R_i(k)` per pair).
* ``positional_encoding.rope``: :func:`check_rope`, the RoPE score from the offset alone
  (``rope_score(q, k, delta)``): :math:`\mathrm{rope}(q, m)\cdot\mathrm{rope}(k, m - \delta)`
  for any :math:`m`, written with :math:`R(m)^\top R(n) = R(n - m)` (section 4's property).
* ``positional_encoding.alibi``: :func:`check_alibi`, the causal ALiBi bias of section 5:
  ``-m_h (i - j)`` for ``j <= i``, ``-inf`` above, slopes ``m_h = 2^(-8h/H)`` for ``h = 1 .. H``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import positional as _positional
from ..lessons import rope as _rope
from ..positional import apply_rope
from .core import CheckResult, Mistake, check_function, seeded
from .positional_mistakes import _alibi, _shift
from .workflow import exercise

__all__ = ["ALIBI_FORBID", "FORBID", "alibi_reference", "check_alibi", "check_rope",
           "check_sinusoidal", "rope_reference", "shift_matrix_reference"]

#: The package functions that would do exercises 1 and 2 for the learner: calling one (under any
#: name, imported into the notebook too) while the learner's function runs fails the check.
FORBID = [(_positional, name) for name in (
    "sinusoidal_encoding", "apply_rope", "frequencies", "_omega", "pair_rotation",
    "SinusoidalPositionalEncoding", "RotaryEmbedding") if hasattr(_positional, name)] + [
    (_rope, name) for name in ("apply_rope_half", "position_scores") if hasattr(_rope, name)]


# --- exercise 1: moving by k is a matrix ---------------------------------------------------------


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
    "sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b, so pair i's "
    "block is [[cos b, sin b], [-sin b, cos b]] with b = k omega_i, omega_i = 10000^(-2i/d), on "
    "rows and columns 2i, 2i+1; zeros elsewhere.",
    "omega = ...                                    # (d/2,) float64: omega_i = 10000^(-2i/d)\n"
    "c, s = ...                                     # (d/2,) each: cos b, sin b, b = k omega_i\n"
    "M = torch.zeros(d_model, d_model, dtype=torch.float64)\n"
    "even = torch.arange(0, d_model, 2)                                   # rows 2i\n"
    "M[even, even], M[even, even + 1] = ...                              # the sin row of each pair\n"
    "M[even + 1, even], M[even + 1, even + 1] = ...                      # the cos row\n"
    "return M"))
def check_sinusoidal(shift_matrix: Callable) -> CheckResult:
    """Exercise: ``shift_matrix(k, d_model) -> M_k (d_model, d_model)`` with ``PE(p + k) = M_k
    PE(p)`` for every ``p``: block-diagonal, pair ``i``'s block ``[[cos b, sin b], [-sin b,
    cos b]]``, ``b = k omega_i`` (section 2's :math:`R_i(k)`)."""
    k, half = _sizes(seeded(70), 2, high=40)  # and a case with random sizes
    cases = [{"k": k, "d_model": d} for k, d in [(1, 8), (3, 16), (0, 4), (-2, 8), (100, 32),
                                                 (7, 2), (k, 2 * half)]]
    return check_function(
        shift_matrix, shift_matrix_reference, cases, what="shift_matrix", output_names=("M_k",),
        forbid=FORBID, instead="Write M_k from the angle-addition formulas", atol=1e-6,
        same_dtype=True, mistakes=[
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
    "rope(q, m) . rope(k, n) = q^T R(m)^T R(n) k, and R(m)^T R(n) = R(n - m): the score needs "
    "only the offset. Put the query at position 0 and the key at -delta, or work pair by pair: "
    "what is the dot product of a pair with another pair turned by an angle?",
    "Pair i of q is (a, b), of k is (c, e); turning (c, e) by theta = -delta omega_i and dotting "
    "with (a, b) gives (ac + be) cos(delta omega_i) + (ae - bc) sin(delta omega_i). Sum over the "
    "d/2 pairs, omega_i = 10000^(-2i/d); compute the angles in float64.",
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


# --- exercise 3: the ALiBi bias ----------------------------------------------------------------


def alibi_reference(n: int, H: int) -> torch.Tensor:  # noqa: N803
    """``(H, n, n)`` float32: the package's :func:`~attn_helpers.positional.alibi_bias` below the
    diagonal (``-m_h (i - j)``), ``-inf`` on the future keys."""
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return _positional.alibi_bias(n, H).masked_fill(~causal, float("-inf"))


def _alibi_cases() -> list[dict]:
    # n = H first, so a slope per query (or key) gives a shape the checker can name
    return [{"n": 8, "H": 8}, {"n": 5, "H": 4}, {"n": 12, "H": 16}, {"n": 6, "H": 2},
            {"n": 1, "H": 4}, {"n": 7, "H": 1}, {"n": 20, "H": 8}]


ALIBI_FORBID = [(_positional, "alibi_bias"), (_positional, "alibi_slopes")]


def _alibi_forbid() -> list[tuple[object, str]]:
    """:data:`ALIBI_FORBID` plus the same functions re-exported by the package and imported by
    07's lesson (looked up when the checker runs: this module is imported while ``attn_helpers``
    itself is still being imported)."""
    import importlib

    package = importlib.import_module("attn_helpers")
    lesson = importlib.import_module("attn_helpers.lessons.positional_encoding")
    return ALIBI_FORBID + [(package, "alibi_bias"), (package, "alibi_slopes"),
                           (lesson, "alibi_bias")]


ALIBI_INSTEAD = ("Write the slopes m_h = 2^(-8h/H) for h = 1 .. H and the bias -m_h (i - j) with "
                 "torch.arange, then mask the future keys with -inf")


@exercise("positional_encoding.alibi", "the ALiBi bias (slopes per head, causal)", hints=(
    "Each head h = 1 .. H has one fixed slope m_h, the steepest first. The bias of query i for key "
    "j is the slope times how far back the key is, made negative: far keys lose more. Keys in "
    "the future (j > i) must get no weight at all after the softmax.",
    "No loops: the head numbers 1..H as floats give the (H,) slopes, and a column of query "
    "indices minus a row of key indices gives the (n, n) distances i - j. The slopes viewed as "
    "(H, 1, 1) times minus the distances broadcast to (H, n, n); then masked_fill puts -inf "
    "wherever j > i (that (n, n) condition broadcasts over the heads).",
    "h = torch.arange(1, H + 1, dtype=torch.float64)\n"
    "m = ...                                                    # (H,): the slopes\n"
    "i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]  # query rows, key columns\n"
    "bias = ...                                                 # (H, n, n): -m_h (i - j)\n"
    "return bias.masked_fill(j > i, float('-inf')).float()"))
def check_alibi(alibi: Callable) -> CheckResult:
    """Exercise: ``alibi(n, H) -> (H, n, n)``, the causal ALiBi bias of notebook 07's section 5:
    ``bias[h - 1, i, j] = -m_h (i - j)`` for ``j <= i`` and ``-inf`` for ``j > i``, with ``m_h =
    2^(-8h/H)``, ``h = 1 .. H`` (``H`` a power of two). Checked against the package's
    :func:`~attn_helpers.positional.alibi_bias` (blocked while the learner's function runs)."""
    if getattr(alibi, "__code__", None) is _alibi.__code__:
        return CheckResult(False, "Not yet: that is the checker's own bias, which does this "
                                  f"exercise for you. {ALIBI_INSTEAD}.")
    return check_function(
        alibi, alibi_reference, _alibi_cases(), what="alibi", output_names=("the bias",),
        forbid=_alibi_forbid(), instead=ALIBI_INSTEAD,
        mistakes=[
            Mistake(lambda n, H: _alibi(n, H, first=0),
                    "the heads are numbered from 0, so the first slope is 2^0 = 1. The paper and "
                    "section 5 number them h = 1 .. H: m_h = 2^(-8h/H), the first 2^(-8/H)."),
            Mistake(lambda n, H: _alibi(n, H, sign=1.0),
                    "the sign is flipped (+m_h (i - j), or -m_h (j - i)): a key farther back must "
                    "LOSE score, bias = -m_h (i - j) with i - j >= 0."),
            Mistake(lambda n, H: _alibi(n, H, distance="abs", future=None),
                    "the future keys (j > i) got the distance penalty -m_h |i - j| instead of the "
                    "causal mask: a penalty still lets the next token through. Set them to -inf."),
            Mistake(lambda n, H: _alibi(n, H, future=None),
                    "there is no causal mask: for j > i, -m_h (i - j) is a BONUS for the future "
                    "keys. Set them to -inf."),
            Mistake(lambda n, H: _alibi(n, H, future=0.0),
                    "the future keys got bias 0, which the softmax still weighs; they must get "
                    "-inf (weight exactly 0)."),
            Mistake(lambda n, H: _alibi(n, H, future=-1e9),
                    "the future keys got a large finite number (-1e9) instead of -inf. After the "
                    "softmax it rounds to a weight of 0 here, but it is a stand-in whose size must "
                    "suit the dtype and the scores (float16 cannot hold -1e9); the exercise asks "
                    "for the mask itself: float('-inf')."),
            Mistake(lambda n, H: _alibi(n, H, per="query"),
                    "the slopes went along the query rows (m[:, None] times an (n, n) grid): one "
                    "slope per HEAD, m[:, None, None], so each head has its own (n, n) bias."),
            Mistake(lambda n, H: _alibi(n, H, per="key"),
                    "the slopes went along the key columns (m[None, :]): one slope per HEAD, "
                    "m[:, None, None], so each head has its own (n, n) bias."),
            Mistake(lambda n, H: _alibi(n, H, H_for_ratio=8),
                    "the slopes are 2^(-h), right for H = 8 only: the ratio between heads is "
                    "2^(-8/H), so H = 16 heads step by 2^(-1/2) and H = 4 by 2^(-2)."),
            Mistake(lambda n, H: _alibi(n, H, base=torch.e),
                    "the slopes use e instead of 2: m_h = 2^(-8h/H)."),
            Mistake(lambda n, H: _alibi(n, H, order="down"),
                    "the slopes run backwards: head h = 1 is the STEEPEST, m_1 = 2^(-8/H), and "
                    "head H the shallowest, m_H = 2^(-8)."),
            Mistake(lambda n, H: _alibi(n, H, diagonal=False),
                    "the diagonal (j = i, the query's own token) is masked too; it is visible "
                    "with bias 0. Mask only j > i."),
            Mistake(lambda n, H: _alibi(n, H, transpose=True),
                    "the bias is transposed: rows are queries i, columns keys j, and the keys a "
                    "query may see are j <= i (the lower triangle)."),
        ],
    )
