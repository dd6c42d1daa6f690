r"""Exercise 2 of notebook 08: FlashAttention-2's backward pass for causal attention
(``complexity.causal_backward``): ``(dq, dk, dv)`` from what the forward saved (``O`` and the
per-row ``lse``), in tiles of ``B`` queries by ``B`` keys (Dao 2023, Algorithm 2). Registered when
:mod:`.complexity` is imported (at its end, before exercise 3).

While the learner's function runs, autograd (by any route), the exact attention and the package's
backward tile are refused, and so is any tensor as large as the ``(..., n, n)`` scores or larger
than one tile of ``B`` queries by ``B`` keys needs, and work on the tiles wholly above the diagonal
(:mod:`.complexity_watch`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .. import efficient
from .complexity_watch import INSTEAD, BackwardWatch
from .core import CheckResult, Mistake, seeded
from .workflow import exercise

__all__ = ["check_causal_backward", "causal_backward_reference"]

F64 = torch.float64
GRADS = ("dq", "dk", "dv")


def causal_backward_reference(q, k, v, O, lse, d_out, B):
    """FlashAttention-2's causal backward, written out (the checker blocks the package's): key
    tiles outside, query tiles inside, from the first query tile that reaches the diagonal."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    D = (d_out * O).sum(dim=-1, keepdim=True)                       # (..., n, 1), whole rows
    lse = lse.unsqueeze(-1)                                         # (..., n, 1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, n, B):                                        # K_j, V_j
        J, cols = slice(j, j + B), torch.arange(j, min(j + B, n))
        for i in range(j, n, B):                                    # Q_i with i + B > j
            I, rows = slice(i, i + B), torch.arange(i, min(i + B, n))
            S = (q[..., I, :] @ k[..., J, :].mT * scale).masked_fill(cols > rows[:, None], -math.inf)
            P = torch.exp(S - lse[..., I, :])
            dS = P * (d_out[..., I, :] @ v[..., J, :].mT - D[..., I, :])
            dq[..., I, :] += dS @ k[..., J, :] * scale
            dk[..., J, :] += dS.mT @ q[..., I, :] * scale
            dv[..., J, :] += P.mT @ d_out[..., I, :]
    return dq, dk, dv


# --- the cases ----------------------------------------------------------------------------------


def _case(g, batch, n, d_k, d_v, B, *, large=False) -> dict:
    """Causal attention over ``n`` tokens: inputs, the forward's ``O`` and ``lse`` ``(..., n)``."""
    def rand(*shape):
        return torch.randn(*batch, *shape, generator=g, dtype=F64)

    q, k, v, d_out = rand(n, d_k), rand(n, d_k), rand(n, d_v), rand(n, d_v)
    if large:                                                       # scores near 1000
        q[..., 0], k[..., 0] = 1000.0 * math.sqrt(d_k), 1.0
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    s = (q @ k.mT / math.sqrt(d_k)).masked_fill(future, -math.inf)
    return {"q": q, "k": k, "v": v, "O": torch.softmax(s, dim=-1) @ v,
            "lse": torch.logsumexp(s, dim=-1), "d_out": d_out, "B": B}


def _cases() -> list[dict]:
    g = seeded(84)
    return [_case(g, (), 16, 3, 2, 4),            # n = 4 B; a tile is smaller than a strip
            _case(g, (2, 3), 10, 2, 3, 4),        # batch and heads; a short last tile
            _case(g, (), 5, 2, 3, 1),             # B = 1: one token per tile
            _case(g, (2,), 6, 4, 3, 8),           # B >= n: one tile, on the diagonal
            _case(g, (), 13, 4, 4, 5)]            # 13 = 2 * 5 + 3


def _large_cases() -> list[dict]:
    """Scores near 1000: exp(S) overflows, exp(S - lse) does not."""
    return [_case(seeded(85), (), 8, 2, 2, 3, large=True)]


# --- the known mistakes -------------------------------------------------------------------------


def _backward_with(q, k, v, O, lse, d_out, B, *, visit="causal", mask="causal",  # noqa: C901
                   fill=-math.inf, mask_ds_only=False, tile_d=False, local_softmax=False,
                   scale_grads=(True, True), scale_scores=True, assign=(), lse_keys=False,
                   d_keys=False, no_lse=False, no_d=False):
    """The backward with one thing changed. ``visit``: which tiles are computed ("causal": all but
    those above the diagonal; "all"; "below": only ``j < i``, the diagonal tiles skipped);
    ``mask``: the mask in a visited tile; ``assign``: which of dq, dk, dv are assigned, not added."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    D = (d_out * O).sum(dim=-1, keepdim=not d_keys)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, n, B):
        J, cols = slice(j, j + B), torch.arange(j, min(j + B, n))[None, :]
        for i in range(0, n, B):
            if {"causal": j >= i + B, "all": False, "below": j >= i}[visit]:
                continue
            I, rows = slice(i, i + B), torch.arange(i, min(i + B, n))[:, None]
            allowed = {"causal": cols <= rows, "none": cols >= 0, "strict": cols < rows,
                       "inverted": cols > rows,                      # "local": the tile's own
                       "local": cols - j <= rows - i}[mask]           # indices, not positions
            S = q[..., I, :] @ k[..., J, :].mT * (scale if scale_scores else 1.0)
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
                      "dv": (dv, J, P.mT @ d_out[..., I, :])}
            for name, (grad, rows_of, share) in shares.items():
                grad[..., rows_of, :] = share + (0 if name in assign else grad[..., rows_of, :])
    return dq, dk, dv


def _wrong(message: str, *variants: dict) -> list[Mistake]:
    return [Mistake(lambda *a, _v=v: _backward_with(*a, **_v), message) for v in variants]


def _mistakes() -> list[Mistake]:
    return [
        *_wrong("no causal mask: keys after a query leaked into its gradients (every tile was "
                "computed, none masked). A tile wholly above the diagonal contributes nothing; "
                "skip it, and mask the future keys where a tile crosses the diagonal.",
                {"visit": "all", "mask": "none"}),
        *_wrong("the tiles that cross the diagonal were not masked: skipping the tiles above it is "
                "not enough, a diagonal tile holds future keys too.", {"mask": "none"}),
        *_wrong("the diagonal tiles were skipped (j >= i rather than j >= i + B): they hold each "
                "token's own key and its nearest past keys; only a tile whose first key comes "
                "after its last query is wholly above the diagonal.", {"visit": "below"}),
        *_wrong("the mask was built from the tile's own indices (a tril of the tile, from 0): it "
                "must compare token positions, i + a for query a and j + b for key b. A tile "
                "below the diagonal needs no mask at all.", {"mask": "local"},
                {"mask": "local", "visit": "all"}),
        *_wrong("the diagonal was masked: query t may attend to key t itself (key <= query).",
                {"mask": "strict"}),
        *_wrong("the mask is inverted: it kept the future keys and removed the past ones.",
                {"mask": "inverted"}, {"mask": "inverted", "visit": "all"}),
        *_wrong("the masked scores were set to 0, not -inf: exp(0 - lse) is not 0, so future keys "
                "still got weight; fill with -inf (or zero P where masked).",
                {"fill": 0.0}, {"fill": 0.0, "visit": "all"}),
        *_wrong("dS was masked but P was not: dV_j = P^T dO_i still collected future keys; mask "
                "the scores before the exponential.", {"mask_ds_only": True}),
        *_wrong("D was recomputed as rowsum(P * dP) over one tile: D = rowsum(dO * O) covers the "
                "whole row, which no tile sees; compute it once, from O, before the loops.",
                {"tile_d": True}),
        *_wrong("P was normalised within the tile (a softmax over its keys): the row's other tiles "
                "hold the rest of its weight. P = exp(S - lse), with the lse of the whole row "
                "that the forward pass saved.", {"local_softmax": True}),
        *_wrong("dS = P * dP misses its second term: the softmax's backward subtracts, in each "
                "row, the weighted mean of dP (the same number for every key of the row), which "
                "section 5 called D.", {"no_d": True}),
        *_wrong("P = exp(S) without the lse: the tile's P is exp(S - lse), each row normalised by "
                "the log-sum-exp of its whole row.", {"no_lse": True}),
        *_wrong("lse broadcast along the keys: lse is (..., n), so its slice (..., B) lines up "
                "with a tile's last axis (the keys); give each row its own, lse.unsqueeze(-1).",
                {"lse_keys": True}),
        *_wrong("D broadcast along the keys: rowsum(dO * O) without keepdim is (..., n) and its "
                "slice lines up with a tile's last axis (the keys); keep it (..., n, 1).",
                {"d_keys": True}),
        *_wrong("the scores miss the scale: S = Q_i K_j^T / sqrt(d_k), as in the forward pass "
                "that computed lse.", {"scale_scores": False}),
        *_wrong("dq or dk misses the scale: S = Q K^T / sqrt(d_k), so both gradients carry "
                "1 / sqrt(d_k) (the chain rule through the scaling).",
                {"scale_grads": (False, False)}, {"scale_grads": (False, True)},
                {"scale_grads": (True, False)}),
        *_wrong("dK_j or dV_j was assigned in each query tile, not added: the last query tile "
                "overwrote the others. Every query tile that sees key tile j adds its share.",
                {"assign": ("dk", "dv")}, {"assign": ("dk",)}, {"assign": ("dv",)}),
        *_wrong("dQ_i was assigned in each key tile, not added: the last key tile overwrote the "
                "others. Every key tile that query tile i sees adds its share.",
                {"assign": ("dq",)}, {"assign": ("dq", "dk", "dv")}),
    ]


@exercise("complexity.causal_backward", "FlashAttention-2's backward for causal attention, in tiles",
          hints=(
              "Section 5 had one block of queries: each key tile's dK_j and dV_j were done in one "
              "step, and no tile was masked. Here the queries come in tiles of B too, and the mask "
              "is causal. Which pairs of tiles contribute anything, which need the mask, and which "
              "results are complete only once a loop has finished?",
              "Compare a tile's last query position with its first key position: when can the "
              "tile contribute nothing at all, and when does it need the mask? P and D are about "
              "whole rows, which no tile sees: what did the forward pass save for each row, and "
              "which of the saved tensors give D without any P? Which of dQ, dK, dV is complete "
              "only after the inner loop, and which only after the outer one?",
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
    """Exercise: ``backward(q, k, v, O, lse, d_out, B) -> (dq, dk, dv)`` for causal attention over
    ``n`` tokens: ``q``, ``k`` ``(..., n, d_k)``, ``v``, ``O``, ``d_out`` ``(..., n, d_v)``, ``lse``
    ``(..., n)``; tiles of ``B`` queries by ``B`` keys (``n`` need not be a multiple of ``B``).
    Checked against the written-out reference (tested equal to autograd)."""
    from .complexity import _EXACT, _stages  # defined there; this module is imported at its end

    overflow = "exp(S) overflowed: never exponentiate a raw score; P = exp(S - lse) is at most 1."
    short_tile = ("when n is not a multiple of B, the last tile is shorter than B: take each tile's "
                  "size (and its positions) from its slice, not from B.")
    forbid = [(efficient, "backward_tile"), (efficient, "_scores"), *_EXACT]
    cases, large = _cases(), _large_cases()
    watch = BackwardWatch(len(cases) + len(large))
    result = _stages(backward, causal_backward_reference,
                     [(cases, _mistakes(), overflow), (large, [], overflow)],
                     what="causal_backward", output_names=GRADS, atol=1e-9, rtol=1e-7,
                     forbid=forbid, instead=INSTEAD, guard=watch.guard,
                     error_hints=[("must match the size of tensor", short_tile)])
    return CheckResult(False, watch.excess) if result and watch.excess else result
