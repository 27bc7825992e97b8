"""Throwaway diagnosis: the exact GPU cumsum over many lanes (rows x n with one tile per row)."""
import cupy, numpy as np
from multireduce import exact
from multireduce.backends import cupy_exact as ce

rng = np.random.default_rng(0)
for rows, n in [(2, 3), (7, 3), (3500, 3), (4, 5000)]:
    x = rng.standard_normal((rows, n))
    xd = cupy.asarray(x)
    tiles = -(-n // ce.scan_tile(x.dtype))
    words = cupy.zeros((rows, tiles + 1, ce.KTILEOUT), dtype=np.int64)
    k = ce._scan_kernels(x.dtype, np.dtype(np.float64))
    k["words"](int(min(-(-rows * tiles // ce.SCAN_WARPS), 1 << 20)), ce.SCAN_WARPS * 32,
               (xd, np.int64(rows), np.int64(n), np.int64(ce.scan_tile(x.dtype)), np.int64(tiles), words))
    w = cupy.asnumpy(words)
    cum = cupy.asnumpy(cupy.cumsum(words, axis=1))
    cum_host = np.cumsum(w, axis=1)
    got = cupy.asnumpy(ce.device_cumsum(xd, np.dtype(np.float64)))
    want = np.stack([exact.cumsum(x[r]) for r in range(rows)])
    print(rows, n, "slot0 of words zero:", bool((w[:, 0] == 0).all()), "cupy cumsum == numpy:", bool((cum == cum_host).all()),
          "result right rows:", int((got == want).all(axis=1).sum()), "of", rows, flush=True)
