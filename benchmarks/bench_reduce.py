"""Reductions side by side: multireduce (auto and every catalogue rung), cupy, torch, the copy roof.

    python benchmarks/bench_reduce.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness as h  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.catalogue import REDUCE_ALGORITHMS  # noqa: E402


def main(argv=None) -> list:
    cupy, torch, args, env = h.setup("reductions side by side", argv)
    rows: list[h.Row] = []
    roof: dict[int, float] = {}
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


if __name__ == "__main__":
    main()
