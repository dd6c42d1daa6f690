"""A trained task that needs positions, a tiny model with pluggable position schemes, and the
length-extrapolation experiment of notebook 07.

The task, "previous token": given random tokens ``x_0 .. x_{n-1}``, predict ``x_{i-1}`` at every
position ``i >= 1``. The model is one causal attention layer (a few heads) over token embeddings
plus a linear read-out. Its attention scores depend on token contents only, unless a position
scheme is plugged in:

=============  ===================================================================
``none``       no position information at all
``sinusoidal`` fixed sin/cos encoding added to the token embeddings
``learned``    one trained vector per position (table of ``max_len`` rows), added
``rope``       queries and keys rotated by :func:`attn_helpers.positional.apply_rope`
``alibi``      ``-slope * distance`` added to each head's scores
=============  ===================================================================

Without positions the layer can only tell *which* tokens came before, not *where*, so it cannot
find the previous one. The models train on lengths ``4..TRAIN_MAX_LEN`` and are tested on longer
inputs (:func:`extrapolation_table`). ``python -m attn_helpers.train positional_previous_token``
re-trains the shipped checkpoint (all five models, a few seconds each).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import require_positive_int, require_tensor, shape
from ..attention import masked_softmax
from ..masks import causal_mask
from ..positional import LearnedPositionalEmbedding, alibi_bias, apply_rope, sinusoidal_encoding
from ..training import load_checkpoint, train

__all__ = [
    "SCHEMES",
    "VOCAB",
    "TRAIN_MIN_LEN",
    "TRAIN_MAX_LEN",
    "TEST_LENGTHS",
    "CHECKPOINT",
    "previous_token_batch",
    "PositionTaskModel",
    "evaluate_accuracy",
    "train_scheme",
    "train_all",
    "load_models",
    "extrapolation_table",
    "extrapolation_claims",
]

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")
VOCAB = 16
TRAIN_MIN_LEN, TRAIN_MAX_LEN = 4, 16
TEST_LENGTHS = (16, 32, 64)
MAX_LEN = 64  # rows of the learned table: positions past TRAIN_MAX_LEN exist but are never trained
CHECKPOINT = "positional_previous_token"
STEPS, BATCH, LR = 600, 64, 5e-3


def previous_token_batch(
    batch: int, n: int, generator: torch.Generator, vocab: int = VOCAB
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (batch, n), targets (batch, n))``: uniform random tokens; ``targets[:, i] =
    tokens[:, i-1]`` and ``targets[:, 0] = -1`` (no previous token; ignored by loss and accuracy)."""
    require_positive_int("batch", batch)
    require_positive_int("n", n)
    require_positive_int("vocab", vocab)
    tokens = torch.randint(0, vocab, (batch, n), generator=generator)
    targets = torch.full_like(tokens, -1)
    targets[:, 1:] = tokens[:, :-1]
    return tokens, targets


class PositionTaskModel(nn.Module):
    """One causal multi-head attention layer with a pluggable position scheme.

    ``forward(tokens (b, n)) -> logits (b, n, vocab)``; :attr:`last_weights` keeps the attention
    weights ``(b, num_heads, n, n)`` of the latest call.
    """

    def __init__(self, scheme: str, *, vocab: int = VOCAB, d_model: int = 32, num_heads: int = 4,
                 max_len: int = MAX_LEN):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into num_heads={num_heads} heads of "
                             "even size")
        self.scheme, self.vocab, self.d_model, self.num_heads = scheme, vocab, d_model, num_heads
        self.max_len = max_len
        self.embed = nn.Embedding(vocab, d_model)
        if scheme == "learned":
            self.positions = LearnedPositionalEmbedding(max_len, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, vocab)
        self.last_weights: torch.Tensor | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        require_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be an integer tensor (batch, n), got {tokens.dtype} "
                             f"shape {shape(tokens)}")
        b, n = tokens.shape
        x = self.embed(tokens)
        if self.scheme == "sinusoidal":
            x = x + sinusoidal_encoding(n, self.d_model).to(x.dtype)
        elif self.scheme == "learned":
            x = self.positions(x)
        h, d_head = self.num_heads, self.d_model // self.num_heads
        q, k, v = self.qkv(x).view(b, n, 3, h, d_head).permute(2, 0, 3, 1, 4)  # (b, h, n, d_head)
        if self.scheme == "rope":
            q, k = apply_rope(q), apply_rope(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
        if self.scheme == "alibi":
            scores = scores + alibi_bias(n, h).to(scores.dtype)
        weights = masked_softmax(scores, causal_mask(n))
        self.last_weights = weights.detach()
        mixed = (weights @ v).transpose(1, 2).reshape(b, n, self.d_model)
        return self.head(x + self.out(mixed))


def _loss(model: PositionTaskModel, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, model.vocab), targets.reshape(-1), ignore_index=-1)


@torch.no_grad()
def evaluate_accuracy(model: PositionTaskModel, n: int, *, batch: int = 256, seed: int = 1) -> float:
    """Share of positions ``1..n-1`` where the model predicts the previous token, on ``batch``
    fresh sequences of length ``n`` drawn with ``seed``."""
    tokens, targets = previous_token_batch(batch, n, torch.Generator().manual_seed(seed), model.vocab)
    model.eval()
    predictions = model(tokens).argmax(-1)
    return (predictions[:, 1:] == targets[:, 1:]).double().mean().item()


def train_scheme(scheme: str, *, steps: int = STEPS, seed: int = 0,
                 progress: bool = False) -> PositionTaskModel:
    """Train one model on the previous-token task, lengths ``TRAIN_MIN_LEN..TRAIN_MAX_LEN``.

    Runs on one CPU thread (restored afterwards): for a model this small, extra threads only add
    synchronisation (on a busy 2-core machine 600 steps took ~3 s on one thread, ~60 s on two),
    and one thread makes the run reproducible whatever ``OMP_NUM_THREADS`` says.
    """
    torch.manual_seed(seed)
    model = PositionTaskModel(scheme)

    def make_batch(step, generator):
        n = int(torch.randint(TRAIN_MIN_LEN, TRAIN_MAX_LEN + 1, (), generator=generator))
        return previous_token_batch(BATCH, n, generator)

    train(model, make_batch, _loss, steps=steps, lr=LR, seed=seed, progress=progress,
          description=f"previous token, {scheme}", single_threaded=True)
    return model


def train_all(*, steps: int = STEPS, seed: int = 0) -> nn.ModuleDict:
    """The five models, one per scheme, in a ``ModuleDict`` keyed by scheme name."""
    return nn.ModuleDict({scheme: train_scheme(scheme, steps=steps, seed=seed) for scheme in SCHEMES})


def _empty_models() -> nn.ModuleDict:
    return nn.ModuleDict({scheme: PositionTaskModel(scheme) for scheme in SCHEMES})


def load_models(name: str = CHECKPOINT) -> tuple[nn.ModuleDict, dict]:
    """The shipped trained models (``ModuleDict`` by scheme) and the checkpoint's metadata."""
    models = _empty_models()
    metadata = load_checkpoint(models, name)
    return models, metadata


def extrapolation_table(models: nn.ModuleDict, lengths=TEST_LENGTHS, *,
                        seed: int = 1) -> dict[str, dict[int, float]]:
    """``{scheme: {n: accuracy}}`` for every model and test length (same test data for all)."""
    return {scheme: {n: evaluate_accuracy(model, n, seed=seed) for n in lengths}
            for scheme, model in models.items()}


def extrapolation_claims(table: dict[str, dict[int, float]]) -> dict[str, bool]:
    """What notebook 07 says about :func:`extrapolation_table`'s result, each claim with its verdict.

    ``table`` must hold the lengths 16, 32 and 64 (16 = ``TRAIN_MAX_LEN``). The thresholds leave
    margins, so a re-training on another machine supports the same sentences.
    """
    t = table
    with_positions = ("sinusoidal", "learned", "rope")
    return {
        "without positions the model stays below 0.5 at the training length":
            t["none"][16] < 0.5,
        "sinusoidal, learned and RoPE all exceed 0.9 at the training length":
            all(t[s][16] > 0.9 for s in with_positions),
        "positions add more than 0.5 accuracy at the training length":
            max(t[s][16] for s in with_positions) - t["none"][16] > 0.5,
        "learned and sinusoidal drop below 0.7 at twice the training length":
            t["learned"][32] < 0.7 and t["sinusoidal"][32] < 0.7,
        "RoPE stays above 0.95 at twice the training length":
            t["rope"][32] > 0.95,
        "every scheme is worse at 64 tokens than at 16":
            all(row[64] < row[16] for row in t.values()),
        "at 64 tokens RoPE and ALiBi both beat learned and sinusoidal":
            min(t["rope"][64], t["alibi"][64]) > max(t["learned"][64], t["sinusoidal"][64]),
        "ALiBi loses less from 16 to 64 tokens than learned and sinusoidal":
            t["alibi"][16] - t["alibi"][64]
            < min(t[s][16] - t[s][64] for s in ("learned", "sinusoidal")),
    }


def recipe():
    """``python -m attn_helpers train positional_previous_token``: train every scheme."""
    models = train_all()
    table = extrapolation_table(models)
    return models, {"task": "previous token", "steps": STEPS, "batch": BATCH, "lr": LR,
                    "train_lengths": [TRAIN_MIN_LEN, TRAIN_MAX_LEN],
                    "accuracy": {s: {str(n): round(a, 4) for n, a in row.items()}
                                 for s, row in table.items()}}
