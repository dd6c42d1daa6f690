"""Notebook 02's lesson (``lessons.query_key_value``): the hard and the soft lookup, the
hand-set sentence, the fitted additive scorer, the saved-for-backward measurement, and
:func:`claims`, the statements the notebook asserts. (The convex-hull helpers are tested in
``test_query_key_value_geometry.py``.)"""

from __future__ import annotations

import math

import pytest
import torch

import attn_helpers as ah
from attn_helpers.lessons import query_key_value as lesson
from attn_helpers.widgets.query_key_value import DEMO_KEYS, lookup_2d_frame


@pytest.fixture(scope="module")
def claims():
    return lesson.claims(DEMO_KEYS)


def test_every_claim_of_notebook_02_holds(claims):
    assert len(claims) >= 15
    assert all(claims.values()), [name for name, holds in claims.items() if not holds]
    groups = {name.split(":")[0] for name in claims}
    assert groups == {"lookup", "sentence", "torch", "convex", "entropy", "additive"}


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


def test_section_1_and_the_widget_at_temperature_1_agree():
    """Notebook 02 says T = 1 in the widget is section 1's scaled attention."""
    keys, values = plane()
    for x, y in [lesson.QUERY, (-2.5, 0.3), (0.0, 0.0)]:
        _, soft_w, _, _ = lesson.lookups(torch.tensor([x, y], dtype=torch.float64), keys, values)
        assert torch.allclose(lookup_2d_frame(x, y, 1.0).weights[0], soft_w, atol=1e-12)


def test_central_difference_measures_a_derivative():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    slope = lesson.central_difference(lambda v: (v ** 3).sum(), x, torch.tensor([0.0, 1.0],
                                                                                 dtype=torch.float64))
    assert abs(slope.item() - 12.0) < 1e-5                       # d/dy y^3 at y = 2


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


def test_fit_additive_reproduces_a_target_and_is_seeded(gen):
    q, k = torch.randn(2, 5, 4, generator=gen)
    target = torch.softmax(2 * torch.randn(5, 5, generator=gen), -1)
    scorer, fitted = lesson.fit_additive(q, k, target, d_a=8, steps=300)
    assert isinstance(scorer, ah.AdditiveScore) and fitted.shape == (5, 5)
    assert (fitted - target).abs().max() < 0.05
    _, again = lesson.fit_additive(q, k, target, d_a=8, steps=300)
    assert torch.equal(fitted, again)


def test_largest_saved_tensor_finds_the_additive_intermediate(gen):
    q, k = torch.randn(2, 7, 4, generator=gen)
    scorer = ah.AdditiveScore(4, 4, 5)
    assert lesson.largest_saved_tensor(lambda q, k: scorer(q, k), q, k) == 7 * 7 * 5
    assert lesson.largest_saved_tensor(lambda q, k: torch.softmax(q @ k.T, -1), q, k) == 7 * 7
    # and it sees what is saved, not what is computed: a sum saves nothing of its input's size
    assert lesson.largest_saved_tensor(lambda q, k: torch.tanh(q @ k.T).sum() * q, q, k) == 49


def test_hull_experiment_is_seeded_and_inside():
    keys, _ = plane()
    queries, outputs, inside = lesson.hull_experiment(keys, m=50, seed=2)
    assert queries.shape == outputs.shape == (50, 2) and bool(inside.all())
    assert torch.equal(queries, lesson.hull_experiment(keys, m=50, seed=2)[0])
    weights = torch.softmax(queries @ keys.T / math.sqrt(2), -1)
    assert torch.allclose(outputs, weights @ keys)
    # notebook 02's figure: 300 queries of std 2, many of them outside the hull, every output in it
    queries, _, inside = lesson.hull_experiment(keys)
    assert 1.8 < queries.std().item() < 2.2 and bool(inside.all())
    assert (~lesson.inside_convex_hull(queries, keys)).sum() > 100


def test_claims_by_group_and_the_temperature_claims():
    sentence = lesson.claims(DEMO_KEYS, group="sentence")
    assert len(sentence) == 4 and all(k.startswith("sentence") for k in sentence)
    with pytest.raises(ValueError, match="no claim"):
        lesson.claims(DEMO_KEYS, group="nothing")
    assert all(lesson.temperature_claims({0.1: 0.03, 1.0: 0.7, 10.0: 1.76}, 6).values())
    assert not all(lesson.temperature_claims({0.1: 0.3, 1.0: 0.7, 10.0: 1.0}, 6).values())
