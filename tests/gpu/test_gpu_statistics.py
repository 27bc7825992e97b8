"""The statistics on CuPy data (the one-pass kernels of kernels/stats.cuh) against NumPy: awkward sizes,
every axis and keepdims, misaligned and strided views (the kernels' scalar head, strided rows, copies),
ties and NaNs at 16-byte pack, unroll and block boundaries, ill-conditioned variances, Dask arrays of
CuPy chunks under several chunkings, and one argmax past 2^31 elements (marked ``large``)."""

from __future__ import annotations

import math
import warnings

import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.statistics import VAR_BOUND

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("synchronous_scheduler")]
cupy = pytest.importorskip("cupy")

from multireduce.backends import cupy_stats  # noqa: E402

SIZES = [1, 31, 33, 1025, 4097, (1 << 20) + 3]
DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64]
ARG = {"argmax": np.argmax, "argmin": np.argmin, "nanargmax": np.nanargmax, "nanargmin": np.nanargmin}
FOLDS = ("nanmin", "nanmax", "any", "all", "count_nonzero")


def _few_values(rng, shape, dtype):
    """Values from a handful, so that ties are everywhere (and zeros, for any/all/count_nonzero)."""
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 5, shape).astype(dtype)


def _close(got, ref, name, rtol=1e-5):
    assert isinstance(got, cupy.ndarray), (name, type(got))
    got = cupy.asnumpy(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=name)
    else:
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=rtol,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_whole_array_kernels_match_numpy(dtype, n):
    rng = np.random.default_rng(n)
    x = _few_values(rng, n + 3, dtype)
    g = cupy.asarray(x)
    for start in (0, 1, 3):  # misaligned views go through the kernels' scalar head
        h, hx = g[start:start + n], x[start:start + n]
        for name in ARG:
            got = getattr(mr, name)(h)
            assert isinstance(got, cupy.ndarray) and int(got) == ARG[name](hx), (name, start)
        for name in FOLDS:
            _close(getattr(mr, name)(h), getattr(np, name)(hx), name)
    assert cupy_stats._loaded, "the one-pass kernels did not run"


def test_empty_and_one_element():
    e = cupy.zeros(0, dtype=cupy.float32)
    with pytest.raises(ValueError):
        mr.argmax(e)
    with pytest.raises(ValueError):
        mr.nanmax(e)
    assert bool(mr.any(e)) is False and bool(mr.all(e)) is True and int(mr.count_nonzero(e)) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(float(mr.var(e)))
    one = cupy.asarray([3.5])
    assert int(mr.argmin(one)) == 0 and float(mr.var(one)) == 0.0
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert np.isnan(float(mr.var(one, ddof=1)))
    x = cupy.zeros((3, 0), dtype=cupy.float64)  # outputs but nothing to reduce
    np.testing.assert_array_equal(cupy.asnumpy(mr.any(x, axis=1)), np.zeros(3, bool))


SHAPES = [((65, 129), None), ((6, 10, 9), None), ((3, 5000), None), ((2, 3, 2100), None),
          ((65, 129), "T"), ((40, 300), "slice")]


@pytest.mark.parametrize("shape,view", SHAPES)
@pytest.mark.parametrize("name", list(ARG) + ["var", "std", "nanvar", "nanstd", "nanmean"] + list(FOLDS))
def test_every_axis_keepdims_and_views(shape, view, name):
    rng = np.random.default_rng(len(shape) * 7 + len(name))
    x = rng.normal(0, 1, shape).astype(np.float32)
    x[x > 1.5] = 2  # ties
    if name.startswith("nan") and not name.startswith("nanarg"):
        x[rng.random(shape) < 0.05] = np.nan
    g = cupy.asarray(x)
    if view == "T":
        x, g = x.T, g.T
    elif view == "slice":
        x, g = x[3:37, 5:290], g[3:37, 5:290]
    fn, ref_fn = getattr(mr, name), getattr(np, name)
    axes = [None] + list(range(x.ndim)) + ([(0, 2), (1, 2), ()] if x.ndim == 3 and name not in ARG else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column now and then: both warn
        for axis in axes:
            for keepdims in (False, True):
                ref = ref_fn(x, axis=axis, keepdims=keepdims)
                _close(fn(g, axis=axis, keepdims=keepdims), ref, f"{name} axis={axis} keepdims={keepdims}")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_arg_kernels_ties_and_nans_at_boundaries(dtype):
    n = (1 << 20) + 3
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, n).astype(dtype)
    pack = 16 // np.dtype(dtype).itemsize
    # pack, unrolled pass, block, grid-stride and tail boundaries
    for b in (pack, 4 * pack, 256 * pack, 1024 * pack, 4096 * pack, n - 1):
        y = x.copy()
        y[b - 1] = y[b] = 2
        y[b // 2] = -2
        y[min(b + 7, n - 1)] = -2
        g = cupy.asarray(y)
        for name in ARG:
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, b)
        y[b] = np.nan
        y[b + 1 if b + 1 < n else 0] = np.nan
        g = cupy.asarray(y)
        for name in ARG:
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, b, "nan")
        r = y[: (n // 1025) * 1025].reshape(-1, 1025)  # the same NaNs and ties along rows and columns
        for name in ARG:
            for axis in (0, 1):
                np.testing.assert_array_equal(cupy.asnumpy(getattr(mr, name)(cupy.asarray(r), axis=axis)),
                                              ARG[name](r, axis=axis), err_msg=f"{name} axis={axis} b={b}")
    with pytest.raises(ValueError, match="All-NaN"):
        mr.nanargmax(cupy.full(1025, cupy.nan, dtype=dtype))


def test_nan_first_and_all_nan_rows():
    x = np.arange(3 * 4100, dtype=np.float32).reshape(3, 4100)
    x[0, 4000] = x[0, 17] = np.nan  # the first NaN wins, wherever its thread is
    x[2, :] = np.nan
    g = cupy.asarray(x)
    np.testing.assert_array_equal(cupy.asnumpy(mr.argmax(g, axis=1)), np.argmax(x, axis=1))
    assert int(mr.argmin(g)) == np.argmin(x) == 17
    with pytest.raises(ValueError, match="All-NaN"):
        mr.nanargmax(g, axis=1)
    with pytest.warns(RuntimeWarning, match="All-NaN"):
        got = mr.nanmax(g, axis=1)
    _close(got, np.array([np.nanmax(x[0]), x[1].max(), np.nan]), "nanmax")
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        mr.nanvar(g, axis=1)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        mr.nanmean(g, axis=1)


def _exact_var(x, ddof=0):
    w = np.asarray(x, dtype=np.float64).ravel()
    mean = math.fsum(w) / w.size
    return math.fsum((w - mean) ** 2) / (w.size - ddof)


@pytest.mark.parametrize("offset,dtype", [(1e8, np.float64), (1e4, np.float32), (0.0, np.float16), (0.0, np.int32)])
@pytest.mark.parametrize("n", [2, 31, 1025, (1 << 20) + 3, (1 << 24) + 7])
def test_moment_kernels_within_bound(offset, dtype, n):
    if n > 1 << 20 and np.dtype(dtype) not in (np.float32, np.float64):
        pytest.skip("the largest size runs for the ill-conditioned cases only")
    rng = np.random.default_rng(n)
    x = (offset + rng.normal(0, 1, n)) if np.dtype(dtype).kind == "f" else rng.integers(-1000, 1000, n)
    x = x.astype(dtype)
    ref = _exact_var(x, 1)
    out = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)
    bound = VAR_BOUND + 2 * float(np.finfo(out).eps)
    for g in (cupy.asarray(x), cupy.asarray(np.concatenate([x[:1], x]))[1:]):
        got = mr.var(g, ddof=1)
        assert isinstance(got, cupy.ndarray) and got.dtype == out
        assert abs(float(got) - ref) <= bound * ref
        assert abs(float(mr.std(g, ddof=1)) - math.sqrt(ref)) <= bound * math.sqrt(ref)
        assert abs(float(mr.nanmean(g)) - float(np.mean(x.astype(np.float64)))) <= 1e-12 * max(1, abs(offset)) + \
            4 * float(np.finfo(out).eps) * max(1, abs(offset))
    if n >= 1025 and np.dtype(dtype).kind == "f":  # rows and columns of the same data
        r = x[: (n // 41) * 41].reshape(-1, 41)  # >= 25 rows: ddof=1 over axis 0 is defined
        for axis in (0, 1):
            # var is shift-free: subtracting each slice's first element is exact (Sterbenz) and keeps
            # NumPy's naive axis-0 accumulation of 1e8-sized values from erring by more than the bound
            w = r.astype(np.float64)
            ref_rows = np.var(w - (w[:1] if axis == 0 else w[:, :1]), axis=axis, ddof=1)
            got = cupy.asnumpy(mr.var(cupy.asarray(r), axis=axis, ddof=1)).astype(np.float64)
            assert np.all(np.abs(got - ref_rows) <= (bound + 1e-12) * ref_rows + 1e-300), axis


def test_nan_moments_on_gpu():
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, 4099)
    x[rng.random(x.size) < 0.3] = np.nan
    x[0] = np.nan  # no anchor at x[0]
    g = cupy.asarray(x)
    for name, ref in (("nanvar", np.nanvar), ("nanstd", np.nanstd), ("nanmean", np.nanmean)):
        np.testing.assert_allclose(float(getattr(mr, name)(g)), ref(x), rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(float(mr.var(g)))


CHUNKINGS = [(16, 50), (65, 129), (1, 129), (64, 1), ((1, 30, 34), (100, 29))]


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("name", ["argmax", "nanargmin", "var", "nanstd", "nanmean", "nanmax", "nansum",
                                  "any", "all", "count_nonzero"])
def test_every_axis_and_dask_cupy(name, chunks):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (65, 129)).astype(np.float32)
    x[3, 7] = x[40, 100] = 9  # a tie across chunks
    x[rng.random(x.shape) < 0.05] = np.nan
    fn = getattr(mr, name)
    ref_fn = getattr(np, name)
    g = cupy.asarray(x)
    d = da.from_array(g, chunks=chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for axis in (None, 0, 1):
            ref = np.asarray(ref_fn(x, axis=axis))
            for got in (fn(g, axis=axis), fn(d, axis=axis, split_every=2).compute()):
                assert isinstance(got, cupy.ndarray), type(got)
                np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), ref.astype(np.float64),
                                           rtol=1e-5, atol=1e-5, err_msg=f"{name} axis={axis}")


def test_var_every_chunking_within_bound():
    rng = np.random.default_rng(9)
    x = 1e8 + rng.normal(0, 1, 100_003)
    ref = _exact_var(x)
    g = cupy.asarray(x)
    for chunks in (1, 7, 4096, 33_334, 100_003):
        got = float(mr.var(da.from_array(g, chunks=chunks), split_every=4).compute())
        assert abs(got - ref) <= VAR_BOUND * ref, chunks


@pytest.mark.large
def test_argmax_past_2_31():
    n = (1 << 31) + 77  # int8: 2 GiB
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 8 * 2**30:
        pytest.skip(f"needs ~8 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    x = cupy.zeros(n, dtype=cupy.int8)
    try:
        x[(1 << 31) + 5] = 7  # the unique maximum past 2^31
        x[(1 << 31) + 70] = -7
        assert int(mr.argmax(x)) == (1 << 31) + 5
        assert int(mr.argmin(x)) == (1 << 31) + 70
        x[3] = 7  # the first occurrence wins across 2^31
        assert int(mr.argmax(x)) == 3
        assert int(mr.count_nonzero(x)) == 3
        rows = x[: n - 1].reshape(2, -1)  # rows of 2^30 + 38 elements
        np.testing.assert_array_equal(cupy.asnumpy(mr.argmax(rows, axis=1)), [3, (1 << 30) - 33])
    finally:
        del x
        cupy.get_default_memory_pool().free_all_blocks()
