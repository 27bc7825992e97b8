"""Reductions, scans and statistics (var, argmax) of elementwise expressions on one GPU: the steps read
into our kernels' loads (multireduce.fusion) against the same call unfused (CuPy's kernel per step, then
ours), the bare array's reduction, dask.array, and the device-to-device copy roof. A Dask array of CuPy chunks in this process
(the synchronous scheduler: no task overhead to hide the kernels), float32, every value checked: the
fused result's bits against the unfused result's, both against a float64 reference."""

from __future__ import annotations

import statistics
import time

from .harness import Row, copy_roof, log2_text, markdown, run_suite, save

EXPRESSIONS = {
    "x * 2": lambda x, where: x * 2,
    "x * 2 + 1": lambda x, where: x * 2 + 1,
    "where(x > 0, x, 0)": lambda x, where: where(x > 0, x, 0),
}


def _wall_ms(fn, cupy, repeats: int) -> tuple[float, object]:
    value = fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        cupy.cuda.Device().synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), value


def body(args, cupy, torch, env):
    import dask
    import dask.array as da

    import multireduce as mr

    repeats = 3 if args.quick else 7
    total_log2 = 28 if args.quick else 30
    rows = []
    for chunk_log2 in ((24, 26) if args.quick else (24, 26, 28)):
        n = 1 << total_log2
        data = cupy.random.default_rng(chunk_log2).random(n, dtype=cupy.float32) - 0.5
        x = da.from_array(data, chunks=1 << chunk_log2, asarray=False)
        roof = copy_roof(n * 4)
        read_ms = n * 4 / roof / 1e6  # reading n float32 at the copy roof (bytes read + written per second)
        with dask.config.set(scheduler="sync"):
            bare_ms, _ = _wall_ms(lambda: mr.sum(x).compute(), cupy, repeats)
            rows.append(Row("sum", "mr.sum(x)", "float32", n, bare_ms, n * 4 / bare_ms / 1e6,
                            read_ms / bare_ms, note=f"chunks 2^{chunk_log2}"))
            for name, make in EXPRESSIONS.items():
                e = make(x, da.where)
                reference = float(make(data.astype(cupy.float64), cupy.where).sum())
                fused_ms, fused = _wall_ms(lambda: mr.sum(e).compute(), cupy, repeats)
                with dask.config.set({"multireduce.fuse-elementwise": False}):
                    plain_ms, plain = _wall_ms(lambda: mr.sum(e).compute(), cupy, repeats)
                dask_ms, theirs = _wall_ms(lambda: e.sum().compute(), cupy, repeats)
                same = cupy.asnumpy(fused).tobytes() == cupy.asnumpy(plain).tobytes()
                close = abs(float(fused) - reference) <= 1e-3 * abs(reference) + 1e-2 * n ** 0.5
                for impl, ms, ok in ((f"mr.sum({name}) read through", fused_ms, same and close),
                                     (f"mr.sum({name}) unfused", plain_ms, close),
                                     (f"da.sum({name})", dask_ms, abs(float(theirs) - reference) < 1e-2 * n ** 0.5)):
                    rows.append(Row("sum", impl, "float32", n, ms, n * 4 / ms / 1e6, read_ms / ms, ok,
                                    note=f"chunks 2^{chunk_log2}; x bare {bare_ms:.2f} ms"))
            e = x * 2 + 1
            reference = cupy.cumsum((data * 2 + 1).astype(cupy.float64))
            fused_ms, fused = _wall_ms(lambda: mr.cumsum(e).compute(), cupy, repeats)
            with dask.config.set({"multireduce.fuse-elementwise": False}):
                plain_ms, plain = _wall_ms(lambda: mr.cumsum(e).compute(), cupy, repeats)
            same = bool(cupy.array_equal(fused.view(cupy.uint32), plain.view(cupy.uint32)))
            close = float(cupy.abs(fused.astype(cupy.float64) - reference).max()) <= 1e-3 * float(cupy.abs(reference).max())
            for impl, ms, ok in (("mr.cumsum(x * 2 + 1) read through", fused_ms, same and close),
                                 ("mr.cumsum(x * 2 + 1) unfused", plain_ms, close)):
                rows.append(Row("cumsum", impl, "float32", n, ms, 2 * n * 4 / ms / 1e6, 2 * read_ms / ms, ok,
                                note=f"chunks 2^{chunk_log2}"))
            for name, stat, make in (("var(x + 1)", mr.var, lambda v: v + 1), ("argmax(x * 2)", mr.argmax, lambda v: v * 2)):
                e = make(x)
                fused_ms, fused = _wall_ms(lambda: stat(e).compute(), cupy, repeats)
                with dask.config.set({"multireduce.fuse-elementwise": False}):
                    plain_ms, plain = _wall_ms(lambda: stat(e).compute(), cupy, repeats)
                peer = getattr(e, stat.__name__)
                dask_ms, theirs = _wall_ms(lambda: peer().compute(), cupy, repeats)
                if stat is mr.var:
                    reference = float(make(data.astype(cupy.float64)).var())
                    close = abs(float(fused) - reference) <= 1e-4 * abs(reference)
                else:
                    close = int(fused) == int(cupy.argmax(make(data)))
                same = cupy.asnumpy(fused).tobytes() == cupy.asnumpy(plain).tobytes()
                for impl, ms, ok in ((f"mr.{name} read through", fused_ms, same and close),
                                     (f"mr.{name} unfused", plain_ms, close),
                                     (f"da.{name}", dask_ms, True)):
                    rows.append(Row(stat.__name__, impl, "float32", n, ms, n * 4 / ms / 1e6, read_ms / ms, ok,
                                    note=f"chunks 2^{chunk_log2}; x bare {bare_ms:.2f} ms"))
        x = data = e = None
        cupy.get_default_memory_pool().free_all_blocks()
    print(markdown(rows, ("family", "impl", "n", "ms", "gbps", "ratio_copy", "ok", "note")))
    save(rows, "bench_fusion", env)
    print(f"(ratio_copy: reading the input once (a scan: and writing it) at the copy roof, over the time; "
          f"n = {log2_text(1 << total_log2)})")
    return rows


def main(argv=None):
    return run_suite("fusion", __doc__, argv, body, quick="2^28 elements, chunks 2^24 and 2^26, 3 repeats")


if __name__ == "__main__":
    main()
