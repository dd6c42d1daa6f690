r"""Notebook 03, why divide by :math:`\sqrt{d_k}`: the softmax's Jacobian, section 4's retrieval
model (``studies/scaling_retrieval.py`` writes :data:`RECORD`), exercise 3's gradient table, the
notebook's plots. The ``*_claims`` functions hold every threshold, for the notebook and the study.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_bool, require_min_dim, require_positive_int, require_tensor
from ..measure import fit_power_law
from ..training import single_thread, train

__all__ = [
    "D_KS", "softmax_jacobian", "jacobian_norm", "RetrievalModel", "retrieval_batch",
    "retrieval_model", "train_retrieval", "sgd_losses", "SWEEP_RATES", "sgd_sweep", "mean_loss",
    "spikes", "SPIKE", "RECORD", "training_claims", "adam_arm", "crossed_claims", "wrong_picks",
    "spike_claims", "sgd_claims", "lr_claims", "matched_claims", "dk_claims", "PROJECTION_SEEDS",
    "projection_gradient_table", "projection_claims", "plot_vs_dk", "plot_adam", "plot_sgd",
    "plot_temperature", "controls_table",
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


def retrieval_model(scaled: bool, seed: int, init: float = 1.0, *, d_k: int = 256,
                    d_in: int = 64) -> RetrievalModel:
    """Section 4's model for ``seed``, with ``W_Q`` and ``W_K`` multiplied by ``init``."""
    torch.manual_seed(seed)
    model = RetrievalModel(d_in, d_k, scaled=scaled)
    with torch.no_grad():
        for layer in (model.w_q, model.w_k):
            layer.weight.mul_(init)
    return model


def train_retrieval(
    *, scaled: bool, seed: int = 0, init: float = 1.0, lr: float = 3e-3, steps: int = 300,
    d_k: int = 256, wrong: list | None = None,
) -> dict:
    """Section 4's clipped Adam: ``{"losses", "score std"}`` (probe batch, every 50 steps). ``wrong``
    gets, per step, the top weights of the queries whose top weight sits on a wrong key."""
    model = retrieval_model(scaled, seed, init, d_k=d_k)
    probe = retrieval_batch(256, torch.Generator().manual_seed(10_000 + seed))

    def score_std(m):
        with torch.no_grad():
            return {"score std": m.scores(*probe[:2]).std().item()}

    def loss_fn(m, query, keys, values, target):
        if wrong is not None:
            with torch.no_grad():
                right = (values == target[:, None, :]).all(-1).int().argmax(-1)   # (b,)
                top = torch.softmax(m.scores(query, keys), -1).max(-1)            # (b,) each
                wrong.append(top.values[top.indices != right].tolist())
        return F.mse_loss(m(query, keys, values), target)

    start = score_std(model)["score std"]
    result = train(model, lambda _step, g: retrieval_batch(64, g), loss_fn, steps=steps, lr=lr,
                   seed=seed, progress=False, single_threaded=True, evaluate=score_std,
                   eval_every=50)
    return {"losses": [float(f"{x:.4g}") for x in result.losses],
            "score std": [float(f"{x:.4g}") for x in [start] + [e["score std"] for _, e in
                                                               result.evaluations]]}


def sgd_losses(model: nn.Module, lr: float, seed: int, steps: int, optim=torch.optim.SGD) -> list:
    """Train ``model`` with ``optim`` (no clipping) on section 4's batches for ``seed``."""
    optimizer, g, losses = optim(model.parameters(), lr=lr), torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        query, keys, values, target = retrieval_batch(64, g)
        loss = F.mse_loss(model(query, keys, values), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


SWEEP_RATES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def sgd_sweep(d_k: int, seed: int, steps: int = 150) -> list[dict]:
    """Section 4's SGD at ``d_k``, each model at five rates around its best, all at once: rows
    ``{"d_k", "seed", "scaled", "lr", "end"}`` (mean of the last 50 losses)."""
    arms = [(True, lr) for lr in SWEEP_RATES[2:]] + [(False, lr) for lr in SWEEP_RATES[:-2]]
    c = torch.tensor([1 / math.sqrt(d_k) if flag else 1.0 for flag, _ in arms])[:, None, None]
    lr = torch.tensor([lr for _, lr in arms])[:, None, None]                    # (R, 1, 1)
    model = retrieval_model(True, seed, d_k=d_k)                                # section 4's init
    W_Q, W_K = (w.weight.detach().T.repeat(len(arms), 1, 1).requires_grad_()  # (R, 64, d_k)
                for w in (model.w_q, model.w_k))
    g, losses = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        query, keys, values, target = retrieval_batch(64, g)
        M = W_Q @ W_K.mT                                      # (R, 64, 64): q . k = x_q M x_k^T
        S = c * torch.einsum("bi,rij,bnj->rbn", query, M, keys)                 # (R, b, 16)
        out = torch.einsum("rbn,bnv->rbv", torch.softmax(S, -1), values)        # (R, b, d_v)
        loss = ((out - target) ** 2).mean((1, 2))                               # (R,): one per arm
        W_Q.grad = W_K.grad = None
        loss.sum().backward()                                 # each arm gets its own loss's gradient
        with torch.no_grad():
            W_Q -= lr * W_Q.grad
            W_K -= lr * W_K.grad
        losses.append(loss.detach())
    ends = torch.stack(losses[-50:]).mean(0).tolist()
    return [{"d_k": d_k, "seed": seed, "scaled": flag, "lr": rate, "end": float(f"{e:.4g}")}
            for (flag, rate), e in zip(arms, ends, strict=True)]


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


def training_claims(runs: dict[bool, dict]) -> dict[str, bool]:
    """Section 4's statements on one seed's ``{True: scaled, False: unscaled}`` Adam runs."""
    on, off = runs[True]["losses"], runs[False]["losses"]
    stds = runs[True]["score std"]
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


def adam_arm(rows: list[dict], scaled: bool, init: float, lr: float) -> list[dict]:
    """The record's Adam runs of one arm, one per seed, in seed order."""
    return sorted((r for r in rows if (r["scaled"], r["init"], r["lr"]) == (scaled, init, lr)),
                  key=lambda r: r["seed"])


def crossed_claims(rows: list[dict]) -> dict[str, bool]:
    """The crossed control (both starts x both rates, and the unscaled model), on Adam rows."""
    slow, fast = sorted({r["lr"] for r in rows})
    usual = [r["losses"] for lr in (slow, fast) for r in adam_arm(rows, True, 1.0, lr)]
    saturated = [r["losses"] for r in adam_arm(rows, True, 4.0, fast) + adam_arm(rows, False, 1.0, slow)]
    return {
        "usual start: <= 5 losses above 0.01 after step 100, at 3e-3 and at 4 x 3e-3 (every seed)":
            all(spikes(x, SPIKE) <= 5 for x in usual),
        "4x start at 4 x 3e-3, and unscaled at 3e-3: >= 20 spikes, median of the last 100 losses "
        "< 1e-4 (every seed)": all(spikes(x, SPIKE) >= 20 and statistics.median(x[-100:]) < 1e-4
                                   for x in saturated),
        "4x start at 3e-3: still learning, median of losses 201-300 > 0.01 and < 1/2 of the median "
        "of 101-200 (every seed)": all(SPIKE < statistics.median(r["losses"][200:300])
                                       < 0.5 * statistics.median(r["losses"][100:200])
                                       for r in adam_arm(rows, True, 4.0, slow)),
    }


def wrong_picks(losses: Sequence[float], wrong: Sequence[list], start: int = 100) -> dict:
    """After ``start``: spike and calm steps, and how many hold a wrong pick (``wrong`` of
    :func:`train_retrieval`); the median wrong weight at spikes."""
    spike = [w for x, w in zip(losses[start:], wrong[start:], strict=True) if x > SPIKE]
    calm = [w for x, w in zip(losses[start:], wrong[start:], strict=True) if x <= SPIKE]
    at_spikes = [x for w in spike for x in w]
    return {"spike steps": [len(spike), sum(map(bool, spike))],
            "calm steps": [len(calm), sum(map(bool, calm))],
            "wrong weight at spikes": statistics.median(at_spikes) if at_spikes else 0.0}


def spike_claims(rows: list[dict]) -> dict[str, bool]:
    """What an unscaled spike is, on the record's unscaled Adam rows (``wrong_picks``)."""
    picks = [r["picks"] for r in adam_arm(rows, False, 1.0, min(r["lr"] for r in rows))]
    return {
        "unscaled, every seed: >= 90% of spike steps hold a query whose top weight is on a wrong key":
            all(p["spike steps"][1] >= 0.9 * p["spike steps"][0] > 0 for p in picks),
        "... fewer than 10% of the calm steps after step 100 hold one":
            all(p["calm steps"][1] < 0.1 * p["calm steps"][0] for p in picks),
        "... and at spike steps the wrong key gets > 0.9 of the weight (median over the wrong picks)":
            all(p["wrong weight at spikes"] > 0.9 for p in picks),
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



def matched_claims(sweep: list[dict], matched: list[dict]) -> dict[str, bool]:
    """The scaled model from the 4x start (``matched``) against the usual start (``sweep``)."""
    usual = {(r["lr"], r["seed"]): r["end"] for r in sweep if r["scaled"]}
    return {"scaled model at rates 3 and 10: from the 4x start it ends (mean of steps 101-150) "
            "> 5x higher than from the usual start (every seed)":
            all(r["end"] > 5 * usual[r["lr"], r["seed"]] for r in matched)}


def dk_claims(rows: list[dict]) -> dict[str, bool]:
    """The best rates at other head sizes, on :func:`sgd_sweep`'s rows, every seed."""
    sizes, seeds = sorted({r["d_k"] for r in rows}), sorted({r["seed"] for r in rows})
    end = {(r["d_k"], r["seed"], r["scaled"], r["lr"]): r["end"] for r in rows}
    best = {(d, s, f): min((lr for d2, s2, f2, lr in end if (d2, s2, f2) == (d, s, f)),
                           key=lambda lr, k=(d, s, f): end[(*k, lr)])
            for d in sizes for s in seeds for f in (True, False)}
    gap = {s: [end[d, s, False, best[d, s, False]] / end[d, s, True, best[d, s, True]]
               for d in sizes] for s in seeds}
    ratio = {s: [best[d, s, True] / best[d, s, False] for d in sizes] for s in seeds}
    step = SWEEP_RATES[1] / SWEEP_RATES[0] * 1.01                                 # one grid step
    inside = {True: SWEEP_RATES[3:-1], False: SWEEP_RATES[1:-3]}
    return {
        f"each model's best rate lies inside its five rates, not at an edge (d_k = "
        f"{', '.join(map(str, sizes))}, "
        "every seed)": all(lr in inside[f] for (_, _, f), lr in best.items()),
        f"each at its own best rate, the unscaled model ends higher, by a factor that grows with "
        f"every d_k step and exceeds 30 at d_k = {sizes[-1]} (every seed)":
            all(all(a < b for a, b in pairwise(gap[s])) and gap[s][-1] > 30 for s in seeds),
        "the scaled model's best rate is >= 10x the unscaled one's, a ratio that never falls as "
        "d_k grows (every seed)": all(min(r) > 9.99 and all(a <= b for a, b in pairwise(r))
                                      for r in ratio.values()),
        f"from d_k = {sizes[0]} to {sizes[-1]}: the unscaled best rate moves at most one grid "
        "step, the scaled one's rises (every seed)":
            all(max(moved := (best[sizes[0], s, False], best[sizes[-1], s, False])) < step * min(moved)
                and best[sizes[-1], s, True] > best[sizes[0], s, True] for s in seeds),
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


# Plots and tables of the notebook (Going deeper shows their source).

def plot_vs_dk(series: dict, *, ylabel: str, title: str, ax=None, d_ks=D_KS, loglog: bool = True):
    """One line per ``series`` item, ``label: values`` (one per d_k) or ``label: (values, fmt)``."""
    ax = ax or plt.subplots(figsize=(5.5, 3.8))[1]
    for label, values in series.items():
        values, fmt = values if isinstance(values, tuple) else (values, "o-")
        ax.plot(d_ks, values, fmt, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log" if loglog else "linear")
    ax.set(xlabel="d_k (key and query size)", ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    return ax


def plot_adam(runs: dict[bool, dict], rows: list[dict]) -> None:
    """Section 4's Adam runs: seed 0 (``runs``) and the record's band over seeds (``rows``) for
    steps 1-100; after step 100 seed 0, log scale, exact zeros as triangles."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    every = [x for r in runs.values() for x in r["losses"] if x > 0]
    floor = 10 ** (math.floor(math.log10(min(every))) - 1)                    # below every loss
    for flag, name, color in ((True, "scaled", "#ff7f0e"), (False, "unscaled", "#1f77b4")):
        losses, seeds = runs[flag]["losses"], adam_arm(rows, flag, 1.0, 3e-3)
        band = torch.tensor([r["losses"][:100] for r in seeds])
        left.fill_between(range(1, 101), band.min(0).values, band.max(0).values, color=color,
                          alpha=0.2, label=f"{name}, seeds 0-{len(seeds) - 1} (record)")
        left.plot(range(1, 101), losses[:100], color=color, linewidth=1, label=f"{name}, seed 0")
        late, steps = torch.tensor(losses[100:]), torch.arange(101, len(losses) + 1)
        right.plot(steps, late.where(late > 0, torch.nan), color=color, linewidth=0.8, label=name)
        if (zero := late == 0).any():                   # every row one-hot to float32 precision
            right.plot(steps[zero], torch.full((int(zero.sum()),), floor), "v", color=color,
                       markersize=4, label=f"{name}: loss exactly 0 ({int(zero.sum())} steps)")
    left.set(xlabel="training step", ylabel="MSE loss (linear scale)", title="the start: steps 1-100")
    left.legend(fontsize=8)
    right.axhline(SPIKE, color="grey", linestyle=":", label=f"spike threshold {SPIKE}")
    right.set(yscale="log", ylim=(floor / 3, 5), xlabel="training step",
              ylabel="MSE loss (log scale)", title="seed 0 after step 100: spikes, exact zeros")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.show()


def plot_sgd(rows: list[dict]) -> None:
    """The study's SGD runs: 10-step means, mean over seeds and band from lowest to highest."""
    fig, ax = plt.subplots(figsize=(6.8, 4))
    for lr, style in ((0.3, "--"), (3.0, "-")):
        for flag, color in ((True, "#ff7f0e"), (False, "#1f77b4")):
            curves = torch.tensor([r["losses"] for r in rows if r["lr"] == lr and r["scaled"] == flag])
            windows = curves.unflatten(1, (-1, 10)).mean(-1)                  # (seeds, 15)
            steps = range(10, curves.shape[1] + 1, 10)
            ax.fill_between(steps, windows.min(0).values, windows.max(0).values, color=color,
                            alpha=0.15)
            ax.plot(steps, windows.mean(0), style, color=color, marker=".",
                    label=f"{'scaled' if flag else 'unscaled'}, lr {lr:g}")
    ax.set(yscale="log", xlabel="training step",
           ylabel=f"MSE loss, 10-step means ({curves.shape[0]} seeds: mean, band)",
           title="plain SGD: both learn at lr 0.3; at lr 3 only the scaled model does")
    ax.legend(fontsize=8)
    plt.show()


def plot_temperature(temperatures: torch.Tensor, curves: torch.Tensor, t_halves: Sequence[float],
                     halves: torch.Tensor) -> None:
    """Section 5: each row's entropy ``curves (rows, T)`` and the T that halves it."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.semilogx(temperatures, curves.T, color="#1f77b4", linewidth=0.8)
    ax.lines[0].set_label("entropy of each row")
    ax.plot(t_halves, halves, "o", color="#ff7f0e", markersize=4, label="half its T = 1 entropy")
    n = curves.shape[0]
    ax.axhline(math.log(n), color="#c0392b", linestyle="--", label=f"ceiling ln {n}")
    ax.axvline(1.0, color="grey", linestyle=":", label="T = 1 (scaled)")
    ax.axvline(1 / 16, color="black", linestyle="--", label="T = 1/16 (unscaled, d_k = 256)")
    ax.set(title=f"entropy of the {n} scaled rows as the temperature varies",
           xlabel="temperature T (applied on top of the sqrt(d_k) scaling)", ylabel="entropy (nats)")
    ax.legend(fontsize=8)
    plt.show()


def controls_table(record: dict) -> list[tuple]:
    """Section 4's controls: ``(optimiser, start, rate, measured, median over seeds, seeds)``."""
    adam, sweep, matched = record["adam"], record["sweep"], record["matched"]
    spiky = {arm: [spikes(r["losses"], SPIKE) for r in adam_arm(adam, *arm)] for arm in
             ((False, 1.0, 3e-3), (True, 1.0, 3e-3), (True, 1.0, 4 * 3e-3), (True, 4.0, 4 * 3e-3))}
    usual = {(r["lr"], r["seed"]): r["end"] for r in sweep if r["scaled"]}
    rows = [("Adam", "unscaled" if not flag else f"{init:g}x",
             "3e-3" if lr == 3e-3 else "4 x 3e-3", "spikes after step 100",
             statistics.median(n), len(n)) for (flag, init, lr), n in spiky.items()]
    ratios = [r["end"] / usual[r["lr"], r["seed"]] for r in matched]
    return rows + [("SGD", "4x / 1x", "3 and 10", "end-loss ratio", statistics.median(ratios),
                    len({r["seed"] for r in matched}))]
