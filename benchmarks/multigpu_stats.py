"""argmax, var and exact sums and scans across GPUs: multireduce vs dask.array on a LocalCUDACluster (one
worker per GPU), on
persisted float32 data (or, with ``--cpu``, a CPU LocalCluster with NumPy chunks and tiny sizes, to check
the script anywhere).

    python benchmarks/multigpu_stats.py                 # every GPU, 8 GiB per GPU, chunks of 2^26
    python benchmarks/multigpu_stats.py --gpus 1,4 --per-gpu-gib 8 --chunk-log2 26,28 --repeats 5
    python benchmarks/multigpu_stats.py --cpu           # a smoke run on the CPU

Times are wall-clock from the client call until the value is on the client, median of repeats after
one warm-up; a repetition starts only after the scheduler has released the previous result's keys.
argmax must equal dask's (both give the first occurrence); var must be within 1e-5 of a float64
reference; the exact sum must be the float32 nearest a float64 sum (within one float32 ulp: the float64
sum is itself rounded) and the exact cumsum's last element the exact sum's bits. The exact rows
(``exact=True``) sit beside the plain ones, so each has its cost in the same run. Writes $OUT/bench_multigpu_stats.{md,json} (and docs/ on a GPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))

from multigpu import _bounded, _make_block, _make_host_block, float32_sizes, persist_placed, wait_released  # noqa: E402


def _measure(client, x, args):
    import dask.array as da
    import distributed

    import multireduce as mr

    truth = {"argmax": int(client.compute(da.argmax(x)).result()),
             "var": float(client.compute(x.astype(np.float64).var()).result()),
             "sum": float(client.compute(x.astype(np.float64).sum()).result())}
    impls = [("argmax", "dask.array.argmax", lambda: da.argmax(x)),
             ("argmax", "mr.argmax().compute()", lambda: mr.argmax(x)),
             ("argmax", "client.compute(mr.argmax())", lambda: mr.argmax(x)),
             ("var", "dask.array.var", lambda: da.var(x)),
             ("var", "mr.var().compute()", lambda: mr.var(x)),
             ("var", "client.compute(mr.var())", lambda: mr.var(x))]
    if args.exact:
        impls += [("sum", "dask.array.sum", lambda: da.sum(x)),
                  ("sum", "mr.sum().compute()", lambda: mr.sum(x)),
                  ("sum", "mr.sum(exact=True).compute()", lambda: mr.sum(x, exact=True)),
                  ("cumsum", "mr.cumsum().persist()", lambda: mr.cumsum(x)),
                  ("cumsum", "mr.cumsum(exact=True).persist()", lambda: mr.cumsum(x, exact=True))]
    exact_sum = None
    rows = []
    for op, name, make in impls:
        row = dict(op=op, impl=name)
        try:
            times, value = [], None
            for i in range(args.repeats + 1):
                lazy = make()
                t0 = time.perf_counter()
                # a row named "....compute()" calls the result's own method (for mr.var of held chunks: no
                # task, the direct path); the others hand the graph to the client
                if name.endswith(".persist()"):  # the scan kept on the workers; its last element read after
                    def run(lazy=lazy):
                        held = lazy.persist()
                        distributed.wait(held)
                        return held
                elif name.endswith(".compute()"):
                    run = lazy.compute
                else:
                    def run(lazy=lazy):
                        return client.compute(lazy).result()
                value = _bounded(run, args.timeout_s)
                if i:  # the first is a warm-up (kernel compilation, imports on the workers)
                    times.append(time.perf_counter() - t0)
                keys = [lazy.name]
                if op == "cumsum":  # untimed: the last element, then the persisted result (held scans
                    # persist under a fresh name of their own) is let go and its keys waited on
                    keys.append(value.name)
                    value = value[-1].compute()
                del lazy
                wait_released(client, keys)
            value = value.item() if hasattr(value, "item") else value
            if op == "argmax":
                ok = int(value) == truth["argmax"]
            elif op == "var":
                ok = abs(float(value) - truth["var"]) <= 1e-5 * truth["var"]
            else:  # a float32 sum: within a float32 ulp of the float64 sum (2^26+ terms: plain sums too)
                ulp = float(np.spacing(np.float32(abs(truth["sum"]))))
                ok = abs(float(value) - truth["sum"]) <= (ulp if "exact" in name else 1e-4 * abs(truth["sum"]) + ulp)
                if name == "mr.sum(exact=True).compute()":
                    exact_sum = np.float32(value)
                elif name == "mr.cumsum(exact=True).persist()":  # its last element is the exact sum
                    ok = ok and exact_sum is not None and np.float32(value).tobytes() == exact_sum.tobytes()
            seconds = statistics.median(times)
            row.update(ms=seconds * 1e3, gbps=x.nbytes / seconds / 1e9, ok=bool(ok), note="")
        except TimeoutError:
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=f"timed out after {args.timeout_s:g} s")
        except Exception as exc:  # out of memory etc.: reported, not fatal
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200])
        rows.append(row)
    return rows


def main(argv=None):
    import dask.array as da
    import distributed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster with NumPy chunks, tiny sizes")
    p.add_argument("--gpus", default="", help="worker counts, e.g. 1,4 (default: every GPU)")
    p.add_argument("--per-gpu-gib", default="8")
    p.add_argument("--chunk-log2", default="26", help="chunk elements, as powers of two")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=60)
    p.add_argument("--exact", action="store_true", help="also exact=True sum and cumsum beside the plain ones")
    args = p.parse_args(argv)
    if args.cpu:
        n_avail, make, device = 2, _make_host_block, "CPU (NumPy chunks)"
        args.gpus, args.per_gpu_gib, args.chunk_log2 = args.gpus or "1,2", "0.01", "18"
        meta = np.empty(0, dtype=np.float32)

        def cluster_for(n):
            return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, scheduler_port=0,
                                            dashboard_address="127.0.0.1:0", host="127.0.0.1")
    else:
        import cupy

        from multireduce.cluster import gpu_count, local_cluster

        n_avail, make = gpu_count(), _make_block
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        meta = cupy.empty(0, dtype=cupy.float32)
        args.gpus = args.gpus or str(n_avail)

        def cluster_for(n):
            return local_cluster(n_workers=n, gpu=True)
    rows, started = [], time.time()
    for n_workers in [int(g) for g in args.gpus.split(",") if 0 < int(g) <= n_avail]:
        with cluster_for(n_workers) as cluster, distributed.Client(cluster) as client:
            for gib, log2, chunk, n in float32_sizes(args, n_workers):
                x, _runs = persist_placed(client, make, n // chunk, chunk, meta, "dask")
                for row in _measure(client, x, args):
                    row.update(workers=n_workers, gib_per_worker=gib, chunk_log2=log2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del x
                if not args.cpu:
                    client.run(lambda: __import__("cupy").get_default_memory_pool().free_all_blocks())
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": device, "seconds": round(time.time() - started, 1),
           "args": vars(args)}
    out_dirs = ([] if args.cpu else [ROOT / "docs"]) + [Path(os.environ.get("OUT", "/tmp"))]
    table = _table(rows)
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "bench_multigpu_stats.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        (d / "bench_multigpu_stats.md").write_text(f"{json.dumps(env)}\n\n{table}\n")
    print(table)
    return rows


def _table(rows):
    """Each row against dask.array's of the same op and configuration, and an exact row against its plain
    twin (the same call without ``exact=True``)."""
    lines = ["| workers | GiB/worker | chunk | op | impl | ms | GB/s | x dask | x plain | ok | note |",
             "|" + "---|" * 11]

    def ratio(r, impl_of):
        same = [q for q in rows if q["op"] == r["op"] and impl_of(q["impl"])
                and all(q[k] == r[k] for k in ("workers", "gib_per_worker", "chunk_log2"))]
        return same[0]["ms"] / r["ms"] if same and r["ms"] == r["ms"] else float("nan")

    for r in rows:
        speed = ratio(r, lambda impl: impl.startswith("dask.array"))
        plain = ratio(r, lambda impl: "exact" in r["impl"] and impl == r["impl"].replace("exact=True", ""))
        lines.append(f"| {r['workers']} | {r['gib_per_worker']:g} | 2^{r['chunk_log2']} | {r['op']} | {r['impl']} | "
                     f"{r['ms']:.2f} | {r['gbps']:.1f} | {speed:.2f} | {plain:.2f} | {r['ok']} | {r['note']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
