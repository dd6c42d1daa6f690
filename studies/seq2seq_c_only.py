"""Notebook 01's c-only control: a wider context vector c, with the decoder kept as narrow as before.

The "wide" control of `studies/seq2seq_wide_context.py` (d_enc = 128) widens c from 64 to 256
numbers, but its decoder state (d_dec = 2 d_enc = 256) widens with it. This study widens only c:
the no-attention model with d_enc = 128 (c has 256 numbers) whose bridge (256 -> 64), decoder GRU
(d_emb -> 64), combine (64 + 256 -> 64) and readout (64 -> V) are the narrow model's widths.
It is trained with rnn_bottleneck.train_seq2seq itself (reversal of 4 to 24 digits, 1,000 steps at
lr 3e-3, then 400 at 1e-3, batches of 64, one thread), on seeds 0, 1 and 2, one after the other.
Records each seed's greedy token accuracy on the fixed test sets (100 sequences of every length
4..24, scored as in seq2seq_wide_context), its size, its final loss and its mean training loss over
each 100 steps in attn_helpers/data/seq2seq_c_only.json.
Asserts only that the models have the intended widths and that a re-run agrees with the shipped
record within tolerances that hold across CPUs. Notebook 01 (section 4) asserts its claims on the
record, next to the narrow, wide and attention models, in view.
Re-run: python3 course.py studies seq2seq_c_only      (843 s on 2 cores shared with other jobs)
"""
import json
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch
from torch import nn

from attn_helpers.lessons import rnn_bottleneck, tasks

RECORDS = ["attn_helpers/data/seq2seq_c_only.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]
SEEDS, D_ENC, D_DEC = (0, 1, 2), 128, 64    # c has 2 d_enc = 256 numbers; the narrow d_dec is 64


class COnly(rnn_bottleneck.Seq2Seq):
    """No attention; c has 2 d_enc numbers, the decoder state d_dec (not 2 d_enc)."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, d_emb: int, d_enc: int,
                 d_dec: int):
        super().__init__(src_vocab_size, tgt_vocab_size, attention="none", d_emb=d_emb, d_enc=d_enc)
        self.d_dec = d_dec                                          # rebuilt at the decoder's width:
        self.bridge = nn.Linear(2 * d_enc, d_dec)                   # s_0 = tanh(c W_b)
        self.decoder = nn.GRU(d_emb, d_dec, batch_first=True)
        self.combine = nn.Linear(d_dec + 2 * d_enc, d_dec)          # tanh([s_t; c] W_c)
        self.out = nn.Linear(d_dec, tgt_vocab_size)                 # W_y


def build_c_only(config: rnn_bottleneck.TrainConfig) -> COnly:
    """Like rnn_bottleneck.build_model: seeded with config.seed, then built."""
    task = tasks.get_task(config.task)
    torch.manual_seed(config.seed)
    return COnly(len(task.src_vocab), len(task.tgt_vocab), d_emb=config.d_emb, d_enc=config.d_enc,
                 d_dec=D_DEC)


def score(model) -> dict:                   # as seq2seq_wide_context.score, plus the decoder width
    accuracy = rnn_bottleneck.accuracy_by_length(model, tasks.eval_batches("reversal", 100))
    return {"accuracy": {str(n): round(a, 4) for n, a in accuracy.items()},
            "parameters": sum(p.numel() for p in model.parameters()),
            "context": 2 * model.encoder.hidden_size, "decoder": model.decoder.hidden_size}


def run(seed: int, steps: int | None = None) -> dict:
    config = replace(rnn_bottleneck.CONFIGS["seq2seq_reversal_none"], d_enc=D_ENC, seed=seed)
    if steps is not None:                   # a short run, to time the study
        config = replace(config, steps=steps, finetune_steps=0)
    # train_seq2seq builds its model with rnn_bottleneck.build_model: swap in ours, so that the
    # training recipe is train_seq2seq's own code, unchanged.
    with mock.patch.object(rnn_bottleneck, "build_model", build_c_only):
        model, result = rnn_bottleneck.train_seq2seq(config, progress=False)
    assert isinstance(model, COnly) and (model.d_dec, model.encoder.hidden_size) == (D_DEC, D_ENC)
    curve = [sum(result.losses[i:i + 100]) / len(result.losses[i:i + 100])
             for i in range(0, len(result.losses), 100)]
    return {**score(model), "final_loss": round(result.final_loss, 4),
            "loss_per_100_steps": [round(loss, 4) for loss in curve]}


def main():
    record = {}
    for seed in SEEDS:
        began = time.monotonic()
        record[str(seed)] = run(seed)
        print("c-only seed", seed, f"{time.monotonic() - began:.0f} s", json.dumps(record[str(seed)]),
              flush=True)

    if RECORD.exists():         # 100 sources a length: an accuracy moves little across CPUs
        stored = json.loads(RECORD.read_text())
        for seed, row in stored.items():
            for n, accuracy in row["accuracy"].items():
                fresh = record[seed]["accuracy"][n]
                assert abs(fresh - accuracy) <= 0.05, (seed, n, fresh, accuracy)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
