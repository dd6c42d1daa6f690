r"""Why attention divides the scores by :math:`\sqrt{d_k}`: the measurements behind notebook 03.

If the components of ``q`` and ``k`` are independent with mean 0 and variance 1, then
:math:`q \cdot k = \sum_{i=1}^{d_k} q_i k_i` has mean 0 and variance :math:`d_k`, so the scores
grow like :math:`\sqrt{d_k}` and the softmax saturates (one weight near 1, the others near 0).
A saturated softmax has a Jacobian :math:`J = \mathrm{diag}(a) - a a^\top` near zero, so almost no
gradient reaches the scores. Dividing by :math:`\sqrt{d_k}` brings the variance back to 1.
A temperature ``T`` divides the scores once more: ``softmax(s / T)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_min_dim, require_positive_int, require_tensor, shape
from ..entropy import attention_entropy
from ..measure import fit_power_law
from ..training import TrainResult, train

__all__ = [
    "D_KS",
    "dot_products",
    "dot_product_variance",
    "variance_table",
    "loglog_slope",
    "random_scores",
    "softmax_jacobian",
    "jacobian_norm",
    "saturation_stats",
    "saturation_table",
    "temperature_softmax",
    "temperature_for_entropy",
    "RetrievalModel",
    "retrieval_batch",
    "train_retrieval",
    "mean_loss",
    "smoothed",
]

D_KS = (4, 16, 64, 256, 1024)


def _generator(generator: torch.Generator | None, seed: int = 0) -> torch.Generator:
    return generator if generator is not None else torch.Generator().manual_seed(seed)


def _check_scaled(scaled) -> bool:
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {type(scaled).__name__}")
    return scaled


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


def dot_product_variance(
    d_k: int, *, scaled: bool = False, n_samples: int = 10_000,
    generator: torch.Generator | None = None,
) -> float:
    """Sample variance of :func:`dot_products`: about ``d_k`` unscaled, about 1 scaled."""
    return dot_products(d_k, n_samples, scaled=scaled, generator=generator).var().item()


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
    """Slope of ``log y`` against ``log x`` (1 for ``y ∝ x``, 0 for constant ``y``): the exponent
    of :func:`attn_helpers.measure.fit_power_law`."""
    return fit_power_law(xs, ys).slope


def random_scores(
    d_k: int, n_queries: int, n_keys: int, *, scaled: bool, temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``(n_queries, n_keys)`` float64 scores ``q . k / (sqrt(d_k) if scaled else 1) / T`` for
    standard normal queries and keys of size ``d_k``."""
    require_positive_int("d_k", d_k)
    require_positive_int("n_queries", n_queries)
    require_positive_int("n_keys", n_keys)
    _check_scaled(scaled)
    _check_temperature(temperature)
    g = _generator(generator)
    q = torch.randn(n_queries, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(n_keys, d_k, generator=g, dtype=torch.float64)
    scores = q @ k.T
    if scaled:
        scores = scores / math.sqrt(d_k)
    return scores / temperature


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    r"""Jacobian of the softmax at the point where it outputs ``weights``:
    :math:`J_{ij} = \partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)`.

    ``(..., n) -> (..., n, n)``.
    """
    require_tensor("weights", weights, floating=True)
    require_min_dim("weights", weights, 1, "(..., n)")
    return torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]


def jacobian_norm(weights: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of :func:`softmax_jacobian` for each row: ``(..., n) -> (...)``. Zero for a
    one-hot row; largest (``sqrt((n-1)/n) / sqrt(n)``... about ``1/sqrt(n)``) for a uniform one."""
    return torch.linalg.matrix_norm(softmax_jacobian(weights))


def saturation_stats(
    d_k: int, *, scaled: bool, n_keys: int = 16, n_queries: int = 2000, seed: int = 0,
) -> dict[str, float]:
    """Means over random queries of the largest weight, the entropy (nats) and the softmax
    Jacobian norm, for scores of size ``d_k`` with or without the ``1/sqrt(d_k)`` scaling."""
    scores = random_scores(d_k, n_queries, n_keys, scaled=scaled,
                           generator=torch.Generator().manual_seed(seed))
    weights = torch.softmax(scores, dim=-1)
    return {"max weight": weights.amax(-1).mean().item(),
            "entropy": attention_entropy(weights).mean().item(),
            "jacobian norm": jacobian_norm(weights).mean().item()}


def saturation_table(
    d_ks: Sequence[int] = D_KS, *, n_keys: int = 16, n_queries: int = 2000, seed: int = 0,
) -> list[dict]:
    """:func:`saturation_stats` for every ``d_k``, unscaled and scaled: a list of rows
    ``{"d_k", "scaled", "max weight", "entropy", "jacobian norm"}``."""
    return [{"d_k": d_k, "scaled": scaled,
             **saturation_stats(d_k, scaled=scaled, n_keys=n_keys, n_queries=n_queries, seed=seed)}
            for scaled in (False, True) for d_k in d_ks]


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    return float(temperature)


def temperature_softmax(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(scores / T)`` over the last dim; ``(..., n) -> (..., n)``."""
    require_tensor("scores", scores, floating=True)
    return torch.softmax(scores / _check_temperature(temperature), dim=-1)


def temperature_for_entropy(
    scores: torch.Tensor, target: float, *, low: float = 1e-4, high: float = 1e4,
    iterations: int = 200,
) -> float:
    """The temperature ``T`` at which ``softmax(scores / T)`` has entropy ``target`` nats.

    The entropy grows monotonically with ``T`` (from 0 for a unique maximum to ``ln n``), so a
    bisection on ``log T`` finds it. ``scores`` is one row ``(n,)`` whose entries are not all equal.
    """
    require_tensor("scores", scores, floating=True)
    if scores.dim() != 1 or len(scores) < 2:
        raise ValueError(f"scores must be one row (n,) with n >= 2, got shape {shape(scores)}")
    if torch.all(scores == scores[0]):
        raise ValueError("scores are all equal: the entropy is ln n at every temperature")
    scores = scores.double()

    def entropy(t: float) -> float:
        return attention_entropy(torch.softmax(scores / t, dim=-1)).item()

    if not entropy(low) <= target <= entropy(high):
        raise ValueError(f"target={target} is outside the reachable entropies "
                         f"[{entropy(low):.4g}, {entropy(high):.4g}] for T in [{low}, {high}]")
    lo, hi = math.log(low), math.log(high)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if entropy(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


# --- the training experiment: the same model with and without the scaling -------------------


class RetrievalModel(nn.Module):
    r"""One attention step that must find, among ``n`` keys, the one the query is a noisy copy of,
    and return that key's value.

    ``q = x_query W_Q``, ``k_j = x_j W_K`` with ``W`` initialised so that every component of ``q``
    and ``k`` has variance about 1; scores ``q . k_j`` are divided by :math:`\sqrt{d_k}` only when
    ``scaled``. ``forward(query (b, d_in), keys (b, n, d_in), values (b, n, d_v)) -> (b, d_v)``.
    """

    def __init__(self, d_in: int, d_k: int, *, scaled: bool):
        super().__init__()
        require_positive_int("d_in", d_in)
        require_positive_int("d_k", d_k)
        self.scaled = _check_scaled(scaled)
        self.d_k = d_k
        self.w_q = nn.Linear(d_in, d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        for layer in (self.w_q, self.w_k):
            nn.init.normal_(layer.weight, std=1.0 / math.sqrt(d_in))

    def forward(self, query, keys, values):
        q = self.w_q(query)[:, None, :]                  # (b, 1, d_k)
        k = self.w_k(keys)                               # (b, n, d_k)
        scores = (q * k).sum(-1)                         # (b, n)
        if self.scaled:
            scores = scores / math.sqrt(self.d_k)
        return (torch.softmax(scores, dim=-1)[:, :, None] * values).sum(1)


def retrieval_batch(
    batch: int, generator: torch.Generator, *, n_keys: int = 16, d_in: int = 64, d_v: int = 8,
    noise: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(query (b, d_in), keys (b, n, d_in), values (b, n, d_v), target (b, d_v))``: the query is
    one of the keys plus Gaussian noise, the target is that key's value."""
    keys = torch.randn(batch, n_keys, d_in, generator=generator)
    values = torch.randn(batch, n_keys, d_v, generator=generator)
    index = torch.randint(n_keys, (batch,), generator=generator)
    rows = torch.arange(batch)
    query = keys[rows, index] + noise * torch.randn(batch, d_in, generator=generator)
    return query, keys, values, values[rows, index]


def train_retrieval(
    *, scaled: bool, d_k: int = 256, seed: int = 0, steps: int = 300, lr: float = 3e-3,
    batch: int = 64, d_in: int = 64,
) -> TrainResult:
    """Train a :class:`RetrievalModel` (mean squared error to the target value); return its losses.
    Runs on one thread (see :func:`attn_helpers.training.single_thread`).

    The two settings of ``scaled`` share the seed, so they start from the same weights and see
    the same batches: the scaling is the only difference.
    """
    torch.manual_seed(seed)
    model = RetrievalModel(d_in, d_k, scaled=scaled)

    def make_batch(_step, generator):
        return retrieval_batch(batch, generator, d_in=d_in)

    def loss_fn(m, query, keys, values, target):
        return F.mse_loss(m(query, keys, values), target)

    return train(model, make_batch, loss_fn, steps=steps, lr=lr, seed=seed, progress=False,
                 single_threaded=True)


def mean_loss(losses: Sequence[float], start: int = 0, stop: int | None = None) -> float:
    """Mean of ``losses[start:stop]`` (e.g. the first 100 steps of a :class:`TrainResult`)."""
    part = list(losses)[start:stop]
    if not part:
        raise ValueError(f"no losses in [{start}:{stop}] of {len(losses)}")
    return sum(part) / len(part)


def smoothed(losses: Sequence[float], window: int = 10) -> tuple[list[int], list[float]]:
    """Means of consecutive blocks of ``window`` losses, for plotting a noisy curve.

    Returns ``(steps, means)``: the last step (1-based) of each block and the block's mean.
    """
    require_positive_int("window", window)
    losses = list(losses)
    steps = list(range(window, len(losses) + 1, window))
    return steps, [sum(losses[s - window:s]) / window for s in steps]
