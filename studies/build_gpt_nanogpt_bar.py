"""nanoGPT's README CPU settings, trained on notebook 10's GPT: the bar its recipe is set beside.

Trains this course's GPT with nanoGPT's CPU settings (``build_gpt.NANOGPT`` on ``GPTConfig()``:
4 layers, 4 heads, 128 dimensions, feed-forward 4d, context 64; 2,000 AdamW steps of 12 chunks,
peak rate 1e-3, warmup 100, cosine to 1e-4, betas (0.9, 0.99), clipping at 1) through
``build_gpt.train``, for seeds 0 and 1, and records each seed's loss on the whole held-out text.
Asserts notebook 10's claims (``build_gpt.recipe_claims``, against the shipped final-recipe
seeds) and that each seed lands within 0.03 nats of its shipped loss.
Re-run: python3 course.py studies build_gpt_nanogpt_bar      (about 12 minutes on 2 cores)
"""
import dataclasses
import datetime
import json

from attn_helpers.lessons import build_gpt as bg

RECORDS = ["attn_helpers/data/build_gpt_nanogpt_bar.json"]
SEEDS = [0, 1]


def main():
    corpus = bg.load_corpus()
    models = [bg.build_and_train(bg.NANOGPT, seed=seed)[0] for seed in SEEDS]
    nats = [round(bg.estimate_loss(m, corpus.val, m.cfg.context, windows=None), 4)
            for m in models]
    recipe = dataclasses.asdict(bg.NANOGPT)
    fresh = {"what": "held-out loss (nats per character, last 10% of pydoc_data.topics) of "
                     "nanoGPT's README CPU recipe, build_and_train(NANOGPT, seed=s)",
             "seeds": SEEDS, "nats": nats,
             "recipe": {k: list(recipe[k]) if k == "betas" else recipe[k]
                        for k in ("steps", "batch", "lr", "warmup", "min_lr", "betas")},
             "config": {k: getattr(bg.GPTConfig(0), k)
                        for k in ("context", "d_model", "num_heads", "num_layers", "d_ff")},
             "recorded": f"2-core x86 CPU, {datetime.date.today()}"}
    print("held-out nats per seed:", nats)

    claims = bg.recipe_claims(bg.load_record("build_gpt_final_seeds"),
                              fresh | {"mean": sum(nats) / len(nats)})
    assert all(claims.values()), claims
    shipped = bg.load_record("build_gpt_nanogpt_bar")
    for new, old in zip(nats, shipped["nats"], strict=True):
        assert abs(new - old) <= 0.03, (nats, shipped["nats"])
    with open(RECORDS[0], "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in fresh.items())
                + "\n}\n")                          # one line per key, as shipped


if __name__ == "__main__":
    main()
