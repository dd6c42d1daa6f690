"""Notebook 04's toy task: two relations at once, and a tiny transformer whose heads split them.

The task: a sequence of ``n`` random letters. At every position ``i >= 1`` the model must name
two things, the **previous** letter ``x[i-1]`` and the **first** letter ``x[0]``. No single
attention pattern serves both (one looks one step back, the other always at position 0), so a
model with two heads can give one relation to each. Head ablation (switching one head off) shows
which head carries which relation.

Re-create the shipped checkpoint with ``python -m attn_helpers.train multihead_two_relations``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_positive_int, require_tensor, shape
from ..entropy import attention_entropy
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from ..training import load_checkpoint, train

__all__ = [
    "RELATIONS",
    "TaskConfig",
    "CONFIG",
    "make_batch",
    "token_labels",
    "TwoRelationModel",
    "relation_accuracy",
    "ablation_table",
    "head_relation_scores",
    "head_entropy",
    "train_two_relations",
    "load_two_relations",
    "CHECKPOINT",
]

RELATIONS = ("previous", "first")
CHECKPOINT = "multihead_two_relations"


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of the task and the model (the defaults are what the checkpoint was trained with)."""

    vocab: int = 8
    length: int = 10
    d_model: int = 32
    num_heads: int = 2
    d_ff: int = 64
    steps: int = 600
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0


CONFIG = TaskConfig()


def make_batch(
    batch: int, generator: torch.Generator, *, vocab: int = CONFIG.vocab,
    length: int = CONFIG.length,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random letters and their two targets.

    Returns:
        ``tokens`` ``(batch, length)`` long and ``targets`` ``(batch, length, 2)`` long:
        ``targets[:, i, 0] = tokens[:, i-1]`` (previous) and ``targets[:, i, 1] = tokens[:, 0]``
        (first). Position 0 has no previous letter; its targets are ``-100`` (ignored by the loss).
    """
    require_positive_int("batch", batch)
    require_positive_int("vocab", vocab)
    require_positive_int("length", length)
    if length < 3:
        raise ValueError(f"length must be >= 3 so the two relations differ, got {length}")
    tokens = torch.randint(vocab, (batch, length), generator=generator)
    targets = torch.full((batch, length, 2), -100, dtype=torch.long)
    targets[:, 1:, 0] = tokens[:, :-1]
    targets[:, 1:, 1] = tokens[:, :1]
    return tokens, targets


def token_labels(tokens: torch.Tensor) -> list[str]:
    """``(n,)`` token ids -> labels ``letter + position`` (``"C0"``, ``"A1"``, ...)."""
    require_tensor("tokens", tokens)
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D (n,), got shape {shape(tokens)}")
    return [f"{string.ascii_uppercase[int(t)]}{i}" for i, t in enumerate(tokens)]


class TwoRelationModel(nn.Module):
    """A one-layer transformer: embeddings + learned positions, one causal
    :class:`MultiHeadAttention`, a residual MLP and two read-outs (previous, first).

    ``forward(tokens (b, n), head_mask=None) -> (logits (b, n, 2, vocab), weights (b, h, n, n))``.
    """

    def __init__(self, config: TaskConfig = CONFIG):
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab, d)
        self.position = nn.Parameter(0.3 * torch.randn(config.length, d))
        self.attention = MultiHeadAttention(d, config.num_heads)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, config.d_ff), nn.ReLU(), nn.Linear(config.d_ff, d))
        self.readout = nn.Linear(d, 2 * config.vocab)

    def forward(self, tokens: torch.Tensor, head_mask: torch.Tensor | None = None):
        require_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.shape[1] > self.config.length:
            raise ValueError(f"tokens must be (b, n) with n <= {self.config.length}, "
                             f"got shape {shape(tokens)}")
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:n]
        attended, weights = self.attention(x, x, x, causal_mask(n), head_mask=head_mask)
        h = x + attended
        h = h + self.mlp(self.norm(h))
        logits = self.readout(h).unflatten(-1, (2, self.config.vocab))
        return logits, weights


def _loss(model: TwoRelationModel, tokens, targets) -> torch.Tensor:
    logits, _ = model(tokens)
    return F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=-100)


def relation_accuracy(
    model: TwoRelationModel, tokens: torch.Tensor, targets: torch.Tensor,
    head_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Share of positions ``i >= 2`` where each relation is named correctly (position 1 is left
    out: there the previous letter *is* the first one). Returns ``{"previous": .., "first": ..}``."""
    with torch.no_grad():
        logits, _ = model(tokens, head_mask=head_mask)
    correct = logits.argmax(-1)[:, 2:] == targets[:, 2:]
    return {name: correct[..., r].float().mean().item() for r, name in enumerate(RELATIONS)}


def ablation_table(model: TwoRelationModel, tokens, targets) -> dict[str, dict[str, float]]:
    """Accuracy per relation with all heads on, and with each head switched off in turn.

    Returns ``{"all heads": {...}, "without head 0": {...}, ...}``.
    """
    h = model.config.num_heads
    table = {"all heads": relation_accuracy(model, tokens, targets)}
    for head in range(h):
        keep = torch.ones(h)
        keep[head] = 0.0
        table[f"without head {head}"] = relation_accuracy(model, tokens, targets, keep)
    return table


def head_relation_scores(weights: torch.Tensor) -> torch.Tensor:
    """How much each head follows each relation: ``weights (b, h, n, n) -> (h, 2)``.

    Column 0 is the mean weight on the previous key ``i-1``, column 1 the mean weight on the
    first key ``0``, both over queries ``i >= 2``.
    """
    require_tensor("weights", weights, floating=True)
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 3:
        raise ValueError(f"weights must be (b, h, n, n) with n >= 3, got shape {shape(weights)}")
    n = weights.shape[-1]
    rows = torch.arange(2, n)
    previous = weights[:, :, rows, rows - 1].mean(dim=(0, 2))
    first = weights[:, :, rows, 0].mean(dim=(0, 2))
    return torch.stack([previous, first], dim=1)


def head_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's rows: ``(b, h, n_q, n_k) -> (h,)``."""
    require_tensor("weights", weights, floating=True)
    if weights.dim() != 4:
        raise ValueError(f"weights must be (b, h, n_q, n_k), got shape {shape(weights)}")
    return attention_entropy(weights).mean(dim=(0, 2))


def train_two_relations(config: TaskConfig = CONFIG, *, progress: bool = False):
    """Train :class:`TwoRelationModel` from scratch (seeded by ``config.seed``), on one thread
    (see :func:`attn_helpers.training.single_thread`).

    Returns ``(model, TrainResult)``.
    """
    torch.manual_seed(config.seed)
    model = TwoRelationModel(config)

    def batch(_step, generator):
        return make_batch(config.batch, generator, vocab=config.vocab, length=config.length)

    result = train(model, batch, _loss, steps=config.steps, lr=config.lr, seed=config.seed,
                   progress=progress, description="two relations", single_threaded=True)
    return model, result


def evaluation_batch(config: TaskConfig = CONFIG, seed: int = 1234):
    """A fixed held-out batch of 512 sequences: ``(tokens, targets)``."""
    return make_batch(512, torch.Generator().manual_seed(seed), vocab=config.vocab,
                      length=config.length)


def recipe():
    """``python -m attn_helpers train multihead_two_relations``: train the two-head model."""
    model, result = train_two_relations(CONFIG)
    tokens, targets = evaluation_batch(CONFIG)
    every = max(1, len(result.losses) // 100)
    curve = [round(sum(result.losses[i:i + every]) / every, 4)
             for i in range(0, len(result.losses), every)]
    return model, {"config": CONFIG.__dict__, "loss_every": every, "loss_curve": curve,
                   "accuracy": relation_accuracy(model, tokens, targets)}


def load_two_relations() -> tuple[TwoRelationModel, dict]:
    """The shipped, trained model and its metadata (config, loss curve, accuracy)."""
    model = TwoRelationModel(CONFIG)
    metadata = load_checkpoint(model, CHECKPOINT)
    return model, metadata
