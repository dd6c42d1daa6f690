"""Notebook 09's head scores on hand-made weights (exact answers), heads switched off against the
plain head-masked encoder, and the value-weighted norms against their definition."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attn_helpers.lessons import real_model as rm
from attn_helpers.masks import key_padding_to_attention_mask
from attn_helpers.pretrained import load_encoder


@pytest.fixture(autouse=True)
def one_thread():
    """Many small forward passes: on a shared 2-core machine a second thread only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hand_made(lengths=(4, 6), n=6):
    """(L=2, b, h=3, n, n) weights over the real keys: head 0 uniform, head 1 on the previous token
    (the first query on itself), head 2 on the first key; layer 1 = layer 0."""
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]          # (b, n)
    w = torch.zeros(2, len(lengths), 3, n, n)
    for b, m in enumerate(lengths):
        w[:, b, 0, :, :m] = 1 / m
        for i in range(n):
            w[:, b, 1, i, max(i - 1, 0) if i < m else 0] = 1
        w[:, b, 2, :, 0] = 1
    return w, mask


def test_entropy_grid_exact_on_hand_made_weights():
    w, mask = hand_made()
    grid, normalised = rm.entropy_grid(w, mask)
    uniform = (4 * math.log(4) + 6 * math.log(6)) / 10     # mean ln n over the 4 + 6 real queries
    assert grid.shape == (2, 3)
    assert torch.allclose(grid[:, 0], torch.full((2,), uniform), atol=1e-6)
    assert torch.allclose(normalised[:, 0], torch.ones(2), atol=1e-6)
    assert grid[:, 1:].abs().max() == 0 and normalised[:, 1:].abs().max() == 0  # one-hot rows
    with pytest.raises(ValueError, match=r"\(L, b, h, n, n\)"):                     # bad inputs
        rm.entropy_grid(w[0], mask)
    with pytest.raises(ValueError, match="mask"):
        rm.entropy_grid(w, mask[:, :-1])


def test_offset_scores_exact_on_hand_made_weights():
    w, mask = hand_made()
    previous, following = rm.offset_scores(w, mask, -1), rm.offset_scores(w, mask, +1)
    assert torch.allclose(previous[:, 1], torch.ones(2))           # every valid query on i - 1
    assert torch.allclose(following[:, 1], torch.zeros(2))
    expected = (3 / 4 + 5 / 6) / 8           # uniform head: 1/n for each query with a real neighbour
    assert torch.allclose(previous[:, 0], torch.full((2,), expected))
    assert torch.allclose(following[:, 0], torch.full((2,), expected))
    with pytest.raises(ValueError, match="offset"):
        rm.offset_scores(w, mask, 6)


def test_sink_shares_on_hand_made_weights():
    w, mask = hand_made()
    ids = torch.where(mask, 7, 0)
    ids[:, 0] = 101                                                # a [CLS] at position 0
    cls = rm.sink_shares(w, mask, ids, 101)
    assert torch.allclose(cls[:, 2], torch.ones(2))                # head 2 looks only at [CLS]
    assert torch.allclose(cls[:, 0], torch.full((2,), 2 / 10))    # uniform: 1/n per query
    with pytest.raises(ValueError, match="shape"):
        rm.sink_shares(w, mask, ids[:, :-1], 101)


def test_heads_off_equals_the_head_masked_encoder_on_a_padded_batch():
    enc = load_encoder()
    sentences = ["The cat sat.", "A much longer sentence, with many more word pieces in it.", "Hi"]
    batch = enc.tokenize(sentences)
    real = batch["attention_mask"]
    with torch.no_grad():
        x = enc.embeddings(batch["input_ids"])
        for layer in enc.layers[:2]:
            x, _ = layer(x, key_padding_to_attention_mask(real))        # layer 3's input
    keep = torch.tensor([[False] * 12, [j != 6 for j in range(12)]])  # layer 3 off; head (3, 7) off
    off = rm.heads_off(enc, x, real, 2, keep)                           # (2, s, d)
    for row, heads in zip(off, keep, strict=True):
        head_mask = torch.ones(6, 12, dtype=torch.bool)
        head_mask[2] = heads
        assert torch.allclose(row, enc.encode(sentences, head_mask=head_mask), atol=1e-5)


def test_value_norms_are_the_definition_and_the_weights_are_the_encoders():
    enc = load_encoder()
    batch = enc.tokenize(["The cat sat on the mat.", "It was tired."])
    ids, real = batch["input_ids"], batch["attention_mask"]
    weights, norms, f = rm.run_value_norms(enc, ids, real)      # checks the heads' sum itself
    with torch.no_grad():
        assert torch.allclose(weights, enc(ids, real)[1], atol=1e-6)
        att, x = enc.layers[0].attention, enc.embeddings(ids)
        v = att.v_proj(x)                                          # (b, n, h * d_head)
        for head in (0, 11):                                       # f_h(x_j) = v_j^(h) W_O^(h)
            cols = slice(32 * head, 32 * (head + 1))
            f_h = v[..., cols] @ att.out_proj.weight[:, cols].T    # (b, n, d)
            assert torch.allclose(f[0, :, head], f_h.norm(dim=-1), atol=1e-5)
    assert torch.allclose(norms, weights * f[:, :, :, None, :])


def test_it_items_units_and_resampling_on_hand_made_data():
    items, units = rm.it_items([["s1", "a", "b"], ["s2", "b", "a"]])        # one shipped pair
    assert len(items) == 2 + 2 * 50 and units["shipped"] == slice(0, 1)
    assert [s.stop - s.start for s in units.values()] == [1] + [10] * 5
    assert items[units["The X could not cross"].start * 2][1:] == ["animal", "street"]
    _, mask = hand_made()
    values = torch.rand(2, 2, 3, 6) * mask[None, :, None, :]               # (L, b, h, n)
    plain = values.sum(dim=(1, 2, 3)) / (mask.sum() * 3)                   # (L,) all sentences once
    assert torch.allclose(rm.resampled(values, mask, torch.tensor([[0, 1]]))[0], plain)


def test_course_name_renames_every_weight_of_the_file_and_checks_its_input():
    from safetensors.torch import load_file

    from attn_helpers.pretrained import course_name, model_dir
    ours = set(load_encoder().state_dict())
    theirs = {course_name(k) for k in load_file(model_dir() / "model.safetensors")
              if not k.startswith(("embeddings.position_ids", "pooler."))}
    assert theirs == ours
    assert course_name("encoder.layer.0.attention.self.query.weight") == \
        "layers.0.attention.q_proj.weight"
    with pytest.raises(TypeError, match="hf_name"):
        course_name(3)


def test_ablated_embeddings_equal_the_head_masked_encoder():
    enc = load_encoder()
    sentences = ["The cat sat.", "A much longer sentence, with many more word pieces in it.", "Hi",
                 "The dog chased the cat.", "The cat was chased by the dog."]
    on, off = rm.ablated_embeddings(enc, sentences)
    assert off.shape == (6, 13, 5, 384)
    assert torch.allclose(on, enc.encode(sentences), atol=1e-5)
    for layer, variant in ((0, 0), (3, 5), (5, 12)):
        head_mask = torch.ones(6, 12, dtype=torch.bool)
        head_mask[layer] = False if variant == 0 else head_mask[layer]
        if variant:
            head_mask[layer, variant - 1] = False
        assert torch.allclose(off[layer, variant], enc.encode(sentences, head_mask=head_mask),
                              atol=1e-5)
    with pytest.raises(TypeError, match="sentences"):
        rm.ablated_embeddings(enc, [])


def test_order_sensitivity_is_zero_for_a_reordering_that_changes_nothing_and_matches_encode():
    enc, words = load_encoder(), ["The", "cat", "sat"]          # one length: one batch, fast
    on, off = rm.order_sensitivity(enc, ["dog dog dog.", "The cat sat?"],
                                   torch.Generator().manual_seed(0), 2)
    assert on.shape == (2, 2) and off.shape == (6, 13, 2, 2)
    assert on[:, 0].abs().max() < 1e-6 and off[..., 0].abs().max() < 1e-6   # one word, any order
    g = torch.Generator().manual_seed(0)
    _, order = torch.randperm(3, generator=g), torch.randperm(3, generator=g).tolist()
    e = enc.encode(["The cat sat?", " ".join(words[i] for i in order) + "?"])
    assert abs(float(on[0, 1]) - (1 - float(e[0] @ e[1]))) < 1e-5 and on[0, 1] > 0.01


def test_the_shipped_ablation_record_matches_ablated_embeddings_on_one_pair():
    """studies/real_model_ablation.py's record (notebook 09): its shapes, its pairs' sentences,
    and the first shipped pair's cosine under all 78 variants, recomputed now."""
    record = json.loads(rm.DATA_FILE.with_name("real_model_ablation.json").read_text())
    every, pairs = record["sentences"], record["pairs"]
    Q, C = len(record["queries"]), len(record["candidates"])
    assert (Q, C, len(every), len(pairs)) == (24, 40, 112, 64)
    assert every[:Q + C] == record["queries"] + record["candidates"]
    assert all(s in every for pair in pairs for s in pair)
    assert torch.tensor(record["margin_off"]).shape == (6, 13, Q)
    assert torch.tensor(record["pair_cosine_off"]).shape == (6, 13, len(pairs))
    enc = load_encoder()
    on, off = rm.ablated_embeddings(enc, pairs[0])
    assert pairs[0] == rm.load_sentences()["paraphrases"][0]
    assert abs(float(on[0] @ on[1]) - record["pair_cosine_on"][0]) < 1e-5
    recorded = torch.tensor(record["pair_cosine_off"])[..., 0]           # (6, 13)
    assert torch.allclose((off[:, :, 0] * off[:, :, 1]).sum(-1), recorded, atol=1e-5)
