"""The GRU encoder-decoder of notebooks 01 and 06 (``lessons.rnn_bottleneck``): shapes, padding,
greedy decoding and the gradient measures, against torch's own references."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import rnn_bottleneck as seq2seq
from attn_helpers.lessons import rnn_bottleneck_positions, tasks
from attn_helpers.lessons.rnn_bottleneck import Seq2Seq

KINDS = seq2seq.ATTENTION_KINDS


def small_model(kind: str, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(13, 13, attention=kind, d_emb=8, d_enc=6, d_attn=5).eval()


@pytest.fixture
def batch(gen):
    return tasks.collate("reversal", [tasks.reversal_pair(n, gen) for n in (5, 2, 7, 1)])


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_equals_one_by_one(kind, batch):
    """Padding changes nothing: the encoder is packed and attention gives the pads weight 0."""
    model = small_model(kind)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (4, 8, 13) and (weights is None) == (kind == "none")
    if weights is not None:
        assert weights.shape == (4, 8, 7)
        real = torch.arange(7)[None, :] < batch.src_lengths[:, None]
        assert torch.allclose(weights.sum(-1), torch.ones(4, 8), atol=1e-6)
        assert torch.all(weights.masked_select(~real[:, None, :].expand_as(weights)) == 0)
    for i in range(len(batch)):
        n, m = int(batch.src_lengths[i]), int(batch.tgt_lengths[i]) + 1
        alone, alone_w = model(batch.src[i:i + 1, :n], batch.src_lengths[i:i + 1],
                               batch.tgt_in[i:i + 1, :m])
        assert torch.allclose(logits[i, :m], alone[0], atol=1e-5)
        if alone_w is not None:
            assert torch.allclose(weights[i, :m, :n], alone_w[0], atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_matches_teacher_forcing_on_its_own_outputs(kind, batch):
    model = small_model(kind, seed=3)
    tokens, weights = model.greedy_decode(batch.src, batch.src_lengths, 6)
    assert tokens.shape == (4, 6) and tokens.dtype == torch.long
    fed = torch.cat([torch.full((4, 1), tasks.SOS), tokens[:, :-1]], dim=1)
    logits, forced_weights = model(batch.src, batch.src_lengths, fed)
    assert torch.equal(logits.argmax(-1), tokens)
    if weights is not None:
        assert torch.allclose(weights, forced_weights, atol=1e-5)


def test_attention_kinds_differ_only_in_the_context(batch):
    """With attention 'none', every decoder step reads the same fixed context vector."""
    model = small_model("none")
    memory, context = model.encode(batch.src, batch.src_lengths)
    assert memory.shape == (4, 7, 12) and context.shape == (4, 12)
    states = torch.randn(4, 3, model.d_dec)
    contexts, weights = model.attend(states, memory, context, torch.ones(4, 7, dtype=torch.bool))
    assert weights is None and torch.equal(contexts, context[:, None, :].expand(4, 3, -1))
    # the context is the last forward state and the first backward state of the encoder
    for i in range(4):
        n, half = int(batch.src_lengths[i]), model.d_dec // 2
        assert torch.allclose(context[i, :half], memory[i, n - 1, :half], atol=1e-6)
        assert torch.allclose(context[i, half:], memory[i, 0, half:], atol=1e-6)


def test_dot_scores_follow_luong_general(batch):
    model = small_model("general")
    memory, context = model.encode(batch.src, batch.src_lengths)
    states = torch.randn(4, 3, model.d_dec)
    mask = torch.arange(7)[None, :] < batch.src_lengths[:, None]
    _, weights = model.attend(states, memory, context, mask)
    scores = torch.einsum("btd,bjd->btj", states, model.key_proj(memory)) / model.d_dec ** 0.5
    expected = torch.softmax(scores.masked_fill(~mask[:, None, :], float("-inf")), -1)
    assert torch.allclose(weights, expected, atol=1e-6)


@pytest.fixture
def same_length(gen):
    return tasks.collate("reversal", [tasks.reversal_pair(6, gen) for _ in range(3)])


@pytest.mark.parametrize("kind", KINDS)
def test_input_gradient_norms_equal_the_jacobian(kind, same_length):
    """Entry [i, t, j] is |d log p(y_t) / d x_j| for example i: checked against
    torch.autograd.functional.jacobian of each example alone."""
    model = small_model(kind)
    norms = seq2seq.input_gradient_norms(model, same_length)
    assert norms.shape == (3, 6, 6) and not norms.requires_grad and not model.training
    for i in (0, 2):                                  # the first and the last of the batch
        src, lengths = same_length.src[i:i + 1], same_length.src_lengths[i:i + 1]
        tgt_in, tgt_out = same_length.tgt_in[i:i + 1, :6], same_length.tgt_out[i, :6]

        def log_p(x, src=src, lengths=lengths, tgt_in=tgt_in, tgt_out=tgt_out):
            logits, _ = model(src, lengths, tgt_in, src_embedded=x)
            return torch.log_softmax(logits[0], -1)[torch.arange(6), tgt_out]   # (n_t,)

        jacobian = torch.autograd.functional.jacobian(log_p, model.src_embed(src).detach())
        assert torch.allclose(norms[i], jacobian[:, 0].norm(dim=-1), rtol=1e-4, atol=1e-7)


def test_model_bad_inputs(batch):
    with pytest.raises(ValueError, match="attention must be one of"):
        Seq2Seq(13, 13, attention="luong")
    model = small_model("additive")
    with pytest.raises(ValueError, match=r"src must be a 2-D integer tensor.*\(7,\)"):
        model.encode(batch.src[0], batch.src_lengths)
    with pytest.raises(ValueError, match=r"every source length must lie in 1..n_src=7"):
        model.encode(batch.src, torch.tensor([5, 2, 8, 1]))
    with pytest.raises(ValueError, match=r"tgt_in must be an integer tensor"):
        model(batch.src, batch.src_lengths, batch.tgt_in.float())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        model.greedy_decode(batch.src, batch.src_lengths, 0)
    with pytest.raises(ValueError, match=r"same length, got \[5, 2, 7, 1\]"):
        seq2seq.input_gradient_norms(model, batch)
    with pytest.raises(TypeError, match="batch must be a tasks.Batch"):
        seq2seq.predict(model, batch.src)
    with pytest.raises(ValueError, match="unknown checkpoint"):
        seq2seq.load_pretrained("seq2seq_nothing")
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        seq2seq.train_seq2seq({"task": "reversal"})


def test_by_position_counts_right_and_skipped_ahead_outputs(gen):
    """Notebook 01's per-position record: shares by output position, and of the wrong outputs."""
    model = small_model("none")
    test = tasks.collate("reversal", [tasks.reversal_pair(6, gen) for _ in range(4)])
    p, tokens = rnn_bottleneck_positions.by_position(model, test), seq2seq.predict(model, test)[0]
    digits = test.tgt_out                                                   # (4, 7): 6 digits, </s>
    wrong = tokens[:, :-1] != digits[:, :5]
    assert p["greedy"] == pytest.approx((tokens == digits[:, :6]).float().mean(0).tolist(), abs=1e-4)
    ahead = ((tokens[:, :-1] == digits[:, 1:6]) & wrong).sum() / wrong.sum()
    assert p["skip_greedy"][0] == pytest.approx(ahead.item(), abs=1e-4)
