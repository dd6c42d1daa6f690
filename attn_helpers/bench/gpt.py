"""``python -m attn_helpers bench gpt [--train] [--check]``: a training step (``build_gpt.train_step``)
of notebook 10's GPT against the same model from ``nn.TransformerEncoderLayer(norm_first=True)``,
interleaved in one run; ``--check``: the ratio of the medians at most :data:`TARGET`. ``--train``
then trains the final recipe once (seed 0) and prints its time and held-out loss."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch
from torch import nn

from ..lessons import build_gpt as bg
from ..training import torch_threads

TARGET = 1.5


class TorchGPT(nn.Module):
    """The same model from ``nn.TransformerEncoderLayer(norm_first=True)`` and a causal mask."""

    def __init__(self, cfg: bg.GPTConfig):
        super().__init__()
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


def bench_gpt(*, steps: int = 30, tiny: bool = False, threads: int = 1) -> dict:
    """Median ms of a training step for both models (3 untimed steps first), and their ratio."""
    corpus = bg.load_corpus()
    cfg = (bg.GPTConfig(corpus.vocab_size, context=16, d_model=32, num_heads=2, num_layers=2, d_ff=64)
           if tiny else bg.final_config(corpus.vocab_size))
    models = {"course": bg.GPT(cfg), "torch": TorchGPT(cfg)}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=bg.FINAL.lr, betas=bg.FINAL.betas)
                  for name, m in models.items()}
    generator = torch.Generator().manual_seed(0)
    seconds = {name: [] for name in models}
    with torch_threads(threads):
        for step in range(steps + 3):
            chunk = bg.get_batch(corpus.train, bg.FINAL.batch, cfg.context, generator)
            for name, model in models.items():
                start = time.perf_counter()
                bg.train_step(model, optimizers[name], chunk)
                if step >= 3:
                    seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in seconds.items()}
    return {"config": dataclasses.asdict(cfg) | {"batch": bg.FINAL.batch}, "threads": threads,
            "params": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
            "median_step_ms": {name: round(1000 * t, 2) for name, t in median.items()},
            "ratio": median["course"] / median["torch"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench gpt", description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (for tests)")
    parser.add_argument("--train", action="store_true",
                        help="then train the final recipe once (seed 0) and report its time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when the course's step is over {TARGET}x")
    args = parser.parse_args(argv)
    result = bench_gpt(steps=args.steps, tiny=args.tiny, threads=args.threads)
    print(json.dumps(result, indent=1))
    ok, ms = result["ratio"] <= TARGET, result["median_step_ms"]
    print(f"training step: course GPT {ms['course']} ms, nn.TransformerEncoderLayer {ms['torch']} ms: "
          f"{result['ratio']:.2f}x (target <= {TARGET}x) {'ok' if ok else 'FAIL'}", file=sys.stderr)
    if args.train:
        model, _, seconds = bg.build_and_train(bg.FINAL, seed=0, threads=args.threads)
        nats = bg.estimate_loss(model, bg.load_corpus().val, model.cfg.context, windows=None)
        print(json.dumps({"final_recipe_trained": {"steps": bg.FINAL.steps, "threads": args.threads,
                                                   "wall_seconds": round(seconds, 1),
                                                   "held_out_nats": round(nats, 4)}}))
        print(f"final recipe trained once (seed 0): {seconds:.0f} s of training (wall, evaluations "
              f"included; target <= 90 s), held-out {nats:.3f} nats per character "
              f"(target <= {bg.BAR_NATS})", file=sys.stderr)
    return 1 if args.check and not ok else 0
