"""Notebook 10's lesson code: the text, the reference GPT (causal, cached = uncached), the
training recipe's pieces, the ladder's shipped results and claims, and the head scores."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import build_gpt as bg
from attn_helpers.lessons import build_gpt_heads as heads
from attn_helpers.lessons import build_gpt_ladder as ladder
from attn_helpers.lessons import build_gpt_train as bgt


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


def test_generation_with_and_without_the_cache_is_equal_and_respects_top_k():
    model = _tiny()
    prompt = torch.randint(0, 13, (3, 2))
    a = bg.generate(model, prompt, 12, 1.0, 1, True, torch.Generator().manual_seed(0))
    b = bg.generate(model, prompt, 12, 1.0, 1, False, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (3, 14)
    with torch.no_grad():                                           # top-1 is greedy
        assert torch.equal(a[:, 2], model(prompt)[:, -1].argmax(-1))


def test_the_learning_rate_warms_up_then_decays_to_its_floor():
    r = bgt.Recipe(steps=100, lr=1e-2, warmup=10, final_lr_share=0.1)
    lrs = [bgt.lr_at(s, r) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)
    assert all(b <= a + 1e-12 for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(1e-3, rel=0.01)


def test_a_short_training_run_lowers_the_held_out_loss():
    corpus = bg.load_corpus()
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size, context=16, d_model=32, num_heads=2,
                                num_layers=1, d_ff=64))
    before = bgt.held_out_loss(model, corpus.val, 16, windows=50)
    log = bgt.train_gpt(model, bgt.Recipe(steps=60, batch=8, lr=3e-3, warmup=5),
                        corpus=corpus, eval_every=30, eval_windows=50, progress=False)
    assert before == pytest.approx(math.log(corpus.vocab_size), rel=0.05)
    assert log.evaluations[-1][1] < before - 0.5
    assert len(log.losses) == 60 and log.cpu_seconds > 0


def test_the_final_recipe_reads_fewer_characters_than_nanogpt():
    assert bgt.FINAL.steps * bgt.FINAL.batch < bgt.NANOGPT.steps * bgt.NANOGPT.batch


def test_the_shipped_ladder_holds_its_claims():
    results = ladder.load_ladder()
    assert list(results["bits"]) == list(ladder.RUNGS) and len(results["seeds"]) >= 3
    claims = ladder.ladder_claims(results)
    assert all(claims.values()), claims


def test_every_rung_runs_and_only_the_bigram_ignores_the_past():
    for rung in ladder.RUNGS:
        model = ladder.LadderModel(rung, 11, d_model=16, context=8, heads=4).eval()
        tokens = torch.randint(0, 11, (2, 8))
        assert model(tokens).shape == (2, 8, 11)
        past = tokens.clone()
        past[:, 0] = (past[:, 0] + 1) % 11
        same = torch.allclose(model(tokens)[:, -1], model(past)[:, -1])
        assert same == (rung == "bigram")


def test_head_scores_find_a_previous_character_head():
    text = "for x in y"
    n = len(text)
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    uniform = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    weights = torch.stack([previous, uniform])[None, :, None]        # (L=1, h=2, b=1, n, n)
    scores = heads.head_scores(weights, text)
    assert scores["previous character"][0, 0] == pytest.approx(1.0)
    assert scores["previous character"][0, 1].item() == pytest.approx(
        scores["previous character (uniform)"])
    choices = heads.key_choices(text)
    assert choices["start of the word"].tolist() == [-1, -1, 0, -1, -1, -1, -1, -1, -1, -1]


def _report(offsets, score, over_3x=2, word=2.0):
    return {"previous character": {"offsets": offsets, "score": score,
                                   "heads over 3x uniform": over_3x},
            "start of the word": {"offset-matched": word}}


def test_the_head_claims_tell_a_previous_character_head_from_a_recent_keys_head():
    n = 12
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    back = (torch.arange(n)[:, None] - torch.arange(n)[None]).double()       # i - j
    recent = torch.where(back >= 0, torch.exp(-back), torch.zeros(()))
    recent = recent / recent.sum(-1, keepdim=True)                           # most on itself
    profile = heads.offset_profile(torch.stack([previous, recent.float()])[None, :, None], 3)
    assert profile[0, 0].tolist() == pytest.approx([1 / n, 1.0, 0.0])
    assert profile[0, 1, 0] > profile[0, 1, 1] > profile[0, 1, 2]
    peak, sharp = list(heads.head_claims(_report([0.05, 0.85, 0.04], 0.85)))[1:3]
    assert all(heads.head_claims(_report([0.05, 0.85, 0.04], 0.85)).values())
    recent_claims = heads.head_claims(_report(profile[0, 1].tolist(), 0.5))
    assert not recent_claims[peak] and not recent_claims[sharp]
    assert not heads.head_claims(_report([0.2, 0.45, 0.16], 0.45))[sharp]   # a soft head
    assert not heads.head_claims(_report([0.2, 0.8, 0.1], 0.8))[peak]       # under 5x itself


def test_the_head_report_names_a_head_and_its_profile():
    corpus = bg.load_corpus()
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size, context=16, d_model=16, num_heads=2,
                                num_layers=2, d_ff=32)).eval()
    report = heads.head_report(model, corpus)
    prev = report["previous character"]
    assert 1 <= prev["head"][0] <= 2 and 1 <= prev["head"][1] <= 2
    assert len(prev["offsets"]) == 3 and all(0 <= x <= 1 for x in prev["offsets"])
    assert 0 <= prev["largest on it"] <= 1 and set(heads.head_claims(report)) >= {
        "at least two heads put over 3x a uniform head's weight on the previous character"}


@pytest.mark.slow
def test_the_ladder_re_trained_holds_the_claims_and_the_shipped_losses():
    shipped = ladder.load_ladder()
    fresh = ladder.run_ladder(seeds=(0,))
    for rung in ladder.RUNGS:
        assert fresh["bits"][rung][0] == pytest.approx(shipped["bits"][rung][0], abs=0.05)
    steps = [ladder.mean(fresh["bits"][b]) - ladder.mean(fresh["bits"][a])
             for a, b in zip(ladder.RUNGS, ladder.RUNGS[1:], strict=False)]
    assert all(s < 0 for s in steps)


def test_a_step_returning_the_loss_as_a_tensor_trains_without_a_warning():
    corpus = bg.load_corpus()
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size, context=8, d_model=16, num_heads=2,
                                num_layers=1, d_ff=16))

    def step(model, optimizer, chunk):
        loss = bg.next_token_loss(model, chunk)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss                                              # a tensor, not loss.item()

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = bgt.train_gpt(model, bgt.Recipe(steps=3, batch=2, warmup=1), corpus=corpus,
                            step_fn=step, eval_every=3, eval_windows=5, progress=False)
    assert len(log.losses) == 3 and all(isinstance(v, float) for v in log.losses)


def test_the_same_samples_claim_names_the_shape_and_can_fail():
    tokens = torch.arange(12).view(3, 4)
    ((name, holds),) = bgt.same_samples_claims(tokens, tokens.clone()).items()
    assert holds and "3 x 4 tokens" in name
    other = tokens.clone()
    other[1, 2] += 1
    assert not any(bgt.same_samples_claims(tokens, other).values())
