"""Scans side by side: multireduce (decoupled look-back and the catalogue), cupy, torch, the copy roof.

    python benchmarks/bench_scan.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness as h  # noqa: E402

import multireduce as mr  # noqa: E402


def main(argv=None) -> list:
    cupy, torch, args, env = h.setup("scans side by side", argv)
    rows: list[h.Row] = []
    roof: dict[int, float] = {}
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
    h.plot(rows, "bench_scan", {}, f"cumsum, {env.get('device')}")
    return rows


if __name__ == "__main__":
    main()
