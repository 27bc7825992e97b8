"""One look-back scan and one vectorized reduce at 2^28 float32, for ncu (benchmarks/run_gpu.sh profile)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402

import multireduce as mr  # noqa: E402

x = cupy.random.random(1 << 28, dtype=cupy.float32)
for _ in range(3):
    mr.cumsum(x)
    mr.sum(x)
cupy.cuda.Device().synchronize()
