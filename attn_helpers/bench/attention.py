"""``python -m attn_helpers bench attention [--max-n 8192] [--device cpu|cuda] [--check]``: time
and peak memory of one attention call (batch 1, 8 heads of 64, float32) against ``n``, doubling from
128, for naive, sdpa, tiled, causal linear and causal local attention, and forward + backward up to
4096 (:func:`attn_helpers.lessons.complexity.bench_attention`). Prints the JSON records, then the
targets' ratios (same run) to stderr."""

from __future__ import annotations

import argparse
import json
import sys

#: (what, numerator method, denominator method, n, record key, largest ratio allowed)
TARGETS = (
    ("tiled peak memory", "tiled", "naive", 8192, "peak_bytes", 0.05),
    ("tiled forward + backward peak memory", "tiled_fwd_bwd", "naive_fwd_bwd", 4096,
     "peak_bytes", 0.05),
    ("tiled median time", "tiled", "sdpa", 4096, "median_ms", 3.0),
)


def attention_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check :data:`TARGETS` on one run, each only when its ``n`` was measured."""
    by = {(r["method"], r.get("n")): r for r in records}
    lines, ok = [], True
    for what, top, bottom, n, key, limit in TARGETS:
        if (top, n) not in by or (bottom, n) not in by:
            lines.append(f"n={n} {top} / {bottom} not measured: target not checked")
            continue
        ratio = by[(top, n)][key] / by[(bottom, n)][key]
        ok &= ratio <= limit
        shown, target = ((f"{100 * ratio:.2f}% of", f"{100 * limit:.0f}%") if key == "peak_bytes"
                         else (f"{ratio:.2f}x", f"{limit:.0f}x"))
        lines.append(f"n={n}: {what} = {shown} {bottom}'s (target <= {target}): "
                     f"{'met' if ratio <= limit else 'NOT met'}")
    return ok, "\n".join(lines)


def main(argv: list[str]) -> int:
    import torch

    from ..lessons.complexity import bench_attention

    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench attention", description=__doc__)
    parser.add_argument("--max-n", type=int, default=8192, help="largest sequence length (>= 128)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds of timed runs per case")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.max_n < 128 or not args.budget_s > 0 or (args.threads is not None and args.threads < 1):
        parser.error("--max-n must be >= 128, --budget-s > 0 and --threads >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    records = bench_attention(args.max_n, args.device, budget_s=args.budget_s)
    print(json.dumps(records, indent=1))
    ok, verdict = attention_verdict(records)
    print(verdict, file=sys.stderr)
    return 1 if args.check and not ok else 0
