r"""Notebook 01 (and the bridge to 06): a GRU encoder-decoder with pluggable attention.

:class:`Seq2Seq` reads the source with a bidirectional GRU, whose states
:math:`h_j = [\overrightarrow{h}_j; \overleftarrow{h}_j]` are the *memory* ``(b, n_src, 2 d_enc)``.
A GRU decoder produces one state :math:`s_t` per output step, and the prediction is

.. math::  \tilde s_t = \tanh(W_c [s_t; c_t]), \qquad p(y_t) = \mathrm{softmax}(W_o \tilde s_t).

The only thing that changes between the three variants is where the context :math:`c_t` comes
from (``attention=``):

* ``"none"``: :math:`c_t = c`, the same fixed vector for every step, the last forward and the
  first backward state (Sutskever et al., 2014; Cho et al., 2014). Its size does not grow with
  the input: the bottleneck of notebook 01.
* ``"additive"``: :math:`c_t = \sum_j a_{tj} h_j` with the additive score of Bahdanau et al.
  (2015), :math:`e_{tj} = v_a^\top \tanh(W_q s_t + W_k h_j)`.
* ``"general"``: the same with Luong et al.'s (2015) *general* score
  :math:`e_{tj} = s_t^\top W_k h_j`, here divided by :math:`\sqrt{d_\text{dec}}` as in
  Transformers (Luong's did not scale).

In every variant the query is the *current* decoder state :math:`s_t` and the context enters the
output through :math:`\tanh(W_c[s_t; c_t])`: that is Luong's arrangement (Bahdanau's scores
from :math:`s_{t-1}` and feeds :math:`c_t` into the recurrence). It lets the decoder GRU run over
the whole target at once in training, so the attention of all steps is one batched call.

The recipes in :data:`attn_helpers.training.RECIPES` (``python -m attn_helpers train NAME``)
train the checkpoints the notebooks load: ``seq2seq_reversal_none``,
``seq2seq_reversal_additive`` and ``seq2seq_dates_general``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._checks import require_positive_int, require_tensor, shape
from ..attention import (
    AdditiveScore,
    masked_softmax,
    scaled_dot_product_scores,
)
from ..masks import padding_mask
from ..training import TrainResult, load_checkpoint, token_accuracy, train
from .tasks import (
    PAD,
    SOS,
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

ATTENTION_KINDS = ("none", "additive", "general")


def _check_src(src, src_lengths) -> None:
    require_tensor("src", src)
    require_tensor("src_lengths", src_lengths)
    if src.dim() != 2 or src.is_floating_point() or src.dtype == torch.bool:
        raise ValueError(f"src must be a 2-D integer tensor (batch, n_src), got {src.dtype} "
                         f"{shape(src)}")
    if src_lengths.shape != (src.shape[0],) or src_lengths.is_floating_point():
        raise ValueError(f"src_lengths must be an integer tensor of shape (batch,) = "
                         f"({src.shape[0]},), got {src_lengths.dtype} {shape(src_lengths)}")
    if src.shape[0] and (int(src_lengths.min()) < 1 or int(src_lengths.max()) > src.shape[1]):
        raise ValueError(f"every source length must lie in 1..n_src={src.shape[1]}, got "
                         f"{src_lengths.tolist()}")


class Seq2Seq(nn.Module):
    """GRU encoder-decoder with ``attention`` in ``"none"``, ``"additive"`` or ``"general"``.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (ids 0, 1, 2 are ``<pad>``, ``<s>``,
            ``</s>``).
        d_emb: embedding size; d_enc: encoder GRU size per direction (the memory and the
            context vector have ``2 * d_enc`` features); the decoder state has ``2 * d_enc``.
        d_attn: hidden size of the additive scorer.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, attention: str = "additive",
                 d_emb: int = 32, d_enc: int = 32, d_attn: int = 32):
        super().__init__()
        for name, value in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("d_emb", d_emb), ("d_enc", d_enc), ("d_attn", d_attn)):
            require_positive_int(name, value)
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        self.attention = attention
        self.d_memory = d_dec = 2 * d_enc
        self.d_dec = d_dec
        self.src_embed = nn.Embedding(src_vocab_size, d_emb, padding_idx=PAD)
        self.encoder = nn.GRU(d_emb, d_enc, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * d_enc, d_dec)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_emb, padding_idx=PAD)
        self.decoder = nn.GRU(d_emb, d_dec, batch_first=True)
        if attention == "additive":
            self.scorer = AdditiveScore(d_dec, 2 * d_enc, d_attn)
        elif attention == "general":
            self.key_proj = nn.Linear(2 * d_enc, d_dec, bias=False)
        self.combine = nn.Linear(d_dec + 2 * d_enc, d_dec)
        self.out = nn.Linear(d_dec, tgt_vocab_size)

    # -- the pieces ---------------------------------------------------------------------------

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor,
               src_embedded: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Read the source.

        Args:
            src: ``(b, n_src)`` ids, padded with 0; src_lengths: ``(b,)``.
            src_embedded: optional ``(b, n_src, d_emb)`` to use instead of the embedding of
                ``src`` (to take gradients with respect to the inputs).

        Returns:
            ``(memory, context)``: memory ``(b, n_src, 2 d_enc)`` (zero at padding), context
            ``(b, 2 d_enc)``: the last forward state and the first backward state.
        """
        _check_src(src, src_lengths)
        embedded = self.src_embed(src) if src_embedded is None else src_embedded
        packed = pack_padded_sequence(embedded, src_lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        states, last = self.encoder(packed)
        memory, _ = pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])
        return memory, torch.cat([last[0], last[1]], dim=-1)

    def attend(self, queries: torch.Tensor, memory: torch.Tensor, context: torch.Tensor,
               src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Context vectors for decoder states ``queries`` ``(b, n_t, d_dec)``.

        Returns ``(contexts (b, n_t, 2 d_enc), weights (b, n_t, n_src) or None)``; without
        attention every step gets the same ``context``, and the weights are ``None``.
        """
        if self.attention == "none":
            return context[:, None, :].expand(-1, queries.shape[1], -1), None
        if self.attention == "additive":
            scores = self.scorer(queries, memory)
        else:
            scores = scaled_dot_product_scores(queries, self.key_proj(memory))
        weights = masked_softmax(scores, src_mask[:, None, :])
        return weights @ memory, weights

    def readout(self, states, memory, context, src_mask):
        """Decoder states ``(b, n_t, d_dec)`` -> ``(logits (b, n_t, V), weights or None)``."""
        contexts, weights = self.attend(states, memory, context, src_mask)
        return self.out(torch.tanh(self.combine(torch.cat([states, contexts], -1)))), weights

    def initial_state(self, context: torch.Tensor) -> torch.Tensor:
        """``(b, 2 d_enc)`` context -> ``(1, b, d_dec)`` first decoder state."""
        return torch.tanh(self.bridge(context))[None]

    # -- training and decoding ----------------------------------------------------------------

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor,
                src_embedded: torch.Tensor | None = None):
        """Teacher forcing: ``tgt_in`` ``(b, n_t)`` starts with ``<s>``.

        Returns ``(logits (b, n_t, tgt_vocab), weights (b, n_t, n_src) or None)``.
        """
        require_tensor("tgt_in", tgt_in)
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0] or tgt_in.is_floating_point():
            raise ValueError(f"tgt_in must be an integer tensor (batch={src.shape[0]}, n_t), got "
                             f"{tgt_in.dtype} {shape(tgt_in)}")
        memory, context = self.encode(src, src_lengths, src_embedded)
        states, _ = self.decoder(self.tgt_embed(tgt_in), self.initial_state(context))
        src_mask = padding_mask(src_lengths, src.shape[1])
        return self.readout(states, memory, context, src_mask)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, src_lengths: torch.Tensor, steps: int):
        """Decode ``steps`` tokens, each the most likely one given the previous ones.

        Returns ``(tokens (b, steps), weights (b, steps, n_src) or None)``: row ``t`` of the
        weights is the cross-attention of output step ``t`` over the source tokens. Tokens after
        a ``</s>`` are left as the model predicted them (:meth:`Vocab.decode` stops at ``</s>``).
        """
        require_positive_int("steps", steps)
        memory, context = self.encode(src, src_lengths)
        src_mask = padding_mask(src_lengths, src.shape[1])
        hidden = self.initial_state(context)
        previous = torch.full((src.shape[0], 1), SOS, dtype=torch.long)
        tokens, rows = [], []
        for _ in range(steps):
            state, hidden = self.decoder(self.tgt_embed(previous), hidden)
            logits, weights = self.readout(state, memory, context, src_mask)
            previous = logits.argmax(-1)
            tokens.append(previous)
            rows.append(weights)
        weights = None if self.attention == "none" else torch.cat(rows, dim=1)
        return torch.cat(tokens, dim=1), weights


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
