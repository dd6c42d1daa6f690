"""Checkers for notebook 10 (build a GPT): attention, the model (its block, then the GPT), the
training (its step, then the schedule and the loop) and generation, each against
:mod:`attn_helpers.lessons.build_gpt` on the same weights and random numbers. Each has a table of
named mistakes, ``(kind, hint)``; ``*_variant(..., kind)`` computes what that mistake gives."""

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
from . import core
from .core import CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise, passed

KEYS = ("attention", "model", "train", "generate")


def pick(name: str, learner, solution, what: str = ""):
    """The learner's ``name`` (one of :data:`KEYS`) if it passed in this kernel (the model: with
    attention and block too), else the reference; prints which (``what``: the piece's name)."""
    mine = all(passed(f"build_gpt.{key}") for key in ([*KEYS[:2]] if name == "model" else [name]))
    print(f"ran: {'your' if mine else 'the reference'} {what or name}" + ("" if mine else " (yours"
          + (", or a piece it uses," if name == "model" else "") + " has not passed yet)"))
    return learner if mine else solution


# --- the module exercises: build, run in pieces through a cache, compare gradients ----------------

def _build(cls, args: tuple, reference: nn.Module, what: str, swap: tuple):
    """``cls(*args)`` with the reference's weights (and its parts ``swap``), or the verdict."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return CheckResult(False, f"Not yet: {what} should be an nn.Module class, got "
                                  f"{type(cls).__name__}.")
    try:
        module = cls(*args)
        for name in swap:
            setattr(module, name, copy.deepcopy(getattr(reference, name)))
        module.load_state_dict(reference.state_dict())
    except NotImplementedError:
        return CheckResult(False, f"{what} is not implemented yet.")
    except Exception as exc:
        return CheckResult(False, f"Not yet: building {what}{args} and loading the reference's weights "
                                  f"failed ({type(exc).__name__}: {exc}). Keep the stub's __init__: the "
                                  "checker relies on its layer names.")
    return module.eval()


def _randomise(module: nn.Module, seed: int, std: float = 0.5, gain: float = 0.0) -> nn.Module:
    """Weights far from the training init, so every mistake shows; ``gain`` added to LayerNorms'."""
    g = seeded(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() > 1 else 0.3))
        for norm in (m for m in module.modules() if isinstance(m, nn.LayerNorm)):
            norm.weight.add_(gain)
    return module.eval()


def _check_module(cls, what: str, sizes: list, variant: Callable, mistakes: list, *,
                  forward: Callable = lambda m, x, start, cache: m(x, cache),
                  new_cache: Callable = lambda x: KVCache(x.shape[1]),
                  cases: Callable = lambda args, seed: _sequences(seed, args[0]), swap: tuple = (),
                  error_hints: tuple = (), std: float = 0.5) -> CheckResult:
    """``cls`` against the randomised reference ``bg.<what>(*args)`` for each ``(args, seed)`` of
    ``sizes`` (``swap``: its parts put in ``cls``'s), then the gradients after one backward."""
    def calls(m):
        """One call (``split`` 0), or ``x[:, :split]`` into a new cache, then ``step`` tokens a call."""
        def run(x, split, step, start=0):
            if not split:
                return forward(m, x, start, None)
            cache, ends = new_cache(x), [split, *range(split + step, x.shape[1], step), x.shape[1]]
            outs = [forward(m, x[:, s:e], s, cache) for s, e in zip([0, *ends[:-1]], ends, strict=True)]
            return None if any(o is None for o in outs) else torch.cat(outs, dim=1)

        return run

    for args, seed in sizes:
        ref = _randomise(getattr(bg, what)(*args), seed, std, gain=1.0)
        module = _build(cls, args, ref, what, swap)
        if isinstance(module, CheckResult):
            return module
        result = check_function(
            calls(module), calls(ref), cases(args, seed), what=what,
            output_names=("the outputs of every call",),
            mistakes=[Mistake(calls(variant(ref, kind)), hint) for kind, hint in mistakes],
            error_hints=[*error_hints, ("positional argument", "keep the stub's signature of "
                                        "forward, and hand the cache on.")])
        if not result:
            return result
    count = len(cases(args, seed))
    if len(sizes) > 1:
        result = CheckResult(True, f"Passed: {what} matches the reference on all {count * len(sizes)} "
                                   f"cases ({count} cases at each of {len(sizes)} model sizes), edge "
                                   "cases included.")
    x = cases(args, seed)[1]["x"]
    wrong = core.gradient_mismatch(module, ref, lambda m, x: forward(m, x, 0, None), x)
    if not wrong:
        return CheckResult(True, result.message.removesuffix(".") + ", and so are its gradients after "
                                                                     "one backward.")
    if parts := core.detached_parts(wrong, next((n for n in wrong if n.endswith("qkv.weight")), "")):
        why = (f"the gradient at qkv's {' and '.join(parts)} rows is wrong: was the "
               f"{' or the '.join(parts)} detached (detach(), .data, torch.no_grad())? The output is "
               "the same, but training would never change its projection")
    elif what == "Block" and list(wrong) == ["x"]:
        why = ("the gradient at the block's input x is wrong while every weight's is right: was the "
               "residual detached (x.detach() + ...)? The output is the same, but the gradient no "
               "longer flows down the residual stream to the blocks below")
    else:
        why = (f"the gradients at {', '.join(wrong)} differ from the reference's: perhaps part of "
               "the computation was detached, or done under torch.no_grad()")
    return CheckResult(False, f"Not yet: {what} gives the right outputs, but after one backward {why}.")


def _sequences(seed: int, d: int = 0, vocab: int = 0, shapes=((1, 5, 0, 0), (2, 7, 0, 0),
              (3, 1, 0, 0), (2, 9, 4, 1), (2, 8, 3, 5), (1, 12, 5, 3), (2, 6, 1, 1))) -> list[dict]:
    """A case per ``(b, n, split, step)``: ``x`` is ``(b, n, d)`` vectors, or ``(b, n)`` ids < vocab."""
    g = seeded(seed)
    return [{"x": torch.randint(0, vocab, (b, n), generator=g) if vocab else
             torch.randn(b, n, d, generator=g), "split": split, "step": step}
            for b, n, split, step in shapes]


# --- 1. causal multi-head self-attention with a KV cache ------------------------------------------

def attention_variant(ref: bg.CausalSelfAttention, kind: str = "right") -> Callable:
    """``forward(x, cache=None)`` with ``ref``'s weights and ``kind``'s mistake."""
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
                "one_ahead": torch.ones(n, start + n, dtype=torch.bool).tril(start + 1),
                "cache_unmasked": None if cache is not None else causal,
                "prompt_only": None if start else causal,
                "complement": ~causal[start:]}.get(kind, causal[start:])
        scale = {"scale_d_model": 1 / math.sqrt(d), "no_scale": 1.0}.get(kind)
        if kind in ("multiplied", "mask_added", "softmax_over_queries"):   # the softmax written out
            scores = q @ k.mT / math.sqrt(d // ref.num_heads)
            scores = {"multiplied": lambda: scores * mask, "mask_added": lambda: scores + mask}.get(
                kind, lambda: scores.masked_fill(~mask, -math.inf))()
            out = scores.softmax(dim=-2 if kind == "softmax_over_queries" else -1) @ v
        else:
            out, _ = scaled_dot_product_attention(q, k, v, mask, scale=scale)
        merged = out.reshape(b, n, d) if kind == "no_transpose" else merge_heads(out)   # (b, n, d)
        return merged if kind == "no_out_proj" else ref.out(merged)

    return run


ATTENTION_MISTAKES = [
    ("cache_unmasked", "with a cache, each new query sees every key: was start = len(cache) read after "
     "cache.append, or is there no mask? A prompt of n > 1 tokens must not see its future."),
    ("prompt_only", "only the prompt (start = 0) was masked: a later cached call can bring several "
     "tokens too. Mask every call, at its offset."),
    ("no_mask", "no causal mask, so the future leaks: new query i sees keys 0..start+i only."),
    ("upper", "the mask is upside down: causal_mask(n) is True on and below the diagonal (a query sees "
     "its past); you let each query see its future."),
    ("not_offset", "the mask is not offset by start: new query i sits at position start + i. (torch's "
     "is_causal=True makes this same mistake: it anchors its mask top-left.)"),
    ("not_read", "the cache is not appended to or not read: every call adds its keys and values to the "
     "cache and attends over all start + n of them."),
    ("kv_swapped", "k and v are swapped in the cache: cache.append(k, v) takes keys, then values."),
    ("no_out_proj", "W_O is missing: the merged heads go through self.out."),
    ("scale_d_model", "the scores are scaled by a wrong factor (such as 1/sqrt(d_model) or 1/d_h): "
     "each head's scale is 1/sqrt(d_h), with d_h = d / h."),
    ("no_scale", "the scores are not scaled: divide q k^T by sqrt(d_h)."),
    ("multiplied", "the scores were multiplied by the mask: a 0 score still gets weight e^0 > 0. Set "
     "masked scores to -inf before the softmax, or pass the mask to the attention step."),
    ("mask_added", "the 0/1 mask was added to the scores: a future key's score moves by 1 only, so it "
     "keeps weight. Set masked scores to -inf, or pass the bool mask to the attention step."),
    ("no_transpose", "the heads were merged by out.reshape(b, n, d) straight from (b, h, n, d_h), "
     "mixing positions with heads: transpose(1, 2) first, or use ah.merge_heads."),
    ("no_diagonal", "the mask hides each query's own position: new query i sees keys up to AND "
     "including start + i."),
    ("one_ahead", "the mask lets each query see one future key, start + i + 1: the future leaks. New "
     "query i sees keys 0..start+i only."),
    ("complement", "the mask is inverted (~mask): True marks the keys a query may see, those at or "
     "before its own position."),
    ("softmax_over_queries", "the softmax ran over dim=-2, the queries: each query's weights over the "
     "keys sum to 1, so use dim=-1."),
]

#: What the checker says when the learner's forward calls ``cache.attend``.
ATTEND_SHORTCUT = (
    "your forward calls cache.attend, notebook 05's finished attention step: it builds the mask "
    "and attends for you. This exercise asks you to write that step. Read cache.keys and "
    "cache.values after the append, build the (n, start + n) mask, and call "
    "ah.scaled_dot_product_attention.")


class _LessonCache(KVCache):
    def attend(self, *args, **kwargs):
        raise Refused(ATTEND_SHORTCUT)


@exercise("build_gpt.attention", "causal self-attention with a KV cache, at an offset", hints=(
    "Without a cache this is notebook 05's causal attention. With a cache holding `start` "
    "positions, the n new tokens sit at start..start+n-1: add their keys and values to the "
    "cache, then let new query i see every key up to start + i.",
    "With a cache, cache.append(k, v), then k and v are cache.keys and cache.values, (b, h, start + n, "
    "d_h). The mask is (n, start + n): which rows of a square causal mask are the new queries?",
    "if cache is not None:\n"
    "    ...              # add the new keys and values to the cache; k, v: everything it holds\n"
    "mask = ...           # (n, start + n), bool: row i is True at keys 0..start+i\n"
    "out = ...            # (b, h, n, d_h): the course's attention step of q on k, v under mask\n"
    "return ...           # (b, n, d): the heads side by side, then W_O"))
def check_attention(cls) -> CheckResult:
    """Exercise: ``cls(d_model, num_heads)``; ``forward(x (b, n, d), cache=None) -> (b, n, d)``,
    new query ``i`` seeing keys ``0..start+i``, the attention step written out."""
    return _check_module(
        cls, "CausalSelfAttention", [((16, 4), 101), ((12, 2), 102), ((8, 1), 103)],
        attention_variant, ATTENTION_MISTAKES, new_cache=lambda x: _LessonCache(x.shape[1]),
        error_hints=[(
            "does not broadcast", "the mask must be (n, start + n). After cache.append, len(cache) "
            "counts the new tokens too: read start = len(cache) before appending (the stub does).")])


# --- 2. the model, part one: the pre-norm block ---------------------------------------------------

def block_variant(ref: bg.Block, kind: str = "right") -> Callable:
    """``forward(x, cache=None)`` with ``ref``'s parts and ``kind``'s mistake."""
    n1, n2, ff = ref.norm1, ref.norm2, ref.ff

    def run(x, cache=None):
        def attn(y):
            return ref.attn(y, None if kind == "cache_not_passed" else cache)

        if kind in ("post_norm", "post_norm_attn", "post_norm_ff"):     # LN(x + sub(x)): one or both
            x = x + attn(n1(x)) if kind == "post_norm_ff" else n1(x + attn(x))
            return x + ff(n2(x)) if kind == "post_norm_attn" else n2(x + ff(x))
        if kind == "parallel":
            return x + attn(n1(x)) + ff(n2(x))
        if kind == "ff_first":
            x = x + ff(n2(x))
            return x + attn(n1(x))
        na, nf = {"no_norm": (nn.Identity(), nn.Identity()), "same_norm": (n1, n1),
                  "norms_swapped": (n2, n1), "ff_unnormed": (n1, nn.Identity())}.get(kind, (n1, n2))
        h = n1(na(x)) if kind == "norm1_twice" else na(x)
        x = {"no_attn_residual": 0, "residual_from_normed": h,
             "residual_from_normed_attn": h}.get(kind, x) + attn(h)
        h = nf(h if kind == "ff_reads_first_norm" else x)
        x = {"no_ff_residual": 0, "residual_from_normed": h, "residual_from_normed_ff": h}.get(kind, x)
        return n2(x + ff(h)) if kind == "output_normed" else x + ff(h)

    return run


BLOCK_MISTAKES = [
    ("post_norm", "norm after instead of before: that is the original post-norm block, LN(x + "
     "attn(x)). Pre-norm normalises the sub-layer's input and leaves the stream alone."),
    *((kind, "one sub-layer is post-norm, LN(x + sub(x)), the other pre-norm: both are pre-norm, x "
      "+ sub(LN(x)), each with its own LayerNorm.") for kind in ("post_norm_attn", "post_norm_ff")),
    ("no_attn_residual", "the residual is missing around attention: add attn(LN_1(x)) to x."),
    ("no_ff_residual", "the residual is missing around the feed-forward: add its output to the stream."),
    ("no_norm", "the LayerNorms are missing: each sub-layer reads LN(x), not x."),
    ("same_norm", "norm1 is used twice: the feed-forward reads norm2(x), its own LayerNorm."),
    ("residual_from_normed", "the residuals add to the normalised x: x + attn(LN(x)), not LN(x) + "
     "attn(LN(x))."),
    ("residual_from_normed_attn", "the attention's residual adds to the normalised x: x + "
     "attn(LN_1(x)), not LN_1(x) + attn(...)."),
    ("residual_from_normed_ff", "the feed-forward's residual adds to the normalised x: x + "
     "ff(LN_2(x)), not LN_2(x) + ff(...)."),
    ("norms_swapped", "the two LayerNorms are swapped: attention reads norm1, the feed-forward norm2."),
    ("parallel", "both sub-layers read the same input: the feed-forward reads the stream after "
     "attention's addition."),
    ("ff_reads_first_norm", "the feed-forward reads norm1's copy of the old x: it normalises the "
     "stream after attention's addition."),
    ("ff_first", "the feed-forward ran first: attention comes first."),
    ("ff_unnormed", "the feed-forward reads the stream itself: it reads norm2's copy, ff(norm2(x))."),
    ("norm1_twice", "norm1 ran twice before attention: attention reads one normalised copy, norm1(x)."),
    ("cache_not_passed", "the cache never reached the attention: the block hands it on."),
    ("output_normed", "the block normalises its output: it returns the stream itself. The one final "
     "LayerNorm is the model's, after the last block."),
]


def check_block(cls) -> CheckResult:
    """Exercise 2's first part: ``cls(d_model, num_heads, d_ff)``, pre-norm ``forward(x, cache)``."""
    return _check_module(
        cls, "Block", [((16, 4, 32), 201), ((12, 3, 20), 202)], block_variant, BLOCK_MISTAKES,
        swap=("attn",), error_hints=[(
            "cache is full", "the cache filled up: does the block call self.attn more than once? "
            "Each call appends its keys and values. Call it once per forward, and add its output.")])


# --- 2. the model, part two: the GPT --------------------------------------------------------------

def model_cfg(vocab=11, context=16, d=16, h=4, layers=2, d_ff=32) -> bg.GPTConfig:
    return bg.GPTConfig(vocab, context=context, d_model=d, num_heads=h, num_layers=layers, d_ff=d_ff)


def model_variant(ref: bg.GPT, kind: str = "right") -> Callable:
    """``forward(tokens, start=0, caches=None)`` with ``ref``'s parts and ``kind``'s mistake."""
    root_d = math.sqrt(ref.cfg.d_model)

    def run(tokens, start=0, caches=None):
        n, s = tokens.shape[1], 0 if kind == "positions_not_offset" else start
        positions = {"positions_from_tokens": tokens,
                     "positions_from_one": torch.arange(n) + s + 1}.get(kind, torch.arange(n) + s)
        tok = ref.token_embedding(tokens)
        pos = 0 if kind == "no_positions" else ref.position_embedding(positions)
        x = {"token_scaled": tok * root_d + pos, "position_scaled": tok + pos * root_d,
             "scaled_embeddings": (tok + pos) * root_d}.get(kind, tok + pos)
        blocks = {"first_block_only": ref.blocks[:1], "no_blocks": [],
                  "reversed_blocks": ref.blocks[::-1]}.get(kind, ref.blocks)
        for i, block in enumerate(blocks):
            x = block(x, None if caches is None or kind == "caches_not_passed" else caches[i])
            if kind == "norm_every_block" and i < len(blocks) - 1:
                x = ref.norm(x)
        logits = ref.head(x if kind == "no_final_norm" else ref.norm(x))
        return {"log_softmax_output": logits.log_softmax(-1),
                "softmax_output": logits.softmax(-1)}.get(kind, logits)

    return run


MODEL_MISTAKES = [
    ("no_positions", "the position embedding is missing: add E_pos at positions start..start+n-1. "
     "Without it the model knows order only indirectly, through the causal mask."),
    ("positions_from_tokens", "the position embedding is indexed by the token ids: index it by the "
     "positions start..start+n-1."),
    ("positions_from_one", "the positions start one too late: the first new character is at position "
     "start."),
    ("positions_not_offset", "the positions ignore start: the new tokens come after the start "
     "characters already cached, not at 0..n-1."),
    ("caches_not_passed", "the caches never reached the blocks: block i gets caches[i] (None without "
     "caches)."),
    ("no_final_norm", "the final LayerNorm is missing: pre-norm leaves the stream unnormalised after "
     "the last block."),
    ("norm_every_block", "the final LayerNorm ran after every block: it runs once, after the last "
     "block. Inside, each block leaves the stream unnormalised."),
    ("first_block_only", "only one block ran: x goes through every block of self.blocks."),
    ("scaled_embeddings", "the embeddings are multiplied by sqrt(d): add them as they are."),
    ("token_scaled", "the token embeddings are multiplied by sqrt(d) (the 2017 paper's convention, "
     "with fixed sinusoids): this GPT adds both learned embeddings as they are."),
    ("position_scaled", "the position embeddings are multiplied by sqrt(d): add E_pos as it is."),
    ("reversed_blocks", "the blocks ran in reverse order: x goes through self.blocks in order."),
    ("no_blocks", "the blocks never ran: the logits come straight from the embeddings."),
    ("log_softmax_output", "the model returns log_softmax(logits): return the raw logits."),
    ("softmax_output", "the model returns softmax(logits): return the raw logits; cross_entropy and "
     "sampling apply the softmax themselves."),
]


def _both(first: CheckResult | None, second: Callable[[], CheckResult]) -> CheckResult:
    """A merged exercise: ``second()`` once ``first`` (None: not given) passed; both messages."""
    if first is not None and not first:
        return first
    result = second()
    return result if first is None or not result else CheckResult(
        True, first.message + " " + result.message.replace("Passed: ", "And ", 1))


@exercise("build_gpt.model", "the model: a pre-norm block, then the GPT", hints=(
    "The block: attention, then the feed-forward, each with its own LayerNorm and a residual "
    "addition; the cache goes to the attention. Notebook 06's exercise layer was post-norm: it "
    "normalised each sum. Which layout leaves a path on which x is never normalised? The GPT: each "
    "token's embedding plus its position's goes through every block, a final LayerNorm, then the "
    "head. With caches, which positions do the n new tokens hold, and which cache does block i read?",
    "The block: no LayerNorm on a residual sum. Each sub-layer reads its own norm's copy of the "
    "stream, and its output is added to the stream itself; the feed-forward reads the stream after "
    "attention's addition. The GPT: start is the position of tokens[:, 0], with caches or without. "
    "Look the n positions up as one (n,) tensor: its (n, d) result broadcasts onto the (b, n, d) "
    "token embeddings. enumerate(self.blocks) gives block i its own cache (None without caches).",
    "# Block.forward:\n"
    "#     x = x + ...      # attention on norm1's copy of x, handed the cache\n"
    "#     return x + ...   # the feed-forward on norm2's copy of the updated x\n"
    "# GPT.forward:\n"
    "positions = ...      # (n,): the positions the n new tokens hold\n"
    "x = ...              # (b, n, d): token plus position embeddings\n"
    "for i, block in ...:    # every block in order, with its index i\n"
    "    x = ...          # block i on x, handed its own cache (None without caches)\n"
    "return ...           # (b, n, vocab): the final norm, then the head"))
def check_model(cls, block=None) -> CheckResult:
    """Exercise: ``block`` (if given) as :func:`check_block`, then ``cls(cfg)``; ``forward(tokens
    (b, n), start=0, caches=None) -> (b, n, vocab)``, run with the reference's blocks."""
    cfg = model_cfg()

    def cases(args, seed):          # ids, the last case at start = context - 5 without caches
        ids = _sequences(seed + 1, vocab=cfg.vocab_size, shapes=[
            (1, 6, 0, 0), (2, 9, 0, 0), (3, 1, 0, 0), (2, cfg.context, 0, 0), (2, 9, 4, 1),
            (1, 12, 5, 3), (2, 5, 0, 0)])
        ids[-1]["start"] = cfg.context - 5
        return ids

    return _both(None if block is None else check_block(block), lambda: _check_module(
        cls, "GPT", [((cfg,), 301)], model_variant, MODEL_MISTAKES,
        forward=lambda m, x, start, caches: m(x, start, caches),
        new_cache=lambda x: [KVCache(cfg.context) for _ in range(cfg.num_layers)],
        cases=cases, swap=("blocks",), std=0.3,
        error_hints=[("not subscriptable", "caches is None here, with start > 0: the positions come "
                      "from the start argument (not from len(caches[0])), and block i gets None "
                      "when caches is None."),
                     ("cache is full", "a cache filled up: block i gets caches[i] (not caches[0] "
                      "for all)."),
                     ("list.append", "a block got the whole caches list: block i gets caches[i], "
                      "its own cache (None without caches).")]))


# --- 3. the training, part one: the step ----------------------------------------------------------

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
        if kind == "reshape_not_transpose":                # (b, n, V) -> (b, V, n): scrambled
            flat = logits.reshape(logits.shape[0], -1, logits.shape[1]), targets
        loss = {"nll_on_logits": lambda: F.nll_loss(*flat),
                "sum": lambda: F.cross_entropy(*flat, reduction="sum"),
                "sum_over_positions": lambda: F.cross_entropy(   # summed over positions, mean over b
                    logits.transpose(1, 2), targets, reduction="none").sum(1).mean(),
                }.get(kind, lambda: F.cross_entropy(*flat))()
        if kind != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        if kind == "zero_grad_late":
            optimizer.zero_grad()
        params = list(model.parameters())
        clip = {"clip_each": lambda: [nn.utils.clip_grad_norm_([p], 1.0) for p in params],
                "clip_value": lambda: nn.utils.clip_grad_value_(params, 1.0),
                "clip_small": lambda: nn.utils.clip_grad_norm_(params, 0.5),
                "no_clip": lambda: None}.get(kind, lambda: nn.utils.clip_grad_norm_(params, 1.0))
        clip()
        if kind != "no_step":
            optimizer.step()
        if kind == "loss_after_step":                     # the loss of the updated weights
            with torch.no_grad():
                loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        return loss.item()

    return step


TRAIN_MISTAKES = [
    ("not_shifted", "the targets are not shifted: the target of input i is the character one after it."),
    ("whole_chunk", "inputs and targets are both the whole chunk: the model learns to copy. A chunk of "
     "n + 1 characters gives n inputs and n targets: which n of each?"),
    ("shifted_backwards", "the shift goes the wrong way: the targets are the later of the two slices."),
    ("no_zero_grad", "the gradients are never zeroed, so they pile up: call optimizer.zero_grad() "
     "before loss.backward()."),
    # zeroing the gradients between backward and step ("zero_grad_late") gives these same outputs
    ("no_step", "the weights did not change: zero the gradients before loss.backward(), not after it, "
     "and call optimizer.step() after it."),
    ("sum", "the loss is summed over positions: take the mean (cross_entropy's default)."),
    ("sum_over_positions", "the loss is summed over each chunk's positions: a per-character loss is "
     "the mean over every position."),
    ("reshape_not_transpose", "reshape(b, V, n) keeps the memory order, so it mixes characters and "
     "positions: cross_entropy wants logits.transpose(1, 2), or both flattened."),
    ("softmax_first", "softmax was applied before cross_entropy, which takes raw logits."),
    ("nll_on_logits", "F.nll_loss on raw logits expects log-probabilities: use F.cross_entropy."),
    ("last_only", "only the last position is trained: every position predicts its next character."),
    ("no_clip", "the gradient was unclipped, clipped after optimizer.step() (too late: the step used "
     "it unclipped), clipped to a larger max_norm than 1.0, or piece by piece: clip the joint norm of "
     "all gradients together, not each one or by value, with "
     "nn.utils.clip_grad_norm_(model.parameters(), 1.0) between backward and step."),
    ("clip_small", "the gradient was clipped to a max_norm below the recipe's 1.0: "
     "nn.utils.clip_grad_norm_(model.parameters(), 1.0)."),
    ("loss_after_step", "the loss you returned was computed after optimizer.step(), on the updated "
     "weights: return the loss the gradients came from."),
]


def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _two_steps(step: Callable) -> Callable:
    """``run(chunks, seed)``: two SGD steps of ``step`` on a randomised GPT, gradients far over 1."""
    def run(chunks, seed):
        model = _randomise(bg.GPT(model_cfg()), seed, std=0.3).train()
        optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.5), []
        for chunk in chunks:
            loss = step(model, optimizer, chunk.clone())
            if loss is None or isinstance(loss, torch.Tensor):
                raise Refused("train_step returned " + ("None" if loss is None else "a tensor, which "
                              "keeps its whole graph in memory") + ": return the loss as a float, "
                              "loss.item().")
            losses.append(float(loss))
        return torch.tensor(losses, dtype=torch.float64), _weights(model)

    return run


def check_train_step(train_step: Callable) -> CheckResult:
    """Exercise 3's first part: ``train_step(model, optimizer, chunk (b, n + 1))``, two SGD steps."""
    g = seeded(401)
    cases = [{"chunks": torch.randint(0, 11, (2, b, n + 1), generator=g), "seed": s}
             for b, n, s in [(2, 8, 1), (3, 16, 2), (1, 4, 3)]]
    return check_function(
        _two_steps(train_step), _two_steps(bg.train_step), cases, what="train_step",
        output_names=("the two losses", "the weights after two steps"), atol=1e-5,
        mistakes=[Mistake(_two_steps(train_variant(kind)), hint) for kind, hint in TRAIN_MISTAKES],
        error_hints=[
            ("Expected target size", "F.cross_entropy reads the classes on dim 1: flatten the (b, "
             "n, vocab) logits and the targets over the positions."),
            ("past the context", "the whole chunk of n + 1 characters went in: the last one has "
             "nothing to predict, so it is never an input.")])


# --- 3. the training, part two: the schedule and the loop -----------------------------------------

def schedule_variant(kind: str = "right") -> Callable:
    """``learning_rate(step, recipe)`` with ``kind``'s mistake."""
    def learning_rate(step, recipe):
        peak, low, warmup, steps = recipe.lr, recipe.min_lr, recipe.warmup, recipe.steps
        if kind == "constant":
            return peak
        if (step <= warmup if kind == "warmup_le" else step < warmup) and kind != "no_warmup":
            return peak * (step if kind == "warmup_from_zero" else step + 1) / warmup
        progress = step / steps if kind in ("no_warmup", "cosine_over_all") \
            else (step - warmup) / max(1, steps - warmup - (kind == "progress_short"))
        low, cos = 0.0 if kind == "to_zero" else low, math.cos(math.pi * progress)
        return {"linear": lambda: low + (peak - low) * (1 - progress),
                "no_half": lambda: low + (peak - low) * cos,
                "min_lr_not_subtracted": lambda: low + 0.5 * peak * (1 + cos),
                "clamped": lambda: max(low, 0.5 * peak * (1 + cos)),
                }.get(kind, lambda: low + 0.5 * (peak - low) * (1 + cos))()

    return learning_rate


SCHEDULE_MISTAKES = [
    ("constant", "the rate never changes: a linear warm-up, then a cosine to recipe.min_lr."),
    ("no_warmup", "there is no warm-up: step s < warmup gets recipe.lr * (s + 1) / recipe.warmup."),
    ("warmup_from_zero", "the first step gets a rate of 0, a wasted step: step s gets recipe.lr * (s + "
     "1) / recipe.warmup."),
    ("warmup_le", "the rate passes recipe.lr at step recipe.warmup: the warm-up covers steps "
     "0..warmup-1 (step < recipe.warmup), and its last step reaches the peak."),
    ("progress_short", "the cosine reaches min_lr one step early: p = (step - warmup) / (steps - "
     "warmup) stays below 1, as in the formula."),
    ("cosine_over_all", "the cosine counts from step 0: its progress is (step - warmup) / (steps - "
     "warmup)."),
    ("to_zero", "the cosine ends at 0: it ends at recipe.min_lr."),
    ("linear", "the decay is linear: after the warm-up it follows half a cosine period."),
    ("min_lr_not_subtracted", "the cosine starts at lr + min_lr: it scales the range, (lr - min_lr) * "
     "(1 + cos(pi * progress)) / 2, added to min_lr."),
    ("clamped", "the cosine falls to 0 and is cut off at min_lr, max(min_lr, ...): it should run "
     "from lr down to min_lr, min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2."),
    ("no_half", "cos(pi * p) runs from 1 to -1, so the rate goes negative: use (1 + cos(pi * p)) / 2."),
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
            for group in optimizer.param_groups[:1 if kind == "first_group_only" else None]:
                group["lr"] = bg.learning_rate(step, recipe)

        optimizer, n, curve, chunk, losses = new_optimizer(), model.cfg.context, [], None, []
        data = corpus.val if kind == "batches_from_val" else corpus.train
        high = len(data) - n - (0 if kind == "randint_high" else 1)
        width = n if kind == "chunk_short" else n + 1
        for step in range(recipe.steps if stop is None or kind == "stop_ignored" else stop):
            if kind == "optimizer_each_step":
                optimizer = new_optimizer()
            if kind not in ("no_schedule", "lr_after_step"):
                set_rate(step)
            if chunk is None or kind != "same_batch":
                starts = torch.randint(int(kind == "randint_low"), high, (recipe.batch,),
                                       generator=None if kind == "no_generator" else generator)
                chunk = torch.stack([data[s:s + width] for s in starts.tolist()])
            losses.append(train_step(model, optimizer, chunk))
            if kind == "lr_after_step":
                set_rate(step)
            done = step if kind == "eval_off_by_one" else step + 1
            if done % recipe.eval_every or kind == "no_eval":
                continue
            train_loss = {"batch_loss": losses[-1],                 # the mean since the last evaluation
                          "batch_loss_mean": sum(losses) / len(losses)}.get(
                              kind, bg.estimate_loss(model, corpus.train, n))
            losses, val_loss = [], bg.estimate_loss(model, corpus.val, n)
            if kind == "eval_swapped":
                train_loss, val_loss = val_loss, train_loss
            curve.append((step if kind == "step_label" else step + 1, train_loss, val_loss))
        return curve

    return train


LOOP_MISTAKES = [
    ("no_schedule", "the rate was never set, so AdamW kept 0.001: before each step set group['lr'] = "
     "learning_rate(step, recipe) in optimizer.param_groups."),
    ("first_group_only", "the rate was set in the first parameter group only, so the biases and "
     "LayerNorm gains kept AdamW's default 0.001: set it in every group of optimizer.param_groups."),
    ("no_generator", "the batches were drawn from torch's global random numbers: draw them with the "
     "given generator, torch.randint(..., generator=generator), to get the reference's batches."),
    ("lr_after_step", "the rate is set after the step: set it before calling train_step."),
    ("optimizer_each_step", "a new AdamW at every step restarts its running averages: build it once."),
    ("batches_from_val", "the batches come from the held-out text: train on corpus.train only."),
    ("same_batch", "one batch is used at every step: draw a fresh one inside the loop."),
    *((kind, "every chunk you draw is valid, but your batches differ from the reference's: draw "
      "torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), generator=generator).")
      for kind in ("randint_high", "randint_low")),
    ("chunk_short", "each chunk holds n characters: it needs n + 1."),
    ("eval_off_by_one", "the evaluations come one step early: evaluate when (step + 1) % "
     "recipe.eval_every == 0."),
    ("step_label", "the curve's steps are one low: after step s (counted from 0), s + 1 steps are "
     "done, so record step + 1."),
    ("eval_swapped", "the curve's two losses are swapped: (steps done, training, held-out)."),
    ("batch_loss", "the curve's training loss is one noisy batch's: use bg.estimate_loss(model, "
     "corpus.train, n)."),
    ("batch_loss_mean", "the curve's training loss is the mean of the batch losses since the last "
     "evaluation, as a training log prints: estimate it like the held-out one."),
    ("no_eval", "the curve is empty: every recipe.eval_every steps append (step + 1, training loss, "
     "held-out loss)."),
    ("stop_ignored", "stop was ignored: run only steps 0..stop-1 (the schedule still spans "
     "recipe.steps)."),
]


def _rates(learning_rate: Callable) -> Callable:
    return lambda recipe: torch.tensor([float(learning_rate(s, recipe)) for s in range(recipe.steps)],
                                       dtype=torch.float64)


def _run_loop(train: Callable) -> Callable:
    """``run(recipe, stop, seed)``: the curve and the weights after, on a random 11-letter text,
    with a one-block model of context 8 (small, so that every named mistake is quick to run)."""
    def run(recipe, stop, seed):
        g = seeded(601)
        corpus = bg.Corpus("abcdefghijk", torch.randint(0, 11, (200,), generator=g),
                           torch.randint(0, 11, (60,), generator=g))
        torch.manual_seed(seed)
        model = bg.GPT(model_cfg(context=8, d=8, h=2, layers=1, d_ff=16))
        curve = train(model, bg.train_step, corpus, recipe, torch.Generator().manual_seed(seed), stop)
        if curve is None:
            raise Refused("train returned None: return the curve.")
        rows = [[float(x) for x in row] for row in curve]
        if any(len(row) != 3 for row in rows):
            raise Refused("each entry of the curve should be (step, training, held-out loss).")
        return torch.tensor(rows, dtype=torch.float64).reshape(-1, 3), _weights(model)

    return run


@exercise("build_gpt.train", "the training: step, schedule, batches, evaluation", hints=(
    "train_step: each position predicts the next character: which character is the target of input "
    "i, and how many predictions does a chunk of n + 1 hold? Then the usual optimizer moves, the "
    "gradient clipped before the step. learning_rate: a straight line up for the warm-up, then half "
    "a cosine period down to min_lr. train: each step set the rate, draw a batch, take one step; "
    "every eval_every steps record both losses.",
    "train_step: inputs and targets are two (b, n) slices, the targets one step ahead: which end does "
    "each drop? F.cross_entropy wants (N, vocab) logits against (N,) ids: flatten both. "
    "learning_rate: step s < warmup gets lr * (s + 1) / warmup; then p = (s - warmup) / (steps - "
    "warmup) runs 0 to 1 and the rate is min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2. train: the "
    "rate goes in every parameter group; the batch is recipe.batch starts from torch.randint with "
    "the given generator, n + 1 characters from each.",
    "# train_step, in four steps:\n"
    "#     inputs, targets = ...   # two (b, n) slices of the chunk, the targets one ahead\n"
    "#     loss = ...              # the mean cross-entropy over all b * n predictions\n"
    "#     ...                     # zero the gradients, backward, clip the joint norm, step\n"
    "#     return ...              # the loss as a float\n"
    "# learning_rate: the warm-up line while step < recipe.warmup, else level 2's cosine.\n"
    "# train, inside the loop (after the stub's rate = learning_rate(step, recipe)):\n"
    "for group in optimizer.param_groups:\n"
    "    ...              # this step's rate into the group\n"
    "starts = ...         # (recipe.batch,) random starts, drawn as the text says\n"
    "chunk = ...          # (b, n + 1): n + 1 characters of corpus.train from each start\n"
    "...                  # one training step on the chunk\n"
    "if ...:              # after every recipe.eval_every steps\n"
    "    curve.append(...)   # (steps done, training loss, held-out loss), each estimated"))
def check_train(train: Callable, learning_rate: Callable, train_step: Callable | None = None
                ) -> CheckResult:
    """Exercise: ``train_step`` (if given) as :func:`check_train_step`, then ``learning_rate(step,
    recipe) -> float`` and ``train(model, train_step, corpus, recipe, generator, stop=None)``."""
    recipes = [{"recipe": bg.Recipe(steps=s, batch=2, lr=lr, warmup=w, min_lr=m)}
               for s, lr, w, m in [(20, 0.1, 5, 0.01), (12, 3e-3, 1, 0.0), (50, 1e-3, 10, 1e-4),
                                   (8, 0.5, 3, 0.05)]]
    runs = [{"recipe": bg.Recipe(steps=s, batch=b, lr=lr, warmup=w, min_lr=m, eval_every=e),
             "stop": stop, "seed": seed}
            for s, b, lr, w, m, e, stop, seed in [(6, 3, 0.02, 2, 0.002, 3, None, 1),
                                                  (4, 2, 0.05, 2, 0.0, 2, None, 2),
                                                  (8, 2, 0.01, 3, 0.001, 2, 4, 3)]]

    def schedule_and_loop():
        result = check_function(
            _rates(learning_rate), _rates(bg.learning_rate), recipes, what="learning_rate",
            output_names=("the rates of every step",), atol=1e-9, rtol=1e-7,
            mistakes=[Mistake(_rates(schedule_variant(kind)), hint) for kind, hint in SCHEDULE_MISTAKES])
        if result:
            result = check_function(
                _run_loop(train), _run_loop(bg.train), runs, what="train",
                output_names=("the curve (step, training loss, held-out loss)", "the weights after"),
                atol=1e-5, mistakes=[Mistake(_run_loop(loop_variant(kind)), hint)
                                     for kind, hint in LOOP_MISTAKES])
        return result if not result else CheckResult(
            True, f"Passed: learning_rate matches the reference on every step of {len(recipes)} "
                  f"recipes, and train gives the reference's curve and weights on all {len(runs)} runs.")

    return _both(None if train_step is None else check_train_step(train_step), schedule_and_loop)


# --- 4. generation with a KV cache ----------------------------------------------------------------

def generate_variant(kind: str = "right") -> Callable:
    """``generate(...)`` with ``kind``'s mistake (``"top_k_indices"`` is right too)."""
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
                kth = logits.topk(k, dim=-1, largest=kind != "top_k_smallest").values[:, -1:]
                if kind == "top_k_off_by_one":                   # all masked at k = 1: uniform
                    logits = logits.masked_fill(logits <= kth, -math.inf)
                    logits = torch.where(logits.isinf().all(-1, keepdim=True), 0.0, logits)
                else:
                    logits = logits.masked_fill(logits < kth, 0.0 if kind == "top_k_zero" else -math.inf)
            probs = torch.softmax(logits, dim=0 if kind == "softmax_dim0" else -1)
            probs = probs / (temperature if kind == "temperature_after_softmax" else 1)
            if kind == "greedy":
                nxt = probs.argmax(-1, keepdim=True)
            elif kind == "top_k_indices" and top_k is not None:
                values, indices = logits.topk(top_k, dim=-1)
                nxt = indices.gather(-1, torch.multinomial(values.softmax(-1), 1, generator=generator))
            else:
                nxt = torch.multinomial(probs, 1, generator={"no_generator": None}.get(kind, generator))
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
     "every one already cached."),
    ("start_is_length", "start = tokens.shape[1] is one past the new character: how many precede it?"),
    ("temperature_after_softmax", "temperature after the softmax changes nothing once renormalised: "
     "divide the logits by T."),
    ("temperature_times", "the logits were multiplied by T: divide them by T."),
    ("first_position", "the next character was sampled from the FIRST position's logits: use the last, "
     "[:, -1]."),
    ("top_k_off_by_one", "top-k keeps k - 1 characters: mask only logits below the k-th largest."),
    ("whole_sequence_cached", "tokens already in the cache were fed again: after the prompt, feed only "
     "the token just sampled (n = 1), at its own position."),
    ("greedy", "the next character was the argmax: sample it with torch.multinomial(probs, 1, "
     "generator=generator)."),
    ("no_generator", "your generate drew from torch's global random numbers: pass generator=generator "
     "to torch.multinomial."),
    ("top_k_zero", "the logits outside the top k were set to 0, not -inf: a logit of 0 keeps a "
     "probability. Set them to float('-inf')."),
    ("no_top_k", "top_k was ignored: set all but the k largest logits to -inf."),
    ("top_k_smallest", "topk(largest=False) finds the k smallest logits: the cut-off is the k-th "
     "largest, logits.topk(k).values[:, -1:]."),
    ("softmax_dim0", "the softmax ran over dim 0, across the batch: each row's probabilities sum to "
     "1 over the characters, softmax(logits, dim=-1)."),
    ("top_k_plus_one", "top-k kept k + 1 characters: the cut-off is the k-th largest logit."),
    ("start_frozen", "start stayed at the prompt's length: each new character sits one position after "
     "the previous one."),
    ("crop_first", "past the context you kept the FIRST n_ctx characters: the window is the last."),
    ("crop_short", "past the context the window held n_ctx - 1 characters: the model reads n_ctx, at "
     "positions 0..n_ctx-1."),
]

#: What a learner's generate does once the text outgrows the context.
PAST_CONTEXT = {
    "cached": "with the cache, the step after the text reached n_ctx = model.cfg.context characters "
              "had nowhere to go: positions stop at n_ctx - 1. Past that the model reads the last "
              "n_ctx characters: at which positions now, and at which were the cached keys made?",
    "stale": "past the context the window went into a cache whose keys were computed when each "
             "character sat further on. With learned absolute positions, what is a cached key "
             "worth once its character has moved?",
    "plain": "without the cache the whole text went in, but the model reads a window of n_ctx = "
             "model.cfg.context characters, at positions 0..n_ctx-1: which n_ctx?",
}


class _Recording(bg.GPT):
    """Records each call as ``(n, start, cache used)``; an empty cache with n > 1 counts as none."""

    def forward(self, tokens, start=0, caches=None):
        n = tokens.shape[1]
        self.calls.append((n, start, caches is not None and (n == 1 or len(caches[0]) > 0)))
        return super().forward(tokens, start, caches)


def _sampler(generate: Callable, model: _Recording) -> Callable:
    """``generate``'s tokens, generator seeded ``seed`` (torch's: ``seed + 1``); misuse explained."""
    def run(prompt, steps, temperature, top_k, use_cache, seed):
        model.calls = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            try:
                return generate(model, prompt, steps, temperature, top_k, use_cache,
                                torch.Generator().manual_seed(seed))
            except ValueError as exc:
                misuse = _cache_misuse(model.calls, prompt.shape[1], steps, use_cache, model.cfg.context)
                if misuse is None or not ("cache is full" in str(exc) or "past the context" in str(exc)):
                    raise
                raise Refused(f"generate failed ({exc}): {misuse}") from exc

    return run


@exercise("build_gpt.generate", "generation with a KV cache, temperature and top-k", hints=(
    "With a cache the prompt runs once; after that only the new character runs, at its own "
    "position. Temperature and top-k reshape the logits before the softmax. Past the context, "
    "positions count from the start of the window the model reads.",
    "The logits are the last position's, (b, vocab), over T. Top-k: which number per row "
    "separates the k largest, and what must the others become? Past the context every character "
    "moves one position down each step: what does that do to cached keys?",
    "logits = ...         # (b, vocab): the last position's, over T\n"
    "if top_k is not None:\n"
    "    kth = ...        # (b, 1): each row's k-th largest logit\n"
    "    logits = ...     # the logits below kth set to -inf\n"
    "nxt = ...            # (b, 1): one draw per row from the probabilities, with the generator\n"
    "tokens = ...         # nxt appended to each row\n"
    "if use_cache and ...:    # the cache still has room\n"
    "    new, start = ...     # nxt at its position\n"
    "else:                    # no cache, or past the context\n"
    "    new, start, caches = ...   # the window the model reads, from position 0"))
def check_generate(generate: Callable) -> CheckResult:
    """Exercise: ``generate(model, prompt (b, n0), steps, temperature, top_k, use_cache,
    generator) -> (b, n0 + steps)``: the reference's tokens, then how it used the cache."""
    model = _randomise(_Recording(model_cfg(vocab=13, context=12, layers=2)), 501, std=0.4)
    g = seeded(502)
    cases = [{"prompt": torch.randint(0, 13, (b, n0), generator=g), "steps": steps,
              "temperature": t, "top_k": k, "use_cache": cache,
              "seed": int(torch.randint(0, 1000, (1,), generator=g))}
             for b, n0, steps, t, k, cache in [     # within, at and past the context of 12
                 (2, 3, 6, 1.0, None, True), (2, 3, 6, 1.0, None, False),
                 (3, 5, 6, 0.5, None, True), (2, 1, 10, 2.0, 4, True), (2, 4, 5, 0.7, 3, False),
                 (1, 6, 6, 1.3, 1, True), (2, 4, 18, 0.9, None, True),
                 (2, 4, 18, 0.9, None, False), (1, 10, 7, 1.0, 5, True)]]
    exact = {"what": "generate", "output_names": ("the tokens",), "atol": 0, "rtol": 0}
    result = check_function(_sampler(generate, model), _sampler(bg.generate, model), cases,
                            mistakes=[Mistake(_sampler(generate_variant(kind), model), hint)
                                      for kind, hint in GENERATE_MISTAKES], **exact)
    if not result:      # sampling among the k largest draws other random numbers, and is right
        among_k = check_function(_sampler(generate, model),
                                 _sampler(generate_variant("top_k_indices"), model), cases, **exact)
        if not among_k:
            return result
        result = CheckResult(True, among_k.message + " (You sample among the k largest logits: "
                             "right too, checked against that way of sampling.)")
    for case in cases:
        _sampler(generate, model)(**case)
        if misuse := _cache_misuse(model.calls, case["prompt"].shape[1], case["steps"],
                                   case["use_cache"], model.cfg.context):
            return CheckResult(False, "Not yet: the tokens are right, but " + misuse)
    return result


def _cache_misuse(calls: list, n0: int, steps: int, use_cache: bool, T: int) -> str | None:
    """What went wrong first in ``calls`` (``(n, start, cache used)`` each), or None. Past the
    context, a fresh cache refilled with the window but its last one, then that one, is one call."""
    merged = []
    for call in calls:
        refill = merged[-1:] == [(T - 1, 0, False)] and call == (1, T - 1, True)
        if use_cache and refill and n0 + len(merged) - 1 > T:
            merged[-1] = (T, 0, False)
        else:
            merged.append(call)
    for j, (n, start, used) in enumerate(merged):
        L = n0 + j                                       # the text's length before call j + 1
        want = (min(L, T), 0, False) if L > T or not use_cache or not j else (1, L - 1, True)
        if (n, start) == want[:2] and (used == want[2] or (use_cache and not j)):
            continue
        if j >= steps:
            return (f"call {j + 1} (n = {n}) came after the last of {steps} characters was sampled: "
                    "its output is never used.\nHint: run the model only for a character to come.")
        ran = (f"call {j + 1} (prompt of {n0}, the text {L} characters long) ran n = {n} at "
               f"start = {start} {'with' if used else 'without'} the cache (expected: n = "
               f"{want[0]} at start = {want[1]} {'with' if want[2] else 'without'} it)")
        if L > T:
            why = "stale" if used and n > 1 else "cached" if used else "plain"
            return f"past the context n_ctx = {T}, {ran}.\nHint: {PAST_CONTEXT[why]}"
        if not use_cache:
            return (f"use_cache=False did not run without the cache: {ran}.\nHint: without it, "
                    "every step re-runs the whole sequence from position 0, caches=None.")
        if not j:
            return (f"the prompt of {n0} did not run in one call: {ran}.\nHint: with the cache, "
                    "the prompt runs once, at position 0; then one new token per call.")
        if not used and (L, n, start) == (T, T, 0):
            return ("the cache was dropped one step early: " + (f"calls 2..{j} used it, but "
                    if j > 1 else "") + f"{ran}: that text is exactly n_ctx = {T} characters long."
                    f"\nHint: its last character sits at position {T - 1}, and the cache has "
                    "room for it. Which comparison of the length with n_ctx says it is full?")
        if not used:
            return (("the cache was never used: " if j == 1 else
                     f"the cache was dropped after call {j}: ") + ran + ".\nHint: hand the "
                    "same caches to every call; only past n_ctx does the window drop them.")
        return f"{ran}.\nHint: {dict(GENERATE_MISTAKES)['whole_sequence_cached']}"
    return None
