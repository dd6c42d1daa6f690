"""attn_helpers.pretrained against ``transformers``' BertModel and tokenizer and
``sentence-transformers``, offline: padding, non-ASCII text and an input past 512 positions."""

from __future__ import annotations

import os

import pytest
import torch

from attn_helpers.pretrained import Encoder, load_encoder, model_dir

SENTENCES = ["The cat sat on the mat.", "Attention is all you need, or so the paper said.",
             "Café crème brûlée, naïve façade: Ελληνικά, русский, العربية.",
             "東京の天気は晴れです 🎉🙂 and emoji too", "ok", ""]
LONG = " ".join(["antidisestablishmentarianism is a long word"] * 80)  # > 512 word pieces

HIDDEN_TOL, ATTENTION_TOL, EMBEDDING_TOL = 1e-4, 1e-5, 1e-5


@pytest.fixture(scope="module")
def enc() -> Encoder:
    return load_encoder()


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModel, AutoTokenizer

    path = str(model_dir())
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    return model.eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def sbert():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir()), device="cpu")


def hf_forward(model, batch):
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                    output_attentions=True)
    return out.last_hidden_state, torch.stack(out.attentions)  # (b, n, d), (L, b, h, n, n)


def test_offline_flags_are_set():
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_tokenize_matches_hf_tokenizer(enc, hf):
    _, tok = hf
    sentences = [*SENTENCES, LONG]
    ours = enc.tokenize(sentences)
    ref = tok(sentences, padding=True, truncation=True, max_length=512, return_tensors="pt")
    assert torch.equal(ours["input_ids"], ref["input_ids"])
    assert torch.equal(ours["attention_mask"], ref["attention_mask"].bool())
    assert ours["input_ids"].shape == (7, 512)
    assert ours["truncated"] == [False] * 6 + [True]
    for i, tokens in enumerate(ours["tokens"]):
        n_real = int(ref["attention_mask"][i].sum())
        assert tokens == tok.convert_ids_to_tokens(ref["input_ids"][i, :n_real].tolist())
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert "[UNK]" in ours["tokens"][3] and "東" in ours["tokens"][3]  # emoji unknown, CJK split
    assert ours["tokens"][5] == ["[CLS]", "[SEP]"]                     # the empty sentence


def test_forward_matches_hf_bert_with_padding(enc, hf):
    """Short sentences of different lengths in one batch: every position, padding included."""
    batch = enc.tokenize(SENTENCES)
    hidden, attentions = enc(batch["input_ids"], batch["attention_mask"])
    ref_hidden, ref_attentions = hf_forward(hf[0], batch)
    b, n = batch["input_ids"].shape
    assert hidden.shape == (b, n, 384) and attentions.shape == (6, b, 12, n, n)
    assert (hidden - ref_hidden).abs().max() < HIDDEN_TOL
    assert (attentions - ref_attentions).abs().max() < ATTENTION_TOL
    assert attentions[..., ~batch["attention_mask"][0]][:, 0].abs().max() == 0  # pad keys: 0


@pytest.mark.slow
def test_forward_matches_hf_bert_with_long_input(enc, hf):
    """A 512-piece input padded with short ones: every real position (rows of padding queries
    carry only float noise, amplified over 6 layers)."""
    batch = enc.tokenize([SENTENCES[1], LONG, SENTENCES[3]])
    hidden, attentions = enc(batch["input_ids"], batch["attention_mask"])
    ref_hidden, ref_attentions = hf_forward(hf[0], batch)
    real = batch["attention_mask"]                                         # (b, n)
    assert (hidden - ref_hidden)[real].abs().max() < HIDDEN_TOL
    per_query = (attentions - ref_attentions).abs().amax(dim=(0, 2, 4))   # (b, n)
    assert per_query[real].max() < ATTENTION_TOL


@pytest.mark.parametrize("sentences", [
    SENTENCES, pytest.param([SENTENCES[0], LONG], marks=pytest.mark.slow)], ids=["short", "long"])
def test_encode_matches_sentence_transformers(enc, sbert, sentences):
    """Both cut the long input to 256 word pieces (sentence-transformers' max_seq_length)."""
    ours = enc.encode(sentences)
    ref = sbert.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)
    assert ours.shape == (len(sentences), 384)
    assert (ours - ref.cpu()).abs().max() < EMBEDDING_TOL
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(sentences)), atol=1e-6)


def test_load_encoder_is_cached_frozen_and_in_eval_mode(enc):
    assert load_encoder() is enc
    assert not enc.training and not any(p.requires_grad for p in enc.parameters())
    assert (enc.cfg.num_layers, enc.cfg.num_heads, enc.cfg.d_model) == (6, 12, 384)
    assert sum(p.numel() for p in enc.parameters()) == 22_565_376  # BertModel minus its pooler


def test_head_mask_zeroes_exactly_that_heads_output(enc):
    """Switching off head (l, i) equals zeroing its 32 input columns of layer l's W^O."""
    batch = enc.tokenize(SENTENCES[:3])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    full, _ = enc(ids, mask)
    assert torch.equal(enc(ids, mask, head_mask=torch.ones(6, 12, dtype=torch.bool))[0], full)
    head_mask = torch.ones(6, 12, dtype=torch.bool)
    head_mask[2, 5] = False
    ablated, _ = enc(ids, mask, head_mask=head_mask)
    w_o = enc.layers[2].attention.out_proj.weight                  # (d, d), the shared model
    saved = w_o[:, 5 * 32 : 6 * 32].clone()
    try:
        w_o[:, 5 * 32 : 6 * 32] = 0
        edited, _ = enc(ids, mask)
    finally:
        w_o[:, 5 * 32 : 6 * 32] = saved
    assert torch.equal(enc(ids, mask)[0], full)                      # restored
    assert (ablated - edited).abs().max() < 1e-5
    assert (ablated - full).abs().max() > 1e-2  # and the head mattered


def test_integer_attention_mask_is_accepted(enc):
    batch = enc.tokenize(SENTENCES[:2])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert torch.equal(enc(ids, mask.long())[0], enc(ids, mask)[0])
    assert torch.equal(enc(ids[:1, :9])[0], enc(ids[:1, :9], mask[:1, :9])[0])  # no padding


@pytest.mark.parametrize(("sentences", "error", "match"), [
    ([], ValueError, "empty"), ("a single string", TypeError, "list of str"),
    (["fine", 3], TypeError, "int at index 1"), (None, TypeError, "list of str")])
def test_bad_sentences(enc, sentences, error, match):
    with pytest.raises(error, match=match):
        enc.tokenize(sentences)
    with pytest.raises(error, match=match):
        enc.encode(sentences)


def test_bad_forward_inputs(enc):
    ids = enc.tokenize(["a short one", "and a longer sentence"])["input_ids"]
    mask = ids != 0
    cases = [
        ((ids.float(), mask), {}, TypeError, "integer"),
        ((ids[0], mask[0]), {}, ValueError, r"\(b, n\)"),
        ((torch.ones(1, 513, dtype=torch.long),), {}, ValueError, "513"),
        ((ids + 40000, mask), {}, ValueError, "30522"),
        ((ids, mask[:, :-1]), {}, ValueError, "shape of input_ids"),
        ((ids, mask.float()), {}, TypeError, "attention_mask"),
        ((ids, torch.zeros_like(mask)), {}, ValueError, "all padding"),
        ((ids, mask), {"head_mask": torch.ones(12)}, ValueError, r"\(6, 12\)"),
        ((ids, mask), {"head_mask": [1] * 12}, TypeError, "head_mask"),
    ]
    for args, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            enc(*args, **kwargs)
    with pytest.raises(ValueError, match="max_length"):
        enc.tokenize(["x"], max_length=513)
