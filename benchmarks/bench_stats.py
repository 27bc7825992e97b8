"""Statistics side by side on one GPU, in one run: argmax/argmin against CuPy and torch, var/std
(ill-conditioned: mean 1e4, spread 1) against CuPy and torch, nansum against cupy.nansum, torch and our
own sum, nanmax against cupy.nanmax and torch, any/count_nonzero against CuPy and torch; float32 and
float64 at 2^26 and 2^28 elements (far above L2), with the copy roof (bytes read / copy bandwidth)
beside each row. Every timed result is checked against a reference first. Segmented reductions are
benchmarks/bench_segments.py.

    python -m benchmarks stats [--quick]     # --quick: 2^24 and 2^26 only
    python -m benchmarks stats --profile call | kernels
    python -m benchmarks stats --cpu [--quick]   # NumPy input against NumPy, 2^24 (--quick: 2^20); no GPU

The table printed last is one line per (statistic, dtype, n): our ratio to the copy roof and to the
fastest of CuPy and torch (> 1: faster).

``--profile call``: the host cost of one statistics call on CuPy input (is a statistic at 2^26 elements
host-bound?). For each statistic on a float32 CuPy array of 2^10 elements (the GPU time is then
negligible): "pipelined" is the host time per call of 2000 back-to-back calls (a call whose GPU time is
shorter than this is host-bound in this suite's pipelined timing), "latency" the median of single calls
each followed by a stream synchronize; then cProfile of 2000 calls of argmax, var and nanmax, the 18
functions with the most own time.

``--cpu``: the CPU backend on NumPy input against NumPy's own function, float32 and float64 at 2^24
elements: the wall-clock median of CPU_ROUNDS interleaved rounds (ours, NumPy, ours, ...) of one call
each, every result checked against a float64 reference first; then var and nanmean of a Dask array of
the same data in 4 chunks under the synchronous scheduler. The last column is NumPy's time over ours
(>= 1: not slower). Under a minute on a loaded 2-core machine.

``--profile kernels``: where a whole-array statistic's GPU time goes at 2^26 and 2^28 elements: the rows
kernel alone (at several grid sizes), rows + fold (two launches), the one launch whose last block folds
(what a call launches), the whole call, nanmax and nanvar with and without their probe, and our sum beside
them, each timed as a pipeline of launches with CUDA events, with the copy roof.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

import multireduce as mr
from benchmarks import harness as h

#: the statistics whose host cost ``--profile call`` measures
CALL_STATS = ("sum", "mean", "argmax", "argmin", "var", "std", "nansum", "nanmax", "nanmean", "any", "count_nonzero")


def _families(cupy, torch):
    """(family, data kind, {impl: fn}, check(fn, x, ref) -> ok, reference(x) -> value) per statistic."""
    def t(x):
        return torch.as_tensor(x, device="cuda")

    def exact_index(fn, x, ref):
        return int(fn(x)) == ref

    def close(rtol):
        return lambda fn, x, ref: abs(float(fn(x)) - ref) <= rtol * max(abs(ref), 1e-30)

    fams = [
        ("argmax", "unique", {"multireduce": mr.argmax, "cupy": cupy.argmax, "torch": lambda x: t(x).argmax()},
         exact_index, lambda x: int(cupy.argmax(x))),
        ("argmin", "unique", {"multireduce": mr.argmin, "cupy": cupy.argmin, "torch": lambda x: t(x).argmin()},
         exact_index, lambda x: int(cupy.argmin(x))),
        ("var", "ill", {"multireduce": mr.var, "cupy": cupy.var, "torch": lambda x: t(x).var(correction=0)},
         close(1e-3), lambda x: _var64(cupy, x)),
        ("std", "ill", {"multireduce": mr.std, "cupy": cupy.std, "torch": lambda x: t(x).std(correction=0)},
         close(1e-3), lambda x: math.sqrt(_var64(cupy, x))),
        ("nansum", "nan", {"multireduce": mr.nansum, "multireduce sum (no NaN)": None, "cupy": cupy.nansum,
                           "torch": lambda x: t(x).nansum()},
         close(1e-4), lambda x: float(cupy.nansum(x.astype(cupy.float64)))),
        ("nanmax", "nan", {"multireduce": mr.nanmax, "cupy": cupy.nanmax,
                           "torch": lambda x: t(x).nan_to_num(nan=-math.inf).max()},
         close(0), lambda x: float(cupy.nanmax(x))),
        ("any", "zeros1", {"multireduce": mr.any, "cupy": cupy.any, "torch": lambda x: t(x).any()},
         lambda fn, x, ref: bool(fn(x)) == ref, lambda x: bool(cupy.any(x))),
        ("count_nonzero", "sparse", {"multireduce": mr.count_nonzero, "cupy": cupy.count_nonzero,
                                     "torch": lambda x: t(x).count_nonzero()},
         lambda fn, x, ref: int(fn(x)) == ref, lambda x: int(cupy.count_nonzero(x))),
    ]
    if torch is None:
        fams = [(f, k, {i: fn for i, fn in impls.items() if not i.startswith("torch")}, c, r)
                for f, k, impls, c, r in fams]
    return fams


ROUNDS = 3


def _rounds(cupy, mr, impls, xs, check, ref):
    """impl -> (ms, ok, failure): every implementation timed in ROUNDS interleaved rounds (ours, the
    peers, ours, ...) of 5 repeats each, the median of the rounds' medians, so that no implementation is
    always the first timed after the data is made (the first one measured up to 15 % slow there on an
    H100 and an H200, whichever it was)."""
    clean = [cupy.nan_to_num(x) for x in xs] if None in impls.values() else None
    found, samples = {}, {impl: [] for impl in impls}
    for impl, fn in impls.items():
        try:
            if fn is None:  # our plain sum of NaN-free data, the ceiling for nansum
                found[impl] = (abs(float(mr.sum(clean[0])) - ref) <= 1e-4 * abs(ref), None)
            else:
                found[impl] = (check(fn, xs[0], ref), None)
        except Exception as exc:
            found[impl] = (False, f"{type(exc).__name__}: {str(exc)[:60]}")
    for _ in range(ROUNDS):
        for impl, fn in impls.items():
            if found[impl][1] is None:
                samples[impl].append(h.time_gpu(mr.sum, clean, repeats=5) if fn is None else h.time_gpu(fn, xs, repeats=5))
    return {impl: (statistics.median(samples[impl]) if samples[impl] else math.nan, *found[impl]) for impl in impls}


def _var64(cupy, x):
    d = x.astype(cupy.float64)
    return float(cupy.mean((d - d.mean()) ** 2))


def _data(cupy, kind, n, dtype, seed):
    """Inputs of one kind: 'unique' (a unique extreme at a random place), 'ill' (1e4 + N(0, 1)), 'nan'
    (1% NaN), 'zeros1' (zeros but one non-zero near the end: any reads everything), 'sparse' (10%
    non-zero)."""
    rng = cupy.random.default_rng(seed)
    if kind == "ill":
        return (1e4 + rng.standard_normal(n, dtype=cupy.float64)).astype(dtype)
    x = rng.random(n, dtype=dtype)
    if kind == "unique":
        spot = int(np.random.default_rng(seed).integers(0, n))
        x[spot] = 2.0
        x[(spot * 7 + 11) % n] = -1.0
    elif kind == "nan":
        x[rng.random(n) < 0.01] = cupy.nan
    elif kind == "zeros1":
        x[...] = 0
        x[n - 5] = 1
    elif kind == "sparse":
        x[x < 0.9] = 0
    return x


def profile_call() -> list:
    """``--profile call``: host microseconds of each statistic at 2^10 elements, then cProfile of three."""
    import cupy

    x = cupy.random.random(1 << 10, dtype=cupy.float32) - 0.25
    rows = []
    for name in CALL_STATS:
        fn = getattr(mr, name)
        pipelined, latency = h.per_call_us(lambda: fn(x))
        rows.append((f"multireduce.{name}", pipelined, latency))
        print(f"{name:16} pipelined {pipelined:7.2f} us   latency {latency:7.2f} us", flush=True)
    for name in ("argmax", "var", "nanmax", "sum"):
        peer = getattr(cupy, name)
        rows.append((f"cupy.{name}", *h.per_call_us(lambda: peer(x))))
    for name in ("argmax", "var", "nanmax"):
        fn = getattr(mr, name)
        text = h.cprofiled(lambda: fn(x), 2000)
        print(f"\n=== cProfile, 2000 x multireduce.{name}\n" + "\n".join(text.splitlines()[4:]))
    print()
    print(h.host_table(("call (float32, 2^10)",), rows))
    return rows


def profile_kernels() -> list:
    """``--profile kernels``: the statistics kernels' GPU time, piece by piece, against the copy roof."""
    import cupy

    from multireduce import kernels, statistics
    from multireduce.backends import cupy_stats as cs

    device = cupy.cuda.runtime.getDevice()
    sms = cs._sm_count(device)
    rows = []
    header = ("stat", "dtype", "n", "what", "ms", "x copy")
    print(h.md_table(header, []), end="")

    def row(stat, dtype, log2n, what, ms, roof):  # each line as it is measured
        rows.append((stat, np.dtype(dtype).name, f"2^{log2n}", what, f"{ms:.4f}", f"{roof / ms:.3f}"))
        print(h.md_table(header, rows[-1:]).splitlines()[-1], flush=True)

    for log2n in (26, 28):
        n = 1 << log2n
        for dtype in (np.float32, np.float64):
            xs = h.buffers(lambda i: cupy.random.random(n, dtype=dtype), n * np.dtype(dtype).itemsize)
            roof = n * np.dtype(dtype).itemsize / (h.copy_roof(n * np.dtype(dtype).itemsize) * 1e6)
            row("copy", dtype, log2n, "read at copy speed", roof, roof)
            row("sum", dtype, log2n, "call", h.time_gpu(mr.sum, xs), roof)
            for stat in ("argmax", "var", "any"):
                ks = cs._kernels_for(stat, np.dtype(dtype), device)
                sdt = cs.state_dtype(stat, dtype)
                per_block = cs.BLOCK * (16 // np.dtype(dtype).itemsize) * cs.ROW_UNROLL
                parts = cupy.empty(16 * sms * sdt.itemsize, dtype=np.uint8)
                out = cupy.empty((), cs.result_dtype(stat, dtype))

                def rows_kernel(x, splits):
                    ks["rows"](splits, cs.BLOCK, (x, np.int64(n), np.int64(0), np.int64(n), np.int32(splits), parts))

                for per_sm in (2, 3, 4, 5, 6, 8):
                    splits = min(per_sm * sms, -(-n // per_block))
                    row(stat, dtype, log2n, f"rows kernel, {per_sm} blocks/SM",
                        h.time_gpu(lambda x, s=splits: rows_kernel(x, s), xs), roof)
                splits = min(cs.BLOCKS_PER_SM * sms, -(-n // per_block))

                def both(x):
                    rows_kernel(x, splits)
                    ks["fold"](1, cs.BLOCK, (parts, np.int64(1), np.int64(splits), np.int64(1), np.int64(0), np.uint64(0),
                                             out, np.float64(0), np.int32(cs._MOMENTS.get(stat, 0))))

                row(stat, dtype, log2n, "rows + fold", h.time_gpu(both, xs), roof)
                arrivals = cupy.zeros(1, dtype=np.uint32)
                whole_kernel = kernels.get_standalone_kernels(cs.WHOLE_ENTRY, {"w": cs.whole_name(stat, dtype)})["w"]

                def whole(x):
                    whole_kernel(splits, cs.BLOCK, (x, np.int64(n), parts, arrivals, out, np.float64(0),
                                                   np.int32(cs._MOMENTS.get(stat, 0))))

                row(stat, dtype, log2n, "whole (one launch: the last block folds)", h.time_gpu(whole, xs), roof)
                row(stat, dtype, log2n, "call", h.time_gpu(getattr(mr, stat), xs), roof)
            for stat in ("nanmax", "nanvar"):
                row(stat, dtype, log2n, "call (probe, then the reduction)", h.time_gpu(getattr(mr, stat), xs), roof)
                probe_from, statistics.PROBE_MIN_SIZE = statistics.PROBE_MIN_SIZE, 1 << 62
                try:
                    row(stat, dtype, log2n, "call, waiting for the result (no probe)", h.time_gpu(getattr(mr, stat), xs),
                        roof)
                finally:
                    statistics.PROBE_MIN_SIZE = probe_from
            del xs
    return rows


#: interleaved rounds of the CPU rows (each round times ours once and NumPy's once)
CPU_ROUNDS = 5
#: (statistic, data kind): 'normal' 3 + N(0, 1), 'nan' the same with 1% NaN, 'sparse' 10% non-zero,
#: 'zeros1' zeros but one non-zero near the end (any reads everything), 'ones0' ones but one zero near
#: the end (so does all), 'unique' a unique extreme at a random place
CPU_STATS = (("var", "normal"), ("std", "normal"), ("mean", "normal"), ("nanmean", "nan"), ("nanvar", "nan"),
             ("nanstd", "nan"), ("nansum", "nan"), ("nanmin", "nan"), ("nanmax", "nan"), ("argmax", "unique"),
             ("argmin", "unique"), ("count_nonzero", "sparse"), ("any", "zeros1"), ("all", "ones0"))


def _cpu_data(kind, base, rng):
    """``base`` (3 + N(0, 1), made once per dtype) copied and shaped into ``kind``."""
    x = base.copy()
    n = x.size
    if kind == "nan":
        x[rng.random(n) < 0.01] = np.nan
    elif kind == "sparse":
        x[rng.random(n) < 0.9] = 0
    elif kind == "zeros1":
        x[...] = 0
        x[n - 5] = 1
    elif kind == "ones0":
        x[...] = 1
        x[n - 5] = 0
    elif kind == "unique":
        x[int(rng.integers(0, n))] = 100.0
        x[int(rng.integers(0, n))] = -100.0
    return x


def _cpu_check(name, got, x):
    """``got`` against NumPy's function of the float64 data: exact for indices, counts and truth values,
    1e-6 relative (float32 results round once) for the rest."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = getattr(np, name)(x.astype(np.float64))
    if name in ("argmax", "argmin", "count_nonzero", "any", "all", "nanmin", "nanmax"):
        return bool(np.asarray(got) == ref)
    return abs(float(got) - float(ref)) <= 1e-6 * abs(float(ref))


def _cpu_time(fns, x):
    """{label: median ms}: one call of each of ``fns`` per round, in turn, CPU_ROUNDS rounds after a warm-up."""
    import time

    samples = {label: [] for label in fns}
    for fn in fns.values():
        fn(x)
    for _ in range(CPU_ROUNDS):
        for label, fn in fns.items():
            start = time.perf_counter()
            fn(x)
            samples[label].append((time.perf_counter() - start) * 1e3)
    return {label: statistics.median(t) for label, t in samples.items()}


def run_cpu(quick: bool) -> list:
    """``--cpu``: our statistics of NumPy (and Dask) input against NumPy's, one table."""
    import warnings

    import dask
    import dask.array as da

    n = 1 << (20 if quick else 24)
    rng = np.random.default_rng(0)
    header = ("statistic", "input", "dtype", "n", "multireduce ms", "numpy ms", "x numpy", "ok")
    rows = []
    print(h.md_table(header, []), end="")

    def row(name, where, dtype, ms_ours, ms_np, ok):
        rows.append((name, where, np.dtype(dtype).name, h.log2_text(n), f"{ms_ours:.2f}", f"{ms_np:.2f}",
                     f"{ms_np / ms_ours:.2f}", ok))
        print(h.md_table(header, rows[-1:]).splitlines()[-1], flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for dtype in (np.float32, np.float64):
            base = (3.0 + rng.standard_normal(n)).astype(dtype)
            for name, kind in CPU_STATS:
                x = _cpu_data(kind, base, rng)
                ours, theirs = getattr(mr, name), getattr(np, name)
                ok = _cpu_check(name, ours(x), x)
                t = _cpu_time({"ours": ours, "numpy": theirs}, x)
                row(name, "numpy", dtype, t["ours"], t["numpy"], ok)
            with dask.config.set(scheduler="synchronous"):
                for name, kind in (("var", "normal"), ("nanmean", "nan")):
                    x = _cpu_data(kind, base, rng)
                    d = da.from_array(x, chunks=-(-n // 4))
                    ours, theirs = getattr(mr, name), getattr(np, name)
                    ok = _cpu_check(name, ours(d).compute(), x)
                    t = _cpu_time({"ours": lambda _: ours(d).compute(), "numpy": theirs}, x)
                    row(name, "dask, 4 chunks", dtype, t["ours"], t["numpy"], ok)
    return rows


def main(argv=None) -> list:
    profiles = {"call": ("host microseconds of one statistics call, and cProfile", profile_call),
                "kernels": ("the statistics kernels' GPU time, piece by piece", profile_kernels)}
    p = h.parser("stats", __doc__, "2^24 and 2^26 only (with --cpu: 2^20)", None,
                 {k: what for k, (what, _) in profiles.items()})
    p.add_argument("--cpu", action="store_true", help="NumPy input against NumPy at 2^24, no GPU")
    args = p.parse_args(argv)
    if args.cpu:
        return run_cpu(args.quick)
    return h.run_suite("stats", __doc__, argv, run, quick="2^24 and 2^26 only", profiles=profiles)


def run(args, cupy, torch, env) -> list:
    sizes = [1 << 24, 1 << 26] if args.quick else [1 << 26, 1 << 28]
    rows: list[h.Row] = []
    summary = []
    for dtype in (np.float32, np.float64):
        for n in sizes:
            nbytes = n * np.dtype(dtype).itemsize
            # the roof: copy GB/s (bytes read + written) against a reduction's GB/s of bytes read
            read_roof = copy = h.copy_roof(nbytes)
            rows.append(h.Row("copy", "cupy copy", np.dtype(dtype).name, n, 2 * nbytes / copy / 1e6, copy, 1.0, True))
            for family, kind, impls, check, reference in _families(cupy, torch):
                xs = [_data(cupy, kind, n, dtype, seed) for seed in range(2)]  # 2 x >= 256 MiB: far above L2
                ref = reference(xs[0])
                ours, best_other = None, None
                timings = _rounds(cupy, mr, impls, xs, check, ref)
                for impl, fn in impls.items():
                    ms, ok, failure = timings[impl]
                    if failure:  # recorded, the run goes on
                        rows.append(h.Row(family, impl, np.dtype(dtype).name, n, math.nan, math.nan, ok=False,
                                          note=f"failed: {failure}"))
                        continue
                    gbps = nbytes / ms / 1e6
                    rows.append(h.Row(family, impl, np.dtype(dtype).name, n, ms, gbps, gbps / read_roof, ok))
                    if impl == "multireduce":
                        ours = ms
                    elif fn is not None and (best_other is None or ms < best_other[1]):
                        best_other = (impl, ms)
                summary.append((family, np.dtype(dtype).name, n, ours, nbytes / ours / 1e6 / read_roof if ours else math.nan,
                                best_other))
                del xs
                cupy.get_default_memory_pool().free_all_blocks()
    h.save(rows, "bench_stats", env)
    print(h.markdown(rows, columns=("family", "impl", "dtype", "n", "ms", "gbps", "ratio_copy", "ok", "note")))
    print("\nSummary (target: >= 0.9 x copy roof, and >= 1 x the fastest of CuPy/torch)\n")
    print(h.md_table(("statistic", "dtype", "n", "ms", "x copy roof", "fastest other", "x fastest other"),
                     ((family, dt, h.log2_text(n), f"{ours or math.nan:.4g}", f"{roof:.3f}",
                       f"{other[0] if other else '-'} {other[1] if other else math.nan:.4g}",
                       f"{other[1] / ours if ours and other else math.nan:.3f}")
                      for family, dt, n, ours, roof, other in summary)))
    return rows

