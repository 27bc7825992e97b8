"""Exact sum/cumsum against the plain kernels (NumPy on the CPU; CuPy/torch and multireduce on a GPU).

    python benchmarks/bench_exact.py [--quick] [--gpu]
    python benchmarks/bench_exact.py --gpu-exact [--quick | --logs 26,28]
    python benchmarks/bench_exact.py --gpu-exact-cumsum [--logs 24,26,28]

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
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import multireduce as mr
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2^20..2^24 elements, cumsum at 2^18 (<= 90 s)")
    ap.add_argument("--gpu", action="store_true", help="also time CuPy input (cupy.sum, torch.sum, mr.sum)")
    ap.add_argument("--gpu-exact", action="store_true",
                    help="exact GPU sum vs plain/cupy/torch sums, CUDA-event medians, table last")
    ap.add_argument("--gpu-exact-cumsum", action="store_true",
                    help="exact GPU cumsum vs mr.cumsum/cupy.cumsum, CUDA-event medians, table last")
    ap.add_argument("--logs", default=None, help="with --gpu-exact(-cumsum): sizes as powers of two, e.g. 26,28")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
