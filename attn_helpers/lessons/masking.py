"""Notebook 05: the associative-recall task and the small model that Going deeper trains with
``g`` key/value heads, to ask what grouped-query attention costs at this scale. Every other
measurement of the notebook (masks, masked gradients, the KV cache, generation timed with and
without it, cache sizes) is computed in its cells.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import require_positive_int
from ..decoder_lm import TinyCausalLM
from ..training import train

__all__ = ["RECALL", "recall_batch", "train_recall"]

#: the associative-recall task and the model trained on it for the GQA trade-off
RECALL = dict(num_keys=16, num_values=8, pairs=6, d_model=32, num_heads=4, d_ff=64, steps=300,
              batch_size=32, lr=1e-2, eval_size=2000)


def recall_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Associative recall: ``pairs`` (key, value) tokens with distinct keys, then a query key;
    the answer is the value stored with that key. A pair is one token, ``key * num_values +
    value``; a query is the token ``num_keys * num_values + key``.

    Returns ``(tokens (b, pairs + 1), answers (b,))`` with answers in ``0..num_values-1``."""
    require_positive_int("batch_size", batch_size)
    n_k, n_v, pairs = RECALL["num_keys"], RECALL["num_values"], RECALL["pairs"]
    keys = torch.rand(batch_size, n_k, generator=generator).argsort(-1)[:, :pairs]  # (b, pairs)
    values = torch.randint(0, n_v, (batch_size, pairs), generator=generator)        # (b, pairs)
    pick = torch.randint(0, pairs, (batch_size,), generator=generator)              # (b,)
    rows = torch.arange(batch_size)
    query = n_k * n_v + keys[rows, pick]                                             # (b,)
    return torch.cat([keys * n_v + values, query[:, None]], 1), values[rows, pick]


def train_recall(num_kv_heads: int, seed: int) -> dict[str, float]:
    """Train a one-layer :class:`TinyCausalLM` with ``num_kv_heads`` key/value heads on
    :func:`recall_batch` (sizes in :data:`RECALL`); return its final loss and its accuracy on
    ``eval_size`` fresh questions."""
    c = RECALL
    vocab = c["num_keys"] * c["num_values"] + c["num_keys"]
    torch.manual_seed(seed)
    model = TinyCausalLM(vocab, c["d_model"], c["num_heads"], 1, c["d_ff"],
                         num_kv_heads=num_kv_heads, max_len=c["pairs"] + 1)

    def loss_fn(model, tokens, answers):                    # the answer is read off the last position
        return F.cross_entropy(model(tokens)[:, -1, : c["num_values"]], answers)

    result = train(model, lambda step, g: recall_batch(c["batch_size"], g), loss_fn,
                   steps=c["steps"], lr=c["lr"], seed=seed, progress=False, single_threaded=True)
    tokens, answers = recall_batch(c["eval_size"], torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        guess = model(tokens)[:, -1, : c["num_values"]].argmax(-1)
    return {"loss": result.final_loss, "accuracy": (guess == answers).float().mean().item()}
