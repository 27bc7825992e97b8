"""Where the exact sum kernel (kernels/exact.cuh) spends its time: its bandwidth at 2^26 and 2^28 against
the plain sum for expansion lengths (TERMS) and blocks per SM (device_words' blocks_per_sm knob, capped by
the kernel's resident blocks per SM), on uniform, normal and range90 data (benchmarks/run_gpu.sh
exactprofile; the ncu pass of the same step profiles the shipped shape).

    python benchmarks/profile_exact.py [--quick | --terms] [--ncu]
    (--quick: 2^26 only, fewer shapes; --terms: 2^26, expansion lengths 4/6/8 on all four data kinds, each
    dtype's shipped unroll and the next lower; --ncu: one launch per dtype at 2^26, for ncu)
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


def reshape_kernel(terms: int, unroll: dict) -> None:
    cupy_exact.TERMS, cupy_exact.UNROLL = terms, unroll
    cupy_exact._loaded.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2^26 only, terms 4, unroll 2/4/8, blocks per SM 2/4/8")
    ap.add_argument("--terms", action="store_true", help="2^26, terms 4/6/8, shipped unroll and half, 2/4 blocks per SM")
    args = ap.parse_args()
    if args.ncu:
        for dtype in (np.float32, np.float64):
            g = make_gpu("normal", 1 << 26, dtype)
            for _ in range(2):
                cupy_exact.device_words(g.reshape(1, -1))
        cupy.cuda.Device().synchronize()
        return
    shipped, shipped_unroll = (cupy_exact.TERMS, cupy_exact.BLOCKS_PER_SM), dict(cupy_exact.UNROLL)
    sizes, terms_swept, unroll_swept, per_sm_swept = (
        ((26,), (4,), (2, 4, 8), (2, 4, 8)) if args.quick else ((26, 28), (4, 6), (1, 2, 4, 8), (2, 3, 4, 8)))
    kinds = ("uniform", "normal", "range90")
    if args.terms:
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
                unrolls = ((shipped_unroll[name], max(1, shipped_unroll[name] // 2)) if args.terms
                           else unroll_swept)
                for terms in terms_swept:
                    for unroll in unrolls:
                        reshape_kernel(terms, {**shipped_unroll, name: unroll})
                        for per_sm in per_sm_swept:
                            ms = median_ms(lambda: cupy_exact.device_words(flat, blocks_per_sm=per_sm), 15)
                            rows.append((lg, name, kind, (terms, unroll, per_sm), ms, plain / ms))
                            print(f"2^{lg} {name} {kind:8s} terms={terms} unroll={unroll} per_sm={per_sm:2d}: "
                                  f"{ms:8.3f} ms {g.nbytes / ms / 1e6:7.0f} GB/s {plain / ms:5.2f} x plain", flush=True)
                reshape_kernel(shipped[0], shipped_unroll)
                del g, flat
                cupy.get_default_memory_pool().free_all_blocks()
    print("\n| n | dtype | data | best terms, unroll, blocks/SM | best x plain | shipped x plain |")
    print("|---|---|---|---|---|---|")
    by = {}
    for lg, dt, kind, shape, ms, ratio in rows:
        by.setdefault((lg, dt, kind), []).append((ratio, shape))
    for (lg, dt, kind), r in by.items():
        best = max(r)
        ship = (shipped[0], shipped_unroll[dt], shipped[1])
        now = next((x[0] for x in r if x[1] == ship), float("nan"))
        print(f"| 2^{lg} | {dt} | {kind} | {', '.join(map(str, best[1]))} | {best[0]:.2f} | {now:.2f} |")


if __name__ == "__main__":
    main()
