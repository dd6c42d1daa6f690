"""Notebook 10's ladder: from a bigram table to a small GPT, one idea per rung, each trained the
same way for several seeds and scored on the held-out text in bits per character.

Rungs (after Karpathy's gpt-dev, which stacks blocks before it adds residuals; here depth comes
last): ``bigram`` (a table of next-character frequencies counted from the training text, with
0.1 added to every count: no seed or recipe involved); ``one head`` (+ one
causal attention head of size d over token + position embeddings); ``multi-head`` (+ the same
width split in 4 heads); ``feed-forward`` (+ a feed-forward layer after attention); ``residual +
LayerNorm`` (three changes at once: each sub-layer as ``x + f(LN(x))``, i.e. residuals and a
LayerNorm before each sub-layer, and a final LayerNorm before the head); ``depth`` (4 such
blocks). Every trained rung uses the same recipe, so a drop is what an idea buys under it.

The results ship as the metadata of the checkpoint ``build_gpt_ladder`` (its weights: the bigram
table); ``python -m attn_helpers train build_gpt_ladder`` re-creates them (a few minutes on one
core); a slow test re-runs the ladder and checks the claims and the losses within tolerances.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..training import load_checkpoint
from ..transformer import FeedForward
from .build_gpt import CausalSelfAttention, Corpus, load_corpus
from .build_gpt_train import Recipe, held_out_loss, train_gpt

__all__ = ["RUNGS", "LADDER_RECIPE", "LadderModel", "run_ladder", "fit_bigram", "load_ladder",
           "ladder_claims", "recipe"]

RUNGS = ("bigram", "one head", "multi-head", "feed-forward", "residual + LayerNorm", "depth")
LADDER_RECIPE = Recipe(steps=600, batch=32, lr=3e-3, warmup=30)
LADDER_SIZE = {"d_model": 64, "context": 32, "heads": 4}
SEEDS = (0, 1, 2)


class _Cfg:
    def __init__(self, vocab_size: int, context: int):
        self.vocab_size, self.context = vocab_size, context


class LadderModel(nn.Module):
    """One rung of the ladder (see the module docstring); ``forward(tokens) -> logits``."""

    def __init__(self, rung: str, vocab_size: int, d_model: int = 64, context: int = 32,
                 heads: int = 4):
        super().__init__()
        if rung not in RUNGS:
            raise ValueError(f"rung must be one of {RUNGS}, got {rung!r}")
        self.rung, self.cfg = rung, _Cfg(vocab_size, context)
        level = RUNGS.index(rung)
        if level == 0:
            self.table = nn.Embedding(vocab_size, vocab_size)   # logits of the next character
            return
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(context, d_model)
        n_blocks = 4 if level == 5 else 1
        self.residual = level >= 4
        self.attn = nn.ModuleList(CausalSelfAttention(d_model, 1 if level == 1 else heads)
                                  for _ in range(n_blocks))
        self.ff = nn.ModuleList(FeedForward(d_model, 4 * d_model, activation="gelu")
                                for _ in range(n_blocks)) if level >= 3 else None
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2 * n_blocks + 1)) \
            if self.residual else None
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.rung == "bigram":
            return self.table(tokens)                                  # (b, n, vocab)
        n = tokens.shape[1]
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(n))
        for i, attn in enumerate(self.attn):
            if self.residual:
                x = x + attn(self.norms[2 * i](x))
                x = x + self.ff[i](self.norms[2 * i + 1](x))
            else:
                x = attn(x)
                if self.ff is not None:
                    x = self.ff[i](x)
        return self.head(self.norms[-1](x) if self.residual else x)


def fit_bigram(model: LadderModel, corpus: Corpus, smoothing: float = 0.1) -> LadderModel:
    """Set the bigram table to the log of the training text's next-character frequencies."""
    v = corpus.vocab_size
    pairs = corpus.train[:-1] * v + corpus.train[1:]
    counts = torch.bincount(pairs, minlength=v * v).view(v, v).double() + smoothing
    with torch.no_grad():
        model.table.weight.copy_((counts / counts.sum(1, keepdim=True)).log())
    return model.eval()


def run_ladder(seeds=SEEDS, *, rungs=RUNGS, corpus: Corpus | None = None,
               progress: bool = False) -> dict:
    """Train every rung for every seed; ``{"bits": {rung: [bits per char per seed]}, ...}``."""
    corpus = load_corpus() if corpus is None else corpus
    bits, params, cpu = {}, {}, {}
    for rung in rungs:
        for seed in seeds:
            torch.manual_seed(seed)
            model = LadderModel(rung, corpus.vocab_size, **LADDER_SIZE)
            if rung == "bigram":
                fit_bigram(model, corpus)
                cpu.setdefault(rung, []).append(0.0)
            else:
                log = train_gpt(model, LADDER_RECIPE, corpus=corpus, seed=seed, eval_every=0,
                                progress=progress)
                cpu.setdefault(rung, []).append(round(log.cpu_seconds, 1))
            nats = held_out_loss(model, corpus.val, LADDER_SIZE["context"])
            bits.setdefault(rung, []).append(round(nats / math.log(2), 4))
            params[rung] = sum(p.numel() for p in model.parameters())
    return {"rungs": list(rungs), "seeds": list(seeds), "bits": bits, "params": params,
            "cpu_seconds": cpu, "recipe": {k: getattr(LADDER_RECIPE, k)
                                           for k in ("steps", "batch", "lr", "warmup")},
            "size": LADDER_SIZE}


def load_ladder() -> dict:
    """The shipped results: the metadata of checkpoint ``build_gpt_ladder`` (whose weights are
    the bigram table of seed 0)."""
    model = LadderModel("bigram", load_corpus().vocab_size)
    return load_checkpoint(model, "build_gpt_ladder")


def mean(values) -> float:
    return sum(values) / len(values)


def ladder_claims(results: dict) -> dict:
    """The notebook's sentences about the ladder, each a bool."""
    bits = {rung: mean(v) for rung, v in results["bits"].items()}
    spread = max(max(v) - min(v) for v in results["bits"].values())
    steps = [bits[a] - bits[b] for a, b in zip(RUNGS, RUNGS[1:], strict=False)]   # drops
    return {
        f"under the ladder's one recipe, every rung lowers the held-out loss (mean over "
        f"{len(results['seeds'])} seeds)":
            all(s > 0 for s in steps),
        "one head beats the counted bigram for every seed":
            max(results["bits"]["one head"]) < bits["bigram"],
        "from one head on, each drop is larger than the largest seed-to-seed spread":
            all(s > spread for s in steps[1:]),
        "depth gives the largest single drop": steps[-1] == max(steps),
        "the deep model is at least 0.8 bits per character below the bigram":
            bits["bigram"] - bits["depth"] >= 0.8,
    }


def recipe():
    """``python -m attn_helpers train build_gpt_ladder``: run the ladder; the checkpoint holds
    the bigram table of seed 0 and, as metadata, every rung's results."""
    results = run_ladder()
    corpus = load_corpus()
    return fit_bigram(LadderModel("bigram", corpus.vocab_size), corpus), results
