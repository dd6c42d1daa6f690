"""Models of attn_helpers.seq2seq (shapes, padding, greedy decoding, references), the widgets of
notebooks 01 and 06, and their exercise checkers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attn_helpers import seq2seq, tasks
from attn_helpers.exercises import seq2seq as ex
from attn_helpers.seq2seq import CrossAttention, Seq2Seq
from attn_helpers.widgets import seq2seq as wd

KINDS = seq2seq.ATTENTION_KINDS


def small_model(kind: str, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(13, 13, attention=kind, d_emb=8, d_enc=6, d_attn=5).eval()


@pytest.fixture
def batch(gen):
    return tasks.collate("reversal", [tasks.reversal_pair(n, gen) for n in (5, 2, 7, 1)])


# --- Seq2Seq ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_shapes(kind, batch):
    model = small_model(kind)
    memory, context = model.encode(batch.src, batch.src_lengths)
    assert memory.shape == (4, 7, 12) and context.shape == (4, 12)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (4, 8, 13)
    tokens, greedy_weights = model.greedy_decode(batch.src, batch.src_lengths, 6)
    assert tokens.shape == (4, 6) and tokens.dtype == torch.long
    if kind == "none":
        assert weights is None and greedy_weights is None
    else:
        assert weights.shape == (4, 8, 7) and greedy_weights.shape == (4, 6, 7)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_weights_are_distributions_that_skip_padding(kind, batch):
    _, weights = small_model(kind)(batch.src, batch.src_lengths, batch.tgt_in)
    real = torch.arange(7)[None, :] < batch.src_lengths[:, None]
    assert torch.allclose(weights.sum(-1), torch.ones(4, 8), atol=1e-6)
    assert torch.all(weights.masked_select(~real[:, None, :].expand_as(weights)) == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_equals_one_by_one(kind, batch):
    """Padding must change nothing: the encoder is packed and attention masks the pads."""
    model = small_model(kind)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
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
    fed = torch.cat([torch.full((4, 1), tasks.SOS), tokens[:, :-1]], dim=1)
    logits, forced_weights = model(batch.src, batch.src_lengths, fed)
    assert torch.equal(logits.argmax(-1), tokens)
    if weights is not None:
        assert torch.allclose(weights, forced_weights, atol=1e-5)


def test_attention_kinds_differ_only_in_the_context(batch):
    """With attention 'none', every decoder step reads the same fixed context vector."""
    model = small_model("none")
    memory, context = model.encode(batch.src, batch.src_lengths)
    states = torch.randn(4, 3, model.d_dec)
    contexts, weights = model.attend(states, memory, context, torch.ones(4, 7, dtype=torch.bool))
    assert weights is None and torch.equal(contexts, context[:, None, :].expand(4, 3, -1))
    # the context is the last forward state and the first backward state of the encoder
    for i in range(4):
        n, half = int(batch.src_lengths[i]), model.d_dec // 2
        assert torch.allclose(context[i, :half], memory[i, n - 1, :half], atol=1e-6)
        assert torch.allclose(context[i, half:], memory[i, 0, half:], atol=1e-6)


def test_dot_scores_follow_luong_general(batch):
    model = small_model("dot")
    memory, context = model.encode(batch.src, batch.src_lengths)
    states = torch.randn(4, 3, model.d_dec)
    mask = torch.arange(7)[None, :] < batch.src_lengths[:, None]
    _, weights = model.attend(states, memory, context, mask)
    scores = torch.einsum("btd,bjd->btj", states, model.key_proj(memory)) / model.d_dec ** 0.5
    expected = torch.softmax(scores.masked_fill(~mask[:, None, :], float("-inf")), -1)
    assert torch.allclose(weights, expected, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_input_gradient_norms(kind, batch):
    model = small_model(kind)
    norms = seq2seq.input_gradient_norms(model, batch, 0)
    assert norms.shape == (5,) and torch.all(norms > 0) and not norms.requires_grad
    assert not model.training


def test_loss_and_accuracy(batch):
    model = small_model("additive")
    loss = seq2seq.seq2seq_loss(model, batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
    assert loss.dim() == 0 and 1.0 < loss.item() < 5.0  # about ln(13) for an untrained model
    accuracy = seq2seq.accuracy_by_length(model, {"all": batch})
    assert list(accuracy) == ["all"] and 0.0 <= accuracy["all"] <= 1.0


def test_model_bad_inputs(batch):
    with pytest.raises(ValueError, match="attention must be one of"):
        Seq2Seq(13, 13, attention="luong")
    with pytest.raises(ValueError, match="d_enc must be >= 1"):
        Seq2Seq(13, 13, d_enc=0)
    model = small_model("additive")
    with pytest.raises(ValueError, match=r"src must be a 2-D integer tensor.*\(7,\)"):
        model.encode(batch.src[0], batch.src_lengths)
    with pytest.raises(ValueError, match=r"src_lengths must be an integer tensor of shape"):
        model.encode(batch.src, batch.src_lengths[:2])
    with pytest.raises(ValueError, match=r"every source length must lie in 1..n_src=7"):
        model.encode(batch.src, torch.tensor([5, 2, 8, 1]))
    with pytest.raises(ValueError, match=r"tgt_in must be an integer tensor"):
        model(batch.src, batch.src_lengths, batch.tgt_in.float())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        model.greedy_decode(batch.src, batch.src_lengths, 0)
    with pytest.raises(ValueError, match=r"step must be an int in 0..5"):
        seq2seq.input_gradient_norms(model, batch, 6)
    with pytest.raises(TypeError, match="batch must be a tasks.Batch"):
        seq2seq.predict(model, batch.src)
    with pytest.raises(ValueError, match="unknown checkpoint"):
        seq2seq.load_pretrained("seq2seq_nothing")
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        seq2seq.train_seq2seq({"task": "reversal"})


# --- CrossAttention -------------------------------------------------------------------------


@pytest.mark.parametrize("d_memory", [None, 6])
def test_cross_attention_equals_torch_multihead(d_memory, gen):
    d_model = 8
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(d_model, 1, kdim=d_memory, vdim=d_memory, batch_first=True)
    layer = CrossAttention.from_torch(reference)
    y = torch.randn(2, 3, d_model, generator=gen)               # n_q = 3 decoder steps
    x = torch.randn(2, 5, d_memory or d_model, generator=gen)   # n_k = 5 encoder positions
    memory_mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out, weights = layer(y, x, memory_mask)
    expected, expected_w = reference(y, x, x, key_padding_mask=~memory_mask)
    assert out.shape == (2, 3, d_model) and weights.shape == (2, 3, 5)
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.allclose(weights, expected_w, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.lists(st.integers(1, 7), min_size=1, max_size=3))
def test_cross_attention_properties(n_q, n_k, lengths):
    lengths = [min(n, n_k) for n in lengths]
    g = torch.Generator().manual_seed(n_q * 100 + n_k)
    torch.manual_seed(1)
    layer = CrossAttention(4, 3)
    y = torch.randn(len(lengths), n_q, 4, generator=g)
    x = torch.randn(len(lengths), n_k, 3, generator=g)
    mask = torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None]
    out, weights = layer(y, x, mask)
    assert out.shape == (len(lengths), n_q, 4)
    assert torch.allclose(weights.sum(-1), torch.ones(len(lengths), n_q), atol=1e-6)
    assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
    # changing what sits in the padding changes nothing
    x2 = torch.where(mask[:, :, None], x, 100.0)
    assert torch.allclose(layer(y, x2, mask)[0], out, atol=1e-5)


def test_cross_attention_bad_inputs():
    layer = CrossAttention(4, 3)
    with pytest.raises(ValueError, match=r"y \(the decoder states\).*d_model=4.*\(2, 3, 5\)"):
        layer(torch.ones(2, 3, 5), torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match=r"x \(the encoder states\).*d_memory=3.*\(2, 4, 4\)"):
        layer(torch.ones(2, 3, 4), torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match=r"memory_mask must be bool with shape \(b, n_k\)"):
        layer(torch.ones(2, 3, 4), torch.ones(2, 4, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        layer([1.0], torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match="num_heads=1"):
        CrossAttention.from_torch(nn.MultiheadAttention(8, 2))


# --- widgets ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models():
    return {"no attention": small_model("none"), "additive attention": small_model("additive")}


def test_decode_frame(models):
    frame = wd.decode_frame(9, "additive attention", 2, models)
    source, target = tasks.example("reversal", 2, 9)
    assert list(frame.source) == source and list(frame.target) == target
    assert frame.weights.shape == (9, 9) and frame.has_attention and frame.mask is None
    assert frame.readouts["token accuracy"] == sum(frame.correct) / 9
    assert [o == t for o, t in zip(frame.output, target, strict=True)] == list(frame.correct)
    plain = wd.decode_frame(9, "no attention", 2, models)
    assert not plain.has_attention and not plain.mask.any()
    assert plain.readouts["mean entropy (nats)"] == "no attention"
    with pytest.raises(ValueError, match="model_name must be one of"):
        wd.decode_frame(9, "dot", 2, models)


def test_bottleneck_widget_moves(models):
    w = wd.bottleneck_widget(models)
    assert w.error is None and w.frame.weights.shape == (20, 20)
    readouts = w.set(length=6, model_name="no attention", index=3)
    assert w.error is None and readouts["model"] == "no attention"
    assert w.frame.readouts == wd.decode_frame(6, "no attention", 3, models).readouts
    assert w.image.value[:4] == b"\x89PNG"


def test_alignment_frame_and_widget(models):
    model = models["additive attention"]
    frame = wd.alignment_frame(model, "reversal", 1, 2)
    n = len(tasks.example("reversal", 1)[0])
    assert frame.weights.shape == (n, n) and frame.highlight_row == 2
    assert frame.mask[:3].all() and not frame.mask[3:].any()
    last = wd.alignment_frame(model, "reversal", 1, 99)
    assert last.highlight_row == n - 1 and last.mask.all()
    w = wd.alignment_widget(model, "reversal")
    w.set(index=1, step=2)
    assert w.error is None and w.frame.readouts == frame.readouts
    with pytest.raises(ValueError, match="no attention"):
        wd.alignment_frame(models["no attention"], "reversal", 0, 0)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        wd.alignment_frame(model, "reversal", 0, -1)
    with pytest.raises(TypeError, match="model must be a seq2seq.Seq2Seq"):
        wd.alignment_frame("model", "reversal", 0, 0)


# --- exercise checkers ----------------------------------------------------------------------


def test_reverse_padded_checker():
    assert ex.check_reverse_padded(ex.reverse_padded_reference)
    verdict = ex.check_reverse_padded(lambda t, n: t.flip(-1))
    assert not verdict and "padding (0) to the front" in verdict.message
    assert not ex.check_reverse_padded(lambda t, n: t)


def test_token_accuracy_checker():
    def right(p, t, n):
        real = torch.arange(t.shape[1])[None, :] < n[:, None]
        return ((p == t) & real).sum() / real.sum()

    assert ex.check_token_accuracy(right)
    verdict = ex.check_token_accuracy(lambda p, t, n: (p == t).float().mean())
    assert not verdict and "padding positions were counted" in verdict.message


def test_cross_attention_checker():
    def right(dec, enc, lengths):
        mask = torch.arange(enc.shape[1])[None, None, :] < lengths[:, None, None]
        scores = dec @ enc.transpose(-2, -1) / dec.shape[-1] ** 0.5
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        return weights @ enc, weights

    assert ex.check_cross_attention(right)

    def unmasked(dec, enc, lengths):
        weights = torch.softmax(dec @ enc.transpose(-2, -1) / dec.shape[-1] ** 0.5, -1)
        return weights @ enc, weights

    verdict = ex.check_cross_attention(unmasked)
    assert not verdict and "padded encoder positions received weight" in verdict.message


def test_antidiagonal_checker():
    assert ex.check_antidiagonal_share(ex.antidiagonal_share_reference)

    def padded_width(weights, lengths):
        n = weights.shape[1]
        steps = torch.arange(n)[None, :]
        real = steps < lengths[:, None]
        return ((weights.argmax(-1) == n - 1 - steps) & real).sum() / real.sum()

    verdict = ex.check_antidiagonal_share(padded_width)
    assert not verdict and "use each sequence's own length" in verdict.message
    # the reference on a perfect anti-diagonal is 1, on a perfect diagonal of length > 1 lower
    eye = torch.eye(4)[None]
    assert ex.antidiagonal_share_reference(eye.flip(-1), torch.tensor([4])).item() == 1.0
    assert ex.antidiagonal_share_reference(eye, torch.tensor([4])).item() == 0.0
