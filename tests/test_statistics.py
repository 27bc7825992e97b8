"""argmin/argmax, var/std, the NaN family and any/all/count_nonzero against NumPy, eager and on Dask
over awkward chunkings (empty and one-element chunks, ties and NaNs on chunk boundaries)."""

from __future__ import annotations

import math
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.statistics import VAR_BOUND

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

SIZES = [1, 31, 33, 1025, (1 << 20) + 3]
CHUNKINGS = [
    ((1000,), ((1000,),)),
    ((1000,), ((1, 0, 499, 300, 0, 200),)),
    ((1000,), ((1,) * 10 + (990,),)),
    ((40, 30), ((7, 0, 33), (1, 29))),
    ((6, 10, 9), ((1, 5), (3, 3, 4), (9,))),
]
DTYPES = [np.bool_, np.int8, np.uint16, np.int64, np.uint64, np.float16, np.float32, np.float64]


def _data(rng, shape, dtype, few_values=False):
    """Random data of ``dtype``; ``few_values`` draws from a handful of values so that ties abound."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if few_values:
        return rng.integers(-3 if dtype.kind != "u" else 0, 4, size=shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def _axes(ndim):
    return [None] + list(range(ndim))


# ------------------------------------------------------------------------------------------------
# argmin / argmax
# ------------------------------------------------------------------------------------------------
ARG = {"argmax": np.argmax, "argmin": np.argmin, "nanargmax": np.nanargmax, "nanargmin": np.nanargmin}


@pytest.mark.parametrize("name", list(ARG))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_arg_numpy_input_awkward_sizes(name, dtype, n):
    rng = np.random.default_rng(n)
    x = _data(rng, n, dtype, few_values=n > 100)
    got = getattr(mr, name)(x)
    assert type(got) is np.intp and got == ARG[name](x)


@pytest.mark.parametrize("split_every", [2, 16])
@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("name", list(ARG))
@pytest.mark.parametrize("dtype", [np.int8, np.float32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_arg_dask_every_axis(dtype, name, shape, chunks, split_every):
    rng = np.random.default_rng(len(shape))
    x = _data(rng, shape, dtype, few_values=True)  # many ties across chunks: the lowest index must win
    d = da.from_array(x, chunks=chunks)
    cases = [(axis, keepdims) for axis in _axes(len(shape)) for keepdims in (False, True)]
    lazies = [getattr(mr, name)(d, axis=axis, keepdims=keepdims, split_every=split_every) for axis, keepdims in cases]
    assert all(isinstance(got, da.Array) for got in lazies)
    for (axis, keepdims), computed in zip(cases, dask.compute(*lazies)):  # one scheduler run for all
        ref = ARG[name](x, axis=axis, keepdims=keepdims)
        np.testing.assert_array_equal(computed, ref, err_msg=f"{name} axis={axis} keepdims={keepdims}")
        assert computed.dtype == np.intp


def test_arg_ties_and_nans_at_chunk_boundaries():
    n, step = 1000, 100
    d_chunks = (step,) * (n // step)
    rng = np.random.default_rng(1)
    for boundary in (step, 5 * step):
        x = rng.uniform(-1, 1, n)
        x[boundary - 1] = x[boundary] = 2.0  # equal maxima on both sides of a boundary
        x[boundary + step] = 2.0
        x[boundary - 1 + 2 * step] = x[boundary + 2 * step] = -2.0
        d = da.from_array(x, chunks=(d_chunks,))
        assert mr.argmax(d).compute() == np.argmax(x) == boundary - 1
        assert mr.argmin(d).compute() == np.argmin(x) == boundary - 1 + 2 * step
        y = x.copy()
        y[boundary + 1] = np.nan
        y[boundary + step - 1] = np.nan  # the first NaN wins, whichever chunk comes first in the tree
        dy = da.from_array(y, chunks=(d_chunks,))
        for name in ("argmax", "argmin", "nanargmax", "nanargmin"):
            assert getattr(mr, name)(dy, split_every=3).compute() == ARG[name](y), name
            assert getattr(mr, name)(y) == ARG[name](y), name


def test_nanarg_skips_nan_beside_infinity():
    x = np.array([np.nan, -np.inf, np.nan, np.inf, np.nan])
    for name in ("nanargmax", "nanargmin"):
        assert getattr(mr, name)(x) == ARG[name](x)
        assert getattr(mr, name)(da.from_array(x, chunks=1)).compute() == ARG[name](x)


def test_arg_errors_follow_numpy():
    with pytest.raises(ValueError, match="empty sequence"):
        mr.argmax(np.zeros(0))
    with pytest.raises(ValueError, match="empty sequence"):
        mr.argmin(da.zeros((3, 0), chunks=2), axis=1)
    assert np.array_equal(mr.argmax(np.zeros((0, 3)), axis=1), np.argmax(np.zeros((0, 3)), axis=1))
    x = np.array([[1.0, np.nan], [np.nan, np.nan]])
    with pytest.raises(ValueError, match="All-NaN slice"):
        mr.nanargmax(x, axis=1)
    with pytest.raises(ValueError, match="All-NaN slice"):
        mr.nanargmin(da.from_array(x, chunks=1), axis=1).compute()
    with pytest.raises(TypeError, match="'axis'"):
        mr.argmax(np.ones((2, 2)), axis=(0, 1))
    with pytest.raises(ValueError, match="split_every"):
        mr.argmax(da.ones(4, chunks=2), split_every=1)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        d = da.ones(10, chunks=3)
        mr.argmax(d[d > 0])


def test_arg_does_not_modify_input_and_keys_are_deterministic():
    x = np.array([3.0, np.nan, 1.0])
    before = x.copy()
    mr.nanargmax(x)
    np.testing.assert_array_equal(x, before)
    d = da.from_array(np.arange(20.0), chunks=3)
    assert mr.argmax(d).name == mr.argmax(d).name
    assert mr.argmax(d).name != mr.argmin(d).name


# ------------------------------------------------------------------------------------------------
# var / std
# ------------------------------------------------------------------------------------------------
def _exact_var(x, ddof=0):
    """float64 two-pass with exactly rounded sums (math.fsum): a reference far tighter than VAR_BOUND."""
    w = np.asarray(x, dtype=np.float64).ravel()
    mean = math.fsum(w) / w.size
    dev = w - mean
    return math.fsum(dev * dev) / (w.size - ddof)


@pytest.mark.parametrize("offset,dtype,n", [(1e8, np.float64, 1 << 16), (1e4, np.float32, 1 << 16),
                                            (1e8, np.float64, 1025), (1e4, np.float32, 33)])
def test_var_ill_conditioned_every_chunking(offset, dtype, n):
    """Data with a mean far above the spread: every chunking stays within the stated bound of the
    exact value (relative, plus one rounding to the output dtype) and never worse than NumPy's var."""
    rng = np.random.default_rng(7)
    x = (offset + rng.normal(0.0, 1.0, n)).astype(dtype)
    ref = _exact_var(x, ddof=1)
    eps_out = float(np.finfo(dtype).eps)
    numpy_err = abs(float(np.var(x, ddof=1)) - ref) / ref
    bound = VAR_BOUND + eps_out
    sizes = sorted({1, 2, 3, 7, 64, 1000, n // 3 + 1, n} if n < 2000 else {64, 1000, 4097, n // 3 + 1, n})
    for chunk in sizes:
        # past 100 chunks only the deepest tree (fan-in 2: the most merges in a row); wider fan-ins at fewer
        for split_every in (2, 5, 16) if n // chunk <= 100 else (2,):
            got = float(mr.var(da.from_array(x, chunks=chunk), ddof=1, split_every=split_every).compute())
            err = abs(got - ref) / ref
            assert err <= bound and err <= numpy_err + 4 * eps_out, (chunk, split_every, err, numpy_err)
    assert abs(float(mr.var(x, ddof=1)) - ref) / ref <= bound


def test_var_every_chunking_of_a_small_array():
    rng = np.random.default_rng(3)
    x = 1e6 + rng.normal(0, 1, 40)
    ref = _exact_var(x)
    for chunk in range(1, 41):
        got = float(mr.var(da.from_array(x, chunks=chunk), split_every=2).compute())
        assert abs(got - ref) <= VAR_BOUND * ref, chunk


MOMENTS = {"var": np.var, "std": np.std, "nanvar": np.nanvar, "nanstd": np.nanstd}


@pytest.mark.parametrize("name", list(MOMENTS))
@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("dtype", [np.int16, np.uint64, np.float16, np.float32, np.float64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_moments_match_numpy(dtype, shape, chunks, name):
    rng = np.random.default_rng(11)
    x = _data(rng, shape, dtype)
    d = da.from_array(x, chunks=chunks)
    fn, ref_fn = getattr(mr, name), MOMENTS[name]
    axes = _axes(len(shape)) + ([(0, len(shape) - 1)] if len(shape) > 1 else [])
    for axis in axes:
        for ddof in (0, 1):
            ref = ref_fn(x.astype(np.float64), axis=axis, ddof=ddof, keepdims=True)
            out = np.dtype(x.dtype if x.dtype.kind == "f" else np.float64)
            for got in (fn(x, axis=axis, ddof=ddof, keepdims=True),
                        fn(d, axis=axis, ddof=ddof, keepdims=True, split_every=3).compute()):
                assert got.dtype == out and got.shape == ref.shape
                tol = 4 * float(np.finfo(out).eps)
                np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max(),
                                           err_msg=f"{name} axis={axis} ddof={ddof}")
    assert np.asarray(fn(x, dtype=np.float32)).dtype == np.float32


def test_moments_edge_cases_warn_as_numpy():
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert np.isnan(mr.var(np.zeros(0)))
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        got = mr.var(np.array([1.0, 3.0]), ddof=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert got == np.var(np.array([1.0, 3.0]), ddof=2)  # inf
    x = np.array([[np.nan, np.nan], [1.0, np.nan]])
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        got = mr.nanvar(da.from_array(x, chunks=1), axis=1).compute()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(got, np.nanvar(x, axis=1))
    y = np.array([1.0, np.inf, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(mr.var(y)) and np.isnan(np.var(y))
    with pytest.raises(TypeError, match="'ddof'"):
        mr.var(np.ones(3), ddof="1")
    with pytest.raises(TypeError, match="'dtype'"):
        mr.var(np.ones(3), dtype=np.int32)
    with pytest.raises(TypeError, match="'x'"):
        mr.std(np.array(["a"]))


# ------------------------------------------------------------------------------------------------
# nan family
# ------------------------------------------------------------------------------------------------
def _with_nans(rng, shape, dtype):
    x = rng.uniform(-1, 1, shape).astype(dtype)
    x[rng.random(shape) < 0.3] = np.nan
    if len(shape) > 1:
        x[0] = np.nan  # an all-NaN slice along the later axes
    return x


NANS = {"nansum": np.nansum, "nanprod": np.nanprod, "nanmean": np.nanmean, "nanmin": np.nanmin,
        "nanmax": np.nanmax}


@pytest.mark.parametrize("name", list(NANS))
@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_nan_family_matches_numpy(dtype, shape, chunks, name):
    rng = np.random.default_rng(5)
    x = _with_nans(rng, shape, dtype)
    before = x.copy()
    d = da.from_array(x, chunks=chunks)
    for axis in _axes(len(shape)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = NANS[name](x.astype(np.float64), axis=axis)
            eager = getattr(mr, name)(x, axis=axis)
            lazy = getattr(mr, name)(d, axis=axis, split_every=2).compute()
        for got in (eager, lazy):
            assert np.asarray(got).dtype == NANS[name](x, axis=axis).dtype
            tol = 64 * float(np.finfo(dtype).eps) * max(1, x.size ** 0.5) if name != "nanprod" else 1e-3
            np.testing.assert_allclose(np.asarray(got, dtype=np.float64), ref, rtol=tol, atol=tol,
                                       err_msg=f"{name} axis={axis}")
    np.testing.assert_array_equal(x, before)


def test_nan_family_warnings_and_errors():
    x = np.array([[np.nan, np.nan], [1.0, 2.0]])
    d = da.from_array(x, chunks=1)
    for name in ("nanmin", "nanmax"):
        with pytest.warns(RuntimeWarning, match="All-NaN slice"):
            got = getattr(mr, name)(d, axis=1).compute()
        np.testing.assert_array_equal(got, np.array([np.nan, 1.0 if name == "nanmin" else 2.0]))
        with pytest.raises(ValueError, match="zero-size array"):
            getattr(mr, name)(np.zeros((0, 2)))
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(mr.nanmean(x, axis=1)[0])
    assert mr.nansum(np.full(5, np.nan)) == 0.0 and mr.nanprod(np.full(5, np.nan)) == 1.0
    i = np.arange(1, 8, dtype=np.int16)
    assert mr.nanmax(i) == 7 and mr.nansum(i).dtype == np.sum(i).dtype


@pytest.mark.parametrize("name,ref", [("nancumsum", np.nancumsum), ("nancumprod", np.nancumprod)])
@pytest.mark.parametrize("n", [0, 1, 31, 1025])
def test_nan_scans(name, ref, n):
    rng = np.random.default_rng(n)
    x = np.exp(rng.normal(0, 1 / max(n, 1) ** 0.5, n))
    x[rng.random(n) < 0.2] = np.nan
    want = ref(x)
    for got in (getattr(mr, name)(x), getattr(mr, name)(da.from_array(x, chunks=100)).compute()):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    m = x[: n - n % 4].reshape(-1, 4) if n >= 4 else x.reshape(1, -1)
    np.testing.assert_allclose(getattr(mr, name)(da.from_array(m, chunks=3), axis=1).compute(), ref(m, axis=1),
                               rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# any / all / count_nonzero
# ------------------------------------------------------------------------------------------------
TRUTH = {"any": np.any, "all": np.all, "count_nonzero": np.count_nonzero}


@pytest.mark.parametrize("name", list(TRUTH))
@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES + [np.complex64], ids=lambda d: np.dtype(d).name)
def test_truth_family(dtype, shape, chunks, name):
    rng = np.random.default_rng(2)
    x = _data(rng, shape, dtype, few_values=True) if np.dtype(dtype).kind != "c" else \
        (rng.integers(0, 2, shape) + 1j * rng.integers(0, 2, shape)).astype(dtype)
    if name == "all":
        x = np.where(rng.random(shape) < 0.002, np.zeros((), dtype), x + np.ones((), dtype)).astype(dtype)
    d = da.from_array(x, chunks=chunks)
    cases = [(axis, keepdims) for axis in _axes(len(shape)) for keepdims in (False, True)]
    lazies = dask.compute(*[getattr(mr, name)(d, axis=axis, keepdims=keepdims, split_every=2) for axis, keepdims in cases])
    for (axis, keepdims), lazy in zip(cases, lazies):
        ref = TRUTH[name](x, axis=axis, keepdims=keepdims)
        eager = getattr(mr, name)(x, axis=axis, keepdims=keepdims)
        for got in (eager, lazy):
            np.testing.assert_array_equal(got, ref)
            assert np.asarray(got).dtype == np.asarray(ref).dtype
    if name == "count_nonzero":
        assert type(mr.count_nonzero(x)) is type(np.count_nonzero(x))


def test_truth_empty_and_nan():
    for name in TRUTH:
        for x in (np.zeros(0), np.zeros((0, 3)), np.array([np.nan, 0.0])):
            for axis in (None, 0):
                np.testing.assert_array_equal(getattr(mr, name)(x, axis=axis), TRUTH[name](x, axis=axis))


# ------------------------------------------------------------------------------------------------
# a real cluster: partials cross workers
# ------------------------------------------------------------------------------------------------
def test_statistics_on_a_distributed_cluster(cpu_client):
    rng = np.random.default_rng(9)
    x = 1e8 + rng.normal(0, 1, (300, 50))
    x[17, 3] = x[250, 49] = x.max() + 1
    d = cpu_client.persist(da.from_array(x, chunks=(40, 25)))
    assert cpu_client.compute(mr.argmax(d)).result() == np.argmax(x)
    np.testing.assert_array_equal(cpu_client.compute(mr.argmin(d, axis=0)).result(), np.argmin(x, axis=0))
    got = cpu_client.compute(mr.var(d, ddof=1)).result()
    assert abs(got - _exact_var(x, 1)) <= VAR_BOUND * _exact_var(x, 1)
    assert cpu_client.compute(mr.count_nonzero(d > 1e8, axis=1)).result().tolist() == \
        np.count_nonzero(x > 1e8, axis=1).tolist()


# ------------------------------------------------------------------------------------------------
# the host side of the GPU kernels: cupy_stats.plan_layout's numbers, read back with as_strided the
# way the kernels address memory, reduce to NumPy's answer (views, moved axes, copies)
# ------------------------------------------------------------------------------------------------
def _kernel_view(a, axes):
    """What the kernels would read for ``a`` reduced over ``axes``: (values as (outputs, elements), the
    index the kernel gives each element)."""
    from numpy.lib.stride_tricks import as_strided

    from multireduce.backends import cupy_stats

    strides = tuple(s // a.itemsize for s in a.strides)
    layout = cupy_stats.plan_layout(a.shape, strides, axes)
    if layout.copy == "moveaxis":
        rest = [d for d in range(a.ndim) if d not in axes]
        a = np.ascontiguousarray(np.moveaxis(a, sorted(axes), list(range(len(rest), a.ndim))))
    elif layout.copy == "contiguous":
        a = np.ascontiguousarray(a)
    else:
        assert layout.copy is None
    isz = a.itemsize
    if layout.kind == "rows":
        rows = as_strided(a, (layout.rows, layout.length), (layout.stride * isz, isz))
        index = np.arange(layout.rows)[:, None] * layout.index_step + np.arange(layout.length)
        if layout.whole:
            return rows.reshape(1, -1), index.reshape(1, -1), layout
        return rows, index, layout
    assert layout.kind == "columns" and not layout.whole
    cols = as_strided(a, (layout.rows, layout.length, layout.inner), (layout.stride * isz, layout.inner * isz, isz))
    values = cols.transpose(0, 2, 1).reshape(layout.rows * layout.inner, layout.length)
    return values, np.broadcast_to(np.arange(layout.length), values.shape), layout


VIEWS = [
    ((1000,), lambda b: b, [(0,)]),
    ((1000,), lambda b: b[3:997:1], [(0,)]),
    ((1000,), lambda b: b[::2], [(0,)]),
    ((65, 129), lambda b: b, [(0, 1), (0,), (1,), ()]),
    ((65, 129), lambda b: b[5:40, 7:100], [(0, 1), (0,), (1,)]),  # a Dask chunk of a C array
    ((65, 129), lambda b: b.T, [(0, 1), (0,), (1,), ()]),
    ((3, 5000), lambda b: b[:, 10:4990], [(0, 1), (1,), (0,)]),  # long strided rows: read in place
    ((6, 10, 9), lambda b: b, [(0, 1, 2), (0,), (1,), (2,), (0, 1), (1, 2), (0, 2)]),
    ((6, 10, 9), lambda b: b[:, ::2, 1:], [(0, 1, 2), (1,), (2,), (0, 2)]),
    ((2, 3, 4, 2100), lambda b: b, [(0, 1, 2, 3), (3,), (2, 3), (1, 2), (0,)]),
    ((1, 1, 31), lambda b: b, [(0, 1, 2), (0,), (2,)]),
    ((), lambda b: b, [()]),
]


@pytest.mark.parametrize("shape,view,axes_list", VIEWS)
def test_kernel_layouts_read_what_numpy_reduces(shape, view, axes_list):
    from multireduce.backends import cupy_stats

    rng = np.random.default_rng(len(shape))
    a = view(rng.integers(0, 7, size=shape).astype(np.float32))
    for axes in axes_list:
        values, index, layout = _kernel_view(a, axes if a.ndim else ())
        kept = tuple(s for d, s in enumerate(a.shape) if d not in axes)
        assert values.shape[0] == layout.outputs == math.prod(kept)
        np.testing.assert_array_equal(values.sum(axis=1).reshape(kept), a.sum(axis=axes if a.ndim else None))
        np.testing.assert_allclose(np.var(values.astype(np.float64), axis=1).reshape(kept),
                                   np.var(a.astype(np.float64), axis=axes if a.ndim else None), rtol=1e-12)
        if len(axes) == 1 or len(axes) == a.ndim:  # argmax: the kernel's index of the first maximum
            got = np.take_along_axis(index, values.argmax(axis=1)[:, None], axis=1).reshape(kept)
            ref = np.argmax(a, axis=None if len(axes) == a.ndim else axes[0])
            np.testing.assert_array_equal(got, ref, err_msg=f"{axes} {layout}")
        if layout.kind == "rows":
            splits = cupy_stats.row_splits(layout, a.itemsize, sms=132)
            assert 1 <= splits and layout.rows * splits < 2**31
        else:
            piece, splits = cupy_stats.column_pieces(layout, sms=132)
            assert (splits - 1) * piece < layout.length <= splits * piece


def test_kernel_layouts_copy_only_where_needed():
    from multireduce.backends.cupy_stats import plan_layout

    assert plan_layout((4096,), (1,), (0,)).copy is None
    assert plan_layout((4096,), (2,), (0,)).copy == "contiguous"
    assert plan_layout((16, 50), (129, 1), (0, 1)).copy == "contiguous"  # short strided rows
    got = plan_layout((16, 5000), (5129, 1), (0, 1))
    assert (got.copy, got.kind, got.rows, got.length, got.stride, got.whole) == (None, "rows", 16, 5000, 5129, True)
    got = plan_layout((16, 50), (129, 1), (0,))
    assert (got.copy, got.kind, got.rows, got.length, got.inner) == ("contiguous", "columns", 1, 16, 50)
    got = plan_layout((16, 50), (129, 1), (1,))
    assert (got.copy, got.kind, got.rows, got.length, got.stride) == (None, "columns", 16, 50, 129)
    assert plan_layout((6, 10, 9), (90, 9, 1), (0, 2)).copy == "moveaxis"


def test_kernel_names_come_from_the_dtype_table():
    from multireduce import dtypes
    from multireduce.backends import cupy_stats

    names = cupy_stats.all_stats_instantiations()
    whole = cupy_stats.all_whole_instantiations()
    for dt in dtypes.GPU_DTYPES:
        T = dtypes.CUDA_TYPE_NAMES[dt]
        assert f"mr::stats_rows<mr::ArgStat<{T}, true, false>, 256, 4>" in names
        assert (f"mr::stats_fold<mr::MomentsStat<{T}, true>, 256>" in names) == (dt.kind == "f")
        assert f"mr::stats_whole<mr::MomentsStat<{T}, false>, 256, 4, {cupy_stats.BLOCKS_PER_SM}>" in whole
        assert f"mr::stats_whole<mr::ArgStat<{T}, true, false>, 256, 4, {cupy_stats.BLOCKS_PER_SM}>" in whole
    assert not [n for n in names if n.startswith("mr::stats_whole")]  # a module of their own
    assert not [n for n in whole if n.startswith("mr::stats_whole<mr::ExtremeStat")]  # what WholeLauncher serves
    from multireduce import kernels

    finish = kernels.all_finish_instantiations()
    for size, bits in ((2, "unsigned short"), (4, "unsigned int"), (8, "unsigned long long")):
        assert kernels.PROBE_NAMES[size] in finish and bits in kernels.PROBE_NAMES[size]
    for stat in cupy_stats.STATS:  # the State images the host reads are the C layouts' sizes
        assert cupy_stats.state_dtype(stat, np.float16).itemsize in (4, 8, 16, 32)


@pytest.mark.slow  # a benchmark run end to end: CI runs it in its second step
def test_multigpu_stats_benchmark_cpu_smoke(tmp_path, monkeypatch):
    """python -m benchmarks multigpu-stats --cpu: a real LocalCluster (loopback, ports 0), every row correct."""
    from benchmarks import multigpu_stats

    monkeypatch.setenv("OUT", str(tmp_path))

    rows = multigpu_stats.main(["--cpu", "--gpus", "2", "--repeats", "1"])
    assert {(r["op"], r["impl"]) for r in rows} == {("argmax", "dask.array.argmax"), ("argmax", "mr.argmax().compute()"),
                                                   ("argmax", "client.compute(mr.argmax())"),
                                                   ("var", "dask.array.var"), ("var", "mr.var().compute()"),
                                                   ("var", "client.compute(mr.var())")}
    assert all(r["ok"] and r["workers"] == 2 for r in rows), rows
    assert (tmp_path / "bench_multigpu_stats.md").read_text().count("| 2 |") == 6


@pytest.mark.parametrize("name", ["argmax", "var", "nanmean", "any", "count_nonzero", "nanmin"])
@pytest.mark.parametrize("bad", [0, 1, -3, 2.5, "4"])
def test_split_every_is_checked_on_numpy_input_too(name, bad):
    """A bad split_every is refused before any work whatever the input kind, as sum and cumsum do."""
    x = np.random.default_rng(0).standard_normal(33)
    with pytest.raises((TypeError, ValueError), match="split_every"):
        getattr(mr, name)(x, split_every=bad)
