"""Notebook 10's lesson code: the text, the reference GPT (causal, cached = uncached, O(L) a
cached step), generation, the training loop's pieces, the head scores and the studies' records."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import build_gpt as bg


def _tiny(vocab=13, context=16):
    torch.manual_seed(0)
    return bg.GPT(bg.GPTConfig(vocab, context=context, d_model=16, num_heads=4, num_layers=2,
                               d_ff=32)).eval()


def test_the_text_is_pydoc_topics_split_90_10_by_position():
    corpus = bg.load_corpus()
    total = len(corpus.train) + len(corpus.val)
    assert total == len(bg.corpus_text()) and 400_000 < total < 600_000
    assert len(corpus.train) == int(0.9 * total)
    assert corpus.decode(corpus.encode("The for")) == "The for"
    with pytest.raises(ValueError, match="vocabulary"):
        corpus.encode("\u2603")


def test_the_gpt_is_causal_and_its_cache_gives_the_same_logits():
    model = _tiny()
    tokens = torch.randint(0, 13, (2, 10))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 13
    with torch.no_grad():
        a, b = model(tokens), model(changed)
        assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
        caches = model.new_caches()
        first = model(tokens[:, :4], 0, caches)
        rest = [model(tokens[:, t:t + 1], t, caches) for t in range(4, 10)]
        stepped = torch.cat([first, *rest], dim=1)
    assert torch.allclose(stepped, a, atol=1e-5)
    with pytest.raises(ValueError, match="past the context 16"):
        model(torch.zeros(1, 2, dtype=torch.long), 15)


def test_a_cached_step_builds_one_row_of_scores_not_a_square():
    attn = bg.CausalSelfAttention(8, 2).eval()
    attn.keep_weights = True
    cache = bg.KVCache(300)
    with torch.no_grad():
        attn(torch.randn(1, 299, 8), cache)
        attn(torch.randn(1, 1, 8), cache)
    assert attn.weights.shape == (1, 2, 1, 300)


def test_generation_with_and_without_the_cache_is_equal_and_respects_top_k():
    model = _tiny()
    prompt = torch.randint(0, 13, (3, 2))
    a = bg.generate(model, prompt, 20, 1.0, 1, True, torch.Generator().manual_seed(0))
    b = bg.generate(model, prompt, 20, 1.0, 1, False, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (3, 22)                 # 22 > 16: past the context
    with torch.no_grad():                                           # top-1 is greedy
        assert torch.equal(a[:, 2], model(prompt)[:, -1].argmax(-1))


def test_the_learning_rate_warms_up_then_decays_to_its_floor():
    r = bg.Recipe(steps=100, batch=2, lr=1e-2, warmup=10, min_lr=1e-3)
    lrs = [bg.learning_rate(s, r) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)
    assert all(b <= a + 1e-12 for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(1e-3, rel=0.01)


def test_a_short_training_run_lowers_the_held_out_loss_and_logs_a_curve():
    corpus = bg.load_corpus()
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size, context=16, d_model=32, num_heads=2,
                                num_layers=1, d_ff=64))
    before = bg.estimate_loss(model, corpus.val, 16, windows=50)
    recipe = bg.Recipe(steps=60, batch=8, lr=3e-3, warmup=5, eval_every=30)
    curve = bg.train(model, bg.train_step, corpus, recipe, torch.Generator().manual_seed(0))
    assert before == pytest.approx(math.log(corpus.vocab_size), rel=0.05)
    assert [s for s, _, _ in curve] == [30, 60] and curve[-1][2] < before - 0.5
    stopped = bg.train(model, bg.train_step, corpus, recipe, torch.Generator(), stop=10)
    assert stopped == []                                           # no evaluation before step 30


def test_head_scores_find_a_previous_character_head():
    text = "for x in y"
    n = len(text)
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    uniform = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    weights = torch.stack([previous, uniform])[None, :, None]        # (L=1, h=2, b=1, n, n)
    scores = bg.head_scores(weights, text)
    assert scores["previous character"][0, 0] == pytest.approx(1.0)
    assert scores["previous character"][0, 1].item() == pytest.approx(
        scores["previous character (uniform)"])
    assert bg.key_choices(text)["start of the word"].tolist() == [-1, -1, 0] + [-1] * 7


def test_the_offsets_tell_a_previous_character_head_from_a_recent_keys_head():
    n = 12
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    back = (torch.arange(n)[:, None] - torch.arange(n)[None]).double()       # i - j
    recent = torch.where(back >= 0, torch.exp(-back), torch.zeros(()))
    recent = recent / recent.sum(-1, keepdim=True)                           # most on itself
    weights = torch.stack([previous, recent.float()])[None, :, None]
    profile = bg.offset_profile(weights, 3)
    assert profile[0, 0].tolist() == pytest.approx([1 / n, 1.0, 0.0])
    assert profile[0, 1, 0] > profile[0, 1, 1] > profile[0, 1, 2]
    text = "abcdef ghijk"                                                    # word starts 0, 7
    ratio = bg.offset_matched(weights, text)
    assert ratio[0, 1] == pytest.approx(1.0, abs=0.3)     # recent keys: no more than offsets give


def test_the_shipped_records_are_the_code_s_recipes_and_their_claims_can_fail():
    bar, seeds = bg.load_record("build_gpt_nanogpt_bar"), bg.load_record("build_gpt_final_seeds")
    assert {k: bar["recipe"][k] for k in ("steps", "batch", "lr")} == {
        "steps": bg.NANOGPT.steps, "batch": bg.NANOGPT.batch, "lr": bg.NANOGPT.lr}
    assert seeds["recipe"]["steps"] == bg.FINAL.steps and seeds["recipe"]["lr"] == bg.FINAL.lr
    assert seeds["size"] == bg.FINAL_SIZE
    assert len(seeds["curves"]) == len(seeds["seeds"])
    assert all(bg.recipe_claims(seeds, bar).values())
    worse = seeds | {"nats": [n + 0.1 for n in seeds["nats"]]}
    assert not all(bg.recipe_claims(worse, bar).values())
    ladder = bg.load_record("build_gpt_ladder")
    assert list(ladder["bits"]) == list(bg.RUNGS)
    flat = ladder | {"bits": {r: [3.0] * 3 for r in bg.RUNGS}}
    assert not all(bg.ladder_claims(flat).values())
