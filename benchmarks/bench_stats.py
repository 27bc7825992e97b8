"""Statistics side by side on one GPU: argmax, var, nansum and segmented sums against CuPy and torch,
at 2^28 float32 elements (1 GiB, far above L2), with the copy roof beside them. Every timed result is
checked against a reference first. Under two minutes on an H200.

    python benchmarks/bench_stats.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness as h  # noqa: E402

import multireduce as mr  # noqa: E402


def main(argv=None) -> list:
    cupy, torch, args, env = h.setup("statistics side by side", argv)
    rows: list[h.Row] = []
    n = 1 << (28 if not args.quick else 24)
    nbytes = 4 * n
    copy = h.copy_roof(nbytes)
    rows.append(h.Row("copy", "cupy copy", "float32", n, 2 * nbytes / copy / 1e6, copy, 1.0, True))

    def add(family, impl, fn, xs, ok, moved=nbytes, repeats=10):
        ms = h.time_gpu(fn, xs, repeats=repeats)
        gbps = moved / ms / 1e6
        rows.append(h.Row(family, impl, "float32", n, ms, gbps, gbps / copy, ok))

    def as_torch(x):
        return torch.as_tensor(x, device="cuda")

    # argmax: a unique maximum placed at random, so a wrong index cannot pass
    xs = h.buffers(lambda i: cupy.random.random(n, dtype=cupy.float32), nbytes, max_buffers=3)
    spot = int(np.random.default_rng(0).integers(0, n))
    xs[0][spot] = 2.0
    impls = {"multireduce": mr.argmax, "cupy": cupy.argmax}
    if torch is not None:
        impls["torch"] = lambda x: as_torch(x).argmax()
    for name, fn in impls.items():
        add("argmax", name, fn, xs, int(fn(xs[0])) == spot)

    # var of ill-conditioned data (mean 1e4, spread 1): accuracy against a float64 two-pass reference
    xs = [x * 0 + cupy.float32(1e4) + cupy.random.standard_normal(n, dtype=cupy.float32) for x in xs]
    d = xs[0].astype(cupy.float64)
    ref = float(cupy.mean((d - d.mean()) ** 2))
    del d
    impls = {"multireduce": mr.var, "cupy": cupy.var}
    if torch is not None:
        impls["torch"] = lambda x: as_torch(x).var(correction=0)
    for name, fn in impls.items():
        err = abs(float(fn(xs[0])) - ref) / ref
        add("var", name, fn, xs, err < 1e-3, repeats=5)
        rows[-1].note = f"rel.err {err:.1e}"

    # nansum with 1% NaNs
    for x in xs:
        x[cupy.random.random(n) < 0.01] = cupy.nan
    want = float(cupy.nansum(xs[0].astype(cupy.float64)))
    mass = float(cupy.nansum(cupy.abs(xs[0]).astype(cupy.float64)))
    impls = {"multireduce": mr.nansum, "cupy": cupy.nansum}
    if torch is not None:
        impls["torch"] = lambda x: as_torch(x).nansum()
    for name, fn in impls.items():
        add("nansum", name, fn, xs, abs(float(fn(xs[0])) - want) <= 1e-5 * mass, repeats=5)
    del xs
    cupy.get_default_memory_pool().free_all_blocks()

    # segmented sums: 10^3, 10^5, 10^7 segments of random lengths
    x = cupy.random.random(n, dtype=cupy.float32)
    for m in (10**3, 10**5, 10**7):
        if m >= n:
            continue
        offsets = np.sort(np.random.default_rng(m).choice(n, m - 1, replace=False)).astype(np.int64)
        offsets = np.concatenate([[0], offsets])
        lengths = np.diff(np.append(offsets, n))
        starts_g = cupy.asarray(offsets)
        host = cupy.asnumpy(x).astype(np.float64)
        want = np.add.reduceat(host, offsets)
        scale = np.add.reduceat(np.abs(host), offsets) + 1

        def check(got):
            return bool(np.all(np.abs(cupy.asnumpy(cupy.asarray(got)).astype(np.float64) - want) <= 1e-4 * scale))

        def cumsum_diff(v):  # CuPy has no segmented reduce: the usual inclusive-scan difference
            c = cupy.concatenate([cupy.zeros(1, cupy.float64), cupy.cumsum(v, dtype=cupy.float64)])
            ends = cupy.concatenate([starts_g[1:], cupy.asarray([n])])
            return (c[ends] - c[starts_g]).astype(cupy.float32)

        impls = {"multireduce": lambda v: mr.segment_reduce(v, offsets), "cupy cumsum-diff": cumsum_diff}
        if torch is not None:
            lengths_t = torch.as_tensor(lengths, device="cuda")
            impls["torch"] = lambda v: torch.segment_reduce(as_torch(v), "sum", lengths=lengths_t)
        for name, fn in impls.items():
            try:
                ok = check(fn(x))
                add("segment_reduce", name, fn, [x], ok, repeats=3)
            except Exception as exc:  # torch.segment_reduce is a prototype API: record, don't stop
                rows.append(h.Row("segment_reduce", name, "float32", n, float("nan"), float("nan"), ok=False,
                                  note=f"failed: {type(exc).__name__}"))
            rows[-1].extra = {"segments": m}
            rows[-1].family = f"segment_reduce m={m:.0e}"

    h.save(rows, "bench_stats", env)
    print(h.markdown(rows, columns=("family", "impl", "n", "ms", "gbps", "ratio_copy", "ok", "note")))
    return rows


if __name__ == "__main__":
    main()
