r"""Checkers for notebook 07 (positional encoding).

* ``positional_encoding.sinusoidal``: :func:`check_sinusoidal`, the sinusoidal table
  :math:`PE_{p,2i} = \sin(p\,\omega_i)`, :math:`PE_{p,2i+1} = \cos(p\,\omega_i)`,
  :math:`\omega_i = 10000^{-2i/d}`.
* ``positional_encoding.rope``: :func:`check_rope`, RoPE in a decoding step with a KV cache
  (``rope_step(q, k, t)``): ``q, k (b, h, n, d)`` hold ``n`` new tokens at positions
  ``t .. t + n - 1``; each pair :math:`(x_{2i}, x_{2i+1})` of the token at position :math:`m` is
  rotated by :math:`m\,\omega_i`. The checker also checks that the new tokens' scores among
  themselves do not depend on ``t`` (only on the offsets).
* ``positional_encoding.alibi``: :func:`check_alibi`, the causal ALiBi bias of section 5:
  ``-m_h (i - j)`` for ``j <= i``, ``-inf`` above, slopes ``m_h = 2^(-8h/H)`` for ``h = 1 .. H``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import positional as _positional
from ..lessons import rope as _rope
from ..positional import apply_rope, sinusoidal_encoding
from .core import CheckResult, Mistake, check_function, seeded
from .positional_mistakes import _alibi
from .workflow import exercise

__all__ = ["ALIBI_FORBID", "FORBID", "alibi_reference", "check_alibi", "check_rope",
           "check_sinusoidal", "rope_reference", "rope_step_reference"]

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
    "omega = ...                       # (d/2,): omega_i = 10000^(-2i/d), float64\n"
    "angles = p * omega                                                    # (n, d/2)\n"
    "return ...                        # (n, d) float32: sin and cos interleaved, sin at 2i"))
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
    "angles = ...                      # (n, d/2): the new tokens' positions times omega\n"
    "cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)\n"
    "def turn(x):\n"
    "    even, odd = x[..., 0::2], x[..., 1::2]                               # (b, h, n, d/2)\n"
    "    return ...                    # (b, h, n, d): the pairs rotated, interleaved back\n"
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
    "m_h = 2^(-8h/H) for h = 1 .. H (head h sits at index h - 1); bias[h - 1, i, j] = -m_h (i - j) "
    "for j <= i, and -inf for j > i. Shapes: slopes (H, 1, 1) times distances (n, n).",
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
