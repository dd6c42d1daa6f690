r"""The cost of attention, counted and measured (notebook 08).

- Counting: :func:`attention_costs` (FLOPs and bytes of each stage of textbook attention),
  :func:`score_matrix_bytes`, :func:`kv_cache_flops`, :func:`traffic_bytes`,
  :func:`tile_working_set_bytes`.
- The benchmark behind ``python -m attn_helpers bench attention``: :func:`bench_attention` returns
  JSON records ``{"method", "n", "median_ms", "peak_bytes", "gflops"}`` for the forward methods
  (:data:`ATTENTION_METHODS`) and for forward + backward (:data:`FWD_BWD_METHODS`), one
  ``{"method": "matmul_peak", "gflops"}`` and one ``{"method": "machine", "cache_bytes",
  "copy_gbps"}``. Every call runs 8 heads of 64 in float32; on CPU, times are medians of the
  process's CPU clock. :func:`load_benchmark` reads the committed CPU run.
- The roofline's timing helpers: :func:`naive_stage_times`, :func:`stage_points`.
- Figures: :func:`plot_scaling` (time and memory against ``n``), :func:`plot_roofline`.
- :func:`tile_stepper`: FlashAttention's tiled forward, one tile at a time, as arrays for the
  widget.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .._checks import require_bool, require_int_in, require_positive_int
from ..efficient import (
    linear_attention,
    local_attention,
    tiled_attention,
)
from ..entropy import attention_entropy
from ..measure import PowerLaw, fit_power_law, format_bytes, peak_bytes, time_call

__all__ = [
    "ATTENTION_FUNCTIONS", "ATTENTION_METHODS", "BENCHMARK_FILE", "FIT_N_MIN", "FWD_BWD_METHODS",
    "PowerLaw", "TileFrame", "attention_costs", "attention_flops", "attention_sizes",
    "bench_attention", "cache_sizes", "copy_bandwidth_gbps",
    "fit_methods", "fit_power_law", "format_bytes", "fwd_bwd_call",
    "kv_cache_flops", "last_level_cache", "load_benchmark", "machine",
    "matmul_gflops", "naive_attention", "naive_stage_times", "plot_roofline", "plot_scaling",
    "measure_roofline", "minor_page_faults", "roof_at", "stage_points",
    "saved_bytes", "score_matrix_bytes", "series", "tile_schedule", "tile_scores", "tile_stepper",
    "tile_working_set_bytes", "time_ms", "traffic_bytes", "validate_records",
]


# --- counting: FLOPs and bytes ---------------------------------------------------------------

#: per score: subtract the row maximum, exponentiate, add to the row sum, divide (plus the max).
SOFTMAX_FLOPS_PER_SCORE = 5


def attention_costs(n: int, d: int, *, heads: int = 1, batch: int = 1,
                    dtype: torch.dtype = torch.float32) -> dict[str, dict[str, int]]:
    r"""FLOPs and bytes moved by each stage of exact self-attention, as textbook code runs it.

    For ``n`` queries and keys of size ``d`` (per head, ``d_v = d``):

    * ``QK^T``: :math:`2n^2d + n^2` FLOPs; reads :math:`Q, K` (:math:`2nd` elements), writes
      :math:`QK^\top` (:math:`n^2`), then the separate ``/ sqrt(d)`` pass reads it and writes
      :math:`S` (:math:`2n^2`).
    * ``softmax``: about :math:`5n^2` FLOPs; reads :math:`S` and writes :math:`P` (:math:`2n^2`).
    * ``PV``: :math:`2n^2d` FLOPs; reads :math:`P` and :math:`V` (:math:`n^2 + nd`), writes
      :math:`O` (:math:`nd`).

    Everything is multiplied by ``batch * heads``, bytes by the element size of ``dtype``.
    Returns ``{stage: {"flops", "bytes"}}`` for ``"QK^T"``, ``"softmax"``, ``"PV"``, ``"total"``.
    """
    for name, value in (("n", n), ("d", d), ("heads", heads), ("batch", batch)):
        require_positive_int(name, value)
    size, copies = torch.empty((), dtype=dtype).element_size(), batch * heads
    stages = {
        "QK^T": (2 * n * n * d + n * n, 2 * n * d + 3 * n * n),
        "softmax": (SOFTMAX_FLOPS_PER_SCORE * n * n, 2 * n * n),
        "PV": (2 * n * n * d, n * n + 2 * n * d),
    }
    out = {name: {"flops": copies * f, "bytes": copies * e * size} for name, (f, e) in stages.items()}
    out["total"] = {key: sum(stage[key] for stage in out.values()) for key in ("flops", "bytes")}
    return out


def score_matrix_bytes(n: int, *, heads: int = 1, batch: int = 1,
                       dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one ``(batch, heads, n, n)`` score (or weight) matrix."""
    for name, value in (("n", n), ("heads", heads), ("batch", batch)):
        require_positive_int(name, value)
    return batch * heads * n * n * torch.empty((), dtype=dtype).element_size()


def kv_cache_flops(t: int, d_model: int) -> dict[str, int]:
    """Matrix-product FLOPs of one self-attention layer (one head of ``d_model``) to produce token
    ``t + 1`` after ``t``: ``{"without_cache": 6(t+1)d^2 + 4(t+1)^2 d`` (the whole prefix again),
    ``"with_cache": 6d^2 + 4(t+1)d}`` (the new token's projections, its one query)."""
    require_positive_int("t", t, allow_zero=True)
    require_positive_int("d_model", d_model)
    m = t + 1
    return {"without_cache": 6 * m * d_model**2 + 4 * m * m * d_model,
            "with_cache": 6 * d_model**2 + 4 * m * d_model}


# --- the benchmark and its records -------------------------------------------------------------

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
                        budget_s: float = 0.5, repeats: int = 1) -> float:
    """Main-memory bandwidth: a copy of ``n_bytes`` (far larger than any cache), counting one read
    and one write of every byte, in GB/s (1e9 bytes per second); the best of ``repeats`` medians
    (a bound: on a busy machine one median can fall short of it)."""
    require_positive_int("repeats", repeats)
    src = torch.ones(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    best_ms = min(time_ms(lambda: dst.copy_(src), budget_s=budget_s, device=device)
                  for _ in range(repeats))
    return 2 * n_bytes / (best_ms / 1000.0) / 1e9


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


def machine(records: list[dict]) -> dict | None:
    """The run's ``machine`` record (cache sizes, copy bandwidth), or ``None``."""
    return next((r for r in records if r["method"] == "machine"), None)


def load_benchmark(name: str = BENCHMARK_FILE) -> list[dict]:
    """The committed benchmark records shipped in ``attn_helpers/data/`` (validated)."""
    text = resources.files("attn_helpers").joinpath("data", name).read_text()
    return validate_records(json.loads(text))


# --- the notebook's live measurements ----------------------------------------------------------

H, D = ATTENTION_HEADS, ATTENTION_HEAD_DIM


def _qkv(n: int, seed: int, count: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, n, D, generator=g) for _ in range(count)]   # (1, h, n, d)


def tile_working_set_bytes(block_q: int, block_k: int, *, heads: int = H, d: int = D,
                           element_bytes: int = 4) -> int:
    """Bytes one step of the tiled forward touches, all ``heads`` at once: ``Q_i`` and the running
    ``acc`` (``B_q x d`` each), ``K_j`` and ``V_j`` (``B_k x d``), the score tile and its
    exponentials (``2 B_q B_k``)."""
    return heads * element_bytes * (2 * block_q * d + 2 * block_k * d + 2 * block_q * block_k)


def traffic_bytes(method: str, n: int, *, heads: int = H, d: int = D, block_q: int = 256,
                  element_bytes: int = 4) -> int:
    r"""Main-memory traffic of one forward call when nothing of size :math:`n^2` fits in cache.

    * ``naive``: :math:`Q, K` read, :math:`QK^\top` written, read and written again as :math:`S`
      by the separate ``/ sqrt(d)`` pass, :math:`S` read and :math:`P` written, :math:`P` and
      :math:`V` read, :math:`O` written: :math:`6n^2 + 4nd` elements per head.
    * ``tiled``: :math:`Q` read and :math:`O` written once, :math:`K, V` read once per block of
      ``block_q`` queries, :math:`2nd + 2nd\,\lceil n / B_q\rceil`, if a tile's working set
      stays in cache (:func:`tile_working_set_bytes`).
    * ``sdpa``: the least any exact method moves, its inputs and output once: :math:`4nd`.
    """
    elements = {"naive": 6 * n * n + 4 * n * d, "sdpa": 4 * n * d,
                "tiled": 2 * n * d + 2 * n * d * math.ceil(n / block_q)}
    if method not in elements:
        raise ValueError(f"method must be 'naive', 'tiled' or 'sdpa', got {method!r}")
    return heads * element_bytes * elements[method]


def naive_stage_times(n: int, *, budget_s: float = 0.2, seed: int = 0, extras: bool = True
                      ) -> dict[str, float]:
    """Median milliseconds of each stage of naive attention on its own at length ``n``:
    ``"QK^T"`` (``S = QK^T / sqrt(d)``, two passes), ``"softmax"``, ``"PV"``; with ``extras``
    also ``"total"`` and, for the softmax's matrix ``S``, ``"copy S"`` (one read and one write of
    it, the least a softmax can move) and ``"exp S"`` (one exponential per score)."""
    q, k, v = _qkv(n, seed)
    scale = 1 / math.sqrt(D)
    s = q @ k.mT * scale                                               # (1, h, n, n)
    p, out = torch.softmax(s, dim=-1), torch.empty_like(s)
    calls = {"QK^T": lambda: q @ k.mT * scale, "softmax": lambda: torch.softmax(s, dim=-1),
             "PV": lambda: p @ v}
    if extras:
        calls |= {"total": lambda: naive_attention(q, k, v), "copy S": lambda: out.copy_(s),
                  "exp S": lambda: torch.exp(s, out=out)}
    return {name: time_ms(call, budget_s=budget_s) for name, call in calls.items()}


def stage_points(n: int, *, budget_s: float = 0.05, seed: int = 0, heads: int = H, d: int = D
                 ) -> dict[str, dict[str, float]]:
    r"""Each stage of naive attention at length ``n``, timed alone: ``{stage: {"flops", "bytes",
    "ms"}}`` for ``"QK^T"`` (the product alone: :math:`2n^2d` FLOPs, reads :math:`Q, K`, writes
    :math:`n^2`), ``"/sqrt(d)"`` (the separate scale pass: :math:`n^2` FLOPs, reads and writes
    :math:`n^2`), ``"softmax"`` and ``"PV"`` (as in :func:`attention_costs`). Per ``heads``,
    float32."""
    require_positive_int("n", n)
    q, k, _ = _qkv(n, seed)
    raw = q @ k.mT                                                     # (1, h, n, n)
    costs = attention_costs(n, d, heads=heads)
    out = {"QK^T": {"flops": heads * 2 * n * n * d, "bytes": heads * 4 * (2 * n * d + n * n),
                    "ms": time_ms(lambda: q @ k.mT, budget_s=budget_s)},
           "/sqrt(d)": {"flops": heads * n * n, "bytes": heads * 4 * 2 * n * n,
                        "ms": time_ms(lambda: raw / math.sqrt(d), budget_s=budget_s)}}
    stages = naive_stage_times(n, budget_s=budget_s, seed=seed, extras=False)
    for name in ("softmax", "PV"):
        out[name] = dict(costs[name], ms=stages[name])
    return out


def measure_roofline(*, n_large: int = 2048, n_small: int = 256, tile: int = 256,
                     budget_s: float = 0.05) -> dict:
    r"""Everything notebook 08's roofline plots, measured on this CPU with one call.

    :math:`\pi` is the best GFLOP/s of three square products (:func:`matmul_gflops`, sizes 256 to
    1024, twice) and of ``sdpa`` at ``n_large``; :math:`\beta` is the best of three timings of a 256 MiB
    copy (``"dram_gbps"``) and of a 1 MiB copy (``"cache_gbps"``): a roof is a bound, and on a
    busy machine a single measurement can fall short of it. ``"points"`` holds
    naive attention's stages at ``n_small`` (under the cache's roof) and ``n_large`` (main memory),
    and ``naive``, ``sdpa`` and ``tiled`` at ``n_large``, each ``{"roof", "intensity",
    "gflops"}``. 8 heads of 64, float32."""
    for name, value in (("n_large", n_large), ("n_small", n_small), ("tile", tile)):
        require_positive_int(name, value)
    caches = cache_sizes()                                             # this CPU's caches (sysfs)
    roof = {"cache_bytes": caches,
            "peak_gflops": max(matmul_gflops(sizes=(256, 512, 1024)) for _ in range(2)),
            "dram_gbps": copy_bandwidth_gbps(budget_s=budget_s, repeats=3),
            "cache_gbps": copy_bandwidth_gbps(n_bytes=2**20, budget_s=budget_s, repeats=3),
            "n_large": n_large, "tile": tile, "tile_bytes": tile_working_set_bytes(tile, tile),
            "points": {}}
    roof["tile_fits"] = bool(caches) and roof["tile_bytes"] <= max(caches.values())
    for n, memory in ((n_small, "cache"), (n_large, "dram")):        # S and P: 2 MiB each at 256
        for stage, c in stage_points(n, budget_s=budget_s).items():  # each stage timed alone
            roof["points"][f"{stage} n={n}"] = {"roof": memory, "intensity": c["flops"] / c["bytes"],
                                                "gflops": c["flops"] / c["ms"] / 1e6}
    flops = 4.0 * H * n_large**2 * D                                   # QK^T and PV
    q, k, v = _qkv(n_large, 0)
    calls = {"naive": lambda: naive_attention(q, k, v),
             "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
             "tiled": lambda: tiled_attention(q, k, v, block_size=tile)}
    with torch.no_grad():
        for method, call in calls.items():
            ms = time_ms(call, budget_s=budget_s)                      # median, CPU clock
            roof["points"][f"{method} n={n_large}"] = {               # sdpa: an upper bound
                "roof": "dram", "gflops": flops / ms / 1e6,
                "intensity": flops / traffic_bytes(method, n_large, block_q=tile)}
    roof["peak_gflops"] = max(roof["peak_gflops"], roof["points"][f"sdpa n={n_large}"]["gflops"])
    roof["ridge"] = roof["peak_gflops"] / roof["dram_gbps"]            # FLOP per byte
    return roof


def minor_page_faults() -> int:
    """This process's minor page faults so far (``getrusage``): each is a fresh page the system
    mapped, and zeroed, on first touch. 0 where the ``resource`` module does not exist (Windows)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def roof_at(roof: dict, point: dict) -> float:
    """The roof over one of :func:`measure_roofline`'s points: ``min(pi, intensity x the
    bandwidth of its memory)``, in GFLOP/s."""
    bandwidth = roof["cache_gbps"] if point["roof"] == "cache" else roof["dram_gbps"]
    return min(roof["peak_gflops"], point["intensity"] * bandwidth)


def plot_scaling(records: list[dict], colors: dict[str, str]):
    """Two log-log panels from :func:`bench_attention` records: each method's median time (its
    slope fitted on ``n >= 256``: rough on few sizes) and peak extra memory, against ``n``; ``linear``
    and ``local`` dashed (causal), causal ``sdpa`` as white diamonds. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for m in ("naive", "sdpa", "tiled", "linear", "local"):
        ns, ms = series(records, m, "median_ms")
        _, peak = series(records, m, "peak_bytes")
        slope = fit_power_law(*series(records, m, "median_ms", n_min=256)).slope
        style = "o--" if m in ("linear", "local") else "o-"
        ax_t.loglog(ns, ms, style, color=colors[m], label=f"{m} (rough fit: slope {slope:.1f})")
        ax_m.loglog(ns, [b / 2**20 for b in peak], style, color=colors[m], label=m)
    ax_t.loglog(*series(records, "sdpa_causal", "median_ms"), "D--", color=colors["sdpa"],
                markerfacecolor="white", label="sdpa, causal")
    for ax, what in ((ax_t, "median time (ms)"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="sequence length n", ylabel=what)
        ax.legend(fontsize=8)
    ax_t.set_title("time of one call (dashed: causal; few sizes, so the fits are noisy)")
    ax_m.set_title("memory allocated during one call (inputs excluded)")
    return fig


#: roofline markers: a shape and an Okabe-Ito colour per stage or method
ROOF_STYLES = {"QK^T": ("s", "#56B4E9"), "/sqrt(d)": ("<", "#000000"), "softmax": ("v", "#D55E00"),
               "PV": ("^", "#009E73"), "naive": ("o", "#E69F00"), "sdpa": ("D", "#0072B2"),
               "tiled": ("P", "#CC79A7")}


def plot_roofline(roof: dict):
    """The roofline of ``roof`` (``peak_gflops``, ``dram_gbps``, ``cache_gbps``, ``ridge`` and
    ``points``: ``{label: {"roof": "cache" | "dram", "intensity", "gflops"}}``): both roofs, the
    ridge, every point. White fill: a point in cache; a large ring: naive attention's whole call.
    Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    intensity = torch.logspace(-1.5, 3.5, 200)
    for bw, style, name in ((roof["dram_gbps"], "-", "main memory"), (roof["cache_gbps"], ":", "cache")):
        ax.loglog(intensity, torch.clamp(intensity * bw, max=roof["peak_gflops"]), style,
                  color="black", label=f"roof, {name}")
    for label, p in roof["points"].items():
        marker, color = ROOF_STYLES[label.split()[0]]
        in_cache, whole = p["roof"] == "cache", label.startswith("naive")
        note = " (whole call)" if whole else " (intensity: upper bound)" if label.startswith(
            "sdpa") or (label.startswith("tiled") and not roof.get("tile_fits", True)) else ""
        ax.plot(p["intensity"], p["gflops"], marker, color=color, markersize=15 if whole else 9,
                markerfacecolor="none" if whole else "white" if in_cache else color,
                markeredgewidth=2 if whole else 1, label=label + note)
    ax.axvline(roof["ridge"], color="grey", linestyle="--", linewidth=0.8, label="ridge, main memory")
    low = min(p["gflops"] for p in roof["points"].values()) / 2        # every point in view
    ax.set(xlabel="arithmetic intensity (FLOP per byte moved)", ylabel="GFLOP/s", ylim=(low, None),
           title="Roofline of this machine (white fill: n = 256, in cache)")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    return fig


# --- FlashAttention's forward, one tile at a time (the widget's arrays) --------------------------

@dataclass(frozen=True)
class TileFrame:
    """The tiled forward after ``step`` of ``n_steps`` tiles. ``scores``, ``weights`` ``(n, n)``:
    ``exp(s - m) / l`` on the keys a row has seen (the softmax once the row is finished), NaN on
    the others; ``m``, ``l`` ``(n,)``: running max (``-inf`` before any tile) and sum; ``rescale``
    ``(n,)``: ``exp(m_before - m_after)``, applied by the last tile to ``l`` and ``acc`` (1: row
    not touched, 0: its first tile); ``tile``: ``(row_start, row_stop, col_start, col_stop)``,
    ``None`` at step 0; ``finished``, ``entropy`` (nats, NaN until finished) and ``ceiling``
    (``ln`` of the keys a row may see) ``(n,)``."""

    step: int
    n_steps: int
    scores: np.ndarray
    weights: np.ndarray
    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the paper's name
    rescale: np.ndarray
    tile: tuple[int, int, int, int] | None
    finished: np.ndarray
    entropy: np.ndarray
    ceiling: np.ndarray


def tile_schedule(n: int, block_size: int, *, causal: bool = False
                  ) -> list[tuple[int, int, int, int]]:
    """The tiles in FlashAttention-2's forward order: for each block of queries (outer loop), each
    block of keys (inner loop); with ``causal``, tiles wholly above the diagonal are skipped."""
    starts = range(0, n, block_size)
    return [(i, min(i + block_size, n), j, min(j + block_size, n))
            for i in starts for j in starts if not (causal and j >= i + block_size)]


def tile_scores(n: int, *, causal: bool = False, seed: int = 0, d: int = 16) -> torch.Tensor:
    """Seeded scaled scores ``(n, n)`` (float64) for the stepper: ``q k^T / sqrt(d)`` plus a ramp
    along the keys (later keys score higher, so the running max moves and rescaling shows);
    ``-inf`` above the diagonal with ``causal``."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2))
    s = q @ k.T / math.sqrt(d) + torch.linspace(0.0, 3.0, n, dtype=torch.float64)
    return s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf) if causal else s


def _running(s: torch.Tensor, seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Over the ``seen`` entries of each row: the running max ``m``, ``p = exp(s - m)`` (0 where
    not seen) and the running sum ``l`` of ``p``."""
    m = s.masked_fill(~seen, -math.inf).amax(dim=-1)                   # (n,)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.where(seen, torch.exp(s - safe[:, None]), 0.0)          # (n, n)
    return m, p, p.sum(dim=-1)


def tile_stepper(n: int, block_size: int, step: int, *, causal: bool = False,
                 seed: int = 0) -> TileFrame:
    """The controls (``n`` in 2..64 tokens, ``block_size`` in 1..n, ``step`` in 0..number of
    tiles) in, the arrays of :class:`TileFrame` out, for :func:`tile_scores` ``(n, seed)``."""
    n, causal = require_int_in("n", n, 2, 64), require_bool("causal", causal)
    block_size = require_int_in("block_size", block_size, 1, n)
    tiles = tile_schedule(n, block_size, causal=causal)
    step = require_int_in("step", step, 0, len(tiles))
    s, block = tile_scores(n, causal=causal, seed=seed), torch.arange(n) // block_size
    bi, bj = block[:, None], block[None, :]                           # tile row and column
    order = bi * (bi + 1) // 2 + bj if causal else bi * math.ceil(n / block_size) + bj
    order = order.masked_fill(causal & (bj > bi), len(tiles))         # position in tile_schedule
    seen, before = order < step, order < step - 1
    (m_before, _, _), (m, p, l) = _running(s, before), _running(s, seen)   # noqa: E741
    touched = (seen != before).any(dim=-1)                            # the rows of the last tile
    rescale = torch.where(touched, torch.exp(m_before - m).nan_to_num(0.0), 1.0)   # e^{m - m'}
    weights = (p / l.clamp_min(1e-300)[:, None]).masked_fill(~seen, math.nan)   # p / l, seen keys
    finished = (seen | torch.isinf(s)).all(dim=-1)
    entropy = attention_entropy(torch.softmax(s, dim=-1)).masked_fill(~finished, math.nan)
    tile = tiles[step - 1] if step else None
    return TileFrame(step, len(tiles), s.numpy(), weights.numpy(), m.numpy(), l.numpy(),
                     rescale.numpy(), tile, finished.numpy(), entropy.numpy(),
                     np.log(torch.isfinite(s).sum(dim=-1).numpy().astype(float)))
