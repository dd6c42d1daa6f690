"""Checkers for notebook 10 (build a GPT): the learner's causal self-attention, pre-norm block,
model, training step, training loop and generation, each run against the reference of
:mod:`attn_helpers.lessons.build_gpt` on the same weights and random numbers.

A module exercise gives ``__init__`` and asks for ``forward``; the checker loads the reference's
weights into the learner's module, with reference parts where they are not the exercise (the
block gets the reference attention, the model the reference blocks). Its outputs are compared,
cached calls included, then its gradients after one backward. Each exercise has one table of
known mistakes, ``(kind, hint)``: ``*_variant(..., kind)`` computes what that mistake gives, and
a learner's answer that gives the same gets the hint.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention
from ..kv_cache import KVCache
from ..lessons import build_gpt as bg
from ..masks import causal_mask
from ..multihead import merge_heads, split_heads
from .core import (
    CheckResult,
    Mistake,
    Refused,
    check_function,
    detached_parts,
    gradient_mismatch,
    seeded,
)
from .workflow import exercise
from .workflow import passed as passed_key

__all__ = ["ATTENTION_MISTAKES", "BLOCK_MISTAKES", "GENERATE_MISTAKES", "LOOP_MISTAKES",
           "MODEL_MISTAKES", "SCHEDULE_MISTAKES", "TRAIN_MISTAKES", "attention_variant",
           "block_variant", "check_attention", "check_block", "check_generate", "check_model",
           "check_train", "check_train_step", "generate_variant", "loop_variant", "model_variant",
           "passed", "pieces", "schedule_variant", "train_variant"]

KEYS = ("attention", "block", "model", "train_step", "train", "generate")


def passed(name: str) -> bool:
    """Did the learner's own ``name`` (one of :data:`KEYS`) pass its checker in this kernel?"""
    return passed_key(f"build_gpt.{name}")


def pieces(learner: dict, solutions: dict) -> tuple[dict, str]:
    """The learner's pieces where they passed, the reference solutions elsewhere, and a line
    saying which ran. ``learner``/``solutions``: ``{"model": cls, "train_step": fn, ...}``; the
    model counts as the learner's when attention, block and model all passed."""
    chosen, words = {}, []
    for name in learner:
        mine = passed(name) and (name != "model" or all(passed(k) for k in KEYS[:3]))
        chosen[name] = learner[name] if mine else solutions[name]
        words.append(f"{'your' if mine else 'the reference'} {name.replace('_', ' ')}")
    return chosen, "Training with " + ", ".join(words) + "."


# --- the module exercises: build, run in pieces through a cache, compare gradients ---------------


def _build(cls, args: tuple, reference: nn.Module, what: str, swap: dict):
    """The learner's module ``cls(*args)`` holding the reference's weights, or a CheckResult."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return CheckResult(False, f"Not yet: {what} should be an nn.Module class, got "
                                  f"{type(cls).__name__}.")
    try:
        module = cls(*args)
        for name, part in swap.items():
            setattr(module, name, copy.deepcopy(part))
        module.load_state_dict(reference.state_dict())
    except NotImplementedError:
        return CheckResult(False, f"{what} is not implemented yet.")
    except Exception as exc:
        return CheckResult(False, f"Not yet: building {what}{args} and loading the reference's "
                                  f"weights failed ({type(exc).__name__}: {exc}). Keep the stub's "
                                  "__init__: the checker relies on its layer names.")
    return module.eval()


def _randomise(module: nn.Module, seed: int, std: float = 0.5) -> nn.Module:
    """Weights far from the tiny training init, so every mistake shows in the output."""
    g = seeded(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() > 1 else 0.3))
    return module.eval()


def _calls(forward: Callable, new_cache: Callable) -> Callable:
    """``run(x, split, step, start=0)``: ``split`` 0, one call ``forward(x, start, None)``; else a
    cache ``new_cache(x)``, the prompt ``x[:, :split]`` at 0, then ``step`` tokens a call at their
    offsets. The outputs are concatenated along the positions."""
    def run(x, split, step, start=0):
        if not split:
            return forward(x, start, None)
        cache, ends = new_cache(x), [split, *range(split + step, x.shape[1], step), x.shape[1]]
        outs = [forward(x[:, s:e], s, cache) for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        return None if any(o is None for o in outs) else torch.cat(outs, dim=1)

    return run


def _check_module(cls, what: str, sizes: list, make, forward: Callable, new_cache: Callable,
                  cases: Callable, variant: Callable, mistakes: list, *, swap: tuple = (),
                  error_hints: tuple = ()) -> CheckResult:
    """``cls`` against the reference ``make(*args, seed)`` at each ``(args, seed)`` of ``sizes``
    (``swap``: the reference parts put inside it), on ``cases(args, seed)`` run by :func:`_calls`
    with ``forward(module, x, start, cache)``; then one backward through the last size's: a
    detached query, key or residual is named."""
    for args, seed in sizes:
        ref = make(*args, seed)
        module = _build(cls, args, ref, what, {name: getattr(ref, name) for name in swap})
        if isinstance(module, CheckResult):
            return module

        def run(m):
            return _calls(lambda x, start, cache: forward(m, x, start, cache), new_cache)

        result = check_function(
            run(module), run(ref), cases(args, seed), what=what,
            output_names=("the outputs of every call",),
            mistakes=[Mistake(run(variant(ref, kind)), hint) for kind, hint in mistakes],
            error_hints=[*error_hints, ("positional argument", "keep the stub's signature of "
                                        "forward, and hand the cache on.")])
        if not result:
            return result
    count = len(cases(args, seed))
    if len(sizes) > 1:
        result = CheckResult(True, f"Passed: {what} matches the reference on all "
                                   f"{count * len(sizes)} cases ({count} cases at each of "
                                   f"{len(sizes)} model sizes), edge cases included.")
    x = next(iter(cases(args, seed)[1].values()))
    wrong = gradient_mismatch(module, ref, lambda m, x: forward(m, x, 0, None), x)
    parts = detached_parts(wrong, next((name for name in wrong if name.endswith("qkv.weight")), ""))
    if parts:
        why = (f"the gradient at qkv's {' and '.join(parts)} rows is wrong: was the "
               f"{' or the '.join(parts)} detached (detach(), .data, torch.no_grad())? The output "
               "is the same, but training would never change its projection")
    elif what == "Block" and list(wrong) == ["x"]:
        why = ("the gradient at the block's input x is wrong while every weight's is right: was "
               "the residual detached (x.detach() + ...)? The output is the same, but the "
               "gradient no longer flows down the residual stream to the blocks below")
    elif wrong:
        why = (f"the gradients at {', '.join(wrong)} differ from the reference's: was part of "
               "the computation detached, or done under torch.no_grad()?")
    else:
        return CheckResult(True, result.message.removesuffix(".") + ", and so are its gradients "
                                                                     "after one backward.")
    return CheckResult(False, f"Not yet: {what} gives the right outputs, but after one backward "
                              f"{why}.")


def _sequences(d: int, seed: int) -> list[dict]:
    """``x (b, n, d)``, run by :func:`_calls` in pieces ``split``, ``step`` (0: one call)."""
    g = seeded(seed)
    return [{"x": torch.randn(b, n, d, generator=g), "split": split, "step": step}
            for b, n, split, step in [(1, 5, 0, 0), (2, 7, 0, 0), (3, 1, 0, 0), (2, 9, 4, 1),
                                      (2, 8, 3, 5), (1, 12, 5, 3), (2, 6, 1, 1)]]


# --- 1. causal multi-head self-attention with a KV cache -----------------------------------------


def attention_variant(ref: bg.CausalSelfAttention, kind: str = "right") -> Callable:
    """``forward(x, cache=None)`` with ``ref``'s weights and ``kind``'s mistake. The head split and
    merge are given to the learner, so their mistakes are not among these."""
    def run(x, cache=None):
        b, n, d = x.shape
        q, k, v = (split_heads(t, ref.num_heads) for t in ref.qkv(x).split(d, dim=-1))
        if cache is not None:
            cache.append(*((v, k) if kind == "kv_swapped" else (k, v)))
            if kind != "not_read":
                k, v = cache.keys, cache.values
        start = k.shape[-2] - n
        causal = causal_mask(start + n)
        mask = {"no_mask": None, "upper": causal.T[start:], "not_offset": causal[:n],
                "no_diagonal": causal.tril(-1)[start:],
                "cache_unmasked": None if cache is not None else causal,
                "prompt_only": None if start else causal}.get(kind, causal[start:])
        scale = {"scale_d_model": 1 / math.sqrt(d), "no_scale": 1.0}.get(kind)
        if kind in ("multiplied", "softmax_over_queries"):        # the softmax written out
            scores = q @ k.mT / math.sqrt(d // ref.num_heads)
            scores = scores * mask if kind == "multiplied" else scores.masked_fill(~mask, -math.inf)
            out = scores.softmax(dim=-1 if kind == "multiplied" else -2) @ v
        else:
            out, _ = scaled_dot_product_attention(q, k, v, mask, scale=scale)
        return merge_heads(out) if kind == "no_out_proj" else ref.out(merge_heads(out))

    return run


ATTENTION_MISTAKES = [
    ("cache_unmasked", "the mask is left out when there is a cache, as if a cached call always "
     "brought one token (notebook 05's step). Here the prompt arrives as n > 1 tokens at start 0 with "
     "a cache, and the n new queries must not see each other's future: mask with a cache too."),
    ("prompt_only", "only the prompt (start = 0) was masked, as if every later cached call brought "
     "one token: a later call can bring a chunk of several new tokens too, and each must not see the "
     "ones after it. Mask every call, at its offset."),
    ("no_mask", "no causal mask, so the future leaks: new query i must not see the positions after "
     "its own, start + i (hint 2 says how to build the mask)."),
    ("upper", "the mask is upside down: causal_mask(n) is True on and below the diagonal (a query "
     "sees its past); you let each query see its future."),
    ("not_offset", "the mask is not offset by start: with start positions in the cache, new query i "
     "sits at position start + i and sees keys 0..start+i: which rows of a causal mask of size start "
     "+ n are those? (torch's is_causal=True aligns its mask top-left: this mistake.)"),
    ("not_read", "the cache is not appended to or not read: the new queries saw only the new keys, "
     "not the start earlier ones the cache holds: every call adds its keys and values to the cache "
     "and attends over all start + n of them."),
    ("kv_swapped", "k and v are swapped in the cache: cache.append(k, v) takes the keys first, then "
     "the values."),
    ("no_out_proj", "W_O is missing: the merged heads go through self.out."),
    ("scale_d_model", "the scores are scaled by 1/sqrt(d_model); each head's scores use its own size, "
     "1/sqrt(d_h) with d_h = d / h."),
    ("no_scale", "the scores are not scaled: divide q k^T by sqrt(d_h) (the course's attention step "
     "does it for you)."),
    ("multiplied", "the scores were multiplied by the mask: a 0 score still gets weight e^0 > 0, so "
     "the future leaks. Set the masked scores to -inf before the softmax (masked_fill), or pass the "
     "mask to the course's attention step."),
    ("no_diagonal", "the mask hides each query's own position: new query i may see the keys up to AND "
     "including its own, start + i, so the diagonal stays open (the first position would otherwise "
     "see nothing)."),
    ("softmax_over_queries", "the softmax ran over dim=-2, the queries: each query's weights over the "
     "keys must sum to 1, so normalise over the last axis, dim=-1."),
]


@exercise("build_gpt.attention", "causal self-attention with a KV cache, at an offset", hints=(
    "Without a cache this is the causal multi-head attention of notebooks 04 and 05. With a "
    "cache that already holds `start` positions, the n new tokens sit at positions "
    "start..start+n-1: add their keys and values to the cache, then let new query i see every "
    "cached key up to its own position, start + i.",
    "Read start before appending (the stub does). With a cache, cache.append(k, v), then k and v "
    "are cache.keys and cache.values, (b, h, start + n, d_h). The mask has one row per new query "
    "and one column per visible key, (n, start + n). New query i is position start + i in the "
    "text: which rows of a square causal mask describe exactly these queries?",
    "if cache is not None:\n"
    "    ...                                 # append k and v, then read every cached key and value\n"
    "mask = ...                              # (n, start + n): new query i sees keys 0..start+i\n"
    "out, _ = ah.scaled_dot_product_attention(q, k, v, mask)\n"
    "return self.out(ah.merge_heads(out))   # the heads side by side, then W_O"))
def check_attention(cls) -> CheckResult:
    """Exercise: ``cls(d_model, num_heads)``, the stub's ``__init__``; ``forward(x (b, n, d),
    cache=None) -> (b, n, d)``, causal; with a cache holding ``start`` positions, it appends the
    new keys and values, and new query ``i`` sees keys ``0..start+i``."""
    return _check_module(
        cls, "CausalSelfAttention", [((16, 4), 101), ((12, 2), 102), ((8, 1), 103)],
        lambda d, h, seed: _randomise(bg.CausalSelfAttention(d, h), seed),
        lambda m, x, start, cache: m(x, cache), lambda x: KVCache(x.shape[1]),
        lambda args, seed: _sequences(args[0], seed), attention_variant, ATTENTION_MISTAKES,
        error_hints=[("does not broadcast", "the mask must be (n, start + n): one row per new "
                      "query, one column per visible key. If start was read after cache.append, "
                      "len(cache) already counts the n new tokens: read start = len(cache) before "
                      "appending (the stub does), then append.")])


# --- 2. the pre-norm block -----------------------------------------------------------------------


def block_variant(ref: bg.Block, kind: str = "right") -> Callable:
    """``forward(x, cache=None)`` with ``ref``'s parts and ``kind``'s mistake."""
    n1, n2, ff = ref.norm1, ref.norm2, ref.ff

    def run(x, cache=None):
        def attn(y):
            return ref.attn(y, None if kind == "cache_not_passed" else cache)

        if kind == "post_norm":
            x = n1(x + attn(x))
            return n2(x + ff(x))
        if kind == "parallel":
            return x + attn(n1(x)) + ff(n2(x))
        if kind == "ff_first":
            x = x + ff(n2(x))
            return x + attn(n1(x))
        na, nf = {"no_norm": (nn.Identity(), nn.Identity()), "same_norm": (n1, n1),
                  "norms_swapped": (n2, n1)}.get(kind, (n1, n2))
        h = na(x)
        x = {"no_attn_residual": 0, "residual_from_normed": h,
             "residual_from_normed_attn": h}.get(kind, x) + attn(h)
        h = nf(x)
        return {"no_ff_residual": 0, "residual_from_normed": h,
                "residual_from_normed_ff": h}.get(kind, x) + ff(h)

    return run


BLOCK_MISTAKES = [
    ("post_norm", "norm after instead of before: that is the original post-norm block, LN(x + "
     "attn(x)). A pre-norm block normalises the sub-layer's input and leaves the residual stream "
     "alone: which of the two, the stream or the sub-layer's input, passes through the LayerNorm?"),
    ("no_attn_residual", "the residual is missing around attention: add attn(LN_1(x)) to x, don't "
     "replace x with it."),
    ("no_ff_residual", "the residual is missing around the feed-forward: its output replaced the "
     "stream instead of being added to it, as attention's is."),
    ("no_norm", "the LayerNorms are missing: each sub-layer reads LN(x), not x."),
    ("same_norm", "norm1 is used twice: the feed-forward reads norm2(x), its own LayerNorm."),
    ("residual_from_normed", "the residual adds to the normalised x: keep the stream x itself, x + "
     "attn(LN(x)), not LN(x) + attn(LN(x))."),
    ("residual_from_normed_attn", "the attention's residual adds to the normalised x: keep the stream "
     "x itself, x + attn(LN_1(x)), not LN_1(x) + attn(...)."),
    ("residual_from_normed_ff", "the feed-forward's residual adds to the normalised x: keep the "
     "stream x itself, x + ff(LN_2(x)), not LN_2(x) + ff(...)."),
    ("norms_swapped", "the two LayerNorms are swapped: attention read norm2's output and the "
     "feed-forward norm1's; each sub-layer has its own, in the stub's order."),
    ("parallel", "both sub-layers read the same input: the feed-forward must read the stream after "
     "attention has been added, one after the other."),
    ("ff_first", "the feed-forward ran first: attention comes first, then the feed-forward."),
    ("cache_not_passed", "the cache never reached the attention: with a cache the new tokens saw only "
     "themselves. The block is handed the layer's cache: who needs it?"),
]


def _block(d, h, d_ff, seed):
    """A reference block with large weights, its LayerNorm gains away from 1."""
    block = _randomise(bg.Block(d, h, d_ff), seed)
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            norm.weight.add_(1.0)
    return block


@exercise("build_gpt.block", "a pre-norm Transformer block", hints=(
    "Two sub-layers, attention then feed-forward, each with a residual addition and a LayerNorm "
    "of its own; the cache goes to the attention. Notebook 06's post-norm layer normalised each "
    "sum. Follow the path from the block's input x to its output in that layout and in the other "
    "one, the norm in front of the sub-layer: which leaves a path on which x is never normalised?",
    "If the stream x is never normalised, no LayerNorm can sit on a residual sum: where else can "
    "norm1 and norm2 go, what does each sub-layer then read, and what is its output added to? "
    "Attention first (handed cache as its second argument), then the feed-forward, which reads "
    "the stream as the attention's addition left it.",
    "x = x + ...          # attention on norm1's copy of x, handed the cache\n"
    "return x + ...       # the feed-forward on norm2's copy of the updated x"))
def check_block(cls) -> CheckResult:
    """Exercise: ``cls(d_model, num_heads, d_ff)``, the stub's ``__init__``; ``forward(x,
    cache=None) -> x``, pre-norm, the cache handed to the attention (the reference's, put in)."""
    return _check_module(
        cls, "Block", [((16, 4, 32), 201), ((12, 3, 20), 202)], _block,
        lambda m, x, start, cache: m(x, cache), lambda x: KVCache(x.shape[1]),
        lambda args, seed: _sequences(args[0], seed), block_variant, BLOCK_MISTAKES,
        swap=("attn",))


# --- 3. the model --------------------------------------------------------------------------------


def model_cfg(vocab=11, context=16, d=16, h=4, layers=2, d_ff=32) -> bg.GPTConfig:
    return bg.GPTConfig(vocab, context=context, d_model=d, num_heads=h, num_layers=layers,
                        d_ff=d_ff)


def model_variant(ref: bg.GPT, kind: str = "right") -> Callable:
    """``forward(tokens, start=0, caches=None)`` with ``ref``'s parts and ``kind``'s mistake."""
    d = ref.cfg.d_model

    def run(tokens, start=0, caches=None):
        n, s = tokens.shape[1], 0 if kind == "positions_not_offset" else start
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


MODEL_MISTAKES = [
    ("no_positions", "the position embedding is missing: without it attention cannot tell the order "
     "of the characters; add the embedding of each new token's position in the sequence."),
    ("positions_from_tokens", "the position embedding is indexed by the token ids: index it by the "
     "positions start..start+n-1 (0..n-1 without a cache)."),
    ("positions_from_one", "the positions start one too late: the first new character is at position "
     "start (0 without a cache): where does the range begin?"),
    ("positions_not_offset", "the positions ignore start: with start characters already in the cache, "
     "the new ones come after them, not at 0..n-1."),
    ("caches_not_passed", "the caches never reached the blocks: each block must be handed its own "
     "cache, caches[i] for block i (and None when there are no caches)."),
    ("no_final_norm", "the final LayerNorm is missing: a pre-norm stack leaves the stream "
     "unnormalised after the last block, so something must normalise it before the output head."),
    ("first_block_only", "only one block ran: x goes through every block of self.blocks, in turn."),
    ("scaled_embeddings", "the embeddings are multiplied by sqrt(d): this GPT adds the token and "
     "position embeddings as they are."),
    ("token_scaled", "the token embeddings are multiplied by sqrt(d) before the positions are added "
     "(the 2017 paper's convention, with its fixed sinusoids): this GPT adds both learned embeddings "
     "as they are."),
    ("no_blocks", "the blocks never ran: the logits come straight from the embeddings."),
    ("log_softmax_output", "the model returns log_softmax(logits): return the raw logits; "
     "cross_entropy and sampling apply the (log-)softmax themselves."),
    ("softmax_output", "the model returns softmax(logits), probabilities: return the raw logits; the "
     "loss (cross_entropy) and sampling apply the softmax themselves."),
]


def _gpt(cfg, seed):
    """A reference GPT with large weights, its final LayerNorm's gain away from 1."""
    model = _randomise(bg.GPT(cfg), seed, std=0.3)
    with torch.no_grad():
        model.norm.weight.add_(1.0)
    return model


def _token_cases(cfg, seed):
    """``tokens (b, n)`` with ``split``/``step`` as in :func:`_sequences`; the last case runs at
    ``start`` = context - 5 without caches, to test start on its own."""
    g = seeded(seed)
    cases = [{"tokens": torch.randint(0, cfg.vocab_size, (b, n), generator=g), "split": split,
              "step": step}
             for b, n, split, step in [(1, 6, 0, 0), (2, 9, 0, 0), (3, 1, 0, 0),
                                       (2, cfg.context, 0, 0), (2, 9, 4, 1), (1, 12, 5, 3)]]
    return [*cases, {"tokens": torch.randint(0, cfg.vocab_size, (2, 5), generator=g), "split": 0,
                     "step": 0, "start": cfg.context - 5}]


@exercise("build_gpt.model", "the GPT: embeddings, blocks, final norm, output head", hints=(
    "Each token becomes its embedding plus the embedding of its position; the sum goes through "
    "every block in turn; a final LayerNorm, then the output head gives one score per character. "
    "With caches, which positions do the n new tokens hold, and which cache does block i read?",
    "start is the position of tokens[:, 0] in the sequence the model reads, with caches or "
    "without. Look the n "
    "positions up in position_embedding as one (n,) tensor: its (n, d) result broadcasts onto the "
    "token embeddings, (b, n, d), the same positions for every sequence of the batch. "
    "enumerate(self.blocks) gives each block its index i, and with it its own cache (None when "
    "caches is None); then self.norm and self.head give (b, n, vocab).",
    "positions = ...                           # (n,): start .. start + n - 1\n"
    "x = ...                                   # (b, n, d): token plus position embeddings\n"
    "for i, block in enumerate(self.blocks):\n"
    "    x = block(x, ...)                     # caches[i], or None without caches\n"
    "return ...                                # (b, n, vocab): the final norm, then the head"))
def check_model(cls) -> CheckResult:
    """Exercise: ``cls(cfg)``, the stub's ``__init__``; ``forward(tokens (b, n), start=0,
    caches=None) -> logits (b, n, vocab)`` at positions ``start..start+n-1``, block ``i`` given
    ``caches[i]`` (the reference blocks, put in)."""
    cfg = model_cfg()
    return _check_module(
        cls, "GPT", [((cfg,), 301)], _gpt, lambda m, x, start, caches: m(x, start, caches),
        lambda x: [KVCache(cfg.context) for _ in range(cfg.num_layers)],
        lambda args, seed: _token_cases(cfg, seed + 1), model_variant, MODEL_MISTAKES,
        swap=("blocks",),
        error_hints=[("not subscriptable", "caches is None here, with start > 0: the checker calls "
                      "the model at an offset without caches, to test start on its own. The "
                      "positions come from the start argument (not from len(caches[0])), and "
                      "block i gets None when caches is None."),
                     ("cache is full", "a cache filled up: each block keeps its own keys and "
                      "values, so block i gets caches[i] (not caches[0] for all), and with a cache "
                      "only the new tokens are fed, at positions start..start+n-1.")])


# --- 4. the training step ------------------------------------------------------------------------


def train_variant(kind: str = "right") -> Callable:
    """``train_step(model, optimizer, chunk)`` with ``kind``'s mistake."""
    def step(model: nn.Module, optimizer, chunk):
        inputs, targets = {"not_shifted": (chunk[:, :-1], chunk[:, :-1]),
                           "whole_chunk": (chunk, chunk),
                           "shifted_backwards": (chunk[:, 1:], chunk[:, :-1])}.get(
                               kind, (chunk[:, :-1], chunk[:, 1:]))
        logits = model(inputs)
        if kind == "softmax_first":
            logits = torch.softmax(logits, dim=-1)
        if kind == "last_only":
            logits, targets = logits[:, -1:], targets[:, -1:]
        flat = logits.flatten(0, 1), targets.flatten()
        if kind == "nll_on_logits":
            loss = F.nll_loss(*flat)
        elif kind == "sum_over_positions":                # summed over positions, mean over batch
            loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(1).mean()
        else:
            loss = F.cross_entropy(*flat, reduction="sum" if kind == "sum" else "mean")
        if kind != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        if kind == "clip_each":                           # each gradient's norm on its own
            for p in model.parameters():
                nn.utils.clip_grad_norm_([p], 1.0)
        elif kind == "clip_value":
            nn.utils.clip_grad_value_(model.parameters(), 1.0)
        elif kind != "no_clip":
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if kind != "no_step":
            optimizer.step()
        return loss.item()

    return step


TRAIN_MISTAKES = [
    ("not_shifted", "the targets are not shifted: position i must predict the NEXT character, so the "
     "target at position i is the character that comes one after input i."),
    ("whole_chunk", "the inputs and the targets are both the whole chunk, unshifted: the model then "
     "learns to copy the current character. A chunk of n + 1 characters gives n inputs and n targets: "
     "which n of each?"),
    ("shifted_backwards", "the shift goes the wrong way: the model predicts each character from the "
     "ones BEFORE it, so the targets are the later of the two slices."),
    ("no_zero_grad", "the gradients are never zeroed, so they pile up from step to step: call "
     "optimizer.zero_grad() before loss.backward()."),
    ("no_step", "the weights did not change: call optimizer.step() after loss.backward() (and zero "
     "the gradients before backward, not between backward and step)."),
    ("sum", "the loss is summed over positions: take the mean (cross_entropy's default), so the step "
     "size does not grow with the batch."),
    ("sum_over_positions", "the loss is summed over each chunk's positions (then averaged over the "
     "batch): a per-character loss is the mean over every position, so the step does not grow with "
     "the context length."),
    ("softmax_first", "softmax was applied before cross_entropy, which takes raw logits (it does the "
     "log-softmax itself)."),
    ("nll_on_logits", "F.nll_loss on raw logits: nll_loss expects log-probabilities; use "
     "F.cross_entropy(logits, targets), which takes the log-softmax itself."),
    ("last_only", "only the last position is trained: every position of the chunk predicts its next "
     "character."),
    ("no_clip", "the step used an unclipped gradient, or clipped each gradient on its own: clip the "
     "joint norm of all gradients together, not each one or by value. Call "
     "nn.utils.clip_grad_norm_(model.parameters(), 1.0) once, after loss.backward() and before "
     "optimizer.step() (before backward there is no gradient yet; after step it is too late)."),
]


@exercise("build_gpt.train_step", "the training step: next-character loss", hints=(
    "At each position the model predicts the next character: so which character of the chunk is "
    "the target of input position i, and how many predictions does a chunk of n + 1 characters "
    "hold? Then the usual optimizer moves, with the gradient clipped before the step.",
    "Inputs and targets are two slices of the chunk's last axis, both (b, n), the targets one step "
    "ahead of the inputs: which end does each slice drop? F.cross_entropy wants "
    "(N, vocab) logits against (N,) ids: flatten the (b, n, vocab) logits to (b * n, vocab) and "
    "the targets to (b * n,); its default mean over the positions is the loss.",
    "inputs, targets = ...                     # (b, n) each: the chunk shifted by one\n"
    "logits = model(inputs)                    # (b, n, vocab)\n"
    "loss = F.cross_entropy(..., ...)          # logits (b * n, vocab), targets (b * n,)\n"
    "optimizer.zero_grad()\n"
    "...                                       # backward, clip the norm to 1, step\n"
    "return loss.item()"))
def check_train_step(train_step: Callable) -> CheckResult:
    """Exercise: ``train_step(model, optimizer, chunk (b, n + 1)) -> loss``: one step of
    next-character training, the gradient norm clipped to 1; checked over two steps of SGD on a
    small GPT with large weights, whose gradients are far over norm 1 (the returned losses and
    the weights after)."""
    g = seeded(401)
    cases = [{"chunks": torch.randint(0, 11, (2, b, n + 1), generator=g), "seed": s}
             for b, n, s in [(2, 8, 1), (3, 16, 2), (1, 4, 3)]]
    return check_function(
        _two_steps(train_step), _two_steps(bg.train_step), cases, what="train_step",
        output_names=("the two losses", "the weights after two steps"), atol=1e-5,
        mistakes=[Mistake(_two_steps(train_variant(kind)), hint) for kind, hint in TRAIN_MISTAKES],
        error_hints=[
            ("Expected target size", "F.cross_entropy reads the classes on dim 1: the logits came "
             "as (b, n, vocab), with the characters on the last axis. Flatten logits and targets "
             "over the positions (or move the vocabulary axis to dim 1)."),
            ("past the context", "the whole chunk of n + 1 characters went into the model: the "
             "last character has nothing to predict, so it is never an input.")])


def _two_steps(step: Callable) -> Callable:
    def run(chunks, seed):
        model = _randomise(bg.GPT(model_cfg()), seed, std=0.3).train()   # gradients far over 1
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for chunk in chunks:
            loss = step(model, optimizer, chunk.clone())
            if loss is None:
                raise Refused("train_step returned None: after the optimizer's step, return the "
                              "loss, a float (loss.item()).")
            losses.append(float(loss.detach() if isinstance(loss, torch.Tensor) else loss))
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        return torch.tensor(losses, dtype=torch.float64), weights

    return run


# --- 5. the training loop and its schedule -------------------------------------------------------


def schedule_variant(kind: str = "right") -> Callable:
    """``learning_rate(step, recipe)`` with ``kind``'s mistake."""
    def learning_rate(step, recipe):
        peak, low, warmup, steps = recipe.lr, recipe.min_lr, recipe.warmup, recipe.steps
        if kind == "constant":
            return peak
        if step < warmup and kind != "no_warmup":
            return peak * (step if kind == "warmup_from_zero" else step + 1) / warmup
        progress = step / steps if kind in ("no_warmup", "cosine_over_all") \
            else (step - warmup) / max(1, steps - warmup)
        low = 0.0 if kind == "to_zero" else low
        if kind == "linear":
            return low + (peak - low) * (1 - progress)
        if kind == "no_half":
            return low + (peak - low) * math.cos(math.pi * progress)
        return low + 0.5 * (peak - low) * (1 + math.cos(math.pi * progress))

    return learning_rate


SCHEDULE_MISTAKES = [
    ("constant", "the learning rate never changes: warm up linearly to recipe.lr, then follow a "
     "cosine down to recipe.min_lr."),
    ("no_warmup", "there is no warm-up: for the first recipe.warmup steps the rate climbs linearly, "
     "step s getting recipe.lr * (s + 1) / recipe.warmup."),
    ("warmup_from_zero", "the first warm-up step gets a learning rate of 0, a wasted step: step s "
     "(from 0) gets recipe.lr * (s + 1) / recipe.warmup."),
    ("cosine_over_all", "the cosine counts from step 0, not from the end of the warm-up: its progress "
     "is (step - warmup) / (steps - warmup), from 0 to 1."),
    ("to_zero", "the cosine ends at 0: it ends at recipe.min_lr."),
    ("linear", "the decay is linear: after the warm-up, follow half a cosine period, min_lr + (lr - "
     "min_lr) * (1 + cos(pi * progress)) / 2."),
    ("no_half", "cos(pi * progress) runs from 1 to -1, so the rate goes negative: map it to 1..0 with "
     "(1 + cos(pi * progress)) / 2."),
]


def loop_variant(kind: str = "right") -> Callable:
    """``train(model, train_step, corpus, recipe, generator, stop)`` with ``kind``'s mistake."""
    def train(model, train_step, corpus, recipe, generator, stop=None):
        def new_optimizer():
            return torch.optim.AdamW(
                [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                 {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                betas=recipe.betas)

        def set_rate(step):
            for group in optimizer.param_groups:
                group["lr"] = bg.learning_rate(step, recipe)

        optimizer, n, curve, chunk = new_optimizer(), model.cfg.context, [], None
        data = corpus.val if kind == "batches_from_val" else corpus.train
        high = len(data) - n - (0 if kind == "randint_high" else 1)
        width = n if kind == "chunk_short" else n + 1
        for step in range(recipe.steps if stop is None or kind == "stop_ignored" else stop):
            if kind == "optimizer_each_step":
                optimizer = new_optimizer()
            if kind not in ("no_schedule", "lr_after_step"):
                set_rate(step)
            if chunk is None or kind != "same_batch":
                starts = torch.randint(0, high, (recipe.batch,), generator=generator)
                chunk = torch.stack([data[s:s + width] for s in starts.tolist()])
            batch_loss = train_step(model, optimizer, chunk)
            if kind == "lr_after_step":
                set_rate(step)
            done = step if kind == "eval_off_by_one" else step + 1
            if done % recipe.eval_every == 0 and kind != "no_eval":
                train_loss = bg.estimate_loss(model, corpus.train, n)
                val_loss = bg.estimate_loss(model, corpus.val, n)
                if kind == "batch_loss":
                    train_loss = batch_loss
                if kind == "eval_swapped":
                    train_loss, val_loss = val_loss, train_loss
                curve.append((step + 1, train_loss, val_loss))
        return curve

    return train


LOOP_MISTAKES = [
    ("no_schedule", "the learning rate was never set, so AdamW kept its default of 0.001: at every "
     "step, before the update, set group['lr'] = learning_rate(step, recipe) in each of "
     "optimizer.param_groups."),
    ("lr_after_step", "the learning rate is set after the step, so each step uses the previous step's "
     "rate: set it before calling train_step."),
    ("optimizer_each_step", "a new AdamW is built at every step: its running averages of the gradient "
     "start from zero each time. Build it once, before the loop."),
    ("batches_from_val", "the batches come from the held-out text: train on corpus.train only, or the "
     "held-out loss no longer measures anything."),
    ("same_batch", "one batch is drawn once and used at every step: draw a fresh batch inside the "
     "loop."),
    ("randint_high", "the starts are drawn from 0..len(corpus.train) - n - 1 inclusive: use "
     "torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), generator=generator), as the "
     "exercise says (the same draws as the reference)."),
    ("chunk_short", "each chunk holds n characters: it needs n + 1, n inputs and the n characters "
     "that follow them."),
    ("eval_off_by_one", "the evaluations come one step early (at step 0, eval_every, ...): evaluate "
     "after step + 1 steps, when (step + 1) % recipe.eval_every == 0."),
    ("eval_swapped", "the curve's two losses are swapped: each entry is (steps done, training loss, "
     "held-out loss)."),
    ("batch_loss", "the curve's training loss is the last batch's loss: that is one noisy batch, "
     "measured before the step. Use bg.estimate_loss(model, corpus.train, n), the same 100 windows as "
     "the held-out loss."),
    ("no_eval", "the curve is empty: every recipe.eval_every steps append (step + 1, the training "
     "loss, the held-out loss), each from bg.estimate_loss."),
    ("stop_ignored", "stop was ignored: with stop, run only steps 0..stop-1 (the schedule still spans "
     "recipe.steps)."),
]


def _rates(learning_rate: Callable) -> Callable:
    def run(recipe):
        return torch.tensor([float(learning_rate(s, recipe)) for s in range(recipe.steps)],
                            dtype=torch.float64)

    return run


def _run_loop(train: Callable) -> Callable:
    """``run(recipe, stop, seed)``: ``train`` on a small GPT and a random 11-letter text, with
    the reference step; the curve and the weights after."""
    def run(recipe, stop, seed):
        g = seeded(601)
        corpus = bg.Corpus("abcdefghijk", torch.randint(0, 11, (500,), generator=g),
                           torch.randint(0, 11, (150,), generator=g))
        torch.manual_seed(seed)
        model = bg.GPT(model_cfg())
        curve = train(model, bg.train_step, corpus, recipe, torch.Generator().manual_seed(seed), stop)
        if curve is None:
            raise Refused("train returned None: return the curve, a list of (step, training "
                          "loss, held-out loss).")
        rows = [[float(x) for x in row] for row in curve]
        if any(len(row) != 3 for row in rows):
            raise Refused("each entry of the curve should be (step, training loss, held-out "
                          "loss), three numbers.")
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        return torch.tensor(rows, dtype=torch.float64).reshape(-1, 3), weights

    return run


@exercise("build_gpt.train", "the training loop: schedule, batches, evaluation", hints=(
    "Two functions. learning_rate: a straight line up for the warm-up steps, then half a cosine "
    "period down to min_lr. train: at every step, set the rate, draw a batch from the training "
    "text, take one step; every eval_every steps, record both losses.",
    "learning_rate: step s < warmup gets lr * (s + 1) / warmup; after that progress p = (s - "
    "warmup) / (steps - warmup) runs from 0 to 1 and the rate is min_lr + (lr - min_lr) * (1 + "
    "cos(pi p)) / 2. The batch: recipe.batch random starts from torch.randint with the "
    "generator, then the n + 1 characters from each start, stacked.",
    "for group in optimizer.param_groups:\n"
    "    group[\"lr\"] = ...                     # this step's rate\n"
    "starts = torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), generator=generator)\n"
    "chunk = torch.stack([...])                # (b, n + 1): corpus.train[s:s + n + 1]\n"
    "train_step(model, optimizer, chunk)\n"
    "if (step + 1) % recipe.eval_every == 0:\n"
    "    curve.append((step + 1, bg.estimate_loss(model, corpus.train, n), ...))"))
def check_train(train: Callable, learning_rate: Callable) -> CheckResult:
    """Exercise: ``learning_rate(step, recipe) -> float`` (a linear warm-up, then a cosine to
    ``min_lr``) and ``train(model, train_step, corpus, recipe, generator, stop=None) -> curve``:
    the schedule on every step of four recipes, then the loop on a small GPT and a toy text (the
    curve and the weights after, against the reference's with the same draws)."""
    recipes = [{"recipe": bg.Recipe(steps=s, batch=2, lr=lr, warmup=w, min_lr=m)}
               for s, lr, w, m in [(20, 0.1, 5, 0.01), (12, 3e-3, 1, 0.0), (50, 1e-3, 10, 1e-4),
                                   (8, 0.5, 3, 0.05)]]
    result = check_function(
        _rates(learning_rate), _rates(bg.learning_rate), recipes, what="learning_rate",
        output_names=("the rates of every step",), atol=1e-9, rtol=1e-7,
        mistakes=[Mistake(_rates(schedule_variant(kind)), hint) for kind, hint in SCHEDULE_MISTAKES])
    if not result:
        return result
    runs = [{"recipe": bg.Recipe(steps=s, batch=b, lr=lr, warmup=w, min_lr=m, eval_every=e),
             "stop": stop, "seed": seed}
            for s, b, lr, w, m, e, stop, seed in [(9, 3, 0.02, 3, 0.002, 3, None, 1),
                                                  (8, 2, 0.05, 2, 0.0, 4, None, 2),
                                                  (12, 2, 0.01, 4, 0.001, 2, 6, 3)]]
    result = check_function(
        _run_loop(train), _run_loop(bg.train), runs, what="train",
        output_names=("the curve (step, training loss, held-out loss)", "the weights after"),
        atol=1e-5, mistakes=[Mistake(_run_loop(loop_variant(kind)), hint)
                             for kind, hint in LOOP_MISTAKES])
    return result if not result else CheckResult(
        True, f"Passed: learning_rate matches the reference on every step of {len(recipes)} "
              f"recipes, and train gives the reference's curve and weights on all {len(runs)} runs.")


# --- 6. generation with a KV cache ---------------------------------------------------------------


def generate_variant(kind: str = "right") -> Callable:
    """``generate(model, prompt, steps, temperature, top_k, use_cache, generator)`` with ``kind``'s
    mistake (``"top_k_indices"``, sampling among the k largest, is right too)."""
    @torch.no_grad()
    def generate(model, prompt, steps, temperature, top_k, use_cache, generator):
        T, tokens = model.cfg.context, prompt
        caches = model.new_caches() if use_cache else None
        new, start = prompt, 0
        for _ in range(steps):
            logits = model(new, start, caches)[:, 0 if kind == "first_position" else -1]
            logits = {"temperature_times": logits * temperature,
                      "temperature_after_softmax": logits}.get(kind, logits / temperature)
            if top_k is not None and kind != "no_top_k":
                k = top_k + 1 if kind == "top_k_plus_one" and top_k < logits.shape[-1] else top_k
                kth = logits.topk(k, dim=-1).values[:, -1:]
                if kind == "top_k_off_by_one":                   # all masked at k = 1: uniform
                    logits = logits.masked_fill(logits <= kth, -math.inf)
                    logits = torch.where(logits.isinf().all(-1, keepdim=True), 0.0, logits)
                else:
                    logits = logits.masked_fill(logits < kth, -math.inf)
            probs = torch.softmax(logits, dim=-1)
            if kind == "temperature_after_softmax":
                probs = probs / temperature
            if kind == "greedy":
                nxt = probs.argmax(-1, keepdim=True)
            elif kind == "no_generator":
                nxt = torch.multinomial(probs, 1)
            elif kind == "top_k_indices" and top_k is not None:
                values, indices = logits.topk(top_k, dim=-1)
                nxt = indices.gather(-1, torch.multinomial(values.softmax(-1), 1, generator=generator))
            else:
                nxt = torch.multinomial(probs, 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            L = tokens.shape[1]
            if use_cache and L <= T:                            # the cache has room
                new, start = nxt, {"positions_restart": 0, "start_is_length": L,
                                   "start_frozen": prompt.shape[1]}.get(kind, L - 1)
                if kind == "whole_sequence_cached":
                    new, start = tokens, len(caches[0])
            else:                                               # past T (or no cache): the window
                new = {"crop_first": tokens[:, :T], "crop_short": tokens[:, -(T - 1):]}.get(
                    kind, tokens[:, -T:])
                start, caches = 0, None
        return tokens

    return generate


GENERATE_MISTAKES = [
    ("positions_restart", "the positions restart in the cached step: the new character sits after "
     "every character already in the cache, not at 0."),
    ("start_is_length", "start = tokens.shape[1] in the cached step, one past the new character: "
     "after appending it, how many characters come before it?"),
    ("temperature_after_softmax", "temperature applied after the softmax: dividing the probabilities "
     "by T changes nothing once they are renormalised; divide the logits by T, then softmax."),
    ("temperature_times", "the logits were multiplied by T: divide them by T (T < 1 sharpens, T > 1 "
     "flattens)."),
    ("first_position", "the next character was sampled from the FIRST position's logits: the "
     "prediction for the next character is at the last position, [:, -1]."),
    ("top_k_off_by_one", "top-k keeps k - 1 characters: keep every logit >= the k-th largest (mask "
     "only those strictly below it)."),
    ("whole_sequence_cached", "every token was fed again while using the cache: with the cache, after "
     "the prompt feed only the token just sampled, at its own position; the cache already holds the "
     "rest."),
    ("greedy", "the next character was the most likely one (argmax): sample it from the probabilities "
     "with torch.multinomial(probs, 1, generator=generator)."),
    ("no_generator", "your generate drew from torch's global random numbers, not from the generator "
     "it was given: sample with torch.multinomial(probs, 1, generator=generator), so that the same "
     "seed gives the same tokens."),
    ("no_top_k", "top_k was ignored: keep the k largest logits and set the others to -inf."),
    ("top_k_plus_one", "top-k kept k + 1 characters: the cut-off is the k-th largest logit, not the "
     "(k + 1)-th."),
    ("start_frozen", "start stayed at the prompt's length in every cached step: each new character "
     "sits one position after the previous one."),
    ("crop_first", "past the context you kept the text's FIRST n_ctx characters: the next character "
     "follows the last ones, so the window is the last n_ctx."),
    ("crop_short", "past the context the window held n_ctx - 1 characters: the model reads up to "
     "n_ctx = model.cfg.context of them, at positions 0..n_ctx-1."),
]

#: Named from what a learner's generate does once the text outgrows the context.
PAST_CONTEXT = {
    "cached": "with the cache, the step after the text reached n_ctx = model.cfg.context characters "
              "had nowhere to go: positions stop at n_ctx - 1, and the cache holds n_ctx keys. Once "
              "the text is longer, the model reads only its last n_ctx characters: at which "
              "positions do they sit now, and at which positions were the cached keys and values "
              "computed?",
    "stale": "past the context the window went into a cache that already held keys and values: "
             "they were computed when each character sat one or more positions further on. With "
             "learned absolute positions, what is a cached key worth once its character has moved?",
    "plain": "without the cache the whole text went in, but past n_ctx = model.cfg.context "
             "characters the model reads only a window of n_ctx of them, at positions "
             "0..n_ctx-1: which n_ctx?",
}


class _Recording(bg.GPT):
    """The checker's GPT: it records each call as ``(n, start, cache used)`` (an empty cache
    counts as none when several tokens come in: a fresh cache for a new window is right)."""

    def forward(self, tokens, start=0, caches=None):
        n = tokens.shape[1]
        self.calls.append((n, start, caches is not None and (n == 1 or len(caches[0]) > 0)))
        return super().forward(tokens, start, caches)


def _sampler(generate: Callable, model: _Recording) -> Callable:
    """``run(prompt, steps, temperature, top_k, use_cache, seed)``: the tokens ``generate``
    samples with a generator seeded ``seed`` (torch's own random numbers seeded ``seed + 1``, so
    that sampling without the generator is named); running out of context is explained."""
    def run(prompt, steps, temperature, top_k, use_cache, seed):
        model.calls, T = [], model.cfg.context
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            try:
                return generate(model, prompt, steps, temperature, top_k, use_cache,
                                torch.Generator().manual_seed(seed))
            except ValueError as exc:
                full = "cache is full" in str(exc)
                if not (full or "past the context" in str(exc)):
                    raise
                n, _, used = model.calls[-1]
                if prompt.shape[1] + len(model.calls) - 1 > T:      # the text outgrew n_ctx
                    why = "stale" if full and n > 1 else "cached" if used else "plain"
                    raise Refused(f"generate failed once the text was longer than the context "
                                  f"n_ctx = {T} ({exc}).\nHint: {PAST_CONTEXT[why]}") from exc
                if use_cache:
                    raise Refused(f"with use_cache=True generate ran past the cache ({exc}).\n"
                                  f"Hint: {dict(GENERATE_MISTAKES)['whole_sequence_cached']}"
                                  ) from exc
                raise

    return run


@exercise("build_gpt.generate", "generation with a KV cache, temperature and top-k", hints=(
    "With a cache the prompt goes through once; after that only the new character runs, at its "
    "own position, and its keys and values join the cache. Temperature and top-k reshape the "
    "logits before the softmax. Past the context n_ctx, each character's position is counted from "
    "the start of the window the model reads, not from the start of the text.",
    "The next character's logits are the last position's, (b, vocab), divided by T. For top-k: "
    "which one number per row separates the k largest logits from the rest, and what must the "
    "others become so that the softmax gives them nothing? With a cache: what goes into the next "
    "call, and at which position? Once the text is longer than the context, every character in "
    "the window has moved one position down since the last step: what does that do to keys and "
    "values computed earlier?",
    "logits = ...                              # (b, vocab): the last position's, over T\n"
    "if top_k is not None:\n"
    "    kth = ...                             # (b, 1): each row's k-th largest logit\n"
    "    logits = ...                          # the logits below kth set to -inf\n"
    "nxt = torch.multinomial(..., 1, generator=generator)   # (b, 1), from the probabilities\n"
    "tokens = torch.cat([tokens, nxt], dim=1)\n"
    "if use_cache and ...:                     # the cache still has room\n"
    "    new, start = ...                      # nxt at its position\n"
    "else:                                     # no cache, or past the context\n"
    "    new, start, caches = ...              # the window the model reads, from position 0"))
def check_generate(generate: Callable) -> CheckResult:
    """Exercise: ``generate(model, prompt (b, n0), steps, temperature, top_k, use_cache,
    generator) -> tokens (b, n0 + steps)``, sampling with ``torch.multinomial(probs, 1,
    generator=generator)``; the reference's tokens with and without the cache, also once the text
    outgrows the context; then how it called the model: the cache used, and only with use_cache."""
    model = _randomise(_Recording(model_cfg(vocab=13, context=24, layers=2)), 501, std=0.4)
    g = seeded(502)
    cases = [{"prompt": torch.randint(0, 13, (b, n0), generator=g), "steps": steps,
              "temperature": t, "top_k": k, "use_cache": cache,
              "seed": int(torch.randint(0, 1000, (1,), generator=g))}
             for b, n0, steps, t, k, cache in [
                 (2, 3, 12, 1.0, None, True), (2, 3, 12, 1.0, None, False),
                 (3, 5, 15, 0.5, None, True), (2, 1, 20, 2.0, 4, True), (2, 4, 10, 0.7, 3, False),
                 (1, 6, 18, 1.3, 1, True), (2, 4, 36, 0.9, None, True),
                 (2, 4, 36, 0.9, None, False), (1, 20, 14, 1.0, 5, True)]]
    result = check_function(
        _sampler(generate, model), _sampler(bg.generate, model), cases, what="generate",
        output_names=("the tokens",), atol=0, rtol=0,
        mistakes=[Mistake(_sampler(generate_variant(kind), model), hint)
                  for kind, hint in GENERATE_MISTAKES])
    if not result:      # sampling among the k largest draws other random numbers, and is right
        among_k = check_function(_sampler(generate, model),
                                 _sampler(generate_variant("top_k_indices"), model), cases,
                                 what="generate", output_names=("the tokens",), atol=0, rtol=0)
        if not among_k:
            return result
        result = CheckResult(True, among_k.message + " (You sample among the k largest logits' "
                             "indices: right too; it draws different random numbers than masking "
                             "the others to -inf, so it was checked against that way of sampling.)")
    for case in cases:
        _sampler(generate, model)(**case)
        if misuse := _cache_misuse(model.calls, case["prompt"].shape[1], case["use_cache"],
                                   model.cfg.context):
            return CheckResult(False, "Not yet: the tokens are right, but " + misuse)
    return result


def _cache_misuse(calls: list, n0: int, use_cache: bool, T: int) -> str | None:
    """What went wrong in ``calls``, or None: with the cache the prompt runs once at 0, then each
    call the new token at its position; without it, and past n_ctx = ``T``, each call runs the
    text (its last ``T``) from 0 with no cache."""
    for j, (n, start, used) in enumerate(calls):
        L = n0 + j                                       # the text's length before call j + 1
        want = (min(L, T), 0, False) if L > T or not use_cache or not j else (1, L - 1, True)
        if (n, start) == want[:2] and (used == want[2] or (use_cache and not j)):
            continue
        ran = (f"call {j + 1} (prompt of {n0}, the text {L} characters long) ran n = {n} at "
               f"start = {start} {'with' if used else 'without'} the cache (expected: n = "
               f"{want[0]} at start = {want[1]} {'with' if want[2] else 'without'} it)")
        if not use_cache:
            return ("use_cache=False did not run without the cache: " + ran + ".\nHint: without "
                    "the cache, every step re-runs the whole sequence so far from position 0 with "
                    "caches=None; the notebook times the two paths against each other.")
        if L > T:
            return f"past the context n_ctx = {T}, {ran}.\nHint: {PAST_CONTEXT['stale']}"
        if not j:
            return (f"the prompt of {n0} did not run in one call: {ran}.\nHint: with the cache, "
                    "the prompt goes through the model once, as one block at position 0; after "
                    "that, one new token per call.")
        if not used and (L, n, start) == (T, T, 0):
            return ("the cache was dropped one step early: " + (f"calls 2..{j} used it, but "
                    if j > 1 else "") + f"{ran}: that text is exactly n_ctx = {T} characters long."
                    "\nHint: a text of n_ctx characters still fits: its last "
                    f"character sits at position n_ctx - 1 = {T - 1}, and the cache has room for "
                    "it. Which comparison of the text's length with n_ctx says the cache is full?")
        if not used:
            return (("the cache was never used: " if j == 1 else
                     f"the cache was dropped after call {j}: ") + ran + ".\nHint: make the caches "
                    "once with model.new_caches() and hand the same ones to every call; only "
                    "past n_ctx does the window start again without them.")
        return (f"{ran}.\nHint: the cache already holds the keys and values of every earlier "
                "position: feed it only the token just sampled (n = 1), at its own position.")
    return None
