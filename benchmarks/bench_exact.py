"""Exact sum/cumsum against the plain kernels (NumPy on the CPU; CuPy/torch and multireduce on a GPU).

    python -m benchmarks exact [--quick] [--gpu]
    python -m benchmarks exact --gpu-exact [--quick | --logs 26,28]
    python -m benchmarks exact --gpu-exact-cumsum [--logs 24,26,28]
    python -m benchmarks exact --profile shapes [--quick] | terms | ncu | call | scan | latency

--gpu-exact: the exact GPU sum (kernels/exact.cuh) against our plain sum, cupy.sum and torch.sum on the
same device array, float32/float64, 2^20..2^30 elements, uniform / normal / ill-conditioned (condition
number ~1e16) / 90-orders-of-magnitude data; median of repeats timed with CUDA events; bandwidth and the
ratio to the plain sum's; "exact kernel" is the kernel alone (device words), "exact" the whole call
(words to the host, fold, rounding). A table is printed last.

--gpu-exact-cumsum: the exact GPU cumsum (kernels/exact_scan.cuh, mr.cumsum(exact=True)) against the plain
mr.cumsum and cupy.cumsum, float32/float64, uniform / normal / ill-conditioned, 2^24/2^26/2^28; CUDA-event
medians; bandwidth counts the input read and the output written once; the goal: exact >= 0.5 x plain.

Data: uniform, normal, and ill-conditioned (condition number ~1e16: large terms that cancel, leaving
small ones). Prints one line per (device, dtype, data, n, function): best-of-3 seconds and the ratio
to the plain sum/cumsum of the same input.

Profiles (one GPU):

- ``shapes``: where the exact sum kernel (kernels/exact.cuh) spends its time: its bandwidth at 2^26 and
  2^28 against the plain sum for expansion lengths (TERMS), unrolls and blocks per SM (device_words'
  blocks_per_sm knob, capped by the kernel's resident blocks per SM), on uniform, normal and range90 data
  (``--quick``: 2^26 only, terms 4, unroll 2/4/8, blocks per SM 2/4/8).
- ``terms``: 2^26, expansion lengths 4/6/8 on all four data kinds, each dtype's shipped unroll and the
  next lower, 2/4 blocks per SM.
- ``ncu``: one exact-sum launch pair per dtype at 2^26, for Nsight Compute.
- ``call``: where the host time of one exact=True sum of CuPy data goes (the whole call minus the kernel is
  what the "exact" row pays on top of "exact kernel"): cProfile of repeated calls at 2^20 float32, the
  heaviest functions by own and by cumulative time.
- ``scan``: where the exact GPU cumsum spends its time: each of device_cumsum's steps (tile words, the
  carries, seeds, pass 2, its retry, fallback walk) timed with CUDA events at 2^26 and 2^28 elements,
  float32 uniform and normal and float64 uniform data, beside the plain mr.cumsum and the whole exact call
  (and their ratio); median of 5 single calls, and the two calls back to back (``harness.time_gpu``).
- ``latency``: the exact sum against the plain sum at 2^26 and 2^28, float32 and float64 normal data, one
  call's latency (events around a call) and back to back (events around 20 calls), and the host time of one
  call at 2^10.
"""

from __future__ import annotations

import time

import numpy as np

import multireduce as mr
from benchmarks import harness as h
from multireduce import exact


def make(kind: str, n: int, dtype, rng):
    if kind == "uniform":
        x = rng.random(n)
    elif kind == "normal":
        x = rng.standard_normal(n)
    else:  # ill-conditioned: sum |x| / |sum x| ~ 1e16
        half = rng.standard_normal(n // 2) * 1e8
        x = np.concatenate([half, -half, rng.standard_normal(n - 2 * (n // 2)) + 1e-8])
        x[0] += 1e-8
        rng.shuffle(x)
    return x.astype(dtype)


def best(f, repeat=3, sync=lambda: None):
    t = float("inf")
    for _ in range(repeat):
        sync()
        s = time.perf_counter()
        f()
        sync()
        t = min(t, time.perf_counter() - s)
    return t


def make_gpu(kind: str, n: int, dtype):
    """Device data, generated on the GPU (2^30 float64 stays off the host)."""
    import cupy

    rs = cupy.random.RandomState(1)
    if kind == "uniform":
        x = rs.random_sample(n)
    elif kind == "normal":
        x = rs.standard_normal(n)
    elif kind == "ill":  # large terms that cancel, small survivors: sum |x| / |sum x| ~ 1e16
        half = rs.standard_normal(n // 2) * 1e8
        x = cupy.concatenate([half, -half, rs.standard_normal(n - 2 * (n // 2)) + 1e-8])
        x[0] += 1e-8
        x = x[rs.permutation(n)]
    else:  # range90: |x| from 1e-45 to 1e45, both signs (float32: clipped to its range)
        lo = -45 if dtype == np.float64 else -37
        hi = 45 if dtype == np.float64 else 37
        x = cupy.where(rs.random_sample(n) < 0.5, -1.0, 1.0) * 10.0 ** rs.uniform(lo, hi, n)
    return x.astype(dtype)


def median_ms(f, repeat: int) -> float:
    import cupy

    f()  # warm: compile, pools
    times = []
    for _ in range(repeat):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def gpu_cases(kinds, logs):
    """(dtype, kind, log2 n, device data, repeats) for each case that fits the GPU; the pool's free blocks
    go back to the driver after each (at most two cases' arrays are alive at once)."""
    import cupy

    for dtype in (np.float32, np.float64):
        for kind in kinds:
            for lg in logs:
                try:
                    g = make_gpu(kind, 1 << lg, dtype)
                except cupy.cuda.memory.OutOfMemoryError:
                    print(f"gpu {np.dtype(dtype)} {kind} 2^{lg}: skipped (device memory)")
                    continue
                yield np.dtype(dtype), kind, lg, g, (21 if lg <= 26 else 7)
                del g
                cupy.get_default_memory_pool().free_all_blocks()


def record(rows, case, times, nbytes, label=""):
    """One line per timing of ``case`` (dtype, kind, lg), with GB/s over ``nbytes`` and the ratio to plain."""
    dtype, kind, lg = case
    for name, ms in times.items():
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.append((dtype.name, kind, lg, name, ms, gbs, times["plain"] / ms))
        print(f"gpu {dtype} {kind:8s} 2^{lg}: {label}{name:13s} {ms:9.4f} ms {gbs:8.1f} GB/s "
              f"{times['plain'] / ms:5.2f} x plain", flush=True)


def by_case(rows):
    by = {}
    for dt, kind, lg, name, ms, gbs, ratio in rows:
        by.setdefault((dt, kind, lg), {})[name] = (gbs, ratio)
    return by


def gpu_exact(quick: bool, logs=None):
    import cupy

    from multireduce.backends import cupy_exact

    try:
        import torch
    except ImportError:
        torch = None
    logs = logs or ([20, 22, 24] if quick else [20, 22, 24, 26, 28, 30])
    rows = []
    for dtype, kind, lg, g, repeat in gpu_cases(("uniform", "normal", "ill", "range90"), logs):
        n = g.size
        t = {
            "plain": median_ms(lambda: mr.sum(g), repeat),
            "cupy": median_ms(lambda: cupy.sum(g), repeat),
            "exact kernel": median_ms(lambda: cupy_exact.device_words(g.reshape(1, n)), repeat),
            "exact": median_ms(lambda: mr.sum(g, exact=True), repeat),
        }
        if torch is not None:
            tg = torch.as_tensor(g, device="cuda")
            t["torch"] = median_ms(lambda: torch.sum(tg), repeat)
            del tg
        # the exact result is the correctly rounded one: check it against the CPU path at small n
        if lg <= 22:
            assert cupy.asnumpy(mr.sum(g, exact=True)).tobytes() == np.asarray(
                exact.sum(cupy.asnumpy(g))).tobytes(), (dtype, kind, lg)
        record(rows, (dtype, kind, lg), t, g.nbytes)
    print("\n| dtype | data | n | exact kernel GB/s | exact GB/s | plain GB/s | cupy GB/s | torch GB/s "
          "| exact kernel / plain | exact / plain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (dt, kind, lg), r in by_case(rows).items():
        def cell(name, k=0):
            return f"{r[name][k]:.0f}" if name in r else "-"
        print(f"| {dt} | {kind} | 2^{lg} | {cell('exact kernel')} | {cell('exact')} | {cell('plain')} | {cell('cupy')} "
              f"| {cell('torch')} | {r['exact kernel'][1]:.2f} | {r['exact'][1]:.2f} |")


def gpu_exact_cumsum(logs=None):
    import cupy

    from multireduce.backends import cupy_exact

    logs = logs or [24, 26, 28]
    rows = []
    for dtype, kind, lg, g, repeat in gpu_cases(("uniform", "normal", "ill"), logs):
        rows2 = g.reshape(1, g.size)
        t = {
            "plain": median_ms(lambda: mr.cumsum(g), repeat),
            "cupy": median_ms(lambda: cupy.cumsum(g), repeat),
            "exact kernels": median_ms(lambda: cupy_exact.device_cumsum(rows2, g.dtype), repeat),
            "exact": median_ms(lambda: mr.cumsum(g, exact=True), repeat),
        }
        if lg <= 20:  # the host oracle is ~2 us per element
            assert cupy.asnumpy(mr.cumsum(g, exact=True)).tobytes() == exact.cumsum(cupy.asnumpy(g)).tobytes()
        record(rows, (dtype, kind, lg), t, 2 * g.nbytes, "cumsum ")  # read once, written once
    print("\n| dtype | data | n | exact GB/s | exact kernels GB/s | plain mr.cumsum GB/s | cupy.cumsum GB/s "
          "| exact / plain |")
    print("|---|---|---|---|---|---|---|---|")
    for (dt, kind, lg), r in by_case(rows).items():
        print(f"| {dt} | {kind} | 2^{lg} | {r['exact'][0]:.0f} | {r['exact kernels'][0]:.0f} | {r['plain'][0]:.0f} "
              f"| {r['cupy'][0]:.0f} | {r['exact'][1]:.2f} |")


def _reshape_kernel(terms: int, unroll: dict) -> None:
    from multireduce.backends import cupy_exact

    cupy_exact.TERMS, cupy_exact.UNROLL = terms, unroll
    cupy_exact._loaded.clear()


def profile_shapes(quick: bool, terms_only: bool) -> list:
    """``--profile shapes`` / ``terms``: the exact sum kernel's bandwidth against the plain sum for each
    expansion length, unroll and blocks per SM; the best per case against the shipped shape last."""
    import cupy

    from multireduce.backends import cupy_backend, cupy_exact

    shipped, shipped_unroll = (cupy_exact.TERMS, cupy_exact.BLOCKS_PER_SM), dict(cupy_exact.UNROLL)
    sizes, terms_swept, unroll_swept, per_sm_swept = (
        ((26,), (4,), (2, 4, 8), (2, 4, 8)) if quick else ((26, 28), (4, 6), (1, 2, 4, 8), (2, 3, 4, 8)))
    kinds = ("uniform", "normal", "range90")
    if terms_only:
        sizes, terms_swept, per_sm_swept, kinds = (26,), (4, 6, 8), (2, 4), ("uniform", "normal", "ill", "range90")
    for dtype in (np.float32, np.float64):
        kernel = cupy_exact._kernel(dtype)
        regs = getattr(kernel.fn, "attributes", {}).get("num_regs")
        print(f"{np.dtype(dtype).name}: {regs} registers, resident blocks per SM "
              f"{cupy_backend.scan_occupancy(kernel, cupy_exact.BLOCK)}", flush=True)
    rows = []
    for lg in sizes:
        for dtype in (np.float32, np.float64):
            for kind in kinds:
                g = make_gpu(kind, 1 << lg, dtype)
                flat = g.reshape(1, -1)
                plain = median_ms(lambda: mr.sum(g), 15)
                name = np.dtype(dtype).name
                unrolls = ((shipped_unroll[name], max(1, shipped_unroll[name] // 2)) if terms_only
                           else unroll_swept)
                for terms in terms_swept:
                    for unroll in unrolls:
                        _reshape_kernel(terms, {**shipped_unroll, name: unroll})
                        for per_sm in per_sm_swept:
                            ms = median_ms(lambda: cupy_exact.device_words(flat, blocks_per_sm=per_sm), 15)
                            rows.append((lg, name, kind, (terms, unroll, per_sm), ms, plain / ms))
                            print(f"2^{lg} {name} {kind:8s} terms={terms} unroll={unroll} per_sm={per_sm:2d}: "
                                  f"{ms:8.3f} ms {g.nbytes / ms / 1e6:7.0f} GB/s {plain / ms:5.2f} x plain", flush=True)
                _reshape_kernel(shipped[0], shipped_unroll)
                del g, flat
                cupy.get_default_memory_pool().free_all_blocks()
    by = {}
    for lg, dt, kind, shape, ms, ratio in rows:
        by.setdefault((lg, dt, kind), []).append((ratio, shape))
    lines = []
    for (lg, dt, kind), r in by.items():
        best = max(r)
        ship = (shipped[0], shipped_unroll[dt], shipped[1])
        lines.append((f"2^{lg}", dt, kind, ", ".join(map(str, best[1])), f"{best[0]:.2f}",
                      f"{next((x[0] for x in r if x[1] == ship), float('nan')):.2f}"))
    print()
    print(h.md_table(("n", "dtype", "data", "best terms, unroll, blocks/SM", "best x plain", "shipped x plain"), lines))
    return rows


def profile_ncu() -> None:
    """``--profile ncu``: two exact-sum kernel launches per dtype at 2^26."""
    import cupy

    from multireduce.backends import cupy_exact

    for dtype in (np.float32, np.float64):
        g = make_gpu("normal", 1 << 26, dtype)
        for _ in range(2):
            cupy_exact.device_words(g.reshape(1, -1))
    cupy.cuda.Device().synchronize()


def host_us_per_call(f, calls: int, until_done: bool) -> float:
    """Host microseconds per call of ``f`` called ``calls`` times back to back; ``until_done``: the wait for
    the GPU to finish the last one counted too."""
    import cupy

    start = time.perf_counter()
    for _ in range(calls):
        f()
    if until_done:
        cupy.cuda.Device().synchronize()
    us = 1e6 * (time.perf_counter() - start) / calls
    cupy.cuda.Device().synchronize()
    return us


def profile_call() -> None:
    """``--profile call``: host microseconds of the exact sum and its pieces, then cProfile of the call."""
    import cupy

    from multireduce.backends import cupy_exact

    g = make_gpu("normal", 1 << 20, cupy.float32)
    flat = g.reshape(1, -1)
    for _ in range(5):
        mr.sum(g, exact=True)
    cupy.cuda.Device().synchronize()
    calls = 300
    for label, f in (("mr.sum(exact=True)", lambda: mr.sum(g, exact=True)),
                     ("device_words + get", lambda: cupy_exact.device_words(flat).get()),
                     ("cupy_exact.state_of", lambda: cupy_exact.state_of(g, (0,))),
                     ("mr.sum", lambda: float(mr.sum(g)))):
        print(f"{label:22s} {host_us_per_call(f, calls, until_done=True):8.1f} us per call (host wall)")
    for sort, lines in (("tottime", 18), ("cumulative", 25)):
        print(h.cprofiled(lambda: mr.sum(g, exact=True), calls, sort, lines))


def profile_scan() -> list:
    """``--profile scan``: device_cumsum's steps replayed and timed one by one, beside mr.cumsum and the
    whole exact call."""
    import cupy

    from multireduce.backends import cupy_exact as ce

    def steps(x, dt):
        rows, n = x.shape
        k = ce._scan_kernels(x.dtype, dt)
        tile = ce.scan_tile(x.dtype, dt)
        tiles = -(-n // tile)
        count = rows * tiles
        i64 = np.int64
        words = cupy.zeros((rows, tiles + 1, ce.KTILEOUT), dtype=np.int64)  # slot 0 of a row: a zero carry
        seeds = cupy.empty(count * 4, dtype=np.int64)
        out = cupy.empty((rows, n), dtype=dt)
        marked = cupy.empty(count, dtype=np.int32)
        state = {}
        yield "tile words", lambda: k["words"](int(min(-(-count // ce.SCAN_WARPS), 1 << 20)), ce.SCAN_WARPS * 32,
                                               (x, i64(rows), i64(n), i64(tile), i64(tiles), words))
        if "carries" in k:
            state["cum"] = cupy.empty_like(words)  # scanned in place: from a copy of the words each time
            yield "carries (and a copy of the words)", lambda: (state["cum"].__setitem__(Ellipsis, words), k["carries"](
                rows * ce.KTILEOUT, ce.CARRY_BLOCK, (state["cum"], i64(rows), i64(tiles + 1))))
        else:  # code before exact_words_cumsum
            yield "carries (cupy.cumsum)", lambda: state.__setitem__("cum", cupy.ascontiguousarray(
                cupy.cumsum(words, axis=1)))
        yield "seeds", lambda: k["seeds"](int(min(-(-count // ce.SEED_BLOCK), 1 << 16)), ce.SEED_BLOCK,
                                          (state["cum"], i64(count), i64(tiles), np.int32(0), seeds))
        yield "pass 2", lambda: k["tiles"](int(min(count, (1 << 31) - 1)), ce.SCAN_BLOCK,
                                           (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(0), out, marked))
        after = marked
        if "retry" in k:  # the tiles pass 2's tile-wide fast path gave up, from a copy of its marks each time
            after = cupy.empty_like(marked)
            yield "pass 2 retry (and a copy of the marks)", lambda: (after.__setitem__(Ellipsis, marked), k["retry"](
                int(min(count, ce._RETRY_GRID)), ce.SCAN_BLOCK,
                (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(0), out, after)))
        yield "fallback walk", lambda: k["fallback"](int(min(count, ce._FALLBACK_GRID)), 32,
                                                     (x, i64(rows), i64(n), i64(tile), i64(tiles), state["cum"],
                                                      after, out))

    rows = []
    header = ("dtype", "data", "n", "step", "ms")
    print(h.md_table(header, []), end="")
    for dtype, data in ((np.float32, "uniform"), (np.float32, "normal"), (np.float64, "uniform")):
        for log in (26, 28):
            if data == "normal":
                x = cupy.random.standard_normal((1, 1 << log), dtype=np.float64).astype(dtype)
            else:
                x = cupy.random.random((1, 1 << log), dtype=np.float64).astype(dtype)
            mr.cumsum(x[0], exact=True)  # load the kernels
            total = 0.0
            found = []
            for name, fn in steps(x, np.dtype(dtype)):
                ms = median_ms(fn, 5)  # its first call makes what the next step reads
                total += ms
                found.append((name, ms))
            plain = median_ms(lambda: mr.cumsum(x[0]), 5)
            whole = median_ms(lambda: mr.cumsum(x[0], exact=True), 5)
            # back to back (harness.time_gpu: batches of calls, median of 20): steadier than one call's
            # latency, whose host time spreads the plain call by up to a third between runs
            plain_piped = h.time_gpu(lambda a: mr.cumsum(a), [x[0]])
            whole_piped = h.time_gpu(lambda a: mr.cumsum(a, exact=True), [x[0]])
            found += [("sum of steps", total), ("plain mr.cumsum", plain), ("mr.cumsum(exact=True)", whole),
                      ("plain mr.cumsum, back to back", plain_piped),
                      ("mr.cumsum(exact=True), back to back", whole_piped)]
            for name, ms in found:
                rows.append((np.dtype(dtype).name, data, f"2^{log}", name, f"{ms:.3f}"))
                print(h.md_table(header, rows[-1:]).splitlines()[-1], flush=True)
            for name, ratio in (("exact call x plain", plain / whole),
                                ("exact x plain, back to back", plain_piped / whole_piped)):
                rows.append((np.dtype(dtype).name, data, f"2^{log}", name, f"{ratio:.3f}"))
                print(h.md_table(header, rows[-1:]).splitlines()[-1], flush=True)
            del x
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def profile_latency() -> list:
    """``--profile latency``: the exact sum against the plain sum of the same normal data at 2^26 and 2^28,
    float32 and float64: one call's latency (CUDA events around a call, as ``--gpu-exact`` times it) and
    back to back (events around 20 calls, per call), and the host time of one call at 2^10."""
    import cupy

    def back_to_back(f, calls=20, repeat=5):
        f()
        times = []
        for _ in range(repeat):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(calls):
                f()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
        return float(np.median(times))

    rng = cupy.random.default_rng(0)
    header = ("dtype", "n", "plain latency us", "exact latency us (x plain)", "plain back to back us",
              "exact back to back us (x plain)")
    rows = []
    print(h.md_table(header, []), end="")
    for dtype in (np.float32, np.float64):
        for lg in (26, 28):
            g = rng.standard_normal(1 << lg, dtype=dtype)
            plain, exact_ = (lambda: mr.sum(g)), (lambda: mr.sum(g, exact=True))
            lp, le = 1e3 * median_ms(plain, 15), 1e3 * median_ms(exact_, 15)
            bp, be = 1e3 * back_to_back(plain), 1e3 * back_to_back(exact_)
            rows.append((np.dtype(dtype).name, f"2^{lg}", f"{lp:.1f}", f"{le:.1f} ({lp / le:.3f})", f"{bp:.1f}",
                         f"{be:.1f} ({bp / be:.3f})"))
            print(h.md_table(header, rows[-1:]).splitlines()[-1], flush=True)
            del g
    small = rng.standard_normal(1 << 10, dtype=np.float32)
    for label, f in (("mr.sum(exact=True)", lambda: mr.sum(small, exact=True)), ("mr.sum", lambda: mr.sum(small))):
        f()
        cupy.cuda.Device().synchronize()
        print(f"{label:20s} host {host_us_per_call(f, 200, until_done=False):6.1f} us per call at 2^10")
    return rows


PROFILES = {"shapes": "the exact sum kernel's terms, unroll and blocks per SM against the plain sum",
            "terms": "expansion lengths 4/6/8 at 2^26 on four data kinds",
            "ncu": "exact-sum launches for Nsight Compute",
            "call": "host time of one exact sum, and cProfile",
            "scan": "the exact cumsum's steps, each timed, and the whole call",
            "latency": "one call's latency and back-to-back time against the plain sum, and host time"}


def main(argv=None):
    ap = h.parser("exact", __doc__, quick="2^20..2^24 elements, cumsum at 2^18 (<= 90 s); with --profile shapes: "
                                          "2^26 only, fewer shapes", profiles=PROFILES)
    ap.add_argument("--gpu", action="store_true", help="also time CuPy input (cupy.sum, torch.sum, mr.sum)")
    ap.add_argument("--gpu-exact", action="store_true",
                    help="exact GPU sum vs plain/cupy/torch sums, CUDA-event medians, table last")
    ap.add_argument("--gpu-exact-cumsum", action="store_true",
                    help="exact GPU cumsum vs mr.cumsum/cupy.cumsum, CUDA-event medians, table last")
    ap.add_argument("--logs", default=None, help="with --gpu-exact(-cumsum): sizes as powers of two, e.g. 26,28")
    args = ap.parse_args(argv)
    if args.profile in ("shapes", "terms"):
        return profile_shapes(args.quick, args.profile == "terms")
    if args.profile:
        return {"ncu": profile_ncu, "call": profile_call, "scan": profile_scan,
                "latency": profile_latency}[args.profile]()
    if args.gpu_exact_cumsum:
        gpu_exact_cumsum([int(v) for v in args.logs.split(',')] if args.logs else None)
        return
    if args.gpu_exact:
        gpu_exact(args.quick, [int(v) for v in args.logs.split(',')] if args.logs else None)
        return
    rng = np.random.default_rng(0)
    sizes = [1 << 20, 1 << 24] if args.quick else [1 << 20, 1 << 24, 1 << 27, 1 << 30]
    for dtype in (np.float32, np.float64):
        for kind in ("uniform", "normal", "ill"):
            for n in sizes:
                try:
                    x = make(kind, n, dtype, rng)
                except MemoryError:
                    print(f"cpu {np.dtype(dtype)} {kind} n={n}: skipped (memory)")
                    continue
                t_plain = best(lambda: np.sum(x))
                t_exact = best(lambda: exact.sum(x), repeat=1 if n > 1 << 24 else 3)
                print(f"cpu {np.dtype(dtype)} {kind:8s} n=2^{n.bit_length() - 1}: np.sum {t_plain:.4f}s "
                      f"exact.sum {t_exact:.4f}s ({t_exact / t_plain:.1f}x)")
                if args.gpu:
                    import cupy


                    g = cupy.asarray(x)
                    sync = cupy.cuda.Device().synchronize
                    t_cp = best(lambda: cupy.sum(g), sync=sync)
                    t_mr = best(lambda: mr.sum(g), sync=sync)
                    line = f"gpu {np.dtype(dtype)} {kind:8s} n=2^{n.bit_length() - 1}: cupy.sum {t_cp:.5f}s mr.sum {t_mr:.5f}s"
                    try:
                        import torch

                        tg = torch.as_tensor(g, device="cuda")
                        t_t = best(lambda: torch.sum(tg), sync=sync)
                        line += f" torch.sum {t_t:.5f}s"
                    except ImportError:
                        pass
                    t_gx = best(lambda: exact.sum(g), repeat=1, sync=sync)
                    print(line + f" exact.sum(host path) {t_gx:.4f}s")
                    del g
            m = 1 << 18
            x = make(kind, m, dtype, rng)
            t_plain = best(lambda: np.cumsum(x))
            t_exact = best(lambda: exact.cumsum(x), repeat=1)
            line = (f"cpu {np.dtype(dtype)} {kind:8s} n=2^18: np.cumsum {t_plain:.4f}s exact.cumsum {t_exact:.3f}s "
                    f"({t_exact / t_plain:.0f}x)")
            if dtype == np.float32:
                t_wide = best(lambda: mr.cumsum(x, accumulate="wide"))
                line += f" cumsum(accumulate='wide') {t_wide:.4f}s ({t_wide / t_plain:.2f}x)"
            print(line)

