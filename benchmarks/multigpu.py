"""multireduce vs dask.array on a LocalCUDACluster (or, with ``--cpu``, a CPU LocalCluster with NumPy
chunks, tiny sizes, to check the script anywhere), side by side in one run, for 1, 2, 4 workers.

    python benchmarks/multigpu.py --quick          # every GPU present, then one: <= 240 s on 4 x H200 (budget 170 s)
    python benchmarks/multigpu.py [--gpus 1,2,4] [--per-gpu-gib 8,32] [--chunk-log2 26,28] [--repeats 5]
    python benchmarks/multigpu.py --cpu            # a smoke run on the CPU
    python benchmarks/multigpu.py --profile [--cpu] # where a lazy sum's time goes, vs dask.array.sum

Data: float32, generated on the workers (random, never zeros) and persisted twice: with Dask's own
placement and contiguous (worker w holds the w-th run of chunks). Times are wall-clock from the client
call until the result (sum: a scalar on the client; cumsum: the output persisted on the workers),
median of repeats after one warm-up; a repetition starts only after the scheduler has released the
previous result's keys. Beside each row, one extra repetition's task stream: tasks, transfers (count,
bytes, from the workers' transfer logs) and the wall time outside any task. ``--budget-s`` (``--quick``:
170 s) starts no new configuration past that time; those left out are listed in the JSON. Writes
docs/bench_multigpu_latest.{md,json} (and $OUT). ``--profile`` splits a lazy sum's time into phases
next to dask.array.sum's and weighs the eager path's ``client.run`` against ``client.submit``.
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


def wait_idle(client, futures, timeout: float) -> bool:
    """Cancel ``futures`` (a timed-out row's) and wait until the scheduler has no task left to run
    (queued tasks count: ``client.processing()`` shows only those already sent to a worker); False past
    ``timeout``."""
    if futures:
        client.cancel(list(futures), force=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        pending = client.run_on_scheduler(lambda dask_scheduler: sum(
            ts.state in ("processing", "queued", "waiting", "no-worker") for ts in dask_scheduler.tasks.values()))
        if not pending:
            return True
        time.sleep(0.05)
    return False


def _clear_transfer_log(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _transferred(dask_worker):
    return [(str(k), n) for entry in dask_worker.transfer_incoming_log for k, n in entry["keys"].items()]


def breakdown(stream, wall: float, moved) -> dict:
    """Tasks, transfers (count and bytes, from the workers' incoming-transfer logs; the largest key
    moved) and the time outside any task, from a task stream."""
    computes = []
    for t in stream:
        for ss in t.get("startstops", ()):
            if ss["action"] == "compute":
                computes.append((ss["start"], ss["stop"]))
    covered, end = 0.0, None
    for start, stop in sorted(computes):
        if end is None or start > end:
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    largest = max(moved, key=lambda kn: kn[1], default=("", 0))
    return dict(tasks=len(stream), transfers=len(moved), transfer_bytes=int(sum(n for _, n in moved)),
                largest_transfer=f"{largest[0][:40]} ({largest[1]} B)" if moved else "",
                outside_tasks_ms=max(wall - covered, 0.0) * 1e3)


def float32_sizes(args, n_workers: int):
    """(GiB per worker, log2 of the chunk, chunk, n) for each --per-gpu-gib x --chunk-log2 pair: n float32
    elements, a whole number of chunks, skipped where not one chunk fits."""
    for gib in [float(g) for g in args.per_gpu_gib.split(",")]:
        for log2 in [int(c) for c in args.chunk_log2.split(",")]:
            chunk = 2**log2
            n = int(gib * n_workers * 2**30 // 4) // chunk * chunk
            if n:
                yield gib, log2, chunk, n


def persist_placed(client, make, n_chunks: int, chunk: int, meta, kind: str):
    """The benchmark's data, generated where it will stay: with ``kind == "dask"``, Dask's own placement
    of ``map_blocks(...).persist()``; with ``"contiguous"``, worker w generates the w-th run of chunks.
    Returns (array, the number of runs of consecutive chunks on one worker).

    Contiguous placement used to persist ``x.blocks[lo:hi]`` on each worker and then persist their
    concatenation: that made a second set of keys (aliases of the first, placed by the scheduler),
    and on the GPUs those rows took seconds per repetition. Worker annotations on the generating
    layer (kept by persisting without optimisation) make each chunk on its worker, once, under the
    array's only name."""
    import dask
    import dask.array as da
    import distributed

    from multireduce import placement

    workers = sorted(client.scheduler_info()["workers"])
    name = f"bench-{kind}-{n_chunks}x{chunk}"
    chunks = ((chunk,) * n_chunks,)
    if kind == "lazy":  # not persisted: every computation generates the chunks again
        return da.map_blocks(make, 7, chunks=chunks, dtype=np.float32, meta=meta, name=name), 0
    if kind == "contiguous":
        def where(key):
            return [workers[key[1] * len(workers) // n_chunks]] if isinstance(key, tuple) else None

        with dask.annotate(workers=where, allow_other_workers=True):
            lazy = da.map_blocks(make, 7, chunks=chunks, dtype=np.float32, meta=meta, name=name)
        x = client.persist(lazy, optimize_graph=False)
    else:
        x = client.persist(da.map_blocks(make, 7, chunks=chunks, dtype=np.float32, meta=meta, name=name))
    distributed.wait(x)
    holder = placement.holders(x, client)
    if holder is None:
        erred = [f for f in distributed.futures_of(x) if f.status != "finished"]
        raise RuntimeError(f"{len(erred)} of {n_chunks} chunks not in memory after persist"
                           + (f": {erred[0].exception()!r}" if erred and erred[0].status == "error" else ""))
    keys = placement.chunk_keys(x)
    runs = sum(1 for i, k in enumerate(keys) if i == 0 or holder[k] != holder[keys[i - 1]])
    return x, runs


def submit_sum(client, x, split_every: int = 16):
    """The eager sum through ``client.submit`` (one task per worker, restricted to it, taking its chunk
    futures) and a gather, folded on the client: the alternative to ``client.run`` that the direct paths were weighed against."""
    from multireduce import graph, placement
    from multireduce.api import _resolve_reduction
    from multireduce.operators import get_operator

    plan = _resolve_reduction("dask", get_operator("sum"), x.dtype, x.ndim, None, None, False, split_every, "auto",
                              False, None, "bench")[0][0]
    holder = placement.holders(x, client)
    keys = placement.chunk_keys(x)
    futures_of = x.__dask_graph__()
    groups = placement.by_worker(holder, True)(keys)
    futures = [client.submit(graph._chunk_partials, plan, *(futures_of[k] for k in group),
                             workers=[holder[group[0]]], allow_other_workers=True, pure=False) for group in groups]
    position = {k: i for i, k in enumerate(keys)}
    ordered = [None] * len(keys)
    for group, partials in zip(groups, client.gather(futures)):
        for k, p in zip(group, partials):
            ordered[position[k]] = p
    return graph.fold_in_order(plan, split_every, ordered)


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
            x, _ = persist_placed(client, make_block, n_chunks, chunk, meta, "dask")
            for name, make in [("dask.array.sum", lambda: da.sum(x)), ("mr.sum", lambda: mr.sum(x))]:
                p = profile_phases(client, make, args.repeats)
                cells = " | ".join(f"{v:.0f}" if k.startswith("n_") else f"{v:.2f}" for k, v in p.items())
                print(f"| {n_workers} | {n_chunks} | {name} | {cells} |", flush=True)
            for name, fn in [("mr.sum(compute=True) [client.run]", lambda: mr.sum(x, compute=True)),
                             ("eager via client.submit", lambda: submit_sum(client, x))]:
                assert np.asarray(fn()).tobytes() == np.asarray(mr.sum(x, compute=True)).tobytes()
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                print(f"| {n_workers} | {n_chunks} | {name} | {statistics.median(times) * 1e3:.2f} "
                      f"(best {min(times) * 1e3:.2f}) |" + " |" * 13, flush=True)
            del x


def main(argv=None):
    import dask.array as da
    import distributed

    import multireduce as mr

    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster with NumPy chunks, tiny sizes")
    p.add_argument("--quick", action="store_true", help="the preset: every GPU present, then one; <= 240 s on 4 x H200")
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--per-gpu-gib", default="8,32")
    p.add_argument("--chunk-log2", default="26,28", help="chunk elements, as powers of two")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dask-cumsum-max-gib", type=float, default=8, help="skip dask's cumsum above this per GPU")
    p.add_argument("--dask-cumsum-methods", default="sequential,blelloch")
    p.add_argument("--timeout-s", type=float, default=60, help="a row that takes longer is reported as timed out")
    p.add_argument("--placements", default="dask,contiguous", help="dask, contiguous and/or lazy (not persisted)")
    p.add_argument("--budget-s", type=float, default=0, help="start no new configuration after this many seconds")
    p.add_argument("--profile", action="store_true", help="the lazy sum's phases vs dask.array.sum (4 workers)")
    args = p.parse_args(argv)
    if args.profile:
        args.gpus = "4"
        args.chunk_log2 = "10" if args.cpu else args.chunk_log2
    if args.quick:
        # 4 GPUs first: the targets are there, and the budget cuts what comes last
        args.gpus, args.per_gpu_gib, args.chunk_log2, args.repeats = "all,1", "8,32", "26,28", 3
        args.timeout_s, args.budget_s = 10, args.budget_s or 170
        # blelloch never finished in 10 s on CuPy chunks in any GPU run, and its cancelled tasks kept the
        # workers busy so that every row after it timed out. Asked for by name only.
        args.dask_cumsum_methods = "sequential"
    if args.cpu and not args.profile:  # blelloch timed out here too (60 s on 40 chunks of 1 MB): not in the smoke run
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
    rows, skipped = [], []
    started = time.time()
    counts = [n_avail if g == "all" else int(g) for g in args.gpus.split(",")]
    for n_gpus in [g for i, g in enumerate(counts) if g <= n_avail and g not in counts[:i]]:
        if args.budget_s and time.time() - started > args.budget_s:
            skipped.append(f"{n_gpus} workers")
            continue
        with cluster_for(n_gpus) as cluster, distributed.Client(cluster) as client:
            for gib, log2, chunk, n in float32_sizes(args, n_gpus):
                for placement_kind in args.placements.split(","):
                    if placement_kind == "contiguous" and n_gpus == 1:
                        continue  # one worker: the same as Dask's placement
                    if args.budget_s and time.time() - started > args.budget_s:
                        skipped.append(f"{n_gpus} x {gib:g} GiB, 2^{log2}, {placement_kind}")
                        continue
                    try:
                        x, runs = persist_placed(client, make, n // chunk, chunk, meta, placement_kind)
                    except Exception as exc:  # noqa: BLE001 - one configuration's failure is reported, not fatal
                        print(f"placing {n_gpus} x {gib:g} GiB, 2^{log2}, {placement_kind} failed: {exc!r}", flush=True)
                        skipped.append(f"{n_gpus} x {gib:g} GiB, 2^{log2}, {placement_kind}: {exc!r}"[:200])
                        continue
                    rows.extend(_measure(client, x, n, n_gpus, gib, log2, placement_kind, runs, args))
                    wait_released(client, [x.name])
                    del x
                    if not args.cpu:
                        client.run(lambda: __import__("cupy").get_default_memory_pool().free_all_blocks())
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "workers": n_avail, "device": device,
           "seconds": round(time.time() - started, 1), "args": vars(args), "skipped_for_budget": skipped}
    _write(rows, env, out_dirs)


def _measure(client, x, n, n_gpus, gib, log2, placement_kind, runs, args):
    import dask.array as da
    import distributed

    import multireduce as mr

    nbytes = n * 4
    lazy_input = placement_kind == "lazy"
    ref = float(client.compute(mr.sum(x, dtype=np.float64)).result())
    mass = n * 0.25  # E|U(-0.5, 0.5)| * n
    tol = np.finfo(np.float32).eps * (n / 1024 + 64) * mass

    def computed(make):
        def run():
            lazy = make()
            run.names = [lazy.name]
            future = client.compute(lazy)
            run.futures = [future]  # before it runs: a timed-out run's tasks are cancelled
            value = future.result()
            # a future kept past its run holds the result's key: the next repetition of the same graph
            # would be served from memory (no task ran) and the key never released
            run.futures = []
            return value
        return run

    def persisted(make):
        def run():
            lazy = make()
            run.names = [lazy.name]
            y = client.persist(lazy)
            run.futures = distributed.futures_of(y)
            distributed.wait(y)
            run.futures = []
            return _last_element(y) if getattr(run, "check", False) else None
        return run

    def eager():
        eager.names = []
        return mr.sum(x, compute=True)

    def method_compute():  # what a notebook writes: the result's own .compute()
        lazy = mr.sum(x)
        method_compute.names = [lazy.name]
        return lazy.compute()

    def method_persist():  # the result's own .persist()
        y = mr.cumsum(x).persist()
        method_persist.names = [y.name]
        method_persist.futures = distributed.futures_of(y)
        distributed.wait(y)
        method_persist.futures = []
        return _last_element(y) if getattr(method_persist, "check", False) else None

    impls = [("dask.array.sum", "sum", computed(lambda: da.sum(x)), nbytes),
             ("mr.sum().compute()", "sum", method_compute, nbytes),
             ("client.compute(mr.sum())", "sum", computed(lambda: mr.sum(x)), nbytes),
             ("mr.sum(compute=True)", "sum", eager, nbytes),
             ("mr.cumsum().persist()", "cumsum", method_persist, 2 * nbytes),
             ("client.persist(mr.cumsum())", "cumsum", persisted(lambda: mr.cumsum(x)), 2 * nbytes)]
    if lazy_input:  # the same graph feeds both sides: what each adds on top of generating the data
        impls = [i for i in impls if i[0] in ("dask.array.sum", "mr.sum().compute()", "mr.cumsum().persist()")]
    if gib <= args.dask_cumsum_max_gib:
        for method in filter(None, args.dask_cumsum_methods.split(",")):
            impls.append((f"da.cumsum[{method}]", "cumsum", persisted(lambda m=method: da.cumsum(x, method=m)),
                          2 * nbytes))
    rows = []
    for name, op, fn, moved in impls:
        row = dict(gpus=n_gpus, gib_per_gpu=gib, chunk_log2=log2, placement=placement_kind, runs=runs, impl=name, op=op)
        try:
            times, value = [], None
            for i in range(args.repeats + 1):
                t0 = time.perf_counter()
                value = _bounded(fn, args.timeout_s)
                if i:
                    times.append(time.perf_counter() - t0)
                wait_released(client, fn.names)
            client.run(_clear_transfer_log)
            with distributed.get_task_stream(client) as stream:
                t0 = time.perf_counter()
                _bounded(fn, args.timeout_s)
                wall = time.perf_counter() - t0
            incoming = [kn for per_worker in client.run(_transferred).values() for kn in per_worker]
            wait_released(client, fn.names)
            if op == "cumsum":  # one more run, untimed, whose last element is read: the scan's total
                fn.check = True
                value = _bounded(fn, args.timeout_s)
                fn.check = False
                wait_released(client, fn.names)
            seconds = statistics.median(times)
            ok = bool(abs(float(value) - ref) <= tol)
            row.update(ms=seconds * 1e3, gbps=moved / seconds / 1e9, ok=ok, note="",
                       **breakdown(stream.data, wall, incoming))
        except TimeoutError:
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=f"timed out after {args.timeout_s:g} s")
            # its tasks still run or wait on the workers: cancelled, and the next rows start once none is left
            if not wait_idle(client, getattr(fn, "futures", []), timeout=max(120.0, 10 * args.timeout_s)):
                row["note"] += "; the workers stayed busy"
            if name.startswith("da.cumsum["):  # its tasks still run: not tried again in this run
                method = name[len("da.cumsum["):-1]
                args.dask_cumsum_methods = ",".join(m for m in args.dask_cumsum_methods.split(",") if m != method)
        except Exception as exc:  # out of memory etc.: reported, not fatal
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _last_element(y) -> float:
    """The last element of a persisted 1-d result, on the client as a float."""
    value = y[-1].compute()
    return float(value.get() if hasattr(value, "get") else value)


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
    """The table: each row's speed against dask's row of the same configuration (sums: dask.array.sum;
    scans: da.cumsum sequential and blelloch, where they ran), and its task-stream breakdown."""
    lines = ["| workers | GiB/worker | chunk | placement (runs) | impl | ms | GB/s | x dask | x blelloch | tasks | "
             "transfers (bytes) | outside tasks ms | ok | note |", "|" + "---|" * 14]

    def speed(r, impl):
        same = [q for q in rows if q["impl"] == impl
                and all(q[k] == r[k] for k in ("gpus", "gib_per_gpu", "chunk_log2", "placement"))]
        return same[0]["ms"] / r["ms"] if same and r["ms"] == r["ms"] else float("nan")

    for r in rows:
        base = speed(r, "dask.array.sum" if r["op"] == "sum" else "da.cumsum[sequential]")
        blelloch = speed(r, "da.cumsum[blelloch]") if r["op"] == "cumsum" else float("nan")
        lines.append(f"| {r['gpus']} | {r['gib_per_gpu']:g} | 2^{r['chunk_log2']} | "
                     f"{r['placement']} ({r.get('runs', '?')}) "
                     f"| {r['impl']} | {r['ms']:.2f} | {r['gbps']:.1f} | {base:.2f} | {blelloch:.2f} | "
                     f"{r.get('tasks', '')} | {r.get('transfers', '')} ({r.get('transfer_bytes', '')}) | "
                     f"{r.get('outside_tasks_ms', float('nan')):.1f} | "
                     f"{r['ok']} | {r['note']} |")
    table = "\n".join(lines)
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "bench_multigpu_latest.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        (d / "bench_multigpu_latest.md").write_text(f"{json.dumps(env)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
