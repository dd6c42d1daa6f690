"""Checkers for notebook 06: Perceiver-style cross-attention, and a decoder layer step by step."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from functools import partial

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..multihead import merge_heads, split_heads
from ..transformer import DecoderLayer
from .core import AllocationWatch, CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise


def batched(x, memory):                  # the latents' rows (n_q, d) for every example: (b, n_q, d)
    return x.expand(memory.shape[0], -1, -1)


_ATTEND = {  # the reference in steps; each named mistake below replaces one
    "QKV": lambda L, m, W_Q, W_K, W_V: (batched(L @ W_Q, m), m @ W_K, m @ W_V),   # the latents ask
    "split": split_heads,                                         # (b, n, d) -> (b, h, n, d_head)
    "scale": lambda Q, memory: math.sqrt(Q.shape[-1]),                               # sqrt(d_head)
    "keep": lambda real, n_q: real[:, None, None, :],                     # (b, 1, 1, n_k): keys
    "weights": lambda scores, keep: scores.masked_fill(~keep, -math.inf).softmax(-1),
    "merge": merge_heads,
    "out": lambda out, weights, W: (out, weights),     # W: W_Q and W_V, for the mistakes' extra W_O
}


def cross_attend_reference(latents, memory, memory_real, W_Q, W_K, W_V, num_heads, **changed):
    """``nn.MultiheadAttention`` without W_O, padded keys masked; ``changed``: a mistake's steps."""
    step = _ATTEND | changed
    Q, K, V = (step["split"](x, num_heads) for x in step["QKV"](latents, memory, W_Q, W_K, W_V))
    scores = Q @ K.mT / step["scale"](Q, memory)                               # (b, h, n_q, n_k)
    weights = step["weights"](scores, step["keep"](memory_real, Q.shape[-2]))
    return step["out"](step["merge"](weights @ V), weights, {"W_Q": W_Q, "W_V": W_V})


def _attend(**changed) -> Callable:
    return partial(cross_attend_reference, **changed)


def _attend_cases() -> list[dict]:
    g = seeded(60)
    cases = []   # case 1: b = n_q = n_k = d = d_m, so every named mistake runs on it; two heads
    # of width 3, so d_head, d_m, 2 sqrt(d_head) and sqrt(d) all differ; case 2 tells the rest apart
    for b, n_q, n_k, d, d_m, h, lengths, dtype in [
            (6, 6, 6, 6, 6, 2, [2, 6, 1, 3, 5, 4], torch.float32),
            (2, 4, 6, 16, 10, 2, [6, 2], torch.float32),
            (2, 1, 5, 4, 4, 2, [3, 5], torch.float64), (4, 2, 9, 8, 6, 4, [3, 9, 2, 7], torch.float32)]:
        def w(rows, cols, dtype=dtype):
            return (2 * torch.randn(rows, cols, generator=g) / math.sqrt(rows)).to(dtype)
        cases.append({"latents": torch.randn(n_q, d, generator=g).to(dtype),
                      "memory": torch.randn(b, n_k, d_m, generator=g).to(dtype),
                      "memory_real": torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None],
                      "W_Q": w(d, d), "W_K": w(d_m, d), "W_V": w(d_m, d), "num_heads": h})
    return cases


_MASK_MISFIT = ("does not broadcast to the shape (..., n_q, n_k)", "memory_real does not fit the scores "
                "(b, h, n_q, n_k): padding hides keys in every head and query row, so (b, 1, 1, n_k).")
_TRANSPOSED = ("transposed: x @ W.T is nn.Linear's habit (its weight is (out, in)). Here the "
               "weights are (in, out), W_Q (d, d), W_K and W_V (d_m, d): multiply from the right.")
ATTEND_MISTAKES = [Mistake(wrong, hint) for hint, wrong in [
    ("padded memory positions were read: mask the scores with memory_real (True = real) before the "
     "softmax.", _attend(weights=lambda S, keep: S.softmax(-1))),
    ("the mask lay along the queries, (b, 1, n_k, 1): it hid rows (latents), not columns. Padding "
     "belongs to the keys: (b, 1, 1, n_k).", _attend(keep=lambda real, n_q: real[:, None, :, None])),
    ("the mask's batch axis met the scores' query axis, (1, 1, b, n_k): keep the batch first, "
     "(b, 1, 1, n_k).", _attend(keep=lambda real, n_q: real[None, None])),
    ("every sentence got the first sentence's mask (memory_real[0]): keep the batch, (b, 1, 1, n_k).",
     _attend(keep=lambda real, n_q: real[:1, None, None])),
    ("the mask is inverted: memory_real is True at the REAL positions, the ones that may be read.",
     _attend(keep=lambda real, n_q: ~real[:, None, None, :])),
    ("the memory was masked causally: every latent may read the whole input.", _attend(
        keep=lambda real, n_q: real[:, None, None, :] & torch.ones(n_q, real.shape[1]).tril().bool())),
    ("the keys and values came from the latents: that is the Perceiver's next step, self-attention. "
     "Here the input is read: K = memory W_K, V = memory W_V.",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: tuple(batched(L @ W, m) for W in (W_Q, W_K, W_V)))),
    ("the keys and values are swapped: K was made with W_V, and V with W_K.",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (batched(L @ W_Q, m), m @ W_V, m @ W_K))),
    ("the roles are swapped: Q came from the memory; the latents ask (Q = latents W_Q).",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (m @ W_Q, batched(L @ W_K, m), batched(L @ W_V, m)))),
    ("the latents asked without W_Q: learned as they are, the query still needs it (latents W_Q).",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (batched(L, m), m @ W_K, m @ W_V))),
    ("the values were the keys (memory W_K); V = memory W_V.",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (batched(L @ W_Q, m), m @ W_K, m @ W_K))),
    ("the softmax ran over dim -2, the latent queries: normalise each row, over the last dim.",
     _attend(weights=lambda S, keep: S.masked_fill(~keep, -math.inf).softmax(-2))),
    *((f"the scores were {how}: divide by sqrt(d_head), the width of one head's Q and K.",
       _attend(scale=scale)) for how, scale in [
        ("not scaled", lambda Q, memory: 1.0),
        ("divided by sqrt(d_m), the memory's width", lambda Q, memory: memory.shape[-1] ** 0.5),
        ("divided by d_head, not its square root (scaled twice? ah.scaled_dot_product_attention "
         "already scales)", lambda Q, memory: Q.shape[-1]),
        ("divided by sqrt(d), all heads' width", lambda Q, memory: (Q.shape[1] * Q.shape[-1]) ** 0.5),
        ("divided by sqrt(n_k), the memory's length", lambda Q, memory: memory.shape[-2] ** 0.5),
        ("divided by sqrt(n_q), the number of latents", lambda Q, memory: Q.shape[-2] ** 0.5),
        ("divided by sqrt(d) / h: the root covers the whole ratio, sqrt(d / h)",
         lambda Q, memory: (Q.shape[1] * Q.shape[-1]) ** 0.5 / Q.shape[1]),
        ("multiplied by sqrt(d_head)", lambda Q, memory: Q.shape[-1] ** -0.5)]),
    ("the output was divided by sqrt(d_head): the scale belongs to the scores, before the softmax.",
     _attend(merge=lambda o: merge_heads(o) / o.shape[-1] ** 0.5)),
    ("the heads were not split: split Q, K and V into h heads (ah.split_heads), then merge.",
     _attend(split=lambda x, h: split_heads(x, 1))),
    ("the heads were split by a reshape alone: reshape to (b, n, h, d_head), then transpose(1, 2).",
     _attend(split=lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1))),
    ("the heads were split as (b, n, d_head, h), every h-th feature: go through (b, n, h, d_head).",
     _attend(split=lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2))),
    ("the heads were merged by a reshape alone: transpose(1, 2) to (b, n_q, h, d_head) first.",
     _attend(merge=lambda o: o.reshape(o.shape[0], o.shape[2], -1))),
    ("the heads were left unmerged, (b, h, n_q, d_head): ah.merge_heads joins them into (b, n_q, d).",
     _attend(merge=lambda o: o)),
    *((f"the merged heads went through {name} again, as if it were a W_O: this exercise has no W_O. "
       "Return the heads' outputs merged.", _attend(out=lambda o, w, W, name=name: (o @ W[name], w)))
      for name in ("W_Q", "W_V")),
    ("the weights were averaged over the heads (torch's default): return each head's, (b, h, n_q, n_k).",
     _attend(out=lambda o, w, W: (o, w.mean(1)))),
    ("only head 0's weights were returned: return each head's, (b, h, n_q, n_k).",
     _attend(out=lambda o, w, W: (o, w[:, 0]))),
    (f"a weight was {_TRANSPOSED}",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (batched(L @ W_Q.T, m), m @ W_K, m @ W_V))),
    (f"the weights were {_TRANSPOSED}",
     _attend(QKV=lambda L, m, W_Q, W_K, W_V: (batched(L @ W_Q.T, m), m @ W_K.T, m @ W_V.T))),
    ("the padded memory rows were set to zero: a zero key scores 0, and exp(0) > 0. Mask with -inf.",
     lambda L, m, real, *W: cross_attend_reference(L, m * real[..., None], real, *W,
                                                   weights=lambda S, keep: S.softmax(-1))),
    ("the two results are swapped: return the output (b, n_q, d) first, then the weights.",
     lambda *args: cross_attend_reference(*args)[::-1]),
    ("the padded scores were set to 0 (masked_fill with 0, or times the mask): fill them with -inf.",
     _attend(weights=lambda S, keep: (S * keep).softmax(-1))),
    ("the mask came after the softmax: the rows no longer sum to 1. Mask the scores before it.",
     _attend(weights=lambda S, keep: S.softmax(-1) * keep)),
]]


@exercise("cross_attention.attend", "Perceiver-style multi-head cross-attention from W_Q, W_K, W_V: "
          "queries from a latent array shared by the batch, keys and values from the input, padded "
          "memory masked", hints=(
    "Section 1's formula per head (notebook 04): the latents ask, the memory answers. The latents "
    "are one (n_q, d) array for the whole batch: they need a batch axis before the heads are split. "
    "Padding hides columns of the weights (memory positions), never rows.",
    "Which of latents and memory makes Q, which K and V? latents W_Q (n_q, d) needs a batch axis "
    "(expand, or 1 and broadcasting). The scores are (b, h, n_q, n_k): over which axis does each "
    "row's softmax run? Which axes must memory_real (b, n_k) gain? Divide by sqrt(one head's width).",
    "Q, K, V = ...                      # (b, h, n, d_head) each, via ah.split_heads: who makes which?\n"
    "scores = ...                       # (b, h, n_q, n_k), scaled\n"
    "scores = ...                       # padded memory positions at -inf: the mask (b, 1, 1, n_k)\n"
    "weights = ...                      # (b, h, n_q, n_k): each row sums to 1\n"
    "return ..., weights                # the heads' outputs merged: (b, n_q, d)"))
def check_cross_attend(cross_attend: Callable) -> CheckResult:
    """Exercise: ``cross_attend(latents (n_q, d), memory (b, n_k, d_m), memory_real (b, n_k), W_Q (d, d),
    W_K (d_m, d), W_V (d_m, d), num_heads) -> (output (b, n_q, d), weights (b, h, n_q, n_k))``."""
    return check_function(
        cross_attend, cross_attend_reference, _attend_cases(), what="cross_attend",
        output_names=("the output", "the weights"), mistakes=ATTEND_MISTAKES,
        nan_hint="a row of -inf scores gives NaN: is the softmax over the memory, the mask True = real?",
        error_hints=[("must be 3-D (b, n, d_model)", "latents W_Q is (n_q, d), one array for the "
                      "whole batch: give it a batch axis (expand, or [None]) before ah.split_heads."),
                     ("must match the size of tensor", "the shapes do not fit the scores (b, h, n_q, "
                      "n_k): which of latents and memory makes the queries, which axes must "
                      "memory_real gain?"), _MASK_MISFIT])


class _DecoderLayer(DecoderLayer):
    """A post-norm ``DecoderLayer``, seeded weights, a one-line repr for the checker's messages."""

    def __init__(self, d_model, num_heads, memory_dim, *, generator, dtype):
        super().__init__(d_model, num_heads, 2 * d_model, norm_first=False, memory_dim=memory_dim)
        with torch.no_grad():
            for name, p in self.named_parameters():
                noise = torch.randn(p.shape, generator=generator)
                p.copy_(noise / math.sqrt(p.shape[-1]) if "norm" not in name
                        else 1 + noise if name.endswith("weight") else 0.1 * noise)
        self.to(dtype).requires_grad_(False)

    def __repr__(self) -> str:
        return (f"DecoderLayer(d_model={self.d_model}, num_heads={self.self_attn.num_heads}, "
                f"memory_dim={self.cross_attn.kdim}, post-norm)")


def decode_layer_reference(layer, y, memory, memory_real):
    """``layer``'s causal output ``(b, T, d)`` for all of ``y``, padded memory masked."""
    return layer(y, memory, memory_padding=memory_real)


_FORMS = {  # a block with its residual and LayerNorm: post-norm is this layer's
    "post": lambda norm, x, block: norm(x + block(x)),
    "pre": lambda norm, x, block: x + block(norm(x)),
    "pre and post": lambda norm, x, block: norm(x + block(norm(x))),
    "norm outside": lambda norm, x, block: norm(x) + block(x),
    "no residual": lambda norm, x, block: norm(block(x)),
    "no norm": lambda norm, x, block: x + block(x),
}


def _blocks(cross="post", ff="post", cross_norm="norm2", ff_norm="norm3"):
    def step(layer, x, y_t, cross_attention):
        x = _FORMS[cross](getattr(layer, cross_norm), x, cross_attention)
        return _FORMS[ff](getattr(layer, ff_norm), x, layer.feed_forward)
    return step


def _scores(q, K):
    return q @ K.mT / math.sqrt(K.shape[-1])


def _sdpa(q, K, V, keep, scale=None):
    return scaled_dot_product_attention(q, K, V, keep, scale=scale)[0]


_DECODE = {  # exercise 2's answer in steps; each named mistake below replaces one
    "split": split_heads,                                        # (b, n, d) -> (b, h, n, d_head)
    "query": lambda ca, x_t: ca.q_proj(x_t),
    "values": lambda ca, memory: ca.v_proj(memory),
    "keep": lambda real, t: real[:, None, None, :],                          # (b, 1, 1, n_m)
    "attend": _sdpa,
    "merge": lambda ca, o: ca.out_proj(merge_heads(o)),
    "step": _blocks(),               # (layer, x_t, y_t, cross-attention) -> the step's output
}


def _decode_with(layer, y, memory, memory_real, **changed):
    part = _DECODE | changed
    ca, h = layer.cross_attn, layer.cross_attn.num_heads
    K_m, V_m = part["split"](ca.k_proj(memory), h), part["split"](part["values"](ca, memory), h)
    x_all = layer.norm1(y + layer.self_attn(y, y, y, causal_mask(y.shape[1]))[0])  # the stub's x_t
    outputs = []
    for t in range(y.shape[1]):
        def cross_attention(z, t=t):
            q = part["split"](part["query"](ca, z), h)                         # (b, h, 1, d_head)
            return part["merge"](ca, part["attend"](q, K_m, V_m, part["keep"](memory_real, t)))
        outputs.append(part["step"](layer, x_all[:, t:t + 1], y[:, t:t + 1], cross_attention))
    return torch.cat(outputs, 1)


def _layer_cases() -> list[dict]:
    g = seeded(63)
    cases = []
    for b, T, n_m, d, h, d_m, lengths, dtype in [
            (2, 4, 5, 8, 2, 6, [5, 2], torch.float32), (1, 1, 3, 4, 1, 4, [3], torch.float32),
            (3, 5, 6, 12, 3, 8, [6, 1, 4], torch.float64), (2, 6, 4, 8, 4, 8, [1, 4], torch.float32)]:
        layer = _DecoderLayer(d, h, d_m, generator=g, dtype=dtype)
        y, memory = torch.randn(b, T, d, generator=g), torch.randn(b, n_m, d_m, generator=g)
        cases.append({"layer": layer, "y": y.to(dtype), "memory": memory.to(dtype),
                      "memory_real": torch.arange(n_m)[None, :] < torch.tensor(lengths)[:, None]})
    return cases


@contextlib.contextmanager
def _memory_projected_once(inputs: dict):
    """The lesson: one query per step, and no (b, n_m, d) projection equal to one made before."""
    layer = inputs["layer"]
    projected = (*inputs["memory"].shape[:2], layer.d_model)           # (b, n_m, d): K or V
    queries, made = [], []

    def count(t, call):
        if tuple(t.shape) == projected and call in ("linear", "matmul", "__matmul__"):
            made.append(t)

    hook = layer.cross_attn.q_proj.register_forward_hook(
        lambda module, args, output: queries.append(args[0].shape[-2]))
    try:
        with AllocationWatch(count):
            yield
    finally:
        hook.remove()
    if max(queries, default=1) > 1:
        raise Refused(
            f"cross_attn.q_proj ran on {max(queries)} target positions in one call: not step "
            "by step.\nHint: returning layer(y, memory, memory_padding=memory_real) does that. A "
            "generating decoder has only x_t at step t: make step t's query from x_t, in the loop.")
    if len(made) > 2 and any(torch.equal(t, p) for i, t in enumerate(made) for p in made[:i]):
        raise Refused(
            f"the memory's keys and values were computed {len(made)} times in {inputs['y'].shape[1]} "
            "decoding steps.\nHint: K and V do not change while the decoder writes (calling "
            "layer.cross_attn(x_t, memory, memory, mask) in the loop makes them again). Project once.")


def _ff(layer, x):                                      # the right feed-forward block
    return layer.norm3(x + layer.feed_forward(x))


def _post(first, last):                  # the blocks in the wrong order: feed-forward first
    return lambda layer, x, y_t, cross: _FORMS["post"](
        getattr(layer, last), _FORMS["post"](getattr(layer, first), x, layer.feed_forward), cross)


DECODE_MISTAKES = [Mistake(partial(_decode_with, **changed), hint) for hint, changed in [
    ("padded memory positions were read: mask the cross-attention with memory_real (True = real).",
     {"keep": lambda real, t: None}),
    *(("a block was written pre-norm, x + block(norm(x)) (or norm(x + block(norm(x)))); this layer "
       "is post-norm: is its LayerNorm before the residual sum or after?", {"step": _blocks(cross, ff)})
      for cross in ("post", "pre", "pre and post") for ff in ("post", "pre", "pre and post")
      if (cross, ff) != ("post", "post")),
    ("the scores were multiplied by the mask: a score of 0 is not -inf, so padded keys get weight.",
     {"attend": lambda q, K, V, keep: (_scores(q, K) * keep).softmax(-1) @ V}),
    ("the mask came after the softmax: the rows no longer sum to 1. Mask the scores before it.",
     {"attend": lambda q, K, V, keep: _scores(q, K).softmax(-1) * keep @ V}),
    ("the memory was masked causally: each step sees all real memory.",
     {"keep": lambda real, t: real[:, None, None, :] & (torch.arange(real.shape[1]) <= t)}),
    ("the memory made the queries: the decoder asks (q from x_t), the memory answers.",
     {"attend": lambda q, K, V, keep: _sdpa(K, q, q, None)}),
    ("the cross-attention's heads were merged but not sent through out_proj.",
     {"merge": lambda ca, o: merge_heads(o)}),
    ("out_proj came after norm2: it ends the cross-attention block, on the merged heads, before the "
     "residual sum and norm2.", {"merge": lambda ca, o: merge_heads(o), "step": lambda layer, x, y, c:
                                 _ff(layer, layer.cross_attn.out_proj(layer.norm2(x + c(x))))}),
    ("the residual is missing: norm2 got the cross-attention's output alone, and x_t was lost.",
     {"step": _blocks(cross="no residual")}),
    ("the cross-attention's query came from y, the state before the self-attention block; q comes "
     "from x_t.", {"step": lambda layer, x, y_t, cross: _ff(layer, layer.norm2(x + cross(y_t)))}),
    ("the query lost q_proj's bias (x_t @ q_proj.weight.T): call cross_attn.q_proj(x_t).",
     {"query": lambda ca, x_t: x_t @ ca.q_proj.weight.T}),
    ("the scores were scaled twice: ah.scaled_dot_product_attention already divides by sqrt(d_head).",
     {"attend": lambda q, K, V, keep: _sdpa(q / q.shape[-1] ** 0.5, K, V, keep)}),
    ("the scores were not scaled by 1/sqrt(d_head), the width of one head.",
     {"attend": partial(_sdpa, scale=1.0)}),
    ("the scores were neither scaled by 1/sqrt(d_head) nor masked: padded positions were read.",
     {"attend": lambda q, K, V, keep: _sdpa(q, K, V, None, scale=1.0)}),
    ("the softmax ran over dim -2, the one query of step t: normalise over the last dim.",
     {"attend": lambda q, K, V, keep: _scores(q, K).masked_fill(~keep, -math.inf).softmax(-2) @ V}),
    ("the scale is 1/sqrt(d_head), the width of one head, not 1/sqrt(d_model).",
     {"attend": lambda q, K, V, keep: _sdpa(q, K, V, keep, (q.shape[1] * q.shape[-1]) ** -0.5)}),
    ("the LayerNorm went on x_t alone, not on the residual sum.",
     {"step": _blocks(cross="norm outside")}),
    ("the heads were not split: attend per head (ah.split_heads), then merge.",
     {"split": lambda x, h: split_heads(x, 1)}),
    ("the heads were split by a reshape alone: reshape to (b, n_m, h, d_head), then transpose(1, 2).",
     {"split": lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1)}),
    ("the sum after the cross-attention was not normalised: norm2 is next.",
     {"step": _blocks(cross="no norm")}),
    ("the cross-attention's sum went through norm1, the self-attention's; its own is norm2.",
     {"step": _blocks(cross_norm="norm1")}),
    ("the feed-forward's output must be ADDED to x_t (the residual), then normalised.",
     {"step": _blocks(ff="no residual")}),
    ("the feed-forward's sum went through norm2; each block has its own: norm3 for the feed-forward.",
     {"step": _blocks(ff_norm="norm2")}),
    ("the sum after the feed-forward was not normalised: post-norm ends each block with its "
     "LayerNorm, norm3 here.", {"step": _blocks(ff="no norm")}),
    *(("the blocks are in the wrong order: cross-attention comes first, then the feed-forward.",
       {"step": _post(first, last)}) for first, last in (("norm3", "norm2"), ("norm2", "norm3"))),
    ("the values were the keys: V_m reused K_m. V = memory W_V, from cross_attn.v_proj.",
     {"values": lambda ca, memory: ca.k_proj(memory)}),
    ("the cross-attention's sum went through norm3, the feed-forward's; its own is norm2.",
     {"step": _blocks(cross_norm="norm3")}),
    ("the cross-attention's residual came from y_t, before the self-attention block: add to x_t.",
     {"step": lambda layer, x, y_t, cross: _ff(layer, layer.norm2(y_t + cross(x)))}),
    ("the feed-forward read x_t from before the cross-attention block; it reads that block's output.",
     {"step": lambda layer, x, y, c: layer.norm3(layer.norm2(x + c(x)) + layer.feed_forward(x))}),
    ("the feed-forward block is missing: after norm2, x_t goes through layer.feed_forward, its "
     "residual and norm3.", {"step": lambda layer, x, y_t, cross: layer.norm2(x + cross(x))}),
    ("the feed-forward's residual added x_t from before the cross-attention block; add its output "
     "to the x_t it read, norm2's output.", {"step": lambda layer, x, y_t, cross: layer.norm3(
         x + layer.feed_forward(layer.norm2(x + cross(x))))}),
    ("the memory mask is inverted: memory_real is True at the REAL positions, the ones to read.",
     {"keep": lambda real, t: ~real[:, None, None, :]}),
    ("the memory mask has shape (b, 1, n_m): against scores (b, h, 1, n_m) its batch axis meets "
     "the heads axis. Which axes must memory_real gain?", {"keep": lambda real, t: real[:, None, :]}),
]]


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
    """Exercise 2: ``decode_layer(layer, y, memory, memory_real) -> (b, T, d)``, step by step."""
    return check_function(decode_layer, decode_layer_reference, _layer_cases(),
                          what="decode_layer", output_names=("the outputs",),
                          mistakes=DECODE_MISTAKES, watch=_memory_projected_once,
                          error_hints=[_MASK_MISFIT])
