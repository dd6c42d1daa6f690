r"""Notebook 01's GRU encoder-decoder (also notebook 06's), its training recipe and checkpoints.

A bidirectional GRU reads the source into states :math:`H` and a context vector :math:`c`; a GRU
decoder starts from :math:`\tanh(c W_b)` and predicts :math:`\mathrm{softmax}(\tanh([s_t; c_t] W_c)
W_y)`. With ``attention="none"``, :math:`c_t = c`: a Sutskever et al. (2014) style model whose
readout also sees :math:`c` (Cho et al., 2014, also fed :math:`c` into every GRU update; not here).
``"additive"`` (Bahdanau et al.'s 2015 score) and ``"general"`` (Luong et al.'s 2015 score) attend
from the current state :math:`s_t`, wired as Luong et al.'s global attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._checks import require_positive_int, require_tensor, shape
from ..attention import AdditiveScore, masked_softmax, scaled_dot_product_scores
from ..masks import padding_mask
from ..training import TrainResult, load_checkpoint, token_accuracy, train
from .tasks import PAD, SOS, Batch, get_task, make_batch

__all__ = ["ATTENTION_KINDS", "Seq2Seq", "seq2seq_loss", "predict", "accuracy_by_length",
           "input_gradient_norms", "TrainConfig", "CONFIGS", "build_model", "train_seq2seq",
           "load_pretrained"]

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
    r"""GRU encoder-decoder; ``attention`` is ``"none"``, ``"additive"`` or ``"general"``.

    The encoder has ``d_enc`` per direction; :math:`H`, :math:`c` and the decoder state have
    ``2 * d_enc`` features. ``d_attn`` is the additive scorer's hidden size :math:`d_a`.
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
        self.d_dec = d_dec = 2 * d_enc
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

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor,
               src_embedded: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``src`` ``(b, n_src)`` padded ids, ``src_lengths`` ``(b,)`` -> ``(memory (b, n_src, 2 d_enc),
        context (b, 2 d_enc))``; ``src_embedded`` ``(b, n_src, d_emb)`` replaces the embedding."""
        _check_src(src, src_lengths)
        embedded = self.src_embed(src) if src_embedded is None else src_embedded
        packed = pack_padded_sequence(embedded, src_lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        states, last = self.encoder(packed)
        memory, _ = pad_packed_sequence(states, batch_first=True, total_length=src.shape[1])
        return memory, torch.cat([last[0], last[1]], dim=-1)

    def attend(self, s: torch.Tensor, H: torch.Tensor, c: torch.Tensor,
               src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""``s`` ``(b, n_t, d_dec)``, ``H`` ``(b, n, 2 d_enc)``, ``c`` ``(b, 2 d_enc)``, ``src_mask``
        ``(b, n)`` -> ``(c_t (b, n_t, 2 d_enc), a (b, n_t, n) or None)``."""
        if self.attention == "none":
            return c[:, None, :].expand(-1, s.shape[1], -1), None  # c_t = c at every step t
        if self.attention == "additive":
            e = self.scorer(s, H)  # (b, n_t, n): e_tj = tanh(s_t U_q + h_j U_k) v_a^T
        else:
            e = scaled_dot_product_scores(s, self.key_proj(H))  # e_tj = s_t (h_j W_k)^T / sqrt(d)
        a = masked_softmax(e, src_mask[:, None, :])  # (b, n_t, n): a_t = softmax_j(e_tj)
        return a @ H, a  # (b, n_t, 2 d_enc): c_t = sum_j a_tj h_j

    def readout(self, states, memory, context, src_mask):
        r"""``(b, n_t, d_dec)`` states -> ``(logits (b, n_t, V), weights)``: :math:`\tanh([s_t; c_t]
        W_c) W_y`."""
        contexts, weights = self.attend(states, memory, context, src_mask)
        return self.out(torch.tanh(self.combine(torch.cat([states, contexts], -1)))), weights

    def initial_state(self, context: torch.Tensor) -> torch.Tensor:
        r"""``(b, 2 d_enc)`` :math:`c` -> ``(1, b, d_dec)`` first state :math:`\tanh(c W_b)`."""
        return torch.tanh(self.bridge(context))[None]

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor,
                src_embedded: torch.Tensor | None = None):
        """Teacher forcing: ``tgt_in`` ``(b, n_t)`` -> ``(logits (b, n_t, V), weights)``."""
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
        """Greedy decoding: ``(tokens (b, steps), weights (b, steps, n_src) or None)``."""
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


def seq2seq_loss(model: Seq2Seq, src, src_lengths, tgt_in, tgt_out) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions over real target tokens and ``</s>``."""
    logits, _ = model(src, src_lengths, tgt_in)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)


def predict(model: Seq2Seq, batch: Batch):
    """Greedy ``(tokens (b, n_tgt), weights (b, n_tgt, n_src) or None)``, without the ``</s>`` step."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    model.eval()
    return model.greedy_decode(batch.src, batch.src_lengths, batch.tgt_out.shape[1] - 1)


def accuracy_by_length(model: Seq2Seq, batches: dict) -> dict:
    """``{key: Batch}`` -> ``{key: greedy token accuracy}`` over real target tokens."""
    result = {}
    for key, batch in batches.items():
        tokens, _ = predict(model, batch)
        n = tokens.shape[1]
        result[key] = token_accuracy(tokens, batch.tgt_out[:, :n], batch.content_mask[:, :n])
    return result


def input_gradient_norms(model: Seq2Seq, batch: Batch) -> torch.Tensor:
    r"""``(b, n, n)``: ``[i, t, j]`` is :math:`\lVert \partial \log p(y_t) / \partial x_j \rVert`
    for example ``i`` (teacher forcing); every source has the same length ``n``."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    n = int(batch.src_lengths[0])
    if not bool((batch.src_lengths == n).all()):
        raise ValueError(f"every source in batch must have the same length, got "
                         f"{batch.src_lengths.tolist()}")
    was_training = model.training
    model.eval()
    x = model.src_embed(batch.src[:, :n]).detach().requires_grad_(True)   # (b, n, d_emb)
    logits, _ = model(batch.src[:, :n], batch.src_lengths, batch.tgt_in[:, :n], src_embedded=x)
    log_p = torch.log_softmax(logits, -1).gather(-1, batch.tgt_out[:, :n, None])[..., 0]  # (b, n)
    rows = [torch.autograd.grad(log_p[:, t].sum(), x, retain_graph=True)[0].norm(dim=-1)
            for t in range(n)]                                             # n x (b, n): over j
    model.train(was_training)
    return torch.stack(rows, dim=1).detach()                               # (b, n_t = n, n)


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


CONFIGS = {
    "seq2seq_reversal_none": TrainConfig("reversal", "none"),
    "seq2seq_reversal_additive": TrainConfig("reversal", "additive"),
    # no attention, c of 68 numbers: at least as many parameters as the attention model
    "seq2seq_reversal_none_wide": TrainConfig("reversal", "none", d_enc=34),
    "seq2seq_dates_general": TrainConfig("dates", "general", steps=500, finetune_steps=100),
}


def build_model(config: TrainConfig) -> Seq2Seq:
    """A fresh :class:`Seq2Seq` for ``config``, seeded with ``config.seed``."""
    task = get_task(config.task)
    torch.manual_seed(config.seed)
    return Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention=config.attention,
                   d_emb=config.d_emb, d_enc=config.d_enc, d_attn=config.d_attn)


def train_seq2seq(config: TrainConfig, *, progress: bool = True) -> tuple[Seq2Seq, TrainResult]:
    """``steps`` at ``lr``, then ``finetune_steps`` at ``finetune_lr`` (a fresh Adam), one thread."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    task = get_task(config.task)
    model = build_model(config)

    def batches(step, generator):
        b = make_batch(task, config.batch_size, generator)
        return b.src, b.src_lengths, b.tgt_in, b.tgt_out

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


def load_pretrained(name: str) -> Seq2Seq:
    """The shipped checkpoint ``name`` (a key of :data:`CONFIGS`), in eval mode."""
    if name not in CONFIGS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {sorted(CONFIGS)}")
    model = build_model(CONFIGS[name])
    load_checkpoint(model, name)
    return model
