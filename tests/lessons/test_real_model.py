"""Notebook 09's head scores on hand-made weights (exact answers), the fast ablation against the
plain head-masked encoder, the norms, the sign test, and the findings on each half of the data."""

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
    with pytest.raises(ValueError, match="W_O"):
        rm.value_norms(w[0], torch.zeros(2, 3, 6, 4), torch.zeros(8, 5))


def test_fast_ablation_equals_the_head_masked_encoder():
    """The batched ablation gives the same cosines as enc.encode(..., head_mask) run plainly."""
    enc, data = load_encoder(), rm.load_sentences()
    abl = rm.ablation(enc, data["paraphrases"], data["non_paraphrases"])
    pairs, n_p = data["paraphrases"] + data["non_paraphrases"], len(data["paraphrases"])
    on = rm.pair_similarities(enc, pairs)
    assert torch.allclose(torch.cat([abl.paraphrase, abl.non_paraphrase]), on, atol=1e-5)
    off = torch.ones(6, 12, dtype=torch.bool)
    off[5] = False                                                  # layer 6's heads off
    assert torch.allclose(abl.cosines[5, 0], rm.pair_similarities(enc, pairs, off), atol=1e-5)
    off = torch.ones(6, 12, dtype=torch.bool)
    off[2, 6] = False                                               # head (3, 7) alone off
    assert torch.allclose(abl.cosines[2, 1 + 6], rm.pair_similarities(enc, pairs, off), atol=1e-5)
    c = rm.gap_change(abl, range(n_p), range(n_p, len(pairs)), torch.Generator().manual_seed(0), 5)
    assert c.gap == pytest.approx(float(on[:n_p].mean() - on[n_p:].mean()), abs=1e-5)


def test_value_norms_add_up_and_row_shares_sum_to_one():
    enc = load_encoder()
    att = rm.run_attention(enc, ["The cat sat on the mat.", "It was tired."])
    weights, norms = rm.run_value_norms(enc, att.input_ids, att.mask)   # checks the heads' sum
    assert torch.allclose(weights, att.weights, atol=1e-6)
    f = rm.value_vector_norms(enc, att.input_ids, att.mask)             # (L, b, h, n)
    assert torch.allclose(norms, weights * f[:, :, :, None, :], atol=1e-5)
    shares = rm.row_shares(norms)
    real_rows = att.mask[None, :, None, :].expand(shares.shape[:-1])
    assert torch.allclose(shares.sum(-1)[real_rows], torch.ones(()), atol=1e-5)


def test_sign_test_is_the_binomial_tail():
    p = rm.sign_test(torch.tensor([16, 5, 0, 3]), torch.tensor([0, 0, 0, 3]))
    assert p[0] == pytest.approx(2.0 ** -16) and p[1] == pytest.approx(1 / 32)
    assert p[2] == 1 and p[3] == pytest.approx(42 / 64)


def test_coreference_counts_flips_and_items_must_come_in_pairs():
    co = rm.coreference(load_encoder(), rm.load_sentences()["coreference"])
    assert co.pairs == 16 and co.correct.shape == (6, 12)
    assert ((co.right + co.wrong) <= co.pairs).all() and int(co.correct.max()) <= 2 * co.pairs
    with pytest.raises(ValueError, match="pairs"):
        rm.coreference(None, [["The cat sat because it was tired.", "cat", "mat"]])


@pytest.mark.parametrize("half", [0, 1])
def test_positional_head_and_cls_sink_hold_on_each_half_of_the_sentences(half):
    """Not a property of a few sentences: each half of the shipped set shows the previous-token
    head (> 0.9) and the [CLS] sink (> 0.5 in layers 2-5) that the notebook reports."""
    enc = load_encoder()
    att = rm.run_attention(enc, rm.load_sentences()["sentences"][6 * half: 6 * half + 6])
    previous = rm.offset_scores(att.weights, att.mask, -1)
    cls = rm.sink_shares(att.weights, att.mask, att.input_ids, enc.cls_id).mean(dim=1)
    assert rm.top_heads(previous, 1)[0][:2] == (0, 2) and previous[0, 2] > 0.9
    assert (cls[1:-1] > 0.5).all()


def test_bootstrap_gap_resamples_each_group_within_itself():
    cosines = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [0.9, 0.7, 0.1, 0.2, 0.3]])   # (2, pairs)
    g = torch.Generator().manual_seed(0)
    boot = rm.bootstrap_gap(cosines, range(0, 2), range(2, 5), g, resamples=200)
    assert boot.shape == (2, 200)
    assert torch.equal(boot[0], torch.ones(200))                    # constant groups: no spread
    assert (boot[1] >= 0.4 - 1e-6).all() and (boot[1] <= 0.8 + 1e-6).all()     # within the extremes
    assert boot[1].mean() == pytest.approx(0.8 - 0.2, abs=0.03)
    for bad in (range(0), range(3, 9), [0, 1]):
        with pytest.raises(ValueError, match="first"):
            rm.bootstrap_gap(cosines, bad, range(2, 5), g)


def test_gap_change_reads_the_right_way_for_a_negative_gap():
    """change > 0 means the gap rose, whatever the gap's sign: a gap of -1 that falls to -2 is -1."""
    para, non = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0])         # gap on: 0 - 1 = -1
    cosines = torch.zeros(1, 2, 4)                                         # (L=1, 1 + h=1, pairs)
    cosines[0, 0] = torch.tensor([0.0, 0.0, 2.0, 2.0])                    # the layer off: -2
    cosines[0, 1] = torch.tensor([0.5, 0.5, 1.0, 1.0])                    # the head off: -0.5
    abl = rm.Ablation(para, non, cosines)
    c = rm.gap_change(abl, range(0, 2), range(2, 4), torch.Generator().manual_seed(0), 50)
    assert c.gap == pytest.approx(-1.0)
    assert torch.allclose(c.off, torch.tensor([[-2.0, -0.5]]))
    assert torch.allclose(c.change, torch.tensor([[-1.0, 0.5]]))          # fell by |gap|; rose by half
    assert c.boot.shape == (1, 2, 50) and torch.allclose(c.boot, c.change[..., None])  # no spread
