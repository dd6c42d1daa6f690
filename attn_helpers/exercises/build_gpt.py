"""Checkers for notebook 10 (build a GPT): the learner's causal self-attention, pre-norm block,
model, training step and generation with a KV cache, each run against the reference of
:mod:`attn_helpers.lessons.build_gpt` with the same weights.

A module exercise gives ``__init__`` and asks for ``forward``; the checker loads the reference's
weights into the learner's module, with reference parts where they are not the exercise (the
block gets the reference attention, the model the reference blocks): one piece per checker.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..kv_cache import KVCache
from ..lessons import build_gpt as bg
from ..lessons import build_gpt_train as bgt
from .build_gpt_hints import TRAIN_ERROR_HINTS
from .build_gpt_mistakes import (  # the mistake lists re-exported: tests read them here
    ATTENTION_MISTAKES,
    BLOCK_MISTAKES,
    GENERATE_MISTAKES,  # noqa: F401
    MODEL_MISTAKES,
    TRAIN_MISTAKES,
    attention_variant,
    block_variant,
    model_variant,
    train_variant,
)
from .build_gpt_support import (
    _INSTEAD,
    _build,
    _first_failure,
    _forbid,
    _function_or_refusal,
    _in_pieces,
    _randomise,
    _refuse_borrowed,
    _safe,
)
from .core import (
    CheckResult,
    Mistake,
    Refused,
    check_function,
    seeded,
)
from .workflow import _RESULTS, exercise

__all__ = ["check_attention", "check_block", "check_model", "check_train_step", "check_generate",
           "passed", "pieces", "with_attention"]
#: Private helpers the checking runs while the learner's code does (see borrowing._checker_helper).
CALLED_WHILE_CHECKING = ("_model_cfg",)

KEYS = ("attention", "block", "model", "train_step", "generate")


def passed(name: str) -> bool:
    """Did the learner's own ``name`` (one of :data:`KEYS`) pass its checker in this kernel?"""
    return bool(_RESULTS.get(f"build_gpt.{name}"))


def pieces(learner: dict, solutions: dict) -> tuple[dict, str]:
    """The learner's pieces where they passed, the reference solutions elsewhere, and a line
    saying which ran. ``learner``/``solutions``: ``{"model": cls, "train_step": fn}``."""
    chosen, words = {}, []
    for name in ("model", "train_step"):
        mine = passed(name) and (name != "model" or all(passed(k) for k in KEYS[:3]))
        chosen[name] = learner[name] if mine else solutions[name]
        words.append(f"{'your' if mine else 'the reference'} {name.replace('_', ' ')}")
    return chosen, "Training with " + " and ".join(words) + "."


# --- 1. causal multi-head self-attention with a KV cache -----------------------------------


def _attention_cases(d: int, seed: int) -> list[dict]:
    """``x (b, n, d)``; ``split`` 0: one call without a cache; else a cache, a first call on
    ``x[:, :split]``, then calls of ``step`` tokens each at offsets ``split, split + step, ...``."""
    g = seeded(seed)
    return [{"x": torch.randn(b, n, d, generator=g), "split": split, "step": step}
            for b, n, split, step in [(1, 5, 0, 0), (2, 7, 0, 0), (3, 1, 0, 0), (2, 9, 4, 1),
                                      (2, 8, 3, 5), (1, 12, 5, 3), (2, 6, 1, 1)]]


def _attention_runner(forward: Callable) -> Callable:
    """``run(x, split, step)``: the outputs of every call, concatenated to ``(b, n, d)``."""
    def run(x, split, step):
        if not split:
            return forward(x, None)
        cache = KVCache(x.shape[1])
        return _in_pieces(lambda part, start: forward(part, cache), x, split, step)

    return run


_MASK_SHAPE_HINT = (
    "the mask must be (n, start + n): one row per new query, one column per visible key. If start "
    "was read after cache.append, len(cache) already counts the n new tokens: read start = "
    "len(cache) before appending (the stub does), then append.")


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
    """Exercise: ``cls(d_model, num_heads)`` with the stub's ``__init__`` (``qkv``, ``out``,
    ``num_heads``); ``forward(x (b, n, d), cache=None) -> (b, n, d)``: causal; with a
    :class:`~attn_helpers.kv_cache.KVCache` holding ``start`` positions, appends the new keys and
    values and lets new query ``i`` see keys ``0..start+i`` (``cache.attend`` is blocked: that
    is the exercise)."""
    refusal = _refuse_borrowed(cls, "CausalSelfAttention")
    if refusal is not None:
        return refusal
    results = []
    for d, h, seed in [(16, 4, 101), (12, 2, 102), (8, 1, 103)]:
        reference = _randomise(bg.CausalSelfAttention(d, h), seed)
        module = _build(cls, (d, h), reference, "CausalSelfAttention")
        if isinstance(module, CheckResult):
            return module
        results.append(check_function(
            _attention_runner(lambda x, c, m=module: m(x, c)),
            _attention_runner(lambda x, c, r=reference: r(x, c)), _attention_cases(d, seed),
            what="CausalSelfAttention", output_names=("the outputs of every call",),
            forbid=[(KVCache, "attend"), *_forbid("attention")], instead=_INSTEAD,
            mistakes=[Mistake(_safe(_attention_runner(attention_variant(reference, **kw))), hint)
                      for kw, hint in ATTENTION_MISTAKES],
            error_hints=[("does not broadcast", _MASK_SHAPE_HINT)]))
        if not results[-1]:
            return results[-1]
    return _first_failure(results, "CausalSelfAttention")


def with_attention(model: bg.GPT, cls) -> bg.GPT:
    """A copy of ``model`` whose blocks run ``cls`` (the learner's attention) with the same
    weights."""
    model = copy.deepcopy(model)
    for block in model.blocks:
        mine = cls(model.cfg.d_model, model.cfg.num_heads)
        mine.load_state_dict(block.attn.state_dict())
        block.attn = mine
    return model.eval()


# --- 2. the pre-norm block -----------------------------------------------------------------


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
    """Exercise: ``cls(d_model, num_heads, d_ff)`` with the stub's ``__init__`` (``norm1``,
    ``attn``, ``norm2``, ``ff``); ``forward(x, cache=None) -> x``, the cache handed to the
    attention. The reference attention is put inside it."""
    refusal = _refuse_borrowed(cls, "Block")
    if refusal is not None:
        return refusal
    results = []
    for d, h, d_ff, seed in [(16, 4, 32, 201), (12, 3, 20, 202)]:
        reference = _randomise(bg.Block(d, h, d_ff), seed)
        with torch.no_grad():                      # LayerNorm gains away from 1, shifts from 0
            for norm in (reference.norm1, reference.norm2):
                norm.weight.add_(1.0)
        module = _build(cls, (d, h, d_ff), reference, "Block", swap={"attn": reference.attn})
        if isinstance(module, CheckResult):
            return module
        results.append(check_function(
            _attention_runner(_with_cache_argument(module, "Block.forward(x, cache=None)")),
            _attention_runner(lambda x, c, r=reference: r(x, c)), _attention_cases(d, seed),
            what="Block", output_names=("the outputs of every call",), forbid=_forbid("block"),
            instead=_INSTEAD,
            mistakes=[Mistake(_safe(_attention_runner(block_variant(reference, kind))), hint)
                      for kind, hint in BLOCK_MISTAKES]))
        if not results[-1]:
            return results[-1]
    return _first_failure(results, "Block")


# --- 3. the model --------------------------------------------------------------------------


def _model_cfg(vocab=11, context=16, d=16, h=4, layers=2, d_ff=32):
    return bg.GPTConfig(vocab, context=context, d_model=d, num_heads=h, num_layers=layers,
                        d_ff=d_ff)


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
    """Exercise: ``cls(cfg)`` with the stub's ``__init__``; ``forward(tokens (b, n), start=0,
    caches=None) -> logits (b, n, vocab)``, positions ``start..start+n-1``, block ``i`` given
    ``caches[i]``. The reference blocks are put inside it; cached calls must equal one call."""
    refusal = _refuse_borrowed(cls, "GPT")
    if refusal is not None:
        return refusal
    cfg = _model_cfg()
    reference = _randomise(bg.GPT(cfg), 301, std=0.3)
    with torch.no_grad():
        reference.norm.weight.add_(1.0)
    module = _build(cls, (cfg,), reference, "GPT", swap={"blocks": reference.blocks})
    if isinstance(module, CheckResult):
        return module
    g = seeded(302)
    cases = [{"tokens": torch.randint(0, cfg.vocab_size, (b, n), generator=g), "split": split,
              "step": step}
             for b, n, split, step in [(1, 6, 0, 0), (2, 9, 0, 0), (3, 1, 0, 0),
                                       (2, cfg.context, 0, 0), (2, 9, 4, 1), (1, 12, 5, 3)]]
    cases.append({"tokens": torch.randint(0, cfg.vocab_size, (2, 5), generator=g), "split": 0,
                  "step": 0, "start": cfg.context - 5})       # start on its own, no caches
    return check_function(
        _model_runner(_with_cache_argument(module, "GPT.forward(tokens, start=0, caches=None)"),
                      cfg), _model_runner(reference, cfg), cases, what="GPT",
        output_names=("the logits of every call",), forbid=_forbid("model"), instead=_INSTEAD,
        mistakes=[Mistake(_safe(_model_runner(model_variant(reference, kind), cfg)), hint)
                  for kind, hint in MODEL_MISTAKES],
        error_hints=[("not subscriptable", "caches is None here, with start > 0: the checker "
                                           "calls the model at an offset without caches, to "
                                           "test start on its own. The positions come "
                                           "from the start argument (not from len(caches[0])), "
                                           "and block i gets None when caches is None."),
                     ("cache is full", "a cache filled up: each block keeps its own keys and "
                                       "values, so block i gets caches[i] (not caches[0] for "
                                       "all), and with a cache only the new tokens are fed, at "
                                       "positions start..start+n-1.")])


def _with_cache_argument(module: nn.Module, signature: str) -> Callable:
    """``module(*args)``, called with the input alone when there is no cache, and a forward that
    takes no cache arguments explained in words."""
    def run(*args):
        if all(a is None or a == 0 for a in args[1:]):
            return module(args[0])
        try:
            return module(*args)
        except TypeError as exc:
            if "positional argument" in str(exc):
                raise Refused(f"{signature.split('(')[0]} takes no cache ({exc}). Keep the "
                              f"stub's signature, {signature}, and hand the cache on.") from exc
            raise

    return run


def _model_runner(forward: Callable, cfg) -> Callable:
    """``run(tokens, split, step, start=0)``: split 0, one call ``forward(tokens)`` (or, with
    ``start``, ``forward(tokens, start, None)``: start tested on its own, no caches); else
    caches, the prompt ``tokens[:, :split]`` at start 0, then ``step`` tokens at a time."""
    def run(tokens, split, step, start=0):
        if not split:
            return forward(tokens, start, None) if start else forward(tokens)
        caches = [KVCache(cfg.context) for _ in range(cfg.num_layers)]
        return _in_pieces(lambda part, start: forward(part, start, caches), tokens, split, step)

    return run


# --- 4. the training step ------------------------------------------------------------------


@exercise("build_gpt.train_step", "the training step: next-character loss", hints=(
    "At each position the model predicts the next character: so which character of the chunk is "
    "the target of input position i, and how many predictions does a chunk of n + 1 characters "
    "hold? Then the usual three optimizer moves.",
    "Inputs and targets are two slices of the chunk's last axis, both (b, n), the targets one step "
    "ahead of the inputs: which end does each slice drop? F.cross_entropy wants "
    "(N, vocab) logits against (N,) ids: flatten the (b, n, vocab) logits to (b * n, vocab) and "
    "the targets to (b * n,); its default mean over the positions is the loss.",
    "inputs, targets = ...                     # (b, n) each: the chunk shifted by one\n"
    "logits = model(inputs)                    # (b, n, vocab)\n"
    "loss = F.cross_entropy(..., ...)          # logits (b * n, vocab), targets (b * n,)\n"
    "...                                       # the optimizer's three moves, in order\n"
    "return loss.item()"))
def check_train_step(train_step: Callable) -> CheckResult:
    """Exercise: ``train_step(model, optimizer, chunk (b, n + 1)) -> loss``: one step of
    next-character training; checked over two steps of SGD on a small reference GPT (the
    returned losses and the weights after)."""
    refusal = _function_or_refusal(train_step, "train_step")
    if refusal is not None:
        return refusal
    g = seeded(401)
    cases = [{"chunks": torch.randint(0, 11, (2, b, n + 1), generator=g), "seed": s}
             for b, n, s in [(2, 8, 1), (3, 16, 2), (1, 4, 3)]]
    return check_function(
        _two_steps(train_step), _two_steps(train_variant("right")), cases, what="train_step",
        output_names=("the two losses", "the weights after two steps"), atol=1e-5,
        forbid=_forbid("train_step"), instead=_INSTEAD,
        mistakes=[Mistake(_safe(_two_steps(train_variant(kind))), hint)
                  for kind, hint in TRAIN_MISTAKES],
        error_hints=TRAIN_ERROR_HINTS)


def _two_steps(step: Callable) -> Callable:
    def run(chunks, seed):
        torch.manual_seed(seed)
        model = bg.GPT(_model_cfg())
        # clipping inside step, as the optimizer train_gpt hands the learner (a step that also
        # clips gives the same weights)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        optimizer.step = bgt.clipped_step(optimizer, model, 1.0)
        model.train()
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


# Exercise 5 in a module of its own, imported last: the exercises register in the notebook's order.
from .build_gpt_generate import check_generate  # noqa: E402
