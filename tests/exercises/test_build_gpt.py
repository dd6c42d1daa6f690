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


@pytest.fixture(autouse=True, scope="module")
def _one_thread():       # tiny models: a second thread mostly spins, at several times the CPU
    with bg.single_thread():
        yield


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


def test_the_references_pass_and_the_merged_exercises_check_both_parts():
    attention = ex.check_attention(bg.CausalSelfAttention).message
    assert attention.startswith("Passed: CausalSelfAttention matches the reference on all 21 cases "
                                "(7 cases at each of 3 model sizes)"), attention
    both = ex.check_model(bg.GPT, bg.Block)
    assert both and "Block matches" in both.message and "And GPT matches" in both.message, both.message
    gradients = "so are its gradients after one backward"
    assert attention.count(gradients) == 1 and both.message.count(gradients) == 2   # Block's, GPT's
    trained = ex.check_train(bg.train, bg.learning_rate, bg.train_step)
    assert trained and "train_step" in trained.message and "And learning_rate" in trained.message
    assert ex.check_generate(bg.generate)
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


# --- learners' answers that no variant writes ----------------------------------------------------


def _attention(detach="", start_after_append=False, attend=False):
    """The reference's forward, with the query or key detached, ``start`` read after the append,
    or notebook 05's ``cache.attend``."""
    def forward(self, x, cache=None):
        b, n, d = x.shape
        q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, dim=-1))
        q, k = (q.detach() if detach == "query" else q), (k.detach() if detach == "key" else k)
        start = 0 if cache is None else len(cache)
        if cache is not None:
            cache.append(k, v)
            if attend:
                return self.out(ah.merge_heads(cache.attend(q)[0]))
            k, v = cache.keys, cache.values
        start = len(cache) if start_after_append and cache is not None else start
        out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
        return self.out(ah.merge_heads(out))

    return type("Attention", (bg.CausalSelfAttention,), {"forward": forward})


def _block(forward):
    return type("Block", (bg.Block,), {"forward": forward})


def _gpt(caches_for):
    """A GPT handing ``super().forward`` the ``(start, caches)`` that ``caches_for`` returns."""
    return type("GPT", (bg.GPT,), {"forward": lambda self, tokens, start=0, caches=None:
                                   bg.GPT.forward(self, tokens, *caches_for(start, caches))})


def _step(clip=1.0, zero_after_step=False, as_float=False, clip_late=False):
    def step(model, optimizer, chunk):
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        if not zero_after_step:
            optimizer.zero_grad()
        loss.backward()
        if clip_late:
            optimizer.step()                     # then clips what the step already used
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        if not clip_late:
            optimizer.step()
        if zero_after_step:
            optimizer.zero_grad()                # after the step: the next backward starts clean
        return float(loss.detach()) if as_float else loss.item()

    return step


def _twice(self, x, cache=None):                 # a first call to attention, then the used one
    _ = self.attn(self.norm1(x), cache)
    x = x + self.attn(self.norm1(x), cache)
    return x + self.ff(self.norm2(x))


def _detached_residual(self, x, cache=None):
    x = x.detach() + self.attn(self.norm1(x), cache)
    return x + self.ff(self.norm2(x))


def _silent(model, train_step, corpus, recipe, generator, stop=None):
    bg.train(model, train_step, corpus, recipe, generator, stop)


#: Per answer: the verdict, and what it must say.
REJECTED = {
    "a forward without the cache argument": (
        lambda: ex.check_block(_block(lambda self, x: bg.Block.forward(self, x))),
        ("keep the stub's signature",)),
    "a block that drops the cache": (
        lambda: ex.check_block(_block(lambda self, x, cache=None: bg.Block.forward(self, x))),
        ("the cache never reached the attention",)),
    "start read after the append": (lambda: ex.check_attention(_attention(start_after_append=True)),
                                    ("read start = len(cache) before",)),
    "cache.attend": (lambda: ex.check_attention(_attention(attend=True)), (ex.ATTEND_SHORTCUT,)),
    "start from len(caches[0])": (lambda: ex.check_model(_gpt(lambda s, c: (len(c[0]), c))),
                                  ("Hint: ", "not from len(caches[0])")),
    "start 0 without caches": (
        lambda: ex.check_model(_gpt(lambda s, c: (0 if c is None else len(c[0]), c))),
        ("Hint: ", "the positions ignore start")),
    "one cache for all blocks": (lambda: ex.check_model(_gpt(lambda s, c: (s, c and [c[0]] * len(c)))),
                                 ("block i gets caches[i]",)),
    "the whole list to each block": (lambda: ex.check_model(_gpt(lambda s, c: (s, c and [c] * len(c)))),
                                     ("got the whole caches list", "caches[i]")),
    "a step returning a tensor": (
        lambda: ex.check_train_step(lambda *a: ex.train_variant()(*a) * torch.ones(())),
        ("returned a tensor", "loss.item()")),
    "clipping to a larger max_norm": (lambda: ex.check_train_step(_step(clip=5.0)),
                                      ("Hint: ", "a larger max_norm than 1.0")),
    "clipping after the step": (lambda: ex.check_train_step(_step(clip_late=True)),
                                ("Hint: ", "clipped after optimizer.step() (too late")),
    "clipping each gradient": (lambda: ex.check_train_step(ex.train_variant("clip_each")),
                               ("Hint: ", "clip the joint norm of all gradients together, not each")),
    "clipping by value": (lambda: ex.check_train_step(ex.train_variant("clip_value")),
                          ("Hint: ", "clip the joint norm of all gradients together, not each")),
    "zeroing between backward and step": (
        lambda: ex.check_train_step(ex.train_variant("zero_grad_late")),
        ("Hint: the weights did not change: zero the gradients before loss.backward()",)),
    "attention called twice": (lambda: ex.check_block(_block(_twice)),
                               ("the cache filled up", "call self.attn more than once")),
    "a loop returning nothing": (lambda: ex.check_train(_silent, bg.learning_rate),
                                 ("return the curve",)),
    "a detached query": (lambda: ex.check_attention(_attention(detach="query")),
                         ("gives the right outputs, but after one backward", "was the query detached")),
    "a detached key": (lambda: ex.check_attention(_attention(detach="key")),
                       ("gives the right outputs, but after one backward", "was the key detached")),
    "a detached residual": (lambda: ex.check_block(_block(_detached_residual)),
                            ("after one backward", "was the residual detached")),
}


@pytest.mark.parametrize("answer", REJECTED)
def test_answers_no_variant_writes_are_named(answer):
    verdict, fragments = REJECTED[answer]
    assert_rejected(verdict(), *fragments)


def test_cache_attend_gives_the_right_outputs_through_a_real_cache():
    x, cache = torch.randn(2, 6, 16), ah.KVCache(6)
    attention = _attention(attend=True)(16, 4).eval()
    steps = torch.cat([attention(x[:, :3], cache), attention(x[:, 3:], cache)], dim=1)
    assert torch.allclose(steps, attention(x), atol=1e-5)


@pytest.mark.parametrize("step", [_step(as_float=True), _step(zero_after_step=True)],
                         ids=["float() of the loss", "zero_grad after the step"])
def test_a_step_written_another_way_passes(step):
    assert ex.check_train_step(step)


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


@torch.no_grad()
def _refill(model, prompt, steps, temperature, top_k, use_cache, g, wasted=False):
    n_ctx, tokens = model.cfg.context, prompt
    caches = model.new_caches() if use_cache else None
    for i in range(steps):
        if not use_cache:
            logits = model(tokens[:, -n_ctx:], 0, None)
        elif i == 0 or tokens.shape[1] <= n_ctx:
            start = 0 if i == 0 else tokens.shape[1] - 1
            logits = model(tokens[:, start:], start, caches)
        else:
            caches = model.new_caches()
            model(tokens[:, -n_ctx:-1], 0, caches)            # the window but its last character
            logits = model(tokens[:, -1:], n_ctx - 1, caches)
        logits = logits[:, -1] / temperature
        if top_k is not None:
            logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[:, -1:], -torch.inf)
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g)
        tokens = torch.cat([tokens, nxt], dim=1)
    if wasted and use_cache and tokens.shape[1] > n_ctx:       # a refill for a step that never comes
        model(tokens[:, -n_ctx:-1], 0, model.new_caches())
    return tokens


def _always_cached(model, prompt, steps, temperature, top_k, use_cache, g):
    return _generate(_cached_while(le, _window))(model, prompt, steps, temperature, top_k, True, g)


#: Per misuse of the cache (or of the generator): the generate, and what its verdict must say.
MISUSES = {
    "never cropped": (_generate(_cached_while(lambda length, n: True, lambda t, c, n: (t, 0, None))),
                      ("had nowhere to go",)),
    "the stale cache past the context": (_generate(_cached_while(le, lambda t, c, n: (t[:, -n:], 0, c))),
                                         ("what is a cached key worth", "cache is full")),
    "the whole text past the context": (_generate(_cached_while(le, lambda t, c, n: (t, 0, None))),
                                        ("which n_ctx?",)),
    "the positions kept past the context": (_generate(_cached_while(le, lambda t, c, n: (
        t[:, -n:], max(0, t.shape[1] - n), None))), ("positions 0..n_ctx-1",)),
    "never cached": (_generate(_cached_while(lambda length, n: False, _window)),
                     ("the cache was never used",)),
    "always cached": (_always_cached, ("use_cache=False did not run without the cache",
                                       "re-runs the whole sequence")),
    "dropped one step early": (_generate(_cached_while(lt, _window)), (
        "the cache was dropped one step early", "exactly n_ctx = 12", "Which comparison")),
    "a wasted refill": (lambda *args: _refill(*args, wasted=True), ("call 19", "output is never used")),
    "torch's global random numbers": (_generate(_cached_while(le, _window), generator=False),
                                      ("generator=generator",)),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_each_misuse_of_the_cache_or_the_generator_is_named(misuse):
    generate, fragments = MISUSES[misuse]
    assert_rejected(ex.check_generate(generate), *fragments)


def test_a_fresh_cache_past_the_context_or_refilled_and_sampling_among_the_k_largest_pass():
    assert ex.check_generate(_refill)    # window but its last, then that one: the window's work
    fresh = _cached_while(le, lambda t, c, n: (t[:, -n:], 0, c and [ah.KVCache(n) for _ in c]))
    assert ex.check_generate(_generate(fresh))
    result = ex.check_generate(ex.generate_variant("top_k_indices"))
    assert result and "among the k largest" in result.message


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


FILLS = {
    "attention": ("cache.append(k, v); k, v = cache.keys, cache.values",
                  "ah.causal_mask(start + n)[start:]",
                  "ah.scaled_dot_product_attention(q, k, v, mask)[0]",
                  "self.out(ah.merge_heads(out))"),
    "model": ("torch.arange(start, start + tokens.shape[1])",
              "self.token_embedding(tokens) + self.position_embedding(positions)",
              "enumerate(self.blocks)", "block(x, None if caches is None else caches[i])",
              "self.head(self.norm(x))"),
    "train": ('group["lr"] = rate',
              "torch.randint(0, len(corpus.train) - n - 1, (recipe.batch,), generator=generator)",
              "torch.stack([corpus.train[s:s + n + 1] for s in starts.tolist()])",
              "train_step(model, optimizer, chunk)", "(step + 1) % recipe.eval_every == 0",
              "(step + 1, bg.estimate_loss(model, corpus.train, n), "
              "bg.estimate_loss(model, corpus.val, n))"),
    "generate": ("model(new, start, caches)[:, -1] / temperature",
                 "logits.topk(top_k, dim=-1).values[:, -1:]",
                 "logits.masked_fill(logits < kth, float('-inf'))",
                 "torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)",
                 "torch.cat([tokens, nxt], dim=1)", "tokens.shape[1] <= n_ctx",
                 "nxt, tokens.shape[1] - 1", "tokens[:, -n_ctx:], 0, None"),
}


#: Per exercise: what the skeleton is written into (the stub's given lines), and its checker.
SKELETONS = {
    "attention": (
        {"signature": "self, x, cache=None", "ah": ah, "F": F,
         "prefix": "b, n, d = x.shape\nstart = 0 if cache is None else len(cache)\n"
                   "q, k, v = (ah.split_heads(t, self.num_heads) for t in self.qkv(x).split(d, "
                   "dim=-1))\n"},
        lambda f: ex.check_attention(type("FromHint", (bg.CausalSelfAttention,), {"forward": f}))),
    "model": ({"signature": "self, tokens, start=0, caches=None", "ah": ah, "F": F},
              lambda f: ex.check_model(type("FromHint", (bg.GPT,), {"forward": f}))),
    "train": (
        {"signature": "model, train_step, corpus, recipe, generator, stop=None", "bg": bg,
         "prefix": "matrices = [p for p in model.parameters() if p.dim() >= 2]\n"
                   "others = [p for p in model.parameters() if p.dim() < 2]\n"
                   "optimizer = torch.optim.AdamW([{'params': matrices, 'weight_decay': 0.1},\n"
                   "                               {'params': others, 'weight_decay': 0.0}], "
                   "betas=recipe.betas)\nn = model.cfg.context\ncurve = []\n",
         "loop": "for step in range(recipe.steps if stop is None else stop):\n"
                 "    rate = bg.learning_rate(step, recipe)", "suffix": "return curve"},
        lambda f: ex.check_train(f, bg.learning_rate)),
    "generate": (
        {"signature": "model, prompt, steps, temperature, top_k, use_cache, generator",
         "prefix": "n_ctx = model.cfg.context\ntokens = prompt\n"
                   "caches = model.new_caches() if use_cache else None\nnew, start = prompt, 0\n",
         "loop": "for _ in range(steps):", "suffix": "return tokens"},
        ex.check_generate),
}


@pytest.mark.parametrize("name", SKELETONS)
def test_the_third_hint_is_a_skeleton(name):
    given, check = SKELETONS[name]
    given = dict(given)
    signature = given.pop("signature")
    assert not check(skeleton(f"build_gpt.{name}", signature, None, **given))
    result = check(skeleton(f"build_gpt.{name}", signature, FILLS[name], **given))
    assert result, result.message
