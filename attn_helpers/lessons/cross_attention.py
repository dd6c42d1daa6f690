"""Notebook 06: where each date and reversal step reads (per GRU seed: the study
cross_attention_gru_seeds) and a small Transformer on the dates (cross_attention_transformer);
the ``*_claims`` functions hold the thresholds the studies and the notebook assert."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .._checks import require_tensor, shape
from ..entropy import attention_entropy
from ..multihead import MultiHeadAttention
from ..training import load_checkpoint
from ..transformer import DecoderLayer, FeedForward
from .rnn_bottleneck import predict
from .tasks import DATES, ISO_STEP_FIELDS, PAD, SOS, Batch, date_fields

__all__ = ["alignment_readings", "dates_readings", "reversal_readings", "table_row", "EncoderLayer",
           "TransformerSeq2Seq", "TRANSFORMER_RECORD", "TRANSFORMER_CHECKPOINT", "GRU_SEEDS_RECORD",
           "load_transformer", "gru_seed_claims"]
DIGIT_STEPS = [t for t, field in enumerate(ISO_STEP_FIELDS) if field != "-"]


def alignment_readings(tokens: torch.Tensor, weights: torch.Tensor, test: Batch) -> dict:
    """Greedy ``tokens (b, 10)`` and one head's ``weights (b, 10, n_k)`` on dates ``test``: token
    accuracy, per ISO step the fields of the strongest input words (counts of dates), the mean
    entropy and strongest weight, and the smallest gap between a row's two strongest weights."""
    require_tensor("weights", weights, floating=True)
    if not isinstance(test, Batch):
        raise TypeError(f"test must be a tasks.Batch, got {type(test).__name__}")
    if weights.shape != (len(test), len(ISO_STEP_FIELDS), test.src.shape[1]):
        raise ValueError(f"weights must have shape (b={len(test)}, {len(ISO_STEP_FIELDS)} ISO steps, "
                         f"n_src={test.src.shape[1]}), got {shape(weights)}")
    fields = [date_fields(DATES.src_vocab.decode(src)) for src in test.src]
    read = [[fields[i][j] for j in w.argmax(-1).tolist()] for i, w in enumerate(weights)]
    top2 = weights.topk(2, dim=-1).values                                 # (b, 10, 2)
    return {"token accuracy": (tokens == test.tgt_out[:, :10]).float().mean().item(),
            "field counts": [{f: sum(row[t] == f for row in read) for f in ("year", "month", "day")}
                             for t in range(len(ISO_STEP_FIELDS))],
            "mean entropy": attention_entropy(weights.double()).mean(0).tolist(),
            "mean strongest weight": weights.max(-1).values.mean(0).tolist(),
            "smallest top-2 gap": (top2[..., 0] - top2[..., 1]).min().item()}


def dates_readings(model, test: Batch) -> dict:
    """:func:`alignment_readings` of a dates GRU, with the lowest teacher-forced p of the correct
    token over every step of every test date."""
    readings = alignment_readings(*predict(model, test), test)
    with torch.no_grad():
        logits, _ = model(test.src, test.src_lengths, test.tgt_in)       # teacher forced
    p_correct = logits.softmax(-1).gather(-1, test.tgt_out[..., None])[..., 0]   # (b, 11)
    return readings | {"lowest p of the correct token": p_correct[:, :10].min().item()}


def table_row(readings: dict) -> dict:
    """Token accuracy, the share of digit steps on their field and their mean entropy."""
    counts, h = readings["field counts"], readings["mean entropy"]
    n = sum(counts[0].values())                                           # test dates
    return {"token accuracy": readings["token accuracy"],
            "digit steps on their field": sum(counts[t][ISO_STEP_FIELDS[t]] for t in DIGIT_STEPS)
            / (n * len(DIGIT_STEPS)),
            "digit-step entropy (nats)": sum(h[t] for t in DIGIT_STEPS) / len(DIGIT_STEPS)}


def reversal_readings(model, tests: dict) -> dict:
    """A reversal GRU on ``{L: Batch}``: the share of real steps whose strongest weight sits on the
    mirror position ``L-1-t`` and within one of it (by length and pooled), the mean entropy by
    length, and the mean weight of the peak and of the 4 strongest keys."""
    by_length = {"on the mirror": {}, "within one": {}, "mean entropy": {}}
    offsets, peak, top4 = [], [], []
    for length, test in tests.items():
        _, weights = predict(model, test)                                # (b, n_t, n)
        t = torch.arange(weights.shape[1])
        real = t < test.tgt_lengths[:, None]                             # (b, n_t)
        offset = (weights.argmax(-1) - (test.src_lengths[:, None] - 1 - t))[real]   # 0: on L-1-t
        by_length["on the mirror"][length] = (offset == 0).float().mean().item()
        by_length["within one"][length] = (offset.abs() <= 1).float().mean().item()
        by_length["mean entropy"][length] = attention_entropy(weights.double())[real].mean().item()
        offsets.append(offset)
        peak.append(weights.max(-1).values[real])
        top4.append(weights.topk(4, dim=-1).values.sum(-1)[real])
    offset = torch.cat(offsets)
    return {**by_length, "on the mirror, pooled": (offset == 0).float().mean().item(),
            "within one, pooled": (offset.abs() <= 1).float().mean().item(),
            "peak weight": torch.cat(peak).mean().item(),
            "4 strongest keys' weight": torch.cat(top4).mean().item()}


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
#: the record ``studies/cross_attention_gru_seeds.py`` writes
GRU_SEEDS_RECORD = TRANSFORMER_RECORD.with_name("cross_attention_gru_seeds.json")


def load_transformer() -> TransformerSeq2Seq:
    """The study's seed-0 :class:`TransformerSeq2Seq`, in eval mode."""
    model = TransformerSeq2Seq()
    load_checkpoint(model, TRANSFORMER_CHECKPOINT)
    return model


def gru_seed_claims(seeds: dict) -> dict[str, bool]:
    """Notebook 06's statements about the GRUs, on ``{seed: {"dates": dates_readings(...),
    "reversal": reversal_readings(...)}}``, every one over every seed."""
    dates = {s: r["dates"] for s, r in seeds.items()}
    rev = {s: r["reversal"] for s, r in seeds.items()}
    n = {s: sum(d["field counts"][0].values()) for s, d in dates.items()}      # test dates
    share = {s: [c[f] / n[s] if f != "-" else 0.0
                 for c, f in zip(d["field counts"], ISO_STEP_FIELDS, strict=True)]
             for s, d in dates.items()}
    entropy = {s: d["mean entropy"] for s, d in dates.items()}
    digit_entropy = {s: sum(e[t] for t in DIGIT_STEPS) / len(DIGIT_STEPS) for s, e in entropy.items()}
    seed_list = ", ".join(map(str, seeds))
    return {
        f"seeds {seed_list}: each dates GRU decodes >= 99% of the test tokens":
            all(d["token accuracy"] >= 0.99 for d in dates.values()),
        "every seed, every digit step but the month's first (step 5): the strongest word is in the "
        "step's field for >= 90% of the dates": all(
            min(share[s][t] for t in DIGIT_STEPS if t != 5) >= 0.9 for s in seeds),
        "step 5, the month's first digit: on the month for >= 90% of the dates on one seed, for < 60% "
        "on another": max(share[s][5] for s in seeds) >= 0.9 and min(share[s][5] for s in seeds) < 0.6,
        "every seed: at the first - (step 4) the strongest word is in the year for >= 80% of dates":
            all(d["field counts"][4]["year"] >= 0.8 * n[s] for s, d in dates.items()),
        "every seed: at the second - (step 7) no field holds the strongest word for over half":
            all(max(d["field counts"][7].values()) <= 0.5 * n[s] for s, d in dates.items()),
        "every seed: at every digit step the strongest word holds over half the weight on average":
            all(min(d["mean strongest weight"][t] for t in DIGIT_STEPS) > 0.5 for d in dates.values()),
        "every seed: the second - has the highest mean entropy of all steps, over 2x the digits'":
            all(max(range(10), key=e.__getitem__) == 7 and e[7] > 2 * digit_entropy[s]
                for s, e in entropy.items()),
        "every seed: teacher forced, p of the correct token > 0.99 at every step of every date":
            all(d["lowest p of the correct token"] > 0.99 for d in dates.values()),
        "every reversal seed: the peak is exactly on L-1-t at >= 70% of the steps of every length, "
        ">= 3x chance (1/L)": all(min(r["on the mirror"].values()) >= 0.7 and
                                  min(int(L) * v for L, v in r["on the mirror"].items()) >= 3
                                  for r in rev.values()),
        "every reversal seed: within one of L-1-t at >= 93% of the steps of every length":
            all(min(r["within one"].values()) >= 0.93 for r in rev.values()),
        "every reversal seed: the peak holds < 0.6 of the weight on average, the 4 strongest keys "
        "> 0.85": all(r["peak weight"] < 0.6 and r["4 strongest keys' weight"] > 0.85
                      for r in rev.values()),
        "every reversal seed: mean entropy between 1 and 1.6 nats at every length":
            all(1.0 < min(r["mean entropy"].values()) and max(r["mean entropy"].values()) < 1.6
                for r in rev.values()),
    }
