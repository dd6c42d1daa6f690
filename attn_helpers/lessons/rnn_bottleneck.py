"""Notebook 01: the RNN bottleneck. Two GRU encoder-decoders (:mod:`.seq2seq`) reverse digit
sequences, one through a fixed context vector, one with attention: their training recipes,
evaluation, input gradients, and :func:`claims`, the statements the notebook asserts.
"""


from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..training import TrainResult, load_checkpoint, token_accuracy, train
from .seq2seq import ATTENTION_KINDS, Seq2Seq
from .tasks import (
    PAD,
    Batch,
    eval_batches,
    get_task,
    make_batch,
)

__all__ = [
    "ATTENTION_KINDS",
    "Seq2Seq",
    "seq2seq_loss",
    "predict",
    "accuracy_by_length",
    "input_gradient_norms",
    "TrainConfig",
    "CONFIGS",
    "recipe_reversal_none",
    "recipe_reversal_additive",
    "recipe_dates_general",
    "claims",
    "train_seq2seq",
    "build_model",
    "load_pretrained",
]

# --- loss, evaluation, gradients --------------------------------------------------------------


def seq2seq_loss(model: Seq2Seq, src, src_lengths, tgt_in, tgt_out) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions over real target tokens and ``</s>``."""
    logits, _ = model(src, src_lengths, tgt_in)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)


def _batch_tuple(batch: Batch) -> tuple:
    return batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out


def predict(model: Seq2Seq, batch: Batch):
    """Greedy predictions for a batch: ``(tokens (b, n_tgt), weights (b, n_tgt, n_src) or None)``,
    one step per target token (the ``</s>`` step is left out)."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    model.eval()
    return model.greedy_decode(batch.src, batch.src_lengths, batch.tgt_out.shape[1] - 1)


def accuracy_by_length(model: Seq2Seq, batches: dict) -> dict:
    """Greedy token accuracy for each ``{key: Batch}`` (e.g. each source length); ``{key: float}``.

    Only real target tokens count; padding and ``</s>`` do not.
    """
    result = {}
    for key, batch in batches.items():
        tokens, _ = predict(model, batch)
        n = tokens.shape[1]
        result[key] = token_accuracy(tokens, batch.tgt_out[:, :n], batch.content_mask[:, :n])
    return result


def input_gradient_norms(model: Seq2Seq, batch: Batch, step: int) -> torch.Tensor:
    r"""``(n_src,)``: for the first example of ``batch``, the norm of
    :math:`\partial \log p(y_\text{step}) / \partial e_j`, the gradient of the log-probability of
    the correct token at output ``step`` (teacher forcing) with respect to the embedding
    :math:`e_j` of every source position ``j``. It measures how directly position ``j`` can
    influence that output: a long path through the recurrence multiplies many Jacobians."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    n_t = int(batch.tgt_lengths[0]) + 1
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < n_t:
        raise ValueError(f"step must be an int in 0..{n_t - 1}, got {step!r}")
    n = int(batch.src_lengths[0])
    src, lengths = batch.src[:1, :n], batch.src_lengths[:1]
    was_training = model.training
    model.eval()
    embedded = model.src_embed(src).detach().requires_grad_(True)
    logits, _ = model(src, lengths, batch.tgt_in[:1, :n_t], src_embedded=embedded)
    log_p = torch.log_softmax(logits[0, step], -1)[batch.tgt_out[0, step]]
    (grad,) = torch.autograd.grad(log_p, embedded)
    model.train(was_training)
    return grad[0].norm(dim=-1).detach()


# --- recipes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """One checkpoint's task, model and training budget."""

    task: str
    attention: str
    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    finetune_steps: int = 400
    finetune_lr: float = 1e-3
    d_emb: int = 32
    d_enc: int = 32
    d_attn: int = 32


# The two reversal models share the task, the sizes and the budget; only the attention differs.
CONFIGS = {
    "seq2seq_reversal_none": TrainConfig("reversal", "none"),
    "seq2seq_reversal_additive": TrainConfig("reversal", "additive"),
    "seq2seq_dates_general": TrainConfig("dates", "general", steps=500, finetune_steps=100),
}


def build_model(config: TrainConfig) -> Seq2Seq:
    """A freshly initialised :class:`Seq2Seq` for ``config`` (seeded with ``config.seed``)."""
    task = get_task(config.task)
    torch.manual_seed(config.seed)
    return Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention=config.attention,
                   d_emb=config.d_emb, d_enc=config.d_enc, d_attn=config.d_attn)


def train_seq2seq(config: TrainConfig, *, progress: bool = True) -> tuple[Seq2Seq, TrainResult]:
    """Train a model for ``config`` from scratch with :func:`attn_helpers.training.train`:
    ``steps`` steps at learning rate ``lr``, then ``finetune_steps`` more at the smaller
    ``finetune_lr`` (a fresh Adam, on a fresh stream of batches), which removes most of the
    last errors that a constant learning rate leaves. The losses of both phases are returned.
    Trains on one thread, so the result does not depend on ``OMP_NUM_THREADS``."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    task = get_task(config.task)
    model = build_model(config)

    def batches(step, generator):
        return _batch_tuple(make_batch(task, config.batch_size, generator))

    description = f"{config.task}, attention={config.attention}"
    result = train(model, batches, seq2seq_loss, steps=config.steps, lr=config.lr,
                   seed=config.seed, progress=progress, description=description,
                   single_threaded=True)
    if config.finetune_steps:
        finetune = train(model, batches, seq2seq_loss, steps=config.finetune_steps,
                         lr=config.finetune_lr, seed=config.seed + 1, progress=progress,
                         description=f"{description}, fine-tuning", single_threaded=True)
        result.losses.extend(finetune.losses)
    return model, result


def _metadata(config: TrainConfig, model: Seq2Seq, result: TrainResult) -> dict:
    accuracy = accuracy_by_length(model, eval_batches(config.task, 100))
    return {
        **{k: v for k, v in config.__dict__.items()},
        "final_loss": round(result.final_loss, 4),
        "accuracy": {str(k): round(v, 4) for k, v in accuracy.items()},
    }


def _recipe(name: str):
    config = CONFIGS[name]
    model, result = train_seq2seq(config)
    return model, _metadata(config, model, result)


def recipe_reversal_none():
    """``python -m attn_helpers train seq2seq_reversal_none``: the no-attention baseline."""
    return _recipe("seq2seq_reversal_none")


def recipe_reversal_additive():
    """``python -m attn_helpers train seq2seq_reversal_additive``: additive attention."""
    return _recipe("seq2seq_reversal_additive")


def recipe_dates_general():
    """``python -m attn_helpers train seq2seq_dates_general``: the dates model of notebook 06."""
    return _recipe("seq2seq_dates_general")


def load_pretrained(name: str) -> Seq2Seq:
    """The shipped checkpoint ``name`` (a key of :data:`CONFIGS`), in eval mode."""
    if name not in CONFIGS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {sorted(CONFIGS)}")
    model = build_model(CONFIGS[name])
    load_checkpoint(model, name)
    return model



def claims(plain: Seq2Seq, attended: Seq2Seq) -> dict[str, bool]:
    """Notebook 01's statements about the two reversal models, as named booleans; the notebook
    asserts them on the shipped checkpoints, the tests on freshly re-trained models."""
    test_sets = eval_batches("reversal", 100)
    acc_plain = accuracy_by_length(plain, test_sets)
    acc_attn = accuracy_by_length(attended, test_sets)
    longest = max(test_sets)
    long_set = test_sets[longest]
    tokens, _ = predict(plain, long_set)
    by_position = (tokens == long_set.tgt_out[:, :longest]).float().mean(0)
    first, last = by_position[:3].mean().item(), by_position[-8:].mean().item()
    return {
        "with attention, accuracy stays >= 0.95 at every length": min(acc_attn.values()) >= 0.95,
        f"without attention, accuracy at length {longest} is at least 0.3 lower":
            acc_plain[longest] <= acc_attn[longest] - 0.3,
        "without attention, short sequences are fine (>= 0.95 at 4, >= 0.9 at 6)":
            acc_plain[4] >= 0.95 and acc_plain[6] >= 0.9,
        "without attention, accuracy falls with length (6 > 12 > longest)":
            acc_plain[longest] < acc_plain[12] < acc_plain[6],
        "without attention, the first outputs are right (> 0.7) and the last wrong (< 0.3)":
            first > 0.7 and last < 0.3 and first > last + 0.5,
    }
