"""Where the time of the direct paths over held chunks goes (issue 12): ``mr.sum(x).compute()`` and
``mr.cumsum(x).persist()`` on a persisted array, phase by phase, beside Dask's own per-task floor (a
trivial ``map_blocks(...).persist()`` over the same chunks) and the GPUs' own time for the same work
done inside one ``client.run`` (no tasks at all).

    python benchmarks/profile_held.py [--cpu] [--workers N] [--gib-per-worker 8] [--chunk-log2 26] [--repeats 5]

Per phase: median ms over repeats. For persisted results, from the task stream: tasks, the median
compute time of a task, the median gap between consecutive tasks on one worker (the worker idle while
the scheduler hands it the next task) and the time from the persist call's return to the first task.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import dask
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from multigpu import _make_block, _make_host_block, wait_released  # noqa: E402


def _negate(block):
    return -block


def _sync_all():
    try:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    except ImportError:
        pass


def _values_of_held_profiled(plan, keys, calls, dask_worker=None):
    """``direct.values_of_held``'s work (``values_here``) as a direct run does it, ``calls`` times under
    cProfile on this worker: (median wall ms, the profile's top lines)."""
    import cProfile
    import io
    import pstats

    from multireduce import direct

    walls = []
    profile = cProfile.Profile()
    for _ in range(calls):
        t0 = time.perf_counter()
        profile.enable()
        held = [k for k in keys if k in dask_worker.data]
        direct.values_here(plan.partial, held, [dask_worker.data[k] for k in held])
        profile.disable()
        walls.append((time.perf_counter() - t0) * 1e3)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    return statistics.median(walls), text.getvalue()


def _cprofiled(client, x, keys, plan, calls: int = 10) -> None:
    import cProfile
    import io
    import pstats

    import multireduce as mr

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        mr.sum(x, compute=True)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(f"## client: cProfile of {calls} x mr.sum(x, compute=True) (main thread)\n{text.getvalue()}", flush=True)
    busiest = max(client.has_what().items(), key=lambda item: len(item[1]))[0]
    wall, lines = client.run(_values_of_held_profiled, plan, keys, calls, workers=[busiest])[busiest]
    print(f"## worker {busiest} (the busiest): values_of_held median {wall:.2f} ms\n{lines}", flush=True)


def _on_worker(plan, scan_plan, keys, dask_worker=None):
    """The GPU's own time for this worker's chunks: every partial launched then one sync; each
    partial brought to the host; every chunk scanned (no carry) then one sync."""
    from multireduce.graph import _host_partial

    blocks = [dask_worker.data[k] for k in keys if k in dask_worker.data]
    out = {}
    _sync_all()
    t0 = time.perf_counter()
    parts = [plan.partial(b) for b in blocks]
    out["partials launched (host)"] = time.perf_counter() - t0  # ~ the line below: the launches wait on the GPU
    _sync_all()
    out["partials, one sync"] = time.perf_counter() - t0
    del parts
    t0 = time.perf_counter()
    for b in blocks:
        plan.partial(b)
        _sync_all()
    out["partials, a sync each"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    parts = [b.sum() for b in blocks]  # CuPy's own reduction, for comparison
    _sync_all()
    out["cupy sum of each, one sync"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    [_host_partial(plan, b) for b in blocks]
    out["partials to host, each"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scans = [scan_plan.scan_block(b) for b in blocks]
    _sync_all()
    out["scans, one sync"] = time.perf_counter() - t0
    del parts, scans
    out["chunks"] = len(blocks)
    return out


def _stream_stats(stream, returned_at):
    by_worker: dict = {}
    for t in stream:
        for ss in t["startstops"]:
            if ss["action"] == "compute":
                by_worker.setdefault(t["worker"], []).append((ss["start"], ss["stop"]))
    durations, gaps, first = [], [], []
    for spans in by_worker.values():
        spans.sort()
        durations += [b - a for a, b in spans]
        gaps += [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
        first.append(spans[0][0] - returned_at)
    med = lambda v: statistics.median(v) * 1e3 if v else float("nan")  # noqa: E731
    return dict(tasks=len(stream), task_ms=med(durations), gap_ms=med(gaps), to_first_ms=med(first))


def main(argv=None):
    import dask.array as da
    import distributed

    import multireduce as mr
    from multireduce import direct, placement
    from multireduce.api import _resolve_reduction, _resolve_scan
    from multireduce.operators import get_operator

    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--workers", type=int, default=0, help="default: every GPU (CPU: 2)")
    p.add_argument("--gib-per-worker", type=float, default=8)
    p.add_argument("--chunk-log2", type=int, default=26)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cprofile", action="store_true",
                   help="also cProfile the eager sum: the client's side, and values_of_held on each worker")
    args = p.parse_args(argv)
    if args.cpu:
        n_workers = args.workers or 2
        args.gib_per_worker, args.chunk_log2 = min(args.gib_per_worker, 0.01), min(args.chunk_log2, 18)
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                           dashboard_address="127.0.0.1:0", host="127.0.0.1")
        make, meta = _make_host_block, np.empty(0, np.float32)
    else:
        import cupy

        from multireduce.cluster import gpu_count, local_cluster

        n_workers = args.workers or gpu_count()
        cluster = local_cluster(n_workers=n_workers, gpu=True)
        make, meta = _make_block, cupy.empty(0, np.float32)
    chunk = 2**args.chunk_log2
    n_chunks = max(1, int(args.gib_per_worker * n_workers * 2**30 // 4) // chunk)
    rows = []
    with cluster, distributed.Client(cluster) as client:
        x = client.persist(da.map_blocks(make, 7, chunks=((chunk,) * n_chunks,), dtype=np.float32, meta=meta))
        distributed.wait(x)
        keys = placement.chunk_keys(x)
        plan = _resolve_reduction("dask", get_operator("sum"), x.dtype, 1, None, None, False, 16, "auto", False,
                                  None, "profile")[0][0]
        scan_plan = _resolve_scan("dask", get_operator("sum"), x.dtype, 1, None, None, True, "auto", 16, None,
                                  "profile")[0]
        print(f"{n_workers} workers, {n_chunks} chunks of 2^{args.chunk_log2} float32, "
              f"{n_chunks * chunk * 4 / 2**30:.1f} GiB", flush=True)

        def timed(name, fn, reps=args.repeats):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            rows.append((name, statistics.median(times) * 1e3, ""))
            print(f"| {name} | {rows[-1][1]:.2f} |", flush=True)

        timed("placement.holders (who_has; the graph's grouping)", lambda: placement.holders(x, client))
        timed("held_values: each chunk's partial on the host", lambda: direct.held_values(x, keys, plan.partial))
        timed("mr.sum(x).compute()", lambda: mr.sum(x).compute())
        timed("mr.sum(x, compute=True)", lambda: mr.sum(x, compute=True))
        timed("held_values: each chunk's total on the host", lambda: direct.held_values(x, keys[:-1], scan_plan.totals))
        timed("client.run of a no-op", lambda: client.run(lambda: None))
        everyone = sorted(client.scheduler_info()["workers"])
        timed("a no-op sent to each worker directly (direct._call_each)",
              lambda: client.sync(direct._call_each, client, everyone, lambda: None))
        with dask.config.set({"multireduce.direct-to-workers": False}):
            timed("mr.sum(x, compute=True) through the scheduler's broadcast", lambda: mr.sum(x, compute=True))
        for w, d in client.run(_on_worker, plan, scan_plan, keys).items():
            cells = ", ".join(f"{k} {v * 1e3:.2f} ms" if k != "chunks" else f"{v} chunks" for k, v in d.items())
            print(f"worker {w}: {cells}", flush=True)
        if args.cprofile:
            _cprofiled(client, x, keys, plan)

        for name, make_result in [("mr.cumsum(x).persist()", lambda: mr.cumsum(x).persist()),
                                  ("client.persist(mr.cumsum(x))", lambda: client.persist(mr.cumsum(x))),
                                  ("x.map_blocks(negate).persist() (Dask's floor)",
                                   lambda: x.map_blocks(_negate, dtype=x.dtype).persist())]:
            stats, walls, calls = [], [], []
            for _ in range(args.repeats + 1):
                with distributed.get_task_stream(client) as ts:
                    t0 = time.perf_counter()
                    y = make_result()
                    returned = time.time()
                    t1 = time.perf_counter()
                    distributed.wait(y)
                    t2 = time.perf_counter()
                walls.append(t2 - t0)
                calls.append(t1 - t0)
                stats.append(_stream_stats(ts.data, returned))
                names = [y.name]
                del y
                wait_released(client, names)
            walls, calls, stats = walls[1:], calls[1:], stats[1:]
            s = {k: statistics.median(d[k] for d in stats) for k in stats[0]}
            print(f"| {name} | {statistics.median(walls) * 1e3:.2f} | call returns after "
                  f"{statistics.median(calls) * 1e3:.2f} | tasks {s['tasks']:.0f} | task {s['task_ms']:.2f} | "
                  f"gap {s['gap_ms']:.2f} | to first task {s['to_first_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
