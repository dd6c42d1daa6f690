"""Notebook 02: query, key, value. The hard and the soft lookup, the hand-set sentence, the 2-D
geometry that shows outputs are convex combinations of the values, additive scoring (fitted,
and its memory measured), and :func:`claims`, the statements the notebook asserts (thresholds
are the module's constants, defined once).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import require_tensor, shape
from ..attention import AdditiveScore
from ..entropy import attention_entropy, effective_keys
from ..training import single_thread

__all__ = ["convex_hull_2d", "inside_convex_hull", "QUERY", "CATEGORIES", "PLANE_VALUES",
           "lookups", "central_difference", "TOKENS", "FEATURES", "EMBEDDING", "LOOKS_FOR",
           "sentence_projections", "fit_additive", "largest_saved_tensor", "claims"]


def _check_points(name: str, points) -> torch.Tensor:
    require_tensor(name, points, floating=True)
    if points.dim() != 2 or points.shape[1] != 2:
        raise ValueError(f"{name} must have shape (n, 2), got {shape(points)}")
    return points


def _cross(o: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def convex_hull_2d(points: torch.Tensor) -> torch.Tensor:
    """Vertices ``(h, 2)`` of the convex hull of ``points`` ``(n, 2)``, counter-clockwise
    (Andrew's monotone chain; collinear points on an edge are dropped)."""
    _check_points("points", points)
    ordered = sorted(map(tuple, points.tolist()))
    unique = [torch.tensor(p, dtype=points.dtype) for i, p in enumerate(ordered)
              if i == 0 or p != ordered[i - 1]]
    if len(unique) <= 2:
        return torch.stack(unique)
    lower, upper = [], []
    for p in unique:
        while len(lower) >= 2 and _cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(unique):
        while len(upper) >= 2 and _cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return torch.stack(lower[:-1] + upper[:-1])


def inside_convex_hull(queries: torch.Tensor, points: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """``(m,)`` bool: which of ``queries`` ``(m, 2)`` lie in the convex hull of ``points``
    ``(n, 2)`` (boundary included, up to ``tol``). The hull must have at least 3 vertices."""
    _check_points("queries", queries)
    hull = convex_hull_2d(points).to(queries.dtype)
    if len(hull) < 3:
        raise ValueError(f"points must span an area (>= 3 non-collinear points), got {shape(points)}")
    start, end = hull, torch.roll(hull, -1, dims=0)
    edge = end - start                                  # (h, 2)
    to_query = queries[:, None, :] - start[None, :, :]  # (m, h, 2)
    cross = edge[None, :, 0] * to_query[..., 1] - edge[None, :, 1] * to_query[..., 0]
    return (cross >= -tol).all(dim=1)


# --- section 1: a hard and a soft lookup in the plane ------------------------------------------

QUERY = (1.0, 0.4)            # section 1's query, between the animals and the fruit
CATEGORIES = ("animal", "vehicle", "fruit")
PLANE_VALUES = (0, 0, 1, 1, 2, 2)   # the category of each of the six keys, in order


def lookups(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
    r"""Hard and soft lookup of one query ``(d_k,)`` among ``keys`` ``(n, d_k)`` with ``values``
    ``(n, d_v)``, with scaled scores :math:`s_j = q \cdot k_j / \sqrt{d_k}`.

    Returns ``(hard, soft)`` weights ``(n,)`` and outputs ``(d_v,)``, as ``(hard_w, soft_w,
    hard_out, soft_out)``: ``hard_w`` is one-hot on the best key (``argmax``), ``soft_w`` is
    ``softmax(s)``; the outputs are ``weights @ values``."""
    scores = keys @ query / math.sqrt(keys.shape[-1])                      # (n,)
    hard = F.one_hot(scores.argmax(), len(keys)).to(scores.dtype)          # (n,)
    soft = torch.softmax(scores, dim=0)                                    # (n,)
    return hard, soft, hard @ values, soft @ values                        # (d_v,) outputs


def central_difference(f, x: torch.Tensor, direction: torch.Tensor, eps: float = 1e-3):
    """``(f(x + eps d) - f(x - eps d)) / (2 eps)``: the derivative of ``f`` along ``d``, measured
    without autograd (so it also works for ``argmax``)."""
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


# --- section 2: the sentence with hand-set projections ----------------------------------------

TOKENS = ("the", "cat", "sat", "on", "the", "mat")
FEATURES = ("det", "noun", "animal", "verb", "prep", "place")
EMBEDDING = {                 # one row per word: which features it has
    "the": (1, 0, 0, 0, 0, 0), "cat": (0, 1, 1, 0, 0, 0), "sat": (0, 0, 0, 1, 0, 0),
    "on": (0, 0, 0, 0, 1, 0), "mat": (0, 1, 0, 0, 0, 1),
}
LOOKS_FOR = {"det": "noun", "verb": "animal", "prep": "place", "animal": "verb", "place": "prep"}
AFFINITY = 6.0


def sentence_projections(seed: int = 0):
    r"""The sentence of section 2 and its hand-set projections: ``(X, W_Q, W_K, W_V)``.

    ``X`` ``(n, d_model) = (6, 6)`` holds one feature row per token. ``M[a, b] = 6`` when a
    token with feature ``a`` looks for feature ``b``; only :math:`W_Q W_K^\top` enters the scores,
    so ``M`` is factored as :math:`W_Q = M R`, :math:`W_K = R` with a random orthogonal ``R``
    (seeded): :math:`W_Q W_K^\top = M R R^\top = M`. ``W_V`` is the identity."""
    X = torch.tensor([EMBEDDING[t] for t in TOKENS], dtype=torch.float32)   # (n, d_model)
    f = {name: i for i, name in enumerate(FEATURES)}
    M = torch.zeros(len(FEATURES), len(FEATURES))
    for mine, wanted in LOOKS_FOR.items():
        M[f[mine], f[wanted]] = AFFINITY
    generator = torch.Generator().manual_seed(seed)
    R, _ = torch.linalg.qr(torch.randn(len(FEATURES), len(FEATURES), generator=generator))
    return X, M @ R, R, torch.eye(len(FEATURES))


# --- section 4: additive scoring --------------------------------------------------------------


def fit_additive(q: torch.Tensor, k: torch.Tensor, target: torch.Tensor, *, d_a: int = 8,
                 steps: int = 400, lr: float = 0.05, seed: int = 0):
    """Fit an :class:`~attn_helpers.attention.AdditiveScore` with hidden size ``d_a`` so that
    ``softmax(scores(q, k))`` reproduces ``target`` weights ``(n_q, n_k)`` (Adam on the KL
    divergence, seeded, on one thread: tiny tensors). Returns ``(scorer, its weights (n_q, n_k))``."""
    with single_thread():
        return _fit_additive(q, k, target, d_a, steps, lr, seed)


def _fit_additive(q, k, target, d_a, steps, lr, seed):
    torch.manual_seed(seed)
    scorer = AdditiveScore(q.shape[-1], k.shape[-1], d_a)
    optimizer = torch.optim.Adam(scorer.parameters(), lr=lr)
    for _ in range(steps):
        loss = F.kl_div(torch.log_softmax(scorer(q, k), -1), target, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return scorer, torch.softmax(scorer(q, k), -1)


def largest_saved_tensor(fn, *inputs: torch.Tensor) -> int:
    """Run ``fn(*inputs)`` with gradients on and return the number of elements of the largest
    tensor autograd saves for the backward pass: the memory that training must hold."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    leaves = [x.detach().requires_grad_(True) for x in inputs]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*leaves)
    return max(sizes)


def hull_experiment(keys: torch.Tensor, m: int = 300, seed: int = 1):
    """Section 3: ``m`` random queries ``(m, 2)`` (std 2, seeded) attend over the 2-D ``keys``
    ``(n, 2)`` with each value equal to its key. Returns ``(queries, outputs, inside)``."""
    generator = torch.Generator().manual_seed(seed)
    queries = 2 * torch.randn(m, 2, generator=generator, dtype=keys.dtype)
    outputs = torch.softmax(queries @ keys.T / math.sqrt(2), -1) @ keys     # (m, 2)
    return queries, outputs, inside_convex_hull(outputs, keys)


# --- the claims of notebook 02 ----------------------------------------------------------------

LINE_STEPS = 200              # queries along the line from QUERY towards "car"
SMOOTH_STEP = 0.05            # the soft output changes by less than this between neighbours
STRONG = 0.6                  # sat -> cat, on -> mat, cat -> sat: weight above this
FOCUSED = (0.65, 0.75)        # "about 70%" on one key for every row except the two "the"
FIT_D_A, FIT_TOLERANCE = 8, 0.01
MEMORY_N, MEMORY_D, MEMORY_D_A = 256, 16, 64
GROWTH = 100.0                # q and k multiplied by this


_COMPUTED: dict = {}   # plane keys -> every claim: a notebook asking group by group computes once


def claims(plane_keys, group: str | None = None) -> dict[str, bool]:
    """Notebook 02's statements, as named booleans, from its fixed examples (``plane_keys``:
    ``{name: (x, y)}``, the six keys of section 1 and the widget). Each name starts with its
    group: ``lookup``, ``sentence``, ``torch``, ``convex``, ``entropy``, ``additive``;
    ``group`` selects the claims whose name starts with it (all of them when ``None``)."""
    key = tuple((name, tuple(xy)) for name, xy in plane_keys.items())
    if key not in _COMPUTED:
        _COMPUTED[key] = _claims(plane_keys)
    chosen = {k: v for k, v in _COMPUTED[key].items() if group is None or k.startswith(group)}
    if not chosen:
        raise ValueError(f"no claim of notebook 02 starts with {group!r}")
    return chosen


def _claims(plane_keys) -> dict[str, bool]:
    names = list(plane_keys)
    keys = torch.tensor([plane_keys[k] for k in names], dtype=torch.float64)
    values = torch.eye(len(CATEGORIES), dtype=torch.float64)[list(PLANE_VALUES)]
    query = torch.tensor(QUERY, dtype=torch.float64, requires_grad=True)
    hard, soft, _, soft_out = lookups(query, keys, values)
    (grad,) = torch.autograd.grad(soft_out[0], query)
    directions = torch.eye(2, dtype=torch.float64)
    with torch.no_grad():
        hard_slope = [central_difference(lambda q: lookups(q, keys, values)[2][0], query, d)
                      for d in directions]
        soft_slope = torch.stack([central_difference(lambda q: lookups(q, keys, values)[3][0],
                                                     query, d) for d in directions])
        line = torch.linspace(0, 1, LINE_STEPS + 1, dtype=torch.float64)[:, None]
        along = query + line * (keys[names.index("car")] - query)
        shares = torch.stack([torch.stack(lookups(q, keys, values)[2:])[:, 0] for q in along])
    X, W_Q, W_K, W_V = sentence_projections()
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T / math.sqrt(K.shape[-1])
    A = torch.softmax(S, -1)
    O = A @ V
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch_out = [F.scaled_dot_product_attention(Q, K, V, attn_mask=mask) for mask in (None, causal)]
    ours = [O, torch.softmax((Q @ K.T / math.sqrt(6)).masked_fill(~causal, -math.inf), -1) @ V]
    t = {name: TOKENS.index(name) for name in ("cat", "sat", "on", "mat")}
    H = attention_entropy(A)
    others = [i for i, token in enumerate(TOKENS) if token != "the"]
    uniform = [effective_keys(torch.full((m,), 1.0 / m)).item() for m in range(1, 7)]
    _, fitted = fit_additive(Q, K, A, d_a=FIT_D_A)
    _, outputs, inside = hull_experiment(keys)
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, MEMORY_N, MEMORY_D, generator=generator)
    scorer = AdditiveScore(MEMORY_D, MEMORY_D, MEMORY_D_A)
    dot_saved = largest_saved_tensor(lambda q, k, v: torch.softmax(q @ k.T, -1) @ v, q, k, v)
    add_saved = largest_saved_tensor(lambda q, k, v: torch.softmax(scorer(q, k), -1) @ v, q, k, v)
    with torch.no_grad():
        bound = scorer.w_v.weight.abs().sum()                              # ||v_a||_1
        largest_additive = scorer(GROWTH * q, GROWTH * k).abs().max()
        largest_dot = ((GROWTH * q) @ (GROWTH * k).T).abs().max()
    return {claim: bool(holds) for claim, holds in {
        "lookup: the hard and the soft lookup pick the same best key, and the soft answer is "
        "mostly (> 0.5) its category":
            hard.argmax() == soft.argmax() and soft_out[PLANE_VALUES[int(hard.argmax())]] > 0.5,
        "lookup: the hard output's central difference is exactly 0 in both directions, the soft "
        "one's equals autograd's within 1e-6":
            all(s == 0 for s in hard_slope) and torch.allclose(soft_slope, grad, atol=1e-6),
        f"lookup: along {LINE_STEPS} steps towards 'car' the hard output is 0 or 1 and jumps once, "
        f"the soft one changes by < {SMOOTH_STEP} per step":
            set(shares[:, 0].tolist()) == {0.0, 1.0} and int((shares[1:, 0] != shares[:-1, 0])
                                                             .sum()) == 1
            and (shares[1:, 1] - shares[:-1, 1]).abs().max() < SMOOTH_STEP,
        f"sentence: the strongest key of sat is cat, of on mat, of cat sat, each > {STRONG}":
            A[t["sat"]].argmax() == t["cat"] and A[t["on"]].argmax() == t["mat"]
            and A[t["cat"]].argmax() == t["sat"]
            and min(A[t["sat"], t["cat"]], A[t["on"], t["mat"]], A[t["cat"], t["sat"]]) > STRONG,
        "sentence: the two 'the' rows are identical and split evenly between cat and mat "
        "(> 0.4 each)":
            torch.equal(A[0], A[4]) and torch.isclose(A[0, 1], A[0, 5]) and A[0, 1] > 0.4,
        "sentence: the scores are asymmetric: s(the, cat) > 2, while s(cat, the) is 0 within 1e-5":
            S[0, 1] > 2 and S[1, 0].abs() < 1e-5,
        f"sentence: the output row of sat has an 'animal' feature above {STRONG}":
            O[t["sat"], FEATURES.index("animal")] > STRONG,
        "torch: the four steps equal torch's scaled_dot_product_attention within 1e-6 "
        "(with and without a causal mask)":
            all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, torch_out, strict=True)),
        "convex: every output coordinate of the sentence lies within the values' range":
            bool((O >= V.min(0).values - 1e-6).all() and (O <= V.max(0).values + 1e-6).all()),
        f"convex: all {len(outputs)} random outputs lie inside the convex hull of the values":
            bool(inside.all()),
        "entropy: every row's entropy is at most ln n":
            bool((H <= math.log(len(TOKENS)) + 1e-6).all()),
        "entropy: the two 'the' rows are the least focused (highest entropy)":
            int(H.argmax()) in (0, 4) and torch.isclose(H[0], H[4]),
        f"entropy: every other row puts {FOCUSED[0]}-{FOCUSED[1]} of its weight on one key":
            bool(((A[others].max(-1).values > FOCUSED[0])
                  & (A[others].max(-1).values < FOCUSED[1])).all()),
        "entropy: exp(H) of a row spread evenly over m keys is m (m = 1..6)":
            all(abs(u - m) < 1e-5 for m, u in enumerate(uniform, start=1)),
        f"additive: fitted with d_a = {FIT_D_A}, it reproduces the dot-product weights within "
        f"{FIT_TOLERANCE}":
            (fitted - A).abs().max() < FIT_TOLERANCE,
        f"additive: the largest tensor kept for backward is d_a = {MEMORY_D_A} times dot-product "
        f"attention's (n = {MEMORY_N})":
            add_saved == MEMORY_D_A * dot_saved == MEMORY_D_A * MEMORY_N ** 2,
        f"additive: with q and k {GROWTH:g}x larger, its scores stay within ||v_a||_1, while the "
        f"largest dot product exceeds {GROWTH:g} ||v_a||_1":
            largest_additive <= bound and largest_dot > GROWTH * bound,
    }.items()}


SHARP_T, FLAT_T = 0.1, 10.0   # the widget's temperatures: "practically hard", "practically uniform"


def temperature_claims(entropy_at: dict, n_keys: int) -> dict[str, bool]:
    """Notebook 02's statements about its widget: ``entropy_at[T]``, the entropy (nats) of one
    query's weights at temperatures ``SHARP_T``, 1 and ``FLAT_T``, over ``n_keys`` keys."""
    sharp, middle, flat = entropy_at[SHARP_T], entropy_at[1.0], entropy_at[FLAT_T]
    return {
        f"temperature: at T = {SHARP_T:g} the entropy is below 0.1 nats (practically a hard lookup)":
            sharp < 0.1,
        f"temperature: the entropy grows with T ({SHARP_T:g} < 1 < {FLAT_T:g})":
            sharp < middle < flat,
        f"temperature: at T = {FLAT_T:g} it is above 0.95 ln {n_keys} (practically a plain average)":
            flat > 0.95 * math.log(n_keys),
    }
