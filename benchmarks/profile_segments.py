"""segment_reduce and segment_scan at 2^28 float32 with 10^3, 10^5 and 10^7 random segments, for ncu
(benchmarks/run_gpu.sh segprofile): where the segmented kernels lose against the copy roof."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402

n = 1 << 28
x = cupy.random.random(n, dtype=cupy.float32)
rng = np.random.default_rng(0)
for m in (10**3, 10**5, 10**7):
    offsets = cupy.asarray(np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64))
    for _ in range(2):
        mr.segment_reduce(x, offsets)
        mr.segment_scan(x, offsets)
cupy.cuda.Device().synchronize()
