"""Notebook 02's lesson (``lessons.query_key_value``): the hard and the soft lookup against
scaled attention, and the hand-set sentence. (The convex-hull helpers are tested
in ``test_query_key_value_geometry.py``; the notebook's claims are asserted in its cells.)"""

from __future__ import annotations

import torch

import attn_helpers as ah
from attn_helpers.lessons import query_key_value as lesson
from attn_helpers.widgets.query_key_value import DEMO_KEYS


def plane(dtype=torch.float64):
    keys = torch.tensor(list(DEMO_KEYS.values()), dtype=dtype)
    values = torch.eye(3, dtype=dtype)[list(lesson.PLANE_VALUES)]
    return keys, values


def test_lookups_are_argmax_and_scaled_attention():
    keys, values = plane()
    query = torch.tensor([0.3, -1.7], dtype=torch.float64)
    hard_w, soft_w, hard_out, soft_out = lesson.lookups(query, keys, values)
    out, weights = ah.scaled_dot_product_attention(query[None], keys, values)
    assert torch.allclose(soft_w, weights[0], atol=1e-12) and torch.allclose(soft_out, out[0])
    best = int((keys @ query).argmax())
    assert torch.equal(hard_w, torch.eye(6, dtype=torch.float64)[best])
    assert torch.equal(hard_out, values[best])


def test_sentence_projections_factor_the_affinities():
    X, W_Q, W_K, W_V = lesson.sentence_projections(seed=3)
    assert X.shape == (6, 6) and torch.equal(W_V, torch.eye(6))
    M = W_Q @ W_K.T                                              # = M R R^T = M
    f = {name: i for i, name in enumerate(lesson.FEATURES)}
    expected = torch.zeros(6, 6)
    for mine, wanted in lesson.LOOKS_FOR.items():
        expected[f[mine], f[wanted]] = lesson.AFFINITY
    assert torch.allclose(M, expected, atol=1e-5)
    assert torch.allclose(W_K @ W_K.T, torch.eye(6), atol=1e-5)  # R is orthogonal
    assert not torch.allclose(W_K, lesson.sentence_projections(seed=4)[2])
