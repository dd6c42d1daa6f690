"""``python -m attn_helpers bench gpt [--check]``: is notebook 10's GPT as fast to train as a
library model?

Times one training step (forward, backward, optimizer) of notebook 10's model
(:class:`~attn_helpers.lessons.build_gpt.GPT`, the course's own attention step) against the
same-size model built from ``nn.TransformerEncoderLayer(norm_first=True)`` with a causal mask,
interleaved in the same run on one thread (``--threads``: more), and reports the ratio of the
medians (``--check``: at most 1.5x). Both step as notebook 10's training does
(``build_gpt.train_step``: AdamW, the gradient clipped). It also reports what the final recipe's
training costs at that speed: its steps times the median step. ``--train`` then trains the final
recipe once with ``build_gpt.train``, the reference of notebook 10's loop (seed 0, evaluations
included), and reports its measured time and the loss on the whole held-out text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn

from ..lessons.build_gpt import (
    BAR_NATS,
    FINAL,
    GPT,
    GPTConfig,
    build_and_train,
    estimate_loss,
    final_config,
    get_batch,
    load_corpus,
    train_step,
)
from ..training import torch_threads

__all__ = ["TorchGPT", "bench_gpt", "main", "TARGET"]

TARGET = 1.5


class TorchGPT(nn.Module):
    """The same model from ``nn.TransformerEncoderLayer(norm_first=True)`` and a causal mask."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.context, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.num_heads, cfg.d_ff, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(n))
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def bench_gpt(*, steps: int = 30, batch: int | None = None, tiny: bool = False,
              threads: int = 1) -> dict:
    """Median seconds of a training step for both models, interleaved; and the ratio."""
    corpus = load_corpus()
    if tiny:
        cfg = GPTConfig(corpus.vocab_size, context=16, d_model=32, num_heads=2, num_layers=2,
                        d_ff=64)
    else:
        cfg = final_config(corpus.vocab_size)
    batch = batch or FINAL.batch
    models = {"course": GPT(cfg), "torch": TorchGPT(cfg)}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=FINAL.lr, betas=FINAL.betas)
                  for name, m in models.items()}
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    with torch_threads(threads):
        for step in range(steps + 3):
            chunk = get_batch(corpus.train, batch, cfg.context, generator)
            for name, model in models.items():
                model.train()
                start, start_cpu = time.perf_counter(), time.process_time()
                train_step(model, optimizers[name], chunk)
                if step >= 3:                                    # warm-up steps not timed
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
    median = {name: statistics.median(t) for name, t in times.items()}
    median_cpu = statistics.median(cpu["course"])
    return {"config": {"d_model": cfg.d_model, "num_heads": cfg.num_heads,
                       "num_layers": cfg.num_layers, "d_ff": cfg.d_ff, "context": cfg.context,
                       "batch": batch},
            "params": params, "median_step_ms": {k: round(1000 * v, 2) for k, v in median.items()},
            "ratio": median["course"] / median["torch"],
            "final_recipe_steps": FINAL.steps,
            "final_recipe_seconds": FINAL.steps * median["course"],
            "final_recipe_cpu_seconds": FINAL.steps * median_cpu, "threads": threads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench gpt",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (for tests)")
    parser.add_argument("--train", action="store_true",
                        help="then train the final recipe once (seed 0) and report its time")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the steps and the training (default 1, as "
                             "notebook 10 trains)")
    parser.add_argument("--check", action="store_true",
                        help=f"exit with status 1 when the course's step is over {TARGET}x")
    args = parser.parse_args(argv)
    result = bench_gpt(steps=args.steps, tiny=args.tiny, threads=args.threads)
    print(json.dumps(result, indent=1))
    ok = result["ratio"] <= TARGET
    print(f"training step: course GPT {result['median_step_ms']['course']} ms, "
          f"nn.TransformerEncoderLayer {result['median_step_ms']['torch']} ms: "
          f"{result['ratio']:.2f}x (target <= {TARGET}x) {'ok' if ok else 'FAIL'}", file=sys.stderr)
    print(f"final recipe: {result['final_recipe_steps']} steps x the median step = "
          f"{result['final_recipe_seconds']:.0f} s of training at this speed, "
          f"{result['final_recipe_cpu_seconds']:.0f} s of CPU time ({args.threads} thread(s); "
          "target <= 90 s)", file=sys.stderr)
    if args.train:
        model, _, seconds = build_and_train(FINAL, seed=0, threads=args.threads)
        nats = estimate_loss(model, load_corpus().val, model.cfg.context, windows=None)
        trained = {"steps": FINAL.steps, "threads": args.threads, "wall_seconds": round(seconds, 1),
                   "held_out_nats": round(nats, 4)}
        print(json.dumps({"final_recipe_trained": trained}))
        print(f"final recipe trained once (seed 0): {seconds:.0f} s of training (wall, "
              f"evaluations included; target <= 90 s), held-out {nats:.3f} nats per character "
              f"(target <= {BAR_NATS})", file=sys.stderr)
    return 1 if args.check and not ok else 0
