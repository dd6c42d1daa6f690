"""Notebook 09's head scores on hand-made weights (exact answers), the fast ablation against the
plain head-masked encoder, and the value-weighted norms against their definition."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.lessons import real_model as rm
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


def test_sink_shares_and_top_heads_on_hand_made_weights():
    w, mask = hand_made()
    ids = torch.where(mask, 7, 0)
    ids[:, 0] = 101                                                # a [CLS] at position 0
    cls = rm.sink_shares(w, mask, ids, 101)
    assert torch.allclose(cls[:, 2], torch.ones(2))                # head 2 looks only at [CLS]
    assert torch.allclose(cls[:, 0], torch.full((2,), 2 / 10))    # uniform: 1/n per query
    grid = torch.tensor([[0.1, 0.5, 0.2], [0.9, 0.0, 0.3]])
    assert rm.top_heads(grid, 2) == [(1, 0, pytest.approx(0.9)), (0, 1, 0.5)]
    with pytest.raises(ValueError, match="shape"):
        rm.sink_shares(w, mask, ids[:, :-1], 101)


def test_bad_inputs_name_the_argument():
    w, mask = hand_made()
    with pytest.raises(ValueError, match=r"\(L, b, h, n, n\)"):
        rm.entropy_grid(w[0], mask)
    with pytest.raises(ValueError, match="mask"):
        rm.entropy_grid(w, mask[:, :-1])
    with pytest.raises(ValueError, match="k must be"):
        rm.top_heads(torch.zeros(2, 3), 7)


def pair_similarities(enc, pairs, head_mask=None):
    """The plain way: each pair's cosine from ``enc.encode`` with one head mask."""
    e = enc.encode([s for pair in pairs for s in pair], head_mask=head_mask)    # (2p, d)
    return (e[0::2] * e[1::2]).sum(dim=-1)


def test_fast_ablation_equals_the_head_masked_encoder():
    enc, data = load_encoder(), rm.load_sentences()
    pairs = data["paraphrases"] + data["non_paraphrases"]
    on, off = rm.ablation(enc, pairs)
    assert off.shape == (6, 13, len(pairs))
    assert torch.allclose(on, pair_similarities(enc, pairs), atol=1e-5)
    layer_off, head_off = torch.ones(2, 6, 12, dtype=torch.bool)
    layer_off[5] = False                                            # layer 6's heads off
    head_off[2, 6] = False                                          # head (3, 7) alone off
    for got, head_mask in ((off[5, 0], layer_off), (off[2, 1 + 6], head_off)):
        assert torch.allclose(got, pair_similarities(enc, pairs, head_mask), atol=1e-5)


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
