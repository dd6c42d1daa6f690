"""How readable a small Transformer's cross-attention is on the dates task, against the GRU's.

Trains `cross_attention.TransformerSeq2Seq` (one encoder layer, one pre-norm decoder layer with
2-head cross-attention, d = 32, learned positions) on random dates for 300 steps, on seeds 0, 1
and 2 (Adam, lr 5e-3, batches of 64, one thread). For each seed it records `alignment_table`
against the shipped GRU dates model (`seq2seq_dates_general`): token accuracy, the share of digit
steps whose strongest input word is in the right field, and the digit steps' mean entropy, per
head and for the heads' average, on the 300 test dates. Asserts `transformer_claims`
(notebook 06 asserts the same statements on the record), and that the fresh numbers agree with the
shipped record's within tolerances that hold across CPUs. Saves seed 0's weights, whose
cross-attention notebook 06 draws (`cross_attention.load_transformer`).
Re-run: python3 course.py studies cross_attention_transformer      (about 1 minute on 2 cores)
"""
import json

import torch
import torch.nn.functional as F

from attn_helpers.lessons import cross_attention, rnn_bottleneck, tasks
from attn_helpers.training import save_checkpoint, train

RECORDS = ["attn_helpers/data/cross_attention_transformer.json",
           "attn_helpers/checkpoints/transformer_dates_seed0.pt"]
STEPS = 300
SEEDS = (0, 1, 2)


def train_transformer_dates(seed, steps=STEPS):
    """`TransformerSeq2Seq` trained on random dates: batches of 64, Adam, lr 5e-3, one thread."""
    torch.manual_seed(seed)
    model = cross_attention.TransformerSeq2Seq()

    def loss_fn(model, src, src_lengths, tgt_in, tgt_out):
        logits, _ = model(src, src_lengths, tgt_in)
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=tasks.PAD)

    def batches(step, generator):
        b = tasks.make_batch(tasks.DATES, 64, generator)
        return b.src, b.src_lengths, b.tgt_in, b.tgt_out

    train(model, batches, loss_fn, steps=steps, lr=5e-3, seed=seed, progress=False,
          single_threaded=True)
    return model


def alignment_table(gru, transformer):
    """On the 300 test dates: token accuracy, the share of digit steps whose strongest input word
    is in the right field, and the digit steps' mean entropy, for the GRU model and for every
    head of the Transformer's cross-attention (and their mean weights)."""
    test = tasks.eval_batches("dates", 300)[None]
    def row(tokens, weights):
        return cross_attention.table_row(cross_attention.alignment_readings(tokens, weights, test))

    table = {"GRU (1 head)": row(*rnn_bottleneck.predict(gru, test))}
    tokens, weights = transformer.greedy_decode(test.src, test.src_lengths, 10)
    for head in range(weights.shape[1]):
        table[f"Transformer head {head}"] = row(tokens, weights[:, head])
    table["Transformer, heads averaged"] = row(tokens, weights.mean(1))
    return table


def main():
    gru = rnn_bottleneck.load_pretrained("seq2seq_dates_general")
    tables, models = {}, {}
    for seed in SEEDS:
        model = models[seed] = train_transformer_dates(seed=seed, steps=STEPS)
        table = alignment_table(gru, model)
        tables[str(seed)] = {name: {k: round(v, 4) for k, v in row.items()}
                             for name, row in table.items()}
        print(f"seed {seed}:", json.dumps(tables[str(seed)]))

    claims = cross_attention.transformer_claims(tables)
    failed = [claim for claim, holds in claims.items() if not holds]
    assert not failed, failed

    if cross_attention.TRANSFORMER_RECORD.exists():
        shipped = json.loads(cross_attention.TRANSFORMER_RECORD.read_text())["tables"]
        assert shipped.keys() == tables.keys()
        for seed, table in tables.items():      # 300 dates x 8 digit steps: a share moves little
            for name, row in table.items():
                for key, value in row.items():
                    assert abs(value - shipped[seed][name][key]) <= 0.05, (seed, name, key, value)

    record = {"steps": STEPS, "tables": tables}
    cross_attention.TRANSFORMER_RECORD.write_text(json.dumps(record, indent=1) + "\n")
    save_checkpoint(models[0], cross_attention.TRANSFORMER_CHECKPOINT, {"seed": 0, "steps": STEPS})


if __name__ == "__main__":
    main()
