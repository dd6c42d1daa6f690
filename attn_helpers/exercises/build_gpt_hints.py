"""The hints of notebook 10's checkers: for each exercise, a list of ``(the mistake's settings for
its ``*_variant`` in :mod:`.build_gpt_mistakes`, the hint that names it)``."""

from __future__ import annotations

__all__ = ["ATTENTION_MISTAKES", "BLOCK_MISTAKES", "MODEL_MISTAKES", "TRAIN_MISTAKES",
           "GENERATE_MISTAKES"]


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
                                "only the new keys. cache.append(k, v), then attend over "
                                "cache.keys and cache.values (all start + n positions)."),
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
    ({"softmax_dim": -2}, "the softmax ran over dim=-2, the queries: each query's weights over "
                          "the keys must sum to 1, so normalise over the last axis, dim=-1."),
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
    ("residual_from_normed_attn", "the attention's residual adds to the normalised x: keep the "
                                  "stream x itself, x + attn(LN_1(x)), not LN_1(x) + attn(...)."),
    ("residual_from_normed_ff", "the feed-forward's residual adds to the normalised x: keep the "
                                "stream x itself, x + ff(LN_2(x)), not LN_2(x) + ff(...)."),
    ("parallel", "both sub-layers read the same input: the feed-forward must read the stream "
                 "after attention has been added, one after the other."),
    ("ff_first", "the feed-forward ran first: attention comes first, then the feed-forward."),
    ("cache_not_passed", "the cache never reached the attention: with a cache the new tokens saw "
                         "only themselves. Pass it on: self.attn(self.norm1(x), cache)."),
]


MODEL_MISTAKES = [
    ("no_positions", "the position embedding is missing: without it attention cannot tell "
                     "the order of the characters; add the embedding of each new token's position "
                     "in the text."),
    ("positions_from_tokens", "the position embedding is indexed by the token ids: index it by "
                              "the positions start..start+n-1 (0..n-1 without a cache)."),
    ("positions_from_one", "the positions start one too late: the first new character is at "
                           "position start (0 without a cache): torch.arange(start, start + n)."),
    ("positions_not_offset", "the positions ignore start: the new tokens sit at positions "
                             "start..start+n-1, so look up position_embedding(arange(start, "
                             "start + n))."),
    ("caches_not_passed", "the caches never reached the blocks: each block must be handed its own "
                          "cache, caches[i] for block i (and None when there are no caches)."),
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
    ("shifted_backwards", "the shift goes the wrong way: the inputs are chunk[:, :-1] and the "
                          "targets chunk[:, 1:], not the other way round."),
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
]


GENERATE_MISTAKES = [
    ("positions_restart", "the positions restart in the cached step: the new character sits at "
                          "position len(tokens) - 1 of the text, not 0."),
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
                              "after the prompt feed only the token just sampled, at its own "
                              "position; the cache already holds the rest."),
    ("greedy", "the next character was the most likely one (argmax): sample it from the "
               "probabilities with torch.multinomial(probs, 1, generator=generator)."),
    ("no_top_k", "top_k was ignored: keep the k largest logits and set the others to -inf."),
]
