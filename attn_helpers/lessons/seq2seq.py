r"""The GRU encoder-decoder of notebooks 01 and 06, with pluggable attention.

Notation (notebook 00's table; vectors are rows): the source tokens' embeddings are
:math:`x_0, \dots, x_{n-1}`. :class:`Seq2Seq` reads them with a bidirectional GRU, whose states
:math:`h_j = [\overrightarrow{h}_j; \overleftarrow{h}_j]` are the *memory* :math:`H` ``(b, n, 2 d_enc)``
and whose two final states form the fixed context vector
:math:`c = [\overrightarrow{h}_{n-1}; \overleftarrow{h}_0]`. A GRU decoder, started from
:math:`\tanh(c W_b)`, produces one state :math:`s_t` per output step, and the prediction is
(biases omitted)

.. math::  \tilde s_t = \tanh([s_t; c_t] W_c), \qquad p(y_t) = \mathrm{softmax}(\tilde s_t W_y).

The only thing that changes between the three variants is where the context :math:`c_t` comes
from (``attention=``):

* ``"none"``: :math:`c_t = c`, the same fixed vector for every step: the fixed-context
  encoder-decoder (Sutskever et al., 2014; Cho et al., 2014). Like Cho et al., it gives :math:`c`
  to every output step as well as to the initial state (they also feed it into the recurrence);
  Sutskever et al. used :math:`c` only as the initial state. Its size does not grow with the
  input: the bottleneck of notebook 01.
* ``"additive"``: :math:`c_t = \sum_j a_{tj} h_j`, :math:`a_t = \mathrm{softmax}_j(e_{tj})`, with
  the additive score of Bahdanau et al. (2015), :math:`e_{tj} = \tanh(s_t U_q + h_j U_k)\, v_a^\top`
  (:class:`attn_helpers.attention.AdditiveScore`).
* ``"general"``: the same with Luong et al.'s (2015) *general* score
  :math:`e_{tj} = s_t (h_j W_k)^\top`, here divided by :math:`\sqrt{d_\text{dec}}` as in
  Transformers (Luong's did not scale).

In every variant the query is the *current* decoder state :math:`s_t` and the context enters the
output through :math:`\tanh([s_t; c_t] W_c)`: that is Luong et al.'s (2015) global attention,
even with Bahdanau's additive score, but without their input feeding (which feeds
:math:`\tilde s_t` back into the next step). Bahdanau et al. score from the *previous* state
:math:`s_{t-1}` and feed :math:`c_t` into the recurrence. Without input feeding, the decoder GRU
runs over the whole target at once in training, so the attention of all steps is one batched call.

The recipes in :data:`attn_helpers.training.RECIPES` (``python -m attn_helpers train NAME``)
train the checkpoints the notebooks load, from :data:`attn_helpers.lessons.rnn_bottleneck.CONFIGS`.
"""


from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._checks import require_positive_int, require_tensor, shape
from ..attention import (
    AdditiveScore,
    masked_softmax,
    scaled_dot_product_scores,
)
from ..masks import padding_mask
from .tasks import (
    PAD,
    SOS,
)

__all__ = ["ATTENTION_KINDS", "Seq2Seq"]

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
    r"""GRU encoder-decoder with ``attention`` in ``"none"``, ``"additive"`` or ``"general"``.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (ids 0, 1, 2 are ``<pad>``, ``<s>``,
            ``</s>``).
        d_emb: embedding size; d_enc: encoder GRU size per direction (the memory and the
            context vector have ``2 * d_enc`` features); the decoder state has ``2 * d_enc``.
        d_attn: hidden size :math:`d_a` of the additive scorer (``scorer``: ``w_q``, ``w_k``,
            ``w_v`` hold :math:`U_q^\top`, :math:`U_k^\top`, :math:`v_a`; ``nn.Linear`` stores
            the transposed matrix). ``key_proj`` (``"general"``) holds :math:`W_k^\top`.
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

    def attend(self, s: torch.Tensor, H: torch.Tensor, c: torch.Tensor,
               src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""The context :math:`c_t` of every decoder state :math:`s_t`.

        Args: ``s`` ``(b, n_t, d_dec)`` decoder states (the queries); ``H`` ``(b, n, 2 d_enc)``
        encoder states :math:`h_j` (keys and values); ``c`` ``(b, 2 d_enc)`` the fixed context
        vector; ``src_mask`` ``(b, n)``, True at real source tokens.

        Returns ``(c_t (b, n_t, 2 d_enc), a (b, n_t, n) or None)``: without attention every step
        gets the same ``c``, and there are no weights.
        """
        if self.attention == "none":
            return c[:, None, :].expand(-1, s.shape[1], -1), None  # c_t = c at every step t
        if self.attention == "additive":
            e = self.scorer(s, H)  # (b, n_t, n): e_tj = tanh(s_t U_q + h_j U_k) v_a^T
        else:
            e = scaled_dot_product_scores(s, self.key_proj(H))  # e_tj = s_t (h_j W_k)^T / sqrt(d)
        a = masked_softmax(e, src_mask[:, None, :])  # (b, n_t, n): a_t = softmax_j(e_tj)
        return a @ H, a  # (b, n_t, 2 d_enc): c_t = sum_j a_tj h_j

    def readout(self, states, memory, context, src_mask):
        r"""Decoder states ``(b, n_t, d_dec)`` -> ``(logits (b, n_t, V), weights or None)``:
        :math:`\mathrm{logits}_t = \tanh([s_t; c_t] W_c) W_y` (``combine`` is :math:`W_c`,
        ``out`` is :math:`W_y`)."""
        contexts, weights = self.attend(states, memory, context, src_mask)
        return self.out(torch.tanh(self.combine(torch.cat([states, contexts], -1)))), weights

    def initial_state(self, context: torch.Tensor) -> torch.Tensor:
        r"""``(b, 2 d_enc)`` context :math:`c` -> ``(1, b, d_dec)`` first decoder state
        :math:`\tanh(c W_b)` (``bridge`` is :math:`W_b`)."""
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
