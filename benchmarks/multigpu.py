"""multireduce vs dask.array on a LocalCUDACluster (or, with ``--cpu``, a CPU LocalCluster with NumPy
chunks, tiny sizes, to check the script anywhere), side by side in one run, for 1, 2, 4 workers.

    python benchmarks/multigpu.py --quick          # the lead's 4 x H200 run, <= 6 minutes
    python benchmarks/multigpu.py [--gpus 1,2,4] [--per-gpu-gib 8,32] [--chunk-log2 26,28] [--repeats 5]
    python benchmarks/multigpu.py --cpu            # a smoke run on the CPU
    python benchmarks/multigpu.py --profile [--cpu] # where a lazy sum's time goes, vs dask.array.sum

Data: float32, generated on the workers (random, never zeros) and persisted twice: with Dask's own
placement and contiguous (worker w holds the w-th run of chunks). Times are wall-clock from the client
call until the result (sum: a scalar on the client; cumsum: the output persisted on the workers),
median of repeats after one warm-up; a repetition starts only after the scheduler has released the
previous result's keys. Beside each row, one extra repetition's task stream: tasks, transfers (count,
bytes) and the wall time outside any task. Writes docs/bench_multigpu_latest.{md,json} (and $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _make_block(seed, block_info=None):
    loc = block_info[None]["chunk-location"][0]
    shape = block_info[None]["chunk-shape"]
    try:
        import cupy

        return cupy.random.default_rng(seed + loc).random(shape, dtype=cupy.float32) - 0.5
    except ImportError:
        return np.random.default_rng(seed + loc).random(shape, dtype=np.float32) - 0.5


def _make_host_block(seed, block_info=None):
    loc = block_info[None]["chunk-location"][0]
    return np.random.default_rng(seed + loc).random(block_info[None]["chunk-shape"], dtype=np.float32) - 0.5


def wait_released(client, names, timeout=30.0):
    """Until the scheduler holds no key of ``names`` (so a repetition is not served from memory)."""
    names = [str(n) for n in names]
    deadline = time.time() + timeout
    while time.time() < deadline:
        held = client.run_on_scheduler(
            lambda dask_scheduler, names=names: any(any(n in str(k) for n in names) for k in dask_scheduler.tasks))
        if not held:
            return
        time.sleep(0.01)


def breakdown(stream, wall: float) -> dict:
    """Tasks, transfers and the time outside any task from a task stream."""
    computes, transfers, nbytes = [], 0, 0
    for t in stream:
        for ss in t.get("startstops", ()):
            if ss["action"] == "compute":
                computes.append((ss["start"], ss["stop"]))
            elif ss["action"] == "transfer":
                transfers += 1
        nbytes += t.get("nbytes", 0) if any(ss["action"] == "transfer" for ss in t.get("startstops", ())) else 0
    covered, end = 0.0, None
    for start, stop in sorted(computes):
        if end is None or start > end:
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return dict(tasks=len(stream), transfers=transfers, transfer_bytes=int(nbytes),
                outside_tasks_ms=max(wall - covered, 0.0) * 1e3)


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


def persist_placed(client, x, contiguous: bool):
    """``x`` persisted with Dask's placement, or contiguous runs of chunks per worker."""
    import dask.array as da
    import distributed

    if not contiguous:
        y = client.persist(x)
        distributed.wait(y)
        return y
    workers = sorted(client.scheduler_info()["workers"])
    n = x.numblocks[0]
    runs = [(w, n * i // len(workers), n * (i + 1) // len(workers)) for i, w in enumerate(workers)]
    parts = [client.persist(x.blocks[lo:hi], workers=[w]) for w, lo, hi in runs if hi > lo]
    y = client.persist(da.concatenate(parts))
    distributed.wait(y)
    return y


def profile_phases(client, make, repeats: int = 15) -> dict:
    """Median ms of each phase from ``make()`` (building the lazy sum) to its value on the client:
    build, optimize (Dask's optimisation of the graph, timed apart), submit (``client.compute`` until it
    returns: conversion, optimisation, sending the graph), to first task (the scheduler takes the graph
    and starts a task), tasks (summed compute time), transfers (count, summed time), the window from
    the first task's start to the last one's end, and gather (last task's end to the value on the
    client). Workers share this machine's clock (LocalCluster)."""
    import distributed
    from dask.core import flatten

    for _ in range(3):
        client.compute(make()).result()
    rows = []
    for _ in range(repeats):
        t0 = time.time()
        lazy = make()
        t1 = time.time()
        with distributed.get_task_stream(client) as ts:
            fut = client.compute(lazy)
            t2 = time.time()
            fut.result()
            t3 = time.time()
        del fut
        spans = [(ss["start"], ss["stop"], ss["action"]) for t in ts.data for ss in t["startstops"]]
        comp = [s for s in spans if s[2] == "compute"]
        xfer = [s for s in spans if s[2] == "transfer"]
        first, last = min(s[0] for s in comp), max(s[1] for s in comp)
        o0 = time.perf_counter()
        lazy.__dask_optimize__(lazy.__dask_graph__(), list(flatten(lazy.__dask_keys__())))
        rows.append(dict(total=t3 - t0, build=t1 - t0, optimize=time.perf_counter() - o0, submit=t2 - t1,
                         to_first_task=first - t2, tasks=sum(s[1] - s[0] for s in comp), n_tasks=len(ts.data),
                         transfers=sum(s[1] - s[0] for s in xfer), n_transfers=len(xfer), window=last - first,
                         gather=t3 - last))
        wait_released(client, [lazy.name])
    return {k: statistics.median(r[k] for r in rows) * (1 if k.startswith("n_") else 1e3) for k in rows[0]}


def profile_main(args, cluster_for, make_block, meta):
    """``--profile``: the lazy sum's phases next to dask.array.sum's on one cluster, printed as a table."""
    import dask.array as da
    import distributed

    import multireduce as mr

    n_workers = int(args.gpus.split(",")[-1])
    chunk = 2 ** int(args.chunk_log2.split(",")[0])
    with cluster_for(n_workers) as cluster, distributed.Client(cluster) as client:
        for n_chunks in (16 * n_workers, 32 * n_workers):
            lazy = da.map_blocks(make_block, 7, chunks=((chunk,) * n_chunks,), dtype=np.float32, meta=meta)
            x = persist_placed(client, lazy, False)
            for name, make in [("dask.array.sum", lambda: da.sum(x)), ("mr.sum", lambda: mr.sum(x))]:
                p = profile_phases(client, make, args.repeats)
                cells = " | ".join(f"{v:.0f}" if k.startswith("n_") else f"{v:.2f}" for k, v in p.items())
                print(f"| {n_workers} | {n_chunks} | {name} | {cells} |", flush=True)
            del x


def main(argv=None):
    import dask.array as da
    import distributed

    import multireduce as mr

    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster with NumPy chunks, tiny sizes")
    p.add_argument("--quick", action="store_true", help="the lead's preset: <= 6 minutes on 4 x H200")
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--per-gpu-gib", default="8,32")
    p.add_argument("--chunk-log2", default="26,28", help="chunk elements, as powers of two")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dask-cumsum-max-gib", type=float, default=8, help="skip dask's cumsum above this per GPU")
    p.add_argument("--dask-cumsum-methods", default="sequential,blelloch")
    p.add_argument("--timeout-s", type=float, default=60, help="a row that takes longer is reported as timed out")
    p.add_argument("--placements", default="dask,contiguous")
    p.add_argument("--profile", action="store_true", help="the lazy sum's phases vs dask.array.sum (4 workers)")
    args = p.parse_args(argv)
    if args.profile:
        args.gpus = "4"
        args.chunk_log2 = "10" if args.cpu else args.chunk_log2
    if args.quick:
        args.gpus, args.per_gpu_gib, args.chunk_log2, args.repeats = "1,4", "8,32", "26,28", 3
        args.timeout_s = 20
    if args.cpu and not args.profile:  # blelloch timed out here too (60 s on 40 chunks of 1 MB): left out of the smoke run
        args.gpus, args.per_gpu_gib, args.chunk_log2 = "1,2", "0.01", "18"
        args.repeats, args.dask_cumsum_methods = min(args.repeats, 3), "sequential"
    # a CPU smoke run never replaces the GPU table in docs/
    out_dirs = ([] if args.cpu else [ROOT / "docs"]) + [Path(os.environ.get("OUT", "/tmp"))]
    if args.cpu:
        n_avail = 2
        make = _make_host_block

        def cluster_for(n):
            return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, scheduler_port=0,
                                            dashboard_address="127.0.0.1:0", host="127.0.0.1")
        meta = np.empty(0, dtype=np.float32)
        device = "CPU (NumPy chunks)"
    else:
        import cupy

        from multireduce.cluster import gpu_count, local_cluster

        n_avail = gpu_count()
        make = _make_block

        def cluster_for(n):
            return local_cluster(n_workers=n, gpu=True)
        meta = cupy.empty(0, dtype=cupy.float32)
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    if args.profile:
        print("| workers | chunks | impl | total | build | optimize | submit | to first task | tasks | task count | "
              "transfers | transfer count | window | gather |\n|" + "---|" * 14)
        return profile_main(args, cluster_for, make, meta)
    rows = []
    started = time.time()
    for n_gpus in [int(g) for g in args.gpus.split(",") if int(g) <= n_avail]:
        with cluster_for(n_gpus) as cluster, distributed.Client(cluster) as client:
            for gib in [float(g) for g in args.per_gpu_gib.split(",")]:
                for log2 in [int(c) for c in args.chunk_log2.split(",")]:
                    chunk = 2**log2
                    n = int(gib * n_gpus * 2**30 // 4) // chunk * chunk
                    if n == 0:
                        continue
                    lazy = da.map_blocks(make, 7, chunks=((chunk,) * (n // chunk),), dtype=np.float32, meta=meta)
                    for placement_kind in args.placements.split(","):
                        x = persist_placed(client, lazy, placement_kind == "contiguous")
                        rows.extend(_measure(client, x, n, n_gpus, gib, log2, placement_kind, args))
                        del x
                        if not args.cpu:
                            client.run(lambda: __import__("cupy").get_default_memory_pool().free_all_blocks())
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "workers": n_avail, "device": device,
           "seconds": round(time.time() - started, 1), "args": vars(args)}
    _write(rows, env, out_dirs)


def _measure(client, x, n, n_gpus, gib, log2, placement_kind, args):
    import dask.array as da
    import distributed

    import multireduce as mr

    nbytes = n * 4
    ref = float(client.compute(mr.sum(x, dtype=np.float64)).result())
    mass = n * 0.25  # E|U(-0.5, 0.5)| * n
    tol = np.finfo(np.float32).eps * (n / 1024 + 64) * mass

    def computed(make):
        def run():
            lazy = make()
            value = client.compute(lazy).result()
            run.names = [lazy.name]
            return value
        return run

    def persisted(make):
        def run():
            lazy = make()
            y = client.persist(lazy)
            distributed.wait(y)
            run.names = [lazy.name]
            del y
        return run

    def eager():
        eager.names = []
        return mr.sum(x, compute=True)

    impls = [("dask.array.sum", "sum", computed(lambda: da.sum(x)), nbytes),
             ("mr.sum().compute()", "sum", computed(lambda: mr.sum(x)), nbytes),
             ("mr.sum(compute=True)", "sum", eager, nbytes),
             ("mr.cumsum().persist()", "cumsum", persisted(lambda: mr.cumsum(x)), 2 * nbytes)]
    if gib <= args.dask_cumsum_max_gib:
        for method in args.dask_cumsum_methods.split(","):
            impls.append((f"da.cumsum[{method}]", "cumsum", persisted(lambda m=method: da.cumsum(x, method=m)),
                          2 * nbytes))
    rows = []
    for name, op, fn, moved in impls:
        row = dict(gpus=n_gpus, gib_per_gpu=gib, chunk_log2=log2, placement=placement_kind, impl=name, op=op)
        try:
            times, value = [], None
            for i in range(args.repeats + 1):
                t0 = time.perf_counter()
                value = _bounded(fn, args.timeout_s)
                if i:
                    times.append(time.perf_counter() - t0)
                wait_released(client, fn.names)
            with distributed.get_task_stream(client) as stream:
                t0 = time.perf_counter()
                _bounded(fn, args.timeout_s)
                wall = time.perf_counter() - t0
            wait_released(client, fn.names)
            seconds = statistics.median(times)
            ok = True if op == "cumsum" else bool(abs(float(value) - ref) <= tol)
            row.update(ms=seconds * 1e3, gbps=moved / seconds / 1e9, ok=ok, note="",
                       **breakdown(stream.data, wall))
        except TimeoutError:
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=f"timed out after {args.timeout_s:g} s")
            if name.startswith("da.cumsum["):  # its tasks still run: not tried again in this run
                method = name[len("da.cumsum["):-1]
                args.dask_cumsum_methods = ",".join(m for m in args.dask_cumsum_methods.split(",") if m != method)
        except Exception as exc:  # out of memory etc.: reported, not fatal
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _bounded(fn, timeout_s):
    """``fn()`` in a thread; TimeoutError after ``timeout_s`` (the thread is left to finish)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _write(rows, env, out_dirs):
    lines = ["| workers | GiB/worker | chunk | placement | impl | ms | GB/s | x dask | tasks | transfers | "
             "outside tasks ms | ok | note |", "|" + "---|" * 13]
    for r in rows:
        base = [q for q in rows if all(q[k] == r[k] for k in ("gpus", "gib_per_gpu", "chunk_log2", "placement"))
                and q["impl"] == ("dask.array.sum" if r["op"] == "sum" else "da.cumsum[sequential]")]
        speed = base[0]["ms"] / r["ms"] if base and r["ms"] == r["ms"] else float("nan")
        lines.append(f"| {r['gpus']} | {r['gib_per_gpu']:g} | 2^{r['chunk_log2']} | {r['placement']} | {r['impl']} | "
                     f"{r['ms']:.2f} | {r['gbps']:.1f} | {speed:.2f} | {r.get('tasks', '')} | "
                     f"{r.get('transfers', '')} | {r.get('outside_tasks_ms', float('nan')):.1f} | {r['ok']} | "
                     f"{r['note']} |")
    table = "\n".join(lines)
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "bench_multigpu_latest.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        (d / "bench_multigpu_latest.md").write_text(f"{json.dumps(env)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
