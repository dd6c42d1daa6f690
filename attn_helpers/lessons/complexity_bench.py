r"""The attention benchmark of notebook 08 (forward, and forward + backward) and the machine it
runs on (cache sizes, copy bandwidth, matrix-product peak).

:func:`bench_attention` (behind ``python -m attn_helpers bench attention``) returns JSON records:

* ``{"method", "n", "median_ms", "peak_bytes", "gflops"}`` for the forward methods
  (:data:`ATTENTION_METHODS`) and for forward + backward (:data:`FWD_BWD_METHODS`: ``q, k, v``
  need gradients, the call returns ``dq, dk, dv`` for a fixed ``dO``);
* one ``{"method": "matmul_peak", "gflops"}``: the best rate of square matrix products;
* one ``{"method": "machine", "cache_bytes", "copy_gbps"}``: this machine's cache sizes (sysfs)
  and the bandwidth of a large tensor copy, measured in the same run.

Every call runs on one sequence (batch 1) of 8 heads of size 64 in float32; on CPU, times are
medians of the process's CPU clock (:func:`time_ms`).
:func:`load_benchmark` loads the committed full CPU run; :func:`fit_methods` fits power laws
:math:`y = c\,n^{p}` on log-log axes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from ..efficient import linear_attention, local_attention, tiled_attention
from ..measure import PowerLaw, fit_power_law, peak_bytes, time_call

__all__ = ["ATTENTION_HEADS", "ATTENTION_HEAD_DIM", "ATTENTION_METHODS", "FWD_BWD_METHODS",
           "EXTRA_METHODS",
           "ATTENTION_FUNCTIONS", "naive_attention", "fwd_bwd_call", "saved_bytes",
           "attention_flops", "attention_sizes", "time_ms", "matmul_gflops", "cache_sizes",
           "last_level_cache", "copy_bandwidth_gbps", "machine_record", "bench_attention",
           "BENCHMARK_FILE", "validate_records", "series", "fit_methods", "matmul_peak", "machine",
           "load_benchmark", "FIT_N_MIN"]

BENCHMARK_FILE = "bench_attention_cpu.json"
ATTENTION_HEADS = 8
ATTENTION_HEAD_DIM = 64
ATTENTION_METHODS = ("naive", "sdpa", "tiled", "linear", "local")
FWD_BWD_METHODS = ("naive_fwd_bwd", "sdpa_fwd_bwd", "tiled_fwd_bwd")
#: measured on request only: exact causal attention, the like-for-like reference of linear and local
EXTRA_METHODS = ("sdpa_causal",)
TILED_QUERY_BLOCK = 1024
TILED_KEY_BLOCK = 512
#: square tiles of the tiled forward + backward (128: a block size FlashAttention-2 uses on GPUs)
TILED_FWD_BWD_BLOCK = 128
LOCAL_WINDOW = 256
#: power laws are fitted on n >= FIT_N_MIN (below it, naive's matrices still fit in the cache)
FIT_N_MIN = 1024
#: forward + backward is measured up to this n (naive autograd at 8192 would need ~12 GiB)
FWD_BWD_MAX_N = 4096


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Textbook attention that materialises the ``(..., n, n)`` score and weight matrices."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


#: every method by name; ``linear`` and ``local`` are both causal, so they compare like for like
ATTENTION_FUNCTIONS: dict[str, Callable] = {
    "naive": naive_attention,
    "sdpa": F.scaled_dot_product_attention,
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=TILED_KEY_BLOCK,
                                             query_block_size=TILED_QUERY_BLOCK),
    "linear": lambda q, k, v: linear_attention(q, k, v, causal=True),
    "local": lambda q, k, v: local_attention(q, k, v, LOCAL_WINDOW, causal=True),
    "sdpa_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "naive_fwd_bwd": naive_attention,
    "sdpa_fwd_bwd": F.scaled_dot_product_attention,
    "tiled_fwd_bwd": lambda q, k, v: tiled_attention(q, k, v, block_size=TILED_FWD_BWD_BLOCK),
}


def fwd_bwd_call(fn: Callable, q, k, v, d_out) -> Callable[[], tuple]:
    """A call that runs ``fn(q, k, v)`` forward and backward for the output gradient ``d_out``
    and returns ``(dq, dk, dv)`` (fresh tensors: nothing accumulates between calls)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)


def saved_bytes(fn: Callable, q, k, v) -> int:
    """Bytes of the tensors autograd saves for the backward of ``fn(q, k, v)`` (each storage
    counted once), seen through ``torch.autograd.graph.saved_tensors_hooks``."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v)
    return sum(seen.values())


def attention_flops(method: str, n: int, heads: int = ATTENTION_HEADS,
                    d: int = ATTENTION_HEAD_DIM) -> float:
    """Useful floating-point operations of one call: the two matrix products of exact attention
    ``4 n^2 d`` per head (``12 n^2 d`` forward + backward: the backward's four products, no
    recomputation); ``4 n d^2`` for linear attention; ``4 n w d`` for a window ``w``."""
    if method in ("naive", "sdpa", "tiled"):
        return 4.0 * heads * n * n * d
    if method in FWD_BWD_METHODS:
        return 12.0 * heads * n * n * d
    if method == "linear":
        return 4.0 * heads * n * d * d
    if method == "sdpa_causal":                                      # the pairs j <= i: about half
        return 2.0 * heads * n * (n + 1) * d
    if method == "local":
        return 4.0 * heads * n * min(n, LOCAL_WINDOW) * d
    raise ValueError(f"method must be one of {ATTENTION_METHODS + FWD_BWD_METHODS}, got {method!r}")


def attention_sizes(max_n: int, min_n: int = 128) -> list[int]:
    """``min_n, 2 min_n, ...`` up to ``max_n``."""
    sizes, n = [], min_n
    while n <= max_n:
        sizes.append(n)
        n *= 2
    return sizes


def time_ms(fn: Callable[[], object], *, budget_s: float = 1.0, device: str = "cpu") -> float:
    """Median milliseconds of one ``fn()`` (:func:`attn_helpers.measure.time_call`): on CPU, of
    the process's CPU clock, so the time a busy, shared machine keeps the process waiting does not
    count (with one torch thread it is the call's compute time); on CUDA, of the wall clock."""
    return time_call(fn, budget_s=budget_s, cpu_clock=device == "cpu")


def matmul_gflops(device: str = "cpu", sizes: tuple[int, ...] = (256, 512, 1024, 2048)) -> float:
    """The best GFLOP/s of square float32 matrix products of the given ``sizes`` (``2 size^3``
    operations each) timed with :func:`time_ms`: the practical compute peak, measured on the same
    clock as the attention. Several sizes, because one large product alone is not the peak on a
    CPU: on a 2-core AVX2 EPYC (2026-11-26) size 2048 ran at 62-69 GFLOP/s and size 256 at 83,
    so notebook 08's (8, 256, 256) products sat up to 1.37x above a 2048-only roof."""
    g = torch.Generator().manual_seed(0)
    best = 0.0
    for size in sizes:
        a, b = (torch.randn(size, size, generator=g).to(device) for _ in range(2))
        ms = time_ms(lambda a=a, b=b: a @ b, budget_s=0.5 / len(sizes), device=device)
        best = max(best, 2.0 * size**3 / (ms / 1000.0) / 1e9)
    return best


def cache_sizes() -> dict[str, int]:
    """This CPU's data caches, e.g. ``{"L1d": 49152, "L2": 1048576, "L3": 33554432}``: on Linux
    those sysfs lists for CPU 0 (each shared with the CPUs its ``shared_cpu_list`` names), on
    macOS those ``sysctl`` reports; empty where neither answers."""
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
    if not sizes and sys.platform == "darwin":
        for name in ("L1d", "L2", "L3"):
            key = f"hw.{name.lower()}cachesize"                       # hw.l1dcachesize, ...
            done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip().isdigit() and int(done.stdout) > 0:
                sizes[name] = int(done.stdout)
    return sizes


def last_level_cache(sizes: dict[str, int]) -> int:
    """The largest cache of :func:`cache_sizes` (the L3 on most x86 CPUs) in bytes, 0 if unknown."""
    return max(sizes.values(), default=0)


def copy_bandwidth_gbps(device: str = "cpu", n_bytes: int = 256 * 2**20,
                        budget_s: float = 0.5) -> float:
    """Main-memory bandwidth: a copy of ``n_bytes`` (far larger than any cache), counting one read
    and one write of every byte, in GB/s (1e9 bytes per second)."""
    src = torch.ones(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * n_bytes / (time_ms(lambda: dst.copy_(src), budget_s=budget_s, device=device)
                          / 1000.0) / 1e9


def machine_record(device: str = "cpu") -> dict:
    """``{"method": "machine", "cache_bytes": cache_sizes(), "copy_gbps": ...}``."""
    return {"method": "machine", "cache_bytes": cache_sizes() if device == "cpu" else {},
            "copy_gbps": round(copy_bandwidth_gbps(device), 3)}


def bench_attention(max_n: int = 8192, device: str = "cpu",
                    methods=ATTENTION_METHODS + FWD_BWD_METHODS, *, min_n: int = 128,
                    budget_s: float = 1.0, seed: int = 0, fwd_bwd_max_n: int = FWD_BWD_MAX_N,
                    references: bool = True, tiled_block: int | None = None) -> list[dict]:
    """Measure every method at every ``n`` (forward + backward only up to ``fwd_bwd_max_n``);
    return the JSON records of the module docstring, the matmul peak and the machine last
    (``references=False`` leaves those two out, for a quick run). ``tiled_block``: square tiles
    of this size for ``tiled`` instead of the committed run's 1024 x 512."""
    known = ATTENTION_METHODS + FWD_BWD_METHODS + EXTRA_METHODS
    unknown = set(methods) - set(known)
    if unknown:
        raise ValueError(f"methods must be among {known}, got {sorted(unknown)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch.cuda.is_available() is False")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    records = []
    g = torch.Generator().manual_seed(seed)
    for n in attention_sizes(max_n, min_n):
        shape = (1, ATTENTION_HEADS, n, ATTENTION_HEAD_DIM)
        q, k, v, d_out = (torch.randn(shape, generator=g).to(device) for _ in range(4))
        for method in methods:
            fn = ATTENTION_FUNCTIONS[method]
            if method == "tiled" and tiled_block is not None:
                def fn(q, k, v, b=tiled_block):
                    return tiled_attention(q, k, v, block_size=b)
            if method in FWD_BWD_METHODS:
                if n > fwd_bwd_max_n:
                    continue
                call = fwd_bwd_call(fn, q, k, v, d_out)
            else:
                def call(fn=fn, q=q, k=k, v=v):
                    with torch.no_grad():
                        return fn(q, k, v)

            median_ms = time_ms(call, budget_s=budget_s, device=device)
            records.append({
                "method": method, "n": n, "median_ms": round(median_ms, 3),
                "peak_bytes": peak_bytes(call, device),
                "gflops": round(attention_flops(method, n) / (median_ms / 1000.0) / 1e9, 3),
            })
    if references:
        records.append({"method": "matmul_peak", "gflops": round(matmul_gflops(device), 3)})
        records.append(machine_record(device))
    return records


# The records: schema, the committed run, series and power-law fits.

def validate_records(records) -> list[dict]:
    """Check the benchmark's JSON schema (module docstring); return
    the records. Raises ``ValueError`` naming the first bad record."""
    if not isinstance(records, list) or not records:
        raise ValueError(f"records must be a non-empty list, got {type(records).__name__}")
    kinds = {"matmul_peak": 0, "machine": 0}
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "method" not in r:
            raise ValueError(f"record {i} must be a dict with a 'method', got {r!r}")
        method = r["method"]
        keys = {"matmul_peak": {"method", "gflops"},
                "machine": {"method", "cache_bytes", "copy_gbps"}}.get(
            method, {"method", "n", "median_ms", "peak_bytes", "gflops"})
        if set(r) != keys:
            raise ValueError(f"record {i} must have exactly the keys {sorted(keys)}, got {sorted(r)}")
        if method in kinds:
            kinds[method] += 1
        if method == "machine":
            caches = r["cache_bytes"]
            if not isinstance(caches, dict) or not all(
                    isinstance(v, int) and v > 0 for v in caches.values()) or not r["copy_gbps"] > 0:
                raise ValueError(f"record {i}: cache_bytes must map names to ints > 0 and "
                                 f"copy_gbps be > 0, got {r!r}")
            continue
        if method not in kinds:
            if method not in ATTENTION_METHODS + FWD_BWD_METHODS + EXTRA_METHODS:
                raise ValueError(f"record {i}: unknown method {method!r}")
            if not isinstance(r["n"], int) or not isinstance(r["peak_bytes"], int):
                raise ValueError(f"record {i}: n and peak_bytes must be ints, got {r!r}")
            if r["median_ms"] <= 0 or r["peak_bytes"] < 0:
                raise ValueError(f"record {i}: median_ms must be > 0 and peak_bytes >= 0, got {r!r}")
        if not r["gflops"] > 0:
            raise ValueError(f"record {i}: gflops must be > 0, got {r!r}")
    if kinds["matmul_peak"] != 1 or kinds["machine"] > 1:
        raise ValueError(f"records must hold exactly one 'matmul_peak' record and at most one "
                         f"'machine' record, got {kinds}")
    return records


def series(records: list[dict], method: str, key: str, *, n_min: int = 0
           ) -> tuple[list[int], list[float]]:
    """``(ns, values)`` of one method, sorted by ``n``, keeping ``n >= n_min``."""
    rows = sorted((r["n"], r[key]) for r in records
                  if r["method"] == method and r["n"] >= n_min)
    if not rows:
        raise ValueError(f"no records for method {method!r} with n >= {n_min}")
    return [n for n, _ in rows], [value for _, value in rows]


def fit_methods(records: list[dict], key: str = "median_ms", *, n_min: int = 0,
                methods=None) -> dict[str, PowerLaw]:
    """A :class:`PowerLaw` of ``key`` against ``n`` for each method (``n >= n_min``); by default
    the forward methods (:data:`ATTENTION_METHODS`) present in ``records``."""
    if methods is None:
        methods = [m for m in ATTENTION_METHODS if any(r["method"] == m for r in records)]
    return {m: fit_power_law(*series(records, m, key, n_min=n_min)) for m in methods}


def matmul_peak(records: list[dict]) -> float:
    """The GFLOP/s of the run's ``matmul_peak`` record."""
    return next(r["gflops"] for r in records if r["method"] == "matmul_peak")


def machine(records: list[dict]) -> dict | None:
    """The run's ``machine`` record (cache sizes, copy bandwidth), or ``None``."""
    return next((r for r in records if r["method"] == "machine"), None)


def load_benchmark(name: str = BENCHMARK_FILE) -> list[dict]:
    """The committed benchmark records shipped in ``attn_helpers/data/`` (validated)."""
    text = resources.files("attn_helpers").joinpath("data", name).read_text()
    return validate_records(json.loads(text))
