"""Checkers for notebook 03: choose the scale from a measured variance, the softmax backward pass
without the Jacobian, and the gradients at W_Q and W_K by hand."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import partial

import torch

from .core import AllocationWatch, CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise


def _scores(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor) -> torch.Tensor:
    return (x @ w_q) @ (x @ w_k).T                                  # S = Q K^T, (n, n)


def _scale_from(f: Callable) -> Callable:
    """A scale ``f(S, x, W_Q, W_K)`` from the raw scores S = Q K^T, as a float64 scalar tensor."""
    return lambda x, w_q, w_k: torch.tensor(float(f(_scores(x, w_q, w_k), x, w_q, w_k)),
                                            dtype=torch.float64)


def _choose_scale_cases() -> list[dict]:
    """A square W first (catches W^T); weights of std 1, nn.Linear's or 1/sqrt(d_model); inputs
    with a mean (whole-matrix variance != the rows'); n >= 200, so biased = unbiased."""
    g, cases = seeded(33), []
    for n, d_model, d_k, init, mean, dtype in [
            (200, 32, 32, "one", 0.0, torch.float32), (256, 64, 16, "default", 0.0, torch.float32),
            (200, 16, 8, "one", 0.0, torch.float32), (256, 24, 12, "default", 2.0, torch.float32),
            (200, 32, 64, "unit", 1.0, torch.float64)]:
        x = mean + torch.randn(n, d_model, generator=g, dtype=dtype)
        cases.append({"x": x, "W_Q": _weight(g, d_model, d_k, init, dtype),
                      "W_K": _weight(g, d_model, d_k, init, dtype)})
    return cases


def _weight(g: torch.Generator, d_model: int, d_k: int, init: str, dtype) -> torch.Tensor:
    if init == "default":                                       # nn.Linear's: U(-1, 1) / sqrt(d_model)
        return (2 * torch.rand(d_model, d_k, generator=g, dtype=dtype) - 1) / math.sqrt(d_model)
    std = 1 / math.sqrt(d_model) if init == "unit" else 1.0
    return std * torch.randn(d_model, d_k, generator=g, dtype=dtype)


def _as_number(fn: Callable) -> Callable:
    def wrapped(*args):
        value = fn(*args)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if value is None or isinstance(value, numbers.Real) and not isinstance(value, bool):
            return None if value is None else torch.tensor(float(value), dtype=torch.float64)
        raise Refused(f"choose_scale should return one number (a float), got {type(value).__name__} "
                      f"{tuple(getattr(value, 'shape', ()))}: average over the rows, then take c.")
    return wrapped if callable(fn) else fn


_SPREAD = "measure the spread of S = Q K^T itself, within its rows"
CHOOSE_SCALE_MISTAKES = [Mistake(_scale_from(f), hint) for f, hint in [
    (lambda S, *_: 1 / S.var().sqrt(), "you took the whole matrix's variance; softmax(s + b) = "
     "softmax(s), so the rows' means do not matter: average the variances within the rows."),
    (lambda S, *_: 1 / S.var(dim=0).mean().sqrt(), "wrong axis: you measured each column (one key "
     "against every query); a softmax row is one query against every key, the last axis."),
    (lambda S, *_: 1 / (S - S.mean(0, keepdim=True)).var().sqrt(), "you subtracted each column's "
     "mean; softmax ignores a constant added to a row: subtract each row's mean, the last axis."),
    (lambda S, *_: 1 / S.std(dim=-1).mean(),
     "you averaged the rows' standard deviations: average the variances, then take the root."),
    (lambda S, *_: 1 / S.var(-1).median().sqrt(),
     "you took the median row; the condition averages the rows' variances (a mean)."),
    (lambda S, x, w_q, w_k: 1 / math.sqrt(w_q.shape[1]), "1/sqrt(d_k) is right only when the "
     f"components of q and k have variance 1; these weights differ: {_SPREAD}."),
    (lambda S, *_: (1 / S.std(dim=-1)).mean(),
     "you averaged a scale per row (1/std of each row): average the variances first."),
    (lambda S, *_: 1 / S.var(-1).mean(),
     "Var(c S) = c^2 Var(S): c is the inverse of the standard deviation, not of the variance."),
    (lambda S, x, w_q, w_k: 1 / (math.sqrt(w_q.shape[1]) * S.var(-1).mean().sqrt()), "you divided "
     "1/sqrt(d_k) by the spread; c replaces 1/sqrt(d_k): c alone multiplies the raw S = Q K^T."),
    (lambda S, *_: S.var(-1).mean().sqrt(),
     "you returned the spread of the scores; the scale divides by it."),
    (lambda S, *_: S.std(dim=-1).mean(),
     "you returned the rows' standard deviation, a spread of the scores; the scale divides by it."),
    (lambda S, x, w_q, w_k: (S.var(-1).mean() / w_q.shape[1]).rsqrt(), "you measured S / sqrt(d_k), "
     "scores already scaled once; c replaces 1/sqrt(d_k), so measure the raw S = Q K^T."),
    (lambda S, *_: 1 / S.pow(2).mean().sqrt(), "mean(S**2) is the variance only for scores of mean "
     "0, and these are not: subtract each row's mean (S.var(dim=-1) does)."),
    (lambda S, x, w_q, w_k: (w_q.shape[1] * (x @ w_q).var() * (x @ w_k).var()).rsqrt(),
     "that is the prediction 1/sqrt(d_k Var(q) Var(k)); it assumes independent components of mean "
     f"0: {_SPREAD}."),
    (lambda S, x, w_q, w_k: (w_q.shape[1] * (x @ w_q).var()).rsqrt(), "1/sqrt(d_k Var(q)) counts "
     f"q's spread only, and assumes independent components of mean 0: {_SPREAD}."),
    (lambda S, x, w_q, w_k: 1 / _scores(x, w_q, w_q).var(-1).mean().sqrt(),
     "you scored the queries against themselves, Q Q^T: the keys are K = x @ W_K, so S = Q K^T."),
    (lambda S, x, w_q, w_k: ((x @ w_q).var() * (x @ w_k).var()).rsqrt(),
     f"you measured the components of q and k; the scale multiplies the scores: {_SPREAD}."),
    (lambda S, x, w_q, w_k: 1 / _scores(x, w_q.T, w_k.T).var(-1).mean().sqrt(),
     "W_Q is (d_model, d_k): Q = x @ W_Q, not x @ W_Q.T (nn.Linear's layout)."),
    (lambda S, x, w_q, w_k: 1 / ((x @ w_q) * (x @ w_k)).sum(-1).std(),
     "you scored each query against its own key only; attention scores every pair: S is (n, n)."),
    (lambda S, x, w_q, w_k: 1 / ((x @ w_q).T @ (x @ w_k)).var(-1).mean().sqrt(), "Q.T @ K is "
     "(d_k, d_k), a sum over the tokens; the scores pair each query with each key: S is (n, n)."),
]]


@exercise("scaling.choose_scale", "choose the scale from the spread within a row", hints=(
    "Compute all n x n scores as attention does. A row's softmax ignores a constant added to the "
    "row: what matters is the spread within each row (one query against every key).",
    "Multiplying the scores by c multiplies each row's variance by c^2. Which reduction, over "
    "which axis, gives the spread within the rows, and which c brings it to 1?",
    "S = (x @ W_Q) @ (x @ W_K).T                  # (n, n)\n"
    "v = ...                                      # each row's variance, averaged over rows\n"
    "return ...                                   # c with Var(c S) = 1, as a float"))
def check_choose_scale(choose_scale: Callable) -> CheckResult:
    """Exercise: ``choose_scale(x, W_Q, W_K) -> c``, mean_i Var_j(c S_ij) = 1, S = (x W_Q)(x W_K)^T."""
    candidate, cases = _as_number(choose_scale), _choose_scale_cases()
    return check_function(
        candidate, _scale_from(lambda S, *_: 1 / S.var(dim=-1).mean().sqrt()), cases,
        what="choose_scale", output_names=("the scale",), atol=0.0, rtol=5e-3,
        mistakes=CHOOSE_SCALE_MISTAKES,
        error_hints=[("cannot be multiplied", "the scores are S = Q K^T: Q and K are both "
                      "(n, d_k), so transpose the keys, (n, d_k) @ (d_k, n).")])


def _backward_cases() -> list[dict]:
    """A batch first (dim 0 and dim -2 differ only there); one key; a row saturated near 1000."""
    g = seeded(31)

    def case(shape, spread=2.0, dtype=torch.float64):
        return {"scores": spread * torch.randn(shape, generator=g, dtype=dtype),
                "grad_weights": torch.randn(shape, generator=g, dtype=dtype)}

    cases = [case(shape) for shape in [(2, 3, 6), (5,), (3, 4)]] + [case((4, 7), 1.0, torch.float32)]
    cases.append(case(tuple(int(i) for i in torch.randint(1, 6, (3,), generator=g)), 3.0))  # random
    return cases + [{"scores": torch.tensor([[3.0], [-2.0]], dtype=torch.float64),
                     "grad_weights": torch.tensor([[1.5], [-0.5]], dtype=torch.float64)},
                    {"scores": torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 0.0, 5.0]]).double(),
                     "grad_weights": torch.tensor([[1.0, -2.0, 0.5], [0.3, 1.0, -1.0]]).double()}]


def _softmax_backward(scores: torch.Tensor, grad_weights: torch.Tensor) -> torch.Tensor:
    """The reference: autograd's gradient of <softmax(scores), grad_weights> at the scores."""
    s = scores.detach().clone().requires_grad_(True)
    (torch.softmax(s, dim=-1) * grad_weights).sum().backward()
    return s.grad


def _softmax_grad(s: torch.Tensor, g: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """J g at the scores ``s``, the weights taken over ``dim``."""
    a = torch.softmax(s, dim=dim)
    return a * (g - (a * g).sum(-1, keepdim=True))


_OVERFLOW = ("exp of {} overflows and inf / inf is NaN. Subtract each row's max first, or use "
             "torch.softmax.")
_WEIGHED = "<a, g> weighs each g_j by its weight a_j: sum(a * g) over the keys"
BACKWARD_MISTAKES = [Mistake(lambda s, g, _f=f: _f(torch.softmax(s, dim=-1), g), hint) for f, hint in [
    (lambda a, g: a * g, "that is only diag(a) g: the a a^T term of J is missing (raising s_j "
     "also lowers every other weight)."),
    (lambda a, g: -a * (a * g).sum(-1, keepdim=True),
     "that is only -a a^T g: the diag(a) g term of J is missing (raising s_i raises a_i itself)."),
    (lambda a, g: g - (a * g).sum(-1, keepdim=True),
     "the factor a_i is missing in front: both terms of (J g)_i carry it."),
    (lambda a, g: a * g - (a * g).sum(-1, keepdim=True),
     "the row sum lost its factor a_i: (a a^T g)_i = a_i <a, g>, not <a, g> alone."),
    (lambda a, g: a * (g - g.sum(-1, keepdim=True)),
     "<a, g> is the weighted sum of g, sum(a * g), not the plain sum of g."),
    (lambda a, g: a * (g - g.mean(-1, keepdim=True)), f"{_WEIGHED}, not the plain mean of g."),
    (lambda a, g: a * (g - g.mean()), f"{_WEIGHED}, one per row, not the plain mean of g."),
    (lambda a, g: a * (g - (a * g).mean(-1, keepdim=True)), "<a, g> is a sum over the keys, not a "
     "mean."),
    (lambda a, g: a * ((a * g).sum(-1, keepdim=True) - g),
     "the sign is flipped: J = diag(a) - a a^T, the diag(a) g term comes with a plus."),
    (lambda a, g: a * (1 - a) * g,
     "that is only the diagonal of J, a_i (1 - a_i): off it, J_ij = -a_i a_j also contributes."),
    (lambda a, g: a * (1 - a) * (g - (a * g).sum(-1, keepdim=True)), "the factor (1 - a_i) is "
     "extra: the -a_i a_j part of J_ij = a_i (delta_ij - a_j) is the <a, g> term already."),
    (lambda a, g: a * g - (a * a * g).sum(-1, keepdim=True), "the a_i of (a a^T g)_i = a_i <a, g> "
     "went inside the sum: it multiplies the row's <a, g> from outside."),
    (lambda a, g: a * (g - (a * a * g).sum(-1, keepdim=True)),
     "<a, g> = sum_j a_j g_j carries one factor a_j; the a_i in front stays outside the sum."),
    (lambda a, g: a * (g - (a * g).sum(0, keepdim=True)),
     "<a, g> is summed over the wrong axis: one dot product per row, over the keys (the last axis)."),
    (lambda a, g: a * (g - (a * g).sum()),
     "<a, g> is one number per row: sum over the last axis, not over the whole tensor."),
    (lambda a, g: g - a * g.sum(-1, keepdim=True), "that is log-softmax's backward, "
     "g - a sum(g); the softmax's J = diag(a) - a a^T puts a factor a_i in front of both terms."),
    (lambda a, g: a * g - a * a * g.sum(-1, keepdim=True), "(a a^T g)_i = a_i sum_j a_j g_j: "
     "one a stays outside the sum, the other weighs each g_j inside it; a_i^2 sum(g) is not that."),
]] + [Mistake(lambda s, g: s * (g - (s * g).sum(-1, keepdim=True)),
              "the formula takes the weights a = softmax(s), not the raw scores.")] + [
    Mistake(partial(_softmax_grad, dim=d), f"the softmax ran over the wrong axis (dim={d}): each row "
            "of scores is one query against every key, so softmax(scores, dim=-1).") for d in (0, -2)]


def _no_jacobian(inputs: dict) -> AllocationWatch:
    """The lesson's constraint: no tensor as big as the ``(..., n, n)`` Jacobian."""
    n = inputs["scores"].shape[-1]

    def refuse(t: torch.Tensor, call: str) -> str | None:
        if n >= 3 and t.numel() >= inputs["scores"].numel() * n:
            return (f"softmax_backward built a tensor of shape {tuple(t.shape)} ({call}), as big as "
                    f"the (..., n, n) Jacobian (n = {n}). This exercise is the backward pass WITHOUT "
                    "J: multiply J = diag(a) - a a^T out on paper, down to vectors and row numbers.")
        return None
    return AllocationWatch(refuse)


@exercise("scaling.softmax_backward", "the softmax backward pass, without building J", hints=(
    "Backpropagation needs only J^T g = J g (J = diag(a) - a a^T is symmetric). Write diag(a) g "
    "and (a a^T) g with no (n, n) matrix.",
    "Split (J g)_i = sum_j a_i (delta_ij - a_j) g_j in two sums. In the second, which factor "
    "leaves the sum? What stays inside is one number per row.",
    "a = torch.softmax(scores, dim=-1)\n"
    "dot = ...                                    # <a, g> per row, kept (..., 1)\n"
    "return ...                                   # (..., n): J g from a, grad_weights and dot"))
def check_softmax_backward(softmax_backward: Callable) -> CheckResult:
    """Exercise: ``softmax_backward(scores (..., n), grad_weights (..., n)) -> (..., n)``, the
    gradient at the scores, with no tensor as big as the ``(..., n, n)`` Jacobian."""
    return check_function(
        softmax_backward, _softmax_backward, _backward_cases(), what="softmax_backward",
        output_names=("the gradient at the scores",), atol=1e-6, rtol=1e-5, watch=_no_jacobian,
        mistakes=BACKWARD_MISTAKES, nan_hint=_OVERFLOW.format("a large score"),
        error_hints=[("must match the size of tensor", "<a, g> must keep its last axis to broadcast: "
                      "sum(dim=-1, keepdim=True) gives (..., 1); without keepdim it is (...,).")])


_BY_HAND = {  # exercise 3's answer in steps; each named mistake below replaces one or two
    "dS": lambda s, up, c: _softmax_grad(s, up),                   # (..., n, n): dL/dS
    "dQ": lambda dS, q, k, c: c * dS @ k,                           # (..., n, d_k)
    "dK": lambda dS, q, k, c: c * dS.mT @ q,
    "dW": lambda x, d: x.mT @ d,                                    # (..., d_model, d_k)
    "batch": lambda g: g.sum(0) if g.dim() == 3 else g,             # the sequences share W
}


def _by_hand(x, w_q, w_k, c, up, **changed):
    step = _BY_HAND | changed
    q, k = x @ w_q, x @ w_k                                           # (..., n, d_k)
    dS = step["dS"](c * q @ k.mT, up, c)
    return tuple(step["batch"](step["dW"](x, d))
                 for d in (step["dQ"](dS, q, k, c), step["dK"](dS, q, k, c)))


def _projection_cases() -> list[dict]:
    """n, d_model, d_k differ; scales not 1/sqrt(d_k); float32; a batch; saturated rows."""
    g = seeded(34)

    def case(n, d_model, d_k, scale, *, batch=(), dtype=torch.float64, spread=1.0):
        x = torch.randn(*batch, n, d_model, generator=g, dtype=dtype)
        w_q, w_k = (spread * torch.randn(d_model, d_k, generator=g, dtype=dtype) / math.sqrt(d_model)
                    for _ in range(2))
        return {"x": x, "W_Q": w_q, "W_K": w_k, "scale": scale,
                "grad_weights": torch.randn(*batch, n, n, generator=g, dtype=dtype)}

    return [case(5, 4, 3, 1 / math.sqrt(3)), case(7, 6, 2, 0.3),
            case(3, 8, 5, 1 / math.sqrt(5), dtype=torch.float32),
            case(6, 3, 9, 2.0),                                       # d_k > d_model, scale > 1
            case(4, 5, 3, 1 / math.sqrt(3), batch=(2,)),              # two sequences share W
            case(6, 4, 4, 1.0, spread=48.0)]                  # scores in the thousands: saturated


def _scaled(power: float) -> dict:                     # dQ and dK with the scale to a power (1 is right)
    return {"dQ": lambda dS, q, k, c: c ** power * dS @ k,
            "dK": lambda dS, q, k, c: c ** power * dS.mT @ q}


_WHOLE = "use exercise 2's whole backward"
PROJECTION_MISTAKES = [Mistake(partial(_by_hand, **changed), hint) for hint, changed in [
    ("grad_weights is the gradient at the weights A, not at the scores: pass it back through the "
     "softmax first (exercise 2).", {"dS": lambda s, up, c: up}),
    ("softmax_backward takes the scores S; you gave it A = softmax(S), a softmax of a softmax.",
     {"dS": lambda s, up, c: _softmax_grad(s.softmax(-1), up)}),
    ("you used the weights A where dS, the gradient at the scores, belongs: pass grad_weights back "
     "through the softmax (exercise 2).", {"dS": lambda s, up, c: s.softmax(-1)}),
    (f"dS misses the a a^T part of the softmax's Jacobian: {_WHOLE}.",
     {"dS": lambda s, up, c: s.softmax(-1) * up}),
    (f"dS used only the diagonal of J, a_i (1 - a_i), not its -a_i a_j: {_WHOLE}.",
     {"dS": lambda s, up, c: s.softmax(-1) * (1 - s.softmax(-1)) * up}),
    ("the softmax backward recomputed the weights over dim -2, down the columns: A normalises each "
     "row (one query against every key).", {"dS": lambda s, up, c: _softmax_grad(s, up, dim=-2)}),
    ("the softmax backward ran at Q K^T, without the scale: it needs the scores the softmax saw, "
     "S = scale * Q K^T.", {"dS": lambda s, up, c: _softmax_grad(s / c, up)}),
    ("the scale is missing from dQ and dK: the way back from S = scale * Q K^T passes through it.",
     _scaled(0)),
    *((f"{a} lacks the scale that {b} has: S = scale * Q K^T, so both dQ and dK carry it.",
       {a: _scaled(0)[a]}) for a, b in (("dQ", "dK"), ("dK", "dQ"))),
    ("the scale came in twice: the way back from S to Q K^T multiplies by it once.", _scaled(2)),
    ("the scale came back as its square root: the way back multiplies by the scale itself.",
     _scaled(0.5)),
    ("dK was computed from dS, not its transpose: key j collects column j of dS (every query's "
     "pull on it).", {"dK": lambda dS, q, k, c: c * dS @ q}),
    ("dK used the keys: in S = scale * Q K^T, the queries carry dS^T to K.",
     {"dK": lambda dS, q, k, c: c * dS.mT @ k}),
    ("you symmetrised dS, but it is not symmetric: dQ takes dS as it is, dK its transpose.",
     {"dS": lambda s, up, c: (lambda d: (d + d.mT) / 2)(_softmax_grad(s, up))}),
    ("dS and dS^T are swapped between dQ and dK: query i collects row i of dS, key j column j.",
     {"dQ": lambda dS, q, k, c: c * dS.mT @ k, "dK": lambda dS, q, k, c: c * dS @ q}),
    ("dQ was computed from dS^T: query i collects row i of dS; only dK needs the transpose.",
     {"dQ": lambda dS, q, k, c: c * dS.mT @ k}),
    ("Q and K are swapped in the chain: the keys carry dS to Q, the queries carry dS^T to K.",
     {"dQ": lambda dS, q, k, c: c * dS @ q, "dK": lambda dS, q, k, c: c * dS.mT @ k}),
    ("that is the gradient at Q and K, (..., n, d_k): one more step, through Q = x W_Q and "
     "K = x W_K.", {"dW": lambda x, d: d, "batch": lambda g: g}),
    ("the gradients came out transposed, (d_k, d_model): in Q = x W_Q, x multiplies W_Q from the "
     "left.", {"dW": lambda x, d: d.mT @ x}),
    ("one gradient per sequence, (b, d_model, d_k): the sequences share W_Q and W_K, so their "
     "gradients add up.", {"batch": lambda g: g}),
    ("averaged over the batch: the gradients at the shared W_Q and W_K are sums, not means.",
     {"batch": lambda g: g.mean(0) if g.dim() == 3 else g}),
    ("only the first sequence of the batch counted: add up the gradients of all of them.",
     {"batch": lambda g: g[0] if g.dim() == 3 else g}),
]] + [Mistake(wrong, hint) for hint, wrong in [
    ("you used 1/sqrt(d_k); the scale is an argument (0.3 or 2 in some cases).",
     lambda x, w_q, w_k, c, up: _by_hand(x, w_q, w_k, w_q.shape[-1] ** -0.5, up)),
    ("the two gradients are swapped: return (grad_W_Q, grad_W_K).", lambda *a: _by_hand(*a)[::-1]),
    ("grad_weights came in transposed: entry (i, j) is dL/dA_ij, query i's weight on key j.",
     lambda x, w_q, w_k, c, up: _by_hand(x, w_q, w_k, c, up.mT)),
    ("the sign is flipped: return the gradient, not the step that descends it.",
     lambda *a: tuple(-g for g in _by_hand(*a))),
]]


def _projection_gradients(x, w_q, w_k, scale, grad_weights):
    """The reference: autograd's gradients at ``W_Q`` and ``W_K``."""
    w_q, w_k = (w.detach().clone().requires_grad_(True) for w in (w_q, w_k))
    weights = torch.softmax(scale * (x @ w_q) @ (x @ w_k).mT, dim=-1)
    return torch.autograd.grad((weights * grad_weights).sum(), (w_q, w_k))


@exercise("scaling.projection_gradients", "backpropagate by hand to W_Q and W_K", hints=(
    "Go back through the forward pass, last step first: A = softmax(S), S = scale * Q K^T, "
    "Q = x W_Q, K = x W_K (exercise 2 did the first). Each gradient has its variable's shape.",
    "For C = A B: dA = dC B^T, dB = A^T dC. Where does the scale come back? Which of dS and dS^T "
    "reaches K? And in a batch, how do the sequences' gradients at the shared W_Q combine?",
    "Q, K = x @ W_Q, x @ W_K                       # (..., n, d_k)\n"
    "S = scale * Q @ K.mT                          # (..., n, n): the scores the softmax saw\n"
    "dS = softmax_backward(S, grad_weights)        # exercise 2: dL/dS\n"
    "dQ = ...                                      # (..., n, d_k)\n"
    "dK = ...                                      # (..., n, d_k)\n"
    "grad_W_Q = ...                                # (d_model, d_k), summed over a batch\n"
    "grad_W_K = ...\n"
    "return grad_W_Q, grad_W_K"))
def check_projection_gradients(projection_gradients: Callable) -> CheckResult:
    """Exercise: ``projection_gradients(x (..., n, d_model), W_Q, W_K (d_model, d_k), scale,
    grad_weights (..., n, n)) -> (grad_W_Q, grad_W_K)``, by hand; names exercise 2's stub."""
    result = check_function(
        projection_gradients, _projection_gradients, _projection_cases(),
        what="projection_gradients", output_names=("the gradient at W_Q", "the gradient at W_K"),
        atol=1e-6, rtol=1e-5, mistakes=PROJECTION_MISTAKES,
        error_hints=[("must match the size of tensor", "in a batch (x is (b, n, d_model)) .T "
                      "reverses all three axes; .mT swaps the last two.")],
        nan_hint=_OVERFLOW.format("a score in the thousands"))
    if result.message.endswith("not implemented yet.") and "softmax_backward" in getattr(
            getattr(projection_gradients, "__code__", None), "co_names", ()):
        return CheckResult(False, f"{result.message} (Or the softmax_backward it calls is still "
                                  "exercise 2's stub: write it inside projection_gradients.)")
    return result
