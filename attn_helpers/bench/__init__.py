"""Benchmarks behind the course's speed claims: ``python -m attn_helpers bench NAME [--help]``, NAME
one of widget, browser, attention, gpt. Every target is a ratio to a baseline measured in the same
run; ``--check`` exits 1 only when a ratio is missed."""

from __future__ import annotations

import statistics
import sys

COMMANDS = ("widget", "browser", "attention", "gpt")


def summarize(durations: list[float]) -> dict:
    """Median and 90th percentile of durations (ms), rounded to 3 decimals."""
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(p90, 3)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m attn_helpers bench {{{','.join(COMMANDS)}}} [--help]\n\n{__doc__}")
        return 2
    if argv[0] == "widget":         # each imported only when it runs
        from .widget import main
    elif argv[0] == "browser":
        from .browser import main
    elif argv[0] == "attention":
        from .attention import main
    else:
        from .gpt import main
    return main(argv[1:])
