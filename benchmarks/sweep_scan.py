"""Sweep the look-back scan's items per thread (256-thread tiles) at 2^26 and 2^28, checked and timed.

    python benchmarks/sweep_scan.py

Runs the production launch (``cupy_backend.lookback_scan``) with each shape in place of the one
``multireduce/tuning.py`` picks; prints GB/s (bytes read + written) and the ratio to the copy roof.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness as h  # noqa: E402

from multireduce.operators import get_operator  # noqa: E402
from multireduce.tuning import SCAN_ITEMS_CANDIDATES  # noqa: E402

# the candidates live beside the policy; earlier sweeps (sweep_scan_1.md, _2.md) ran the kernel before
# its cp.async loads, sweep_scan_3.md also timed two-stage persistent blocks (since removed)
SHAPES = {"float32": SCAN_ITEMS_CANDIDATES["4byte"], "float64": SCAN_ITEMS_CANDIDATES["8byte"],
          "int32->int64": SCAN_ITEMS_CANDIDATES["widening"]}


def main(argv=None):
    cupy, _, args, env = h.setup("look-back scan tile shapes", argv)
    from multireduce.backends import cupy_backend as cb

    op = get_operator("sum")
    rows = []
    for log2n in (26, 28):
        n = 1 << log2n
        for label, shapes in SHAPES.items():
            T, O = {"float32": (np.float32, np.float32), "float64": (np.float64, np.float64),
                    "int32->int64": (np.int32, np.int64)}[label]
            A = np.dtype(O)
            xs = h.buffers(lambda i: (cupy.random.random(n, dtype=cupy.float64) * 100 - 50).astype(T),
                           n * np.dtype(T).itemsize, 2)
            moved = n * (np.dtype(T).itemsize + np.dtype(O).itemsize)
            roof = h.copy_roof(moved // 2)
            probe = cupy.asarray(np.unique(np.linspace(0, n - 1, 101).astype(np.int64)))
            ref = cupy.cumsum(xs[0].astype(cupy.float64))[probe].get()
            out = cupy.empty(n, O)
            identity = op.identity(A)
            for items in shapes:

                def run(x):
                    cb.lookback_scan(x.reshape(1, n), out.reshape(1, n), op, A, identity, None, True, items)

                run(xs[0])
                got = out[probe].get().astype(np.float64)
                ok = bool(np.allclose(got, ref, rtol=1e-4, atol=1e-2 * np.sqrt(n)))
                ms = h.time_gpu(run, xs)
                gbps = moved / ms / 1e6
                shape = f"256x{items}"
                rows.append(h.Row("scan-sweep", shape, label, n, ms, gbps, gbps / roof, ok))
                print(f"2^{log2n} {label:14} {shape:12}: {ms:.3f} ms {gbps:7.0f} GB/s {gbps / roof:.3f} x copy ok={ok}",
                      flush=True)
    h.save(rows, "sweep_scan", env)


if __name__ == "__main__":
    main()
