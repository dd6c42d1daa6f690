"""Notebook 06's lessons: the alignment readings, the small Transformer encoder-decoder (and the
widget's reader for it), the claims on the studies' records."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

from attn_helpers.lessons import cross_attention, rnn_bottleneck, tasks
from attn_helpers.widgets.cross_attention import alignment_widget


def test_alignment_readings_count_the_strongest_words_field():
    pairs = [tasks.example("dates", i) for i in range(3)]
    batch = tasks.collate("dates", pairs)
    weights = torch.zeros(3, 10, batch.src.shape[1])
    for i, (words, _) in enumerate(pairs):
        fields = tasks.date_fields(words)
        for t, want in enumerate(tasks.ISO_STEP_FIELDS):     # peak on the first word of the field
            weights[i, t, fields.index(want) if want != "-" else 0] = 1.0
    weights[0, 0] = weights[0, 5]                             # the first year digit reads the month
    readings = cross_attention.alignment_readings(batch.tgt_out[:, :10], weights, batch)
    assert readings["field counts"][0] == {"year": 2, "month": 1, "day": 0}
    assert readings["token accuracy"] == 1 and readings["mean entropy"][0] == 0
    assert cross_attention.table_row(readings)["digit steps on their field"] == 23 / 24
    with pytest.raises(ValueError, match="weights must have shape"):
        cross_attention.alignment_readings(batch.tgt_out[:, :9], weights[:, :9], batch)


def test_transformer_shapes_padding_and_greedy_decoding():
    torch.manual_seed(0)
    model = cross_attention.TransformerSeq2Seq().eval()                # untrained
    batch = tasks.make_batch("dates", 3, torch.Generator().manual_seed(0))
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (3, batch.tgt_in.shape[1], len(tasks.DATES.tgt_vocab))
    assert weights.shape == (3, 2, batch.tgt_in.shape[1], batch.src.shape[1])
    real = torch.arange(batch.src.shape[1])[None, :] < batch.src_lengths[:, None]
    assert torch.all(weights.masked_select(~real[:, None, None, :]) == 0)   # pads never read
    tokens, step_weights = model.greedy_decode(batch.src, batch.src_lengths, 10)
    assert tokens.shape == (3, 10) and step_weights.shape == (3, 2, 10, batch.src.shape[1])
    fed = torch.cat([torch.full((3, 1), tasks.SOS), tokens[:, :-1]], dim=1)
    with torch.no_grad():
        forced, _ = model(batch.src, batch.src_lengths, fed)
    assert torch.equal(forced.argmax(-1), tokens)       # causal: each step as if decoded alone
    w = alignment_widget(rnn_bottleneck.load_pretrained("seq2seq_dates_general"), "dates", examples=2,
                         transformer=model)
    w.set(index=1, step=3, reader="Transformer head 1")
    one = tasks.collate("dates", [tasks.example("dates", 1)])
    assert torch.equal(w.frame.weights, model.greedy_decode(one.src, one.src_lengths, 10)[1][0, 1])
    assert w.error is None and w.frame.caption[0].startswith("Transformer head 1: ")


def _failing(claims: dict) -> list[str]:
    return [statement for statement, holds in claims.items() if not holds]


def test_recorded_claims_hold_and_fail_when_one_is_made_false():
    tables = json.loads(cross_attention.TRANSFORMER_RECORD.read_text())["tables"]
    seeds = json.loads(cross_attention.GRU_SEEDS_RECORD.read_text())["seeds"]
    assert _failing(cross_attention.gru_seed_claims(seeds)) == []
    seeds["2"]["reversal"]["mean entropy"]["24"] = 1.7                   # above 1.6 nats
    failing = _failing(cross_attention.gru_seed_claims(seeds))
    assert len(failing) == 1 and "mean entropy" in failing[0]
    study = runpy.run_path(str(Path(__file__).parents[2] / "studies/cross_attention_transformer.py"))
    assert [c for c, holds in study["CLAIMS"].items() if not holds(tables)] == []
    tables["1"]["Transformer head 0"]["digit steps on their field"] = 0.5    # below 60%
    failing = [c for c, holds in study["CLAIMS"].items() if not holds(tables)]
    assert len(failing) == 1 and failing[0].startswith("every seed, every head alone")

