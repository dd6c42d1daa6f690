r"""Checkers for notebook 08 (complexity): one FlashAttention tile update
(``complexity.tile_update``), one key/value tile of FlashAttention-2's backward
(``complexity.backward_tile``), and causal linear attention by running sums
(``complexity.causal_linear``).

A state is the online softmax's ``(m, l, acc)``: ``m`` ``(..., n_q, 1)`` the running maximum of
the scores (``-inf`` before any key), ``l`` ``(..., n_q, 1)`` the sum of ``exp(s - m)`` and ``acc``
``(..., n_q, d_v)`` the sum of ``exp(s - m) v``; ``acc / l`` is the attention output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from ..efficient import (
    OnlineSoftmaxState,
    backward_tile,
    block_state,
    elu_feature_map,
    linear_attention,
    online_softmax_step,
)
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_tile_update", "check_backward_tile", "check_causal_linear",
           "tile_update_reference", "backward_tile_reference", "causal_linear_reference"]

F64 = torch.float64
STATE = ("m (running max)", "l (running sum)", "acc (running output)")


def _stages(candidate, reference, stages, *, what, output_names, atol, rtol) -> CheckResult:
    """:func:`check_function` over groups ``(cases, mistakes, nan_hint)``, each with its own
    hints; the first miss is reported (numbered among all cases), else one verdict. A later
    group is reached only by answers that pass the earlier ones, where the known mistakes fail:
    it needs no mistakes, only its ``nan_hint``."""
    total, done = sum(len(cases) for cases, _, _ in stages), 0
    for cases, mistakes, nan_hint in stages:
        result = check_function(candidate, reference, cases, what=what, output_names=output_names,
                                mistakes=mistakes, nan_hint=nan_hint, atol=atol, rtol=rtol)
        if not result:
            return CheckResult(False, re.sub(r"on case (\d+) of \d+", lambda m, done=done: (
                f"on case {int(m[1]) + done} of {total}"), result.message, count=1))
        done += len(cases)
    return CheckResult(True, f"Passed: {what} matches the reference on all {total} cases, "
                             "edge cases included.")


# --- exercise 1: one FlashAttention tile --------------------------------------------------------


def tile_update_reference(m, l, acc, q, k, v):  # noqa: E741 - the paper's name
    """Fold the key tile ``k`` ``(..., b_k, d_k)``, ``v`` ``(..., b_k, d_v)`` into the state of the
    query tile ``q`` ``(..., b_q, d_k)``; scores ``q k^T / sqrt(d_k)``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])       # (..., b_q, b_k)
    return tuple(online_softmax_step(OnlineSoftmaxState(m, l, acc), scores, v))


def _state_after(scores: torch.Tensor, values: torch.Tensor) -> tuple:
    return tuple(block_state(scores, values))


def _tile_cases() -> list[dict]:
    g = seeded(80)
    cases = []
    for batch, b_q, b_k, d_k, d_v, size, start in [
        ((), 4, 4, 8, 8, 1.0, "seen"), ((2, 3), 3, 5, 4, 6, 1.0, "seen"),
        ((), 1, 1, 2, 3, 1.0, "seen"), ((2,), 4, 3, 8, 2, 1.0, "empty"),
        ((), 3, 4, 16, 4, 12.0, "seen"),
    ]:
        def rand(*shape, g=g, batch=batch):
            return torch.randn(*batch, *shape, generator=g, dtype=F64)

        q, k, v = size * rand(b_q, d_k), size * rand(b_k, d_k), rand(b_k, d_v)
        if start == "empty":                                        # the first tile of a row
            m = torch.full((*batch, b_q, 1), -math.inf, dtype=F64)
            l, acc = torch.zeros_like(m), torch.zeros(*batch, b_q, d_v, dtype=F64)  # noqa: E741
        else:                                                       # after a tile of 3 keys
            old = rand(b_q, 3) * size * math.sqrt(d_k) / 4
            m, l, acc = _state_after(old, rand(3, d_v))  # noqa: E741
        cases.append({"m": m, "l": l, "acc": acc, "q": q, "k": k, "v": v})
    return cases


def _large_tile_cases() -> list[dict]:
    """Scores near 1000 (``exp`` overflows past 709), the old max below the tile's."""
    g = seeded(81)
    q, k = torch.randn(2, 8, generator=g, dtype=F64), torch.randn(3, 8, generator=g, dtype=F64)
    q[:, 0], k[:, 0] = 1000.0 * math.sqrt(8), 1.0                   # every score 1000 + noise
    m, l, acc = _state_after(999.0 + torch.randn(2, 3, generator=g, dtype=F64),  # noqa: E741
                             torch.randn(3, 4, generator=g, dtype=F64))
    return [{"m": m, "l": l, "acc": acc, "q": q, "k": k,
             "v": torch.randn(3, 4, generator=g, dtype=F64)}]


def _tile_with(m, l, acc, q, k, v, *, scale=None, rescale_l=True, rescale_acc=True,  # noqa: E741
               block_max=False, normalise=False, finish=False):
    """The tile update with one thing changed, for the known mistakes."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    c = torch.exp(m - m_new)
    p = torch.exp(s - (s.amax(-1, keepdim=True) if block_max else m_new))
    if normalise:
        p = p / p.sum(-1, keepdim=True)
    l_new = (c * l if rescale_l else l) + p.sum(-1, keepdim=True)
    acc_new = (c * acc if rescale_acc else acc) + p @ v
    return m_new, l_new, acc_new / l_new if finish else acc_new


@exercise("complexity.tile_update", "one FlashAttention tile: fold a key tile into the running "
          "state", hints=(
              "The tile's scores are q k^T / sqrt(d_k). The running max can only grow; whatever "
              "l and acc summed before was measured against the old max m, and must be re-expressed "
              "against the new one before the tile's own terms are added.",
              "s = q k^T / sqrt(d_k);  m' = max(m, max_j s_j);  p = exp(s - m');  "
              "l' = exp(m - m') l + sum_j p_j;  acc' = exp(m - m') acc + p v.",
              "s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
              "m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n"
              "c, p = torch.exp(m - m_new), torch.exp(s - m_new)\n"
              "return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v"))
def check_tile_update(tile_update: Callable) -> CheckResult:
    """Exercise: ``tile_update(m, l, acc, q, k, v) -> (m, l, acc)``: ``m``, ``l`` ``(..., b_q, 1)``,
    ``acc`` ``(..., b_q, d_v)``, ``q`` ``(..., b_q, d_k)``, ``k`` ``(..., b_k, d_k)``, ``v``
    ``(..., b_k, d_v)``; the same shapes out."""
    mistakes = [
        Mistake(lambda *a: _tile_with(*a, scale=1.0),
                "the scores were not scaled: divide q k^T by sqrt(d_k), as in the attention formula."),
        Mistake(lambda *a: _tile_with(*a, scale=1 / a[3].shape[-1]),
                "the scores were divided by d_k; the scale is 1 / sqrt(d_k)."),
        Mistake(lambda *a: _tile_with(*a, scale=1 / math.sqrt(a[5].shape[-1])),
                "the scale used the values' width d_v; it is 1 / sqrt(d_k), the width of q and k."),
        Mistake(lambda *a: _tile_with(*a, rescale_acc=False),
                "l was rescaled but acc was not: acc's old terms were measured against the old "
                "max too, so acc needs the same factor exp(m - m_new) as l."),
        Mistake(lambda *a: _tile_with(*a, rescale_l=False, rescale_acc=False),
                "neither l nor acc was rescaled. When the max grows from m to m_new, every old "
                "term exp(s - m) must become exp(s - m_new): multiply both by exp(m - m_new)."),
        Mistake(lambda *a: _tile_with(*a, block_max=True),
                "the tile was exponentiated against its own max, but l and acc are kept against "
                "the running max m_new: use exp(s - m_new)."),
        Mistake(lambda *a: _tile_with(*a, normalise=True),
                "the tile's weights were normalised (a softmax over the tile) before being added: "
                "add the raw exp(s - m_new); the division by l comes once, after the last tile."),
        Mistake(lambda *a: _tile_with(*a, finish=True),
                "acc came back divided by l: that is the output so far, not the running state; "
                "keep acc unnormalised and divide only after the last tile."),
    ]
    overflow = ("exp of a large score overflows to inf: subtract the new running max m_new = "
                "max(m, max of the tile's scores) before exponentiating.")
    return _stages(tile_update, tile_update_reference,
                   [(_tile_cases(), mistakes, overflow), (_large_tile_cases(), [], overflow)],
                   what="tile_update", output_names=STATE, atol=1e-9, rtol=1e-7)


# --- exercise 2: one tile of FlashAttention-2's backward ----------------------------------------


GRADS = ("dq (this tile's share of dQ)", "dk_j", "dv_j")


def backward_tile_reference(q, k_j, v_j, d_out, lse, D):
    """``(dq, dk_j, dv_j)`` of the key/value tile ``k_j``, ``v_j`` for all queries ``q``, from the
    saved ``lse`` and ``D = rowsum(dO * O)`` ``(..., n_q, 1)``; scale ``1 / sqrt(d_k)``."""
    return backward_tile(q, k_j, v_j, d_out, lse, D)


def _backward_case(g, batch, n_q, n_k, d_k, d_v, tile, size=1.0, large=False):
    """Inputs of one tile (keys ``tile``, a slice of ``0..n_k``), the lse and D of all keys;
    ``large``: every score near 1000."""
    def rand(*shape):
        return torch.randn(*batch, *shape, generator=g, dtype=F64)

    q, k, v, d_out = size * rand(n_q, d_k), rand(n_k, d_k), rand(n_k, d_v), rand(n_q, d_v)
    if large:
        q[..., 0], k[..., 0] = 1000.0 * math.sqrt(d_k), 1.0
    s = q @ k.transpose(-2, -1) / math.sqrt(d_k)                     # (..., n_q, n_k)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)                   # (..., n_q, 1)
    out = torch.softmax(s, dim=-1) @ v
    return {"q": q, "k_j": k[..., tile, :], "v_j": v[..., tile, :], "d_out": d_out, "lse": lse,
            "D": (d_out * out).sum(dim=-1, keepdim=True)}


def _backward_cases() -> list[dict]:
    g = seeded(84)
    return [_backward_case(g, (), 5, 12, 8, 8, slice(4, 8)),        # a middle tile
            _backward_case(g, (2, 3), 4, 9, 4, 6, slice(0, 3)),     # batch, heads, d_k != d_v
            _backward_case(g, (), 1, 5, 2, 3, slice(4, 5)),         # one query, one key
            _backward_case(g, (2,), 6, 10, 16, 4, slice(6, 10), size=4.0)]


def _large_backward_cases() -> list[dict]:
    """Scores near 1000: exp(S) overflows, exp(S - lse) does not."""
    return [_backward_case(seeded(85), (), 3, 8, 8, 4, slice(2, 6), large=True)]


def _backward_with(q, k_j, v_j, d_out, lse, D, *, scale_grads=True, scale_scores=True, p=None,
                   d=None, sign=1.0):
    """The tile's gradients with one thing changed, for the known mistakes."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k_j.transpose(-2, -1) * (scale if scale_scores else 1.0)
    P = torch.exp(s - lse) if p is None else p(s)
    dP = d_out @ v_j.transpose(-2, -1)
    D = D if d is None else d(P, dP, d_out, v_j)
    dS = P * (dP - sign * D)
    g = scale if scale_grads else 1.0
    return dS @ k_j * g, dS.transpose(-2, -1) @ q * g, P.transpose(-2, -1) @ d_out


def _backward_mistakes() -> list[Mistake]:
    return [
        Mistake(lambda *a: _backward_with(*a, d=lambda P, dP, dO, v: (P * dP).sum(-1, keepdim=True)),
                "D was recomputed as rowsum(P * dP) over this tile alone; D = rowsum(dO * O) = "
                "rowsum(P * dP) summed over ALL keys of the row: use the D you are given."),
        Mistake(lambda *a: _backward_with(*a, d=lambda P, dP, dO, v: torch.zeros_like(P[..., :1])),
                "dS = P * dP is missing the - D term: the softmax's Jacobian gives "
                "dS = P * (dP - D), D = rowsum(dO * O)."),
        Mistake(lambda *a: _backward_with(*a, sign=-1.0),
                "D was added instead of subtracted: dS = P * (dP - D)."),
        Mistake(lambda *a: _backward_with(*a, scale_grads=False),
                "dq and dk_j miss the scale: S = Q K^T / sqrt(d_k), so dQ = dS K_j / sqrt(d_k) and "
                "dK_j = dS^T Q / sqrt(d_k) (the chain rule through the scaling)."),
        Mistake(lambda *a: _backward_with(*a, scale_scores=False),
                "the scores were not scaled before exp: P = exp(Q K_j^T / sqrt(d_k) - lse)."),
        Mistake(lambda *a: _backward_with(*a, p=lambda s: torch.softmax(s, dim=-1)),
                "P was not recomputed from lse: a softmax over this tile alone normalises over its "
                "keys only; P = exp(S - lse) divides by the whole row's sum, saved as lse."),
        Mistake(lambda *a: _backward_with(*a, p=lambda s: torch.exp(s - s.amax(-1, keepdim=True))),
                "P was recomputed against the tile's own max, not from lse: P = exp(S - lse) is "
                "the softmax over the whole row, already normalised."),
    ]


@exercise("complexity.backward_tile", "one key/value tile of FlashAttention-2's backward", hints=(
    "Nothing of size n x n was saved: rebuild this tile's weights P from the scores and the saved "
    "log-sum-exp, then follow the chain rule backwards through O = P V, the softmax and the "
    "scaling S = Q K^T / sqrt(d_k). D, the softmax's row term, is given: it covers all keys.",
    "S = Q K_j^T / sqrt(d_k);  P = exp(S - lse);  dV_j = P^T dO;  dP = dO V_j^T;  "
    "dS = P * (dP - D);  dQ = dS K_j / sqrt(d_k);  dK_j = dS^T Q / sqrt(d_k).",
    "scale = 1 / math.sqrt(q.shape[-1])\n"
    "p = torch.exp(q @ k_j.transpose(-2, -1) * scale - lse)\n"
    "ds = p * (d_out @ v_j.transpose(-2, -1) - D)\n"
    "return ds @ k_j * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ d_out"))
def check_backward_tile(tile: Callable) -> CheckResult:
    """Exercise: ``backward_tile(q, k_j, v_j, d_out, lse, D) -> (dq, dk_j, dv_j)``: ``q``
    ``(..., n_q, d_k)``, ``k_j`` ``(..., b_k, d_k)``, ``v_j`` ``(..., b_k, d_v)``, ``d_out``
    ``(..., n_q, d_v)``, ``lse`` and ``D`` ``(..., n_q, 1)``; ``dq`` is this tile's share of dQ."""
    overflow = ("exp(S) overflowed: never exponentiate a raw score; P = exp(S - lse) is at most 1.")
    return _stages(tile, backward_tile_reference,
                   [(_backward_cases(), _backward_mistakes(), overflow),
                    (_large_backward_cases(), [], overflow)],
                   what="backward_tile", output_names=GRADS, atol=1e-9, rtol=1e-7)


# --- exercise 3: causal linear attention by running sums ---------------------------------------


def causal_linear_reference(q, k, v):
    """``out_t = phi(q_t)^T S_t / phi(q_t)^T z_t`` with ``S_t = sum_{j<=t} phi(k_j) v_j^T`` and
    ``z_t = sum_{j<=t} phi(k_j)``, ``phi = elu + 1``: ``linear_attention(q, k, v, causal=True)``."""
    return linear_attention(q, k, v, causal=True)


def _linear_cases() -> list[dict]:
    g = seeded(86)
    cases = []
    for batch, n, d_k, d_v in [((), 7, 4, 4), ((2, 3), 9, 3, 5), ((), 1, 2, 3), ((2,), 12, 8, 2)]:
        q, k, v = (torch.randn(*batch, n, d, generator=g, dtype=F64) for d in (d_k, d_k, d_v))
        cases.append({"q": q, "k": k, "v": v})
    return cases


def _linear_with(q, k, v, *, phi=elu_feature_map, prefix="inclusive", normalise="causal",
                 phi_v=False):
    """Causal linear attention with one thing changed, for the known mistakes."""
    pq, pk = phi(q), phi(k)
    v = elu_feature_map(v) if phi_v else v
    a = pq @ pk.transpose(-2, -1)                                    # (..., n, n) phi(q_t) . phi(k_j)
    n = q.shape[-2]
    keep = {"inclusive": torch.ones(n, n).tril(), "exclusive": torch.ones(n, n).tril(-1),
            "all": torch.ones(n, n), "one ahead": torch.ones(n, n).tril(1)}[prefix].to(F64)
    a_masked = a * keep
    num = a_masked @ v
    if normalise == "none":
        return num
    den = (a if normalise == "all" else a_masked).sum(-1, keepdim=True)
    return num / den


def _linear_mistakes() -> list[Mistake]:
    return [
        Mistake(lambda *a: _linear_with(*a, prefix="all"),
                "the sums ran over every token, future included (non-causal): S_t and z_t may "
                "only add phi(k_j) v_j^T and phi(k_j) for j <= t."),
        Mistake(lambda *a: _linear_with(*a, prefix="one ahead"),
                "the sums at step t include token t + 1, from the future: update S and z with "
                "token t, read them at t, and only then move on."),
        Mistake(lambda *a: _linear_with(*a, prefix="exclusive"),
                "token t does not see itself: the running sums were read before token t was "
                "added (j < t); they must include j = t."),
        Mistake(lambda *a: _linear_with(*a, normalise="none"),
                "the normaliser is missing: divide phi(q_t)^T S_t by phi(q_t)^T z_t."),
        Mistake(lambda *a: _linear_with(*a, normalise="all"),
                "the normaliser z summed over all tokens while S was causal: both run over j <= t."),
        Mistake(lambda *a: _linear_with(*a, phi=lambda x: torch.nn.functional.elu(x)),
                "phi = elu without the + 1: the feature map is elu(x) + 1, positive, so the "
                "normaliser never reaches 0."),
        Mistake(lambda *a: _linear_with(*a, phi=lambda x: x),
                "no feature map: phi(x) = elu(x) + 1 is applied to q and k (raw dot products can "
                "be negative and the normaliser can cross 0)."),
        Mistake(lambda *a: _linear_with(*a, phi_v=True),
                "phi was applied to the values too: only q and k go through the feature map."),
    ]


@exercise("complexity.causal_linear", "causal linear attention by running sums", hints=(
    "Walk t = 0, 1, ..., n - 1 and keep two running sums over the tokens so far: a d_k x d_v "
    "matrix and a d_k vector. Add token t to them first, then read them with phi(q_t). "
    "phi(x) = elu(x) + 1 (torch.nn.functional.elu).",
    "phi = elu + 1;  S_t = S_{t-1} + phi(k_t) v_t^T;  z_t = z_{t-1} + phi(k_t);  "
    "out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t).",
    "pq, pk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1\n"
    "S = q.new_zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]))\n"
    "z, outs = q.new_zeros((*q.shape[:-2], q.shape[-1])), []\n"
    "for t in range(q.shape[-2]):\n"
    "    S = S + pk[..., t, :, None] * v[..., t, None, :]\n"
    "    z = z + pk[..., t, :]\n"
    "    num = (pq[..., t, None, :] @ S).squeeze(-2)\n"
    "    outs.append(num / (pq[..., t, :] * z).sum(-1, keepdim=True))\n"
    "return torch.stack(outs, dim=-2)"))
def check_causal_linear(causal_linear: Callable) -> CheckResult:
    """Exercise: ``causal_linear(q, k, v) -> out``: ``q``, ``k`` ``(..., n, d_k)``, ``v``
    ``(..., n, d_v)``; ``out`` ``(..., n, d_v)``, equal to ``linear_attention(causal=True)``."""
    return check_function(causal_linear, causal_linear_reference, _linear_cases(),
                          what="causal_linear", output_names=("out",), mistakes=_linear_mistakes(),
                          nan_hint="a normaliser of 0 or below: phi = elu + 1 keeps it positive.",
                          atol=1e-9, rtol=1e-7)
