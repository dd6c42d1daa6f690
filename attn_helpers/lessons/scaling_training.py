"""Notebook 03's training experiment: one attention step learns a retrieval task, with and without
the ``1/sqrt(d_k)`` scaling (the two runs share the seed, so the scaling is the only difference);
and the softmax temperature of its last section.
:mod:`attn_helpers.lessons.scaling` re-exports these names and the claims about them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_positive_int, require_tensor, shape
from ..entropy import attention_entropy
from ..training import TrainResult, single_thread, train

__all__ = ["RetrievalModel", "retrieval_batch", "train_retrieval", "mean_loss", "spikes",
           "training_claims", "init_gradients", "train_retrieval_sgd", "sgd_study", "sgd_claims",
           "temperature_softmax", "temperature_for_entropy"]

# The thresholds of the training claims, defined once (see training_claims()).
SLOW_START = 3              # unscaled mean loss over the first 100 steps > 3x the scaled one
SOLVED = (0.005, 0.03)      # scaled, steps 51-100: mean loss below 0.005, every step below 0.03
SPIKE = 0.01                # a step is a spike when its loss exceeds this...
SPIKES = (20, 2)            # ...unscaled: at least 20 spikes after step 100; scaled: at most 2
LOWER_END = 100             # ...but between spikes its median loss ends 100x below the scaled one
LOGIT_GROWTH = 2            # training multiplies the score std of the scaled model by > 2
# The SGD study (plain SGD, no clipping): learning rates, seeds, steps, and its thresholds.
SGD_LRS = (0.3, 3.0)
SGD_SEEDS = (0, 1, 2)
SGD_STEPS = 150
SGD_GRADIENTS = (0.5, 4)    # at step 0, unscaled: gradient at the scores < 0.5x, at W_Q, W_K > 4x
SGD_ALIKE = 1.5             # lr 0.3: mean losses over the run within a factor 1.5 of each other
SGD_LEARNS = (0.05, 0.005)  # ...both end (last 50 steps) below 0.05; lr 3: scaled below 0.005
SGD_STUCK = 1.0             # lr 3: unscaled last-50 mean loss above 1 (chance is about 2)


def _check_scaled(scaled) -> bool:
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {type(scaled).__name__}")
    return scaled


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

    def scores(self, query, keys):
        """The scores that enter the softmax, ``(b, n)``."""
        q = self.w_q(query)[:, None, :]                  # (b, 1, d_k)
        k = self.w_k(keys)                               # (b, n, d_k)
        scores = (q * k).sum(-1)                         # (b, n)
        return scores / math.sqrt(self.d_k) if self.scaled else scores

    def forward(self, query, keys, values):
        a = torch.softmax(self.scores(query, keys), dim=-1)   # (b, n)
        return (a[:, :, None] * values).sum(1)                # (b, d_v)


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
    the same batches: the scaling is the only difference. ``result.evaluations`` holds
    ``(step, {"score std": ...})`` at step 0 and every 50 steps: the standard deviation of the
    scores entering the softmax on a fixed probe batch.
    """
    torch.manual_seed(seed)
    model = RetrievalModel(d_in, d_k, scaled=scaled)
    probe = retrieval_batch(256, torch.Generator().manual_seed(10_000 + seed), d_in=d_in)

    def score_std(m):
        with torch.no_grad():
            return {"score std": m.scores(*probe[:2]).std().item()}

    def make_batch(_step, generator):
        return retrieval_batch(batch, generator, d_in=d_in)

    def loss_fn(m, query, keys, values, target):
        return F.mse_loss(m(query, keys, values), target)

    start = score_std(model)
    result = train(model, make_batch, loss_fn, steps=steps, lr=lr, seed=seed, progress=False,
                   single_threaded=True, evaluate=score_std, eval_every=50)
    result.evaluations.insert(0, (0, start))
    return result


def mean_loss(losses: Sequence[float], start: int = 0, stop: int | None = None) -> float:
    """Mean of ``losses[start:stop]`` (e.g. the first 100 steps of a :class:`TrainResult`)."""
    part = list(losses)[start:stop]
    if not part:
        raise ValueError(f"no losses in [{start}:{stop}] of {len(losses)}")
    return sum(part) / len(part)


def spikes(losses: Sequence[float], threshold: float, start: int = 100) -> int:
    """How many of ``losses[start:]`` exceed ``threshold`` (one query of 64 answered with a wrong
    value already costs about 0.03)."""
    return sum(loss > threshold for loss in list(losses)[start:])


def training_claims(runs: dict[bool, TrainResult]) -> dict[str, bool]:
    """Notebook 03's statements about the two runs ``{True: scaled, False: unscaled}`` of
    :func:`train_retrieval` (one wrong answer among 64 costs about 0.03 of loss)."""
    on, off = runs[True].losses, runs[False].losses
    stds = [e["score std"] for _, e in runs[True].evaluations]
    return {
        "unscaled: a higher loss at step 1": off[0] > on[0],
        f"unscaled: first 100 steps' mean loss > {SLOW_START}x the scaled one":
            mean_loss(off, 0, 100) > SLOW_START * mean_loss(on, 0, 100),
        f"scaled, steps 51-100: mean loss < {SOLVED[0]}, every step < {SOLVED[1]}":
            mean_loss(on, 50, 100) < SOLVED[0] and max(on[50:100]) < SOLVED[1],
        f"after step 100: unscaled >= {SPIKES[0]} spikes above {SPIKE}, scaled <= {SPIKES[1]}; "
        "so the unscaled mean over the last 100 steps is higher":
            spikes(off, SPIKE) >= SPIKES[0] and spikes(on, SPIKE) <= SPIKES[1]
            and mean_loss(off, -100) > mean_loss(on, -100),
        f"not a worse end: the unscaled median over the last 100 steps is > {LOWER_END}x lower":
            LOWER_END * statistics.median(off[-100:]) < statistics.median(on[-100:]),
        f"training multiplies the scaled model's score std by > {LOGIT_GROWTH}":
            stds[-1] > LOGIT_GROWTH * stds[0],
    }


def _sgd_setup(scaled: bool, seed: int, d_k: int, d_in: int):
    torch.manual_seed(seed)
    return RetrievalModel(d_in, d_k, scaled=_check_scaled(scaled)), torch.Generator().manual_seed(seed)


def init_gradients(*, scaled: bool, seed: int = 0, d_k: int = 256, batch: int = 1024,
                   d_in: int = 64) -> dict[str, float]:
    """At the initial weights of :func:`train_retrieval_sgd` (same seed), on a probe batch of
    ``batch`` queries: the mean norm of the gradient of the loss reaching each query's row of
    scores (times ``batch``: per query), and the norm of the gradient on ``W_Q, W_K``."""
    model, _ = _sgd_setup(scaled, seed, d_k, d_in)
    generator = torch.Generator().manual_seed(20_000 + seed)
    query, keys, values, target = retrieval_batch(batch, generator, d_in=d_in)
    scores = model.scores(query, keys)                            # (b, n)
    scores.retain_grad()
    out = (torch.softmax(scores, -1)[:, :, None] * values).sum(1)
    F.mse_loss(out, target).backward()
    weights = torch.cat([p.grad.flatten() for p in model.parameters()])
    return {"scores": scores.grad.norm(dim=-1).mean().item() * batch,   # per query, not / batch
            "weights": weights.norm().item()}


def train_retrieval_sgd(*, scaled: bool, lr: float, seed: int = 0, steps: int = SGD_STEPS,
                        d_k: int = 256, batch: int = 64, d_in: int = 64) -> list[float]:
    """:func:`train_retrieval`'s model, task and batches, trained with plain SGD (no momentum, no
    clipping), so a small gradient makes a small step. Returns every step's loss."""
    require_positive_int("steps", steps)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    with single_thread():
        model, generator = _sgd_setup(scaled, seed, d_k, d_in)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            query, keys, values, target = retrieval_batch(batch, generator, d_in=d_in)
            loss = F.mse_loss(model(query, keys, values), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def sgd_study(lrs: Sequence[float] = SGD_LRS, seeds: Sequence[int] = SGD_SEEDS,
              steps: int = SGD_STEPS) -> list[dict]:
    """:func:`train_retrieval_sgd` for every learning rate, seed and setting of the scaling, and
    :func:`init_gradients` per seed: rows ``{"lr", "seed", "scaled", "losses", "gradients"}``."""
    return [{"lr": lr, "seed": seed, "scaled": scaled,
             "losses": train_retrieval_sgd(scaled=scaled, lr=lr, seed=seed, steps=steps),
             "gradients": init_gradients(scaled=scaled, seed=seed)}
            for lr in lrs for seed in seeds for scaled in (True, False)]


def sgd_claims(rows: list[dict]) -> dict[str, bool]:
    """Notebook 03's statements about :func:`sgd_study` (on every seed)."""
    def run(lr, seed, scaled):
        return next(r for r in rows if r["lr"] == lr and r["seed"] == seed and r["scaled"] == scaled)

    seeds = sorted({r["seed"] for r in rows})
    small, large = min(r["lr"] for r in rows), max(r["lr"] for r in rows)
    grads = [(run(small, s, True)["gradients"], run(small, s, False)["gradients"]) for s in seeds]
    alike = [mean_loss(run(small, s, False)["losses"]) / mean_loss(run(small, s, True)["losses"])
             for s in seeds]
    return {
        f"step 0, unscaled: gradient at the scores < {SGD_GRADIENTS[0]}x the scaled one "
        f"(every seed)": all(off["scores"] < SGD_GRADIENTS[0] * on["scores"] for on, off in grads),
        f"step 0, unscaled: gradient at W_Q, W_K > {SGD_GRADIENTS[1]}x the scaled one "
        f"(every seed)": all(off["weights"] > SGD_GRADIENTS[1] * on["weights"] for on, off in grads),
        f"SGD, lr {small:g}: both learn (last 50 steps < {SGD_LEARNS[0]}) and their mean losses "
        f"are within {SGD_ALIKE}x (every seed)":
            all(1 / SGD_ALIKE < a < SGD_ALIKE for a in alike)
            and all(mean_loss(r["losses"], -50) < SGD_LEARNS[0] for r in rows if r["lr"] == small),
        f"SGD, lr {large:g}: scaled ends below {SGD_LEARNS[1]}, unscaled stays above {SGD_STUCK} "
        f"(last 50 steps, every seed)":
            all(mean_loss(run(large, s, True)["losses"], -50) < SGD_LEARNS[1]
                and mean_loss(run(large, s, False)["losses"], -50) > SGD_STUCK for s in seeds),
    }


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
