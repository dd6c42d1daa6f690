"""Notebook 06, cross-attention: the memory's keys and values projected once per sentence, the
alignment of a trained model's dates (does each ISO step read its own field?), and a small
Transformer encoder-decoder on the dates task, trained on three seeds by
``studies/cross_attention_transformer.py`` (its record: :data:`TRANSFORMER_RECORD`; seed 0's
weights: :func:`load_transformer`)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import require_tensor, shape
from ..attention import scaled_dot_product_attention
from ..entropy import attention_entropy
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from ..training import load_checkpoint, train
from ..transformer import DecoderLayer, FeedForward
from .rnn_bottleneck import Seq2Seq, predict
from .tasks import (
    DATES,
    ISO_STEP_FIELDS,
    PAD,
    SOS,
    Batch,
    collate,
    date_fields,
    eval_batches,
    example,
    make_batch,
)

__all__ = ["cross_attention_memory_once", "date_field_hits", "reversal_alignment_accuracy",
           "EncoderLayer", "TransformerSeq2Seq", "train_transformer_dates", "alignment_table",
           "TRANSFORMER_SEEDS", "TRANSFORMER_RECORD", "TRANSFORMER_CHECKPOINT", "load_transformer",
           "transformer_claims"]

_DIGITS = [t for t, f in enumerate(ISO_STEP_FIELDS) if f != "-"]


# --- cross-attention with the memory projected once ------------------------------------------


def cross_attention_memory_once(cross: MultiHeadAttention, y: torch.Tensor,
                                memory: torch.Tensor, memory_padding: torch.Tensor | None = None):
    """Cross-attention decoded one target position at a time, with the memory's keys and values
    projected **once** and reused at every step.

    Args:
        cross: the cross-attention layer (``num_kv_heads == num_heads``).
        y: ``(b, n, d_model)`` the decoder states, one row per step; memory: ``(b, n_m, kdim)``.
        memory_padding: optional bool ``(b, n_m)``, True = a real memory token.

    Returns:
        ``(output (b, n, d_model), calls)``: the output equals ``cross(y, memory, memory, mask)``;
        ``calls`` counts how often each memory projection ran, ``{"k_proj": 1, "v_proj": 1}``.
    """
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


# --- reading a trained model's alignment -----------------------------------------------------


def date_field_hits(weights: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(b, 10)`` bool: for a dates batch, whether the strongest input word of each ISO output
    step lies in the field that step copies (:data:`tasks.ISO_STEP_FIELDS`: the year digits
    should read the year words, and so on). The two separator steps (``-``) copy nothing and are
    always False; leave them out of any share."""
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


def reversal_alignment_accuracy(model: Seq2Seq, alignment_accuracy, *, per_length: int = 5) -> dict:
    """Run a learner's ``alignment_accuracy(weights, src_real, gold, tgt_real)`` (notebook 06's
    exercise 2) on one padded batch of ``per_length`` reversal examples of every length 4..24,
    with the gold alignment ``L - 1 - t``. Returns ``{"accuracy": its answer, "mirror share":
    the share of real steps whose peak is on the mirror position, counted directly, "steps": the
    real steps}``."""
    batch = collate("reversal", [example("reversal", i, length) for length in range(4, 25)
                                 for i in range(per_length)])
    _, weights = predict(model, batch)                                     # (b, n_t, n_src)
    steps = torch.arange(weights.shape[1])[None, :]
    gold = (batch.src_lengths[:, None] - 1 - steps).clamp(min=0)           # the mirror position
    src_real = torch.arange(batch.src.shape[1])[None, :] < batch.src_lengths[:, None]
    tgt_real = steps < batch.tgt_lengths[:, None]
    _, accuracy = alignment_accuracy(weights, src_real, gold, tgt_real)
    share = ((weights.argmax(-1) == gold) & tgt_real).sum() / tgt_real.sum()
    return {"accuracy": float(accuracy), "mirror share": share.item(), "steps": int(tgt_real.sum())}


# --- a small Transformer encoder-decoder on the dates task ----------------------------------


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
    """One :class:`EncoderLayer` and one pre-norm :class:`~attn_helpers.transformer.DecoderLayer`
    (causal self-attention, cross-attention to the encoder, feed-forward) with learned positions,
    for the dates task. ``forward(src, src_lengths, tgt_in)`` returns ``(logits (b, n_t, vocab),
    cross-attention weights (b, h, n_t, n_src))``."""

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


def train_transformer_dates(seed: int = 0, steps: int = 300) -> TransformerSeq2Seq:
    """Train :class:`TransformerSeq2Seq` on random dates (batches of 64, Adam, lr 5e-3, one
    thread): about 10 s on a laptop CPU."""
    torch.manual_seed(seed)
    model = TransformerSeq2Seq()

    def loss_fn(model, src, src_lengths, tgt_in, tgt_out):
        logits, _ = model(src, src_lengths, tgt_in)
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)

    def batches(step, generator):
        b = make_batch(DATES, 64, generator)
        return b.src, b.src_lengths, b.tgt_in, b.tgt_out

    train(model, batches, loss_fn, steps=steps, lr=5e-3, seed=seed, progress=False,
          single_threaded=True)
    return model


def _row(tokens, weights, test) -> dict[str, float]:
    return {"token accuracy": (tokens == test.tgt_out[:, :10]).float().mean().item(),
            "digit steps on their field": date_field_hits(weights, test)[:, _DIGITS]
            .float().mean().item(),
            "digit-step entropy (nats)": attention_entropy(weights[:, _DIGITS].double())
            .mean().item()}


def alignment_table(gru: Seq2Seq, transformer) -> dict[str, dict]:
    """On the 300 test dates: token accuracy, the share of digit steps whose strongest input word
    is in the right field, and the digit steps' mean entropy, for the GRU model and for every
    head of the Transformer's cross-attention (and their mean weights)."""
    test = eval_batches("dates", 300)[None]
    table = {"GRU (1 head)": _row(*predict(gru, test), test)}
    tokens, weights = transformer.greedy_decode(test.src, test.src_lengths, 10)
    for head in range(weights.shape[1]):
        table[f"Transformer head {head}"] = _row(tokens, weights[:, head], test)
    table["Transformer, heads averaged"] = _row(tokens, weights.mean(1), test)
    return table


#: the seeds ``studies/cross_attention_transformer.py`` trains, and the record it writes:
#: ``{"steps": 300, "tables": {seed: alignment_table(...)}}``
TRANSFORMER_SEEDS = (0, 1, 2)
TRANSFORMER_RECORD = Path(__file__).resolve().parent.parent / "data" / "cross_attention_transformer.json"
TRANSFORMER_CHECKPOINT = "transformer_dates_seed0"


def load_transformer() -> TransformerSeq2Seq:
    """The study's seed-0 :class:`TransformerSeq2Seq` (:data:`TRANSFORMER_CHECKPOINT`), in eval
    mode."""
    model = TransformerSeq2Seq()
    load_checkpoint(model, TRANSFORMER_CHECKPOINT)
    return model


def transformer_claims(tables: dict) -> dict[str, bool]:
    """Notebook 06's statements comparing the two models' alignments, for every seed's
    :func:`alignment_table` in ``tables`` (``{seed: table}``); the study asserts them on fresh
    trainings, the notebook on the record."""
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
