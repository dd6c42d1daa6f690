"""Checkers for notebook 03 (why scale by sqrt(d_k)): choose the scale from a measured variance,
the softmax backward pass without building the Jacobian, and the chain on from the weights to the
gradients at W_Q and W_K, by hand."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from ..lessons import scaling as _scaling_lesson
from .core import CheckResult, Mistake, Refused, as_number, check_function, refusing_ops, seeded
from .scaling_mistakes import (
    CHAIN_CODE,
    PROJECTION_FORBID,
    PROJECTION_INSTEAD,
    PROJECTION_MISTAKES,
    _projection_cases,
    projection_guard,
)
from .workflow import exercise

__all__ = ["check_choose_scale", "check_softmax_backward", "check_projection_gradients"]


def _number(f: Callable) -> Callable:
    """``f`` returning a float, as a function returning a float64 scalar tensor."""
    return lambda *args: torch.tensor(float(f(*args)), dtype=torch.float64)


# --- exercise 1: choose the scale from the spread of the scores within a row ---------------


def _scores(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor) -> torch.Tensor:
    return (x @ w_q) @ (x @ w_k).T                                  # S = Q K^T, (n, n)


def _row_scale(scores: torch.Tensor, dim: int = -1) -> float:
    """1 / sqrt(mean over rows of the variance within each row): softmax(s + b) = softmax(s)
    for a constant b per row, so only the spread within a row matters."""
    return 1 / scores.var(dim=dim).mean().sqrt().item()


def _weight(g: torch.Generator, d_model: int, d_k: int, init: str, dtype) -> torch.Tensor:
    """W (d_model, d_k): PyTorch's default nn.Linear init (uniform in +-1/sqrt(d_model)), a
    variance-preserving one (std 1/sqrt(d_model)) or weights of variance 1."""
    if init == "default":
        return (2 * torch.rand(d_model, d_k, generator=g, dtype=dtype) - 1) / math.sqrt(d_model)
    std = 1 / math.sqrt(d_model) if init == "unit" else 1.0
    return std * torch.randn(d_model, d_k, generator=g, dtype=dtype)


def _choose_scale_cases() -> list[dict]:
    g = seeded(33)
    cases = []
    # (n, d_model, d_k, init, input mean, dtype): a square W first (catches W^T), the default
    # nn.Linear init, weights of variance 1, inputs with a mean (where the whole matrix's
    # variance is about twice the within-row one), float64. n >= 200, so the biased and the
    # unbiased variance give the same scale to 0.3%.
    for n, d_model, d_k, init, mean, dtype in [
            (200, 32, 32, "unit", 0.0, torch.float32), (256, 64, 16, "default", 0.0, torch.float32),
            (200, 16, 8, "one", 0.0, torch.float32), (256, 24, 12, "default", 2.0, torch.float32),
            (200, 32, 64, "unit", 1.0, torch.float64)]:
        x = mean + torch.randn(n, d_model, generator=g, dtype=dtype)
        cases.append({"x": x, "W_Q": _weight(g, d_model, d_k, init, dtype),
                      "W_K": _weight(g, d_model, d_k, init, dtype)})
    return cases


@exercise("scaling.choose_scale", "choose the scale from the spread within a row", hints=(
    "Compute the scores exactly as attention does, all n x n of them. The softmax of a row does "
    "not change if you add the same number to the whole row, so what matters is how spread out "
    "the scores are within each row (one query against every key), not across the matrix.",
    "Multiplying every score by c multiplies every row's variance by c^2. So you need one number "
    "from S: the spread within its rows, as a variance. Which reduction, over which axis, gives "
    "it, and which c then brings it to 1?",
    "S = (x @ W_Q) @ (x @ W_K).T                  # (n, n)\n"
    "v = ...                                      # each row's variance, averaged over rows\n"
    "return ...                                   # c with Var(c S) = 1, as a float"))
def check_choose_scale(choose_scale: Callable) -> CheckResult:
    """Exercise: ``choose_scale(x (n, d_model), W_Q (d_model, d_k), W_K (d_model, d_k)) -> c``,
    the number that makes the variance within each row of the ``n x n`` scores
    ``c * (x W_Q)(x W_K)^T``, averaged over the rows, equal to 1 (biased or unbiased variance:
    both pass)."""

    def scale(x, w_q, w_k):
        return _row_scale(_scores(x, w_q, w_k))

    return check_function(
        as_number(choose_scale, "choose_scale should return a number"), _number(scale),
        _choose_scale_cases(),
        what="choose_scale", output_names=("the scale",), atol=0.0, rtol=5e-3,
        mistakes=[
            Mistake(_number(lambda x, w_q, w_k: 1 / _scores(x, w_q, w_k).var().sqrt().item()),
                    "you took the variance of the whole score matrix. The softmax runs along each "
                    "row and softmax(s + b) = softmax(s) for any constant b added to a row, so "
                    "differences between the rows' means do not matter: measure the variance "
                    "within each row (S.var(dim=-1)) and average it over the rows."),
            Mistake(_number(lambda x, w_q, w_k: _row_scale(_scores(x, w_q, w_k), dim=0)),
                    "wrong axis: you measured the spread within each column (one key against "
                    "every query). A softmax row is one query against every key: take the "
                    "variance over the last axis, dim=-1."),
            Mistake(_number(lambda x, w_q, w_k: 1 / _scores(x, w_q, w_k).std(dim=-1).mean().item()),
                    "you averaged the rows' standard deviations; the variance of c S is what must "
                    "be 1: average the rows' variances, then take the square root."),
            Mistake(_number(lambda x, w_q, w_k: 1 / math.sqrt(w_q.shape[1])),
                    "1/sqrt(d_k) is right only when the components of q and k have variance 1. "
                    "These weights are initialised differently: measure the spread of the "
                    "scores S = Q K^T within each row and take c = 1/sqrt(that variance)."),
            Mistake(_number(lambda x, w_q, w_k: (1 / _scores(x, w_q, w_k).std(dim=-1)).mean().item()),
                    "you averaged a scale per row, 1/std of each row; the exercise asks for one c "
                    "that makes the rows' variances average to 1: average the variances first "
                    "(S.var(dim=-1).mean()), then c = 1 / sqrt(that)."),
            Mistake(_number(lambda x, w_q, w_k: _row_scale(_scores(x, w_q, w_k)) ** 2),
                    "Var(c S) = c^2 Var(S): the scale is 1/sqrt(variance), the inverse of the "
                    "standard deviation, not of the variance."),
            Mistake(_number(lambda x, w_q, w_k: 1 / _row_scale(_scores(x, w_q, w_k))),
                    "you returned the spread of the scores; the scale divides by it: "
                    "c = 1 / std."),
            Mistake(_number(lambda x, w_q, w_k: 1 / _scores(x, w_q, w_k).pow(2).mean().sqrt().item()),
                    "mean(S**2) is the variance only when the scores have mean 0, and here they "
                    "do not: subtract each row's mean (S.var(dim=-1) does)."),
            Mistake(_number(lambda x, w_q, w_k: 1 / ((x @ w_q).var() * (x @ w_k).var()).sqrt().item()),
                    "you measured the components of q and k; the scale multiplies the scores "
                    "q . k, a sum of d_k products: measure the spread of S = Q K^T itself."),
            Mistake(_number(lambda x, w_q, w_k: _row_scale(_scores(x, w_q.T, w_k.T))),
                    "W_Q has shape (d_model, d_k) and acts from the right: Q = x @ W_Q, not "
                    "x @ W_Q.T (that is nn.Linear's weight layout)."),
            Mistake(_number(lambda x, w_q, w_k: 1 / ((x @ w_q) * (x @ w_k)).sum(-1).std().item()),
                    "you scored each token's query against its own key only (the diagonal); "
                    "attention scores every query against every key: S = Q K^T is (n, n)."),
        ],
    )


# --- exercise 2: the backward pass of the softmax, without building J ------------------------


def _backward_cases() -> list[dict]:
    g = seeded(31)
    cases = [{"scores": 2 * torch.randn(shape, generator=g, dtype=torch.float64),
              "grad_weights": torch.randn(shape, generator=g, dtype=torch.float64)}
             for shape in [(5,), (3, 4), (2, 3, 6)]]
    cases.append({"scores": torch.randn(4, 7, generator=g),                      # float32
                  "grad_weights": torch.randn(4, 7, generator=g)})
    size = [int(i) for i in torch.randint(1, 6, (3,), generator=g)]               # random shape
    cases.append({"scores": 3 * torch.randn(*size, generator=g, dtype=torch.float64),
                  "grad_weights": torch.randn(*size, generator=g, dtype=torch.float64)})
    cases.append({"scores": torch.tensor([[3.0], [-2.0]], dtype=torch.float64),  # one key
                  "grad_weights": torch.tensor([[1.5], [-0.5]], dtype=torch.float64)})
    cases.append({"scores": torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 0.0, 5.0]]).double(),
                  "grad_weights": torch.tensor([[1.0, -2.0, 0.5], [0.3, 1.0, -1.0]]).double()})
    return cases


def _softmax_backward(scores: torch.Tensor, grad_weights: torch.Tensor) -> torch.Tensor:
    """The reference: autograd's gradient of <softmax(scores), grad_weights> at the scores."""
    s = scores.detach().clone().requires_grad_(True)
    (torch.softmax(s, dim=-1) * grad_weights).sum().backward()
    return s.grad


def _backward_from(f: Callable) -> Callable:
    """A wrong answer written from the weights a = softmax(s) and the incoming gradient g."""
    return lambda s, g: f(torch.softmax(s, dim=-1), g)


# What would do the exercise without it being written: autograd, PyTorch's own softmax backward,
# and the Jacobian built in full (section 3's function, diag_embed).
_BACKWARD_FORBID = [
    (torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward"),
    (torch.autograd.functional, "jacobian"), (torch.autograd.functional, "vjp"),
    (torch.func, "vjp"), (torch.func, "jacrev"), (torch.func, "grad"),
    (torch, "_softmax_backward_data"), (torch, "diag_embed"), (torch.Tensor, "diag_embed"),
    (torch, "diag"), (torch.Tensor, "diag"), (torch, "diagflat"), (torch, "eye"),
    (_scaling_lesson, "softmax_jacobian"),
]
_BACKWARD_INSTEAD = ("Multiply J = diag(a) - a a^T out on paper, a = softmax(scores), until only "
                     "vectors of length n and numbers per row are left: no n x n matrix "
                     "(exercises.hint('scaling.softmax_backward', 2) names the idea)")
_BACKWARD_POINT = ("The point of this exercise is the backward pass WITHOUT J, which at n = 8,192 "
                   f"and 64 rows would need 17 GB. {_BACKWARD_INSTEAD}.")


class _NoJacobian(torch.overrides.TorchFunctionMode):
    """Watches every torch operation the learner's function ``what`` runs on the rows ``(..., n)``:
    a result with as many elements as the ``(..., n, n)`` Jacobian (n times the rows') means J was
    built, whatever the route (an outer product by broadcasting, a loop filling a matrix, ...);
    ``point`` says why that fails the exercise."""

    def __init__(self, rows: torch.Tensor, what: str, point: str):
        super().__init__()
        self.n = rows.shape[-1]
        self.limit = rows.numel() * self.n
        self.what, self.point = what, point

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and self.n >= 3 and t.numel() >= self.limit:
                raise Refused(
                    f"{self.what} built a tensor of shape {tuple(t.shape)}, as big as the "
                    f"(..., n, n) Jacobian (n = {self.n}). {self.point}")
        return out


def _no_jacobian(what: str, point: str, instead: str, ops: tuple[str, ...] = ()) -> Callable:
    """A ``guard`` that refuses, while ``what`` runs, J (any tensor as big as it: ``point`` says
    why), autograd by any route and the aten ``ops`` (``instead`` says what to write)."""
    used = "PyTorch's own softmax backward or autograd" if ops else "autograd"
    no_autograd = refusing_ops(ops, f"{what} used {used} (torch.ops.aten, a grad_fn, backward, "
                                    "torch.autograd.grad, torch.func), which does this exercise "
                                    f"for you. {instead}", autograd=True)

    @contextlib.contextmanager
    def guard(inputs: dict):
        with no_autograd(inputs), _NoJacobian(next(iter(inputs.values())), what, point):
            yield

    return guard


@exercise("scaling.softmax_backward", "the softmax backward pass, without building J", hints=(
    "Backpropagation needs only J^T g, and J = diag(a) - a a^T is symmetric. What are diag(a) g "
    "and (a a^T) g, written so that no (n, n) matrix appears?",
    "Write (J g)_i = sum_j J_ij g_j with J_ij = a_i (delta_ij - a_j) and split it in two sums. "
    "In the first, delta_ij keeps only j = i; in the second, which factor does not depend on j "
    "and comes out of the sum? What stays inside is the same for every i: one number per row.",
    "a = torch.softmax(scores, dim=-1)\n"
    "dot = ...                                    # <a, g> per row, kept (..., 1)\n"
    "return ...                                   # (..., n): J g from a, grad_weights and dot"))
def check_softmax_backward(softmax_backward: Callable) -> CheckResult:
    """Exercise: ``softmax_backward(scores (..., n), grad_weights (..., n)) -> (..., n)``, the
    gradient of the loss at the scores given its gradient ``g`` at the weights ``a =
    softmax(scores)``: ``a * (g - <a, g>)``, without building the ``(..., n, n)`` Jacobian (any
    intermediate that large fails the check) and without autograd (blocked while it runs);
    checked against autograd."""
    return check_function(
        softmax_backward, _softmax_backward, _backward_cases(), what="softmax_backward",
        output_names=("the gradient at the scores",), atol=1e-6, rtol=1e-5,
        forbid=_BACKWARD_FORBID, instead=_BACKWARD_INSTEAD,
        guard=_no_jacobian("softmax_backward", _BACKWARD_POINT, _BACKWARD_INSTEAD,
                           ("_softmax_backward_data",)),
        mistakes=[
            Mistake(_backward_from(lambda a, g: a * g),
                    "that is only diag(a) g: the a a^T term of J is missing. Raising s_j also "
                    "lowers every other weight; what does (a a^T) g give, one row at a time?"),
            Mistake(_backward_from(lambda a, g: g - (a * g).sum(-1, keepdim=True)),
                    "the factor a_i is missing in front: both terms of (J g)_i carry it."),
            Mistake(_backward_from(lambda a, g: a * (g - g.sum(-1, keepdim=True))),
                    "<a, g> is the weighted sum of g, sum(a * g), not the plain sum of g."),
            Mistake(_backward_from(lambda a, g: a * ((a * g).sum(-1, keepdim=True) - g)),
                    "the sign is flipped: J = diag(a) - a a^T, so the diag(a) g term comes in "
                    "with a plus (raising g_i raises the pull on s_i)."),
            Mistake(_backward_from(lambda a, g: a * (1 - a) * g),
                    "that is only the diagonal of J, a_i (1 - a_i): off the diagonal J_ij = "
                    "-a_i a_j also contributes, and its sum over j is one number per row."),
            Mistake(_backward_from(lambda a, g: a * (g - (a * g).sum(0, keepdim=True))),
                    "<a, g> is summed over the wrong axis: one dot product per row, over the "
                    "last axis (the keys), sum(dim=-1, keepdim=True)."),
            Mistake(lambda s, g: s * (g - (s * g).sum(-1, keepdim=True)),
                    "the formula takes the weights a = softmax(s), not the raw scores: apply the "
                    "softmax first."),
            Mistake(_backward_from(lambda a, g: a * (g - (a * g).sum())),
                    "<a, g> is one number per row: sum over the last axis with keepdim=True, "
                    "not over the whole tensor."),
        ],
        nan_hint="exp of a large score overflows to inf, and inf / inf is NaN. Subtract each "
                 "row's max before exponentiating (the softmax does not change), or use "
                 "torch.softmax.",
    )


# --- exercise 3: the gradient that reaches W_Q and W_K ------------------------------------------


def _projection_gradients(x, w_q, w_k, scale, grad_weights):
    """The reference: autograd's gradients of ``<softmax(scale (x W_Q)(x W_K)^T), grad_weights>``
    at ``W_Q`` and ``W_K`` (summed over the sequences of a batch)."""
    w_q, w_k = (w.detach().clone().requires_grad_(True) for w in (w_q, w_k))
    weights = torch.softmax(scale * (x @ w_q) @ (x @ w_k).mT, dim=-1)
    return torch.autograd.grad((weights * grad_weights).sum(), (w_q, w_k))


def _about_exercise_2(fn: Callable, result: CheckResult) -> CheckResult:
    """``result``, with a line for a learner whose function leans on exercise 2: its reference
    solution (refused here, as every solution is inside a learner's check) or its stub."""
    if result:
        return result
    if "softmax_backward_solution" in result.message:
        return CheckResult(False, f"{result.message}\nHint: that solution is exercise 2's, not "
                                  "this one's, but no reference solution runs inside your own "
                                  "work: call your own softmax_backward once it passes, or copy "
                                  "softmax_backward_solution's three lines into "
                                  "projection_gradients.")
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    if result.message.endswith("not implemented yet.") and "softmax_backward" in names:
        return CheckResult(False, f"{result.message} (Or the softmax_backward it calls is still "
                                  "exercise 2's stub: until yours passes, write the softmax "
                                  "backward inside projection_gradients.)")
    return result


@exercise("scaling.projection_gradients", "backpropagate by hand to W_Q and W_K", hints=(
    "Go back through the forward pass, last step first: A = softmax(S), S = scale * Q K^T, "
    "Q = x W_Q, K = x W_K. Exercise 2 did the first step. Every gradient has the shape of what it "
    "is the gradient of: write those shapes down before any product.",
    "For a product C = A B, the gradients are dA = dC B^T and dB = A^T dC (the shapes check it). "
    "In S = scale * Q K^T the scale is a constant factor: where does it come back? Q is "
    "multiplied by K^T, not K: which of dS and dS^T reaches K? Q = x W_Q is one more product. And "
    "with a batch, every sequence uses the same W_Q: how do their gradients combine?",
    "Q, K = x @ W_Q, x @ W_K                       # (..., n, d_k)\n"
    "S = scale * Q @ K.mT                          # (..., n, n): the scores the softmax saw\n"
    "dS = softmax_backward(S, grad_weights)        # exercise 2: dL/dS\n"
    "dQ = ...                                      # (..., n, d_k)\n"
    "dK = ...                                      # (..., n, d_k)\n"
    "grad_W_Q = ...                                # (d_model, d_k), summed over a batch\n"
    "grad_W_K = ...\n"
    "return grad_W_Q, grad_W_K"))
def check_projection_gradients(projection_gradients: Callable) -> CheckResult:
    """Exercise: ``projection_gradients(x, W_Q, W_K, scale, grad_weights) -> (grad_W_Q,
    grad_W_K)``, ``x`` ``(n, d_model)`` or a batch ``(b, n, d_model)``, ``W_Q``, ``W_K``
    ``(d_model, d_k)``, ``grad_weights`` ``(..., n, n)`` the gradient of the loss at
    ``A = softmax(scale * (x W_Q)(x W_K)^T)``: the gradients at ``W_Q`` and ``W_K``, each
    ``(d_model, d_k)`` (summed over a batch), chained by hand (autograd is refused by any route
    while it runs). Checked against autograd; 18 named mistakes (:mod:`.scaling_mistakes`)."""
    if getattr(projection_gradients, "__code__", None) is CHAIN_CODE:
        return CheckResult(False, "Not yet: that is the checker's own code, which does this "
                                  f"exercise for you. {PROJECTION_INSTEAD}.")
    result = check_function(
        projection_gradients, _projection_gradients, _projection_cases(),
        what="projection_gradients", output_names=("the gradient at W_Q", "the gradient at W_K"),
        atol=1e-6, rtol=1e-5, forbid=PROJECTION_FORBID, instead=PROJECTION_INSTEAD,
        guard=projection_guard(), mistakes=PROJECTION_MISTAKES,
        error_hints=[("must match the size of tensor",
                      "if this is the batch case (x is (b, n, d_model)): .T reverses all three "
                      "axes of a batch; .mT (or .transpose(-2, -1)) swaps the last two.")],
        nan_hint="exp of a score in the thousands overflows to inf, and inf / inf is NaN. Subtract each "
                 "row's max before exponentiating (the softmax does not change), or use "
                 "torch.softmax.",
    )
    return _about_exercise_2(projection_gradients, result)
