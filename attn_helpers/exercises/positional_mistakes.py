"""The known mistakes of notebook 07's exercises, each as one function with a switch per mistake
(:func:`_shift`, :func:`_layout`, :func:`_reach`); with their defaults they are the right answers
(the checkers refuse them as a learner's answer, see :mod:`.positional_encoding`). Also exercise
2's cases and the scores its messages measure (:func:`_layout_cases`, :func:`_scores`) and
exercise 3's guard against a sum over the row (:func:`_no_row_sum`)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import torch

from ..lessons import positional_encoding as _rope
from ..positional import alibi_slopes
from .core import Mistake, Refused, seeded

__all__: list[str] = []

# --- exercise 2: a checkpoint's rows, from RoPE's split-half layout to the interleaved one -------


def _layout(W_Q: torch.Tensor, W_K: torch.Tensor, h: int, g: int, *, inverse: bool = False,
            swap: bool = False, negate: bool = False, one_head: bool = False,
            head_minor: bool = False, columns: bool = False, keep_k: bool = False,
            counts: tuple[int, int] | None = None,
            reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_Q', W_K')``: the rows of each head of ``W_Q`` (``h`` heads) and ``W_K`` (``g`` heads),
    ``nn.Linear`` weights trained with split-half RoPE (pair ``i`` = rows ``i, i + d/2`` of a head),
    moved so that interleaved RoPE (pair ``i`` = rows ``2i, 2i+1``) computes the same scores:
    new row ``2i`` is old row ``i``, new row ``2i+1`` old row ``i + d/2``. With one thing changed
    (exercise 2's known mistakes); with the defaults it is the right answer. ``inverse``: the other
    direction; ``swap``: each pair's members swapped; ``negate``: the second member negated;
    ``one_head``: all rows as one head; ``head_minor``: rows read as ``(d_head, heads)``;
    ``columns``: the columns moved instead; ``keep_k``: ``W_K`` left as it is; ``counts``: the
    head counts used for ``(W_Q, W_K)``; ``reverse``: the pairs in reverse order."""
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
    """A layer's ``W_Q`` ``(h d_head, d_in)`` and ``W_K`` ``(g d_head, d_in)`` with ``h`` query and
    ``g`` key/value heads: one head; ``g = h``; grouped-query (``g < h``) and multi-query
    (``g = 1``) layers; ``d_head = 2`` (nothing to move) and ``4`` (a reordering that is its own
    inverse); ``d_in`` equal to the rows and not; one float32 layer and a random one."""
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


#: Where a layer's scores are taken: far apart, so that even the slowest pairs turn.
SCORE_POSITIONS = torch.arange(16) ** 2 * 7                                   # 0 .. 1575


def _scores(W_Q: torch.Tensor, W_K: torch.Tensor, h: int, g: int, *, layout: str,
            sign: int = 1) -> torch.Tensor:
    """``(h, 16, 16)`` float64: every head's scores of 16 seeded tokens at :data:`SCORE_POSITIONS`
    (times ``sign``) under RoPE in ``layout`` (``"interleaved"``, the course's, or ``"half"``)."""
    d_in = W_Q.shape[1]
    x = torch.randn(16, d_in, generator=seeded(73), dtype=torch.float64) / d_in ** 0.5  # (16, d_in)
    return _rope.layer_scores(W_Q.double(), W_K.double(), x, h, g, layout=layout,
                              positions=sign * SCORE_POSITIONS)


def _kept(W_Q, W_K, h, g):  # nothing moved
    return W_Q.clone(), W_K.clone()


_BACKWARDS = ("mirrors the pair, and a mirrored rotation turns the other way: your scores are the "
              "original model's with every position negated, so the key delta back scores as the "
              "key delta ahead did (the Scores line measures it).")
_COUNTS = ("you cut one weight into the other's number of heads: W_Q holds h query heads and W_K "
           "g key/value heads (grouped-query attention, notebook 04), each of d_head rows; "
           "Hugging Face's Llama conversion, too, reorders k_proj with the key/value head count.")
#: Exercise 2's known mistakes, each with its explanation (the first that matches is named).
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


def _score_line(W_Q, W_K, h, g, mine) -> str:
    """What the learner's ``(W_Q', W_K')`` do to the layer's scores, measured: apply_rope on them
    against split-half RoPE on ``W_Q, W_K`` (:func:`.positional_mistakes._scores`)."""
    original = _scores(W_Q, W_K, h, g, layout="half")
    yours = _scores(*mine, h, g, layout="interleaved")
    gap, top = (yours - original).abs().max().item(), original.abs().max().item()
    if gap <= 1e-9 * top:
        return (f"\nScores: your weights still give every head the original model's scores "
                f"(largest difference {gap:.1g}), but they are not W_Q's and W_K's rows moved; "
                "only rows move here, unchanged.")
    said = (f"\nScores: with your weights, apply_rope's scores differ from the original model's "
            f"(split-half RoPE on W_Q, W_K) by up to {gap:.2g}, against a largest score of "
            f"{top:.2g}")
    negated = _scores(W_Q, W_K, h, g, layout="half", sign=-1)
    if (yours - negated).abs().max().item() <= 1e-9 * top:
        return (f"{said}; they equal its scores with every position negated: the key delta back "
                "scores as the key delta ahead did.")
    return f"{said}. Such weights load without an error and compute something else."


# --- exercise 3: its cases, and no sum over the row -------------------------------------------

#: Every case keeps each head's real-valued k, x = -ln((1 + r^n) / 2) / m, at least this far from a
#: whole number >= 1 (tested), so any float64 closed form (log or log1p, ...) rounds it alike.
REACH_MARGIN = 0.01


def _reach_cases() -> list[dict]:
    """ALiBi's slopes for 4, 8, 12 and 16 heads in rows of 1 to 3000 keys, tiny and large slopes (the
    limits ceil(n / 2) and 1), and a random case; none within :data:`REACH_MARGIN` of a tie."""
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


#: Rows shorter than this are not watched: a closed form's (H,) tensors could reach their length.
ROW_GUARD_MIN = 256
_NOT_THE_LEARNER = tuple(os.path.dirname(os.path.abspath(f)) for f in (
    torch.__file__, os.path.dirname(__file__), contextlib.__file__))
_WHY = ("that is a sum over the row, which this exercise refuses. The closed form is the point: "
        "the geometric series gives the reach for any n in O(1) work, even for an endless row "
        "(n -> infinity), where no sum can run. Derive it from the geometric series")


class _NoRowSum(torch.overrides.TorchFunctionMode):
    """Refuses, while ``half_weight_reach`` runs on a row of ``n`` keys, any tensor of ``n`` or more
    elements and ``n`` or more torch calls: the row's weights, vectorised or one at a time."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.calls = n, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls += 1
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() >= self.n:
                raise Refused(f"half_weight_reach built a tensor of shape {tuple(t.shape)} for a row "
                              f"of n = {self.n} keys: {_WHY}.")
        if self.calls >= self.n:
            raise Refused(f"half_weight_reach made {self.calls} torch calls for a row of n = "
                          f"{self.n} keys, one per key: {_WHY}.")
        return out


@contextlib.contextmanager
def _no_row_sum(inputs: dict) -> Iterator[None]:
    """Exercise 3's ``guard``: for a row of ``n >= ROW_GUARD_MIN`` keys, refuse a tensor as long as
    the row (:class:`_NoRowSum`) and a Python loop over it (``n`` lines run in the learner's code)."""
    n = inputs["n"]
    if not isinstance(n, int) or n < ROW_GUARD_MIN:
        yield
        return
    lines = [0]

    def local(frame, event, arg):
        if event == "line":
            lines[0] += 1
            if lines[0] >= n:
                raise Refused(f"half_weight_reach ran {lines[0]} lines of Python for a row of n = "
                              f"{n} keys: {_WHY}.")
        return local

    def tracer(frame, event, arg):
        return None if frame.f_code.co_filename.startswith(_NOT_THE_LEARNER) else local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        with _NoRowSum(n):
            yield
    finally:
        sys.settrace(previous)


# --- the known mistakes of exercises 1 and 3 ----------------------------------------------------


def _reach(m: torch.Tensor, n: int, *, rounding: str = "ceil", keys: int = 0, sign: float = -1.0,
           base: float = math.e, log2: bool = False, endless: bool = False, cap: bool = False,
           statistic: str = "half") -> torch.Tensor:
    """The half-weight reach ``(H,)`` long of slopes ``m (H,)`` in a causal row of ``n`` keys with one
    thing changed (the known mistakes of exercise 3); with the defaults it is the right answer,
    ``ceil(x)`` with ``x = -ln((1 + r^n) / 2) / m``, ``r = e^{-m}``. ``keys``: a row of ``n + keys``
    keys; ``sign = +1``: weights ``e^{+m delta}``; ``base``: weights ``base^{-m delta}``; ``log2``:
    ``log2`` in place of ``ln``; ``endless``: ``ln 2 / m`` (``cap``: at most ``n``); ``statistic``:
    ``"mean"`` distance or ``"uniform"`` (``n / 2``, the slope ignored)."""
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


def _shift(k: int, d: int, *, sign: float = 1.0, exponents=None, halves: bool = False,
           same_angle: bool = False, no_sin: bool = False) -> torch.Tensor:
    """The ``(d, d)`` matrix ``M_k`` with ``PE(p + k) = M_k PE(p)`` for the interleaved sinusoidal
    encoding (pair ``(sin, cos)``: block ``[[cos, sin], [-sin, cos]]`` of the angle ``k omega_i``),
    with one thing changed (the known mistakes of notebook 07's exercise 1); with the defaults
    it is the right answer."""
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
