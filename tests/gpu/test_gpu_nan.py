"""The nan-family on the GPU: NaN masked where the production kernels load each element (kernels/common.cuh
``load_as``), never on partial results, against NumPy's nan-functions.

NaN is placed at 16-byte vector, block-pass and scan-tile boundaries (from the policy the kernels are
launched with), at both ends, in runs, and in misaligned views (the vectorized kernel's head elements).
The same logic runs on the CPU in tests/test_api.py (the nan-family section).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce import tuning  # noqa: E402

from ..helpers import assert_matches, reference_reduce  # noqa: E402

FLOATS = [np.float16, np.float32, np.float64]
SIZES = [1, 31, 33, 1023, 1025, 4097, (1 << 20) + 3]
IDENTITY = {"sum": 0.0, "prod": 1.0}


def _policy():
    return tuning.policy(int(cupy.cuda.Device().compute_capability[:-1]))


def _boundaries(n: int, itemsize: int) -> np.ndarray:
    """Element indices around the kernels' boundaries: vectors, one block's pass of the vectorized reduce,
    look-back scan tiles."""
    p = _policy()
    per_vector = 16 // itemsize
    per_block = p.reduce_block * per_vector * p.reduce_vectors_per_thread
    tile = p.scan_shape(itemsize, max(4, itemsize), itemsize).tile(itemsize)
    marks = []
    for step in (per_vector, per_block, tile):
        for k in range(1, 6):
            marks += [k * step - 1, k * step, k * step + 1]
    marks = np.asarray(marks)
    return marks[marks < n]


def _data(n: int, dtype, product: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.uniform(0.9, 1.1, n) if product else rng.standard_normal(n)).astype(dtype)
    x[rng.random(n) < 0.2] = np.nan
    x[_boundaries(n, np.dtype(dtype).itemsize)] = np.nan
    x[0] = x[-1] = np.nan
    return x


def _check_reduce(got, host, base: str, dtype, what: str):
    """``got`` (a CuPy result) against the float64 reduction of ``host`` with NaN replaced by the identity."""
    filled = np.where(np.isnan(host), IDENTITY[base], host).astype(dtype)
    ref, mass = reference_reduce(filled, base)
    acc = np.float32 if np.dtype(dtype) == np.float16 else dtype
    assert_matches(cupy.asnumpy(got), ref, mass, acc, dtype, max(host.size, 1), what, product=base == "prod")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_nansum_nanprod_at_kernel_boundaries_and_misaligned(n, dtype):
    for base in ("sum", "prod"):
        host = _data(n, dtype, base == "prod", n)
        dev = cupy.asarray(host)
        before = dev.copy()
        fn = getattr(mr, "nan" + base)
        for view, what in [(slice(None), "whole"), (slice(1, None), "offset 1"), (slice(3, -2), "offset 3")]:
            h, d = host[view], dev[view]
            if h.size == 0:
                continue
            for attempt in ("first", "cached"):  # the general path, then the cached plan's launcher
                _check_reduce(fn(d), h, base, dtype, f"nan{base} {what} n={n} {attempt}")
            _check_reduce(mr.reduce(d, "nan" + base), h, base, dtype, f"reduce nan{base} {what} n={n}")
        cupy.testing.assert_array_equal(dev, before)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_nan_reductions_along_axes(dtype):
    """Rows (reduce_rows), columns (reduce_columns, split along K: the segments' partials are folded without
    the mask), on C-ordered and transposed data."""
    host = _data(257 * 129, dtype, False, 1).reshape(257, 129)
    host[5] = np.nan
    host[:, 7] = np.nan
    dev = cupy.asarray(host)
    for axis in (0, 1):
        for x_h, x_d in [(host, dev), (host.T, dev.T)]:
            got = mr.nansum(x_d, axis=axis)
            filled = np.where(np.isnan(x_h), 0, x_h).astype(dtype)
            ref, mass = reference_reduce(filled, "sum", axis=axis)
            acc = np.float32 if np.dtype(dtype) == np.float16 else dtype
            assert_matches(cupy.asnumpy(got), ref, mass, acc, dtype, x_h.shape[axis], f"axis={axis}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                for name in ("nanmin", "nanmax"):
                    np.testing.assert_array_equal(cupy.asnumpy(getattr(mr, name)(x_d, axis=axis)),
                                                  getattr(np, name)(x_h, axis=axis), err_msg=f"{name} axis={axis}")
    # few long columns: reduce_columns splits K into segments whose partials are folded again
    tall = _data((1 << 16) * 3, np.float32, False, 2).reshape(-1, 3)
    tall[100, 0], tall[101, 0] = np.inf, -np.inf  # one segment's partial is NaN: the next level keeps it
    got = cupy.asnumpy(mr.nansum(cupy.asarray(tall), axis=0))
    assert np.isnan(got[0]) and np.isnan(np.nansum(tall, axis=0)[0])
    ref, mass = reference_reduce(np.where(np.isnan(tall[:, 1:]), 0, tall[:, 1:]), "sum", axis=0)
    assert_matches(got[1:], ref, mass, np.float32, np.float32, tall.shape[0], "tall columns")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_nanmin_nanmax_match_numpy(dtype):
    for n in SIZES:
        host = _data(n, dtype, False, n + 7)
        host[n // 2] = np.inf if n > 2 else host[n // 2]
        for view in (slice(None), slice(1, None)):
            h = host[view]
            if h.size == 0 or np.isnan(h).all():
                continue
            for name in ("nanmin", "nanmax"):
                got = getattr(mr, name)(cupy.asarray(h))
                assert got.dtype == h.dtype and float(got) == float(getattr(np, name)(h)), (name, n)


def test_all_nan_and_infinities():
    for dtype in FLOATS:
        for n in (1, 33, 4097, (1 << 20) + 3):
            dev = cupy.full(n, np.nan, dtype)
            assert float(mr.nansum(dev)) == 0.0 and float(mr.nanprod(dev)) == 1.0
            for name in ("nanmin", "nanmax"):
                with pytest.warns(RuntimeWarning, match="All-NaN slice"):
                    assert np.isnan(float(getattr(mr, name)(dev)))
            # an infinity among NaN is a value, not an all-NaN slice
            dev[n // 2] = np.inf
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert float(mr.nanmin(dev)) == np.inf and float(mr.nanmax(dev)) == np.inf
    # inf - inf inside one block of a multi-block launch: that block's partial is NaN and stays NaN when
    # the last block folds the partials; and inf, -inf in blocks far apart meet there as NaN
    for far in (False, True):
        x = cupy.zeros((1 << 22) + 5, np.float32)
        x[1], x[-2 if far else 2], x[1000] = np.inf, -np.inf, np.nan
        assert np.isnan(float(mr.nansum(x)))
        scanned = cupy.asnumpy(mr.nancumsum(x))
        assert scanned[1] == np.inf and np.isnan(scanned[-1])


def _check_scan(got, host, base: str, dtype, what: str, axis=0):
    filled = np.where(np.isnan(host), IDENTITY[base], host).astype(dtype).astype(np.float64)
    if base == "sum":
        ref, mass = np.cumsum(filled, axis=axis), np.cumsum(np.abs(filled), axis=axis)
    else:
        ref = np.cumprod(filled, axis=axis)
        mass = np.abs(ref)
    acc = np.float32 if np.dtype(dtype) == np.float16 else dtype
    assert_matches(cupy.asnumpy(got), ref, mass, acc, dtype, host.shape[axis], what, product=base == "prod")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 33, 1025, (1 << 20) + 3])
def test_nan_scans_at_tile_boundaries(n, dtype):
    """The look-back scan (rows, misaligned views, a 2-d axis) and scan_columns read through the mask."""
    for base in ("sum", "prod"):
        host = _data(n, dtype, base == "prod", 3 * n)
        dev = cupy.asarray(host)
        fn = getattr(mr, "nancum" + base)
        for view in (slice(None), slice(1, None), slice(3, -2)):
            if host[view].size:
                _check_scan(fn(dev[view]), host[view], base, dtype, f"nancum{base} n={n} {view}")
                _check_scan(mr.scan(dev[view], "nan" + base), host[view], base, dtype, f"scan nan{base} {view}")
        if n >= 33:
            two_d = host[: n - n % 3].reshape(3, -1)
            for axis in (0, 1):  # scan_columns, then the look-back over rows
                _check_scan(fn(cupy.asarray(two_d), axis=axis), two_d, base, dtype, f"{base} axis={axis}", axis)


def test_nan_family_on_dask_cupy():
    da = pytest.importorskip("dask.array")
    host = _data((1 << 16) + 3, np.float32, False, 5)
    host[10], host[11] = np.inf, -np.inf  # one chunk's partial and scan total are NaN and must stay NaN
    x = da.from_array(cupy.asarray(host), chunks=4099, asarray=False)
    assert np.isnan(float(mr.nansum(x).compute())) and np.isnan(np.nansum(host))
    np.testing.assert_array_equal(np.isnan(cupy.asnumpy(mr.nancumsum(x).compute())), np.isnan(np.nancumsum(host)))
    host[11] = 1.0
    x = da.from_array(cupy.asarray(host), chunks=4099, asarray=False)
    assert float(mr.nansum(x).compute()) == np.inf
    finite = host.copy()
    finite[10] = 2.0
    x = da.from_array(cupy.asarray(finite), chunks=4099, asarray=False)
    ref, mass = reference_reduce(np.where(np.isnan(finite), 0, finite), "sum")
    assert_matches(cupy.asnumpy(mr.nansum(x).compute()), ref, mass, np.float32, np.float32, finite.size, "dask")
    got = cupy.asnumpy(mr.nancumsum(x).compute()).astype(np.float64)
    np.testing.assert_allclose(got, np.nancumsum(finite.astype(np.float64)), rtol=1e-4, atol=1e-2)
