"""Notebook 06's lessons: the memory projected once, the dates alignment measure and the small
Transformer encoder-decoder."""

from __future__ import annotations

import json

import pytest
import torch

import attn_helpers as ah
from attn_helpers.lessons import cross_attention, tasks


def test_memory_projected_once_masks_padding_and_refuses_grouped_heads():
    torch.manual_seed(3)
    cross = ah.MultiHeadAttention(16, 4, kdim=12, vdim=12)
    y, memory = torch.randn(2, 6, 16), torch.randn(2, 5, 12)
    real = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    with torch.no_grad():
        masked, _ = cross_attention.cross_attention_memory_once(cross, y, memory, real)
        unmasked, _ = cross_attention.cross_attention_memory_once(cross, y, memory)
    assert not torch.allclose(unmasked[1], masked[1], atol=1e-3)   # the padding mask is applied
    with pytest.raises(TypeError, match="num_kv_heads"):
        cross_attention.cross_attention_memory_once(
            ah.MultiHeadAttention(16, 4, num_kv_heads=2), y, y)


def test_date_field_hits_on_synthetic_weights():
    pairs = [tasks.example("dates", i) for i in range(3)]
    batch = tasks.collate("dates", pairs)
    weights = torch.zeros(3, 10, batch.src.shape[1])
    for i, (words, _) in enumerate(pairs):
        fields = tasks.date_fields(words)
        for t, want in enumerate(tasks.ISO_STEP_FIELDS):     # peak on the first word of the field
            weights[i, t, fields.index(want) if want != "-" else 0] = 1.0
    hits = cross_attention.date_field_hits(weights, batch)
    digits = [t for t, f in enumerate(tasks.ISO_STEP_FIELDS) if f != "-"]
    assert hits[:, digits].all() and not hits[:, [4, 7]].any()
    weights[0, 0] = weights[0, 5]                             # the first year digit reads the month
    assert not cross_attention.date_field_hits(weights, batch)[0, 0]
    with pytest.raises(ValueError, match="10 output steps"):
        cross_attention.date_field_hits(weights[:, :9], batch)
    with pytest.raises(ValueError, match="weights must have shape"):
        cross_attention.date_field_hits(weights[:2], batch)


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


def _failing(claims: dict) -> list[str]:
    return [statement for statement, holds in claims.items() if not holds]


def test_transformer_claims_hold_on_the_record_and_fail_when_one_is_made_false():
    tables = json.loads(cross_attention.TRANSFORMER_RECORD.read_text())["tables"]
    assert _failing(cross_attention.transformer_claims(tables)) == []
    tables["1"]["Transformer head 0"]["digit steps on their field"] = 0.5    # below 60%
    failing = _failing(cross_attention.transformer_claims(tables))
    assert len(failing) == 1 and failing[0].startswith("yet every head still reads")
