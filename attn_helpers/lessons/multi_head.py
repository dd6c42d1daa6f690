"""Notebook 04's toy task: two relations at once, and a tiny transformer whose heads split them.

The task: a sequence of ``n`` random letters. At every position ``i >= 1`` the model must name
two things, the **previous** letter ``x[i-1]`` and the **first** letter ``x[0]``. No single
attention pattern puts all its weight on both (one looks one step back, the other always at
position 0): two heads can give one relation to each, while one head has to blend them (and, at
this size, still solves the task that way). Head ablation (switching one head off) shows which
head carries which relation.

Re-create the shipped checkpoint with ``python -m attn_helpers train multihead_two_relations``.
The one-head control and the seed study live in :mod:`attn_helpers.lessons.multi_head_study`;
:func:`claims` states what notebook 04 says, with the thresholds below; :func:`mask_claims`
(re-exported from :mod:`.multi_head_masks`) its statements about PyTorch's mask conventions.
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
from .multi_head_masks import mask_claims

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
    "head_contributions",
    "mask_claims",
    "claims",
    "steps_to",
]

RELATIONS = ("previous", "first")
CHECKPOINT = "multihead_two_relations"

# The thresholds of the claims, defined once (see claims()).
ACCURACY_MIN = 0.99         # "names both letters": accuracy per relation above this
FOCUS = (0.7, 0.9, 0.1)     # specialised: previous head > 0.7 on i-1, first head > 0.9 on 0, < 0.1 else
ABLATED = (0.03, 0.95)      # without its head: a relation within 0.03 of chance, the other > 0.95
BLEND_MIN = 0.2             # one head blends: more than 0.2 of its weight on each relation's key,
BLEND_GAP = 0.2             # ...and more than 0.2 more on the first key than on the previous one
LOSS_RATIO = 3              # two heads end with a training loss 3x lower than one head
LOSS_EVERY = 10             # the seed study keeps the mean loss of every 10 steps
SOONER = (0.01, 50)         # ...and get below a loss of 0.01 at least 50 steps sooner


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


def head_contributions(attention: MultiHeadAttention, heads: torch.Tensor) -> torch.Tensor:
    r"""What each head adds to the output: ``head_i W^O_i``, ``(b, h, n, d_head) -> (b, h, n, d_model)``.

    :math:`W^O` (``out_proj.weight.T``, rows = input features) cut into ``h`` blocks of
    ``d_head`` rows gives :math:`W^O_i`, so
    :math:`\mathrm{Concat}(\mathrm{head}_1..\mathrm{head}_h) W^O = \sum_i \mathrm{head}_i W^O_i`
    (plus the bias): switching head ``i`` off removes exactly its term.
    """
    require_tensor("heads", heads, floating=True)
    h, d_head = attention.num_heads, attention.d_head
    if heads.dim() != 4 or heads.shape[1] != h or heads.shape[-1] != d_head:
        raise ValueError(f"heads must be (b, {h}, n, {d_head}), got shape {shape(heads)}")
    w_o = attention.out_proj.weight.T.unflatten(0, (h, d_head))      # (h, d_head, d_model)
    return torch.einsum("bhnd,hde->bhne", heads, w_o)                 # (b, h, n, d_model)


def head_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's rows: ``(b, h, n_q, n_k) -> (h,)``."""
    require_tensor("weights", weights, floating=True)
    if weights.dim() != 4:
        raise ValueError(f"weights must be (b, h, n_q, n_k), got shape {shape(weights)}")
    return attention_entropy(weights).mean(dim=(0, 2))


def train_two_relations(config: TaskConfig = CONFIG, *, progress: bool = False, build=None):
    """Train :class:`TwoRelationModel` from scratch (seeded by ``config.seed``), on one thread
    (see :func:`attn_helpers.training.single_thread`). ``build(config)`` may build another model
    for the task (notebook 04's exercise swaps in the learner's attention). -> ``(model, TrainResult)``.
    """
    torch.manual_seed(config.seed)
    model = TwoRelationModel(config) if build is None else build(config)

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


def _focused(scores) -> bool:
    scores = torch.as_tensor(scores)
    previous, first = int(scores[:, 0].argmax()), int(scores[:, 1].argmax())
    return bool(previous != first and scores[previous, 0] > FOCUS[0] and scores[first, 1] > FOCUS[1]
                and scores[previous, 1] < FOCUS[2] and scores[first, 0] < FOCUS[2])


def steps_to(run: dict, loss: float) -> int:
    """The step at which a study run's loss curve (means of :data:`LOSS_EVERY` steps) first falls
    below ``loss`` (the end of that block), or ``CONFIG.steps + 1`` if it never does."""
    blocks = (i for i, mean in enumerate(run["loss_curve"]) if mean < loss)
    return LOSS_EVERY * (next(blocks, CONFIG.steps // LOSS_EVERY) + 1)


def claims(model: TwoRelationModel | None = None, one_head: TwoRelationModel | None = None,
           study: list[dict] | None = None, *, part: str | None = None) -> dict[str, bool]:
    """Notebook 04's statements about the two-relation task, checked on the two-head ``model``,
    the one-head ``one_head`` (same task, ``d_model``, parameters and steps), both measured now on
    :func:`evaluation_batch`, and ``study``, the stored rows of
    :func:`attn_helpers.lessons.multi_head_study.seed_study` (one and two heads, several seeds).

    ``part``: ``"two_heads"`` (needs ``model``), ``"one_head"`` (needs ``one_head``) or
    ``"study"`` (needs ``study``: the recorded results); ``None`` for all three."""
    parts = ("two_heads", "one_head", "study") if part is None else (part,)
    if not set(parts) <= {"two_heads", "one_head", "study"}:
        raise ValueError(f"part must be 'two_heads', 'one_head', 'study' or None, got {part!r}")
    result = {}
    if "two_heads" in parts:
        tokens, targets = evaluation_batch(model.config)
        with torch.no_grad():
            scores = head_relation_scores(model(tokens)[1])               # (2, 2)
        previous, first = int(scores[:, 0].argmax()), int(scores[:, 1].argmax())
        table = ablation_table(model, tokens, targets)
        no_prev, no_first = table[f"without head {previous}"], table[f"without head {first}"]
        chance = 1 / model.config.vocab

        def at_chance(accuracy: float) -> bool:
            return abs(accuracy - chance) < ABLATED[0]

        result.update({
            f"the shipped two-head model names both letters (> {ACCURACY_MIN:.0%} held-out)":
                min(table["all heads"].values()) > ACCURACY_MIN,
            f"the heads specialise (> {FOCUS[0]} on i-1, > {FOCUS[1]} on 0, < {FOCUS[2]} across)":
                _focused(scores),
            f"without its head a relation falls to chance (within {ABLATED[0]} of "
            f"1/{model.config.vocab}), the other stays above {ABLATED[1]}":
                at_chance(no_prev["previous"]) and no_prev["first"] > ABLATED[1]
                and at_chance(no_first["first"]) and no_first["previous"] > ABLATED[1],
        })
    if "one_head" in parts:
        tokens, targets = evaluation_batch(one_head.config)
        with torch.no_grad():
            previous_, first_ = head_relation_scores(one_head(tokens)[1])[0].tolist()
        result.update({
            f"the shipped one-head model names both letters too (> {ACCURACY_MIN:.0%} held-out)":
                min(relation_accuracy(one_head, tokens, targets).values()) > ACCURACY_MIN,
            f"its head puts > {BLEND_MIN} of its weight on each relation's key (a blend), "
            f"> {BLEND_GAP} more on the first":
                min(previous_, first_) > BLEND_MIN and first_ - previous_ > BLEND_GAP,
        })
    if "study" in parts:
        runs = {h: sorted((r for r in study if r["num_heads"] == h), key=lambda r: r["seed"])
                for h in (1, 2)}
        pairs = list(zip(runs[1], runs[2], strict=True))
        blends = [r["relation_scores"][0] for r in runs[1]]
        result.update({
            f"two heads name both letters (> {ACCURACY_MIN:.0%}, every seed)":
                all(min(r["accuracy"].values()) > ACCURACY_MIN for r in runs[2]),
            f"one head also names both letters (> {ACCURACY_MIN:.0%}, every seed): two are not "
            "needed": all(min(r["accuracy"].values()) > ACCURACY_MIN for r in runs[1]),
            f"the single head blends: > {BLEND_MIN} of its weight on each relation's key (every "
            "seed)": all(min(b) > BLEND_MIN for b in blends),
            f"...unequally: > {BLEND_GAP} more on the first key than on the previous (every seed)":
                all(first_ - previous_ > BLEND_GAP for previous_, first_ in blends),
            f"with two heads the relations split between them on every seed ({len(runs[2])} seeds)":
                all(_focused(r["relation_scores"]) for r in runs[2]),
            "which head takes which relation changes with the seed":
                len({int(torch.tensor(r["relation_scores"])[:, 0].argmax()) for r in runs[2]}) == 2,
            f"two heads end with a > {LOSS_RATIO}x lower training loss than one (every seed)":
                all(two["final_loss"] * LOSS_RATIO < one["final_loss"] for one, two in pairs),
            f"two heads learn faster: loss below {SOONER[0]} at least {SOONER[1]} steps sooner "
            "(every seed)": all(steps_to(two, SOONER[0]) + SOONER[1] <= steps_to(one, SOONER[0])
                                for one, two in pairs),
        })
    return result
