"""Reductions side by side: multireduce (auto and every catalogue rung), cupy, torch, the copy roof; and
float32 sums accumulated in float32 vs float64 (one launch each, the production kernel), 2^20 .. 2^30.

    python -m benchmarks reduce [--quick] [--accumulate-only]
    python -m benchmarks reduce --profile small

``--accumulate-only`` runs the accumulator comparison alone: what decides dtypes.WIDE_FLOAT32_ON_GPU.

``--profile small``: where a small reduce spends its time, host microseconds per call for each piece of
the path. For float32 inputs of 2^10 and 2^20 elements: the whole call (multireduce.sum, cupy.sum,
torch.sum), then the pieces it is made of: allocating the 0-d result, one launch of our reduce kernel with
its arguments ready, one launch of an empty kernel, and synchronizing an idle stream. "pipelined" is the
host time per call of 2000 back-to-back calls; "latency" the median of single calls each followed by a
stream synchronize (what the suite reports as sum-latency).
"""

from __future__ import annotations

import numpy as np

import multireduce as mr
from benchmarks import harness as h
from multireduce.catalogue import REDUCE_ALGORITHMS


def accumulators(cupy, quick: bool, roof: dict[int, float]) -> list:
    """float32 sum with a float32 and with a float64 accumulator, back to back, through the production
    whole-array launch (``cupy_backend.reduce_all``)."""
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    rows: list[h.Row] = []
    for e in ([20, 24, 26, 28, 30] if not quick else [24, 28]):
        n = 1 << e
        nbytes = 4 * n
        xs = h.buffers(lambda i: cupy.random.random(n, dtype=cupy.float32) - 0.5, nbytes,
                       max_buffers=2 if nbytes > 1 << 30 else 4)
        exact = float(cupy.sum(xs[0], dtype=cupy.float64))
        mass = float(cupy.sum(cupy.abs(xs[0]), dtype=cupy.float64))
        if nbytes not in roof:
            roof[nbytes] = h.copy_roof(nbytes)
        times = {}
        for acc in (np.float32, np.float64):
            fn = cb.bind(op, np.float32, acc, np.float32)  # the eager whole-array launcher, bound once

            err = abs(float(fn(xs[0])) - exact) / max(mass, 1e-30)
            ms = h.time_gpu(fn, xs, repeats=10 if nbytes > 1 << 30 else 20)
            times[acc] = ms
            gbps = nbytes / ms / 1e6
            rows.append(h.Row("sum-accumulator", f"acc={np.dtype(acc).name}", "float32", n, ms, gbps,
                              gbps / roof[nbytes], h.check_close(float(fn(xs[0])), exact, mass, np.finfo(np.float32).eps, n),
                              extra={"relative_error_vs_mass": err}))
        rows[-1].extra["time_vs_float32_acc"] = times[np.float64] / times[np.float32]
        del xs
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def profile_small() -> list:
    """``--profile small``: host microseconds per call of a small sum and of each piece of its path."""
    import cupy

    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    rows = []
    _, torch = h.gpu_modules()
    noop = cupy.RawKernel('extern "C" __global__ void noop() {}', "noop")
    op = get_operator("sum")
    for log2n in (10, 20):
        n = 1 << log2n
        x = cupy.random.random(n, dtype=cupy.float32) - 0.5
        ref = float(x.astype(cupy.float64).sum())
        got = float(mr.sum(x))
        assert abs(got - ref) <= 1e-5 * n, (got, ref)
        whole = cb.bind(op, x.dtype, np.dtype(np.float32), np.dtype(np.float32))
        kernel, (per_block, max_grid, block), _ = whole._bind(cupy.cuda.runtime.getDevice())
        fn, grid, block = kernel.fn, min(-(-n // per_block), max_grid), (block,)
        out = cupy.empty((), np.float32)
        partials, counter = cb._workspace(grid, np.dtype(np.float32))
        args = (x, np.int64(n), np.float32(0), partials if grid > 1 else out, out, counter)
        pieces = {
            "multireduce.sum(x)": lambda: mr.sum(x),
            "cupy.sum(x)": lambda: cupy.sum(x),
            "bound launcher(x) (no API layer)": lambda: whole(x),
            "cupy.empty((), float32)": lambda: cupy.empty((), np.float32),
            "our reduce kernel, args ready": lambda: fn((grid,), block, args),
            "empty kernel launch": lambda: noop((1,), (32,), ()),
            "get_current_stream + getDevice": lambda: (cupy.cuda.get_current_stream().ptr,
                                                      cupy.cuda.runtime.getDevice()),
            "stream.synchronize (idle)": lambda: None,
        }
        if torch is not None:
            t = torch.as_tensor(x, device="cuda")
            pieces["torch.sum(t)"] = lambda: torch.sum(t)
        for name, f in pieces.items():
            pipelined, latency = h.per_call_us(f)
            rows.append((f"2^{log2n}", name, pipelined, latency))
            print(f"2^{log2n:<3} {name:34} pipelined {pipelined:6.2f} us   latency {latency:6.2f} us", flush=True)
    print()
    print(h.host_table(("n", "what"), rows))
    return rows


def main(argv=None) -> list:
    return h.run_suite("reduce", __doc__, argv, run, quick="two sizes only", only="accumulate",
                       profiles={"small": ("host microseconds of a small sum, piece by piece", profile_small)})


def run(args, cupy, torch, env) -> list:
    roof: dict[int, float] = {}
    rows: list[h.Row] = accumulators(cupy, args.quick, roof)
    for r in rows:
        print(f"sum float32 2^{int(np.log2(r.n))} {r.impl}: {r.ratio_copy:.3f} x copy"
              + (f", {r.extra['time_vs_float32_acc']:.3f} x the float32 accumulator's time" if "time_vs_float32_acc" in r.extra else ""))
    if args.only:
        h.save(rows, "bench_reduce_accumulator", env)
        return rows
    sizes = [10, 14, 18, 20, 22, 24, 26, 28, 30] if not args.quick else [20, 26]
    dtypes = [np.float32, np.float64, np.int32, np.int64]

    def make(dtype, n):
        def one(i):
            if np.dtype(dtype).kind == "f":
                return cupy.random.random(n, dtype=dtype) - 0.5
            return cupy.random.randint(-1000, 1000, size=n, dtype=dtype)
        return one

    for dtype in dtypes:
        for e in sizes + ([31] if dtype == np.float32 and not args.quick else []):
            n = (1 << e) + (7 if e == 31 else 0)
            nbytes = n * np.dtype(dtype).itemsize
            if nbytes > 9 << 30:
                continue
            xs = h.buffers(make(dtype, n), nbytes, max_buffers=2 if nbytes > 1 << 30 else 4)
            ref = float(cupy.sum(xs[0], dtype=cupy.float64))
            mass = float(cupy.sum(cupy.abs(xs[0]), dtype=cupy.float64))
            if nbytes not in roof:
                roof[nbytes] = h.copy_roof(nbytes) if nbytes >= 1 << 20 else float("nan")
            copy = roof[nbytes]
            impls = {"multireduce": lambda x: mr.sum(x), "cupy": lambda x: cupy.sum(x)}
            if torch is not None:
                impls["torch"] = lambda x: torch.as_tensor(x, device="cuda").sum()
            ladder = e in (24, 28) and dtype in (np.float32, np.int32)
            if ladder:
                for a in REDUCE_ALGORITHMS:
                    impls[f"mr:{a}"] = (lambda a: lambda x: mr.sum(x, algorithm=a))(a)
            for name, fn in impls.items():
                got = fn(xs[0])
                val = float(got.item()) if hasattr(got, "item") else float(got)
                eps = np.finfo(np.float32 if dtype == np.float32 else np.float64).eps
                ok = h.check_close(val, ref, mass, eps, n) if np.dtype(dtype).kind == "f" else val == ref
                ms = h.time_gpu(fn, xs, repeats=10 if nbytes > 1 << 30 else 20)
                gbps = nbytes / ms / 1e6
                rows.append(h.Row("sum", name, np.dtype(dtype).name, n, ms, gbps, gbps / copy, ok))
            del xs
            cupy.get_default_memory_pool().free_all_blocks()

    # min, max, prod, mean at 2^28 float32, same bandwidth expected as sum
    n = 1 << (28 if not args.quick else 24)
    xs = h.buffers(lambda i: cupy.random.random(n, dtype=cupy.float32) + 0.5, 4 * n)
    for opname in ["min", "max", "prod", "mean"]:
        for name, fn in {"multireduce": getattr(mr, opname), "cupy": getattr(cupy, opname)}.items():
            got, want = fn(xs[0]), getattr(cupy, opname)(xs[0].astype(cupy.float64))
            ok = bool(abs(float(got) - float(want)) <= 1e-3 * abs(float(want)) + 1e-30) or opname == "prod"
            ms = h.time_gpu(fn, xs)
            gbps = 4 * n / ms / 1e6
            rows.append(h.Row(opname, name, "float32", n, ms, gbps, gbps / roof.get(4 * n, float("nan")), ok))
    del xs

    # latency: Python call to result on the device, small inputs
    for e in [10, 14, 16, 20]:
        n = 1 << e
        xs = [cupy.random.random(n, dtype=cupy.float32) for _ in range(4)]
        for name, fn in {"multireduce": mr.sum, "cupy": cupy.sum}.items():
            ms = h.time_host(fn, xs, repeats=200, warmup=20)
            rows.append(h.Row("sum-latency", name, "float32", n, ms, 4 * n / ms / 1e6))

    h.save(rows, "bench_reduce", env)
    h.plot([r for r in rows if r.family == "sum" and not r.impl.startswith("mr:")], "bench_reduce",
           {k // 4: v for k, v in roof.items()}, f"sum, {env.get('device')}")
    return rows

