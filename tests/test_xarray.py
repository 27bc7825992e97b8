"""The ``.mr`` accessor against xarray's own methods on NumPy- and dask-backed data: every reduction, the
dim forms, skipna / min_count / keep_attrs, names, attrs and coords, scans, argmin/argmax, Datasets,
group-by and resample (missing bins, NaN-only groups, unsorted labels, groups straddling chunks), lazy
results for dask data, and the plain functions refusing labelled input."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402
import multireduce.xarray  # noqa: E402,F401  (registers .mr)

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

TIME = pd.date_range("2001-01-20", periods=90, freq="17h")


def _refuse(*args, **kwargs):
    raise AssertionError("computed while building the result")


def field(dtype=np.float64, backing="numpy"):
    """time x lat x lon with NaN scattered, one all-NaN (lat, lon) column, a non-index coord along lat
    and attrs; dask-backed: chunks that cut every month and day."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (TIME.size, 3, 5))
    if np.dtype(dtype).kind == "f":
        x[rng.random(x.shape) < 0.08] = np.nan
        x[:, 1, 2] = np.nan
    else:
        x = rng.integers(-9, 9, x.shape)
    arr = xr.DataArray(x.astype(dtype), dims=("time", "lat", "lon"), name="t2m", attrs={"units": "K"},
                       coords={"time": TIME, "lat": [10.0, 20.0, 30.0], "lon": np.arange(5) * 1.5,
                               "band": ("lat", ["a", "b", "c"])})
    if backing == "dask":  # chunking makes the non-index coord dask-backed too; the labels stay in memory
        arr = arr.chunk({"time": 11, "lat": 2, "lon": 3}).assign_coords(band=arr.band)
    return arr


def check(ours, theirs, rtol=1e-6):
    """Same values, dtype, dims, coords, name and attrs; a dask-backed result stays dask-backed."""
    xr.testing.assert_allclose(ours.compute(), theirs.compute(), rtol=rtol)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.dims == theirs.dims and ours.name == theirs.name and ours.attrs == theirs.attrs
    assert set(ours.coords) == set(theirs.coords)


def lazily(fn):
    with dask.config.set(scheduler=_refuse):
        return fn()


CASES = [("sum", {}), ("sum", {"skipna": False}), ("sum", {"min_count": 80}), ("prod", {"min_count": 2}),
         ("mean", {}), ("mean", {"skipna": False}), ("var", {"ddof": 1}), ("std", {}), ("min", {}),
         ("max", {"skipna": False}), ("count", {}), ("any", {}), ("all", {}), ("sum", {"keep_attrs": False})]


@pytest.mark.parametrize("backing", ["numpy", "dask"])
@pytest.mark.parametrize("dim", [None, "time", ["lat", "lon"], ...])
def test_reductions_match_xarray(backing, dim):
    arr = field(backing=backing)
    for method, kwargs in CASES:
        ours = lazily(lambda: getattr(arr.mr, method)(dim, **kwargs))
        if backing == "dask":
            assert isinstance(ours.data, da.Array), method
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            check(ours, getattr(arr, method)(dim, **kwargs))


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_integer_data_follow_xarray(backing):
    arr = field(np.int32, backing)
    for method, kwargs in CASES + [("sum", {"skipna": True, "min_count": 1000}), ("mean", {"skipna": True})]:
        check(getattr(arr.mr, method)("time", **kwargs), getattr(arr, method)("time", **kwargs))


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_scans_along_one_dim_and_several(backing):
    arr = field(backing=backing)
    for method in ("cumsum", "cumprod"):
        for dim, kwargs in [("time", {}), ("lon", {"skipna": False}), (["lat", "lon"], {})]:
            ours = lazily(lambda: getattr(arr.mr, method)(dim, **kwargs))
            check(ours, getattr(arr, method)(dim, **kwargs), rtol=1e-9)


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_argmin_argmax_in_every_dim_form(backing):
    arr = field(backing=backing).fillna(0.25)
    arr[5, 1, 1] = np.nan
    for method in ("argmin", "argmax"):
        for dim in ("time", ["lat", "lon"], ...) if backing == "numpy" or method == "argmin" else ("time",):
            ours, theirs = getattr(arr.mr, method)(dim), getattr(arr, method)(dim)
            if isinstance(theirs, dict):
                assert set(ours) == set(theirs)
                for key in theirs:
                    xr.testing.assert_identical(ours[key].compute(), theirs[key].compute())
            else:
                xr.testing.assert_identical(ours.compute(), theirs.compute())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # xarray's warning about dim=None
            assert int(getattr(arr.mr, method)()) == int(getattr(arr, method)())


def test_exact_sums_are_correctly_rounded_for_any_chunking():
    rng = np.random.default_rng(3)
    values = rng.standard_normal((40, 6)) * np.logspace(-8, 8, 40)[:, None]
    arr = xr.DataArray(values, dims=("time", "x"))
    want = [math.fsum(values[:, j]) for j in range(6)]
    for data in (arr, arr.chunk({"time": 7, "x": 4})):
        np.testing.assert_array_equal(data.mr.sum("time", exact=True).values, want)
        np.testing.assert_array_equal(data.mr.mean("time", exact=True, skipna=False).values,
                                      [float(sum(map(Fraction, values[:, j])) / 40) for j in range(6)])
        running = data.mr.cumsum("time", exact=True).values
        np.testing.assert_array_equal(running[-1], want)
    holed = arr.where(arr.time % 3 != 0)
    for data in (holed, holed.chunk({"time": 9})):  # skipna: the exact sum of the rest, over their count
        kept = [values[np.arange(40) % 3 != 0, j] for j in range(6)]
        np.testing.assert_array_equal(data.mr.sum("time", exact=True).values, [math.fsum(k) for k in kept])
        np.testing.assert_array_equal(data.mr.mean("time", exact=True).values, [math.fsum(k) / k.size for k in kept])


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:Degrees of freedom", "ignore:All-NaN slice",
                            "ignore:invalid value encountered")
def test_dataset_reductions_match_xarray():
    arr = field(backing="dask")
    ds = xr.Dataset({"t2m": arr, "flag": arr.isel(lat=0, drop=True) > 0, "name": ("lat", ["p", "q", "r"]),
                     "const": ("lon", np.arange(5.0))}, attrs={"title": "demo"})
    numeric = ds.drop_vars("name")  # xarray's own std, max, count and any refuse strings
    for data, method, kwargs in [(ds, "sum", {}), (ds, "mean", {}), (numeric, "std", {"ddof": 1}),
                                 (ds, "sum", {"keep_attrs": False}), (ds, "cumsum", {}), (numeric, "max", {}),
                                 (numeric, "count", {}), (numeric, "any", {}), (numeric, "var", {})]:
        ours = lazily(lambda: getattr(data.mr, method)("time", **kwargs))
        theirs = getattr(data, method)("time", **kwargs)
        xr.testing.assert_allclose(ours.compute(), theirs.compute())
        assert ours.attrs == theirs.attrs and list(ours.data_vars) == list(theirs.data_vars)


@pytest.mark.parametrize("backing", ["numpy", "dask"])
@pytest.mark.parametrize("group", ["time.month", "time.dayofyear", "band"])
def test_groupby_matches_xarray(backing, group):
    arr = field(backing=backing)
    cases = [("mean", {}), ("sum", {"min_count": 3}), ("var", {"ddof": 1}), ("max", {"skipna": False}), ("count", {})]
    if backing == "numpy":
        cases += [("sum", {}), ("std", {}), ("min", {}), ("prod", {}), ("mean", {"keep_attrs": False}), ("any", {}),
                  ("all", {})]
    for method, kwargs in cases:
        ours = lazily(lambda: getattr(arr.mr.groupby(group), method)(**kwargs))
        if backing == "dask":
            assert isinstance(ours.data, da.Array)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            check(ours, getattr(arr.groupby(group), method)(**kwargs))


def test_groupby_unsorted_labels_with_nan_and_integer_data():
    rng = np.random.default_rng(4)
    labels = rng.choice([3.0, -1.0, 7.5, np.nan], TIME.size)
    labels[labels == 7.5][:] = 7.5
    by = xr.DataArray(labels, dims="time", name="regime")
    for arr in (field(), field(np.int64, "dask")):
        for method in ("sum", "mean", "max", "count", "var"):
            check(getattr(arr.mr.groupby(by), method)(), getattr(arr.groupby(by), method)())


def test_groupby_computes_dask_backed_labels_only():
    arr = field(backing="dask").chunk({"time": 11, "lat": 2, "lon": 3})
    assert isinstance(arr.band.data, da.Array)
    # xarray's own group-by refuses chunked labels unless told them: computed here for the reference
    check(arr.mr.groupby("band").mean(), arr.assign_coords(band=arr.band.compute()).groupby("band").mean())


def test_groupby_nan_only_group():
    arr = field()
    arr[:, 0, 0] = np.where(arr.time.dt.month == 2, np.nan, arr[:, 0, 0])
    for method in ("sum", "mean", "max", "count", "std"):
        check(getattr(arr.mr.groupby("time.month"), method)(), getattr(arr.groupby("time.month"), method)())


def test_groupby_dataset():
    arr = field(backing="dask")
    ds = xr.Dataset({"a": arr, "b": arr.isel(lon=0, drop=True) * 2})
    ours = ds.mr.groupby("time.month").mean()
    theirs = ds.groupby("time.month").mean()
    for key in ("a", "b"):
        xr.testing.assert_allclose(ours[key].compute(), theirs[key].transpose(*ours[key].dims).compute())


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_resample_with_empty_bins_matches_xarray(backing):
    arr = field(backing=backing)
    gappy = arr.isel(time=np.r_[0:20, 31:50, 70:90])  # days with no sample: empty bins
    for freq in ("1D", "5D", "MS") if backing == "numpy" else ("1D",):
        for method, kwargs in [("max", {}), ("mean", {}), ("sum", {}), ("count", {}), ("var", {}), ("any", {}),
                               ("sum", {"min_count": 2})]:
            ours = lazily(lambda: getattr(gappy.mr.resample(time=freq), method)(**kwargs))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                theirs = getattr(gappy.resample(time=freq), method)(**kwargs)
            if method in ("count", "any"):
                # a bin whose values are all NaN: 0 and True here, as xarray's groupby and NumPy give; xarray's
                # resample gives NaN (its empty-bin fill reaches them)
                hollow = gappy.notnull().resample(time=freq).sum() == 0  # NaN (empty bins) == 0 is False
                expected = 0 if method == "count" else True
                assert (ours.where(hollow) == expected).sum() == hollow.sum()
                theirs = theirs.where(~hollow, expected)
            check(ours, theirs)


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_plain_functions_refuse_labelled_input(backing):
    arr = field(backing=backing)
    for fn in (mr.sum, mr.mean, mr.nanmax, mr.var, mr.argmin, mr.cumsum, mr.count_nonzero,
               lambda x: mr.sum(x, exact=True), lambda x: mr.sum(x, compute=True),
               lambda x: mr.segment_reduce(x, [0]), lambda x: mr.groupby_reduce(x, np.zeros(3), "sum")):
        with dask.config.set(scheduler=_refuse), pytest.raises(TypeError, match=r"x\.mr\.\w+\(dim="):
            fn(arr)
        with dask.config.set(scheduler=_refuse), pytest.raises(TypeError):  # exact=True asks a Dataset its dtype first
            fn(arr.to_dataset())
    with pytest.raises(TypeError, match=r"x\.mr\.max\(dim=\.\.\., skipna=True\)"):
        mr.nanmax(arr)


def test_groupby_and_resample_refuse_bad_arguments():
    arr = field()
    with pytest.raises(TypeError, match="argument 'group'"):
        arr.mr.groupby(np.arange(TIME.size))
    with pytest.raises(ValueError, match="not a dim"):
        arr.mr.groupby(xr.DataArray(np.arange(4), dims="other", name="o"))
    with pytest.raises(ValueError, match="one dim=frequency"):
        arr.mr.resample(time="1D", lat="2")
    with pytest.raises(ValueError, match="monotonic"):
        arr.isel(time=slice(None, None, -1)).mr.resample(time="1D")
    with pytest.raises(TypeError, match="argument 'x' has dtype"):
        arr.astype("datetime64[ns]").mr.sum("time")
