r"""Why attention divides the scores by :math:`\sqrt{d_k}`: the measurements behind notebook 03.

If the components of ``q`` and ``k`` are independent with mean 0 and variance 1, then
:math:`q \cdot k = \sum_{i=1}^{d_k} q_i k_i` has mean 0 and variance :math:`d_k`, so the scores
grow like :math:`\sqrt{d_k}` and the softmax saturates (one weight near 1, the others near 0).
A saturated softmax has a Jacobian :math:`J = \mathrm{diag}(a) - a a^\top` near zero, so almost no
gradient reaches the scores. Dividing by :math:`\sqrt{d_k}` brings the variance back to 1.
A temperature ``T`` divides the scores once more: ``softmax(s / T)``.
The argument assumes unit-variance components, i.e. holds at such an initialisation;
``nn.Linear``'s default init gives score std about :math:`\sqrt{d_k}/3`, that of
``nn.MultiheadAttention`` about :math:`\sqrt{d_k}/2`, and training can grow the scores.
:func:`claims` states, as named booleans, what the notebook says about each measurement; the
thresholds are defined once, below (the training ones in ``scaling_training``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

from .._checks import require_min_dim, require_positive_int, require_tensor
from ..entropy import attention_entropy
from ..measure import fit_power_law
from ..training import TrainResult
from .scaling_gradients import PROJECTION_SEEDS, projection_claims, projection_gradient_table
from .scaling_training import (
    LOGIT_GROWTH,
    LOWER_END,
    SLOW_START,
    SOLVED,
    SPIKE,
    SPIKES,
    RetrievalModel,
    _check_scaled,
    _check_temperature,
    init_gradients,
    mean_loss,
    retrieval_batch,
    sgd_claims,
    sgd_study,
    spikes,
    temperature_for_entropy,
    temperature_softmax,
    train_retrieval,
    train_retrieval_sgd,
    training_claims,
)

__all__ = [
    "D_KS", "dot_products", "variance_table", "loglog_slope",
    "random_scores", "softmax_jacobian", "jacobian_norm", "saturation_stats",
    "saturation_table", "temperature_softmax", "temperature_for_entropy", "jacobian_curve",
    "default_init_score_std", "RetrievalModel", "retrieval_batch", "train_retrieval",
    "mean_loss", "spikes", "claims", "init_gradients", "sgd_study", "SPREADS",
    "train_retrieval_sgd", "SLOW_START",
    "SOLVED", "SPIKE", "SPIKES",
    "LOWER_END", "LOGIT_GROWTH", "projection_gradient_table", "projection_claims", "PROJECTION_SEEDS",
]

D_KS = (4, 16, 64, 256, 1024)
SPREADS = tuple(2.0 ** (i / 4) for i in range(-16, 29))  # score std 1/16 .. 128, for jacobian_curve

# The thresholds of the claims, defined once (see claims()).
REL_TOL = 0.1               # measured variances and stds within 10 % of the formula
SLOPE_TOL = 0.05            # log-log slopes within 0.05 of 1 (unscaled) and 0 (scaled)
ONE_HOT = (0.95, 0.15)      # unscaled at d_k = 1024: mean largest weight above, entropy below
AT_64 = (0.8, 2 / 3)        # unscaled at d_k = 64: mean largest weight above, |J| / scaled below
SHARP_ROWS = (0.95, 0.75)   # raw example: at least 3/4 of the rows put > 0.95 on one key
FLAT = (0.06, 0.1, 0.02)    # scaled: spread over d_k of the mean largest weight, entropy, |J|
J_FRACTION = 0.2            # unscaled |J| at d_k = 1024 below this fraction of the scaled one
J_SLOPE = (-0.7, -0.3)      # unscaled |J|: log-log slope against d_k from 64 on
TYPICAL_ROW = 0.1           # unscaled, d_k >= 256: median |J| below this fraction of the mean
UNIFORM_BELOW_PEAK = 0.8    # |J| of near-uniform rows below this fraction of the peak
WIDGET = (0.5, 0.9)         # widget, d_k = 1024: scaled largest weight below; at T = 0.1 above
# the training thresholds (SLOW_START ... LOGIT_GROWTH) live in scaling_training


def _generator(generator: torch.Generator | None, seed: int = 0) -> torch.Generator:
    return generator if generator is not None else torch.Generator().manual_seed(seed)


def dot_products(
    d_k: int, n_samples: int, *, scaled: bool = False, generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""``(n_samples,)`` float64 samples of :math:`q \cdot k` (divided by :math:`\sqrt{d_k}` when
    ``scaled``) for independent ``q, k`` with standard normal components."""
    require_positive_int("d_k", d_k)
    require_positive_int("n_samples", n_samples)
    _check_scaled(scaled)
    g = _generator(generator)
    q = torch.randn(n_samples, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(n_samples, d_k, generator=g, dtype=torch.float64)
    dots = (q * k).sum(-1)
    return dots / math.sqrt(d_k) if scaled else dots


def variance_table(
    d_ks: Sequence[int] = D_KS, *, n_samples: int = 10_000, seed: int = 0,
) -> list[dict[str, float]]:
    """For each ``d_k``: ``{"d_k", "variance", "scaled variance"}`` (the same samples, divided by
    ``sqrt(d_k)`` for the second)."""
    rows = []
    for d_k in d_ks:
        dots = dot_products(d_k, n_samples, generator=torch.Generator().manual_seed(seed + d_k))
        rows.append({"d_k": d_k, "variance": dots.var().item(),
                     "scaled variance": (dots / math.sqrt(d_k)).var().item()})
    return rows


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Slope of ``log y`` against ``log x`` (1 for ``y ∝ x``, 0 for constant ``y``)."""
    return fit_power_law(xs, ys).slope


def random_scores(
    d_k: int, n_queries: int, n_keys: int, *, scaled: bool, temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``(n_queries, n_keys)`` float64 scores ``q . k / (sqrt(d_k) if scaled else 1) / T`` for
    standard normal queries and keys of size ``d_k``, every query with its own ``n_keys`` keys.

    For a fixed ``q``, ``q . k`` with ``k`` standard normal is exactly normal with variance
    ``|q|^2``: each row is drawn that way, without storing ``n_queries * n_keys`` keys."""
    require_positive_int("d_k", d_k)
    require_positive_int("n_queries", n_queries)
    require_positive_int("n_keys", n_keys)
    _check_scaled(scaled)
    _check_temperature(temperature)
    g = _generator(generator)
    q = torch.randn(n_queries, 1, d_k, generator=g, dtype=torch.float64)
    z = torch.randn(n_queries, n_keys, generator=g, dtype=torch.float64)
    scores = q.norm(dim=-1) * z / (math.sqrt(d_k) if scaled else 1.0)   # (n_queries, n_keys)
    return scores / temperature


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    r"""Jacobian of the softmax at the point where it outputs ``weights``:
    :math:`J_{ij} = \partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)`; ``(..., n) -> (..., n, n)``.
    """
    require_tensor("weights", weights, floating=True)
    require_min_dim("weights", weights, 1, "(..., n)")
    return torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]


def jacobian_norm(weights: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of :func:`softmax_jacobian` for each row: ``(..., n) -> (...)``.

    Zero for a one-hot row, ``sqrt(n - 1) / n`` (about ``1/sqrt(n)``) for a uniform row of ``n``,
    and 1/2 for two keys tied at 1/2 each, the largest value it takes (a property test checks
    this): the norm peaks at intermediate sharpness, not at either extreme.
    """
    return torch.linalg.matrix_norm(softmax_jacobian(weights))


def saturation_stats(
    d_k: int, *, scaled: bool, n_keys: int = 16, n_queries: int = 2000, seed: int = 0,
) -> dict[str, float]:
    """Means over random queries of the largest weight, the entropy (nats) and the softmax
    Jacobian norm, and the median Jacobian norm (a typical row), for scores of size ``d_k`` with
    or without the ``1/sqrt(d_k)`` scaling."""
    scores = random_scores(d_k, n_queries, n_keys, scaled=scaled,
                           generator=torch.Generator().manual_seed(seed))
    weights = torch.softmax(scores, dim=-1)
    norms = jacobian_norm(weights)
    return {"max weight": weights.amax(-1).mean().item(),
            "entropy": attention_entropy(weights).mean().item(),
            "jacobian norm": norms.mean().item(), "median jacobian norm": norms.median().item()}


def saturation_table(
    d_ks: Sequence[int] = D_KS, *, n_keys: int = 16, n_queries: int = 2000, seed: int = 0,
) -> list[dict]:
    """:func:`saturation_stats` for every ``d_k``, unscaled and scaled: a list of rows
    ``{"d_k", "scaled", "max weight", "entropy", "jacobian norm", "median jacobian norm"}``."""
    return [{"d_k": d_k, "scaled": scaled,
             **saturation_stats(d_k, scaled=scaled, n_keys=n_keys, n_queries=n_queries, seed=seed)}
            for scaled in (False, True) for d_k in d_ks]


def jacobian_curve(
    spreads: Sequence[float] = SPREADS, *, n_keys: int = 16, n_queries: int = 2000, seed: int = 0,
) -> list[float]:
    """Mean :func:`jacobian_norm` over ``n_queries`` rows of ``n_keys`` independent scores of
    standard deviation ``spread``, for each spread (the same rows, multiplied by each spread).

    Small spreads give near-uniform rows (norm ``sqrt(n-1)/n``), large ones near one-hot rows
    (norm near 0); in between the curve has a peak.
    """
    require_positive_int("n_keys", n_keys)
    require_positive_int("n_queries", n_queries)
    z = torch.randn(n_queries, n_keys, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    return [jacobian_norm(torch.softmax(spread * z, dim=-1)).mean().item() for spread in spreads]


def default_init_score_std(
    d_k: int, *, d_model: int = 256, n_samples: int = 4000, seed: int = 0,
    module: str = "linear",
) -> float:
    """Standard deviation of the raw score ``q . k`` of one head of size ``d_k`` at PyTorch's
    default initialisation, for inputs ``x, y`` with independent standard normal components.

    ``module="linear"``: ``q = x W_Q + b_Q``, ``k = y W_K + b_K`` from two
    ``nn.Linear(d_model, d_k)``, whose weights (and biases) are uniform in ``±1/sqrt(d_model)``,
    variance ``1/(3 d_model)``: components of variance about 1/3, score std about ``sqrt(d_k)/3``.
    ``module="multihead"``: head 0 of ``nn.MultiheadAttention(d_model, d_model // d_k)``, whose
    packed ``in_proj_weight`` ``(3 d_model, d_model)`` is ``xavier_uniform_`` (variance
    ``1/(2 d_model)``) and bias 0: components of variance about 1/2, score std about ``sqrt(d_k)/2``.
    """
    require_positive_int("d_k", d_k)
    require_positive_int("d_model", d_model)
    torch.manual_seed(seed)
    if module == "linear":
        w_q, w_k = nn.Linear(d_model, d_k), nn.Linear(d_model, d_k)
    elif module == "multihead" and d_model % d_k == 0:
        w = nn.MultiheadAttention(d_model, d_model // d_k).in_proj_weight     # (3 d_model, d_model)
        w_q, w_k = (lambda x: x @ w[:d_k].T), (lambda y: y @ w[d_model:d_model + d_k].T)
    else:
        raise ValueError(f"module must be 'linear' or 'multihead' (with d_k dividing d_model), "
                         f"got {module!r} with d_k={d_k}, d_model={d_model}")
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, n_samples, d_model, generator=g)
    with torch.no_grad():
        return (w_q(x) * w_k(y)).sum(-1).std().item()


def _within(measured: float, expected: float, tol: float = REL_TOL) -> bool:
    return abs(measured / expected - 1) < tol


def _rising(xs: Sequence[float]) -> bool:
    return all(a < b for a, b in pairwise(xs))


def _spread(xs: Sequence[float]) -> float:
    return max(xs) - min(xs)


def _column(rows: list[dict], name: str, scaled: bool) -> list[float]:
    return [r[name] for r in rows if r["scaled"] == scaled]


def claims(
    *, variance: list[dict] | None = None, example: tuple | None = None,
    saturation: list[dict] | None = None, gradients: list[dict] | None = None,
    curve: Sequence[float] | None = None, init_stds: dict[int, float] | None = None,
    mha_init_stds: dict[int, float] | None = None, runs: dict[bool, TrainResult] | None = None,
    temperature: tuple | None = None, widget: tuple | None = None, sgd: list[dict] | None = None,
    projections: list[dict] | None = None, projection_parts: list[dict] | None = None,
) -> dict[str, bool]:
    """Notebook 03's statements, each checked on the measurements given (the others are skipped):
    ``variance`` (:func:`variance_table`), ``example`` ``(raw weights, scaled weights)`` of one
    set of queries and keys, ``saturation`` and ``gradients`` (both :func:`saturation_table` over
    :data:`D_KS`), ``curve`` (:func:`jacobian_curve` over :data:`SPREADS`, 16 keys), ``init_stds``
    ``{d_k: default_init_score_std(d_k)}``, ``mha_init_stds`` (the same, ``module="multihead"``),
    ``runs`` ``{True: scaled, False: unscaled}`` (:func:`train_retrieval`), ``temperature``
    ``(row of scores, T_half)`` and ``widget`` ``(unscaled, scaled, cold)``: the widget's readouts
    for rising ``d_k`` without scaling (a list), at the last ``d_k`` scaled, and scaled at T = 0.1;
    ``projections`` and ``projection_parts`` (:func:`projection_gradient_table`): the gradient at
    ``W_Q``, and where it comes from (:func:`projection_claims`)."""
    out = {}
    if variance is not None:
        d_ks = [r["d_k"] for r in variance]
        raw, scaled = [r["variance"] for r in variance], [r["scaled variance"] for r in variance]
        out[f"Var(q.k) within {REL_TOL:.0%} of d_k, Var(q.k/sqrt(d_k)) within {REL_TOL:.0%} of 1"] = (
            all(_within(v, d) and _within(s, 1) for v, s, d in zip(raw, scaled, d_ks, strict=True)))
        out["log-log slope 1 unscaled, 0 scaled"] = (
            abs(loglog_slope(d_ks, raw) - 1) < SLOPE_TOL
            and abs(loglog_slope(d_ks, scaled)) < SLOPE_TOL)
    if example is not None:
        raw, scaled = example
        out["the raw example is nearly one-hot (mean largest weight > 0.9), the scaled < 0.5"] = (
            raw.amax(-1).mean().item() > 0.9 and scaled.amax(-1).mean().item() < 0.5)
        sharp = (raw.amax(-1) > SHARP_ROWS[0]).float().mean().item()
        out[f"at least {SHARP_ROWS[1]:.0%} of the raw rows put > {SHARP_ROWS[0]} on one key"] = (
            sharp >= SHARP_ROWS[1])
        out["same best key with and without the scaling"] = bool(
            (raw.argmax(-1) == scaled.argmax(-1)).all())
    if saturation is not None:
        top, ent = _column(saturation, "max weight", False), _column(saturation, "entropy", False)
        out["unscaled: the largest weight rises and the entropy falls with every d_k step"] = (
            _rising(top) and _rising([-e for e in ent]))
        out[f"unscaled, d_k = 1024: largest weight > {ONE_HOT[0]}, entropy < {ONE_HOT[1]}"] = (
            top[-1] > ONE_HOT[0] and ent[-1] < ONE_HOT[1])
        out[f"unscaled, d_k = 64: largest weight > {AT_64[0]}"] = top[D_KS.index(64)] > AT_64[0]
        out["scaled: largest weight and entropy flat in d_k"] = (
            _spread(_column(saturation, "max weight", True)) < FLAT[0]
            and _spread(_column(saturation, "entropy", True)) < FLAT[1])
    if gradients is not None:
        jac, jac_on = (_column(gradients, "jacobian norm", on) for on in (False, True))
        out[f"unscaled |J| falls with d_k, below {J_FRACTION} of the scaled one at 1024"] = (
            _rising([-j for j in jac]) and jac[-1] < J_FRACTION * jac_on[-1])
        out[f"unscaled |J| ~ 1/sqrt(d_k) from d_k = 64 on (slope in {J_SLOPE})"] = (
            J_SLOPE[0] < loglog_slope(D_KS[2:], jac[2:]) < J_SLOPE[1])
        at = D_KS.index(64)
        out[f"unscaled, d_k = 64: |J| below {AT_64[1]:.2f} of the scaled one"] = (
            jac[at] < AT_64[1] * jac_on[at])
        out[f"scaled |J| does not depend on d_k (spread < {FLAT[2]})"] = _spread(jac_on) < FLAT[2]
        out[f"unscaled, d_k >= 256: the median row's |J| is below {TYPICAL_ROW} of the mean"] = all(
            r["median jacobian norm"] < TYPICAL_ROW * r["jacobian norm"]
            for r in gradients if not r["scaled"] and r["d_k"] >= 256)
        out["at d_k = 4 the unscaled |J| is larger than the scaled one"] = jac[0] > jac_on[0]
    if curve is not None:
        peak = max(curve)
        at = SPREADS[curve.index(peak)]
        out["|J| peaks at a score std between 1 (scaled) and 4 (unscaled d_k = 16)"] = 1 < at < 4
        out[f"near-uniform rows pass less than {UNIFORM_BELOW_PEAK} of the peak, sqrt(n-1)/n"] = (
            curve[0] < UNIFORM_BELOW_PEAK * peak and _within(curve[0], math.sqrt(15) / 16, 0.01))
        out["near-one-hot rows pass almost nothing (< 0.1 of the peak)"] = curve[-1] < 0.1 * peak
    if init_stds is not None:
        out[f"default nn.Linear init: score std within {REL_TOL:.0%} of sqrt(d_k)/3"] = all(
            _within(std, math.sqrt(d_k) / 3) for d_k, std in init_stds.items())
    if mha_init_stds is not None:
        out[f"nn.MultiheadAttention init: score std within {REL_TOL:.0%} of sqrt(d_k)/2"] = all(
            _within(std, math.sqrt(d_k) / 2) for d_k, std in mha_init_stds.items())
    if runs is not None:
        out.update(training_claims(runs))
    if sgd is not None:                              # sgd_study(): plain SGD, several seeds
        out.update(sgd_claims(sgd))
    if projections is not None:                      # after exercise 3
        out.update(projection_claims(projections))
    if projection_parts is not None:
        out.update(projection_claims(projection_parts, why=True))
    if temperature is not None:
        row, t_half = temperature
        ts = torch.logspace(-2, 2, 81, dtype=torch.float64)
        h = attention_entropy(torch.softmax(row / ts[:, None], dim=-1)).tolist()
        half = 0.5 * attention_entropy(torch.softmax(row, -1)).item()
        out["the entropy rises with T from near 0 (T = 0.01) to near ln n (T = 100)"] = (
            all(a <= b + 1e-12 for a, b in pairwise(h)) and h[0] < 0.01
            and h[-1] > 0.99 * math.log(len(row)))
        out["halving the entropy takes a T below 1/2 (by more than 0.05), not T = 1/2"] = (
            abs(attention_entropy(torch.softmax(row / t_half, -1)).item() - half) < 1e-6
            and t_half < 0.5 - 0.05)
    if widget is not None:
        unscaled, scaled, cold = widget
        top = [r["largest weight (mean over rows)"] for r in unscaled]
        jac = [r["gradient norm |J| (mean over rows)"] for r in unscaled]
        out["widget, unscaled: the largest weight rises and |J| falls with d_k"] = (
            _rising(top) and _rising([-j for j in jac]))
        out[f"widget: scaling brings the largest weight below {WIDGET[0]}, T = 0.1 above "
            f"{WIDGET[1]}"] = (scaled["largest weight (mean over rows)"] < WIDGET[0]
                               and cold["largest weight (mean over rows)"] > WIDGET[1])
    return out
