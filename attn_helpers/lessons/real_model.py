r"""Notebook 09: all-MiniLM-L6-v2's heads measured on the shipped sentences. Head scores, one
``(L, h)`` grid each, average over real queries only (padding is never a key); :func:`heads_off`
switches heads off; :func:`run_value_norms` gives Kobayashi et al.'s value-weighted norms."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .._checks import require_int_in, require_tensor, shape
from ..entropy import attention_entropy, normalized_entropy
from ..masks import key_padding_to_attention_mask
from ..multihead import split_heads
from ..pretrained import Encoder, mean_pool

__all__ = ["DATA_FILE", "ablation", "entropy_grid", "heads_off", "load_sentences", "offset_scores",
           "run_value_norms", "sink_shares"]

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "real_model_sentences.json"


def load_sentences() -> dict[str, list]:
    """The shipped set: sentences, (non_)paraphrases (``[a, b]`` pairs) and coreference items."""
    data = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return {key: data[key] for key in ("sentences", "paraphrases", "non_paraphrases", "coreference")}


# --- head scores: (L, b, h, n, n) weights in, an (L, h) grid out ---------------------------------

def _check(weights: torch.Tensor, mask: torch.Tensor) -> None:
    require_tensor("weights", weights, floating=True)
    require_tensor("mask", mask)
    if weights.dim() != 5 or mask.dtype != torch.bool or mask.shape != (weights.shape[1],
                                                                       weights.shape[3]):
        raise ValueError(f"weights must be (L, b, h, n, n) and mask bool (b, n); got weights "
                         f"{shape(weights)}, mask {mask.dtype} {shape(mask)}")


def _mean_over_queries(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    v = valid[None, :, None, :].to(x.dtype)        # (1, b, 1, n)
    return (x * v).sum(dim=(1, 3)) / v.sum(dim=(1, 3))


def entropy_grid(weights: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(L, h)`` mean entropy over the real queries (nats) and ``(L, h)`` mean of
    :math:`H_i / \ln n`, ``n`` the sentence's real tokens."""
    _check(weights, mask)
    entropy = attention_entropy(weights)                                  # (L, b, h, n)
    normalised = normalized_entropy(weights, mask[None, :, None, None, :])  # (L, b, h, n)
    return _mean_over_queries(entropy, mask), _mean_over_queries(normalised, mask)


def sink_shares(weights: torch.Tensor, mask: torch.Tensor, input_ids: torch.Tensor,
                token_id: int) -> torch.Tensor:
    """``(L, h)``: mean weight a real query puts on the keys holding ``token_id``."""
    _check(weights, mask)
    require_tensor("input_ids", input_ids)
    if input_ids.shape != mask.shape:
        raise ValueError(f"input_ids {shape(input_ids)} must have the shape of mask {shape(mask)}")
    is_token = (input_ids == token_id)[None, :, None, None, :]       # (1, b, 1, 1, n)
    return _mean_over_queries((weights * is_token).sum(dim=-1), mask)


def offset_scores(weights: torch.Tensor, mask: torch.Tensor, offset: int) -> torch.Tensor:
    """``(L, h)``: mean ``a[i, i + offset]`` over real queries whose key ``i + offset`` is real."""
    _check(weights, mask)
    n = weights.shape[-1]
    require_int_in("offset", offset, -(n - 1), n - 1)
    i = torch.arange(n)
    j = (i + offset).clamp(0, n - 1)                                  # (n,) the key of query i
    valid = mask & mask[:, j] & (i + offset >= 0) & (i + offset < n)  # (b, n)
    return _mean_over_queries(weights[..., i, j], valid)


# --- switching heads off ---------------------------------------------------------------------------

@torch.no_grad()
def heads_off(enc: Encoder, x: torch.Tensor, real: torch.Tensor, layer: int,
              keep: torch.Tensor) -> torch.Tensor:
    """``(k, s, d)`` sentence embeddings, layer ``layer``'s (0-based) heads off where ``keep (k, h)``
    is False; ``x (s, n, d)`` is that layer's input, ``real (s, n)`` True at real tokens."""
    mask = key_padding_to_attention_mask(real)                           # (s, 1, n)
    x = torch.cat([enc.layers[layer](x, mask, row)[0] for row in keep])  # (k s, n, d)
    for later in enc.layers[layer + 1:]:
        x, _ = later(x, mask.repeat(len(keep), 1, 1))
    return mean_pool(x, real.repeat(len(keep), 1)).view(len(keep), len(real), -1)


@torch.no_grad()
def ablation(enc: Encoder, pairs: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Each ``[a, b]`` pair's cosine with all heads on ``(p,)``, and off ``(L, 1 + h, p)``:
    ``[l, 0]`` layer l's heads all off, ``[l, 1 + i]`` head (l, i) alone off."""
    unique = sorted({s for pair in pairs for s in pair})
    a, b = (torch.tensor([unique.index(pair[k]) for pair in pairs]) for k in (0, 1))
    batch, L, h, d = enc.tokenize(unique), len(enc.layers), enc.cfg.num_heads, enc.cfg.d_model
    keep = torch.cat([torch.zeros(1, h), 1 - torch.eye(h)]).bool()      # (1 + h, h): False = off
    on, off = torch.zeros(len(unique), d), torch.zeros(L, 1 + h, len(unique), d)
    for bucket in batch["attention_mask"].sum(dim=1).argsort(stable=True).chunk(4):  # by length
        n = int(batch["attention_mask"][bucket].sum(dim=1).max())       # pad only to the longest
        real, x = batch["attention_mask"][bucket, :n], enc.embeddings(batch["input_ids"][bucket, :n])
        for l, layer in enumerate(enc.layers):
            off[l][:, bucket] = heads_off(enc, x, real, l, keep)        # layers l.. on 1 + h variants
            x, _ = layer(x, key_padding_to_attention_mask(real))        # the next layer's input
        on[bucket] = mean_pool(x, real)
    return (on[a] * on[b]).sum(dim=-1), (off[:, :, a] * off[:, :, b]).sum(dim=-1)


# --- value-weighted norms (Kobayashi et al., 2020) -------------------------------------------------

@torch.no_grad()
def run_value_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor):
    r"""Weights :math:`a_{ij}` and norms :math:`\lVert a_{ij} f_h(x_j) \rVert`, both
    ``(L, b, h, n, n)``, and :math:`\lVert f_h(x_j) \rVert` ``(L, b, h, n)``, with
    :math:`f_h(x_j) = v^{(h)}_j W_O^{(h)}`."""
    mask = key_padding_to_attention_mask(real)                  # (b, 1, n)
    x, out = enc.embeddings(input_ids), []
    for layer in enc.layers:
        att = layer.attention
        y, w = att(x, x, x, mask)                               # (b, n, d), (b, h, n, n)
        v = split_heads(att.v_proj(x), att.num_heads)           # (b, h, n, d_head)
        W_h = att.out_proj.weight.view(-1, att.num_heads, att.d_head).permute(1, 2, 0)
        f = torch.einsum("bhjk,hkd->bhjd", v, W_h)              # f_h(x_j): (b, h, n, d)
        summed = torch.einsum("bhij,bhjd->bid", w, f) + att.out_proj.bias
        if not torch.allclose(summed, y, atol=1e-4):            # sum_h sum_j a_ij f_h(x_j) + b_O
            raise AssertionError("the heads' terms do not add up to the attention output")
        out.append((w, w * f.norm(dim=-1)[:, :, None, :], f.norm(dim=-1)))
        x, _ = layer(x, mask)
    return tuple(torch.stack(t) for t in zip(*out, strict=True))
