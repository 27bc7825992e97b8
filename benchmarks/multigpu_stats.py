"""argmax, var and exact sums and scans across GPUs: multireduce vs dask.array on a LocalCUDACluster (one
worker per GPU), on
persisted float32 data (or, with ``--cpu``, a CPU LocalCluster with NumPy chunks and tiny sizes, to check
the script anywhere).

    python -m benchmarks multigpu-stats                 # every GPU, 8 GiB per GPU, chunks of 2^26
    python -m benchmarks multigpu-stats --gpus 1,4 --per-gpu-gib 8 --chunk-log2 26,28 --repeats 5
    python -m benchmarks multigpu-stats --cpu           # a smoke run on the CPU

Times are wall-clock from the client call until the value is on the client, median of repeats after
one warm-up; a repetition starts only after the scheduler has released the previous result's keys.
argmax must equal dask's (both give the first occurrence); var must be within 1e-5 of a float64
reference; the exact sum must be the float32 nearest a float64 sum (within one float32 ulp: the float64
sum is itself rounded) and the exact cumsum's last element the exact sum's bits. The exact rows
(``exact=True``) sit beside the plain ones, so each has its cost in the same run. Writes $OUT/bench_multigpu_stats.{md,json} (and docs/ on a GPU run).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks import harness as h
from benchmarks.multigpu import ROOT, float32_sizes, place


def _measure(client, x, args):
    import dask.array as da

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
    exact_sum = {}

    def check(op, name):
        def ok(got):
            value = h.last_element(got) if op == "cumsum" else h.host(got).item()
            if op == "argmax":
                return int(value) == truth["argmax"]
            if op == "var":
                return abs(float(value) - truth["var"]) <= 1e-5 * truth["var"]
            # a float32 sum: within a float32 ulp of the float64 sum (2^26+ terms: plain sums too)
            ulp = float(np.spacing(np.float32(abs(truth["sum"]))))
            right = abs(float(value) - truth["sum"]) <= (ulp if "exact" in name else 1e-4 * abs(truth["sum"]) + ulp)
            if name == "mr.sum(exact=True).compute()":
                exact_sum["bits"] = np.float32(value).tobytes()
            elif name == "mr.cumsum(exact=True).persist()":  # its last element is the exact sum
                right = right and np.float32(value).tobytes() == exact_sum.get("bits")
            return right
        return ok

    # a row named "....compute()" calls the result's own method (for mr.var of held chunks: no task, the
    # direct path); "....persist()" keeps the scan on the workers, its last element read after the timing;
    # the others hand the graph to the client
    how = {".compute()": "compute", ".persist()": "persist"}
    return [h.time_case(client, h.Case("stats", name, op, h.Step(client, how.get(name[-10:], "client.compute"), make),
                                       x.nbytes, check(op, name)), args.repeats, args.timeout_s, stream=False)
            for op, name, make in impls]


def main(argv=None):
    import distributed

    p = h.parser("multigpu-stats", __doc__)
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster with NumPy chunks, tiny sizes")
    p.add_argument("--gpus", default="", help="worker counts, e.g. 1,4 (default: every GPU)")
    p.add_argument("--per-gpu-gib", default="8")
    p.add_argument("--chunk-log2", default="26", help="chunk elements, as powers of two")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=60)
    p.add_argument("--exact", action="store_true", help="also exact=True sum and cumsum beside the plain ones")
    args = p.parse_args(argv)
    setting = h.setting(args.cpu)
    if args.cpu:
        args.gpus, args.per_gpu_gib, args.chunk_log2 = args.gpus or "1,2", "0.01", "18"
    args.gpus = args.gpus or str(setting.available)
    rows, started = [], time.time()
    for n_workers in [int(g) for g in args.gpus.split(",") if 0 < int(g) <= setting.available]:
        with setting.cluster(n_workers) as cluster, distributed.Client(cluster) as client:
            for gib, log2, chunk, n in float32_sizes(args, n_workers):
                x, _ = place(client, setting, ((chunk,) * (n // chunk),), "dask")
                for row in _measure(client, x, args):
                    row.update(workers=n_workers, gib_per_worker=gib, chunk_log2=log2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del x
                setting.free(client)
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": setting.device,
           "seconds": round(time.time() - started, 1), "args": vars(args)}
    out_dirs = ([] if args.cpu else [ROOT / "docs"]) + [Path(os.environ.get("OUT") or "/tmp")]
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
    lines = []

    def ratio(r, impl_of):
        same = [q for q in rows if q["op"] == r["op"] and impl_of(q["impl"])
                and all(q[k] == r[k] for k in ("workers", "gib_per_worker", "chunk_log2"))]
        return same[0]["ms"] / r["ms"] if same and r["ms"] == r["ms"] else float("nan")

    for r in rows:
        speed = ratio(r, lambda impl: impl.startswith("dask.array"))
        plain = ratio(r, lambda impl: "exact" in r["impl"] and impl == r["impl"].replace("exact=True", ""))
        lines.append((r["workers"], f"{r['gib_per_worker']:g}", f"2^{r['chunk_log2']}", r["op"], r["impl"],
                      f"{r['ms']:.2f}", f"{r['gbps']:.1f}", f"{speed:.2f}", f"{plain:.2f}", r["ok"], r["note"]))
    return h.md_table(("workers", "GiB/worker", "chunk", "op", "impl", "ms", "GB/s", "x dask", "x plain", "ok", "note"),
                      lines).rstrip("\n")

