"""Notebook 10's ladder: from a bigram table to a small GPT, one idea per rung, held-out bits.

Rungs (the ideas of Karpathy's "Let's build GPT", depth moved last): ``bigram`` (next-character
frequencies counted from the training text, every count + 0.1; no seed involved), ``one head``
(one causal attention head of width 64 over token + position embeddings), ``multi-head`` (the
same width in 4 heads), ``feed-forward`` (+ a GELU feed-forward layer of 4d after attention),
``residual + LayerNorm`` (each sub-layer as ``x + f(LN(x))``, a final LayerNorm before the head),
``depth`` (4 such blocks). Every trained rung: 600 AdamW steps of 32 chunks of 33 characters,
peak rate 3e-3, warmup 30, cosine to 3e-4, through ``build_gpt.train`` (the reference solution of
the notebook's training loop), for seeds 0, 1, 2. Records the held-out bits per
character of each rung and seed in the metadata of the checkpoint below (its weights: the bigram
table), and asserts notebook 10's claims (``build_gpt.ladder_claims``) and that each rung's mean
lands within 0.05 bits of the shipped record.
Re-run: python3 course.py studies build_gpt_ladder      (about 20 minutes on 2 cores)
"""
import datetime
import math
import time

import torch
from torch import nn

from attn_helpers.lessons import build_gpt as bg
from attn_helpers.transformer import FeedForward

RECORDS = ["attn_helpers/checkpoints/build_gpt_ladder.pt"]
SEEDS = (0, 1, 2)
RECIPE = bg.Recipe(steps=600, batch=32, lr=3e-3, warmup=30, min_lr=3e-4, eval_every=600)
SIZE = {"d_model": 64, "context": 32, "heads": 4}


class LadderModel(nn.Module):
    """One rung of the ladder: ``forward(tokens (b, n)) -> logits (b, n, vocab)``."""

    def __init__(self, rung, vocab_size, d_model=64, context=32, heads=4):
        super().__init__()
        self.rung, level = rung, bg.RUNGS.index(rung)
        self.cfg = bg.GPTConfig(vocab_size, context=context)      # the loop reads cfg.context
        if level == 0:
            self.table = nn.Embedding(vocab_size, vocab_size)      # logits of the next character
            return
        n_blocks = 4 if rung == "depth" else 1
        self.residual = level >= 4
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(context, d_model)
        self.attn = nn.ModuleList(bg.CausalSelfAttention(d_model, 1 if level == 1 else heads)
                                  for _ in range(n_blocks))
        self.ff = nn.ModuleList(FeedForward(d_model, 4 * d_model, activation="gelu")
                                for _ in range(n_blocks)) if level >= 3 else None
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2 * n_blocks + 1)) \
            if self.residual else None
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        if self.rung == "bigram":
            return self.table(tokens)                                  # (b, n, vocab)
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(tokens.shape[1]))
        for i, attn in enumerate(self.attn):
            if self.residual:                                          # pre-norm, residual
                x = x + attn(self.norms[2 * i](x))
                x = x + self.ff[i](self.norms[2 * i + 1](x))
            else:                                                      # each replaces the stream
                x = attn(x)
                if self.ff is not None:
                    x = self.ff[i](x)
        return self.head(self.norms[-1](x) if self.residual else x)


def fit_bigram(model, corpus, smoothing=0.1):
    """The bigram table: log of the training text's next-character frequencies (+ smoothing)."""
    v = corpus.vocab_size
    pairs = corpus.train[:-1] * v + corpus.train[1:]
    counts = torch.bincount(pairs, minlength=v * v).view(v, v).double() + smoothing
    with torch.no_grad():
        model.table.weight.copy_((counts / counts.sum(1, keepdim=True)).log())
    return model.eval()


def main():
    corpus = bg.load_corpus()
    began = time.perf_counter()
    bits, params, cpu = {}, {}, {}
    for rung in bg.RUNGS:
        for seed in SEEDS:
            torch.manual_seed(seed)
            model = LadderModel(rung, corpus.vocab_size, **SIZE)
            if rung == "bigram":
                fit_bigram(model, corpus)
                seconds = 0.0
            else:
                cpu_began = time.process_time()
                with bg.single_thread():                               # as the notebook trains
                    bg.train(model, bg.train_step, corpus, RECIPE,
                             torch.Generator().manual_seed(seed))
                seconds = round(time.process_time() - cpu_began, 1)
            nats = bg.estimate_loss(model, corpus.val, SIZE["context"], windows=None)
            bits.setdefault(rung, []).append(round(nats / math.log(2), 4))
            cpu.setdefault(rung, []).append(seconds)
            params[rung] = sum(p.numel() for p in model.parameters())
            print(f"{rung:<22} seed {seed}: {bits[rung][-1]:.4f} bits per character", flush=True)
    results = {"rungs": list(bg.RUNGS), "seeds": list(SEEDS), "bits": bits, "params": params,
               "cpu_seconds": cpu,
               "recipe": {k: getattr(RECIPE, k) for k in ("steps", "batch", "lr", "warmup")},
               "size": SIZE, "train_seconds": round(time.perf_counter() - began, 1),
               "recorded": f"2-core x86 CPU, {datetime.date.today()}; bigram counted, "
                           "other rungs trained"}

    claims = bg.ladder_claims(results)
    assert all(claims.values()), claims
    shipped = bg.load_record("build_gpt_ladder")
    for rung in bg.RUNGS:
        fresh, old = (sum(r["bits"][rung]) / len(SEEDS) for r in (results, shipped))
        assert abs(fresh - old) <= 0.05, (rung, fresh, old)
    bigram = fit_bigram(LadderModel("bigram", corpus.vocab_size, **SIZE), corpus)
    torch.save({"state_dict": bigram.state_dict(), "metadata": results}, RECORDS[0])


if __name__ == "__main__":
    main()
