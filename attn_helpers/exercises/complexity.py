"""Checkers for notebook 08: merging two online-softmax states, the causal backward in tiles
(never holding the n x n scores), and one step of causal linear attention."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..efficient import OnlineSoftmaxState, block_state, elu_feature_map, merge_states
from .core import AllocationWatch, CheckResult, Mistake, check_function, seeded
from .workflow import exercise

STATE = ("m (the merged max)", "l (the merged sum)", "acc (the merged output sum)")


def _randn(g: torch.Generator, batch: tuple) -> Callable[..., torch.Tensor]:   # float64 randn
    return lambda *shape: torch.randn(*batch, *shape, generator=g, dtype=torch.float64)


def merge_states_reference(m1, l1, acc1, m2, l2, acc2):       # the core's merge_states
    return tuple(merge_states(OnlineSoftmaxState(m1, l1, acc1), OnlineSoftmaxState(m2, l2, acc2)))


def _merge_case(g, batch, n_q, keys, d_v, *, offset=0.0, empty2=False, size=1.0) -> dict:
    """Two states of ``keys`` keys; ``offset`` shifts half the rows' second scores up, half down."""
    rand = _randn(g, batch)
    shift = torch.tensor([offset if r % 2 else -offset for r in range(n_q)], dtype=torch.float64)
    s1, s2 = size * rand(n_q, keys[0]), size * rand(n_q, keys[1])
    m1, l1, acc1 = block_state(s1, rand(keys[0], d_v))
    m2, l2, acc2 = block_state(s2 + shift[:, None], rand(keys[1], d_v))
    if empty2:                                             # a split with no key for these rows
        m2, l2, acc2 = torch.full_like(m2, -math.inf), torch.zeros_like(l2), torch.zeros_like(acc2)
    return {"m1": m1, "l1": l1, "acc1": acc1, "m2": m2, "l2": l2, "acc2": acc2}


def _merge_cases() -> list[dict]:
    """Five plain cases, maxima near 1000 (``exp(m)`` overflows past 709), rows with no key at all."""
    g = seeded(80)
    large = _merge_case(seeded(81), (), 4, (3, 3), 3, offset=2.0)
    empty = _merge_case(seeded(82), (), 4, (3, 2), 3, offset=1.0)
    rows = torch.tensor([[True], [False], [True], [False]])                 # rows 0 and 2: no keys
    return [_merge_case(g, (), 4, (3, 5), 3, offset=2.0),
            _merge_case(g, (2, 3), 3, (4, 2), 5, offset=1.5),
            _merge_case(g, (), 1, (1, 1), 2, offset=3.0),
            _merge_case(g, (2,), 4, (3, 3), 2, empty2=True),
            _merge_case(g, (), 6, (5, 4), 4, offset=6.0, size=3.0),
            {**large, "m1": large["m1"] + 1000.0, "m2": large["m2"] + 1000.0},
            {name: t.masked_fill(rows, -math.inf if name[0] == "m" else 0.0)
             for name, t in empty.items()}]


def _merge_with(m1, l1, acc1, m2, l2, acc2, *, new_max=torch.maximum, rescale=("12", "12"),
                flip=False, swap=False, finish=False, weigh=False, average=False):
    """The merge with one thing changed (``rescale``: the states whose l, then acc, are rescaled)."""
    m = new_max(m1, m2)
    c1, c2 = (torch.exp(m - m1), torch.exp(m - m2)) if flip else (torch.exp(m1 - m), torch.exp(m2 - m))
    c1, c2 = (c2, c1) if swap else (c1, c2)
    def add(x1, x2, states: str):
        return (c1 if "1" in states else 1.0) * x1 + (c2 if "2" in states else 1.0) * x2
    l, acc = add(l1, l2, rescale[0]), add(acc1, acc2, rescale[1])
    acc = (c1 * l1 * acc1 + c2 * l2 * acc2) / l if weigh else acc
    acc = l * (acc1 / l1 + acc2 / l2) / 2 if average else acc
    return m, l, acc / l if finish else acc


def _merge_mistakes() -> list[Mistake]:
    return [Mistake(lambda *a, _f=flaw: _merge_with(*a, **_f), hint) for flaw, hint in [
        ({}, "both states are empty in some rows (m1 = m2 = -inf), so m1 - m is NaN: rescale against "
             "a max that is finite in every row; the merged row is then empty too: m = -inf, l = 0, "
             "acc = 0."),
        ({"rescale": ("", "")}, "the sums were added without rescaling: l_i and acc_i are "
         "measured against m_i; bring both to the new max m first (times exp(m1 - m), exp(m2 - m))."),
        ({"rescale": ("12", "")}, "l was rescaled but acc was not: acc1 and acc2 need the same "
                                  "factors as l1 and l2."),
        *[({"rescale": ("12", state)}, "acc was rescaled on one side only: each acc_i needs the "
                                       "same factor as its l_i.") for state in "12"],
        *[({"rescale": (one, one)}, f"only state {one} was rescaled: l{two} and acc{two} are measured "
           f"against m{two}, so they need exp(m{two} - m) too (1 only where m{two} is the larger max).")
          for one, two in ("12", "21")],
        ({"flip": True}, "the factors are upside down: exp(s - m1) becomes exp(s - m) times "
                         "exp(m1 - m), at most 1, not exp(m - m1)."),
        ({"swap": True}, "the factors were swapped: state 1 takes exp(m1 - m), state 2 exp(m2 - m)."),
        ({"new_max": lambda x, y: x}, "m was kept from state 1: the merged m is max(m1, m2), so no "
                                      "factor exceeds 1."),
        *[({"new_max": new_max}, f"your m is {what} of m1 and m2: the merged m is max(m1, m2).")
          for what, new_max in (("the smaller", torch.minimum), ("the mean", lambda x, y: (x + y) / 2))],
        ({"new_max": lambda x, y: torch.maximum(x, y).nan_to_num(neginf=0.0)},
         "rows with no key in either state came back with m = 0: an empty row's max is -inf. A later "
         "merge would take max(0, m3), wrong where all its scores lie below 0. Use the finite stand-in "
         "inside the factors only, and return m = max(m1, m2)."),
        ({"finish": True}, "acc came back divided by l: that is the output, not the state; keep acc "
                           "unnormalised so that more states can be merged into it."),
        ({"weigh": True}, "acc was weighted by l, as if each acc_i were a normalised output: acc is "
                          "the unnormalised sum; rescale it like l, do not weight it by l."),
        ({"average": True}, "acc is l times the mean of the normalised outputs acc_i / l_i, which "
                            "weighs both key sets equally: rescale and add the sums acc_i, as for l."),
    ]] + [Mistake(lambda m1, l1, _acc1, m2, l2, _acc2: torch.logaddexp(m1 + l1.log(), m2 + l2.log()),
                  "m is the running max, not the log-sum-exp: this state keeps m = the largest "
                  "score so far and l = the sum of exp(s - m), not m = lse with l = 1.")] + [
        Mistake(lambda *a, _o=order: tuple(merge_states_reference(*a)[i] for i in _o), "the values "
                "came back in another order: return (m, l, acc), the merged max, sum and output sum.")
        for order in itertools.permutations(range(3)) if order != (0, 1, 2)]


_OVERFLOW = ("exp of a max near 1000 overflows (this case has maxima near 1000; exp(x) is inf past "
             "x = 709): never exponentiate m1 or m2 alone, only the differences m1 - m, m2 - m <= 0.")


@exercise("complexity.merge_states", "merge two partial online-softmax states (split-KV, ring)", hints=(
              "Each state summed exp(s - m_i) over its own keys, against its own max. Pick the "
              "merged max first, then re-express both sums against it before adding them.",
              "The merged m is the larger of m1 and m2. Which factor turns every term "
              "exp(s - m_i) of state i into exp(s - m)? Where both states are empty, m1 - m is "
              "NaN: what can you subtract there so that the row stays empty?",
              "m = torch.maximum(m1, m2)                     # (..., n_q, 1): the merged max\n"
              "safe = ...                                    # m, but 0 where m = -inf (both empty)\n"
              "c1, c2 = ...                                  # each state's factor, against safe\n"
              "return m, ..., ...                            # l and acc, both rescaled and added"))
def check_merge_states(merge: Callable) -> CheckResult:
    """Exercise: ``merge(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``, two disjoint sets of keys."""
    # Every case before it passed, so wrong values at maxima near 1000 are the overflow: named there.
    overflow = Mistake(lambda m1, *rest: merge(m1, *rest) if m1.max() > 500 else None, _OVERFLOW)
    return check_function(merge, merge_states_reference, _merge_cases(), what="merge_states",
                          output_names=STATE, mistakes=[overflow, *_merge_mistakes()],
                          atol=1e-9, rtol=1e-7)


def _no_full_scores(inputs: dict) -> AllocationWatch | None:
    """No fused call (the watch cannot see inside it); when ``B < n``, no tensor as large as the n x n
    scores, or over a padded input and a ``(..., B, B, d)`` tile, nor a tile above the diagonal."""
    q, v, B = inputs["q"], inputs["v"], inputs["B"]
    n, d, batch = q.shape[-2], max(q.shape[-1], v.shape[-1]), q[..., 0, 0].numel()
    full, tile_room = batch * n * n, batch * d * max(B * B, n + B - 1)
    S, above = q @ inputs["k"].mT, {}       # the raw scores, outside the watch; above: by tile shape
    for i, j in ((a, b) for a in range(0, n, B) for b in range(a + B, n, B)):   # wholly above
        for tile in (S[..., i:i + B, j:j + B], S[..., i:i + B, j:j + B] / q.shape[-1] ** 0.5):
            above.setdefault(tile.shape, []).append((i, j, tile, tile.flatten()[0].item()))

    def refuse(t: torch.Tensor, call: str) -> str | None:
        if call == "scaled_dot_product_attention":
            return ("causal_backward called scaled_dot_product_attention: the checker cannot see what "
                    "a fused call holds inside (autograd through it may keep the n x n weights). "
                    "Write the tile loop with plain tensor operations.")
        if B >= n:
            return None
        if t.numel() >= full:
            return (f"causal_backward built a tensor of shape {tuple(t.shape)} ({call}), as large "
                    f"as the (..., n, n) scores (n = {n}). The point of tiling is never to hold "
                    "the n x n matrix: recompute each tile's P from the saved lse, and build each "
                    "tile's mask from its positions (a full mask is n x n too).")
        if t.numel() > tile_room:
            return (f"causal_backward built a tensor of shape {tuple(t.shape)} ({call}), more "
                    f"than one tile needs (n = {n}, B = {B}): the queries were not tiled. "
                    "FlashAttention-2 takes B_r queries by B_c keys at a time; here both are B.")
        tiles = above.get(t.shape, []) if t.is_floating_point() else []
        corner = t.flatten()[0].item() if tiles else None       # a cheap first test, then all of it
        for i, j, tile, tile_corner in tiles:                   # a tile wholly above the diagonal
            if math.isclose(corner, tile_corner, rel_tol=1e-9) and torch.allclose(t.double(), tile):
                return (f"you scored queries {i}..{i + B - 1} against keys {j}..{j + t.shape[-1] - 1}: "
                        "a tile wholly above the diagonal, where every key comes after every query and "
                        "P is 0. Skip such tiles (up to half the work); mask the ones on the diagonal.")
        return None

    return AllocationWatch(refuse)


def _case(g, batch, n, d_k, d_v, B, *, large=False) -> dict:
    """Causal attention over ``n`` tokens: inputs, the forward's ``O`` and ``lse`` ``(..., n)``."""
    rand = _randn(g, batch)
    q, k, v, d_out = rand(n, d_k), rand(n, d_k), rand(n, d_v), rand(n, d_v)
    if large:                                                       # scores near 1000
        q[..., 0], k[..., 0] = 1000.0 * math.sqrt(d_k), 1.0
    s = (q @ k.mT / math.sqrt(d_k)).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return {"q": q, "k": k, "v": v, "O": torch.softmax(s, dim=-1) @ v,
            "lse": torch.logsumexp(s, dim=-1), "d_out": d_out, "B": B}


def _cases() -> list[dict]:
    g = seeded(84)
    return [_case(g, (), 16, 3, 2, 4),            # n = 4 B; a tile is smaller than a strip
            _case(g, (2, 3), 10, 2, 3, 4),        # batch and heads; a short last tile
            _case(g, (), 5, 2, 3, 1),             # B = 1: one token per tile
            _case(g, (2,), 6, 4, 3, 8),           # B >= n: one tile, on the diagonal
            _case(g, (), 13, 4, 4, 5),            # 13 = 2 * 5 + 3
            _case(seeded(85), (), 8, 2, 2, 3, large=True)]   # exp(S) overflows, exp(S - lse) not


def _backward_with(q, k, v, O, lse, d_out, B, *, visit="causal", mask="causal",  # noqa: C901
                   fill=-math.inf, mask_ds_only=False, tile_d=False, local_softmax=False, no_d=False,
                   scale_grads=(True, True), score_pow=1, assign=(), lse_keys=False, d_keys=False,
                   no_lse=False, dv_from_o=False, dv_ds=False, whole="", scale_by_v=False):
    """The backward with one thing changed. ``visit``: "causal" or "below" (``j < i``); ``mask``: in a
    visited tile; ``assign``: grads assigned, not added; ``whole``: loops that drop a short last tile."""
    n, scale = q.shape[-2], 1 / math.sqrt((v if scale_by_v else q).shape[-1])
    D = (d_out * O).sum(dim=-1, keepdim=not d_keys)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    ends = {axis: n - n % B if axis in whole else n for axis in "ij"}
    for j in range(0, ends["j"], B):
        J, cols = slice(j, j + B), torch.arange(j, min(j + B, n))[None, :]
        for i in range(0, ends["i"], B):
            if {"causal": j >= i + B, "below": j >= i}[visit]:
                continue
            I, rows = slice(i, i + B), torch.arange(i, min(i + B, n))[:, None]
            allowed = {"causal": cols <= rows, "none": cols >= 0, "strict": cols < rows,
                       "inverted": cols > rows,                      # "local": the tile's own
                       "local": cols - j <= rows - i}[mask]           # indices, not positions
            S = q[..., I, :] @ k[..., J, :].mT * scale ** score_pow
            S_masked = S.masked_fill(~allowed, fill)
            row_lse = lse[..., I][..., None, :] if lse_keys else lse[..., I, None]
            P = torch.exp((S if mask_ds_only else S_masked) - (0.0 if no_lse else row_lse))
            if local_softmax:                                       # this tile's keys only
                P = torch.softmax(S_masked, dim=-1).nan_to_num(0.0)
            dP = d_out[..., I, :] @ v[..., J, :].mT
            D_i = D[..., I][..., None, :] if d_keys else D[..., I, :]
            D_i = (P * allowed * dP).sum(-1, keepdim=True) if tile_d else D_i * (not no_d)
            dS = P * (dP - D_i) * (allowed if mask_ds_only else True)
            shares = {"dq": (dq, I, dS @ k[..., J, :] * (scale if scale_grads[0] else 1.0)),
                      "dk": (dk, J, dS.mT @ q[..., I, :] * (scale if scale_grads[1] else 1.0)),
                      "dv": (dv, J, (dS if dv_ds else P).mT @ (O if dv_from_o else d_out)[..., I, :])}
            for name, (grad, rows_of, share) in shares.items():
                grad[..., rows_of, :] = share + (0 if name in assign else grad[..., rows_of, :])
    return dq, dk, dv


def causal_backward_reference(q, k, v, O, lse, d_out, B):
    """FlashAttention-2's causal backward: key tiles outside, tiles above the diagonal skipped."""
    return _backward_with(q, k, v, O, lse, d_out, B)


def _mistakes() -> list[Mistake]:       # each hint, then the changes to the reference it names
    return [Mistake(lambda *a, _v=v: _backward_with(*a, **_v), hint) for hint, *variants in [
        ("the tiles that cross the diagonal were not masked: they hold future keys too.",
         {"mask": "none"}),
        ("the diagonal tiles were skipped (j >= i rather than j >= i + B): they hold each token's own "
         "key and its nearest past keys.", {"visit": "below"}),
        ("the mask was built from the tile's own indices (a tril from 0): compare token positions, "
         "i + a for query a and j + b for key b.", {"mask": "local"}),
        ("the diagonal was masked: query t may attend to key t itself (key <= query).",
         {"mask": "strict"}),
        ("the mask is inverted: it kept the future keys and removed the past ones.",
         {"mask": "inverted"}),
        ("the masked scores were set to 0, not -inf: exp(0 - lse) is not 0, so future keys still got "
         "weight.", {"fill": 0.0}),
        ("dS was masked but P was not: dV_j = P^T dO_i still collected future keys; mask the scores "
         "before the exponential.", {"mask_ds_only": True}),
        ("D was recomputed as rowsum(P * dP) over one tile: D = rowsum(dO * O) covers the whole row; "
         "compute it once, from O, before the loops.", {"tile_d": True}),
        ("P was normalised within the tile (a softmax over its keys): P = exp(S - lse), with the "
         "whole row's lse from the forward pass.", {"local_softmax": True}),
        ("dS = P * dP misses its second term: subtract each row's D (section 4).", {"no_d": True}),
        ("P = exp(S) without the lse: P = exp(S - lse), each row by its own lse.", {"no_lse": True}),
        ("lse broadcast along the keys: its slice (..., B) meets a tile's last axis; give each row its "
         "own, lse.unsqueeze(-1).", {"lse_keys": True}),
        ("D broadcast along the keys: rowsum(dO * O) without keepdim is (..., n); keep it "
         "(..., n, 1).", {"d_keys": True}),
        ("the scores miss the scale: S = Q_i K_j^T / sqrt(d_k).", {"score_pow": 0}),
        ("the scores were scaled twice: S = Q_i K_j^T / sqrt(d_k), once.", {"score_pow": 2}),
        ("the scale used d_v: it is 1 / sqrt(d_k), d_k the size of q and k.", {"scale_by_v": True}),
        ("dV_j was built from O or from dS: dV_j = P^T dO_i, the weights times the output's gradient.",
         {"dv_from_o": True}, {"dv_ds": True}),
        ("dq or dk misses the scale: S = Q K^T / sqrt(d_k), so both gradients carry 1 / sqrt(d_k).",
         {"scale_grads": (False, False)}, {"scale_grads": (False, True)},
         {"scale_grads": (True, False)}),
        ("dK_j or dV_j was assigned in each query tile, not added: the last query tile overwrote the "
         "others.", {"assign": ("dk", "dv")}, {"assign": ("dk",)}, {"assign": ("dv",)}),
        ("the short last tile was dropped: when n is not a multiple of B, the last tile holds n % B "
         "tokens, and range(0, n, B) still reaches it; its slices are simply shorter.",
         {"whole": "ij"}, {"whole": "j"}, {"whole": "i"}),
        ("dQ_i was assigned in each key tile, not added: the last key tile overwrote the others.",
         {"assign": ("dq",)}, {"assign": ("dq", "dk", "dv")}),
    ] for v in variants]


@exercise("complexity.causal_backward", "the causal backward in tiles, from the saved O and lse",
          hints=(
              "Section 4 had one block of queries and no mask. Here the queries come in tiles of "
              "B too, and the mask is causal. Which pairs of tiles contribute anything, which "
              "need the mask, and which results are complete only once a loop has finished?",
              "Compare a tile's last query position with its first key position. P and D are "
              "about whole rows, which no tile sees: what did the forward pass save per row, and "
              "which saved tensors give D without any P? Which of dQ, dK, dV is complete after "
              "the inner loop, and which after the outer one?",
              "n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])\n"
              "D = ...                                   # (..., n, 1), once, from whole rows\n"
              "lse = lse.unsqueeze(-1)                   # (..., n, 1): one value per row\n"
              "dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n"
              "for j in range(0, n, B):                  # outer loop: the key tile K_j, V_j\n"
              "    K_j, V_j = k[..., j:j + B, :], v[..., j:j + B, :]\n"
              "    cols = torch.arange(j, min(j + B, n))             # the keys' positions\n"
              "    for i in range(...):                  # inner loop: the query tiles that see K_j\n"
              "        Q_i, dO_i = q[..., i:i + B, :], d_out[..., i:i + B, :]\n"
              "        rows = torch.arange(i, min(i + B, n))[:, None]  # the queries' positions\n"
              "        S = ...                           # (..., B_q, B_k), -inf at future keys\n"
              "        P = ...                           # from the rows' saved lse\n"
              "        dS = P * (dO_i @ V_j.mT - D[..., i:i + B, :])\n"
              "        dq[..., i:i + B, :] += ...\n"
              "        dk[..., j:j + B, :] += ...\n"
              "        dv[..., j:j + B, :] += ...\n"
              "return dq, dk, dv"))
def check_causal_backward(backward: Callable) -> CheckResult:
    """Exercise: ``backward(q, k, v, O, lse, d_out, B) -> (dq, dk, dv)``, causal, B x B tiles."""
    overflow = "exp(S) overflowed: never exponentiate a raw score; P = exp(S - lse) is at most 1."
    short_tile = ("when n is not a multiple of B, the last tile is shorter than B: take each tile's "
                  "size and positions from its slice.")
    return check_function(backward, causal_backward_reference, _cases(),
                          what="causal_backward", output_names=("dq", "dk", "dv"), mistakes=_mistakes(),
                          nan_hint=overflow, atol=1e-9, rtol=1e-7, watch=_no_full_scores,
                          error_hints=[("must match the size of tensor", short_tile)])


def _linear_case(g, batch, d_k, d_v, before: int) -> dict:     # the state of `before` tokens, token t
    rand = _randn(g, batch)
    phi_k, v = elu_feature_map(rand(before, d_k)), rand(before, d_v)
    return {"S": phi_k.mT @ v, "z": phi_k.sum(-2), "q_t": rand(d_k), "k_t": rand(d_k), "v_t": rand(d_v)}


def _step_with(S, z, q_t, k_t, v_t, *, phi=elu_feature_map, read_first=False, normalise=True,
               replace=False, z_term="phi_k", phi_v=False, old_z=False, eps=0.0,
               z_by=lambda pq, pk: pq, phi_k=True, softmax=False, scaled=""):
    """One step with one thing changed (``z_by``: what reads z; ``scaled``: divided by sqrt(d_k))."""
    q_t, k_t = (x / math.sqrt(x.shape[-1]) if s in scaled else x for s, x in (("q", q_t), ("k", k_t)))
    pq, pk, v_t = phi(q_t), phi(k_t) if phi_k else k_t, (elu_feature_map(v_t) if phi_v else v_t)
    outer = pk[..., :, None] * v_t[..., None, :]
    S_new = outer if replace else S + outer
    z_new = {"phi_k": pk, "k": k_t, "phi_q": pq}[z_term] + (0 if replace else z)
    S_read, z_read = (S, z) if read_first else (S_new, z if old_z else z_new)
    pq = pq.softmax(-1) if softmax else pq
    num = (pq[..., None, :] @ S_read).squeeze(-2)
    o = num / ((z_by(pq, pk) * z_read).sum(-1, keepdim=True) + eps) if normalise else num
    return o, S_new, z_new


def linear_step_reference(S, z, q_t, k_t, v_t):         # add token t, then read: (o_t, S_t, z_t)
    return _step_with(S, z, q_t, k_t, v_t)


def _linear_mistakes() -> list[Mistake]:
    return [Mistake(lambda *a, _f=flaw: _step_with(*a, **_f), hint) for flaw, hint in [
        ({"read_first": True}, "o_t was read from the state before token t was added: token t "
                               "must see itself (add first, then read)."),
        ({"old_z": True}, "the normaliser used z before token t was added: read both with S_t, z_t."),
        ({"z_by": lambda q, k: k}, "the normaliser was read with phi(k_t): phi(q_t) reads S_t and z_t."),
        ({"z_by": lambda q, k: 1}, "the normaliser summed z_t alone: it is phi(q_t)^T z_t."),
        ({"normalise": False}, "the normaliser is missing: divide phi(q_t)^T S_t by phi(q_t)^T z_t."),
        ({"replace": True}, "the state was replaced by token t's terms, not added to: "
                            "S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t)."),
        ({"z_term": "k"}, "z collected k_t itself: z_t = z_{t-1} + phi(k_t)."),
        ({"z_term": "phi_q"}, "z collected phi(q_t): z sums the keys, z_t = z_{t-1} + phi(k_t)."),
        ({"phi": F.elu}, "phi = elu without the + 1: elu(x) + 1 > 0 keeps the normaliser off 0."),
        ({"phi": F.relu}, "phi = relu: the feature map here is elu(x) + 1 (Katharopoulos et al.)."),
        ({"phi": torch.exp}, "phi = exp: exp(q).exp(k) is not the softmax's exp(q.k); phi = elu + 1."),
        ({"phi": lambda x: torch.exp(x / math.sqrt(x.shape[-1]))}, "phi = exp(x / sqrt(d_k)): "
         "exp(q/sqrt(d)).exp(k/sqrt(d)) is not the softmax's exp(q.k/sqrt(d)) either; phi = elu + 1."),
        *[({"scaled": key}, f"{who} scaled by 1 / sqrt(d_k) before phi: linear attention has no "
           "such scale; phi = elu + 1 on q_t and k_t as given.")
          for key, who in (("qk", "q_t and k_t were"), ("q", "only q_t was"), ("k", "only k_t was"))],
        ({"phi": lambda x: x}, "no feature map: phi(x) = elu(x) + 1 is applied to q_t and k_t."),
        ({"phi_v": True}, "phi was applied to the value too: only q_t and k_t go through it."),
        ({"phi_k": False}, "phi(k_t) is missing: the key goes through the feature map too."),
        ({"softmax": True, "normalise": False}, "a softmax over phi(q_t) sums to 1 over the d_k "
         "features, not over the past tokens: the normaliser reads z_t, as the numerator reads S_t."),
        *[({"eps": eps}, f"an eps of {eps:g} in the normaliser shifts o_t a little: up to 1e-6 passes.")
          for eps in (1e-2, 1e-3, 1e-4, 1e-5)],
    ]] + [Mistake(lambda *a, _o=order: tuple(_step_with(*a)[i] for i in _o), "the values came back in "
                  "another order: return (o_t, S_t, z_t), the output first, then the new state.")
          for order in itertools.permutations(range(3)) if order != (0, 1, 2)]


_SHAPES = ("the shapes do not line up (d_k != d_v here). Either the outer product is transposed (S "
           "is (..., d_k, d_v): token t adds phi(k_t) v_t^T, not v_t phi(k_t)^T), or the normaliser "
           "phi(q_t)^T z_t lost its summed axis: keep it (keepdim=True), a (..., 1) normaliser.")
_SIDE = ("S was read from the wrong side: S is (..., d_k, d_v) and d_k != d_v here, so phi(q_t) "
         "reads it from the left, phi(q_t)^T S_t (..., d_v), not S_t phi(q_t).")
_OUTER = ("torch.outer takes 1-D vectors only, and this case has a batch: build a batched outer "
          "product by broadcasting (a size-1 axis in each factor) or with torch.einsum.")


@exercise("complexity.linear_step", "one step of causal linear attention: state in, state out", hints=(
              "In the formula above, which factor of each term depends on j, and which does "
              "not? Take the one that does not out of the sums: what is left is the state. Add "
              "token t's terms first, then read with phi(q_t). phi(x) = elu(x) + 1.",
              "Once phi(q_t) is out, the sums over past keys no longer depend on the query: S "
              "(numerator) and z (denominator) carry them, and step t adds token t's terms. "
              "Then phi(q_t) reads the new state; keep the denominator (..., 1).",
              "pq, pk = torch.nn.functional.elu(q_t) + 1, torch.nn.functional.elu(k_t) + 1\n"
              "S_t = ...                            # (..., d_k, d_v): S plus token t's term\n"
              "z_t = ...                            # (..., d_k): z plus token t's term\n"
              "o_t = ...                            # (..., d_v): the new state read with phi(q_t)\n"
              "return o_t, S_t, z_t"))
def check_linear_step(step: Callable) -> CheckResult:
    """Exercise: ``step(S, z, q_t, k_t, v_t) -> (o_t, S_t, z_t)``; an ``eps`` up to 1e-6 passes."""
    g = seeded(86)
    cases = [_linear_case(g, (), 4, 3, 6), _linear_case(g, (2, 3), 3, 5, 4),
             _linear_case(g, (), 2, 3, 0), _linear_case(g, (2,), 6, 2, 9)]
    return check_function(step, linear_step_reference, cases, what="linear_step",
                          output_names=("o_t", "S_t", "z_t"), mistakes=_linear_mistakes(),
                          nan_hint="a normaliser of 0: add token t before reading, and use "
                                   "phi = elu + 1, which keeps it positive.",
                          error_hints=[("must match the size of tensor", _SHAPES),
                                       ("outer: Expected 1-D", _OUTER), ("cannot be multiplied", _SIDE),
                                       ("does not broadcast with previously seen size", _SIDE)],
                          atol=1e-9, rtol=1e-5)   # rtol: accepts the usual + eps <= 1e-6 below
