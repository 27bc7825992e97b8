"""Where the exact sum kernel (kernels/exact.cuh) spends its time: its bandwidth at 2^26 and 2^28 against
the plain sum for expansion lengths (TERMS) and blocks per SM, on uniform, normal and range90 data
(benchmarks/run_gpu.sh exactprofile; the ncu pass of the same step profiles the shipped shape).

    python benchmarks/profile_exact.py [--ncu]    (--ncu: one launch per dtype at 2^26, for ncu)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_exact  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact import make_gpu, median_ms  # noqa: E402


def reshape_kernel(terms: int, per_sm: int) -> None:
    cupy_exact.TERMS, cupy_exact.BLOCKS_PER_SM = terms, per_sm
    cupy_exact._loaded.clear()
    cupy_exact._grid_x.cache_clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    if args.ncu:
        for dtype in (np.float32, np.float64):
            g = make_gpu("normal", 1 << 26, dtype)
            for _ in range(2):
                cupy_exact.device_words(g.reshape(1, -1))
        cupy.cuda.Device().synchronize()
        return
    shipped = (cupy_exact.TERMS, cupy_exact.BLOCKS_PER_SM)
    rows = []
    for lg in (26, 28):
        for dtype in (np.float32, np.float64):
            for kind in ("uniform", "normal", "range90"):
                g = make_gpu(kind, 1 << lg, dtype)
                flat = g.reshape(1, -1)
                plain = median_ms(lambda: mr.sum(g), 15)
                for terms in (2, 3, 4, 6):
                    for per_sm in (4, 8, 16):
                        reshape_kernel(terms, per_sm)
                        ms = median_ms(lambda: cupy_exact.device_words(flat), 15)
                        rows.append((lg, np.dtype(dtype).name, kind, terms, per_sm, ms, plain / ms))
                        print(f"2^{lg} {np.dtype(dtype).name} {kind:8s} terms={terms} per_sm={per_sm:2d}: "
                              f"{ms:8.3f} ms {g.nbytes / ms / 1e6:7.0f} GB/s {plain / ms:5.2f} x plain", flush=True)
                reshape_kernel(*shipped)
                del g, flat
                cupy.get_default_memory_pool().free_all_blocks()
    print("\n| n | dtype | data | best terms, blocks/SM | best x plain | shipped x plain |")
    print("|---|---|---|---|---|---|")
    by = {}
    for lg, dt, kind, terms, per_sm, ms, ratio in rows:
        by.setdefault((lg, dt, kind), []).append((ratio, terms, per_sm))
    for (lg, dt, kind), r in by.items():
        best = max(r)
        now = next(x[0] for x in r if (x[1], x[2]) == shipped)
        print(f"| 2^{lg} | {dt} | {kind} | {best[1]}, {best[2]} | {best[0]:.2f} | {now:.2f} |")


if __name__ == "__main__":
    main()
