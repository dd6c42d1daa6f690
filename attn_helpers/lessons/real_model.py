r"""Notebook 09's helpers: head scores ``(L, h)`` over real queries, ablations, stimuli, figures."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from .._checks import require_int_in, require_tensor, shape
from ..entropy import attention_entropy, normalized_entropy
from ..masks import key_padding_to_attention_mask
from ..multihead import merge_heads, split_heads
from ..plots import heatmap, weights_cmap
from ..pretrained import Encoder, mean_pool

__all__ = ["DATA_FILE", "IT_TEMPLATES", "TRIPLES", "ablated_embeddings", "entropy_grid", "gap_changes",
           "heads_off", "interval", "it_items", "load_sentences", "offset_scores", "order_sensitivity",
           "plot_ablation", "plot_entropy", "plot_flips", "plot_layer", "plot_offsets", "plot_shares",
           "resampled", "run_value_norms", "sink_shares", "template_sentences", "top_heads",
           "weights_from_it"]

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "real_model_sentences.json"


def load_sentences() -> dict[str, list]:
    """The shipped set: sentences, (non_)paraphrases (``[a, b]`` pairs), coreference items, about."""
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))


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
    r"""``(L, h)`` mean entropy over real queries (nats), and mean :math:`H_i / \ln n` (real ``n``)."""
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
    """``(k, s, d)`` embeddings, layer ``layer``'s (0-based) heads off where ``keep (k, h)`` is False;
    ``x (s, n, d)``: its input, ``real (s, n)``: True at real tokens. Weights computed once for all k."""
    mask, block = key_padding_to_attention_mask(real), enc.layers[layer]    # (s, 1, n)
    att, k = block.attention, len(keep)
    _, weights = att(x, x, x, mask)                                      # (s, h, n, n)
    heads = weights @ split_heads(att.v_proj(x), att.num_heads)          # (s, h, n, d_head)
    heads = heads * keep.to(x.dtype)[:, None, :, None, None]             # (k, s, h, n, d_head)
    y = block.attention_norm(x.repeat(k, 1, 1) + att.out_proj(merge_heads(heads.flatten(0, 1))))
    x = block.ff_norm(y + block.ff_out(F.gelu(block.ff_in(y))))          # as EncoderLayer.forward
    for later in enc.layers[layer + 1:]:
        x, _ = later(x, mask.repeat(k, 1, 1))
    return mean_pool(x, real.repeat(k, 1)).view(k, len(real), -1)


@torch.no_grad()
def ablated_embeddings(enc: Encoder, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-length embeddings, all heads on ``(s, d)`` and off ``(L, 1 + h, s, d)``: ``[l, 0]`` layer
    ``l`` off, ``[l, 1 + i]`` head ``i`` alone; one batch per sentence length (no padding), for speed."""
    if not sentences or not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must be a non-empty list of strings")
    tok, L, h, d = enc.tokenize(sentences), enc.cfg.num_layers, enc.cfg.num_heads, enc.cfg.d_model
    keep = torch.cat([torch.zeros(1, h), 1 - torch.eye(h)]).bool()      # (1 + h, h): False = off
    on, off = torch.zeros(len(sentences), d), torch.zeros(L, 1 + h, len(sentences), d)
    lengths = tok["attention_mask"].sum(dim=1)                          # (s,) real tokens
    for n in lengths.unique().tolist():                                 # the sentences of length n
        bucket = (lengths == n).nonzero().flatten()
        mask, x = tok["attention_mask"][bucket, :n], enc.embeddings(tok["input_ids"][bucket, :n])
        for l, layer in enumerate(enc.layers):
            off[l][:, bucket] = heads_off(enc, x, mask, l, keep)        # layers l.. on 1 + h variants
            x, _ = layer(x, key_padding_to_attention_mask(mask))        # the next layer's input
        on[bucket] = mean_pool(x, mask)                                 # unit-length embeddings
    return on, off


@torch.no_grad()
def order_sensitivity(enc: Encoder, sentences: list[str], g: torch.Generator, k: int = 3):
    """1 - cos(sentence, its words shuffled), ``k`` shuffles of each of ``s`` sentences: all heads on
    ``(k, s)``, and each variant of :func:`ablated_embeddings` off ``(L, 1 + h, k, s)``."""
    shuffled = []
    for _ in range(k):
        for sentence in sentences:                          # the same words in a random order
            words = sentence[:-1].split()                   # the final . or ? kept at the end
            order = torch.randperm(len(words), generator=g).tolist()
            shuffled.append(" ".join(words[i] for i in order) + sentence[-1])
    s = len(sentences)
    on, off = ablated_embeddings(enc, sentences + shuffled)     # (S, d), (L, 1 + h, S, d); S = s + k s
    return tuple(1 - (e[..., None, :s, :] * e[..., s:, :].unflatten(-2, (k, s))).sum(-1)
                 for e in (on, off))


# --- value-weighted norms (Kobayashi et al., 2020) -------------------------------------------------

@torch.no_grad()
def run_value_norms(enc: Encoder, input_ids: torch.Tensor, real: torch.Tensor):
    r"""Weights :math:`a_{ij}` and norms :math:`\lVert a_{ij} f_h(x_j) \rVert` ``(L, b, h, n, n)``, and
    :math:`\lVert f_h(x_j) \rVert` ``(L, b, h, n)``, :math:`f_h(x_j) = v^{(h)}_j W_O^{(h)}`."""
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


# --- the notebook's stimuli -----------------------------------------------------------------------

def template_sentences(g: torch.Generator, k: int) -> list[str]:
    """``k`` different sentences "subject verb object ending." drawn from a 2,304-sentence grid."""
    parts = [["The old farmer", "My sister", "A young doctor", "The committee", "Our neighbours",
              "The children", "A tired pilot", "The new teacher"],
             ["repaired", "painted", "sold", "described", "found", "cleaned", "photographed", "bought"],
             ["the broken fence", "a small boat", "the red house", "an old map", "the village church",
              "a quiet garden"],
             ["before the rain started", "after a long week", "because nobody else would",
              "on a cold morning in March", "while the radio played", "without asking anyone for help"]]
    grid = [(s, v, o, e) for s in parts[0] for v in parts[1] for o in parts[2] for e in parts[3]]
    return [" ".join(grid[i]) + "." for i in torch.randperm(len(grid), generator=g)[:k]]


TRIPLES = [tuple(t.split()) for t in (  # notebook 09's retrieval control: (subject, verb, object)
    "dog chased cat, teacher praised student, doctor helped nurse, police arrested thief, "
    "company hired engineer, girl pushed boy, storm damaged bridge, lion attacked zebra, "
    "manager called driver, child hugged grandmother, farmer fed horse, king trusted minister, "
    "journalist interviewed senator, coach trained athlete, mother carried baby, army defeated rebels, "
    "critic reviewed author, cat watched bird, pilot thanked passenger, judge warned lawyer, "
    "bank sued customer, student visited professor, fox followed rabbit, chef paid waiter").split(", ")]

IT_TEMPLATES = {  # sentence; the word that makes the 1st noun "it", then the 2nd; noun pairs
    "The {} didn't fit in the {} because it was too {}.": ("big", "small",
        "trophy suitcase, book bag, cake box, bottle fridge, sofa van, piano room, "
        "guitar case, laptop drawer, ring pocket, chair car"),
    "The {} could not cross the {} because it was too {}.": ("tired", "wide",
        "animal street, horse river, dog road, cat yard, mule lake, goat valley, "
        "donkey stream, deer bridge, cow field, sheep square"),
    "The {} passed the {} because it was {}.": ("faster", "slower",
        "car truck, horse cart, train bus, boat ship, bike tractor, plane helicopter, "
        "dog cat, tram bus, taxi van, rabbit turtle"),
    "The {} broke the {} because it was {}.": ("heavy", "fragile",
        "ball window, stone vase, hammer glass, rock mirror, brick lamp, book cup, "
        "box table, bottle plate, bag bowl, chair screen"),
    "The {} did not go through the {} because it was too {}.": ("wide", "narrow",
        "table door, truck tunnel, ship canal, bed gate, car gap, sofa hall, "
        "boat channel, piano corridor, cart path, train pass"),
}


def it_items(shipped: list) -> tuple[list, dict]:
    """``[sentence, antecedent, other noun]`` items in pairs (``shipped``, then 10 per template), and
    each unit's pair slice ("shipped", then each template by its opening words)."""
    items = list(shipped)
    for template, (first_word, second_word, nouns) in IT_TEMPLATES.items():
        for a, b in (pair.split() for pair in nouns.split(", ")):
            items += [[template.format(a, b, first_word), a, b],
                      [template.format(a, b, second_word), b, a]]
    s = len(shipped) // 2
    units = {"shipped": slice(0, s), **{t.split(" the {}")[0].format("X"): slice(s + k, s + k + 10)
                                       for k, t in zip(range(0, 50, 10), IT_TEMPLATES, strict=True)}}
    return items, units


@torch.no_grad()
def weights_from_it(enc: Encoder, items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's weight from "it" to the antecedent and to the other noun: ``(S, L, h)`` each."""
    batch = enc.tokenize([sentence for sentence, _, _ in items])
    _, A = enc(batch["input_ids"], batch["attention_mask"])            # (L, S, h, n, n)
    to_antecedent, to_other = [], []
    for s, (_, antecedent, other) in enumerate(items):
        t = batch["tokens"][s]
        if not all(t.count(word) == 1 for word in ("it", antecedent, other)):
            raise ValueError(f"'it' and both nouns must be one word piece, once each: {t}")
        to_antecedent.append(A[:, s, :, t.index("it"), t.index(antecedent)])
        to_other.append(A[:, s, :, t.index("it"), t.index(other)])
    return torch.stack(to_antecedent), torch.stack(to_other)


# --- resampling ------------------------------------------------------------------------------------

def resampled(x: torch.Tensor, real: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``x (L, b, h, n)`` per query, ``draws (R, b)`` -> ``(R, L)``: mean over real queries, heads."""
    sums = (x * real[None, :, None, :]).sum(dim=(2, 3)).T              # (b, L)
    counts = real.sum(dim=1) * x.shape[2]                              # (b,) real queries x heads
    return sums[draws].sum(dim=1) / counts[draws].sum(dim=1, keepdim=True)


def interval(boot: torch.Tensor) -> str:
    """``(R, L)`` -> "[lo, hi]" per layer: the middle 95% of the resamples."""
    lo, hi = boot.quantile(0.025, dim=0), boot.quantile(0.975, dim=0)
    return " ".join(f"[{a:.2f}, {b:.2f}]" for a, b in zip(lo.tolist(), hi.tolist(), strict=True))


def gap_changes(on: torch.Tensor, off: torch.Tensor, gaps: dict, g: torch.Generator, R: int = 1000):
    """Each gap (mean cosine of pairs ``a`` minus pairs ``b``): ``gap`` all on, ``off (L, 1 + h)``,
    ``change`` = off - on, ``boot (L, 1 + h, R)`` on ``R`` paired resamples (the same ``i`` in ``a``
    and ``b``), ``parts``: the change of ``a``'s and ``b``'s mean cosine."""
    every = torch.cat([on[None], off.flatten(0, 1)])                  # (1 + L (1 + h), p)
    out = {}
    for name, (a, b) in gaps.items():
        gap = every[:, a].mean(-1) - every[:, b].mean(-1)
        i = torch.randint(a.stop - a.start, (R, a.stop - a.start), generator=g)
        boot = every[:, a.start + i].mean(-1) - every[:, b.start + i].mean(-1)   # (1 + ..., R)
        out[name] = SimpleNamespace(gap=float(gap[0]), off=gap[1:].view(off.shape[:2]),
                                    change=(gap[1:] - gap[0]).view(off.shape[:2]),
                                    boot=(boot[1:] - boot[0]).view(*off.shape[:2], R),
                                    parts=[(m[1:] - m[0]).view(off.shape[:2])
                                           for m in (every[:, a].mean(-1), every[:, b].mean(-1))])
    return out


def top_heads(scores: torch.Tensor, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` highest entries of an ``(L, h)`` grid as ``(layer, head, score)``, 0-based."""
    values, index = scores.flatten().topk(k)
    return [(*divmod(int(f), scores.shape[1]), float(v)) for v, f in zip(values, index, strict=True)]


# --- figures ---------------------------------------------------------------------------------------

LAYERS, HEADS = [str(i) for i in range(1, 7)], [str(i) for i in range(1, 13)]


def plot_layer(weights: torch.Tensor, tokens: list, layer: int) -> None:
    """One sentence's ``weights (L, h, n, n)``: the 12 heads of ``layer`` (1-based), mean entropy."""
    n = len(tokens)
    fig, axes = plt.subplots(2, 6, figsize=(15, 6.2), sharex=True, sharey=True)
    for head, ax in enumerate(axes.flat, start=1):
        w = weights[layer - 1, head - 1]                              # (n, n)
        image = ax.imshow(w, cmap=weights_cmap(), vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"head {head}: H = {attention_entropy(w).mean():.1f}", fontsize=9)
        ax.set_xticks(range(n), tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(n), tokens, fontsize=7)
    fig.colorbar(image, ax=axes, fraction=0.02, pad=0.01, label="attention weight")
    fig.suptitle(f"Layer {layer}, all 12 heads (rows: queries, columns: keys); "
                 f"ceiling ln n = {math.log(n):.1f} nats")
    plt.show()


def plot_entropy(fraction: torch.Tensor, entropy: torch.Tensor, ceiling: float) -> None:
    """Every head's mean entropy / ln n, and each layer's heads in nats against the ceiling."""
    _, (ax_grid, ax_layer) = plt.subplots(1, 2, figsize=(14, 4.2),
                                          gridspec_kw={"width_ratios": [2.2, 1]})
    heatmap(fraction, HEADS, LAYERS, ax=ax_grid, annotate=True, xlabel="head", ylabel="layer",
            title="mean entropy / ln n of every head (1 = uniform)")
    ax_grid.tick_params(axis="x", labelrotation=0)
    layer = torch.arange(1, 7).repeat_interleave(12)
    jitter = 0.08 * torch.randn(72, generator=torch.Generator().manual_seed(0))
    ax_layer.scatter(layer + jitter, entropy.flatten(), s=12, color="#888888", alpha=0.6,
                     label="one head")
    ax_layer.plot(range(1, 7), entropy.mean(dim=1), "o-", color="#3b75af", label="mean of the layer")
    ax_layer.axhline(ceiling, color="#c0392b", linestyle="--", label="ceiling: mean ln n")
    ax_layer.set(xlabel="layer", ylabel="mean entropy (nats)", title="entropy by layer", ylim=(0, 2.8))
    ax_layer.legend(fontsize=8, loc="lower right")
    plt.show()


def plot_shares(bars: dict, title: str, chance: float | None = None) -> None:
    """``bars``: label -> ``(L,)`` mean share per query, side by side for each layer."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(bars)
    colors = ["#3b75af", "#9ecae1", "#e6550d", "#fdae6b"] if len(bars) == 4 else ["#3b75af", "#ff7f0e"]
    for k, ((label, values), color) in enumerate(zip(bars.items(), colors, strict=True)):
        ax.bar(torch.arange(1, 7) + (k - (len(bars) - 1) / 2) * width, values, width=width,
               label=label, color=color)
    if chance is not None:
        ax.axhline(chance, color="#555555", linestyle=":", label="chance: one key of a uniform row")
    ax.set(xlabel="layer", ylabel="mean share per query", ylim=(0, 1), title=title)
    ax.legend(fontsize=8, ncol=2)
    plt.show()


def plot_offsets(previous, following, weights, tokens, best_previous, best_next) -> None:
    """The previous- and next-token scores ``(L, h)``; each best head on ``weights (L, h, n, n)``."""
    n = len(tokens)
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.6), layout="constrained",
                             gridspec_kw={"width_ratios": [1.3, 1.3, 1, 1]})
    for ax, scores, name in ((axes[0], previous, "previous-token score"),
                             (axes[1], following, "next-token score")):
        heatmap(scores, HEADS, LAYERS, ax=ax, xlabel="head", ylabel="layer", title=name, colorbar=False)
        ax.tick_params(axis="x", labelrotation=0)
    for ax, (l, h), name in ((axes[2], best_previous, "best previous-token head"),
                             (axes[3], best_next, "best next-token head")):
        image = heatmap(weights[l, h, :n, :n], tokens, tokens, ax=ax, colorbar=False,
                        title=f"{name}\n(layer {l + 1}, head {h + 1})")
    fig.colorbar(image, ax=axes, fraction=0.015, pad=0.01, label="score / attention weight (0 to 1)")
    plt.show()


def plot_flips(right: torch.Tensor, wrong: torch.Tensor, need: int, P: int) -> None:
    """Right minus wrong flips of each head on a diverging map, "right/wrong" in every cell."""
    fig, ax = plt.subplots(figsize=(15, 4.4))
    heatmap((right - wrong).float(), HEADS, LAYERS, ax=ax, vmin=None, vmax=None, xlabel="head",
            ylabel="layer", title=f"right minus wrong flips of each head, {P} pairs (red: more right, "
            f"blue: more wrong; cells: right / wrong; pass: >= {need} right)")
    bound = int((right - wrong).abs().max())                              # the colour scale's end
    for l, i in torch.cartesian_prod(torch.arange(6), torch.arange(12)).tolist():
        r, x = int(right[l, i]), int(wrong[l, i])
        ax.text(i, l, f"{r}/{x}", ha="center", va="center", fontsize=10,
                color="white" if abs(r - x) > 0.6 * bound else "black")
    ax.tick_params(axis="x", labelrotation=0)
    plt.show()


def plot_ablation(groups: dict, swap) -> None:
    """The pairs' cosines by group; ``swap`` (a :func:`gap_changes` entry), each layer and head off."""
    fig, axes = plt.subplot_mosaic([["pairs", "layers"], ["heads", "heads"]], figsize=(14, 8.4),
                                   gridspec_kw={"width_ratios": [1, 1.6]}, layout="constrained")
    colors = ("#1f77b4", "#17becf", "#ff7f0e", "#d62728")
    for x, (cos, color) in enumerate(zip(groups.values(), colors, strict=True)):
        spread = torch.linspace(-0.3, 0.3, len(cos))                  # sideways in order of value
        axes["pairs"].scatter(x + spread[cos.argsort().argsort()], cos, s=24, facecolors="none",
                              edgecolors=color, linewidths=1.3)
    axes["pairs"].set(xticks=range(len(groups)), ylabel="cosine similarity", xlim=(-0.6, 3.6),
                      title="the pairs, all heads on")
    axes["pairs"].set_xticklabels([textwrap.fill(name, 11) for name in groups], fontsize=8)
    change, (lo, hi) = swap.change[:, 0], swap.boot[:, 0].quantile(torch.tensor([0.025, 0.975]), -1)
    bars = axes["layers"].bar(range(1, 7), change, width=0.6, color="#f28e2b", capsize=3,
                              yerr=torch.stack([change - lo, hi - change]))
    for bar, unsure in zip(bars, ((lo < 0) & (hi > 0)).tolist(), strict=True):
        bar.set_hatch("///" if unsure else None)                    # the interval includes 0
    axes["layers"].axhline(0, color="black", linewidth=0.8)
    axes["layers"].set(xlabel="layer switched off (all 12 heads)",
                       ylabel="change of g_swap in cosine\n> 0: the gap rises (better)",
                       title=f"g_swap = {swap.gap:.3f}, one layer's heads off (error bars: middle 95% "
                             "of resamples; hatched: it includes 0)")
    heatmap(swap.change[:, 1:], HEADS, LAYERS, ax=axes["heads"], vmin=-0.005, vmax=0.005,
            cmap="RdBu_r", xlabel="head", ylabel="layer",
            title="one head off: change of g_swap in cosine (red: rises, blue: falls; scale ±0.005)")
    axes["heads"].tick_params(axis="x", labelrotation=0)
    plt.show()
