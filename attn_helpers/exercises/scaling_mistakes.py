r"""The known wrong answers of notebook 03's exercise 3 (``scaling.projection_gradients``): the
gradients of the loss at :math:`W_Q` and :math:`W_K` given its gradient at the weights
:math:`A = \mathrm{softmax}(S)`, :math:`S = c\,QK^\top`, :math:`Q = xW_Q`, :math:`K = xW_K`. Each
is :func:`_backward_with` with one thing changed; with its defaults it is the right answer, which
the checker refuses as a learner's answer (:data:`CHAIN_CODE`), and it is private, so a learner's
function may not call it either. Also the exercise's cases (:func:`_projection_cases`) and what
the learner's function may not do while it runs (:func:`projection_guard`: autograd by any
route)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from .core import Mistake, refusing_ops, seeded

__all__ = ["CHAIN_CODE", "PROJECTION_FORBID", "PROJECTION_INSTEAD", "PROJECTION_MISTAKES",
           "projection_guard"]

F64 = torch.float64


def _softmax_grad(s: torch.Tensor, g: torch.Tensor, *, diagonal_only: bool = False,
                  dim: int = -1) -> torch.Tensor:
    """The softmax backward at the scores ``s`` (rows on the last axis), for ``g = dL/dA``;
    ``dim``: the axis its weights are recomputed over (-1, the keys, is right)."""
    a = torch.softmax(s, dim=dim)
    return a * g if diagonal_only else a * (g - (a * g).sum(-1, keepdim=True))


def _backward_with(x, w_q, w_k, scale, up, *, power=1, given_scale=True,  # noqa: C901
                   softmax_at="scores", dq_rows=True, dk_columns=True, swap_qk=False,
                   wrt="weights", batch="sum", swap_outputs=False, sign=1.0, weights_dim=-1):
    """``(dL/dW_Q, dL/dW_K)`` written out, with one thing changed. ``power``: how many times the
    scale multiplies dQ and dK; ``given_scale=False``: 1/sqrt(d_k) in place of ``scale``;
    ``softmax_at``: where the softmax backward runs ("scores": S; "raw": Q K^T, the scale left
    out; "weights": A, the softmax taken twice; "skipped": none, dS = dL/dA; "diagonal": only the
    diag(a) part of J); ``dq_rows=False``: dQ from dS^T; ``dk_columns=False``: dK from dS;
    ``swap_qk``: dQ from Q and dK from K; ``wrt``: "weights", "qk" (dQ, dK) or "transposed";
    ``batch``: how the sequences of a batch combine ("sum", "mean", "kept"); ``weights_dim``: the
    axis the softmax backward recomputes the weights over (-2: down the columns, over queries)."""
    c = scale if given_scale else 1 / math.sqrt(w_q.shape[-1])
    q, k = x @ w_q, x @ w_k                                           # (..., n, d_k)
    s = c * q @ k.mT                                                  # (..., n, n)
    d_s = {"scores": lambda: _softmax_grad(s, up, dim=weights_dim),
           "raw": lambda: _softmax_grad(q @ k.mT, up),
           "weights": lambda: _softmax_grad(torch.softmax(s, dim=-1), up),
           "skipped": lambda: up,
           "diagonal": lambda: _softmax_grad(s, up, diagonal_only=True)}[softmax_at]()
    first, second = (q, k) if swap_qk else (k, q)                     # what dQ, dK multiply
    d_q = c ** power * (d_s if dq_rows else d_s.mT) @ first
    d_k = c ** power * (d_s.mT if dk_columns else d_s) @ second
    if wrt == "qk":
        grads = (d_q, d_k)
    else:
        grads = tuple(d.mT @ x if wrt == "transposed" else x.mT @ d for d in (d_q, d_k))
        if x.dim() == 3 and batch != "kept":
            grads = tuple(g.mean(0) if batch == "mean" else g.sum(0) for g in grads)
    grads = tuple(sign * g for g in grads)
    return grads[::-1] if swap_outputs else grads


#: The code of :func:`_backward_with`: handed in as the learner's function with its defaults, it
#: is the checker's own answer, refused by the checker.
CHAIN_CODE = _backward_with.__code__


def _projection_cases() -> list[dict]:
    """``x (n, d_model)`` or ``(b, n, d_model)``, ``W_Q``, ``W_K`` ``(d_model, d_k)``, the scale
    and ``grad_weights (..., n, n)``: n, d_model and d_k all different (so a missing or misplaced
    transpose changes a shape), a scale that is not 1/sqrt(d_k) (0.3, then 2), float32, a batch,
    and rows saturated by scores in the thousands, where the gradient underflows to almost 0."""
    g = seeded(34)

    def case(n, d_model, d_k, scale, *, batch=(), dtype=F64, spread=1.0):
        x = torch.randn(*batch, n, d_model, generator=g, dtype=dtype)
        w_q, w_k = (spread * torch.randn(d_model, d_k, generator=g, dtype=dtype) / math.sqrt(d_model)
                    for _ in range(2))
        return {"x": x, "W_Q": w_q, "W_K": w_k, "scale": scale,
                "grad_weights": torch.randn(*batch, n, n, generator=g, dtype=dtype)}

    return [case(5, 4, 3, 1 / math.sqrt(3)),
            case(7, 6, 2, 0.3),
            case(3, 8, 5, 1 / math.sqrt(5), dtype=torch.float32),
            case(6, 3, 9, 2.0),                                       # d_k > d_model, scale > 1
            case(4, 5, 3, 1 / math.sqrt(3), batch=(2,)),              # two sequences share W
            case(6, 4, 4, 1.0, spread=48.0)]                  # scores in the thousands: saturated


def _wrong(message: str, *variants: dict) -> list[Mistake]:
    return [Mistake(lambda *a, _v=v: _backward_with(*a, **_v), message) for v in variants]


PROJECTION_MISTAKES = [
    *_wrong("grad_weights is the gradient at the weights A, not at the scores: pass it back "
            "through the softmax first (exercise 2's softmax_backward).", {"softmax_at": "skipped"}),
    *_wrong("softmax_backward takes the scores S and applies the softmax itself; you handed it "
            "the weights A = softmax(S), so it differentiated a softmax of a softmax.",
            {"softmax_at": "weights"}),
    *_wrong("dS misses the a a^T part of the softmax's Jacobian (that is only diag(a) g): use "
            "the whole softmax backward of exercise 2.", {"softmax_at": "diagonal"}),
    *_wrong("the softmax backward recomputed the weights over dim -2, down each column of S (over "
            "the queries): A = softmax(S) normalises each row, one query's scores against every "
            "key, so the weights it differentiates are the softmax over the last axis.",
            {"weights_dim": -2}),
    *_wrong("the softmax backward ran at Q K^T, without the scale: it needs the scores the "
            "softmax saw, S = scale * Q K^T, since the weights A = softmax(S) depend on them.",
            {"softmax_at": "raw"}),
    *_wrong("the scale is missing from dQ and dK. dS is the gradient at S = scale * Q K^T; going "
            "from S back to Q K^T passes through that constant factor, which the chain rule "
            "keeps.", {"power": 0}),
    *_wrong("the scale came in twice. dS is the gradient at S = scale * Q K^T, so the way back "
            "from S to Q K^T multiplies by the scale once; the softmax backward already ran at "
            "the scaled scores.", {"power": 2}),
    *_wrong("you used 1/sqrt(d_k); the scale is an argument (one case uses 0.3, another 2): use "
            "it in the forward pass and on the way back.", {"given_scale": False}),
    *_wrong("dK was computed from dS, not its transpose: S_ij = scale q_i . k_j, so key j collects "
            "column j of dS (every query's pull on it); row j of dS belongs to query j.",
            {"dk_columns": False}),
    *_wrong("dS and dS^T are swapped between dQ and dK: query i collects row i of dS (its own "
            "scores), key j collects column j.", {"dq_rows": False, "dk_columns": False}),
    *_wrong("dQ was computed from dS^T: query i collects row i of dS, its own scores against "
            "every key; only dK needs the transpose.", {"dq_rows": False}),
    *_wrong("Q and K are swapped in the chain: in S = Q K^T each q_i is multiplied by the keys, "
            "so the keys carry dS to Q, and the queries carry dS^T to K.", {"swap_qk": True}),
    *_wrong("that is the gradient at Q and K, (..., n, d_k); the exercise asks for W_Q and W_K, "
            "(d_model, d_k): one more step, through Q = x W_Q and K = x W_K.", {"wrt": "qk"}),
    *_wrong("the gradients came out transposed, (d_k, d_model): W_Q is (d_model, d_k), and in "
            "Q = x W_Q it is x that multiplies W_Q, from the left.", {"wrt": "transposed"}),
    *_wrong("the two gradients are swapped: return (grad_W_Q, grad_W_K), in that order.",
            {"swap_outputs": True}),
    *_wrong("one gradient per sequence, (b, d_model, d_k): every sequence of the batch uses the "
            "same W_Q and W_K, so their gradients add up to one (d_model, d_k) each.",
            {"batch": "kept"}),
    *_wrong("averaged over the batch: the loss adds the terms of every sequence, so the "
            "gradients at the shared W_Q and W_K are the sums over the batch, not the means.",
            {"batch": "mean"}),
    *_wrong("the sign is flipped: return the gradient of the loss, not the step that descends "
            "it.", {"sign": -1.0}),
]


# --- what the learner's function may not do -------------------------------------------------


PROJECTION_FORBID = [
    (torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward"),
    (torch.autograd.functional, "vjp"), (torch.autograd.functional, "jacobian"),
    (torch.func, "vjp"), (torch.func, "grad"), (torch.func, "jacrev"),
    (torch, "_softmax_backward_data"),
]
PROJECTION_INSTEAD = ("Go back through the forward pass one step at a time: the softmax (your "
                      "softmax_backward from exercise 2), the scale and S = Q K^T, then "
                      "Q = x W_Q and K = x W_K (exercises.hint('scaling.projection_gradients', 2) "
                      "names the rule)")
_PROJECTION_WHY = ("projection_gradients used autograd (backward, torch.autograd.grad, a grad_fn, "
                   "torch.func, torch.ops.aten), which does this exercise for you. "
                   f"{PROJECTION_INSTEAD}")


def projection_guard() -> Callable[[dict], contextlib.AbstractContextManager]:
    """A ``guard`` for :func:`.core.check_function`: while the learner's function runs, autograd
    by any route (:func:`.guards.refusing_ops` with ``autograd=True``: the named functions, and
    any tensor that requires grad, so no ``grad_fn`` or engine call either) and PyTorch's own
    softmax backward are refused."""
    return refusing_ops(("_softmax_backward_data",), _PROJECTION_WHY, autograd=True)
