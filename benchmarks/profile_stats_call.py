"""Host cost of one statistics call on CuPy input: is a statistic at 2^26 elements host-bound?

    python benchmarks/profile_stats_call.py

For each statistic on a float32 CuPy array of 2^10 elements (the GPU time is then negligible):
"pipelined" is the host time per call of 2000 back-to-back calls (the rate at which a loop can issue
them; a call whose GPU time is shorter than this is host-bound in bench_stats' pipelined timing),
"latency" the median of single calls each followed by a stream synchronize. Then cProfile of 2000
calls of argmax, var and nanmax, the 18 functions with the most own time.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import cupy  # noqa: E402

import multireduce as mr  # noqa: E402
from profile_small import per_call_us, print_host_table  # noqa: E402

STATS = ("sum", "mean", "argmax", "argmin", "var", "std", "nansum", "nanmax", "nanmean", "any", "count_nonzero")


def main():
    x = cupy.random.random(1 << 10, dtype=cupy.float32) - 0.25
    rows = []
    for name in STATS:
        fn = getattr(mr, name)
        host, latency = per_call_us(lambda: fn(x))
        rows.append((f"multireduce.{name}", host, latency))
        print(f"{name:16} pipelined {host:7.2f} us   latency {latency:7.2f} us", flush=True)
    for name in ("argmax", "var", "nanmax", "sum"):
        peer = getattr(cupy, name)
        host, latency = per_call_us(lambda: peer(x))
        rows.append((f"cupy.{name}", host, latency))
    for name in ("argmax", "var", "nanmax"):
        fn = getattr(mr, name)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn(x)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        print(f"\n=== cProfile, 2000 x multireduce.{name}\n" + "\n".join(text.getvalue().splitlines()[4:]))
    print()
    print_host_table(("call (float32, 2^10)",), rows)


if __name__ == "__main__":
    main()
