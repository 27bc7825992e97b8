"""segment_reduce and segment_scan at 2^28 float32 with 10^3, 10^5 and 10^7 random segments, for ncu
(benchmarks/run_gpu.sh segprofile): where the segmented kernels lose against the copy roof.

Each kernel runs once per configuration, so the ncu report has one entry per kernel and configuration:
the modules are compiled beforehand without launching anything, and the backend is called directly (no
offset check). Launches matching "segment_", in order, per segment count: segment_tile_starts,
segment_reduce_tiles, segment_carry_totals, segment_carry_apply (the reduction), segment_tile_starts,
segment_scan_tiles (the one-pass scan); at 10^5 segments also the deterministic scan: segment_tile_starts,
segment_scan_tiles (totals), segment_carry_totals, segment_carry_apply, segment_scan_tiles (rescan).
23 launches in all (run_gpu.sh profiles 24).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

from multireduce.backends import cupy_segment  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

n = 1 << 28
f32 = np.dtype(np.float32)
op = get_operator("sum")
for names in (cupy_segment.segment_names(f32, f32, op), cupy_segment.scan_names(f32, f32, f32, op),
              cupy_segment.scan_names(f32, f32, f32, op, deterministic=True)):
    cupy_segment._kernels_for(op, names)  # compile now: no launch before the measured ones
x = cupy.random.random(n, dtype=cupy.float32)
rng = np.random.default_rng(0)
for m in (10**3, 10**5, 10**7):
    offsets = cupy.asarray(np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64))
    cupy_segment.segment_reduce(x, offsets, op, f32)
    cupy_segment.segment_scan(x, offsets, op, f32, f32, deterministic=False)
    if m == 10**5:
        cupy_segment.segment_scan(x, offsets, op, f32, f32, deterministic=True)
    cupy.cuda.Device().synchronize()
