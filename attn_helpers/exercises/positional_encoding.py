"""Checkers for notebook 07: the matrix M_k with PE(p + k) = M_k PE(p) (``sinusoidal``), a RoPE
checkpoint moved from split halves to interleaved pairs (``rope_layout``), and an ALiBi head's
half-weight reach (``reach``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..lessons.positional_encoding import half_weight_reach
from ..positional import alibi_slopes
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["REACH_MARGIN", "check_reach", "check_rope_layout", "check_sinusoidal",
           "half_weight_reach_reference", "shift_matrix_reference", "to_interleaved_reference"]


# --- exercise 1: moving by k is a matrix ---------------------------------------------------------


def _shift(k: int, d: int, *, sign: float = 1.0, exponents=None, halves: bool = False,
           same_angle: bool = False, no_sin: bool = False) -> torch.Tensor:
    """Exercise 1's ``M_k`` ``(d, d)`` with one known mistake (the defaults: the right answer, one
    block ``[[cos, sin], [-sin, cos]]`` of the angle ``k omega_i`` per (sin, cos) pair)."""
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    omega = torch.ones(d // 2) if same_angle else 10000.0 ** (-exponents.double())
    omega = omega.double()
    c, s = (k * omega).cos(), sign * (k * omega).sin() * (0.0 if no_sin else 1.0)
    first = torch.arange(d // 2) if halves else torch.arange(0, d, 2)   # the pair's two rows
    second = first + d // 2 if halves else first + 1
    M = torch.zeros(d, d, dtype=torch.float64)
    M[first, first], M[first, second] = c, s
    M[second, first], M[second, second] = -s, c
    return M


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
    M_k PE(p)`` for every ``p`` (section 2's table, derived by the learner)."""
    k, half = torch.randint(1, 41, (2,), generator=seeded(70)).tolist()  # a random case too
    cases = [{"k": k, "d_model": d} for k, d in [(1, 8), (3, 16), (0, 4), (-2, 8), (100, 32),
                                                 (7, 2), (k, 2 * half)]]
    return check_function(
        shift_matrix, shift_matrix_reference, cases, what="shift_matrix", output_names=("M_k",),
        atol=1e-6, same_dtype=True, mistakes=[
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


# --- exercise 2: a checkpoint trained with RoPE's other layout ----------------------------------


def _layout(W_Q: torch.Tensor, W_K: torch.Tensor, h: int, g: int, *, inverse: bool = False,
            swap: bool = False, negate: bool = False, one_head: bool = False,
            head_minor: bool = False, columns: bool = False, keep_k: bool = False,
            counts: tuple[int, int] | None = None,
            reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 2's ``(W_Q', W_K')`` with one known mistake (the defaults: the right answer, new
    row ``2i`` of each head = old row ``i``, new row ``2i+1`` = old row ``i + d/2``)."""
    def convert(W: torch.Tensor, heads: int) -> torch.Tensor:
        rows = W.shape[0]
        heads = 1 if one_head else heads
        if rows % heads or (rows // heads) % 2:
            raise ValueError(f"{rows} rows do not split into {heads} heads of even size")
        d = rows // heads
        i = torch.arange(d // 2).flip(0) if reverse else torch.arange(d // 2)
        index = torch.stack([i + d // 2, i] if swap else [i, i + d // 2], -1).flatten()  # (d,)
        index = index.argsort() if inverse else index              # new row r <- old row index[r]
        block = torch.arange(heads)
        full = (index[:, None] * heads + block).flatten() if head_minor else (
            block[:, None] * d + index).flatten()                  # (rows,): over all the heads
        moved = W[:, full] if columns else W[full]
        if negate:
            moved = moved.clone()
            moved[1::2] = -moved[1::2]
        return moved

    h_used, g_used = counts if counts is not None else (h, g)
    return convert(W_Q, h_used), W_K.clone() if keep_k else convert(W_K, g_used)


def _layout_cases() -> list[dict]:
    """``W_Q (h d_head, d_in)``, ``W_K (g d_head, d_in)``: one head, g = h, g < h, g = 1;
    d_head = 2 (nothing moves), 4 (its own inverse) and more; a float32 layer; a random one."""
    gen = seeded(71)
    g_rand = int(torch.randint(1, 4, (1,), generator=gen))
    h_rand = g_rand * int(torch.randint(1, 4, (1,), generator=gen))
    d_rand, d_in_rand = (2 * int(torch.randint(1, 9, (1,), generator=gen)),
                         int(torch.randint(1, 41, (1,), generator=gen)))
    cases = []
    for h, g, d_head, d_in, dtype in [(1, 1, 8, 8, torch.float64), (4, 4, 6, 24, torch.float64),
                                      (4, 2, 8, 20, torch.float64), (3, 1, 4, 10, torch.float64),
                                      (2, 2, 2, 5, torch.float64), (8, 2, 16, 48, torch.float32),
                                      (h_rand, g_rand, d_rand, d_in_rand, torch.float64)]:
        cases.append({"W_Q": torch.randn(h * d_head, d_in, generator=gen, dtype=dtype),
                      "W_K": torch.randn(g * d_head, d_in, generator=gen, dtype=dtype),
                      "h": h, "g": g})
    return cases


def _kept(W_Q, W_K, h, g):  # nothing moved
    return W_Q.clone(), W_K.clone()


_BACKWARDS = ("mirrors the pair, and a mirrored rotation turns the other way: your scores are the "
              "original model's with every position negated, so the key delta back scores as the "
              "key delta ahead did.")
_COUNTS = ("you cut one weight into the other's number of heads: W_Q holds h query heads and W_K "
           "g key/value heads (grouped-query attention, notebook 04), each of d_head rows; "
           "Hugging Face's Llama conversion, too, reorders k_proj with the key/value head count.")
LAYOUT_MISTAKES = [
    Mistake(_kept, "nothing moved: loaded as they are, the weights run under apply_rope without an "
                   "error, but each number is paired with the wrong partner and turned at the "
                   "wrong frequency. Move rows so that each split-half pair lands on an "
                   "interleaved pair with the same omega_i."),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, inverse=True),
            "your reordering is the inverse of the right one: it turns an interleaved head into a "
            "split-half one (the direction of Hugging Face's conversion of Meta's Llama weights). "
            "W[index] puts old row index[r] at new row r: for each new row, which old row holds "
            "its number?"),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, swap=True),
            f"each pair's two members are swapped: that {_BACKWARDS}"),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, negate=True),
            f"you negated one member of each pair: rows only move here. A sign flip {_BACKWARDS}"),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, columns=True),
            "you moved the columns: they are the input features, which RoPE never touches. "
            "nn.Linear computes x @ W.T, so the numbers RoPE pairs (each head's queries and keys) "
            "come from the rows of W."),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, keep_k=True),
            "W_K' is W_K unchanged: keys are rotated like queries, so k_proj needs the same move, "
            "head by head (it is v_proj and o_proj that stay as they are)."),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, one_head=True),
            "you reordered all the rows as one head: each head is its own block of d_head rows, "
            "and the move happens inside every block, the same in each."),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, head_minor=True),
            "you read the rows as (d_head, heads): nn.Linear's rows are head after head, so "
            "head j is the block of rows j * d_head .. (j + 1) * d_head - 1."),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, reverse=True),
            "your pairs are in reverse order: split-half pair i landed on interleaved pair "
            "d/2 - 1 - i, which turns at another frequency. Both layouts give pair i the same "
            "omega_i: which interleaved pair must each split-half pair become?"),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, counts=(h, h)), _COUNTS),
    Mistake(lambda W_Q, W_K, h, g: _layout(W_Q, W_K, h, g, counts=(g, g)), _COUNTS),
]


def to_interleaved_reference(W_Q: torch.Tensor, W_K: torch.Tensor, h: int, g: int):
    """``(W_Q', W_K')``: each of the ``h`` query heads of ``W_Q`` and ``g`` key/value heads of
    ``W_K`` moved from split-half RoPE (pair ``i`` = rows ``i, i + d/2``) to interleaved pairs
    (rows ``2i, 2i+1``), so that ``apply_rope`` gives the layer's scores."""
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
    """Exercise: ``to_interleaved(W_Q (h d_head, d_in), W_K (g d_head, d_in), h, g) -> (W_Q',
    W_K')``, see :func:`to_interleaved_reference`; rows only move, so compared exactly, in the
    input's dtype."""
    return check_function(to_interleaved, to_interleaved_reference, _layout_cases(),
                          what="to_interleaved", output_names=("W_Q'", "W_K'"), atol=1e-12, rtol=0.0,
                          same_dtype=True, mistakes=LAYOUT_MISTAKES)


# --- exercise 3: how far back an ALiBi head looks ----------------------------------------------


def _reach(m: torch.Tensor, n: int, *, rounding: str = "ceil", keys: int = 0, sign: float = -1.0,
           base: float = math.e, log2: bool = False, endless: bool = False, cap: bool = False,
           statistic: str = "half") -> torch.Tensor:
    """Exercise 3's reach ``(H,)`` long with one known mistake (the defaults: the right answer,
    ``ceil(-ln((1 + r^n) / 2) / m)``, ``r = e^{-m}``)."""
    m, rows = m.double() * math.log(base), n + keys                  # base^(-m d) = e^(-m ln(base) d)
    if statistic == "mean":
        delta = torch.arange(n, dtype=torch.float64)                  # (n,): distances 0 .. n-1
        x = (torch.softmax(-m[:, None] * delta, -1) * delta).sum(-1)  # (H,): the mean distance
    elif statistic == "uniform":
        x = torch.full_like(m, n / 2)
    elif endless:
        x = math.log(2) / m
    else:
        x = -torch.log1p(torch.expm1(-m * rows) / 2) / m               # (H,): share(x) = 1/2
        x = x if sign < 0 else rows - x          # weights e^{+m d}: the row read from its far end
    x = x / math.log(2) if log2 else x
    k = {"ceil": torch.ceil, "floor": torch.floor, "round": torch.round}[rounding](x)
    return (k.clamp(max=n) if cap else k).long()


#: Every case's real-valued reach x = -ln((1 + r^n) / 2) / m is this far from a whole number >= 1
#: (tested), so any float64 closed form rounds it alike.
REACH_MARGIN = 0.01


def _reach_cases() -> list[dict]:
    """ALiBi's slopes for 4 to 16 heads, rows of 1 to 3000 keys, tiny and large slopes (the limits
    ceil(n / 2) and 1), and a random case."""
    g = seeded(72)
    heads = int(torch.randint(2, 7, (1,), generator=g))
    log_m = torch.empty(heads, dtype=torch.float64).uniform_(math.log(1e-3), math.log(2.0), generator=g)
    n = int(torch.randint(2, 4001, (1,), generator=g))
    slopes = alibi_slopes
    return [{"m": m, "n": n} for m, n in [
        (slopes(8), 24), (slopes(4), 1), (slopes(12), 100), (slopes(4), 7), (slopes(8), 3000),
        (slopes(16), 2048),
        (torch.tensor([1e-6, 1e-4, 1e-3], dtype=torch.float64), 1001),
        (torch.tensor([0.3, 3.0, 40.0], dtype=torch.float64), 50), (log_m.exp(), n)]]


def half_weight_reach_reference(m: torch.Tensor, n: int) -> torch.Tensor:
    """``(H,)`` long: ``ceil(-ln((1 + r^n) / 2) / m)`` with ``r = e^{-m}`` (the lesson's function)."""
    return half_weight_reach(m, n)


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
    "and take the smallest whole k where the share reaches 1/2. No sum over the row is needed.",
    "# To check yourself on a short row (not in here): count keys until the row's cumsum >= 1/2.\n"
    "r_n = torch.exp(-m * n)                     # (H,): r^n, r = e^{-m}\n"
    "x = ...                                     # (H,) float: the k where share(k) is exactly 1/2\n"
    "return ...                                  # (H,) long: the smallest whole k >= x"))
def check_reach(half_weight_reach: Callable) -> CheckResult:
    """Exercise: ``half_weight_reach(m (H,), n) -> (H,)`` long: the fewest nearest keys holding half
    the weight of a causal row of ``n`` keys under ALiBi's bias ``-m delta``."""

    def whole(m, n):  # the reaches count keys: an integer tensor
        k = half_weight_reach(m, n)
        if isinstance(k, torch.Tensor) and (k.is_floating_point() or k.is_complex()
                                            or k.dtype == torch.bool):
            raise TypeError(f"the reaches count keys: return them as a LongTensor (H,) of whole "
                            f"numbers (.long()), got dtype {k.dtype}")
        return k

    return check_function(
        whole, half_weight_reach_reference, _reach_cases(), what="half_weight_reach",
        output_names=("the reaches",), atol=0.0, rtol=0.0, mistakes=[
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
