r"""Notebook 09's two studies beyond raw attention weights.

- **Value-weighted norms** (Kobayashi et al., 2020, *Attention is Not Only a Weight*): head ``h``
  adds :math:`\sum_j \alpha_{ij} f_h(x_j)` to token ``i``, with
  :math:`f_h(x_j) = W_O^{(h)} v^{(h)}_j` the value vector of token ``j`` passed through the
  head's slice of the output projection. A large weight on a key whose :math:`f_h(x_j)` is
  short moves little, so :math:`\lVert \alpha_{ij} f_h(x_j) \rVert` says more than
  :math:`\alpha_{ij}` about what a key contributes. :func:`value_norms` computes it,
  :func:`run_value_norms` on every head of the model.
- **Which noun does "it" read?** (:func:`coreference`): Winograd-style sentences in pairs that
  differ in one word, so that the antecedent of "it" is the first noun in one and the second
  noun in the other. A head that resolves "it" puts more weight on the antecedent than on the
  other noun in both; a head that only prefers a position or a word does so in one of the two.
  So each pair is scored as a **right flip** (the head's preferred noun follows the antecedent),
  **no flip** (same noun in both sentences) or a **wrong flip**; :func:`sign_test` asks, across
  pairs, whether right flips outnumber wrong ones more than chance allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import require_tensor, shape
from ..masks import key_padding_to_attention_mask
from ..multihead import split_heads
from ..pretrained import Encoder

__all__ = ["Coreference", "PASS_RIGHT_FLIPS", "coreference", "row_shares", "run_value_norms",
           "sign_test", "value_norms", "value_vector_norms"]

#: The pass criterion of the "it" study, fixed before looking at the heads: a head "knows" the
#: antecedent if it flips the right way in at least 15 of the 16 pairs. A head that flips at random
#: (right or wrong, equally likely, in each pair) does so with probability 17 / 2^16 < 3e-4, so
#: the chance that any of 72 such heads passes is below 0.02 (Bonferroni).
PASS_RIGHT_FLIPS = 15


def value_norms(weights: torch.Tensor, values: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    r""":math:`\lVert \alpha_{ij} f_h(x_j) \rVert` for every head, query and key.

    ``weights (b, h, n, n)``, ``values (b, h, n, d_head)`` (each head's value vectors, bias
    included), ``W_O (d, h * d_head)`` (``out_proj.weight``, stored ``(out, in)``: head ``h``
    owns the columns ``h * d_head .. (h + 1) * d_head - 1``). Returns ``(b, h, n, n)``.
    """
    require_tensor("weights", weights, floating=True)
    require_tensor("values", values, floating=True)
    require_tensor("W_O", W_O, floating=True)
    b, h, n, d_head = values.shape if values.dim() == 4 else (0, 0, 0, 0)
    if (values.dim() != 4 or weights.shape != (b, h, n, n) or W_O.dim() != 2
            or W_O.shape[1] != h * d_head):
        raise ValueError(f"need weights (b, h, n, n), values (b, h, n, d_head), W_O (d, h * d_head); "
                         f"got {shape(weights)}, {shape(values)}, {shape(W_O)}")
    W_h = W_O.view(W_O.shape[0], h, d_head).permute(1, 2, 0)   # (h, d_head, d): head h's slice
    f = torch.einsum("bhjk,hkd->bhjd", values, W_h)            # f_h(x_j): (b, h, n, d)
    return weights * f.norm(dim=-1)[:, :, None, :]             # a_ij ||f_h(x_j)||, a_ij >= 0


@torch.no_grad()
def run_value_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor):
    """Every layer's weights and value-weighted norms on a padded batch: two ``(L, b, h, n, n)``
    tensors. Checks on the way that the heads' terms add up to the attention block's output."""
    mask = key_padding_to_attention_mask(real)                  # (b, 1, n)
    x, weights, norms = enc.embeddings(input_ids), [], []
    for layer in enc.layers:
        att = layer.attention
        out, w = att(x, x, x, mask)                             # (b, n, d), (b, h, n, n)
        v = split_heads(att.v_proj(x), att.num_heads)           # (b, h, n, d_head)
        W_h = att.out_proj.weight.view(-1, att.num_heads, att.d_head).permute(1, 2, 0)
        f = torch.einsum("bhjk,hkd->bhjd", v, W_h)              # (b, h, n, d)
        summed = torch.einsum("bhij,bhjd->bid", w, f) + att.out_proj.bias
        if not torch.allclose(summed, out, atol=1e-4):          # sum_h sum_j a_ij f_h(x_j) + b_O
            raise AssertionError("the heads' terms do not add up to the attention output")
        weights.append(w)
        norms.append(value_norms(w, v, att.out_proj.weight))
        x, _ = layer(x, mask)
    return torch.stack(weights), torch.stack(norms)


@torch.no_grad()
def value_vector_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``||f_h(x_j)||`` for every layer, sentence, head and key: ``(L, b, h, n)`` (padding keys
    included; mask them out with ``real``)."""
    mask = key_padding_to_attention_mask(real)                  # (b, 1, n)
    x, out = enc.embeddings(input_ids), []
    for layer in enc.layers:
        att = layer.attention
        v = split_heads(att.v_proj(x), att.num_heads)           # (b, h, n, d_head)
        W_h = att.out_proj.weight.view(-1, att.num_heads, att.d_head).permute(1, 2, 0)
        out.append(torch.einsum("bhjk,hkd->bhjd", v, W_h).norm(dim=-1))  # (b, h, n)
        x, _ = layer(x, mask)
    return torch.stack(out)


def row_shares(grid: torch.Tensor) -> torch.Tensor:
    """Each row of a non-negative ``(..., n, n)`` grid scaled to sum to one (rows of zeros stay 0),
    so norms and weights can be compared as shares of a query's total."""
    total = grid.sum(dim=-1, keepdim=True)
    return grid / total.clamp_min(torch.finfo(grid.dtype).tiny)


@dataclass(frozen=True)
class Coreference:
    """Weights from "it" to the two nouns of each sentence: ``antecedent (S, L, h)``,
    ``other (S, L, h)``; ``correct (L, h)``: in how many of the ``S`` sentences the head puts more
    weight on the antecedent than on the other noun; ``on_nouns (L, h)``: mean weight on the two
    nouns together. Per pair (sentences ``2k``, ``2k + 1``): ``right (L, h)`` right flips,
    ``wrong (L, h)`` wrong flips; the other pairs are no flips."""

    sentences: list[str]
    antecedent: torch.Tensor
    other: torch.Tensor
    correct: torch.Tensor
    on_nouns: torch.Tensor
    right: torch.Tensor
    wrong: torch.Tensor

    @property
    def pairs(self) -> int:
        return len(self.sentences) // 2


def sign_test(right: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """One-sided sign test per head: ``P(X >= right)`` for ``X ~ Binomial(right + wrong, 1/2)``,
    the chance that a head whose flips go either way with equal odds has this many right ones
    (pairs with no flip are ties and drop out; no flip at all gives 1)."""
    def tail(r: int, w: int) -> float:
        n = r + w
        return sum(math.comb(n, k) for k in range(r, n + 1)) / 2 ** n
    return torch.tensor([tail(int(r), int(w)) for r, w in zip(right.flatten(), wrong.flatten(),
                                                               strict=True)],
                        dtype=torch.float64).view(right.shape)


@torch.no_grad()
def coreference(enc: Encoder, items: list) -> Coreference:
    """``items``: ``[sentence, antecedent, other noun]``, each word one word piece that occurs
    once, and "it" once; items ``2k`` and ``2k + 1`` are a pair with the nouns' roles swapped."""
    if len(items) % 2 or any(items[k][1:] != items[k + 1][2:0:-1] for k in range(0, len(items), 2)):
        raise ValueError("items must come in pairs: the second of each pair swaps the two nouns")
    sentences = [s for s, _, _ in items]
    batch = enc.tokenize(sentences)
    _, A = enc(batch["input_ids"], batch["attention_mask"])     # (L, S, h, n, n)
    ant, oth = [], []
    for s, (sentence, a, o) in enumerate(items):
        tokens = batch["tokens"][s]
        if any(tokens.count(word) != 1 for word in ("it", a, o)):
            raise ValueError(f"{sentence!r}: 'it', {a!r} and {o!r} must each be one word piece "
                             f"that occurs once; word pieces: {tokens}")
        i = tokens.index("it")
        ant.append(A[:, s, :, i, tokens.index(a)])
        oth.append(A[:, s, :, i, tokens.index(o)])
    ant, oth = torch.stack(ant), torch.stack(oth)               # (S, L, h)
    first = ant[0::2] > oth[0::2]      # (P, L, h): prefers the antecedent when it is the first noun
    second = ant[1::2] > oth[1::2]     # ... and when it is the second noun
    return Coreference(sentences, ant, oth, (ant > oth).sum(dim=0), (ant + oth).mean(dim=0),
                       right=(first & second).sum(dim=0), wrong=(~first & ~second).sum(dim=0))
