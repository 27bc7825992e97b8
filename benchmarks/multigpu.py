"""multireduce vs dask.array on a LocalCUDACluster, side by side in one run, for 1, 2, 4 GPUs.

    python benchmarks/multigpu.py [--gpus 1,2,4] [--per-gpu-gib 8,32] [--chunk-mib 256,1024] [--repeats 5]

Data: float32, generated on the workers' GPUs (random, never zeros) and persisted as CuPy chunks.
Times are wall-clock from the client call until the result (sum: a scalar on the client; cumsum: the
output persisted on the workers), median of repeats after one warm-up. GB/s = bytes that must move:
a sum reads the array once; a cumsum reads and writes it.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _make_block(seed, block_info=None):
    import cupy

    loc = block_info[None]["chunk-location"][0]
    rng = cupy.random.default_rng(seed + loc)
    return rng.random(block_info[None]["chunk-shape"], dtype=cupy.float32) - 0.5


def timed(fn, repeats):
    """Median seconds of ``fn()``; ``fn.settle()`` (if any) runs between repetitions, untimed."""
    settle = getattr(fn, "settle", lambda: None)
    fn()
    settle()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        settle()
    return statistics.median(times)


def main(argv=None):
    import cupy
    import dask.array as da
    import distributed

    import multireduce as mr
    from multireduce.cluster import gpu_count, local_cluster

    p = argparse.ArgumentParser()
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--per-gpu-gib", default="8,32")
    p.add_argument("--chunk-mib", default="256,1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dask-cumsum-max-gib", type=float, default=8, help="skip dask's cumsum above this per GPU")
    p.add_argument("--dask-cumsum-methods", default="sequential",
                   help="dask cumsum methods to compare (blelloch stalled for minutes on CuPy chunks, 2026-11-21)")
    args = p.parse_args(argv)
    out_dir = os.environ.get("OUT", ".")
    rows = []
    for n_gpus in [int(g) for g in args.gpus.split(",") if int(g) <= gpu_count()]:
        with local_cluster(n_workers=n_gpus, gpu=True) as cluster, distributed.Client(cluster) as client:
            for gib in [float(g) for g in args.per_gpu_gib.split(",")]:
                for chunk_mib in [int(c) for c in args.chunk_mib.split(",")]:
                    chunk = chunk_mib * 2**20 // 4
                    n = int(gib * n_gpus * 2**30 // 4) // chunk * chunk
                    x = da.map_blocks(_make_block, 7, chunks=((chunk,) * (n // chunk),), dtype=np.float32,
                                      meta=cupy.empty(0, dtype=cupy.float32))
                    x = client.persist(x)
                    distributed.wait(x)
                    nbytes = n * 4
                    ref = float(client.compute(mr.sum(x, dtype=np.float64)).result())
                    mass = n * 0.25  # E|U(-0.5, 0.5)| * n
                    results = {}

                    def check_sum(v):
                        return abs(float(v) - ref) <= np.finfo(np.float32).eps * (n / 1024 + 64) * mass

                    def run_sum(fn):
                        v = client.compute(fn(x)).result()
                        results.setdefault(fn.__name__, v)
                        return v

                    def mr_sum(a):
                        return mr.sum(a)

                    def dask_sum(a):
                        return da.sum(a)

                    def mr_sum_now():
                        v = mr.sum(x, compute=True)
                        results.setdefault("mr_sum_now", v)
                        return v

                    impls = [("multireduce.sum(compute=True)", "sum", mr_sum_now, nbytes),
                             ("multireduce.sum", "sum", lambda: run_sum(mr_sum), nbytes),
                             ("dask.array.sum", "sum", lambda: run_sum(dask_sum), nbytes)]

                    def persist_wait(make):
                        names = []

                        def run():
                            lazy = make()
                            names.append(lazy.name)
                            y = client.persist(lazy)
                            distributed.wait(y)
                            del y

                        def settle():
                            # the next repetition has the same keys: wait until the scheduler has
                            # forgotten these, or it would hand back the results still in memory
                            name = names.pop()
                            for _ in range(1000):
                                if not client.run_on_scheduler(
                                        lambda dask_scheduler: any(name in str(k) for k in dask_scheduler.tasks)):
                                    break
                                time.sleep(0.01)

                        run.settle = settle
                        return run

                    impls.append(("multireduce.cumsum", "cumsum", persist_wait(lambda: mr.cumsum(x)), 2 * nbytes))
                    if gib <= args.dask_cumsum_max_gib:
                        for method in args.dask_cumsum_methods.split(","):
                            impls.append((f"dask.cumsum[{method}]", "cumsum",
                                          persist_wait(lambda m=method: da.cumsum(x, method=m)), 2 * nbytes))
                    for name, op, fn, moved in impls:
                        try:
                            seconds = timed(fn, args.repeats)
                        except Exception as exc:  # out of memory etc.: reported, not fatal
                            rows.append(dict(gpus=n_gpus, gib_per_gpu=gib, chunk_mib=chunk_mib, impl=name, op=op,
                                             ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200]))
                            continue
                        ok = True
                        if op == "sum":
                            ok = bool(check_sum(results[{"multireduce.sum(compute=True)": "mr_sum_now",
                                                         "multireduce.sum": "mr_sum"}.get(name, "dask_sum")]))
                        rows.append(dict(gpus=n_gpus, gib_per_gpu=gib, chunk_mib=chunk_mib, impl=name, op=op,
                                         ms=seconds * 1e3, gbps=moved / seconds / 1e9, ok=ok, note=""))
                        print(json.dumps(rows[-1]), flush=True)
                    if True:  # correctness of the multi-GPU cumsum at a few positions
                        c = client.persist(mr.cumsum(x))
                        last = float(c[-1].compute())
                        rows[-1]["note"] += f" cumsum[-1]={last:.6g} ref={ref:.6g}"
                        del c
                    x = None  # release the chunks before the next size
                    client.run(lambda: cupy.get_default_memory_pool().free_all_blocks())
    env = {"date": time.strftime("%Y-%m-%d"), "devices": gpu_count(),
           "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    with open(os.path.join(out_dir, "bench_multigpu.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    # the short table
    lines = ["| GPUs | GiB/GPU | chunk MiB | impl | ms | GB/s | x dask | ok |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = [q for q in rows if q["gpus"] == r["gpus"] and q["gib_per_gpu"] == r["gib_per_gpu"]
                and q["chunk_mib"] == r["chunk_mib"]
                and q["impl"] == ("dask.array.sum" if r["op"] == "sum" else "dask.cumsum[sequential]")]
        speed = base[0]["ms"] / r["ms"] if base and r["ms"] == r["ms"] else float("nan")
        lines.append(f"| {r['gpus']} | {r['gib_per_gpu']:g} | {r['chunk_mib']} | {r['impl']} | {r['ms']:.2f} | "
                     f"{r['gbps']:.0f} | {speed:.1f} | {r['ok']} |")
    table = "\n".join(lines)
    with open(os.path.join(out_dir, "bench_multigpu.md"), "w") as f:
        f.write(f"{env}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
