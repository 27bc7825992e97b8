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


@pytest.mark.parametrize("func", FUNCS)
def test_dask_cohorts_on_cupy_chunks_give_the_trees_bits(func):
    """Days of hours in CuPy chunks of a week and a bit, folded by cohorts: the bits of the tree over every
    chunk's partial (on a GPU a NaN met by an empty state comes back as the canonical NaN, and -0.0 as
    0.0, in both), the result chunked by the runs and on the GPU."""
    rng = np.random.default_rng(14)
    hours = 24 * 40
    x = rng.standard_normal((hours, 3, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = np.nan
    x[48:72] = -0.0
    labels = (np.arange(hours) // 24).astype(np.float64)
    labels[120:130] = np.nan
    data = x if func not in ("prod", "nanprod") else 1 + x / 1e3
    d = da.from_array(cupy.asarray(data), chunks=(166, 2, 5), asarray=False)
    with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = mr.groupby_reduce(d, labels, func, axis=0, split_every=3, method="cohorts")
        want, _ = mr.groupby_reduce(d, labels, func, axis=0, split_every=3, method="map-reduce")
        assert len(got.chunks[-1]) == d.numblocks[0] and isinstance(got._meta, cupy.ndarray)
        got, want = got.compute(), want.compute()
    assert isinstance(got, cupy.ndarray) and got.dtype == want.dtype
    assert got.get().tobytes() == want.get().tobytes()
    reference, _ = mr.groupby_reduce(data, labels, func, axis=0)
    _close(got, reference, 1e-5)


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


# ------------------------------------------------------------------------------------------------
# Many labels (one per element of a long axis): factorized, checked and put in group order on the GPU
# ------------------------------------------------------------------------------------------------
def _many_labels(kind: str, n: int, rng):
    if kind == "sorted":
        return np.repeat(np.arange(12), -(-n // 12))[:n]
    if kind == "unsorted":
        return rng.integers(0, 4096, n)
    if kind == "int8":
        return rng.integers(-128, 128, n).astype(np.int8)
    if kind == "wide int64":  # a span no table holds: sorted and searched
        return rng.choice(np.array([-2**62, 5, 2**61, 2**62 + 7]), n)
    if kind == "uint64 near the top":
        return (np.uint64(2**64 - 1) - rng.integers(0, 9, n).astype(np.uint64))
    labels = rng.integers(0, 300, n).astype(np.float64) / 4  # float labels, a fifth of them NaN
    labels[rng.random(n) < 0.2] = np.nan
    return labels


@pytest.mark.parametrize("kind", ["sorted", "unsorted", "int8", "wide int64", "uint64 near the top", "float with NaN"])
def test_many_labels_factorize_on_the_gpu_as_on_the_host(kind):
    from multireduce import groupby

    n = groupby.DEVICE_LABELS_MIN + 33
    labels = _many_labels(kind, n, np.random.default_rng(21))
    want_codes, want_groups = groupby.factorize(labels, n, None, "test")
    for by in (labels, cupy.asarray(labels)):
        codes, groups = groupby.factorize(by, n, None, "test", device=0)
        assert isinstance(codes, cupy.ndarray) and codes.dtype == np.int64
        assert groups.dtype == want_groups.dtype and np.array_equal(groups, want_groups)
        np.testing.assert_array_equal(codes.get(), want_codes)
    expected = want_groups[::3]  # some groups dropped; float labels also name one that no label has
    if labels.dtype.kind == "f":
        expected = np.concatenate([expected, [1e9]])
    want_codes, _ = groupby.factorize(labels, n, expected, "test")
    codes, groups = groupby.factorize(cupy.asarray(labels), n, expected, "test", device=0)
    np.testing.assert_array_equal(codes.get(), want_codes)
    assert np.array_equal(groups, expected)


@pytest.mark.parametrize("func", ["sum", "nanmean", "nanvar", "max", "nanmin", "count", "prod"])
@pytest.mark.parametrize("kind", ["sorted", "unsorted", "float with NaN"])
@pytest.mark.parametrize("n", [(1 << 16) + 33, (1 << 20) + 7])
def test_many_labels_cupy_matches_numpy(func, kind, n):
    rng = np.random.default_rng(22)
    labels = _many_labels(kind, n, rng)
    x = rng.uniform(-1, 1, n)
    x[rng.random(n) < 0.05] = np.nan
    if func == "prod":
        x = 1 + x / 64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want, groups = mr.groupby_reduce(x, labels, func)
        for by in (labels, cupy.asarray(labels)):
            got, got_groups = mr.groupby_reduce(cupy.asarray(x), by, func)
            np.testing.assert_array_equal(got_groups, groups)
            _close(got, want, 1e-12)
    again, _ = mr.groupby_reduce(cupy.asarray(x), cupy.asarray(labels), func)
    assert cupy.array_equal(got, again, equal_nan=True)  # the same bits on repeat


def test_many_labels_along_the_last_axis_of_rows_and_in_dask_chunks():
    rng = np.random.default_rng(23)
    n = (1 << 17) + 5
    labels = _many_labels("unsorted", n, rng)
    x = rng.standard_normal((3, n)).astype(np.float32)
    want, groups = mr.groupby_reduce(x, labels, "mean", axis=1)
    got, got_groups = mr.groupby_reduce(cupy.asarray(x), labels, "mean", axis=1)
    np.testing.assert_array_equal(got_groups, groups)
    _close(got, want, 1e-5)
    d = da.from_array(cupy.asarray(x), chunks=(2, 1 << 16), asarray=False)  # codes per chunk planned on the GPU
    lazy, _ = mr.groupby_reduce(d, cupy.asarray(labels), "mean", axis=1)
    with dask.config.set(scheduler="synchronous"):
        _close(lazy.compute(), want, 1e-5)


def test_many_labels_are_planned_on_the_gpu(monkeypatch):
    """No sort of the labels on the host: the group order of a chunk with many labels comes from the GPU."""
    from multireduce import groupby

    n = groupby.DEVICE_LABELS_MIN + 1
    labels = _many_labels("unsorted", n, np.random.default_rng(24))
    x = cupy.asarray(np.random.default_rng(25).standard_normal(n))
    host_sorts = []
    real = np.argsort
    monkeypatch.setattr(np, "argsort", lambda a, *args, **kw: host_sorts.append(np.shape(a)) or real(a, *args, **kw))
    seg = groupby._Segments(x, labels, 0, 4096, False)
    assert isinstance(seg.key, cupy.ndarray) and not host_sorts
    got, _ = mr.groupby_reduce(x, labels, "sum")
    assert not [s for s in host_sorts if s[0] >= n]
    want, _ = mr.groupby_reduce(x.get(), labels, "sum")
    _close(got, want, 1e-12)
