"""Checkers for notebook 07: RoPE itself, RoPE's split halves to interleaved, ALiBi's bias."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import masked_softmax
from ..positional import alibi_slopes, apply_rope
from .core import CheckResult, Mistake, Refused, check_function, seeded, size
from .workflow import exercise


def _angles(x: torch.Tensor, positions: torch.Tensor, exponent=lambda i: 2 * i) -> torch.Tensor:
    """``(n, d/2)`` float64: ``positions[j] * 10000^(-exponent(i) / d)``, right for ``2i``."""
    i = torch.arange(x.shape[-1] // 2, dtype=torch.float64)                        # pair index
    return positions.double()[:, None] * 10000.0 ** (-exponent(i) / x.shape[-1])


def _turn(x, angles, *, halves=False, swap=False, back_as_halves=False) -> torch.Tensor:
    """Each pair of ``x (..., n, d)`` turned by ``angles (n, d/2)``; the flags plant mistakes."""
    d = x.shape[-1]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    cos, sin = (sin, cos) if swap else (cos, sin)
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos - b * sin, a * sin + b * cos                           # (..., n, d/2)
    if halves or back_as_halves:
        return torch.cat([first, second], -1)
    return torch.stack([first, second], -1).flatten(-2)


def _repeated(x, positions) -> torch.Tensor:
    """Hugging Face's x cos + (-x[2i+1], x[2i]) sin, its angles laid out by .repeat, as split halves."""
    angles = _angles(x, positions).repeat(1, 2)                             # (n, d): all d/2, twice
    turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * angles.cos().to(x.dtype) + turned * angles.sin().to(x.dtype)


rope_reference = apply_rope  # x (..., n, d), positions (n,): pair i of row j turned by positions[j] w_i


def _rope_cases() -> list[dict]:
    """Float32 and float64; one pair, d/2 odd, batch and head dimensions; positions from 0, a KV
    cache's later positions, gaps; a random case; last, positions up to 99 999 (float32 angles fail)."""
    g = seeded(73)
    n, half = size(g, 2, 8), size(g, 1, 8)
    shapes = [((6, 8), torch.float32, torch.arange(6)), ((5, 2), torch.float64, torch.arange(5)),
              ((2, 3, 7, 16), torch.float32, torch.arange(7)),
              ((4, 8), torch.float64, torch.arange(4) + 9),          # a cache: positions 9 .. 12
              ((3, 6), torch.float64, torch.tensor([0, 2, 5])),
              ((5, 64), torch.float32, torch.tensor([0, 1, 17, 60, 100])),
              ((2, n, 2 * half), torch.float64, torch.randperm(50, generator=g)[:n].sort().values),
              ((4, 64), torch.float32, torch.tensor([0, 1000, 50_000, 99_999]))]
    return [{"x": torch.randn(shape, generator=g, dtype=dtype), "positions": positions}
            for shape, dtype, positions in shapes]


_SIGNS = "Check the signs of Rot(theta) in section 4: position m turns a pair counterclockwise."
ROPE_MISTAKES = [Mistake(produce, hint) for produce, hint in [
    (lambda x, p: _turn(x, _angles(x, p), halves=True),
     "you paired dimension i with i + d/2 (GPT-NeoX's layout, Hugging Face's rotate_half). This "
     "course pairs neighbours, (x[2i], x[2i+1]), as RoFormer and apply_rope do (exercise 2)."),
    (lambda x, p: _turn(x, _angles(x, p, lambda i: i)),
     "pair i turns at 10000^(-i/d): the exponent is -2i/d, with i = 0 .. d/2 - 1 the pair's index."),
    (lambda x, p: _turn(x, _angles(x, p, lambda i: 2 * i + 1)), "your exponent is -(2i+1)/d: pair "
     "i's frequency uses 2i, its first (even) dimension: omega_i = 10000^(-2i/d), omega_0 = 1."),
    (lambda x, p: _turn(x, _angles(x, p, lambda i: 4 * i)),
     "your exponent is -4i/d, twice too large: if your i already runs over 0, 2, 4, ..., it holds 2i."),
    (lambda x, p: _turn(x, -_angles(x, p)),
     "you rotated by -m omega_i, that is R(m)^T: the scores depend on m - n instead of n - m, so a "
     "model trained with apply_rope would read a key 3 back as 3 ahead. " + _SIGNS),
    (lambda x, p: _turn(x, _angles(x, p + 1)), "your positions start at 1: the token at position "
     "0 must come out unchanged (angle 0). Rotate by the positions you are given."),
    (lambda x, p: _turn(x, _angles(x, p - 1)),
     "your positions are one too small: rotate by the positions you are given."),
    (lambda x, p: _turn(x, _angles(x, torch.arange(x.shape[-2]))), "you rotated by 0 .. n-1 and "
     "ignored positions: with a KV cache the new tokens sit at later positions (this case's)."),
    (lambda x, p: _turn(x, _angles(x, p, lambda i: 0 * i)),
     "every pair turned by m: pair i turns by m omega_i, slower for larger i."),
    (lambda x, p: _turn(x, _angles(x, p).flip(-1)),
     "the frequencies run the wrong way: pair 0 turns fastest (omega_0 = 1)."),
    (lambda x, p: _turn(x, _angles(x, p), swap=True),
     "cos and sin are swapped: at position 0 (angle 0) a pair must come out unchanged. " + _SIGNS),
    (_repeated, "you laid the angles out with .repeat, [a_0, a_1, .., a_0, a_1, ..], the split-halves "
     "order: interleaved pairs need each angle twice in place, [a_0, a_0, a_1, a_1, ..], as "
     "repeat_interleave(2, dim=-1) gives."),
    (lambda x, p: _turn(x, _angles(x, p), back_as_halves=True),
     "your rotated pairs came back as two halves: each pair must stay in place, at 2i and 2i+1."),
    (lambda x, p: x + torch.stack([_angles(x, p).sin(), _angles(x, p).cos()], -1).flatten(-2).to(
        x.dtype), "you added the sinusoidal encoding to x: RoPE rotates each pair instead, so no "
                  "length changes and every score depends on n - m only."),
]]


FAR_HINT = ("right up to position 100, wrong far out: in float32 an angle near 99 999 is off by up to "
            "0.004 rad. Compute omega and the angles in float64, then cast cos and sin to x's dtype.")


def _rope_property_hint(rope: Callable) -> str | None:
    """The first property of RoPE a wrong answer breaks, on one query and key (d = 8), positions < 12."""
    q, k = torch.randn(2, 1, 8, generator=seeded(74), dtype=torch.float64)
    try:
        at_zero = torch.as_tensor(rope(q.clone(), torch.tensor([0]))).double()
        q_at, k_at = (torch.as_tensor(rope(v.expand(12, 8).clone(), torch.arange(12))).double()
                      for v in (q, k))
    except Exception:  # noqa: BLE001 - the checker's verdict already names what went wrong
        return None
    if at_zero.shape != q.shape or not q_at.shape == k_at.shape == (12, 8):
        return None
    scores = q_at @ k_at.T                                                    # (12, 12): [m, n]
    (a, b), (a2, b2) = q.view(4, 2).T, q_at[1].view(4, 2).T                  # each (4,): pairs
    turn = torch.atan2(a * b2 - b * a2, a * a2 + b * b2)      # each pair's turn from position 0 to 1
    omega = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    broken = [
        (not torch.allclose(at_zero, q, atol=1e-6),
         "at position 0 the angle is 0, so RoPE leaves x unchanged there; yours changes it."),
        (not torch.allclose(q_at.view(12, 4, 2).norm(dim=-1), q.view(4, 2).norm(dim=-1), atol=1e-6),
         "RoPE only turns each pair (x[2i], x[2i+1]): every pair keeps its length; yours changes it."),
        ((scores[1:, 1:] - scores[:-1, :-1]).abs().max() > 1e-6,
         "your scores rope(q, m) . rope(k, n) change when m and n move together: a rotation by "
         "angles proportional to the position makes them depend on n - m only.")]
    wrong = ((turn - omega).abs() > 1e-3).nonzero().flatten().tolist()
    if wrong:
        i = wrong[0]
        broken.append((True, f"your rotation keeps lengths and is relative, but its angles are off. "
                             f"With d = 8, from position 0 to 1 pair {i} turned by {turn[i]:.3f} rad "
                             f"instead of omega_{i} = 10000^(-{2 * i}/8) = {omega[i]:.3f}. Check "
                             "omega_i: d is x's last dimension, the base is 10000, and the positions "
                             "are used as given, not rescaled."))
    return next((hint for wrong, hint in broken if wrong), None)


@exercise("positional_encoding.rope", "rotary position embedding: turning each pair by its angle",
          hints=(
    "Each pair (x[2i], x[2i+1]) is a point in the plane. At position m it turns by the angle "
    "m omega_i: which 2x2 matrix turns a point by an angle, and how do you apply it to every pair "
    "at every position at once?",
    "Take the first and second members of all pairs apart with strided slices, each (..., n, d/2). "
    "A table of angles (n, d/2), one row per position, broadcasts against both. Apply section 4's "
    "Rot entrywise, then put each pair back at 2i, 2i+1 (not as two halves).",
    "d = x.shape[-1]\n"
    "omega = ...                                    # (d/2,) float64: omega_i = 10000^(-2i/d)\n"
    "angles = ...                                   # (n, d/2): positions[j] * omega_i\n"
    "cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
    "even, odd = x[..., 0::2], x[..., 1::2]         # (..., n, d/2): x[2i], x[2i+1]\n"
    "rotated = torch.stack((..., ...), dim=-1)      # (..., n, d/2, 2): each pair turned\n"
    "return rotated.flatten(-2)                     # (..., n, d): pairs back at 2i, 2i+1"))
def check_rope(rope: Callable) -> CheckResult:
    """Exercise: ``rope(x (..., n, d), positions (n,)) -> (..., n, d)``, x's dtype, RoPE's rotation."""
    def check(cases):
        return check_function(rope, rope_reference, cases, what="rope", output_names=("the rotated x",),
                              atol=1e-4, rtol=1e-4, same_dtype=True, mistakes=ROPE_MISTAKES)
    verdict = check(cases := _rope_cases())
    if verdict or "Hint:" in verdict.message or not verdict.message.startswith("Not yet"):
        return verdict
    hint = FAR_HINT if check(cases[:-1]) else _rope_property_hint(rope)
    return CheckResult(False, f"{verdict.message}\nHint: {hint}") if hint else verdict


def _move(W: torch.Tensor, heads: int, *, inverse=False, swap=False, reverse=False,
          head_minor=False, columns=False, negate=False) -> torch.Tensor:
    """Exercise 2's move of ``W``'s ``heads`` blocks, with one named mistake (defaults: the answer)."""
    d, block = W.shape[0] // heads, torch.arange(heads)
    i = torch.arange(d // 2).flip(0) if reverse else torch.arange(d // 2)
    index = torch.stack([i + d // 2, i] if swap else [i, i + d // 2], -1).flatten()  # (d,)
    index = index.argsort() if inverse else index
    full = (index[:, None] * heads + block) if head_minor else (block[:, None] * d + index)
    moved = W[:, full.flatten()] if columns else W[full.flatten()]   # (rows,): over all the heads
    if negate:                                                         # every second row's sign
        moved = moved * torch.tensor([1.0, -1.0], dtype=W.dtype).repeat(len(W) // 2)[:, None]
    return moved


def _layout_cases() -> list[dict]:
    """One head, g = h, g < h, g = 1; d_head = 2, 4 (its own inverse) and more; float32; random."""
    gen = seeded(71)
    g = size(gen, 1, 3)
    h, d_head, d_in = g * size(gen, 1, 3), 2 * size(gen, 1, 8), size(gen, 1, 40)
    return [{"W_Q": torch.randn(h * d_head, d_in, generator=gen, dtype=dtype),
             "W_K": torch.randn(g * d_head, d_in, generator=gen, dtype=dtype), "h": h, "g": g}
            for h, g, d_head, d_in, dtype in [
                (1, 1, 8, 8, torch.float64), (4, 4, 6, 24, torch.float64), (4, 2, 8, 20, torch.float64),
                (3, 1, 4, 10, torch.float64), (2, 2, 2, 5, torch.float64), (8, 2, 16, 48, torch.float32),
                (h, g, d_head, d_in, torch.float64)]]


def _half_of_each_head(W: torch.Tensor, heads: int) -> torch.Tensor:
    """Partial RoPE: each head's first d/2 rows moved as a head of their own, the rest left."""
    blocks = W.reshape(heads, W.shape[0] // heads, -1).clone()                # (heads, d, d_in)
    half = blocks.shape[1] // 2
    blocks[:, :half] = _move(blocks[:, :half].reshape(heads * half, -1), heads).view(heads, half, -1)
    return blocks.reshape(W.shape)


def to_interleaved_reference(W_Q, W_K, h, g, **flaw):
    """``h`` query, ``g`` key heads: split-half pairs to interleaved; ``flaw``: a _move mistake."""
    return _move(W_Q, h, **flaw), _move(W_K, g, **flaw)


def _both(**flaw) -> Callable:
    return lambda *args: to_interleaved_reference(*args, **flaw)


_BACKWARDS = ("mirrors the pair, and a mirrored rotation turns the other way: the key delta back "
              "scores as the key delta ahead did.")
_COUNTS = ("you cut one weight into the other's number of heads: W_Q holds h query heads, W_K g "
           "key/value heads (grouped-query attention, notebook 04).")
_SIGN = ("you changed the sign of a whole weight: rows only move. -W_K alone flips every score; "
         "-W_Q with -W_K keeps them, yet the weights differ.")
LAYOUT_MISTAKES = [Mistake(produce, hint) for produce, hint in [
    (lambda W_Q, W_K, h, g: (W_Q.clone(), W_K.clone()), "nothing moved: the weights run under "
     "apply_rope without an error, but each number gets a wrong partner, most a wrong frequency."),
    (_both(inverse=True), "your reordering is the inverse of the right one: it turns an interleaved "
                          "head into a split-half one. W[index] puts old row index[r] at new row r."),
    (_both(swap=True), f"each pair's two members are swapped: that {_BACKWARDS}"),
    (_both(negate=True), f"you negated one member of each pair: rows only move. A sign flip "
                         f"{_BACKWARDS}"),
    (_both(columns=True), "you moved the columns, the input features RoPE never touches: "
                          "nn.Linear computes x @ W.T, so RoPE's pairs come from the rows."),
    (lambda W_Q, W_K, h, g: (_move(W_Q, h), W_K.clone()),
     "W_K' is W_K unchanged: keys are rotated like queries, so k_proj needs the same move."),
    (lambda W_Q, W_K, h, g: (_move(W_Q, 1), _move(W_K, 1)),
     "you reordered all the rows as one head: the move happens inside each head's block of rows."),
    (_both(head_minor=True), "you read the rows as (d_head, heads): nn.Linear's rows are head after "
                             "head."),
    (_both(reverse=True), "your pairs are in reverse order: split-half pair i landed on interleaved "
                          "pair d/2 - 1 - i, another frequency."),
    (lambda W_Q, W_K, h, g: (_move(W_Q, h), _move(W_K, h)), _COUNTS),
    (lambda W_Q, W_K, h, g: (_move(W_Q, g), _move(W_K, g)), _COUNTS),
    (lambda W_Q, W_K, h, g: (_move(W_Q, h), -_move(W_K, g)), _SIGN),
    (lambda W_Q, W_K, h, g: (-_move(W_Q, h), -_move(W_K, g)), _SIGN),
    (lambda W_Q, W_K, h, g: (_half_of_each_head(W_Q, h), _half_of_each_head(W_K, g)),
     "you moved only the first half of each head, as if only it were rotated (GPT-NeoX rotates "
     "part of each head). These weights were trained rotating all of it: every pair moves."),
    (lambda W_Q, W_K, h, g: to_interleaved_reference(W_Q, W_K, h, g)[::-1],
     "you returned (W_K', W_Q'): the weights come back in the order they went in, W_Q' first."),
]]


@exercise("positional_encoding.rope_layout", "loading weights trained with RoPE's other layout",
          hints=(
    "Reordering the rows of W_Q and W_K alike leaves dot products alone; the rotation cares which "
    "two numbers form a pair, at which omega_i, in which order. For each row of an interleaved "
    "head, which row of the split-half head holds its number?",
    "Work head by head: W_Q is h blocks of d_head rows, W_K g blocks. In a block, new rows = "
    "old_rows[index]. Its inverse reorders the other way (they agree for d_head = 4, not for 8: "
    "check yours by hand), and swapping a pair's members turns the rotation backwards.",
    "def convert(W, heads):                      # one weight: heads blocks of d_head rows\n"
    "    d_head = ...                            # rows per head\n"
    "    index = ...                             # (d_head,) long: new row r copies old row index[r]\n"
    "    blocks = W.view(heads, d_head, -1)      # (heads, d_head, d_in): head after head\n"
    "    return blocks[:, index].reshape(W.shape)\n"
    "return convert(W_Q, h), convert(W_K, g)"))
def check_rope_layout(to_interleaved: Callable) -> CheckResult:
    """Exercise: ``to_interleaved(W_Q, W_K, h, g) -> (W_Q', W_K')``, compared exactly."""
    return check_function(to_interleaved, to_interleaved_reference, _layout_cases(),
                          what="to_interleaved", output_names=("W_Q'", "W_K'"), atol=1e-12, rtol=0.0,
                          same_dtype=True, mistakes=LAYOUT_MISTAKES)


def alibi_bias_reference(n_queries: int, n_keys: int, slopes: torch.Tensor) -> torch.Tensor:
    """``(H, n_queries, n_keys)`` float64: ALiBi's ``-m_h (i - j)``, keys at ``j = 0 .. n_keys - 1``,
    queries the last ``n_queries`` positions ``i`` (a KV cache: the new tokens come last)."""
    i = torch.arange(n_keys - n_queries, n_keys, dtype=torch.float64)
    return -slopes.double()[:, None, None] * (i[:, None] - torch.arange(n_keys))


def _through_softmax(bias_of: Callable) -> Callable:
    """The causal softmax weights of ``scores + bias_of(...)``: any per-row number passes."""
    def weights(n_queries, n_keys, slopes, scores):
        bias = bias_of(n_queries, n_keys, slopes)
        if isinstance(bias, torch.Tensor) and (bias.dim() != 3 or len(bias) != len(slopes)):
            raise Refused(f"alibi_bias returned shape {tuple(bias.shape)} for {len(slopes)} heads: "
                          "return (H, n_queries, n_keys), one grid per head (a size-1 axis that "
                          "broadcasts, as in Bloom's (H, 1, n_keys), passes too).")
        try:
            total = scores + bias
        except (TypeError, RuntimeError):
            return bias                          # check_function names what is wrong with it
        seen = torch.arange(n_keys) <= torch.arange(n_keys - n_queries, n_keys)[:, None]  # j <= i
        return masked_softmax(total, seen) if total.shape == scores.shape else bias
    return weights


_OWN_SLOPE = ": head h multiplies the distance by its own slope, slopes[h]."


def _slopes(wrong: Callable) -> Callable:  # the bias with wrong(slopes) in place of the slopes
    return lambda q, n, m: alibi_bias_reference(q, n, wrong(m))


ALIBI_MISTAKES = [   # (the bias a mistake returns, its hint)
    (lambda q, n, m: -alibi_bias_reference(q, n, m), "your bias rewards distance: farther keys get more "
     "weight. +m_h (i - j) and -m_h j differ by m_h i, one number per row, so softmax gives both "
     "these weights. ALiBi's bias falls as the key moves back: -m_h (i - j)."),
    (lambda q, n, m: torch.zeros(len(m), 1, 1, dtype=torch.float64), "your bias is the same along "
     "each row (0, or a function of i): softmax ignores it, so these are the weights without ALiBi."),
    (_slopes(torch.ones_like), "every head got slope 1" + _OWN_SLOPE),
    (_slopes(lambda m: m[:1].expand_as(m)), "every head got slopes[0]" + _OWN_SLOPE),
    (_slopes(lambda m: m.flip(0)), "your slopes run backwards" + _OWN_SLOPE),
    (_slopes(lambda m: 0.5 ** torch.arange(1.0, len(m) + 1)), "your slopes are 1/2, 1/4, ..., the rule "
     "for 8 heads: use the slopes you are given" + _OWN_SLOPE),
    (lambda q, n, m: alibi_bias_reference(n, n, m), "you built all n_keys rows: with a cache only the "
     "last n_queries positions are new queries; the earlier rows were computed at earlier steps."),
    (lambda q, n, m: alibi_bias_reference(q, q, m), "your keys stop at n_queries: the new queries also "
     "see every cached key, positions 0 .. n_keys - 1."),
]


@exercise("positional_encoding.alibi_bias", "ALiBi's bias under a KV cache, anchored anywhere along a "
          "row", hints=(
    "Which keys should head h favour, and by how much less per step back? The penalty grows with "
    "the distance i - j, at the head's own rate. With a cache, the new queries sit at the last "
    "n_queries positions; the keys run over every position so far.",
    "Build the distances i - j as an (n_queries, n_keys) grid: a column of query positions minus a "
    "row of key positions. Give each head its slope by broadcasting slopes to (H, 1, 1).",
    "i = torch.arange(n_keys - n_queries, n_keys, dtype=torch.float64)   # the new queries' positions\n"
    "j = torch.arange(n_keys, dtype=torch.float64)                        # every key's position\n"
    "distance = ...                # (n_queries, n_keys): i - j, query i down, key j across\n"
    "m = ...                       # (H, 1, 1): head h's slope\n"
    "return -m * distance          # (H, n_queries, n_keys)"))
def check_alibi_bias(alibi_bias: Callable) -> CheckResult:
    """``alibi_bias(n_queries, n_keys, slopes (H,)) -> (H, n_queries, n_keys)``, via a causal softmax."""
    g = seeded(72)
    cases = [{"n_queries": q, "n_keys": n, "slopes": alibi_slopes(h),
              "scores": torch.randn(h, q, n, generator=g, dtype=torch.float64)}
             for q, n, h in ((5, 5, 8), (1, 7, 6), (3, 9, 12), (4, 4, 5), (2, 6, 1), (9, 9, 3))]
    verdict = check_function(_through_softmax(alibi_bias), _through_softmax(alibi_bias_reference),
                             cases, what="alibi_bias", output_names=("softmax(S + your bias)",),
                             mistakes=[Mistake(_through_softmax(p), hint) for p, hint in ALIBI_MISTAKES])
    if not verdict:
        return verdict
    q, n, m = 2, 6, alibi_slopes(4)
    c = (alibi_bias(q, n, m.clone()).double() - alibi_bias_reference(q, n, m))[..., 0]   # (H, q): c_i
    anchors = {"0 (the paper's form)": 0 * c,
               "m_h i (Bloom's m_h j)": m[:, None] * torch.arange(n - q, n),
               "m_h (n_keys - n_queries), as your queries count from 0": m[:, None] * (n - q) + 0 * c}
    anchor = next((name for name, v in anchors.items() if torch.allclose(c, v, atol=1e-5)), "c_i")
    return CheckResult(True, f"{verdict.message}\nYour bias is -m_h (i - j) + {anchor}, one number "
                             "per row i. softmax(s + c) = softmax(s), so every such anchor gives "
                             "ALiBi's weights. A number per column would not.")
