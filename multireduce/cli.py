"""The ``multireduce`` command: ``demo`` (the main job on a local cluster, verified) and ``info``."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time

import numpy as np


def _version(module: str) -> str:
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception:
        return "not installed"


def info(args) -> int:
    import multireduce
    from multireduce import kernels
    from multireduce.cluster import gpu_count

    print(f"multireduce {multireduce.__version__}")
    for mod in ["numpy", "dask", "distributed", "cupy", "dask_cuda"]:
        print(f"  {mod:12} {_version(mod)}")
    n = gpu_count()
    print(f"GPUs seen: {n}")
    if n:
        import cupy

        for i in range(n):
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            print(f"  {i}: {name}, {props['totalGlobalMem'] / 2**30:.0f} GiB, {props['multiProcessorCount']} SMs, "
                  f"sm_{props['major']}{props['minor']}")
    print(f"kernel cache: {kernels.cache_dir()}  (set MULTIREDUCE_KERNEL_CACHE to move it)")
    print(f"kernel sources: {kernels.source_dir()}")
    print(f"algorithms: {', '.join(multireduce.algorithms())}")
    return 0


def _reference(opname: str, host: np.ndarray):
    wide = host.astype(np.float64)
    return {
        "sum": np.sum(wide), "min": np.min(host), "max": np.max(host), "mean": np.mean(wide),
        "cumsum": np.cumsum(wide),
    }[opname]


def demo(args) -> int:
    import dask.array as da
    from distributed import Client, progress, wait

    import multireduce as mr
    from multireduce.cluster import local_cluster

    size, chunk = int(args.size), int(args.chunk)
    dtype = np.dtype(args.dtype)
    with local_cluster(n_workers=args.workers, gpu={"auto": None, "gpu": True, "cpu": False}[args.backend]) as cluster, \
            Client(cluster) as client:
        gpu = type(cluster).__name__ == "LocalCUDACluster"
        backend = "cupy (our CUDA kernels)" if gpu else "numpy"
        print(f"cluster: {type(cluster).__name__}, {len(client.scheduler_info()['workers'])} workers; "
              f"dashboard {client.dashboard_link}")
        print(f"array: {size:,} x {dtype} in chunks of {chunk:,} ({size * dtype.itemsize / 2**30:.2f} GiB)")
        x = da.random.default_rng(args.seed).random(size, chunks=chunk, dtype=np.float64)
        x = (x - 0.5).astype(dtype)
        if gpu:
            import cupy

            x = x.map_blocks(cupy.asarray, dtype=dtype)
        x = x.persist()
        progress(x) if sys.stdout.isatty() else None
        wait(x)
        host = x.compute()
        host = host.get() if hasattr(host, "get") else np.asarray(host)
        rows, failed = [], 0
        for opname in ["sum", "min", "max", "mean", "cumsum"]:
            lazy = getattr(mr, opname)(x)
            start = time.perf_counter()
            if opname == "cumsum":
                out = lazy.persist()
                wait(out)
                elapsed = time.perf_counter() - start
                got = out.compute()
                got = got.get() if hasattr(got, "get") else got
                ref = _reference(opname, host)
                mass = np.cumsum(np.abs(host.astype(np.float64)))
                err = float(np.max(np.abs(got - ref) / np.maximum(mass, 1e-300)))
                value = float(got[-1])
                moved = 2 * size * dtype.itemsize
            else:
                got = lazy.compute()
                elapsed = time.perf_counter() - start
                value = float(got)
                ref = float(_reference(opname, host))
                mass = float(np.sum(np.abs(host.astype(np.float64)))) if opname == "sum" else abs(ref) or 1.0
                if opname == "mean":
                    mass = float(np.mean(np.abs(host.astype(np.float64))))
                err = abs(value - ref) / mass
                moved = size * dtype.itemsize
            bound = np.finfo(dtype).eps * (size / 1024 + 64) if dtype.kind == "f" else 0.0
            ok = err <= bound
            failed += not ok
            rows.append((opname, f"{value:.9g}", f"{err:.2e}", "ok" if ok else "WRONG", f"{elapsed * 1e3:.1f} ms",
                         f"{moved / elapsed / 1e9:.2f}", backend))
        header = ("op", "value", "rel. error", "check", "time", "GB/s", "backend")
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
        print()
        print(line(header))
        print("  ".join("-" * w for w in widths))
        for r in rows:
            print(line(r))
        print(f"\n{len(rows) - failed} of {len(rows)} results verified against NumPy (float64 reference); "
              "errors are relative to the sum of |x| (mean: mean |x|)")
        return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="multireduce", description="Reductions and scans across GPUs with Dask.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="reduce and scan a large random array on a local cluster and verify it")
    d.add_argument("--size", type=float, default=2**25, help="elements (default 2^25)")
    d.add_argument("--chunk", type=float, default=2**22, help="elements per chunk (default 2^22)")
    d.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    d.add_argument("--workers", type=int, default=None, help="workers (default: one per GPU, or 2 CPU workers)")
    d.add_argument("--backend", default="auto", choices=["auto", "gpu", "cpu"])
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=demo)
    i = sub.add_parser("info", help="versions, GPUs, kernel cache location")
    i.set_defaults(func=info)
    args = parser.parse_args(argv)
    if getattr(args, "size", 1) < 1 or getattr(args, "chunk", 1) < 1 or math.isnan(getattr(args, "size", 1)):
        parser.error("--size and --chunk must be positive")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
