"""Checkers for notebook 04 (multi-head attention): the multi-head forward from split to merge,
and grouped-query attention (h query heads sharing g key/value heads)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..multihead import MultiHeadAttention
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_multi_head_forward", "check_grouped_query_attention"]


# --- exercise 1: the multi-head forward, from split to merge ---------------------------------


def _forward_cases() -> list[dict]:
    g = seeded(41)
    rb, rn, rh, rd = (int(i) for i in torch.randint(1, 6, (4,), generator=g))     # random shape
    cases = []
    for b, n, d_model, h, dtype in [(2, 5, 12, 3, torch.float32), (1, 4, 8, 2, torch.float32),
                                    (2, 6, 8, 1, torch.float32), (3, 1, 6, 3, torch.float32),
                                    (2, 7, 16, 4, torch.float64), (rb, rn, rh * rd, rh, torch.float32)]:
        case = {"x": torch.randn(b, n, d_model, generator=g, dtype=dtype)}
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            case[name] = torch.randn(d_model, d_model, generator=g, dtype=dtype) / math.sqrt(d_model)
        case["num_heads"] = h
        cases.append(case)
    return cases


def _module_forward(x, w_q, w_k, w_v, w_o, num_heads):
    """The course's ``MultiHeadAttention`` (bias=False) holding these weights: ``nn.Linear``
    stores the transpose, ``x @ W == x @ weight.T``."""
    with torch.random.fork_rng(devices=[]):    # building the module must not move the global seed
        mha = MultiHeadAttention(x.shape[-1], num_heads, bias=False).to(x.dtype)
    with torch.no_grad():
        for proj, w in ((mha.q_proj, w_q), (mha.k_proj, w_k), (mha.v_proj, w_v), (mha.out_proj, w_o)):
            proj.weight.copy_(w.T)
        return mha(x, x, x)[0]


def _wrong_forward(*, split="right", merge="right", scale="d_head", dim=-1, transpose_w=False,
                   use_w_o=True) -> Callable:
    """A multi-head forward with one known mistake, for the checker's hints."""

    def forward(x, w_q, w_k, w_v, w_o, h):
        b, n, d = x.shape
        if transpose_w:
            w_q, w_k, w_v, w_o = w_q.T, w_k.T, w_v.T, w_o.T

        def split_(t):
            if split == "no transpose":
                return t.reshape(b, h, n, d // h)
            if split == "interleaved":
                return t.reshape(b, n, d // h, h).permute(0, 3, 1, 2)
            return t.reshape(b, n, h, d // h).transpose(1, 2)

        q, k, v = split_(x @ w_q), split_(x @ w_k), split_(x @ w_v)
        c = {"d_head": d // h, "d_model": d, "none": 1}[scale]
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c), dim=dim)
        heads = a @ v                                                     # (b, h, n, d_head)
        if merge == "no transpose":
            concat = heads.reshape(b, n, d)
        else:
            concat = heads.transpose(1, 2).reshape(b, n, d)
        return concat @ w_o if use_w_o else concat

    return forward


@exercise("multi_head.forward", "multi-head attention from split to merge", hints=(
    "Project once with the big matrices, cut the last axis into h slices of d_head features (head "
    "i gets features i*d_head .. (i+1)*d_head - 1), run scaled dot-product attention in every head "
    "at once, glue the heads back side by side, and mix them with W_O.",
    "Q = x W_Q -> (b, n, h, d_head) -> (b, h, n, d_head), the same for K and V; "
    "heads = softmax(Q K^T / sqrt(d_head)) V; concat = heads -> (b, n, h, d_head) -> "
    "(b, n, d_model); output = concat W_O.",
    "def split(t): return t.reshape(b, n, h, d // h).transpose(1, 2)\n"
    "q, k, v = split(x @ W_Q), split(x @ W_K), split(x @ W_V)\n"
    "heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1) @ v\n"
    "return heads.transpose(1, 2).reshape(b, n, d) @ W_O"))
def check_multi_head_forward(multi_head_forward: Callable) -> CheckResult:
    """Exercise: ``multi_head_forward(x (b, n, d_model), W_Q, W_K, W_V, W_O (d_model, d_model),
    num_heads) -> (b, n, d_model)``, multi-head self-attention without biases or mask; equal to
    ``MultiHeadAttention(d_model, num_heads, bias=False)`` holding the same weights."""
    return check_function(
        multi_head_forward, _module_forward, _forward_cases(), what="multi_head_forward",
        output_names=("the output",), atol=1e-5, rtol=1e-4,
        mistakes=[
            Mistake(_wrong_forward(split="no transpose"),
                    "the split scrambles the features: reshaping (b, n, d_model) straight to "
                    "(b, h, n, d_head) mixes positions into heads. Reshape to (b, n, h, d_head) "
                    "first, then swap the n and h axes (transpose(1, 2))."),
            Mistake(_wrong_forward(split="interleaved"),
                    "head i must get the consecutive features i*d_head .. (i+1)*d_head - 1, not "
                    "every h-th feature: reshape to (b, n, h, d_head), not (b, n, d_head, h)."),
            Mistake(_wrong_forward(merge="no transpose"),
                    "the merge scrambles the heads: move the head axis next to d_head first "
                    "(heads.transpose(1, 2) gives (b, n, h, d_head)), then reshape to "
                    "(b, n, d_model)."),
            Mistake(_wrong_forward(scale="d_model"),
                    "each head scales by 1/sqrt(d_head), its own query size, not 1/sqrt(d_model)."),
            Mistake(_wrong_forward(scale="none"),
                    "the scores are not scaled: divide Q K^T by sqrt(d_head) in every head."),
            Mistake(_wrong_forward(dim=-2),
                    "the softmax runs over the wrong axis: each query's weights over the keys "
                    "(the last axis) must sum to 1."),
            Mistake(_wrong_forward(transpose_w=True),
                    "the matrices act from the right: Q = x @ W_Q with W_Q of shape "
                    "(d_model, d_model), not x @ W_Q.T (nn.Linear's weight layout)."),
            Mistake(_wrong_forward(use_w_o=False),
                    "the concatenated heads still have to be mixed by the output projection: "
                    "multiply by W_O."),
        ],
    )


# --- exercise 2: grouped-query attention -----------------------------------------------------


def _gqa_cases() -> list[dict]:
    g = seeded(42)
    rb, rg, group, rn, rd = (int(i) for i in torch.randint(1, 5, (5,), generator=g))  # random shape
    cases = []
    for b, h, kv, n, d, dtype in [(2, 4, 2, 5, 3, torch.float32), (1, 6, 3, 4, 2, torch.float32),
                                  (2, 8, 2, 4, 4, torch.float32), (2, 4, 1, 3, 4, torch.float32),
                                  (1, 3, 3, 4, 2, torch.float32), (2, 8, 2, 1, 4, torch.float32),
                                  (1, 6, 2, 5, 8, torch.float64),
                                  (rb, rg * group, rg, rn, rd, torch.float32)]:
        cases.append({"q": torch.randn(b, h, n, d, generator=g, dtype=dtype),
                      "k": torch.randn(b, kv, n, d, generator=g, dtype=dtype),
                      "v": torch.randn(b, kv, n, d, generator=g, dtype=dtype)})
    return cases


def _gqa(q, k, v, *, group_of=None, scale=None, dim=-1):
    """Query head i reads key/value head ``group_of(i, h, g)`` (right: ``i // (h/g)``)."""
    h, g = q.shape[1], k.shape[1]
    group_of = group_of or (lambda i, h, g: i // (h // g))
    index = torch.tensor([group_of(i, h, g) for i in range(h)])
    k, v = k[:, index], v[:, index]                                  # (b, h, n, d_head)
    if dim == -1:
        return scaled_dot_product_attention(q, k, v, scale=scale)[0]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    return torch.softmax(s, dim=dim) @ v


@exercise("multi_head.grouped_query", "grouped-query attention", hints=(
    "There are h query heads but only g key/value heads. Consecutive query heads form g groups of "
    "h/g, and every head of a group reads the same key/value head. Then it is ordinary scaled "
    "dot-product attention per head.",
    "query head i uses key/value head i // (h/g); output_i = softmax(q_i k_{i//(h/g)}^T / "
    "sqrt(d_head)) v_{i//(h/g)}.",
    "k = k.repeat_interleave(h // g, dim=1)   # (b, h, n, d_head); the same for v\n"
    "return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_head), dim=-1) @ v"))
def check_grouped_query_attention(grouped_query_attention: Callable) -> CheckResult:
    """Exercise: ``grouped_query_attention(q (b, h, n, d_head), k (b, g, n, d_head), v (b, g, n,
    d_head)) -> (b, h, n, d_head)``; query head ``i`` attends with key/value head ``i // (h/g)``,
    as ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` does."""
    return check_function(
        grouped_query_attention, _gqa, _gqa_cases(), what="grouped_query_attention",
        output_names=("the output",), atol=1e-5, rtol=1e-4,
        mistakes=[
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: i % g),
                    "query head i must use key/value head i // (h/g): consecutive query heads "
                    "share one. k.repeat(1, h // g, 1, 1) cycles through the key/value heads "
                    "instead; use k.repeat_interleave(h // g, dim=1)."),
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: min(i // g, g - 1)),
                    "a group holds h/g query heads, so head i uses key/value head i // (h/g), "
                    "not i // g."),
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: 0),
                    "every query head read the first key/value head; with g key/value heads "
                    "there are g groups (g = 1 is multi-query attention)."),
            Mistake(lambda q, k, v: _gqa(q, k, v, scale=1.0),
                    "the scores are not scaled: divide by sqrt(d_head)."),
            Mistake(lambda q, k, v: _gqa(q, k, v, scale=1 / math.sqrt(q.shape[1] * q.shape[-1])),
                    "each head scales by 1/sqrt(d_head), its own query size, not by "
                    "1/sqrt(h * d_head)."),
            Mistake(lambda q, k, v: _gqa(q, k, v, dim=-2),
                    "the softmax runs over the wrong axis: each query's weights over the keys "
                    "(the last axis) must sum to 1."),
        ],
    )
