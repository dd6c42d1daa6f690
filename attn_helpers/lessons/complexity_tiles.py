"""FlashAttention's tiled forward, one tile at a time, as arrays for notebook 08's tile stepper
(re-exported by :mod:`.complexity`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import require_bool, require_int_in
from ..entropy import attention_entropy

__all__ = ["TileFrame", "tile_schedule", "tile_scores", "tile_stepper"]


@dataclass(frozen=True)
class TileFrame:
    """The tiled forward after ``step`` of ``n_steps`` tiles. ``scores``, ``weights`` ``(n, n)``:
    ``exp(s - m) / l`` on the keys a row has seen (the softmax once the row is finished), NaN on
    the others; ``m``, ``l`` ``(n,)``: running max (``-inf`` before any tile) and sum; ``rescale``
    ``(n,)``: ``exp(m_before - m_after)``, applied by the last tile to ``l`` and ``acc`` (1: row
    not touched, 0: its first tile); ``tile``: ``(row_start, row_stop, col_start, col_stop)``,
    ``None`` at step 0; ``finished``, ``entropy`` (nats, NaN until finished) and ``ceiling``
    (``ln`` of the keys a row may see) ``(n,)``."""

    step: int
    n_steps: int
    scores: np.ndarray
    weights: np.ndarray
    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the paper's name
    rescale: np.ndarray
    tile: tuple[int, int, int, int] | None
    finished: np.ndarray
    entropy: np.ndarray
    ceiling: np.ndarray


def tile_schedule(n: int, block_size: int, *, causal: bool = False
                  ) -> list[tuple[int, int, int, int]]:
    """The tiles in FlashAttention-2's forward order: for each block of queries (outer loop), each
    block of keys (inner loop); with ``causal``, tiles wholly above the diagonal are skipped."""
    starts = range(0, n, block_size)
    return [(i, min(i + block_size, n), j, min(j + block_size, n))
            for i in starts for j in starts if not (causal and j >= i + block_size)]


def tile_scores(n: int, *, causal: bool = False, seed: int = 0, d: int = 16) -> torch.Tensor:
    """Seeded scaled scores ``(n, n)`` (float64) for the stepper: ``q k^T / sqrt(d)`` plus a ramp
    along the keys (later keys score higher, so the running max moves and rescaling shows);
    ``-inf`` above the diagonal with ``causal``."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2))
    s = q @ k.T / math.sqrt(d) + torch.linspace(0.0, 3.0, n, dtype=torch.float64)
    return s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf) if causal else s


def _running(s: torch.Tensor, seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Over the ``seen`` entries of each row: the running max ``m``, ``p = exp(s - m)`` (0 where
    not seen) and the running sum ``l`` of ``p``."""
    m = s.masked_fill(~seen, -math.inf).amax(dim=-1)                   # (n,)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.where(seen, torch.exp(s - safe[:, None]), 0.0)          # (n, n)
    return m, p, p.sum(dim=-1)


def tile_stepper(n: int, block_size: int, step: int, *, causal: bool = False,
                 seed: int = 0) -> TileFrame:
    """The controls (``n`` in 2..64 tokens, ``block_size`` in 1..n, ``step`` in 0..number of
    tiles) in, the arrays of :class:`TileFrame` out, for :func:`tile_scores` ``(n, seed)``."""
    n, causal = require_int_in("n", n, 2, 64), require_bool("causal", causal)
    block_size = require_int_in("block_size", block_size, 1, n)
    tiles = tile_schedule(n, block_size, causal=causal)
    step = require_int_in("step", step, 0, len(tiles))
    s, block = tile_scores(n, causal=causal, seed=seed), torch.arange(n) // block_size
    bi, bj = block[:, None], block[None, :]                           # tile row and column
    order = bi * (bi + 1) // 2 + bj if causal else bi * math.ceil(n / block_size) + bj
    order = order.masked_fill(causal & (bj > bi), len(tiles))         # position in tile_schedule
    seen, before = order < step, order < step - 1
    (m_before, _, _), (m, p, l) = _running(s, before), _running(s, seen)   # noqa: E741
    touched = (seen != before).any(dim=-1)                            # the rows of the last tile
    rescale = torch.where(touched, torch.exp(m_before - m).nan_to_num(0.0), 1.0)   # e^{m - m'}
    weights = (p / l.clamp_min(1e-300)[:, None]).masked_fill(~seen, math.nan)   # p / l, seen keys
    finished = (seen | torch.isinf(s)).all(dim=-1)
    entropy = attention_entropy(torch.softmax(s, dim=-1)).masked_fill(~finished, math.nan)
    tile = tiles[step - 1] if step else None
    return TileFrame(step, len(tiles), s.numpy(), weights.numpy(), m.numpy(), l.numpy(),
                     rescale.numpy(), tile, finished.numpy(), entropy.numpy(),
                     np.log(torch.isfinite(s).sum(dim=-1).numpy().astype(float)))
