"""Notebook 03's training experiment: one attention step learns a retrieval task, with and without
the ``1/sqrt(d_k)`` scaling (the two runs share the seed, so the scaling is the only difference).
:mod:`attn_helpers.lessons.scaling` re-exports these names and states the claims about them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_positive_int
from ..training import TrainResult, train

__all__ = ["RetrievalModel", "retrieval_batch", "train_retrieval", "mean_loss", "spikes"]


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
