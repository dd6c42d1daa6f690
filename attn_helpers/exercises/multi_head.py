"""Checkers for notebook 04: a multi-head module with ``nn.MultiheadAttention``'s fused ``in_proj``,
all heads in one call; grouped-query attention, K and V not copied to h heads by the learner's code."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import torch
from torch import nn

from ..masks import causal_mask, padding_mask
from . import core
from .core import AllocationWatch, CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise


def _module_cases() -> list[dict]:
    """``x``, a bool ``mask`` (``(n, n)``, ``(b, n, n)`` or None), ``num_heads``, the weights' seed."""
    g = seeded(41)
    masks = {None: lambda b, n: None, "causal": lambda b, n: causal_mask(n),
             "random": lambda b, n: (torch.rand(n, n, generator=g) < 0.5) | torch.eye(n).bool(),
             "batch": lambda b, n: (causal_mask(n) & padding_mask(   # (b, n, n): b different lengths
                 torch.tensor([n, n - 2, n - 3][:b]), n)[:, None, :]) | torch.eye(n).bool()}
    cases = []
    for b, n, d_model, h, mask, dtype in [
            (2, 5, 12, 3, None, torch.float32), (1, 6, 16, 4, "causal", torch.float32),
            (2, 4, 8, 1, None, torch.float32), (3, 1, 12, 3, None, torch.float32),
            (2, 7, 16, 2, "random", torch.float64), (2, 6, 8, 2, "causal", torch.float32),
            (3, 5, 12, 3, "batch", torch.float32), (2, 6, 16, 4, "batch", torch.float32)]:
        cases.append({"x": torch.randn(b, n, d_model, generator=g, dtype=dtype),
                      "mask": masks[mask](b, n), "num_heads": h, "seed": len(cases)})
    return cases


def _torch_module(d_model: int, num_heads: int, seed: int, dtype) -> nn.MultiheadAttention:
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        m = nn.MultiheadAttention(d_model, num_heads, batch_first=True).to(dtype).eval()
        m.in_proj_bias.normal_(0, 0.3)                  # non-zero biases; the global seed stays
        m.out_proj.bias.normal_(0, 0.3)
    return m


def _build(module_class, x: torch.Tensor, num_heads: int, seed: int) -> nn.Module:
    """``module_class(d_model, num_heads)`` in ``x``'s dtype, the case's torch weights copied in."""
    with torch.random.fork_rng(devices=[]):
        module = module_class(x.shape[-1], num_heads).to(x.dtype)
    m = _torch_module(x.shape[-1], num_heads, seed, x.dtype)
    for name, weight, bias in (("in_proj", m.in_proj_weight, m.in_proj_bias),
                               ("out_proj", m.out_proj.weight, m.out_proj.bias)):
        layer = getattr(module, name, None)
        if not isinstance(layer, nn.Linear) or layer.weight.shape != weight.shape or layer.bias is None:
            d_out = "3 * d_model" if name == "in_proj" else "d_model"
            raise Refused(f"the checker copies PyTorch's weights into the module's own {name} = "
                          f"nn.Linear(d_model, {d_out}), with a bias (d_model = {x.shape[-1]}): {layer}")
        layer.load_state_dict({"weight": weight, "bias": bias})
    return module


_SPLIT = {   # (b, n, d) -> (b, h, n, d_head), right and wrong
    "right": lambda t, h: t.unflatten(-1, (h, -1)).transpose(1, 2),
    "no transpose": lambda t, h: t.reshape(t.shape[0], h, t.shape[1], -1),   # positions in heads
    "interleaved": lambda t, h: t.unflatten(-1, (-1, h)).permute(0, 3, 1, 2)}  # every h-th feature
_MERGE = {   # (b, h, n, d_head) -> (b, n, d), right and wrong
    "right": lambda a: a.transpose(1, 2).flatten(2),
    "no transpose": lambda a: a.reshape(a.shape[0], a.shape[2], -1),
    "interleaved": lambda a: a.permute(0, 2, 3, 1).flatten(2),             # head i: every h-th column
    "reversed heads": lambda a: a.flip(1).transpose(1, 2).flatten(2),      # head h-1 first
    "reversed columns": lambda a: a.transpose(1, 2).flatten(2).flip(-1)}   # every column backwards


class _Reference(nn.Module):
    """The module exercise's answer with the learner's layer names; ``mistake``: :func:`_attend`'s."""

    def __init__(self, d_model: int, num_heads: int, **mistake):
        super().__init__()
        self.num_heads, self.mistake = num_heads, mistake
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        return _attend(self, x, mask, **self.mistake)


def _attend(p: _Reference, x, mask, *, split="right", merge="right", scale="d_head", dim=-1,
            use_w_o=True, invert_mask=None, fused="right", mask_heads=True, ignore_mask=False,
            fill=float("-inf")):
    """Self-attention with ``p``'s layers; each keyword other than its default is a mistake."""
    d, h = x.shape[-1], p.num_heads
    qkv = p.in_proj(x)                                                # (b, n, 3 d)
    if fused == "per head":                      # [q k v] of head 0, then of head 1, ...
        qkv = qkv.unflatten(-1, (h, -1))
    q, k, v = (_SPLIT[split](t.flatten(2), h) for t in qkv.chunk(3, dim=-1))
    if fused == "k q v":
        q, k = k, q
    c = {"d_head": d // h, "d_model": d, "none": 1, "twice": (d // h) ** 2}[scale]
    s = q @ k.transpose(-2, -1) / math.sqrt(c)
    if mask is not None and not ignore_mask:
        allowed = ~mask if invert_mask else mask
        if allowed.dim() == 3 and mask_heads:
            allowed = allowed[:, None]           # without: meets (b, h, n, n) as (1, b, n, n)
        s = s.masked_fill(~allowed, fill)
    a = torch.softmax(s, dim=dim)
    if invert_mask == "zeros":                  # a fully masked row gives zeros, not NaN
        a = a.nan_to_num(0.0)
    concat = _MERGE[merge](a @ v)                                     # (b, n, d)
    return p.out_proj(concat) if use_w_o else concat


def _run(module_class) -> Callable:
    def run(x, mask, num_heads, seed):                # a case's inputs -> the module's output
        with torch.no_grad():
            return _build(module_class, x, num_heads, seed)(x, *([] if mask is None else [mask]))
    return run


@contextlib.contextmanager
def _all_heads_at_once(inputs: dict):
    """The lesson's constraint: a loop over heads holds only one head's ``(b, n, n)`` scores."""
    (b, n), h = inputs["x"].shape[:2], inputs["num_heads"]
    largest = [0]

    def record(t: torch.Tensor, call: str) -> None:
        if t.is_floating_point() and t.dim() >= 2 and tuple(t.shape[-2:]) == (n, n):
            largest[0] = max(largest[0], t.numel())

    with AllocationWatch(record):
        yield
    if h > 1 and n > 1 and 0 < largest[0] < b * h * n * n:
        raise Refused(
            f"it attended head by head: its largest (n, n) scores held {largest[0]} numbers, one head's "
            f"worth, not the {b * h * n * n} of all {h} heads. This exercise asks for all heads in one "
            "attention call, without a loop over heads: make Q, K, V one (b, h, n, d_head) tensor each.")


MASK_INVERTED = ("the mask is inverted: in this course True means MAY attend (nn.MultiheadAttention's "
                 "attn_mask means the opposite). Set the scores to -inf where mask is False.")
_MODULE_MISTAKES = [   # _Reference's keywords for one mistake, and its hint
    ({"fused": "per head"}, "in_proj's output is [Q | K | V], all of Q first, not [q k v] per head: "
     "cut it with chunk(3, dim=-1), then split each into heads."),
    ({"fused": "k q v"}, "Q and K are swapped: in_proj's output is Q, K, V in that order."),
    ({"split": "no transpose"}, "reshaping (b, n, d_model) straight to (b, h, n, d_head) mixes "
     "positions into heads. Reshape to (b, n, h, d_head), then transpose(1, 2)."),
    ({"split": "no transpose", "merge": "no transpose"}, "reshaping straight to (b, h, n, d_head) "
     "mixes positions into heads (and merged back the same way): go through (b, n, h, d_head)."),
    ({"split": "interleaved"}, "the heads are split on the wrong axis, from the wrong end: head i "
     "gets the consecutive features i*d_head .. (i+1)*d_head - 1: reshape to (b, n, h, d_head)."),
    ({"split": "interleaved", "merge": "interleaved"}, "the heads are split and merged from the "
     "wrong end: head i owns features i*d_head .. (i+1)*d_head - 1. Go through (b, n, h, d_head)."),
    ({"merge": "no transpose"}, "the heads are merged in the wrong order: heads.transpose(1, 2) to "
     "(b, n, h, d_head) first, then reshape to (b, n, d_model)."),
    ({"merge": "interleaved"}, "the heads are merged on the wrong axis, from the wrong end: head i "
     "fills the columns i*d_head .. (i+1)*d_head - 1."),
    ({"merge": "reversed heads"}, "the heads come back in reverse order: head h-1 fills the first "
     "columns, not head 0."),
    ({"merge": "reversed columns"}, "the merged columns are in reverse order. Was a flip left in?"),
    ({"scale": "none"}, "the 1/sqrt(d_head) scale is missing."),
    ({"scale": "d_model"}, "each head scales by 1/sqrt(d_head), its own query size, not "
     "1/sqrt(d_model)."),
    ({"scale": "twice"}, "scaled twice: ah.scaled_dot_product_attention already divides by "
     "sqrt(d_head)."),
    ({"use_w_o": False}, "W_O is missing: the concatenated heads still go through out_proj."),
    ({"invert_mask": "nan"}, MASK_INVERTED),
    ({"invert_mask": "zeros"}, MASK_INVERTED),
    ({"fill": 0.0}, "masked scores set to 0, not -inf: a blocked key still gets weight (exp(0) = 1)."),
    ({"ignore_mask": True}, "the mask was ignored: every query read every key."),
    ({"mask_heads": False}, "a (b, n, n) mask was lined up with the heads axis of the (b, h, n, n) "
     "scores: give it a head axis, mask[:, None]."),
    ({"dim": -2}, "the softmax runs over the wrong axis: each query's weights over the keys must "
     "sum to 1."),
]


@exercise("multi_head.module", "all heads at once: a multi-head module with a fused in_proj", hints=(
    "In __init__ (after super().__init__()), keep num_heads and make in_proj = nn.Linear(d_model, "
    "3 * d_model), output [Q | K | V], and out_proj = nn.Linear(d_model, d_model). Head i is a "
    "block of d_head consecutive features (section 1): the h heads are a reshape, one call serves all.",
    "Cut [Q | K | V] with chunk(3, dim=-1). Splitting d_model in two, which comes first, h or "
    "d_head? ah.scaled_dot_product_attention treats every axis before the last two as a batch: "
    "where must the head axis stand, and what does a (b, n, n) mask lack? The merge undoes the split.",
    "b, n, d_model = x.shape\nh = self.num_heads\n"
    "q, k, v = (... for t in self.in_proj(x).chunk(3, dim=-1))   # split: each (b, h, n, d_head)\n"
    "if mask is not None and mask.dim() == 3: mask = mask[:, None]   # (b, 1, n, n): every head\n"
    "heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)  # (b, h, n, d_head), one call\n"
    "return self.out_proj(...)                  # merge first: (b, n, d_model), head i's columns"))
def check_multi_head_module(module_class) -> CheckResult:
    """Exercise: ``module_class(d_model, num_heads)``, its ``forward(x, mask=None)`` equal to
    ``_Reference`` (as nn.MultiheadAttention computes), all heads in one call, gradients included."""
    name = getattr(module_class, "__name__", "your module")
    if not isinstance(module_class, type):
        return CheckResult(False, f"Not yet: pass the class itself (e.g. MultiHeadSelfAttention), "
                                  f"not {type(module_class).__name__}.")
    cases = _module_cases()
    view = ("after a transpose the heads are no longer contiguous in memory, so .view cannot merge "
            "them: use .reshape (or .contiguous().view).")
    mask_axis = "a (b, n, n) mask needs a head axis to meet the (b, h, n, n) scores: mask[:, None]."
    result = check_function(
        _run(module_class), _run(_Reference), cases, what=name, watch=_all_heads_at_once,
        error_hints=[("must match the size", mask_axis), ("does not broadcast", mask_axis),
                     ("view size is not compatible", view)],
        mistakes=[Mistake(_run(functools.partial(_Reference, **mistake)), hint)
                  for mistake, hint in _MODULE_MISTAKES])
    if not result:
        return result
    x, mask, h, seed = cases[6].values()                   # one backward on a (b, n, n) mask
    wrong = core.gradient_mismatch(_build(module_class, x, h, seed), _build(_Reference, x, h, seed),
                                   lambda m, x: m(x, mask), x)
    if wrong:
        parts = core.detached_parts(wrong, "in_proj.weight")
        where = f"in_proj's {' and '.join(parts)} rows" if parts else ", ".join(wrong)
        what = " or the ".join(parts or ["input, or a part of the module,"])
        return CheckResult(False, f"Not yet: {name} gives the right output, but after one backward the "
                                  f"gradient at {where} is wrong: was the {what} detached (detach(), "
                                  ".data, torch.no_grad())? Nothing would train those weights.")
    return CheckResult(True, f"Passed: {name} equals nn.MultiheadAttention, as the checker's reference "
                             f"computes it, on all {len(cases)} cases, gradients included.")


def _gqa(q, k, v, *, group_of=lambda i, h, g: i // (h // g), scale=None, dim=-1):
    """Query head i reads key/value head ``group_of(i, h, g)`` (right: ``i // (h/g)``)."""
    index = torch.tensor([group_of(i, q.shape[1], k.shape[1]) for i in range(q.shape[1])])
    k, v = k[:, index], v[:, index]                                  # (b, h, n_k, d_head)
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return torch.softmax(s, dim=dim) @ v


def _rows(q, k, v, *, fold_n_q_first=False, unfold_n_q_first=False, dim=-1):  # not default: a mistake
    b, h, n_q, d = q.shape
    rows = (q.transpose(1, 2) if fold_n_q_first else q).reshape(b, k.shape[1], -1, d)
    out = torch.softmax(rows @ k.mT / math.sqrt(d), dim=dim) @ v
    return out.reshape(b, n_q, h, d).transpose(1, 2) if unfold_n_q_first else out.reshape(q.shape)


def _gqa_cases() -> list[dict]:
    g = seeded(42)
    rb, rg, group, rn, rd = (int(i) for i in torch.randint(1, 5, (5,), generator=g))  # random shape
    shapes = [(b, h, kv, n, n, d, dtype) for b, h, kv, n, d, dtype in [
        (2, 4, 2, 5, 3, torch.float32), (1, 6, 3, 4, 2, torch.float32),
        (2, 8, 2, 4, 4, torch.float32), (2, 4, 1, 3, 4, torch.float32),
        (1, 3, 3, 4, 2, torch.float32), (2, 8, 2, 1, 4, torch.float32),
        (1, 6, 2, 5, 8, torch.float64), (rb, rg * group, rg, rn, rd, torch.float32)]]
    shapes += [(2, 8, 2, 1, 32, 8, torch.float32), (1, 6, 2, 2, 16, 4, torch.float32),  # decoding
               (2, 4, 1, 1, 24, 4, torch.float32), (1, 12, 3, 3, 20, 8, torch.float64)]
    return [{"q": torch.randn(b, h, n_q, d, generator=g, dtype=dtype),
             "k": torch.randn(b, kv, n_k, d, generator=g, dtype=dtype),
             "v": torch.randn(b, kv, n_k, d, generator=g, dtype=dtype)}
            for b, h, kv, n_q, n_k, d, dtype in shapes]


def _no_copied_kv(inputs: dict) -> contextlib.AbstractContextManager:
    """On the decoding cases: no tensor holds ``b * h * n_k * d_head`` numbers; views pass."""
    (b, h, n_q, d), (g, n_k) = inputs["q"].shape, inputs["k"].shape[1:3]
    if not (h >= 3 * g and n_q < min(n_k, d)):
        return contextlib.nullcontext()

    def refuse(t: torch.Tensor, call: str) -> str | None:
        held = t.untyped_storage().nbytes() // t.element_size()
        if held < b * h * n_k * d:
            return None
        return (f"{call} built a tensor of shape {tuple(t.shape)}, {held:,} numbers: K (or V) "
                f"copied to all h = {h} query heads (b * h * n_k * d_head = {b} * {h} * {n_k} * {d}). "
                f"A decoding step would then read h = {h} heads of keys and values, not g = {g}. A view "
                "copies nothing (unsqueeze, expand), but reshaping an expanded K copies it, as "
                "repeat_interleave and cat do: fold the query heads into rows instead.")

    return AllocationWatch(refuse)


_GQA_MISTAKES = [
    Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: i % g),
            "query head i must use key/value head i // (h/g); yours cycles through the key/value "
            "heads (0, 1, 0, 1), as an (h/g, g) split of the head axis does: the groups come first, "
            "(g, h/g). k.repeat(1, h // g, 1, 1) gives this order too, and is a copy of K and V."),
    Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: min(i // g, g - 1)),
            "a group holds h/g query heads, so head i uses key/value head i // (h/g), not i // g."),
    Mistake(lambda q, k, v: _gqa(q, k, v, group_of=lambda i, h, g: 0),
            "every query head read the first key/value head; there are g groups."),
    Mistake(functools.partial(_rows, fold_n_q_first=True, unfold_n_q_first=True), "the rows of a "
            "group mix positions and heads: n_q was moved in front of the head axis. A group is h/g "
            "whole query heads: cut the head axis where it stands."),
    Mistake(functools.partial(_rows, unfold_n_q_first=True), "the output is merged back in the "
            "wrong order: undo your own fold, reshape to (b, h, n_q, d_head), no transpose."),
    Mistake(lambda q, k, v: _gqa(q, k, v, scale=1.0),
            "the scores are not scaled: divide by sqrt(d_head)."),
    Mistake(lambda q, k, v: _gqa(q, k, v, scale=1 / q.shape[-1]), "scaled twice: "
            "ah.scaled_dot_product_attention already divides by sqrt(d_head)."),
    Mistake(lambda q, k, v: _gqa(q, k, v, scale=1 / math.sqrt(q.shape[1] * q.shape[-1])),
            "each head scales by 1/sqrt(d_head), its own query size, not by 1/sqrt(h * d_head)."),
    Mistake(lambda q, k, v: _gqa(q, k, v, dim=-2), "the softmax runs over the wrong axis: each "
            "query's weights over the keys must sum to 1."),
    Mistake(functools.partial(_rows, dim=-2), "the softmax runs over the folded rows, so it mixes a "
            "group's query heads: each row's weights over the keys must sum to 1 (dim=-1)."),
]


@exercise("multi_head.grouped_query", "grouped-query attention", hints=(
    "Consecutive query heads form g groups of h/g; group j reads key/value head j. Your code must "
    "not build K or V for all h heads: the checker refuses any torch call that hands you a tensor "
    "that large. Which tensor can change its shape for free (a view), and into what?",
    "ah.scaled_dot_product_attention (and @) treats the axes before the last two as a batch and "
    "broadcasts a size-1 axis. q's head axis splits into g groups of h/g: which comes first? Then "
    "fold the h/g axis into q's rows. (A size-1 axis on k and v broadcasts too, but matmul then "
    "copies them to every head inside the call.) Is each step a view? How does the output get back "
    "to (b, h, n_q, d_head)?",
    "b, h, n_q, d_head = q.shape\n"
    "g = k.shape[1]\n"
    "rows = ...   # (b, g, h/g * n_q, d_head): group j's query heads as rows against k[:, j]; a view\n"
    "out, _ = ah.scaled_dot_product_attention(rows, k, v)   # (b, g, h/g * n_q, d_head)\n"
    "return ...   # (b, h, n_q, d_head)"))
def check_grouped_query_attention(grouped_query_attention: Callable) -> CheckResult:
    """Exercise: query head ``i`` of ``q (b, h, n_q, d_head)`` reads head ``i // (h/g)`` of ``k, v
    (b, g, n_k, d_head)``, K and V not copied."""
    return check_function(grouped_query_attention, _gqa, _gqa_cases(), what="grouped_query_attention",
                          watch=_no_copied_kv, mistakes=_GQA_MISTAKES)
