"""The toy tasks: readable tokens, correct targets, deterministic generation, padded batches."""

from __future__ import annotations

import datetime

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.lessons import tasks
from attn_helpers.lessons.tasks import DATES, EOS, PAD, REVERSAL, SOS


def test_vocab_round_trip_and_specials():
    vocab = tasks.Vocab(["a", "b", "c"])
    assert vocab.itos[:3] == ["<pad>", "<s>", "</s>"] and len(vocab) == 6
    ids = vocab.encode(["c", "a", "b"])
    assert ids == [5, 3, 4]
    assert vocab.decode([SOS, *ids, EOS, 4, PAD]) == ["c", "a", "b"]
    assert vocab.decode(torch.tensor([3, PAD, 4])) == ["a", "b"]


@pytest.mark.parametrize("date, words", [
    ((1999, 3, 21), "twenty one march nineteen ninety nine"),
    ((2000, 7, 4), "four july two thousand"),
    ((2013, 2, 13), "thirteen february two thousand thirteen"),
    ((2029, 8, 31), "thirty one august two thousand twenty nine"),
])
def test_date_words(date, words):
    assert " ".join(tasks.date_to_words(*date)) == words


def test_every_date_has_distinct_words_and_known_tokens():
    """Reading the words back must be possible: no two dates share the same words."""
    seen = {}
    day = datetime.date(tasks.YEAR_RANGE[0], 1, 1)
    while day.year <= tasks.YEAR_RANGE[1]:
        if not (day.month == 2 and day.day == 29):
            words = tuple(tasks.date_to_words(day.year, day.month, day.day))
            assert words not in seen, (day, seen.get(words))
            seen[words] = day
            DATES.src_vocab.encode(words)
        day += datetime.timedelta(days=1)
    assert len(seen) == 80 * 365


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31))
def test_date_pair_is_consistent(seed):
    words, iso = tasks.date_pair(torch.Generator().manual_seed(seed))
    text = "".join(iso)
    parsed = datetime.date.fromisoformat(text)
    assert tasks.date_to_words(parsed.year, parsed.month, parsed.day) == words
    assert len(iso) == 10 and iso[4] == iso[7] == "-"


def test_make_batch_layout(gen):
    batch = tasks.make_batch(REVERSAL, 16, gen)
    assert batch.src.shape == (16, int(batch.src_lengths.max())) and len(batch) == 16
    low, high = REVERSAL.lengths
    assert int(batch.src_lengths.min()) >= low and int(batch.src_lengths.max()) <= high
    assert torch.equal(batch.tgt_lengths, batch.src_lengths)
    assert batch.tgt_in.shape == batch.tgt_out.shape == (16, int(batch.tgt_lengths.max()) + 1)
    assert torch.all(batch.tgt_in[:, 0] == SOS)
    for i in range(16):
        n = int(batch.src_lengths[i])
        assert torch.all(batch.src[i, n:] == PAD) and torch.all(batch.src[i, :n] > EOS)
        source = REVERSAL.src_vocab.decode(batch.src[i])
        target = REVERSAL.tgt_vocab.decode(batch.tgt_out[i])
        assert target == source[::-1]
        assert batch.tgt_out[i, n] == EOS and torch.all(batch.tgt_out[i, n + 1:] == PAD)
        assert torch.equal(batch.tgt_in[i, 1:n + 1], batch.tgt_out[i, :n])
    assert torch.equal(batch.content_mask, (batch.tgt_out != PAD) & (batch.tgt_out != EOS))


def test_make_batch_fixed_length_dates_and_determinism(gen):
    batch = tasks.make_batch("reversal", 4, gen, length=9)
    assert batch.src.shape == (4, 9) and torch.all(batch.src_lengths == 9)
    dates = tasks.make_batch("dates", 8, gen)
    assert torch.all(dates.tgt_lengths == 10)
    assert torch.all(dates.src_lengths >= 3) and torch.all(dates.src_lengths <= 7)
    a, b = (tasks.make_batch(DATES, 8, torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    assert tasks.example("reversal", 3, 12) == tasks.example("reversal", 3, 12)
    assert tasks.example("reversal", 3, 12) != tasks.example("reversal", 4, 12)


def test_eval_batches_cover_every_length():
    batches = tasks.eval_batches("reversal", 3)
    assert list(batches) == list(range(REVERSAL.lengths[0], REVERSAL.lengths[1] + 1))
    assert all(torch.all(b.src_lengths == n) for n, b in batches.items())
    assert list(tasks.eval_batches("dates", 5)) == [None]


@pytest.mark.parametrize("call, error, pattern", [
    (lambda g: tasks.get_task("copy"), ValueError, "unknown task 'copy'"),
    (lambda g: tasks.make_batch(REVERSAL, 0, g), ValueError, "batch_size must be >= 1, got 0"),
    (lambda g: tasks.make_batch(REVERSAL, 2, 0), TypeError,
     "generator must be a torch.Generator, got int"),
    (lambda g: tasks.make_batch(DATES, 2, g, length=5), ValueError, "draws its own lengths"),
    (lambda g: tasks.collate(REVERSAL, []), ValueError, "at least one"),
    (lambda g: tasks.example(REVERSAL, 1.5), TypeError, "index must be an int"),
    (lambda g: tasks.reversal_pair(0, g), ValueError, "length must be >= 1"),
    (lambda g: tasks.Vocab(["a", "a"]), ValueError, "unique"),
    (lambda g: tasks.Vocab(["a"]).encode(["a", "z"]), ValueError, "unknown token.*'z'"),
    (lambda g: tasks.date_to_words(1949, 1, 1), ValueError, "year"),
    (lambda g: tasks.date_to_words(2001, 2, 29), ValueError, "date"),
])
def test_bad_inputs(gen, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(gen)
