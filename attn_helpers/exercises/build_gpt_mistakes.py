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


def attention_variant(ref: bg.CausalSelfAttention, *, mask="causal", split="ok", merge="ok",
                      order="qkv", out_proj=True, scale="d_h", heads=None,
                      cache_use="ok", softmax_dim=-1) -> Callable:
    """``forward(x, cache=None)`` of the attention with one mistake, with ``ref``'s weights."""

    def run(x, cache=None):
        b, n, d = x.shape
        h = heads or ref.num_heads
        qkv = ref.qkv(x)
        if split == "interleaved":                    # (q_j, k_j, v_j) side by side per head
            q, k, v = (t.transpose(1, 2) for t in qkv.view(b, n, h, 3, d // h).unbind(3))
        else:
            q, k, v = qkv.split(d, dim=-1)
            if order == "kqv":
                q, k = k, q
            if split == "view":
                q, k, v = (t.reshape(b, h, n, d // h) for t in (q, k, v))
            else:
                q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in (q, k, v))
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
        out = out.reshape(b, n, d) if merge == "view" else out.transpose(1, 2).reshape(b, n, d)
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
        if kind == "residual_from_normed":
            h = n1(x)
            x = h + attn(h)
            h = n2(x)
            return h + ff(h)
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
        x = tok + pos
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
        if kind != "nll_on_logits":
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   reduction="sum" if kind == "sum" else "mean")
        if kind != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        if kind == "clipped":
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if kind != "no_step":
            optimizer.step()
        return loss.item()

    return step


def generate_variant(kind: str) -> Callable:
    def generate(model, prompt, steps, temperature, top_k, use_cache, generator):
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
                tokens = torch.cat([tokens, nxt], dim=1)
                new, start = (nxt, tokens.shape[1] - 1) if use_cache else (tokens, 0)
                continue
            probs = torch.softmax(logits, dim=-1)
            if kind == "temperature_after_softmax":
                probs = probs / temperature
            if kind == "greedy":
                nxt = probs.argmax(-1, keepdim=True)
            else:
                nxt = torch.multinomial(probs, 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            if not use_cache:
                new, start = tokens, 0
            elif kind == "positions_restart":
                new, start = nxt, 0
            elif kind == "start_is_length":
                new, start = nxt, tokens.shape[1]
            elif kind == "whole_sequence_cached":
                new, start = tokens, caches[0].length
            else:
                new, start = nxt, tokens.shape[1] - 1
        return tokens

    return generate


# --- the hints the checkers give, one per mistake -------------------------------------------

ATTENTION_MISTAKES = [
    ({"mask": "none"}, "no causal mask, so the future leaks: new query i must not see the "
                       "positions after it; mask = causal_mask(start + n)[start:]."),
    ({"mask": "upper"}, "the mask is upside down: causal_mask(n) is True on and below the "
                        "diagonal (a query sees its past); you let each query see its future."),
    ({"mask": "not_offset"}, "the mask is not offset by start: with start positions in the "
                             "cache, new query i sits at position start + i and sees keys "
                             "0..start+i, the LAST n rows of causal_mask(start + n), [start:]. "
                             "(torch's is_causal=True aligns its mask top-left: this mistake.)"),
    ({"cache_use": "not_read"}, "the cache is not appended to or not read: the new queries saw "
                                "only the new keys. cache.append(k, v), then attend over "
                                "cache.keys and cache.values (all start + n positions)."),
    ({"cache_use": "kv_swapped"}, "k and v are swapped in the cache: cache.append(k, v) takes "
                                  "the keys first, then the values."),
    ({"split": "view"}, "the heads are split wrong: view x as (b, n, h, d_h) and then transpose "
                        "to (b, h, n, d_h); viewing straight to (b, h, n, d_h) mixes positions "
                        "and heads."),
    ({"split": "interleaved"}, "an interleaved q, k, v layout: qkv(x) holds all of q, then all "
                               "of k, then all of v (split(d, dim=-1)), not (q, k, v) per head "
                               "side by side."),
    ({"merge": "view"}, "the heads are merged in the wrong order: transpose (b, h, n, d_h) back "
                        "to (b, n, h, d_h) before reshaping to (b, n, d)."),
    ({"order": "kqv"}, "q and k are swapped: qkv(x) holds q, then k, then v (in that order)."),
    ({"out_proj": False}, "W_O is missing: the merged heads go through self.out."),
    ({"scale": "d_model"}, "the scores are scaled by 1/sqrt(d_model); each head's scores use its "
                           "own size, 1/sqrt(d_h) with d_h = d / h."),
    ({"scale": "none"}, "the scores are not scaled: divide q k^T by sqrt(d_h) (the course's "
                        "attention step does it for you)."),
    ({"mask": "multiplied"}, "the scores were multiplied by the mask: a 0 score still gets "
                             "weight e^0 > 0, so the future leaks. Set the masked scores to -inf "
                             "before the softmax (masked_fill), or pass the mask to the course's "
                             "attention step."),
    ({"softmax_dim": -2}, "the softmax ran over dim=-2, the queries: each query's weights over "
                          "the keys must sum to 1, so normalise over the last axis, dim=-1."),
    ({"heads": 1}, "one head of size d: split the d features into num_heads heads of d / h."),
]


BLOCK_MISTAKES = [
    ("post_norm", "norm after instead of before: that is the original post-norm block, "
                  "LN(x + attn(x)). A pre-norm block normalises the sub-layer's input and leaves "
                  "the residual stream alone: x + attn(LN(x))."),
    ("no_attn_residual", "the residual is missing around attention: add attn(LN_1(x)) to x, "
                         "don't replace x with it."),
    ("no_ff_residual", "the residual is missing around the feed-forward: x = x + ff(LN_2(x))."),
    ("no_norm", "the LayerNorms are missing: each sub-layer reads LN(x), not x."),
    ("same_norm", "norm1 is used twice: the feed-forward reads norm2(x), its own LayerNorm."),
    ("residual_from_normed", "the residual adds to the normalised x: keep the stream x itself, "
                             "x + attn(LN(x)), not LN(x) + attn(LN(x))."),
    ("parallel", "both sub-layers read the same input: the feed-forward must read the stream "
                 "after attention has been added, one after the other."),
    ("ff_first", "the feed-forward ran first: attention comes first, then the feed-forward."),
    ("cache_not_passed", "the cache never reached the attention: with a cache the new tokens saw "
                         "only themselves. Pass it on: self.attn(self.norm1(x), cache)."),
]


MODEL_MISTAKES = [
    ("no_positions", "the position embedding is missing: without it attention cannot tell "
                     "the order of the characters; add position_embedding(arange(n))."),
    ("positions_from_tokens", "the position embedding is indexed by the token ids: index it by "
                              "the positions 0..n-1."),
    ("positions_from_one", "the positions start at 1: the first character is at position 0, "
                           "torch.arange(n)."),
    ("positions_not_offset", "the positions ignore start: the new tokens sit at positions "
                             "start..start+n-1, so look up position_embedding(arange(start, "
                             "start + n))."),
    ("caches_not_passed", "the caches never reached the blocks: block i gets caches[i] (or None "
                          "without caches): x = block(x, None if caches is None else caches[i])."),
    ("no_final_norm", "the final LayerNorm is missing: logits = head(norm(x))."),
    ("first_block_only", "only one block ran: x goes through every block of self.blocks, in "
                         "turn."),
    ("scaled_embeddings", "the embeddings are multiplied by sqrt(d): this GPT adds the token and "
                          "position embeddings as they are."),
    ("no_blocks", "the blocks never ran: the logits come straight from the embeddings."),
    ("log_softmax_output", "the model returns log_softmax(logits): return the raw logits; "
                           "cross_entropy and sampling apply the (log-)softmax themselves."),
    ("softmax_output", "the model returns softmax(logits), probabilities: return the raw "
                       "logits; the loss (cross_entropy) and sampling apply the softmax "
                       "themselves."),
]


TRAIN_MISTAKES = [
    ("not_shifted", "the targets are not shifted: position i must predict the NEXT character, "
                    "targets = chunk[:, 1:] for inputs = chunk[:, :-1]."),
    ("whole_chunk", "the inputs and the targets are both the whole chunk, unshifted: the model "
                    "then learns to copy the current character. Inputs chunk[:, :-1], targets "
                    "chunk[:, 1:]."),
    ("clipped", "you clipped the gradients: the training loop (train_gpt) already clips them "
                "before each optimizer.step, so leave clipping out of train_step."),
    ("shifted_backwards", "the shift goes the wrong way: the inputs are chunk[:, :-1] and the "
                          "targets chunk[:, 1:], not the other way round."),
    ("no_zero_grad", "the gradients are never zeroed, so they pile up from step to step: call "
                     "optimizer.zero_grad() before loss.backward()."),
    ("no_step", "the weights did not change: call optimizer.step() after loss.backward() (and "
                "zero the gradients before backward, not between backward and step)."),
    ("sum", "the loss is summed over positions: take the mean (cross_entropy's default), so the "
            "step size does not grow with the batch."),
    ("softmax_first", "softmax was applied before cross_entropy, which takes raw logits (it "
                      "does the log-softmax itself)."),
    ("nll_on_logits", "F.nll_loss on raw logits: nll_loss expects log-probabilities; use "
                      "F.cross_entropy(logits, targets), which takes the log-softmax itself."),
    ("last_only", "only the last position is trained: every position of the chunk predicts its "
                  "next character."),
]


GENERATE_MISTAKES = [
    ("positions_restart", "the positions restart in the cached step: the new character sits at "
                          "position len(tokens) - 1, so pass start = tokens.shape[1] - 1, not 0."),
    ("start_is_length", "start = tokens.shape[1] in the cached step: after appending the new "
                        "character, the sequence is tokens.shape[1] long and the new character "
                        "sits at position tokens.shape[1] - 1."),
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
                              "after the prompt feed only the token just sampled (new = nxt), "
                              "at start = tokens.shape[1] - 1; the cache already holds the rest."),
    ("greedy", "the next character was the most likely one (argmax): sample it from the "
               "probabilities with torch.multinomial(probs, 1, generator=generator)."),
    ("no_top_k", "top_k was ignored: keep the k largest logits and set the others to -inf."),
]
