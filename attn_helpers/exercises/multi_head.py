"""Checkers for notebook 04 (multi-head attention): a trainable multi-head attention module with
``nn.MultiheadAttention``'s fused ``in_proj``, all heads at once (the head split and merge written
by the learner), proved equal to that module with the same weights, and grouped-query attention
(h query heads sharing g key/value heads, which are never copied to h)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

import attn_helpers

from .. import multihead
from ..attention import scaled_dot_product_attention
from ..multihead import MultiHeadAttention
from .core import CheckResult, Mistake, _namespaces, blocking, check_function
from .multi_head_cases import (
    _AllHeadsAtOnce,
    _copy_weights,
    _gqa_cases,
    _module_cases,
    _NoCopiedKV,
    _torch_module,
    _weights,
)
from .workflow import exercise

__all__ = ["check_multi_head_module", "check_grouped_query_attention"]


# --- exercise 1: a trainable multi-head attention module, nn.MultiheadAttention's fused layout --

PROJECTIONS = ("in_proj", "out_proj")


def _reference(x, mask, num_heads, seed):
    m = _torch_module(x.shape[-1], num_heads, seed, x.dtype)
    if mask is not None and mask.dim() == 3:         # PyTorch wants (b * h, n, n)
        mask = mask.repeat_interleave(num_heads, dim=0)
    with torch.no_grad():
        return m(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=False)[0]


# While the learner's module runs: the modules and functions that would do it for them, and the
# package's head split and merge (the skill this exercise asks for).
_MODULE_FORBID = [
    (MultiHeadAttention, "forward"), (nn.MultiheadAttention, "forward"),
    (nn.functional, "multi_head_attention_forward"),
    (multihead, "split_heads"), (multihead, "merge_heads"),
    (attn_helpers, "split_heads"), (attn_helpers, "merge_heads"),
]
_MODULE_INSTEAD = ("Write the steps yourself: the head split and merge included, all heads in one "
                   "attention call")


def _learner(module_class) -> Callable:
    """Build the learner's module for a case, with the case's weights copied in, and run it
    (the package's and PyTorch's multi-head modules blocked)."""

    def run(x, mask, num_heads, seed):
        with torch.random.fork_rng(devices=[]):     # building it must not move the global seed
            module = module_class(x.shape[-1], num_heads)
        if not isinstance(module, nn.Module):
            raise TypeError(f"{module_class.__name__}(d_model, num_heads) should be an nn.Module, "
                            f"got {type(module).__name__}")
        module = module.to(x.dtype)
        _copy_weights(module, _torch_module(x.shape[-1], num_heads, seed, x.dtype))
        with torch.no_grad(), blocking(_MODULE_FORBID, namespaces=_namespaces(module_class)):
            return module(x) if mask is None else module(x, mask)

    return run


def _wrong(*, split="right", merge="right", scale="d_head", dim=-1, use_w_o=True,
           invert_mask=None, fused="right", mask_heads=True, ignore_mask=False) -> Callable:
    """Multi-head self-attention with one known mistake, on a case's copied weights."""

    def forward(x, mask, h, seed):
        p = _weights(_torch_module(x.shape[-1], h, seed, x.dtype))
        b, n, d = x.shape
        qkv = x @ p["in_proj"][0].T + p["in_proj"][1]                     # (b, n, 3 d)
        if fused == "per head":                      # [q k v] of head 0, then of head 1, ...
            q, k, v = qkv.reshape(b, n, h, 3 * (d // h)).chunk(3, dim=-1)
            q, k, v = (t.reshape(b, n, d) for t in (q, k, v))
        elif fused == "k q v":
            k, q, v = qkv.chunk(3, dim=-1)
        else:
            q, k, v = qkv.chunk(3, dim=-1)

        def split_(t):
            if split == "no transpose":              # (b, n, d) read as (b, h, n, d_head)
                return t.reshape(b, h, n, d // h)
            if split == "interleaved":               # from the wrong end: every h-th feature
                return t.reshape(b, n, d // h, h).permute(0, 3, 1, 2)
            return t.reshape(b, n, h, d // h).transpose(1, 2)

        q, k, v = split_(q), split_(k), split_(v)
        c = {"d_head": d // h, "d_model": d, "none": 1}[scale]
        s = q @ k.transpose(-2, -1) / math.sqrt(c)
        if mask is not None and not ignore_mask:
            allowed = ~mask if invert_mask else mask
            if allowed.dim() == 3:
                if not mask_heads:                   # (b, n, n) against (b, h, n, n)
                    if b != h:                       # PyTorch raises here: no match
                        return torch.full((0,), float("nan"), dtype=x.dtype)
                    allowed = allowed[None]
                else:
                    allowed = allowed[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s, dim=dim)
        if invert_mask == "zeros":                  # a fully masked row gives zeros, not NaN
            a = a.nan_to_num(0.0)
        heads = a @ v                                                     # (b, h, n, d_head)
        if merge == "no transpose":
            concat = heads.reshape(b, n, d)
        elif merge == "interleaved":                 # head i to every h-th column
            concat = heads.permute(0, 2, 3, 1).reshape(b, n, d)
        else:
            concat = heads.transpose(1, 2).reshape(b, n, d)
        return concat @ p["out_proj"][0].T + p["out_proj"][1] if use_w_o else concat

    return forward


def _trainable(module_class, case: dict) -> str | None:
    """None if a loss on the module's output sends a gradient to every projection's weight."""
    with torch.random.fork_rng(devices=[]):
        module = module_class(case["x"].shape[-1], case["num_heads"]).to(case["x"].dtype)
    with blocking(_MODULE_FORBID, namespaces=_namespaces(module_class)):
        out = module(case["x"]) if case["mask"] is None else module(case["x"], case["mask"])
    if not out.requires_grad:
        return "its output does not depend on any trainable parameter (was it computed with .data, " \
               "detach() or under torch.no_grad()?)"
    out.square().sum().backward()
    missing = [name for name in PROJECTIONS if getattr(module, name).weight.grad is None
               or not getattr(module, name).weight.grad.abs().sum() > 0]
    return f"no gradient reaches {', '.join(missing)}" if missing else None


@exercise("multi_head.module", "all heads at once: a multi-head module with a fused in_proj", hints=(
    "In __init__ (after super().__init__()), keep num_heads and make two layers: in_proj = "
    "nn.Linear(d_model, 3 * d_model), whose output is [Q | K | V] side by side (the rows of its "
    "weight are W_Q, W_K, W_V stacked, as in nn.MultiheadAttention.in_proj_weight), and out_proj "
    "= nn.Linear(d_model, d_model). In forward: project once and cut the result into Q, K, V. "
    "Then no loop over heads: head i is a block of d_head consecutive features (section 1), so "
    "the h heads are a reshape of the feature axis, and one attention call can serve them all.",
    "Cut [Q | K | V] with chunk(3, dim=-1). Head i owns the consecutive features "
    "i*d_head .. (i+1)*d_head - 1: splitting the last axis, d_model, in two, which comes first, "
    "h or d_head? ah.scaled_dot_product_attention treats every axis before the last two as a "
    "batch: where must the head axis then stand, and what does a (b, n, n) mask lack against the "
    "scores (b, h, n, n)? The merge undoes the split: in which order, so that head i fills the "
    "columns torch.cat gave it in section 1?",
    "b, n, d_model = x.shape\nh = self.num_heads\n"
    "q, k, v = (... for t in self.in_proj(x).chunk(3, dim=-1))   # split: each (b, h, n, d_head)\n"
    "if mask is not None and mask.dim() == 3: mask = mask[:, None]   # (b, 1, n, n): every head\n"
    "heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)  # (b, h, n, d_head), one call\n"
    "return self.out_proj(...)                  # merge first: (b, n, d_model), head i's columns"))
def check_multi_head_module(module_class) -> CheckResult:
    """Exercise: a class ``module_class(d_model, num_heads)``, an ``nn.Module`` with its own
    ``nn.Linear`` layers ``in_proj`` (d_model -> 3 d_model, W_Q, W_K, W_V fused as in
    ``nn.MultiheadAttention.in_proj_weight``) and ``out_proj`` (d_model -> d_model), both with a
    bias, and ``forward(x (b, n, d_model), mask=None) -> (b, n, d_model)``, multi-head
    self-attention with an optional bool mask ``(n, n)`` or ``(b, n, n)`` (True = may attend).
    With the weights of a ``torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True)``
    copied in, it must give that module's output, all heads in one attention call (a loop over
    heads is refused, see :class:`._AllHeadsAtOnce`; the package's ``MultiHeadAttention``,
    ``split_heads`` and ``merge_heads`` and PyTorch's module are blocked while it runs); then a
    loss on its output must reach both projections."""
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
        atol=1e-5, rtol=1e-4, instead=_MODULE_INSTEAD, guard=_AllHeadsAtOnce,
        mistakes=[
            Mistake(_wrong(fused="per head"),
                    "in_proj's output is [Q | K | V]: its first d_model features are all of Q "
                    "(every head), then K, then V, as nn.MultiheadAttention stacks W_Q, W_K, W_V. "
                    "Cut it with chunk(3, dim=-1) first, then split each into heads; it is not "
                    "[q k v] per head."),
            Mistake(_wrong(fused="k q v"),
                    "Q and K are swapped: in_proj's output is Q, K, V in that order."),
            Mistake(_wrong(split="no transpose"),
                    "the split scrambles the features: reshaping (b, n, d_model) straight to "
                    "(b, h, n, d_head) mixes positions into heads. Reshape to (b, n, h, d_head) "
                    "first, then swap the n and h axes (transpose(1, 2))."),
            Mistake(_wrong(split="no transpose", merge="no transpose"),
                    "the heads were split by reshaping (b, n, d_model) straight to (b, h, n, "
                    "d_head), which mixes positions into heads (and merged back the same way). "
                    "Reshape to (b, n, h, d_head) first, then transpose(1, 2); to merge, "
                    "transpose(1, 2) back before the reshape to (b, n, d_model)."),
            Mistake(_wrong(split="interleaved"),
                    "the heads are split on the wrong axis, from the wrong end: head i must get "
                    "the consecutive features i*d_head .. (i+1)*d_head - 1, not every h-th "
                    "feature: reshape to (b, n, h, d_head), not (b, n, d_head, h)."),
            Mistake(_wrong(split="interleaved", merge="interleaved"),
                    "the heads are split and merged from the wrong end: (b, n, d_head, h) gives "
                    "head i every h-th feature, but head i owns the consecutive features "
                    "i*d_head .. (i+1)*d_head - 1 of Q, K and V, and fills those columns before "
                    "W_O. Reshape to (b, n, h, d_head), head axis first; merge back the same way."),
            Mistake(_wrong(merge="no transpose"),
                    "the heads are merged in the wrong order: move the head axis next to d_head "
                    "first (heads.transpose(1, 2) gives (b, n, h, d_head)), then reshape to "
                    "(b, n, d_model)."),
            Mistake(_wrong(merge="interleaved"),
                    "the heads are merged on the wrong axis, from the wrong end: head i's output "
                    "goes to the consecutive columns i*d_head .. (i+1)*d_head - 1 (as torch.cat "
                    "put the heads side by side), not to every h-th column: merge through "
                    "(b, n, h, d_head), not (b, n, d_head, h)."),
            Mistake(_wrong(scale="none"),
                    "the 1/sqrt(d_head) scale is missing: divide Q K^T by sqrt(d_head) in every "
                    "head."),
            Mistake(_wrong(scale="d_model"),
                    "each head scales by 1/sqrt(d_head), its own query size, not 1/sqrt(d_model)."),
            Mistake(_wrong(use_w_o=False),
                    "W_O is missing: the concatenated heads still go through out_proj."),
            Mistake(_wrong(invert_mask="nan"), mask_hint),
            Mistake(_wrong(invert_mask="zeros"), mask_hint),
            Mistake(_wrong(ignore_mask=True),
                    "the mask was ignored: every query read every key. Set the scores to -inf "
                    "where mask is False (or pass mask to ah.scaled_dot_product_attention)."),
            Mistake(_wrong(mask_heads=False),
                    "a (b, n, n) mask was lined up with the heads axis: the scores are (b, h, n, "
                    "n), so give the mask a head axis, mask[:, None] -> (b, 1, n, n)."),
            Mistake(_wrong(dim=-2),
                    "the softmax runs over the wrong axis: each query's weights over the keys "
                    "(the last axis) must sum to 1."),
        ],
    )
    if not result:
        if "must match the size" in result.message:
            return CheckResult(False, result.message + "\nHint: a (b, n, n) mask needs a head "
                               "axis to meet the (b, h, n, n) scores: mask[:, None].")
        if "view size is not compatible" in result.message:
            return CheckResult(False, result.message + "\nHint: after a transpose the heads are "
                               "no longer contiguous in memory, so .view cannot merge them: use "
                               ".reshape (or .contiguous().view).")
        return result
    problem = _trainable(module_class, cases[1])
    if problem:
        return CheckResult(False, f"Not yet: {name} gives the right output, but it is not "
                                  f"trainable: {problem}.")
    return CheckResult(True, f"Passed: {name} equals nn.MultiheadAttention(batch_first=True) with "
                             f"the same weights on all {len(cases)} cases ((n, n) and (b, n, n) "
                             "masks, one head, one token and float64 included), and gradients "
                             "reach both projections.")


# --- exercise 2: grouped-query attention -----------------------------------------------------


def _gqa(q, k, v, *, group_of=None, scale=None, dim=-1):
    """Query head i reads key/value head ``group_of(i, h, g)`` (right: ``i // (h/g)``). The
    checker's reference runs outside the guard: it may index (copy) the heads."""
    h, g = q.shape[1], k.shape[1]
    group_of = group_of or (lambda i, h, g: i // (h // g))
    index = torch.tensor([group_of(i, h, g) for i in range(h)])
    k, v = k[:, index], v[:, index]                                  # (b, h, n_k, d_head)
    if dim == -1:
        return scaled_dot_product_attention(q, k, v, scale=scale)[0]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    return torch.softmax(s, dim=dim) @ v


def _rows_mixed(q, k, v):
    """A group's rows taken after moving n_q in front of the heads: query head i at position p
    reads key/value head ``(p h + i) // (h/g n_q)``."""
    b, h, n_q, d = q.shape
    rows = q.transpose(1, 2).reshape(b, k.shape[1], -1, d)
    return scaled_dot_product_attention(rows, k, v)[0].reshape(b, n_q, h, d).transpose(1, 2)


# Right with their default arguments: refused while the learner's function runs.
REFUSED_WHILE_CHECKING = ("_gqa", "_wrong")


@exercise("multi_head.grouped_query", "grouped-query attention", hints=(
    "There are h query heads but only g key/value heads: consecutive query heads form g groups of "
    "h/g, and group j reads key/value head j. The point is that K and V are never copied to h "
    "heads, so a decoding step reads g heads of keys and values, not h; the checker refuses any "
    "allocation that large. Nothing may be copied: which tensor can change its shape for free, "
    "and into what? The attention itself is notebook 02's, ah.scaled_dot_product_attention.",
    "ah.scaled_dot_product_attention treats every axis before the last two as a batch and pairs "
    "q's batch entries with k's; an axis of size 1 in k that has to broadcast against several "
    "query heads is copied inside the matrix product. So k's batch axes, (b, g), must meet q's "
    "exactly. q's head axis splits into g groups of h/g: group first, or h/g first? What is "
    "left of the h/g axis after that, and where can it go so that q keeps only (b, g) in front of "
    "its last two axes? Is that a view of q or a copy? And how does the output get back to "
    "(b, h, n_q, d_head)?",
    "b, h, n_q, d_head = q.shape\n"
    "g = k.shape[1]\n"
    "rows = ...   # (b, g, h/g * n_q, d_head): group j's query heads as rows against k[:, j]; a view\n"
    "out, _ = ah.scaled_dot_product_attention(rows, k, v)   # (b, g, h/g * n_q, d_head)\n"
    "return ...   # (b, h, n_q, d_head)"))
def check_grouped_query_attention(grouped_query_attention: Callable) -> CheckResult:
    """Exercise: ``grouped_query_attention(q (b, h, n_q, d_head), k (b, g, n_k, d_head), v (b, g,
    n_k, d_head)) -> (b, h, n_q, d_head)``; query head ``i`` attends with key/value head
    ``i // (h/g)``, as PyTorch's grouped-query attention does, without K or V ever copied to the
    ``h`` query heads (on the decoding cases a tensor that large is refused, see
    :class:`._NoCopiedKV`; PyTorch's fused attention is blocked while the candidate runs)."""
    return check_function(
        grouped_query_attention, _gqa, _gqa_cases(), what="grouped_query_attention",
        output_names=("the output",), atol=1e-5, rtol=1e-4,
        forbid=[(nn.functional, "scaled_dot_product_attention")], guard=_NoCopiedKV,
        instead="Group the heads yourself, without copying K or V, then call "
                "ah.scaled_dot_product_attention",
        mistakes=[
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: i % g),
                    "query head i must use key/value head i // (h/g): consecutive query heads "
                    "share one (for h = 4, g = 2, heads 0 and 1 read key/value head 0). Yours "
                    "cycles through the key/value heads (0, 1, 0, 1), as splitting the head axis "
                    "into (h/g, g) does, or k.repeat(1, h // g, 1, 1): the groups come first, "
                    "(g, h/g)."),
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: min(i // g, g - 1)),
                    "a group holds h/g query heads, so head i uses key/value head i // (h/g), "
                    "not i // g."),
            Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: 0),
                    "every query head read the first key/value head; with g key/value heads "
                    "there are g groups (g = 1 is multi-query attention)."),
            Mistake(_rows_mixed,
                    "the rows of a group mix positions and heads: n_q was moved in front of the "
                    "head axis before the heads were cut into groups, so group j got some heads "
                    "of some positions. A group is h/g whole query heads, every position of each: "
                    "cut the head axis where it stands."),
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
