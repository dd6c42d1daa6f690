"""Benchmarks behind the course's speed claims: ``python -m attn_helpers bench NAME ...``
(alias ``python -m attn_helpers.bench NAME ...``; ``NAME --help`` for each one's options).

Every target is a ratio to a baseline measured in the same run (machines differ by 3x and more),
never a fixed number of milliseconds; ``--check`` exits 1 only when a ratio is missed, and the
numbers and ratios are always printed.

``widget``: one slider move in the kernel (compute + render + PNG into the ``ipywidgets.Image``)
for every notebook's widget, built as its notebook builds it, and for the generic view at 8, 32
and 64 tokens, beside re-creating a seaborn heatmap figure on every change. Target: every move
at most 1/10 of the seaborn re-plot at 32 tokens (see :mod:`attn_helpers.bench.widget`).

``browser``: what the learner feels, end to end, in one pass of JupyterLab in headless Chromium:
a floor (a bare ipywidgets slider swapping precomputed PNGs), then every notebook run, checked
(no error; a slider move changes the picture and the readouts) and timed from the key press to
the new picture. Target: every notebook's median at most 2x the floor (see
:mod:`attn_helpers.bench.browser`).

``attention``: time and peak memory of one attention call (batch 1, 8 heads, head dimension 64,
float32) against the sequence length ``n`` for ``naive`` (materialises the ``n x n`` scores),
``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``), ``tiled``, causal ``linear`` and
causal ``local`` (from :mod:`attn_helpers.efficient`), ``n`` doubling from 128 to ``--max-n``; and
of forward + backward (``naive_fwd_bwd``, ``sdpa_fwd_bwd``, ``tiled_fwd_bwd``: FlashAttention's
recomputing backward) up to ``n = 4096``. It prints a JSON list of records ``{"method", "n",
"median_ms", "peak_bytes", "gflops"}`` plus one ``{"method": "matmul_peak", "gflops"}`` and one
``{"method": "machine", "cache_bytes", "copy_gbps"}``, all measured in the same run; the targets'
ratios go to stderr (tiled's peak memory against naive's, its time against sdpa's).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import import_module

__all__ = ["COMMANDS", "main"]

#: ``NAME: ("module:function", help)``: ``function(argv) -> exit status`` runs ``bench NAME``.
#: Modules are imported only when their command runs. A new benchmark is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "widget": ("attn_helpers.bench.widget:main",
               "one slider move in the kernel, against re-creating a seaborn heatmap"),
    "browser": ("attn_helpers.bench.browser:main",
                "every notebook in JupyterLab in Chromium: checked, and key press to picture "
                "against a bare slider's floor"),
    "attention": ("attn_helpers.bench:attention_main",
                  "time and peak memory of attention against n"),
    "gpt": ("attn_helpers.bench.gpt:main",
            "a training step of notebook 10's GPT against nn.TransformerEncoderLayer"),
}


def attention_main(argv: list[str]) -> int:
    import torch

    from ..lessons.complexity import bench_attention
    from .attention import attention_verdict

    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench attention",
                                     description=COMMANDS["attention"][1])
    parser.add_argument("--max-n", type=int, default=8192, help="largest sequence length")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--budget-s", type=float, default=1.0,
                        help="seconds of timed runs per method and n (default 1.0)")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when the targets are not met")
    args = parser.parse_args(argv)
    if args.max_n < 128:
        parser.error("--max-n must be >= 128")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if not args.budget_s > 0:
        parser.error("--budget-s must be > 0")
    records = bench_attention(args.max_n, args.device, budget_s=args.budget_s)
    print(json.dumps(records, indent=1))
    ok, verdict = attention_verdict(records)
    print(verdict, file=sys.stderr)
    return 0 if ok or not args.check else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        module, function = COMMANDS[argv[0]][0].split(":")
        return getattr(import_module(module), function)(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="name", required=True)
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    parser.parse_args(argv)  # --help, or an unknown or missing name: exits
    return 2
