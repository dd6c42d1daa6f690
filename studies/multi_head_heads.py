"""Notebook 04's cost of more heads: section 3's model with h = 1, 2, 4, 8, 16 and 32 heads.

d_model stays 32, so a head's width is d_head = 32 / h (32 down to 1). Everything else is the
checkpoint's recipe (multi_head.train_two_relations: Adam at lr 3e-3, batches of 64, the MLP, one
thread), on seeds 0, 1 and 2, for 1,200 steps (twice the recipe's 600, so slow settings can still
arrive). Records per run the loss curve (mean of every 10 steps, as the seed study keeps), the steps
to a mean loss below 0.01 (None if never), the final loss and the held-out accuracy per relation.
Written to attn_helpers/data/multi_head_heads.json; notebook 04 plots it and asserts on it in view.
A re-run checks the h = 1 and h = 2 runs' first 600 steps against the seed study's curves (the same
recipe and seeds) and the shipped record's steps-to-0.01 within 30 steps.
Re-run: python3 course.py studies multi_head_heads      (~5 min of CPU; 12 minutes on 2 busy cores)
"""
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from attn_helpers.lessons import multi_head

RECORDS = ["attn_helpers/data/multi_head_heads.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]
SEEDS, HEADS, STEPS, TARGET = (0, 1, 2), (1, 2, 4, 8, 16, 32), 1200, 0.01


def run(num_heads: int, seed: int) -> dict:
    config = replace(multi_head.CONFIG, num_heads=num_heads, seed=seed, steps=STEPS)
    model, result = multi_head.train_two_relations(config)
    every = multi_head.LOSS_EVERY
    curve = [sum(result.losses[i:i + every]) / every for i in range(0, STEPS, every)]
    below = next((i for i, mean in enumerate(curve) if mean < TARGET), None)
    tokens, targets = multi_head.evaluation_batch()
    return {"num_heads": num_heads, "d_head": 32 // num_heads, "seed": seed, "steps": STEPS,
            "steps_to_0.01": None if below is None else every * (below + 1),
            "final_loss": float(f"{result.final_loss:.3g}"),
            "accuracy": {k: round(v, 4) for k, v in
                         multi_head.relation_accuracy(model, tokens, targets).items()},
            "loss_curve": [float(f"{mean:.3g}") for mean in curve]}


def main():
    rows = []
    for num_heads in HEADS:
        for seed in SEEDS:
            began = time.monotonic()
            rows.append(run(num_heads, seed))
            print(f"{time.monotonic() - began:.0f} s h={num_heads} seed={seed} "
                  f"steps_to_0.01={rows[-1]['steps_to_0.01']} final={rows[-1]['final_loss']}",
                  flush=True)
    _, shipped = multi_head.load_one_head()          # the seed study: same recipe, same seeds
    for row in (r for r in rows if r["num_heads"] <= 2):
        seed_row = next(r for r in shipped["study"]
                        if (r["num_heads"], r["seed"]) == (row["num_heads"], row["seed"]))
        n = len(seed_row["loss_curve"])
        assert torch.allclose(torch.tensor(row["loss_curve"][:n]), torch.tensor(seed_row["loss_curve"]),
                              rtol=2e-2, atol=1e-4), (row["num_heads"], row["seed"])
    if RECORD.exists():
        old = {(r["num_heads"], r["seed"]): r["steps_to_0.01"] for r in json.loads(RECORD.read_text())}
        for row in rows:
            before = old.get((row["num_heads"], row["seed"]))
            if before is not None and row["steps_to_0.01"] is not None:
                assert abs(row["steps_to_0.01"] - before) <= 30, (row["num_heads"], row["seed"])
    RECORD.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
