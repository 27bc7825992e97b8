"""Soak test: N client processes each send M mixed reductions and scans to one cluster; every result is
checked against NumPy, worker memory (RSS; on GPUs also the CuPy pool and the driver's free memory) is
sampled after a warm-up and at the end and must stay flat, and small-request throughput is reported next to
dask.array.sum on the same requests.

    python benchmarks/soak.py                              # 4 clients x 500 requests, 1 KB .. 1 GB, GPUs
    python benchmarks/soak.py --cpu --clients 2 --requests 20 --max-bytes 1e6
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", "bool"]
OPS = ["sum", "min", "max", "mean", "cumsum"]


def _sample():
    """On a worker: its RSS and, where CuPy is in use, the pool's bytes and the driver's used bytes."""
    import psutil

    out = {"rss": psutil.Process().memory_info().rss}
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        free, total = cupy.cuda.runtime.memGetInfo()
        out["pool"] = cupy.get_default_memory_pool().used_bytes()
        out["gpu_used"] = total - free
    return out


def _data(rng, dtype, n):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        hi = min(int(info.max), 100) + 1  # small values: sums of 1 GB of int8 stay exact in int64 references
        return rng.integers(max(int(info.min), -100), hi, n).astype(dt)
    x = rng.standard_normal(n) + (1j * rng.standard_normal(n) if dt.kind == "c" else 0)
    return x.astype(dt)


def _check(op, got, host):
    dt = host.dtype
    ref_t = np.complex128 if dt.kind == "c" else np.float64
    if op == "cumsum":
        ref = np.cumsum(host.astype(ref_t))
    elif op == "mean":
        ref = host.astype(ref_t).mean()
    else:
        ref = getattr(np, op)(host.astype(ref_t)) if op == "sum" else getattr(np, op)(host)
    got = np.asarray(got)
    if op == "cumsum" and dt.kind in "iub":
        assert np.array_equal(got.astype(np.int64), ref.astype(np.int64)), (op, dt)
        return
    if dt.kind in "iub" and op != "mean":
        assert np.array_equal(np.asarray(got, dtype=ref.dtype), ref), (op, dt, got, ref)
        return
    eps = {2: 1e-2, 4: 1e-5, 8: 1e-12}.get(dt.itemsize if dt.kind != "c" else dt.itemsize // 2, 1e-5)
    scale = np.sqrt(host.size) * eps * max(1.0, float(np.abs(host).max(initial=0)))
    assert np.allclose(got.astype(ref.dtype), ref, rtol=eps * 10, atol=scale * 10), (op, dt)


def _client_main(address, index, n_requests, min_bytes, max_bytes, gpu, seed, queue):
    import dask.array as da
    from distributed import Client

    import multireduce as mr

    rng = np.random.default_rng(seed + index)
    done = 0
    try:
        with Client(address, timeout=60) as client:
            for _ in range(n_requests):
                # complex data runs on the CPU backend only (dtypes.GPU_DTYPES): CuPy chunks get the others
                kinds = [d for d in DTYPES if not (gpu and np.dtype(d).kind == "c")]
                dtype = kinds[rng.integers(len(kinds))]
                op = OPS[rng.integers(len(OPS))]
                if np.dtype(dtype).kind == "b" and op in ("cumsum", "mean"):
                    op = "sum"
                if np.dtype(dtype).kind == "c" and op in ("min", "max"):
                    op = "sum"
                nbytes = int(np.exp(rng.uniform(np.log(min_bytes), np.log(max_bytes))))
                n = max(nbytes // np.dtype(dtype).itemsize, 1) + int(rng.integers(0, 3))
                host = _data(rng, dtype, n)
                x = da.from_array(host, chunks=max(n // int(rng.integers(1, 9)), 1))
                if gpu:
                    import cupy

                    x = x.map_blocks(cupy.asarray, dtype=x.dtype)
                if rng.random() < 0.5:
                    x = client.persist(x)
                result = getattr(mr, op)(x)
                got = client.compute(result).result()
                if gpu and hasattr(got, "get"):
                    got = got.get()
                _check(op, got, host)
                done += 1
                del x, result, got
        queue.put((index, done, None))
    except BaseException as exc:  # the parent reports which client failed and why
        queue.put((index, done, f"{type(exc).__name__}: {exc}"))


def _throughput(client, gpu, n=200):
    import dask.array as da

    import multireduce as mr

    rng = np.random.default_rng(1)
    host = rng.standard_normal(128).astype(np.float64)  # 1 KB
    x = da.from_array(host, chunks=64)
    if gpu:
        import cupy

        x = x.map_blocks(cupy.asarray, dtype=x.dtype)
    x = client.persist(x)
    out = {}
    for name, fn in (("multireduce.sum", mr.sum), ("dask.array.sum", lambda a: a.sum())):
        client.compute(fn(x)).result()
        t0 = time.perf_counter()
        for _ in range(n):
            client.compute(fn(x)).result()
        out[name] = n / (time.perf_counter() - t0)
    return out


def run(clients=4, requests=500, min_bytes=1024, max_bytes=1e9, cpu=False, seed=0, rss_tol=256 * 2**20,
        gpu_tol=64 * 2**20, warmup=5, throughput_requests=200) -> dict:
    from distributed import Client

    from multireduce.cluster import local_cluster

    gpu = not cpu
    with local_cluster(gpu=gpu) as cluster, Client(cluster) as client:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        # warm-up: imports, kernels, pools reach their working size before the baseline sample
        w = ctx.Process(target=_client_main, args=(cluster.scheduler_address, 999, warmup, min_bytes,
                                                    min(max_bytes, 1e6), gpu, seed, q))
        w.start(); w.join(); q.get(timeout=5)
        client.run(lambda: __import__("gc").collect())
        before = client.run(_sample)
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_client_main, args=(cluster.scheduler_address, i, requests, min_bytes,
                                                         max_bytes, gpu, seed, q)) for i in range(clients)]
        for p in procs:
            p.start()
        reports = [q.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - t0
        client.run(lambda: __import__("gc").collect())
        after = client.run(_sample)
        tput = _throughput(client, gpu, throughput_requests)
    errors = [r for r in reports if r[2]]
    growth = {w: {k: after[w][k] - before[w][k] for k in before[w]} for w in before}
    tol = {"rss": rss_tol, "pool": gpu_tol, "gpu_used": gpu_tol}
    leaks = {w: {k: v for k, v in g.items() if v > tol[k]} for w, g in growth.items()}
    leaks = {w: g for w, g in leaks.items() if g}
    return {"clients": clients, "requests": requests, "done": sum(r[1] for r in reports), "errors": errors,
            "seconds": elapsed, "growth_bytes": growth, "tolerance_bytes": tol, "leaks": leaks,
            "small_request_per_s": tput, "ok": not errors and not leaks}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--min-bytes", type=float, default=1024)
    p.add_argument("--max-bytes", type=float, default=1e9)
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster instead of LocalCUDACluster")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-tol-mb", type=float, default=256, help="allowed RSS growth per worker")
    p.add_argument("--gpu-tol-mb", type=float, default=64, help="allowed CuPy pool / driver growth per worker")
    a = p.parse_args(argv)
    if a.clients < 1 or a.requests < 1 or not 1 <= a.min_bytes <= a.max_bytes:
        p.error(f"need --clients >= 1, --requests >= 1, 1 <= --min-bytes <= --max-bytes; got {vars(a)}")
    out = run(a.clients, a.requests, int(a.min_bytes), int(a.max_bytes), a.cpu, a.seed,
              int(a.rss_tol_mb * 2**20), int(a.gpu_tol_mb * 2**20))
    print(json.dumps(out, indent=1, default=str))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
