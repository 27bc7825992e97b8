"""Where a whole-array statistic's GPU time goes at 2^26 and 2^28 elements: the rows kernel alone (at
several grid sizes), rows + fold (what a call launches), the whole call, and our sum beside them, each
timed as a pipeline of launches with CUDA events (harness.time_gpu), with the copy roof.

    python benchmarks/profile_stats_kernels.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import harness as h  # noqa: E402
import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_stats as cs  # noqa: E402


def main():
    device = cupy.cuda.runtime.getDevice()
    sms = cs._sm_count(device)
    print(f"| stat | dtype | n | what | ms | x copy |")
    print("|---|---|---|---|---|---|")
    for log2n in (26, 28):
        n = 1 << log2n
        for dtype in (np.float32, np.float64):
            xs = h.buffers(lambda i: cupy.random.random(n, dtype=dtype), n * np.dtype(dtype).itemsize)
            roof = n * np.dtype(dtype).itemsize / (h.copy_roof(n * np.dtype(dtype).itemsize) * 1e6)
            print(f"| copy | {np.dtype(dtype).name} | 2^{log2n} | read at copy speed | {roof:.4f} | 1 |", flush=True)
            ms = h.time_gpu(mr.sum, xs)
            print(f"| sum | {np.dtype(dtype).name} | 2^{log2n} | call | {ms:.4f} | {roof / ms:.3f} |", flush=True)
            for stat in ("argmax", "var", "any"):
                ks = cs._kernels_for(stat, np.dtype(dtype), device)
                sdt = cs.state_dtype(stat, dtype)
                per_block = cs.BLOCK * (16 // np.dtype(dtype).itemsize) * cs.ROW_UNROLL
                parts = cupy.empty(16 * sms * sdt.itemsize, dtype=np.uint8)
                out = cupy.empty((), cs.result_dtype(stat, dtype))
                for per_sm in (2, 3, 4, 5, 6, 8):
                    splits = min(per_sm * sms, -(-n // per_block))

                    def rows(x, splits=splits):
                        ks["rows"](splits, cs.BLOCK, (x, np.int64(n), np.int64(0), np.int64(n), np.int32(splits), parts))

                    ms = h.time_gpu(rows, xs)
                    print(f"| {stat} | {np.dtype(dtype).name} | 2^{log2n} | rows kernel, {per_sm} blocks/SM | {ms:.4f} | "
                          f"{roof / ms:.3f} |", flush=True)
                splits = min(cs.BLOCKS_PER_SM * sms, -(-n // per_block))

                def both(x):
                    ks["rows"](splits, cs.BLOCK, (x, np.int64(n), np.int64(0), np.int64(n), np.int32(splits), parts))
                    ks["fold"](1, cs.BLOCK, (parts, np.int64(1), np.int64(splits), np.int64(1), np.int64(0), np.uint64(0),
                                             out, np.float64(0), np.int32(cs._MOMENTS.get(stat, 0))))

                ms = h.time_gpu(both, xs)
                print(f"| {stat} | {np.dtype(dtype).name} | 2^{log2n} | rows + fold | {ms:.4f} | {roof / ms:.3f} |", flush=True)
                ms = h.time_gpu(getattr(mr, stat), xs)
                print(f"| {stat} | {np.dtype(dtype).name} | 2^{log2n} | call | {ms:.4f} | {roof / ms:.3f} |", flush=True)
            del xs


if __name__ == "__main__":
    main()
