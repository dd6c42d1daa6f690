r"""Small sequence-to-sequence models: a GRU encoder-decoder with pluggable attention, and a
transformer-style cross-attention layer.

:class:`Seq2Seq` reads the source with a bidirectional GRU, whose states
:math:`h_j = [\overrightarrow{h}_j; \overleftarrow{h}_j]` are the *memory* ``(b, n_src, 2 d_enc)``.
A GRU decoder produces one state :math:`s_t` per output step, and the prediction is

.. math::  \tilde s_t = \tanh(W_c [s_t; c_t]), \qquad p(y_t) = \mathrm{softmax}(W_o \tilde s_t).

The only thing that changes between the three variants is where the context :math:`c_t` comes
from (``attention=``):

* ``"none"``: :math:`c_t = c`, the same fixed vector for every step, the last forward and the
  first backward state (Sutskever et al., 2014; Cho et al., 2014). Its size does not grow with
  the input: the bottleneck of notebook 01.
* ``"additive"``: :math:`c_t = \sum_j a_{tj} h_j` with Bahdanau scores
  :math:`e_{tj} = w^\top \tanh(W_q s_t + W_k h_j)` (Bahdanau et al., 2015).
* ``"dot"``: the same with Luong's "general" dot-product scores
  :math:`e_{tj} = s_t \cdot (W_k h_j) / \sqrt{d_\text{dec}}` (Luong et al., 2015).

The attention uses the current decoder state as query (Luong's arrangement), so in training the
decoder GRU runs over the whole target at once and the attention of all steps is one batched call.

Recipes (``python -m attn_helpers.train NAME``) train the checkpoints the notebooks load:
``seq2seq_reversal_none``, ``seq2seq_reversal_additive`` and ``seq2seq_dates_dot``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ._checks import require_positive_int, require_tensor, shape
from .attention import (
    AdditiveScore,
    masked_softmax,
    scaled_dot_product_attention,
    scaled_dot_product_scores,
)
from .masks import padding_mask
from .tasks import (
    DATES,
    ISO_STEP_FIELDS,
    PAD,
    SOS,
    Batch,
    date_fields,
    eval_batches,
    get_task,
    make_batch,
)
from .train import recipe
from .training import TrainResult, load_checkpoint, token_accuracy, train

__all__ = [
    "ATTENTION_KINDS",
    "Seq2Seq",
    "CrossAttention",
    "seq2seq_loss",
    "predict",
    "accuracy_by_length",
    "input_gradient_norms",
    "antidiagonal_hits",
    "date_field_hits",
    "TrainConfig",
    "RECIPES",
    "train_seq2seq",
    "build_model",
    "load_pretrained",
]

ATTENTION_KINDS = ("none", "additive", "dot")


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
    """GRU encoder-decoder with ``attention`` in ``"none"``, ``"additive"`` or ``"dot"``.

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
        elif attention == "dot":
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


class CrossAttention(nn.Module):
    r"""Transformer-style single-head cross-attention: queries from the decoder, keys and values
    from the encoder.

    .. math::  Q = Y W_Q,\; K = X W_K,\; V = X W_V,\qquad
               \mathrm{out} = \mathrm{softmax}(QK^\top/\sqrt{d})\,V\,W_O

    ``forward(y (b, n_q, d_model), x (b, n_k, d_memory), memory_mask (b, n_k) bool or None)
    -> (out (b, n_q, d_model), weights (b, n_q, n_k))``; ``memory_mask`` is True at real
    (non-padding) encoder positions. Built on :func:`scaled_dot_product_attention`; equal to
    ``torch.nn.MultiheadAttention(d_model, 1, kdim=d_memory, vdim=d_memory, batch_first=True)``
    with the same weights (see :meth:`from_torch`).
    """

    def __init__(self, d_model: int, d_memory: int | None = None, *, bias: bool = True):
        super().__init__()
        require_positive_int("d_model", d_model)
        d_memory = d_model if d_memory is None else require_positive_int("d_memory", d_memory)
        self.d_model, self.d_memory = d_model, d_memory
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_memory, d_model, bias=bias)
        self.w_v = nn.Linear(d_memory, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, y: torch.Tensor, x: torch.Tensor, memory_mask: torch.Tensor | None = None):
        require_tensor("y", y, floating=True)
        require_tensor("x", x, floating=True)
        if y.dim() != 3 or y.shape[-1] != self.d_model:
            raise ValueError(f"y (the decoder states) must have shape (b, n_q, d_model="
                             f"{self.d_model}), got {shape(y)}")
        if x.dim() != 3 or x.shape[-1] != self.d_memory or x.shape[0] != y.shape[0]:
            raise ValueError(f"x (the encoder states) must have shape (b={y.shape[0]}, n_k, "
                             f"d_memory={self.d_memory}), got {shape(x)}")
        mask = None
        if memory_mask is not None:
            require_tensor("memory_mask", memory_mask)
            if memory_mask.dtype != torch.bool or memory_mask.shape != x.shape[:2]:
                raise ValueError(f"memory_mask must be bool with shape (b, n_k) = "
                                 f"{tuple(x.shape[:2])}, got {memory_mask.dtype} "
                                 f"{shape(memory_mask)}")
            mask = memory_mask[:, None, :]
        out, weights = scaled_dot_product_attention(self.w_q(y), self.w_k(x), self.w_v(x), mask)
        return self.w_o(out), weights

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> CrossAttention:
        """A :class:`CrossAttention` with the weights of a one-head, batch-first ``m``."""
        if not isinstance(m, nn.MultiheadAttention) or m.num_heads != 1:
            raise ValueError("m must be a torch.nn.MultiheadAttention with num_heads=1")
        layer = cls(m.embed_dim, m.kdim, bias=m.in_proj_bias is not None)
        d = m.embed_dim
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                w_q, w_k, w_v = m.in_proj_weight.split(d)
            else:
                w_q, w_k, w_v = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            for linear, weight in ((layer.w_q, w_q), (layer.w_k, w_k), (layer.w_v, w_v)):
                linear.weight.copy_(weight)
            layer.w_o.weight.copy_(m.out_proj.weight)
            if m.in_proj_bias is not None:
                for linear, b in zip((layer.w_q, layer.w_k, layer.w_v), m.in_proj_bias.split(d),
                                     strict=True):
                    linear.bias.copy_(b)
                layer.w_o.bias.copy_(m.out_proj.bias)
        return layer


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


def antidiagonal_hits(weights: torch.Tensor, batch: Batch, tolerance: int = 0) -> torch.Tensor:
    """``(b, n_t)`` bool: for a reversal batch, whether the strongest weight of output step ``t``
    lies on source position ``L - 1 - t`` (``L`` the sequence's length), or at most
    ``tolerance`` positions from it; False at padded steps. ``weights`` ``(b, n_t, n_src)``."""
    _check_weights_for(weights, batch)
    require_positive_int("tolerance", tolerance, allow_zero=True)
    steps = torch.arange(weights.shape[1])[None, :]
    mirror = batch.src_lengths[:, None] - 1 - steps
    near = (weights.argmax(-1) - mirror).abs() <= tolerance
    return near & (steps < batch.tgt_lengths[:, None])


def date_field_hits(weights: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(b, 10)`` bool: for a dates batch, whether the strongest input word of each ISO output
    step lies in the field that step copies (:data:`tasks.ISO_STEP_FIELDS`: the year digits
    should read the year words, and so on). The two separator steps (``-``) copy nothing and are
    always False; leave them out of any share."""
    _check_weights_for(weights, batch)
    if weights.shape[1] != len(ISO_STEP_FIELDS):
        raise ValueError(f"weights must have {len(ISO_STEP_FIELDS)} output steps (an ISO date), "
                         f"got shape {shape(weights)}")
    hits = torch.zeros(weights.shape[:2], dtype=torch.bool)
    for i in range(len(batch)):
        fields = date_fields(DATES.src_vocab.decode(batch.src[i]))
        strongest = weights[i].argmax(-1).tolist()
        hits[i] = torch.tensor([fields[j] == want
                                for j, want in zip(strongest, ISO_STEP_FIELDS, strict=True)])
    return hits


def _check_weights_for(weights, batch: Batch) -> None:
    require_tensor("weights", weights, floating=True)
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    if weights.dim() != 3 or weights.shape[0] != len(batch) or weights.shape[2] != batch.src.shape[1]:
        raise ValueError(f"weights must have shape (b={len(batch)}, n_t, n_src={batch.src.shape[1]}), "
                         f"got {shape(weights)}")


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
RECIPES = {
    "seq2seq_reversal_none": TrainConfig("reversal", "none"),
    "seq2seq_reversal_additive": TrainConfig("reversal", "additive"),
    "seq2seq_dates_dot": TrainConfig("dates", "dot", steps=500, finetune_steps=100),
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


def _register(name: str, config: TrainConfig) -> None:
    def run():
        model, result = train_seq2seq(config)
        return model, _metadata(config, model, result)

    run.__name__ = f"recipe_{name}"
    recipe(name)(run)


for _name, _config in RECIPES.items():
    _register(_name, _config)


def load_pretrained(name: str) -> Seq2Seq:
    """The shipped checkpoint ``name`` (a key of :data:`RECIPES`), in eval mode."""
    if name not in RECIPES:
        raise ValueError(f"unknown checkpoint {name!r}; known: {sorted(RECIPES)}")
    model = build_model(RECIPES[name])
    load_checkpoint(model, name)
    return model

