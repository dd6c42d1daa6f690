"""RoPE's motivation (project, then rotate) and its two layouts, checked against Hugging Face
Llama's ``rotate_half`` implementation and the row permutation of its weight conversion."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.lessons import rope
from attn_helpers.positional import apply_rope, sinusoidal_encoding


def hf_rope_half(x: torch.Tensor, base: float, positions: torch.Tensor) -> torch.Tensor:
    """Hugging Face Llama: ``LlamaRotaryEmbedding`` gives cos/sin, ``apply_rotary_pos_emb`` rotates."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, d = x.shape[1], x.shape[-1]
    config = LlamaConfig(hidden_size=heads * d, num_attention_heads=heads,
                         max_position_embeddings=4096, rope_theta=base)
    config.rope_parameters = {"rope_type": "default", "rope_theta": base}
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None].expand(x.shape[0], -1))
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


@pytest.mark.parametrize(("d", "base"), [(8, 10000.0), (16, 10000.0), (64, 500000.0)])
def test_half_layout_equals_hugging_face_llama(d, base):
    x = torch.randn(2, 3, 40, d, generator=torch.Generator().manual_seed(d))  # (b, heads, n, d)
    positions = torch.arange(40) * 3 + 5
    ours = rope.apply_rope_half(x, positions, base=base)
    assert torch.allclose(ours, hf_rope_half(x, base, positions), atol=2e-4)
    assert not torch.allclose(ours, apply_rope(x, positions, base=base), atol=1e-2)


def test_row_permutation_equals_the_conversion_scripts_reshape():
    """Hugging Face's Llama conversion permutes q/k rows with ``view(heads, d/2, 2, d_in)
    .transpose(1, 2)``; :func:`rope.permute_rows` must be that same reordering."""
    heads, d_head, d_in = 4, 8, 12
    W = torch.randn(heads * d_head, d_in, generator=torch.Generator().manual_seed(0))
    reference = W.view(heads, d_head // 2, 2, d_in).transpose(1, 2).reshape(heads * d_head, d_in)
    assert torch.equal(rope.permute_rows(W, heads), reference)
    assert rope.interleaved_to_half(6).tolist() == [0, 2, 4, 1, 3, 5]


@settings(max_examples=30, deadline=None)
@given(pairs=st.integers(1, 8), n=st.integers(1, 20), seed=st.integers(0, 10_000),
       base=st.floats(2.0, 1e6))
def test_layouts_differ_by_the_permutation_only(pairs, n, seed, base):
    x = torch.randn(n, 2 * pairs, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    perm = rope.interleaved_to_half(2 * pairs)
    assert torch.allclose(rope.apply_rope_half(x[..., perm], base=base),
                          apply_rope(x, base=base)[..., perm], atol=1e-10)


def test_position_scores_match_a_loop_over_positions():
    d, n = 6, 5
    W_Q, W_K = rope.random_projections(d, seed=3)
    x = torch.randn(d, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    pe = sinusoidal_encoding(n, d, dtype=torch.float64)
    added = rope.position_scores("add, then project", W_Q, W_K, x, n)
    rotated = rope.position_scores("project, then rotate", W_Q, W_K, x, n)
    for p in range(n):
        for q in range(n):
            assert math.isclose(added[p, q], (W_Q @ (x + pe[p])) @ (W_K @ (x + pe[q])), abs_tol=1e-12)
            q_p = apply_rope((W_Q @ x).expand(n, d))[p]
            k_q = apply_rope((W_K @ x).expand(n, d))[q]
            assert math.isclose(rotated[p, q], q_p @ k_q, abs_tol=1e-12)


@settings(max_examples=20, deadline=None)
@given(pairs=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_rotating_after_projection_is_relative_for_any_projection(pairs, seed):
    scores = rope.position_scores("project, then rotate", *rope.random_projections(2 * pairs, seed=seed),
                                  torch.randn(2 * pairs, dtype=torch.float64), 20)
    assert rope.diagonal_spread(scores) < 1e-9 * max(1.0, scores.abs().max().item())
    commuting = rope.commuting_projections(2 * pairs, seed=seed)
    absolute = rope.position_scores("add, then project", *commuting,
                                    torch.zeros(2 * pairs, dtype=torch.float64), 20)
    assert rope.diagonal_spread(absolute) < 1e-9 * max(1.0, absolute.abs().max().item())


def test_head_projections_are_the_models_queries_and_keys():
    from attn_helpers.lessons.positional_encoding import PositionTaskModel

    torch.manual_seed(0)
    model = PositionTaskModel("none").eval()
    x = torch.randn(5, model.d_model)
    q, k, _ = model.qkv(x).view(5, 3, model.num_heads, -1).unbind(1)  # (n, heads, d_head)
    for head in range(model.num_heads):
        W_Q, W_K = rope.head_projections(model.qkv.weight, model.num_heads, head)
        assert torch.allclose(x.double() @ W_Q.T, q[:, head].double(), atol=1e-6)
        assert torch.allclose(x.double() @ W_K.T, k[:, head].double(), atol=1e-6)


def test_adding_before_a_generic_projection_is_not_relative():
    for seed in range(5):
        W_Q, W_K = rope.random_projections(8, seed=seed)
        scores = rope.position_scores("add, then project", W_Q, W_K,
                                      torch.zeros(8, dtype=torch.float64), 24)
        assert rope.diagonal_spread(scores) > 0.1 * scores.abs().max().item()


def test_diagonal_spread():
    values = torch.arange(-4.0, 5.0)
    toeplitz = values[torch.arange(5)[None, :] - torch.arange(5)[:, None] + 4]  # T[p, q] = v[q - p]
    assert rope.diagonal_spread(toeplitz) == 0.0
    toeplitz[1, 2] += 0.25
    assert rope.diagonal_spread(toeplitz) == 0.25
    with pytest.raises(ValueError, match=r"square \(n, n\) grid, got \(2, 3\)"):
        rope.diagonal_spread(torch.zeros(2, 3))


def test_projected_scores_is_the_widget_function():
    for mode in rope.MODES:
        scores = rope.projected_scores(mode, n=12, d=8, seed=1)
        assert scores.shape == (12, 12) and scores.dtype == torch.float64
        assert torch.equal(scores, rope.projected_scores(mode, n=12, d=8, seed=1))
    assert rope.diagonal_spread(rope.projected_scores("project, then rotate")) < 1e-9
    assert rope.diagonal_spread(rope.projected_scores("add, then project")) > 1.0


def test_rope_claims_hold_and_can_fail(monkeypatch):
    verdicts = rope.rope_claims()
    assert len(verdicts) == 9 and all(verdicts.values()), verdicts
    monkeypatch.setattr(rope, "apply_rope_half", lambda x, *a, **k: apply_rope(x))
    broken = rope.rope_claims()
    assert not broken["the split-halves layout is the interleaved one with dimensions permuted"]
    assert not broken["loading the weights without the permutation changes the scores"]
    def scaled(x, *args, **kwargs):  # scales position p by p + 1: not a rotation, not relative
        return x * torch.arange(1.0, x.shape[-2] + 1)[:, None]

    monkeypatch.setattr(rope, "apply_rope_half", scaled)
    assert not rope.rope_claims()["either layout alone gives scores that depend on n - m only (so "
                                  "the bug is silent)"]
    monkeypatch.setattr(rope, "sinusoidal_encoding", lambda n, d, dtype: torch.ones(n, d, dtype=dtype))
    assert not rope.rope_claims()["position added: two positions 5 apart score differently at (0, 5) "
                                  "and (20, 25)"]
    monkeypatch.undo()
    monkeypatch.setattr(rope, "commuting_projections", rope.random_projections)
    assert not rope.rope_claims()["if W_Q^T W_K commutes with the rotations, adding positions is "
                                  "relative too"]


def test_bad_inputs_name_the_argument():
    W = torch.eye(4, dtype=torch.float64)
    x = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="mode must be one of"):
        rope.position_scores("rotate", W, W, x, 3)
    with pytest.raises(ValueError, match=r"W_K \(4, 3\) and x \(4,\) must be \(d_out, d_in\)"):
        rope.position_scores("add, then project", W, torch.zeros(4, 3, dtype=torch.float64), x, 3)
    with pytest.raises(ValueError, match=r"x \(3,\) must be"):
        rope.position_scores("add, then project", W, W, torch.ones(3, dtype=torch.float64), 3)
    odd = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"needs an even d_out .* \(3, 4\)"):
        rope.position_scores("project, then rotate", odd, odd, x, 3)
    assert rope.position_scores("add, then project", odd, odd, x, 3).shape == (3, 3)
    with pytest.raises(ValueError, match="n must be"):
        rope.position_scores("add, then project", W, W, x, 0)
    with pytest.raises(ValueError, match="d must be even"):
        rope.random_projections(5)
    with pytest.raises(ValueError, match=r"last dimension of x must be even.*\(2, 3\)"):
        rope.apply_rope_half(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"qkv_weight must be \(3 \* d_model, d_model\).*\(6, 3\)"):
        rope.head_projections(torch.zeros(6, 3), 2, 0)
    with pytest.raises(ValueError, match="head must be"):
        rope.head_projections(torch.zeros(12, 4), 2, 2)
    with pytest.raises(ValueError, match=r"W must be \(num_heads \* d_head, d_in\).*\(6, 2\)"):
        rope.permute_rows(torch.zeros(6, 2), 2)


def test_wavelength_collapse_position_and_slope():
    assert rope.wavelength(10000.0) == pytest.approx(2 * math.pi / 0.1)
    assert rope.wavelength(625.0, 8, pair=1) == pytest.approx(2 * math.pi / 0.2)
    with pytest.raises(ValueError, match="base must be a positive"):
        rope.wavelength(0.0)
    curve = torch.cat([torch.ones(20, 1), torch.full((12, 1), 0.3)]).double()
    assert rope.collapse_position(curve, window=4) == 19  # 18..21: 0.65, 19..22: 0.475 < 0.5
    assert rope.collapse_position(curve, threshold=0.9, window=4) == 17  # 17..20: 0.825
    assert rope.collapse_position(torch.ones(10, 1).double()) == 10
    second_pair = {b: [3 * b ** 0.25, 3.1 * b ** 0.25] for b in (625.0, 10000.0, 160000.0)}
    assert rope.collapse_slope(second_pair) == pytest.approx(0.25)
    assert rope.collapse_slope({b: [40, 41] for b in (625.0, 10000.0)}) == pytest.approx(0.0)


def test_rope_claims_split_into_motivation_and_layouts():
    every = rope.rope_claims()
    parts = {**rope.rope_claims(part="motivation"), **rope.rope_claims(part="layouts")}
    assert parts == every and len(rope.rope_claims(part="motivation")) == 5
    with pytest.raises(ValueError, match="part"):
        rope.rope_claims(part="nope")
