"""Sweep pass 2 of the exact GPU cumsum (kernels/exact_scan.cuh exact_scan_tiles<T, Out, Block, Items,
MinBlocks>): threads per tile (Block), elements per thread (Items) and the blocks per SM asked of ptxas
(MinBlocks, __launch_bounds__' second argument), checked bit for bit and timed.

    python -m benchmarks sweep-exact-scan [--quick] [--out FILE] [--logs 26,28]
                                          [--blocks 128,256,512] [--items 4,8,16,32] [--min-blocks 2,3,4,5,6]
    python -m benchmarks sweep-exact-scan --list     (the combinations and their shared memory; no GPU)

Each (Block, Items, MinBlocks) is compiled once by NVRTC (kernels._compiled over cupy_exact.module_text(),
the library's own options and disk cache; several compiles at a time, --jobs), float32->float32 and
float64->float64 in one module, a dtype left out where its tile does not fit 48 KB of static shared memory.
For float32 and float64, uniform and normal data (bench_exact.make_gpu) at 2^26 and 2^28 elements (1-D),
the whole exact cumsum is replayed as cupy_exact.device_cumsum runs it, with the variant's tile
(Block x Items) everywhere: pass 1 (exact_tile_words) and the fallback walk take the tile as a runtime
argument and the seeds only the tile count, so the library's kernels serve them; only pass 2 is the
variant's. Its output must be bitwise the library's mr.cumsum(x, exact=True) (written into a buffer
filled with garbage first): a variant that differs is reported loudly and disqualified. Times are CUDA-event
medians of 5 after a warm-up: pass 2 alone (seeds ready) and the whole pipeline (its allocations
included, as device_cumsum's), beside the plain mr.cumsum of the same array and the library's exact call.
"x plain" is plain ms / whole ms (the goal: >= 0.5). A markdown table is printed last; --out writes
every row as JSON.
"""

from __future__ import annotations

import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks import harness as h

BLOCKS = (128, 256, 512)
ITEMS = (4, 8, 16, 32)
MIN_BLOCKS = (2, 3, 4, 5, 6)
QUICK = {"blocks": (256, 512), "items": (8, 16, 32), "min_blocks": (2, 3, 4), "logs": (26,)}
LOGS = (26, 28)
DTYPES = ("float32", "float64")  # each scanned into its own dtype
KINDS = ("uniform", "normal")
STATIC_SHARED_LIMIT = 48 * 1024  # a kernel's static __shared__ (exact_scan_tiles' buffer is static)
PARTIAL_BYTES = 32  # exact_scan.cuh Partial: hi, lo, eb, flags
REPEATS = 5


def library_shape(dtype: str) -> tuple[int, int, int]:
    """The library's pass 2 for ``dtype``: (tuning exact_scan_block, exact_scan_items[dtype], exact_scan.cuh
    kScanMinBlocks)."""
    import re

    from multireduce import kernels as _kernels
    from multireduce.tuning import policy

    p = policy(9)
    found = re.search(r"constexpr int kScanMinBlocks = (\d+);", (_kernels.source_dir() / "exact_scan.cuh").read_text())
    return p.exact_scan_block, dict(p.exact_scan_items)[dtype], int(found.group(1))


def shared_bytes(itemsize: int, block: int, items: int) -> int:
    """exact_scan_tiles' static shared memory for T = Out of ``itemsize`` bytes: the padded tile (one slot
    per 32 elements more, exact_scan.cuh padded()) and the warps' Partials (ptxas: 17152 bytes for float32
    at 256 x 16, 34048 for float64)."""
    tile = block * items
    return itemsize * (tile + tile // 32) + (block // 32) * PARTIAL_BYTES


def combinations(blocks, items, min_blocks, max_threads_per_sm: int = 2048):
    """[(Block, Items, MinBlocks, dtypes)]: every combination asked for whose MinBlocks blocks of Block
    threads fit an SM's threads, each with the dtypes (DTYPES) whose tile fits the static shared memory;
    combinations no dtype fits are left out."""
    out = []
    for b, i, m in itertools.product(blocks, items, min_blocks):
        if b % 32 or b > 1024 or b * m > max_threads_per_sm:
            continue
        fits = tuple(d for d in DTYPES if shared_bytes(np.dtype(d).itemsize, b, i) <= STATIC_SHARED_LIMIT)
        if fits:
            out.append((b, i, m, fits))
    return out


def tiles_name(dtype: str, block: int, items: int, min_blocks: int, kernel: str = "exact_scan_tiles") -> str:
    from multireduce import kernels as _kernels

    t = _kernels.ctype(np.dtype(dtype))
    return f"mr::exact::{kernel}<{t}, {t}, {block}, {items}, {min_blocks}>"


def retry_name(dtype: str, block: int, items: int, min_blocks: int) -> str:
    """Pass 2's retry kernel of the same shape (the Partial path of the tiles pass 2 gave up)."""
    return tiles_name(dtype, block, items, min_blocks, "exact_scan_retry")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def parse(argv=None):
    ap = h.parser("sweep-exact-scan", __doc__,
                  quick="2^26 only; Block 256/512, Items 8/16/32, MinBlocks 2/3/4 (the explicit lists below win)")
    ap.add_argument("--out", metavar="FILE", help="write every row (and the compile failures) as JSON")
    ap.add_argument("--logs", type=_ints, help="log2 of the sizes (default 26,28)")
    ap.add_argument("--blocks", type=_ints, help="threads per tile (default 128,256,512)")
    ap.add_argument("--items", type=_ints, help="elements per thread (default 4,8,16,32)")
    ap.add_argument("--min-blocks", type=_ints, help="__launch_bounds__ blocks per SM (default 2,3,4,5,6)")
    ap.add_argument("--jobs", type=int, default=8, help="NVRTC compiles at a time (default 8)")
    ap.add_argument("--list", action="store_true", help="print the combinations and exit (no GPU)")
    args = ap.parse_args(argv)
    pick = QUICK if args.quick else {"blocks": BLOCKS, "items": ITEMS, "min_blocks": MIN_BLOCKS, "logs": LOGS}
    for key in pick:
        if getattr(args, key) is None:
            setattr(args, key, pick[key])
    return args


# ------------------------------------------------------------------------------------------------
# the GPU part (CuPy imported here only)
# ------------------------------------------------------------------------------------------------
def compile_variants(combos, jobs: int):
    """{(Block, Items, MinBlocks): {dtype: kernels.Kernel}} and {(Block, Items, MinBlocks): error}: one NVRTC
    module per combination, ``jobs`` at a time (NVRTC releases the GIL while it compiles)."""
    from multireduce import kernels as _kernels
    from multireduce.backends import cupy_exact as ce

    text = ce.module_text()

    def one(combo):
        b, i, m, dts = combo
        names = {d: tiles_name(d, b, i, m) for d in dts}
        names.update({f"{d} retry": retry_name(d, b, i, m) for d in dts})
        start = time.perf_counter()
        try:
            return combo, _kernels._compiled(text, names, f"exact scan pass 2 {b} x {i}, {m} blocks/SM"), \
                time.perf_counter() - start
        except Exception as exc:  # kernels.KernelError with NVRTC's log
            return combo, exc, time.perf_counter() - start

    kernels, failed = {}, {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for (b, i, m, _), got, seconds in pool.map(one, combos):
            if isinstance(got, Exception):
                failed[(b, i, m)] = str(got)
                print(f"!! COMPILE FAILED: Block {b}, Items {i}, MinBlocks {m}: {str(got)[:2000]}", flush=True)
            else:
                kernels[(b, i, m)] = got
                print(f"compiled Block {b:3d} Items {i:2d} MinBlocks {m}: {seconds:5.1f} s", flush=True)
    return kernels, failed


def pipeline(cupy, lib, tiles_kernel, x, block: int, items: int, out=None, timed_pass2=False, retry_kernel=None):
    """cupy_exact.device_cumsum with pass 2 replaced by ``tiles_kernel`` (Block x Items tiles; then
    ``retry_kernel``, its retry of the tiles the tile-wide fast path gave up, where there is one) for one
    C-contiguous (rows, n) array scanned into its own dtype, no carry, no skipnan. Returns (out, marked) or,
    with ``timed_pass2``, a function launching pass 2 alone on the state it built."""
    from multireduce.backends import cupy_exact as ce

    rows, n = x.shape
    tile = block * items
    tiles = -(-n // tile)
    count = rows * tiles
    i64 = np.int64
    words = cupy.zeros((rows, tiles + 1, ce.KTILEOUT), dtype=np.int64)
    lib["words"](int(min(-(-count // ce.SCAN_WARPS), 1 << 20)), ce.SCAN_WARPS * 32,
                 (x, i64(rows), i64(n), i64(tile), i64(tiles), words))
    lib["carries"](rows * ce.KTILEOUT, ce.CARRY_BLOCK, (words, i64(rows), i64(tiles + 1)))
    cum = words
    seeds = cupy.empty(count * 4, dtype=np.int64)
    lib["seeds"](int(min(-(-count // ce.SEED_BLOCK), 1 << 16)), ce.SEED_BLOCK,
                 (cum, i64(count), i64(tiles), np.int32(0), seeds))
    if out is None:
        out = cupy.empty((rows, n), dtype=x.dtype)
    marked = cupy.empty(count, dtype=np.int32)

    def pass2():
        tiles_kernel(int(min(count, (1 << 31) - 1)), block,
                     (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(0), out, marked))
        if retry_kernel is not None:
            retry_kernel(int(min(count, ce._RETRY_GRID)), block,
                         (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(0), out, marked))

    pass2()
    lib["fallback"](int(min(count, ce._FALLBACK_GRID)), 32,
                    (x, i64(rows), i64(n), i64(tile), i64(tiles), cum, marked, out))
    return pass2 if timed_pass2 else (out, marked)


def run(args) -> int:
    import cupy

    from benchmarks.bench_exact import make_gpu, median_ms

    import multireduce as mr
    from multireduce.backends import cupy_backend, cupy_exact as ce

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    max_threads = int(dev.attributes["MaxThreadsPerMultiProcessor"])
    combos = combinations(args.blocks, args.items, args.min_blocks, max_threads)
    shapes = "; ".join(f"{d} Block {b}, Items {i}, MinBlocks {m}" for d in DTYPES for b, i, m in [library_shape(d)])
    print(f"{gpu}: {len(combos)} combinations; the library's pass 2: {shapes}", flush=True)
    start = time.perf_counter()
    variants, failed = compile_variants(combos, args.jobs)
    print(f"compiled {len(variants)} modules in {time.perf_counter() - start:.1f} s", flush=True)

    info = {}  # (b, i, m, dtype) -> registers, local bytes, resident blocks per SM
    for (b, i, m), found in variants.items():
        for d, kernel in found.items():
            attrs = getattr(kernel.fn, "attributes", {}) or {}
            info[(b, i, m, d)] = (attrs.get("num_regs"), attrs.get("local_size_bytes"),
                                  cupy_backend.scan_occupancy(kernel, b))

    rows, mismatched = [], []
    for lg in args.logs:
        n = 1 << lg
        for d in DTYPES:
            dt = np.dtype(d)
            lib = ce._scan_kernels(dt, dt)
            for kind in KINDS:
                x = make_gpu(kind, n, dt)
                x2 = x.reshape(1, n)
                ref = mr.cumsum(x, exact=True)
                ref_bits = ref.view({4: np.uint32, 8: np.uint64}[dt.itemsize])
                plain = median_ms(lambda: mr.cumsum(x), REPEATS)
                library = median_ms(lambda: mr.cumsum(x, exact=True), REPEATS)
                print(f"2^{lg} {d} {kind}: plain mr.cumsum {plain:.3f} ms, mr.cumsum(exact=True) {library:.3f} ms "
                      f"({plain / library:.3f} x plain)", flush=True)
                rows.append({"dtype": d, "kind": kind, "log2n": lg, "block": None, "items": None,
                             "min_blocks": None, "variant": "library mr.cumsum(exact=True)", "whole_ms": library,
                             "plain_ms": plain, "x_plain": plain / library})
                for (b, i, m), found in variants.items():
                    if d not in found:
                        continue
                    kernel, retry = found[d], found.get(f"{d} retry")
                    regs, local, resident = info[(b, i, m, d)]
                    row = {"dtype": d, "kind": kind, "log2n": lg, "block": b, "items": i, "min_blocks": m,
                           "variant": "sweep", "registers": regs, "local_bytes": local,
                           "resident_blocks_per_sm": resident, "plain_ms": plain, "library_ms": library,
                           "default": (b, i, m) == library_shape(d)}
                    try:
                        out = cupy.empty((1, n), dtype=dt)
                        out.view(np.uint8).fill(0xA5)  # garbage: a variant that writes nothing cannot pass
                        got, marked = pipeline(cupy, lib, kernel, x2, b, i, out=out, retry_kernel=retry)
                        got_bits = got.reshape(n).view(ref_bits.dtype)
                        diff = int(cupy.count_nonzero(got_bits != ref_bits))
                        row["mismatches"], row["bits_equal"] = diff, diff == 0
                        row["marked_tiles"] = int(cupy.count_nonzero(marked))
                        del got, out, marked, got_bits
                        if diff:
                            mismatched.append((lg, d, kind, b, i, m, diff))
                            print(f"!! MISMATCH: 2^{lg} {d} {kind} Block {b} Items {i} MinBlocks {m}: {diff} "
                                  f"outputs differ from mr.cumsum(x, exact=True): DISQUALIFIED", flush=True)
                        p2 = pipeline(cupy, lib, kernel, x2, b, i, timed_pass2=True, retry_kernel=retry)
                        row["pass2_ms"] = median_ms(p2, REPEATS)
                        del p2
                        row["whole_ms"] = median_ms(lambda: pipeline(cupy, lib, kernel, x2, b, i, retry_kernel=retry),
                                                    REPEATS)
                        row["x_plain"] = plain / row["whole_ms"]
                    except Exception as exc:  # a launch that fails (resources): reported, the sweep goes on
                        row["error"] = str(exc)[:500]
                        row["bits_equal"] = False
                        print(f"!! FAILED: 2^{lg} {d} {kind} Block {b} Items {i} MinBlocks {m}: {exc}", flush=True)
                    rows.append(row)
                    if "whole_ms" in row:
                        print(f"2^{lg} {d} {kind} B{b:3d} I{i:2d} M{m}: regs {regs} local {local} "
                              f"resident {resident}: pass 2 {row['pass2_ms']:.3f} ms, whole {row['whole_ms']:.3f} ms "
                              f"({row['x_plain']:.3f} x plain), marked tiles {row['marked_tiles']}, "
                              f"bits {'equal' if row['bits_equal'] else 'DIFFER'}", flush=True)
                del x, x2, ref, ref_bits
                cupy.get_default_memory_pool().free_all_blocks()

    if args.out:
        Path(args.out).write_text(json.dumps({"device": gpu, "cupy": cupy.__version__, "rows": rows,
                                              "compile_failures": {f"{b}x{i}/{m}": e for (b, i, m), e in
                                                                   failed.items()}}, indent=1) + "\n")
    sweep = [r for r in rows if r["variant"] == "sweep" and "whole_ms" in r]
    print("\nBest bitwise-equal variant per dtype and size (lowest whole ms summed over the data kinds):\n")
    print("| dtype | n | Block | Items | MinBlocks | whole ms (sum) | default whole ms (sum) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lg, d in itertools.product(args.logs, DTYPES):
        totals, bad = {}, set()
        for r in sweep:
            if r["log2n"] == lg and r["dtype"] == d:
                key = (r["block"], r["items"], r["min_blocks"])
                totals.setdefault(key, []).append(r["whole_ms"])
                if not r["bits_equal"]:
                    bad.add(key)
        good = {k: sum(v) for k, v in totals.items() if k not in bad and len(v) == len(KINDS)}
        if good:
            best = min(good, key=good.get)
            dflt = f"{good[library_shape(d)]:.3f}" if library_shape(d) in good else "-"
            print(f"| {d} | 2^{lg} | {best[0]} | {best[1]} | {best[2]} | {good[best]:.3f} | {dflt} |")
    print(f"\n{gpu}; x plain = plain mr.cumsum ms / whole ms (target >= 0.5); resident = blocks per SM (occupancy API)\n")
    print("| dtype | data | n | Block | Items | MinBlocks | registers | local B | resident | pass-2 ms | whole ms "
          "| x plain | bits equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["variant"] != "sweep":
            print(f"| {r['dtype']} | {r['kind']} | 2^{r['log2n']} | library | | | | | | | {r['whole_ms']:.3f} "
                  f"| {r['x_plain']:.3f} | (reference; plain {r['plain_ms']:.3f} ms) |")
            continue
        mark = " (default)" if r["default"] else ""
        if "whole_ms" not in r:
            print(f"| {r['dtype']} | {r['kind']} | 2^{r['log2n']} | {r['block']} | {r['items']} | {r['min_blocks']}{mark} "
                  f"| {r['registers']} | {r['local_bytes']} | {r['resident_blocks_per_sm']} | - | - | - | FAILED |")
            continue
        eq = "yes" if r["bits_equal"] else f"**NO ({r['mismatches']} differ)**"
        print(f"| {r['dtype']} | {r['kind']} | 2^{r['log2n']} | {r['block']} | {r['items']} | {r['min_blocks']}{mark} "
              f"| {r['registers']} | {r['local_bytes']} | {r['resident_blocks_per_sm']} | {r['pass2_ms']:.3f} "
              f"| {r['whole_ms']:.3f} | {r['x_plain']:.3f} | {eq} |")
    if failed:
        print(f"\n!! {len(failed)} combinations failed to compile: "
              + ", ".join(f"{b}x{i}/{m}" for b, i, m in failed))
    if mismatched:
        print(f"\n!! {len(mismatched)} runs DIFFER from mr.cumsum(x, exact=True): "
              + ", ".join(f"2^{lg} {d} {k} {b}x{i}/{m} ({n} outputs)" for lg, d, k, b, i, m, n in mismatched))
    return 1 if (mismatched or failed or any("error" in r for r in rows)) else 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.list:
        for b, i, m, dts in combinations(args.blocks, args.items, args.min_blocks):
            sizes = ", ".join(f"{d} {shared_bytes(np.dtype(d).itemsize, b, i)} B" for d in dts)
            mine = [d for d in dts if library_shape(d) == (b, i, m)]
            print(f"Block {b:3d} Items {i:2d} MinBlocks {m}: tile {b * i:5d}, shared {sizes}"
                  + (f"  (the library's for {', '.join(mine)})" if mine else ""))
        return 0
    return run(args)

