"""Measuring, shared by the lessons and the benchmarks: time a call (the median of
``torch.utils.benchmark.Timer`` blocks), its peak memory, and a power law ``y = c n^p`` fit."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils import benchmark

from ._checks import require_number

__all__ = ["time_call", "peak_bytes", "PowerLaw", "fit_power_law", "format_bytes"]


def time_call(fn: Callable[[], object], *, budget_s: float = 1.0, cpu_clock: bool = False) -> float:
    """Median milliseconds of one ``fn()`` over about ``budget_s`` seconds of runs;
    ``cpu_clock``: the process's CPU time, so waiting on a busy machine does not count."""
    require_number("budget_s", budget_s, positive=True)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
                            timer=time.process_time if cpu_clock else time.perf_counter)
    return timer.blocked_autorange(min_run_time=budget_s).median * 1000.0


@contextlib.contextmanager
def _silence_fd2():
    """Silence C++ writes to file descriptor 2 (the profiler's log lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_bytes(fn: Callable[[], object], device: str = "cpu") -> int:
    """Peak bytes ``fn()`` allocates above what was allocated before: on CUDA the allocator's
    statistics, on CPU the running total of the profiler's allocation and free records."""
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    from torch.profiler import ProfilerActivity, profile

    with _silence_fd2(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    records.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for record in records:
        running += record.nbytes()
        peak = max(peak, running)
    return int(peak)


@dataclass(frozen=True)
class PowerLaw:
    """``y = coefficient * n ** slope``, fitted by least squares on log-log axes."""

    slope: float
    coefficient: float
    n_min: int
    n_max: int

    def predict(self, n) -> float:
        """The fitted ``y`` at ``n`` (a number)."""
        return self.coefficient * require_number("n", n, positive=True) ** self.slope


def fit_power_law(ns, ys) -> PowerLaw:
    """Least-squares line through ``(log n, log y)``: ``ns`` (two distinct at least) and ``ys``
    all > 0, one ``y`` per ``n``."""
    ns, ys = [float(x) for x in ns], [float(y) for y in ys]
    if len(ns) != len(ys):
        raise ValueError(f"ns and ys must have the same length, got {len(ns)} and {len(ys)}")
    if len(set(ns)) < 2:
        raise ValueError(f"need at least two distinct n to fit a slope, got ns={ns}")
    if min(ns) <= 0 or min(ys) <= 0:
        raise ValueError(f"every n and y must be > 0 on log-log axes, got ns={ns}, ys={ys}")
    slope, intercept = np.polyfit(np.log(ns), np.log(ys), 1)
    return PowerLaw(float(slope), float(math.exp(intercept)), int(min(ns)), int(max(ns)))


def format_bytes(n_bytes: float) -> str:
    """``1536 -> '1.5 KiB'``: bytes in binary units, 3 significant figures."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024:
            return f"{n_bytes:.3g} {unit}" if unit != "B" else f"{int(n_bytes)} B"
        n_bytes /= 1024
    return f"{n_bytes:.3g} TiB"
