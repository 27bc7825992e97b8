"""Where a small reduce spends its time: host microseconds per call for each piece of the path.

    python benchmarks/profile_small.py

For float32 inputs of 2^10 and 2^20 elements: the whole call (multireduce.sum, cupy.sum, torch.sum),
then the pieces it is made of: allocating the 0-d result, one launch of our reduce kernel with its
arguments ready, one launch of an empty kernel, and synchronizing an idle stream. "pipelined" is the
host time per call of 2000 back-to-back calls; "latency" the median of single calls each followed by a
stream synchronize (what benchmarks/bench_reduce.py reports as sum-latency).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_backend as cb  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402


def per_call_us(fn, calls: int = 2000) -> tuple[float, float]:
    for _ in range(50):
        fn()
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    stream.synchronize()
    samples = []
    for _ in range(300):
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return host, statistics.median(samples)


def main():
    rows = []
    try:
        import torch
    except ImportError:
        torch = None
    noop = cupy.RawKernel('extern "C" __global__ void noop() {}', "noop")
    op = get_operator("sum")
    for log2n in (10, 20):
        n = 1 << log2n
        x = cupy.random.random(n, dtype=cupy.float32) - 0.5
        ref = float(x.astype(cupy.float64).sum())
        got = float(mr.sum(x))
        assert abs(got - ref) <= 1e-5 * n, (got, ref)
        whole = cb.bind(op, x.dtype, np.dtype(np.float32), np.dtype(np.float32))
        kernel, (per_block, max_grid, block), _ = whole._bind(cupy.cuda.runtime.getDevice())
        fn, grid, block = kernel.fn, min(-(-n // per_block), max_grid), (block,)
        out = cupy.empty((), np.float32)
        partials, counter = cb._workspace(grid, np.dtype(np.float32))
        args = (x, np.int64(n), np.float32(0), partials if grid > 1 else out, out, counter)
        pieces = {
            "multireduce.sum(x)": lambda: mr.sum(x),
            "cupy.sum(x)": lambda: cupy.sum(x),
            "bound launcher(x) (no API layer)": lambda: whole(x),
            "cupy.empty((), float32)": lambda: cupy.empty((), np.float32),
            "our reduce kernel, args ready": lambda: fn((grid,), block, args),
            "empty kernel launch": lambda: noop((1,), (32,), ()),
            "get_current_stream + getDevice": lambda: (cupy.cuda.get_current_stream().ptr,
                                                      cupy.cuda.runtime.getDevice()),
            "stream.synchronize (idle)": lambda: None,
        }
        if torch is not None:
            t = torch.as_tensor(x, device="cuda")
            pieces["torch.sum(t)"] = lambda: torch.sum(t)
        for name, f in pieces.items():
            host, latency = per_call_us(f)
            rows.append((f"2^{log2n}", name, host, latency))
            print(f"2^{log2n:<3} {name:34} pipelined {host:6.2f} us   latency {latency:6.2f} us", flush=True)
    print()
    print_host_table(("n", "what"), rows)


def print_host_table(names: tuple, rows: list) -> None:
    """Rows of (names..., pipelined us, latency us) as a markdown table."""
    print("| " + " | ".join(names) + " | pipelined host us/call | latency us (call + sync) |")
    print("|" + "---|" * (len(names) + 2))
    for r in rows:
        print("| " + " | ".join(str(v) for v in r[:len(names)]) + f" | {r[-2]:.2f} | {r[-1]:.2f} |")


if __name__ == "__main__":
    main()
