"""Segmented sums and segmented inclusive scans on one GPU: 2^28 float32 elements cut into 2^10, 10^5,
2^20 and 10^7 segments of random lengths; multireduce's element-balanced kernels against CuPy
(``cupy.add.reduceat`` where CuPy has it, else an inclusive float64 scan and a difference at the
segment ends; for the scan, the same float64 cumsum minus its value before each segment, spread by a
second cumsum) and ``torch.segment_reduce`` (lengths form; PyTorch has no segmented scan), with the
copy roof beside them. CUDA events, median of repeats, every timed result checked against a float64
reference first. Offsets live on the GPU for every implementation.

Rows: "multireduce" is the public call (the offsets are checked on the GPU first: one small kernel and
one 4-byte copy back, a wait the kernels themselves do not need); "multireduce kernels" is the backend
call without that check (the scan's "direct stores" row: each thread stores its own outputs instead
of a warp's through shared memory, cupy_segment.STAGED_STORES=False; "deterministic": the three-pass
form, tile folds, their scan, a rescan, reading the data twice). For reductions ``ratio_copy`` counts the data read (n * 4 bytes) against the
copy roof, as the other reduction tables do, and the note adds offsets and results; for scans it counts
the data read and written (2 * n * 4 bytes), as the scan tables do. "cupy cumsum (no segments)" is
CuPy's plain float32 scan of the same data, for scale.

    python -m benchmarks segments [--quick]
    python -m benchmarks segments --profile kernels | call

``--profile kernels`` (for ncu, ``benchmarks/run_gpu.sh segprofile``): segment_reduce and segment_scan at
2^28 float32 with 2^10, 10^5, 2^20 and 10^7 random segments, where the segmented kernels lose against the copy
roof. Each kernel runs once per configuration, so the ncu report has one entry per kernel and
configuration: the modules are compiled beforehand without launching anything, and the backend is
called directly (no offset check). Launches matching "segment_", in order, per segment count:
segment_tile_starts, segment_reduce_tiles, segment_carry_totals, segment_carry_apply (the reduction),
segment_tile_starts, segment_scan_tiles (the one-pass scan); at 10^5 segments also the deterministic
scan: segment_tile_starts, segment_scan_tiles (totals), segment_carry_totals, segment_carry_apply,
segment_scan_tiles (rescan). 29 launches in all (run_gpu.sh profiles 30).

``--profile call`` (``benchmarks/run_gpu.sh segcall``): where mr.segment_reduce / mr.segment_scan spend
host time: the public call against the backend's kernels alone, at a size where the host dominates (2^16
float32, 10^3 segments), single-call latency (time_host) and pipelined device time (time_gpu), then a
cProfile of the public call.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import multireduce as mr
from benchmarks import harness as h
from multireduce.backends import cupy_segment
from multireduce.operators import get_operator

SEGMENTS = (2**10, 10**5, 2**20, 10**7)
# the goal per segment count, a fraction of the copy roof: the reduction's, and the scan's
TARGET = {2**10: 0.85, 10**5: 0.8, 2**20: 0.85, 10**7: 0.5}
SCAN_TARGET = {2**10: 0.8, 10**5: 0.8, 2**20: 0.8, 10**7: 0.5}


def target_note(ratio: float, target: float) -> str:
    return f"; target {target} x: {'met' if ratio >= target else 'NOT met'}"


def count_label(m: int) -> str:
    """A segment count as the tables write it: 10^k or 2^k where it is one, else the number."""
    for base in (10, 2):
        k = round(math.log(m, base)) if m > 0 else 0
        if m > 1 and base ** k == m:
            return f"{base}^{k}"
    return str(m)


def profile_kernels() -> None:
    """``--profile kernels``: each segment kernel launched once per segment count, for ncu."""
    import cupy

    n = 1 << 28
    f32 = np.dtype(np.float32)
    op = get_operator("sum")
    for names in (cupy_segment.segment_names(f32, f32, op), cupy_segment.scan_names(f32, f32, f32, op),
                  cupy_segment.scan_names(f32, f32, f32, op, deterministic=True)):
        cupy_segment._kernels_for(op, names)  # compile now: no launch before the measured ones
    x = cupy.random.random(n, dtype=cupy.float32)
    rng = np.random.default_rng(0)
    for m in SEGMENTS:
        offsets = cupy.asarray(np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64))
        cupy_segment.segment_reduce(x, offsets, op, f32)
        cupy_segment.segment_scan(x, offsets, op, f32, f32, deterministic=False)
        if m == 10**5:
            cupy_segment.segment_scan(x, offsets, op, f32, f32, deterministic=True)
        cupy.cuda.Device().synchronize()


def profile_call() -> None:
    """``--profile call``: host latency and pipelined device time of the public segment calls against the
    kernels alone, then cProfile of 500 public calls."""
    import cupy

    n, m = 1 << 16, 1000
    rng = np.random.default_rng(0)
    xs = [cupy.asarray(rng.random(n, dtype=np.float32)) for _ in range(4)]
    starts = cupy.asarray(np.sort(rng.choice(n, m, replace=False)).astype(np.int64))
    op, f32 = get_operator("sum"), np.dtype(np.float32)
    impls = {"mr.segment_reduce": lambda v: mr.segment_reduce(v, starts),
             "kernels (segment_reduce)": lambda v: cupy_segment.segment_reduce(v, starts, op, f32),
             "mr.segment_scan": lambda v: mr.segment_scan(v, starts),
             "kernels (segment_scan)": lambda v: cupy_segment.segment_scan(v, starts, op, f32, f32),
             "cupy.sum (reference launch)": lambda v: cupy.sum(v)}
    print(h.md_table(("call", "host latency us", "pipelined device us"),
                     ((name, f"{h.time_host(fn, xs, repeats=200) * 1e3:.1f}", f"{h.time_gpu(fn, xs, repeats=20) * 1e3:.1f}")
                      for name, fn in impls.items())))
    for name in ("mr.segment_reduce", "mr.segment_scan"):
        inputs = itertools.cycle(xs)
        text = h.cprofiled(lambda: impls[name](next(inputs)), 500)
        cupy.cuda.Device().synchronize()
        print(f"\n### {name}: cProfile of 500 calls (tottime)\n" + "\n".join(text.splitlines()[6:30]))


def main(argv=None) -> list:
    return h.run_suite("segments", __doc__, argv, run, quick="2^24 elements",
                       profiles={"kernels": ("each segment kernel once per segment count, for ncu", profile_kernels),
                                 "call": ("host time of one segment call, and cProfile", profile_call)})


def run(args, cupy, torch, env) -> list:
    rows: list[h.Row] = []
    n = 1 << (28 if not args.quick else 24)
    nbytes = 4 * n
    copy = h.copy_roof(nbytes)
    rows.append(h.Row("copy", "cupy copy", "float32", n, 2 * nbytes / copy / 1e6, copy, 1.0, True))
    xs = h.buffers(lambda i: cupy.random.random(n, dtype=cupy.float32), nbytes, max_buffers=2)
    total = cupy.concatenate([cupy.zeros(1, cupy.float64), cupy.cumsum(xs[0], dtype=cupy.float64)])
    add_op = get_operator("sum")
    reduceat = getattr(cupy.add, "reduceat", None)

    for m in SEGMENTS:
        if m >= n:
            continue
        offsets, lengths, starts, ends, want = segment_case(cupy, total, n, m)  # data in [0, 1): sum = mass
        moved = nbytes + 12 * m  # data, int64 offsets, float32 results

        def check(got):
            got = cupy.asnumpy(cupy.asarray(got)).astype(np.float64)
            return got.shape == want.shape and bool(np.all(np.abs(got - want) <= 1e-4 * (want + 1)))

        def cumsum_diff(v):
            c = cupy.concatenate([cupy.zeros(1, cupy.float64), cupy.cumsum(v, dtype=cupy.float64)])
            return (c[ends] - c[starts]).astype(cupy.float32)

        impls = {
            "multireduce": lambda v: mr.segment_reduce(v, starts),
            "multireduce kernels": lambda v: cupy_segment.segment_reduce(v, starts, add_op, np.float32),
        }
        if reduceat is not None:
            impls["cupy add.reduceat"] = lambda v: reduceat(v, starts)
        impls["cupy cumsum-diff"] = cumsum_diff
        if torch is not None:
            lengths_t = torch.as_tensor(lengths, device="cuda")
            impls["torch segment_reduce"] = lambda v: torch.segment_reduce(torch.as_tensor(v, device="cuda"), "sum",
                                                                           lengths=lengths_t)
        for name, fn in impls.items():
            family = f"segments m={count_label(m)}"
            try:
                ok = check(fn(xs[0]))
                ms = h.time_gpu(fn, xs, repeats=7, warmup=2)
            except Exception as exc:  # a prototype API (torch) or a CuPy without reduceat: record, go on
                rows.append(h.Row(family, name, "float32", n, float("nan"), float("nan"), ok=False,
                                  note=f"failed: {type(exc).__name__}: {str(exc)[:60]}"))
                continue
            gbps = nbytes / ms / 1e6
            row = h.Row(family, name, "float32", n, ms, gbps, gbps / copy, ok,
                        note=f"all bytes {moved / ms / 1e6 / copy:.3f} x copy")
            row.extra = {"segments": m, "target": TARGET.get(m)}
            if name.startswith("multireduce") and m in TARGET:
                row.note += target_note(gbps / copy, TARGET[m])
            rows.append(row)
        del starts, ends
    del total
    rows += _scan_rows(cupy, xs, n, copy)
    h.save(rows, "bench_segments", env)
    print(h.markdown(rows, columns=("family", "impl", "n", "ms", "gbps", "ratio_copy", "ok", "note")))
    return rows


def segment_case(cupy, running_total, n: int, m: int):
    """One segment count's case, shared with bench_cub so the two tables line up: the offsets, lengths,
    device starts and ends, and the float64 reference sums from a running total with a leading zero."""
    offsets = _offsets(n, m)
    lengths = np.diff(np.append(offsets, n))
    starts = cupy.asarray(offsets)
    ends = cupy.asarray(np.append(offsets[1:], n))
    want = cupy.asnumpy(running_total[ends] - running_total[starts])
    return offsets, lengths, starts, ends, want


def _offsets(n: int, m: int) -> np.ndarray:
    """m ascending distinct start offsets, the first 0, of random lengths (the same for every table)."""
    rng = np.random.default_rng(m)
    pool = np.unique(rng.integers(1, n, 2 * m))  # distinct cuts without a 2^28-entry permutation
    cuts = np.sort(pool[rng.choice(pool.size, m - 1, replace=False)])
    return np.concatenate([[0], cuts]).astype(np.int64)


def _scan_rows(cupy, xs, n: int, copy: float) -> list:
    """Segmented inclusive sums: ours (public call, kernels) against the CuPy formulation, checked on the
    GPU against a float64 reference (the CuPy formulation in float64) within 1e-4 of the running mass."""
    rows = []
    add_op = get_operator("sum")
    moved = 2 * 4 * n  # float32 read and written
    for m in SEGMENTS:
        if m >= n:
            continue
        starts = cupy.asarray(_offsets(n, m))

        def cumsum_segments(v, dtype=cupy.float32):
            c = cupy.cumsum(v, dtype=cupy.float64)
            before = cupy.concatenate([cupy.zeros(1, cupy.float64), c[starts[1:] - 1]])  # c before each segment
            spread = cupy.zeros(n, cupy.float64)
            spread[starts] = cupy.diff(before, prepend=0.0)
            return (c - cupy.cumsum(spread)).astype(dtype)

        want = cumsum_segments(xs[0], cupy.float64)  # data in [0, 1): the running sum is the mass too

        def check(got):
            got = cupy.asarray(got)
            return got.shape == want.shape and bool((cupy.abs(got.astype(cupy.float64) - want) <= 1e-4 * (want + 1)).all())

        impls = {
            "multireduce": lambda v: mr.segment_scan(v, starts),
            "multireduce kernels": lambda v: cupy_segment.segment_scan(v, starts, add_op, np.float32, np.float32),
            "multireduce kernels, direct stores": lambda v: cupy_segment.segment_scan(v, starts, add_op, np.float32,
                                                                                     np.float32, staged=False),
            "multireduce kernels, deterministic": lambda v: cupy_segment.segment_scan(v, starts, add_op, np.float32,
                                                                                     np.float32, deterministic=True),
            "cupy cumsum-segments": cumsum_segments,
            "cupy cumsum (no segments)": lambda v: cupy.cumsum(v),
        }
        family = f"segment scan m={count_label(m)}"
        for name, fn in impls.items():
            try:
                ok = check(fn(xs[0])) if "no segments" not in name else True
                ms = h.time_gpu(fn, xs, repeats=7, warmup=2)
            except Exception as exc:  # record, go on
                rows.append(h.Row(family, name, "float32", n, float("nan"), float("nan"), ok=False,
                                  note=f"failed: {type(exc).__name__}: {str(exc)[:60]}"))
                continue
            gbps = moved / ms / 1e6
            row = h.Row(family, name, "float32", n, ms, gbps, gbps / copy, ok, note="read + written vs copy")
            row.extra = {"segments": m, "target": SCAN_TARGET.get(m)}
            if name.startswith("multireduce") and m in SCAN_TARGET:
                row.note += target_note(gbps / copy, SCAN_TARGET[m])
            rows.append(row)
        del starts, want
        cupy.get_default_memory_pool().free_all_blocks()
    return rows

