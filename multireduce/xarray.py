"""The ``.mr`` accessor: multireduce's reductions, scans and group-by on xarray objects.

``import multireduce.xarray`` registers ``.mr`` on ``xarray.DataArray`` and ``xarray.Dataset``::

    import multireduce.xarray
    arr.mr.sum(dim="time")                         # as arr.sum(dim="time"), computed by multireduce
    arr.mr.groupby("time.month").mean()            # monthly climatology
    arr.mr.resample(time="1D").max()               # daily maximum

Every method follows the xarray method of the same name: ``dim`` (None, a name, a list of names or
``...``), ``skipna`` (by default True for floating data), ``min_count``, ``keep_attrs``, the name,
and the coordinates (those along reduced dimensions dropped). The metadata goes through xarray's own
``reduce``; the data through multireduce's functions, which dispatch on the array under the labels:
NumPy now on the CPU, CuPy on its GPU, and dask lazily (the result stays dask-backed, chunks of the
input's type). ``exact=True`` (sum, mean, cumsum) gives correctly rounded sums (docs/numerics.md).

Group-by and resample use ``multireduce.groupby``: the labels (small) are factorized on the host, the
data reduced per chunk and combined in a tree; groups may straddle chunks and labels need not be sorted.
"""

from __future__ import annotations

import warnings

import numpy as np

try:
    import xarray as xr
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("multireduce.xarray needs xarray and pandas: pip install 'multireduce[xarray]'") from exc

from . import groupby as _groupby
from . import statistics as _stats
from . import api as _api

__all__ = ["DataArrayAccessor", "DatasetAccessor", "GroupBy"]

# xarray hides these NumPy warnings in its own reductions (a skipped all-NaN slice gives NaN)
_QUIET = ("All-NaN slice encountered", "Mean of empty slice", "Degrees of freedom <= 0 for slice")


def _skip(skipna, data) -> bool:
    """xarray's rule: skip NaN when asked, or by default for floating (and complex) data."""
    return bool(skipna) or (skipna is None and data.dtype.kind in "fc")


def _quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        for text in _QUIET:
            warnings.filterwarnings("ignore", text, RuntimeWarning)
        return fn(*args, **kwargs)


def _valid(data, axis):
    """The non-NaN count over ``axis`` (intp)."""
    return _stats.count_nonzero(~np.isnan(data), axis)


def _null_out(result, data, axis, min_count):
    """xarray's min_count: NaN where fewer than ``min_count`` values are not NaN (integer results become
    float64 to hold it, as xarray promotes them)."""
    result = result.astype(np.result_type(result.dtype, np.nan), copy=False)
    return np.where(_valid(data, axis) < min_count, np.nan, result)


# ------------------------------------------------------------------------------------------------
# The array functions xarray's ``reduce`` calls as func(data, axis=..., **kwargs)
# ------------------------------------------------------------------------------------------------
def _invariant(fn):
    """As xarray's own sum, prod, mean, min, max and scans: over no axis (a Dataset's variables that lack
    the reduced dims) the data come back as they are, whatever their dtype."""

    def over(data, axis=None, **kwargs):
        return data if axis == () else fn(data, axis, **kwargs)

    over.__name__ = fn.__name__
    return over


@_invariant
def _sum(data, axis=None, skipna=None, min_count=None, exact=False):
    if not _skip(skipna, data):
        return _api.sum(data, axis, exact=exact)
    result = _stats.nansum(data, axis, exact=exact)
    return result if min_count is None else _null_out(result, data, axis, min_count)


@_invariant
def _prod(data, axis=None, skipna=None, min_count=None):
    if not _skip(skipna, data):
        return _api.prod(data, axis)
    result = _stats.nanprod(data, axis)
    return result if min_count is None else _null_out(result, data, axis, min_count)


@_invariant
def _mean(data, axis=None, skipna=None, exact=False):
    if not _skip(skipna, data) or data.dtype.kind not in "fc":
        return _api.mean(data, axis, exact=exact)
    if not exact:
        return _quietly(_stats.nanmean, data, axis)
    # the exact sum of the non-NaN values, rounded once to float64, over their count
    total = _stats.nansum(data, axis, dtype=np.float64, exact=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / _valid(data, axis)).astype(data.dtype, copy=False)


def _var(data, axis=None, skipna=None, ddof=0):
    return _quietly(_stats.nanvar if _skip(skipna, data) else _stats.var, data, axis, ddof=ddof)


def _std(data, axis=None, skipna=None, ddof=0):
    return _quietly(_stats.nanstd if _skip(skipna, data) else _stats.std, data, axis, ddof=ddof)


@_invariant
def _min(data, axis=None, skipna=None):
    return _quietly(_stats.nanmin if _skip(skipna, data) else _api.min, data, axis)


@_invariant
def _max(data, axis=None, skipna=None):
    return _quietly(_stats.nanmax if _skip(skipna, data) else _api.max, data, axis)


def _argmin(data, axis=None, skipna=None):
    return (_stats.nanargmin if _skip(skipna, data) else _stats.argmin)(data, axis)


def _argmax(data, axis=None, skipna=None):
    return (_stats.nanargmax if _skip(skipna, data) else _stats.argmax)(data, axis)


def _count(data, axis=None):
    return _valid(data, axis)


def _any(data, axis=None):
    return _stats.any(data, axis)


def _all(data, axis=None):
    return _stats.all(data, axis)


def _each_axis(axis, ndim):
    """xarray's N-d scans: over each axis in turn (every axis for None)."""
    if axis is None:
        return tuple(range(ndim))
    return axis if isinstance(axis, tuple) else (axis,)


@_invariant
def _cumsum(data, axis=None, skipna=None, exact=False):
    scan = _stats.nancumsum if _skip(skipna, data) else _api.cumsum
    for a in _each_axis(axis, data.ndim):
        data = scan(data, a, exact=exact)
    return data


@_invariant
def _cumprod(data, axis=None, skipna=None):
    scan = _stats.nancumprod if _skip(skipna, data) else _api.cumprod
    for a in _each_axis(axis, data.ndim):
        data = scan(data, a)
    return data


def _exact_flag(exact):
    return {} if exact is False else {"exact": exact}


# ------------------------------------------------------------------------------------------------
# The accessors
# ------------------------------------------------------------------------------------------------
class _Accessor:
    """What DataArray and Dataset share: every reduction is ``obj.reduce(func, dim, ...)``, so dims,
    coords, name and attrs follow xarray's own rules; ``numeric_only`` as xarray's Dataset methods pass it."""

    def __init__(self, obj):
        self._obj = obj

    def _reduce(self, func, dim, keep_attrs, numeric_only=False, **kwargs):
        if isinstance(self._obj, xr.Dataset):
            kwargs["numeric_only"] = numeric_only
        return self._obj.reduce(func, dim=dim, keep_attrs=keep_attrs, **kwargs)

    def sum(self, dim=None, *, skipna=None, min_count=None, keep_attrs=None, exact=False):
        """Sum over ``dim``, as ``obj.sum``; ``exact=True``: correctly rounded."""
        return self._reduce(_sum, dim, keep_attrs, True, skipna=skipna, min_count=min_count, **_exact_flag(exact))

    def prod(self, dim=None, *, skipna=None, min_count=None, keep_attrs=None):
        """Product over ``dim``, as ``obj.prod``."""
        return self._reduce(_prod, dim, keep_attrs, True, skipna=skipna, min_count=min_count)

    def mean(self, dim=None, *, skipna=None, keep_attrs=None, exact=False):
        """Mean over ``dim``, as ``obj.mean``; ``exact=True``: from the correctly rounded sum."""
        return self._reduce(_mean, dim, keep_attrs, True, skipna=skipna, **_exact_flag(exact))

    def var(self, dim=None, *, skipna=None, ddof=0, keep_attrs=None):
        """Variance over ``dim``, as ``obj.var`` (one pass: Chan's merge of per-chunk moments)."""
        return self._reduce(_var, dim, keep_attrs, True, skipna=skipna, ddof=ddof)

    def std(self, dim=None, *, skipna=None, ddof=0, keep_attrs=None):
        """Standard deviation over ``dim``, as ``obj.std``."""
        return self._reduce(_std, dim, keep_attrs, True, skipna=skipna, ddof=ddof)

    def min(self, dim=None, *, skipna=None, keep_attrs=None):
        """Minimum over ``dim``, as ``obj.min``."""
        return self._reduce(_min, dim, keep_attrs, skipna=skipna)

    def max(self, dim=None, *, skipna=None, keep_attrs=None):
        """Maximum over ``dim``, as ``obj.max``."""
        return self._reduce(_max, dim, keep_attrs, skipna=skipna)

    def count(self, dim=None, *, keep_attrs=None):
        """Number of non-NaN values over ``dim``, as ``obj.count``."""
        return self._reduce(_count, dim, keep_attrs)

    def any(self, dim=None, *, keep_attrs=None):
        """Whether some value over ``dim`` is non-zero, as ``obj.any``."""
        return self._reduce(_any, dim, keep_attrs)

    def all(self, dim=None, *, keep_attrs=None):
        """Whether every value over ``dim`` is non-zero, as ``obj.all``."""
        return self._reduce(_all, dim, keep_attrs)

    def cumsum(self, dim=None, *, skipna=None, keep_attrs=None, exact=False):
        """Running sum along ``dim`` (each dim in turn for several), as ``obj.cumsum``."""
        return self._scanned(self._reduce(_cumsum, dim, keep_attrs, True, skipna=skipna, **_exact_flag(exact)))

    def cumprod(self, dim=None, *, skipna=None, keep_attrs=None):
        """Running product along ``dim``, as ``obj.cumprod``."""
        return self._scanned(self._reduce(_cumprod, dim, keep_attrs, True, skipna=skipna))

    def _scanned(self, result):
        """A scan keeps every coordinate (a Dataset's ``reduce`` drops those along the scanned dims, which
        xarray's own Dataset scans keep)."""
        lost = {k: c for k, c in self._obj.coords.items() if k not in result.coords}
        return result.assign_coords(lost) if lost else result

    def argmin(self, dim=None, *, skipna=None, keep_attrs=None):
        """Index of the minimum, as ``obj.argmin``: over one dim an array of indices; over several (a
        list or ``...``) a dict of them per dim, which ``obj.isel`` takes; ``dim=None`` the flat index."""
        return self._arg(_argmin, dim, skipna, keep_attrs)

    def argmax(self, dim=None, *, skipna=None, keep_attrs=None):
        """Index of the maximum, as ``obj.argmax`` (see ``argmin``)."""
        return self._arg(_argmax, dim, skipna, keep_attrs)

    def _arg(self, func, dim, skipna, keep_attrs):
        obj = self._obj
        if dim is None or isinstance(dim, str):
            return self._reduce(func, dim, keep_attrs, skipna=skipna)
        if isinstance(obj, xr.Dataset):
            raise ValueError("argmin/argmax of a Dataset over several dims is not defined (xarray's neither): "
                             "pass one dim, or reduce each DataArray")
        dims = tuple(obj.dims) if dim is ... else tuple(dim)
        stacked_dim = "_mr_stacked"
        while stacked_dim in obj.dims:
            stacked_dim += "_"
        # the dims to search, as one, last: a flat index over them, unravelled per dim
        stacked = obj.transpose(..., *dims).variable
        flat = stacked.data.reshape(stacked.shape[: stacked.ndim - len(dims)] + (-1,))
        index = xr.Variable(stacked.dims[: stacked.ndim - len(dims)] + (stacked_dim,), flat)
        found = index.reduce(func, dim=stacked_dim, keep_attrs=False, skipna=skipna)
        sizes = tuple(obj.sizes[d] for d in dims)
        keep = _keep_attrs(keep_attrs)
        coords = {k: c for k, c in obj.coords.items() if not set(c.dims) & set(dims)}
        return {d: xr.DataArray(i, dims=found.dims, coords=coords, name=obj.name, attrs=obj.attrs if keep else None)
                for d, i in zip(dims, _unravel(found.data, sizes))}

    # -- group-by ---------------------------------------------------------------------------------
    def groupby(self, group):
        """Groups of ``group`` (a coordinate name such as "time.month", or a named 1-D DataArray along
        one dim); its reductions (sum, mean, ...) work as xarray's group-by reductions."""
        obj = self._obj
        labels = obj[group] if isinstance(group, str) else group
        if not isinstance(labels, xr.DataArray) or labels.ndim != 1 or labels.name is None:
            raise TypeError(f"groupby: argument 'group' must be a coordinate name or a named 1-D DataArray; got "
                            f"{type(group).__name__}" + (f" of {labels.ndim} dims" if hasattr(labels, "ndim") else ""))
        (dim,) = labels.dims
        if dim not in obj.dims:
            raise ValueError(f"groupby: argument 'group' runs along {dim!r}, which is not a dim of the object "
                             f"{tuple(obj.dims)}")
        codes, groups = _groupby.factorize(labels.values, obj.sizes[dim], None, "groupby")
        return GroupBy(obj, dim, codes, xr.Variable(labels.name, groups, labels.attrs), labels.name)

    def resample(self, indexer=None, *, closed=None, label=None, origin="start_day", offset=None, **indexers):
        """Bins of a time coordinate, as ``obj.resample(time="1D")``: one group per bin from the first to
        the last, an empty bin NaN (as xarray's); its reductions work as xarray's resample reductions."""
        import pandas as pd

        obj = self._obj
        indexers = dict(indexer or {}, **indexers)
        if len(indexers) != 1:
            raise ValueError(f"resample: expected one dim=frequency pair; got {indexers!r}")
        ((dim, freq),) = indexers.items()
        if dim not in obj.dims or dim not in obj.indexes:
            raise ValueError(f"resample: {dim!r} is not a dim with an index; dims {tuple(obj.dims)}")
        index = obj.indexes[dim]
        if not index.is_monotonic_increasing:
            raise ValueError(f"resample: the index of {dim!r} must be monotonic increasing")
        bins = pd.Series(np.ones(len(index)), index=index).resample(
            freq, closed=closed, label=label, origin=origin, offset=offset).count()
        codes = np.repeat(np.arange(len(bins)), bins.to_numpy().astype(np.int64))
        coord = xr.Variable(dim, bins.index.to_numpy(), obj[dim].attrs)
        return GroupBy(obj, dim, codes, coord, dim, fill_value=np.nan)


def _keep_attrs(keep_attrs) -> bool:
    if keep_attrs is not None:
        return bool(keep_attrs)
    option = xr.get_options()["keep_attrs"]
    return True if option == "default" else bool(option)


def _unravel(flat, shape):
    if type(flat).__module__.startswith("dask"):
        import dask.array as da

        return da.unravel_index(flat, shape)
    if type(flat).__module__.startswith("cupy"):
        import cupy

        return cupy.unravel_index(flat, shape)
    return np.unravel_index(flat, shape)


@xr.register_dataarray_accessor("mr")
class DataArrayAccessor(_Accessor):
    """``DataArray.mr``: multireduce's reductions with xarray's semantics (see the module docstring)."""


@xr.register_dataset_accessor("mr")
class DatasetAccessor(_Accessor):
    """``Dataset.mr``: each data variable reduced as ``DataArray.mr`` does; ``numeric_only`` as xarray."""


class GroupBy:
    """Groups along ``dim`` (``codes``: each position's group, -1 for none) whose reductions return the
    object with ``dim`` replaced by ``coord`` (one entry per group), as xarray's group-by reductions."""

    def __init__(self, obj, dim, codes, coord: xr.Variable, name, fill_value=None):
        self._obj, self._dim, self._codes, self._coord, self._name = obj, dim, codes, coord, name
        self._fill = fill_value

    def __repr__(self) -> str:
        return f"multireduce GroupBy over {self._dim!r}: {self._coord.size} groups of {self._name!r}"

    @property
    def groups(self):
        """The group labels, in the result's order."""
        return self._coord.values

    def _apply(self, func, keep_attrs, numeric_only, skipna=None, **kwargs):
        obj = self._obj
        if isinstance(obj, xr.Dataset):
            data_vars = {}
            for key, var in obj.data_vars.items():
                if numeric_only and not (np.issubdtype(var.dtype, np.number) or var.dtype == np.bool_):
                    continue  # dropped, as xarray's numeric-only reductions drop them
                data_vars[key] = self._one(var, func, keep_attrs, skipna, **kwargs) if self._dim in var.dims else var
            coords = {k: c for k, c in obj.coords.items() if self._dim not in c.dims}
            coords[self._name] = self._coord
            keep = _keep_attrs(keep_attrs)
            return xr.Dataset(data_vars, coords=coords, attrs=obj.attrs if keep else None)
        return self._one(obj, func, keep_attrs, skipna, **kwargs)

    def _one(self, arr: xr.DataArray, func, keep_attrs, skipna, **kwargs):
        dim = self._dim
        axis = arr.get_axis_num(dim)
        if func in _groupby._SKIPPING:
            func = ("nan" if _skip(skipna, arr.data) else "") + func
        data = _groupby.reduce_codes(arr.data, self._codes, self._coord.size, func, axis=axis,
                                     fill_value=self._fill, caller=f"groupby.{func}", **kwargs)
        data = np.moveaxis(data, -1, axis)
        dims = tuple(self._name if d == dim else d for d in arr.dims)
        coords = {k: c for k, c in arr.coords.items() if dim not in c.dims}
        coords[self._name] = self._coord
        keep = _keep_attrs(keep_attrs)
        return xr.DataArray(data, dims=dims, coords=coords, name=arr.name, attrs=arr.attrs if keep else None)

    def sum(self, *, skipna=None, min_count=None, keep_attrs=None):
        return self._apply("sum", keep_attrs, True, skipna, min_count=min_count)

    def prod(self, *, skipna=None, min_count=None, keep_attrs=None):
        return self._apply("prod", keep_attrs, True, skipna, min_count=min_count)

    def mean(self, *, skipna=None, keep_attrs=None):
        return self._apply("mean", keep_attrs, True, skipna)

    def var(self, *, skipna=None, ddof=0, keep_attrs=None):
        return self._apply("var", keep_attrs, True, skipna, ddof=ddof)

    def std(self, *, skipna=None, ddof=0, keep_attrs=None):
        return self._apply("std", keep_attrs, True, skipna, ddof=ddof)

    def min(self, *, skipna=None, keep_attrs=None):
        return self._apply("min", keep_attrs, False, skipna)

    def max(self, *, skipna=None, keep_attrs=None):
        return self._apply("max", keep_attrs, False, skipna)

    def count(self, *, keep_attrs=None):
        return self._apply("count", keep_attrs, False)

    def any(self, *, keep_attrs=None):
        return self._apply("any", keep_attrs, False)

    def all(self, *, keep_attrs=None):
        return self._apply("all", keep_attrs, False)
