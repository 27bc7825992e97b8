"""Where mr.segment_reduce / mr.segment_scan spend host time (benchmarks/run_gpu.sh segcall): the public call
against the backend's kernels alone, at a size where the host dominates (2^16 float32, 10^3 segments),
single-call latency (time_host) and pipelined device time (time_gpu), then a cProfile of the public call."""
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402
import harness as h  # noqa: E402
from multireduce.backends import cupy_segment  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

n, m = 1 << 16, 1000
rng = np.random.default_rng(0)
xs = [cupy.asarray(rng.random(n, dtype=np.float32)) for _ in range(4)]
starts = cupy.asarray(np.sort(rng.choice(n, m, replace=False)).astype(np.int64))
op, f32 = get_operator("sum"), np.dtype(np.float32)
impls = {"mr.segment_reduce": lambda v: mr.segment_reduce(v, starts),
         "kernels (segment_reduce)": lambda v: cupy_segment.segment_reduce(v, starts, op, f32),
         "mr.segment_scan": lambda v: mr.segment_scan(v, starts),
         "kernels (segment_scan)": lambda v: cupy_segment.segment_scan(v, starts, op, f32, f32),
         "cupy.sum (reference launch)": lambda v: cupy.sum(v)}
print("| call | host latency us | pipelined device us |")
print("| --- | --- | --- |")
for name, fn in impls.items():
    print(f"| {name} | {h.time_host(fn, xs, repeats=200) * 1e3:.1f} | {h.time_gpu(fn, xs, repeats=20) * 1e3:.1f} |")
for name in ("mr.segment_reduce", "mr.segment_scan"):
    prof = cProfile.Profile()
    fn = impls[name]
    prof.enable()
    for i in range(500):
        fn(xs[i % 4])
    prof.disable()
    cupy.cuda.Device().synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    print(f"\n### {name}: cProfile of 500 calls (tottime)\n" + "\n".join(text.getvalue().splitlines()[6:30]))
