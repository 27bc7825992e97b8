"""The short table printed last by benchmarks/run_gpu.sh: each single-GPU target and what was measured.

    python -m benchmarks summary [DIR]   (DIR, default $OUT or ".", holds bench_reduce.json and bench_scan.json)
"""

from __future__ import annotations

import json
import os

from benchmarks import harness as h


def load(path):
    if not os.path.exists(path):
        return None, []
    data = json.load(open(path))
    return data["environment"], data["rows"]


def pick(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def main(argv=None) -> int:
    p = h.parser("summary", __doc__)
    p.add_argument("dir", nargs="?", default=os.environ.get("OUT") or ".",
                   help="the folder with bench_reduce.json and bench_scan.json")
    out = p.parse_args(argv).dir
    env, red = load(os.path.join(out, "bench_reduce.json"))
    _, scan = load(os.path.join(out, "bench_scan.json"))
    lines = []

    def add(target, value, ok):
        lines.append((target, value, "met" if ok else "NOT met"))

    for dtype in ["float32", "float64", "int32", "int64"]:
        big = [r for r in pick(red, family="sum", impl="multireduce", dtype=dtype) if r["n"] >= 1 << 26]
        if big:
            worst = min(r["ratio_copy"] for r in big)
            add(f"reduce {dtype} >= 1.0 x copy (n >= 2^26)", f"{worst:.2f} x", worst >= 1.0)
        ours = {r["n"]: r for r in pick(red, family="sum", impl="multireduce", dtype=dtype)}
        theirs = {r["n"]: r for r in pick(red, family="sum", impl="cupy", dtype=dtype)}
        ratios = [theirs[n]["ms"] / ours[n]["ms"] for n in ours if n in theirs]
        if ratios:
            need = 1.8 if dtype == "int32" else 1.0
            add(f"reduce {dtype} >= {need} x cupy.sum (every size)", f"min {min(ratios):.2f} x", min(ratios) >= need)
    past = [r for r in pick(red, family="sum", impl="multireduce", dtype="float32") if r["n"] > 1 << 31]
    at30 = [r for r in pick(red, family="sum", impl="multireduce", dtype="float32") if r["n"] == 1 << 30]
    if past and at30:
        rel = past[0]["gbps"] / at30[0]["gbps"]
        add("reduce past 2^31 same GB/s as 2^30", f"{past[0]['gbps']:.0f} vs {at30[0]['gbps']:.0f} GB/s", rel >= 0.95)
    for op in ["min", "max", "prod", "mean"]:
        r = pick(red, family=op, impl="multireduce")
        if r:
            add(f"{op} at sum's bandwidth", f"{r[0]['ratio_copy']:.2f} x copy", r[0]["ratio_copy"] >= 0.95)
    lat = {r["n"]: r for r in pick(red, family="sum-latency", impl="multireduce")}
    latc = {r["n"]: r for r in pick(red, family="sum-latency", impl="cupy")}
    if lat:
        worst = max(lat[n]["ms"] / latc[n]["ms"] for n in lat)
        add("small reduce <= 0.6 x cupy.sum time (<= 2^20)", f"worst {worst:.2f} x ({min(r['ms'] for r in lat.values())*1e3:.1f} us)", worst <= 0.6)
    for dtype in ["float32->float32", "float64->float64", "int32->int64"]:
        ours = {r["n"]: r for r in pick(scan, impl="multireduce", dtype=dtype)}
        for e, need in [(26, 0.8), (28, 0.9), (30, 0.9)]:
            if (1 << e) in ours:
                v = ours[1 << e]["ratio_copy"]
                add(f"scan {dtype} >= {need} x copy at 2^{e}", f"{v:.2f} x", v >= need)
        for other, need in [("cupy", 3.5), ("torch", 1.5)]:
            theirs = {r["n"]: r for r in pick(scan, impl=other, dtype=dtype)}
            ratios = [theirs[n]["ms"] / ours[n]["ms"] for n in ours if n in theirs and n >= 1 << 26]
            if ratios:
                add(f"scan {dtype} >= {need} x {other}.cumsum (n >= 2^26)", f"min {min(ratios):.2f} x", min(ratios) >= need)
    bad = [r for r in red + scan if not r["ok"]]
    print(f"\nDevice: {env.get('device') if env else '?'}; {len(red) + len(scan)} timed rows, {len(bad)} failed their check")
    for r in bad[:10]:
        print(f"  CHECK FAILED: {r['family']} {r['impl']} {r['dtype']} n={r['n']}")
    print(h.md_table(("target", "measured", ""), lines), end="")
    return 1 if bad else 0
