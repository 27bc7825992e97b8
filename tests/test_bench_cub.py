"""CPU tests of benchmarks/bench_cub.py: arguments, the reference check, failure rows, the table, the skip
path, and one whole run with NumPy standing in for CuPy and a fake cuda.compute (so the row plumbing,
the refusal capture and the closures over sizes and modes are exercised without a GPU)."""

from __future__ import annotations

import enum
import json
import os
import sys
import types

import numpy as np
import pytest

from benchmarks import bench_cub as bc
from benchmarks import bench_segments
from benchmarks import harness as h


# ---------------------------------------------------------------------------------------------- args
def test_sizes_accept_exponents_powers_and_counts():
    assert bc.parse_args(["--sizes", "26,2^28,1000"]).sizes == [1 << 26, 1 << 28, 1000]


def test_defaults_and_quick():
    full, quick = bc.parse_args([]), bc.parse_args(["--quick"])
    assert full.sizes == [1 << 26, 1 << 28] and full.dtypes == ["float32", "float64"] and full.repeats == 20
    assert quick.sizes == [1 << 26] and quick.repeats == 5


def test_explicit_options_win_over_quick():
    args = bc.parse_args(["--quick", "--sizes", "28", "--repeats", "3", "--dtypes", "float64"])
    assert (args.sizes, args.repeats, args.dtypes) == ([1 << 28], 3, ["float64"])


def test_json_defaults_to_out(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bc.parse_args([]).json == os.path.join(str(tmp_path), "bench_cub.json")


@pytest.mark.parametrize("argv", [["--sizes", "big"], ["--sizes", "0"], ["--dtypes", "int32"],
                                  ["--repeats", "-1"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bc.parse_args(argv)


# --------------------------------------------------------------------------------------------- check
def test_bound_accepts_float32_rounding_and_rejects_a_wrong_sum():
    rng = np.random.default_rng(0)
    x = (rng.random(1 << 16) - 0.5).astype(np.float32)
    want, mass = float(np.sum(x, dtype=np.float64)), float(np.sum(np.abs(x), dtype=np.float64))
    assert bc.within_bound(float(np.sum(x)), want, mass, np.float32, x.size)[0]
    ok, detail = bc.within_bound(want + 1e-3 * mass, want, mass, np.float32, x.size)
    assert not ok and "bound" in detail


def test_bound_rejects_a_scan_with_one_wrong_element_a_wrong_shape_and_nan():
    x = np.random.default_rng(1).random(4096)
    want, mass = np.cumsum(x), np.cumsum(np.abs(x))
    bad = want.copy()
    bad[100] += 1.0
    assert bc.within_bound(want, want, mass, np.float64, x.size)[0]
    assert not bc.within_bound(bad, want, mass, np.float64, x.size)[0]
    assert "shape" in bc.within_bound(want[:-1], want, mass, np.float64, x.size)[1]
    nan = want.copy()
    nan[0] = np.nan
    assert "non-finite" in bc.within_bound(nan, want, mass, np.float64, x.size)[1]


# ---------------------------------------------------------------------------------------------- rows
def _timer(fn, xs, repeats, warmup):
    return 2.0


def _measure(build, check=lambda got: (True, "fine"), **kw):
    xs = [np.ones(8)]
    return bc.measure("sum", "impl", "float32", 8, build, xs, check, 8 * 4, 10.0, 3, timer=_timer, **kw)


def test_a_wrong_result_is_a_failure_row_and_is_not_timed():
    def timer(*a, **k):
        raise AssertionError("a wrong result must not be timed")

    xs = [np.ones(8)]
    r = bc.measure("sum", "fast but wrong", "float32", 8, lambda: lambda v: 0.0, xs,
                   lambda got: bc.within_bound(got, 8.0, 8.0, np.float32, 8), 32, 10.0, 3, timer=timer)
    assert not r.ok and r.note.startswith("WRONG") and np.isnan(r.ms) and r.extra["status"] == "wrong"


def test_a_right_result_is_timed_with_bandwidth_and_roof_fraction():
    r = _measure(lambda: lambda v: v.sum())
    assert r.ok and r.ms == 2.0 and r.gbps == pytest.approx(32 / 2.0 / 1e6)
    assert r.ratio_copy == pytest.approx(r.gbps / 10.0)


def test_repeat_check_reports_bitwise_differences():
    calls = iter(range(10))
    r = _measure(lambda: lambda v: float(next(calls)), repeat_check=True)
    assert r.ok and r.extra["repeatable"] is False and "DIFFERS" in r.note
    assert _measure(lambda: lambda v: 1.0, repeat_check=True).extra["repeatable"] is True


def test_a_refused_build_records_its_printed_reason():
    def build():
        os.write(1, b"ERROR in compile(): gpu-to-gpu determinism is not supported\n")
        raise RuntimeError("Failed building reduce, error code: 1")

    r = _measure(build, build_status="refused")
    assert not r.ok and r.note.startswith("refused: RuntimeError")
    assert "gpu-to-gpu determinism is not supported" in r.extra["error"]


def test_an_exception_while_running_is_a_failure_row():
    def run(v):
        raise TypeError("unexpected keyword argument")

    r = _measure(lambda: run)
    assert not r.ok and r.extra["status"] == "failed" and "unexpected keyword" in r.note


def test_table_cuts_long_notes_and_escapes_pipes():
    rows = [h.Row("sum", "x", "float32", 1 << 26, 1.0, 2.0, 0.5, False, note="a|b " + "z" * 200)]
    text = bc.table(rows)
    line = text.splitlines()[-1]
    assert line.count("|") == len(bc.TABLE_COLUMNS) + 1 and "a/b" in line and "..." in line
    assert "2^26" in line and rows[0].note.startswith("a|b")  # the row itself (the JSON) keeps it whole


# ---------------------------------------------------------------------------------------------- skip
def test_skip_path_without_cuda_compute(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bc, "import_compute", lambda: (None, "ModuleNotFoundError: No module named 'cuda'"))
    path = tmp_path / "cub.json"
    rows = bc.main(["--json", str(path)])
    out = capsys.readouterr().out
    assert bc.INSTALL in out and out.rstrip().splitlines()[-1].startswith("| cub")
    saved = json.loads(path.read_text())["rows"]
    assert len(rows) == len(saved) == 1 and saved[0]["extra"]["status"] == "skip"


def test_import_compute_reports_a_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)  # makes `import cuda.compute` fail, as on a bare machine
    monkeypatch.setitem(sys.modules, "cuda.compute", None)
    cc, why = bc.import_compute()
    assert cc is None and "Error" in why


# ---------------------------------------------------------------------------- whole run, no GPU
class _Pool:
    def free_all_blocks(self):
        pass


def _fake_cupy():
    """The slice of CuPy bench_cub uses, on NumPy."""
    rng = np.random.default_rng(3)
    cp = types.SimpleNamespace(**{k: getattr(np, k) for k in (
        "float64", "float32", "uint8", "asarray", "cumsum", "sum", "abs", "concatenate", "zeros", "empty",
        "empty_like")})
    cp.asnumpy = np.asarray
    cp.random = types.SimpleNamespace(random=lambda n, dtype: rng.random(n).astype(dtype))
    cp.get_default_memory_pool = _Pool
    return cp


def _fake_compute(wrong_scan=False):
    """cuda.compute's shape as read from NVIDIA/cccl: two-phase objects, Determinism, GPU_TO_GPU refused
    at build with a printed reason, no determinism argument on the scan."""
    Determinism = enum.IntEnum("Determinism", "NOT_GUARANTEED RUN_TO_RUN GPU_TO_GPU")
    OpKind = types.SimpleNamespace(PLUS="plus")

    def make_reduce_into(*, d_in, d_out, op, h_init, determinism=Determinism.RUN_TO_RUN):
        if determinism == Determinism.GPU_TO_GPU:
            os.write(1, b"\nERROR in cccl_device_reduce_compile(): gpu-to-gpu determinism is not supported\n")
            raise RuntimeError("Failed building reduce, error code: 1")

        def call(*, temp_storage, d_in, d_out, num_items, op, h_init, stream=None):
            if temp_storage is None:
                return 64
            d_out[0] = h_init[0] + d_in[:num_items].sum()
            return 64
        return call

    def make_inclusive_scan(*, d_in, d_out, op, init_value=None, compute_capability=None):
        def call(*, temp_storage, d_in, d_out, op, num_items, init_value, stream=None):
            if temp_storage is not None:
                d_out[:] = np.cumsum(d_in[:num_items]) + (1.0 if wrong_scan else 0.0)
            return 128
        return call

    def make_segmented_reduce(*, d_in, d_out, start_offsets_in, end_offsets_in, op, h_init):
        def call(*, temp_storage, d_in, d_out, num_segments, start_offsets_in, end_offsets_in, op, h_init):
            if temp_storage is not None:
                c = np.concatenate([[0.0], np.cumsum(d_in, dtype=np.float64)])
                d_out[:] = c[end_offsets_in] - c[start_offsets_in]
            return 0
        return call

    def reduce_into(*, d_in, d_out, num_items, op, h_init, stream=None):
        make_reduce_into(d_in=d_in, d_out=d_out, op=op, h_init=h_init)(
            temp_storage=b"", d_in=d_in, d_out=d_out, num_items=num_items, op=op, h_init=h_init)

    def inclusive_scan(*, d_in, d_out, op, init_value, num_items, stream=None):
        make_inclusive_scan(d_in=d_in, d_out=d_out, op=op)(
            temp_storage=b"", d_in=d_in, d_out=d_out, op=op, num_items=num_items, init_value=init_value)

    return types.SimpleNamespace(Determinism=Determinism, OpKind=OpKind, make_reduce_into=make_reduce_into,
                                 make_inclusive_scan=make_inclusive_scan, make_segmented_reduce=make_segmented_reduce,
                                 reduce_into=reduce_into, inclusive_scan=inclusive_scan)


def _run_without_gpu(monkeypatch, tmp_path, cc, n=1 << 14):
    monkeypatch.setattr(bench_segments, "SEGMENTS", (10, 1000))
    monkeypatch.setattr(h, "copy_roof", lambda nbytes: 100.0)
    monkeypatch.setattr(h, "time_gpu", lambda fn, xs, repeats=20, warmup=3, min_sample_ms=1.0: 1.0)
    cp = _fake_cupy()
    rows = []
    for dtype in ("float32", "float64"):
        rows += bc._size_rows(cc, cp, None, np.dtype(dtype), n, 3, set())
    bc.write_json(rows, {"device": "none"}, str(tmp_path / "cub.json"))
    return rows


def _by_impl(rows, family, dtype="float32"):
    return {r.impl: r for r in rows if r.family == family and r.dtype == dtype}


def test_whole_run_on_numpy_with_a_fake_cuda_compute(monkeypatch, tmp_path):
    rows = _run_without_gpu(monkeypatch, tmp_path, _fake_compute())
    for dtype in ("float32", "float64"):
        sums, scans = _by_impl(rows, "sum", dtype), _by_impl(rows, "cumsum", dtype)
        for impl in ("cub reduce (object)", "cub reduce_into (one call)", "cub reduce not_guaranteed",
                     "cub reduce run_to_run", "multireduce", "multireduce exact=True", "cupy"):
            assert sums[impl].ok, (impl, sums[impl].note)
            assert sums[impl].extra["repeatable"] is True
        refused = sums["cub reduce gpu_to_gpu"]
        assert not refused.ok and "gpu-to-gpu determinism is not supported" in refused.extra["error"]
        for impl in ("cub inclusive_scan (object)", "cub inclusive_scan (one call)", "multireduce", "cupy"):
            assert scans[impl].ok, (impl, scans[impl].note)
            assert scans[impl].ratio_copy == pytest.approx(2 * scans[impl].n * np.dtype(dtype).itemsize / 1e6 / 100)
        for mode in bc.MODES:  # the scan takes no determinism argument: each mode is a refusal row
            r = scans[f"cub inclusive_scan {mode.lower()}"]
            assert r.extra["status"] == "refused" and "determinism" in r.note
    segs = [r for r in rows if r.family.startswith("segments")]
    assert {r.family for r in segs} == {"segments m=10^1", "segments m=10^3"}
    assert all(r.ok and r.dtype == "float32" for r in segs), [r.note for r in segs if not r.ok]
    assert json.loads((tmp_path / "cub.json").read_text())["rows"][0]["family"] == "copy"


def test_whole_run_marks_a_wrong_cub_scan(monkeypatch, tmp_path):
    rows = _run_without_gpu(monkeypatch, tmp_path, _fake_compute(wrong_scan=True))
    scans = _by_impl(rows, "cumsum")
    assert not scans["cub inclusive_scan (object)"].ok and scans["cub inclusive_scan (object)"].note.startswith("WRONG")
    assert scans["multireduce"].ok


def test_refused_mode_is_recorded_once_across_sizes(monkeypatch):
    monkeypatch.setattr(bench_segments, "SEGMENTS", ())
    monkeypatch.setattr(h, "copy_roof", lambda nbytes: 100.0)
    monkeypatch.setattr(h, "time_gpu", lambda fn, xs, repeats=20, warmup=3, min_sample_ms=1.0: 1.0)
    cc, cp, refused = _fake_compute(), _fake_cupy(), set()
    first = bc._size_rows(cc, cp, None, np.dtype("float32"), 1 << 12, 2, refused)
    second = bc._size_rows(cc, cp, None, np.dtype("float32"), 1 << 13, 2, refused)
    assert "cub reduce gpu_to_gpu" in _by_impl(first, "sum") and "cub reduce gpu_to_gpu" not in _by_impl(second, "sum")
    assert "cub reduce run_to_run" in _by_impl(second, "sum")
