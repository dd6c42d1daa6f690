r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the sinusoidal table
  :math:`PE_{p,2i} = \sin(p\,\omega_i)`, :math:`PE_{p,2i+1} = \cos(p\,\omega_i)`,
  :math:`\omega_i = 10000^{-2i/d}`.
* ``positional_encoding.rope``: :func:`check_rope`, RoPE on a vector (``rotate(x, p)``): each pair
  :math:`(x_{2i}, x_{2i+1})` rotated by :math:`p\,\omega_i`.
* ``positional_encoding.relative_gap``: :func:`check_relative_gap`, the relative-position check:
  does the score of a query at ``p`` and a key at ``p + offset`` equal the score at ``0`` and
  ``offset``?
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..positional import apply_rope, frequencies, sinusoidal_encoding
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["PositionScheme", "SCHEMES", "check_relative_gap", "check_rope", "check_sinusoidal",
           "relative_gap_reference", "rope_reference"]


# --- exercise 1: the sinusoidal table --------------------------------------------------------


def _sizes(g: torch.Generator, k: int, high: int = 8) -> list[int]:  # a case's random shapes
    return torch.randint(1, high + 1, (k,), generator=g).tolist()


def _table(n, d, *, positions=None, exponents=None):
    """``sin``/``cos`` of ``positions[:, None] * 10000^(-exponents)``, interleaved: the encoding
    with one thing changed, for the known mistakes."""
    positions = torch.arange(n, dtype=torch.float64) if positions is None else positions
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    angles = positions[:, None] * 10000.0 ** (-exponents)  # (n, d/2)
    return torch.stack([angles.sin(), angles.cos()], -1).reshape(n, d).float()


@exercise("positional_encoding.sinusoidal", "the sinusoidal encoding table", hints=(
    "Row p is position p, and its d numbers come in d/2 pairs (2i, 2i+1). Each pair turns at its "
    "own frequency, fastest first; the even entry is a sine, the odd one a cosine.",
    "omega_i = 10000^(-2i/d) for i = 0 .. d/2 - 1; PE[p, 2i] = sin(p omega_i), "
    "PE[p, 2i+1] = cos(p omega_i).",
    "p = torch.arange(n_positions, dtype=torch.float64)[:, None]            # (n, 1)\n"
    "omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)\n"
    "angles = p * omega                                                    # (n, d/2)\n"
    "return torch.stack([angles.sin(), angles.cos()], -1).reshape(n_positions, d_model).float()"))
def check_sinusoidal(sinusoidal: Callable) -> CheckResult:
    """Exercise: ``sinusoidal(n_positions, d_model) -> PE (n_positions, d_model)`` float32, with
    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``."""
    n, half = _sizes(seeded(70), 2, high=40)  # and a case with random sizes
    cases = [{"n_positions": n, "d_model": d}
             for n, d in [(6, 8), (4, 2), (50, 16), (1, 4), (n, 2 * half)]]

    def per_dimension(n, d):  # omega = 10000^(-j/d) for every dimension j, odd ones included
        angles = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (
            -torch.arange(d, dtype=torch.float64) / d)
        return torch.where(torch.arange(d) % 2 == 0, angles.sin(), angles.cos()).float()

    return check_function(
        sinusoidal, sinusoidal_encoding, cases, what="sinusoidal", output_names=("PE",),
        mistakes=[
            Mistake(lambda n, d: _table(n, d).view(n, d // 2, 2).flip(-1).reshape(n, d),
                    "sin and cos are swapped: even dimensions 2i hold the sine, odd ones 2i+1 the "
                    "cosine."),
            Mistake(lambda n, d: torch.cat([_table(n, d)[:, 0::2], _table(n, d)[:, 1::2]], -1),
                    "you put all sines first and all cosines after; in this course's layout they "
                    "alternate: sin, cos, sin, cos, ..."),
            Mistake(lambda n, d: _table(n, d, exponents=torch.arange(d // 2) / d),
                    "the exponent is 2i/d, where 2i is the even dimension index (0, 2, 4, ...): "
                    "pair i has frequency 10000^(-2i/d), not 10000^(-i/d)."),
            Mistake(per_dimension,
                    "the sine and the cosine of a pair share one frequency, 10000^(-2i/d); you "
                    "gave dimension 2i+1 its own exponent (2i+1)/d."),
            Mistake(lambda n, d: _table(n, d, positions=torch.arange(1, n + 1, dtype=torch.float64)),
                    "off by one: the first row is position p = 0 (sin 0 = 0, cos 0 = 1), not 1."),
            Mistake(lambda n, d: _table(n, d, exponents=-torch.arange(0, d, 2) / d),
                    "the frequencies grow instead of shrinking: divide p by 10000^(2i/d), which "
                    "is p * 10000^(-2i/d), so that the later pairs turn more slowly."),
        ],
        atol=1e-4,
    )


# --- exercise 2: RoPE on a vector ------------------------------------------------------------


def rope_reference(x: torch.Tensor, p: int) -> torch.Tensor:
    """``x (..., d)`` rotated as if it stood at position ``p``: pair ``(x[2i], x[2i+1])`` turned
    by ``p * omega_i`` (:func:`attn_helpers.positional.apply_rope` on one position)."""
    return apply_rope(x[..., None, :], torch.tensor([p]))[..., 0, :]


def _rotate(x, p, *, sign=1.0, exponents=None, halves=False, interleave=True):
    """RoPE with one thing changed, for the known mistakes."""
    d = x.shape[-1]
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    angles = sign * p * 10000.0 ** (-exponents)  # (d/2,)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos - b * sin, a * sin + b * cos  # (..., d/2) each
    if halves or not interleave:
        return torch.cat([first, second], -1)
    return torch.stack([first, second], -1).flatten(-2)


def _rope_cases() -> list[dict]:
    g = seeded(71)
    shapes = [((8,), 5, torch.float32), ((2,), 3, torch.float32), ((4, 16), 11, torch.float64),
              ((2, 3, 8), 1000, torch.float64), ((6,), 0, torch.float32)]
    b, h, half, p = _sizes(g, 4, high=12)
    shapes.append(((b, h, 2 * half), 10 * p, torch.float32))  # random shapes
    return [{"x": torch.randn(*shape, generator=g).to(dtype), "p": p}
            for shape, p, dtype in shapes]


@exercise("positional_encoding.rope", "RoPE on a vector (interleaved pairs)", hints=(
    "Cut x into neighbouring pairs (x[0], x[1]), (x[2], x[3]), ... and turn each pair, as a point "
    "in the plane, by an angle that grows with the position p; pair i turns at omega_i.",
    "theta_i = p * 10000^(-2i/d); x'[2i] = x[2i] cos theta_i - x[2i+1] sin theta_i, "
    "x'[2i+1] = x[2i] sin theta_i + x[2i+1] cos theta_i.",
    "d = x.shape[-1]\n"
    "theta = p * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)   # (d/2,)\n"
    "cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)\n"
    "even, odd = x[..., 0::2], x[..., 1::2]                                   # (..., d/2)\n"
    "return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)"))
def check_rope(rotate: Callable) -> CheckResult:
    """Exercise: ``rotate(x (..., d), p: int) -> (..., d)``, the rotary embedding of ``x`` at
    position ``p`` with interleaved pairs and ``omega_i = 10000^(-2i/d)``."""
    return check_function(
        rotate, rope_reference, _rope_cases(), what="rotate", output_names=("the rotated vector",),
        mistakes=[
            Mistake(lambda x, p: _rotate(x, p, sign=-1.0),
                    "you turned the pairs the wrong way (by -p omega_i): x'[2i] = x[2i] cos - "
                    "x[2i+1] sin, x'[2i+1] = x[2i] sin + x[2i+1] cos."),
            Mistake(lambda x, p: _rotate(x, p, halves=True),
                    "you paired dimension i with i + d/2 (the split-halves layout of GPT-NeoX and "
                    "LLaMA's Hugging Face code); here the pairs are neighbours (x[2i], x[2i+1])."),
            Mistake(lambda x, p: _rotate(x, p, interleave=False),
                    "the rotated pairs were not put back in place: you returned all first "
                    "components, then all second ones. x'[2i] and x'[2i+1] stay side by side."),
            Mistake(lambda x, p: _rotate(x, p, exponents=torch.arange(x.shape[-1] // 2) / x.shape[-1]),
                    "the frequency of pair i is 10000^(-2i/d), not 10000^(-i/d)."),
            Mistake(lambda x, p: _rotate(x, p + 1),
                    "off by one: a vector at position p turns by p omega_i, so position 0 is not "
                    "turned at all."),
            Mistake(lambda x, p: _rotate(x, p, exponents=torch.arange(0, x.shape[-1], 2).flip(0)
                                         / x.shape[-1]),
                    "the frequencies run the wrong way: pair 0 turns fastest (omega_0 = 1), the "
                    "last pair slowest."),
        ],
    )


# --- exercise 3: the relative-position check -------------------------------------------------


class PositionScheme:
    """A named way to put position into a query or key: ``encode(x (..., d), p) -> (..., d)``."""

    def __init__(self, name: str, encode: Callable[[torch.Tensor, int], torch.Tensor]):
        self.name, self.encode = name, encode

    def __call__(self, x: torch.Tensor, p: int) -> torch.Tensor:
        return self.encode(x, p)

    def __repr__(self) -> str:
        return self.name


def _added_sinusoid(x, p):
    angles = p * frequencies(x.shape[-1])  # (d/2,), any integer p, negative ones too
    return x + torch.stack([angles.sin(), angles.cos()], -1).flatten().to(x.dtype)


SCHEMES = {
    "rope": PositionScheme("RoPE", rope_reference),
    "added": PositionScheme("sinusoids added", _added_sinusoid),
    "none": PositionScheme("no position", lambda x, p: x),
    "scaled": PositionScheme("x * (1 + p / 10)", lambda x, p: x * (1 + p / 10)),
}


def relative_gap_reference(encode, q, k, p, offset):
    """The largest ``|score(p, p + offset) - score(0, offset)|`` over the leading dims, a 0-d
    tensor; ``score(m, n) = encode(q, m) . encode(k, n)`` over the last dim of ``q, k (..., d)``."""
    moved = (encode(q, p) * encode(k, p + offset)).sum(-1)  # (...,): query at p, key at p + offset
    start = (encode(q, 0) * encode(k, offset)).sum(-1)  # (...,): the same distance from 0
    return (moved - start).abs().max()


def _gap_cases() -> list[dict]:
    g = seeded(72)
    cases, (h, half, at, apart) = [], _sizes(g, 4, high=12)  # the last case's random sizes
    for scheme, heads, d, p, offset in [("rope", 3, 8, 5, 2), ("added", 4, 8, 3, 4),
                                        ("none", 2, 6, 7, 1), ("scaled", 3, 4, 2, 5),
                                        ("rope", 1, 16, 40, 9), ("added", 2, 4, 10, -3),
                                        ("added", 3, 16, 1, 0), ("added", h, 2 * half, at, apart)]:
        q, k = torch.randn(2, heads, d, generator=g, dtype=torch.float64)
        k = -q if scheme == "scaled" else k  # q . k < 0: every head's score falls as p grows
        cases.append({"encode": SCHEMES[scheme], "q": q, "k": k, "p": p, "offset": offset})
    return cases


def _score(encode, q, k, m, n):
    return (encode(q, m) * encode(k, n)).sum(-1)  # (...,)


@exercise("positional_encoding.relative_gap", "the relative-position check", hints=(
    "Place the query at p and the key at p + offset, and score them. Then slide the pair back "
    "so the query is at 0, keeping the distance. A relative scheme gives the same score.",
    "score(m, n) = encode(q, m) . encode(k, n) (a dot product over the last dim); the gap is "
    "max |score(p, p + offset) - score(0, offset)| over the heads.",
    "moved = (encode(q, p) * encode(k, p + offset)).sum(-1)      # one score per head\n"
    "start = (encode(q, 0) * encode(k, offset)).sum(-1)\n"
    "return (moved - start).abs().max()"))
def check_relative_gap(relative_gap: Callable) -> CheckResult:
    """Exercise: ``relative_gap(encode, q (h, d), k (h, d), p, offset) -> 0-d tensor``, the
    largest change over the heads of the score ``encode(q, m) . encode(k, n)`` between
    ``(m, n) = (p, p + offset)`` and ``(0, offset)``: zero for a relative scheme (RoPE)."""
    return check_function(
        relative_gap, relative_gap_reference, _gap_cases(), what="relative_gap",
        output_names=("the gap",), atol=1e-8, rtol=1e-6,
        mistakes=[
            Mistake(lambda f, q, k, p, o: (_score(f, q, k, p, o) - _score(f, q, k, 0, o)).abs().max(),
                    "the key must move with the query: it stands at p + offset, not at offset, "
                    "so that the two are offset apart in both scores."),
            Mistake(lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, 0))
                    .abs().max(),
                    "compare with the pair at the same distance: query at 0, key at offset "
                    "(not both at 0)."),
            Mistake(lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, o)).max(),
                    "the gap is the size of the change, whatever its sign: take .abs() before "
                    ".max()."),
            Mistake(lambda f, q, k, p, o: (_score(f, q, k, p, p + o) - _score(f, q, k, 0, o))
                    .abs().sum(),
                    "that is the sum over the heads; the gap is the largest change (.max())."),
            Mistake(lambda f, q, k, p, o: (((f(q, p) * k).sum(-1) - (f(q, 0) * k).sum(-1))
                                           .abs().max()),
                    "the key needs its position too: encode both q (at p, then 0) and k (at "
                    "p + offset, then offset)."),
            Mistake(lambda f, q, k, p, o: (f(q, p) - f(q, 0)).abs().max(),
                    "compare the scores (dot products of query and key), not the encoded "
                    "vectors: RoPE moves each vector, yet their dot product stays the same."),
        ],
    )
