r"""Notebook 09 (real_model): what the 72 heads of a real pretrained model do, measured.

The model is all-MiniLM-L6-v2 (6 layers x 12 heads) from :mod:`attn_helpers.pretrained`; the
sentences are a small shipped set (``data/real_model_sentences.json``, written for this course):
varied English sentences, and pairs that do or do not mean the same. Every analysis averages over
real tokens only: padding is never a query and never a key.

- :func:`entropy_grid`: each head's mean entropy (nats) against the ``ln n`` ceiling;
- :func:`sink_shares`: how much attention goes to ``[CLS]`` and to ``[SEP]`` (attention sinks);
- :func:`offset_scores`: the mean weight a head puts on the token ``offset`` places away, which
  finds previous-token (``offset = -1``) and next-token (``+1``) heads without hand-picking;
- :func:`ablation`: how switching heads off changes the gap
  ``mean cos(paraphrase pairs) - mean cos(non-paraphrase pairs)`` on the shipped pairs;
- value-weighted norms and the "it" study: :mod:`.real_model_studies`.

:func:`analyse` runs them all; :func:`claims` states what the notebook says, as named booleans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .._checks import require_int_in, require_tensor, shape
from ..entropy import attention_entropy, normalized_entropy
from ..masks import key_padding_to_attention_mask
from ..pretrained import Encoder, load_encoder, mean_pool
from ..training import single_thread
from .real_model_studies import (
    Coreference,
)

__all__ = [
    "Ablation", "Analysis", "Attention", "DATA_FILE", "ablation", "analyse", "claims",
    "entropy_grid", "load_sentences", "offset_scores", "pair_similarities", "run_attention",
    "sink_shares", "top_heads", "transformers_claims",
]

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "real_model_sentences.json"
# The thresholds of the claims, defined once (see claims()).
UNIFORM_MAX = 0.95          # every head's mean entropy stays below 0.95 ln n (measured: <= 0.88)
PREVIOUS_TOKEN_MIN = 0.9    # the best previous-token head puts > 90 % of its weight on i - 1
NEXT_TOKEN_MIN = 0.5        # the best next-token head puts > half of its weight on i + 1
CLS_SINK_MIN = 0.5          # in layers 2-5, more than half of all attention lands on [CLS]
SINGLE_HEAD_MAX = 0.1       # no single head moves the similarity gap by a tenth of it or more


def load_sentences() -> dict[str, list]:
    """The shipped set: sentences, (non_)paraphrases (``[a, b]`` pairs) and coreference items."""
    data = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return {key: data[key] for key in ("sentences", "paraphrases", "non_paraphrases", "coreference")}


@dataclass(frozen=True)
class Attention:
    """Every head's weights on a batch: ``weights (L, b, h, n, n)``, ``input_ids``/``mask``
    ``(b, n)`` (mask True = real token) and ``tokens`` (word pieces of each sentence)."""

    weights: torch.Tensor
    input_ids: torch.Tensor
    mask: torch.Tensor
    tokens: list[list[str]]


def run_attention(enc: Encoder, sentences: list[str]) -> Attention:
    """Tokenise ``sentences`` and run the encoder once, keeping every head's weights."""
    batch = enc.tokenize(sentences)
    _, weights = enc(batch["input_ids"], batch["attention_mask"])
    return Attention(weights, batch["input_ids"], batch["attention_mask"], batch["tokens"])


def _check(weights: torch.Tensor, mask: torch.Tensor) -> None:
    require_tensor("weights", weights, floating=True)
    require_tensor("mask", mask)
    if weights.dim() != 5 or mask.dtype != torch.bool or mask.shape != (weights.shape[1],
                                                                       weights.shape[3]):
        raise ValueError(f"weights must be (L, b, h, n, n) and mask bool (b, n); got weights "
                         f"{shape(weights)}, mask {mask.dtype} {shape(mask)}")


def _mean_over_queries(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of ``x (L, b, h, n)`` over the ``(b, n)`` queries where ``valid`` -> ``(L, h)``."""
    v = valid[None, :, None, :].to(x.dtype)        # (1, b, 1, n)
    return (x * v).sum(dim=(1, 3)) / v.sum(dim=(1, 3))


def entropy_grid(weights: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Each head's mean entropy over the real queries, in nats, and as a fraction of its ceiling.

    Returns ``(grid (L, h), normalised (L, h))``: ``grid`` is the mean of :math:`H_i`, the
    entropy of query ``i``'s row (padding keys carry weight 0, so it is over real keys);
    ``normalised`` the mean of :math:`H_i / \ln n`, ``n`` the sentence's number of real tokens
    (:func:`~attn_helpers.entropy.normalized_entropy`)."""
    _check(weights, mask)
    entropy = attention_entropy(weights)                                  # (L, b, h, n)
    normalised = normalized_entropy(weights, mask[None, :, None, None, :])  # (L, b, h, n)
    return _mean_over_queries(entropy, mask), _mean_over_queries(normalised, mask)


def mean_ceiling(mask: torch.Tensor) -> float:
    """``ln n`` averaged over the same real queries as :func:`entropy_grid` (its grid's ceiling)."""
    n = mask.sum(dim=1).to(torch.float32)                    # (b,)
    return float((n * torch.log(n)).sum() / n.sum())


def sink_shares(weights: torch.Tensor, mask: torch.Tensor, input_ids: torch.Tensor,
                token_id: int) -> torch.Tensor:
    """Mean weight that a real query puts on the keys holding ``token_id`` (e.g. ``enc.cls_id``),
    ``(L, h)``. Averaging over heads gives the share by layer (every head has the same queries).
    """
    _check(weights, mask)
    require_tensor("input_ids", input_ids)
    if input_ids.shape != mask.shape:
        raise ValueError(f"input_ids {shape(input_ids)} must have the shape of mask {shape(mask)}")
    is_token = (input_ids == token_id)[None, :, None, None, :]       # (1, b, 1, 1, n)
    share = (weights * is_token).sum(dim=-1)                         # (L, b, h, n)
    return _mean_over_queries(share, mask)


def offset_scores(weights: torch.Tensor, mask: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean weight on the key ``offset`` positions away, ``a[i, i + offset]``, over the real
    queries whose key ``i + offset`` is real: ``(L, h)``. ``offset = -1``: previous token."""
    _check(weights, mask)
    n = weights.shape[-1]
    require_int_in("offset", offset, -(n - 1), n - 1)
    i = torch.arange(n)
    j = (i + offset).clamp(0, n - 1)                                  # (n,) the key of query i
    valid = mask & mask[:, j] & (i + offset >= 0) & (i + offset < n)  # (b, n)
    on_key = weights[..., i, j]                                       # (L, b, h, n)
    return _mean_over_queries(on_key, valid)


def top_heads(scores: torch.Tensor, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` highest entries of an ``(L, h)`` grid as ``(layer, head, score)``, 0-based."""
    require_tensor("scores", scores, floating=True)
    if scores.dim() != 2:
        raise ValueError(f"scores must be an (L, h) grid, got shape {shape(scores)}")
    require_int_in("k", k, 1, scores.numel())
    values, index = scores.flatten().topk(k)
    h = scores.shape[1]
    return [(int(f) // h, int(f) % h, float(v)) for v, f in zip(values, index, strict=True)]


def pair_similarities(enc: Encoder, pairs: list, head_mask=None) -> torch.Tensor:
    """Cosine similarity of each ``[a, b]`` pair's sentence embeddings: ``(p,)``."""
    firsts, seconds = zip(*pairs, strict=True)
    e = enc.encode([*firsts, *seconds], head_mask=head_mask)    # (2p, d), unit length
    return (e[: len(pairs)] * e[len(pairs):]).sum(dim=-1)


@dataclass(frozen=True)
class Ablation:
    """Similarity gap ``mean cos(paraphrases) - mean cos(non-paraphrases)`` and its changes.

    ``layer_delta (L,)``: change when all heads of layer ``l`` are off; ``head_delta (L, h)``:
    when head ``(l, i)`` alone is off; ``layer_separation (L,)``: with layer ``l`` off, the
    lowest paraphrase similarity minus the highest non-paraphrase one (> 0: still separated);
    ``head_separation (L, h)``: the same with head ``(l, i)`` alone off.
    """

    paraphrase: torch.Tensor
    non_paraphrase: torch.Tensor
    gap: float
    layer_delta: torch.Tensor
    head_delta: torch.Tensor
    layer_separation: torch.Tensor
    head_separation: torch.Tensor


@torch.no_grad()
def ablation(enc: Encoder, paraphrases: list, non_paraphrases: list) -> Ablation:
    """Switch off each layer's 12 heads, then each single head, and measure the gap.

    The same numbers as ``pair_similarities(enc, pairs, head_mask)`` for each of the 78 head
    masks, computed faster: the layers before the ablated one are run once, and the 13 variants
    of a layer (all heads off, then each head off) run through the later layers as one batch.
    """
    pairs = [*paraphrases, *non_paraphrases]
    unique = sorted({s for pair in pairs for s in pair})
    first = torch.tensor([unique.index(a) for a, _ in pairs])
    second = torch.tensor([unique.index(b) for _, b in pairs])
    batch = enc.tokenize(unique, max_length=enc.cfg.sentence_max_tokens)
    real = batch["attention_mask"]                                   # (s, n)
    mask = key_padding_to_attention_mask(real)                       # (s, 1, n)
    L, h = enc.cfg.num_layers, enc.cfg.num_heads

    def cosines(hidden, copies=1):                                   # (copies * s, n, d)
        e = mean_pool(hidden, real.repeat(copies, 1)).view(copies, len(unique), -1)
        return (e[:, first] * e[:, second]).sum(dim=-1)              # (copies, pairs)

    x, layer_inputs = enc.embeddings(batch["input_ids"]), []
    for layer in enc.layers:                                         # the clean run
        layer_inputs.append(x)
        x, _ = layer(x, mask)
    sims = cosines(x)[0]
    n_p = len(paraphrases)
    base = float(sims[:n_p].mean() - sims[n_p:].mean())

    variants = torch.cat([torch.zeros(1, h), 1 - torch.eye(h)]).bool()   # (1 + h, h): off = False
    gaps, separation = torch.zeros(L, 1 + h), torch.zeros(L, 1 + h)
    for l in range(L):
        x = torch.cat([enc.layers[l](layer_inputs[l], mask, v)[0] for v in variants])
        for later in enc.layers[l + 1:]:
            x, _ = later(x, mask.repeat(1 + h, 1, 1))
        s = cosines(x, 1 + h)                                        # (1 + h, pairs)
        gaps[l] = s[:, :n_p].mean(dim=1) - s[:, n_p:].mean(dim=1)
        separation[l] = s[:, :n_p].min(dim=1).values - s[:, n_p:].max(dim=1).values
    return Ablation(sims[:n_p], sims[n_p:], base, gaps[:, 0] - base, gaps[:, 1:] - base,
                    separation[:, 0], separation[:, 1:])


@dataclass(frozen=True)
class Analysis:
    """Everything notebook 09 measures on the shipped sentences; see :func:`analyse`."""

    attention: Attention
    entropy: torch.Tensor           # (L, h) mean entropy, nats
    normalised_entropy: torch.Tensor  # (L, h) mean H / ln n
    ceiling: float                  # mean ln n over the same queries
    cls_share: torch.Tensor         # (L, h) mean weight on [CLS]
    sep_share: torch.Tensor         # (L, h) mean weight on [SEP]
    chance: float                   # mean 1/n: the weight any one key gets from a uniform row
    previous_token: torch.Tensor    # (L, h) offset_scores(-1)
    next_token: torch.Tensor        # (L, h) offset_scores(+1)
    ablation: Ablation
    norms: torch.Tensor             # (L, b, h, n, n) ||a_ij f(x_j)||
    cls_norm_share: torch.Tensor    # (L, h) [CLS]'s share of each row's summed norms
    sep_norm_share: torch.Tensor    # (L, h) the same for [SEP]
    previous_token_norm: torch.Tensor  # (L, h) offset_scores(-1) on the norm shares
    cls_vector_ratio: torch.Tensor  # (L, h) mean over sentences of ||f(x_CLS)|| / median ||f(x_j)||
    coreference: Coreference


def analyse(enc: Encoder | None = None, data: dict | None = None) -> Analysis:
    """Run every analysis on the shipped set (or on ``data`` with the same keys)."""
    from .real_model_norms import beyond_weights  # value-weighted norms, the "it" study

    enc = load_encoder() if enc is None else enc
    data = load_sentences() if data is None else data
    # One thread: many small forward passes, where a second thread beside other work only waits
    # for its core (6 s on one thread, 35 s on two beside CI's other lane, on 2 cores).
    with single_thread():
        att = run_attention(enc, data["sentences"])
        w, m = att.weights, att.mask
        entropy, normalised = entropy_grid(w, m)
        n = m.sum(dim=1).to(torch.float32)
        return Analysis(
            attention=att, entropy=entropy, normalised_entropy=normalised,
            ceiling=mean_ceiling(m),
            cls_share=sink_shares(w, m, att.input_ids, enc.cls_id),
            sep_share=sink_shares(w, m, att.input_ids, enc.sep_id),
            chance=float(len(n) / n.sum()),  # mean over real queries of 1/n
            previous_token=offset_scores(w, m, -1), next_token=offset_scores(w, m, +1),
            ablation=ablation(enc, data["paraphrases"], data["non_paraphrases"]),
            **beyond_weights(enc, att, data),
        )


def transformers_claims(hidden, hidden_ref, attentions, attentions_ref, real) -> dict[str, bool]:
    """Section 2's finding: the rebuilt model equals ``transformers``' ``BertModel`` at the real
    positions (``hidden (b, n, d)``, ``attentions (L, b, h, n, n)``, ``real (b, n)``)."""
    real_rows = real[None, :, None, :, None].expand_as(attentions)     # real queries only
    return {
        "hidden states equal transformers' within 1e-4": bool(
            (hidden - hidden_ref).abs()[real].max() < 1e-4),
        "all 72 heads' weights equal transformers' within 1e-5": bool(
            (attentions - attentions_ref).abs()[real_rows].max() < 1e-5),
    }


#: The notebook's sections and how many claims each has, in the order claims() states them.
SECTIONS = {"entropy": 2, "positional": 4, "sinks": 3, "ablation": 5, "norms": 5, "coreference": 5,
            "norm_heads": 2}


def claims(a: Analysis, section: str | None = None) -> dict[str, bool]:
    """The statements notebook 09 makes, each checked on the measured numbers; ``section`` (one
    of :data:`SECTIONS`) keeps the claims of one section of the notebook.

    Layers are 0-based here; the notebook says "layer 1" for layer 0.
    """
    if not isinstance(a, Analysis):
        raise TypeError(f"a must be the Analysis returned by analyse(), got {type(a).__name__}")
    if section is not None and section not in SECTIONS:
        raise ValueError(f"section must be one of {', '.join(SECTIONS)}, got {section!r}")
    every = _claims(a)
    if section is None:
        return every
    start = sum(list(SECTIONS.values())[: list(SECTIONS).index(section)])
    return dict(list(every.items())[start: start + SECTIONS[section]])


def _claims(a: Analysis) -> dict[str, bool]:
    from .real_model_norms import claims_beyond_weights  # it imports this module

    layer_entropy = a.entropy.mean(dim=1)                          # (L,)
    middle = slice(1, -1)                                           # layers 2..5 in the notebook
    cls_by_layer, sep_by_layer = a.cls_share.mean(dim=1), a.sep_share.mean(dim=1)
    sinks = cls_by_layer + sep_by_layer
    prev_l, prev_h, prev_score = top_heads(a.previous_token, 1)[0]
    next_l, _, next_score = top_heads(a.next_token, 1)[0]
    sharpest = divmod(int(a.entropy.argmin()), a.entropy.shape[1])
    abl = a.ablation
    return {
        f"no head is uniform (every head below {UNIFORM_MAX} ln n)": bool(
            (a.normalised_entropy < UNIFORM_MAX).all()),
        "middle layers are sharper than the first and the last": bool(
            layer_entropy[middle].max() < min(layer_entropy[0], layer_entropy[-1])),
        "the sharpest head is the previous-token head": sharpest == (prev_l, prev_h),
        f"a previous-token head puts > {PREVIOUS_TOKEN_MIN} of its weight on the previous token": (
            prev_score > PREVIOUS_TOKEN_MIN),
        f"a next-token head puts > {NEXT_TOKEN_MIN} of its weight on the next token": (
            next_score > NEXT_TOKEN_MIN),
        "both positional heads sit in the first two layers": prev_l <= 1 and next_l <= 1,
        f"more than {CLS_SINK_MIN} of the attention goes to [CLS] in layers 2-5": bool(
            (cls_by_layer[middle] > CLS_SINK_MIN).all()),
        "[CLS] gets more attention than [SEP] in every layer": bool(
            (cls_by_layer > sep_by_layer).all()),
        "sinks take more in the middle layers than in the first and the last": bool(
            sinks[middle].min() > max(sinks[0], sinks[-1])),
        "on these pairs, every paraphrase is more similar than every non-paraphrase": bool(
            abl.paraphrase.min() > abl.non_paraphrase.max()),
        "switching off the last layer's heads narrows the gap most": bool(
            abl.layer_delta[-1] < 0 and abl.layer_delta.argmin() == len(abl.layer_delta) - 1),
        f"no single head moves the gap by {SINGLE_HEAD_MAX} of it": bool(
            (abl.head_delta.abs() < SINGLE_HEAD_MAX * abl.gap).all()),
        "with any one layer's heads off, these pairs stay separated": bool(
            (abl.layer_separation > 0).all()),
        "with any single head off, these pairs stay separated": bool(
            (abl.head_separation > 0).all()),
        **claims_beyond_weights(a),
    }
