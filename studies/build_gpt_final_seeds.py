"""Notebook 10's final recipe over seeds: the held-out loss of ``build_and_train(FINAL, seed=s)``.

Trains the notebook's GPT (4 layers, 4 heads, 128 dimensions, feed-forward 256, context 64) with
the final recipe (``build_gpt.FINAL``: AdamW, a linear warm-up then a cosine, gradient clipping)
through ``build_gpt.train``, the reference solution of the notebook's training loop, for seeds 0,
1, 2. Records each seed's curve (training and held-out estimates every ``eval_every`` steps), its
loss on the whole held-out text and the loop's wall time (one thread), and seed 0's weights in
float16 (the model the notebook generates with and whose heads it reads). Asserts notebook 10's
claims (``build_gpt.recipe_claims``, against the shipped nanoGPT record) and, when the shipped
record has the same recipe, that each seed lands within 0.03 nats of its shipped loss.
Re-run: python3 course.py studies build_gpt_final_seeds
(three seeds, one thread each: about 10 minutes on an idle 2-core machine; the shipped record
took 786, 371 and 607 s beside other jobs, 29 minutes)
"""
import dataclasses
import datetime
import json

import torch

from attn_helpers.lessons import build_gpt as bg

RECORDS = ["attn_helpers/data/build_gpt_final_seeds.json",
           "attn_helpers/checkpoints/build_gpt_final.pt"]
SEEDS = [0, 1, 2]


def main():
    corpus = bg.load_corpus()
    runs = [bg.build_and_train(bg.FINAL, seed=seed) for seed in SEEDS]
    nats = [round(bg.estimate_loss(m, corpus.val, m.cfg.context, windows=None), 4)
            for m, _, _ in runs]
    recipe = dataclasses.asdict(bg.FINAL)
    fresh = {"what": "held-out loss (nats per character, last 10% of pydoc_data.topics) of "
                     "notebook 10's final recipe, build_and_train(FINAL, seed=s)",
             "seeds": SEEDS, "nats": nats,
             "recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.items()},
             "size": dict(bg.FINAL_SIZE),
             "curves": [[[s, round(t, 4), round(v, 4)] for s, t, v in c] for _, c, _ in runs],
             "wall_seconds": [round(s, 1) for _, _, s in runs],
             "recorded": f"2-core x86 CPU, {datetime.date.today()}, one thread"}
    print("held-out nats per seed:", nats, "seconds:", fresh["wall_seconds"])

    claims = bg.recipe_claims(fresh | {"mean": sum(nats) / len(SEEDS)},
                              bg.load_record("build_gpt_nanogpt_bar"))
    assert all(claims.values()), claims
    shipped = bg.load_record("build_gpt_final_seeds")
    if shipped["recipe"] == fresh["recipe"] and shipped["size"] == fresh["size"]:
        for new, old in zip(nats, shipped["nats"], strict=True):
            assert abs(new - old) <= 0.03, (nats, shipped["nats"])
    with open(RECORDS[0], "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in fresh.items())
                + "\n}\n")                          # one line per key, as shipped
    torch.save({k: v.half() for k, v in runs[0][0].state_dict().items()}, RECORDS[1])


if __name__ == "__main__":
    main()
