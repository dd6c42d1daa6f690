"""Notebook 04's seed study: `TwoRelationModel` (d_model 32, 600 Adam steps, one thread) with 2 heads
and with 1 head on seeds 0-4, then the same ten runs at learning rates 1e-3 and 1e-2 ("lr_sweep").
Per run: held-out accuracy per relation, final loss (mean of the last 10% of steps), each head's mean
weight on key i-1 and on key 0, the loss curve in means of 10 steps, and (two heads) the held-out
accuracy without each head, zero- and mean-ablated.
Asserts `multi_head.study_claims` on the fresh rows, compares them with the shipped ones, and writes
the two-head and the one-head model of seed 0 (the latter with every row).
Re-run: python3 course.py studies multi_head_seeds      (about 1-2 minutes on 2 idle cores, one thread)
"""
import itertools
from dataclasses import replace
from pathlib import Path

import torch

from attn_helpers.lessons import multi_head
from attn_helpers.training import save_checkpoint, single_thread

RECORDS = ["attn_helpers/checkpoints/multihead_two_relations.pt",
           "attn_helpers/checkpoints/multihead_one_head.pt"]
HEADS = (1, 2)
LR_SWEEP = (1e-3, 1e-2)   # around the checkpoint's 3e-3: does "two heads learn faster" hold there too?
EVERY = multi_head.LOSS_EVERY


def run(num_heads, seed, tokens, targets, lr=multi_head.CONFIG.lr):
    config = replace(multi_head.CONFIG, num_heads=num_heads, seed=seed, lr=lr)
    model, result = multi_head.train_two_relations(config)
    with torch.no_grad():
        _, weights = model(tokens)                                   # (512, h, n, n)
    losses = result.losses
    row = {"num_heads": num_heads, "seed": seed,
           "accuracy": multi_head.relation_accuracy(model, tokens, targets),
           "final_loss": result.final_loss,
           "relation_scores": multi_head.head_relation_scores(weights).tolist(),
           "loss_curve": [sum(losses[i:i + EVERY]) / EVERY for i in range(0, len(losses), EVERY)]}
    if num_heads > 1:        # held-out accuracy without each head, zero- and mean-ablated
        row["ablation"] = {kind: [multi_head.ablated_accuracy(model, tokens, targets, head, kind)
                                  for head in range(num_heads)] for kind in ("zero", "mean")}
    return model, row


def main():
    tokens, targets = multi_head.evaluation_batch()
    models, rows = {}, []
    for num_heads, seed in itertools.product(HEADS, multi_head.STUDY_SEEDS):
        models[num_heads, seed], row = run(num_heads, seed, tokens, targets)
        rows.append(row)
        print(f"{num_heads} head(s), seed {seed}: accuracy {row['accuracy']}, "
              f"final loss {row['final_loss']:.1e}", flush=True)

    sweep = []                       # the same ten runs at two other learning rates
    for lr, num_heads, seed in itertools.product(LR_SWEEP, HEADS, multi_head.STUDY_SEEDS):
        _, row = run(num_heads, seed, tokens, targets, lr=lr)
        sweep.append({"lr": lr, **{key: row[key] for key in ("num_heads", "seed", "accuracy",
                                                             "final_loss", "loss_curve")}})
        print(f"lr {lr:g}, {num_heads} head(s), seed {seed}: final loss {row['final_loss']:.1e}",
              flush=True)

    claims = multi_head.study_claims(rows)
    for claim, holds in claims.items():
        print("✓" if holds else "✗", claim)
    assert all(claims.values()), "a claim of notebook 04 fails on the fresh study"

    try:
        _, shipped = multi_head.load_one_head()
    except FileNotFoundError:
        shipped = None
    if shipped is not None:          # the fresh rows against the shipped ones (any CPU)
        for fresh, old in zip(rows, shipped["study"], strict=True):
            assert (fresh["num_heads"], fresh["seed"]) == (old["num_heads"], old["seed"])
            for relation, accuracy in fresh["accuracy"].items():
                assert abs(accuracy - old["accuracy"][relation]) <= 0.01, (fresh, old)
            assert torch.allclose(torch.tensor(fresh["relation_scores"]),
                                  torch.tensor(old["relation_scores"]), atol=0.05), (fresh, old)
            assert 0.5 < fresh["final_loss"] / old["final_loss"] < 2, (fresh, old)

    two, one = models[2, 0], models[1, 0]
    row = rows[HEADS.index(2) * len(multi_head.STUDY_SEEDS)]
    save_checkpoint(two, Path(RECORDS[0]), {"config": two.config.__dict__, "loss_every": EVERY,
                                            "loss_curve": [round(x, 4) for x in row["loss_curve"]],
                                            "accuracy": row["accuracy"]})
    save_checkpoint(one, Path(RECORDS[1]), {"config": one.config.__dict__, "loss_every": EVERY,
                                            "study": rows, "lr_sweep": sweep})


if __name__ == "__main__":
    with single_thread():    # training is one thread already; the evaluations too
        main()
