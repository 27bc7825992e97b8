"""Sweep the look-back scan's tile shapes (threads x items in shared memory + layers held in registers)
at 2^26, 2^28 and 2^30 elements, checked and timed.

    python -m benchmarks sweep-scan [--quick]

Runs the production launch (``cupy_backend.lookback_scan``) with each candidate of
``tuning.SCAN_SHAPE_CANDIDATES`` in place of the one the policy picks; prints GB/s (bytes read +
written) and the ratio to the copy roof.
"""

from __future__ import annotations

import numpy as np

from benchmarks import harness as h
from multireduce.operators import get_operator
from multireduce.tuning import SCAN_SHAPE_CANDIDATES

# the candidates live beside the policy, so a default can change after a sweep without new code; the kernel
# variants that led to them (held layers, tile index from blockIdx) are measured in docs/sweep_scan_4.md
SHAPES = {"float32": SCAN_SHAPE_CANDIDATES["4byte"], "float64": SCAN_SHAPE_CANDIDATES["8byte"],
          "int32->int64": SCAN_SHAPE_CANDIDATES["widening"]}


def main(argv=None):
    return h.run_suite("sweep-scan", __doc__, argv, run, quick="2^26 and 2^28 only")


def run(args, cupy, torch, env):
    from multireduce.backends import cupy_backend as cb

    op = get_operator("sum")
    rows = []
    for log2n in (26, 28) if args.quick else (26, 28, 30):
        n = 1 << log2n
        for label, shapes in SHAPES.items():
            if log2n == 30 and label != "float32":
                continue
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
            for shape in shapes:

                def run(x):
                    cb.lookback_scan(x.reshape(1, n), out.reshape(1, n), op, A, identity, None, True, shape)

                out.fill(-7)  # a shape that writes nothing must not pass on the previous shape's results
                run(xs[0])
                got = out[probe].get().astype(np.float64)
                ok = bool(np.allclose(got, ref, rtol=1e-4, atol=1e-2 * np.sqrt(n)))
                ms = h.time_gpu(run, xs)
                gbps = moved / ms / 1e6
                rows.append(h.Row("scan-sweep", str(shape), label, n, ms, gbps, gbps / roof, ok))
                print(f"2^{log2n} {label:14} {str(shape):12}: {ms:.3f} ms {gbps:7.0f} GB/s {gbps / roof:.3f} x copy "
                      f"ok={ok}", flush=True)
    h.save(rows, "sweep_scan", env)

