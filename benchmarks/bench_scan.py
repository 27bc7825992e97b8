"""Scans side by side: multireduce (decoupled look-back and the catalogue), cupy, torch, the copy roof; and
the look-back's variants in one run: free vs fixed (deterministic) for float32, float64 and int32 -> int64,
and float32 accumulated in float32 vs float64, 2^24 .. 2^30 elements, each as a ratio to the copy roof.

    python -m benchmarks scan [--quick] [--lookback-only]
    python -m benchmarks scan --profile       # one look-back scan and one reduce at 2^28 float32, for ncu

``--lookback-only`` runs the variants section alone (what picks the defaults: the fixed
look-back must reach >= 0.97 x the free one's throughput; dtypes.WIDE_FLOAT32_ON_GPU waits for "wide"
to cost nothing measurable).

``--profile`` (``ncu``) launches mr.cumsum and mr.sum of the same 2^28 float32 array three times each and
nothing else timed: the launches ``benchmarks/run_gpu.sh profile`` hands to Nsight Compute.
"""

from __future__ import annotations

import numpy as np

import multireduce as mr
from benchmarks import harness as h


def lookback_variants(cupy, quick: bool, roof: dict[int, float]) -> list:
    """Free vs fixed look-back, and float32 vs float64 accumulation of float32, timed back to back through
    the production launcher (``cupy_backend.lookback_scan``, private ``deterministic=``)."""
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    rows: list[h.Row] = []
    sizes = [24, 26, 28, 30] if not quick else [24, 28]
    # (input, accumulator, output, variants): (label, deterministic)
    cases = [(np.float32, np.float32, np.float32, [("free", False), ("fixed", True)]),
             (np.float64, np.float64, np.float64, [("free", False), ("fixed", True)]),
             (np.int32, np.int64, np.int64, [("free", False), ("fixed", True)]),
             (np.float32, np.float64, np.float32, [("wide-free", False), ("wide-fixed", True)])]
    for T, A, O, variants in cases:
        T, A, O = np.dtype(T), np.dtype(A), np.dtype(O)
        for e in sizes:
            n = 1 << e
            moved = n * (T.itemsize + O.itemsize)
            if moved > 12 << 30:
                continue
            if T.kind == "f":
                xs = h.buffers(lambda i: cupy.random.random(n, dtype=T) - 0.5, n * T.itemsize,
                               max_buffers=2 if moved > 1 << 30 else 4)
            else:
                xs = h.buffers(lambda i: cupy.random.randint(-1000, 1000, size=n, dtype=T), n * T.itemsize,
                               max_buffers=2 if moved > 1 << 30 else 4)
            out = cupy.empty(n, O)
            probe = cupy.asarray(np.unique(np.linspace(0, n - 1, 257).astype(np.int64)))
            ref = cupy.cumsum(xs[0].astype(cupy.float64))[probe].get()
            mass = cupy.cumsum(cupy.abs(xs[0].astype(cupy.float64)))[probe].get()
            if moved not in roof:
                roof[moved] = h.copy_roof(moved // 2)
            identity = op.identity(A)
            times = {}
            for label, fixed in variants:
                def fn(x, fixed=fixed):
                    cb.lookback_scan(x.reshape(1, n), out.reshape(1, n), op, A, identity, None, True,
                                     deterministic=fixed)
                    return out

                fn(xs[0])
                first = out.copy()
                fn(xs[0])
                repeatable = bool(cupy.array_equal(first.view(cupy.uint8), out.view(cupy.uint8)))
                got = out[probe].get().astype(np.float64)
                eps = np.finfo(O).eps if O.kind == "f" else 0.0
                ok = bool(np.all(np.abs(got - ref) <= eps * (n / 1024 + 64) * mass + 1e-30))
                ms = h.time_gpu(fn, xs, repeats=10 if moved > 1 << 30 else 20)
                times[label] = ms
                gbps = moved / ms / 1e6
                kernel = cb._scan_kernels(op, T, A, O, None, fixed)[0]["lookback"]
                shape = cb._facts()[1].scan_shape(T.itemsize, A.itemsize, O.itemsize)
                rows.append(h.Row("lookback", label, f"{T.name}->{O.name} acc {A.name}", n, ms, gbps,
                                  gbps / roof[moved], ok, note="repeatable" if repeatable else "differs run to run",
                                  extra={"tile": str(shape),
                                         "blocks_per_sm": cb.scan_occupancy(kernel, shape.block)}))
            base = times[variants[0][0]]
            for r in rows[-len(variants):]:
                r.extra["time_vs_" + variants[0][0]] = r.ms / base
            del xs, out
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def summary(rows: list) -> str:
    """Throughput of each variant relative to the first of its case (free, or float32 accumulation)."""
    lines = ["| dtype | n | variant | x copy | throughput vs first | repeatable |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.family != "lookback":
            continue
        first = [k for k in r.extra if k.startswith("time_vs_")][0]
        lines.append(f"| {r.dtype} | 2^{int(np.log2(r.n))} | {r.impl} | {r.ratio_copy:.3f} | "
                     f"{1 / r.extra[first]:.3f} (vs {first[8:]}) | {r.note} |")
    return "\n".join(lines) + "\n"


def profile_ncu() -> None:
    """``--profile``: one look-back scan and one vectorized reduce at 2^28 float32, three times each."""
    import cupy

    x = cupy.random.random(1 << 28, dtype=cupy.float32)
    for _ in range(3):
        mr.cumsum(x)
        mr.sum(x)
    cupy.cuda.Device().synchronize()


def main(argv=None) -> list:
    return h.run_suite("scan", __doc__, argv, run, quick="two sizes only", only="lookback",
                       profiles={"ncu": ("launches of one scan and one reduce for Nsight Compute", profile_ncu)})


def run(args, cupy, torch, env) -> list:
    roof: dict[int, float] = {}
    rows: list[h.Row] = lookback_variants(cupy, args.quick, roof)
    print(summary(rows))
    if args.only:
        h.save(rows, "bench_scan_lookback", env)
        return rows
    sizes = [16, 20, 22, 24, 26, 28, 30] if not args.quick else [20, 26]
    for dtype, out_dtype in [(np.float32, np.float32), (np.float64, np.float64), (np.int32, np.int64)]:
        for e in sizes:
            n = 1 << e
            moved = n * (np.dtype(dtype).itemsize + np.dtype(out_dtype).itemsize)
            if moved > 12 << 30:
                continue

            def make(i):
                if np.dtype(dtype).kind == "f":
                    return cupy.random.random(n, dtype=dtype) - 0.5
                return cupy.random.randint(-1000, 1000, size=n, dtype=dtype)

            xs = h.buffers(make, n * np.dtype(dtype).itemsize, max_buffers=2 if moved > 1 << 30 else 4)
            probe = cupy.asarray(np.unique(np.linspace(0, n - 1, 257).astype(np.int64)))
            ref = cupy.cumsum(xs[0].astype(cupy.float64))[probe].get()
            mass = cupy.cumsum(cupy.abs(xs[0].astype(cupy.float64)))[probe].get()
            if moved not in roof:
                roof[moved] = h.copy_roof(moved // 2)
            copy = roof[moved]
            impls = {"multireduce": lambda x: mr.cumsum(x), "cupy": lambda x: cupy.cumsum(x)}
            if dtype == np.float32:
                impls["mr:accumulate=wide"] = lambda x: mr.cumsum(x, accumulate="wide")
            if torch is not None:
                impls["torch"] = lambda x: torch.cumsum(torch.as_tensor(x, device="cuda"), 0)
            if e <= 26:
                impls["mr:hillis_steele"] = lambda x: mr.cumsum(x, algorithm="hillis_steele")
                impls["mr:blelloch"] = lambda x: mr.cumsum(x, algorithm="blelloch")
            for name, fn in impls.items():
                got = fn(xs[0])
                got = cupy.asarray(got)[probe].get().astype(np.float64)
                eps = np.finfo(np.float32 if dtype == np.float32 else np.float64).eps
                ok = bool(np.all(np.abs(got - ref) <= eps * (n / 1024 + 64) * mass + 1e-30))
                ms = h.time_gpu(fn, xs, repeats=10 if moved > 1 << 30 else 20)
                gbps = moved / ms / 1e6
                rows.append(h.Row("cumsum", name, f"{np.dtype(dtype).name}->{np.dtype(out_dtype).name}", n, ms,
                                  gbps, gbps / copy, ok))
            del xs
            cupy.get_default_memory_pool().free_all_blocks()
    h.save(rows, "bench_scan", env)
    h.plot([r for r in rows if r.family == "cumsum"], "bench_scan", {}, f"cumsum, {env.get('device')}")
    return rows

