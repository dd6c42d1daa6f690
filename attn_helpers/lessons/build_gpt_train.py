"""Notebook 10's training: batches of the text, the held-out loss, and the recipe of the final
model (Muon for the blocks' matrices and AdamW for the rest, a short linear warmup to a high
learning rate, then cosine decay), with a progress bar and an optional live loss curve.

Training runs on one torch thread unless told otherwise (``threads``): the trained weights then
do not depend on the thread count (on an idle 2-core machine a second thread makes a step about
1.4-1.7x faster; beside other work, twice as slow; see :func:`~attn_helpers.training.single_thread`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..training import single_thread, torch_threads
from .build_gpt import GPT, Corpus, GPTConfig, load_corpus, next_token_loss
from .build_gpt_muon import MuonWithAdamW, adamw

__all__ = ["Recipe", "FINAL", "FINAL_SIZE", "NANOGPT", "BAR_NATS", "claims", "build_and_train",
           "cache_speed", "cache_claims", "final_config", "get_batch", "held_out_loss", "lr_at",
           "clipped_step", "make_optimizer", "muon_flops_per_step", "same_samples_claims",
           "train_flops", "TrainLog",
           "train_gpt", "train_step"]

LN2 = math.log(2.0)


@dataclass(frozen=True)
class Recipe:
    """How to train: ``steps`` optimizer steps of ``batch`` chunks of ``context + 1`` characters;
    learning rate rises linearly for ``warmup`` steps to ``lr`` then follows a cosine down to
    ``lr * final_lr_share``. ``optimizer``: ``"adamw"`` for every weight, or ``"muon"``:
    :class:`~.build_gpt_muon.Muon` for the blocks' weight matrices (at ``muon_scale`` times the
    rate) and AdamW for the rest."""

    steps: int = 1200
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 100
    final_lr_share: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    clip: float = 1.0
    optimizer: str = "adamw"
    muon_scale: float = 1.0


#: The notebook's final recipe (tuned on this split): Muon for the blocks' matrices at 1.6 times
#: the rate, AdamW for the rest, a short warmup to a high peak rate, a cosine down to zero; batch
#: 16 for 550 steps, on nanoGPT's model with a feed-forward layer of 2d instead of 4d.
FINAL = Recipe(steps=550, batch=16, lr=8e-3, warmup=30, final_lr_share=0.0, optimizer="muon",
               muon_scale=1.6)
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
    weighted sums over the whole context (as the course computes them, masked), and the head;
    with Muon, plus its Newton-Schulz products at every step (:func:`muon_flops_per_step`)."""
    d, n = cfg.d_model, cfg.context
    per_layer = 2 * (4 * d * d + 2 * d * cfg.d_ff) + 2 * 2 * n * d
    per_token = cfg.num_layers * per_layer + 2 * d * cfg.vocab_size
    muon = muon_flops_per_step(cfg) if recipe.optimizer == "muon" else 0.0
    return (3.0 * per_token * recipe.batch * n + muon) * recipe.steps


def muon_flops_per_step(cfg: GPTConfig, ns_steps: int = 5) -> float:
    """Muon's Newton-Schulz products for one step of ``cfg``'s block matrices: per iteration, on
    an ``r x s`` matrix (r <= s), ``X X^T`` and ``B X`` (2 r^2 s FLOPs each) and ``A^2`` (2 r^3)."""
    d, f = cfg.d_model, cfg.d_ff
    per_block = 0.0
    for m, k in ((3 * d, d), (d, d), (f, d), (d, f)):          # W_qkv, W_O, the feed-forward
        r, s = sorted((m, k))
        per_block += 4 * r * r * s + 2 * r ** 3
    return ns_steps * cfg.num_layers * per_block


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
              on_eval: Callable | None = None, threads: int = 1) -> TrainLog:
    """Train ``model`` with ``recipe`` on the training text, deterministically for ``seed``.

    ``step_fn(model, optimizer, chunk) -> loss``: the training step (default :func:`train_step`;
    the notebook passes the learner's). Every ``eval_every`` steps the held-out loss on
    ``eval_windows`` evenly spaced held-out windows is logged (and passed to ``on_eval(log)``,
    e.g. to redraw a live curve); the last evaluation reads the whole held-out text. ``threads``:
    torch threads for the steps (1, the default, gives the same weights whatever the machine's
    thread count; more are faster on an idle machine, slower beside other work).
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
    with torch_threads(threads):
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


def make_optimizer(model: nn.Module, recipe: Recipe = FINAL):
    """The optimizer ``recipe`` names: AdamW (weight decay on the matrices only, in one fused
    kernel: the same update, without a Python loop over the parameters), or Muon for the blocks'
    matrices with that AdamW for the rest (:class:`~.build_gpt_muon.MuonWithAdamW`). With
    ``recipe.clip``, its ``step`` first clips the gradient norm (so a learner's step clips too)."""
    if recipe.optimizer == "muon":
        optimizer = MuonWithAdamW(model, lr=recipe.lr, betas=recipe.betas,
                                  weight_decay=recipe.weight_decay, muon_scale=recipe.muon_scale)
    elif recipe.optimizer == "adamw":
        optimizer = adamw(model.parameters(), lr=recipe.lr, betas=recipe.betas,
                          weight_decay=recipe.weight_decay)
    else:
        raise ValueError(f"recipe.optimizer must be 'adamw' or 'muon', got {recipe.optimizer!r}")
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
                    threads: int = 1, **config) -> tuple[GPT, TrainLog]:
    """A fresh :class:`GPT` (``config`` overrides :class:`GPTConfig`), trained with ``recipe``."""
    corpus = load_corpus()
    torch.manual_seed(seed)
    if recipe is FINAL:
        config = FINAL_SIZE | config
    model = GPT(GPTConfig(corpus.vocab_size, **config))
    return model, train_gpt(model, recipe, corpus=corpus, seed=seed, progress=progress,
                            threads=threads)


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
    return {f"with and without the cache, the same {b} x {n} tokens from the same random numbers "
            "(the cache is used up to the context; past it both re-encode the window)":
            torch.equal(cached, plain)}
