"""Notebook 10's checkers (``exercises.build_gpt``): each accepts the reference and rejects at
least six plausible wrong answers with a hint that names the mistake."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attn_helpers as ah
from attn_helpers import exercises
from attn_helpers.exercises import build_gpt as ex
from attn_helpers.exercises.build_gpt import (
    attention_variant,
    block_variant,
    generate_variant,
    loop_variant,
    model_variant,
    schedule_variant,
    train_variant,
)
from attn_helpers.lessons import build_gpt as bg
from tests._exercises import assert_rejected, skeleton


def _attention_class(**mistake):
    class Attention(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            return attention_variant(self, **mistake)(x, cache)

    return Attention


def _block_class(kind):
    class Block(bg.Block):
        def forward(self, x, cache=None):
            return block_variant(self, kind)(x, cache) if kind else super().forward(x, cache)

    return Block


def _model_class(kind):
    class Model(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return (model_variant(self, kind)(tokens, start, caches) if kind
                    else super().forward(tokens, start, caches))

    return Model


class _Stub(nn.Module):
    def __init__(self, *args):
        super().__init__()
        raise NotImplementedError


def test_the_references_pass():
    assert ex.check_attention(bg.CausalSelfAttention)
    assert ex.check_attention(_attention_class())
    assert ex.check_block(bg.Block)
    assert ex.check_model(bg.GPT)
    assert ex.check_train_step(train_variant("right"))
    assert ex.check_train_step(bg.train_step)
    assert ex.check_train(bg.train, bg.learning_rate)
    assert ex.check_train(loop_variant("right"), schedule_variant("right"))
    assert ex.check_generate(bg.generate)


@pytest.mark.parametrize("kind, words", [(kind, hint[:30]) for kind, hint in ex.SCHEDULE_MISTAKES])
def test_the_schedule_names_its_mistakes(kind, words):
    assert_rejected(ex.check_train(bg.train, schedule_variant(kind)), "Hint: ", words)


@pytest.mark.parametrize("kind, words", [(kind, hint[:30]) for kind, hint in ex.LOOP_MISTAKES])
def test_the_loop_names_its_mistakes(kind, words):
    assert_rejected(ex.check_train(loop_variant(kind), bg.learning_rate), "Hint: ", words)


def test_a_loop_that_returns_nothing_is_told_to_return_the_curve():
    def silent(model, train_step, corpus, recipe, generator, stop=None):
        loop_variant("right")(model, train_step, corpus, recipe, generator, stop)

    assert "return the curve" in ex.check_train(silent, bg.learning_rate).message


@pytest.mark.parametrize("mistake, words", [(kw, hint.split(":")[0][:30])
                                            for kw, hint in ex.ATTENTION_MISTAKES])
def test_attention_rejects_known_mistakes(mistake, words):
    result = ex.check_attention(_attention_class(**mistake))
    assert_rejected(result, "Hint: ", words)


def test_attention_names_the_leak():
    assert "the future leaks" in ex.check_attention(_attention_class(mask="none")).message


def test_attention_mistakes_are_those_the_stub_leaves_open():
    """The stub gives the head split and merge, so no listed mistake is one of theirs."""
    keys = {key for kw, _ in ex.ATTENTION_MISTAKES for key in kw}
    assert len(ex.ATTENTION_MISTAKES) >= 6 and not keys & {"split", "merge", "order", "heads"}


@pytest.mark.parametrize("mistake, words", [
    ({"mask": "none"}, "no causal mask, so the future leaks"),
    ({"mask": "not_offset"}, "the mask is not offset by start"),
    ({"mask": "cache_unmasked"}, "the mask is left out when there is a cache"),
    ({"cache_use": "not_read"}, "the cache is not appended to or not read"),
    ({"cache_use": "kv_swapped"}, "k and v are swapped in the cache"),
    ({"scale": "d_model"}, "scaled by 1/sqrt(d_model)"),
])
def test_attention_names_the_cache_mistakes(mistake, words):
    assert_rejected(ex.check_attention(_attention_class(**mistake)), "Hint: ", words)


@pytest.mark.parametrize("kind, words", [(kind, hint[:30]) for kind, hint in ex.BLOCK_MISTAKES])
def test_block_rejects_known_mistakes(kind, words):
    assert_rejected(ex.check_block(_block_class(kind)), "Hint: ", words)


def test_block_names_post_norm_and_a_missing_residual():
    assert "norm after instead of before" in ex.check_block(_block_class("post_norm")).message
    assert "residual is missing" in ex.check_block(_block_class("no_attn_residual")).message


@pytest.mark.parametrize("kind, words", [(kind, hint[:30]) for kind, hint in ex.MODEL_MISTAKES])
def test_model_rejects_known_mistakes(kind, words):
    assert_rejected(ex.check_model(_model_class(kind)), "Hint: ", words)


@pytest.mark.parametrize("kind, words", [(kind, hint[:30]) for kind, hint in ex.TRAIN_MISTAKES])
def test_train_step_rejects_known_mistakes(kind, words):
    assert_rejected(ex.check_train_step(train_variant(kind)), "Hint: ", words)


def test_train_step_names_unshifted_targets():
    assert "targets are not shifted" in ex.check_train_step(train_variant("not_shifted")).message
    assert "F.nll_loss on raw logits" in ex.check_train_step(train_variant("nll_on_logits")).message


def test_model_takes_start_from_its_argument_not_from_the_caches():
    """A window later in the text, without caches: positions from ``start`` itself."""
    class FromCaches(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, len(caches[0]), caches)

    assert_rejected(ex.check_model(FromCaches), "Hint: ", "not from len(caches[0])")

    class IgnoresStartWithoutCaches(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, 0 if caches is None else len(caches[0]), caches)

    assert_rejected(ex.check_model(IgnoresStartWithoutCaches), "Hint: ", "the positions ignore start")


def test_model_names_softmax_output():
    assert "returns softmax(logits)" in ex.check_model(_model_class("softmax_output")).message


def test_the_cache_path_of_block_and_model_is_checked():
    class BlockWithoutCache(bg.Block):
        def forward(self, x, cache=None):
            return super().forward(x)

    class ModelAtZero(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, 0, caches)

    assert "the cache never reached the attention" in ex.check_block(BlockWithoutCache).message
    assert "the positions ignore start" in ex.check_model(ModelAtZero).message
    message = ex.check_train_step(train_variant("whole_chunk")).message
    assert "both the whole chunk, unshifted" in message

    def step_that_also_clips(model, optimizer, chunk):      # the right answer, written out
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    assert ex.check_train_step(step_that_also_clips)
    assert "log_softmax" in ex.check_model(_model_class("log_softmax_output")).message
    assert "multiplied by the mask" in ex.check_attention(_attention_class(mask="multiplied")).message
    assert "dim=-2" in ex.check_attention(_attention_class(softmax_dim=-2)).message
    message = ex.check_generate(generate_variant("whole_sequence_cached")).message
    assert "every token was fed again" in message and "ValueError" not in message.split("\n")[0][:20]


@pytest.mark.parametrize("kind, words", [(kind, hint[:30])
                                         for kind, hint in ex.GENERATE_MISTAKES])
def test_generate_rejects_known_mistakes(kind, words):
    assert_rejected(ex.check_generate(generate_variant(kind)), "Hint: ", words)


def _past_context(update):
    """A generate whose step after sampling is ``update(tokens, nxt, caches, use_cache, n_ctx)``."""
    @torch.no_grad()
    def generate(model, prompt, steps, temperature, top_k, use_cache, generator):
        n_ctx, tokens = model.cfg.context, prompt
        caches = model.new_caches() if use_cache else None
        new, start = prompt, 0
        for _ in range(steps):
            logits = model(new, start, caches)[:, -1] / temperature
            if top_k is not None:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            new, start, caches = update(tokens, nxt, caches, use_cache, n_ctx)
        return tokens
    return generate


def _cached_while_room(past):
    def update(tokens, nxt, caches, use_cache, n_ctx):
        if use_cache and tokens.shape[1] <= n_ctx:
            return nxt, tokens.shape[1] - 1, caches
        return past(tokens, caches, use_cache, n_ctx)
    return update


def test_generate_past_the_context_accepts_a_fresh_cache_and_names_each_mistake():
    fresh = _cached_while_room(lambda t, c, use, n: (t[:, -n:], 0,
                                                     None if c is None else MODEL_CACHES(c)))
    assert ex.check_generate(_past_context(fresh))
    never_crops = _past_context(lambda t, nxt, c, use, n: (nxt, t.shape[1] - 1, c) if use
                                else (t, 0, None))
    assert "had nowhere to go" in ex.check_generate(never_crops).message
    crops_without_cache_only = _past_context(lambda t, nxt, c, use, n: (nxt, t.shape[1] - 1, c)
                                             if use else (t[:, -n:], 0, None))
    assert "had nowhere to go" in ex.check_generate(crops_without_cache_only).message
    stale = _cached_while_room(lambda t, c, use, n: (t[:, -n:], 0, c))
    message = ex.check_generate(_past_context(stale)).message
    assert "what is a cached key worth" in message and "cache is full" in message
    plain = _cached_while_room(lambda t, c, use, n: (t, 0, None))
    assert "which n_ctx?" in ex.check_generate(_past_context(plain)).message
    keeps_positions = _cached_while_room(lambda t, c, use, n: (t[:, -n:], max(0, t.shape[1] - n),
                                                               None))
    assert "positions 0..n_ctx-1" in ex.check_generate(_past_context(keeps_positions)).message


def MODEL_CACHES(caches):                       # a new, empty cache of the same size per layer
    return [type(c)(c.max_len) for c in caches]


def test_generate_names_restarting_positions_and_late_temperature():
    assert "positions restart" in ex.check_generate(generate_variant("positions_restart")).message
    assert "start = tokens.shape[1]" in ex.check_generate(generate_variant("start_is_length")).message
    message = ex.check_generate(generate_variant("temperature_after_softmax")).message
    assert "temperature applied after the softmax" in message


def test_each_checker_knows_at_least_six_mistakes():
    for mistakes in (ex.ATTENTION_MISTAKES, ex.BLOCK_MISTAKES, ex.MODEL_MISTAKES,
                     ex.TRAIN_MISTAKES, ex.SCHEDULE_MISTAKES, ex.LOOP_MISTAKES,
                     ex.GENERATE_MISTAKES):
        assert len(mistakes) >= 6


def test_stubs_are_not_implemented_yet():
    def stub(*args):
        raise NotImplementedError

    for check in (ex.check_attention, ex.check_block, ex.check_model):
        assert "not implemented yet" in check(_Stub).message

    class ForwardStub(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            raise NotImplementedError

    assert "not implemented yet" in ex.check_attention(ForwardStub).message
    assert "top_k_indices" not in [kind for kind, _ in ex.GENERATE_MISTAKES]
    assert "not implemented yet" in ex.check_train_step(stub).message
    assert "not implemented yet" in ex.check_train(stub, stub).message
    assert "not implemented yet" in ex.check_train(stub, bg.learning_rate).message
    assert "not implemented yet" in ex.check_generate(stub).message
    assert not ex.check_attention("CausalSelfAttention")


def test_cached_and_uncached_generation_give_the_same_tokens():
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(13, context=24, d_model=16, num_heads=4, num_layers=2, d_ff=32))
    prompt = torch.randint(0, 13, (2, 4))
    a = bg.generate(model, prompt, 15, 0.8, 5, True, torch.Generator().manual_seed(3))
    b = bg.generate(model, prompt, 15, 0.8, 5, False, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_solution_true_does_not_count_and_pieces_follow_the_learner():
    result = ex.check_block(bg.Block, solution=True)
    assert result and "does not count" in result.message
    chosen, line = ex.pieces({"model": "mine", "train_step": "my step"},
                             {"model": "ref", "train_step": "ref step"})
    assert line.startswith("Training with")
    assert set(chosen) == {"model", "train_step"}


@pytest.mark.parametrize("name, answers", [
    ("block", ("self.attn(self.norm1", "x + attn(", "in front of its sub-layer")),
    ("model", ("arange", "start..start+n-1", "start + n - 1", "caches[i]")),
    ("train_step", ("[:, :-1]", "[:, 1:]", "without its last", "without its first")),
])
def test_hints_before_the_skeleton_do_not_state_the_solution(name, answers):
    hints = exercises.EXERCISES[f"build_gpt.{name}"].hints
    for fragment in answers:
        assert fragment not in hints[0] + hints[1], fragment


def _sample_whole_sequence(model, prompt, steps, temperature, top_k, generator):
    """A learner's sampling loop that re-runs the whole sequence at every step (no cache);
    ``generator=None`` draws from torch's global random numbers."""
    tokens = prompt
    for _ in range(steps):
        logits = model(tokens[:, -model.cfg.context:])[:, -1] / temperature
        if top_k is not None:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        nxt = (torch.multinomial(probs, 1) if generator is None
               else torch.multinomial(probs, 1, generator=generator))
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def test_generate_that_ignores_the_cache_is_refused():
    def no_cache(model, prompt, steps, temperature, top_k, use_cache, generator):
        return bg.generate(model, prompt, steps, temperature, top_k, False, generator)

    def whole_with_start(model, prompt, steps, temperature, top_k, use_cache, generator):
        return _sample_whole_sequence(model, prompt, steps, temperature, top_k, generator)

    for fn in (no_cache, whole_with_start):
        result = ex.check_generate(fn)
        assert not result and "the cache was never used" in result.message
    assert ex.check_generate(bg.generate)


def test_generate_that_always_uses_the_cache_is_refused():
    def always_cached(model, prompt, steps, temperature, top_k, use_cache, generator):
        return bg.generate(model, prompt, steps, temperature, top_k, True, generator)

    result = ex.check_generate(always_cached)
    assert not result and "use_cache=False did not run without the cache" in result.message
    assert "re-runs the whole sequence" in result.message


def test_sampling_among_the_top_k_indices_passes_and_says_why():
    result = ex.check_generate(generate_variant("top_k_indices"))
    assert result and "among the k largest" in result.message


def test_sampling_without_the_generator_is_named():
    def no_generator(model, prompt, steps, temperature, top_k, use_cache, generator):
        return _sample_whole_sequence(model, prompt, steps, temperature, top_k, None)

    result = ex.check_generate(no_generator)
    assert not result and "generator=generator" in result.message, result.message


def test_start_read_after_the_append_gets_the_mask_shape_hint():
    import attn_helpers as ah

    class CausalSelfAttention(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.num_heads = num_heads
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.out = nn.Linear(d_model, d_model)

        def forward(self, x, cache=None):
            b, n, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (t.view(b, n, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            if cache is not None:
                cache.append(k, v)
                k, v = cache.keys, cache.values
            start = 0 if cache is None else len(cache)      # read after the append
            out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
            return self.out(out.transpose(1, 2).reshape(b, n, d))

    assert_rejected(ex.check_attention(CausalSelfAttention), "read start = len(cache) before")


def test_one_cache_for_every_block_is_named():
    import attn_helpers as ah

    class GPT(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.position_embedding = nn.Embedding(cfg.context, cfg.d_model)
            self.blocks = nn.ModuleList(bg.Block(cfg.d_model, cfg.num_heads, cfg.d_ff)
                                        for _ in range(cfg.num_layers))
            self.norm = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.head.weight = self.token_embedding.weight

        def new_caches(self):
            return [ah.KVCache(self.cfg.context) for _ in self.blocks]

        def forward(self, tokens, start=0, caches=None):
            positions = torch.arange(start, start + tokens.shape[1])
            x = self.token_embedding(tokens) + self.position_embedding(positions)
            for block in self.blocks:
                x = block(x, None if caches is None else caches[0])    # one cache for all
            return self.head(self.norm(x))

    result = ex.check_model(GPT)
    assert not result and "block i gets caches[i]" in result.message, result.message


# --- level 3 hints: skeletons, not solutions ------------------------------------------------


def _with_forward(base, key, signature, fills, prefix=""):
    forward = skeleton(key, signature, fills, prefix=prefix, ah=ah, F=F)
    return type("FromHint", (base,), {"forward": forward})


def _generate_from_hint(fills):
    """Hint 3 of generate is the body of the stub's loop."""
    return skeleton("build_gpt.generate",
                    "model, prompt, steps, temperature, top_k, use_cache, generator", fills,
                    prefix="n_ctx = model.cfg.context\ntokens = prompt\n"
                           "caches = model.new_caches() if use_cache else None\n"
                           "new, start = prompt, 0\n",
                    loop="for _ in range(steps):", suffix="return tokens")


ATTENTION_GIVEN = ("b, n, d = x.shape\nstart = 0 if cache is None else len(cache)\n"
                   "q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, "
                   "dim=-1))\n")


@pytest.mark.parametrize("key, base, signature, check, fills, prefix", [
    ("build_gpt.attention", bg.CausalSelfAttention, "self, x, cache=None", "check_attention",
     ("cache.append(k, v); k, v = cache.keys, cache.values", "ah.causal_mask(start + n)[start:]"),
     ATTENTION_GIVEN),
    ("build_gpt.block", bg.Block, "self, x, cache=None", "check_block",
     ("self.attn(self.norm1(x), cache)", "self.ff(self.norm2(x))"), ""),
    ("build_gpt.model", bg.GPT, "self, tokens, start=0, caches=None", "check_model",
     ("torch.arange(start, start + tokens.shape[1])",
      "self.token_embedding(tokens) + self.position_embedding(positions)",
      "None if caches is None else caches[i]", "self.head(self.norm(x))"), ""),
])
def test_the_third_hint_of_each_piece_is_a_skeleton(key, base, signature, check, fills, prefix):
    check = getattr(ex, check)
    assert not check(_with_forward(base, key, signature, None, prefix))
    result = check(_with_forward(base, key, signature, fills, prefix))
    assert result, result.message


def test_the_third_hints_of_the_step_and_of_generate_are_skeletons():
    key = "build_gpt.train_step"
    assert not ex.check_train_step(skeleton(key, "model, optimizer, chunk", F=F, nn=nn))
    result = ex.check_train_step(skeleton(key, "model, optimizer, chunk", (
        "chunk[:, :-1], chunk[:, 1:]", "logits.reshape(-1, logits.shape[-1])",
        "targets.reshape(-1)",
        "loss.backward(); nn.utils.clip_grad_norm_(model.parameters(), 1.0); optimizer.step()"),
        F=F, nn=nn))
    assert result, result.message
    assert not ex.check_generate(_generate_from_hint(None))
    result = ex.check_generate(_generate_from_hint((
        "model(new, start, caches)[:, -1] / temperature",
        "logits.topk(top_k, dim=-1).values[:, -1:]",
        "logits.masked_fill(logits < kth, float('-inf'))", "torch.softmax(logits, dim=-1)",
        "tokens.shape[1] <= n_ctx", "nxt, tokens.shape[1] - 1", "tokens[:, -n_ctx:], 0, None")))
    assert result, result.message


def test_the_pass_names_the_class_and_the_sizes():
    """Review 6: "Passed: matches the reference on all 21 cases" named neither the class nor why 21."""
    message = ex.check_attention(_attention_class()).message
    assert message.startswith("Passed: CausalSelfAttention matches the reference on all "), message
    assert "cases at each of" in message and "model sizes" in message, message


# --- gradients after one backward: a detached query, key or residual is named ---------------------


def _detached_attention(part):
    class Attention(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            b, n, d = x.shape
            q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, dim=-1))
            q = q.detach() if part == "query" else q
            k = k.detach() if part == "key" else k
            if cache is not None:
                start = len(cache)
                cache.append(k, v)
                k, v = cache.keys, cache.values
            else:
                start = 0
            mask = ah.causal_mask(start + n)[start:]
            out, _ = ah.scaled_dot_product_attention(q, k, v, mask)
            return self.out(ah.merge_heads(out))

    return Attention


@pytest.mark.parametrize("part", ["query", "key"])
def test_a_detached_query_or_key_gives_the_right_outputs_and_is_named(part):
    result = ex.check_attention(_detached_attention(part))
    assert_rejected(result, "gives the right outputs, but after one backward",
                    f"was the {part} detached")


def test_a_detached_residual_is_named():
    class Block(bg.Block):
        def forward(self, x, cache=None):
            x = x.detach() + self.attn(self.norm1(x), cache)
            return x + self.ff(self.norm2(x))

    assert_rejected(ex.check_block(Block), "after one backward", "was the residual detached")


def test_the_module_passes_name_their_gradients():
    for check, cls in ((ex.check_attention, bg.CausalSelfAttention), (ex.check_block, bg.Block),
                       (ex.check_model, bg.GPT)):
        result = check(cls)
        assert result and "so are its gradients after one backward" in result.message, result.message


def test_a_cache_dropped_one_step_early_is_named():
    """Issue 33: ``tokens.shape[1] < n_ctx`` drops the cache when the text is exactly n_ctx long:
    the tokens are right; the message names the step, not "the cache was never used"."""
    @torch.no_grad()
    def one_step_early(model, prompt, steps, temperature, top_k, use_cache, generator):
        n_ctx, tokens = model.cfg.context, prompt
        caches = model.new_caches() if use_cache else None
        new, start = prompt, 0
        for _ in range(steps):
            logits = model(new, start, caches)[:, -1] / temperature
            if top_k is not None:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
            if use_cache and tokens.shape[1] < n_ctx:        # off by one: <= is right
                new, start = nxt, tokens.shape[1] - 1
            else:
                new, start, caches = tokens[:, -n_ctx:], 0, None
        return tokens

    result = ex.check_generate(one_step_early)
    assert_rejected(result, "the cache was dropped one step early", "exactly n_ctx = 24",
                    "Which comparison")
    assert "never used" not in result.message


@pytest.mark.parametrize("kind", ["clip_each", "clip_value"])
def test_clipping_each_gradient_or_by_value_is_named(kind):
    assert_rejected(ex.check_train_step(train_variant(kind)), "Hint: ",
                    "clip the joint norm of all gradients together, not each one or by value")


def test_the_batch_loss_as_the_curves_training_loss_is_named():
    assert_rejected(ex.check_train(loop_variant("batch_loss"), bg.learning_rate), "Hint: ",
                    "the curve's training loss is the last batch's loss")
