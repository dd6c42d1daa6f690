"""Checkers for notebook 00: a softmax with a temperature, and the entropy of attention rows."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .core import AllocationWatch, CheckResult, Mistake, check_function, seeded, size
from .workflow import exercise


def _softmax_cases() -> list[dict]:
    g = seeded(100)
    return [
        {"scores": torch.randn(5, generator=g), "temperature": 1.0},
        {"scores": torch.randn(4, generator=g), "temperature": 0.5},
        {"scores": torch.randn(3, 6, generator=g), "temperature": 2.0},
        {"scores": torch.randn(1, generator=g), "temperature": 1.0},                  # one key
        {"scores": torch.randn(2, 2, 5, generator=g, dtype=torch.float64), "temperature": 10.0},
        {"scores": torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1000.0, -999.0]]),
         "temperature": 1.0},
        {"scores": 3 * torch.randn(4, 7, generator=g), "temperature": 0.01},  # scores / T huge
        {"scores": torch.randn(size(g, 1, 4), size(g, 1, 9), generator=g),    # random shape
         "temperature": size(g, 2, 50) / 10},
    ]


def _softmax(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(scores.double() / temperature, dim=-1).to(scores.dtype)


def _normalise(e: torch.Tensor, dim: int = -1) -> torch.Tensor:   # mistakes: e over a sum of it
    return e / e.sum(dim, keepdim=True)


FIXED_AXIS = ("Dimension out of range", "a fixed axis such as dim=1 does not exist in a one-row "
              "case. Reduce over the last axis, dim=-1.")
NOT_THE_MAX = ("you subtracted each row's minimum or mean, not its maximum: the largest score "
               "minus it can still overflow exp. With the maximum, every exponent is <= 0.")
KEEPDIM = ("a row maximum or a row sum lost its axis: shape (...,) broadcasts against the "
           "columns. Keep the reduced axis on both, (..., 1), so each row meets its own numbers.")


@exercise("start_here.softmax_with_temperature", "softmax of a score row, with a temperature",
          hints=(
              "T divides the scores before the softmax: small T sharpens the row, large T "
              "flattens it. Each row (the last dimension) sums to one; scores of 1000 must not "
              "overflow.",
              "Divide by T, subtract the row maximum, exponentiate, divide by the row sum: along "
              "dim=-1 with keepdim=True, so each row's max and sum are (..., 1).",
              "z = scores / temperature                   # (..., n)\n"
              "e = torch.exp(z - ...)                     # minus each row's max, kept (..., 1)\n"
              "return e / ...                             # each row's sum, kept (..., 1)"))
def check_softmax_with_temperature(softmax_with_temperature: Callable) -> CheckResult:
    """``softmax_with_temperature(scores (..., n), temperature) -> (..., n)``."""
    def stable(s, t):   # exp(s / T - each row's max)
        return torch.exp(s / t - (s / t).amax(-1, keepdim=True))

    no_softmax = "a softmax call does the exercise for you: write it with torch.exp and a row sum."
    return check_function(
        softmax_with_temperature, _softmax, _softmax_cases(),
        what="softmax_with_temperature", output_names=("the weights",), same_dtype=True,
        watch=lambda _: AllocationWatch(lambda _, call: no_softmax if "softmax" in call else None),
        mistakes=[
            Mistake(lambda s, t: torch.softmax(s, -1),
                    "the temperature was ignored: divide the scores by T before the softmax."),
            Mistake(lambda s, t: torch.softmax(s * t, -1),
                    "you multiplied the scores by T; divide them by T."),
            Mistake(lambda s, t: torch.softmax(s / t ** 0.5, -1), "you divided the scores by "
                    "sqrt(T); divide them by T itself (the Transformer's T is sqrt(d_k))."),
            Mistake(lambda s, t: _normalise(torch.exp(s / t - (s / t).amax(0, keepdim=True))),
                    "you subtracted a maximum over dim=0, one per column: a constant cancels only "
                    "if the whole row shares it. Subtract each row's own maximum (dim=-1)."),
            Mistake(lambda s, t: torch.softmax(s / t, 0),
                    "the softmax ran over the first dimension; each row (dim=-1) must sum to one."),
            Mistake(lambda s, t: _normalise(stable(s, t), 0),
                    "the exponentials were divided by a sum over the wrong axis (dim=0); each row "
                    "(dim=-1) must sum to one."),
            Mistake(stable, "the exponentials were not normalised: divide them by their row's sum."),
            Mistake(lambda s, t: torch.softmax(s, -1) / t,
                    "you divided the weights by T after the softmax; divide the scores before it."),
            Mistake(lambda s, t: stable(s, t) / stable(s, t).sum(),
                    "the exponentials were divided by the sum of the whole tensor; sum each row."),
            Mistake(lambda s, t: stable(s, t) / stable(s, t).sum(-1), KEEPDIM),
            Mistake(lambda s, t: _normalise(torch.exp(s / t - s.amax(-1, keepdim=True))),
                    "you subtracted the maximum of s, not of s / T: at a small T, s / T - max(s) "
                    "is still huge. Subtract the row maximum of s / T."),
            Mistake(lambda s, t: _normalise(torch.exp(s / t - (s / t).max())), "with one maximum "
                    "for the whole tensor, a row far below it underflows to 0 / 0 = NaN."),
            *(Mistake(lambda s, t, low=low: _normalise(torch.exp(s / t - low(s / t))), NOT_THE_MAX)
              for low in (lambda z: z.amin(-1, keepdim=True), lambda z: z.mean(-1, keepdim=True))),
            *(Mistake(lambda s, t, c=c: _normalise(torch.exp((s / t).clamp(-c, c))), "you clamped "
                      "s / T before exp: no inf, but scores past the clamp become equal and the "
                      "weights change. Subtract each row's maximum instead: exact, and no overflow.")
              for c in (50.0, 80.0, 88.0)),
            Mistake(lambda s, t: _normalise(torch.exp2(s / t - (s / t).amax(-1, keepdim=True))),
                    "torch.exp2 is 2 ** x, not e ** x: a softmax at T / ln 2. Use torch.exp."),
        ],
        error_hints=[("must match the size of tensor", KEEPDIM),
                     ("torch.return_types.max", "max(dim=...) returns a pair (values, indices), "
                      "not a tensor: take its .values, or use amax."), FIXED_AXIS],
        nan_hint="exp of a large number overflows to inf, and inf / inf is NaN. Subtract each row's "
                 "own maximum before exp: the constant cancels in the ratio.",
    )


def _entropy_cases() -> list[dict]:
    g = seeded(122)
    weights = [torch.softmax(torch.randn(shape, generator=g), -1)
               for shape in [(6,), (4, 4), (3, 5), (2, 2, 4)]]
    weights += [torch.softmax(torch.randn(2, 7, generator=g, dtype=torch.float64), -1),
                torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]),
                torch.softmax(2 * torch.randn(size(g, 1, 5), size(g, 1, 9), generator=g), -1),
                # weights of about 1e-6, 1e-20, a subnormal (4e-44) and 0 beside a weight of 1.0
                torch.softmax(torch.tensor([[0.0, -13.8155, -46.0517, -100.0, -1e4],
                                            [0.0, -46.0, -1e4, -1e4, -1e4],
                                            [0.0, -100.0, -101.0, -1e4, -1e4]]), -1)]
    return [{"weights": w} for w in weights]


def _entropy(weights: torch.Tensor) -> torch.Tensor:   # -sum_j a_j ln a_j in nats, 0 ln 0 = 0
    return torch.special.entr(weights).sum(-1)


ATOL, RTOL = 1e-9, 1e-4    # an eps that moves the entropy by less passes: ln(a + 1e-12)
TINY_WEIGHTS = (
    "a threshold or an eps moved your entropy by more than the checker allows (1e-9 nats plus "
    "0.01%). Rows of tiny weights (down to 4e-44) have an entropy near 0, so any shift shows. "
    "Only a weight of exactly 0 needs care: which constant touches a positive one?")
ZERO_WEIGHT_NAN = ("a key of weight 0 gave 0 * ln 0 = 0 * (-inf) = NaN; the limit of a ln a at 0 "
                   "is 0, so such a key adds exactly 0.")
OVERFLOW_INF = ("an entropy came out infinite: some step overflowed at a tiny weight. 1 / a is inf "
                "for a = 4e-44 in float32, and a * ln(inf) = inf. Use -a ln a with torch.log(a) "
                "itself: it never overflows.")
#: A threshold, a clamp or ``ln(a + eps)``: named for eps = 1e-1 .. 1e-8 and the machine eps.
EPS_FORMS = (lambda w, eps: torch.where(w > eps, -w * torch.log(w), torch.zeros_like(w)).sum(-1),
             lambda w, eps: -(w * torch.log(w.clamp_min(eps))).sum(-1),
             lambda w, eps: -(w * torch.log(w + eps)).sum(-1))


@exercise("start_here.entropy", "the entropy of attention rows", hints=(
    "Entropy is 0 when one key takes all the weight, ln n when n keys share it equally. A key "
    "with weight 0 adds nothing.",
    "Each key adds -a_j ln a_j (torch.log), but at a_j = 0 that is 0 * (-inf) = nan. Inside the "
    "log, replace zero weights by a number whose log is 0; the gradient stays finite (Going "
    "deeper). Sum over dim=-1. Keep positive weights as they are: torch.log(a + 1e-12) passes, "
    "torch.log(a + 1e-6) does not.",
    "safe = torch.where(weights > 0, weights, ...)   # 1 where a = 0: ln 1 = 0\n"
    "return -(weights * torch.log(safe)).sum(...)    # over the last axis: shape (...)"))
def check_entropy(entropy: Callable) -> CheckResult:
    """``entropy(weights (..., n)) -> (...)`` in nats, with ``0 ln 0 = 0``."""
    no_entr = ("torch.special.entr (which ah.attention_entropy uses) does the exercise for you: "
               "write -a ln a with torch.log, and give a key of weight 0 its limit, 0, yourself.")
    verdict = check_function(
        entropy, _entropy, _entropy_cases(), what="entropy", output_names=("the entropy",),
        same_dtype=True, nan_hint=ZERO_WEIGHT_NAN, atol=ATOL, rtol=RTOL, error_hints=[FIXED_AXIS],
        watch=lambda _: AllocationWatch(lambda _, call: no_entr if "entr" in call else None),
        mistakes=[
            *(Mistake(lambda w, base=base: _entropy(w) / math.log(base), f"that is log base {base} "
                      f"({unit}); use the natural log (torch.log) for nats.")
              for base, unit in ((2, "bits"), (10, "decimal digits"))),
            Mistake(lambda w: -_entropy(w),
                    "the sign is flipped: H = -sum_j a_j ln a_j is never negative."),
            Mistake(lambda w: _entropy(w) / w.shape[-1],
                    "you averaged over the keys; the entropy is the sum over j."),
            Mistake(lambda w: _entropy(w)[..., None], "you kept the summed axis (keepdim=True): "
                    "shape (..., 1). The answer has one entropy per row, shape (...)."),
            Mistake(lambda w: torch.special.entr(w).sum(0),
                    "you summed over the first dimension; sum over the keys (dim=-1)."),
            Mistake(lambda w: torch.special.entr(w),
                    "you returned each key's term -a_j ln a_j, shape (..., n); sum them over the "
                    "keys (dim=-1) for one entropy per row, shape (...)."),
            Mistake(lambda w: torch.where(w > 0, -torch.log(w), torch.zeros_like(w)).sum(-1),
                    "each term is -a_j ln a_j: the log must be weighted by a_j."),
            Mistake(lambda w: -(w * torch.log1p(w)).sum(-1),
                    "torch.log1p(a) is ln(1 + a), not ln a: use torch.log."),
            Mistake(lambda w: torch.distributions.Categorical(probs=w).entropy(), "Categorical "
                    "clamps each weight into [eps, 1 - eps] before its log, so a one-hot float32 row "
                    "gets 1.2e-7 nats, not 0. Write -a ln a with torch.log yourself."),
            Mistake(lambda w: math.log(w.shape[-1]) - _entropy(w), "that is ln n - H, how far "
                    "the row is from uniform (0 when uniform); return H = -sum_j a_j ln a_j itself."),
            *(Mistake(lambda w, form=form, eps=eps: form(w, eps or torch.finfo(w.dtype).eps),
                      TINY_WEIGHTS)
              for form in EPS_FORMS for eps in [10.0 ** -k for k in range(1, 9)] + [None]),
        ],
    )
    if not verdict and verdict.message.endswith(ZERO_WEIGHT_NAN) and "inf at index" in verdict.message:
        verdict = CheckResult(False, verdict.message[:-len(ZERO_WEIGHT_NAN)] + OVERFLOW_INF)  # not NaN
    if verdict:     # right values; is its gradient finite through a softmax with a weight of 0?
        scores = torch.tensor([-1000.0, 1.0, 0.0], requires_grad=True)
        entropy(torch.softmax(scores, -1)).sum().backward()
        if scores.grad is None or not scores.grad.isfinite().all():
            return CheckResult(True, verdict.message + "\nNote: through a softmax, the gradient of your "
                               "entropy is NaN for the whole row when a weight is exactly 0 (0 times "
                               "the infinite slope of ln a). To train with it, use the double where.")
    return verdict
