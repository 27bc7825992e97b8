"""Where the exact sum kernel (kernels/exact.cuh) spends its time: its bandwidth at 2^26 and 2^28 against
the plain sum for expansion lengths (TERMS) and blocks per SM (device_words' blocks_per_sm knob, capped by
the kernel's resident blocks per SM), on uniform, normal and range90 data (benchmarks/run_gpu.sh
exactprofile; the ncu pass of the same step profiles the shipped shape).

    python benchmarks/profile_exact.py [--quick] [--ncu]
    (--quick: 2^26 only, fewer shapes; --ncu: one launch per dtype at 2^26, for ncu)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_backend, cupy_exact  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact import make_gpu, median_ms  # noqa: E402


def reshape_kernel(terms: int) -> None:
    cupy_exact.TERMS = terms
    cupy_exact._loaded.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2^26 only, terms 3/4, blocks per SM 2/4/8")
    args = ap.parse_args()
    if args.ncu:
        for dtype in (np.float32, np.float64):
            g = make_gpu("normal", 1 << 26, dtype)
            for _ in range(2):
                cupy_exact.device_words(g.reshape(1, -1))
        cupy.cuda.Device().synchronize()
        return
    shipped = (cupy_exact.TERMS, cupy_exact.BLOCKS_PER_SM)
    sizes, terms_swept, per_sm_swept = ((26,), (3, 4), (2, 4, 8)) if args.quick else ((26, 28), (2, 3, 4, 6), (1, 2, 4, 8, 16))
    for dtype in (np.float32, np.float64):
        kernel = cupy_exact._kernel(dtype)
        print(f"{np.dtype(dtype).name}: {getattr(kernel.fn, 'attributes', {}).get('num_regs')} registers, resident blocks per SM "
              f"{cupy_backend.scan_occupancy(kernel, cupy_exact.BLOCK)}", flush=True)
    rows = []
    for lg in sizes:
        for dtype in (np.float32, np.float64):
            for kind in ("uniform", "normal", "range90"):
                g = make_gpu(kind, 1 << lg, dtype)
                flat = g.reshape(1, -1)
                plain = median_ms(lambda: mr.sum(g), 15)
                for terms in terms_swept:
                    reshape_kernel(terms)
                    for per_sm in per_sm_swept:
                        ms = median_ms(lambda: cupy_exact.device_words(flat, blocks_per_sm=per_sm), 15)
                        rows.append((lg, np.dtype(dtype).name, kind, terms, per_sm, ms, plain / ms))
                        print(f"2^{lg} {np.dtype(dtype).name} {kind:8s} terms={terms} per_sm={per_sm:2d}: "
                              f"{ms:8.3f} ms {g.nbytes / ms / 1e6:7.0f} GB/s {plain / ms:5.2f} x plain", flush=True)
                reshape_kernel(shipped[0])
                del g, flat
                cupy.get_default_memory_pool().free_all_blocks()
    print("\n| n | dtype | data | best terms, blocks/SM | best x plain | shipped x plain |")
    print("|---|---|---|---|---|---|")
    by = {}
    for lg, dt, kind, terms, per_sm, ms, ratio in rows:
        by.setdefault((lg, dt, kind), []).append((ratio, terms, per_sm))
    for (lg, dt, kind), r in by.items():
        best = max(r)
        now = next((x[0] for x in r if (x[1], x[2]) == shipped), float("nan"))
        print(f"| 2^{lg} | {dt} | {kind} | {best[1]}, {best[2]} | {best[0]:.2f} | {now:.2f} |")


if __name__ == "__main__":
    main()
