"""Notebook 05's associative-recall task, a small model with ``g`` key/value heads trained on it,
and the claims on the record of ``studies/masking_gqa_recall.py``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional as F

from .._checks import require_positive_int
from ..decoder_lm import TinyCausalLM
from ..training import train

__all__ = ["recall_batch", "train_recall", "RECORD", "load_record", "summary", "gqa_claims"]

RECORD = Path(__file__).resolve().parent.parent / "data" / "masking_gqa_recall.json"  # the study's


def recall_batch(batch_size: int, generator: torch.Generator, *, num_keys: int = 16,
                 num_values: int = 8, pairs: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """``pairs`` (key, value) tokens ``key * num_values + value`` with distinct keys, then a query
    token ``num_keys * num_values + key``. -> ``(tokens (b, pairs + 1), answers (b,))``."""
    require_positive_int("batch_size", batch_size)
    keys = torch.rand(batch_size, num_keys, generator=generator).argsort(-1)[:, :pairs]  # (b, pairs)
    values = torch.randint(0, num_values, (batch_size, pairs), generator=generator)   # (b, pairs)
    pick = torch.randint(0, pairs, (batch_size,), generator=generator)                # (b,)
    rows = torch.arange(batch_size)
    query = num_keys * num_values + keys[rows, pick]                                   # (b,)
    return torch.cat([keys * num_values + values, query[:, None]], 1), values[rows, pick]


def train_recall(g: int, seed: int) -> dict:
    """h = 4 query heads, g key/value heads, 300 Adam steps on batches of 32, one thread ->
    accuracy on 2,000 new questions and the mean loss of the last 30 steps."""
    torch.manual_seed(seed)
    model = TinyCausalLM(16 * 8 + 16, 32, 4, 1, 64, num_kv_heads=g, max_len=7)  # 6 pairs + query

    def loss_fn(model, tokens, answers):                    # the answer: one of 8 values, last position
        return F.cross_entropy(model(tokens)[:, -1, :8], answers)

    result = train(model, lambda step, gen: recall_batch(32, gen), loss_fn, steps=300, lr=1e-2,
                   seed=seed, progress=False, single_threaded=True)
    tokens, answers = recall_batch(2000, torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        accuracy = (model(tokens)[:, -1, :8].argmax(-1) == answers).float().mean().item()
    return {"g": g, "seed": seed, "accuracy": accuracy, "final_loss": sum(result.losses[-30:]) / 30}


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per ``g`` (a string key): the mean, lowest and highest accuracy over the seeds."""
    out = {}
    for g in sorted({r["g"] for r in rows}, reverse=True):
        accuracy = [r["accuracy"] for r in rows if r["g"] == g]
        out[str(g)] = {"mean": round(sum(accuracy) / len(accuracy), 4),
                       "min": min(accuracy), "max": max(accuracy)}
    return out


def load_record(path: Path = RECORD) -> dict:
    """The study's record: ``gs``, ``seeds``, ``rows`` (per g and seed) and ``summary`` (per g)."""
    return json.loads(Path(path).read_text())


def gqa_claims(record: dict) -> dict[str, bool]:
    """Notebook 05's statements about the study's record (same seed: same batches)."""
    rows, seeds = record["rows"], record["seeds"]
    accuracy = {(r["g"], r["seed"]): r["accuracy"] for r in rows}
    mean = {g: sum(accuracy[g, s] for s in seeds) / len(seeds) for g in (4, 2, 1)}
    below_mha = {g: sum(accuracy[g, s] < accuracy[4, s] for s in seeds) for g in (2, 1)}
    n = len(seeds)

    def mean_and_se(a, b):  # paired: same seed, same batches
        d = [accuracy[a, s] - accuracy[b, s] for s in seeds]
        mean = sum(d) / n
        return mean, (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5 if n > 1 else float("inf")

    (drop, drop_se), (gap_21, se_21) = mean_and_se(4, 1), mean_and_se(2, 1)
    return {
        f"every run (g = 4, 2, 1; {n} seeds, at least 10) beats chance (1/8) over 4x: accuracy > 0.5":
            n >= 10 and len(accuracy) == 3 * n and all(a > 0.5 for a in accuracy.values()),
        f"g = 1 (multi-query) scores below g = 4 on at least 18 of the {n} seeds":
            below_mha[1] >= 18,
        f"g = 2 scores below g = 4 on at least 15 of the {n} seeds": below_mha[2] >= 15,
        "each mean drop from g = 4 is under 0.1 (a few points, not a collapse)":
            0 < mean[4] - mean[2] < 0.1 and 0 < mean[4] - mean[1] < 0.1,
        "paired per seed, g = 4 minus g = 1 has a mean over 3 standard errors (sd / sqrt(seeds))":
            drop > 3 * drop_se,
        "paired per seed, g = 2 minus g = 1 has a mean above 0 but under 3 standard errors "
        "(suggestive only)": 0 < gap_21 < 3 * se_21,
    }
