"""groupby_reduce on CuPy data grouped along an axis that is not the last, with many elements after it
(a time x space field by month or by day): the chunk's rows stay in place and the row-segment kernel
(kernels/segment_rows.cuh) folds each run of labels, then the runs of each group. Against the same
calls on NumPy data; the planning is tested without a GPU in tests/test_groupby_rows.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.backends import cupy_segment  # noqa: E402
from multireduce.groupby import FUNCS, ROWS_MIN_COLUMNS  # noqa: E402

from .test_gpu_groupby import _close, _data  # noqa: E402


@pytest.fixture
def launches(monkeypatch):
    """How many times the row-segment path ran."""
    calls = []
    real = cupy_segment.segment_reduce_rows

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(cupy_segment, "segment_reduce_rows", counted)
    return calls


def _months(n: int) -> np.ndarray:
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
    return np.resize(np.repeat(np.arange(12), days), n).astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shape, axis, labelled", [((301, ROWS_MIN_COLUMNS), 0, "random"),
                                                    ((2, 203, 17, 19), 1, "random"),
                                                    ((1500, 300), 0, "months"),
                                                    ((3, 700, 257), 1, "sorted"),
                                                    ((1200, 258), 0, "long runs")])
def test_rows_in_place_match_numpy(launches, func, dtype, shape, axis, labelled):
    rng = np.random.default_rng(21)
    x, labels = _data(rng, shape, dtype, axis)
    if labelled == "months":  # runs of 672-744 rows: cut into pieces, folded again
        labels = _months(shape[axis] * 8)[::8]
    elif labelled == "long runs":  # longer than a piece: folded in pieces, then the pieces folded
        labels = np.repeat([2.0, 0.0, 1.0], 400)
        assert 400 > cupy_segment.ROWS_PIECE
    elif labelled == "sorted":
        labels = np.repeat(np.arange(5.0), -(-shape[axis] // 5))[:shape[axis]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want, groups = mr.groupby_reduce(x, labels, func, axis=axis)
        got, got_groups = mr.groupby_reduce(cupy.asarray(x), labels, func, axis=axis)
        again, _ = mr.groupby_reduce(cupy.asarray(x), labels, func, axis=axis)
    # every function reads the data through the rows path, but a count of integers (the group sizes)
    assert launches or (func == "count" and np.dtype(dtype).kind != "f"), "the rows path did not run"
    np.testing.assert_array_equal(got_groups, groups)
    if want.dtype == np.float64:
        # float64 sums of up to ~700 values of [-1, 1] in another order than NumPy's pairwise one: an
        # absolute error of up to ~700 ulps of 1 where a group's sum cancels to near zero
        assert isinstance(got, cupy.ndarray) and got.dtype == want.dtype
        np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=700 * np.finfo(np.float64).eps, equal_nan=True)
    else:
        _close(got, want, 1e-5 if dtype == np.float32 else 1e-12)
    assert got.tobytes() == again.tobytes()  # the same bits on every call


def test_a_field_by_month_in_dask_chunks_along_time(launches):
    rng = np.random.default_rng(22)
    steps = 8760 // 4
    x = rng.standard_normal((steps, 16, 32)).astype(np.float32)
    labels = _months(8760)[::4]
    want, groups = mr.groupby_reduce(x, labels, "mean", axis=0)
    d = da.from_array(cupy.asarray(x), chunks=(400, 16, 32), asarray=False)
    got, got_groups = mr.groupby_reduce(d, labels, "mean", axis=0)
    with dask.config.set(scheduler="synchronous"):
        _close(got.compute(), want, 1e-5)
    np.testing.assert_array_equal(got_groups, groups)
    assert launches


@pytest.mark.parametrize("func", ["sum", "max", "nanmin", "mean", "var", "any", "count"])
@pytest.mark.parametrize("dtype", [np.float16, np.bool_])
@pytest.mark.parametrize("case", ["pre > 1, even columns", "a view one element off", "hour of day", "empty axis"])
def test_rows_in_place_edge_layouts(launches, func, dtype, case):
    """Two columns per thread with several leading rows, the one-column fallback for a misaligned view,
    labels that change every row (put in group order first) and an empty grouped axis."""
    rng = np.random.default_rng(23)
    expected = None
    if case == "pre > 1, even columns":
        x, axis, labels = rng.uniform(-1, 1, (3, 150, 2, 130)), 1, _months(150 * 58)[::58]
    elif case == "a view one element off":
        x, axis, labels = rng.uniform(-1, 1, 1 + 90 * 300)[1:].reshape(90, 300), 0, np.arange(90.0) // 30
    elif case == "hour of day":
        x, axis, labels = rng.uniform(-1, 1, (96, 260)), 0, np.arange(96.0) % 24
    else:
        x, axis, labels, expected = rng.uniform(-1, 1, (2, 0, 300)), 1, np.array([]), [1.0, 2.0]
    x = (x > 0) if dtype == np.bool_ else x.astype(dtype)
    device = cupy.asarray(x)
    if case == "a view one element off":  # the same bytes, one element into an allocation
        device = cupy.asarray(np.concatenate([x.reshape(-1)[:1], x.reshape(-1)])).reshape(-1)[1:].reshape(x.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want, groups = mr.groupby_reduce(x, labels, func, axis=axis, expected_groups=expected)
        got, got_groups = mr.groupby_reduce(device, labels, func, axis=axis, expected_groups=expected)
    assert launches or func == "count", "the rows path did not run"
    np.testing.assert_array_equal(got_groups, groups)
    _close(got, want, 2e-3 if dtype == np.float16 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.float16])
@pytest.mark.parametrize("func", ["var", "nanstd"])
@pytest.mark.parametrize("labelled", ["months", "hour of day", "unsorted with NaN"])
def test_rows_variance_in_two_reads_gives_the_bits_of_the_deviations_copy(monkeypatch, func, dtype, labelled):
    """The variance of a chunk whose rows stay in place reads the data twice (the anchors, then the
    deviations' sums and squares in one kernel) with every rounding of the float64 copy's four passes:
    the same bits as that path, which is still there for the copy's own sake (for normal values: CuPy's
    conversion in that path flushes float32 subnormals, the shipped kernels keep them)."""
    from multireduce import groupby

    rng = np.random.default_rng(24)
    n = 1500
    x = rng.standard_normal((n, 300)) * 3 + 100
    x[rng.random(x.shape) < 0.02] = np.nan
    x = x.astype(dtype) if np.dtype(dtype).kind == "f" else np.nan_to_num(x).astype(dtype)
    labels = {"months": _months(n * 8)[::8], "hour of day": np.arange(n) % 24.0,
              "unsorted with NaN": np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 7, n))}[labelled]
    shifted = []
    real = cupy_segment.segment_shifted_squares_rows
    monkeypatch.setattr(cupy_segment, "segment_shifted_squares_rows",
                        lambda *a: shifted.append(a[0].shape) or real(*a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = mr.groupby_reduce(cupy.asarray(x), labels, func, axis=0, ddof=1)
        assert len(shifted) == 1, "one pass for the deviations' sums and squares"
        with monkeypatch.context() as undo:
            undo.setattr(groupby, "_reads_moments_twice", lambda dtype: False)  # the float64 copy's four passes
            want, _ = mr.groupby_reduce(cupy.asarray(x), labels, func, axis=0, ddof=1)
        host, _ = mr.groupby_reduce(x, labels, func, axis=0, ddof=1)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    _close(got, host, 2e-3 if dtype == np.float16 else 1e-5 if dtype == np.float32 else 1e-10)
