r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the sinusoidal table
  :math:`PE_{p,2i} = \sin(p\,\omega_i)`, :math:`PE_{p,2i+1} = \cos(p\,\omega_i)`,
  :math:`\omega_i = 10000^{-2i/d}`.
* ``positional_encoding.rope``: :func:`check_rope`, RoPE in a decoding step with a KV cache
  (``rope_step(q, k, t)``): ``q, k (b, h, n, d)`` hold ``n`` new tokens at positions
  ``t .. t + n - 1``; each pair :math:`(x_{2i}, x_{2i+1})` of the token at position :math:`m` is
  rotated by :math:`m\,\omega_i`. The checker also checks that the new tokens' scores among
  themselves do not depend on ``t`` (only on the offsets).
* ``positional_encoding.relative_gap``: :func:`check_relative_gap`, the relative-position check:
  does the score of a query at ``p`` and a key at ``p + offset`` equal the score at ``0`` and
  ``offset``?
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import positional as _positional
from ..lessons import rope as _rope
from ..positional import apply_rope, frequencies, sinusoidal_encoding
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["FORBID", "PositionScheme", "SCHEMES", "check_relative_gap", "check_rope",
           "check_sinusoidal", "relative_gap_reference", "rope_reference", "rope_step_reference"]

#: The package functions that would do exercises 1 and 2 for the learner: calling one (under any
#: name, imported into the notebook too) while the learner's function runs fails the check.
FORBID = [(_positional, name) for name in (
    "sinusoidal_encoding", "apply_rope", "frequencies", "_omega", "pair_rotation",
    "SinusoidalPositionalEncoding", "RotaryEmbedding") if hasattr(_positional, name)] + [
    (_rope, name) for name in ("apply_rope_half", "position_scores") if hasattr(_rope, name)]


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

    if sinusoidal is sinusoidal_encoding:
        return _handed_in("sinusoidal", "sinusoidal_encoding")
    return check_function(
        sinusoidal, sinusoidal_encoding, cases, what="sinusoidal", output_names=("PE",),
        forbid=FORBID, mistakes=[
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


def _handed_in(what: str, label: str) -> CheckResult:
    return CheckResult(False, f"Not yet: {what} is the package's {label}, which does this exercise "
                              "for you. Write the steps yourself; the checker blocks it here.")


# --- exercise 2: RoPE in a decoding step -----------------------------------------------------


def rope_reference(x: torch.Tensor, p: int) -> torch.Tensor:
    """``x (..., d)`` rotated as if it stood at position ``p``: pair ``(x[2i], x[2i+1])`` turned
    by ``p * omega_i`` (:func:`attn_helpers.positional.apply_rope` on one position)."""
    return apply_rope(x[..., None, :], torch.tensor([p]))[..., 0, :]


def rope_step_reference(q: torch.Tensor, k: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k (b, h, n, d)``: ``n`` new tokens at positions ``t .. t + n - 1`` (a decoding step
    after ``t`` cached tokens), each rotated by its own position; returns ``(q', k')``."""
    positions = t + torch.arange(q.shape[-2])
    return apply_rope(q, positions), apply_rope(k, positions)


def _rope_cases() -> list[dict]:
    g = seeded(71)
    shapes = [((1, 1, 1, 8), 5, torch.float32), ((2, 3, 4, 2), 3, torch.float32),
              ((1, 2, 5, 16), 11, torch.float64), ((2, 1, 3, 8), 1000, torch.float64),
              ((1, 2, 6, 6), 0, torch.float32)]
    b, h, n, half, t = _sizes(g, 5, high=6)
    shapes.append(((b, h, n, 2 * half), 10 * t, torch.float32))  # random shapes
    return [{"q": torch.randn(*shape, generator=g).to(dtype),
             "k": torch.randn(*shape, generator=g).to(dtype), "t": t} for shape, t, dtype in shapes]


def _step(q, k, t, **kw):
    """The step with one thing changed, for the known mistakes (``shift`` moves the positions,
    ``axis`` is the axis read as the positions)."""
    shift, axis, only_q = kw.pop("shift", 0), kw.pop("axis", -2), kw.pop("only_q", False)

    def one(x):
        n = x.shape[axis]
        angles_at = (t + shift + torch.arange(n)).view(-1, *([1] * (-axis - 2)))  # along axis
        return _rotate_at(x, angles_at, **kw)
    return one(q), (k if only_q else one(k))


def _rotate_at(x, positions, *, sign=1.0, exponents=None, halves=False, interleave=True):
    """RoPE with per-token ``positions`` (broadcast against ``x[..., :1]``), one thing changeable."""
    d = x.shape[-1]
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d if exponents is None else exponents
    angles = sign * positions.to(torch.float64)[..., None] * 10000.0 ** (-exponents)  # (..., d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos - b * sin, a * sin + b * cos  # (..., d/2) each
    if halves or not interleave:
        return torch.cat([first, second], -1)
    return torch.stack([first, second], -1).flatten(-2)


def _offsets_only(candidate: Callable) -> CheckResult | None:
    """The new tokens' scores among themselves must not change when the whole step moves."""
    g = seeded(74)
    q, k = torch.randn(2, 1, 2, 5, 8, generator=g, dtype=torch.float64)
    try:
        with torch.no_grad():
            at_0, at_t = candidate(q.clone(), k.clone(), 0), candidate(q.clone(), k.clone(), 37)
    except Exception:  # noqa: BLE001 - the main check already reported it
        return None
    scores = [a[0] @ a[1].transpose(-1, -2) for a in (at_0, at_t)]
    gap = (scores[1] - scores[0]).abs().max().item()
    if gap > 1e-8:
        return CheckResult(False, f"Not yet: moving the whole step from t = 0 to t = 37 changed the "
                                  f"new tokens' scores among themselves by {gap:.2g}; with RoPE they "
                                  "depend only on the offsets between the tokens.")
    return None


@exercise("positional_encoding.rope", "RoPE in a decoding step (positions from t)", hints=(
    "In a decoding step with a KV cache, t tokens are already cached, so the n new tokens stand at "
    "positions t, t + 1, ..., t + n - 1: token m of the step is rotated by (t + m) omega_i, along "
    "the n axis (dim -2), the same for every batch entry and head.",
    "positions = t + torch.arange(n) (n,); omega_i = 10000^(-2i/d); angles = positions[:, None] * "
    "omega (n, d/2) broadcasts against q[..., 0::2] (b, h, n, d/2). x'[2i] = x[2i] cos - x[2i+1] "
    "sin, x'[2i+1] = x[2i] sin + x[2i+1] cos; rotate q and k alike.",
    "d, n = q.shape[-1], q.shape[-2]\n"
    "omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)       # (d/2,)\n"
    "angles = (t + torch.arange(n, dtype=torch.float64))[:, None] * omega       # (n, d/2)\n"
    "cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)\n"
    "def turn(x):\n"
    "    even, odd = x[..., 0::2], x[..., 1::2]                               # (b, h, n, d/2)\n"
    "    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)\n"
    "return turn(q), turn(k)"))
def check_rope(rope_step: Callable) -> CheckResult:
    """Exercise: ``rope_step(q (b, h, n, d), k (b, h, n, d), t: int) -> (q', k')``, RoPE for the
    ``n`` new tokens of a decoding step, at positions ``t .. t + n - 1`` (interleaved pairs,
    ``omega_i = 10000^(-2i/d)``); the new tokens' scores among themselves depend on offsets only."""
    if rope_step is rope_step_reference:
        return _handed_in("rope_step", "rope_step_reference")
    result = check_function(
        rope_step, rope_step_reference, _rope_cases(), what="rope_step",
        output_names=("the rotated queries", "the rotated keys"), forbid=FORBID,
        mistakes=[
            Mistake(lambda q, k, t: _step(q, k, t, shift=-t),
                    "you started the positions at 0: after t cached tokens the new ones stand at "
                    "t, t + 1, ..., so their scores against the cached keys would be wrong."),
            Mistake(lambda q, k, t: _step(q, k, t, sign=-1.0),
                    "you turned the pairs the wrong way (by -m omega_i): x'[2i] = x[2i] cos - "
                    "x[2i+1] sin, x'[2i+1] = x[2i] sin + x[2i+1] cos."),
            Mistake(lambda q, k, t: _step(q, k, t, halves=True),
                    "you paired dimension i with i + d/2 (the split-halves layout of GPT-NeoX and "
                    "LLaMA's Hugging Face code); here the pairs are neighbours (x[2i], x[2i+1])."),
            Mistake(lambda q, k, t: _step(q, k, t, interleave=False),
                    "the rotated pairs were not put back in place: you returned all first "
                    "components, then all second ones. x'[2i] and x'[2i+1] stay side by side."),
            Mistake(lambda q, k, t: _step(q, k, t, exponents=torch.arange(q.shape[-1] // 2)
                                          / q.shape[-1]),
                    "the frequency of pair i is 10000^(-2i/d), not 10000^(-i/d)."),
            Mistake(lambda q, k, t: _step(q, k, t, shift=1),
                    "off by one: the first new token stands at position t (t tokens are cached at "
                    "0 .. t - 1), not t + 1."),
            Mistake(lambda q, k, t: _step(q, k, t, axis=-3),
                    "you took the positions along the heads axis (dim -3): the tokens run along "
                    "dim -2 of (b, h, n, d); every head sees the same positions."),
            Mistake(lambda q, k, t: _step(q, k, t, only_q=True),
                    "you rotated the queries only: the keys need their positions too, or the "
                    "scores depend on the absolute position, not on the offset."),
            Mistake(lambda q, k, t: _step(q, k, t, exponents=torch.arange(0, q.shape[-1], 2).flip(0)
                                          / q.shape[-1]),
                    "the frequencies run the wrong way: pair 0 turns fastest (omega_0 = 1), the "
                    "last pair slowest."),
        ],
    )
    if result or "not implemented" in result.message or "blocks it" in result.message:
        return result
    extra = _offsets_only(rope_step)  # the property RoPE is for, checked on its own
    if extra is None:
        return result
    return CheckResult(False, f"{result.message} Also: {extra.message.removeprefix('Not yet: ')}")


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
