"""Where the exact GPU cumsum spends its time: each of device_cumsum's five steps (tile words, the words'
cumsum, seeds, pass 2, fallback walk) timed with CUDA events at 2^26 and 2^28 elements, float32 and
float64 uniform data, beside the plain mr.cumsum. Median of 5; the steps replay cupy_exact.device_cumsum."""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_exact as ce  # noqa: E402


def steps(x, dt):
    rows, n = x.shape
    k = ce._scan_kernels(x.dtype, dt)
    tile = ce.scan_tile(x.dtype, dt)
    tiles = -(-n // tile)
    count = rows * tiles
    i64 = np.int64
    words = cupy.zeros((rows, tiles + 1, ce.KTILEOUT), dtype=np.int64)  # slot 0 of a row: a zero carry
    seeds = cupy.empty(count * 4, dtype=np.int64)
    out = cupy.empty((rows, n), dtype=dt)
    marked = cupy.empty(count, dtype=np.int32)
    state = {}
    yield "tile words", lambda: k["words"](int(min(-(-count // ce.SCAN_WARPS), 1 << 20)), ce.SCAN_WARPS * 32,
                                           (x, i64(rows), i64(n), i64(tile), i64(tiles), words))
    yield "words cumsum (cupy)", lambda: state.__setitem__("cum", cupy.cumsum(words, axis=1))
    yield "seeds", lambda: k["seeds"](int(min(-(-count // ce.SEED_BLOCK), 1 << 16)), ce.SEED_BLOCK,
                                      (state["cum"], i64(count), i64(tiles), np.int32(0), seeds))
    yield "pass 2", lambda: k["tiles"](int(min(count, (1 << 31) - 1)), ce.SCAN_BLOCK,
                                       (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(0), out, marked))
    yield "fallback walk", lambda: k["fallback"](int(min(count, ce._FALLBACK_GRID)), 32,
                                                 (x, i64(rows), i64(n), i64(tile), i64(tiles), state["cum"], marked, out))


def timed(fn, repeats=5):
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


print("| dtype | n | step | ms |")
print("| --- | --- | --- | --- |")
for dtype in (np.float32, np.float64):
    for log in (26, 28):
        x = cupy.random.random((1, 1 << log), dtype=np.float64).astype(dtype)
        mr.cumsum(x[0], exact=True)  # load the kernels
        total = 0.0
        for name, fn in steps(x, np.dtype(dtype)):
            fn()
            ms = timed(fn)
            total += ms
            print(f"| {np.dtype(dtype).name} | 2^{log} | {name} | {ms:.3f} |")
        print(f"| {np.dtype(dtype).name} | 2^{log} | sum of steps | {total:.3f} |")
        print(f"| {np.dtype(dtype).name} | 2^{log} | plain mr.cumsum | {timed(lambda: mr.cumsum(x[0])):.3f} |")
        del x
        cupy.get_default_memory_pool().free_all_blocks()
