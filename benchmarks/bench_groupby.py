"""Group-by reductions of one CuPy array on one GPU (``multireduce.groupby_reduce``) against the copy roof,
CUDA events, median of repeats, every timed result checked against a float64 NumPy reference first.

Cases, float32 data, labels on the host (as xarray's are):

- "1-d sorted": 2^26 (``--quick``) or 2^28 elements in runs of equal labels, 12 / 365 / 4096 groups;
- "1-d unsorted": the same data, labels drawn at random from the groups (the chunk is put in group order
  first: one gather);
- "field by month": a time x space field (2^26 or 2^28 elements: 8760 steps x space) grouped along time
  by month of an hourly year (12 groups in runs of 672-744 steps), the climatology's shape;
- "field by day": the same field grouped by day (365 groups of 24 steps), resample's shape.

``ratio_copy`` counts the data read (n * 4 bytes) against the copy roof, as the other reduction tables
do; the labels, the order and the results are not counted. Functions: sum, mean, max, var.

    python -m benchmarks groupby [--quick] [--cases field,1d]

Labels are turned into group codes (``groupby.factorize``) on the host where they are few (a field grouped
along time has 8760 labels for 2^26 elements) and on the GPU where they are many (1-d data with one label
per element: ``groupby.DEVICE_LABELS_MIN``), where the chunk is also put in group order. 1-d cases are timed
with the labels on the host (copied up on every call, as xarray's coordinates are) and on the GPU.
"""

from __future__ import annotations

import numpy as np

import multireduce as mr
from benchmarks import harness as h

FUNCS = ("sum", "mean", "max", "var")


def _month_of_hour(steps: int) -> np.ndarray:
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
    month = np.repeat(np.arange(12), days)
    return np.resize(month, steps)


def _references(host: np.ndarray, labels: np.ndarray, groups: int, axis: int) -> dict:
    """func -> the float64 NumPy result of every FUNCS (groups on a last axis), the data sorted once."""
    x = np.moveaxis(host.astype(np.float64), axis, -1)
    counts = np.bincount(labels, minlength=groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    xs = x[..., np.argsort(labels, kind="stable")]
    out = {f: np.empty(x.shape[:-1] + (groups,)) for f in FUNCS}
    for g in range(groups):
        seg = xs[..., starts[g]:starts[g] + counts[g]]
        for f, fn in (("sum", np.sum), ("mean", np.mean), ("max", np.max), ("var", np.var)):
            out[f][..., g] = fn(seg, axis=-1)
    return out


def cases(log2n: int, kinds=("field", "1d")):
    rng = np.random.default_rng(5)
    n = 1 << log2n
    if "field" in kinds:
        steps = 8760
        space = n // steps
        yield "field by month", (steps, space), 0, _month_of_hour(steps), 12
        yield "field by day", (steps, space), 0, np.arange(steps) // 24, 365
    if "1d" in kinds:
        for groups in (12, 365, 4096):
            sorted_labels = np.repeat(np.arange(groups), -(-n // groups))[:n]
            yield "1-d sorted", (n,), 0, sorted_labels, groups
            yield "1-d unsorted", (n,), 0, rng.integers(0, groups, n), groups


def run(args, cupy, torch, env):
    rows = []
    for log2n in (26,) if args.quick else (26, 28):
        roof = None
        for name, shape, axis, labels, groups in cases(log2n, tuple(args.cases.split(","))):
            n = int(np.prod(shape))
            xs = h.buffers(lambda i: cupy.random.standard_normal(shape, dtype=cupy.float32), n * 4, 2)
            if roof is None:
                roof = h.copy_roof(n * 4)
            wants = _references(xs[0].get(), labels, groups, axis)
            # 1-d labels as long as the data also come as a CuPy array (a key computed on the GPU): the host
            # ones are copied up on every call first
            places = ("host",) if name.startswith("field") else ("host", "GPU")
            for place in places:
                by = labels if place == "host" else cupy.asarray(labels)
                for func in FUNCS:
                    got, found = mr.groupby_reduce(xs[0], by, func, axis=axis)
                    want = wants[func]
                    ok = bool(np.array_equal(found, np.arange(groups))
                              and np.allclose(got.get(), want, rtol=2e-5, atol=2e-5 * np.sqrt(n / groups)))
                    ms = h.time_gpu(lambda x: mr.groupby_reduce(x, by, func, axis=axis), xs, repeats=5, warmup=1)
                    gbps = n * 4 / ms / 1e6
                    label = f"{name}, {groups} groups, {'x'.join(map(str, shape))}"
                    if len(places) > 1:
                        label += f", labels on the {place}"
                    rows.append(h.Row("groupby", func, label, n, ms, gbps, gbps / roof, ok))
                    print(f"2^{log2n} {label:40} {func:5} {ms:8.3f} ms {gbps:7.0f} GB/s {gbps / roof:.3f} x copy "
                          f"ok={ok}", flush=True)
            del xs
            cupy.get_default_memory_pool().free_all_blocks()
    print()
    print(h.md_table(("n", "case", "func", "ms", "x copy", "ok"),
                     ((h.log2_text(r.n), r.dtype, r.impl, f"{r.ms:.3f}", f"{r.ratio_copy:.3f}", r.ok) for r in rows)))
    h.save(rows, "bench_groupby", env)
    return rows


def main(argv=None):
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    kinds = "field,1d"
    if "--cases" in argv:  # the suite's own option, read before run_suite's parser
        at = argv.index("--cases")
        kinds = argv[at + 1] if at + 1 < len(argv) else ""
        del argv[at:at + 2]
        if not kinds or set(kinds.split(",")) - {"field", "1d"}:
            raise SystemExit(f"python -m benchmarks groupby: --cases: expected field and/or 1d, comma-separated; "
                             f"got {kinds!r}")

    def body(args, cupy, torch, env):
        args.cases = kinds
        return run(args, cupy, torch, env)

    return h.run_suite("groupby", __doc__, argv, body, quick="2^26 elements only")
