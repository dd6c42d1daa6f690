r"""Why RoPE rotates *after* the projection, and its two layouts (notebook 07).

**The motivation.** With a position vector added to the input, the position part of a score is
:math:`(W_Q PE_p)\cdot(W_K PE_q) = PE_p^\top A\, PE_q` with :math:`A = W_Q^\top W_K`. Moving a
position is a rotation, :math:`PE_q = R(q) PE_0`, so the score is
:math:`PE_0^\top R(p)^\top A R(q) PE_0`, a function of :math:`q - p` only when ``A`` commutes with
every :math:`R(k)` (per sin/cos pair a multiple of a rotation). A learned ``A`` does not, so the
score depends on where the pair stands, not only on how far apart it is. RoPE (Su et al., 2021)
projects first and rotates the projected query and key: :math:`(R(p) W_Q x)\cdot(R(q) W_K y) =
x^\top W_Q^\top R(q - p) W_K y`, a function of :math:`q - p` for *any* ``W_Q``, ``W_K``.
:func:`position_scores` computes both; :func:`diagonal_spread` measures how far a score grid is from
depending on ``q - p`` only.

**The two layouts.** RoFormer (and :func:`attn_helpers.positional.apply_rope`) rotates the
interleaved pairs ``(x[2i], x[2i+1])``. GPT-NeoX, and Llama in Hugging Face ``transformers``
(``rotate_half``), rotate the split halves ``(x[i], x[i + d/2])`` with the same frequencies
(:func:`apply_rope_half`). They are the same operation up to the permutation
:func:`interleaved_to_half` of each head's feature dimensions; permuting the rows of ``W_Q`` and
``W_K`` by it (:func:`permute_rows`, per head) turns a model trained in one layout into the same
model in the other. Loading weights without it silently gives a different model (scores still
depend on the offset only, but each dimension is paired with the wrong partner and turned at the
wrong frequency). :func:`layer_scores` gives a layer's scores, per head, in either layout.

**Where RoPE breaks down.** :func:`wavelength` is the number of positions in which one pair turns
once; :func:`collapse_position` finds where an accuracy curve breaks down, and
:func:`collapse_slope` how fast that point moves with RoPE's base (a power law on log-log axes).
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    require_int_in,
    require_min_dim,
    require_number,
    require_positive_int,
    require_tensor,
    shape,
)
from ..positional import apply_rope, frequencies, sinusoidal_encoding

__all__ = [
    "MODES",
    "random_projections",
    "commuting_projections",
    "position_scores",
    "head_projections",
    "projected_scores",
    "diagonal_spread",
    "apply_rope_half",
    "interleaved_to_half",
    "permute_rows",
    "layer_scores",
    "rope_claims",
    "wavelength",
    "collapse_position",
    "collapse_slope",
]

MODES = ("add, then project", "project, then rotate")


def _require_even(name: str, value: int) -> int:
    require_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (sin/cos pairs), got {value}")
    return value


def random_projections(d: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_Q, W_K)``, each ``(d, d)`` float64 with entries ``N(0, 1/d)``: a generic pair of
    projections, like an untrained (or trained) layer's."""
    _require_even("d", d)
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(d, d, generator=generator, dtype=torch.float64) / d ** 0.5
                 for _ in range(2))


def commuting_projections(d: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_Q, W_K) = (I, B)``, ``B`` block-diagonal with one ``[[a, -b], [b, a]]`` per sin/cos
    pair: ``A = W_Q^T W_K = B`` commutes with every rotation of the pairs, which is sufficient (not
    necessary) for scores of positions added before the projection to depend on ``q - p`` only."""
    _require_even("d", d)
    a, b = torch.randn(2, d // 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    blocks = [torch.tensor([[a_i, -b_i], [b_i, a_i]], dtype=torch.float64)
              for a_i, b_i in zip(a.tolist(), b.tolist(), strict=True)]
    return torch.eye(d, dtype=torch.float64), torch.block_diag(*blocks)


def position_scores(mode: str, W_Q: torch.Tensor, W_K: torch.Tensor, x: torch.Tensor,
                    n: int) -> torch.Tensor:
    """``(n, n)`` scores ``S[p, q] = query_p . key_q`` of one token ``x`` placed at every position.

    * ``"add, then project"``: ``query_p = W_Q (x + PE_p)``, ``key_q = W_K (x + PE_q)``
      (sinusoidal ``PE``; ``x`` may be zero, leaving the position term alone);
    * ``"project, then rotate"`` (RoPE): ``query_p = R_p W_Q x``, ``key_q = R_q W_K x``.

    ``W_Q``, ``W_K`` are ``(d_out, d_in)`` (acting on column vectors, like an ``nn.Linear``'s
    weight), ``x`` is ``(d_in,)``; ``d_in`` must be even to add ``PE``, ``d_out`` to rotate.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    require_tensor("W_Q", W_Q, floating=True)
    require_tensor("W_K", W_K, floating=True)
    require_tensor("x", x, floating=True)
    if W_Q.dim() != 2 or W_K.shape != W_Q.shape or x.shape != W_Q.shape[1:]:
        raise ValueError(f"W_Q {shape(W_Q)}, W_K {shape(W_K)} and x {shape(x)} must be (d_out, d_in), "
                         "(d_out, d_in) and (d_in,)")
    d_out, d_in = W_Q.shape
    name, size = ("d_in", d_in) if mode == "add, then project" else ("d_out", d_out)
    if size % 2:
        raise ValueError(f"mode {mode!r} needs an even {name} (sin/cos pairs), got W_Q of shape "
                         f"{shape(W_Q)}")
    require_positive_int("n", n)
    X = x.expand(n, d_in)  # (n, d_in): the same token at positions 0..n-1
    if mode == "add, then project":
        X = X + sinusoidal_encoding(n, d_in, dtype=x.dtype)
        queries, keys = X @ W_Q.T, X @ W_K.T  # (n, d_out): W_Q (x + PE_p), W_K (x + PE_q)
    else:
        queries, keys = apply_rope(X @ W_Q.T), apply_rope(X @ W_K.T)  # (n, d_out): R_p W_Q x, ...
    return queries @ keys.T  # (n, n): S[p, q]


def head_projections(qkv_weight: torch.Tensor, num_heads: int,
                     head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_Q, W_K)`` of one head, each ``(d_head, d_model)`` float64, from a fused
    ``nn.Linear(d_model, 3 * d_model)`` weight ``(3 * d_model, d_model)`` (rows: Q, K, V heads)."""
    require_tensor("qkv_weight", qkv_weight, floating=True)
    require_positive_int("num_heads", num_heads)
    rows, d_model = qkv_weight.shape if qkv_weight.dim() == 2 else (0, 0)
    if rows != 3 * d_model or d_model % num_heads:
        raise ValueError(f"qkv_weight must be (3 * d_model, d_model) with d_model divisible by "
                         f"num_heads={num_heads}, got {shape(qkv_weight)}")
    require_int_in("head", head, 0, num_heads - 1)
    d_head = d_model // num_heads
    W = qkv_weight.detach().to(torch.float64)
    return W[head * d_head:(head + 1) * d_head], W[d_model + head * d_head:d_model + (head + 1) * d_head]


def projected_scores(mode: str, *, n: int = 24, d: int = 16, seed: int = 0) -> torch.Tensor:
    """:func:`position_scores` for the seeded :func:`random_projections` and a seeded token ``x``
    (``N(0, 1)`` entries): controls in, an ``(n, n)`` float64 grid out (for a widget)."""
    _require_even("d", d)
    W_Q, W_K = random_projections(d, seed=seed)
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return position_scores(mode, W_Q, W_K, x, n)


def diagonal_spread(scores: torch.Tensor) -> float:
    """``max_k (max - min)`` of ``scores`` along each diagonal ``q - p = k``: zero exactly when the
    square grid depends on ``q - p`` only."""
    require_tensor("scores", scores, floating=True)
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be a square (n, n) grid, got {shape(scores)}")
    n = scores.shape[0]
    diagonals = [scores.diagonal(k) for k in range(-(n - 1), n)]
    return max((line.max() - line.min()).item() for line in diagonals)


def apply_rope_half(x: torch.Tensor, positions: torch.Tensor | None = None, *,
                    base: float = 10000.0) -> torch.Tensor:
    """RoPE in the split-halves layout (GPT-NeoX; Hugging Face Llama's ``rotate_half``).

    Rotates each pair ``(x[i], x[i + d/2])`` by ``p * omega_i``, ``omega_i = base^(-2i/d)``:
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = (-x[d/2:], x[:d/2])``.
    ``x`` is ``(..., n, d)``, ``d`` even; ``positions`` ``(n,)``, default ``0..n-1``.
    """
    require_tensor("x", x, floating=True)
    require_min_dim("x", x, 2, "(..., n, d)")
    d = x.shape[-1]
    if d == 0 or d % 2:
        raise ValueError(f"the last dimension of x must be even (pairs), got shape {shape(x)}")
    if positions is None:
        positions = torch.arange(x.shape[-2])
    angles = positions.to(torch.float64)[..., None] * frequencies(d, base)  # (n, d/2): p omega_i
    cos, sin = (f(torch.cat([angles, angles], -1)).to(x.dtype) for f in (torch.cos, torch.sin))
    first, second = x[..., : d // 2], x[..., d // 2:]  # (..., n, d/2) each
    return x * cos + torch.cat([-second, first], -1) * sin  # (..., n, d)


def interleaved_to_half(d: int) -> torch.Tensor:
    """``(d,)`` index ``perm`` with ``half = interleaved[..., perm]``: ``(0, 2, 4, ..., 1, 3, ...)``,
    so pair ``(2i, 2i+1)`` lands on ``(i, i + d/2)``. Then
    ``apply_rope_half(x[..., perm]) == apply_rope(x)[..., perm]``."""
    _require_even("d", d)
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def permute_rows(W: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``W`` ``(num_heads * d_head, d_in)`` with each head's rows reordered by
    :func:`interleaved_to_half`: a query/key projection for the interleaved layout becomes the same
    projection for the split-halves layout."""
    require_tensor("W", W)
    require_positive_int("num_heads", num_heads)
    if W.dim() != 2 or W.shape[0] % num_heads or (W.shape[0] // num_heads) % 2:
        raise ValueError(f"W must be (num_heads * d_head, d_in) with d_head even, got {shape(W)} "
                         f"for num_heads={num_heads}")
    d_head = W.shape[0] // num_heads
    perm = interleaved_to_half(d_head)
    return W.view(num_heads, d_head, -1)[:, perm].reshape(W.shape)


def layer_scores(W_Q: torch.Tensor, W_K: torch.Tensor, x: torch.Tensor, h: int, g: int, *,
                 layout: str = "interleaved", positions: torch.Tensor | None = None) -> torch.Tensor:
    """``(h, n, n)`` scores ``q_m . k_n`` (no scaling, no mask) of each query head of one layer for
    tokens ``x`` ``(n, d_in)`` at ``positions`` (default ``0..n-1``). ``W_Q`` ``(h d_head, d_in)`` and
    ``W_K`` ``(g d_head, d_in)`` are ``nn.Linear`` weights, head after head; query head ``j`` reads
    key/value head ``j // (h/g)`` (notebook 04). RoPE in ``layout``: ``"interleaved"``
    (:func:`~attn_helpers.positional.apply_rope`) or ``"half"`` (:func:`apply_rope_half`)."""
    for name, value in (("W_Q", W_Q), ("W_K", W_K), ("x", x)):
        require_tensor(name, value, floating=True)
    require_positive_int("h", h)
    require_positive_int("g", g)
    if layout not in ("interleaved", "half"):
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    d_head = W_Q.shape[0] // h if W_Q.dim() == 2 else 0
    if (W_Q.dim() != 2 or W_K.dim() != 2 or x.dim() != 2 or h % g or d_head % 2 or not d_head
            or W_Q.shape != (h * d_head, x.shape[1]) or W_K.shape != (g * d_head, x.shape[1])):
        raise ValueError(f"need W_Q (h d_head, d_in), W_K (g d_head, d_in) and x (n, d_in) with "
                         f"d_head even and g dividing h; got W_Q {shape(W_Q)}, W_K {shape(W_K)}, "
                         f"x {shape(x)}, h={h}, g={g}")
    n = x.shape[0]
    q = (x @ W_Q.T).view(n, h, d_head).transpose(0, 1)                          # (h, n, d_head)
    k = (x @ W_K.T).view(n, g, d_head).transpose(0, 1).repeat_interleave(h // g, 0)
    rotate = apply_rope if layout == "interleaved" else apply_rope_half
    return rotate(q, positions) @ rotate(k, positions).transpose(-2, -1)         # (h, n, n)


def wavelength(base: float, d_head: int = 8, pair: int = 1) -> float:
    """Positions for RoPE's pair ``pair`` (of a head of ``d_head``) to turn once: ``2 pi / omega``."""
    require_number("base", base, positive=True)
    return 2 * math.pi / frequencies(_require_even("d_head", d_head), base)[pair].item()


def collapse_position(curve: torch.Tensor, *, threshold: float = 0.5, window: int = 8) -> int:
    """First position ``p`` where the mean accuracy over positions ``p .. p + window - 1`` (and all
    offsets) falls below ``threshold``; ``len(curve)`` if it never does. ``curve`` is ``(n, K)``
    (NaN where a target does not exist). The window's centre is ``p + (window - 1) / 2``."""
    require_tensor("curve", curve, floating=True)
    require_positive_int("window", window)
    per_position = curve.nanmean(-1)  # (n,)
    means = per_position.unfold(0, window, 1).mean(-1)  # (n - window + 1,)
    below = (means < threshold).nonzero()
    return int(below[0]) if len(below) else curve.shape[0]


def collapse_slope(collapse: dict[float, list[int]]) -> float:
    """Least-squares slope ``s`` of ``log(collapse point)`` against ``log(base)``, over every seed
    of every base: the collapse grows like ``base^s``. A pair ``i`` of a head of ``d`` turns at
    ``base^(-2i/d)``, so if the collapse tracked that pair's wavelength, ``s = 2i/d``."""
    x = torch.tensor([math.log(b) for b, points in collapse.items() for _ in points],
                     dtype=torch.float64)
    y = torch.tensor([math.log(p) for points in collapse.values() for p in points],
                     dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return ((x * y).sum() / (x * x).sum()).item()


def rope_claims(*, d: int = 8, n: int = 32, seed: int = 0, part: str | None = None) -> dict[str, bool]:
    """The notebook's claims about the motivation and the two layouts, each with its verdict;
    ``part="motivation"`` keeps the first five, ``part="layouts"`` the last four.

    Tolerances: ``1e-9`` for "depends on q - p only" (float64 rounding is ~1e-14), and at least
    ``0.1`` times the largest score for "does not" (a difference no rounding explains). The example
    pair of positions 5 apart is ``(0, 5)`` against ``(20, 25)``.
    """
    W_Q, W_K = random_projections(d, seed=seed)
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    zero = torch.zeros(d, dtype=torch.float64)
    absolute = position_scores("add, then project", W_Q, W_K, zero, n)
    with_token = position_scores("add, then project", W_Q, W_K, x, n)
    rotated = position_scores("project, then rotate", W_Q, W_K, x, n)
    commuting = position_scores("add, then project", *commuting_projections(d, seed=seed), zero, n)
    perm, heads = interleaved_to_half(d), 2
    tokens = torch.randn(n, 2 * heads * d, generator=torch.Generator().manual_seed(seed + 2),
                         dtype=torch.float64)
    W = torch.randn(2, heads * d, 2 * heads * d, generator=torch.Generator().manual_seed(seed + 3),
                    dtype=torch.float64)  # (W_Q, W_K), heads * d outputs each

    def head_scores(rope, W_Q, W_K):  # (heads, n, n)
        q, k = ((tokens @ w.T).view(n, heads, d).transpose(0, 1) for w in (W_Q, W_K))
        return rope(q) @ rope(k).transpose(-2, -1)

    interleaved = head_scores(apply_rope, W[0], W[1])
    converted = head_scores(apply_rope_half, permute_rows(W[0], heads), permute_rows(W[1], heads))
    unconverted = head_scores(apply_rope_half, W[0], W[1])
    probe = torch.randn(3, n, d, generator=torch.Generator().manual_seed(seed + 4), dtype=torch.float64)
    scale = interleaved.abs().max().item()
    same = probe[0, :1].expand(n, d)  # one vector at every position: is split-halves RoPE relative?
    halves = apply_rope_half(same @ W_Q[:d, :d].T) @ apply_rope_half(same @ W_K[:d, :d].T).T
    if part not in (None, "motivation", "layouts"):
        raise ValueError(f"part must be None, 'motivation' or 'layouts', got {part!r}")
    every = {
        "position added before W_Q, W_K: the score is not a function of n - m":
            diagonal_spread(absolute) > 0.1 * absolute.abs().max().item(),
        "position added: two positions 5 apart score differently at (0, 5) and (20, 25)":
            abs(absolute[0, 5] - absolute[20, 25]).item() > 0.1 * absolute.abs().max().item(),
        "the same with a token's content added too":
            diagonal_spread(with_token) > 0.1 * with_token.abs().max().item(),
        "rotating after W_Q, W_K (RoPE): the score depends on n - m only":
            diagonal_spread(rotated) < 1e-9,
        "if W_Q^T W_K commutes with the rotations, adding positions is relative too":
            diagonal_spread(commuting) < 1e-9,
        "the split-halves layout is the interleaved one with dimensions permuted":
            torch.allclose(apply_rope_half(probe[..., perm]), apply_rope(probe)[..., perm],
                           atol=1e-12),
        "permuting each head's rows of W_Q and W_K gives identical scores in the other layout":
            (converted - interleaved).abs().max().item() < 1e-9 * scale,
        "loading the weights without the permutation changes the scores":
            (unconverted - interleaved).abs().max().item() > 0.1 * scale,
        "either layout alone gives scores that depend on n - m only (so the bug is silent)":
            diagonal_spread(halves) < 1e-9,
    }
    items = list(every.items())
    return every if part is None else dict(items[:5] if part == "motivation" else items[5:])
