"""Checkers for notebook 06: a post-norm decoder layer one target position at a time, the memory
projected once, and a hard alignment's accuracy against a gold one, with padding."""

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
from .core import CheckResult, Mistake, Refused, check_function, clone_inputs, seeded
from .workflow import exercise

__all__ = ["check_decode_layer", "decode_layer_reference", "check_alignment_accuracy",
           "alignment_accuracy_reference"]


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
    """The lesson's constraint: the memory projected once per call, one query per step."""
    ca, steps = inputs["layer"].cross_attn, inputs["y"].shape[1]
    seen = {"q_proj": [], "k_proj": [], "v_proj": []}
    hooks = [getattr(ca, name).register_forward_hook(
        lambda module, args, output, name=name: seen[name].append(args[0].shape[-2]))
        for name in seen]
    try:
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


def _alignment_case(g, b, n_out, n_src, *, pad_weight=0.0, dtype=torch.float32):
    src_len = torch.randint(1, n_src + 1, (b,), generator=g)
    src_len[0] = n_src - 1 if n_src > 1 else 1                         # one padded source at least
    tgt_len = torch.randint(1, n_out + 1, (b,), generator=g)
    tgt_len[-1], tgt_len[0] = n_out, max(1, n_out - 2)                 # lengths differ by sentence
    src_real = torch.arange(n_src)[None, :] < src_len[:, None]
    tgt_real = torch.arange(n_out)[None, :] < tgt_len[:, None]
    logits = 3 * torch.randn(b, n_out, n_src, generator=g)
    logits = logits.masked_fill(~src_real[:, None, :], math.log(pad_weight) if pad_weight else -math.inf)
    weights = torch.softmax(logits, -1)
    if pad_weight:                                # an unmasked model: padding may hold the most weight
        weights = weights + (~src_real[:, None, :]) * pad_weight
    best = weights.masked_fill(~src_real[:, None, :], -1).argmax(-1)
    right = torch.rand(b, n_out, generator=g) < 0.6
    gold = torch.where(right, best, (best + 1) % src_len[:, None]).masked_fill(~tgt_real, -1)
    return {"weights": weights.to(dtype), "src_real": src_real, "gold": gold, "tgt_real": tgt_real}


def _alignment_cases() -> list[dict]:
    g = seeded(64)
    return [_alignment_case(g, 3, 5, 6, pad_weight=0.9), _alignment_case(g, 2, 4, 4),
            _alignment_case(g, 4, 7, 5, pad_weight=0.6, dtype=torch.float64),
            _alignment_case(g, 1, 3, 8, pad_weight=0.9)]


def alignment_accuracy_reference(weights, src_real, gold, tgt_real):
    """``(alignment (b, n_out) long, accuracy)``: each real output step's strongest real source
    position (``-1`` at padded steps), and the pooled share of real steps equal to ``gold``."""
    scores = weights.masked_fill(~src_real[:, None, :], -math.inf)       # padding never wins
    alignment = scores.argmax(-1).masked_fill(~tgt_real, -1)             # (b, n_out)
    hits = (alignment == gold) & tgt_real                                # real steps only
    return alignment, hits.sum() / tgt_real.sum()


def _alignment_mistakes():
    """``(hint, produce)`` per named mistake: ``produce`` gives ``(alignment, accuracy)``."""
    def masked(w, s, t):
        return w.masked_fill(~s[:, None, :], -math.inf).argmax(-1).masked_fill(~t, -1)
    def pooled(a, g, t):
        return a, ((a == g) & t).sum() / t.sum()

    return [
        ("padding won the argmax: take it over the real source positions only.",
         lambda w, s, g, t: pooled(w.argmax(-1).masked_fill(~t, -1), g, t)),
        ("the mask is inverted: the argmax ran over the padded source positions.",
         lambda w, s, g, t: pooled(masked(w, ~s, t), g, t)),
        ("the argmax ran over the output steps (dim 1), not the source positions (the last dim).",
         lambda w, s, g, t: w.masked_fill(~s[:, None, :], -math.inf).argmax(1)),
        ("padded output steps counted in the accuracy: divide the hits on real steps by the "
         "number of real steps.", lambda w, s, g, t: (a := masked(w, s, t), (a == g).float().mean())),
        ("padded output steps counted as hits: alignment and gold are both -1 there.",
         lambda w, s, g, t: (a := masked(w, s, t), (a == g).sum() / t.sum())),
        ("padded output steps counted as misses: divide by the real steps, not all b * n_out.",
         lambda w, s, g, t: (a := masked(w, s, t), ((a == g) & t).float().mean())),
        ("the accuracy is a mean of per-sentence accuracies; pool the real steps of the batch.",
         lambda w, s, g, t: (a := masked(w, s, t), (((a == g) & t).sum(1) / t.sum(1)).mean())),
        ("padded output steps must be marked -1 in the alignment.",
         lambda w, s, g, t: pooled(w.masked_fill(~s[:, None, :], -math.inf).argmax(-1), g, t)),
    ]


@exercise("cross_attention.alignment", "the hard alignment and its accuracy", hints=(
    "Each output step reads the source position with the most weight, but a padded source "
    "position is never an answer, and a padded output step is never scored.",
    "A padded source must lose every argmax: which value can no real weight fall below, and how "
    "must src_real broadcast over the output steps? The accuracy is one ratio over all the real "
    "steps of the batch.",
    "scores = ...                       # (b, n_out, n_src): the weights, padded sources at -inf\n"
    "alignment = ...                    # (b, n_out) long: each step's best source, -1 if padded\n"
    "hits = ...                         # (b, n_out) bool: equal to gold, real steps only\n"
    "return alignment, ...              # pooled: the hits over ALL real steps of the batch"))
def check_alignment_accuracy(alignment_accuracy: Callable) -> CheckResult:
    """Exercise: ``alignment_accuracy(weights, src_real, gold, tgt_real) -> (alignment, accuracy)``."""
    padded = []                   # the last call's real steps that name a padded source position

    def run(*inputs):  # the learner's answer; the accuracy (a tensor or a number) as a tensor
        got = alignment_accuracy(*inputs)
        if not (isinstance(got, tuple | list) and len(got) == 2):
            return got                                  # check_function says what is wrong
        if not isinstance(got[0], torch.Tensor) or got[0].is_floating_point():
            raise Refused("the alignment must be an integer tensor of source positions.")
        a, (_, src_real, _, tgt_real), n = got[0].long(), inputs, inputs[1].shape[1]
        on = (tgt_real & (a >= 0) & (a < n) & ~src_real.gather(1, a.clamp(0, n - 1))
              if a.shape == tgt_real.shape else torch.zeros(0, 0))
        padded[:] = [(i, t, int(a[i, t])) for i, t in on.nonzero().tolist()]
        return got[0], torch.tensor(float(got[1]), dtype=torch.float64)

    def everywhere(produce):  # named only if it gives the answer on EVERY case: one scalar
        def checked(*inputs):  # accuracy can match a wrong formula on one case by chance
            failing_case = padded[:]
            try:
                for case in cases:
                    got = run(*clone_inputs(case).values())                   # a pair
                    wrong = produce(*clone_inputs(case).values())             # a pair or a tensor
                    wrong = wrong if isinstance(wrong, tuple) else (wrong,)
                    if not all(x.shape == y.shape and torch.allclose(x.double(), y.double(), atol=1e-6)
                               for x, y in zip(wrong, got, strict=False)):
                        raise ValueError("not this mistake")    # a mistake that raises is not named
            finally:
                padded[:] = failing_case                        # the failing case's, not the last's
            return produce(*inputs)
        return checked

    cases = _alignment_cases()
    verdict = check_function(
        run if callable(alignment_accuracy) else alignment_accuracy, alignment_accuracy_reference,
        cases, what="alignment_accuracy", output_names=("the alignment", "the accuracy"),
        mistakes=[Mistake(everywhere(produce), hint) for hint, produce in _alignment_mistakes()])
    if verdict or "\nHint: " in verdict.message or not padded:
        return verdict
    i, t, j = padded[0]
    return CheckResult(False, f"{verdict.message}\nHint: at index ({i}, {t}) you chose source "
                              f"position {j}, which is padding in sentence {i}: never an answer.")
