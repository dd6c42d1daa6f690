"""Checkers for notebook 06: cross-attention from its weight matrices (queries from the decoder,
keys and values from the encoder, padded memory masked on the keys), and a post-norm decoder layer
one target position at a time, the memory projected once."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..multihead import merge_heads, split_heads
from ..transformer import DecoderLayer
from .core import AllocationWatch, CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise

__all__ = ["check_cross_attend", "cross_attend_reference", "check_decode_layer",
           "decode_layer_reference"]


class _DecoderLayer(DecoderLayer):
    """A post-norm ``DecoderLayer`` with seeded weights and a short repr."""

    def __init__(self, d_model, num_heads, d_ff, memory_dim, *, generator, dtype):
        super().__init__(d_model, num_heads, d_ff, norm_first=False, memory_dim=memory_dim)
        with torch.no_grad():
            for name, p in self.named_parameters():
                scale = 0.1 if "norm" in name and name.endswith("bias") else (
                    1.0 if "norm" in name else 1 / math.sqrt(p.shape[-1]))
                base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
                p.copy_(base + scale * torch.randn(p.shape, generator=generator))
        self.to(dtype).requires_grad_(False)

    def __repr__(self) -> str:
        return (f"DecoderLayer(d_model={self.d_model}, num_heads={self.self_attn.num_heads}, "
                f"memory_dim={self.cross_attn.kdim}, post-norm)")


def cross_attend_reference(y, memory, memory_real, W_Q, W_K, W_V):
    """``(output (b, n_q, d_v), weights (b, n_q, n_k))``: one head of cross-attention, padded memory
    positions masked on the keys only; ``torch.nn.MultiheadAttention``'s with ``key_padding_mask``."""
    Q, K, V = y @ W_Q, memory @ W_K, memory @ W_V       # (b, n_q, d), (b, n_k, d), (b, n_k, d_v)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])      # (b, n_q, n_k)
    weights = scores.masked_fill(~memory_real[:, None, :], -math.inf).softmax(-1)
    return weights @ V, weights


def _attend_with(y, memory, memory_real, W_Q, W_K, W_V, *, mask="keys", causal=False, kv_from="memory",
                 queries_from="y", softmax_dim=-1, scale="d", values="W_V", transposed=(),
                 zero_padded_rows=False, swapped=False):
    """The answer with one named mistake (all defaults: the right answer). ``transposed``: the
    weights multiplied as ``x @ W.T`` (nn.Linear's habit); ``zero_padded_rows``: the padded memory
    rows set to zero, no mask; ``scale="output"``: the output divided by sqrt(d), not the scores;
    ``swapped``: (weights, output) returned."""
    W_Q, W_K, W_V = (W.T if name in transposed else W
                     for name, W in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)))
    if zero_padded_rows:
        memory, mask = memory * memory_real[..., None], None
    Q = (memory if queries_from == "memory" else y) @ W_Q
    source = y if kv_from == "y" else memory
    K, V = source @ W_K, source @ (W_K if values == "W_K" else W_V)
    scores = Q @ K.transpose(-2, -1)
    scores = scores / {"d": math.sqrt(Q.shape[-1]), "d_m": math.sqrt(memory.shape[-1]), None: 1.0,
                       "d2": Q.shape[-1], "output": 1.0, "n_k": math.sqrt(memory.shape[-2])}[scale]
    keep = {"queries": memory_real[:, :, None], "batch": memory_real[None],   # (b, n_k, 1), (1, b, n_k)
            "inverted": ~memory_real[:, None, :], None: torch.ones(1, 1, 1, dtype=torch.bool)
            }.get(mask, memory_real[:, None, :])                             # right: (b, 1, n_k)
    if causal:                                                        # key j seen only by queries >= j
        keep = keep & torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    if mask == "times":                                               # the scores times the mask
        return _weighted(torch.softmax(scores * keep, softmax_dim), V)
    if mask == "after":                                               # the mask after the softmax
        return _weighted(torch.softmax(scores, softmax_dim) * keep, V)
    output, weights = _weighted(scores.masked_fill(~keep, -math.inf).softmax(softmax_dim), V)
    if scale == "output":                                             # sqrt(d) after the weighted sum
        output = output / math.sqrt(Q.shape[-1])
    return (weights, output) if swapped else (output, weights)


def _weighted(weights, V):
    return weights @ V, weights


def _attend_cases() -> list[dict]:
    g = seeded(60)
    cases = []   # case 1: b = n_q = n_k, d_m = d: every named mistake has the answer's shapes
    for b, n_q, n_k, d, d_m, lengths, dtype in [
            (3, 3, 3, 4, 4, [3, 1, 2], torch.float32), (2, 4, 6, 6, 10, [6, 2], torch.float32),
            (2, 1, 5, 4, 4, [3, 5], torch.float64), (4, 5, 3, 8, 6, [3, 1, 2, 3], torch.float32)]:
        def w(rows, cols, dtype=dtype):
            return (2 * torch.randn(rows, cols, generator=g) / math.sqrt(rows)).to(dtype)
        cases.append({"y": torch.randn(b, n_q, d, generator=g).to(dtype),
                      "memory": torch.randn(b, n_k, d_m, generator=g).to(dtype),
                      "memory_real": torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None],
                      "W_Q": w(d, d), "W_K": w(d_m, d), "W_V": w(d_m, d)})
    return cases


@exercise("cross_attention.attend", "cross-attention from W_Q, W_K, W_V: queries from the decoder, "
          "keys and values from the encoder, padded memory masked", hints=(
    "Section 1's formula and its padding mask: the decoder asks, the memory answers. Padding "
    "is a property of the memory's positions, so it hides columns of the weights, never rows.",
    "Which of y and memory makes Q, which makes K and V? The scores are (b, n_q, n_k): one row per "
    "decoder position. Which axis does each row's softmax run over? memory_real is (b, n_k): which "
    "axis must it gain to broadcast over the n_q queries? Divide by the square root of the width "
    "of Q and K.",
    "Q, K, V = ...                      # (b, n_q, d), (b, n_k, d), (b, n_k, d): who makes which?\n"
    "scores = ...                       # (b, n_q, n_k), scaled\n"
    "scores = ...                       # padded memory positions at -inf: the mask (b, 1, n_k)\n"
    "weights = ...                      # (b, n_q, n_k): each row sums to 1\n"
    "return weights @ V, weights"))
def check_cross_attend(cross_attend: Callable) -> CheckResult:
    """Exercise: ``cross_attend(y (b, n_q, d), memory (b, n_k, d_m), memory_real (b, n_k), W_Q (d, d),
    W_K (d_m, d), W_V (d_m, d)) -> (output (b, n_q, d), weights (b, n_q, n_k))``."""
    mistakes = [Mistake(lambda *a, _f=flaw: _attend_with(*a, **_f), hint) for hint, flaw in [
        ("padded memory positions were read: mask the scores with memory_real (True = real) "
         "before the softmax.", {"mask": None}),
        ("the mask was laid along the queries, (b, n_k, 1): it hid rows of the weights (decoder "
         "positions), not columns. Padding belongs to the memory's positions, the keys: give the "
         "mask a query axis of size 1 in the middle, (b, 1, n_k).", {"mask": "queries"}),
        ("the mask's batch axis met the scores' query axis, (1, b, n_k): each decoder position got "
         "another sentence's padding. Keep the batch first: (b, 1, n_k).", {"mask": "batch"}),
        ("the mask is inverted: memory_real is True at the REAL positions, the ones that may be "
         "read.", {"mask": "inverted"}),
        ("the memory was masked causally: cross-attention needs no causal mask. The whole input is "
         "known before the decoder writes, so every decoder position may read every real memory "
         "position.", {"causal": True}),
        ("the keys and values came from the decoder states y: that is self-attention. In "
         "cross-attention they come from the memory, K = memory W_K and V = memory W_V.",
         {"kv_from": "y"}),
        ("the roles are swapped: the queries came from the memory and the keys and values from y. "
         "The decoder asks (Q = y W_Q); the memory answers.",
         {"queries_from": "memory", "kv_from": "y"}),
        ("the values were the keys (memory W_K); V = memory W_V.", {"values": "W_K"}),
        ("the softmax ran over dim -2, the decoder positions: each column summed to 1. Normalise "
         "each row, over the memory positions (the last dim).", {"softmax_dim": -2}),
        ("the scores were not scaled: divide by sqrt(d), the width of Q and K.", {"scale": None}),
        ("the scores were divided by sqrt(d_m), the memory's width; divide by sqrt(d), the width "
         "of Q and K after W_Q and W_K.", {"scale": "d_m"}),
        ("the scores were divided by d; divide by sqrt(d).", {"scale": "d2"}),
        ("the scores were divided by sqrt(n_k), the number of memory positions; divide by sqrt(d), "
         "the width of Q and K: the scale counts the terms of one dot product, not the keys.",
         {"scale": "n_k"}),
        ("the output was divided by sqrt(d), after the weighted sum: the scale belongs to the "
         "scores, before the softmax, where it keeps the softmax from saturating.", {"scale": "output"}),
        ("a weight was transposed: x @ W.T is nn.Linear's habit (its weight is stored (out, in)). "
         "Here the weights are given (in, out): W_Q is (d, d), W_K and W_V are (d_m, d). Each "
         "multiplies its input from the right, untransposed.", {"transposed": ("W_Q",)}),
        ("the weights were transposed: x @ W.T is nn.Linear's habit (its weight is stored (out, in)). "
         "Here the weights are given (in, out): W_Q is (d, d), W_K and W_V are (d_m, d). Each "
         "multiplies its input from the right, untransposed.", {"transposed": ("W_Q", "W_K", "W_V")}),
        ("the padded memory rows were set to zero instead of masked: a zero key still scores 0, "
         "and exp(0) gives it weight. Mask the scores with -inf at padded positions, before the "
         "softmax.", {"zero_padded_rows": True}),
        ("the two results are swapped: return the output first, then the weights, (output (b, n_q, "
         "d), weights (b, n_q, n_k)).", {"swapped": True}),
        ("the padded scores were set to 0 (masked_fill with 0, or the scores times the mask): a "
         "score of 0 is not -inf, so padded positions still get weight. Fill them with -inf.",
         {"mask": "times"}),
        ("the mask came after the softmax: the rows no longer sum to 1. Mask the scores, before "
         "the softmax.", {"mask": "after"}),
    ]]
    return check_function(
        cross_attend, cross_attend_reference, _attend_cases(), what="cross_attend",
        output_names=("the output", "the weights"), mistakes=mistakes,
        nan_hint="a row with every score at -inf gives NaN: is the softmax over the memory "
                 "positions, and is the mask the right way round (True = real)?",
        error_hints=[("must match the size of tensor", "the shapes do not fit the scores (b, n_q, n_k), "
                      "one row per decoder position and one column per memory position. Which of "
                      "y and memory makes the queries, and which axis must memory_real gain?")])


def decode_layer_reference(layer, y, memory, memory_real):
    """``layer``'s causal output ``(b, T, d)`` for all of ``y``, padded memory masked."""
    return layer(y, memory, memory_padding=memory_real)


def _decode_with(layer, y, memory, memory_real, *, mask_memory=True, pre_norm=(False, False),
                 cross_out=True, cross_residual=True, query_before_self=False, one_head=False,
                 memory_queries=False, cross_norm="norm2", ff_residual=True, ff_norm="norm3",
                 invert_memory=False, causal_memory=False, mask_3d=False, scale=None, norm_outside=False,
                 zero_mask=False, soft_mask=False, no_transpose=False, ff_first=False,
                 softmax_dim=-1, values_are_keys=False, residual_from_y=False, ff_on_pre_cross=False):
    """Exercise 1's answer with one named mistake (all off: the right answer)."""
    ca, h = layer.cross_attn, 1 if one_head else layer.cross_attn.num_heads
    split = (lambda x: x.reshape(x.shape[0], h, x.shape[1], -1)) if no_transpose else (
        lambda x: split_heads(x, h))                    # reshaped straight to (b, h, n, d_head)?
    K_m = split(ca.k_proj(memory))
    V_m = K_m if values_are_keys else split(ca.v_proj(memory))   # the keys reused as the values?
    real = (~memory_real if invert_memory else memory_real)[:, None, None, :] if mask_memory else None
    real = real[:, 0] if mask_3d else real                # (b, 1, n_m): batch meets the heads
    x_all = layer.norm1(y + layer.self_attn(y, y, y, causal_mask(y.shape[1]))[0])  # the stub's x_t
    outputs = []

    def block(x, norm, fn, *, residual=True, pre=False):
        if pre == "both":                             # a norm before the block and after the sum
            return norm(x + fn(norm(x)))
        if pre == "outside":                          # the norm on x alone: LN(x) + block(x)
            return norm(x) + fn(x)
        if pre:                                       # pre-norm: x + block(LN(x))
            return x + fn(norm(x))
        return norm((x if residual else 0) + fn(x))   # post-norm: LN(x + block(x))

    for t in range(y.shape[1]):
        x = x_all[:, t:t + 1]                                           # (b, 1, d)
        def cross_attention(z, t=t):
            seen = real & (torch.arange(K_m.shape[-2]) <= t) if causal_memory else real
            q = split_heads(ca.q_proj(z), h)
            o, _ = scaled_dot_product_attention(q, K_m, V_m, seen, scale=(
                layer.d_model ** -0.5 if scale == "d_model" else scale))
            if zero_mask or soft_mask:     # scores times the mask (padding 0), or the mask after softmax
                s = q @ K_m.transpose(-2, -1) * K_m.shape[-1] ** -0.5
                o = ((s * seen).softmax(-1) if zero_mask else s.softmax(-1) * seen) @ V_m
            if softmax_dim != -1:          # the softmax over the query axis (one query: all ones)
                s = (q @ K_m.transpose(-2, -1) * K_m.shape[-1] ** -0.5).masked_fill(~seen, -math.inf)
                o = s.softmax(softmax_dim) @ V_m
            return ca.out_proj(merge_heads(o)) if cross_out else merge_heads(o)

        if ff_first:                                  # blocks swapped; each its own norm, or by place
            first, last = (layer.norm3, layer.norm2) if ff_first == "own" else (layer.norm2, layer.norm3)
            x = first(x + layer.feed_forward(x))
            outputs.append(last(x + cross_attention(x)))
            continue
        if query_before_self:
            x = layer.norm2(x + cross_attention(y[:, t:t + 1]))
        elif memory_queries:                          # queries and keys swapped: (b, n_m, d)
            q = split_heads(ca.q_proj(x), h)
            o, _ = scaled_dot_product_attention(K_m, q, q)
            x = layer.norm2(x + ca.out_proj(merge_heads(o)))
        elif residual_from_y:                         # the residual taken from y_t, not from x_t
            x = layer.norm2(y[:, t:t + 1] + cross_attention(x))
        else:
            x_pre = x
            x = block(x, getattr(layer, cross_norm) if cross_norm else nn.Identity(), cross_attention,
                      residual=cross_residual, pre="outside" if norm_outside else pre_norm[0])
            if ff_on_pre_cross:                       # the feed-forward read the pre-cross state
                outputs.append(layer.norm3(x + layer.feed_forward(x_pre)))
                continue
        outputs.append(block(x, getattr(layer, ff_norm) if ff_norm else nn.Identity(),
                             layer.feed_forward, residual=ff_residual, pre=pre_norm[1]))
    return torch.cat(outputs, 1)


def _layer_cases() -> list[dict]:
    g = seeded(63)
    cases = []
    for b, T, n_m, d, h, d_m, lengths, dtype in [
            (2, 4, 5, 8, 2, 6, [5, 2], torch.float32), (1, 1, 3, 4, 1, 4, [3], torch.float32),
            (3, 5, 6, 12, 3, 8, [6, 1, 4], torch.float64), (2, 6, 4, 8, 4, 8, [1, 4], torch.float32)]:
        layer = _DecoderLayer(d, h, 2 * d, d_m, generator=g, dtype=dtype)
        y, memory = torch.randn(b, T, d, generator=g), torch.randn(b, n_m, d_m, generator=g)
        cases.append({"layer": layer, "y": y.to(dtype), "memory": memory.to(dtype),
                      "memory_real": torch.arange(n_m)[None, :] < torch.tensor(lengths)[:, None]})
    return cases


@contextlib.contextmanager
def _memory_projected_once(inputs: dict):
    """The lesson's constraint: the memory projected once per call, one query per step. Counted
    twice: the cross-attention's projection modules, and the (b, n_m, d) tensors a linear map or
    matmul returns that equal one made before (K or V made again, however they are made)."""
    layer = inputs["layer"]
    ca, steps = layer.cross_attn, inputs["y"].shape[1]
    projected = (*inputs["memory"].shape[:2], layer.d_model)           # (b, n_m, d): K or V
    seen = {"q_proj": [], "k_proj": [], "v_proj": []}
    projections, again = [], []                              # (b, n_m, d) made; made again

    def count(t, call):
        if tuple(t.shape) == projected and call in ("linear", "matmul", "__matmul__"):
            (again if any(torch.equal(t, p) for p in projections) else projections).append(t)

    hooks = [getattr(ca, name).register_forward_hook(
        lambda module, args, output, name=name: seen[name].append(args[0].shape[-2]))
        for name in seen]
    try:
        with AllocationWatch(count):
            yield
    finally:
        for hook in hooks:
            hook.remove()
    if max(seen["q_proj"], default=1) > 1:
        raise Refused(
            f"cross_attn.q_proj ran on {max(seen['q_proj'])} target positions in one call: not step "
            "by step.\nHint: returning layer(y, memory, memory_padding=memory_real) does that. A "
            "generating decoder has only x_t at step t: make step t's query from x_t, in the loop.")
    for made, unused in (("k_proj", "v_proj"), ("v_proj", "k_proj")):
        if not seen[unused] and len(seen[made]) == 2:     # both before the loop, one of them wrong
            raise Refused(
                f"cross_attn.{made} ran twice and cross_attn.{unused} never: the keys and the values "
                f"were both made with {made}.\nHint: K = memory W_K comes from k_proj, V = memory "
                "W_V from v_proj.")
    name = max(("k_proj", "v_proj"), key=lambda name: len(seen[name]))
    if len(seen[name]) > 1:
        raise Refused(
            f"cross_attn.{name} ran {len(seen[name])} times in {steps} decoding steps: the "
            "memory was projected at every step.\nHint: calling layer.cross_attn(x_t, memory, "
            "memory, mask) in the loop does that. Project the memory once, before the loop.")
    if again:
        raise Refused(
            f"the memory's keys and values were computed {len(projections) + len(again)} times "
            f"in {steps} decoding steps (each a (b, n_m, d) projection): the memory was projected "
            "at every step.\nHint: K and V do not change while the decoder writes. Project the "
            "memory once, before the loop, and reuse K_m and V_m at every step.")


@exercise("cross_attention.decode", "a decoder layer's cross-attention step by step, the "
          "memory's keys and values projected once", hints=(
    "The stub's loop gives x_t after the causal self-attention block; left at each step are the "
    "cross-attention and the feed-forward, each post-norm. The memory does not change while the "
    "decoder writes: what need not be computed again at every step?",
    "The decoder asks, the memory answers: which makes the query, which the keys and values? "
    "Post-norm: is a sub-layer's output added before or after its LayerNorm, and which of norm2, "
    "norm3 is whose? How must memory_real be shaped against the scores (b, h, 1, n_m)?",
    "ca, h = layer.cross_attn, layer.cross_attn.num_heads\n"
    "K_m = ...                          # (b, h, n_m, d_head): ca.k_proj(memory) split, ONCE\n"
    "V_m = ...                          # the same with ca.v_proj\n"
    "outputs = []\n"
    "for t in range(y.shape[1]):\n"
    "    y_t = y[:, t:t + 1]                                             # given\n"
    "    x_t = layer.norm1(y_t + layer.self_attn(y_t, y_t, y_t, cache=cache)[0])  # given\n"
    "    q = ...                        # (b, h, 1, d_head): x_t through ca.q_proj\n"
    "    o, _ = ...                     # attention over K_m, V_m; padded memory masked (b, 1, 1, n_m)\n"
    "    x_t = ...                      # norm2 of: x_t plus the heads merged through ca.out_proj\n"
    "    outputs.append(...)            # norm3 of: x_t plus its feed-forward\n"
    "return torch.cat(outputs, 1)                                         # (b, T, d)"))
def check_decode_layer(decode_layer: Callable) -> CheckResult:
    """Exercise: ``decode_layer(layer, y (b, T, d), memory (b, n_m, d_m), memory_real (b, n_m))
    -> (b, T, d)``, one target position per step, the memory projected once."""
    mistakes = [Mistake(lambda *a, _f=flaw: _decode_with(*a, **_f), hint) for hint, flaw in [
        ("padded memory positions were read: mask the cross-attention with memory_real "
         "(True = real).", {"mask_memory": False}),
        *(("a block was written pre-norm, x + block(norm(x)) (or norm(x + block(norm(x)))); this "
           "layer is post-norm: does its LayerNorm come before the residual sum or after it?",
           {"pre_norm": (cross, ff)})
          for cross in (False, True, "both") for ff in (False, True, "both") if cross or ff),
        ("the scores were multiplied by the mask: a score of 0 is not -inf, so padded keys "
         "still get weight.", {"zero_mask": True}),
        ("the mask came after the softmax: the rows no longer sum to 1. Mask the scores, before "
         "the softmax.", {"soft_mask": True}),
        ("the memory was masked causally: each step sees all real memory.", {"causal_memory": True}),
        ("the memory made the queries; in cross-attention the decoder asks (q from x_t) and the "
         "memory answers.", {"memory_queries": True}),
        ("the cross-attention's heads were merged but not sent through out_proj.", {"cross_out": False}),
        ("the residual is missing: norm2 got the cross-attention's output alone, and x_t was "
         "lost.", {"cross_residual": False}),
        ("the cross-attention's query came from y, the state before the self-attention block; "
         "q comes from x_t.", {"query_before_self": True}),
        ("the scores were not scaled by 1/sqrt(d_head), the width of one head.", {"scale": 1.0}),
        ("the scores were neither scaled by 1/sqrt(d_head) nor masked: padded memory positions were "
         "read. Scale, then mask with memory_real (True = real).", {"scale": 1.0, "mask_memory": False}),
        ("the softmax ran over dim -2, the one query of step t: each weight became 1 (NaN where "
         "masked). Normalise over the memory positions, the last dim.", {"softmax_dim": -2}),
        ("the scale is 1/sqrt(d_head), the width of one head, not 1/sqrt(d_model).",
         {"scale": "d_model"}),
        ("the LayerNorm went on x_t alone, not on the residual sum.", {"norm_outside": True}),
        ("the heads were not split: attend per head (ah.split_heads), then merge.", {"one_head": True}),
        ("the heads were split without moving the head axis before the positions: reshape to (b, "
         "n_m, h, d_head), then transpose(1, 2), as ah.split_heads does.", {"no_transpose": True}),
        ("the sum after the cross-attention was not normalised: norm2 is next.", {"cross_norm": False}),
        ("the cross-attention's sum went through norm1, the self-attention block's; each block has "
         "its own LayerNorm.", {"cross_norm": "norm1"}),
        ("the feed-forward's output must be ADDED to x_t (the residual), then normalised.",
         {"ff_residual": False}),
        ("the feed-forward's sum went through norm2; each block has its own: norm3 for the "
         "feed-forward.", {"ff_norm": "norm2"}),
        ("the sum after the feed-forward was not normalised: post-norm ends each block with its "
         "LayerNorm, norm3 here.", {"ff_norm": None}),
        *(("the blocks are in the wrong order: cross-attention comes first, then the feed-forward "
           "(section 2).", {"ff_first": place}) for place in ("own", "place")),
        ("the values were the keys: V_m reused K_m. The values are V = memory W_V, from "
         "cross_attn.v_proj.", {"values_are_keys": True}),
        ("the cross-attention's sum went through norm3; norm2 is the cross-attention block's, norm3 "
         "the feed-forward's.", {"cross_norm": "norm3"}),
        ("the cross-attention's residual came from y_t, the state before the self-attention block; "
         "add the block's output to x_t, its own input.", {"residual_from_y": True}),
        ("the feed-forward read x_t from before the cross-attention block; it reads that block's "
         "output, the new x_t.", {"ff_on_pre_cross": True}),
        ("the memory mask is inverted: memory_real is True at the REAL positions, the ones that "
         "may be read.", {"invert_memory": True}),
        ("the memory mask has shape (b, 1, n_m): against scores (b, h, 1, n_m) its batch axis "
         "meets the heads axis. Which axes must memory_real gain?", {"mask_3d": True}),
    ]]
    return check_function(decode_layer, decode_layer_reference, _layer_cases(),
                          what="decode_layer", output_names=("the outputs",), mistakes=mistakes,
                          watch=_memory_projected_once)

