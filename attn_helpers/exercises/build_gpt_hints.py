"""The hints of notebook 10's checkers: for each exercise, a list of ``(the mistake's settings for
its ``*_variant`` in :mod:`.build_gpt_mistakes`, the hint that names it)``."""

from __future__ import annotations

__all__ = ["ATTENTION_MISTAKES", "BLOCK_MISTAKES", "MODEL_MISTAKES", "TRAIN_MISTAKES",
           "GENERATE_MISTAKES", "PAST_CONTEXT", "TRAIN_ERROR_HINTS"]


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
