"""Independent reference computations for the tests, in float64 numpy with explicit loops.

Nothing here calls ``attn_helpers``: the package is compared with these; decode_png reads widgets.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image


def decode_png(png: bytes, mode: str = "RGBA") -> np.ndarray:
    """A widget's PNG bytes as an int array ``(height, width, len(mode))``."""
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return np.asarray(image.convert(mode)).astype(int)


def as_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def attention_weights(q, k, *, scale=None, mask=None) -> np.ndarray:
    """``softmax(q k^T * scale)`` over the allowed keys (bool mask, True = may attend), row by row;
    a row with no allowed key is all zeros. ``q`` ``(..., n_q, d)``, ``k`` ``(..., n_k, d)``; batch
    dims and the mask broadcast."""
    q, k = as_np(q), as_np(k)
    (n_q, d), n_k = q.shape[-2:], k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = np.broadcast_to(q, (*batch, n_q, d)), np.broadcast_to(k, (*batch, n_k, d))
    allowed = np.broadcast_to(True if mask is None else mask.cpu().numpy(), (*batch, n_q, n_k))
    out = np.zeros((*batch, n_q, n_k))
    for index in np.ndindex(*batch):
        for i in range(n_q):
            keep = [j for j in range(n_k) if allowed[index][i, j]]
            scores = [sum(q[index][i, t] * k[index][j, t] for t in range(d)) * scale for j in keep]
            e = [math.exp(s - max(scores)) for s in scores]
            for j, e_j in zip(keep, e, strict=True):
                out[index][i, j] = e_j / sum(e)
    return out


def attention_output(weights: np.ndarray, v) -> np.ndarray:
    """``sum_j weights[i, j] v[j]``, with batch dims broadcast."""
    v = as_np(v)
    batch = np.broadcast_shapes(weights.shape[:-2], v.shape[:-2])
    w = np.broadcast_to(weights, (*batch, *weights.shape[-2:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-2:]))
    out = np.zeros((*batch, w.shape[-2], v.shape[-1]))
    for index in np.ndindex(*batch):
        for i in range(w.shape[-2]):
            out[index][i] = sum(w[index][i, j] * v[index][j] for j in range(w.shape[-1]))
    return out


def entropy(weights) -> np.ndarray:
    """Shannon entropy in nats over the last axis with 0 ln 0 = 0."""
    w = as_np(weights)
    out = np.zeros(w.shape[:-1])
    for index in np.ndindex(*w.shape[:-1]):
        out[index] = -sum(p * math.log(p) for p in w[index] if p > 0)
    return out
