"""CUB baselines through ``cuda.compute``, side by side with multireduce, CuPy and PyTorch in one run
(CUB is the reference for a GPU reduce, scan and segmented reduce; its determinism modes are the
reference for what repeatable sums cost).

    python -m benchmarks cub [--sizes 26,28] [--dtypes float32,float64] [--repeats 20] [--quick]
                             [--json PATH]

Families, each at every size and dtype (float32 and float64, random data in [-0.5, 0.5), 2^26 and
2^28 elements: larger than L2):

- "sum": CUB DeviceReduce (object API: built once, temporary storage allocated once; and the one-call
  ``reduce_into``, which allocates its temporary storage on every call, as ``mr.sum`` and
  ``cupy.sum`` do), in each determinism mode cuda.compute exposes; ``mr.sum``, ``mr.sum(exact=True)``,
  ``cupy.sum``, ``torch.sum``.
- "cumsum": CUB DeviceScan (inclusive, object API and one call ``inclusive_scan``), ``mr.cumsum``,
  ``cupy.cumsum``, ``torch.cumsum``.
- "segments m=..." (float32 only): CUB DeviceSegmentedReduce at 2^10, 10^5, 2^20, 10^7 segments (the
  offsets of bench_segments.py), ``mr.segment_reduce``, ``torch.segment_reduce``.
- "copy": a device-to-device copy of the same bytes, the roof. ``ratio_copy`` is GB/s over the roof's
  GB/s; a reduction counts the bytes it reads, a scan the bytes read and written (as bench_reduce.py and
  bench_scan.py count them).

Every result is checked against a float64 reference before it is timed; a wrong result is a row with
``ok`` false and no time, an exception is a row with its text, and a determinism mode the build
refuses is a row with the refusal text (the C layer prints its reason on stdout, which is captured).
``extra["repeatable"]`` says whether three calls on the same input gave bitwise the same sum.
Timing: harness.time_gpu (CUDA events, median of repeats, inputs rotated among buffers larger than L2).
The JSON holds every row (--json; default $OUT/bench_cub.json); a Markdown table is printed last.

cuda.compute is not installed by this script. Without it the script prints how to install it, writes
one SKIP row and exits 0.

The cuda.compute 1.2.1 API used here was read from NVIDIA/cccl (mirror at 571f2fc3, 2026-08-22, whose
python/cuda_cccl is the 1.2 line; tag python-1.1.1 compared for the signatures below; the 1.2.1 wheel
itself was not in reach of this machine's registry):

- python/cuda_cccl/cuda/compute/__init__.py: exports make_reduce_into, reduce_into, make_inclusive_scan,
  inclusive_scan, make_segmented_reduce, segmented_reduce, OpKind, Determinism; ``_BINDINGS_AVAILABLE``
  is false on a machine without CUDA drivers (then every other attribute raises AttributeError).
- algorithms/_reduce.py: ``make_reduce_into(*, d_in, d_out, op, h_init, **kwargs)`` reads
  ``kwargs["determinism"]`` (default Determinism.RUN_TO_RUN); the object is called as
  ``(temp_storage=None | device array of uint8, d_in, d_out, num_items, op, h_init, stream=None)`` and
  returns the temporary storage bytes (two-phase: first with None to query, then with the buffer).
- algorithms/_scan.py: ``make_inclusive_scan(*, d_in, d_out, op, init_value=None, compute_capability)``:
  no determinism argument (passing one is a TypeError, recorded as the refusal).
- algorithms/_segmented_reduce.py: ``make_segmented_reduce(*, d_in, d_out, start_offsets_in,
  end_offsets_in, op, h_init)``, called with ``num_segments`` and both offset arrays.
- _bindings.pyi / _bindings_impl.pyx: ``Determinism`` = NOT_GUARANTEED, RUN_TO_RUN, GPU_TO_GPU; a failed
  build raises RuntimeError("Failed building reduce, error code: ...").
- c/parallel/src/reduce.cu: NOT_GUARANTEED needs OpKind.PLUS and a pointer output (one kernel, atomics,
  the output zeroed first); GPU_TO_GPU is refused ("gpu-to-gpu determinism is not supported").
- _caching.py: the make_* objects are cached on all arguments, keyword ones (determinism) included.
- _utils/protocols.py: stream=None is the legacy default stream, the one CuPy and PyTorch use here.
- tests/compute/examples/{reduction/reduce_object.py, scan/inclusive_scan_object.py,
  segmented/segmented_reduce_object.py}: CuPy arrays passed directly (``__cuda_array_interface__``),
  h_init as a 1-element NumPy array, temporary storage as ``cupy.empty(nbytes, uint8)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import asdict

import numpy as np

from benchmarks import harness as h

INSTALL = "pip install --no-index --find-links .whl-cccl cuda-cccl cuda-core cuda-bindings cuda-pathfinder"
MODES = ("NOT_GUARANTEED", "RUN_TO_RUN", "GPU_TO_GPU")
TABLE_COLUMNS = ("family", "impl", "dtype", "n", "ms", "gbps", "ratio_copy", "ok", "note")
NOTE_WIDTH = 90  # the table stays readable; the JSON keeps the whole text in extra["error"]


# ------------------------------------------------------------------------------------------------
# Pure Python: arguments, checks, rows, table (tested on the CPU in tests/test_bench_cub.py)
# ------------------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """'2^26', '26' (an exponent: below 64) or '67108864' -> element count."""
    text = text.strip()
    try:
        if text.startswith("2^"):
            return 1 << int(text[2:])
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected an exponent (26), 2^26 or a count") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected a positive number")
    return 1 << value if value < 64 else value


def parse_dtype(text: str) -> str:
    if text.strip() not in ("float32", "float64"):
        raise argparse.ArgumentTypeError(f"dtype {text!r}: expected float32 or float64")
    return text.strip()


def parse_args(argv=None) -> argparse.Namespace:
    parser = h.parser("cub", __doc__, quick="2^26 only, 5 repeats")
    parser.add_argument("--sizes", type=lambda s: [parse_size(p) for p in s.split(",") if p.strip()],
                        default=None, help="element counts: exponents or 2^k, comma separated (default 26,28)")
    parser.add_argument("--dtypes", type=lambda s: [parse_dtype(p) for p in s.split(",") if p.strip()],
                        default=None, help="float32,float64 (default both)")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per row (default 20)")
    parser.add_argument("--json", default=None, help="where the rows go (default $OUT/bench_cub.json)")
    args = parser.parse_args(argv)
    # explicit options win over --quick, so a quick run can still name its sizes
    args.sizes = args.sizes or ([1 << 26] if args.quick else [1 << 26, 1 << 28])
    args.dtypes = args.dtypes or ["float32", "float64"]
    args.repeats = args.repeats or (5 if args.quick else 20)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected at least 1")
    args.json = args.json or os.path.join(os.environ.get("OUT") or ".", "bench_cub.json")
    return args


def import_compute():
    """(cuda.compute, None) or (None, why not)."""
    try:
        import cuda.compute as cc
    except Exception as exc:  # ImportError, or a broken install failing on import
        return None, f"{type(exc).__name__}: {exc}"
    if not getattr(cc, "_BINDINGS_AVAILABLE", True):
        return None, "cuda.compute imported but its CUDA bindings are not available (no driver?)"
    return cc, None


def skip_rows(reason: str) -> list:
    return [h.Row("cub", "cuda.compute", "-", 0, float("nan"), float("nan"), ok=False,
                  note=f"SKIP: cuda.compute not importable ({reason}); install: {INSTALL}",
                  extra={"status": "skip", "error": reason})]


def within_bound(got, want, mass, dtype, n: int) -> tuple[bool, str]:
    """The blocked-sum error bound the other benchmarks use: |got - want| <= eps(dtype) * (n/1024 + 64)
    * mass, elementwise, where mass is the sum of |x| over the same elements. Returns (ok, detail)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    if got.shape != want.shape:
        return False, f"shape {got.shape}, expected {want.shape}"
    if not np.all(np.isfinite(got)):
        return False, "non-finite values"
    eps = np.finfo(np.dtype(dtype)).eps
    err = np.abs(got - want)
    bound = eps * (n / 1024 + 64) * mass + 1e-30
    worst = float(np.max(err / bound)) if err.size else 0.0
    if not np.all(err <= bound):
        return False, f"error {worst:.3g} x the bound"
    return True, f"error {worst:.2g} x bound"


def failure_row(family, impl, dtype, n, status: str, exc: BaseException, printed: str = "") -> h.Row:
    text = f"{type(exc).__name__}: {exc}" + (f" [printed: {printed.strip()}]" if printed.strip() else "")
    return h.Row(family, impl, dtype, n, float("nan"), float("nan"), ok=False,
                 note=f"{status}: {text}", extra={"status": status, "error": text})


def measure(family: str, impl: str, dtype: str, n: int, build, xs, check, moved: int, roof: float,
            repeats: int, timer=None, repeat_check: bool = False, build_status: str = "failed") -> h.Row:
    """One row: ``build()`` returns the callable (an exception there is recorded as ``build_status``:
    "refused" for a determinism mode), its result on ``xs[0]`` is checked, and only a right result is
    timed (a wrong one is a failure row)."""
    timer = timer or h.time_gpu
    with captured_stdout() as printed:
        try:
            fn = build()
        except Exception as exc:  # a mode the build refuses, or an API this version lacks
            fn, refusal = None, exc
    if fn is None:
        return failure_row(family, impl, dtype, n, build_status, refusal, printed[0])
    try:
        got = fn(xs[0])
        ok, detail = check(got)
        repeatable = None
        if ok and repeat_check:
            first = _bits(got)
            repeatable = all(_bits(fn(xs[0])) == first for _ in range(2))
    except Exception as exc:
        return failure_row(family, impl, dtype, n, "failed", exc)
    if not ok:
        return h.Row(family, impl, dtype, n, float("nan"), float("nan"), ok=False, note=f"WRONG: {detail}",
                     extra={"status": "wrong", "error": detail})
    try:
        ms = timer(fn, xs, repeats=repeats, warmup=2)
    except Exception as exc:
        return failure_row(family, impl, dtype, n, "failed", exc)
    gbps = moved / ms / 1e6
    extra = {"status": "ok", "check": detail}
    if repeatable is not None:
        extra["repeatable"] = repeatable
        detail += "; repeat " + ("bitwise same" if repeatable else "DIFFERS")
    return h.Row(family, impl, dtype, n, ms, gbps, gbps / roof, True, note=detail, extra=extra)


def host(value) -> np.ndarray:
    """A CuPy array, a torch tensor (CUDA or not) or a host value, on the host."""
    if hasattr(value, "get"):
        return np.asarray(value.get())
    if hasattr(value, "cpu"):
        return value.cpu().numpy()
    return np.asarray(value)


def _bits(value) -> bytes:
    return host(value).tobytes()


@contextlib.contextmanager
def captured_stdout():
    """Capture file descriptor 1 (cuda.compute's C layer prints its refusals with printf, not Python);
    yields a list that holds the text afterwards, which is also echoed so the log keeps it."""
    sys.stdout.flush()
    saved = os.dup(1)
    text: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            yield text
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode(errors="replace"))
            if text[0]:
                sys.stdout.write(text[0])


def table(rows: list) -> str:
    """The Markdown table printed last: harness.markdown with the note cut to NOTE_WIDTH."""
    short = []
    for r in rows:
        d = asdict(r)
        if len(d["note"]) > NOTE_WIDTH:
            d["note"] = d["note"][:NOTE_WIDTH - 3] + "..."
        d["note"] = d["note"].replace("|", "/")  # a pipe in an error text would split the cell
        short.append(h.Row(**d))
    return h.markdown(short, columns=TABLE_COLUMNS)


def write_json(rows: list, env: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": [asdict(r) for r in rows]}, f, indent=1)


def environment() -> dict:
    try:
        env = h.environment()
    except Exception as exc:  # no multireduce/CuPy importable: the skip row still gets written
        env = {"environment": f"unavailable ({type(exc).__name__}: {exc})"}
    try:
        from importlib.metadata import version

        for pkg in ("cuda-cccl", "cuda-core", "cuda-bindings", "cuda-pathfinder"):
            with contextlib.suppress(Exception):
                env[pkg] = version(pkg)
    except ImportError:
        pass
    return env


# ------------------------------------------------------------------------------------------------
# CUB through cuda.compute
# ------------------------------------------------------------------------------------------------
def cub_reduce(cc, cupy, x, mode: str | None):
    """Object API, the way a CUB user runs it in a loop: built once, temporary storage queried and
    allocated once, then one launch sequence per call. mode None: no determinism argument at all.
    The callable returns the 1-element output array (not ``out[0]``: a CuPy view per timed call is host
    time CUB does not spend)."""
    out = cupy.zeros(1, x.dtype)
    h_init = np.zeros(1, x.dtype)
    kwargs = {} if mode is None else {"determinism": getattr(cc.Determinism, mode)}
    reducer = cc.make_reduce_into(d_in=x, d_out=out, op=cc.OpKind.PLUS, h_init=h_init, **kwargs)
    nbytes = reducer(temp_storage=None, d_in=x, d_out=out, num_items=x.size, op=cc.OpKind.PLUS, h_init=h_init)
    temp = cupy.empty(max(int(nbytes), 1), cupy.uint8)

    def run(v):
        reducer(temp_storage=temp, d_in=v, d_out=out, num_items=v.size, op=cc.OpKind.PLUS, h_init=h_init)
        return out

    return run


def cub_reduce_one_call(cc, cupy, x):
    """The one-call form: temporary storage allocated (cudaMallocAsync) on every call, as mr.sum and
    cupy.sum allocate from their pools."""
    out = cupy.zeros(1, x.dtype)
    h_init = np.zeros(1, x.dtype)

    def run(v):
        cc.reduce_into(d_in=v, d_out=out, num_items=v.size, op=cc.OpKind.PLUS, h_init=h_init)
        return out

    return run


def cub_scan(cc, cupy, x, mode: str | None):
    out = cupy.empty_like(x)
    h_init = np.zeros(1, x.dtype)
    kwargs = {} if mode is None else {"determinism": getattr(cc.Determinism, mode)}
    scanner = cc.make_inclusive_scan(d_in=x, d_out=out, op=cc.OpKind.PLUS, init_value=h_init, **kwargs)
    nbytes = scanner(temp_storage=None, d_in=x, d_out=out, op=cc.OpKind.PLUS, num_items=x.size, init_value=h_init)
    temp = cupy.empty(max(int(nbytes), 1), cupy.uint8)

    def run(v):
        scanner(temp_storage=temp, d_in=v, d_out=out, op=cc.OpKind.PLUS, num_items=v.size, init_value=h_init)
        return out

    return run


def cub_scan_one_call(cc, cupy, x):
    out = cupy.empty_like(x)
    h_init = np.zeros(1, x.dtype)

    def run(v):
        cc.inclusive_scan(d_in=v, d_out=out, op=cc.OpKind.PLUS, init_value=h_init, num_items=v.size)
        return out

    return run


def cub_segmented(cc, cupy, x, starts, ends):
    m = int(starts.size)
    out = cupy.empty(m, x.dtype)
    h_init = np.zeros(1, x.dtype)
    args = dict(d_out=out, start_offsets_in=starts, end_offsets_in=ends, op=cc.OpKind.PLUS, h_init=h_init)
    reducer = cc.make_segmented_reduce(d_in=x, **args)
    nbytes = reducer(temp_storage=None, d_in=x, num_segments=m, **args)
    temp = cupy.empty(max(int(nbytes), 1), cupy.uint8)

    def run(v):
        reducer(temp_storage=temp, d_in=v, num_segments=m, **args)
        return out

    return run


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
def main(argv=None) -> list:
    args = parse_args(argv)
    cc, why = import_compute()
    if cc is None:
        print(f"cuda.compute is not importable ({why}).\nInstall the carried wheels first:\n    {INSTALL}")
        rows = skip_rows(why)
        write_json(rows, environment(), args.json)
        print(table(rows))
        return rows

    import cupy

    try:
        import torch
    except ImportError:
        torch = None
    env = environment()
    rows: list[h.Row] = []
    refused: set = set()  # a refusal does not depend on n: record it once per (family, mode, dtype)
    for dtype in args.dtypes:
        for n in args.sizes:
            rows += _size_rows(cc, cupy, torch, np.dtype(dtype), n, args.repeats, refused)
            cupy.get_default_memory_pool().free_all_blocks()
            write_json(rows, env, args.json)  # a later crash (out of memory at 2^28) keeps what was measured
    write_json(rows, env, args.json)
    print(table(rows))
    return rows


def _size_rows(cc, cupy, torch, dtype: np.dtype, n: int, repeats: int, refused: set) -> list:
    import multireduce as mr

    name = dtype.name
    nbytes = n * dtype.itemsize
    roof = h.copy_roof(nbytes)
    rows = [h.Row("copy", "cupy copy", name, n, 2 * nbytes / roof / 1e6, roof, 1.0, True,
                  note="read + written", extra={"status": "ok"})]
    xs = h.buffers(lambda i: cupy.random.random(n, dtype=dtype) - 0.5, nbytes, max_buffers=2 if n >= 1 << 28 else 4)
    x64 = xs[0].astype(cupy.float64)
    want, mass = float(cupy.sum(x64)), float(cupy.sum(cupy.abs(x64)))

    def check_sum(got):
        got = host(got)
        if got.size != 1:
            return False, f"{got.size} values, expected 1"
        return within_bound(float(got.reshape(-1)[0]), want, mass, dtype, n)

    def row(family, impl, build, check, moved, mode=None):
        key = (family, mode, name)
        if key in refused:
            return []
        r = measure(family, impl, name, n, build, xs, check, moved, roof, repeats, repeat_check=family == "sum",
                    build_status="refused" if mode else "failed")
        if r.extra.get("status") == "refused" and mode is not None:
            refused.add(key)
        return [r]

    as_torch = (lambda v: torch.as_tensor(v, device="cuda")) if torch is not None else None
    rows += row("sum", "cub reduce (object)", lambda: cub_reduce(cc, cupy, xs[0], None), check_sum, nbytes)
    rows += row("sum", "cub reduce_into (one call)", lambda: cub_reduce_one_call(cc, cupy, xs[0]), check_sum, nbytes)
    for mode in MODES:
        rows += row("sum", f"cub reduce {mode.lower()}", lambda mode=mode: cub_reduce(cc, cupy, xs[0], mode), check_sum,
                    nbytes, mode)
    rows += row("sum", "multireduce", lambda: mr.sum, check_sum, nbytes)
    rows += row("sum", "multireduce exact=True", lambda: lambda v: mr.sum(v, exact=True), check_sum, nbytes)
    rows += row("sum", "cupy", lambda: cupy.sum, check_sum, nbytes)
    if torch is not None:
        rows += row("sum", "torch", lambda: lambda v: torch.sum(as_torch(v)), check_sum, nbytes)
    del x64

    # the scan is checked at 257 spread positions, as bench_scan.py does (a full float64 copy of 2^28
    # elements per implementation would double the memory for little extra power)
    probe = cupy.asarray(np.unique(np.linspace(0, n - 1, 257).astype(np.int64)))
    ref = host(cupy.cumsum(xs[0].astype(cupy.float64))[probe])
    run_mass = host(cupy.cumsum(cupy.abs(xs[0].astype(cupy.float64)))[probe])

    def check_scan(got):
        return within_bound(host(cupy.asarray(got)[probe]), ref, run_mass, dtype, n)

    moved = 2 * nbytes
    rows += row("cumsum", "cub inclusive_scan (object)", lambda: cub_scan(cc, cupy, xs[0], None), check_scan, moved)
    rows += row("cumsum", "cub inclusive_scan (one call)", lambda: cub_scan_one_call(cc, cupy, xs[0]), check_scan, moved)
    for mode in MODES:
        rows += row("cumsum", f"cub inclusive_scan {mode.lower()}", lambda mode=mode: cub_scan(cc, cupy, xs[0], mode),
                    check_scan, moved, mode=mode)
    rows += row("cumsum", "multireduce", lambda: mr.cumsum, check_scan, moved)
    rows += row("cumsum", "cupy", lambda: cupy.cumsum, check_scan, moved)
    if torch is not None:
        rows += row("cumsum", "torch", lambda: lambda v: torch.cumsum(as_torch(v), 0), check_scan, moved)
    cupy.get_default_memory_pool().free_all_blocks()

    if dtype == np.float32:
        rows += _segment_rows(cc, cupy, torch, xs, n, roof, repeats)
    return rows


def _segment_rows(cc, cupy, torch, xs, n: int, roof: float, repeats: int) -> list:
    import multireduce as mr
    # the segment counts and random lengths of the bench_segments table, so the two tables line up
    from benchmarks.bench_segments import SEGMENTS, count_label, segment_case

    rows = []
    nbytes = 4 * n
    total = cupy.concatenate([cupy.zeros(1, cupy.float64), cupy.cumsum(xs[0], dtype=cupy.float64)])
    total_abs = cupy.concatenate([cupy.zeros(1, cupy.float64), cupy.cumsum(cupy.abs(xs[0]), dtype=cupy.float64)])
    for m in SEGMENTS:
        if m >= n:
            continue
        offsets, lengths, starts, ends, want = segment_case(cupy, total, n, m)
        mass = cupy.asnumpy(total_abs[ends] - total_abs[starts])
        seg_n = max(int(lengths.max()), 1)  # the bound grows with the longest segment, not with n

        def check(got, want=want, mass=mass, seg_n=seg_n):
            return within_bound(cupy.asnumpy(cupy.asarray(got)), want, mass, np.float32, seg_n)

        family = f"segments m={count_label(m)}"
        impls = {
            "cub segmented_reduce": lambda starts=starts, ends=ends: cub_segmented(cc, cupy, xs[0], starts, ends),
            "multireduce": lambda starts=starts: lambda v: mr.segment_reduce(v, starts),
        }
        if torch is not None:
            lengths_t = torch.as_tensor(lengths, device="cuda")
            impls["torch segment_reduce"] = lambda lengths_t=lengths_t: lambda v: torch.segment_reduce(
                torch.as_tensor(v, device="cuda"), "sum", lengths=lengths_t)
        for impl, build in impls.items():
            r = measure(family, impl, "float32", n, build, xs, check, nbytes, roof, repeats)
            r.extra["segments"] = m
            if r.ok:
                # data + start and end offsets (int64) + float32 results: what CUB reads and writes
                r.note += f"; all bytes {(nbytes + 20 * m) / r.ms / 1e6 / roof:.3f} x copy"
            rows.append(r)
        del starts, ends
    del total, total_abs
    cupy.get_default_memory_pool().free_all_blocks()
    return rows

