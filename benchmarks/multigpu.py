"""multireduce vs dask.array across GPUs on a LocalCUDACluster, one worker per GPU (or, with ``--cpu``, a CPU
LocalCluster with NumPy chunks at tiny sizes, to check the suite anywhere), side by side in one run.

    python -m benchmarks multigpu                     # every path on every GPU, 8 GiB per GPU, chunks 2^24/2^26/2^28
    python -m benchmarks multigpu --paths expr,lazy --gpus 4 --repeats 3
    python -m benchmarks multigpu --quick             # the held rows, every GPU then one: <= 240 s on 4 x H200
    python -m benchmarks multigpu --scaling           # 1, 2, 4 (8...) GPUs x 8/24/32 GiB, Dask's and balanced placement
    python -m benchmarks multigpu --cpu [--paths ...] # a smoke run on the CPU
    python -m benchmarks multigpu --profile [phases]  # where a lazy sum's time goes, vs dask.array.sum
    python -m benchmarks multigpu --profile held [--cprofile]   # the held paths phase by phase
    python -m benchmarks multigpu --profile groupby   # the field's group-by, task by task
    python -m benchmarks multigpu --profile axes      # the field's mean over time, call by call
    python -m benchmarks multigpu --profile expr      # expressions over a held array, call by call

Data: float32 uniform in [-0.5, 0.5), generated on the workers and persisted (held): with Dask's own
placement, contiguous (worker w holds the w-th run of chunks) or balanced (``multireduce.persist(x,
balanced=True)`` where multireduce has it, else contiguous). Times are wall-clock from the client call
until the result (a value on the client, or a persisted result waited on), median of repeats after one
warm-up; a repetition starts only after the scheduler released the previous result's keys. Every value
is checked against a float64 reference computed by dask.array (sums and scans' last elements within the
float32 bound of the data's mass, var within its condition number times 1e-5, argmax and max exactly,
axis reductions element by element). Beside each row: one more repetition's task stream (tasks,
transfers and their bytes, wall time outside any task), the placement's runs of consecutive chunks and
the chunks each worker holds, and "x dask": the time of the dask.array row of the same computation
over this row's.

Paths (``--paths``, any of them; the new ones run on Dask's placement only):

- held: ``mr.sum(x).compute()``, ``client.compute(mr.sum(x))``, ``mr.sum(x, compute=True)``,
  ``mr.cumsum(x).persist()``, ``client.persist(mr.cumsum(x))`` vs ``dask.array.sum`` and ``da.cumsum``.
- expr: ``mr.sum(x * 2)``, ``mr.var(x + 1)``, ``mr.argmax(abs(x))`` (``.compute()``) and
  ``mr.cumsum(x * 2).persist()`` vs dask.array's same expressions (the sum and cumsum also with the steps
  left to CuPy: "unfused"), the held bare call, and ``x * 2`` alone:
  CUDA-event time of ``b * 2`` on each held chunk, summed per worker, the slowest worker's.
- axes: ``mr.mean(f, axis=0).compute()`` of a time x lat x lon field chunked along time (Dask's placement,
  and balanced where ``--placements`` names it; ``--field-gib``
  per GPU sets the time axis: 8760 x 721 x 1440 on 4 GPUs by default, 166 steps a chunk: 53 chunks) vs
  dask.array's; its monthly climatology (``mr.groupby_reduce(f, month, "mean", axis=0)``, the hours of a
  year by month) vs one dask.array mean per month of the selected steps (what xarray's group-by runs
  without flox); its daily maximum (the hours by day; no dask.array row: xarray's resample fails on CuPy
  data) and its total (``mr.sum(f)`` vs ``da.sum(f)``); and ``mr.sum(m, axis=1).persist()`` of a tall
  matrix (``--tall-cols`` columns, x's bytes and chunk bytes) vs ``dask.array``.
- lazy: ``lz`` made in the graph, not persisted: ``mr.sum(lz).compute()``, ``mr.cumsum(lz).persist()`` vs
  dask.array's, and the floor: one task per worker (``client.submit`` restricted to it) that makes and sums
  that worker's share of the chunks in a loop, the best any graph could do.
- graph: ``client.compute(mr.sum(x)).result()`` and ``dask.compute(mr.sum(x), mr.max(x))`` vs dask.array's,
  and the floor of any future: one trivial task submitted and its result fetched.
- memory: peak memory per worker during ``mr.sum(lz).compute()`` and ``da.sum(lz).compute()``: CuPy's pool
  (used, sampled every 5 ms; total, the pool's high-water mark), or RMM's peak of allocated bytes where CuPy
  allocates through RMM (counters pushed for the run), and the driver's bytes (NVML), above the worker's
  baseline (RSS on CPU workers); the ratio compares the allocator's peak where there is one.

``--scaling`` is a preset: worker counts 1, 2, 4, 8... up to every GPU (and every GPU itself), 8 / 24 /
32 GiB per GPU, chunks of 2^26, Dask's placement and balanced, the held sum, ``compute=True``, the held
cumsum and dask.array's rows; it writes bench_multigpu_scaling.{md,json}. ``--budget-s`` (``--quick``:
170 s) starts no new configuration past that time; those left out, and configurations that failed, are
listed in the JSON ("left_out"). A row that passes ``--timeout-s`` is reported as timed out and its tasks
are cancelled before the next row starts.

Writes bench_multigpu_latest.{md,json} (the full table, the memory table) to $OUT and, on GPUs, docs/;
prints each row as JSON when measured and a short table last. ``--profile phases`` splits a lazy sum's
time into phases next to dask.array.sum's and weighs the eager path's ``client.run`` against
``client.submit``; ``--profile held`` times the held paths piece by piece (benchmarks/multigpu_profile.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness as h

ROOT = Path(__file__).resolve().parent.parent
SEED = 7
F32_EPS = float(np.finfo(np.float32).eps)

PATHS = ("held", "expr", "axes", "lazy", "graph", "memory")
PLACEMENTS = ("dask", "contiguous", "balanced")
#: the rows of --scaling
SCALING_IMPLS = ("dask.array.sum", "mr.sum().compute()", "mr.sum(compute=True)", "mr.cumsum().persist()",
                 "da.cumsum[sequential]")

#: option -> value, layered: the defaults, then --quick, --scaling or --profile's, then --cpu's and --cpu's of
#: each of those; options given on the command line win
PRESETS = {
    "default": dict(gpus="all", per_gpu_gib="8", chunk_log2="24,26,28", repeats=5, timeout_s=60.0, budget_s=0.0,
                    placements="dask,contiguous", allocators="", protocols="tcp", paths=",".join(PATHS), dask_cumsum_max_gib=8.0,
                    dask_cumsum_methods="sequential", field_gib=8.4704, field_shape="721,1440",
                    field_chunk_steps=166, tall_cols=32),
    # 4 GPUs first: the targets are there, and the budget cuts what comes last
    "quick": dict(gpus="all,1", per_gpu_gib="8,32", chunk_log2="26,28", repeats=3, timeout_s=10.0, budget_s=170.0,
                  paths="held"),
    "scaling": dict(gpus="powers", per_gpu_gib="8,24,32", chunk_log2="26", placements="dask,balanced", paths="held"),
    "cpu": dict(gpus="1,2", per_gpu_gib="0.01", chunk_log2="18", repeats=3, field_gib=0.0005, field_shape="9,16"),
    "cpu-scaling": dict(per_gpu_gib="0.004,0.008"),
    "profile-phases": dict(gpus="4"),
    "cpu-profile-phases": dict(gpus="4", chunk_log2="10"),
    "profile-held": dict(per_gpu_gib="8", chunk_log2="26"),
    "profile-expr": dict(per_gpu_gib="8", chunk_log2="26"),
}


def parse(argv=None):
    p = h.parser("multigpu", __doc__, quick="the held rows on every GPU, then one; <= 240 s on 4 x H200",
                 profiles={"phases": "a lazy sum's phases next to dask.array.sum's (4 workers)",
                           "held": "the held paths piece by piece, beside Dask's per-task floor",
                           "groupby": "the field's group-by (by month, by day; both methods) from the task stream",
                           "axes": "the field's mean over time, float32 and float64, split into the direct call, "
                                   "the busiest worker's work and the client's own time",
                           "expr": "expressions over a held array (sum(x * 2), argmax(abs(x)), var(x + 1)), "
                                   "split as axes",
                           "tall": "the tall matrix's row sums persisted, split into the direct call, the "
                                   "outputs' registration, their lineage and the wait, beside no lineage and "
                                   "dask.array"})
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster with NumPy chunks, tiny sizes")
    p.add_argument("--scaling", action="store_true", help="the scaling table: worker counts x sizes x placements")
    p.add_argument("--paths", help=f"comma-separated, any of {', '.join(PATHS)} or all (default all)")
    p.add_argument("--gpus", help="worker counts, e.g. 1,2,4; all = every GPU (default all; --cpu 1,2)")
    p.add_argument("--per-gpu-gib", help="GiB of x per GPU, comma-separated (default 8)")
    p.add_argument("--chunk-log2", help="chunk elements as powers of two (default 24,26,28)")
    p.add_argument("--repeats", type=int, help="timed repetitions per row after a warm-up (default 5)")
    p.add_argument("--timeout-s", type=float, help="a row that takes longer is reported as timed out (default 60)")
    p.add_argument("--budget-s", type=float, help="start no new configuration after this many seconds (default: none)")
    p.add_argument("--placements", help=f"any of {', '.join(PLACEMENTS)} (default dask,contiguous)")
    p.add_argument("--allocators", help=f"the workers' device allocators, one cluster each: any of "
                                        f"{', '.join(h.ALLOCATORS)} (default: local_cluster's, async where rmm "
                                        f"is installed, else cupy; with --protocols ucx: pool; RMM's need GPU workers)")
    p.add_argument("--protocols", help=f"Dask's transport between workers, one cluster each: any of "
                                       f"{', '.join(h.PROTOCOLS)} (default tcp; ucx needs distributed-ucxx and GPU workers)")
    p.add_argument("--dask-cumsum-max-gib", type=float, help="skip dask's cumsum above this per GPU (default 8)")
    # blelloch never finished in 10 s on CuPy chunks in any GPU run (60 s on 40 chunks of 1 MB on the CPU),
    # and its cancelled tasks kept the workers busy so that every row after it timed out: by name only
    p.add_argument("--dask-cumsum-methods", help="da.cumsum methods of the held rows, comma-separated: sequential "
                                                 "and/or blelloch (default sequential)")
    p.add_argument("--field-gib", type=float, help="axes path: the field's GiB per GPU (default 8.4704: 8760 steps "
                                                   "of 721 x 1440 on 4 GPUs)")
    p.add_argument("--field-shape", help="axes path: lat,lon of the field (default 721,1440)")
    p.add_argument("--field-chunk-steps", type=int, help="axes path: time steps per chunk (default 166: 53 chunks of the full field)")
    p.add_argument("--tall-cols", type=int, help="axes path: columns of the tall matrix (default 32)")
    p.add_argument("--no-task-stream", dest="task_stream", action="store_false",
                   help="skip each row's extra repetition under the task stream")
    p.add_argument("--cprofile", action="store_true",
                   help="with --profile held: cProfile of the eager sum on the client and on the busiest worker; "
                        "with --profile expr or axes: of each call on the client")
    args = p.parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None}
    modes = [k for k in ("quick", "scaling") if getattr(args, k)] + ([f"profile-{args.profile}"] if args.profile else [])
    layers = ["default", *modes] + (["cpu", *(f"cpu-{m}" for m in modes)] if args.cpu else [])
    for layer in layers:
        for k, v in PRESETS.get(layer, {}).items():
            if k not in given:
                setattr(args, k, v)
    lists = [("--paths", args.paths, lambda t: t in PATHS or t == "all", f"any of {', '.join(PATHS)} or all"),
             ("--placements", args.placements, lambda t: t in PLACEMENTS, f"any of {', '.join(PLACEMENTS)}"),
             ("--allocators", args.allocators or h.default_allocator(args.cpu),
              lambda t: t in h.ALLOCATORS and (t == "cupy" or not args.cpu),
              f"any of {', '.join(h.ALLOCATORS)} (with --cpu: cupy)"),
             ("--protocols", args.protocols, lambda t: t in h.PROTOCOLS and (t == "tcp" or not args.cpu),
              f"any of {', '.join(h.PROTOCOLS)} (with --cpu: tcp)"),
             ("--gpus", args.gpus, lambda t: t in ("all", "powers") or int(t) > 0, "worker counts > 0, all or powers"),
             ("--per-gpu-gib", args.per_gpu_gib, lambda t: float(t) > 0, "sizes > 0"),
             ("--chunk-log2", args.chunk_log2, lambda t: 0 <= int(t) <= 40, "whole numbers 0..40"),
             ("--field-shape", args.field_shape, lambda t: int(t) > 0, "two whole numbers > 0, lat,lon"),
             ("--dask-cumsum-methods", args.dask_cumsum_methods, lambda t: t in ("sequential", "blelloch"),
              "sequential and/or blelloch")]
    for option, text, good, expected in lists:
        try:
            right = all(good(t) for t in str(text).split(",")) and (option != "--field-shape" or text.count(",") == 1)
        except ValueError:
            right = False
        if not right:
            p.error(f"{option}: expected a comma-separated list of {expected}; got {text!r}")
    for option, value, least in (("--repeats", args.repeats, 1), ("--field-chunk-steps", args.field_chunk_steps, 1),
                                 ("--tall-cols", args.tall_cols, 1), ("--timeout-s", args.timeout_s, 1e-3),
                                 ("--field-gib", args.field_gib, 1e-12), ("--budget-s", args.budget_s, 0)):
        if value < least:
            p.error(f"{option}: expected at least {least:g}; got {value:g}")
    args.paths = PATHS if "all" in args.paths.split(",") else tuple(args.paths.split(","))
    args.placements = tuple(args.placements.split(","))
    args.allocators = tuple(args.allocators.split(",")) if args.allocators else ()  # (): local_cluster's, per transport
    args.protocols = tuple(args.protocols.split(","))
    args.field_shape = tuple(int(v) for v in args.field_shape.split(","))
    return args


def allocators_for(args, protocol: str) -> tuple:
    """The allocators asked for, else the kind local_cluster gives workers of ``protocol``: RMM's
    asynchronous allocator over TCP where rmm is installed, an RMM pool over UCX (whose CUDA IPC cannot map
    the asynchronous allocator's memory), CuPy's pool on CPU workers."""
    if args.allocators:
        return args.allocators
    default = h.default_allocator(args.cpu)  # "cupy" on CPU workers and without rmm
    return ("pool",) if protocol == "ucx" and default != "cupy" else (default,)


def worker_counts(gpus: str, available: int) -> list[int]:
    """The worker counts asked for, those past ``available`` left out, each once: "all" is every GPU,
    "powers" 1, 2, 4, ... below it and every GPU itself."""
    counts = []
    for g in gpus.split(","):
        if g == "powers":
            counts += [1 << k for k in range(available.bit_length()) if 1 << k < available] + [available]
        else:
            counts.append(available if g == "all" else int(g))
    return [c for i, c in enumerate(counts) if 0 < c <= available and c not in counts[:i]]


def float32_sizes(args, n_workers: int):
    """(GiB per worker, log2 of the chunk, chunk, n) for each --per-gpu-gib x --chunk-log2 pair: n float32
    elements, a whole number of chunks, skipped where not one chunk fits."""
    for gib in [float(g) for g in str(args.per_gpu_gib).split(",")]:
        for log2 in [int(c) for c in str(args.chunk_log2).split(",")]:
            chunk = 2**log2
            n = int(gib * n_workers * 2**30 // 4) // chunk * chunk
            if n:
                yield gib, log2, chunk, n


@dataclass
class Layout:
    """Where a held array's chunks are: the placement as run, the runs of consecutive chunks on one
    worker, and the chunks each worker holds (in the order of the workers' addresses)."""

    placement: str
    runs: int
    per_worker: str


def place(client, setting: h.Setting, chunks: tuple, kind: str, seed: int = SEED):
    """Random float32 chunks (``chunks``: dask.array's chunks, split along the first axis only) made where
    they stay: with ``kind == "dask"``, Dask's own placement of ``map_blocks(...).persist()``; with
    ``"contiguous"``, worker w makes the w-th run of chunks; ``"balanced"``, ``multireduce.persist(x,
    balanced=True)`` where multireduce has it, else contiguous. Returns (array, Layout).

    Contiguous placement used to persist ``x.blocks[lo:hi]`` on each worker and then persist their
    concatenation: that made a second set of keys (aliases of the first, placed by the scheduler),
    and on the GPUs those rows took seconds per repetition. Worker annotations on the generating
    layer (kept by persisting without optimisation) make each chunk on its worker, once, under the
    array's only name."""
    import dask
    import dask.array as da
    import distributed

    import multireduce
    from multireduce import placement

    workers = sorted(client.scheduler_info()["workers"])
    n_chunks = len(chunks[0])
    shape = "x".join(str(sum(c)) for c in chunks)
    name = f"bench-{kind}-{shape}-{n_chunks}"

    def lazy():
        return da.map_blocks(setting.make, seed, chunks=chunks, dtype=np.float32, meta=setting.meta(len(chunks)),
                             name=name)

    label = kind
    if kind == "balanced" and hasattr(multireduce, "persist"):
        x = multireduce.persist(lazy(), balanced=True)
        label = "balanced (multireduce.persist)"
    elif kind in ("contiguous", "balanced"):
        def where(key):
            return [workers[key[1] * len(workers) // n_chunks]] if isinstance(key, tuple) else None

        with dask.annotate(workers=where, allow_other_workers=True):
            made = lazy()
        x = client.persist(made, optimize_graph=False)
        label = "contiguous" if kind == "contiguous" else "balanced (contiguous)"
    else:
        x = client.persist(lazy())
    distributed.wait(x)
    holder = placement.holders(x, client)
    if holder is None:
        erred = [f for f in distributed.futures_of(x) if f.status != "finished"]
        raise RuntimeError(f"{len(erred)} of {n_chunks} chunks not in memory after persist"
                           + (f": {erred[0].exception()!r}" if erred and erred[0].status == "error" else ""))
    keys = placement.chunk_keys(x)
    runs = sum(1 for i, k in enumerate(keys) if i == 0 or holder[k] != holder[keys[i - 1]])
    counts = [sum(1 for k in keys if holder[k] == w) for w in workers]
    return x, Layout(label, runs, "/".join(map(str, counts)))


def lazy_array(setting: h.Setting, n_chunks: int, chunk: int, seed: int = SEED):
    """The same chunks as ``place``'s (same seed), made by the graph every time it is computed."""
    import dask.array as da

    return da.map_blocks(setting.make, seed, chunks=((chunk,) * n_chunks,), dtype=np.float32, meta=setting.meta(),
                         name=f"bench-lazy-{n_chunks}x{chunk}")


# ------------------------------------------------------------------------------------------------
# References and checks
# ------------------------------------------------------------------------------------------------
@dataclass
class Reference:
    """float64 facts of x (computed by dask.array on float64 chunks) and the bound of a float32 sum."""

    n: int
    sum: float
    mass: float  # sum of |x|
    var: float
    max: float
    argmax_abs: int

    @property
    def sum_tol(self) -> float:
        return F32_EPS * (self.n / 1024 + 64) * self.mass

    def close(self, got, want: float, tol: float) -> bool:
        return abs(h.to_float(got) - want) <= tol


def reference(x) -> Reference:
    import dask
    import dask.array as da

    x64 = x.astype(np.float64)
    s, mass, var, mx, am = dask.compute(x64.sum(), abs(x64).sum(), x64.var(), x64.max(), da.argmax(abs(x64)))
    return Reference(x.size, h.to_float(s), h.to_float(mass), h.to_float(var), h.to_float(mx), int(h.host(am)))


def _scan_total_close(ref: Reference, scale: float):
    """A check of a persisted scan: its last element is ``scale`` times the sum."""
    return lambda y: ref.close(h.last_element(y), scale * ref.sum, scale * ref.sum_tol)


def _var_close(ref: Reference, shift: float):
    """A check of var(x + shift): within 1e-5 times its condition number, 1 + mean^2 / var."""
    mean = ref.sum / ref.n + shift
    return lambda got: ref.close(got, ref.var, 1e-5 * (1 + mean * mean / ref.var) * ref.var)


# ------------------------------------------------------------------------------------------------
# The rows of each path
# ------------------------------------------------------------------------------------------------
def held_cases(client, x, ref: Reference, args, gib: float) -> list[h.Case]:
    import dask.array as da

    import multireduce as mr

    nbytes = x.nbytes
    sums = [("dask.array.sum", "client.compute", lambda: da.sum(x)),
            ("mr.sum().compute()", "compute", lambda: mr.sum(x)),  # what a notebook writes
            ("client.compute(mr.sum())", "client.compute", lambda: mr.sum(x)),
            ("mr.sum(compute=True)", "now", lambda: mr.sum(x, compute=True))]
    scans = [("mr.cumsum().persist()", "persist", lambda: mr.cumsum(x)),
             ("client.persist(mr.cumsum())", "client.persist", lambda: mr.cumsum(x))]
    if gib <= args.dask_cumsum_max_gib:
        scans += [(f"da.cumsum[{m}]", "client.persist", lambda m=m: da.cumsum(x, method=m))
                  for m in filter(None, args.dask_cumsum_methods.split(","))]
    cases = [h.Case("held", impl, "sum(x)", h.Step(client, how, make), nbytes,
                    lambda got: ref.close(got, ref.sum, ref.sum_tol), "dask.array.sum") for impl, how, make in sums]
    cases += [h.Case("held", impl, "cumsum(x)", h.Step(client, how, make), 2 * nbytes, _scan_total_close(ref, 1),
                     "da.cumsum[sequential]") for impl, how, make in scans]
    return cases


def _held_rows(path: str, client, x, ref: Reference, args, gib: float, impls: tuple) -> list[h.Case]:
    """Rows of the held path another path compares with, under that path's name (measured once: where the
    held path runs too, under its name)."""
    return [dataclasses.replace(c, path=path) for c in held_cases(client, x, ref, args, gib) if c.impl in impls]


def _unfused(make):
    """``make()`` with elementwise steps left to CuPy (``multireduce.fuse-elementwise`` off while the
    result is built: the choice is made then)."""
    import dask

    with dask.config.set({"multireduce.fuse-elementwise": False}):
        return make()


def expr_cases(client, x, ref: Reference, args, gib: float) -> list[h.Case]:
    import dask.array as da

    import multireduce as mr

    nbytes = x.nbytes
    pairs = [("sum(x * 2)", "compute", lambda lib: lib.sum(x * 2), lambda got: ref.close(got, 2 * ref.sum, 2 * ref.sum_tol)),
             ("var(x + 1)", "compute", lambda lib: lib.var(x + 1), _var_close(ref, 1.0)),
             ("argmax(abs(x))", "compute", lambda lib: lib.argmax(abs(x)), lambda got: int(h.host(got)) == ref.argmax_abs)]
    cases = []
    for op, how, make, check in pairs:
        ours, theirs = f"mr.{op}.{how}()", f"da.{op}.{how}()"
        cases += [h.Case("expr", ours, op, h.Step(client, how, lambda make=make: make(mr)), nbytes, check, theirs),
                  h.Case("expr", theirs, op, h.Step(client, how, lambda make=make: make(da)), nbytes, check, theirs)]
    # the same calls with the steps left to CuPy (a kernel per step, then ours): what reading them into
    # the loads buys
    cases.append(h.Case("expr", "mr.sum(x * 2).compute() unfused", "sum(x * 2)",
                        h.Step(client, "compute", lambda: _unfused(lambda: mr.sum(x * 2))), nbytes,
                        lambda got: ref.close(got, 2 * ref.sum, 2 * ref.sum_tol), "da.sum(x * 2).compute()"))
    cases.append(h.Case("expr", "mr.argmax(abs(x)).compute() unfused", "argmax(abs(x))",
                        h.Step(client, "compute", lambda: _unfused(lambda: mr.argmax(abs(x)))), nbytes,
                        lambda got: int(h.host(got)) == ref.argmax_abs, "da.argmax(abs(x)).compute()"))
    scan = ("mr.cumsum(x * 2).persist()", "da.cumsum(x * 2).persist()")
    cases.append(h.Case("expr", scan[0], "cumsum(x * 2)", h.Step(client, "persist", lambda: mr.cumsum(x * 2)),
                        2 * nbytes, _scan_total_close(ref, 2), scan[1]))
    cases.append(h.Case("expr", scan[0] + " unfused", "cumsum(x * 2)",
                        h.Step(client, "persist", lambda: _unfused(lambda: mr.cumsum(x * 2))),
                        2 * nbytes, _scan_total_close(ref, 2), scan[1]))
    if gib <= args.dask_cumsum_max_gib:
        cases.append(h.Case("expr", scan[1], "cumsum(x * 2)", h.Step(client, "persist", lambda: da.cumsum(x * 2)),
                            2 * nbytes, _scan_total_close(ref, 2), scan[1]))
    # the held bare call and its dask.array row beside the expressions
    return cases + _held_rows("expr", client, x, ref, args, gib, ("dask.array.sum", "mr.sum().compute()"))


def graph_cases(client, x, ref: Reference, args, gib: float) -> list[h.Case]:
    import dask.array as da

    import multireduce as mr

    def sum_and_max(got):
        return ref.close(got[0], ref.sum, ref.sum_tol) and h.to_float(got[1]) == ref.max

    theirs = "dask.compute(da.sum(x), da.max(x))"
    return _held_rows("graph", client, x, ref, args, gib, ("dask.array.sum", "client.compute(mr.sum())")) + [
        h.Case("graph", "dask.compute(mr.sum(x), mr.max(x))", "sum(x), max(x)",
               h.Step(client, "dask.compute", lambda: (mr.sum(x), mr.max(x))), x.nbytes, sum_and_max, theirs),
        h.Case("graph", theirs, "sum(x), max(x)", h.Step(client, "dask.compute", lambda: (da.sum(x), da.max(x))),
               x.nbytes, sum_and_max, theirs),
        # what any future costs: a result handed over through the graph waits at least this long
        h.Case("graph", TRIVIAL_TASK, "1", h.Step(client, "now", lambda: client.submit(_one, pure=False).result()),
               0, lambda got: got == 1)]


#: the graph path's floor row: one task that does nothing, submitted and its result fetched
TRIVIAL_TASK = "floor: client.submit(trivial task).result()"


def _one() -> int:
    return 1


def _make_and_sum(seed: int, locations: list, chunk: int, host: bool) -> float:
    """One worker's share of the lazy array: each chunk made and summed in turn (no chunk kept), the
    partial sums added in float64 on the host."""
    import multireduce as mr

    parts = [mr.sum(h.random_chunk(seed + loc, (chunk,), host)) for loc in locations]
    return math.fsum(h.to_float(p) for p in parts)


def floor_sum(client, n_chunks: int, chunk: int, host: bool) -> float:
    """The lazy sum's floor: one task per worker, restricted to it, making and summing its run of chunks."""
    workers = sorted(client.scheduler_info()["workers"])
    shares = [list(range(w * n_chunks // len(workers), (w + 1) * n_chunks // len(workers))) for w in range(len(workers))]
    futures = [client.submit(_make_and_sum, SEED, share, chunk, host, workers=[addr], allow_other_workers=False,
                             pure=False) for addr, share in zip(workers, shares) if share]
    return math.fsum(client.gather(futures))


def lazy_cases(client, setting: h.Setting, lz, ref: Reference, args, gib: float, chunk: int) -> list[h.Case]:
    import dask.array as da

    import multireduce as mr

    nbytes = lz.nbytes

    def total(got):
        return ref.close(got, ref.sum, ref.sum_tol)

    cases = [h.Case("lazy", "mr.sum(lz).compute()", "sum(lz)", h.Step(client, "compute", lambda: mr.sum(lz)), nbytes,
                    total, "da.sum(lz).compute()"),
             h.Case("lazy", "da.sum(lz).compute()", "sum(lz)", h.Step(client, "compute", lambda: da.sum(lz)), nbytes,
                    total, "da.sum(lz).compute()"),
             h.Case("lazy", "floor: one task per worker makes and sums its chunks", "sum(lz)",
                    h.Step(client, "now", lambda: floor_sum(client, lz.numblocks[0], chunk, setting.cpu)), nbytes,
                    total, "da.sum(lz).compute()"),
             h.Case("lazy", "mr.cumsum(lz).persist()", "cumsum(lz)", h.Step(client, "persist", lambda: mr.cumsum(lz)),
                    2 * nbytes, _scan_total_close(ref, 1), "da.cumsum(lz).persist()")]
    if gib <= args.dask_cumsum_max_gib:
        cases.append(h.Case("lazy", "da.cumsum(lz).persist()", "cumsum(lz)",
                            h.Step(client, "persist", lambda: da.cumsum(lz)), 2 * nbytes, _scan_total_close(ref, 1),
                            "da.cumsum(lz).persist()"))
    return cases


def _time_times_two(keys: list, repeats: int, dask_worker=None) -> tuple[float, int]:
    """On a worker, over the chunks of ``keys`` it holds: the median over ``repeats`` of the summed time of
    ``b * 2`` on each (CUDA events on CuPy chunks, the host clock on NumPy ones), and how many chunks."""
    blocks = [dask_worker.data[k] for k in keys if k in dask_worker.data]
    cupy = sys.modules.get("cupy")
    on_gpu = bool(blocks) and cupy is not None and isinstance(blocks[0], cupy.ndarray)
    totals = []
    for _ in range(repeats + 1):  # the first: a warm-up
        total = 0.0
        for b in blocks:
            if on_gpu:
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                b * 2
                stop.record()
                stop.synchronize()
                total += cupy.cuda.get_elapsed_time(start, stop)
            else:
                t0 = time.perf_counter()
                b * 2
                total += (time.perf_counter() - t0) * 1e3
        totals.append(total)
    return statistics.median(totals[1:]), len(blocks)


def expression_time_row(client, x, repeats: int) -> dict:
    """``x * 2`` alone on the workers: the kernel time the expression rows pay on top of the sum."""
    from multireduce import placement

    keys = placement.chunk_keys(x)
    found = client.run(_time_times_two, keys, repeats)
    ms = max(t for t, _ in found.values())
    return dict(path="expr", impl="x * 2 alone: b * 2 on each held chunk, summed per worker (slowest)", op="x * 2",
                peer=None, ms=ms, gbps=2 * x.nbytes / ms / 1e6, ok=sum(c for _, c in found.values()) == len(keys),
                note="", per_worker_ms={w: t for w, (t, _) in found.items()})


def memory_rows(client, lz, ref: Reference, timeout_s: float) -> list[dict]:
    """Peak memory per worker above its baseline while a lazy sum runs (after a warm-up run), ours and
    dask.array's."""
    import dask.array as da

    import multireduce as mr

    rows = []
    theirs = "peak memory: da.sum(lz).compute()"
    for impl, make in [("peak memory: mr.sum(lz).compute()", lambda: mr.sum(lz)), (theirs, lambda: da.sum(lz))]:
        row = dict(path="memory", impl=impl, op="sum(lz)", peer=theirs)
        step, sampling = h.Step(client, "compute", make), False
        try:
            h.bounded(step, timeout_s)
            h.wait_released(client, step.names)
            client.run(h.start_sampling)
            sampling = True
            t0 = time.perf_counter()
            value = h.bounded(step, timeout_s)
            seconds = time.perf_counter() - t0
            samples, sampling = client.run(h.stop_sampling), False
            h.wait_released(client, step.names)
            above = {w: {k: s["peak"][k] - s["baseline"][k] for k in s["peak"]} for w, s in samples.items()}
            metrics = sorted({k for a in above.values() for k in a})
            row.update(ms=seconds * 1e3, gbps=lz.nbytes / seconds / 1e9, ok=ref.close(value, ref.sum, ref.sum_tol),
                       note="", memory_above_baseline=above,
                       **{f"peak_{k}": max(a.get(k, 0) for a in above.values()) for k in metrics})
        except TimeoutError:
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=f"timed out after {timeout_s:g} s")
            h.wait_idle(client, [], timeout=max(120.0, 10 * timeout_s))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200])
        if sampling:
            client.run(h.stop_sampling)
        rows.append(row)
    return rows


def tall_cases(client, m, ref64, cols: int) -> list[h.Case]:
    """``sum(m, axis=1)`` of a tall matrix, persisted, checked element by element on the workers."""
    import dask.array as da

    import multireduce as mr

    tol = F32_EPS * (cols / 1024 + 64) * cols * 0.5

    def check(y):
        return h.to_float(da.max(abs(y.astype(np.float64) - ref64)).compute()) <= tol

    theirs = "da.sum(m, axis=1).persist()"
    return [h.Case("axes", "mr.sum(m, axis=1).persist()", "sum(m, axis=1)",
                   h.Step(client, "persist", lambda: mr.sum(m, axis=1)), m.nbytes, check, theirs),
            h.Case("axes", theirs, "sum(m, axis=1)", h.Step(client, "persist", lambda: da.sum(m, axis=1)), m.nbytes,
                   check, theirs)]


def month_of_hour(steps: int) -> np.ndarray:
    """The month (0-11) of each hour of a year from January 1st, repeated past a year."""
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
    return np.resize(np.repeat(np.arange(12), days), steps)


def field_refs(f) -> dict:
    """The field's references, computed once by dask.array (float64 where they round): its mean over time,
    its monthly means, its daily maxima (exact in float32) and its total and total of magnitudes."""
    import dask.array as da

    steps = f.shape[0]
    month = month_of_hour(steps)
    f64 = f.astype(np.float64)
    days = range(steps // 24)
    return {"mean": h.host(f64.mean(axis=0).compute()).astype(np.float64),
            "monthly": np.stack([h.host(f64[np.flatnonzero(month == m)].mean(axis=0).compute())
                                 for m in np.unique(month)], axis=-1).astype(np.float64),
            "daily_max": h.host(da.stack([f[d * 24:(d + 1) * 24].max(axis=0) for d in days], axis=-1).compute()),
            "total": float(f64.sum().compute()), "magnitude": float(abs(f64).sum().compute())}


def field_cases(client, f, refs: dict) -> list[h.Case]:
    """``mean(f, axis=0)`` of a time x lat x lon field, its monthly climatology (the field's hours grouped
    by month: ``mr.groupby_reduce``, against what xarray's group-by without flox runs on dask, one mean per
    month of the selected steps), its daily maximum (hours grouped by day: what xarray's resample fails at
    on CuPy data; no dask.array row) and its total, on the client, checked element by element."""
    import dask.array as da

    import multireduce as mr

    ref64, monthly64 = refs["mean"], refs["monthly"]
    steps = f.shape[0]
    tol = F32_EPS * (steps / 1024 + 65) * 0.5  # a mean of |values| <= 0.5, then the division

    def close(want):
        def check(got):
            got = h.host(got)
            return got.shape == want.shape and float(np.max(np.abs(got.astype(np.float64) - want))) <= tol
        return check

    month = month_of_hour(steps)
    present = np.unique(month)

    def per_month():
        return da.stack([f[np.flatnonzero(month == m)].mean(axis=0) for m in present], axis=-1)

    theirs, their_months = "da.mean(f, axis=0).compute()", "per month: da.stack([f[month == m].mean(axis=0)])"
    theirs64 = "da.mean(f, axis=0, dtype=float64).compute()"
    cases = [h.Case("axes", "mr.mean(f, axis=0).compute()", "mean(f, axis=0)",
                   h.Step(client, "compute", lambda: mr.mean(f, axis=0)), f.nbytes, close(ref64), theirs),
            h.Case("axes", theirs, "mean(f, axis=0)", h.Step(client, "compute", lambda: da.mean(f, axis=0)),
                   f.nbytes, close(ref64), theirs),
            # float64 sums of float32 values, exact in any order on such data: each worker sums its chunks together
            h.Case("axes", "mr.mean(f, axis=0, dtype=float64).compute()", "float64 mean(f, axis=0)",
                   h.Step(client, "compute", lambda: mr.mean(f, axis=0, dtype=np.float64)), f.nbytes, close(ref64),
                   theirs64),
            h.Case("axes", theirs64, "float64 mean(f, axis=0)",
                   h.Step(client, "compute", lambda: da.mean(f, axis=0, dtype=np.float64)), f.nbytes, close(ref64),
                   theirs64),
            h.Case("axes", "mr.groupby_reduce(f, month, 'mean', axis=0)", "monthly mean",
                   h.Step(client, "compute", lambda: mr.groupby_reduce(f, month, "mean", axis=0)[0]), f.nbytes,
                   close(monthly64), their_months),
            h.Case("axes", "the same, method='map-reduce' (one tree over every chunk's partial)", "monthly mean",
                   h.Step(client, "compute", lambda: mr.groupby_reduce(f, month, "mean", axis=0,
                                                                       method="map-reduce")[0]), f.nbytes,
                   close(monthly64), their_months),
            h.Case("axes", their_months, "monthly mean", h.Step(client, "compute", per_month), f.nbytes,
                   close(monthly64), their_months)]
    day = np.arange(steps) // 24
    whole_days = steps // 24 * 24  # the hours of a last partial day are left out, as in the reference

    def exact_daily_max(got):
        got = h.host(got)
        return got.shape == refs["daily_max"].shape and bool(np.array_equal(got, refs["daily_max"], equal_nan=True))

    def total_close(got):
        return abs(float(h.host(got)) - refs["total"]) <= 2 * F32_EPS * refs["magnitude"] + 1e-30

    # a result as large as a day's field per day (1.5 GB for the year) stays on the GPUs, as a user keeps it
    cases.append(h.Case("axes", "mr.groupby_reduce(f, day, 'max', axis=0).persist()", "daily max",
                        h.Step(client, "persist", lambda: mr.groupby_reduce(f[:whole_days], day[:whole_days], "max",
                                                                            axis=0)[0]),
                        f.nbytes * whole_days // max(steps, 1), exact_daily_max))
    theirs_total = "da.sum(f).compute()"
    cases += [h.Case("axes", "mr.sum(f).compute()", "total", h.Step(client, "compute", lambda: mr.sum(f)), f.nbytes,
                     total_close, theirs_total),
              h.Case("axes", theirs_total, "total", h.Step(client, "compute", lambda: da.sum(f)), f.nbytes,
                     total_close, theirs_total)]
    return cases


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
class Run:
    """The rows measured so far, what the budget left out, and the clock."""

    def __init__(self, args, setting: h.Setting):
        self.args, self.setting = args, setting
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.started = time.time()
        self.allocator = "cupy"  # of the cluster being measured
        self.protocol = "tcp"

    def over_budget(self, what: str) -> bool:
        if self.args.budget_s and time.time() - self.started > self.args.budget_s:
            self.skipped.append(what)
            return True
        return False

    def measure(self, client, cases: list[h.Case], base: dict) -> None:
        """Each case once (the first of a name), as a row with ``base``'s configuration and the cluster's
        allocator and transport."""
        base = {"allocator": self.allocator, "protocol": self.protocol, **base}
        seen = {r["impl"] for r in self.rows if all(r.get(k) == v for k, v in base.items())}
        for case in cases:
            if case.impl in seen:
                continue
            seen.add(case.impl)
            if self.args.scaling and case.impl not in SCALING_IMPLS:
                continue
            self.add(base, h.time_case(client, case, self.args.repeats, self.args.timeout_s, self.args.task_stream))
            if self.rows[-1]["note"].startswith("timed out") and case.impl.startswith("da.cumsum["):
                # its tasks still ran on: not tried again in this run
                method = case.impl[len("da.cumsum["):-1]
                self.args.dask_cumsum_methods = ",".join(
                    m for m in self.args.dask_cumsum_methods.split(",") if m != method)

    def add(self, base: dict, row: dict) -> None:
        row = {"allocator": self.allocator, "protocol": self.protocol, **base, **row}
        self.rows.append(row)
        print(json.dumps(row, default=str), flush=True)

    def attempt(self, what: str, fn, *args) -> None:
        """``fn(self, *args)``; a failure (placing the data, its reference, out of memory) is reported and
        listed with what the run left out, and the run goes on."""
        try:
            fn(self, *args)
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is not the run's
            print(f"{what} failed: {exc!r}", flush=True)
            self.skipped.append(f"{what}: {exc!r}"[:200])


def configuration(run: Run, client, n: int, gib: float, log2: int, chunk: int, total: int, kind: str) -> None:
    """Every asked-for path of one worker count, size, chunk and placement."""
    args, setting = run.args, run.setting
    x, layout = place(client, setting, ((chunk,) * (total // chunk),), kind)
    base = dict(gpus=n, gib_per_gpu=gib, chunk_log2=log2, chunk=f"2^{log2}", placement=layout.placement,
                runs=layout.runs, chunks_per_worker=layout.per_worker)
    paths = args.paths if kind == "dask" else ("held",)
    ref = reference(x)
    if "held" in paths:
        run.measure(client, held_cases(client, x, ref, args, gib), base)
    if "expr" in paths:
        run.measure(client, expr_cases(client, x, ref, args, gib), base)
        run.add(base, expression_time_row(client, x, args.repeats))
    if "graph" in paths:
        run.measure(client, graph_cases(client, x, ref, args, gib), base)
    if "lazy" in paths or "memory" in paths:
        lz = lazy_array(setting, total // chunk, chunk)
        if "lazy" in paths:
            run.measure(client, lazy_cases(client, setting, lz, ref, args, gib, chunk), base)
        if "memory" in paths:
            for row in memory_rows(client, lz, ref, args.timeout_s):
                run.add(base, row)
    names = [x.name]
    del x
    h.wait_released(client, names)
    setting.free(client)
    if "axes" in paths:
        run.attempt(f"tall matrix of {n} x {gib:g} GiB, 2^{log2}", tall, client, n, gib, chunk, total)


def tall(run: Run, client, n: int, gib: float, chunk: int, total: int) -> None:
    """The tall matrix of x's bytes, chunks of x's chunk bytes, Dask's placement."""
    cols = run.args.tall_cols
    rows_per_chunk = max(chunk // cols, 1)
    n_chunks = max(total // cols // rows_per_chunk, 1)
    m, layout = place(client, run.setting, ((rows_per_chunk,) * n_chunks, (cols,)), "dask", seed=SEED + 1)
    ref64 = client.persist(m.astype(np.float64).sum(axis=1))
    base = dict(gpus=n, gib_per_gpu=gib, chunk_log2=None, chunk=f"{rows_per_chunk}x{cols}", placement=layout.placement,
                runs=layout.runs, chunks_per_worker=layout.per_worker)
    run.measure(client, tall_cases(client, m, ref64, cols), base)
    names = [m.name, ref64.name]
    del m, ref64
    h.wait_released(client, names)
    run.setting.free(client)


def field(run: Run, client, n: int, kind: str = "dask") -> None:
    """The time x lat x lon field, its time axis scaled to the workers and --field-gib, placed by ``kind``
    (Dask's, or balanced: equal contiguous shares)."""
    args = run.args
    lat, lon = args.field_shape
    steps = int(args.field_gib * n * 2**30 // (lat * lon * 4))
    if steps < 1:
        run.skipped.append(f"field on {n} workers: --field-gib {args.field_gib:g} holds no time step")
        return
    per = min(args.field_chunk_steps, steps)
    chunks = ((per,) * (steps // per) + ((steps % per,) if steps % per else ()), (lat,), (lon,))
    f, layout = place(client, run.setting, chunks, kind, seed=SEED + 2)
    refs = field_refs(f)
    base = dict(gpus=n, gib_per_gpu=f.nbytes / n / 2**30, chunk_log2=None, chunk=f"{per}x{lat}x{lon}",
                placement=layout.placement, runs=layout.runs, chunks_per_worker=layout.per_worker)
    print(f"field {steps} x {lat} x {lon} float32 ({f.nbytes / 1e9:.1f} GB) in {len(chunks[0])} chunks", flush=True)
    run.measure(client, field_cases(client, f, refs), base)
    names = [f.name]
    del f
    h.wait_released(client, names)
    run.setting.free(client)


def main(argv=None):
    import distributed

    args = parse(argv)
    setting = h.setting(args.cpu)
    if args.profile:
        from benchmarks import multigpu_profile

        return multigpu_profile.main(args, setting)
    run = Run(args, setting)
    for n in worker_counts(args.gpus, setting.available):
        for allocator, protocol in ((a, p) for p in args.protocols for a in allocators_for(args, p)):
            if run.over_budget(f"{n} workers, {allocator}, {protocol}"):
                continue
            run.allocator, run.protocol = allocator, protocol
            try:
                cluster = setting.cluster(n, allocator, protocol)
            except Exception as exc:  # noqa: BLE001 - an allocator or transport this machine lacks is reported
                run.skipped.append(f"{n} workers, {allocator}, {protocol}: {exc!r}"[:200])
                print(f"{n} workers, {allocator}, {protocol}: {exc!r}", flush=True)
                continue
            with cluster, distributed.Client(cluster) as client:
                # the field first: one configuration per worker count, and the budget cuts what comes last
                for kind in ([k for k in args.placements if k in ("dask", "balanced")] if "axes" in args.paths else []):
                    if not run.over_budget(f"field on {n} workers, {kind}"):
                        run.attempt(f"field on {n} workers, {kind}", field, client, n, kind)
                for gib, log2, chunk, total in float32_sizes(args, n):
                    # one worker: every placement is Dask's, measured once
                    for kind in (args.placements if n > 1 else args.placements[:1]):
                        what = f"{n} x {gib:g} GiB, 2^{log2}, {kind}, {allocator}"
                        if not run.over_budget(what):
                            run.attempt(what, configuration, client, n, gib, log2, chunk, total,
                                        kind if n > 1 else "dask")
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "workers": setting.available, "device": setting.device,
           "seconds": round(time.time() - run.started, 1), "args": vars(args), "left_out": run.skipped}
    # a CPU smoke run never replaces the GPU tables in docs/
    out_dirs = ([] if args.cpu else [ROOT / "docs"]) + [Path(os.environ.get("OUT") or "/tmp")]
    write(run.rows, env, out_dirs, "bench_multigpu_scaling" if args.scaling else "bench_multigpu_latest")
    return run.rows


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------
CONFIG = ("gpus", "gib_per_gpu", "chunk", "placement", "allocator", "protocol")


def x_dask(rows: list[dict], r: dict, key: str = "ms") -> float:
    """The peer row's ``key`` over this row's (same configuration); NaN where there is none."""
    same = [q for q in rows if q["impl"] == r.get("peer") and all(q.get(k) == r.get(k) for k in CONFIG)]
    mine = r.get(key, float("nan"))
    if not same or not mine or mine != mine:
        return float("nan")
    return same[0].get(key, float("nan")) / mine


def _f(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and v is not None else "-"


def full_table(rows: list[dict]) -> str:
    timed = [r for r in rows if r["path"] != "memory"]
    return h.md_table(
        ("workers", "GiB/worker", "chunk", "placement (runs)", "chunks/worker", "allocator", "protocol", "path", "impl", "ms",
         "first call ms", "GB/s", "x dask", "tasks", "transfers (bytes)", "outside tasks ms", "ok", "note"),
        ((r["gpus"], f"{r['gib_per_gpu']:.4g}", r["chunk"], f"{r['placement']} ({r['runs']})", r["chunks_per_worker"],
          r.get("allocator", "cupy"), r.get("protocol", "tcp"), r["path"], r["impl"], _f(r["ms"], ".2f"), _f(r.get("first_ms"), ".2f"),
          _f(r["gbps"], ".1f"), _f(x_dask(rows, r), ".2f"),
          r.get("tasks", ""), f"{r.get('transfers', '')} ({r.get('transfer_bytes', '')})" if "transfers" in r else "",
          _f(r.get("outside_tasks_ms"), ".1f"), r["ok"], r["note"]) for r in timed))


def memory_table(rows: list[dict]) -> str:
    mem = [r for r in rows if r["path"] == "memory"]
    metrics = ("peak_pool_used", "peak_pool_total", "peak_rmm_peak", "peak_device_used", "peak_rss")

    def compared(r):  # allocated bytes where an allocator counts them, else the driver's, else RSS
        return next((k for k in ("peak_rmm_peak", "peak_pool_total", "peak_device_used", "peak_rss") if k in r), "ms")

    return h.md_table(
        ("workers", "GiB/worker", "chunk", "allocator", "impl", "ms", "pool used MiB", "pool high-water MiB",
         "RMM peak MiB", "device (NVML) MiB", "RSS MiB", "dask's peak / ours", "ok"),
        ((r["gpus"], f"{r['gib_per_gpu']:.4g}", r["chunk"], r.get("allocator", "cupy"), r["impl"], _f(r["ms"], ".2f"),
          *(_f(r[k] / 2**20, ".0f") if k in r else "-" for k in metrics),
          _f(x_dask(rows, r, compared(r)), ".2f") if r["impl"] != r["peer"] else "", r["ok"]) for r in mem))


def short_table(rows: list[dict]) -> str:
    return h.md_table(("workers", "GiB/worker", "chunk", "placement", "chunks/worker", "allocator", "protocol", "impl", "ms",
                       "first ms", "x dask", "ok"),
                      ((r["gpus"], f"{r['gib_per_gpu']:.4g}", r["chunk"], r["placement"], r["chunks_per_worker"],
                        r.get("allocator", "cupy"), r.get("protocol", "tcp"), r["impl"], _f(r["ms"], ".2f"), _f(r.get("first_ms"), ".1f"),
                        _f(x_dask(rows, r), ".2f"), r["ok"] if r["ok"] else
                        f"{r['ok']} ({r['note'][:60]})") for r in rows if r["path"] != "memory"))


def write(rows: list[dict], env: dict, out_dirs: list[Path], name: str) -> None:
    """The full and memory tables and the JSON to each of ``out_dirs``; a short table printed last."""
    memory = f"Peak memory per worker above its baseline (the largest worker's):\n\n{memory_table(rows)}"
    text = f"{json.dumps(env, default=str)}\n\n{full_table(rows)}\n{memory}"
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1, default=str))
        (d / f"{name}.md").write_text(text)
    bad = [r for r in rows if not r["ok"]]
    if any(r["path"] == "memory" for r in rows):
        print("\n" + memory)
    print(f"\n{env['device']}: {len(rows)} rows, {len(bad)} not ok, {env['seconds']} s; full table in "
          f"{', '.join(str(d / (name + '.md')) for d in out_dirs)}\n")
    print(short_table(rows), end="")
