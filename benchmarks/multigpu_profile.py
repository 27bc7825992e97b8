"""The multigpu suite's profiles (``python -m benchmarks multigpu --profile [phases | held | groupby | axes]``).

``phases``: a lazy sum over held chunks split into phases (build, optimize, submit, to the first task,
tasks, transfers, the window of tasks, gather) next to dask.array.sum's, at 16 and 32 chunks per worker;
then the eager sum's ``client.run`` against ``client.submit`` (one task per worker) and a gather.

``held``: where the time of the direct paths over held chunks goes: ``mr.sum(x).compute()`` and
``mr.cumsum(x).persist()`` on a persisted array, phase by phase, beside Dask's own per-task floor (a trivial
``map_blocks(...).persist()`` over the same chunks) and the GPUs' own time for the same work done inside
one ``client.run`` (no tasks at all). Per phase: median ms over repeats. For persisted results, from the
task stream: tasks, the median compute time of a task, the median gap between consecutive tasks on one
worker (the worker idle while the scheduler hands it the next task) and the time from the persist call's
return to the first task. ``--cprofile`` adds cProfile of the eager sum on the client, and of
``values_of_held`` on the busiest worker.

``groupby``: the field of ``--paths axes`` (time x lat x lon, Dask's placement) grouped by month (mean)
and by day (max, persisted), each method ("cohorts", "map-reduce"): the wall time and, from the task
stream, per task prefix the tasks, their compute time summed and the transfers into them (count,
seconds); per worker the compute time summed, the span from its first task's start to its last task's
end and, from its transfer log, what came in (count, MB, seconds); beside one ``client.run`` that
computes every held chunk's partial where it is (no task).

``axes``: the same field's mean over time, float32 (the chunk-ordered fold of float32 partials) and float64
(summed per worker where the sums are exact in any order): the lazy result's making timed, then each
``.compute()`` split into the direct call to the workers (``client.run``: the workers' work, their replies
and the transfer to the client), the busiest worker's own work inside it, and the client's own time
(planning, combining, the result on its GPU).

``tall``: ``mr.sum(m, axis=1).persist()`` of the tall matrix of ``--paths axes`` (``--tall-cols`` columns,
x's bytes, Dask's placement), every size of ``--chunk-log2``, from the call to every output key in memory,
split into the direct call to the workers (each reduces and keeps its chunks' row sums), the busiest
worker's own work inside it, the scheduler's registration of the outputs as data (``update_data``), the
lineage graph's registration (``client.persist`` of one task per output, the client's part) and the wait
for the keys; beside the same call with outputs registered as data only (no lineage: what lineage costs)
and ``da.sum(m, axis=1).persist()``.

``expr``: whole reductions and statistics of a held 1-D float32 array and of expressions over it
(``sum(x * 2)``, ``argmax(abs(x))``, ``var(x + 1)``), Dask's placement, the first size and chunk of
``--per-gpu-gib``/``--chunk-log2``, split as ``axes``.
"""

from __future__ import annotations

import functools
import statistics
import time

import numpy as np

from benchmarks import harness as h
from benchmarks.multigpu import place


def main(args, setting: h.Setting):
    import distributed

    from benchmarks.multigpu import worker_counts

    n_workers = worker_counts(args.gpus, 4 if setting.cpu else setting.available)[-1]
    with setting.cluster(n_workers) as cluster, distributed.Client(cluster) as client:
        return {"phases": phases, "held": held, "groupby": groupby, "axes": axes,
                "expr": expressions, "tall": tall}[args.profile](args, setting, client, n_workers)


# ------------------------------------------------------------------------------------------------
# phases
# ------------------------------------------------------------------------------------------------
PHASES = ("total", "build", "optimize", "submit", "to_first_task", "tasks", "n_tasks", "transfers", "n_transfers",
          "window", "gather")
PHASE_HEADER = ("workers", "chunks", "impl", "total", "build", "optimize", "submit", "to first task", "tasks",
                "task count", "transfers", "transfer count", "window", "gather")


def submit_sum(client, x, split_every: int = 16):
    """The eager sum through ``client.submit`` (one task per worker, restricted to it, taking its chunk
    futures) and a gather, folded on the client: the alternative to ``client.run`` that the direct paths
    were weighed against."""
    from multireduce import graph, placement
    from multireduce.api import _resolve_reduction
    from multireduce.operators import get_operator

    plan = _resolve_reduction("dask", get_operator("sum"), x.dtype, x.ndim, None, None, False, split_every, "auto",
                              False, None, "bench")[0][0]
    holder = placement.holders(x, client)
    keys = placement.chunk_keys(x)
    futures_of = x.__dask_graph__()
    groups = placement.by_worker(holder, True)(keys)
    position = {k: i for i, k in enumerate(keys)}
    futures = [client.submit(graph._chunk_partials, plan, split_every, len(keys), [position[k] for k in group],
                             *(futures_of[k] for k in group), workers=[holder[group[0]]], allow_other_workers=True,
                             pure=False) for group in groups]
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

    for _ in range(3):  # warm-up, each after the previous one's keys are gone (else its gather can race them)
        lazy = make()
        client.compute(lazy).result()
        h.wait_released(client, [lazy.name])
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
        h.wait_released(client, [lazy.name])
    return {k: statistics.median(r[k] for r in rows) * (1 if k.startswith("n_") else 1e3) for k in PHASES}


def phase_cells(workers: int, chunks: int, impl: str, found: dict) -> list:
    """A row of the phases table; a call timed whole (``found`` with "total" and "best" alone) leaves the
    phase cells empty."""
    if set(found) == {"total", "best"}:
        return [workers, chunks, impl, f"{found['total']:.2f} (best {found['best']:.2f})"] + [""] * (len(PHASES) - 1)
    return [workers, chunks, impl] + [f"{found[k]:.0f}" if k.startswith("n_") else f"{found[k]:.2f}" for k in PHASES]


def phases(args, setting: h.Setting, client, n_workers: int) -> list:
    """``--profile phases``: the lazy sum's phases next to dask.array.sum's, printed as a table."""
    import dask.array as da

    import multireduce as mr

    chunk = 2 ** int(str(args.chunk_log2).split(",")[0])
    print(h.md_table(PHASE_HEADER, []), end="", flush=True)
    rows = []
    for n_chunks in (16 * n_workers, 32 * n_workers):
        x, _ = place(client, setting, ((chunk,) * n_chunks,), "dask")
        found = [(name, profile_phases(client, make, args.repeats))
                 for name, make in [("dask.array.sum", lambda: da.sum(x)), ("mr.sum", lambda: mr.sum(x))]]
        for name, fn in [("mr.sum(compute=True) [client.run]", lambda: mr.sum(x, compute=True)),
                         ("eager via client.submit", lambda: submit_sum(client, x))]:
            assert np.asarray(fn()).tobytes() == np.asarray(mr.sum(x, compute=True)).tobytes()
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            found.append((name, {"total": statistics.median(times) * 1e3, "best": min(times) * 1e3}))
        for name, f in found:
            rows.append(phase_cells(n_workers, n_chunks, name, f))
            print(h.md_table(PHASE_HEADER, rows[-1:]).splitlines()[-1], flush=True)
        del x
    return rows


# ------------------------------------------------------------------------------------------------
# held
# ------------------------------------------------------------------------------------------------
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
    from multireduce import direct

    walls = []

    def once():
        t0 = time.perf_counter()
        held = [k for k in keys if k in dask_worker.data]
        direct.values_here(plan.partial, held, [dask_worker.data[k] for k in held])
        walls.append((time.perf_counter() - t0) * 1e3)

    text = h.cprofiled(once, calls, "tottime", 22)
    return statistics.median(walls), text


def _cprofiled(client, x, keys, plan, calls: int = 10) -> None:
    import multireduce as mr

    text = h.cprofiled(lambda: mr.sum(x, compute=True), calls, "cumulative", 30)
    print(f"## client: cProfile of {calls} x mr.sum(x, compute=True) (main thread)\n{text}", flush=True)
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


def held(args, setting: h.Setting, client, n_workers: int) -> dict:
    """``--profile held``: three tables: the pieces of the eager paths, each worker's own GPU time, and the
    persisted results' task streams. Returns them as lists of rows."""
    import dask
    import distributed

    import multireduce as mr
    from multireduce import direct, placement
    from multireduce.api import _resolve_reduction, _resolve_scan
    from multireduce.operators import get_operator

    gib, log2 = float(str(args.per_gpu_gib).split(",")[0]), int(str(args.chunk_log2).split(",")[0])
    chunk = 2**log2
    n_chunks = max(1, int(gib * n_workers * 2**30 // 4) // chunk)
    x, layout = place(client, setting, ((chunk,) * n_chunks,), args.placements[0])
    keys = placement.chunk_keys(x)
    plan = _resolve_reduction("dask", get_operator("sum"), x.dtype, 1, None, None, False, 16, "auto", False,
                              None, "profile")[0][0]
    scan_plan = _resolve_scan("dask", get_operator("sum"), x.dtype, 1, None, None, True, "auto", 16, None,
                              "profile")[0]
    print(f"{n_workers} workers, {n_chunks} chunks of 2^{log2} float32, {n_chunks * chunk * 4 / 2**30:.1f} GiB, "
          f"{layout.placement} placement, chunks per worker {layout.per_worker}\n", flush=True)
    tables = {"pieces": [], "workers": [], "results": []}

    def timed(name, fn, reps=args.repeats):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        tables["pieces"].append((name, f"{statistics.median(times) * 1e3:.2f}"))

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
    print(h.md_table(("piece", "median ms"), tables["pieces"]), flush=True)

    on_worker = client.run(_on_worker, plan, scan_plan, keys)
    columns = list(next(iter(on_worker.values())))
    tables["workers"] = [[w] + [d[k] if k == "chunks" else f"{d[k] * 1e3:.2f}" for k in columns]
                         for w, d in on_worker.items()]
    print(h.md_table(["worker"] + [k if k == "chunks" else f"{k} ms" for k in columns], tables["workers"]), flush=True)
    if args.cprofile:
        _cprofiled(client, x, keys, plan)

    tables["scan phases"] = _scan_phases(client, x, args.repeats)
    print(h.md_table(("mr.cumsum(x).persist(), phase", "median ms"), tables["scan phases"]), flush=True)

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
            h.wait_released(client, names)
        walls, calls, stats = walls[1:], calls[1:], stats[1:]
        s = {k: statistics.median(d[k] for d in stats) for k in stats[0]}
        tables["results"].append((name, f"{statistics.median(walls) * 1e3:.2f}", f"{statistics.median(calls) * 1e3:.2f}",
                                  f"{s['tasks']:.0f}", f"{s['task_ms']:.2f}", f"{s['gap_ms']:.2f}",
                                  f"{s['to_first_ms']:.2f}"))
    print(h.md_table(("result", "ms", "call returns after ms", "tasks", "task ms", "gap ms", "to first task ms"),
                     tables["results"]), flush=True)
    return tables


def _clocked(spent: dict, label, fn):
    """``fn``, adding the seconds each call of it takes to ``spent[label]``."""
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
    return wrapper


def _scan_phases(client, x, repeats: int) -> list:
    """The held scan (``direct.scan_persisted``) split into its phases by timing the functions it calls:
    the chunks' totals (one ``client.run``), the scans kept on the workers (the second), the outputs
    registered with their recipes (``_register_with_lineage``: a persist of one task per output, none of
    which runs), and the rest (the carries folded on the client, ``update_data``, futures)."""
    import multireduce as mr
    from multireduce import direct

    spent: dict = {}
    clocked = functools.partial(_clocked, spent)

    real_run, real_values, real_register = direct._run, direct.held_values, direct._register_with_lineage

    def run_labelled(client_, workers, fn, *a):
        label = "scans kept on the workers (client.run)" if fn is direct.scan_and_keep else None
        return clocked(label, real_run)(client_, workers, fn, *a) if label else real_run(client_, workers, fn, *a)

    rows: dict = {}
    direct._run, direct.held_values = run_labelled, clocked("chunk totals (client.run)", real_values)
    direct._register_with_lineage = clocked("outputs registered with recipes (a persist)", real_register)
    try:
        for rep in range(repeats + 1):
            spent.clear()
            t0 = time.perf_counter()
            y = mr.cumsum(x).persist()
            total = time.perf_counter() - t0
            if rep:
                rest = total - sum(spent.values())
                for label, v in [*spent.items(), ("the rest (carries, update_data, futures)", rest), ("whole call", total)]:
                    rows.setdefault(label, []).append(v)
            names = [y.name]
            del y
            h.wait_released(client, names)
    finally:
        direct._run, direct.held_values, direct._register_with_lineage = real_run, real_values, real_register
    return [(label, f"{statistics.median(v) * 1e3:.2f}") for label, v in rows.items()]


# ------------------------------------------------------------------------------------------------
# groupby
# ------------------------------------------------------------------------------------------------
def _stream_by_prefix(stream) -> tuple[list, list]:
    """Task-stream rows per key prefix (tasks, compute s, transfers, MB, transfer s) and per worker
    (tasks, compute s, span s)."""
    from dask.utils import key_split

    prefixes: dict = {}
    workers: dict = {}
    for t in stream:
        row = prefixes.setdefault(key_split(t["key"]), [0, 0.0, 0, 0.0, 0.0])
        row[0] += 1
        w = workers.setdefault(t["worker"], [0, 0.0, float("inf"), float("-inf")])
        for ss in t["startstops"]:
            if ss["action"] == "compute":
                row[1] += ss["stop"] - ss["start"]
                w[0] += 1
                w[1] += ss["stop"] - ss["start"]
                w[2], w[3] = min(w[2], ss["start"]), max(w[3], ss["stop"])
            elif ss["action"] == "transfer":
                row[2] += 1
                row[4] += ss["stop"] - ss["start"]
    return ([(k, v[0], f"{v[1] * 1e3:.1f}", v[2], f"{v[4] * 1e3:.1f}") for k, v in prefixes.items()],
            [(k, v[0], f"{v[1] * 1e3:.1f}", f"{(v[3] - v[2]) * 1e3:.1f}") for k, v in sorted(workers.items())])


def _incoming_since(since: float, dask_worker=None) -> tuple:
    """This worker's transfers in since ``since`` (wall clock): (count, bytes, seconds summed)."""
    log = [e for e in dask_worker.transfer_incoming_log if e["start"] >= since]
    return len(log), sum(e["total"] for e in log), sum(e["duration"] for e in log)


def _partials_here(plan, codes_of, keys, dask_worker=None):
    """Every chunk's group-by partial computed where it is held, synchronized: (chunks, seconds)."""
    from multireduce.groupby import Grouped

    held = [k for k in keys if k in dask_worker.data]
    _sync_all()
    t0 = time.perf_counter()
    for k in held:
        plan.partial(Grouped(dask_worker.data[k], codes_of[k]))
    _sync_all()
    return len(held), time.perf_counter() - t0


def _field(args, setting: h.Setting, client, n_workers: int):
    """(the field of ``--paths axes`` persisted with Dask's placement, its time steps, its chunks)."""
    lat, lon = args.field_shape
    steps = int(args.field_gib * n_workers * 2**30 // (lat * lon * 4))
    per = min(args.field_chunk_steps, steps)
    chunks = ((per,) * (steps // per) + ((steps % per,) if steps % per else ()), (lat,), (lon,))
    f, layout = place(client, setting, chunks, "dask", seed=3)
    print(f"field {steps} x {lat} x {lon} float32 ({f.nbytes / 1e9:.1f} GB) in {len(chunks[0])} chunks, "
          f"chunks per worker {layout.per_worker}", flush=True)
    return f, steps, chunks


def groupby(args, setting: h.Setting, client, n_workers: int) -> dict:
    """``--profile groupby``: see the module docstring."""
    import distributed

    import multireduce as mr
    from multireduce import groupby as gb
    from multireduce import placement

    from benchmarks.multigpu import month_of_hour

    f, steps, chunks = _field(args, setting, client, n_workers)
    month, day = month_of_hour(steps), np.arange(steps) // 24
    tables: dict = {"walls": [], "prefixes": [], "workers": []}
    keys = placement.chunk_keys(f)
    bounds = np.cumsum((0,) + chunks[0])
    for labels, func, name in ((month, "mean", "by month"), (day, "max", "by day")):
        codes = gb.factorize(labels, steps, None, "profile")[0]
        plan = gb.GroupByPlan(func, 0, int(codes.max()) + 1, np.dtype(np.float64 if func == "mean" else np.float32),
                              np.dtype(np.float32))
        codes_of = {k: codes[bounds[i]:bounds[i + 1]] for i, k in enumerate(keys)}
        client.run(_partials_here, plan, codes_of, keys)  # the first call loads the kernels on every worker
        here = client.run(_partials_here, plan, codes_of, keys)
        busiest = max(here.values(), key=lambda v: v[1])
        tables["walls"].append((name, "every chunk's partial where it is held (client.run), busiest worker",
                                f"{busiest[1] * 1e3:.1f}", f"{busiest[0]} chunks"))
        for method in ("cohorts", "map-reduce"):
            how = "persist" if func == "max" else "compute"
            walls = []
            for rep in range(args.repeats + 1):
                result = mr.groupby_reduce(f, labels, func, axis=0, method=method)[0]
                with distributed.get_task_stream(client) as ts:
                    since = time.time()
                    t0 = time.perf_counter()
                    out = result.persist() if how == "persist" else result.compute()
                    if how == "persist":
                        distributed.wait(out)
                    walls.append(time.perf_counter() - t0)
                moved = client.run(_incoming_since, since)
                names = [result.name] + ([out.name] if how == "persist" else [])
                del out, result
                h.wait_released(client, names)
            label = f"{name}: groupby_reduce(f, ..., {func!r}, method={method!r}).{how}()"
            tables["walls"].append((name, label, f"{statistics.median(walls[1:]) * 1e3:.1f}",
                                    f"first {walls[0] * 1e3:.0f}"))
            by_prefix, by_worker = _stream_by_prefix(ts.data)  # the last repetition's
            tables["prefixes"] += [(label, *row) for row in by_prefix]
            tables["workers"] += [(label, *row, moved[row[0]][0], f"{moved[row[0]][1] / 1e6:.0f}",
                                   f"{moved[row[0]][2] * 1e3:.1f}") for row in by_worker]
    print(h.md_table(("grouping", "what", "ms (median)", "note"), tables["walls"]), flush=True)
    print(h.md_table(("call", "task prefix", "tasks", "compute ms (sum)", "transfers in", "transfer ms (sum)"),
                     tables["prefixes"]), flush=True)
    print(h.md_table(("call", "worker", "tasks", "compute ms (sum)", "span ms", "transfers in", "MB in",
                      "transfer ms (sum)"), tables["workers"]), flush=True)
    return tables


# ------------------------------------------------------------------------------------------------
# axes
# ------------------------------------------------------------------------------------------------
_TIMED = ("_totals_here", "values_here")  # the workers' share of the direct paths over some axes


def _time_worker_work(names=_TIMED, dask_worker=None):
    """Wraps ``names`` of multireduce.direct in this worker (once) with a log of their durations; clears it."""
    from multireduce import direct

    for name in names:
        fn = getattr(direct, name)
        if not hasattr(fn, "log"):
            def timed(*args, _real=fn, **kwargs):
                start = time.perf_counter()
                try:
                    return _real(*args, **kwargs)
                finally:
                    timed_log.append(time.perf_counter() - start)

            timed_log: list = []
            timed.log = timed_log
            setattr(direct, name, timed)
        getattr(direct, name).log.clear()


def _worker_work_log(names=_TIMED, dask_worker=None) -> float:
    from multireduce import direct

    return sum(sum(getattr(direct, name).log) for name in names)


def _split_calls(client, calls, repeats: int, cprofile: bool = False) -> list:
    """Each (label, make) of ``calls``: ``make()`` (the lazy result, as a notebook's line makes it) timed,
    then its ``.compute()`` timed whole and split into the direct calls to the workers (``direct._run``),
    the busiest worker's own work inside them and the client's own time;
    median ms over ``repeats`` after a warm-up, each repetition after the previous result's keys left.
    ``cprofile``: then three more calls under cProfile (the client's main thread, by own time)."""
    from multireduce import direct

    runs: list = []
    real_run = direct._run

    def timed_run(*a, **k):
        start = time.perf_counter()
        try:
            return real_run(*a, **k)
        finally:
            runs.append(time.perf_counter() - start)

    rows = []
    direct._run = timed_run
    try:
        for label, make in calls:
            cells = []
            for rep in range(repeats + 1):
                client.run(_time_worker_work)
                runs.clear()
                direct.last_decline = None
                made = time.perf_counter()
                result = make()
                start = time.perf_counter()
                result.compute()
                wall = time.perf_counter() - start
                work = max(client.run(_worker_work_log).values())
                cells.append((wall, sum(runs), work, start - made, len(runs)))
                names = [result.name]
                del result
                h.wait_released(client, names)  # the next repetition may not reuse this one's keys
            med = [statistics.median(c[i] for c in cells[1:]) for i in range(4)]
            rows.append((label, f"{med[3] * 1e3:.2f}", f"{med[0] * 1e3:.1f}", f"{med[1] * 1e3:.1f}",
                         f"{med[2] * 1e3:.1f}", f"{(med[0] - med[1]) * 1e3:.1f}", str(cells[-1][4]),
                         direct.last_decline or "-"))
            print(h.md_table(HEADER_AXES, rows[-1:]).splitlines()[-1], flush=True)
            if cprofile:
                print(f"## client: cProfile of 3 x {label}.compute() (main thread)\n{_cprofiled_calls(client, make)}",
                      flush=True)
    finally:
        direct._run = real_run
    print(h.md_table(HEADER_AXES, rows), flush=True)
    return rows


def _cprofiled_calls(client, make, calls: int = 3) -> str:
    """cProfile (the client's main thread, by own time) of ``calls`` x ``make().compute()``, each after the
    previous result's keys left the scheduler (the wait is not profiled)."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    for _ in range(calls):
        result = make()
        profile.enable()
        result.compute()
        profile.disable()
        names = [result.name]
        del result
        h.wait_released(client, names)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def axes(args, setting: h.Setting, client, n_workers: int) -> dict:
    """``--profile axes``: see the module docstring."""
    import multireduce as mr

    f, steps, chunks = _field(args, setting, client, n_workers)
    rows = _split_calls(client, (
        ("mr.mean(f, axis=0)", lambda: mr.mean(f, axis=0)),
        ("mr.mean(f, axis=0, dtype=float64)", lambda: mr.mean(f, axis=0, dtype=np.float64))), args.repeats,
        args.cprofile)
    # the same call with the workers' replies pickled whole (every buffer inside the pickle), side by side
    client.run(_replies_out_of_band_from, 1 << 62)
    try:
        rows += _split_calls(client, (("mr.mean(f, axis=0, dtype=float64), replies pickled whole",
                                       lambda: mr.mean(f, axis=0, dtype=np.float64)),), args.repeats)
    finally:
        client.run(_replies_out_of_band_from, None)
    print(h.md_table(HEADER_AXES, rows), flush=True)
    return {"rows": rows}


def _replies_out_of_band_from(nbytes):
    """Sets this worker's ``direct.OUT_OF_BAND_BYTES`` (None: back to the default)."""
    from multireduce import direct

    default = getattr(direct, "_default_out_of_band", direct.OUT_OF_BAND_BYTES)
    direct._default_out_of_band = default
    direct.OUT_OF_BAND_BYTES = default if nbytes is None else nbytes


def expressions(args, setting: h.Setting, client, n_workers: int) -> dict:
    """``--profile expr``: see the module docstring."""
    import multireduce as mr
    from benchmarks.multigpu import float32_sizes

    (gib, log2, chunk, total), = list(float32_sizes(args, n_workers))[:1]
    x, layout = place(client, setting, ((chunk,) * (total // chunk),), "dask")
    print(f"x: {total} float32 in {total // chunk} chunks of 2^{log2}, chunks per worker {layout.per_worker}",
          flush=True)
    return {"rows": _split_calls(client, (
        ("mr.sum(x)", lambda: mr.sum(x)), ("mr.sum(x * 2)", lambda: mr.sum(x * 2)),
        ("mr.argmax(x)", lambda: mr.argmax(x)), ("mr.argmax(abs(x))", lambda: mr.argmax(abs(x))),
        ("mr.var(x + 1)", lambda: mr.var(x + 1))), args.repeats, args.cprofile)}


HEADER_AXES = ("call", "making the result ms", "wall ms", "direct calls ms", "busiest worker's work ms",
               "client's own ms", "direct calls", "declined")



# ------------------------------------------------------------------------------------------------
# tall
# ------------------------------------------------------------------------------------------------
HEADER_TALL = ("chunk", "chunks/worker", "call", "wall ms", "direct call ms", "busiest worker's work ms",
               "update_data ms", "lineage ms", "wait ms", "other client ms", "declined")


def _data_only(client, x, kept, name, work, sources=None, chunks=None):
    """``direct._register_with_lineage`` without the lineage: the outputs, registered as data by
    ``update_data``, as a persisted array of bare futures (what a scatter gives)."""
    import dask.array as da
    import distributed
    from dask.array.utils import meta_from_array
    from dask.highlevelgraph import HighLevelGraph

    futures = {k: distributed.Future(k, client) for per in work.values() for _, k, _ in per}
    chunks = x.chunks if chunks is None else chunks
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=kept.out_dtype)
    return da.Array(HighLevelGraph.from_collections(name, futures, dependencies=[]), name, chunks, meta=meta)


def tall(args, setting: h.Setting, client, n_workers: int) -> dict:
    """``--profile tall``: see the module docstring."""
    import dask.array as da
    import distributed

    import multireduce as mr
    from benchmarks.multigpu import SEED, float32_sizes
    from multireduce import direct

    clocks: dict = {}
    clocked = functools.partial(_clocked, clocks)

    real = {n: getattr(direct, n) for n in ("_run", "_keep_where_held", "_register_with_lineage")}
    rows = []
    for gib, log2, chunk, total in float32_sizes(args, n_workers):
        cols = args.tall_cols
        rows_per_chunk = max(chunk // cols, 1)
        n_chunks = max(total // cols // rows_per_chunk, 1)
        m, layout = place(client, setting, ((rows_per_chunk,) * n_chunks, (cols,)), "dask", seed=SEED + 1)
        ref64 = client.persist(m.astype(np.float64).sum(axis=1))
        tol = 4 * np.finfo(np.float32).eps * cols * cols
        for label, register in (("mr.sum(m, axis=1).persist()", real["_register_with_lineage"]),
                                ("the same, outputs registered as data only (no lineage)", _data_only),
                                ("da.sum(m, axis=1).persist()", None)):
            cells = []
            for rep in range(args.repeats + 1):
                client.run(_time_worker_work, ("_scans_here",))
                clocks.clear()
                direct.last_decline = None
                direct._run = clocked("run", real["_run"])
                direct._keep_where_held = clocked("keep", real["_keep_where_held"])
                direct._register_with_lineage = clocked("lineage", register or real["_register_with_lineage"])
                try:
                    start = time.perf_counter()
                    out = mr.sum(m, axis=1).persist() if register else da.sum(m, axis=1).persist()
                    returned = time.perf_counter()
                    distributed.wait(out)
                    wall = time.perf_counter() - start
                finally:
                    for n, fn in real.items():
                        setattr(direct, n, fn)
                work = max(client.run(_worker_work_log, ("_scans_here",)).values())
                if rep == 0:  # every row sum against float64's, on the workers
                    diff = h.to_float(da.max(abs(out.astype(np.float64) - ref64)).compute())
                    assert diff <= tol, f"{label}: off by {diff} (tolerance {tol})"
                run, keep, lineage = clocks.get("run", 0), clocks.get("keep", 0), clocks.get("lineage", 0)
                cells.append((wall, run, work, keep - run - lineage, lineage, wall - (returned - start),
                              (returned - start) - keep))
                names = [out.name]
                del out
                h.wait_released(client, names)
            med = [statistics.median(c[i] for c in cells[1:]) for i in range(7)]
            rows.append((f"{rows_per_chunk}x{cols}", str(layout.per_worker), label,
                         *(f"{v * 1e3:.1f}" for v in med), direct.last_decline or "-"))
            print(h.md_table(HEADER_TALL, rows[-1:]).splitlines()[-1], flush=True)
        names = [m.name, ref64.name]
        del m, ref64
        h.wait_released(client, names)
        setting.free(client)
    print(h.md_table(HEADER_TALL, rows), flush=True)
    return {"rows": rows}
