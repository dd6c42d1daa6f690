"""Notebook 06: the claims the notebook asserts about the GRU models' cross-attention (does
output step ``t`` read the input it must copy?), the Transformer decoder layer checked against
PyTorch, encoder keys and values projected once per sentence, and a small Transformer
encoder-decoder on the dates task. The measurements behind the alignment claims are in
:mod:`attn_helpers.lessons.cross_attention_studies` (re-exported here)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention
from ..entropy import attention_entropy
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from ..training import train
from ..transformer import DecoderLayer, FeedForward
from .cross_attention_studies import (
    alignment_table,
    antidiagonal_hits,
    date_field_hits,
    digit_step_margin,
    mirror_offsets,
    neighbour_steps,
    reversal_alignment_stats,
)
from .rnn_bottleneck import Seq2Seq, predict
from .tasks import DATES, ISO_STEP_FIELDS, PAD, SOS, collate, eval_batches, example, make_batch

__all__ = ["REVERSAL_EXAMPLE", "mirror_offsets", "antidiagonal_hits", "date_field_hits",
           "reversal_alignment_stats", "neighbour_steps", "digit_step_margin", "count_claims",
           "decoder_layer_gap",
           "cross_attention_memory_once", "alignment_claims", "dates_claims", "decoder_claims",
           "EncoderLayer", "TransformerSeq2Seq", "train_transformer_dates", "alignment_table",
           "transformer_claims", "claims", "reversal_alignment_accuracy"]

#: the reversal example notebook 06 plots: ``tasks.example("reversal", *REVERSAL_EXAMPLE)``
REVERSAL_EXAMPLE = (5, 14)
#: at steps whose strongest weight is a neighbour of the mirror position, the mirror itself keeps
#: at least this much weight on average, and at least this share of those steps is still right
NEIGHBOUR_MIRROR_WEIGHT, NEIGHBOUR_CORRECT = 0.2, 0.97
#: at least this share of those neighbour steps peak one position *after* the mirror (a lag)
NEIGHBOUR_AFTER = 0.95
#: the first separator's mean entropy is "about equal" to the first year digit's: within this
SEPARATOR_TIE = 0.02
#: every Transformer head puts its strongest weight on the right field at a share of digit steps
#: in this range (the tests retrain seeds 0, 1 and 2)
HEAD_FIELD_RANGE = (0.6, 0.95)


def alignment_claims(attended: Seq2Seq) -> dict[str, bool]:
    """The reversal model's alignment: a band two positions wide around the anti-diagonal (the
    mirror position and the one after it), not a line."""
    stats = reversal_alignment_stats(attended)
    neighbours = neighbour_steps(attended)
    single = collate("reversal", [example("reversal", *REVERSAL_EXAMPLE)])
    _, weights = predict(attended, single)
    plotted = set(mirror_offsets(weights, single)[0].tolist())     # the notebook's figure
    return {
        # The split between the mirror and the lagging neighbour varies between runs of the same
        # recipe (shipped 62% exact, re-trained on another floating-point path 80%): no upper bound.
        "the strongest weight sits exactly on the anti-diagonal at more than 55% of all test steps":
            stats["exact"] > 0.55,
        "it sits within one position of it at >= 97% of the steps (>= 93% at every length)":
            stats["near"] >= 0.97 and stats["near, lowest length"] >= 0.93,
        f"of the steps that peak next to the mirror position, >= {NEIGHBOUR_AFTER:.0%} peak one "
        "after it (L - t, the digit the previous step copied)":
            neighbours["one after"] >= NEIGHBOUR_AFTER * neighbours["steps"],
        f"in the plotted {REVERSAL_EXAMPLE[1]}-digit example, every step peaks on the mirror "
        "position or the one after it":
            plotted <= {0, 1},
        f"where the peak is on a neighbour, the mirror keeps >= {NEIGHBOUR_MIRROR_WEIGHT} of "
        f"the weight on average and >= {NEIGHBOUR_CORRECT:.0%} of those digits are right":
            neighbours["mirror weight"] >= NEIGHBOUR_MIRROR_WEIGHT
            and neighbours["correct"] >= NEIGHBOUR_CORRECT,
    }


def reversal_alignment_accuracy(model: Seq2Seq, alignment_accuracy, *, per_length: int = 5) -> dict:
    """Run a learner's ``alignment_accuracy(weights, src_real, gold, tgt_real)`` (notebook 06's
    exercise 2) on one padded batch of ``per_length`` reversal examples of every length 4..24,
    with the gold alignment ``L - 1 - t``. Returns ``{"accuracy": its answer, "mirror share":
    the share of real steps whose peak is on the mirror position, from :func:`mirror_offsets`,
    "steps": the real steps}``."""
    batch = collate("reversal", [example("reversal", i, length) for length in range(4, 25)
                                 for i in range(per_length)])
    _, weights = predict(model, batch)                                     # (b, n_t, n_src)
    steps = torch.arange(weights.shape[1])[None, :]
    gold = (batch.src_lengths[:, None] - 1 - steps).clamp(min=0)           # the mirror position
    src_real = torch.arange(batch.src.shape[1])[None, :] < batch.src_lengths[:, None]
    tgt_real = steps < batch.tgt_lengths[:, None]
    _, accuracy = alignment_accuracy(weights, src_real, gold, tgt_real)
    share = ((mirror_offsets(weights, batch) == 0) & tgt_real).sum() / tgt_real.sum()
    return {"accuracy": float(accuracy), "mirror share": share.item(), "steps": int(tgt_real.sum())}


#: the smallest gap between a digit step's two strongest input words that makes the argmax counts
#: CPU-proof (float32 noise across instruction sets is ~1e-6)
COUNT_MARGIN = 1e-3


def count_claims(weights: torch.Tensor) -> dict[str, bool]:
    """The dates batch's per-step counts (:func:`date_field_hits`) are the same on any CPU: no
    digit step of ``weights`` is within :data:`COUNT_MARGIN` of a tie between its two strongest
    input words."""
    return {f"no digit step is within {COUNT_MARGIN} of a tie between its two strongest words, "
            "so these counts are the same on any CPU": digit_step_margin(weights) > COUNT_MARGIN}


def dates_claims(model: Seq2Seq) -> dict[str, bool]:
    """Notebook 06's statements about the dates model: accuracy, alignment by field, entropy."""
    test = eval_batches("dates", 300)[None]
    predicted, weights = predict(model, test)
    accuracy = (predicted == test.tgt_out[:, :10]).float().mean().item()
    hits = date_field_hits(weights, test).float().mean(0)
    digits = [t for t, f in enumerate(ISO_STEP_FIELDS) if f != "-"]
    separators = [t for t, f in enumerate(ISO_STEP_FIELDS) if f == "-"]
    mean_entropy = attention_entropy(weights.double()).mean(0)     # (10,)
    mean_top = weights.max(-1).values.mean(0)                       # (10,)
    first = separators[0]
    words, iso = example("dates", 0)
    one = collate("dates", [(words, iso)])
    tokens, _ = model.greedy_decode(one.src, one.src_lengths, 10)
    return {
        "token accuracy >= 0.99": accuracy >= 0.99,
        "digit steps read their own field (>= 0.95 on average, >= 0.85 each)":
            hits[digits].mean().item() >= 0.95 and hits[digits].min().item() >= 0.85,
        "at every digit step, the strongest word holds over half the weight on average":
            bool((mean_top[digits] > 0.5).all()),
        "separator steps have over 1.5x the mean entropy of digit steps":
            mean_entropy[separators].mean().item() > 1.5 * mean_entropy[digits].mean().item(),
        "the step with the highest mean entropy is a separator":
            int(mean_entropy.argmax()) in separators,
        f"yet the first separator is about equal to the first year digit (within {SEPARATOR_TIE} "
        "nats) and below the second: not every separator is above every digit":
            abs(mean_entropy[first] - mean_entropy[0]).item() < SEPARATOR_TIE
            and bool(mean_entropy[first] < mean_entropy[1]),
        "the notebook's example decodes correctly": DATES.tgt_vocab.decode(tokens[0]) == iso,
    }


def decoder_layer_gap(norm_first: bool, *, seed: int = 0) -> float:
    """Largest ``|difference|`` between ``torch.nn.TransformerDecoderLayer`` (4 heads, d = 16,
    no dropout) and ``DecoderLayer.from_torch`` of it, with a causal target mask and a padded
    memory."""
    torch.manual_seed(seed)
    theirs = nn.TransformerDecoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True,
                                        norm_first=norm_first).eval()
    ours = DecoderLayer.from_torch(theirs)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)       # (b, n, d), (b, n_m, d)
    real = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])    # (b, n_m): True = real
    future = nn.Transformer.generate_square_subsequent_mask(5)     # torch: -inf = hidden
    with torch.no_grad():
        expected = theirs(x, memory, tgt_mask=future, memory_key_padding_mask=~real,
                          tgt_is_causal=True)
        got = ours(x, memory, causal=True, memory_padding=real)
    return (got - expected).abs().max().item()


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


def decoder_claims() -> dict[str, bool]:
    """Notebook 06's statements about the Transformer decoder layer built from the course's parts."""
    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32)
    y, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    real = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    with torch.no_grad():
        once, calls = cross_attention_memory_once(layer.cross_attn, y, memory, real)
        full, _ = layer.cross_attn(y, memory, memory, real[:, None, :])
    return {
        "DecoderLayer.from_torch equals nn.TransformerDecoderLayer, post-norm (within 1e-5)":
            decoder_layer_gap(False) < 1e-5,
        "... and pre-norm (norm_first=True)": decoder_layer_gap(True) < 1e-5,
        "memory keys and values projected once (k_proj and v_proj each run once) and reused "
        "give the same cross-attention":
            calls == {"k_proj": 1, "v_proj": 1} and torch.allclose(once, full, atol=1e-6),
    }


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


def transformer_claims(table: dict[str, dict]) -> dict[str, bool]:
    """Notebook 06's statements comparing the two models' alignments (:func:`alignment_table`)."""
    gru = table["GRU (1 head)"]
    heads = [row for name, row in table.items() if name.startswith("Transformer head")]
    field, entropy = "digit steps on their field", "digit-step entropy (nats)"
    lo, hi = HEAD_FIELD_RANGE
    return {
        "both models decode >= 99% of the test tokens correctly":
            gru["token accuracy"] >= 0.99 and heads[0]["token accuracy"] >= 0.99,
        "every Transformer head is less aligned with the fields than the GRU":
            all(row[field] < gru[field] for row in heads),
        f"yet every head still reads the right field at most digit steps ({lo:.0%} to {hi:.0%})":
            all(lo < row[field] < hi for row in heads),
        "its heads together spread their digit-step weight more than the GRU (the entropy of "
        "the heads' average is higher)":
            table["Transformer, heads averaged"][entropy] > gru[entropy],
    }


def claims(reversal_model: Seq2Seq, dates_model: Seq2Seq, table: dict | None = None):
    """All of notebook 06's statements, ``{name: bool}``: the reversal alignment, the dates model,
    the decoder layer and, given :func:`alignment_table`'s result, the Transformer comparison."""
    return {**alignment_claims(reversal_model), **dates_claims(dates_model), **decoder_claims(),
            **(transformer_claims(table) if table is not None else {})}
