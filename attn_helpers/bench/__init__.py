"""Benchmarks behind the course's speed claims: ``python -m attn_helpers bench NAME ...``
(``NAME --help`` for each one's options). Every target is a ratio to a baseline measured in the
same run (machines differ by 3x and more), never a fixed number of milliseconds; ``--check``
exits 1 only when a ratio is missed, and the numbers and ratios are always printed.

* ``widget``: one slider move in the kernel for every notebook's widget, against re-creating a
  seaborn heatmap on every change (:mod:`.widget`).
* ``browser``: every notebook run, checked and timed in JupyterLab in headless Chromium, against
  a bare slider's floor (:mod:`.browser`).
* ``attention``: time and peak memory of attention against ``n`` (:mod:`.attention`).
* ``gpt``: a training step of notebook 10's GPT against ``nn.TransformerEncoderLayer``.
"""

from __future__ import annotations

import statistics
import sys


def summarize(durations: list[float]) -> dict:
    """Median and 90th percentile of a list of durations (ms), rounded to 3 decimals."""
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(p90, 3)}


def _command(name: str):
    """The ``main(argv)`` of a command, imported only when it runs."""
    if name == "widget":
        from .widget import main
    elif name == "browser":
        from .browser import main
    elif name == "attention":
        from .attention import main
    else:
        from .gpt import main
    return main


COMMANDS = ("widget", "browser", "attention", "gpt")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m attn_helpers bench {{{','.join(COMMANDS)}}} [--help]\n\n{__doc__}")
        return 2
    return _command(argv[0])(argv[1:])
