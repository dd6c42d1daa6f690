r"""The cost of attention, counted and measured (notebook 08): the FLOPs and bytes of each stage of
exact attention and of a generated token with and without a KV cache; :func:`tile_stepper`,
FlashAttention's tiled forward tile by tile as arrays for a live view; :func:`claims`, every
statement the notebook makes about a measurement, as named booleans. Re-exported from
:mod:`.complexity_bench`: the benchmark, its records (:func:`load_benchmark`, the committed CPU
run) and power-law fits; the live studies :func:`claims` reads are in :mod:`.complexity_studies`.
"""

from __future__ import annotations

import torch

from .._checks import require_positive_int
from ..measure import PowerLaw, fit_power_law, format_bytes
from .complexity_bench import (
    ATTENTION_FUNCTIONS,
    ATTENTION_METHODS,
    BENCHMARK_FILE,
    FIT_N_MIN,
    FWD_BWD_METHODS,
    attention_flops,
    attention_sizes,
    bench_attention,
    fit_methods,
    load_benchmark,
    machine,
    matmul_peak,
    naive_attention,
    series,
    validate_records,
)
from .complexity_tiles import TileFrame, tile_schedule, tile_scores, tile_stepper

__all__ = ["BENCHMARK_FILE", "SOFTMAX_FLOPS_PER_SCORE", "FIT_N_MIN", "element_size", "roof",
           "attention_costs", "score_matrix_bytes", "kv_cache_flops", "PowerLaw", "fit_power_law",
           "series", "fit_methods", "matmul_peak", "machine", "load_benchmark", "validate_records",
           "format_bytes", "ATTENTION_METHODS", "FWD_BWD_METHODS", "ATTENTION_FUNCTIONS",
           "naive_attention", "attention_flops", "attention_sizes", "bench_attention", "TileFrame",
           "tile_schedule", "tile_scores", "tile_stepper", "claims"]

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
    size, copies = element_size(dtype), batch * heads
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
    return batch * heads * n * n * element_size(dtype)


def kv_cache_flops(t: int, d_model: int) -> dict[str, int]:
    """Matrix-product FLOPs of one self-attention layer (one head of ``d_model``) to produce token
    ``t + 1`` after ``t``: ``{"without_cache": 6(t+1)d^2 + 4(t+1)^2 d`` (the whole prefix again),
    ``"with_cache": 6d^2 + 4(t+1)d}`` (the new token's projections, its one query)."""
    require_positive_int("t", t, allow_zero=True)
    require_positive_int("d_model", d_model)
    m = t + 1
    return {"without_cache": 6 * m * d_model**2 + 4 * m * m * d_model,
            "with_cache": 6 * d_model**2 + 4 * m * d_model}



# The claims of notebook 08: every threshold once, here.
MEMORY_FRACTION = 0.05          # tiled's and sdpa's peak memory against naive's (committed run)
CLIFF_RATE_RATIO, STEADY_RATE_RATIO = 0.6, 0.8  # best GFLOP/s out of L3 / in L3 / 4: naive; sdpa, tiled
TRAINING_MEMORY_FRACTION = 1 / 6  # tiled's fwd + bwd peak against naive autograd's (live, n = 1024)
GRAD_TOLERANCE, RING_TOLERANCE = 1e-4, 1e-5   # largest gaps: gradients to SDPA's, ring to full
SMALL_TILE_SLOWDOWN = OUT_OF_CACHE_SLOWDOWN = 2.0  # the smallest tile / the best; softmax in / out of L3
CACHE_OVER_STATE, CACHE_FLOP_SAVING = 30, 100  # cache / linear state; FLOPs without / with cache
ROOF_NOISE = 1.25                # a measured point may sit this much above its roof (timing noise)
CAUSAL_GROWTH = 1.5              # live: causal sdpa's time growth over causal linear's and local's
LIVE_SLOPES = {"naive": (1.3, 3.2), "linear": (0.4, 1.6), "local": (0.4, 1.6)}  # noisy live run


def _record_claims(records: list[dict]) -> dict[str, bool]:
    by = {(r["method"], r.get("n")): r for r in records}
    time_fit, memory_fit = (fit_methods(records, key, n_min=FIT_N_MIN)
                            for key in ("median_ms", "peak_bytes"))

    def ratio(a, b, n, key="peak_bytes"):
        return by[(a, n)][key] / by[(b, n)][key]

    l3 = (machine(records) or {}).get("cache_bytes", {}).get("L3", 0)
    ns = series(records, "naive", "gflops")[0]
    in_l3 = [n for n in ns if 2 * score_matrix_bytes(n, heads=8) <= l3 // 4]   # S and P fit
    out_l3 = [n for n in ns if 2 * score_matrix_bytes(n, heads=8) > l3]        # they do not

    def rate(m, sizes):                                                         # best GFLOP/s
        return max((by[(m, n)]["gflops"] for n in sizes), default=0.0)

    return {
        "naive: time slope 1.6..2.4 and memory slope 1.7..2.3 (n^2)": (
            1.6 <= time_fit["naive"].slope <= 2.4 and 1.7 <= memory_fit["naive"].slope <= 2.3),
        "tiled: time slope >= 1.5 (it still does all n^2 work)": time_fit["tiled"].slope >= 1.5,
        "sdpa and tiled: memory slope <= 1.2 (no n x n matrix)": max(
            memory_fit["sdpa"].slope, memory_fit["tiled"].slope) <= 1.2,
        "causal linear and local: time slope 0.6..1.4, memory slope <= 1.4": all(
            0.6 <= time_fit[m].slope <= 1.4 and memory_fit[m].slope <= 1.4
            for m in ("linear", "local")),
        "n = 8192: tiled's peak <= 5% of naive's": ratio("tiled", "naive", 8192) <= MEMORY_FRACTION,
        "n = 1024 to 8192: naive's peak memory grows > 50x, tiled's < 3x": (
            by[("naive", 8192)]["peak_bytes"] > 50 * by[("naive", 1024)]["peak_bytes"]
            and by[("tiled", 8192)]["peak_bytes"] < 3 * by[("tiled", 1024)]["peak_bytes"]),
        "n = 4096, forward + backward: tiled's and sdpa's peak <= 5% of naive autograd's": max(
            ratio("tiled_fwd_bwd", "naive_fwd_bwd", 4096),
            ratio("sdpa_fwd_bwd", "naive_fwd_bwd", 4096)) <= MEMORY_FRACTION,
        "n = 4096: tiled takes <= 3x sdpa's time": ratio("tiled", "sdpa", 4096, "median_ms") <= 3,
        "n = 4096: sdpa > 2x and tiled > 1x naive's GFLOP/s": (
            ratio("sdpa", "naive", 4096, "gflops") > 2 and ratio("tiled", "naive", 4096, "gflops") > 1),
        "naive: best GFLOP/s once S and P outgrow L3 < 0.6x its best while they fit in L3 / 4": (
            bool(in_l3 and out_l3) and rate("naive", out_l3) < CLIFF_RATE_RATIO * rate("naive", in_l3)),
        "naive, n = 512 (S and P: half of L3): GFLOP/s < 0.6x its best at n <= 256": bool(
            l3 and 2 * score_matrix_bytes(512, heads=8) <= l3 // 2) and by[("naive", 512)]["gflops"]
            < CLIFF_RATE_RATIO * rate("naive", [n for n in ns if n <= 256]),
        "sdpa and tiled: best GFLOP/s at those sizes >= 0.8x their best at the small ones": (
            bool(in_l3 and out_l3) and all(rate(m, out_l3) >= STEADY_RATE_RATIO * rate(m, in_l3)
                                           for m in ("sdpa", "tiled"))),
    }


def _live_claims(live: list[dict]) -> dict[str, bool]:
    by = {(r["method"], r["n"]): r.get("peak_bytes") for r in live}
    ms = {(r["method"], r["n"]): r["median_ms"] for r in live}
    causal = sorted(r["n"] for r in live if r["method"] == "sdpa_causal")
    time_fit, memory_fit = (fit_methods(live, key, n_min=256, methods=("naive", "linear", "local"))
                            for key in ("median_ms", "peak_bytes"))
    n_t = max((r["n"] for r in live if r["method"] == "tiled"), default=0)

    def growth(m):                 # time at the largest causal n over time at the smallest
        return ms[(m, causal[-1])] / ms[(m, causal[0])]

    return {
        "live: time slopes naive 1.3..3.2, causal linear and local 0.4..1.6": all(
            low <= time_fit[m].slope <= high for m, (low, high) in LIVE_SLOPES.items()),
        "live: memory slopes naive 1.8..2.2, causal linear and local <= 1.2": (
            1.8 <= memory_fit["naive"].slope <= 2.2
            and max(memory_fit["linear"].slope, memory_fit["local"].slope) <= 1.2),
        "live, n = 1024: tiled's peak < naive's, sdpa's < a tenth of naive's": (
            by[("tiled", 1024)] < by[("naive", 1024)] > 10 * by[("sdpa", 1024)]),
    } | ({f"live, n = 1024 to {n_t} (4x the tokens): tiled's peak grows < 2x": (
        by[("tiled", n_t)] < 2 * by[("tiled", 1024)])} if n_t >= 4096 else {}) | ({
        f"live, n = {causal[0]} to {causal[-1]}: causal sdpa's time grows > {CAUSAL_GROWTH}x "
        "as much as causal linear's and local's": all(
            growth("sdpa_causal") > CAUSAL_GROWTH * growth(m) for m in ("linear", "local"))
    } if len(causal) >= 2 else {})


def _training_claims(t: dict) -> dict[str, bool]:
    peak, saved, error = t["peak_bytes"], t["saved_bytes"], t["grad_error"]
    return {
        "tiled's and naive's gradients equal SDPA's (gap < 1e-4)": max(
            error["tiled"], error["naive"]) < GRAD_TOLERANCE,
        "naive autograd saves at least one n x n matrix per head": saved["naive"] >= t["score_bytes"],
        "tiled saves exactly q, k, v, O and lse": saved["tiled"] == 4 * 8 * t["n"] * (4 * 64 + 1),
        "naive's forward + backward peak >= 2 score matrices": peak["naive"] >= 2 * t["score_bytes"],
        "tiled's forward + backward peak < 1/6 of naive's": (
            peak["tiled"] < TRAINING_MEMORY_FRACTION * peak["naive"]),
    }


def roof(r: dict, point: dict) -> float:
    """The roof over ``point`` of ``roofline_study`` ``r``: ``min(peak, intensity x bandwidth)``,
    with the in-cache copy bandwidth for an in-cache point, main memory's for the others."""
    bandwidth = r["cache_gbps"] if point["roof"] == "cache" else r["dram_gbps"]
    return min(r["peak_gflops"], point["intensity"] * bandwidth)


def _roofline_claims(r: dict) -> dict[str, bool]:
    large, p, ms = r["n_large"], r["points"], r["stage_ms"]
    return {
        "the softmax lies left of the measured ridge point": (
            p[f"softmax n={large}"]["intensity"] < r["ridge"]),
        "every point lies below the roof that applies to it (25% timing noise allowed)": all(
            q["gflops"] <= ROOF_NOISE * roof(r, q) for q in p.values()),
        f"n = {large}: the softmax takes > 2x a plain copy of its matrix": (
            ms["softmax"] > OUT_OF_CACHE_SLOWDOWN * ms["copy S"]),
        f"n = {large}: sdpa's GFLOP/s > naive's": (
            p[f"sdpa n={large}"]["gflops"] > p[f"naive n={large}"]["gflops"]),
    }


def _sweep_claims(s: dict) -> dict[str, bool]:
    rows, llc = s["rows"], max(s["cache_bytes"].values(), default=0)   # 0: sizes unknown
    best = min(rows, key=lambda row: row["median_ms"])
    return {
        "the smallest tile is > 2x slower than the best (a fixed cost per tile)": (
            rows[0]["median_ms"] > SMALL_TILE_SLOWDOWN * best["median_ms"]),
        "the largest tile is slower than the best": rows[-1]["median_ms"] > best["median_ms"],
    } | ({"the fastest tile's working set fits in the last-level cache": (
        best["working_set_bytes"] <= llc)} if llc else {})


def _ring_claims(ring: dict) -> dict[str, bool]:
    return {
        f"ring attention over P = {', '.join(map(str, sorted(ring)))} equals full attention": all(
            r["max_error"] < RING_TOLERANCE for r in ring.values()),
        "scoring a block takes longer than moving one (median, every P)": all(
            r["compute_s"] >= r["transfer_s"] for r in ring.values()),
        "after scoring, the wait is shorter than a lone transfer (median, every P)": all(
            r["wait_s"] < r["transfer_s"] for r in ring.values()),
    }


def _decoding_claims(s: dict) -> dict[str, bool]:
    formula = s["formula"]
    return {
        "the RNN steps equal causal linear attention (gap < 1e-5)": s["max_error"] < 1e-5,
        "linear attention's state never grows and matches decoding_memory": all(
            b == f["linear_state"] for b, f in zip(s["state_bytes"], formula, strict=True)),
        "the KV cache grows by the same bytes every token, as decoding_memory says": all(
            b == f["kv_cache"] for b, f in zip(s["cache_bytes"], formula, strict=True)),
        f"after {s['t'][-1]} tokens the KV cache is > {CACHE_OVER_STATE}x the state": (
            s["cache_bytes"][-1] > CACHE_OVER_STATE * s["state_bytes"][-1]),
    }


def _generation_claims(g: dict) -> dict[str, bool]:
    steps, counted = [kv_cache_flops(t, g["d"]) for t in range(g["n"])], g["counted"]
    return {
        "counted FLOPs equal kv_cache_flops summed over the steps": all(
            counted[key] == sum(step[key] for step in steps)
            for key in ("with_cache", "without_cache")),
        f"over {g['n']} tokens the cache saves > {CACHE_FLOP_SAVING}x the FLOPs": (
            counted["without_cache"] > CACHE_FLOP_SAVING * counted["with_cache"]),
    } | ({"generating without a cache takes > 1.5x the time with one": g["seconds"][
        "without_cache"] > 1.5 * g["seconds"]["with_cache"]} if "seconds" in g else {})


def claims(*, records=None, live=None, training=None, roofline=None, sweep=None, ring=None,
           decoding=None, generation=None) -> dict[str, bool]:
    """The statements of notebook 08, each checked on the numbers given (only the sections
    given): ``records`` the committed run (:func:`load_benchmark`), ``live`` a small live run,
    ``training``/``roofline``/``decoding`` the studies of :mod:`.complexity_studies`, ``sweep``
    ``{"rows": block_sweep(...), "cache_bytes"}``, ``ring`` ``{P: {"max_error", **ring_overlap}}``,
    ``generation`` ``{"n", "d", "counted": generation_flops(...)}`` (and ``"seconds"`` if timed)."""
    sections = ((records, _record_claims), (live, _live_claims), (training, _training_claims),
                (roofline, _roofline_claims), (sweep, _sweep_claims), (ring, _ring_claims),
                (decoding, _decoding_claims), (generation, _generation_claims))
    out: dict[str, bool] = {}
    for data, check in sections:
        if data is not None:
            out.update({name: bool(value) for name, value in check(data).items()})
    return out
