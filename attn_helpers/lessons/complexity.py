r"""The cost of attention, counted and measured (notebook 08).

* Counting: floating-point operations and bytes of the three stages of exact attention
  (:math:`QK^\top`, softmax, product with :math:`V`), the memory of the score matrix, and the cost
  of generating one token with and without a KV cache.
* Measuring: :func:`bench_attention` (behind ``python -m attn_helpers.bench attention``) times
  one call of each method and records its peak memory; its records (a JSON list of
  ``{"method", "n", "median_ms", "peak_bytes", "gflops"}`` plus one ``{"method": "matmul_peak",
  "gflops"}``), the committed full CPU run (:func:`load_benchmark`), power laws
  :math:`y = c\,n^{p}` fitted on log-log axes (:func:`fit_power_law`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import resources

import torch

from .._checks import require_positive_int
from ..efficient import linear_attention, local_attention, tiled_attention
from ..measure import PowerLaw, fit_power_law, format_bytes, matmul_peak_gflops, peak_bytes, time_call

__all__ = [
    "BENCHMARK_FILE",
    "SOFTMAX_FLOPS_PER_SCORE",
    "element_size",
    "attention_costs",
    "score_matrix_bytes",
    "kv_cache_flops",
    "PowerLaw",
    "fit_power_law",
    "series",
    "fit_methods",
    "matmul_peak",
    "load_benchmark",
    "validate_records",
    "format_bytes",
    "ATTENTION_METHODS",
    "ATTENTION_FUNCTIONS",
    "naive_attention",
    "attention_flops",
    "attention_sizes",
    "bench_attention",
]

BENCHMARK_FILE = "bench_attention_cpu.json"
#: per score: subtract the row maximum, exponentiate, add to the row sum, divide (plus the max).
SOFTMAX_FLOPS_PER_SCORE = 5


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (4 for float32, 2 for float16 and bfloat16, 8 for float64)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()


def attention_costs(n: int, d: int, *, heads: int = 1, batch: int = 1,
                    dtype: torch.dtype = torch.float32) -> dict[str, dict[str, int]]:
    r"""FLOPs and bytes moved by each stage of exact self-attention, as textbook code runs it.

    For ``n`` queries and keys of size ``d`` (per head, ``d_v = d``):

    * ``QK^T``: :math:`2n^2d` FLOPs; reads :math:`Q, K` (:math:`2nd` elements), writes
      :math:`S` (:math:`n^2`).
    * ``softmax``: about :math:`5n^2` FLOPs; reads :math:`S` and writes :math:`P` (:math:`2n^2`).
    * ``PV``: :math:`2n^2d` FLOPs; reads :math:`P` and :math:`V` (:math:`n^2 + nd`), writes
      :math:`O` (:math:`nd`).

    Everything is multiplied by ``batch * heads``; bytes by the element size of ``dtype``.

    Returns:
        ``{stage: {"flops": int, "bytes": int}}`` for ``"QK^T"``, ``"softmax"``, ``"PV"`` and
        ``"total"``.
    """
    for name, value in (("n", n), ("d", d), ("heads", heads), ("batch", batch)):
        require_positive_int(name, value)
    size, copies = element_size(dtype), batch * heads
    stages = {
        "QK^T": (2 * n * n * d, 2 * n * d + n * n),
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
    return batch * heads * n * n * element_size(dtype)


def kv_cache_flops(t: int, d_model: int) -> dict[str, int]:
    r"""FLOPs of one self-attention layer (one head of size ``d_model``) to produce token ``t + 1``
    when ``t`` tokens came before.

    * Without a cache the layer runs again on all ``t + 1`` tokens: projections
      :math:`3 \cdot 2(t+1)d^2` and the full attention :math:`4(t+1)^2 d`, though only the
      last row is new.
    * With a cache of the earlier keys and values, only the new token is projected
      (:math:`3\cdot 2d^2`) and its one query attends to the :math:`t+1` keys
      (:math:`4(t+1)d`).

    Returns:
        ``{"without_cache": int, "with_cache": int}``.
    """
    require_positive_int("t", t, allow_zero=True)
    require_positive_int("d_model", d_model)
    m = t + 1
    return {"without_cache": 6 * m * d_model**2 + 4 * m * m * d_model,
            "with_cache": 6 * d_model**2 + 4 * m * d_model}


def validate_records(records) -> list[dict]:
    """Check the benchmark's JSON schema; return the records. Raises ``ValueError`` naming the
    first bad record."""
    if not isinstance(records, list) or not records:
        raise ValueError(f"records must be a non-empty list, got {type(records).__name__}")
    peaks = 0
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "method" not in r:
            raise ValueError(f"record {i} must be a dict with a 'method', got {r!r}")
        if r["method"] == "matmul_peak":
            peaks += 1
            keys = {"method", "gflops"}
        else:
            keys = {"method", "n", "median_ms", "peak_bytes", "gflops"}
        if set(r) != keys:
            raise ValueError(f"record {i} must have exactly the keys {sorted(keys)}, got {sorted(r)}")
        if r["method"] != "matmul_peak":
            if not isinstance(r["n"], int) or not isinstance(r["peak_bytes"], int):
                raise ValueError(f"record {i}: n and peak_bytes must be ints, got {r!r}")
            if r["median_ms"] <= 0 or r["peak_bytes"] < 0:
                raise ValueError(f"record {i}: median_ms must be > 0 and peak_bytes >= 0, got {r!r}")
        if not r["gflops"] > 0:
            raise ValueError(f"record {i}: gflops must be > 0, got {r!r}")
    if peaks != 1:
        raise ValueError(f"records must hold exactly one 'matmul_peak' record, got {peaks}")
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
    """A :class:`PowerLaw` of ``key`` against ``n`` for each method (``n >= n_min``)."""
    if methods is None:
        methods = sorted({r["method"] for r in records if r["method"] != "matmul_peak"})
    return {m: fit_power_law(*series(records, m, key, n_min=n_min)) for m in methods}


def matmul_peak(records: list[dict]) -> float:
    """The GFLOP/s of the run's ``matmul_peak`` record."""
    return next(r["gflops"] for r in records if r["method"] == "matmul_peak")


def load_benchmark(name: str = BENCHMARK_FILE) -> list[dict]:
    """The committed benchmark records shipped in ``attn_helpers/data/`` (validated)."""
    text = resources.files("attn_helpers").joinpath("data", name).read_text()
    return validate_records(json.loads(text))


# The attention benchmark (its command line is ``python -m attn_helpers.bench attention``).

ATTENTION_HEADS = 8
ATTENTION_HEAD_DIM = 64
ATTENTION_METHODS = ("naive", "sdpa", "tiled", "linear", "local")
TILED_QUERY_BLOCK = 1024
TILED_KEY_BLOCK = 512
LOCAL_WINDOW = 256


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Textbook attention that materialises the ``(..., n, n)`` score and weight matrices."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


ATTENTION_FUNCTIONS: dict[str, Callable] = {
    "naive": naive_attention,
    "sdpa": torch.nn.functional.scaled_dot_product_attention,
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=TILED_KEY_BLOCK,
                                             query_block_size=TILED_QUERY_BLOCK),
    "linear": linear_attention,
    "local": lambda q, k, v: local_attention(q, k, v, LOCAL_WINDOW, causal=True),
}


def attention_flops(method: str, n: int, heads: int = ATTENTION_HEADS,
                    d: int = ATTENTION_HEAD_DIM) -> float:
    """Useful floating-point operations of one call: the two matrix products of exact attention
    ``4 n^2 d`` per head; ``4 n d^2`` for linear attention; ``4 n w d`` for a window ``w``."""
    if method in ("naive", "sdpa", "tiled"):
        return 4.0 * heads * n * n * d
    if method == "linear":
        return 4.0 * heads * n * d * d
    if method == "local":
        return 4.0 * heads * n * min(n, LOCAL_WINDOW) * d
    raise ValueError(f"method must be one of {ATTENTION_METHODS}, got {method!r}")


def attention_sizes(max_n: int, min_n: int = 128) -> list[int]:
    """``min_n, 2 min_n, ...`` up to ``max_n``."""
    sizes, n = [], min_n
    while n <= max_n:
        sizes.append(n)
        n *= 2
    return sizes


def bench_attention(max_n: int = 8192, device: str = "cpu", methods=ATTENTION_METHODS, *,
                    min_n: int = 128, budget_s: float = 1.0, seed: int = 0) -> list[dict]:
    """Measure every method at every ``n``; return the JSON records (see the module docstring)."""
    unknown = set(methods) - set(ATTENTION_METHODS)
    if unknown:
        raise ValueError(f"methods must be among {ATTENTION_METHODS}, got {sorted(unknown)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch.cuda.is_available() is False")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    records = []
    g = torch.Generator().manual_seed(seed)
    for n in attention_sizes(max_n, min_n):
        shape = (1, ATTENTION_HEADS, n, ATTENTION_HEAD_DIM)
        q, k, v = (torch.randn(shape, generator=g).to(device) for _ in range(3))
        for method in methods:
            fn = ATTENTION_FUNCTIONS[method]

            def call(fn=fn, q=q, k=k, v=v):
                with torch.no_grad():
                    return fn(q, k, v)

            median_ms = time_call(call, budget_s=budget_s)
            records.append({
                "method": method, "n": n, "median_ms": round(median_ms, 3),
                "peak_bytes": peak_bytes(call, device),
                "gflops": round(attention_flops(method, n) / (median_ms / 1000.0) / 1e9, 3),
            })
    records.append({"method": "matmul_peak", "gflops": round(matmul_peak_gflops(device), 3)})
    return records
