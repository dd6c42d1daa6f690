"""Checkers for notebook 10 (build a GPT): the learner's causal self-attention, pre-norm block,
model, training step and generation with a KV cache, each run against the reference of
:mod:`attn_helpers.lessons.build_gpt` with the same weights.

A module exercise gives ``__init__`` and asks for ``forward``; the checker loads the reference's
weights into the learner's module, with reference parts where they are not the exercise (the
block gets the reference attention, the model the reference blocks): one piece per checker. Its
outputs are compared (cached calls included), then its gradients after one backward. Each
``*_variant(...)`` builds what one known mistake gives (``"right"``: the correct answer); the
``*_MISTAKES`` lists pair each with the hint that names it.
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

__all__ = ["ATTENTION_MISTAKES", "BLOCK_MISTAKES", "GENERATE_MISTAKES", "MODEL_MISTAKES",
           "LOOP_MISTAKES", "SCHEDULE_MISTAKES", "TRAIN_MISTAKES", "attention_variant",
           "block_variant", "check_attention", "check_block", "check_generate", "check_model",
           "check_train", "check_train_step", "generate_variant", "in_pieces", "loop_variant",
           "model_variant", "passed", "pieces", "schedule_variant", "train_variant"]

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


# --- shared by the checkers ------------------------------------------------------------------


def in_pieces(call: Callable, x: torch.Tensor, split: int, step: int):
    """``call(x[:, :split], 0)``, then ``call(x[:, t:t + step], t)`` for ``t = split, split +
    step, ...``: the outputs concatenated along the positions (None if any call returned None).
    The checkers run a cache this way: a prompt, then new tokens a few at a time."""
    starts = [0, *range(split, x.shape[1], step)]
    outs = [call(x[:, s:e], s) for s, e in zip(starts, [*starts[1:], x.shape[1]], strict=True)]
    if any(o is None for o in outs):
        return None
    return torch.cat(outs, dim=1)


def _safe(produce: Callable) -> Callable:
    """A mistake that crashes on a case simply does not match it."""

    def run(*args):
        try:
            return produce(*args)
        except Exception:
            return None

    return run


def _first_failure(results, what: str = "it") -> CheckResult:
    """The first failed result, else one verdict: ``what`` matched the reference on every case of
    every model size."""
    results = list(results)
    for result in results:
        if not result:
            return result
    counts = [int(r.message.split(" all ")[1].split()[0]) for r in results]
    sizes = f" ({counts[0]} cases at each of {len(counts)} model sizes)" if len(set(counts)) == 1 \
        and len(counts) > 1 else ""
    return CheckResult(True, f"Passed: {what} matches the reference on all {sum(counts)} "
                             f"cases{sizes}, edge cases included.")


def _build(cls, args: tuple, reference: nn.Module, what: str, swap: dict | None = None):
    """The learner's module ``cls(*args)`` with the reference's weights, or a CheckResult."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return CheckResult(False, f"Not yet: {what} should be an nn.Module class, got "
                                  f"{type(cls).__name__}.")
    try:
        module = cls(*args)
        for name, part in (swap or {}).items():
            setattr(module, name, copy.deepcopy(part))
        module.load_state_dict(reference.state_dict())
    except NotImplementedError:
        return CheckResult(False, f"{what} is not implemented yet.")
    except Exception as exc:
        return CheckResult(False, f"Not yet: building {what}{args} and loading the reference's "
                                  f"weights failed ({type(exc).__name__}: {exc}). Keep the stub's "
                                  "__init__: the checker relies on its layer names.")
    module.eval()
    return module


def _randomise(module: nn.Module, seed: int, std: float = 0.5) -> nn.Module:
    """Weights far from the tiny training init, so every mistake shows in the output."""
    g = seeded(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() > 1 else 0.3))
    return module.eval()


# --- the known mistakes -------------------------------------------------------------------------


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


ATTENTION_MISTAKES = [
    ({"mask": "cache_unmasked"}, "the mask is left out when there is a cache, as if a cached call "
                                 "always brought one token (notebook 05's step). Here the prompt "
                                 "arrives as n > 1 tokens at start 0 with a cache, and the n new "
                                 "queries must not see each other's future: mask with a cache too."),
    ({"mask": "prompt_only"}, "only the prompt (start = 0) was masked, as if every later cached call "
                              "brought one token: a later call can bring a chunk of several new "
                              "tokens too, and each must not see the ones after it. Mask every "
                              "call, at its offset."),
    ({"mask": "none"}, "no causal mask, so the future leaks: new query i must not see the "
                       "positions after its own, start + i (hint 2 says how to build the mask)."),
    ({"mask": "upper"}, "the mask is upside down: causal_mask(n) is True on and below the "
                        "diagonal (a query sees its past); you let each query see its future."),
    ({"mask": "not_offset"}, "the mask is not offset by start: with start positions in the "
                             "cache, new query i sits at position start + i and sees keys "
                             "0..start+i: which rows of a causal mask of size start + n are "
                             "those? (torch's is_causal=True aligns its mask top-left: this "
                             "mistake.)"),
    ({"cache_use": "not_read"}, "the cache is not appended to or not read: the new queries saw "
                                "only the new keys, not the start earlier ones the cache "
                                "holds: every call adds its keys and values to the cache and "
                                "attends over all start + n of them."),
    ({"cache_use": "kv_swapped"}, "k and v are swapped in the cache: cache.append(k, v) takes "
                                  "the keys first, then the values."),
    ({"out_proj": False}, "W_O is missing: the merged heads go through self.out."),
    ({"scale": "d_model"}, "the scores are scaled by 1/sqrt(d_model); each head's scores use its "
                           "own size, 1/sqrt(d_h) with d_h = d / h."),
    ({"scale": "none"}, "the scores are not scaled: divide q k^T by sqrt(d_h) (the course's "
                        "attention step does it for you)."),
    ({"mask": "multiplied"}, "the scores were multiplied by the mask: a 0 score still gets "
                             "weight e^0 > 0, so the future leaks. Set the masked scores to -inf "
                             "before the softmax (masked_fill), or pass the mask to the course's "
                             "attention step."),
    ({"mask": "no_diagonal"}, "the mask hides each query's own position: new query i may see the "
                              "keys up to AND including its own, start + i, so the diagonal "
                              "stays open (the first position would otherwise see nothing)."),
    ({"softmax_dim": -2}, "the softmax ran over dim=-2, the queries: each query's weights over "
                          "the keys must sum to 1, so normalise over the last axis, dim=-1."),
]


BLOCK_MISTAKES = [
    ("post_norm", "norm after instead of before: that is the original post-norm block, "
                  "LN(x + attn(x)). A pre-norm block normalises the sub-layer's input and leaves "
                  "the residual stream alone: which of the two, the stream or the sub-layer's input, "
                  "passes through the LayerNorm?"),
    ("no_attn_residual", "the residual is missing around attention: add attn(LN_1(x)) to x, "
                         "don't replace x with it."),
    ("no_ff_residual", "the residual is missing around the feed-forward: its output replaced the "
                       "stream instead of being added to it, as attention's is."),
    ("no_norm", "the LayerNorms are missing: each sub-layer reads LN(x), not x."),
    ("same_norm", "norm1 is used twice: the feed-forward reads norm2(x), its own LayerNorm."),
    ("residual_from_normed", "the residual adds to the normalised x: keep the stream x itself, "
                             "x + attn(LN(x)), not LN(x) + attn(LN(x))."),
    ("residual_from_normed_attn", "the attention's residual adds to the normalised x: keep the "
                                  "stream x itself, x + attn(LN_1(x)), not LN_1(x) + attn(...)."),
    ("residual_from_normed_ff", "the feed-forward's residual adds to the normalised x: keep the "
                                "stream x itself, x + ff(LN_2(x)), not LN_2(x) + ff(...)."),
    ("norms_swapped", "the two LayerNorms are swapped: attention read norm2's output and the "
                      "feed-forward norm1's; each sub-layer has its own, in the stub's order."),
    ("parallel", "both sub-layers read the same input: the feed-forward must read the stream "
                 "after attention has been added, one after the other."),
    ("ff_first", "the feed-forward ran first: attention comes first, then the feed-forward."),
    ("cache_not_passed", "the cache never reached the attention: with a cache the new tokens saw "
                         "only themselves. The block is handed the layer's cache: who needs it?"),
]


MODEL_MISTAKES = [
    ("no_positions", "the position embedding is missing: without it attention cannot tell "
                     "the order of the characters; add the embedding of each new token's position "
                     "in the sequence."),
    ("positions_from_tokens", "the position embedding is indexed by the token ids: index it by "
                              "the positions start..start+n-1 (0..n-1 without a cache)."),
    ("positions_from_one", "the positions start one too late: the first new character is at "
                           "position start (0 without a cache): where does the range begin?"),
    ("positions_not_offset", "the positions ignore start: with start characters already in "
                             "the cache, the new ones come after them, not at 0..n-1."),
    ("caches_not_passed", "the caches never reached the blocks: each block must be handed its own "
                          "cache, caches[i] for block i (and None when there are no caches)."),
    ("no_final_norm", "the final LayerNorm is missing: a pre-norm stack leaves the stream "
                      "unnormalised after the last block, so something must normalise it before "
                      "the output head."),
    ("first_block_only", "only one block ran: x goes through every block of self.blocks, in "
                         "turn."),
    ("scaled_embeddings", "the embeddings are multiplied by sqrt(d): this GPT adds the token and "
                          "position embeddings as they are."),
    ("token_scaled", "the token embeddings are multiplied by sqrt(d) before the positions are "
                     "added (the 2017 paper's convention, with its fixed sinusoids): this GPT "
                     "adds both learned embeddings as they are."),
    ("no_blocks", "the blocks never ran: the logits come straight from the embeddings."),
    ("log_softmax_output", "the model returns log_softmax(logits): return the raw logits; "
                           "cross_entropy and sampling apply the (log-)softmax themselves."),
    ("softmax_output", "the model returns softmax(logits), probabilities: return the raw "
                       "logits; the loss (cross_entropy) and sampling apply the softmax "
                       "themselves."),
]


TRAIN_MISTAKES = [
    ("not_shifted", "the targets are not shifted: position i must predict the NEXT character, "
                    "so the target at position i is the character that comes one after input i."),
    ("whole_chunk", "the inputs and the targets are both the whole chunk, unshifted: the model "
                    "then learns to copy the current character. A chunk of n + 1 characters gives "
                    "n inputs and n targets: which n of each?"),
    ("shifted_backwards", "the shift goes the wrong way: the model predicts each character from "
                          "the ones BEFORE it, so the targets are the later of the two slices."),
    ("no_zero_grad", "the gradients are never zeroed, so they pile up from step to step: call "
                     "optimizer.zero_grad() before loss.backward()."),
    ("no_step", "the weights did not change: call optimizer.step() after loss.backward() (and "
                "zero the gradients before backward, not between backward and step)."),
    ("sum", "the loss is summed over positions: take the mean (cross_entropy's default), so the "
            "step size does not grow with the batch."),
    ("sum_over_positions", "the loss is summed over each chunk's positions (then averaged over "
                           "the batch): a per-character loss is the mean over every position, so "
                           "the step does not grow with the context length."),
    ("softmax_first", "softmax was applied before cross_entropy, which takes raw logits (it "
                      "does the log-softmax itself)."),
    ("nll_on_logits", "F.nll_loss on raw logits: nll_loss expects log-probabilities; use "
                      "F.cross_entropy(logits, targets), which takes the log-softmax itself."),
    ("last_only", "only the last position is trained: every position of the chunk predicts its "
                  "next character."),
    ("no_clip", "the step used an unclipped gradient, or clipped each gradient on its own: "
                "clip the joint norm of all gradients together, not each one or by value. Call "
                "nn.utils.clip_grad_norm_(model.parameters(), 1.0) once, after loss.backward() "
                "and before optimizer.step() (before backward there is no gradient yet; after "
                "step it is too late)."),
    ("clip_value", "clip the joint norm of all gradients together, not each one or by value: "
                   "clip_grad_value_ cuts each entry at 1 and turns the gradient's direction; "
                   "use nn.utils.clip_grad_norm_(model.parameters(), 1.0)."),
]


GENERATE_MISTAKES = [
    ("positions_restart", "the positions restart in the cached step: the new character sits "
                          "after every character already in the cache, not at 0."),
    ("start_is_length", "start = tokens.shape[1] in the cached step, one past the new character: "
                        "after appending it, how many characters come before it?"),
    ("temperature_after_softmax", "temperature applied after the softmax: dividing the "
                                  "probabilities by T changes nothing once they are renormalised; "
                                  "divide the logits by T, then softmax."),
    ("temperature_times", "the logits were multiplied by T: divide them by T (T < 1 sharpens, "
                          "T > 1 flattens)."),
    ("first_position", "the next character was sampled from the FIRST position's logits: the "
                       "prediction for the next character is at the last position, [:, -1]."),
    ("top_k_off_by_one", "top-k keeps k - 1 characters: keep every logit >= the k-th largest "
                         "(mask only those strictly below it)."),
    ("whole_sequence_cached", "every token was fed again while using the cache: with the cache, "
                              "after the prompt feed only the token just sampled, at its own "
                              "position; the cache already holds the rest."),
    ("greedy", "the next character was the most likely one (argmax): sample it from the "
               "probabilities with torch.multinomial(probs, 1, generator=generator)."),
    ("no_top_k", "top_k was ignored: keep the k largest logits and set the others to -inf."),
    ("top_k_plus_one", "top-k kept k + 1 characters: the cut-off is the k-th largest logit, "
                       "not the (k + 1)-th."),
    ("start_frozen", "start stayed at the prompt's length in every cached step: each new "
                     "character sits one position after the previous one."),
    ("crop_first", "past the context you kept the text's FIRST n_ctx characters: the next "
                   "character follows the last ones, so the window is the last n_ctx."),
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


#: The train step's likely exceptions, named (check_function's error_hints).
TRAIN_ERROR_HINTS = [
    ("Expected target size", "F.cross_entropy reads the classes on dim 1: the logits came as "
                             "(b, n, vocab), with the characters on the last axis. Flatten logits "
                             "and targets over the positions (or move the vocabulary axis to dim 1)."),
    ("past the context", "the whole chunk of n + 1 characters went into the model: the last "
                         "character has nothing to predict, so it is never an input."),
]


def _with_gradients(result: CheckResult, cls, args: tuple, reference: nn.Module, what: str, *,
                    swap: dict | None = None, x: torch.Tensor | None = None) -> CheckResult:
    """``result``, unless it passed and one backward through the learner's module gives other
    gradients than the reference's (at ``x`` and at every weight): then what went wrong, named
    (a detached query, key or value; a detached residual; a weight no gradient reaches)."""
    if not result:
        return result
    module = _build(cls, args, reference, what, swap)
    if isinstance(module, CheckResult):
        return module
    if x is None:
        x = torch.randn(2, 7, args[0], generator=seeded(9))
    wrong = gradient_mismatch(module, reference, lambda m, x: m(x), x)
    parts = next((p for name in wrong if name.endswith("qkv.weight")
                  for p in [detached_parts(wrong, name)] if p), [])
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
        return in_pieces(lambda part, start: forward(part, cache), x, split, step)

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
    values and lets new query ``i`` see keys ``0..start+i``; then one backward must give the
    reference's gradients."""
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
            mistakes=[Mistake(_safe(_attention_runner(attention_variant(reference, **kw))), hint)
                      for kw, hint in ATTENTION_MISTAKES],
            error_hints=[("does not broadcast", _MASK_SHAPE_HINT)]))
        if not results[-1]:
            return results[-1]
    return _with_gradients(_first_failure(results, "CausalSelfAttention"), cls, (16, 4),
                           _randomise(bg.CausalSelfAttention(16, 4), 101), "CausalSelfAttention")


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
    attention. The reference attention is put inside it; then one backward must give the
    reference's gradients."""
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
            what="Block", output_names=("the outputs of every call",),
            mistakes=[Mistake(_safe(_attention_runner(block_variant(reference, kind))), hint)
                      for kind, hint in BLOCK_MISTAKES]))
        if not results[-1]:
            return results[-1]
    return _with_gradients(_first_failure(results, "Block"), cls, (d, h, d_ff), reference, "Block",
                           swap={"attn": reference.attn})


# --- 3. the model --------------------------------------------------------------------------


def model_cfg(vocab=11, context=16, d=16, h=4, layers=2, d_ff=32):
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
    cfg = model_cfg()
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
    result = check_function(
        _model_runner(_with_cache_argument(module, "GPT.forward(tokens, start=0, caches=None)"),
                      cfg), _model_runner(reference, cfg), cases, what="GPT",
        output_names=("the logits of every call",),
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
    return _with_gradients(result, cls, (cfg,), reference, "GPT", swap={"blocks": reference.blocks},
                           x=cases[1]["tokens"])


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
        return in_pieces(lambda part, start: forward(part, start, caches), tokens, split, step)

    return run


# --- 4. the training step ------------------------------------------------------------------


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
    small reference GPT with large weights, whose gradients are far over norm 1 (the returned
    losses and the weights after)."""
    g = seeded(401)
    cases = [{"chunks": torch.randint(0, 11, (2, b, n + 1), generator=g), "seed": s}
             for b, n, s in [(2, 8, 1), (3, 16, 2), (1, 4, 3)]]
    return check_function(
        _two_steps(train_step), _two_steps(train_variant("right")), cases, what="train_step",
        output_names=("the two losses", "the weights after two steps"), atol=1e-5,
        mistakes=[Mistake(_safe(_two_steps(train_variant(kind))), hint)
                  for kind, hint in TRAIN_MISTAKES],
        error_hints=TRAIN_ERROR_HINTS)


def _two_steps(step: Callable) -> Callable:
    def run(chunks, seed):
        model = _randomise(bg.GPT(model_cfg()), seed, std=0.3)   # gradients far over norm 1
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
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


# --- 5. the training loop ------------------------------------------------------------------------


def schedule_variant(kind: str) -> Callable:
    """``learning_rate(step, recipe)`` with ``kind``'s mistake (``"right"``: the reference)."""
    def learning_rate(step, recipe):
        peak, low, warmup, steps = recipe.lr, recipe.min_lr, recipe.warmup, recipe.steps
        if kind == "constant":
            return peak
        if step < warmup and kind != "no_warmup":
            return peak * (step if kind == "warmup_from_zero" else step + 1) / warmup
        if kind in ("no_warmup", "cosine_over_all"):
            progress = step / steps
        else:
            progress = (step - warmup) / max(1, steps - warmup)
        if kind == "to_zero":
            low = 0.0
        if kind == "linear":
            return low + (peak - low) * (1 - progress)
        if kind == "no_half":
            return low + (peak - low) * math.cos(math.pi * progress)
        return low + 0.5 * (peak - low) * (1 + math.cos(math.pi * progress))

    return learning_rate


SCHEDULE_MISTAKES = [
    ("constant", "the learning rate never changes: warm up linearly to recipe.lr, then follow a "
                 "cosine down to recipe.min_lr."),
    ("no_warmup", "there is no warm-up: for the first recipe.warmup steps the rate climbs "
                  "linearly, step s getting recipe.lr * (s + 1) / recipe.warmup."),
    ("warmup_from_zero", "the first warm-up step gets a learning rate of 0, a wasted step: step s "
                         "(from 0) gets recipe.lr * (s + 1) / recipe.warmup."),
    ("cosine_over_all", "the cosine counts from step 0, not from the end of the warm-up: its "
                        "progress is (step - warmup) / (steps - warmup), from 0 to 1."),
    ("to_zero", "the cosine ends at 0: it ends at recipe.min_lr."),
    ("linear", "the decay is linear: after the warm-up, follow half a cosine period, "
               "min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2."),
    ("no_half", "cos(pi * progress) runs from 1 to -1, so the rate goes negative: map it to 1..0 "
                "with (1 + cos(pi * progress)) / 2."),
]


def loop_variant(kind: str) -> Callable:
    """``train(model, train_step, corpus, recipe, generator, stop)`` with ``kind``'s mistake."""
    learning_rate = schedule_variant("right")

    def train(model, train_step, corpus, recipe, generator, stop=None):
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]

        def new_optimizer():
            return torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                      {"params": others, "weight_decay": 0.0}],
                                     betas=recipe.betas)

        optimizer = new_optimizer()
        n = model.cfg.context
        data = corpus.val if kind == "batches_from_val" else corpus.train
        high = len(data) - n - (0 if kind == "randint_high" else 1)
        width = n if kind == "chunk_short" else n + 1
        curve, fixed = [], None
        steps = recipe.steps if stop is None or kind == "stop_ignored" else stop
        for step in range(steps):
            if kind == "optimizer_each_step":
                optimizer = new_optimizer()
            if kind not in ("no_schedule", "lr_after_step"):
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(step, recipe)
            if fixed is None or kind != "same_batch":
                starts = torch.randint(0, high, (recipe.batch,), generator=generator)
                fixed = torch.stack([data[s:s + width] for s in starts.tolist()])
            model.train()
            batch_loss = train_step(model, optimizer, fixed)
            if kind == "lr_after_step":
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(step, recipe)
            due = step % recipe.eval_every == 0 if kind == "eval_off_by_one" \
                else (step + 1) % recipe.eval_every == 0
            if due and kind != "no_eval":
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
    ("no_schedule", "the learning rate was never set, so AdamW kept its default of 0.001: at "
                    "every step, before the update, set group['lr'] = learning_rate(step, recipe) "
                    "in each of optimizer.param_groups."),
    ("lr_after_step", "the learning rate is set after the step, so each step uses the previous "
                      "step's rate: set it before calling train_step."),
    ("optimizer_each_step", "a new AdamW is built at every step: its running averages of the "
                            "gradient start from zero each time. Build it once, before the loop."),
    ("batches_from_val", "the batches come from the held-out text: train on corpus.train only, "
                         "or the held-out loss no longer measures anything."),
    ("same_batch", "one batch is drawn once and used at every step: draw a fresh batch inside "
                   "the loop."),
    ("randint_high", "the starts are drawn from 0..len(corpus.train) - n - 1 inclusive: use "
                     "torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), "
                     "generator=generator), as the exercise says (the same draws as the "
                     "reference)."),
    ("chunk_short", "each chunk holds n characters: it needs n + 1, n inputs and the n "
                    "characters that follow them."),
    ("eval_off_by_one", "the evaluations come one step early (at step 0, eval_every, ...): "
                        "evaluate after step + 1 steps, when (step + 1) % recipe.eval_every == 0."),
    ("eval_swapped", "the curve's two losses are swapped: each entry is (steps done, training "
                     "loss, held-out loss)."),
    ("batch_loss", "the curve's training loss is the last batch's loss: that is one noisy "
                   "batch, measured before the step. Use bg.estimate_loss(model, corpus.train, "
                   "n), the same 100 windows as the held-out loss."),
    ("no_eval", "the curve is empty: every recipe.eval_every steps append (step + 1, the "
                "training loss, the held-out loss), each from bg.estimate_loss."),
    ("stop_ignored", "stop was ignored: with stop, run only steps 0..stop-1 (the schedule still "
                     "spans recipe.steps)."),
]


def _toy_corpus() -> bg.Corpus:
    g = seeded(601)
    return bg.Corpus("abcdefghijk", torch.randint(0, 11, (500,), generator=g),
                     torch.randint(0, 11, (150,), generator=g))


def _run_loop(train: Callable) -> Callable:
    def run(recipe, stop, seed):
        torch.manual_seed(seed)
        model = bg.GPT(model_cfg())
        curve = train(model, bg.train_step, _toy_corpus(), recipe,
                      torch.Generator().manual_seed(seed), stop)
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


def _schedule_values(learning_rate: Callable) -> Callable:
    def run(recipe):
        return torch.tensor([float(learning_rate(s, recipe)) for s in range(recipe.steps)],
                            dtype=torch.float64)

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
    schedules = [{"recipe": bg.Recipe(steps=s, batch=2, lr=lr, warmup=w, min_lr=m)}
                 for s, lr, w, m in [(20, 0.1, 5, 0.01), (12, 3e-3, 1, 0.0),
                                     (50, 1e-3, 10, 1e-4), (8, 0.5, 3, 0.05)]]
    result = check_function(
        _schedule_values(learning_rate), _schedule_values(schedule_variant("right")), schedules,
        what="learning_rate", output_names=("the rates of every step",), atol=1e-9, rtol=1e-7,
        mistakes=[Mistake(_safe(_schedule_values(schedule_variant(kind))), hint)
                  for kind, hint in SCHEDULE_MISTAKES])
    if not result:
        return result
    cases = [{"recipe": bg.Recipe(steps=s, batch=b, lr=lr, warmup=w, min_lr=m, eval_every=e),
              "stop": stop, "seed": seed}
             for s, b, lr, w, m, e, stop, seed in [(9, 3, 0.02, 3, 0.002, 3, None, 1),
                                                   (8, 2, 0.05, 2, 0.0, 4, None, 2),
                                                   (12, 2, 0.01, 4, 0.001, 2, 6, 3)]]
    loop = check_function(
        _run_loop(train), _run_loop(loop_variant("right")), cases, what="train",
        output_names=("the curve (step, training loss, held-out loss)", "the weights after"),
        atol=1e-5, mistakes=[Mistake(_safe(_run_loop(loop_variant(kind))), hint)
                             for kind, hint in LOOP_MISTAKES])
    if not loop:
        return loop
    return CheckResult(True, "Passed: learning_rate matches the reference on every step of "
                             f"{len(schedules)} recipes, and train gives the reference's curve "
                             f"and weights on all {len(cases)} runs.")


# --- 6. generation with a KV cache ---------------------------------------------------------


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
    generator=generator)``; with and without the cache it must give the same tokens, also once
    the text outgrows the context (three of the eight cases do)."""
    model = _randomise(bg.GPT(model_cfg(vocab=13, context=24, layers=2)), 501, std=0.4)
    g = seeded(502)
    cases = []
    for b, n0, steps, t, k, cache in [(2, 3, 12, 1.0, None, True), (2, 3, 12, 1.0, None, False),
                                      (3, 5, 15, 0.5, None, True), (2, 1, 20, 2.0, 4, True),
                                      (2, 4, 10, 0.7, 3, False), (1, 6, 18, 1.3, 1, True),
                                      (2, 4, 36, 0.9, None, True), (2, 4, 36, 0.9, None, False),
                                      (1, 20, 14, 1.0, 5, True)]:
        cases.append({"prompt": torch.randint(0, 13, (b, n0), generator=g), "steps": steps,
                      "temperature": t, "top_k": k, "use_cache": cache,
                      "seed": int(torch.randint(0, 1000, (1,), generator=g))})

    global_draws = []     # the learner's calls that drew from torch's global random numbers

    def past_hint(exc, call):                   # call: (caches given?, tokens fed) when it failed
        cached, n = call
        if "cache is full" in str(exc) and n > 1:
            return "stale"                          # a window fed into the old cache
        return "cached" if cached else "plain"

    def runner(fn, learner=False):
        def run(prompt, steps, temperature, top_k, use_cache, seed):
            state = torch.random.get_rng_state()
            calls = []                       # the learner's model calls, to place an error

            def counting(tokens, start=0, caches=None):
                calls.append((caches is not None, tokens.shape[1]))
                return type(model).forward(model, tokens, start, caches)

            model.forward = counting
            try:
                out = fn(model, prompt, steps, temperature, top_k, use_cache,
                         torch.Generator().manual_seed(seed))
                if learner and not torch.equal(state, torch.random.get_rng_state()):
                    global_draws.append(seed)
            except ValueError as exc:
                full = "cache is full" in str(exc) or "past the context" in str(exc)
                past = prompt.shape[1] + len(calls) - 1 > model.cfg.context
                if full and past:            # the text had outgrown the context
                    raise Refused(f"generate failed once the text was longer than the context "
                                  f"n_ctx = {model.cfg.context} ({exc}).\nHint: "
                                  f"{PAST_CONTEXT[past_hint(exc, calls[-1])]}") from exc
                if use_cache and full:
                    raise Refused(f"with use_cache=True generate ran past the cache ({exc}).\n"
                                  f"Hint: {dict(GENERATE_MISTAKES)['whole_sequence_cached']}"
                                  ) from exc
                raise
            finally:
                del model.forward
            if out is None:
                return None
            if not isinstance(out, torch.Tensor) or out.shape != (prompt.shape[0],
                                                                  prompt.shape[1] + steps):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"generate should return (b, n0 + steps) = "
                                 f"{(prompt.shape[0], prompt.shape[1] + steps)} tokens, got {got}")
            return out.double()
        return run

    result = check_function(
        runner(generate, learner=True), runner(generate_variant("right")), cases, what="generate",
        output_names=("the tokens",), atol=0, rtol=0,
        mistakes=[Mistake(_safe(runner(generate_variant(kind))), hint)
                  for kind, hint in GENERATE_MISTAKES])
    if not result:
        # Sampling among the k largest (topk's values and indices) is right too; it only draws
        # different random numbers, so it is compared with that way of sampling.
        among_k = check_function(runner(generate), runner(generate_variant("top_k_indices")),
                                 cases, what="generate", output_names=("the tokens",), atol=0,
                                 rtol=0)
        if among_k:
            result = CheckResult(True, among_k.message + " (You sample among the k largest "
                                 "logits' indices: right too; it draws different random numbers "
                                 "than masking the others to -inf, so it was checked against that "
                                 "way of sampling.)")
    if not result and global_draws and "\nHint: " not in result.message:
        result = CheckResult(False, result.message + "\nHint: your generate drew from torch's "
                             "global random numbers, not from the generator it was given: sample "
                             "with torch.multinomial(probs, 1, generator=generator), so that the "
                             "same seed gives the same tokens.")
    refusal = _check_cache_used(generate, model, cases) if result.passed else None
    return result if refusal is None else refusal


def _check_cache_used(generate: Callable, model: bg.GPT, cases: list[dict]) -> CheckResult | None:
    """A failure (or None): with ``use_cache`` each call after the first runs one new token at its
    position; without it, each call re-runs the whole sequence from position 0, with no cache."""
    def recording(tokens, start=0, caches=None):     # an empty cache counts as none
        calls.append((tokens.shape[1], start, caches is not None and caches[0].length > 0
                       if tokens.shape[1] > 1 else caches is not None))
        return type(model).forward(model, tokens, start, caches)

    for case in cases:
        calls = []
        n0, use_cache = case["prompt"].shape[1], case["use_cache"]
        model.forward = recording
        try:
            generate(model, case["prompt"], case["steps"], case["temperature"], case["top_k"],
                     use_cache, torch.Generator().manual_seed(case["seed"]))
        finally:
            del model.forward
        T = model.cfg.context
        for j, (n, start, cached) in enumerate(calls):
            length = n0 + j                          # the text's length before call j
            if j and length > T and (cached or n != T or start != 0):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but past the context n_ctx = {T} call {j + 1} "
                    f"(the text {length} characters long) ran n = {n}, start = {start}, caches "
                    f"{'passed' if cached else 'not passed'}; expected the last n_ctx = {T} "
                    f"characters at start = 0, with no cache (or a new, empty one).\nHint: "
                    f"{PAST_CONTEXT['stale']}"))
            if length > T:
                continue
            if use_cache and not j and (n != n0 or start != 0):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but the prompt of {n0} did not run in one "
                    f"call: the first call ran n = {n} at start = {start}.\nHint: with the cache, "
                    "the prompt goes through the model once, as one block at position 0; after "
                    "that, one new token per call."))
            if use_cache and j and not cached and length == T and n == T and start == 0:
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but the cache was dropped one step early: "
                    f"call {j + 1} (prompt of {n0}), with the text exactly n_ctx = {T} characters "
                    "long, re-ran the whole window from position 0 without the cache, though calls "
                    f"2..{j} used it.\nHint: a text of n_ctx characters still fits: its last "
                    f"character sits at position n_ctx - 1 = {T - 1}, and the cache has room for "
                    "it. Which comparison of the text's length with n_ctx says the cache is full?"))
            if use_cache and j > 1 and not cached:
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but call {j + 1} (prompt of {n0}, the text "
                    f"{length} characters long) got no caches, though calls 2..{j} used them."
                    "\nHint: within the context the same caches go to every call; only past "
                    "n_ctx does the window start again without them."))
            if use_cache and j and not cached:
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but the cache was never used: call {j + 1} "
                    f"(prompt of {n0}) got no caches.\nHint: make the caches once with "
                    "model.new_caches() and hand the same ones to every call."))
            if use_cache and j and (n != 1 or start != n0 + j - 1):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but call {j + 1} (prompt of {n0}) ran n = {n} "
                    f"at start = {start}, caches passed; with the cache each call after the "
                    f"prompt runs only the token just sampled (n = 1), at its own position (here "
                    f"{n0 + j - 1}).\nHint: the cache already holds the keys and values of every "
                    "earlier position: feed it only what it has not seen."))
            if not use_cache and (cached or n != n0 + j or start != 0):
                return CheckResult(False, (
                    "Not yet: the tokens are right, but use_cache=False did not run without the "
                    f"cache: call {j + 1} (prompt of {n0}) ran n = {n}, start = {start}, caches "
                    f"{'passed' if cached else 'not passed'} (expected n = {n0 + j}, start = 0, no "
                    "caches).\nHint: without the cache, every step re-runs the whole sequence "
                    "so far from position 0 with caches=None; the notebook times the two paths "
                    "against each other."))
    return None
