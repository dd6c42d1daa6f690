r"""Notebook 03, why attention divides the scores by :math:`\sqrt{d_k}`: the softmax's Jacobian,
the toy retrieval model of section 4 (also trained by ``studies/scaling_retrieval.py``, which
writes :data:`RECORD`) and exercise 3's gradient table. The ``*_claims`` functions hold the
thresholds: the notebook asserts them on its runs and the record, the study on fresh runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_bool, require_min_dim, require_positive_int, require_tensor
from ..measure import fit_power_law
from ..training import TrainResult, single_thread, train

__all__ = [
    "D_KS", "softmax_jacobian", "jacobian_norm", "RetrievalModel",
    "retrieval_batch", "train_retrieval", "mean_loss", "spikes", "SPIKE", "RECORD",
    "training_claims", "sgd_claims", "lr_claims", "PROJECTION_SEEDS", "projection_gradient_table",
    "projection_claims",
]

D_KS = (4, 16, 64, 256, 1024)


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    r""":math:`J_{ij} = \partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)` of the softmax at
    ``weights``: ``(..., n) -> (..., n, n)``."""
    require_tensor("weights", weights, floating=True)
    require_min_dim("weights", weights, 1, "(..., n)")
    return torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]


def jacobian_norm(weights: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of :func:`softmax_jacobian` for each row, ``(..., n) -> (...)``."""
    return torch.linalg.matrix_norm(softmax_jacobian(weights))


class RetrievalModel(nn.Module):
    r"""One attention step that finds the key the query is a noisy copy of and returns its value.
    ``forward(query (b, d_in), keys (b, n, d_in), values (b, n, d_v)) -> (b, d_v)``; the scores
    are divided by :math:`\sqrt{d_k}` only when ``scaled``."""

    def __init__(self, d_in: int, d_k: int, *, scaled: bool):
        super().__init__()
        self.scaled, self.d_k = require_bool("scaled", scaled), require_positive_int("d_k", d_k)
        self.w_q = nn.Linear(require_positive_int("d_in", d_in), d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        for layer in (self.w_q, self.w_k):                  # every component of q and k: variance ~1
            nn.init.normal_(layer.weight, std=1.0 / math.sqrt(d_in))

    def scores(self, query, keys):
        """The scores that enter the softmax, ``(b, n)``."""
        q = self.w_q(query)[:, None, :]                     # (b, 1, d_k)
        k = self.w_k(keys)                                  # (b, n, d_k)
        scores = (q * k).sum(-1)                            # (b, n)
        return scores / math.sqrt(self.d_k) if self.scaled else scores

    def forward(self, query, keys, values):
        a = torch.softmax(self.scores(query, keys), dim=-1)    # (b, n)
        return (a[:, :, None] * values).sum(1)                 # (b, d_v)


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
    """Train a :class:`RetrievalModel` with Adam (MSE, gradient norm clipped at 1, one thread);
    both settings of ``scaled`` share the seed. ``result.evaluations``: ``(step, {"score std"})``
    at step 0 and every 50 steps, the std of the scores entering the softmax on a probe batch."""
    torch.manual_seed(seed)
    model = RetrievalModel(d_in, d_k, scaled=scaled)
    probe = retrieval_batch(256, torch.Generator().manual_seed(10_000 + seed), d_in=d_in)

    def score_std(m):
        with torch.no_grad():
            return {"score std": m.scores(*probe[:2]).std().item()}

    def loss_fn(m, query, keys, values, target):
        return F.mse_loss(m(query, keys, values), target)

    start = score_std(model)
    result = train(model, lambda _step, g: retrieval_batch(batch, g, d_in=d_in), loss_fn,
                   steps=steps, lr=lr, seed=seed, progress=False, single_threaded=True,
                   evaluate=score_std, eval_every=50)
    result.evaluations.insert(0, (0, start))
    return result


def mean_loss(losses: Sequence[float], start: int = 0, stop: int | None = None) -> float:
    """Mean of ``losses[start:stop]``."""
    part = list(losses)[start:stop]
    if not part:
        raise ValueError(f"no losses in [{start}:{stop}] of {len(losses)}")
    return sum(part) / len(part)


def spikes(losses: Sequence[float], threshold: float, start: int = 100) -> int:
    """How many of ``losses[start:]`` exceed ``threshold``."""
    return sum(loss > threshold for loss in list(losses)[start:])


SPIKE = 0.01                # a step after step 100 is a spike when its loss exceeds this
RECORD = Path(__file__).resolve().parent.parent / "data" / "scaling_retrieval.json"  # the study's


def training_claims(runs: dict[bool, TrainResult]) -> dict[str, bool]:
    """Section 4's statements on two Adam runs ``{True: scaled, False: unscaled}`` of one seed."""
    on, off = runs[True].losses, runs[False].losses
    stds = [e["score std"] for _, e in runs[True].evaluations]
    return {
        "unscaled: first 100 steps' mean loss > 3x the scaled one":
            mean_loss(off, 0, 100) > 3 * mean_loss(on, 0, 100),
        "scaled, from step 50 on: every loss < 0.03 (one wrong answer in 64), and < 0.005 on "
        "average over steps 50-100": max(on[49:]) < 0.03 and mean_loss(on, 49, 100) < 0.005,
        f"after step 100: unscaled >= 20 spikes above {SPIKE}, scaled <= 2; so the unscaled mean "
        "over the last 100 steps is higher": spikes(off, SPIKE) >= 20 and spikes(on, SPIKE) <= 2
            and mean_loss(off, -100) > mean_loss(on, -100),
        "a bimodal end: the unscaled median over the last 100 steps is > 100x lower":
            100 * statistics.median(off[-100:]) < statistics.median(on[-100:]),
        "training multiplies the scaled model's score std by > 2": stds[-1] > 2 * stds[0],
    }


def sgd_claims(runs: list[dict]) -> dict[str, bool]:
    """The plain-SGD runs' statements (every seed), on the study's rows at two rates (its record)."""
    def run(lr, seed, scaled):
        return next(r for r in runs if r["lr"] == lr and r["seed"] == seed and r["scaled"] == scaled)

    seeds = sorted({r["seed"] for r in runs})
    small, large = min(r["lr"] for r in runs), max(r["lr"] for r in runs)
    grads = [(run(small, s, True)["gradients"], run(small, s, False)["gradients"]) for s in seeds]
    alike = [mean_loss(run(small, s, False)["losses"]) / mean_loss(run(small, s, True)["losses"])
             for s in seeds]
    return {
        "step 0, unscaled: gradient at the scores < 0.5x the scaled one (every seed)":
            all(off["scores"] < 0.5 * on["scores"] for on, off in grads),
        "step 0, unscaled: gradient at W_Q, W_K > 4x the scaled one (every seed)":
            all(off["weights"] > 4 * on["weights"] for on, off in grads),
        f"SGD, lr {small:g}: both learn (last 50 steps < 0.05) and their mean losses are within "
        "1.5x (every seed)": all(1 / 1.5 < a < 1.5 for a in alike)
            and all(mean_loss(r["losses"], -50) < 0.05 for r in runs if r["lr"] == small),
        f"SGD, lr {large:g}: scaled ends below 0.005, unscaled stays above 1.0 (last 50 steps, "
        "every seed)": all(mean_loss(run(large, s, True)["losses"], -50) < 0.005
                           and mean_loss(run(large, s, False)["losses"], -50) > 1.0 for s in seeds),
    }


def lr_claims(sweep: list[dict]) -> dict[str, bool]:
    """The sweep's statements: rows ``{"lr", "seed", "scaled", "end"}`` (mean of the last 50)."""
    lrs = sorted({r["lr"] for r in sweep})

    def mean_end(lr, scaled):                          # over the seeds
        return statistics.mean(r["end"] for r in sweep if r["lr"] == lr and r["scaled"] == scaled)

    best = {flag: min(lrs, key=lambda lr: mean_end(lr, flag)) for flag in (True, False)}
    return {
        f"SGD at {len(lrs)} rates from {lrs[0]:g} to {lrs[-1]:g}: each model's best rate (lowest "
        "end loss, mean over the seeds) lies inside the sweep, not at an edge":
            all(lrs[0] < best[flag] < lrs[-1] for flag in best),
        "the scaled model's best rate is at least 10x the unscaled one's":
            best[True] >= 10 * best[False],
    }



PROJECTION_SEEDS = (0, 1, 2, 3, 4)


def projection_gradient_table(
    gradients: Callable | None, d_ks: Sequence[int], seeds: Sequence[int] = PROJECTION_SEEDS, *,
    batch: int = 32, n: int = 16, d_model: int = 64,
) -> list[dict]:
    r"""For each ``d_k``, seed and scale (:math:`1/\sqrt{d_k}` or 1): random ``x (batch, n,
    d_model)``, ``W_Q``, ``W_K`` ``(d_model, d_k)`` of variance ``1/d_model`` and a fixed ``dL/dA``.
    A row ``{"d_k", "seed", "scaled", "W_Q", "W_K", "scores", "mean row", "median row", "top
    share"}``: the norms of ``gradients(x, W_Q, W_K, scale, dL/dA)`` (``None``: autograd's), then
    of ``dS`` over all rows, its rows' mean and median norm, and the top tenth of rows' share of
    ``|dS|^2``."""
    rows = []
    with single_thread():
        for d_k in d_ks:
            for seed in seeds:
                g = torch.Generator().manual_seed(1000 * seed + d_k)
                x = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
                w_q, w_k = (torch.randn(d_model, d_k, generator=g, dtype=torch.float64)
                            / math.sqrt(d_model) for _ in range(2))
                up = torch.randn(batch, n, n, generator=g, dtype=torch.float64)    # dL/dA
                rows += [_measure(gradients, x, w_q, w_k, up, d_k, seed, scaled)
                         for scaled in (False, True)]
    return rows


def _measure(gradients, x, w_q, w_k, up, d_k, seed, scaled) -> dict:
    scale = 1 / math.sqrt(d_k) if scaled else 1.0
    w_q, w_k = (w.clone().requires_grad_(True) for w in (w_q, w_k))
    scores = scale * (x @ w_q) @ (x @ w_k).mT                            # (b, n, n)
    scores.retain_grad()
    (torch.softmax(scores, dim=-1) * up).sum().backward()                 # L = <A, dL/dA>
    grad_w_q, grad_w_k, d_s = w_q.grad, w_k.grad, scores.grad
    if gradients is not None:
        grad_w_q, grad_w_k = gradients(x, w_q.detach(), w_k.detach(), scale, up)
    per_row = d_s.norm(dim=-1).flatten()                                  # (b * n,)
    squares = per_row.square().sort(descending=True).values
    top = squares[:max(1, round(0.1 * len(squares)))].sum() / squares.sum()
    return {"d_k": d_k, "seed": seed, "scaled": scaled, "W_Q": grad_w_q.norm().item(),
            "W_K": grad_w_k.norm().item(), "scores": d_s.norm().item(),
            "mean row": per_row.mean().item(), "median row": per_row.median().item(),
            "top share": top.item()}


def projection_claims(rows: list[dict], *, why: bool = False) -> dict[str, bool]:
    """Exercise 3's statements on `projection_gradient_table`: what the gradient at W_Q does, or
    (``why``) where it comes from."""
    by = {(r["d_k"], r["seed"], r["scaled"]): r for r in rows}
    pairs = {(d, s): (by[d, s, False], by[d, s, True]) for d, s, scaled in by if scaled}
    d_ks = sorted({d for d, _ in pairs})
    ratio = {key: off["W_Q"] / on["W_Q"] for key, (off, on) in pairs.items()}
    top = max(d_ks)

    def medians(key, scaled, sizes=d_ks):
        return [statistics.median(r[key] for r in rows if r["d_k"] == d and r["scaled"] == scaled)
                for d in sizes]

    if not why:
        median_ratio = [statistics.median(r for (d, _), r in ratio.items() if d == d_k)
                        for d_k in d_ks]
        scaled = medians("W_Q", True)
        return {
            "unscaled: more gradient reaches W_Q and W_K than scaled (> 1.5x) at every d_k, on "
            "every seed": all(off[w] > 1.5 * on[w] for off, on in pairs.values()
                              for w in ("W_Q", "W_K")),
            f"the W_Q ratio rises with every d_k step (median over seeds), > 8x at d_k = {top} "
            "on every seed": all(a < b for a, b in pairwise(median_ratio))
            and all(r > 8 for (d, _), r in ratio.items() if d == top),
            "scaled: |dW_Q| flat in d_k (medians over seeds within 20% of each other)":
                max(scaled) < 1.2 * min(scaled),
        }
    mid = [d for d in d_ks if d >= 64]
    root, mean = medians("scores", False, mid), medians("mean row", False, mid)
    off_top, on_top = zip(*(pairs[d, s] for d, s in pairs if d == top), strict=True)
    return {
        "the W_Q ratio is sqrt(d_k) x the ratio of |dS| over all rows, within 20% (every d_k and "
        "seed)": all(abs(ratio[d, s] / (math.sqrt(d) * off["scores"] / on["scores"]) - 1) < 0.2
                     for (d, s), (off, on) in pairs.items()),
        "unscaled, from d_k = 64 on: |dS| over all rows falls like d_k^-1/4 (slope in (-0.35, "
        "-0.1)), the mean row like d_k^-1/2 (slope in (-0.6, -0.35))":
            -0.35 < fit_power_law(mid, root).slope < -0.1
            and -0.6 < fit_power_law(mid, mean).slope < -0.35,
        f"d_k = {top}: the top 10% of rows hold > 90% of |dS|^2 unscaled, < 40% scaled; the "
        "median row passes back < 0.001x the scaled one":
            all(r["top share"] > 0.9 for r in off_top) and all(r["top share"] < 0.4 for r in on_top)
            and all(off["median row"] < 1e-3 * on["median row"]
                    for off, on in zip(off_top, on_top, strict=True)),
    }
