"""``python -m attn_helpers bench attention``: time and peak memory of attention against ``n``.

The sweep itself is :func:`attn_helpers.lessons.complexity.bench_attention` (notebook 08 runs a
small one live); this module checks the targets on one run's records.
"""

from __future__ import annotations

#: (what, numerator method, denominator method, n, record key, largest ratio allowed)
TARGETS = (
    ("tiled peak memory", "tiled", "naive", 8192, "peak_bytes", 0.05),
    ("tiled forward + backward peak memory", "tiled_fwd_bwd", "naive_fwd_bwd", 4096,
     "peak_bytes", 0.05),
    ("tiled median time", "tiled", "sdpa", 4096, "median_ms", 3.0),
)


def attention_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check the targets on one run, each only when its ``n`` was measured: tiled's peak memory
    <= 5% of naive's at n = 8192; tiled's forward + backward peak <= 5% of naive autograd's at
    n = 4096; tiled's median time <= 3x sdpa's at n = 4096."""
    by = {(r["method"], r.get("n")): r for r in records}
    lines, ok = [], True
    for what, top, bottom, n, key, limit in TARGETS:
        if (top, n) not in by or (bottom, n) not in by:
            lines.append(f"n={n} {top} / {bottom} not measured: target not checked")
            continue
        ratio = by[(top, n)][key] / by[(bottom, n)][key]
        met = ratio <= limit
        ok &= met
        memory = key == "peak_bytes"
        shown = f"{100 * ratio:.2f}% of {bottom}'s" if memory else f"{ratio:.2f}x {bottom}'s"
        target = f"<= {100 * limit:.0f}%" if memory else f"<= {limit:.0f}x"
        lines.append(f"n={n}: {what} = {shown} (target {target}): {'met' if met else 'NOT met'}")
    peak = next((r["gflops"] for r in records if r["method"] == "matmul_peak"), None)
    rows = [r for r in records if "n" in r]
    largest = max((r["n"] for r in rows), default=None)
    for r in rows:
        if r["n"] == largest:
            share = f", {100 * r['gflops'] / peak:.1f}% of the matmul peak" if peak else ""
            lines.append(f"n={r['n']} {r['method']:>13}: {r['median_ms']:10.2f} ms, "
                         f"{r['peak_bytes'] / 2**20:9.1f} MiB, {r['gflops']:7.2f} GFLOP/s{share}")
    machine = next((r for r in records if r["method"] == "machine"), None)
    if machine:
        caches = ", ".join(f"{k} {v / 2**20:g} MiB" for k, v in machine["cache_bytes"].items())
        lines.append(f"machine: {caches or 'cache sizes unknown'}; copy {machine['copy_gbps']:.1f} GB/s")
    return bool(ok), "\n".join(lines)
