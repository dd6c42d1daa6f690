"""Notebook 01's path-versus-selection control: attention whose weights are fixed at 1/n.

The attention model gives every output step a one-step path to every encoder state h_j. This
control keeps that path and takes away the selection: c_t = mean_j h_j over the n real source
states, the same for every output step t (weights 1/n, no scorer). Everything else is the
no-attention model's (c of 64 numbers, the readout tanh([s_t; c_t] W_c) W_y): it has exactly the
no-attention model's parameters. It is trained with rnn_bottleneck.train_seq2seq itself (reversal of
4 to 24 digits, 1,000 steps at lr 3e-3, then 400 at 1e-3, batches of 64, one thread each), on
seeds 0, 1 and 2 in three parallel processes.
Records, for each seed, in attn_helpers/data/seq2seq_uniform_control.json: its greedy token
accuracy on the fixed test sets (100 sequences of every length 4..24, as seq2seq_wide_context scores
them), its size, its final loss and its mean training loss over each 100 steps; and, under "check",
the c_t that UniformAttention.attend gives on one small fixed batch (notebook 01 repeats the
definition and asserts it gives the same).
Claims (asserted here, and in notebook 01 on the record): at 24 digits each uniform seed trails
every attention seed of seq2seq_wide_context's record by >= 0.4, and is at most 0.1 above the best
no-attention seed. A re-run must agree with the shipped record within 0.05.
Re-run: python3 course.py studies seq2seq_uniform_control      (1,566 s on 2 shared cores)
"""
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch

from attn_helpers.lessons import rnn_bottleneck, rnn_bottleneck_wide, tasks
from attn_helpers.masks import padding_mask

RECORDS = ["attn_helpers/data/seq2seq_uniform_control.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]
SEEDS = (0, 1, 2)


class UniformAttention(rnn_bottleneck.Seq2Seq):
    """The no-attention model whose readout gets c_t = mean_j h_j (weights 1/n) instead of c."""

    def attend(self, s, H, c, src_mask):
        a = src_mask[:, None, :].float().expand(-1, s.shape[1], -1)    # (b, n_t, n): 1 at real j
        a = a / a.sum(-1, keepdim=True)                                # a_tj = 1/n
        return a @ H, a                                                # c_t = mean_j h_j


def build_uniform(config: rnn_bottleneck.TrainConfig) -> UniformAttention:
    """Like rnn_bottleneck.build_model: seeded with config.seed, then built."""
    task = tasks.get_task(config.task)
    torch.manual_seed(config.seed)
    return UniformAttention(len(task.src_vocab), len(task.tgt_vocab), attention="none",
                            d_emb=config.d_emb, d_enc=config.d_enc)


def check_batch() -> list:
    """c_t of UniformAttention.attend on a fixed batch: H (2, 4, 3) from seed 0, lengths 4 and 2."""
    H = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    c_t, _ = UniformAttention.attend(None, torch.zeros(2, 1, 6), H, None, padding_mask([4, 2], 4))
    return [[round(x, 4) for x in row] for row in c_t[:, 0].tolist()]


def run(seed: int) -> dict:
    torch.set_num_threads(1)
    config = replace(rnn_bottleneck.CONFIGS["seq2seq_reversal_none"], seed=seed)
    began = time.monotonic()
    # train_seq2seq builds its model with rnn_bottleneck.build_model: swap in ours, so that the
    # training recipe is train_seq2seq's own code, unchanged.
    with mock.patch.object(rnn_bottleneck, "build_model", build_uniform):
        model, result = rnn_bottleneck.train_seq2seq(config, progress=False)
    assert isinstance(model, UniformAttention)
    accuracy = rnn_bottleneck.accuracy_by_length(model, tasks.eval_batches("reversal", 100))
    curve = [sum(result.losses[i:i + 100]) / len(result.losses[i:i + 100])
             for i in range(0, len(result.losses), 100)]
    print("uniform control, seed", seed, f"{time.monotonic() - began:.0f} s", flush=True)
    return {"accuracy": {str(n): round(a, 4) for n, a in accuracy.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
            "context": 2 * model.encoder.hidden_size, "final_loss": round(result.final_loss, 4),
            "loss_per_100_steps": [round(loss, 4) for loss in curve]}


def claims(record: dict, wide_record: dict) -> dict:
    seeds = {s: row for s, row in record.items() if s != "check"}
    attention, narrow = wide_record["attention"].values(), wide_record["narrow"].values()
    best_narrow = max(row["accuracy"]["24"] for row in narrow)
    return {
        "uniform weights, seeds 0, 1, 2: at 24 digits each trails every attention seed by >= 0.4":
            all(a["accuracy"]["24"] - row["accuracy"]["24"] >= 0.4
                for row in seeds.values() for a in attention),
        "uniform weights, seeds 0, 1, 2: at 24 digits none is > 0.1 above the best no-attention seed":
            all(row["accuracy"]["24"] <= best_narrow + 0.1 for row in seeds.values()),
    }


def main():
    spawn = multiprocessing.get_context("spawn")                           # a fresh torch each
    with ProcessPoolExecutor(len(SEEDS), mp_context=spawn) as pool:
        runs = list(pool.map(run, SEEDS))
    record = {str(seed): row for seed, row in zip(SEEDS, runs, strict=True)}
    for seed, row in record.items():
        print("uniform control, seed", seed, json.dumps(row), flush=True)
    record["check"] = check_batch()

    failed = [c for c, holds in claims(record, rnn_bottleneck_wide.load_record()).items() if not holds]
    assert not failed, failed
    if RECORD.exists():         # 100 sources a length: an accuracy moves little across CPUs
        for seed, row in json.loads(RECORD.read_text()).items():
            if seed != "check":
                for n, accuracy in row["accuracy"].items():
                    assert abs(record[seed]["accuracy"][n] - accuracy) <= 0.05, (seed, n, accuracy)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
