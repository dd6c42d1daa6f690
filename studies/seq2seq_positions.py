"""Notebook 01's section 4 on three seeds: which output positions fail without attention.

Trains notebook 01's no-attention GRU encoder-decoder (a context vector of 64 numbers) on seeds 1
and 2 with the recipe of its checkpoint (reversal of 4 to 24 digits, 1,000 steps at lr 3e-3, then
400 at 1e-3, batches of 64, one thread; the same runs as `studies/seq2seq_wide_context.py`). Seed 0
and the parameter control are the shipped checkpoints of `studies/seq2seq_checkpoints.py`. On the
100 fixed test sequences of 24 digits, records `rnn_bottleneck_positions.by_position` for each:
token accuracy by output position (greedy and teacher-forced), the share of `</s>`, and which
targets the wrong outputs are, in attn_helpers/data/seq2seq_positions.json. Asserts
`rnn_bottleneck_positions.claims` (notebook 01 asserts the same function on the record), and that
the fresh numbers agree with the shipped record's within tolerances that hold across CPUs.
Re-run: python3 course.py studies seq2seq_positions      (about 3 minutes on one idle core)
"""
import json
from dataclasses import replace

import torch

from attn_helpers.lessons import rnn_bottleneck, rnn_bottleneck_positions, tasks

RECORDS = ["attn_helpers/data/seq2seq_positions.json"]
SEEDS = (1, 2)                                  # seed 0: the shipped checkpoint


def main():
    torch.set_num_threads(1)
    test = tasks.eval_batches("reversal", 100)[24]
    models = {("narrow", "0"): rnn_bottleneck.load_pretrained("seq2seq_reversal_none"),
              ("control", "0"): rnn_bottleneck.load_pretrained("seq2seq_reversal_none_wide")}
    for seed in SEEDS:
        config = replace(rnn_bottleneck.CONFIGS["seq2seq_reversal_none"], seed=seed)
        models["narrow", str(seed)] = rnn_bottleneck.train_seq2seq(config, progress=False)[0]
    record = {"narrow": {}, "control": {}}
    for (kind, seed), model in models.items():
        record[kind][seed] = rnn_bottleneck_positions.by_position(model, test)
        print(kind, "seed", seed, json.dumps(record[kind][seed]), flush=True)

    claims = rnn_bottleneck_positions.claims(record)
    failed = [claim for claim, holds in claims.items() if not holds]
    assert not failed, failed

    path = rnn_bottleneck_positions.RECORD
    if path.exists():           # 100 sources: a share over 3 or 8 positions moves little across CPUs
        stored = json.loads(path.read_text())
        for kind, seeds in stored.items():
            for seed, row in seeds.items():
                for key in ("greedy", "forced"):
                    for part in (slice(0, 3), slice(-8, None)):
                        fresh, old = record[kind][seed][key][part], row[key][part]
                        assert abs(sum(fresh) - sum(old)) / len(old) <= 0.05, (kind, seed, key, part)
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
