"""Notebook 04's toy task: at every position ``i >= 1`` of ``n`` random letters, name the previous
letter ``x[i-1]`` and the first letter ``x[0]``; a tiny transformer whose heads can split the two.
The shipped checkpoints come from ``studies/multi_head_seeds.py``, which asserts :func:`study_claims`.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from .._checks import require_int_in, require_positive_int, require_tensor, shape
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from ..training import load_checkpoint, train

__all__ = [
    "RELATIONS", "TaskConfig", "CONFIG", "ONE_HEAD", "LOSS_EVERY", "STUDY_SEEDS",
    "make_batch", "token_labels", "TwoRelationModel", "relation_accuracy", "head_relation_scores",
    "evaluation_batch", "train_two_relations", "load_two_relations", "load_one_head", "steps_to",
    "ablated_accuracy", "ablation_falls", "heads_split", "study_claims",
    "AblationData", "AblationFrame", "ablation_data", "ablation_frame",
]

RELATIONS = ("previous", "first")
LOSS_EVERY = 10             # the seed study keeps the mean loss of every 10 steps
STUDY_SEEDS = tuple(range(24))


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of the task and the model (defaults: the checkpoint's)."""

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
ONE_HEAD = replace(CONFIG, num_heads=1)     # the same task, d_model, MLP, steps and learning rate


def make_batch(batch: int, generator: torch.Generator, *, vocab: int = CONFIG.vocab,
               length: int = CONFIG.length) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens (batch, length)``, ``targets (batch, length, 2)``: previous, first letter (-100 at 0)."""
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
    """Embeddings + positions, a causal :class:`MultiHeadAttention`, a residual MLP, two read-outs."""

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
        x = self.embed(tokens) + self.position[:n]                     # (b, n, d)
        attended, weights = self.attention(x, x, x, causal_mask(n), head_mask=head_mask)
        h = x + attended
        h = h + self.mlp(self.norm(h))
        logits = self.readout(h).unflatten(-1, (2, self.config.vocab))  # (b, n, 2, vocab)
        return logits, weights


def relation_accuracy(model: TwoRelationModel, tokens: torch.Tensor, targets: torch.Tensor,
                      head_mask: torch.Tensor | None = None) -> dict[str, float]:
    """``{"previous": .., "first": ..}``: share of positions ``i >= 2`` (not 1: there x0 = x[i-1])."""
    with torch.no_grad():
        logits, _ = model(tokens, head_mask=head_mask)
    correct = logits.argmax(-1)[:, 2:] == targets[:, 2:]
    return {name: correct[..., r].float().mean().item() for r, name in enumerate(RELATIONS)}


def head_relation_scores(weights: torch.Tensor) -> torch.Tensor:
    """``weights (b, h, n, n) -> (h, 2)``: mean weight on key ``i-1``, on key 0 (queries ``i >= 2``)."""
    require_tensor("weights", weights, floating=True)
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 3:
        raise ValueError(f"weights must be (b, h, n, n) with n >= 3, got shape {shape(weights)}")
    rows = torch.arange(2, weights.shape[-1])
    previous = weights[:, :, rows, rows - 1].mean(dim=(0, 2))
    first = weights[:, :, rows, 0].mean(dim=(0, 2))
    return torch.stack([previous, first], dim=1)


def evaluation_batch(config: TaskConfig = CONFIG, seed: int = 1234):
    """A fixed held-out batch of 512: ``(tokens, targets)``."""
    return make_batch(512, torch.Generator().manual_seed(seed), vocab=config.vocab,
                      length=config.length)


def _loss(model: nn.Module, tokens, targets) -> torch.Tensor:
    logits, _ = model(tokens)
    return F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=-100)


def train_two_relations(config: TaskConfig = CONFIG, *, build=None):
    """``(model, TrainResult)``: a :class:`TwoRelationModel` (or ``build(config)``), one thread."""
    torch.manual_seed(config.seed)
    model = TwoRelationModel(config) if build is None else build(config)

    def batch(_step, generator):
        return make_batch(config.batch, generator, vocab=config.vocab, length=config.length)

    result = train(model, batch, _loss, steps=config.steps, lr=config.lr, seed=config.seed,
                   progress=False, description="two relations", single_threaded=True)
    return model, result


def load_two_relations() -> tuple[TwoRelationModel, dict]:
    """The shipped two-head model (seed 0) and its metadata."""
    model = TwoRelationModel(CONFIG)
    return model, load_checkpoint(model, "multihead_two_relations")


def load_one_head() -> tuple[TwoRelationModel, dict]:
    """The shipped one-head model (seed 0); its metadata's ``"study"`` holds the seed study's rows."""
    model = TwoRelationModel(ONE_HEAD)
    return model, load_checkpoint(model, "multihead_one_head")


def steps_to(run: dict, loss: float) -> int:
    """The step where a loss curve first falls below ``loss``, else ``CONFIG.steps + LOSS_EVERY``."""
    blocks = (i for i, mean in enumerate(run["loss_curve"]) if mean < loss)
    return LOSS_EVERY * (next(blocks, CONFIG.steps // LOSS_EVERY) + 1)


def ablated_accuracy(model: TwoRelationModel, tokens, targets, head: int, kind: str) -> dict[str, float]:
    """:func:`relation_accuracy` with ``head``'s output replaced: ``kind="zero"`` by 0 (``head_mask``),
    ``"mean"`` by its mean over the batch at each position (a hook on ``W_O``'s input, Concat(heads))."""
    h, d = model.config.num_heads, model.config.d_model // model.config.num_heads
    require_int_in("head", head, 0, h - 1)
    if kind == "zero":
        return relation_accuracy(model, tokens, targets, torch.arange(h).ne(head).float())
    if kind != "mean":
        raise ValueError(f'kind must be "zero" or "mean", got {kind!r}')
    cols = slice(head * d, (head + 1) * d)

    def replace(_module, args):                                   # args[0]: Concat(heads), (b, n, d)
        concat = args[0].clone()
        concat[..., cols] = concat[..., cols].mean(dim=0)         # (n, d_head): mean over sequences
        return (concat,)

    hook = model.attention.out_proj.register_forward_pre_hook(replace)
    try:
        return relation_accuracy(model, tokens, targets)
    finally:
        hook.remove()


def ablation_falls(ablation: dict, lost_below: float, kept_above: float = 0.95) -> dict[str, bool]:
    """Per kind: for each relation, removing some head sends it below ``lost_below``, the other above
    ``kept_above``."""
    def falls(accuracy, lost, kept):
        return accuracy[lost] < lost_below and accuracy[kept] > kept_above

    return {kind: all(any(falls(acc, lost, kept) for acc in accs)
                      for lost, kept in (RELATIONS, RELATIONS[::-1]))
            for kind, accs in ablation.items()}


def heads_split(scores) -> bool:
    """``scores (h, 2)``: one head > 0.5 on key i-1 and < 0.25 on key 0, another the reverse."""
    scores = torch.as_tensor(scores)
    previous, first = int(scores[:, 0].argmax()), int(scores[:, 1].argmax())
    return bool(previous != first and scores[previous, 0] > 0.5 and scores[previous, 1] < 0.25
                and scores[first, 1] > 0.5 and scores[first, 0] < 0.25)


def study_claims(study: list[dict]) -> dict[str, dict[str, bool]]:
    """Notebook 04's claims on the seed study, by group. Rates leave room for seeds near an edge."""
    runs = {h: sorted((r for r in study if r["num_heads"] == h), key=lambda r: r["seed"])
            for h in (1, 2)}
    pairs = list(zip(runs[1], runs[2], strict=True))
    n = len(pairs)
    split = [heads_split(r["relation_scores"]) for r in runs[2]]
    blends = [r["relation_scores"][0] for r in runs[1]]          # (previous, first) per seed
    gain = [steps_to(one, 0.01) - steps_to(two, 0.01) for one, two in pairs]   # steps sooner
    gain_split = sorted(g for g, s in zip(gain, split, strict=True) if s)
    return {"two heads": {
        f"two heads name both letters (> 99%) on every seed ({n} seeds)":
            all(min(r["accuracy"].values()) > 0.99 for r in runs[2]),
        f"the heads split the relations on >= {n - 4} of {n} seeds (one head > 0.5 of its weight on "
        "key i-1 and < 0.25 on key 0, another the reverse)": sum(split) >= n - 4,
        "...but not on every seed": not all(split),
        "on every seed whose heads split, zero- and mean-ablation: without its head a relation falls "
        "below 0.3 (chance 1/8), the other stays > 0.95":
            all(all(ablation_falls(r["ablation"], 0.3).values())
                for r, s in zip(runs[2], split, strict=True) if s),
        "which head takes which relation changes with the seed":
            len({int(torch.tensor(r["relation_scores"])[:, 0].argmax()) for r in runs[2]}) == 2,
    }, "one head": {
        "one head also names both letters (> 99%, every seed): two are not needed":
            all(min(r["accuracy"].values()) > 0.99 for r in runs[1]),
        "the single head blends: > 0.2 of its weight on each relation's key (every seed)":
            all(min(b) > 0.2 for b in blends),
        "...unequally: > 0.2 more on the first key than on the previous (every seed)":
            all(first - previous > 0.2 for previous, first in blends),
    }, "speed": {
        f"two heads get the loss below 0.01 at least 50 steps sooner than one on >= {n - 6} of {n} "
        "seeds": sum(g >= 50 for g in gain) >= n - 6,
        f"two heads end with a > 3x lower training loss than one on >= {n - 4} of {n} seeds":
            sum(two["final_loss"] * 3 < one["final_loss"] for one, two in pairs) >= n - 4,
        "the speed-up goes with the split: every seed without one gains over 50 steps less than the "
        "median seed with one": bool(gain_split) and all(
            g + 50 < gain_split[len(gain_split) // 2] for g, s in zip(gain, split, strict=True)
            if not s),
    }}


@dataclass(frozen=True)
class AblationData:
    """The batch and weights; per ``heads_on`` tuple, ``predictions (m, n, 2)`` and ``accuracy``."""

    tokens: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    predictions: dict
    accuracy: dict


@dataclass(frozen=True)
class AblationFrame:
    """One example with some heads off, and the batch's ``accuracy`` with these heads."""

    weights: torch.Tensor
    heads_on: tuple
    labels: list
    predictions: torch.Tensor
    correct: torch.Tensor
    accuracy: dict


def ablation_data(model: TwoRelationModel, tokens: torch.Tensor, targets: torch.Tensor):
    """Run ``model`` once per subset of heads (``2^h`` runs)."""
    require_tensor("tokens", tokens)
    if tokens.dim() != 2 or targets.shape != (*tokens.shape, 2):
        raise ValueError(f"tokens must be (m, n) and targets (m, n, 2); got {shape(tokens)} and "
                         f"{shape(targets)}")
    predictions, accuracy = {}, {}
    with torch.no_grad():
        _, weights = model(tokens)
        for heads_on in itertools.product((True, False), repeat=model.config.num_heads):
            logits, _ = model(tokens, head_mask=torch.tensor(heads_on))
            predictions[heads_on] = logits.argmax(-1)                       # (m, n, 2)
            accuracy[heads_on] = relation_accuracy(model, tokens, targets, torch.tensor(heads_on))
    return AblationData(tokens, targets, weights, predictions, accuracy)


def ablation_frame(data: AblationData, example: int, heads_on) -> AblationFrame:
    """Example ``example`` with the heads where ``heads_on`` is False switched off."""
    m, h = data.weights.shape[:2]
    require_int_in("example", example, 0, m - 1)
    heads_on = tuple(bool(on) for on in heads_on)
    if heads_on not in data.predictions:
        raise ValueError(f"heads_on must be {h} bools (one per head), got {heads_on!r}")
    predictions = data.predictions[heads_on][example]                       # (n, 2)
    targets = data.targets[example]
    return AblationFrame(data.weights[example], heads_on, token_labels(data.tokens[example]),
                         predictions, (predictions == targets) & (targets != -100),
                         data.accuracy[heads_on])
