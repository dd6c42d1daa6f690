"""Independent reference computations for the tests, in float64 numpy with explicit loops.

Nothing here calls ``attn_helpers``; the tests compare the package against these.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def as_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def softmax_row(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Softmax of a 1-D row over the allowed entries; zeros when nothing is allowed."""
    out = np.zeros_like(scores, dtype=np.float64)
    if not allowed.any():
        return out
    kept = scores[allowed]
    e = np.exp(kept - kept.max())
    out[allowed] = e / e.sum()
    return out


def attention_weights(q, k, *, scale=None, mask=None) -> np.ndarray:
    """``softmax(q k^T * scale)`` with a boolean mask (True = may attend), row by row.

    ``q`` ``(..., n_q, d)``, ``k`` ``(..., n_k, d)``; batch dims and the mask broadcast.
    """
    q, k = as_np(q), as_np(k)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    q = np.broadcast_to(q, (*batch, n_q, d))
    k = np.broadcast_to(k, (*batch, n_k, d))
    if mask is None:
        allowed = np.ones((*batch, n_q, n_k), dtype=bool)
    else:
        allowed = np.broadcast_to(np.asarray(mask.cpu().numpy(), dtype=bool), (*batch, n_q, n_k))
    out = np.zeros((*batch, n_q, n_k))
    for index in np.ndindex(*batch):
        for i in range(n_q):
            scores = np.array(
                [sum(q[index][i, t] * k[index][j, t] for t in range(d)) * scale for j in range(n_k)]
            )
            out[index][i] = softmax_row(scores, allowed[index][i])
    return out


def attention_output(weights: np.ndarray, v) -> np.ndarray:
    v = as_np(v)
    batch = np.broadcast_shapes(weights.shape[:-2], v.shape[:-2])
    w = np.broadcast_to(weights, (*batch, *weights.shape[-2:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-2:]))
    out = np.zeros((*batch, w.shape[-2], v.shape[-1]))
    for index in np.ndindex(*batch):
        for i in range(w.shape[-2]):
            for j in range(w.shape[-1]):
                out[index][i] += w[index][i, j] * v[index][j]
    return out


def entropy(weights) -> np.ndarray:
    """Shannon entropy in nats over the last axis with 0 ln 0 = 0."""
    w = as_np(weights)
    out = np.zeros(w.shape[:-1])
    for index in np.ndindex(*w.shape[:-1]):
        out[index] = -sum(p * math.log(p) for p in w[index] if p > 0)
    return out
