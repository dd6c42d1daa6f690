"""Position helpers against the papers' formulas and their defining properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.attention import scaled_dot_product_attention
from attn_helpers.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    frequencies,
    pair_rotation,
    sinusoidal_encoding,
)


def test_sinusoidal_matches_the_formula_element_by_element():
    n, d = 7, 10
    pe = sinusoidal_encoding(n, d, dtype=torch.float64)
    for p in range(n):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)
    assert sinusoidal_encoding(3, 4).dtype == torch.float32


@settings(max_examples=30, deadline=None, derandomize=True)
@given(k=st.integers(0, 40), half=st.integers(1, 12))
def test_dot_product_depends_only_on_offset(k, half):
    d = 2 * half
    pe = sinusoidal_encoding(80, d, dtype=torch.float64)
    dots = (pe[: 80 - k] * pe[k:]).sum(-1)
    expected = torch.cos(k * frequencies(d)).sum()
    assert torch.allclose(dots, expected.expand_as(dots), atol=1e-9)
    assert torch.allclose((pe**2).sum(-1), torch.tensor(float(half), dtype=torch.float64))  # k = 0


@settings(max_examples=30, deadline=None, derandomize=True)
@given(k=st.integers(-20, 20), pair=st.integers(0, 7), p=st.integers(0, 30))
def test_offset_is_a_fixed_rotation_of_each_pair(k, pair, p):
    pe = sinusoidal_encoding(81, 16, dtype=torch.float64)  # rows up to p + 30 + k = 80
    rotation = pair_rotation(k, 16, pair)
    assert torch.allclose(rotation @ rotation.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(rotation @ pe[p + 30, 2 * pair:2 * pair + 2],
                          pe[p + 30 + k, 2 * pair:2 * pair + 2], atol=1e-9)


def test_learned_adds_its_first_rows():
    layer = LearnedPositionalEmbedding(10, 4)
    x = torch.zeros(2, 6, 4)
    assert torch.equal(layer(x), layer.weight[:6].expand(2, 6, 4))


def rope_reference(x, positions, base=10000.0):
    """RoFormer's eq. 34: block-diagonal rotation matrices, built explicitly."""
    n, d = x.shape
    out = torch.empty_like(x)
    for row in range(n):
        rotation = torch.zeros(d, d, dtype=x.dtype)
        for i in range(d // 2):
            theta = float(positions[row]) * base ** (-2 * i / d)
            c, s = math.cos(theta), math.sin(theta)
            rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]])
        out[row] = rotation @ x[row]
    return out


def test_rope_matches_the_rotation_matrix_form(gen):
    x = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 3, 1, 7, 20])
    assert torch.allclose(apply_rope(x, positions), rope_reference(x, positions), atol=1e-12)
    assert torch.allclose(apply_rope(x), rope_reference(x, torch.arange(5)), atol=1e-12)
    # a batch of position rows, and float32 kept
    x = x.float()
    out = apply_rope(x.expand(2, 5, 8), torch.stack([torch.arange(5), torch.arange(3, 8)]))
    assert out.dtype == torch.float32 and torch.allclose(out[1], apply_rope(x, torch.arange(3, 8)))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(-100, 100),
       seed=st.integers(0, 1000))
def test_rope_score_depends_only_on_the_offset(m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 8, generator=g, dtype=torch.float64)

    def score(a, b):
        return (apply_rope(q, torch.tensor([a])) * apply_rope(k, torch.tensor([b]))).sum()

    m2, n2 = m + abs(shift), n + abs(shift)
    assert torch.allclose(score(m, n), score(m2, n2), atol=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 1000), n=st.integers(1, 12), half=st.integers(1, 8))
def test_rope_preserves_norms_and_position_zero(seed, n, half):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, n, 2 * half, generator=g, dtype=torch.float64)
    rotated = apply_rope(x)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-10)
    assert torch.allclose(rotated[:, 0], x[:, 0])


@pytest.mark.parametrize("heads", [1, 3, 5, 6, 8, 12, 16, 20])
def test_alibi_slopes_match_the_paper(heads):
    """A geometric sequence from 2^(-8/h) for h a power of two; otherwise the closest power of two's,
    then every other slope of the next power of two's."""
    closest = 2 ** int(math.log2(heads))
    expected = [2 ** (-8 / closest * (i + 1)) for i in range(closest)]
    expected += [2 ** (-8 / (2 * closest) * (i + 1)) for i in range(0, 2 * closest, 2)]
    assert torch.allclose(alibi_slopes(heads), torch.tensor(expected[:heads], dtype=torch.float64))


def test_alibi_bias_shape_values_and_causal_part():
    bias = alibi_bias(5, 4)
    assert bias.shape == (4, 5, 5) and bias.dtype == torch.float32
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(i + 1):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j), abs=1e-6)
    assert torch.equal(bias, bias.transpose(-1, -2))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 10))
def test_attention_without_positions_is_permutation_equivariant(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    perm = torch.randperm(n, generator=g)
    out = scaled_dot_product_attention(x, x, x)[0]
    assert torch.allclose(scaled_dot_product_attention(x[perm], x[perm], x[perm])[0], out[perm])
