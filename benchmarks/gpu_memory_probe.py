"""Which operation leaves driver-level GPU memory behind outside CuPy's pool? One process, one GPU: each
soak operation (benchmarks/soak.py OPS) on every GPU dtype at several sizes, eagerly on a CuPy array; after
each, a synchronize and the pool's free blocks returned, then this process's NVML reading against the
baseline (taken after one small run of everything). A reading above it that a later trivial launch or a
second sample brings back is a transient reservation (local memory resized for a kernel, for one), not a
leak. Prints the operations whose reading passed --report-mb.

    python benchmarks/gpu_memory_probe.py [--sizes-mb 1,64,1024] [--report-mb 16]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="1,64,1024")
    p.add_argument("--report-mb", type=float, default=16)
    a = p.parse_args(argv)
    import cupy

    import multireduce as mr
    import soak

    pool = cupy.get_default_memory_pool()

    def used():
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
        return soak._gpu_used_by_this_process(cupy)[0]

    rng = np.random.default_rng(0)
    cases = [(d, op) for d in soak.dtypes_for(True) for op in soak.ops_for(d)]
    for d, op in cases:  # warm-up: modules loaded, workspaces sized
        getattr(mr, op)(cupy.asarray(soak._data(rng, d, 4096, op)))
    base = used()
    print(f"baseline {base / 2**20:.0f} MB (scope {soak._gpu_used_by_this_process(cupy)[1]})", flush=True)
    flagged = []
    for mb in [float(s) for s in a.sizes_mb.split(",")]:
        for d, op in cases:
            n = max(int(mb * 2**20) // np.dtype(d).itemsize, 1)
            x = cupy.asarray(soak._data(rng, d, n, op))
            r = getattr(mr, op)(x)
            del x, r
            after = used() - base
            if after > a.report_mb * 2**20:
                cupy.zeros(1).sum()  # a trivial launch: does a resized reservation come back?
                later = used() - base
                flagged.append((mb, d, op, after, later))
                print(f"{mb:g} MB {d} {op}: +{after / 2**20:.0f} MB, after a trivial launch +{later / 2**20:.0f} MB",
                      flush=True)
    print(f"flagged {len(flagged)} of {len(cases) * len(a.sizes_mb.split(','))}; final +{(used() - base) / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
