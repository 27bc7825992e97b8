"""Where the host time of one exact=True sum of CuPy data goes (the whole call minus the kernel is what
bench_exact.py's "exact" row pays on top of "exact kernel"): cProfile of repeated calls at 2^20 float32,
the heaviest functions by own and by cumulative time.

    python benchmarks/profile_exact_call.py
"""
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_exact  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact import make_gpu  # noqa: E402


def main():
    g = make_gpu("normal", 1 << 20, cupy.float32)
    flat = g.reshape(1, -1)
    for _ in range(5):
        mr.sum(g, exact=True)
    cupy.cuda.Device().synchronize()
    calls = 300
    for label, f in (("mr.sum(exact=True)", lambda: mr.sum(g, exact=True)),
                     ("device_words + get", lambda: cupy_exact.device_words(flat).get()),
                     ("cupy_exact.state_of", lambda: cupy_exact.state_of(g, (0,))),
                     ("mr.sum", lambda: float(mr.sum(g)))):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        cupy.cuda.Device().synchronize()
        print(f"{label:22s} {1e6 * (time.perf_counter() - start) / calls:8.1f} us per call (host wall)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        mr.sum(g, exact=True)
    profile.disable()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
