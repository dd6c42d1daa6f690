"""Notebook 04's controls: the two-relation model trained on several seeds with one head and with
two, at the same ``d_model``, parameter count and number of steps; and the data of the live
head-ablation view (every subset of heads switched on, evaluated once).

Re-create the shipped one-head checkpoint (and the seed study in its metadata) with
``python -m attn_helpers train multihead_one_head``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch
from torch import nn

from .._checks import require_int_in, require_tensor, shape
from ..training import TrainResult, load_checkpoint
from .multi_head import (
    ABLATED,
    ACCURACY_MIN,
    CONFIG,
    LOSS_EVERY,
    TwoRelationModel,
    evaluation_batch,
    head_relation_scores,
    relation_accuracy,
    token_labels,
    train_two_relations,
)

__all__ = [
    "ONE_HEAD", "ONE_HEAD_CHECKPOINT", "STUDY_SEEDS", "seed_study", "recipe_one_head",
    "load_one_head", "AblationData", "AblationFrame", "ablation_data", "ablation_frame",
    "ModuleAttention", "train_with_module", "module_claims", "widget_claims",
]

ONE_HEAD = replace(CONFIG, num_heads=1)     # the same task, d_model, MLP, steps and learning rate
ONE_HEAD_CHECKPOINT = "multihead_one_head"
STUDY_SEEDS = (0, 1, 2, 3, 4)


def seed_study(seeds=STUDY_SEEDS, heads=(1, 2)) -> tuple[list[dict], TwoRelationModel]:
    """Train the model for every number of heads and seed; return one row per run,
    ``{"num_heads", "seed", "accuracy", "final_loss", "relation_scores" (h x 2), "loss_curve"}``
    (held-out accuracy and relation scores on :func:`evaluation_batch`), and the one-head model of
    the first seed."""
    tokens, targets = evaluation_batch(CONFIG)
    rows, first_one_head = [], None
    for h, seed in itertools.product(heads, seeds):
        model, result = train_two_relations(replace(CONFIG, num_heads=h, seed=seed))
        with torch.no_grad():
            _, weights = model(tokens)
        losses = result.losses
        rows.append({"num_heads": h, "seed": seed,
                     "accuracy": relation_accuracy(model, tokens, targets),
                     "final_loss": result.final_loss,
                     "relation_scores": head_relation_scores(weights).tolist(),
                     "loss_curve": [sum(losses[i:i + LOSS_EVERY]) / LOSS_EVERY
                                    for i in range(0, len(losses), LOSS_EVERY)]})
        if h == 1 and first_one_head is None:
            first_one_head = model
    return rows, first_one_head


class ModuleAttention(nn.Module):
    """Puts a learner's self-attention module, ``module(x, mask) -> (b, n, d_model)``, where
    :class:`TwoRelationModel` expects ``MultiHeadAttention``'s ``(query, key, value, mask) ->
    (output, weights)``; the weights are not returned (``None``)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.inner = module

    def forward(self, query, key, value, mask=None, *, head_mask=None):
        if head_mask is not None or key is not query or value is not query:
            raise ValueError("a learner's module does self-attention, without head_mask")
        return self.inner(query, mask), None


def train_with_module(module_class, config=CONFIG) -> tuple[TwoRelationModel, TrainResult, dict]:
    """Notebook 04's task and training (the checkpoint's recipe: same seed, steps, learning rate
    and batches), with the attention replaced by ``module_class(d_model, num_heads)``.

    Returns ``(model, result, held-out accuracy per relation)``."""
    def build(cfg):
        model = TwoRelationModel(cfg)
        model.attention = ModuleAttention(module_class(cfg.d_model, cfg.num_heads))
        return model

    model, result = train_two_relations(config, build=build)
    tokens, targets = evaluation_batch(config)
    return model, result, relation_accuracy(model, tokens, targets)


def module_claims(accuracy: dict) -> dict[str, bool]:
    """What notebook 04 says about the model trained with the exercise's module."""
    return {f"with this module the model names both letters (> {ACCURACY_MIN:.0%} held-out, each "
            "relation), as the shipped two-head model does": min(accuracy.values()) > ACCURACY_MIN}


def widget_claims(ablations: list, previous_head: int, first_head: int) -> dict[str, bool]:
    """Notebook 04's statements about the widget's ablation moves: ``ablations`` is a list of
    ``(heads_on, held-out accuracy per relation)`` read from the widget."""
    relation_of = {previous_head: "previous", first_head: "first"}
    chance = 1 / CONFIG.vocab
    return {f"in the widget, a switched-off head's relation is at chance (within {ABLATED[0]} of "
            f"1/{CONFIG.vocab}), a head that is on keeps its relation above {ABLATED[1]}": all(
                (accuracy[relation_of[head]] > ABLATED[1]) if on
                else abs(accuracy[relation_of[head]] - chance) <= ABLATED[0]
                for heads_on, accuracy in ablations for head, on in enumerate(heads_on))}


def recipe_one_head():
    """``python -m attn_helpers train multihead_one_head``: the seed study (10 runs, about a
    minute on one CPU thread); the checkpoint holds the one-head model of seed 0."""
    rows, model = seed_study()
    return model, {"config": ONE_HEAD.__dict__, "loss_every": LOSS_EVERY, "study": rows}


def load_one_head() -> tuple[TwoRelationModel, dict]:
    """The shipped one-head model (seed 0) and its metadata, whose ``"study"`` holds the rows of
    :func:`seed_study` for one and two heads on seeds 0..4."""
    model = TwoRelationModel(ONE_HEAD)
    return model, load_checkpoint(model, ONE_HEAD_CHECKPOINT)


# --- the live head-ablation view: every subset of heads, evaluated once -----------------------


@dataclass(frozen=True)
class AblationData:
    """``tokens`` ``(m, n)``, ``targets`` ``(m, n, 2)``, ``weights`` ``(m, h, n, n)`` (a one-layer
    model's weights do not depend on which heads are switched off) and, for every ``heads_on``
    tuple of ``h`` bools, the letters named ``predictions[heads_on]`` ``(m, n, 2)`` and the
    accuracy per relation ``accuracy[heads_on]`` (positions ``i >= 2``, as
    :func:`relation_accuracy`)."""

    tokens: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    predictions: dict
    accuracy: dict


@dataclass(frozen=True)
class AblationFrame:
    """One example with some heads switched off: ``weights`` ``(h, n, n)``, ``heads_on`` (h
    bools), ``labels`` (n token labels), ``predictions`` ``(n, 2)`` letters named for (previous,
    first), ``correct`` ``(n, 2)`` bool (False where there is no target), and ``accuracy``
    ``{"previous", "first"}`` over the whole held-out batch with these heads."""

    weights: torch.Tensor
    heads_on: tuple
    labels: list
    predictions: torch.Tensor
    correct: torch.Tensor
    accuracy: dict


def ablation_data(model: TwoRelationModel, tokens: torch.Tensor, targets: torch.Tensor):
    """Run ``model`` once per subset of heads (``2^h`` runs) and keep everything a head-ablation
    view needs; :func:`ablation_frame` then only looks it up."""
    require_tensor("tokens", tokens)
    if tokens.dim() != 2 or targets.shape != (*tokens.shape, 2):
        raise ValueError(f"tokens must be (m, n) and targets (m, n, 2); got {shape(tokens)} and "
                         f"{shape(targets)}")
    h = model.config.num_heads
    predictions, accuracy = {}, {}
    with torch.no_grad():
        _, weights = model(tokens)
        for heads_on in itertools.product((True, False), repeat=h):
            logits, _ = model(tokens, head_mask=torch.tensor(heads_on))
            predictions[heads_on] = logits.argmax(-1)                       # (m, n, 2)
            accuracy[heads_on] = relation_accuracy(model, tokens, targets, torch.tensor(heads_on))
    return AblationData(tokens, targets, weights, predictions, accuracy)


def ablation_frame(data: AblationData, example: int, heads_on) -> AblationFrame:
    """Example ``example`` of ``data`` with the heads where ``heads_on`` is False switched off."""
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
