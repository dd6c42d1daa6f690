"""MultiHeadAttention against torch.nn.MultiheadAttention, split/merge, parameter counts, notebook
04's widget and checkers."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from attn_helpers.exercises.multihead import (
    check_merge_heads,
    check_parameter_count,
    check_split_heads,
)
from attn_helpers.masks import causal_mask, key_padding_to_attention_mask, padding_mask
from attn_helpers.multihead import (
    MultiHeadAttention,
    merge_heads,
    parameter_count,
    split_heads,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from attn_helpers.widgets.multihead import (
    ALL_HEADS,
    MultiHeadView,
    multihead_frame,
    multihead_widget,
)

# --- equality with torch.nn.MultiheadAttention ---------------------------------------------


def offset_causal(n_q: int, n_k: int) -> torch.Tensor:
    """``(n_q, n_k)`` causal-style mask, True = may attend; every row keeps key 0."""
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    return j <= torch.clamp(i + (n_k - n_q), min=0)


def compare_with_torch(*, b, h, d_head, n_q, n_k, kdim, vdim, batch_first, bias, use_mask,
                       use_padding, seed, dtype=torch.float32, atol=1e-5):
    d_model = h * d_head
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    reference = torch.nn.MultiheadAttention(d_model, h, bias=bias, kdim=kdim, vdim=vdim,
                                            batch_first=batch_first, dtype=dtype).eval()
    with torch.no_grad():  # non-zero biases, so a mix-up of biases would show
        for name, p in reference.named_parameters():
            if "bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=dtype))
    ours = MultiHeadAttention.from_torch(reference)
    query = torch.randn(b, n_q, d_model, generator=g, dtype=dtype)
    key = torch.randn(b, n_k, kdim or d_model, generator=g, dtype=dtype)
    value = torch.randn(b, n_k, vdim or d_model, generator=g, dtype=dtype)
    mask = offset_causal(n_q, n_k) if use_mask else None
    real = None
    if use_padding:
        lengths = torch.randint(1, n_k + 1, (b,), generator=g)
        real = padding_mask(lengths, n_k)
        padding = key_padding_to_attention_mask(real)
        mask = padding if mask is None else mask & padding
    out, weights = ours(query, key, value, mask)
    args = [query, key, value] if batch_first else [t.transpose(0, 1) for t in (query, key, value)]
    t_out, t_weights = reference(
        *args,
        attn_mask=None if not use_mask else to_torch_attn_mask(offset_causal(n_q, n_k)),
        key_padding_mask=None if real is None else to_torch_key_padding_mask(real),
        average_attn_weights=False, need_weights=True,
    )
    if not batch_first:
        t_out = t_out.transpose(0, 1)
    assert out.shape == (b, n_q, d_model) and weights.shape == (b, h, n_q, n_k)
    torch.testing.assert_close(out, t_out, atol=atol, rtol=1e-4)
    torch.testing.assert_close(weights, t_weights, atol=atol, rtol=1e-4)
    _, averaged = reference(*args, attn_mask=None if not use_mask else
                            to_torch_attn_mask(offset_causal(n_q, n_k)),
                            key_padding_mask=None if real is None else
                            to_torch_key_padding_mask(real))
    torch.testing.assert_close(weights.mean(1), averaged, atol=atol, rtol=1e-4)


GRID = list(itertools.product(
    [1, 4],            # batch
    [1, 3, 8],         # heads
    [(5, 5), (3, 7)],  # (n_q, n_k)
    [(None, None), (6, 10)],  # kdim, vdim
    [True, False],     # batch_first
))


@pytest.mark.parametrize("b, h, sizes, dims, batch_first", GRID)
def test_equals_torch_grid(b, h, sizes, dims, batch_first):
    n_q, n_k = sizes
    for use_mask, use_padding in [(False, False), (True, False), (False, True), (True, True)]:
        compare_with_torch(b=b, h=h, d_head=4, n_q=n_q, n_k=n_k, kdim=dims[0], vdim=dims[1],
                           batch_first=batch_first, bias=True, use_mask=use_mask,
                           use_padding=use_padding, seed=b * 100 + h)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 4), h=st.integers(1, 8), d_head=st.integers(1, 6), n_q=st.integers(1, 7),
    n_k=st.integers(1, 7), kdim=st.one_of(st.none(), st.integers(1, 9)),
    vdim=st.one_of(st.none(), st.integers(1, 9)), batch_first=st.booleans(), bias=st.booleans(),
    use_mask=st.booleans(), use_padding=st.booleans(), seed=st.integers(0, 10_000),
)
def test_equals_torch_random_configurations(b, h, d_head, n_q, n_k, kdim, vdim, batch_first, bias,
                                            use_mask, use_padding, seed):
    compare_with_torch(b=b, h=h, d_head=d_head, n_q=n_q, n_k=n_k, kdim=kdim, vdim=vdim,
                       batch_first=batch_first, bias=bias, use_mask=use_mask,
                       use_padding=use_padding, seed=seed)


def test_equals_torch_in_float64_to_high_precision():
    compare_with_torch(b=2, h=4, d_head=8, n_q=6, n_k=9, kdim=5, vdim=7, batch_first=False,
                       bias=True, use_mask=True, use_padding=True, seed=3, dtype=torch.float64,
                       atol=1e-12)


def test_per_head_mask_matches_torch_3d_attn_mask(gen):
    b, h, n = 2, 3, 5
    reference = torch.nn.MultiheadAttention(6, h, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(reference)
    x = torch.randn(b, n, 6, generator=gen)
    mask = torch.rand(b, h, n, n, generator=gen) > 0.4
    mask[..., 0] = True  # no empty row
    out, weights = ours(x, x, x, mask)
    t_out, t_weights = reference(x, x, x, attn_mask=to_torch_attn_mask(mask.reshape(b * h, n, n)),
                                 average_attn_weights=False)
    torch.testing.assert_close(out, t_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights, t_weights, atol=1e-5, rtol=1e-4)


def test_gradients_equal_torch(gen):
    reference = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
    ours = MultiHeadAttention.from_torch(reference)
    q = torch.randn(3, 4, 8, generator=gen, requires_grad=True)
    k = torch.randn(3, 6, 5, generator=gen, requires_grad=True)
    v = torch.randn(3, 6, 3, generator=gen, requires_grad=True)
    ours(q, k, v)[0].square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    reference(q, k, v)[0].square().sum().backward()
    for mine, theirs in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_from_torch_with_packed_and_separate_projections_keeps_dtype():
    packed = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64)
    assert packed._qkv_same_embed_dim
    ours = MultiHeadAttention.from_torch(packed)
    assert ours.q_proj.weight.dtype == torch.float64
    torch.testing.assert_close(ours.k_proj.weight, packed.in_proj_weight[8:16])
    no_bias = MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, bias=False))
    assert no_bias.q_proj.bias is None and no_bias.out_proj.bias is None


def test_fully_masked_row_gives_zeros_not_nan(gen):
    mha = MultiHeadAttention(8, 2, bias=False)
    x = torch.randn(1, 3, 8, generator=gen)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    out, weights = mha(x, x, x, mask)
    assert torch.isfinite(out).all()
    assert torch.all(weights[:, :, 1] == 0) and torch.allclose(out[0, 1], torch.zeros(8))


def test_head_mask_switches_off_exactly_one_head(gen):
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 4, 12, generator=gen)
    full, weights = mha(x, x, x)
    same, _ = mha(x, x, x, head_mask=torch.ones(3))
    torch.testing.assert_close(full, same)
    keep = torch.tensor([True, False, True])
    ablated, ablated_weights = mha(x, x, x, head_mask=keep)
    heads = merge_heads(weights @ split_heads(mha.v_proj(x), 3))
    heads[..., 4:8] = 0
    torch.testing.assert_close(ablated, mha.out_proj(heads))
    torch.testing.assert_close(ablated_weights, weights)  # the pattern itself is unchanged


# --- split, merge and parameter counts ------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 6), h=st.integers(1, 6), d_head=st.integers(1, 5))
def test_split_merge_are_inverse_and_split_takes_consecutive_features(b, n, h, d_head):
    x = torch.randn(b, n, h * d_head)
    heads = split_heads(x, h)
    assert heads.shape == (b, h, n, d_head)
    for i in range(h):
        assert torch.equal(heads[:, i], x[..., i * d_head:(i + 1) * d_head])
    assert torch.equal(merge_heads(heads), x)
    assert torch.equal(split_heads(merge_heads(heads), h), heads)


@pytest.mark.parametrize("d_model, h, kdim, vdim, bias", [
    (768, 12, None, None, True), (512, 8, None, None, False), (64, 4, 32, 16, True),
    (6, 3, 2, 5, False), (10, 1, None, 7, True),
])
def test_parameter_count_matches_torch_and_ours(d_model, h, kdim, vdim, bias):
    reference = torch.nn.MultiheadAttention(d_model, h, bias=bias, kdim=kdim, vdim=vdim)
    ours = MultiHeadAttention(d_model, h, bias=bias, kdim=kdim, vdim=vdim)
    expected = sum(p.numel() for p in reference.parameters())
    assert parameter_count(d_model, h, bias=bias, kdim=kdim, vdim=vdim) == expected
    assert sum(p.numel() for p in ours.parameters()) == expected


def test_bert_base_parameter_count():
    assert parameter_count(768, 12) == 2_362_368
    assert parameter_count(768, 1) == parameter_count(768, 768) == 2_362_368


# --- bad inputs -------------------------------------------------------------------------------


def test_d_model_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"d_model=10.*num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="divisible"):
        split_heads(torch.zeros(1, 2, 10), 3)
    with pytest.raises(ValueError, match="divisible"):
        parameter_count(10, 4)


@pytest.mark.parametrize("args, error, pattern", [
    ((0, 1), ValueError, "d_model"),
    ((8, 0), ValueError, "num_heads"),
    ((8.0, 2), TypeError, "d_model"),
])
def test_bad_constructor_arguments(args, error, pattern):
    with pytest.raises(error, match=pattern):
        MultiHeadAttention(*args)


def test_bad_forward_inputs_name_argument_and_shapes():
    mha = MultiHeadAttention(8, 2, kdim=4)
    q, k, v = torch.zeros(2, 3, 8), torch.zeros(2, 5, 4), torch.zeros(2, 5, 8)
    with pytest.raises(ValueError, match=r"query.*\(2, 3, 7\)"):
        mha(torch.zeros(2, 3, 7), k, v)
    with pytest.raises(ValueError, match=r"key.*\(2, 5, 8\)"):
        mha(q, torch.zeros(2, 5, 8), v)
    with pytest.raises(ValueError, match=r"key \(2, 5, 4\) and value \(2, 4, 8\)"):
        mha(q, k, torch.zeros(2, 4, 8))
    with pytest.raises(ValueError, match="batch size"):
        mha(torch.zeros(3, 3, 8), k, v)
    with pytest.raises(ValueError, match="batch first"):
        mha(torch.zeros(3, 8), k, v)
    with pytest.raises(TypeError, match="query"):
        mha(q.tolist(), k, v)
    with pytest.raises(TypeError, match="floating"):
        mha(q.long(), k, v)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\)"):
        mha(q, k, v, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean"):
        mha(q, k, v, torch.ones(3, 5))
    with pytest.raises(ValueError, match="head_mask"):
        mha(q, k, v, head_mask=torch.ones(3))


def test_bad_from_torch_and_mask_conversions():
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="boolean"):
        to_torch_attn_mask(torch.ones(2, 2))
    with pytest.raises(ValueError, match="key_padding"):
        to_torch_key_padding_mask(torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="4-D"):
        merge_heads(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="3-D"):
        split_heads(torch.zeros(2, 3), 1)


def test_mask_conversions_invert():
    mask = causal_mask(4)
    assert torch.equal(to_torch_attn_mask(mask), ~mask)
    real = padding_mask([2, 4], 4)
    assert torch.equal(to_torch_key_padding_mask(real), ~real)


# --- notebook 04's widget -------------------------------------------------------------------


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA")).astype(int)


@pytest.fixture
def example_weights(gen):
    weights = torch.softmax(torch.randn(3, 2, 4, 4, generator=gen, dtype=torch.float64), -1)
    labels = [[f"{c}{i}" for i in range(4)] for c in "ABC"]
    return weights, labels


def test_multihead_frame_is_pure_and_correct(example_weights):
    weights, labels = example_weights
    frame = multihead_frame(weights, labels, 1, 0)
    assert torch.equal(frame.weights, weights[1, 0]) and frame.head == 0
    grid = multihead_frame(weights, labels, 1, ALL_HEADS)
    assert grid.head is None and torch.allclose(grid.weights, weights[1].mean(0))
    entropy = -(weights[1] * weights[1].log()).sum(-1).mean(-1)
    torch.testing.assert_close(grid.head_entropy, entropy)
    assert grid.readouts["mean entropy per head (nats)"] == (
        f"head 0: {entropy[0].item():.4f}, head 1: {entropy[1].item():.4f}")
    strongest = labels[1][int(weights[1, 1, -1].argmax())]
    assert multihead_frame(weights, labels, 1, 1).readouts["last query's strongest key"] == (
        f"head 1: {strongest}")


@pytest.mark.parametrize("example, head, pattern", [
    (3, 0, "example"), (0, 2, "head"), (0, "some", "head"), (True, 0, "example"),
])
def test_multihead_frame_bad_inputs(example_weights, example, head, pattern):
    weights, labels = example_weights
    with pytest.raises(ValueError, match=pattern):
        multihead_frame(weights, labels, example, head)


def test_multihead_frame_bad_shapes(example_weights):
    weights, labels = example_weights
    with pytest.raises(ValueError, match="4-D"):
        multihead_frame(weights[0], labels, 0, 0)
    with pytest.raises(ValueError, match="labels"):
        multihead_frame(weights, labels[:2], 0, 0)
    with pytest.raises(ValueError, match="head_names"):
        multihead_frame(weights, labels, 0, 0, head_names=["a"])


def test_multihead_widget_switches_between_grid_and_single(example_weights):
    weights, labels = example_weights
    widget = multihead_widget(weights, labels, mask=causal_mask(4))
    assert widget.view.last_mode == "grid" and widget.error is None
    grid_png = decode(widget.image.value)
    figure = widget.view.grid.figure
    assert grid_png.shape[:2] == (round(figure.get_size_inches()[1] * figure.dpi),
                                  round(figure.get_size_inches()[0] * figure.dpi))
    widget.set(head=1)
    assert widget.view.last_mode == "single"
    single = decode(widget.image.value)
    assert single.shape != grid_png.shape
    widget.set(example=2)
    assert not np.array_equal(single, decode(widget.image.value))
    assert torch.equal(widget.frame.weights, weights[2, 1])
    widget.set(head=ALL_HEADS)
    assert widget.view.last_mode == "grid" and widget.renders == 4


def test_multihead_view_rejects_wrong_number_of_heads(example_weights):
    weights, labels = example_weights
    view = MultiHeadView(3)
    with pytest.raises(ValueError, match="3 heads"):
        view.update(multihead_frame(weights, labels, 0, 0))
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadView(0)


# --- notebook 04's checkers -----------------------------------------------------------------


def test_checkers_pass_the_references():
    assert check_split_heads(split_heads)
    assert check_merge_heads(merge_heads)
    assert check_parameter_count(
        lambda d, h, k, v, bias: parameter_count(d, h, kdim=k, vdim=v, bias=bias))


def test_checkers_explain_known_mistakes():
    verdict = check_split_heads(lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1))
    assert not verdict and "transpose" in verdict.message
    verdict = check_merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    assert not verdict and "Hint" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: 4 * d * d + 4 * d)
    assert not verdict and "kdim" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: d * (d + k + v) + (3 * d if bias else 0))
    assert not verdict and "W_O" in verdict.message
    verdict = check_parameter_count(lambda d, h, k, v, bias: "many")
    assert not verdict and "should return a number" in verdict.message
    assert not check_split_heads(3)
