"""Checkers for notebook 04 (multi-head attention): a trainable multi-head attention module, proved
equal to ``torch.nn.MultiheadAttention`` with the same weights, and grouped-query attention (h
query heads sharing g key/value heads)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_multi_head_module", "check_grouped_query_attention"]


# --- exercise 1: a trainable multi-head attention module -----------------------------------

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def _module_cases() -> list[dict]:
    """``x``, a bool ``mask`` (True = may attend) or None, the number of heads and the seed of the
    ``nn.MultiheadAttention`` whose weights are copied in."""
    g = seeded(41)
    cases = []
    for b, n, d_model, h, mask, dtype in [
            (2, 5, 12, 3, None, torch.float32), (1, 6, 16, 4, "causal", torch.float32),
            (2, 4, 8, 1, None, torch.float32), (3, 1, 12, 3, None, torch.float32),
            (2, 7, 16, 2, "random", torch.float64), (2, 6, 8, 2, "causal", torch.float32)]:
        if mask == "causal":
            mask = causal_mask(n)
        elif mask == "random":                       # every query keeps at least its own key
            mask = (torch.rand(n, n, generator=g) < 0.5) | torch.eye(n, dtype=torch.bool)
        cases.append({"x": torch.randn(b, n, d_model, generator=g, dtype=dtype), "mask": mask,
                      "num_heads": h, "seed": len(cases)})
    return cases


def _torch_module(d_model: int, num_heads: int, seed: int, dtype) -> nn.MultiheadAttention:
    """PyTorch's module with random weights and non-zero biases, built without moving the global
    seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = nn.MultiheadAttention(d_model, num_heads, batch_first=True).to(dtype).eval()
        with torch.no_grad():
            m.in_proj_bias.normal_(0, 0.3)
            m.out_proj.bias.normal_(0, 0.3)
    return m


def _weights(m: nn.MultiheadAttention) -> dict:
    """``{name: (weight (d_out, d_in), bias)}`` of the four projections, as ``nn.Linear`` stores them."""
    w, b = m.in_proj_weight.detach().chunk(3), m.in_proj_bias.detach().chunk(3)
    return {"q_proj": (w[0], b[0]), "k_proj": (w[1], b[1]), "v_proj": (w[2], b[2]),
            "out_proj": (m.out_proj.weight.detach(), m.out_proj.bias.detach())}


def _copy_weights(module: nn.Module, m: nn.MultiheadAttention) -> None:
    """Copy ``m``'s weights into the learner's ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``."""
    d = m.embed_dim
    for name, (weight, bias) in _weights(m).items():
        layer = getattr(module, name, None)
        if not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != (d, d) or layer.bias is None:
            raise TypeError(f"the module needs {name} = nn.Linear(d_model, d_model) with a bias "
                            f"(d_model = {d}); got {layer!r}")
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)


def _reference(x, mask, num_heads, seed):
    m = _torch_module(x.shape[-1], num_heads, seed, x.dtype)
    with torch.no_grad():
        return m(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=False)[0]


def _learner(module_class) -> Callable:
    """Build the learner's module for a case, with the case's weights copied in, and run it."""

    def run(x, mask, num_heads, seed):
        with torch.random.fork_rng(devices=[]):     # building it must not move the global seed
            module = module_class(x.shape[-1], num_heads)
        if not isinstance(module, nn.Module):
            raise TypeError(f"{module_class.__name__}(d_model, num_heads) should be an nn.Module, "
                            f"got {type(module).__name__}")
        module = module.to(x.dtype)
        _copy_weights(module, _torch_module(x.shape[-1], num_heads, seed, x.dtype))
        with torch.no_grad():
            return module(x) if mask is None else module(x, mask)

    return run


def _wrong(*, split="right", merge="right", scale="d_head", dim=-1, use_w_o=True,
           invert_mask=None) -> Callable:
    """Multi-head self-attention with one known mistake, on a case's copied weights."""

    def forward(x, mask, h, seed):
        p = _weights(_torch_module(x.shape[-1], h, seed, x.dtype))
        b, n, d = x.shape

        def linear(t, name):
            return t @ p[name][0].T + p[name][1]

        def split_(t):
            if split == "no transpose":
                return t.reshape(b, h, n, d // h)
            if split == "interleaved":
                return t.reshape(b, n, d // h, h).permute(0, 3, 1, 2)
            return t.reshape(b, n, h, d // h).transpose(1, 2)

        q, k, v = (split_(linear(x, name)) for name in ("q_proj", "k_proj", "v_proj"))
        c = {"d_head": d // h, "d_model": d, "none": 1}[scale]
        s = q @ k.transpose(-2, -1) / math.sqrt(c)
        if mask is not None:
            allowed = ~mask if invert_mask else mask
            s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s, dim=dim)
        if invert_mask == "zeros":                  # a fully masked row gives zeros, not NaN
            a = a.nan_to_num(0.0)
        heads = a @ v                                                     # (b, h, n, d_head)
        concat = (heads.reshape(b, n, d) if merge == "no transpose"
                  else heads.transpose(1, 2).reshape(b, n, d))
        return linear(concat, "out_proj") if use_w_o else concat

    return forward


def _trainable(module_class, case: dict) -> str | None:
    """None if a loss on the module's output sends a gradient to every projection's weight."""
    with torch.random.fork_rng(devices=[]):
        module = module_class(case["x"].shape[-1], case["num_heads"]).to(case["x"].dtype)
    out = module(case["x"]) if case["mask"] is None else module(case["x"], case["mask"])
    if not out.requires_grad:
        return "its output does not depend on any trainable parameter (was it computed with .data, " \
               "detach() or under torch.no_grad()?)"
    out.square().sum().backward()
    missing = [name for name in PROJECTIONS if getattr(module, name).weight.grad is None
               or not getattr(module, name).weight.grad.abs().sum() > 0]
    return f"no gradient reaches {', '.join(missing)}" if missing else None


@exercise("multi_head.module", "a trainable multi-head attention module", hints=(
    "In __init__ (after super().__init__()), keep num_heads and make four nn.Linear(d_model, "
    "d_model) layers: q_proj, k_proj, v_proj and out_proj. In forward, project x three times, cut "
    "the last axis of each into h heads of d_head = d_model // h consecutive features, attend in "
    "every head at once, glue the heads back side by side and apply out_proj.",
    "Q = q_proj(x): (b, n, d_model) -> (b, n, h, d_head) -> transpose(1, 2) -> (b, h, n, d_head); "
    "the same for K and V. heads, _ = ah.scaled_dot_product_attention(Q, K, V, mask) (scale "
    "1/sqrt(d_head), mask True = may attend, broadcast over the heads). concat = heads -> "
    "(b, n, h, d_head) -> (b, n, d_model); output = out_proj(concat).",
    "b, n, d_model = x.shape\nh = self.num_heads\n"
    "def split(t): return t.reshape(b, n, h, d_model // h).transpose(1, 2)\n"
    "q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))\n"
    "heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)\n"
    "return self.out_proj(heads.transpose(1, 2).reshape(b, n, d_model))"))
def check_multi_head_module(module_class) -> CheckResult:
    """Exercise: a class ``module_class(d_model, num_heads)``, an ``nn.Module`` with ``nn.Linear``
    layers ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (d_model -> d_model, with bias) and
    ``forward(x (b, n, d_model), mask=None) -> (b, n, d_model)``, multi-head self-attention with
    an optional bool mask ``(n, n)`` (True = may attend). With the weights of a
    ``torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True)`` copied in, it must give
    that module's output; then a loss on its output must reach all four projections."""
    name = getattr(module_class, "__name__", "your module")
    if not isinstance(module_class, type):
        return CheckResult(False, f"Not yet: pass the class itself (e.g. MultiHeadSelfAttention), "
                                  f"not {type(module_class).__name__}.")
    cases = _module_cases()
    mask_hint = ("the mask is inverted: in this course True means the query MAY attend to the "
                 "key (PyTorch's attn_mask means the opposite). Keep the scores where mask is True "
                 "and set the others to -inf (or pass mask to ah.scaled_dot_product_attention).")
    result = check_function(
        _learner(module_class), _reference, cases, what=name, output_names=("the output",),
        atol=1e-5, rtol=1e-4,
        mistakes=[
            Mistake(_wrong(split="no transpose"),
                    "the split scrambles the features: reshaping (b, n, d_model) straight to "
                    "(b, h, n, d_head) mixes positions into heads. Reshape to (b, n, h, d_head) "
                    "first, then swap the n and h axes (transpose(1, 2))."),
            Mistake(_wrong(split="interleaved"),
                    "the heads are split on the wrong axis: head i must get the consecutive "
                    "features i*d_head .. (i+1)*d_head - 1, not every h-th feature: reshape to "
                    "(b, n, h, d_head), not (b, n, d_head, h)."),
            Mistake(_wrong(merge="no transpose"),
                    "the heads are merged in the wrong order: move the head axis next to d_head "
                    "first (heads.transpose(1, 2) gives (b, n, h, d_head)), then reshape to "
                    "(b, n, d_model)."),
            Mistake(_wrong(scale="none"),
                    "the 1/sqrt(d_head) scale is missing: divide Q K^T by sqrt(d_head) in every "
                    "head."),
            Mistake(_wrong(scale="d_model"),
                    "each head scales by 1/sqrt(d_head), its own query size, not 1/sqrt(d_model)."),
            Mistake(_wrong(use_w_o=False),
                    "W_O is missing: the concatenated heads still go through out_proj."),
            Mistake(_wrong(invert_mask="nan"), mask_hint),
            Mistake(_wrong(invert_mask="zeros"), mask_hint),
            Mistake(_wrong(dim=-2),
                    "the softmax runs over the wrong axis: each query's weights over the keys "
                    "(the last axis) must sum to 1."),
        ],
    )
    if not result:
        return result
    problem = _trainable(module_class, cases[1])
    if problem:
        return CheckResult(False, f"Not yet: {name} gives the right output, but it is not "
                                  f"trainable: {problem}.")
    return CheckResult(True, f"Passed: {name} equals nn.MultiheadAttention(batch_first=True) with "
                             f"the same weights on all {len(cases)} cases (masks, one head, one "
                             "token and float64 included), and gradients reach all four "
                             "projections.")


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
