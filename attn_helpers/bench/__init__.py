"""Benchmarks behind the course's speed claims: ``python -m attn_helpers bench NAME``
(alias ``python -m attn_helpers.bench NAME``).

``widget``: the cost of one slider move in the kernel (compute + render + PNG into the
``ipywidgets.Image``). One record per notebook widget, ``{"widget": "<notebook slug>", "method":
"live", "median_ms", "p90_ms", "cpu_median_ms"}``, each widget built as its notebook builds it and
driven through its sliders; plus, for the generic view, ``{"tokens", "method", "median_ms",
"p90_ms"}`` beside the naive approach of re-creating a seaborn heatmap on every change, measured in
the same run. Targets: every notebook's median at most 15 ms; at 32 tokens the generic view at
most 15 ms and at least 10x faster than seaborn.

``browser``: what the learner feels, end to end: JupyterLab on loopback with a random token,
Debian's Chromium through Playwright, Run All, then arrow keys on every slider of every widget,
each move timed from the key press to the new picture painted; per-notebook median and p90, and
``--check`` fails above 50 ms (see :mod:`attn_helpers.bench.browser`).

``attention``: time and peak memory of one attention call (batch 1, 8 heads, head dimension 64,
float32) against the sequence length ``n`` for ``naive`` (materialises the ``n x n`` scores),
``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``), ``tiled``, causal ``linear`` and
causal ``local`` (from :mod:`attn_helpers.efficient`), ``n`` doubling from 128 to ``--max-n``; and
of forward + backward (``naive_fwd_bwd``: autograd through the naive code, ``sdpa_fwd_bwd``,
``tiled_fwd_bwd``: FlashAttention's recomputing backward) up to ``n = 4096``. It prints a JSON
list of records ``{"method", "n", "median_ms", "peak_bytes", "gflops"}`` plus one
``{"method": "matmul_peak", "gflops"}``, the best rate of a large matrix product, and one
``{"method": "machine", "cache_bytes", "copy_gbps"}``, the cache sizes and the copy bandwidth, all
measured in the same run; the targets' ratios go to stderr.

Timings are medians over many repeats, so a busy machine moves them little; the targets are
checked against a baseline measured in the same process, never against a fixed number in a test.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ..lessons.complexity import bench_attention
from .attention import attention_verdict
from .widget import bench_widget, widget_verdict

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="name", required=True)
    widget = sub.add_parser("widget", help="one slider move: live widget vs seaborn re-plot")
    widget.add_argument("--repeats", type=int, default=60, help="timed moves per live case")
    widget.add_argument("--check", action="store_true",
                        help="exit with status 1 when the targets are not met")
    attention = sub.add_parser("attention", help="time and peak memory of attention against n")
    attention.add_argument("--max-n", type=int, default=8192, help="largest sequence length")
    attention.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    attention.add_argument("--threads", type=int, default=None,
                           help="torch CPU threads (default: torch's own choice)")
    attention.add_argument("--budget-s", type=float, default=1.0,
                           help="seconds of timed runs per method and n (default 1.0)")
    attention.add_argument("--check", action="store_true",
                           help="exit with status 1 when the targets are not met")
    sub.add_parser("browser", add_help=False,
                   help="key press to new picture in JupyterLab in Chromium (see --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["browser"]:
        from .browser import main as browser_main

        return browser_main(argv[1:])
    args = parser.parse_args(argv)
    if args.name == "attention":
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
    if args.name == "widget":
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        records = bench_widget(args.repeats, max(3, args.repeats // 5))
        print(json.dumps(records, indent=1))
        ok, verdict = widget_verdict(records)
        print(verdict, file=sys.stderr)
        return 0 if ok or not args.check else 1
    return 2
