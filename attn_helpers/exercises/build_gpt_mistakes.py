"""The known wrong answers of notebook 10's exercises, computed with the reference's weights:
each ``*_variant(...)`` returns a function that gives what one mistake gives (``"right"``: the
correct answer). The checkers in :mod:`attn_helpers.exercises.build_gpt` name the mistake when a
learner's output equals one of these."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention
from ..lessons import build_gpt as bg
from ..masks import causal_mask

__all__ = ["ATTENTION_MISTAKES", "BLOCK_MISTAKES", "MODEL_MISTAKES", "TRAIN_MISTAKES",
           "GENERATE_MISTAKES", "attention_variant", "block_variant", "model_variant", "train_variant",
           "generate_variant"]

#: The mistake generators give the right answer with their default arguments: refused while a
#: learner's object runs (core's borrowed-code check).
REFUSED_WHILE_CHECKING = ("attention_variant", "block_variant", "model_variant", "train_variant",
                          "generate_variant")


def attention_variant(ref: bg.CausalSelfAttention, *, mask="causal", out_proj=True,
                      scale="d_h", cache_use="ok", softmax_dim=-1) -> Callable:
    """``forward(x, cache=None)`` of the attention with one mistake, with ``ref``'s weights. The
    head split and merge are given to the learner (``ah.split_heads``, ``ah.merge_heads``), so
    their mistakes are not among these."""

    def run(x, cache=None):
        b, n, d = x.shape
        h = ref.num_heads
        q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in ref.qkv(x).split(d, dim=-1))
        if cache is not None:
            if cache_use == "kv_swapped":
                cache.append(v, k)
            else:
                cache.append(k, v)
            if cache_use != "not_read":
                k, v = cache.keys, cache.values
        total = k.shape[-2]
        start = total - n
        allowed = {"causal": lambda: causal_mask(total)[start:], "none": lambda: None,
                   "upper": lambda: causal_mask(total).T[start:],
                   "not_offset": lambda: causal_mask(total)[:n],
                   "no_diagonal": lambda: torch.ones(total, total, dtype=torch.bool).tril(-1)[start:],
                   "cache_unmasked": lambda: None if cache is not None else causal_mask(total),
                   "prompt_only": lambda: causal_mask(total)[start:] if start == 0 else None,
                   "multiplied": lambda: None}[mask]()
        c = {"d_h": None, "d_model": 1 / math.sqrt(d), "none": 1.0}[scale]
        if mask == "multiplied" or softmax_dim != -1:      # written out: scores * mask, dim=-2
            scores = q @ k.transpose(-2, -1) * (c or 1 / math.sqrt(d // h))
            kept = causal_mask(total)[start:]
            scores = (scores * kept if mask == "multiplied"
                      else scores.masked_fill(~kept, float("-inf")))
            out = torch.softmax(scores, dim=softmax_dim) @ v
        else:
            out, _ = scaled_dot_product_attention(q, k, v, allowed, scale=c)
        out = out.transpose(1, 2).reshape(b, n, d)
        return ref.out(out) if out_proj else out

    return run


def block_variant(ref: bg.Block, kind: str) -> Callable:
    """``forward(x, cache=None)`` of the block with one mistake, with ``ref``'s parts."""
    ff, n1, n2 = ref.ff, ref.norm1, ref.norm2

    def run(x, cache=None):
        def attn(y):
            return ref.attn(y, None if kind == "cache_not_passed" else cache)

        if kind == "post_norm":
            x = n1(x + attn(x))
            return n2(x + ff(x))
        if kind == "no_attn_residual":
            x = attn(n1(x))
            return x + ff(n2(x))
        if kind == "no_ff_residual":
            x = x + attn(n1(x))
            return ff(n2(x))
        if kind == "no_norm":
            x = x + attn(x)
            return x + ff(x)
        if kind == "same_norm":
            x = x + attn(n1(x))
            return x + ff(n1(x))
        if kind == "norms_swapped":
            x = x + attn(n2(x))
            return x + ff(n1(x))
        if kind.startswith("residual_from_normed"):       # both sub-layers, or _attn / _ff alone
            h = n1(x)
            x = (h if kind != "residual_from_normed_ff" else x) + attn(h)
            h = n2(x)
            return (h if kind != "residual_from_normed_attn" else x) + ff(h)
        if kind == "parallel":
            return x + attn(n1(x)) + ff(n2(x))
        if kind == "ff_first":
            x = x + ff(n2(x))
            return x + attn(n1(x))
        if kind in ("right", "cache_not_passed"):
            x = x + attn(n1(x))
            return x + ff(n2(x))
        raise ValueError(kind)

    return run


def model_variant(ref: bg.GPT, kind: str) -> Callable:
    """``forward(tokens, start=0, caches=None)`` of the model with one mistake."""
    d = ref.cfg.d_model

    def run(tokens, start=0, caches=None):
        n = tokens.shape[1]
        s = 0 if kind == "positions_not_offset" else start
        tok = ref.token_embedding(tokens)
        pos = {"positions_from_tokens": lambda: ref.position_embedding(tokens),
               "positions_from_one": lambda: ref.position_embedding(torch.arange(s + 1, s + n + 1)),
               "no_positions": lambda: 0}.get(
                   kind, lambda: ref.position_embedding(torch.arange(s, s + n)))()
        x = tok * math.sqrt(d) + pos if kind == "token_scaled" else tok + pos
        if kind == "scaled_embeddings":
            x = x * math.sqrt(d)
        blocks = {"first_block_only": ref.blocks[:1], "no_blocks": []}.get(kind, ref.blocks)
        for i, block in enumerate(blocks):
            x = block(x, None if caches is None or kind == "caches_not_passed" else caches[i])
        logits = ref.head(x if kind == "no_final_norm" else ref.norm(x))
        if kind == "log_softmax_output":
            return torch.log_softmax(logits, dim=-1)
        return torch.softmax(logits, dim=-1) if kind == "softmax_output" else logits

    return run


def train_variant(kind: str) -> Callable:
    def step(model: nn.Module, optimizer, chunk):
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        if kind == "not_shifted":
            targets = inputs
        elif kind == "whole_chunk":
            inputs = targets = chunk
        elif kind == "shifted_backwards":
            inputs, targets = chunk[:, 1:], chunk[:, :-1]
        logits = model(inputs)
        if kind == "softmax_first":
            logits = torch.softmax(logits, dim=-1)
        if kind == "nll_on_logits":
            loss = F.nll_loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        elif kind == "last_only":
            logits, targets = logits[:, -1:], targets[:, -1:]
        if kind == "sum_over_positions":                  # summed over positions, mean over batch
            loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(1).mean()
        elif kind != "nll_on_logits":
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   reduction="sum" if kind == "sum" else "mean")
        if kind != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        if kind != "no_step":
            optimizer.step()
        return loss.item()

    return step


def _advance(kind: str, tokens, nxt, caches, use_cache: bool, T: int):
    """What the next call gets, ``(new, start, caches)``, with ``kind``'s mistake."""
    L = tokens.shape[1]
    if use_cache and L <= T:                          # the cache has room
        if kind == "positions_restart":
            return nxt, 0, caches
        if kind == "start_is_length":
            return nxt, L, caches
        if kind == "whole_sequence_cached":
            return tokens, caches[0].length, caches
        return nxt, L - 1, caches
    if kind == "crop_first":                          # past T (or no cache): the window
        return tokens[:, :T], 0, None
    if kind == "crop_short":
        return tokens[:, -(T - 1):], 0, None
    return tokens[:, -T:], 0, None


def generate_variant(kind: str) -> Callable:
    def generate(model, prompt, steps, temperature, top_k, use_cache, generator):
        T = model.cfg.context
        tokens = prompt
        caches = model.new_caches() if use_cache else None
        new, start = prompt, 0
        for _ in range(steps):
            logits = model(new, start, caches)
            logits = logits[:, 0] if kind == "first_position" else logits[:, -1]
            if kind == "temperature_times":
                logits = logits * temperature
            elif kind != "temperature_after_softmax":
                logits = logits / temperature
            if top_k is not None and kind != "no_top_k":
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                if kind == "top_k_plus_one" and top_k < logits.shape[-1]:
                    kth = logits.topk(top_k + 1, dim=-1).values[:, -1:]
                if kind == "top_k_off_by_one":
                    logits = logits.masked_fill(logits <= kth, float("-inf"))
                    logits = torch.where(torch.isinf(logits).all(-1, keepdim=True),
                                         torch.zeros_like(logits), logits)
                else:
                    logits = logits.masked_fill(logits < kth, float("-inf"))
            if kind == "top_k_indices" and top_k is not None:   # correct too: sample among k
                values, indices = logits.topk(top_k, dim=-1)
                pick = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
                nxt = indices.gather(-1, pick)
            else:
                probs = torch.softmax(logits, dim=-1)
                if kind == "temperature_after_softmax":
                    probs = probs / temperature
                if kind == "greedy":
                    nxt = probs.argmax(-1, keepdim=True)
                else:
                    nxt = torch.multinomial(probs, 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            new, start, caches = _advance(kind, tokens, nxt, caches, use_cache, T)
            if kind == "start_frozen" and use_cache and caches is not None:
                start = prompt.shape[1]
        return tokens

    return generate


# The hints, one per mistake, in a module of their own.
from .build_gpt_hints import (  # noqa: E402
    ATTENTION_MISTAKES,
    BLOCK_MISTAKES,
    GENERATE_MISTAKES,
    MODEL_MISTAKES,
    TRAIN_MISTAKES,
)
