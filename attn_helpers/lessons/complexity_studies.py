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
    TILED_QUERY_BLOCK,
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
           "roofline_sizes", "roofline_study", "fwd_bwd_study", "decoding_study", "ring_overlap",
           "generation_flops"]

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


def block_sweep(n: int, blocks, *, budget_s: float = 0.2, seed: int = 0) -> list[dict]:
    """Forward time of ``tiled_attention`` with square ``b x b`` tiles for each ``b`` in ``blocks``
    (8 heads of 64, float32): ``[{"block", "median_ms", "working_set_bytes"}]``."""
    q, k, v = _qkv(require_positive_int("n", n), seed)
    rows = []
    for b in blocks:
        b = require_positive_int("block", b)
        with torch.no_grad():
            ms = time_ms(lambda b=b: tiled_attention(q, k, v, block_size=b), budget_s=budget_s)
        rows.append({"block": b, "median_ms": ms, "working_set_bytes": tile_working_set_bytes(b, b)})
    return rows


def traffic_bytes(method: str, n: int, *, heads: int = H, d: int = D,
                  block_q: int = TILED_QUERY_BLOCK, element_bytes: int = 4) -> int:
    r"""Main-memory traffic of one forward call when nothing of size :math:`n^2` fits in cache.

    * ``naive``: :math:`Q, K` read, :math:`S` written and read, :math:`P` written and read,
      :math:`V` read, :math:`O` written: :math:`4n^2 + 4nd` elements per head.
    * ``tiled``: :math:`Q` read and :math:`O` written once, :math:`K, V` read once per block of
      ``block_q`` queries: :math:`2nd + 2nd\,\lceil n / B_q\rceil`.
    * ``sdpa``: the least any exact method moves, its inputs and output once: :math:`4nd`.
    """
    elements = {"naive": 4 * n * n + 4 * n * d, "sdpa": 4 * n * d,
                "tiled": 2 * n * d + 2 * n * d * math.ceil(n / block_q)}
    if method not in elements:
        raise ValueError(f"method must be 'naive', 'tiled' or 'sdpa', got {method!r}")
    return heads * element_bytes * elements[method]


def naive_stage_times(n: int, *, budget_s: float = 0.2, seed: int = 0) -> dict[str, float]:
    """Median milliseconds of each stage of naive attention on its own at length ``n``:
    ``"QK^T"`` (:math:`S = QK^\\top/\\sqrt d`), ``"softmax"``, ``"PV"``, and ``"total"``."""
    q, k, v = _qkv(n, seed)
    scale = 1 / math.sqrt(D)
    s = q @ k.mT * scale                                               # (1, h, n, n)
    p = torch.softmax(s, dim=-1)
    calls = {"QK^T": lambda: q @ k.mT * scale, "softmax": lambda: torch.softmax(s, dim=-1),
             "PV": lambda: p @ v, "total": lambda: naive_attention(q, k, v)}
    return {name: time_ms(call, budget_s=budget_s) for name, call in calls.items()}


def roofline_sizes(l3_bytes: int | None) -> tuple[int, int]:
    """``(n_small, n_large)``: the largest ``n`` (128..1024) whose score and weight matrices (8
    heads, float32) fit together in a quarter of the last-level cache ``l3_bytes`` (other
    processes share it), and the smallest (1024..4096) whose score matrix alone is at least 4
    times that cache; ``(256, 2048)`` when its size is unknown."""
    if not l3_bytes:
        return 256, 2048
    small = max([n for n in (128, 256, 512, 1024) if 2 * score_matrix_bytes(n, heads=H)
                 <= l3_bytes // 4] or [128])
    large = min([n for n in (1024, 2048, 4096) if score_matrix_bytes(n, heads=H)
                 >= 4 * l3_bytes] or [4096])
    return small, large


def roofline_study(*, budget_s: float = 0.2, seed: int = 0) -> dict:
    """Cache sizes, copy bandwidth and matmul peak, then measured points ``{label: {"n",
    "intensity", "gflops"}}`` for the roofline: naive's three stages at ``n_small`` (in cache) and
    ``n_large`` (not), naive as a whole, ``sdpa`` and ``tiled`` at ``n_large``. Intensities are
    FLOPs per byte of main-memory traffic (:func:`attention_costs`, :func:`traffic_bytes`)."""
    caches = cache_sizes()
    peak, bandwidth = matmul_gflops(), copy_bandwidth_gbps()
    n_small, n_large = roofline_sizes(last_level_cache(caches) or None)
    points = {}
    for n in (n_small, n_large):
        times, costs = naive_stage_times(n, budget_s=budget_s, seed=seed), attention_costs(n, D, heads=H)
        for stage in ("QK^T", "softmax", "PV"):
            c = costs[stage]
            points[f"{stage} n={n}"] = {"n": n, "intensity": c["flops"] / c["bytes"],
                                        "gflops": c["flops"] / times[stage] / 1e6}
        flops = 4.0 * H * n * n * D
        points[f"naive n={n}"] = {"n": n, "intensity": flops / traffic_bytes("naive", n),
                                  "gflops": flops / times["total"] / 1e6}
    q, k, v = _qkv(n_large, seed)
    for method in ("sdpa", "tiled"):
        with torch.no_grad():
            ms = time_ms(lambda m=method: ATTENTION_FUNCTIONS[m](q, k, v), budget_s=budget_s)
        flops = 4.0 * H * n_large * n_large * D
        points[f"{method} n={n_large}"] = {"n": n_large, "gflops": flops / ms / 1e6,
                                           "intensity": flops / traffic_bytes(method, n_large)}
    return {"cache_bytes": caches, "peak_gflops": peak, "copy_gbps": bandwidth,
            "ridge": peak / bandwidth, "n_small": n_small, "n_large": n_large, "points": points}


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
