"""Notebook 10's checkers: each accepts the reference, names every mistake of its table, and
what only a wrong call pattern or a wrong gradient shows."""

from __future__ import annotations

from operator import le, lt

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attn_helpers as ah
from attn_helpers import exercises
from attn_helpers.exercises import build_gpt as ex
from attn_helpers.lessons import build_gpt as bg
from tests._exercises import assert_rejected, skeleton, stub


def _learner(base, variant, kind):
    return type(base.__name__, (base,), {"forward": lambda self, *a: variant(self, kind)(*a)})


#: Per table of mistakes: the verdict on an answer with mistake ``kind`` ("right": none).
ANSWERS = {
    "ATTENTION_MISTAKES": lambda kind: ex.check_attention(
        _learner(bg.CausalSelfAttention, ex.attention_variant, kind)),
    "BLOCK_MISTAKES": lambda kind: ex.check_model(bg.GPT, _learner(bg.Block, ex.block_variant,
                                                                   kind)),
    "MODEL_MISTAKES": lambda kind: ex.check_model(_learner(bg.GPT, ex.model_variant, kind), bg.Block),
    "TRAIN_MISTAKES": lambda kind: ex.check_train(bg.train, bg.learning_rate,
                                                  ex.train_variant(kind)),
    "SCHEDULE_MISTAKES": lambda kind: ex.check_train(bg.train, ex.schedule_variant(kind)),
    "LOOP_MISTAKES": lambda kind: ex.check_train(ex.loop_variant(kind), bg.learning_rate),
    "GENERATE_MISTAKES": lambda kind: ex.check_generate(ex.generate_variant(kind)),
}


@pytest.mark.parametrize("table", ANSWERS)
def test_the_right_variant_passes(table):
    result = ANSWERS[table]("right")
    assert result, result.message


@pytest.mark.parametrize("table, kind, hint", [(table, kind, hint) for table in ANSWERS
                                               for kind, hint in getattr(ex, table)])
def test_every_named_mistake_gets_its_hint(table, kind, hint):
    assert_rejected(ANSWERS[table](kind), "Hint: " + hint)


def test_the_references_pass_and_the_module_passes_name_sizes_and_gradients():
    for check, cls in ((ex.check_attention, bg.CausalSelfAttention), (ex.check_block, bg.Block),
                       (ex.check_model, bg.GPT)):
        result = check(cls)
        assert result and "so are its gradients after one backward" in result.message, result.message
    message = ex.check_attention(bg.CausalSelfAttention).message
    assert message.startswith("Passed: CausalSelfAttention matches the reference on all 21 cases "
                              "(7 cases at each of 3 model sizes)"), message
    assert ex.check_train_step(bg.train_step) and ex.check_train(bg.train, bg.learning_rate)
    assert ex.check_generate(bg.generate)


def test_the_merged_exercises_check_both_parts_and_name_the_first_that_fails():
    both = ex.check_model(bg.GPT, bg.Block)
    assert both and "Block matches" in both.message and "And GPT matches" in both.message, both.message
    wrong_block = _learner(bg.Block, ex.block_variant, "post_norm")
    assert_rejected(ex.check_model(bg.GPT, wrong_block), "post-norm")
    trained = ex.check_train(bg.train, bg.learning_rate, bg.train_step)
    assert trained and "train_step" in trained.message and "And learning_rate" in trained.message
    assert_rejected(ex.check_train(bg.train, bg.learning_rate, ex.train_variant("no_step")),
                    "optimizer.step()")
    assert set(ex.KEYS) == {key.partition(".")[2] for key in exercises.EXERCISES
                            if key.startswith("build_gpt.")}


def test_stubs_are_not_implemented_yet_and_a_string_is_not_a_class():
    class Stub(nn.Module):
        def __init__(self, *args):
            super().__init__()
            raise NotImplementedError

    for check in (ex.check_attention, ex.check_block, ex.check_model):
        assert "not implemented yet" in check(Stub).message
    assert "not implemented yet" in ex.check_model(bg.GPT, Stub).message
    assert "not implemented yet" in ex.check_train(bg.train, bg.learning_rate, stub).message
    assert "not implemented yet" in ex.check_attention(_learner(bg.CausalSelfAttention,
                                                                lambda self, kind: stub, "")).message
    for result in (ex.check_train_step(stub), ex.check_train(stub, stub),
                   ex.check_train(stub, bg.learning_rate), ex.check_generate(stub)):
        assert "not implemented yet" in result.message
    assert "should be an nn.Module class" in ex.check_attention("CausalSelfAttention").message


def test_solution_true_does_not_count_and_pick_follows_the_learner(capsys):
    result = ex.check_model(bg.GPT, bg.Block, solution=True)
    assert result and "does not count" in result.message
    assert ex.pick("model", "mine", "ref") == "ref" and "the reference model" in capsys.readouterr().out


# --- learners' answers that no variant writes ------------------------------------------------------


def test_a_forward_without_the_cache_argument_is_told_to_keep_the_signature():
    class Block(bg.Block):
        def forward(self, x):
            return super().forward(x)

    class BlockWithoutCache(bg.Block):
        def forward(self, x, cache=None):
            return super().forward(x)

    assert_rejected(ex.check_block(Block), "keep the stub's signature")
    assert_rejected(ex.check_block(BlockWithoutCache), "the cache never reached the attention")


def test_start_read_after_the_append_gets_the_mask_shape_hint():
    class Attention(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            b, n, d = x.shape
            q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, dim=-1))
            if cache is not None:
                cache.append(k, v)
                k, v = cache.keys, cache.values
            start = 0 if cache is None else len(cache)      # read after the append
            out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
            return self.out(ah.merge_heads(out))

    assert_rejected(ex.check_attention(Attention), "read start = len(cache) before")


def test_calling_cache_attend_is_told_what_the_exercise_asks():
    class Attention(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            b, n, d = x.shape
            q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, dim=-1))
            if cache is not None:                           # notebook 05's finished step
                cache.append(k, v)
                out, _ = cache.attend(q)
            else:
                out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(n))
            return self.out(ah.merge_heads(out))

    x, cache = torch.randn(2, 6, 16), ah.KVCache(6)       # right outputs through a real cache
    attention = Attention(16, 4).eval()
    steps = torch.cat([attention(x[:, :3], cache), attention(x[:, 3:], cache)], dim=1)
    assert torch.allclose(steps, attention(x), atol=1e-5)
    assert_rejected(ex.check_attention(Attention), ex.ATTEND_SHORTCUT)


def test_the_model_takes_start_from_its_argument_and_gives_each_block_its_cache():
    class FromCaches(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, len(caches[0]), caches)

    class AtZeroWithoutCaches(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, 0 if caches is None else len(caches[0]), caches)

    class OneCache(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, start, caches and [caches[0]] * len(caches))

    assert_rejected(ex.check_model(FromCaches), "Hint: ", "not from len(caches[0])")
    assert_rejected(ex.check_model(AtZeroWithoutCaches), "Hint: ", "the positions ignore start")
    class WholeList(bg.GPT):
        def forward(self, tokens, start=0, caches=None):
            return super().forward(tokens, start, caches and [caches] * len(caches))

    assert_rejected(ex.check_model(OneCache), "block i gets caches[i]")
    assert_rejected(ex.check_model(WholeList), "got the whole caches list", "caches[i]")


def test_a_step_written_another_way_passes():
    def step(model, optimizer, chunk):
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())                       # float(), not loss.item()

    assert ex.check_train_step(step)


def test_a_step_that_returns_a_tensor_is_told_to_return_a_float():
    def step(model, optimizer, chunk):
        return ex.train_variant()(model, optimizer, chunk) * torch.ones(())   # a tensor

    assert_rejected(ex.check_train_step(step), "returned a tensor", "loss.item()")


def test_clipping_to_a_larger_max_norm_is_named():
    def step(model, optimizer, chunk):
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        return loss.item()

    assert_rejected(ex.check_train_step(step), "Hint: ", "a larger max_norm than 1.0")


def test_a_block_that_calls_attention_twice_is_told_why_the_cache_filled_up():
    class Block(bg.Block):
        def forward(self, x, cache=None):
            _ = self.attn(self.norm1(x), cache)              # a first call, then the used one
            x = x + self.attn(self.norm1(x), cache)
            return x + self.ff(self.norm2(x))

    assert_rejected(ex.check_block(Block), "the cache filled up", "call self.attn more than once")


@pytest.mark.parametrize("kind", ["clip_each", "clip_value"])
def test_clipping_each_gradient_or_by_value_is_named(kind):
    assert_rejected(ex.check_train_step(ex.train_variant(kind)), "Hint: ",
                    "clip the joint norm of all gradients together, not each one or by value")


def test_zeroing_the_gradients_after_backward_is_told_to_zero_them_before():
    assert_rejected(ex.check_train_step(ex.train_variant("zero_grad_late")),
                    "Hint: the weights did not change: zero the gradients before loss.backward()")


def test_zeroing_the_gradients_after_the_step_passes():
    def step(model, optimizer, chunk):
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()                    # after the step: the next backward starts clean
        return loss.item()

    assert ex.check_train_step(step)


def test_one_visible_future_key_is_named_as_a_leak():
    assert_rejected(ANSWERS["ATTENTION_MISTAKES"]("one_ahead"), "one future key", "the future leaks")


def test_a_loop_that_returns_nothing_is_told_to_return_the_curve():
    def silent(model, train_step, corpus, recipe, generator, stop=None):
        bg.train(model, train_step, corpus, recipe, generator, stop)

    assert "return the curve" in ex.check_train(silent, bg.learning_rate).message


# --- gradients after one backward: a detached query, key or residual is named ---------------------


@pytest.mark.parametrize("part", ["query", "key"])
def test_a_detached_query_or_key_gives_the_right_outputs_and_is_named(part):
    class Attention(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            b, n, d = x.shape
            q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, dim=-1))
            q, k = (q.detach(), k) if part == "query" else (q, k.detach())
            start = 0 if cache is None else len(cache)
            if cache is not None:
                cache.append(k, v)
                k, v = cache.keys, cache.values
            out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
            return self.out(ah.merge_heads(out))

    assert_rejected(ex.check_attention(Attention), "gives the right outputs, but after one "
                    "backward", f"was the {part} detached")


def test_a_detached_residual_is_named():
    class Block(bg.Block):
        def forward(self, x, cache=None):
            x = x.detach() + self.attn(self.norm1(x), cache)
            return x + self.ff(self.norm2(x))

    assert_rejected(ex.check_block(Block), "after one backward", "was the residual detached")


# --- generate: sampling, the cache's use, the context's end ----------------------------------------


def _generate(update, *, generator=True):
    """The reference's sampling, then ``update(tokens, nxt, caches, use_cache, n_ctx)``."""
    @torch.no_grad()
    def generate(model, prompt, steps, temperature, top_k, use_cache, g):
        n_ctx, tokens = model.cfg.context, prompt
        caches = model.new_caches() if use_cache else None
        new, start = prompt, 0
        for _ in range(steps):
            logits = model(new, start, caches)[:, -1] / temperature
            if top_k is not None:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=g) if generator else torch.multinomial(probs, 1)
            tokens = torch.cat([tokens, nxt], dim=1)
            new, start, caches = update(tokens, nxt, caches, use_cache, n_ctx)
        return tokens

    return generate


def _cached_while(fits, past):
    """With the cache while ``fits(length, n_ctx)``, else ``past(tokens, caches, n_ctx)``."""
    def update(tokens, nxt, caches, use_cache, n_ctx):
        if use_cache and fits(tokens.shape[1], n_ctx):
            return nxt, tokens.shape[1] - 1, caches
        return past(tokens, caches, n_ctx)

    return update


def _window(tokens, caches, n):
    return tokens[:, -n:], 0, None


def test_generate_past_the_context_accepts_a_fresh_cache_and_names_each_mistake():
    fresh = _cached_while(le, lambda t, c, n: (t[:, -n:], 0, c and [ah.KVCache(n) for _ in c]))
    assert ex.check_generate(_generate(fresh))
    never_crops = _cached_while(lambda length, n: True, lambda t, c, n: (t, 0, None))
    assert "had nowhere to go" in ex.check_generate(_generate(never_crops)).message
    stale = _cached_while(le, lambda t, c, n: (t[:, -n:], 0, c))
    message = ex.check_generate(_generate(stale)).message
    assert "what is a cached key worth" in message and "cache is full" in message
    plain = _cached_while(le, lambda t, c, n: (t, 0, None))
    assert "which n_ctx?" in ex.check_generate(_generate(plain)).message
    keeps_positions = _cached_while(le, lambda t, c, n: (t[:, -n:], max(0, t.shape[1] - n),
                                                                 None))
    assert "positions 0..n_ctx-1" in ex.check_generate(_generate(keeps_positions)).message


def test_generate_must_use_the_cache_exactly_when_asked():
    never = _cached_while(lambda length, n: False, _window)
    assert_rejected(ex.check_generate(_generate(never)), "the cache was never used")

    def always_cached(model, prompt, steps, temperature, top_k, use_cache, g):
        return _generate(_cached_while(le, _window))(model, prompt, steps, temperature, top_k,
                                                     True, g)

    assert_rejected(ex.check_generate(always_cached), "use_cache=False did not run without the "
                    "cache", "re-runs the whole sequence")


def test_a_cache_dropped_one_step_early_is_named():
    result = ex.check_generate(_generate(_cached_while(lt, _window)))
    assert_rejected(result, "the cache was dropped one step early", "exactly n_ctx = 24",
                    "Which comparison")
    assert "never used" not in result.message


def test_sampling_among_the_top_k_indices_passes_and_without_the_generator_is_named():
    result = ex.check_generate(ex.generate_variant("top_k_indices"))
    assert result and "among the k largest" in result.message
    no_generator = _generate(_cached_while(le, _window), generator=False)
    assert_rejected(ex.check_generate(no_generator), "generator=generator")


# --- hints: levels 1-2 do not state the answer; level 3 is a skeleton -------------------------------


@pytest.mark.parametrize("name, answers", [
    ("model", ("self.attn(self.norm1", "x + attn(", "in front of its sub-layer", "arange",
               "start..start+n-1", "start + n - 1", "caches[i]")),
    ("train", ("[:, :-1]", "[:, 1:]", "without its last", "without its first",
               "param_groups[0]")),
])
def test_hints_before_the_skeleton_do_not_state_the_solution(name, answers):
    hints = exercises.EXERCISES[f"build_gpt.{name}"].hints
    for fragment in answers:
        assert fragment not in hints[0] + hints[1], fragment


ATTENTION_GIVEN = ("b, n, d = x.shape\nstart = 0 if cache is None else len(cache)\n"
                   "q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, "
                   "dim=-1))\n")


ATTENTION_FILLS = ("cache.append(k, v); k, v = cache.keys, cache.values",
                   "ah.causal_mask(start + n)[start:]",
                   "ah.scaled_dot_product_attention(q, k, v, mask)[0]",
                   "self.out(ah.merge_heads(out))")
MODEL_FILLS = ("torch.arange(start, start + tokens.shape[1])",
               "self.token_embedding(tokens) + self.position_embedding(positions)",
               "enumerate(self.blocks)", "block(x, None if caches is None else caches[i])",
               "self.head(self.norm(x))")
TRAIN_FILLS = ('group["lr"] = rate',
               "torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), generator=generator)",
               "torch.stack([corpus.train[s:s + n + 1] for s in starts.tolist()])",
               "train_step(model, optimizer, chunk)", "(step + 1) % recipe.eval_every == 0",
               "(step + 1, bg.estimate_loss(model, corpus.train, n), "
               "bg.estimate_loss(model, corpus.val, n))")
GENERATE_FILLS = ("model(new, start, caches)[:, -1] / temperature",
                  "logits.topk(top_k, dim=-1).values[:, -1:]",
                  "logits.masked_fill(logits < kth, float('-inf'))",
                  "torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)",
                  "torch.cat([tokens, nxt], dim=1)", "tokens.shape[1] <= n_ctx",
                  "nxt, tokens.shape[1] - 1", "tokens[:, -n_ctx:], 0, None")


@pytest.mark.parametrize("name, fills", [("attention", ATTENTION_FILLS), ("model", MODEL_FILLS),
                                         ("train", TRAIN_FILLS), ("generate", GENERATE_FILLS)])
def test_the_third_hint_names_each_step_and_writes_none_of_its_code(name, fills):
    code = "\n".join(line.split("#", 1)[0] for line in
                     exercises.EXERCISES[f"build_gpt.{name}"].hints[2].splitlines())
    for fill in fills:
        assert fill.replace("'", '"') not in code.replace("'", '"'), fill


@pytest.mark.parametrize("key, base, signature, check, fills, prefix", [
    ("build_gpt.attention", bg.CausalSelfAttention, "self, x, cache=None", "check_attention",
     ATTENTION_FILLS, ATTENTION_GIVEN),
    ("build_gpt.model", bg.GPT, "self, tokens, start=0, caches=None", "check_model", MODEL_FILLS, ""),
])
def test_the_third_hint_of_each_piece_is_a_skeleton(key, base, signature, check, fills, prefix):
    def with_forward(fills):
        forward = skeleton(key, signature, fills, prefix=prefix, ah=ah, F=F)
        return type("FromHint", (base,), {"forward": forward})

    check = getattr(ex, check)
    assert not check(with_forward(None))
    result = check(with_forward(fills))
    assert result, result.message


TRAIN_GIVEN = ("matrices = [p for p in model.parameters() if p.dim() >= 2]\n"
               "others = [p for p in model.parameters() if p.dim() < 2]\n"
               "optimizer = torch.optim.AdamW([{'params': matrices, 'weight_decay': 0.1},\n"
               "                               {'params': others, 'weight_decay': 0.0}], "
               "betas=recipe.betas)\n"
               "n = model.cfg.context\ncurve = []\n")


def test_the_third_hint_of_train_is_a_skeleton():
    def train(fills):
        return skeleton("build_gpt.train", "model, train_step, corpus, recipe, generator, stop=None",
                        fills, prefix=TRAIN_GIVEN,
                        loop="for step in range(recipe.steps if stop is None else stop):\n"
                             "    rate = bg.learning_rate(step, recipe)",
                        suffix="return curve", bg=bg)

    assert not ex.check_train(train(None), bg.learning_rate)
    result = ex.check_train(train(TRAIN_FILLS), bg.learning_rate)
    assert result, result.message


def test_the_third_hint_of_generate_is_a_skeleton():
    def generate(fills):
        return skeleton("build_gpt.generate",
                        "model, prompt, steps, temperature, top_k, use_cache, generator", fills,
                        prefix="n_ctx = model.cfg.context\ntokens = prompt\n"
                               "caches = model.new_caches() if use_cache else None\n"
                               "new, start = prompt, 0\n",
                        loop="for _ in range(steps):", suffix="return tokens")

    assert not ex.check_generate(generate(None))
    result = ex.check_generate(generate(GENERATE_FILLS))
    assert result, result.message
