"""Notebook 10's final recipe over seeds: the held-out loss of ``build_and_train(FINAL, seed=s)``.

Trains the notebook's GPT (4 layers, 4 heads, 128 dimensions, feed-forward 256, context 64) with
the final recipe (``build_gpt.FINAL``: 550 steps of 16 chunks, Muon for the blocks' matrices,
AdamW for the rest) for seeds 0, 1, 2 and records each seed's loss on the whole held-out text.
Asserts notebook 10's claims on them against the shipped nanoGPT record
(``build_gpt.recipe_claims``) and that each seed lands within 0.03 nats of its shipped loss.
Re-run: python3 course.py studies build_gpt_final_seeds      (about 5 minutes on 2 cores)
"""
import dataclasses
import datetime
import json

from attn_helpers.lessons import build_gpt as bg

RECORDS = ["attn_helpers/data/build_gpt_final_seeds.json"]
SEEDS = [0, 1, 2]


def main():
    logs = [bg.build_and_train(bg.FINAL, seed=seed)[1] for seed in SEEDS]
    fresh = {"what": "held-out loss (nats per character, last 10% of pydoc_data.topics) of "
                     "notebook 10's final recipe, build_and_train(FINAL, seed=s)",
             "seeds": SEEDS, "nats": [round(log.final, 4) for log in logs],
             "recipe": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in dataclasses.asdict(bg.FINAL).items()},
             "size": dict(bg.FINAL_SIZE),
             "cpu_seconds": [round(log.cpu_seconds, 1) for log in logs],
             "recorded": f"2-core x86 CPU, {datetime.date.today()}"}
    print("held-out nats per seed:", fresh["nats"])

    claims = bg.recipe_claims(fresh | {"mean": sum(fresh["nats"]) / len(SEEDS)},
                              bg.load_record("build_gpt_nanogpt_bar"))
    assert all(claims.values()), claims
    shipped = bg.load_record("build_gpt_final_seeds")
    for new, old in zip(fresh["nats"], shipped["nats"], strict=True):
        assert abs(new - old) <= 0.03, (fresh["nats"], shipped["nats"])
    with open(RECORDS[0], "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in fresh.items())
                + "\n}\n")                          # one line per key, as shipped


if __name__ == "__main__":
    main()
