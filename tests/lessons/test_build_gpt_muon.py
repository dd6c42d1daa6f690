"""Notebook 10's Muon (``lessons.build_gpt_muon``): checked against ``torch.optim.Muon`` and the
SVD, and the combined optimizer steps every parameter once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.lessons import build_gpt as bg
from attn_helpers.lessons.build_gpt_muon import Muon, MuonWithAdamW, orthogonalize


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 40), n=st.integers(2, 40), seed=st.integers(0, 2**16))
def test_orthogonalize_keeps_the_singular_vectors_and_lands_the_values_near_one(m, n, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(m, n, generator=g, dtype=torch.float64)
    o = orthogonalize(u).double()
    left, s, right_t = torch.linalg.svd(u, full_matrices=False)
    inner = left.mT @ o @ right_t.mT                      # diagonal if the vectors are kept
    diag = inner.diagonal()
    off = inner - torch.diag(diag)
    assert off.abs().max() < 1e-4
    # five iterations of Jordan's quintic: about 0.7 to 1.2, except directions with a tiny share
    big = s / s.max() > 1e-2
    assert ((diag[big] > 0.6) & (diag[big] < 1.25)).all()


def test_orthogonalize_batches_and_refuses_a_vector():
    x = torch.randn(3, 5, 7)
    assert torch.allclose(orthogonalize(x)[1], orthogonalize(x[1]), atol=1e-6)
    with pytest.raises(ValueError, match="update must be a matrix"):
        orthogonalize(torch.randn(4))


def test_one_step_equals_torch_muon_up_to_its_bfloat16():
    """torch.optim.Muon runs its iterations in bfloat16: about 1% apart, never more than 3%."""
    g = torch.Generator().manual_seed(0)
    shapes = [(24, 8), (8, 24), (16, 16), (8, 24)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    a = Muon(ours, lr=0.02, weight_decay=0.1, scale=1.0)
    b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    before = [p.detach().clone() for p in ours]
    for step in grads:
        for p, q, grad in zip(ours, theirs, step, strict=True):
            p.grad, q.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    for p, q, p0 in zip(ours, theirs, before, strict=True):
        moved, torch_moved = p.detach() - p0, q.detach() - p0
        assert (moved - torch_moved).norm() < 0.03 * torch_moved.norm()


def test_muon_refuses_a_vector_parameter():
    with pytest.raises(ValueError, match="matrices only"):
        Muon([torch.nn.Parameter(torch.randn(5))])


def test_the_combined_optimizer_splits_the_gpt_and_follows_the_schedule():
    corpus = bg.load_corpus()
    cfg = bg.GPTConfig(corpus.vocab_size, context=8, d_model=16, num_heads=2, num_layers=2, d_ff=32)
    model = bg.GPT(cfg)
    opt = MuonWithAdamW(model, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, muon_scale=1.6)
    muon_ids = {id(p) for p in opt.muon.param_groups[0]["params"]}
    adam_ids = {id(p) for group in opt.adamw.param_groups for p in group["params"]}
    names = {id(p): name for name, p in model.named_parameters()}
    assert not muon_ids & adam_ids and muon_ids | adam_ids == set(names)
    assert all(names[i].startswith("blocks.") for i in muon_ids)
    assert "token_embedding.weight" in {names[i] for i in adam_ids}
    for group in opt.param_groups:
        group["lr"] = 5e-3
    assert opt.muon.param_groups[0]["lr"] == opt.adamw.param_groups[0]["lr"] == 5e-3
    recipe = bg.Recipe(steps=3, batch=2, warmup=1, optimizer="muon", muon_scale=1.6)
    before = [p.detach().clone() for p in model.parameters()]
    bg.train_gpt(model, recipe, corpus=corpus, eval_every=0, progress=False)
    assert all(not torch.equal(p0, p) for p0, p in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="recipe.optimizer"):
        bg.make_optimizer(model, bg.Recipe(optimizer="sgd"))


def test_the_counted_newton_schulz_flops_are_what_torch_counts():
    from torch.utils.flop_counter import FlopCounterMode

    cfg = bg.GPTConfig(20, context=8, d_model=16, num_heads=2, num_layers=2, d_ff=48)
    model = bg.GPT(cfg)
    hidden = [p for name, p in model.named_parameters() if p.dim() == 2 and name.startswith("blocks.")]
    for p in hidden:
        p.grad = torch.randn_like(p)
    opt = Muon(hidden)
    with FlopCounterMode(display=False) as counter:
        opt.step()
    assert counter.get_total_flops() == bg.muon_flops_per_step(cfg)


def test_a_scaled_step_is_torch_muon_at_a_scaled_rate_and_an_unscaled_decay():
    """``scale`` multiplies the update, not the decay: torch's Muon at lr s*lr, decay wd/s."""
    g = torch.Generator().manual_seed(1)
    start = torch.randn(12, 20, generator=g)
    grad = torch.randn(12, 20, generator=g)
    moved = {}
    for name, make in {
            "ours": lambda p: Muon([p], lr=0.02, weight_decay=0.1, scale=1.6),
            "torch": lambda p: torch.optim.Muon([p], lr=0.032, weight_decay=0.1 / 1.6,
                                                adjust_lr_fn="match_rms_adamw"),
            "unscaled decay": lambda p: torch.optim.Muon([p], lr=0.032, weight_decay=0.1,
                                                         adjust_lr_fn="match_rms_adamw")}.items():
        p = torch.nn.Parameter(start.clone())
        p.grad = grad.clone()
        make(p).step()
        moved[name] = p.detach() - start
    gap = (moved["ours"] - moved["torch"]).norm() / moved["torch"].norm()
    assert gap < 0.03                                           # torch's bfloat16: about 1%
    assert (moved["ours"] - moved["unscaled decay"]).norm() > (moved["ours"] - moved["torch"]).norm()
