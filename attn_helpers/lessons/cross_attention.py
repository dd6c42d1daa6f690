"""Notebook 06, cross-attention: the memory projected once per sentence, whether each ISO date
step reads its own field, and a small Transformer encoder-decoder on the dates task (trained by
``studies/cross_attention_transformer.py``; :func:`transformer_claims` holds the thresholds the
study and the notebook assert)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .._checks import require_tensor, shape
from ..attention import scaled_dot_product_attention
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from ..training import load_checkpoint
from ..transformer import DecoderLayer, FeedForward
from .tasks import DATES, ISO_STEP_FIELDS, PAD, SOS, Batch, date_fields

__all__ = ["cross_attention_memory_once", "date_field_hits", "EncoderLayer", "TransformerSeq2Seq",
           "TRANSFORMER_RECORD", "TRANSFORMER_CHECKPOINT", "load_transformer",
           "transformer_claims"]


def cross_attention_memory_once(cross: MultiHeadAttention, y: torch.Tensor,
                                memory: torch.Tensor, memory_padding: torch.Tensor | None = None):
    """``cross(y, memory, memory, memory_padding)`` one step of ``y (b, n, d_model)`` at a time,
    the keys and values of ``memory (b, n_m, kdim)`` projected once. Returns ``(output (b, n,
    d_model), calls)``, ``calls`` how often each memory projection ran (``{"k_proj": 1, ...}``)."""
    if not isinstance(cross, MultiHeadAttention) or cross.num_kv_heads != cross.num_heads:
        raise TypeError("cross must be a MultiHeadAttention with num_kv_heads == num_heads")
    calls = {"k_proj": 0, "v_proj": 0}

    def counter(name):
        def count(*_):
            calls[name] += 1
        return count

    hooks = [getattr(cross, name).register_forward_hook(counter(name)) for name in calls]
    try:
        h = cross.num_heads
        mask = None if memory_padding is None else memory_padding[:, None, None, :]  # (b,1,1,n_m)
        keys = split_heads(cross.k_proj(memory), h)             # (b, h, n_m, d_head): once
        values = split_heads(cross.v_proj(memory), h)           # (b, h, n_m, d_head): once
        steps = []
        for t in range(y.shape[1]):                             # one decoding step at a time
            q_t = split_heads(cross.q_proj(y[:, t : t + 1]), h)   # (b, h, 1, d_head)
            o_t, _ = scaled_dot_product_attention(q_t, keys, values, mask)
            steps.append(cross.out_proj(merge_heads(o_t)))      # (b, 1, d_model)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat(steps, dim=1), calls


def date_field_hits(weights: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(b, 10)`` bool: whether each ISO output step's strongest input word lies in the field it
    copies (:data:`tasks.ISO_STEP_FIELDS`); always False at the two ``-`` steps."""
    _check_weights_for(weights, batch)
    if weights.shape[1] != len(ISO_STEP_FIELDS):
        raise ValueError(f"weights must have {len(ISO_STEP_FIELDS)} output steps (an ISO date), "
                         f"got shape {shape(weights)}")
    hits = torch.zeros(weights.shape[:2], dtype=torch.bool)
    for i in range(len(batch)):
        fields = date_fields(DATES.src_vocab.decode(batch.src[i]))
        strongest = weights[i].argmax(-1).tolist()
        hits[i] = torch.tensor([fields[j] == want
                                for j, want in zip(strongest, ISO_STEP_FIELDS, strict=True)])
    return hits


def _check_weights_for(weights, batch: Batch) -> None:
    require_tensor("weights", weights, floating=True)
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    if weights.dim() != 3 or weights.shape[0] != len(batch) or weights.shape[2] != batch.src.shape[1]:
        raise ValueError(f"weights must have shape (b={len(batch)}, n_t, n_src={batch.src.shape[1]}), "
                         f"got {shape(weights)}")


class EncoderLayer(nn.Module):
    """Pre-norm Transformer encoder layer: ``x + MHA(LN(x))`` with padded keys masked, then
    ``x + FF(LN(x))``. ``forward(x (b, n, d), real (b, n) bool) -> (b, n, d)``."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = FeedForward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, real[:, None, :])[0]    # (b, n, d): pads never read
        return x + self.feed_forward(self.norm2(x))


class TransformerSeq2Seq(nn.Module):
    """One :class:`EncoderLayer` and one pre-norm ``DecoderLayer`` with learned positions, for the
    dates task. ``forward(src, src_lengths, tgt_in) -> (logits (b, n_t, vocab), cross-attention
    weights (b, h, n_t, n_src))``."""

    def __init__(self, d_model: int = 32, num_heads: int = 2, d_ff: int = 64, max_len: int = 16):
        super().__init__()
        self.src_embed = nn.Embedding(len(DATES.src_vocab), d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(len(DATES.tgt_vocab), d_model, padding_idx=PAD)
        self.src_pos, self.tgt_pos = nn.Embedding(max_len, d_model), nn.Embedding(max_len, d_model)
        self.encoder = EncoderLayer(d_model, num_heads, d_ff)
        self.decoder = DecoderLayer(d_model, num_heads, d_ff, norm_first=True)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, len(DATES.tgt_vocab))

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor):
        real = torch.arange(src.shape[1])[None, :] < src_lengths[:, None]         # (b, n_src)
        memory = self.encoder(self.src_embed(src) + self.src_pos.weight[: src.shape[1]], real)
        x = self.tgt_embed(tgt_in) + self.tgt_pos.weight[: tgt_in.shape[1]]        # (b, n_t, d)
        x, weights = self.decoder(x, memory, memory_padding=real, need_weights=True)
        return self.out(self.norm(x)), weights.cross_attention

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, src_lengths: torch.Tensor, steps: int):
        """``(tokens (b, steps), cross-attention weights (b, h, steps, n_src))``; row ``t`` is
        the step that wrote token ``t`` (causal, so re-running the prefix gives the same rows)."""
        tokens = torch.full((src.shape[0], 1), SOS)
        for _ in range(steps):
            logits, _ = self(src, src_lengths, tokens)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        _, weights = self(src, src_lengths, tokens[:, :-1])
        return tokens[:, 1:], weights


#: the record ``studies/cross_attention_transformer.py`` writes and seed 0's checkpoint
TRANSFORMER_RECORD = Path(__file__).resolve().parent.parent / "data" / "cross_attention_transformer.json"
TRANSFORMER_CHECKPOINT = "transformer_dates_seed0"


def load_transformer() -> TransformerSeq2Seq:
    """The study's seed-0 :class:`TransformerSeq2Seq`, in eval mode."""
    model = TransformerSeq2Seq()
    load_checkpoint(model, TRANSFORMER_CHECKPOINT)
    return model


def transformer_claims(tables: dict) -> dict[str, bool]:
    """The statements comparing the two models' alignments, on ``{seed: alignment_table}``."""
    field, entropy = "digit steps on their field", "digit-step entropy (nats)"
    seeds = ", ".join(map(str, tables))
    gru = {seed: table["GRU (1 head)"] for seed, table in tables.items()}
    heads = {seed: [row for name, row in table.items() if name.startswith("Transformer head")]
             for seed, table in tables.items()}
    return {
        f"seeds {seeds}: both models decode >= 99% of the test tokens correctly": all(
            gru[s]["token accuracy"] >= 0.99 and heads[s][0]["token accuracy"] >= 0.99
            for s in tables),
        "every Transformer head is less aligned with the fields than the GRU": all(
            row[field] < gru[s][field] for s in tables for row in heads[s]),
        "yet every head still reads the right field at most digit steps (60% to 95%)": all(
            0.6 < row[field] < 0.95 for s in tables for row in heads[s]),
        "in every seed, the mean of the heads' digit-step entropies is above the GRU's": all(
            sum(row[entropy] for row in heads[s]) / len(heads[s]) > gru[s][entropy]
            for s in tables),
    }
