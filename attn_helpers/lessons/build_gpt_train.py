"""Notebook 10's training: batches of the text, the held-out loss, and the recipe of the final
model (AdamW, a short linear warmup to a high learning rate, then cosine decay), with a progress
bar and an optional live loss curve.

Training runs on one torch thread (:func:`~attn_helpers.training.single_thread`): the trained
weights then do not depend on the thread count (on an idle machine a second thread would make a
step about 1.3-1.5x faster; see that function).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..training import single_thread
from .build_gpt import GPT, Corpus, GPTConfig, load_corpus, next_token_loss

__all__ = ["Recipe", "FINAL", "FINAL_SIZE", "NANOGPT", "BAR_NATS", "claims", "build_and_train",
           "cache_speed", "cache_claims", "final_config", "get_batch", "held_out_loss", "lr_at",
           "clipped_step", "make_optimizer", "same_samples_claims", "train_flops", "TrainLog",
           "train_gpt", "train_step"]

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
    optimizer = make_optimizer(model, recipe)
    log = TrainLog()
    bar = None
    if progress:
        from tqdm.std import tqdm  # text, not a widget: the stored notebook shows it as text

        bar = tqdm(total=recipe.steps, desc="training", mininterval=5.0,
                   miniters=max(1, recipe.steps // 10), ncols=80, file=sys.stdout)
    with single_thread():
        for step in range(recipe.steps):
            cpu, wall = time.process_time(), time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, recipe)
            model.train()
            chunk = get_batch(corpus.train, recipe.batch, context, generator)
            loss = step_fn(model, optimizer, chunk)
            loss = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
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


def make_optimizer(model: nn.Module, recipe: Recipe = FINAL) -> torch.optim.Optimizer:
    """AdamW as ``recipe`` says, weight decay on the matrices only, in one fused kernel (the
    same update, without a Python loop over the parameters); with ``recipe.clip``, its ``step``
    first clips the gradient norm (so a learner's step clips too)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=recipe.lr, betas=recipe.betas, fused=True)
    if recipe.clip:
        optimizer.step = clipped_step(optimizer, model, recipe.clip)
    return optimizer


def clipped_step(optimizer, model, clip):
    """``optimizer.step`` that first clips the gradient norm of ``model`` to ``clip`` (so a
    learner's step clips too; a step that also clips gets the same update)."""
    step = type(optimizer).step

    def step_with_clip(*args, **kwargs):
        nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        return step(optimizer, *args, **kwargs)

    return step_with_clip


def build_and_train(recipe: Recipe = FINAL, *, seed: int = 0, progress: bool = False,
                    **config) -> tuple[GPT, TrainLog]:
    """A fresh :class:`GPT` (``config`` overrides :class:`GPTConfig`), trained with ``recipe``."""
    corpus = load_corpus()
    torch.manual_seed(seed)
    if recipe is FINAL:
        config = FINAL_SIZE | config
    model = GPT(GPTConfig(corpus.vocab_size, **config))
    return model, train_gpt(model, recipe, corpus=corpus, seed=seed, progress=progress)


#: The course's target, from issue 24's estimate of what nanoGPT's CPU recipe reaches on this split
#: ("about 1.43"). Run here, on this course's GPT, those settings reached 1.385 (two seeds; stored
#: and re-measured, see :mod:`.build_gpt_compare`), so the target leaves them a few hundredths.
BAR_NATS = 1.43


def claims(log: TrainLog, recipe: Recipe = FINAL) -> dict:
    """The notebook's sentences about the final model's training in this run, each a bool."""
    return {
        f"after {recipe.steps} steps the held-out loss is at most {BAR_NATS} nats per character "
        "(the course's target)": log.final <= BAR_NATS,
        "the held-out loss was lower at each evaluation than at the one before (200 windows "
        "each, the last on the whole held-out text)":
            all(b < a for (_, a), (_, b) in zip(log.evaluations, log.evaluations[1:],
                                                strict=False)),
    }


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


def same_samples_claims(cached: torch.Tensor, plain: torch.Tensor) -> dict:
    """Generation with and without the cache, from the same random numbers: the same tokens
    (the distributions agree up to rounding, so only a draw on a rounding edge could differ)."""
    b, n = cached.shape
    return {f"with and without the cache, the same {b} x {n} tokens from the same random numbers":
            torch.equal(cached, plain)}
