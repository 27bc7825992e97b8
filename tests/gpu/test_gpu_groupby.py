"""groupby_reduce and the xarray accessor on CuPy data (the per-chunk sort and the segment kernels over
flattened rows, on the GPU) against the same calls on NumPy data. The flattened path itself is replayed
on NumPy in tests/test_groupby.py (``flat=True``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.groupby import FUNCS  # noqa: E402


def _data(rng, shape, dtype, axis):
    x = rng.uniform(-1, 1, shape)
    if np.dtype(dtype).kind == "f":
        x[rng.random(shape) < 0.1] = np.nan
    else:
        x = rng.integers(-40, 40, shape)
    labels = rng.integers(0, 9, shape[axis]).astype(np.float64)
    labels[labels == 4] = 5  # label 4 only where set below
    labels[:2] = np.nan
    labels[[5, 9]] = 4
    return x.astype(dtype), labels


def _close(got, want, rtol):
    assert isinstance(got, cupy.ndarray)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    got = got.get()
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        # float32 products of many values in [-1, 1] reach subnormals, which the GPU's segment kernels
        # flush to zero (docs/design.md, known limits): below the smallest normal, zero is as close
        tiny = float(np.finfo(want.dtype).tiny) if rtol else 0.0
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=tiny,
                                   equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shape, axis", [((1003,), 0), ((7, 517), 1), ((301, 5, 3), 0), ((4, 65, 33), 1)])
def test_cupy_matches_numpy(func, dtype, shape, axis):
    rng = np.random.default_rng(11)
    x, labels = _data(rng, shape, dtype, axis)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want, groups = mr.groupby_reduce(x, labels, func, axis=axis)
        got, got_groups = mr.groupby_reduce(cupy.asarray(x), cupy.asarray(labels), func, axis=axis)
    np.testing.assert_array_equal(got_groups, groups)
    _close(got, want, 1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("func", ["sum", "nanmean", "nanvar", "max", "nanmin", "count", "all"])
def test_cupy_missing_groups_and_fill(func):
    rng = np.random.default_rng(12)
    x, labels = _data(rng, (6, 200), np.float64, 1)
    expected = np.array([8.0, 77.0, 0.0, 4.0, -3.0])
    want, _ = mr.groupby_reduce(x, labels, func, expected_groups=expected)
    got, _ = mr.groupby_reduce(cupy.asarray(x), labels, func, expected_groups=expected)
    _close(got, want, 1e-12)
    want, _ = mr.groupby_reduce(x.astype(np.int32), labels, "max", expected_groups=expected, fill_value=-1)
    got, _ = mr.groupby_reduce(cupy.asarray(x.astype(np.int32)), labels, "max", expected_groups=expected, fill_value=-1)
    _close(got, want, 0)


@pytest.mark.parametrize("func", ["nansum", "mean", "nanstd", "nanmax", "count", "prod"])
def test_dask_with_cupy_chunks_stays_lazy_and_on_the_gpu(func):
    rng = np.random.default_rng(13)
    x, labels = _data(rng, (97, 6, 5), np.float32, 0)
    want, groups = mr.groupby_reduce(x, labels, func, axis=0)
    d = da.from_array(cupy.asarray(x), chunks=(13, 4, 5), asarray=False)
    got, got_groups = mr.groupby_reduce(d, labels, func, axis=0, split_every=3)
    assert isinstance(got._meta, cupy.ndarray) and got.dtype == want.dtype
    with dask.config.set(scheduler="synchronous"):
        _close(got.compute(), want, 1e-5)


def test_xarray_accessor_on_cupy_data():
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    import multireduce.xarray  # noqa: F401

    rng = np.random.default_rng(14)
    x = rng.uniform(-1, 1, (200, 4, 6)).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = np.nan
    time = pd.date_range("2001-01-25", periods=200, freq="9h")
    host = xr.DataArray(x, dims=("time", "lat", "lon"), coords={"time": time}, name="t", attrs={"units": "K"})
    device = host.copy(data=cupy.asarray(x))
    for ours, theirs in [
        (device.mr.sum("time"), host.sum("time")),
        (device.mr.mean(["lat", "lon"]), host.mean(["lat", "lon"])),
        (device.mr.std("time", ddof=1), host.std("time", ddof=1)),
        (device.mr.cumsum("time"), host.cumsum("time")),
        (device.mr.groupby("time.month").mean(), host.groupby("time.month").mean()),
        (device.mr.resample(time="1D").max(), host.resample(time="1D").max()),
    ]:
        assert isinstance(ours.data, cupy.ndarray)
        # float32 sums of up to 200 values of [-1, 1] in another order: rounding of the running magnitude
        xr.testing.assert_allclose(ours.copy(data=ours.data.get()), theirs, rtol=1e-5, atol=1e-4)
        assert ours.attrs == theirs.attrs and ours.dims == theirs.dims
    lazy = host.copy(data=da.from_array(cupy.asarray(x), chunks=(50, 4, 3), asarray=False))
    monthly = lazy.mr.groupby("time.month").max()
    assert isinstance(monthly.data, da.Array) and isinstance(monthly.data._meta, cupy.ndarray)
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_allclose(monthly.data.compute().get(), host.groupby("time.month").max().values,
                                   equal_nan=True)
