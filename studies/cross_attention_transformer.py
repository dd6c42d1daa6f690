"""How readable a small Transformer's cross-attention is on the dates task, against the GRU's.

Trains `cross_attention.TransformerSeq2Seq` (one encoder layer, one pre-norm decoder layer with
2-head cross-attention, d = 32, learned positions) on random dates for 300 steps, on seeds 0, 1
and 2 (Adam, lr 5e-3, batches of 64, one thread). For each seed it records `alignment_table`
against the shipped GRU dates model (`seq2seq_dates_general`): token accuracy, the share of digit
steps whose strongest input word is in the right field, and the digit steps' mean entropy, per
head and for the heads' average, on the 300 test dates. Asserts `cross_attention.transformer_claims`
(notebook 06 asserts the same function on the record), and that the fresh numbers agree with the
shipped record's within tolerances that hold across CPUs. Saves seed 0's weights, whose
cross-attention notebook 06 draws (`cross_attention.load_transformer`).
Re-run: python3 course.py studies cross_attention_transformer      (about 1 minute on 2 cores)
"""
import json

from attn_helpers.lessons import cross_attention, rnn_bottleneck
from attn_helpers.training import save_checkpoint

RECORDS = ["attn_helpers/data/cross_attention_transformer.json",
           "attn_helpers/checkpoints/transformer_dates_seed0.pt"]
STEPS = 300


def main():
    gru = rnn_bottleneck.load_pretrained("seq2seq_dates_general")
    tables, models = {}, {}
    for seed in cross_attention.TRANSFORMER_SEEDS:
        model = models[seed] = cross_attention.train_transformer_dates(seed=seed, steps=STEPS)
        table = cross_attention.alignment_table(gru, model)
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
