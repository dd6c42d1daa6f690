"""Notebook 01's wide-context control: is the no-attention model limited by its context's size?

Trains notebook 01's no-attention GRU encoder-decoder with the recipe of its checkpoint
`seq2seq_reversal_none` (reversal of 4 to 24 digits, 1,000 steps at lr 3e-3, then 400 at 1e-3,
batches of 64, one thread), but with d_enc = 128 instead of 32: a context vector of 256 numbers
instead of 64 (the decoder state widens with it), on seeds 0, 1 and 2. Only the width differs.
Records each model's greedy token accuracy on the fixed test sets (100 sequences of every length
4..24), its final loss and its size in attn_helpers/data/seq2seq_wide_context.json, with the
shipped 64-number models, without and with attention (seed 0), scored the same way. The seeds
train in parallel processes. Asserts `rnn_bottleneck_wide.claims` (notebook 01 asserts the same
function on the record), and that the fresh numbers agree with the shipped record's within
tolerances that hold across CPUs.
Re-run: python3 course.py studies seq2seq_wide_context      (about 6 minutes on 2 idle cores)
"""
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from attn_helpers.lessons import rnn_bottleneck, rnn_bottleneck_wide, tasks

RECORDS = ["attn_helpers/data/seq2seq_wide_context.json"]
WIDE, SEEDS = 128, (0, 1, 2)                # d_enc: the context vector has 2 d_enc numbers


def score(model) -> dict:
    accuracy = rnn_bottleneck.accuracy_by_length(model, tasks.eval_batches("reversal", 100))
    return {"accuracy": {str(n): round(a, 4) for n, a in accuracy.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
            "context": 2 * model.encoder.hidden_size}


def run(d_enc: int, seed: int) -> dict:
    config = replace(rnn_bottleneck.CONFIGS["seq2seq_reversal_none"], d_enc=d_enc, seed=seed)
    model, result = rnn_bottleneck.train_seq2seq(config, progress=False)
    return {**score(model), "final_loss": round(result.final_loss, 4)}


def main():
    spawn = multiprocessing.get_context("spawn")                            # a fresh torch each
    with ProcessPoolExecutor(len(SEEDS), mp_context=spawn) as pool:         # one thread each
        runs = pool.map(run, [WIDE] * len(SEEDS), SEEDS)
        record = {kind: {"0": score(rnn_bottleneck.load_pretrained(name))}  # d_enc = 32, seed 0
                  for kind, name in (("narrow", "seq2seq_reversal_none"),
                                     ("attention", "seq2seq_reversal_additive"))}
        record["wide"] = {str(seed): row for seed, row in zip(SEEDS, runs, strict=True)}
    for seed, row in record["wide"].items():
        print("wide, seed", seed, json.dumps(row), flush=True)

    claims = rnn_bottleneck_wide.claims(record)
    failed = [claim for claim, holds in claims.items() if not holds]
    assert not failed, failed

    path = rnn_bottleneck_wide.RECORD
    if path.exists():           # 100 sources a length: an accuracy moves little across CPUs
        stored = json.loads(path.read_text())
        for kind, seeds in stored.items():
            for seed, row in seeds.items():
                fresh = record[kind][seed]["accuracy"]
                for n, accuracy in row["accuracy"].items():
                    assert abs(fresh[n] - accuracy) <= 0.05, (kind, seed, n, fresh[n], accuracy)
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
