"""Sweep the look-back scan's tile shape (threads x items per thread) at one size, checked and timed.

    python benchmarks/sweep_scan.py [--log2n 28]

Launches ``mr::scan_lookback`` directly with each shape (the production path picks the shape from
``multireduce/tuning.py``); prints GB/s (bytes read + written) and the ratio to the copy roof.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import MappingProxyType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness as h  # noqa: E402

from multireduce import kernels as K  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

# a first sweep (docs/sweep_scan_1.md) found larger tiles better; this one goes up to the 48 KB of static
# shared memory a block may have
SHAPES = {
    "float32": [(256, 23), (256, 31), (256, 39), (256, 47), (128, 47), (128, 63)],
    "float64": [(256, 11), (256, 15), (256, 19), (256, 23), (128, 31)],
    "int32->int64": [(256, 9), (256, 13), (256, 15), (128, 27)],
}


def main(argv=None):
    cupy, _, args, env = h.setup("look-back scan tile shapes", argv)
    log2n = 28
    n = 1 << log2n
    op = get_operator("sum")
    rows = []
    for label, shapes in SHAPES.items():
        T, O = {"float32": (np.float32, np.float32), "float64": (np.float64, np.float64),
                "int32->int64": (np.int32, np.int64)}[label]
        A = O
        xs = h.buffers(lambda i: (cupy.random.random(n, dtype=cupy.float64) * 100 - 50).astype(T), n * np.dtype(T).itemsize, 2)
        moved = n * (np.dtype(T).itemsize + np.dtype(O).itemsize)
        roof = h.copy_roof(moved // 2)
        probe = cupy.asarray(np.unique(np.linspace(0, n - 1, 101).astype(np.int64)))
        ref = cupy.cumsum(xs[0].astype(cupy.float64))[probe].get()
        out = cupy.empty(n, O)
        for block, items in shapes:
            name = f"mr::scan_lookback<{K.ctype(T)}, {K.ctype(A)}, {K.ctype(O)}, mr::Sum, {block}, {items}>"
            kern = K.get_kernels(op, MappingProxyType({"lookback": name}))["lookback"]
            tiles = -(-n // (block * items))
            per_tile = 1 if np.dtype(A).itemsize <= 4 else 2

            def run(x):
                words = cupy.zeros(tiles * per_tile + 2, np.uint64)
                kern(tiles, block, (x, out, np.int64(n), np.int64(tiles), op.identity(np.dtype(A)), np.uint64(0),
                                    np.uint64(0), words, np.int32(1)))

            run(xs[0])
            got = out[probe].get().astype(np.float64)
            ok = bool(np.allclose(got, ref, rtol=1e-4, atol=1e-2 * np.sqrt(n)))
            ms = h.time_gpu(run, xs)
            gbps = moved / ms / 1e6
            rows.append(h.Row("scan-sweep", f"{block}x{items}", label, n, ms, gbps, gbps / roof, ok))
            print(f"{label:14} {block:5} x {items:3}: {ms:.3f} ms {gbps:7.0f} GB/s {gbps / roof:.3f} x copy ok={ok}",
                  flush=True)
    h.save(rows, "sweep_scan", env)


if __name__ == "__main__":
    main()
