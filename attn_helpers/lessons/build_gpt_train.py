"""Notebook 10's training: batches of the text, the held-out loss, and the recipe of the final
model (AdamW, a short linear warmup to a high learning rate, then cosine decay), with a progress
bar and an optional live loss curve.

Training runs on one torch thread (:func:`~attn_helpers.training.single_thread`): for a model
this small it wastes nothing, and the trained weights no longer depend on the thread count.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..training import single_thread
from .build_gpt import GPT, Corpus, GPTConfig, load_corpus, next_token_loss

__all__ = ["Recipe", "FINAL", "FINAL_SIZE", "NANOGPT", "BAR_NATS", "claims", "build_and_train",
           "cache_speed", "cache_claims", "final_config", "flop_checks", "nanogpt_claims",
           "get_batch", "held_out_loss", "lr_at",
           "load_nanogpt_bar", "measure_nanogpt_bar", "train_flops", "TrainLog", "train_gpt",
           "train_step"]

LN2 = math.log(2.0)


@dataclass(frozen=True)
class Recipe:
    """How to train: ``steps`` AdamW steps of ``batch`` chunks of ``context + 1`` characters;
    learning rate rises linearly for ``warmup`` steps to ``lr`` then follows a cosine down to
    ``lr * final_lr_share``."""

    steps: int = 1200
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 100
    final_lr_share: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    clip: float = 1.0


#: The notebook's final recipe (tuned on this split): a higher learning rate and beta2 0.95,
#: batch 16 for 1,200 steps, on nanoGPT's model with a feed-forward layer of 2d instead of 4d.
FINAL = Recipe()
#: The final model's size, on top of :class:`GPTConfig` (nanoGPT's CPU model otherwise).
FINAL_SIZE = {"d_ff": 256}
#: nanoGPT's README recipe for a CPU (lr 1e-3, warmup 100, cosine to 1e-4), for comparison; its
#: model is :class:`GPTConfig`'s default (d_ff = 4d = 512).
NANOGPT = Recipe(steps=2000, batch=12, lr=1e-3, warmup=100, final_lr_share=0.1,
                 betas=(0.9, 0.99))
#: Where the measured loss of :data:`NANOGPT` on this split is stored.
NANOGPT_BAR_FILE = Path(__file__).resolve().parent.parent / "data" / "build_gpt_nanogpt_bar.json"


def final_config(vocab_size: int) -> GPTConfig:
    """The final model: nanoGPT's CPU model (4 layers, 4 heads, 128 dimensions, context 64) with
    a feed-forward layer of 2d."""
    return GPTConfig(vocab_size, **FINAL_SIZE)


def train_flops(cfg: GPTConfig, recipe: Recipe) -> float:
    """Matrix-product FLOPs of training ``cfg`` with ``recipe``: 3x the forward's (forward,
    backward), the forward per token being the projections, the feed-forward, the scores and
    weighted sums over the whole context (as the course computes them, masked), and the head."""
    d, n = cfg.d_model, cfg.context
    per_layer = 2 * (4 * d * d + 2 * d * cfg.d_ff) + 2 * 2 * n * d
    per_token = cfg.num_layers * per_layer + 2 * d * cfg.vocab_size
    return 3.0 * per_token * recipe.steps * recipe.batch * n


def get_batch(data: torch.Tensor, batch: int, context: int,
              generator: torch.Generator) -> torch.Tensor:
    """``(batch, context + 1)`` chunks of ``data`` at random positions."""
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=generator)
    return torch.stack([data[s:s + context + 1] for s in starts.tolist()])


@torch.no_grad()
def held_out_loss(model: nn.Module, data: torch.Tensor, context: int, *,
                  windows: int | None = None) -> float:
    """Mean next-character loss in nats over ``data`` in non-overlapping windows of ``context +
    1`` characters (every character after a window's first is predicted once, from the ones
    before it in its window); ``windows``: only that many, evenly spaced (a quicker estimate)."""
    count = (len(data) - 1) // context
    chunks = data[: count * context + 1].unfold(0, context + 1, context)   # (count, context + 1)
    if windows is not None and windows < count:
        chunks = chunks[torch.linspace(0, count - 1, windows).long()]
    model.eval()
    total, n = 0.0, 0
    with single_thread():
        for chunk in chunks.split(256):
            total += next_token_loss(model, chunk).item() * chunk[:, 1:].numel()
            n += chunk[:, 1:].numel()
    return total / n


def lr_at(step: int, recipe: Recipe) -> float:
    """Learning rate of step ``step`` (0-based)."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    low = recipe.lr * recipe.final_lr_share
    return low + 0.5 * (recipe.lr - low) * (1 + math.cos(math.pi * min(progress, 1.0)))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, chunk: torch.Tensor) -> float:
    """One step of next-character training on ``chunk (b, n + 1)``; returns the loss (nats)."""
    loss = next_token_loss(model, chunk)        # predict chunk[:, 1:] from chunk[:, :-1]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


@dataclass
class TrainLog:
    """Losses of every step, held-out losses ``(step, nats)``, and CPU seconds of training."""

    losses: list = field(default_factory=list)
    evaluations: list = field(default_factory=list)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def final(self) -> float:
        return self.evaluations[-1][1]

    @property
    def cpu_ms_per_step(self) -> float:
        return 1000 * self.cpu_seconds / max(1, len(self.losses))


def train_gpt(model: nn.Module, recipe: Recipe = FINAL, *,
              corpus: Corpus | None = None,
              seed: int = 0, step_fn: Callable | None = None, eval_every: int = 200,
              eval_windows: int | None = 200, progress: bool = True,
              on_eval: Callable | None = None) -> TrainLog:
    """Train ``model`` with ``recipe`` on the training text, deterministically for ``seed``.

    ``step_fn(model, optimizer, chunk) -> loss``: the training step (default :func:`train_step`;
    the notebook passes the learner's). Every ``eval_every`` steps the held-out loss on
    ``eval_windows`` evenly spaced held-out windows is logged (and passed to ``on_eval(log)``,
    e.g. to redraw a live curve); the last evaluation reads the whole held-out text.
    """
    corpus = load_corpus() if corpus is None else corpus
    step_fn = train_step if step_fn is None else step_fn
    context = model.cfg.context
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=recipe.lr, betas=recipe.betas)
    log = TrainLog()
    bar = None
    if progress:
        from tqdm.std import tqdm  # text, not a widget: the stored notebook shows it as text

        bar = tqdm(total=recipe.steps, desc="training", mininterval=5.0,
                   miniters=max(1, recipe.steps // 10), ncols=80, file=sys.stdout)
    if recipe.clip:
        optimizer.step = _clipped(optimizer, model, recipe.clip)
    with single_thread():
        for step in range(recipe.steps):
            cpu, wall = time.process_time(), time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, recipe)
            model.train()
            chunk = get_batch(corpus.train, recipe.batch, context, generator)
            loss = float(step_fn(model, optimizer, chunk))
            log.cpu_seconds += time.process_time() - cpu
            log.wall_seconds += time.perf_counter() - wall
            if not math.isfinite(loss):
                raise FloatingPointError(f"the loss became {loss} at step {step + 1}")
            log.losses.append(loss)
            last = step + 1 == recipe.steps
            if eval_every and ((step + 1) % eval_every == 0 or last):
                windows = None if last else eval_windows
                log.evaluations.append((step + 1, held_out_loss(model, corpus.val, context,
                                                                windows=windows)))
                if on_eval is not None:
                    on_eval(log)
            if bar is not None:
                bar.update(1)
                if (step + 1) % 20 == 0:
                    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
    if bar is not None:
        bar.close()
    model.eval()
    return log


def _clipped(optimizer, model, clip):
    """``optimizer.step`` that first clips the gradient norm (so a learner's step clips too)."""
    step = type(optimizer).step

    def clipped_step(*args, **kwargs):
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        return step(optimizer, *args, **kwargs)

    return clipped_step


def build_and_train(recipe: Recipe = FINAL, *, seed: int = 0, progress: bool = False,
                    **config) -> tuple[GPT, TrainLog]:
    """A fresh :class:`GPT` (``config`` overrides :class:`GPTConfig`), trained with ``recipe``."""
    corpus = load_corpus()
    torch.manual_seed(seed)
    if recipe is FINAL:
        config = FINAL_SIZE | config
    model = GPT(GPTConfig(corpus.vocab_size, **config))
    return model, train_gpt(model, recipe, corpus=corpus, seed=seed, progress=progress)


#: The asserted bar: nanoGPT's CPU recipe reaches about 1.43 nats per character on this split
#: (issue 24's statement). What it reaches when run here is measured and stored: see
#: :func:`load_nanogpt_bar` (about 1.385).
BAR_NATS = 1.43
#: How far above nanoGPT's measured loss the final model may land and still count as "level".
LEVEL_NATS = 0.05


def load_nanogpt_bar() -> dict:
    """The stored measurement of :data:`NANOGPT` on this split: ``{"nats": [per seed], "seeds",
    "mean", "recipe", "config", "recorded"}`` (re-measure with :func:`measure_nanogpt_bar`; a slow
    test does)."""
    bar = json.loads(NANOGPT_BAR_FILE.read_text())
    bar["mean"] = sum(bar["nats"]) / len(bar["nats"])
    return bar


def measure_nanogpt_bar(seeds=(0, 1)) -> dict:
    """Train nanoGPT's CPU recipe on this split for ``seeds``: the held-out loss of each."""
    nats = [round(build_and_train(NANOGPT, seed=seed)[1].final, 4) for seed in seeds]
    return {"seeds": list(seeds), "nats": nats,
            "recipe": {k: getattr(NANOGPT, k) for k in ("steps", "batch", "lr", "warmup",
                                                       "final_lr_share", "betas")},
            "config": {k: getattr(GPTConfig(0), k) for k in ("context", "d_model", "num_heads",
                                                             "num_layers", "d_ff")}}


def claims(log: TrainLog, recipe: Recipe = FINAL, cfg: GPTConfig | None = None,
           bar: dict | None = None) -> dict:
    """The notebook's sentences about the final model's training, each a bool (``bar``: the
    stored nanoGPT measurement, :func:`load_nanogpt_bar`)."""
    cfg = final_config(load_corpus().vocab_size) if cfg is None else cfg
    bar = load_nanogpt_bar() if bar is None else bar
    return {
        f"after {recipe.steps} steps the held-out loss is at most {BAR_NATS} nats per character "
        "(the course's target, about what nanoGPT's CPU settings reach on this split)":
            log.final <= BAR_NATS,
        f"it is at most {LEVEL_NATS} nats above this course's GPT trained with nanoGPT's settings "
        f"({bar['mean']:.3f}, recorded)": log.final <= bar["mean"] + LEVEL_NATS,
        "the held-out loss was lower at each evaluation than at the one before (200 windows "
        "each, the last on the whole held-out text)":
            all(b < a for (_, a), (_, b) in zip(log.evaluations, log.evaluations[1:],
                                                strict=False)),
    }


def nanogpt_claims(bar: dict | None = None) -> dict:
    """The recorded run of this course's GPT with nanoGPT's CPU settings (:data:`NANOGPT`: 4
    layers, 4 heads, 128 dimensions, context 64, batch 12, 2,000 AdamW steps), read from the
    shipped file: print with ``check_claims(..., recorded=bar["recorded"])``."""
    bar = load_nanogpt_bar() if bar is None else bar
    return {f"this course's GPT trained with nanoGPT's settings reaches {bar['mean']:.3f} nats "
            f"per character (mean of seeds {bar['seeds']}), under the {BAR_NATS} target":
            bar["mean"] <= BAR_NATS}


def flop_checks(cfg: GPTConfig, recipe: Recipe = FINAL) -> dict:
    """Counted, not measured: the recipe's matrix-product FLOPs against nanoGPT's settings."""
    share = train_flops(cfg, recipe) / train_flops(GPTConfig(cfg.vocab_size), NANOGPT)
    return {"counted, not measured: our recipe does at most 60% of the matrix-product FLOPs of "
            "nanoGPT's settings": share <= 0.6}


def cache_speed(model: GPT, generate: Callable, *, batch: int = 4, steps: int = 56,
                repeats: int = 3) -> dict:
    """Tokens per second of ``generate`` with and without the KV cache, interleaved in this run
    (median of ``repeats``), and their ratio."""
    import statistics

    prompt = torch.zeros(batch, model.cfg.context - steps, dtype=torch.long)
    times = {True: [], False: []}
    with single_thread():
        for _ in range(repeats):
            for use_cache in (True, False):
                start = time.perf_counter()
                generate(model, prompt, steps, 1.0, None, use_cache,
                         torch.Generator().manual_seed(0))
                times[use_cache].append(time.perf_counter() - start)
    cached = batch * steps / statistics.median(times[True])
    plain = batch * steps / statistics.median(times[False])
    return {"cached": cached, "plain": plain, "ratio": cached / plain}


def cache_claims(speed: dict) -> dict:
    return {"generation with the KV cache is faster than without it, measured in this run":
            speed["ratio"] > 1.0}
