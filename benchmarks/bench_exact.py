"""Exact sum/cumsum against the plain kernels (NumPy on the CPU; CuPy/torch and multireduce on a GPU).

    python benchmarks/bench_exact.py [--quick] [--gpu]

Data: uniform, normal, and ill-conditioned (condition number ~1e16: large terms that cancel, leaving
small ones). Prints one line per (device, dtype, data, n, function): best-of-3 seconds and the ratio
to the plain sum/cumsum of the same input.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2^20..2^24 elements, cumsum at 2^18 (<= 90 s)")
    ap.add_argument("--gpu", action="store_true", help="also time CuPy input (cupy.sum, torch.sum, mr.sum)")
    args = ap.parse_args()
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

                    import multireduce as mr

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
                t_wide = best(lambda: exact.cumsum_wide(x))
                line += f" cumsum_wide {t_wide:.4f}s ({t_wide / t_plain:.2f}x)"
            print(line)


if __name__ == "__main__":
    main()
