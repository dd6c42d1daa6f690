r"""Notebook 07: the offset-copy task ("copy from 1 and 3 back") and its one-layer model with a
pluggable position scheme (trained by ``studies/positional_offsets.py``), and ALiBi's half-weight
reach.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import require_positive_int, require_tensor, shape
from ..attention import masked_softmax
from ..masks import causal_mask
from ..positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    apply_rope,
    sinusoidal_encoding,
)
from ..training import load_checkpoint, single_thread, train

__all__ = [
    "SCHEMES", "VOCAB", "OFFSETS", "D_MODEL", "NUM_HEADS", "TRAIN_MIN_LEN", "TRAIN_MAX_LEN",
    "TEST_LENGTHS", "SEEDS", "BASE", "WRAP_BASES", "WRAP_LENGTH", "MODELS",
    "offset_copy_batch", "PositionTaskModel", "model_key", "train_scheme", "load_models",
    "position_accuracy",
]

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")
VOCAB, OFFSETS = 16, (1, 3)
D_MODEL, NUM_HEADS = 24, 3  # d_head = 8: RoPE pairs turn at 1, 0.1, 0.01, 0.001 rad per position
TRAIN_MIN_LEN, TRAIN_MAX_LEN = 8, 16
TEST_LENGTHS = (16, 32, 64)  # 1x, 2x and 4x the training length
MAX_LEN = 64  # rows of the learned table; rows 16..63 exist but are never trained
SEEDS, BASE = (0, 1, 2), 10000.0
WRAP_BASES = (625.0, BASE, 160000.0)  # second pair at 0.2, 0.1, 0.05 rad per position
WRAP_LENGTH = 160
STEPS, BATCH, LR = 1200, 64, 5e-3
#: ``(scheme, seed, base)`` of every shipped model: all schemes, then RoPE's other bases.
MODELS = ([(s, seed, BASE) for s in SCHEMES for seed in SEEDS]
          + [("rope", seed, b) for b in WRAP_BASES if b != BASE for seed in SEEDS])


def offset_copy_batch(batch: int, n: int, generator: torch.Generator, *, vocab: int = VOCAB,
                      offsets: tuple[int, ...] = OFFSETS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (batch, n), targets (batch, n, len(offsets)))``, ``targets[:, i, j] =
    tokens[:, i - offsets[j]]`` or ``-1`` (ignored) where ``i < offsets[j]``."""
    require_positive_int("batch", batch)
    require_positive_int("n", n)
    require_positive_int("vocab", vocab)
    tokens = torch.randint(0, vocab, (batch, n), generator=generator)
    targets = torch.full((batch, n, len(offsets)), -1)
    for j, k in enumerate(offsets):
        targets[:, k:, j] = tokens[:, : n - k]
    return tokens, targets


class PositionTaskModel(nn.Module):
    """One causal multi-head attention layer with position scheme ``scheme`` (one of
    :data:`SCHEMES`; ``base`` is RoPE's). ``forward(tokens (b, n)) -> logits (b, n, len(offsets),
    vocab)``, ``head(x + attention(x))``; :attr:`last_weights` ``(b, h, n, n)`` of the latest call."""

    def __init__(self, scheme: str, *, vocab: int = VOCAB, d_model: int = D_MODEL,
                 num_heads: int = NUM_HEADS, offsets: tuple[int, ...] = OFFSETS,
                 max_len: int = MAX_LEN, base: float = BASE):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into num_heads={num_heads} heads of "
                             "even size")
        self.scheme, self.vocab, self.d_model, self.num_heads = scheme, vocab, d_model, num_heads
        self.offsets, self.max_len, self.base = tuple(offsets), max_len, float(base)
        self.embed = nn.Embedding(vocab, d_model)
        if scheme == "learned":
            self.positions = LearnedPositionalEmbedding(max_len, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # rows: Q heads, K heads, V heads
        self.head = nn.Linear(d_model, len(self.offsets) * vocab, bias=False)
        self.last_weights: torch.Tensor | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        require_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be an integer tensor (batch, n), got {tokens.dtype} "
                             f"shape {shape(tokens)}")
        b, n = tokens.shape
        x = self.embed(tokens)  # (b, n, d)
        if self.scheme == "sinusoidal":
            x = x + sinusoidal_encoding(n, self.d_model).to(x.dtype)
        elif self.scheme == "learned":
            x = self.positions(x)
        h, d_head = self.num_heads, self.d_model // self.num_heads
        q, k, v = self.qkv(x).view(b, n, 3, h, d_head).permute(2, 0, 3, 1, 4)  # (b, h, n, d_head)
        if self.scheme == "rope":
            q, k = apply_rope(q, base=self.base), apply_rope(k, base=self.base)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (b, h, n, n)
        if self.scheme == "alibi":
            scores = scores + alibi_bias(n, h).to(scores.dtype)
        weights = masked_softmax(scores, causal_mask(n))
        self.last_weights = weights.detach()
        mixed = (weights @ v).transpose(1, 2).reshape(b, n, self.d_model)  # heads concatenated
        return self.head(x + mixed).view(b, n, len(self.offsets), self.vocab)


def model_key(scheme: str, seed: int, base: float = BASE) -> str:
    """The name of one trained model in the checkpoint: ``"rope_s0"``, ``"rope_b625_s1"``."""
    return f"{scheme}_s{seed}" if base == BASE else f"{scheme}_b{base:g}_s{seed}"


def _loss(model: PositionTaskModel, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).reshape(-1, model.vocab), targets.reshape(-1),
                           ignore_index=-1)


def train_scheme(scheme: str, *, seed: int = 0, base: float = BASE,
                 steps: int = STEPS) -> PositionTaskModel:
    """Train one model on lengths ``TRAIN_MIN_LEN..TRAIN_MAX_LEN`` (Adam, one CPU thread)."""
    torch.manual_seed(seed)
    model = PositionTaskModel(scheme, base=base)

    def make_batch(step, generator):
        n = int(torch.randint(TRAIN_MIN_LEN, TRAIN_MAX_LEN + 1, (), generator=generator))
        return offset_copy_batch(BATCH, n, generator)

    train(model, make_batch, _loss, steps=steps, lr=LR, seed=seed, progress=False,
          description=model_key(scheme, seed, base), single_threaded=True)
    return model


def load_models() -> tuple[nn.ModuleDict, dict]:
    """The shipped trained models (keyed by :func:`model_key`) and the checkpoint's metadata."""
    models = nn.ModuleDict({model_key(s, seed, b): PositionTaskModel(s, base=b)
                            for s, seed, b in MODELS})
    return models, load_checkpoint(models, "positional_offsets")


@torch.no_grad()
def position_accuracy(model: PositionTaskModel, n: int = 4 * TRAIN_MAX_LEN, *, batch: int = 128,
                      seed: int = 1) -> torch.Tensor:
    """``(n, len(offsets))``: the share of ``batch`` random sequences in which the model gets
    position ``i``'s target for each offset; NaN where ``i < offset``."""
    require_positive_int("n", n)
    tokens, targets = offset_copy_batch(batch, n, torch.Generator().manual_seed(seed),
                                        vocab=model.vocab, offsets=model.offsets)
    model.eval()
    with single_thread():  # far faster for a model this small, on a busy machine
        correct = (model(tokens).argmax(-1) == targets).double().mean(0)  # (n, K)
    return correct.masked_fill(targets[0] < 0, math.nan)


