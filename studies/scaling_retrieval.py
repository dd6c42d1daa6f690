"""Notebook 03's retrieval model on many seeds: Adam and plain SGD, with and without 1/sqrt(d_k).

Trains notebook 03's `RetrievalModel` (d_k = 256) with and without the scaling. Adam, 300 steps,
seeds 0-4: `training_claims` must hold on every seed (the notebook trains seed 0 live).
Plain SGD (no momentum, no clipping), 150 steps at learning rates 0.3 and 3, seeds 0-5, with the
gradient that reaches the scores and W_Q, W_K at the initial weights: `sgd_claims`, which
the notebook asserts on this record. Plain SGD at seven rates from 0.03 to 30, seeds 0-2, brackets
each model's best rate: `lr_claims`. Exercise 3's measurement of the gradient at W_Q on
seeds 5-29 (the notebook uses 0-4): `projection_claims`. It records the SGD runs (every
loss, 4 significant digits), the sweep's end losses and, per Adam seed, its claims, in
attn_helpers/data/scaling_retrieval.json.
Re-run: python3 course.py studies scaling_retrieval      (about 2 minutes on 2 cores)
"""
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from attn_helpers.lessons import scaling
from attn_helpers.lessons.scaling import lr_claims, projection_claims, sgd_claims, training_claims
from attn_helpers.training import single_thread

RECORDS = ["attn_helpers/data/scaling_retrieval.json"]
ADAM_SEEDS = (0, 1, 2, 3, 4)
SGD_LRS, SGD_SEEDS, SGD_STEPS = (0.3, 3.0), (0, 1, 2, 3, 4, 5), 150
SWEEP_LRS, SWEEP_SEEDS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0), (0, 1, 2)
PROJECTION_SEEDS = tuple(range(5, 30))


def sgd_run(scaled, lr, seed, d_k=256, d_in=64, batch=64):
    """The notebook's model, task and batches, trained with plain SGD: a small gradient makes a
    small step. Returns every step's loss and, at the initial weights on a probe batch of 1024
    queries, the mean norm of the gradient reaching one query's scores and the norm of the
    gradient on W_Q, W_K."""
    torch.manual_seed(seed)
    model = scaling.RetrievalModel(d_in, d_k, scaled=scaled)
    query, keys, values, target = scaling.retrieval_batch(
        1024, torch.Generator().manual_seed(20_000 + seed), d_in=d_in)
    scores = model.scores(query, keys)                                  # (b, n)
    scores.retain_grad()
    F.mse_loss((torch.softmax(scores, -1)[:, :, None] * values).sum(1), target).backward()
    gradients = {"scores": scores.grad.norm(dim=-1).mean().item() * 1024,    # per query
                 "weights": torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()}
    model.zero_grad(set_to_none=True)

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator, losses = torch.Generator().manual_seed(seed), []
    for _ in range(SGD_STEPS):
        query, keys, values, target = scaling.retrieval_batch(batch, generator, d_in=d_in)
        loss = F.mse_loss(model(query, keys, values), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(f"{loss.item():.4g}"))
    return {"lr": lr, "seed": seed, "scaled": scaled, "losses": losses, "gradients": gradients}


def main():
    adam = []
    for seed in ADAM_SEEDS:
        runs = {flag: scaling.train_retrieval(scaled=flag, seed=seed) for flag in (True, False)}
        claims = training_claims(runs)
        assert all(claims.values()), (seed, claims)
        adam.append({"seed": seed, "claims": claims})
        print(f"Adam, seed {seed}: all {len(claims)} claims hold")

    with single_thread():
        sgd = [sgd_run(scaled, lr, seed) for lr in SGD_LRS for seed in SGD_SEEDS
               for scaled in (True, False)]
    claims = sgd_claims(sgd)
    assert all(claims.values()), claims
    print(f"SGD, seeds {SGD_SEEDS}: all {len(claims)} claims hold")

    with single_thread():
        sweep = [{"lr": lr, "seed": seed, "scaled": scaled,
                  "end": scaling.mean_loss(sgd_run(scaled, lr, seed)["losses"], -50)}
                 for lr in SWEEP_LRS for seed in SWEEP_SEEDS for scaled in (True, False)]
    claims = lr_claims(sweep)
    assert all(claims.values()), claims
    print(f"SGD sweep over {SWEEP_LRS}: both best rates bracketed, scaled >= 10x unscaled")

    table = scaling.projection_gradient_table(None, scaling.D_KS, PROJECTION_SEEDS)
    claims = {**projection_claims(table), **projection_claims(table, why=True)}
    assert all(claims.values()), claims
    print(f"gradient at W_Q, seeds {PROJECTION_SEEDS[0]}-{PROJECTION_SEEDS[-1]}: all claims hold")

    path = Path(RECORDS[0])
    if path.exists():                   # the shipped record: the same runs within CPU tolerances
        shipped = json.loads(path.read_text())
        for old, new in zip(shipped["sgd"], sgd, strict=True):
            assert (old["lr"], old["seed"], old["scaled"]) == (new["lr"], new["seed"], new["scaled"])
            for a, b in ((scaling.mean_loss(old["losses"], -50), scaling.mean_loss(new["losses"], -50)),
                         *zip(old["gradients"].values(), new["gradients"].values(), strict=True)):
                assert math.isclose(a, b, rel_tol=0.25, abs_tol=1e-3), (old["seed"], a, b)
        for old, new in zip(shipped.get("sweep", sweep), sweep, strict=True):
            assert math.isclose(old["end"], new["end"], rel_tol=0.25, abs_tol=1e-3), (old, new)
    path.write_text(json.dumps({"adam": adam, "sgd": sgd, "sweep": sweep}) + "\n")


if __name__ == "__main__":
    main()
