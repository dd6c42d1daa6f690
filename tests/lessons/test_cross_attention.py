"""Notebook 06's measures and claims: alignment hits on synthetic weights, the decoder layer
against torch, memory keys and values projected once, and the claims on the shipped models."""

from __future__ import annotations

import pytest
import torch

import attn_helpers as ah
from attn_helpers.lessons import cross_attention, rnn_bottleneck, tasks


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The GRU models are tiny: one thread is fastest, and steady on a busy machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def reversal_model():
    return rnn_bottleneck.load_pretrained("seq2seq_reversal_additive")


def _one_hot_alignment(batch, shift: int) -> torch.Tensor:
    """(b, n_t, n_src) weights whose peak is the mirror position moved by ``shift``."""
    b, n_t, n_src = len(batch), batch.tgt_out.shape[1], batch.src.shape[1]
    weights = torch.full((b, n_t, n_src), 0.01)
    for i in range(b):
        L = int(batch.src_lengths[i])
        for t in range(L):
            weights[i, t, min(max(L - 1 - t + shift, 0), n_src - 1)] = 1.0
    return weights


def test_antidiagonal_hits_exact_and_with_tolerance():
    batch = tasks.collate("reversal", [tasks.example("reversal", i, 6 + i) for i in range(3)])
    exact = cross_attention.antidiagonal_hits(_one_hot_alignment(batch, 0), batch)
    real = torch.arange(exact.shape[1])[None, :] < batch.tgt_lengths[:, None]
    assert torch.equal(exact, real)                           # every real step, no padded one
    shifted = _one_hot_alignment(batch, 1)
    assert not (cross_attention.antidiagonal_hits(shifted, batch) & real)[:, 1:].any()
    near = cross_attention.antidiagonal_hits(shifted, batch, tolerance=1)
    assert near[:, 1:][real[:, 1:]].all()
    with pytest.raises(ValueError, match="weights"):
        cross_attention.antidiagonal_hits(torch.zeros(2, 3, 4), batch)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first):
    assert cross_attention.decoder_layer_gap(norm_first) < 1e-5


def test_memory_projected_once_equals_the_whole_cross_attention():
    torch.manual_seed(3)
    cross = ah.MultiHeadAttention(16, 4, kdim=12, vdim=12)
    y, memory = torch.randn(2, 6, 16), torch.randn(2, 5, 12)
    real = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    with torch.no_grad():
        once, calls = cross_attention.cross_attention_memory_once(cross, y, memory, real)
        full, _ = cross(y, memory, memory, real[:, None, :])
        unmasked, _ = cross_attention.cross_attention_memory_once(cross, y, memory)
    assert calls == {"k_proj": 1, "v_proj": 1} and torch.allclose(once, full, atol=1e-6)
    assert not torch.allclose(unmasked[1], full[1], atol=1e-3)  # the padding mask is applied
    assert not cross.k_proj._forward_hooks and not cross.v_proj._forward_hooks  # hooks removed
    with pytest.raises(TypeError, match="num_kv_heads"):
        cross_attention.cross_attention_memory_once(
            ah.MultiHeadAttention(16, 4, num_kv_heads=2), y, y)


def test_decoder_claims_hold():
    claims = cross_attention.decoder_claims()
    assert all(claims.values()), claims


def test_mirror_offsets_on_synthetic_weights():
    batch = tasks.collate("reversal", [tasks.example("reversal", i, 6 + i) for i in range(3)])
    real = torch.arange(batch.tgt_out.shape[1])[None, :] < batch.tgt_lengths[:, None]
    offsets = cross_attention.mirror_offsets(_one_hot_alignment(batch, 1), batch)
    assert torch.all(offsets[:, 1:][real[:, 1:]] == 1)      # step 0's L - t is clipped to L - 1
    before = cross_attention.mirror_offsets(_one_hot_alignment(batch, -2), batch)
    unclipped = torch.arange(before.shape[1])[None, :] < batch.tgt_lengths[:, None] - 2
    assert torch.all(before[unclipped] == -2)               # the last two steps clip to 0


def test_neighbour_steps_and_alignment_claims(reversal_model):
    stats = cross_attention.neighbour_steps(reversal_model)
    assert stats["steps"] > 1000
    assert 0 < stats["mirror weight"] < stats["peak weight"] <= 1
    assert 0.97 <= stats["correct"] <= 1
    assert stats["one after"] >= cross_attention.NEIGHBOUR_AFTER * stats["steps"]
    pooled = cross_attention.reversal_alignment_stats(reversal_model)
    offsets = pooled["offsets"]
    assert sum(offsets.values()) == pooled["steps"] == 50 * sum(range(4, 25))
    assert offsets["+1"] + offsets["-1"] == stats["steps"] and offsets["+1"] == stats["one after"]
    assert pooled["exact"] == pytest.approx(offsets["0"] / pooled["steps"])
    claims = cross_attention.alignment_claims(reversal_model)
    assert all(claims.values()), claims


def test_alignment_claims_fail_for_an_untrained_model():
    untrained = rnn_bottleneck.build_model(rnn_bottleneck.CONFIGS["seq2seq_reversal_additive"])
    claims = cross_attention.alignment_claims(untrained)
    assert not claims["it sits within one position of it at >= 97% of the steps (>= 93% at "
                      "every length)"]
    assert not all(claims.values())


def test_all_claims_together(reversal_model):
    gru = rnn_bottleneck.load_pretrained("seq2seq_dates_general")
    together = cross_attention.claims(reversal_model, gru)
    assert together == {**cross_attention.alignment_claims(reversal_model),
                        **cross_attention.dates_claims(gru), **cross_attention.decoder_claims()}
    assert all(together.values())


def test_dates_claims_hold_and_can_fail():
    model = rnn_bottleneck.load_pretrained("seq2seq_dates_general")
    claims = cross_attention.dates_claims(model)
    assert all(claims.values()), claims
    test = tasks.eval_batches("dates", 300)[None]
    _, weights = rnn_bottleneck.predict(model, test)
    entropy = ah.attention_entropy(weights.double()).mean(0)
    assert abs(entropy[4] - entropy[0]) < cross_attention.SEPARATOR_TIE < entropy[1] - entropy[4]
    untrained = rnn_bottleneck.build_model(rnn_bottleneck.CONFIGS["seq2seq_dates_general"])
    assert not all(cross_attention.dates_claims(untrained).values())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transformer_claims_on_fresh_trainings(seed):
    """The notebook trains seed 0 and says seeds 1 and 2 give the same picture: checked here."""
    gru = rnn_bottleneck.load_pretrained("seq2seq_dates_general")
    table = cross_attention.alignment_table(gru, cross_attention.train_transformer_dates(seed))
    claims = cross_attention.transformer_claims(table)
    assert all(claims.values()), claims      # every head in HEAD_FIELD_RANGE included


def test_transformer_shapes_and_claims_can_fail():
    model = cross_attention.TransformerSeq2Seq()                   # untrained
    batch = tasks.make_batch("dates", 3, torch.Generator().manual_seed(0))
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (3, batch.tgt_in.shape[1], len(tasks.DATES.tgt_vocab))
    assert weights.shape == (3, 2, batch.tgt_in.shape[1], batch.src.shape[1])
    real = torch.arange(batch.src.shape[1])[None, :] < batch.src_lengths[:, None]
    assert torch.all(weights.masked_select(~real[:, None, None, :]) == 0)   # pads never read
    tokens, step_weights = model.greedy_decode(batch.src, batch.src_lengths, 10)
    assert tokens.shape == (3, 10) and step_weights.shape == (3, 2, 10, batch.src.shape[1])
    table = cross_attention.alignment_table(
        rnn_bottleneck.load_pretrained("seq2seq_dates_general"), model)
    assert not all(cross_attention.transformer_claims(table).values())


def test_count_claims_measure_the_gap_to_a_tie_at_digit_steps():
    weights = torch.zeros(2, 10, 4)
    weights[..., 0], weights[..., 1] = 0.6, 0.4
    assert cross_attention.digit_step_margin(weights) == pytest.approx(0.2)
    assert all(cross_attention.count_claims(weights).values())
    weights[1, 9, 1] = 0.6 - 1e-4                                     # a near tie at a digit step
    assert cross_attention.digit_step_margin(weights) == pytest.approx(1e-4, abs=1e-6)
    assert not any(cross_attention.count_claims(weights).values())
    weights[1, 9, 1], weights[1, 4, 1] = 0.4, 0.6                     # a tie at a separator: ignored
    assert all(cross_attention.count_claims(weights).values())
