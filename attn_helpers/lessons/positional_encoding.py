"""Notebook 07's trained experiment: a task that needs two offsets, a tiny model with pluggable
position schemes, length extrapolation over several seeds, and the RoPE wrap-around study.

The task, "copy from 1 and 3 back": given random tokens ``x_0 .. x_{n-1}``, predict at every
position ``i`` both ``x_{i-1}`` and ``x_{i-3}`` (where they exist). The model is one causal
attention layer (3 heads of ``d_head = 8``) over token embeddings, a residual connection and a
linear read-out with one group of ``VOCAB`` logits per offset. Its scores see token contents only,
unless a position scheme is plugged in:

=============  ===================================================================
``none``       no position information (but see the NoPE effect below)
``sinusoidal`` fixed sin/cos encoding added to the token embeddings
``learned``    one trained vector per position (``MAX_LEN`` rows), added
``rope``       queries and keys rotated by :func:`attn_helpers.positional.apply_rope`
``alibi``      ``-slope * distance`` added to each head's scores
=============  ===================================================================

Every scheme trains with ``SEEDS`` on lengths ``TRAIN_MIN_LEN..TRAIN_MAX_LEN`` and is tested on
positions up to ``4 * TRAIN_MAX_LEN`` (:func:`position_accuracy`); RoPE also trains with the bases
``WRAP_BASES``, which set how fast its second pair turns (:func:`wrap_study`). The causal mask
alone leaks position (query ``i`` sees ``i + 1`` keys; Haviv et al., 2022, Kazemnejad et al.,
2023), so even ``none`` is right on the first positions. All the models ship in one checkpoint,
``python -m attn_helpers train positional_offsets`` re-trains it (a few minutes on one core).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import require_int_in, require_positive_int, require_tensor, shape
from ..attention import masked_softmax
from ..masks import causal_mask
from ..positional import LearnedPositionalEmbedding, alibi_bias, apply_rope, sinusoidal_encoding
from ..training import load_checkpoint, single_thread, train
from . import rope
from .positional_reach import REACH_LENGTHS, half_weight_reach, reach_claims  # re-exported
from .rope import collapse_position, wavelength  # re-exported: notebook 07 calls them from here

__all__ = [
    "SCHEMES", "VOCAB", "OFFSETS", "D_MODEL", "NUM_HEADS", "TRAIN_MIN_LEN", "TRAIN_MAX_LEN",
    "TEST_LENGTHS", "SEEDS", "WRAP_BASES", "WRAP_LENGTH", "CHECKPOINT",
    "offset_copy_batch", "PositionTaskModel", "model_key", "train_scheme", "train_all",
    "load_models", "position_accuracy", "accuracy_at", "extrapolation_table", "wavelength",
    "collapse_position", "attention_summary", "extrapolation_claims",
    "claims", "recipe", "REACH_LENGTHS", "half_weight_reach", "reach_claims",
]

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")
VOCAB, OFFSETS = 16, (1, 3)
D_MODEL, NUM_HEADS = 24, 3  # d_head = 8: RoPE pairs turn at 1, 0.1, 0.01, 0.001 rad per position
TRAIN_MIN_LEN, TRAIN_MAX_LEN = 8, 16
TEST_LENGTHS = (16, 32, 64)  # 1x, 2x and 4x the training length
MAX_LEN = 64  # rows of the learned table; rows 16..63 exist but are never trained
SEEDS, BASE = (0, 1, 2), 10000.0
WRAP_BASES = (625.0, BASE, 160000.0)  # second pair at 0.2, 0.1, 0.05 rad per position
WRAP_LENGTH, CHECKPOINT = 160, "positional_offsets"
STEPS, BATCH, LR = 1200, 64, 5e-3


def offset_copy_batch(batch: int, n: int, generator: torch.Generator, *, vocab: int = VOCAB,
                      offsets: tuple[int, ...] = OFFSETS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (batch, n), targets (batch, n, len(offsets)))``: uniform random tokens and
    ``targets[:, i, j] = tokens[:, i - offsets[j]]``, or ``-1`` (ignored) where ``i < offsets[j]``."""
    require_positive_int("batch", batch)
    require_positive_int("n", n)
    require_positive_int("vocab", vocab)
    tokens = torch.randint(0, vocab, (batch, n), generator=generator)
    targets = torch.full((batch, n, len(offsets)), -1)
    for j, k in enumerate(offsets):
        targets[:, k:, j] = tokens[:, : n - k]
    return tokens, targets


class PositionTaskModel(nn.Module):
    """One causal multi-head attention layer with a pluggable position scheme.

    ``forward(tokens (b, n)) -> logits (b, n, len(offsets), vocab)``: ``head(x + attention(x))``.
    :attr:`last_weights` keeps the attention weights ``(b, num_heads, n, n)`` of the latest call.
    ``base`` is RoPE's (only used by ``scheme="rope"``).
    """

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
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # no biases: a smaller checkpoint
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


def train_scheme(scheme: str, *, seed: int = 0, base: float = BASE, steps: int = STEPS,
                 progress: bool = False) -> PositionTaskModel:
    """Train one model on lengths ``TRAIN_MIN_LEN..TRAIN_MAX_LEN`` on one CPU thread (faster for a
    model this small, and the weights no longer depend on ``OMP_NUM_THREADS``)."""
    torch.manual_seed(seed)
    model = PositionTaskModel(scheme, base=base)

    def make_batch(step, generator):
        n = int(torch.randint(TRAIN_MIN_LEN, TRAIN_MAX_LEN + 1, (), generator=generator))
        return offset_copy_batch(BATCH, n, generator)

    train(model, make_batch, _loss, steps=steps, lr=LR, seed=seed, progress=progress,
          description=model_key(scheme, seed, base), single_threaded=True)
    return model


def _plan() -> list[tuple[str, int, float]]:
    """``(scheme, seed, base)`` of every shipped model: all schemes, then RoPE's other bases."""
    return ([(s, seed, BASE) for s in SCHEMES for seed in SEEDS]
            + [("rope", seed, b) for b in WRAP_BASES if b != BASE for seed in SEEDS])


def train_all(*, steps: int = STEPS) -> nn.ModuleDict:
    """Every shipped model, trained from scratch, in a ``ModuleDict`` keyed by :func:`model_key`:
    the models of one seed together (:func:`.positional_together.train_together`, the same
    arithmetic as :func:`train_scheme` for each, in fewer operations)."""
    from .positional_together import train_together  # it imports this module

    models = {}
    for seed in SEEDS:
        group = {}
        for s, _, b in [p for p in _plan() if p[1] == seed]:
            torch.manual_seed(seed)                     # as train_scheme builds each model
            group[model_key(s, seed, b)] = PositionTaskModel(s, base=b)
        train_together(list(group.values()), seed=seed, steps=steps)
        models.update(group)
    return nn.ModuleDict({model_key(s, seed, b): models[model_key(s, seed, b)]
                          for s, seed, b in _plan()})


def load_models(name: str = CHECKPOINT) -> tuple[nn.ModuleDict, dict]:
    """The shipped trained models (keyed by :func:`model_key`) and the checkpoint's metadata."""
    models = nn.ModuleDict({model_key(s, seed, b): PositionTaskModel(s, base=b)
                            for s, seed, b in _plan()})
    return models, load_checkpoint(models, name)


@torch.no_grad()
def position_accuracy(model: PositionTaskModel, n: int = 4 * TRAIN_MAX_LEN, *, batch: int = 128,
                      seed: int = 1) -> torch.Tensor:
    """``(n, len(offsets))`` share of ``batch`` sequences (drawn with ``seed``) in which the model
    gets position ``i``'s target for each offset; NaN where ``i < offset``. The model is causal,
    so row ``i`` is also what any sequence of length ``> i`` gets there."""
    require_positive_int("n", n)
    tokens, targets = offset_copy_batch(batch, n, torch.Generator().manual_seed(seed),
                                        vocab=model.vocab, offsets=model.offsets)
    model.eval()
    with single_thread():  # far faster for a model this small, on a busy machine
        correct = (model(tokens).argmax(-1) == targets).double().mean(0)  # (n, K)
    return correct.masked_fill(targets[0] < 0, math.nan)


def accuracy_at(curve: torch.Tensor, n: int, offset: int | None = None) -> float:
    """Accuracy on sequences of length ``n`` (positions ``0..n-1``), from a
    :func:`position_accuracy` curve; over all offsets, or column ``offset`` (an index)."""
    require_tensor("curve", curve, floating=True)
    require_int_in("n", n, 1, curve.shape[0])
    part = curve[:n] if offset is None else curve[:n, offset]
    return part.nanmean().item()


def extrapolation_table(curves: dict[str, torch.Tensor], lengths=TEST_LENGTHS,
                        offset: int | None = None) -> dict[str, dict[int, list[float]]]:
    """``{scheme: {n: [accuracy of each seed]}}`` for the base-10000 models of every scheme."""
    return {s: {n: [accuracy_at(curves[model_key(s, seed)], n, offset) for seed in SEEDS]
                for n in lengths} for s in SCHEMES}


@torch.no_grad()
def attention_summary(models: nn.ModuleDict, n: int = TRAIN_MAX_LEN, *, batch: int = 128,
                      seed: int = 1) -> dict[str, dict[int, torch.Tensor]]:
    """What the trained heads look at, on ``batch`` random sequences of length ``n``, per seed:

    * ``"none_first_key"``: ``(n,)`` weight of query ``i`` on key 0 in the ``none`` model (mean
      over sequences and heads) over its mean weight on keys ``1 .. i-1``; NaN for ``i < 2``;
    * ``"rope_offset_weight"``: ``(len(OFFSETS), num_heads)`` mean weight each RoPE head puts on
      the key ``k`` back, for each offset ``k``;
    * ``"sinusoidal_relative_gap"``: ``(num_heads,)`` diagonal spread over largest value of each
      sinusoidal head's ``(W_Q PE_p) . (W_K PE_q)`` (0: a function of ``q - p`` only).
    """
    tokens, _ = offset_copy_batch(batch, n, torch.Generator().manual_seed(seed))
    summary = {"none_first_key": {}, "rope_offset_weight": {}, "sinusoidal_relative_gap": {}}
    zero = torch.zeros(D_MODEL, dtype=torch.float64)
    for s in SEEDS:
        W = models[model_key("sinusoidal", s)].qkv.weight
        grids = [rope.position_scores("add, then project", *rope.head_projections(W, NUM_HEADS, h),
                                      zero, n) for h in range(NUM_HEADS)]  # (n, n) each
        summary["sinusoidal_relative_gap"][s] = torch.tensor(
            [rope.diagonal_spread(g) / g.abs().max().item() for g in grids])
        none, rotary = models[model_key("none", s)].eval(), models[model_key("rope", s)].eval()
        with single_thread():
            none(tokens)
            rotary(tokens)
        w = none.last_weights.mean((0, 1))  # (n, n)
        summary["none_first_key"][s] = torch.tensor(
            [w[i, 0] / w[i, 1:i].mean() if i >= 2 else math.nan for i in range(n)])  # (n,)
        weights = rotary.last_weights.mean(0)  # (h, n, n)
        summary["rope_offset_weight"][s] = torch.stack(
            [weights.diagonal(-k, -2, -1).mean(-1) for k in OFFSETS])  # (K, h)
    return summary


def extrapolation_claims(curves: dict[str, torch.Tensor],
                         attention: dict[str, dict[int, torch.Tensor]]) -> dict[str, bool]:
    """What notebook 07 says about the schemes' accuracy, each claim with its verdict.

    ``curves``: :func:`position_accuracy` (``n = 64``) of every base-10000 model by :func:`model_key`;
    ``attention``: :func:`attention_summary`. "Every seed above" is checked on the worst seed (min),
    "every seed below" on the best (max).
    """
    t, chance = extrapolation_table(curves), 1 / VOCAB
    lo = {s: {n: min(v) for n, v in row.items()} for s, row in t.items()}
    hi = {s: {n: max(v) for n, v in row.items()} for s, row in t.items()}
    one, three = OFFSETS.index(1), OFFSETS.index(3)
    by_offset = {j: extrapolation_table(curves, (16, 64), offset=j) for j in (one, three)}
    kept = {s: [(t[s][64][i] - chance) / (t[s][16][i] - chance) for i in range(len(SEEDS))]
            for s in SCHEMES}  # share of the above-chance accuracy kept from 16 to 64 tokens
    seeds = {s: [curves[model_key(s, seed)] for seed in SEEDS] for s in SCHEMES}
    first_key = [w[2:] for w in attention["none_first_key"].values()]  # ratios for i >= 2
    return {
        "without positions every seed stays below 0.5 at the training length":
            hi["none"][16] < 0.5,
        "sinusoidal, learned and RoPE: every seed above 0.95 at the training length":
            all(lo[s][16] > 0.95 for s in ("sinusoidal", "learned", "rope")),
        "positions add more than 0.5 accuracy at the training length (worst seed vs best none)":
            min(lo[s][16] for s in ("sinusoidal", "learned", "rope")) - hi["none"][16] > 0.5,
        "NoPE effect: without positions, position 1 is solved (> 0.95) by every seed":
            min(c[1, one].item() for c in seeds["none"]) > 0.95,
        "NoPE effect fades: without positions, every seed is below 0.15 on positions 32-63":
            max(c[32:].nanmean().item() for c in seeds["none"]) < 0.15,
        "without positions, key 0 gets 0.9-1.1 times the mean weight on keys 1..i-1 (i >= 2)":
            all(((w > 0.9) & (w < 1.1)).all() for w in first_key),
        "RoPE: in every seed one head puts over half its weight on 1 back, one on 3 back":
            all(w.max(-1).values.min() > 0.5 for w in attention["rope_offset_weight"].values()),
        "sinusoidal: every trained head's position term varies along its diagonals (> 0.5 max)":
            min(g.min().item() for g in attention["sinusoidal_relative_gap"].values()) > 0.5,
        "ALiBi (one layer) learns offset 1: every seed above 0.75 at the training length":
            min(by_offset[one]["alibi"][16]) > 0.75,
        "ALiBi (one layer) is no better than no positions at offset 3 (within 0.03)":
            max(by_offset[three]["alibi"][16]) < min(by_offset[three]["none"][16]) + 0.03,
        "learned and sinusoidal: every seed below 0.7 at twice the training length":
            hi["learned"][32] < 0.7 and hi["sinusoidal"][32] < 0.7,
        "learned: every seed below 0.15 already on positions 16-23":
            max(c[16:24].nanmean().item() for c in seeds["learned"]) < 0.15,
        "learned and sinusoidal: every seed below 0.15 on positions 24-63":
            max(c[24:].nanmean().item() for c in seeds["learned"] + seeds["sinusoidal"]) < 0.15,
        "RoPE: every seed above 0.9 at twice the training length":
            lo["rope"][32] > 0.9,
        "RoPE: every seed above 0.9 on positions 16-31 alone, and above 0.65 at each of them":
            all(c[16:32].nanmean().item() > 0.9 and c[16:32].nanmean(-1).min().item() > 0.65
                for c in seeds["rope"]),
        "RoPE: every seed below 0.7 at four times the training length":
            hi["rope"][64] < 0.7,
        "every scheme and seed is worse at 4x than at 1x the training length":
            all(t[s][64][i] < t[s][16][i] for s in SCHEMES for i in range(len(SEEDS))),
        "from 16 to 64 tokens ALiBi keeps the largest share of its above-chance accuracy":
            min(kept["alibi"]) > max(max(kept[s]) for s in SCHEMES if s != "alibi"),
        "at 4x, ALiBi's worst seed beats every other model on offset 1":
            min(by_offset[one]["alibi"][64])
            > max(max(row[64]) for s, row in by_offset[one].items() if s != "alibi"),
    }


def claims(curves: dict[str, torch.Tensor], attention: dict[str, dict[int, torch.Tensor]],
           wrap: dict[float, dict]) -> dict[str, bool]:
    """Every claim notebook 07 makes about its trained models: :func:`extrapolation_claims` and
    :func:`wrap_claims` together."""
    from .positional_wrap import wrap_claims  # it imports this module

    return {**extrapolation_claims(curves, attention), **wrap_claims(wrap)}


def recipe():
    """``python -m attn_helpers train positional_offsets``: train every model of the lesson."""
    models = train_all()
    curves = {key: position_accuracy(model) for key, model in models.items()}
    return models, {"task": "copy from offsets 1 and 3", "steps": STEPS, "batch": BATCH, "lr": LR,
                    "train_lengths": [TRAIN_MIN_LEN, TRAIN_MAX_LEN], "seeds": list(SEEDS),
                    "accuracy": {key: {str(n): round(accuracy_at(c, n), 4) for n in TEST_LENGTHS}
                                 for key, c in curves.items()}}


_WRAP = ("wrap_study", "offset_head_crossing", "wrap_claims", "CROSSING_TOLERANCE")


def __getattr__(name: str):
    """The wrap-around study lives in :mod:`.positional_wrap` (it reads this module's models and
    constants); its names are reachable from here too, as notebook 07 calls them."""
    if name in _WRAP:
        from . import positional_wrap

        return getattr(positional_wrap, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
