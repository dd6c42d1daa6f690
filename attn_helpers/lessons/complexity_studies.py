r"""The live studies of notebook 08, small enough for a notebook cell: where attention's time goes
(the roofline, the tile size, the backward pass) and what decoding and ring attention hold.

Each returns plain numbers that :func:`attn_helpers.lessons.complexity.claims` reads. Timings
are medians of the process's CPU clock (:func:`.complexity_bench.time_ms`) with torch's current
thread count; the conclusions drawn from them compare numbers measured in the same call.
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from .._checks import require_positive_int
from ..efficient import (
    LinearAttentionState,
    decoding_memory,
    linear_attention,
    linear_attention_step,
    tiled_attention,
)
from ..kv_cache import KVCache, generate_with_cache, generate_without_cache
from ..measure import peak_bytes
from .complexity import attention_costs, score_matrix_bytes
from .complexity_bench import (
    ATTENTION_FUNCTIONS,
    ATTENTION_HEAD_DIM,
    ATTENTION_HEADS,
    cache_sizes,
    copy_bandwidth_gbps,
    fwd_bwd_call,
    last_level_cache,
    matmul_gflops,
    naive_attention,
    saved_bytes,
    time_ms,
)

__all__ = ["tile_working_set_bytes", "block_sweep", "traffic_bytes", "naive_stage_times",
           "causal_reference", "ROOFLINE_N", "ROOFLINE_TILE", "roofline_study", "fwd_bwd_study",
           "decoding_study", "ring_overlap", "generation_flops"]

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


def block_sweep(n: int, blocks, *, budget_s: float = 0.2, seed: int = 0,
                rounds: int = 3) -> list[dict]:
    """Forward time of ``tiled_attention`` with square ``b x b`` tiles for each ``b`` in ``blocks``
    (8 heads of 64, float32): ``[{"block", "median_ms", "working_set_bytes"}]``. Every size is
    timed once per round, the rounds interleaved, and keeps its fastest round: a burst of other
    work on a shared machine (CI, 2026-11-26: the next size's one sample, beside another job)
    slows one round of one size, not all of them."""
    q, k, v = _qkv(require_positive_int("n", n), seed)
    sizes = [require_positive_int("block", b) for b in blocks]
    best = dict.fromkeys(sizes, math.inf)
    for _ in range(require_positive_int("rounds", rounds)):
        for b in sizes:
            with torch.no_grad():
                ms = time_ms(lambda b=b: tiled_attention(q, k, v, block_size=b), budget_s=budget_s)
            best[b] = min(best[b], ms)
    return [{"block": b, "median_ms": best[b], "working_set_bytes": tile_working_set_bytes(b, b)}
            for b in sizes]


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


def causal_reference(n: int = 4096, *, budget_s: float = 0.01, seed: int = 0) -> dict:
    """A ``bench_attention``-style record of exact causal attention
    (``F.scaled_dot_product_attention(..., is_causal=True)``) at ``n``, time only (``median_ms``):
    the like-for-like reference for the causal ``linear`` and ``local`` methods."""
    q, k, v = _qkv(require_positive_int("n", n), seed)
    with torch.no_grad():
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                     budget_s=budget_s)
    return {"method": "sdpa_causal", "n": n, "median_ms": ms}


#: the roofline's sizes: 8 heads of (256, 256) float32 scores take 2 MiB (in the L2 or L3 of any
#: recent CPU), of (2048, 2048) 128 MiB (more than the L3 of most); the tiled method's tiles
ROOFLINE_N = (256, 2048)
ROOFLINE_TILE = 256


def roofline_study(*, budget_s: float = 0.2, seed: int = 0, tile: int = ROOFLINE_TILE) -> dict:
    """The roofline of this machine, measured: the matmul peak (GFLOP/s), the copy bandwidth of
    a 256 MiB buffer (``"dram_gbps"``) and of a 1 MiB one that stays in cache (``"cache_gbps"``),
    the cache sizes; then points ``{label: {"n", "intensity", "gflops", "roof"}}``: naive's three
    stages at both sizes of :data:`ROOFLINE_N` (``"roof"``: ``"cache"`` at the small one,
    ``"dram"`` at the large one), naive as a whole, ``sdpa`` and ``tiled`` (``tile x tile``
    tiles; ``"tile_fits"``: its working set fits in the last-level cache) at the large one.
    Intensities: :func:`attention_costs` and :func:`traffic_bytes`; method FLOPs ``4 n^2 d`` per
    head. ``"stage_ms"``: :func:`naive_stage_times` at the large size."""
    caches = cache_sizes()
    peak, dram = matmul_gflops(), copy_bandwidth_gbps(budget_s=budget_s)
    cache_bw = copy_bandwidth_gbps(n_bytes=2**20, budget_s=budget_s)
    points, (small, large) = {}, ROOFLINE_N
    for n, roof in ((small, "cache"), (large, "dram")):
        times = naive_stage_times(n, budget_s=budget_s, seed=seed, extras=n == large)
        costs = attention_costs(n, D, heads=H)
        for stage in ("QK^T", "softmax", "PV"):
            c = costs[stage]
            points[f"{stage} n={n}"] = {"n": n, "roof": roof, "intensity": c["flops"] / c["bytes"],
                                        "gflops": c["flops"] / times[stage] / 1e6}
    flops = 4.0 * H * large * large * D
    points[f"naive n={large}"] = {"n": large, "roof": "dram", "gflops": flops / times["total"] / 1e6,
                                  "intensity": flops / traffic_bytes("naive", large)}
    q, k, v = _qkv(large, seed)
    fns = {"sdpa": ATTENTION_FUNCTIONS["sdpa"],
           "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=tile)}
    for method, fn in fns.items():
        with torch.no_grad():
            ms = time_ms(lambda fn=fn: fn(q, k, v), budget_s=budget_s)
        points[f"{method} n={large}"] = {"n": large, "roof": "dram", "gflops": flops / ms / 1e6,
                                         "intensity": flops / traffic_bytes(method, large, block_q=tile)}
    llc = last_level_cache(caches)
    return {"cache_bytes": caches, "peak_gflops": peak, "dram_gbps": dram, "cache_gbps": cache_bw,
            "ridge": peak / dram, "n_small": small, "n_large": large, "points": points,
            "tile": tile, "tile_bytes": tile_working_set_bytes(tile, tile),
            "tile_fits": bool(llc) and tile_working_set_bytes(tile, tile) <= llc,
            "stage_ms": times}


def fwd_bwd_study(n: int = 1024, *, block_size: int = 128, budget_s: float | None = 0.3,
                  seed: int = 0) -> dict:
    """Forward + backward of naive attention (autograd), ``F.scaled_dot_product_attention`` and
    ``tiled_attention`` (``block_size`` tiles) on the same ``q, k, v, dO`` (8 heads of 64):
    ``{"n", "score_bytes", "peak_bytes", "saved_bytes", "median_ms", "grad_error"}``, the last
    four keyed by method; ``grad_error`` the largest gap of ``dq, dk, dv`` to SDPA's;
    ``median_ms`` is empty when ``budget_s`` is ``None`` (no timing)."""
    q, k, v, d_out = _qkv(require_positive_int("n", n), seed, 4)
    fns = {"naive": naive_attention, "sdpa": F.scaled_dot_product_attention,
           "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=block_size)}
    calls = {m: fwd_bwd_call(fn, q, k, v, d_out) for m, fn in fns.items()}
    grads = {m: call() for m, call in calls.items()}
    return {"n": n, "score_bytes": score_matrix_bytes(n, heads=H),
            "peak_bytes": {m: peak_bytes(call) for m, call in calls.items()},
            "saved_bytes": {m: saved_bytes(fn, q, k, v) for m, fn in fns.items()},
            "median_ms": {m: time_ms(call, budget_s=budget_s) for m, call in calls.items()
                          if budget_s is not None},
            "grad_error": {m: max(float((a - b).abs().max()) for a, b in zip(g, grads["sdpa"],
                                                                              strict=True))
                           for m, g in grads.items()}}


def decoding_study(n_tokens: int = 1024, *, d: int = 64, heads: int = 8,
                   every: int = 256, seed: int = 0) -> dict:
    """Decode ``n_tokens`` with causal linear attention's RNN step and with a KV cache side by
    side (``heads`` heads of size ``d``, float32). Returns the bytes each holds after token 1 and
    every ``every`` tokens, ``{"t", "state_bytes", "cache_bytes", "formula"}`` (lists;
    ``formula``: :func:`decoding_memory` at ``t``), and ``"max_error"``, the largest gap between
    the RNN's outputs and ``linear_attention(..., causal=True)``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(heads, require_positive_int("n_tokens", n_tokens), d, generator=g)
               for _ in range(3))
    state: LinearAttentionState | None = None
    cache, outputs = KVCache(n_tokens), []
    rows = {"t": [], "state_bytes": [], "cache_bytes": [], "formula": []}
    for t in range(n_tokens):
        o_t, state = linear_attention_step(state, q[:, t], k[:, t], v[:, t])   # (h, d)
        cache.append(k[:, t:t + 1], v[:, t:t + 1])                             # (h, 1, d)
        outputs.append(o_t)
        if (t + 1) % every == 0 or t == 0:
            rows["t"].append(t + 1)
            rows["state_bytes"].append(sum(x.numel() * x.element_size() for x in state))
            rows["cache_bytes"].append(sum(x.numel() * x.element_size()
                                           for x in (cache.keys, cache.values)))
            rows["formula"].append(decoding_memory(t + 1, d_k=d, d_v=d, num_heads=heads,
                                                   bytes_per_value=4))
    gap = torch.stack(outputs, dim=1) - linear_attention(q, k, v, causal=True)
    return {**rows, "max_error": float(gap.abs().max())}


def ring_overlap(stats: dict) -> dict[str, float]:
    """Medians over ranks and steps of ``ring_attention(..., return_stats=True)``'s ``compute_s``
    and ``wait_s``, the median lone ``transfer_s`` and the largest ``block_bytes``."""
    compute = [c for s in stats.values() for c in s["compute_s"]]
    wait = [w for s in stats.values() for w in s["wait_s"]]
    return {"compute_s": statistics.median(compute), "wait_s": statistics.median(wait),
            "transfer_s": statistics.median(s["transfer_s"] for s in stats.values()),
            "block_bytes": max(s["block_bytes"] for s in stats.values())}


def generation_flops(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                     w_v: torch.Tensor) -> dict[str, int]:
    """Matrix-product FLOPs that ``generate_with_cache`` and ``generate_without_cache`` really
    perform on ``x`` ``(n, d_model)``, counted by ``torch.utils.flop_counter.FlopCounterMode``:
    ``{"with_cache": int, "without_cache": int}``."""
    counts = {}
    for name, generate in (("with_cache", generate_with_cache),
                           ("without_cache", generate_without_cache)):
        with FlopCounterMode(display=False) as counter:
            generate(x, w_q, w_k, w_v)
        counts[name] = int(counter.get_total_flops())
    return counts
