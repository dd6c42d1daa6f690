r"""Notebook 09 (real_model): the measurements on all-MiniLM-L6-v2's 72 heads that the notebook
runs in view, on the sentences it ships (``data/real_model_sentences.json``).

Every average is over real tokens only: padding is never a query and never a key.

- :func:`entropy_grid`, :func:`sink_shares`, :func:`offset_scores`: one ``(L, h)`` grid per head
  score (mean entropy, weight on a token such as ``[CLS]``, weight on the key ``offset`` away);
- :func:`ablation`: how switching heads off changes the similarity gap of the shipped pairs;
  :func:`gap_change` (and :func:`bootstrap_gap`): one gap's relative change, resampled;
- :func:`run_value_norms`: Kobayashi et al.'s value-weighted norms on every head;
- :func:`coreference` and :func:`sign_test`: which noun "it" reads, pair by pair.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

from .._checks import require_int_in, require_tensor, shape
from ..entropy import attention_entropy, normalized_entropy
from ..masks import key_padding_to_attention_mask
from ..multihead import split_heads
from ..pretrained import Encoder, mean_pool

__all__ = [
    "Ablation", "Attention", "Coreference", "DATA_FILE", "GapChange", "PASS_SHARE",
    "ablation", "bootstrap_gap", "coreference", "draw_ablation", "draw_flips", "entropy_grid",
    "gap_change", "load_sentences", "offset_scores",
    "pair_similarities", "row_shares", "run_attention", "run_value_norms", "sign_test",
    "sink_shares", "top_heads", "value_norms", "value_vector_norms",
]

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "real_model_sentences.json"
#: The pass criterion of the "it" study, fixed before looking at the heads: right flips in at
#: least 90% of the pairs. With 66 pairs that is 60; a head flipping at random does so with
#: probability below 1e-11 (a one-sided binomial tail), so no head should pass by chance.
PASS_SHARE = 0.9


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


@torch.no_grad()
def run_attention(enc: Encoder, sentences: list[str]) -> Attention:
    """Tokenise ``sentences`` and run the encoder once, keeping every head's weights."""
    batch = enc.tokenize(sentences)
    _, weights = enc(batch["input_ids"], batch["attention_mask"])
    return Attention(weights, batch["input_ids"], batch["attention_mask"], batch["tokens"])


# --- head scores: (L, b, h, n, n) weights in, an (L, h) grid out ---------------------------------

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
    r"""Each head's mean entropy over the real queries in nats, and the mean of :math:`H_i / \ln n`
    (``n`` the sentence's real tokens): ``(grid (L, h), normalised (L, h))``."""
    _check(weights, mask)
    entropy = attention_entropy(weights)                                  # (L, b, h, n)
    normalised = normalized_entropy(weights, mask[None, :, None, None, :])  # (L, b, h, n)
    return _mean_over_queries(entropy, mask), _mean_over_queries(normalised, mask)


def sink_shares(weights: torch.Tensor, mask: torch.Tensor, input_ids: torch.Tensor,
                token_id: int) -> torch.Tensor:
    """Mean weight that a real query puts on the keys holding ``token_id`` (e.g. ``enc.cls_id``),
    ``(L, h)``. Averaging over heads gives the share by layer (every head has the same queries)."""
    _check(weights, mask)
    require_tensor("input_ids", input_ids)
    if input_ids.shape != mask.shape:
        raise ValueError(f"input_ids {shape(input_ids)} must have the shape of mask {shape(mask)}")
    is_token = (input_ids == token_id)[None, :, None, None, :]       # (1, b, 1, 1, n)
    return _mean_over_queries((weights * is_token).sum(dim=-1), mask)


def offset_scores(weights: torch.Tensor, mask: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean weight on the key ``offset`` positions away, ``a[i, i + offset]``, over the real
    queries whose key ``i + offset`` is real: ``(L, h)``. ``offset = -1``: previous token."""
    _check(weights, mask)
    n = weights.shape[-1]
    require_int_in("offset", offset, -(n - 1), n - 1)
    i = torch.arange(n)
    j = (i + offset).clamp(0, n - 1)                                  # (n,) the key of query i
    valid = mask & mask[:, j] & (i + offset >= 0) & (i + offset < n)  # (b, n)
    return _mean_over_queries(weights[..., i, j], valid)


def top_heads(scores: torch.Tensor, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` highest entries of an ``(L, h)`` grid as ``(layer, head, score)``, 0-based."""
    require_tensor("scores", scores, floating=True)
    if scores.dim() != 2:
        raise ValueError(f"scores must be an (L, h) grid, got shape {shape(scores)}")
    require_int_in("k", k, 1, scores.numel())
    values, index = scores.flatten().topk(k)
    h = scores.shape[1]
    return [(int(f) // h, int(f) % h, float(v)) for v, f in zip(values, index, strict=True)]


# --- switching heads off ---------------------------------------------------------------------------

def pair_similarities(enc: Encoder, pairs: list, head_mask=None) -> torch.Tensor:
    """Cosine similarity of each ``[a, b]`` pair's sentence embeddings: ``(p,)``."""
    firsts, seconds = zip(*pairs, strict=True)
    e = enc.encode([*firsts, *seconds], head_mask=head_mask)    # (2p, d), unit length
    return (e[: len(pairs)] * e[len(pairs):]).sum(dim=-1)


@dataclass(frozen=True)
class Ablation:
    """Every pair's cosine similarity with all heads on (``paraphrase (p_1,)``,
    ``non_paraphrase (p_2,)``) and with heads off: ``cosines (L, 1 + h, p_1 + p_2)``, with layer
    ``l``'s heads off (``[:, 0]``) or head ``(l, i)`` alone off (``[:, 1 + i]``). A gap over any
    subsets of the pairs follows from these (:func:`gap_change`)."""

    paraphrase: torch.Tensor
    non_paraphrase: torch.Tensor
    cosines: torch.Tensor


@torch.no_grad()
def ablation(enc: Encoder, paraphrases: list, non_paraphrases: list) -> Ablation:
    """Switch off each layer's 12 heads, then each single head, and measure the gap.

    The same numbers as ``pair_similarities(enc, pairs, head_mask)`` for each of the 78 head
    masks, computed faster: the layers before the ablated one run once, and the 13 variants of a
    layer (all heads off, then each head off) run through the later layers as one batch."""
    pairs = [*paraphrases, *non_paraphrases]
    unique = sorted({s for pair in pairs for s in pair})
    first = torch.tensor([unique.index(a) for a, _ in pairs])
    second = torch.tensor([unique.index(b) for _, b in pairs])
    full = enc.tokenize(unique, max_length=enc.cfg.sentence_max_tokens)
    L, h, d = enc.cfg.num_layers, enc.cfg.num_heads, enc.cfg.d_model
    variants = torch.cat([torch.zeros(1, h), 1 - torch.eye(h)]).bool()   # (1 + h, h): off = False
    clean, off = torch.zeros(len(unique), d), torch.zeros(L, 1 + h, len(unique), d)
    # two buckets of similar lengths, each padded only to its own longest sentence: less padding
    for bucket in full["attention_mask"].sum(dim=1).argsort(stable=True).chunk(2):
        real = full["attention_mask"][bucket]
        n = int(real.sum(dim=1).max())
        real, ids = real[:, :n], full["input_ids"][bucket, :n]           # (s, n): padding at the end
        mask = key_padding_to_attention_mask(real)                       # (s, 1, n)
        x, layer_inputs = enc.embeddings(ids), []
        for layer in enc.layers:                                         # the clean run
            layer_inputs.append(x)
            x, _ = layer(x, mask)
        clean[bucket] = mean_pool(x, real)
        for l in range(L):
            x = torch.cat([enc.layers[l](layer_inputs[l], mask, v)[0] for v in variants])
            for later in enc.layers[l + 1:]:
                x, _ = later(x, mask.repeat(1 + h, 1, 1))
            off[l][:, bucket] = mean_pool(x, real.repeat(1 + h, 1)).view(1 + h, len(bucket), d)
    sims = (clean[first] * clean[second]).sum(dim=-1)                    # (pairs,)
    every = (off[:, :, first] * off[:, :, second]).sum(dim=-1)          # (L, 1 + h, pairs)
    n_p = len(paraphrases)
    return Ablation(sims[:n_p], sims[n_p:], every)


def bootstrap_gap(cosines: torch.Tensor, first: range, second: range, generator: torch.Generator,
                  resamples: int = 1000) -> torch.Tensor:
    """The gap ``mean cos(first pairs) - mean cos(second pairs)`` on ``resamples`` resamples: the
    pairs of each group drawn with replacement, within the group. ``cosines (..., p)`` (e.g.
    :attr:`Ablation.cosines`), ``first``/``second`` ranges of pair indices. Returns
    ``(..., resamples)``; the same draws serve every leading index (every ablated head)."""
    require_tensor("cosines", cosines, floating=True)
    p = cosines.shape[-1]
    for name, group in (("first", first), ("second", second)):
        if not isinstance(group, range) or len(group) == 0 or group.start < 0 or group.stop > p:
            raise ValueError(f"{name} must be a non-empty range of pair indices below {p}, "
                             f"got {group!r}")
    require_int_in("resamples", resamples, 1, 10 ** 6)

    def draw(group):                                                  # (resamples, len(group))
        return group.start + torch.randint(len(group), (resamples, len(group)), generator=generator)

    return cosines[..., draw(first)].mean(-1) - cosines[..., draw(second)].mean(-1)


@dataclass(frozen=True)
class GapChange:
    """One similarity gap ``mean cos(first pairs) - mean cos(second pairs)`` under ablation.

    ``gap``: with every head on. ``off (L, 1 + h)``: the gap with layer ``l``'s heads off
    (``[:, 0]``) or head ``(l, i)`` alone off (``[:, 1 + i]``). ``change (L, 1 + h)``:
    ``(off - gap) / |gap|``, so that > 0 always means the gap grew (moved the right way) and < 0
    that it shrank, whatever the gap's sign. ``boot (L, 1 + h, resamples)``: ``change`` on pairs
    resampled within each group (:func:`bootstrap_gap`), each resample against its own gap."""

    gap: float
    off: torch.Tensor
    change: torch.Tensor
    boot: torch.Tensor


def gap_change(abl: Ablation, first: range, second: range, generator: torch.Generator,
               resamples: int = 1000) -> GapChange:
    """The gap of :class:`GapChange` from an :func:`ablation`'s cosines: ``first``/``second`` are
    ranges of pair indices (paraphrases first, then non-paraphrases, as passed to ablation)."""
    L, variants, p = abl.cosines.shape
    on = torch.cat([abl.paraphrase, abl.non_paraphrase])                   # (p,) every head on
    every = torch.cat([on[None], abl.cosines.flatten(0, 1)])               # (1 + L (1 + h), p)
    value = every[:, list(first)].mean(-1) - every[:, list(second)].mean(-1)
    boot = bootstrap_gap(every, first, second, generator, resamples)       # (1 + L (1 + h), R)
    return GapChange(float(value[0]), value[1:].view(L, variants),
                     ((value[1:] - value[0]) / value[0].abs()).view(L, variants),
                     ((boot[1:] - boot[0]) / boot[0].abs()).view(L, variants, -1))


def draw_ablation(groups: dict, changes: dict, bounds: dict) -> None:
    """Notebook 09's ablation figure: the pairs' cosines by group (all heads on), each gap's
    change with one layer's heads off (95% of resamples as error bars), and with one head off
    (a heatmap per gap on the scale ``+-bounds[name]``). ``changes``: name -> :class:`GapChange`."""
    import matplotlib.pyplot as plt

    from ..plots import heatmap
    fig, axes = plt.subplot_mosaic([["pairs", "layers"], ["easy", "swap"]], figsize=(16, 8.4),
                                   gridspec_kw={"width_ratios": [1, 1.6]}, layout="constrained")
    colors = ("#1f77b4", "#17becf", "#ff7f0e", "#d62728")
    for x, (cos, color) in enumerate(zip(groups.values(), colors, strict=True)):
        spread = torch.linspace(-0.3, 0.3, len(cos))                 # sideways in order of value
        axes["pairs"].scatter(x + spread[cos.argsort().argsort()], cos, s=24, facecolors="none",
                              edgecolors=color, linewidths=1.3)
    axes["pairs"].set(xticks=range(len(groups)), ylabel="cosine similarity", xlim=(-0.6, 3.6),
                      title="the pairs, all heads on")
    axes["pairs"].set_xticklabels([textwrap.fill(name, 11) for name in groups], fontsize=8)
    for shift, name, color in ((-0.2, "g_easy", "#3b75af"), (0.2, "g_swap", "#f28e2b")):
        c = changes[name]
        lo, hi = c.boot[:, 0].quantile(0.025, dim=-1), c.boot[:, 0].quantile(0.975, dim=-1)
        mid = c.change[:, 0]
        axes["layers"].bar(torch.arange(1, len(mid) + 1) + shift, mid, width=0.4, color=color,
                           label=f"{name} = {c.gap:.3f}", yerr=torch.stack([mid - lo, hi - mid]),
                           capsize=3)
    axes["layers"].axhline(0, color="black", linewidth=0.8)
    axes["layers"].set(xlabel="layer switched off (all 12 heads)",
                       ylabel="(gap off - gap on) / |gap on|\n> 0: the gap rises (better)",
                       title="one layer's heads off (bars: 95% of resamples)")
    axes["layers"].legend(fontsize=8)
    for key, name in (("easy", "g_easy"), ("swap", "g_swap")):
        c, bound = changes[name], bounds[name]
        h = c.change.shape[1] - 1
        heatmap(c.change[:, 1:], [str(i) for i in range(1, h + 1)],
                [str(i) for i in range(1, len(c.change) + 1)], ax=axes[key], vmin=-bound,
                vmax=bound, cmap="RdBu", xlabel="head", ylabel="layer",
                title=f"one head off: change of {name} / |{name}| (blue: rises, red: falls; "
                      f"scale: the bound, ±{bound})")
        axes[key].tick_params(axis="x", labelrotation=0)
    plt.show()


def draw_flips(enc: Encoder, co: Coreference, layer: int, head: int, need: int) -> None:
    """Notebook 09's figure of the "it" test: each head's right flips out of ``co.pairs`` (the pass
    criterion ``need`` in the title), and the row of "it" of head ``(layer, head)`` (0-based) on
    the first pair's two sentences."""
    import matplotlib.pyplot as plt

    from ..plots import heatmap
    P, (L, h) = co.pairs, co.right.shape
    fig, (ax_grid, ax_row) = plt.subplots(1, 2, figsize=(15, 3.8),
                                          gridspec_kw={"width_ratios": [1.6, 1]})
    heatmap(co.right.float(), [str(i) for i in range(1, h + 1)], [str(i) for i in range(1, L + 1)],
            ax=ax_grid, vmin=0, vmax=P, xlabel="head", ylabel="layer",
            title=f"right flips of each head, out of {P} pairs (pass: {need})")
    for (l, i), count in zip(torch.cartesian_prod(torch.arange(L), torch.arange(h)).tolist(),
                             co.right.flatten().tolist(), strict=True):   # counts in the cells
        ax_grid.text(i, l, str(count), ha="center", va="center", fontsize=8,
                     color="white" if count < P / 2 else "black")
    ax_grid.tick_params(axis="x", labelrotation=0)
    batch = enc.tokenize(co.sentences[:2])
    with torch.no_grad():
        _, pair = enc(batch["input_ids"], batch["attention_mask"])
    for s, shift in ((0, -0.2), (1, 0.2)):
        toks = batch["tokens"][s]
        row = pair[layer, s, head, toks.index("it"), : len(toks)]
        ax_row.bar(torch.arange(len(toks)) + shift, row, width=0.4, label=co.sentences[s][-14:])
    ax_row.set_xticks(range(len(toks)), toks, rotation=90)
    ax_row.set(ylabel="weight from 'it'", ylim=(0, 1),
               title=f"layer {layer + 1} head {head + 1}: the row of 'it' in the first pair")
    ax_row.legend(fontsize=8)
    plt.show()


# --- value-weighted norms (Kobayashi et al., 2020) -------------------------------------------------

def value_norms(weights: torch.Tensor, values: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    r""":math:`\lVert a_{ij} f_h(x_j) \rVert` with :math:`f_h(x_j) = v^{(h)}_j W_O^{(h)}`.

    ``weights (b, h, n, n)``, ``values (b, h, n, d_head)`` (bias included), ``W_O (d, h * d_head)``
    (``out_proj.weight``, which stores :math:`W_O` transposed: head ``h``'s block of rows of
    :math:`W_O` is its columns ``h * d_head .. (h + 1) * d_head - 1``).
    Returns ``(b, h, n, n)``."""
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


def _head_vectors(att, x: torch.Tensor) -> torch.Tensor:
    """``f_h(x_j) = v_j^(h) W_O^(h)`` of one attention module on ``x (b, n, d)``: ``(b, h, n, d)``."""
    v = split_heads(att.v_proj(x), att.num_heads)               # (b, h, n, d_head)
    W_h = att.out_proj.weight.view(-1, att.num_heads, att.d_head).permute(1, 2, 0)
    return torch.einsum("bhjk,hkd->bhjd", v, W_h)


@torch.no_grad()
def run_value_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor):
    """Every layer's weights and value-weighted norms on a padded batch: two ``(L, b, h, n, n)``
    tensors. Checks on the way that the heads' terms add up to the attention block's output."""
    mask = key_padding_to_attention_mask(real)                  # (b, 1, n)
    x, weights, norms = enc.embeddings(input_ids), [], []
    for layer in enc.layers:
        att = layer.attention
        out, w = att(x, x, x, mask)                             # (b, n, d), (b, h, n, n)
        f = _head_vectors(att, x)                               # (b, h, n, d)
        summed = torch.einsum("bhij,bhjd->bid", w, f) + att.out_proj.bias
        if not torch.allclose(summed, out, atol=1e-4):          # sum_h sum_j a_ij f_h(x_j) + b_O
            raise AssertionError("the heads' terms do not add up to the attention output")
        weights.append(w)
        norms.append(w * f.norm(dim=-1)[:, :, None, :])         # value_norms, unchecked
        x, _ = layer(x, mask)
    return torch.stack(weights), torch.stack(norms)


@torch.no_grad()
def value_vector_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``||f_h(x_j)||`` for every layer, sentence, head and key: ``(L, b, h, n)`` (padding keys
    included; mask them out with ``real``)."""
    mask = key_padding_to_attention_mask(real)                  # (b, 1, n)
    x, out = enc.embeddings(input_ids), []
    for layer in enc.layers:
        out.append(_head_vectors(layer.attention, x).norm(dim=-1))   # (b, h, n)
        x, _ = layer(x, mask)
    return torch.stack(out)


def row_shares(grid: torch.Tensor) -> torch.Tensor:
    """Each row of a non-negative ``(..., n, n)`` grid scaled to sum to one (rows of zeros stay 0),
    so norms and weights can be compared as shares of a query's total."""
    return grid / grid.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(grid.dtype).tiny)


# --- which noun does "it" read? ----------------------------------------------------------------------

@dataclass(frozen=True)
class Coreference:
    """Weights from "it" to the two nouns of each sentence: ``antecedent (S, L, h)``,
    ``other (S, L, h)``; ``correct (L, h)``: in how many of the ``S`` sentences the head puts more
    weight on the antecedent; ``on_nouns (L, h)``: mean weight on the two nouns together. Per pair
    (sentences ``2k``, ``2k + 1``): ``right (L, h)`` right flips (the preferred noun follows the
    antecedent), ``wrong (L, h)`` wrong flips; the other pairs are no flips."""

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
    """One-sided sign test per head: ``P(X >= right)`` for ``X ~ Binomial(right + wrong, 1/2)``
    (pairs with no flip are ties and drop out; no flip at all gives 1)."""
    def tail(r: int, w: int) -> float:
        return sum(math.comb(r + w, k) for k in range(r, r + w + 1)) / 2 ** (r + w)
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
