"""Notebook 01's parameter control on three seeds: no attention, made slightly wider (d_enc = 34).

The shipped checkpoint `seq2seq_reversal_none_wide` (seed 0, `studies/seq2seq_checkpoints.py`) is
the no-attention model with d_enc = 34: a context vector of 68 numbers and at least as many
parameters as the attention model. This study trains the same recipe on seeds 1 and 2 with
rnn_bottleneck.train_seq2seq itself (reversal of 4 to 24 digits, 1,000 steps at lr 3e-3, then 400
at 1e-3, batches of 64, one thread each, in two parallel processes), and scores seed 0 from the
checkpoint the same way.
Records, for each seed, in attn_helpers/data/seq2seq_param_control.json: its greedy token accuracy
on the fixed test sets (100 sequences of every length 4..24, as seq2seq_wide_context scores them),
its size, its teacher-forced token accuracy at n = 24, and (seeds 1, 2) its final loss and mean
training loss over each 100 steps.
Claims (asserted here, and in notebook 01 on the record): each of the three seeds has at least as
many parameters as the attention model, and at 24 digits trails every attention seed of
seq2seq_wide_context's record by >= 0.5. A re-run must agree with the shipped record within 0.05.
Re-run: python3 course.py studies seq2seq_param_control      (1,170 s on 2 cores shared with other jobs)
"""
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

from attn_helpers.lessons import rnn_bottleneck, rnn_bottleneck_wide, tasks

RECORDS = ["attn_helpers/data/seq2seq_param_control.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]
NAME, SEEDS = "seq2seq_reversal_none_wide", (1, 2)          # seed 0 is the shipped checkpoint


def score(model) -> dict:        # as seq2seq_wide_context.score, plus teacher-forced at n = 24
    accuracy = rnn_bottleneck.accuracy_by_length(model, tasks.eval_batches("reversal", 100))
    test = tasks.eval_batches("reversal", 100)[24]
    with torch.no_grad():
        logits, _ = model(test.src, test.src_lengths, test.tgt_in)          # (100, 25, V)
    forced = (logits.argmax(-1) == test.tgt_out)[:, :24].float().mean().item()
    return {"accuracy": {str(n): round(a, 4) for n, a in accuracy.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
            "context": 2 * model.encoder.hidden_size, "forced_24": round(forced, 4)}


def run(seed: int) -> dict:
    torch.set_num_threads(1)
    model, result = rnn_bottleneck.train_seq2seq(replace(rnn_bottleneck.CONFIGS[NAME], seed=seed),
                                                 progress=False)
    curve = [sum(result.losses[i:i + 100]) / len(result.losses[i:i + 100])
             for i in range(0, len(result.losses), 100)]
    return {**score(model), "final_loss": round(result.final_loss, 4),
            "loss_per_100_steps": [round(loss, 4) for loss in curve]}


def claims(record: dict, wide_record: dict) -> dict:
    attention = wide_record["attention"]                                   # seeds 0, 1, 2
    return {
        "parameter control, seeds 0, 1, 2: each has at least as many parameters as attention":
            all(row["parameters"] >= attention["0"]["parameters"] for row in record.values()),
        "parameter control, seeds 0, 1, 2: at 24 digits each trails every attention seed by >= 0.5":
            all(a["accuracy"]["24"] - row["accuracy"]["24"] >= 0.5
                for row in record.values() for a in attention.values()),
    }


def main():
    torch.set_num_threads(1)
    spawn = multiprocessing.get_context("spawn")                           # a fresh torch each
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        runs = pool.map(run, SEEDS)
        record = {"0": score(rnn_bottleneck.load_pretrained(NAME))}
        for seed, row in zip(SEEDS, runs, strict=True):
            record[str(seed)] = row
            print("parameter control, seed", seed, json.dumps(row), flush=True)

    failed = [c for c, holds in claims(record, rnn_bottleneck_wide.load_record()).items() if not holds]
    assert not failed, failed
    if RECORD.exists():         # 100 sources a length: an accuracy moves little across CPUs
        for seed, row in json.loads(RECORD.read_text()).items():
            for n, accuracy in row["accuracy"].items():
                assert abs(record[seed]["accuracy"][n] - accuracy) <= 0.05, (seed, n, accuracy)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
