"""``python -m attn_helpers bench attention``: time and peak memory of attention against ``n``.

The sweep itself is :func:`attn_helpers.lessons.complexity.bench_attention` (notebook 08 runs a
small one live); this module checks the targets on one run's records.
"""

from __future__ import annotations

TARGET_MEMORY_N, TARGET_MEMORY_FRACTION = 8192, 0.05
TARGET_TIME_N, TARGET_TIME_RATIO = 4096, 3.0


def attention_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check the targets on one run: tiled peak memory <= 5% of naive's at n = 8192, tiled
    median time <= 3x sdpa's at n = 4096 (each only when that ``n`` was measured)."""
    by = {(r["method"], r.get("n")): r for r in records}
    lines, ok = [], True
    if ("tiled", TARGET_MEMORY_N) in by and ("naive", TARGET_MEMORY_N) in by:
        fraction = (by[("tiled", TARGET_MEMORY_N)]["peak_bytes"]
                    / by[("naive", TARGET_MEMORY_N)]["peak_bytes"])
        met = fraction <= TARGET_MEMORY_FRACTION
        ok &= met
        lines.append(f"n={TARGET_MEMORY_N}: tiled peak memory = {100 * fraction:.2f}% of naive's "
                     f"(target <= {100 * TARGET_MEMORY_FRACTION:.0f}%): {'met' if met else 'NOT met'}")
    else:
        lines.append(f"n={TARGET_MEMORY_N} not measured: memory target not checked")
    if ("tiled", TARGET_TIME_N) in by and ("sdpa", TARGET_TIME_N) in by:
        ratio = by[("tiled", TARGET_TIME_N)]["median_ms"] / by[("sdpa", TARGET_TIME_N)]["median_ms"]
        met = ratio <= TARGET_TIME_RATIO
        ok &= met
        lines.append(f"n={TARGET_TIME_N}: tiled median time = {ratio:.2f}x sdpa's "
                     f"(target <= {TARGET_TIME_RATIO:.0f}x): {'met' if met else 'NOT met'}")
    else:
        lines.append(f"n={TARGET_TIME_N} not measured: time target not checked")
    peak = next((r["gflops"] for r in records if r["method"] == "matmul_peak"), None)
    for r in records:
        if r["method"] != "matmul_peak" and r["n"] == max(x.get("n", 0) for x in records):
            share = f", {100 * r['gflops'] / peak:.1f}% of the matmul peak" if peak else ""
            lines.append(f"n={r['n']} {r['method']:>6}: {r['median_ms']:10.2f} ms, "
                         f"{r['peak_bytes'] / 2**20:9.1f} MiB, {r['gflops']:7.2f} GFLOP/s{share}")
    return bool(ok), "\n".join(lines)
