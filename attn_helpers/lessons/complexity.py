"""Notebook 08's measurements: the live harness (:func:`benchmark`, :func:`slope`, the figures) and
the committed benchmark, :func:`bench_attention` (``python -m attn_helpers bench attention``) and
:func:`load_benchmark`."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from .._checks import require_positive_int
from ..efficient import linear_attention, local_attention, tiled_attention
from ..measure import PowerLaw, fit_power_law, peak_bytes, time_call

HEADS, HEAD_DIM = 8, 64         # the benchmark's inputs: (1, 8, n, 64) float32
ATTENTION_METHODS = ("naive", "sdpa", "tiled", "linear", "local")
FWD_BWD_METHODS = ("naive_fwd_bwd", "sdpa_fwd_bwd", "tiled_fwd_bwd")
LOCAL_WINDOW = 256
FIT_N_MIN = 1024                # fits start here: below it naive's matrices fit in the cache
#: Okabe-Ito colours (colour-blind safe) of the methods in the notebook's figures
METHOD_COLORS = {"naive": "#D55E00", "sdpa": "#0072B2", "tiled": "#009E73", "linear": "#CC79A7",
                 "local": "#E69F00", "sdpa_causal": "#56B4E9"}


def cpu_ms(call: Callable) -> float:
    """One ``call()``'s CPU time in ms: waiting on a busy machine does not count."""
    start = time.process_time()
    call()
    return 1000 * (time.process_time() - start)


def benchmark(methods: dict[str, Callable], plan: dict[str, dict[int, int]], generator
              ) -> tuple[dict, dict]:
    """``plan[method] = {n: timed calls}`` -> ``(ms, peak)``, keyed ``(method, n)``: the fastest
    call's CPU ms and one call's peak extra bytes (also the warm-up). Inputs ``(1, 8, n, 64)``
    float32 from ``generator``, fresh per method; the methods at one ``n`` are timed in
    interleaved rounds, so a load spike hits them all."""
    ms, peak = {}, {}
    with torch.no_grad():
        for n in sorted({n for sizes in plan.values() for n in sizes}):
            calls = {m: partial(methods[m], *(torch.randn(1, 8, n, 64, generator=generator)
                                              for _ in range(3))) for m in plan if n in plan[m]}
            peak |= {(m, n): peak_bytes(call) for m, call in calls.items()}
            for round_ in range(max(plan[m][n] for m in calls)):
                for m, call in calls.items():
                    if round_ < plan[m][n]:
                        ms[(m, n)] = min(ms.get((m, n), math.inf), cpu_ms(call))
    return ms, peak


def slope(table: dict, method: str, n_min: int = 256) -> float:
    """The exponent ``p`` of a power law ``c n^p`` fitted to ``table[(method, n)]``, ``n >= n_min``."""
    ns = [n for m, n in table if m == method and n >= n_min]
    return fit_power_law(ns, [table[(method, n)] for n in ns]).slope


def plot_scaling(ms: dict, peak: dict, causal=(), calls="several") -> None:
    """Time and peak memory against ``n``, log-log, a line per method (dashed: ``causal``); the legend
    gives each time series' slope from ``n = 256`` (two-point where a series has two sizes)."""
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for m in dict.fromkeys(m for m, _ in ms):
        ns, hollow = sorted(n for method, n in ms if method == m), m.endswith("_causal")
        style = dict(color=METHOD_COLORS[m], marker="D" if hollow else "o",
                     markersize=10 if hollow else 6, markerfacecolor="none" if hollow else None,
                     linestyle="--" if m in causal else "-")   # a large hollow diamond: dots below show
        fit = "rough fit: slope" if len(ns) > 2 else "two-point slope"                # 2 points: no fit
        ax_t.loglog(ns, [ms[(m, n)] for n in ns], **style, label=f"{m} ({fit} {slope(ms, m):.1f})")
        ax_m.loglog(ns, [peak[(m, n)] / 2**20 for n in ns], **style, label=m)
    for ax, what in ((ax_t, "CPU time (ms)"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="sequence length n", ylabel=what)
        ax.legend(fontsize=8)
    ax_t.set_title(f"CPU time, one thread, fastest of {calls} calls"
                   + (" (dashed: causal)" if causal else ""))
    ax_m.set_title("memory allocated during one call (inputs excluded)")
    plt.show()


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Textbook attention: materialises the ``(..., n, n)`` scores and weights."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


ATTENTION_FUNCTIONS: dict[str, Callable] = {
    "naive": naive_attention,
    "sdpa": F.scaled_dot_product_attention,
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=512, query_block_size=1024),
    "linear": lambda q, k, v: linear_attention(q, k, v, causal=True),
    "local": lambda q, k, v: local_attention(q, k, v, LOCAL_WINDOW, causal=True),
    "naive_fwd_bwd": naive_attention,
    "sdpa_fwd_bwd": F.scaled_dot_product_attention,
    "tiled_fwd_bwd": lambda q, k, v: tiled_attention(q, k, v, block_size=128),   # as on GPUs
}


def fwd_bwd_call(fn: Callable, q, k, v, d_out) -> Callable[[], tuple]:
    """A call running ``fn(q, k, v)`` forward and backward for ``d_out``, returning ``(dq, dk, dv)``."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)


def saved_bytes(fn: Callable, q, k, v) -> int:
    """Bytes autograd saves for the backward of ``fn(q, k, v)``, each storage once."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v)
    return sum(seen.values())


def attention_flops(method: str, n: int, heads: int = HEADS, d: int = HEAD_DIM) -> float:
    """Useful FLOPs of one call per head: ``4 n^2 d`` exact (``12 n^2 d`` forward + backward),
    ``4 n d^2`` linear, ``4 n w d`` local."""
    width = {"linear": d, "local": min(n, LOCAL_WINDOW)}.get(method, n)   # what n^2 d becomes
    return (12.0 if method in FWD_BWD_METHODS else 4.0) * heads * n * width * d


def matmul_gflops(device: str = "cpu", sizes: tuple[int, ...] = (256, 512, 1024, 2048)) -> float:
    """The compute peak: the best GFLOP/s of square float32 products of these ``sizes``."""
    g, best = torch.Generator().manual_seed(0), 0.0
    for size in sizes:
        a, b = (torch.randn(size, size, generator=g).to(device) for _ in range(2))
        ms = time_call(lambda a=a, b=b: a @ b, budget_s=0.5 / len(sizes), cpu_clock=device == "cpu")
        best = max(best, 2.0 * size**3 / (ms / 1000.0) / 1e9)
    return best


def cache_sizes() -> dict[str, int]:
    """This CPU's data caches in bytes, ``{"L1d": .., "L2": .., "L3": ..}``, from Linux's sysfs."""
    sizes, units = {}, {"K": 2**10, "M": 2**20, "G": 2**30}
    for folder in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((folder / key).read_text().strip()
                                 for key in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            value = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
            sizes[f"L{level}" + ("d" if kind == "Data" else "")] = value
    return sizes


def copy_bandwidth_gbps(device: str = "cpu", n_bytes: int = 256 * 2**20,
                        budget_s: float = 0.5, repeats: int = 1) -> float:
    """GB/s copying ``n_bytes``, 2 bytes per byte (no write-allocate), best of ``repeats`` medians."""
    require_positive_int("repeats", repeats)
    src, dst = torch.ones(n_bytes // 4, device=device), torch.empty(n_bytes // 4, device=device)
    best_ms = min(time_call(lambda: dst.copy_(src), budget_s=budget_s, cpu_clock=device == "cpu")
                  for _ in range(repeats))
    return 2 * n_bytes / (best_ms / 1000.0) / 1e9


def bench_attention(max_n: int = 8192, device: str = "cpu",
                    methods=ATTENTION_METHODS + FWD_BWD_METHODS, *, budget_s: float = 1.0,
                    fwd_bwd_max_n: int = 4096, references: bool = True) -> list[dict]:
    """Every method at ``n = 128, 256, ...`` up to ``max_n`` (forward + backward up to
    ``fwd_bwd_max_n``: naive autograd at 8192 needs ~12 GiB): records ``{"method", "n",
    "median_ms", "peak_bytes", "gflops"}``, then a ``matmul_peak`` and a ``machine`` record."""
    if unknown := set(methods) - set(ATTENTION_FUNCTIONS):
        raise ValueError(f"methods must be among {tuple(ATTENTION_FUNCTIONS)}, got {sorted(unknown)}")
    if device not in ("cpu", "cuda") or device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be 'cpu', or 'cuda' where CUDA is available; got {device!r}")
    records, g, cpu = [], torch.Generator().manual_seed(0), device == "cpu"
    for n in [128 * 2**i for i in range(16) if 128 * 2**i <= max_n]:
        q, k, v, d_out = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(device) for _ in range(4))
        for method in methods:
            if method in FWD_BWD_METHODS and n > fwd_bwd_max_n:
                continue
            fn = ATTENTION_FUNCTIONS[method]
            call = (fwd_bwd_call(fn, q, k, v, d_out) if method in FWD_BWD_METHODS
                    else torch.no_grad()(partial(fn, q, k, v)))
            median_ms = time_call(call, budget_s=budget_s, cpu_clock=cpu)
            records.append({
                "method": method, "n": n, "median_ms": round(median_ms, 3),
                "peak_bytes": peak_bytes(call, device),
                "gflops": round(attention_flops(method, n) / (median_ms / 1000.0) / 1e9, 3),
            })
    if references:
        records.append({"method": "matmul_peak", "gflops": round(matmul_gflops(device), 3)})
        records.append({"method": "machine", "cache_bytes": cache_sizes() if cpu else {},
                        "copy_gbps": round(copy_bandwidth_gbps(device), 3),
                        "threads": torch.get_num_threads()})   # the rates depend on it
    return records


def series(records: list[dict], method: str, key: str, *, n_min: int = 0
           ) -> tuple[list[int], list[float]]:
    """``(ns, values)`` of one method, sorted by ``n``, keeping ``n >= n_min``."""
    rows = sorted((r["n"], r[key]) for r in records
                  if r["method"] == method and r["n"] >= n_min)
    if not rows:
        raise ValueError(f"no records for method {method!r} with n >= {n_min}")
    return [n for n, _ in rows], [value for _, value in rows]


def fit_methods(records: list[dict], key: str = "median_ms", *, n_min: int = 0) -> dict[str, PowerLaw]:
    """A :class:`PowerLaw` of ``key`` against ``n >= n_min`` for each forward method."""
    return {m: fit_power_law(*series(records, m, key, n_min=n_min)) for m in ATTENTION_METHODS}


def machine(records: list[dict]) -> dict | None:
    return next((r for r in records if r["method"] == "machine"), None)


def load_benchmark() -> list[dict]:
    """The committed CPU run of :func:`bench_attention`."""
    return json.loads((Path(__file__).parents[1] / "data" / "bench_attention_cpu.json").read_text())
