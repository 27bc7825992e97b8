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

from multireduce import kernels  # noqa: E402
from multireduce.backends import cupy_backend, cupy_stats  # noqa: E402

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


# ------------------------------------------------------------------------------------------------------
# NumPy's rules on hostile data (the kernels' non-finite paths; their CPU model is
# tests/test_stats_kernel_model.py): inf, -inf and NaN at the pack, unrolled-pass, block and grid-stride
# boundaries of stats_rows on this GPU, nanargmax's NaN-as--inf, 1e308, every ddof rule
# ------------------------------------------------------------------------------------------------------
HOSTILE_SIZES = [0, 1, 31, 1025, (1 << 24) + 7]
MOMENTS = {"var": np.var, "std": np.std, "nanvar": np.nanvar, "nanstd": np.nanstd, "nanmean": np.nanmean}


def _row_marks(n, dtype):
    """Element positions where a thread, an unrolled pass, a block and the grid-stride wrap in
    stats_rows for a whole 1-D array of ``n`` elements on the current GPU."""
    isz = np.dtype(dtype).itemsize
    pack, block, unroll = 16 // isz, cupy_stats.BLOCK, cupy_stats.ROW_UNROLL
    layout = cupy_stats.plan_layout((n,), (1,), (0,))
    splits = cupy_stats.row_splits(layout, isz, cupy_stats._sm_count(cupy.cuda.Device().id))
    threads = splits * block
    marks = {0, 1, pack - 1, pack, unroll * pack - 1, unroll * pack, block * pack - 1, block * pack,
             threads * pack - 1, threads * pack, threads * pack * unroll - 1, threads * pack * unroll, n // 2,
             n - 2, n - 1}
    return sorted(m for m in marks if 0 <= m < n)


def _quiet_numpy(fn, *args, **kwargs):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args, **kwargs)


def _same(got, ref, rtol, what):
    """Special values exactly (inf with its sign, NaN), finite ones within rtol."""
    got = cupy.asnumpy(got).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    special = ~np.isfinite(ref)
    np.testing.assert_array_equal(got[special], ref[special], err_msg=what)
    np.testing.assert_allclose(got[~special], ref[~special], rtol=rtol, atol=0, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", HOSTILE_SIZES)
def test_arg_nan_rules_at_kernel_boundaries(dtype, n):
    """argmax/argmin: the first NaN wins, ties go to the lower index across threads and blocks;
    nanargmax/nanargmin: NaN reads as -inf/+inf (np.nanargmax([nan, -inf]) == 0), all-NaN raises."""
    if n == 0:
        for name in ARG:
            with pytest.raises(ValueError):
                getattr(mr, name)(cupy.zeros(0, dtype=dtype))
        return
    rng = np.random.default_rng(n)
    marks = _row_marks(n, dtype)
    pairs = list(zip(marks, marks[1:])) or [(0, 0)]
    x = rng.integers(-3, 3, n).astype(dtype)
    for a, b in pairs:
        y = x.copy()
        y[a] = y[b] = 7
        g = cupy.asarray(y)
        for name in ARG:
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, a, b)
        y[b] = np.nan
        y[min(b + 1, n - 1)] = np.nan
        g = cupy.asarray(y)
        for name in ARG if n > 1 else ("argmax", "argmin"):  # [nan]: nanarg* raise (below)
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, a, b, "nan")
    for largest, worst in ((True, -np.inf), (False, np.inf)):
        name = "nanargmax" if largest else "nanargmin"
        for a, b in pairs[:: max(1, len(pairs) // 4)]:
            y = np.full(n, np.nan, dtype=dtype)  # NaN everywhere but one infinity: the first element wins
            y[b] = worst
            assert int(getattr(mr, name)(cupy.asarray(y))) == ARG[name](y) == 0, (name, b)
            if n > 1:
                y = np.full(n, worst, dtype=dtype)  # infinities and NaNs: still the first element
                y[a] = y[b] = np.nan
                assert int(getattr(mr, name)(cupy.asarray(y))) == ARG[name](y) == 0, (name, a, b)
            y = np.full(n, np.nan, dtype=dtype)  # NaN up to a number at a boundary
            y[b] = 1
            assert int(getattr(mr, name)(cupy.asarray(y))) == ARG[name](y) == b, (name, b)
        with pytest.raises(ValueError, match="All-NaN"):
            getattr(mr, name)(cupy.full(n, cupy.nan, dtype=dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", HOSTILE_SIZES)
def test_moments_inf_and_nan_at_kernel_boundaries(dtype, n):
    """The mean of data with inf is inf ([inf, -inf]: NaN), var NaN; nanvar skips NaN; never the NaN
    of Chan's inf - inf where NumPy has a number or inf."""
    if n == 0:
        e = cupy.zeros(0, dtype=dtype)
        with pytest.warns(RuntimeWarning):
            assert np.isnan(float(mr.var(e)))
        with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
            assert np.isnan(float(mr.nanmean(e)))
        return
    rng = np.random.default_rng(n + 1)
    x = rng.normal(3, 1, n).astype(dtype)
    marks = _row_marks(n, dtype)
    cases = [{}]
    for m in marks[:: 2 if n < 1 << 20 else 4]:
        cases += [{m: np.inf}, {m: -np.inf}, {m: np.nan}, {m: np.inf, n - 1 - m: -np.inf}, {m: np.nan, 0: np.inf}]
    rtol = 1e-10 if dtype == np.float64 else 2e-5
    for case in cases:
        y = x.copy()
        for at, value in case.items():
            y[at] = value
        g = cupy.asarray(y)
        for name, ref_fn in MOMENTS.items():
            ref = _quiet_numpy(ref_fn, y.astype(np.float64))
            got = _quiet_numpy(getattr(mr, name), g)
            assert got.dtype == dtype
            _same(got, ref, rtol, f"{name} n={n} {case}")


def test_moments_near_dbl_max():
    """[1e308, -1e308]: mean 0, var inf (NumPy's answers); squares past DBL_MAX: var inf, mean finite;
    a spread past DBL_MAX (+-1.5e308): var and std inf, not NaN, the mean right (NumPy's own sum may
    overflow there, so the reference is exact)."""
    from fractions import Fraction

    for case in ([1e308, -1e308], [-1e308, 1e308, 0.0], [1e200, -1e200, 3e200], [np.inf, 1.0], [np.inf, -np.inf]):
        x = np.array(case)
        for name, ref_fn in MOMENTS.items():
            _same(getattr(mr, name)(cupy.asarray(x)), _quiet_numpy(ref_fn, x), 1e-14, f"{name} {case}")
    rng = np.random.default_rng(5)
    for n in (2, 31, 1025, 4099):
        x = np.where(rng.random(n) < 0.5, 1.5e308, -1.5e308) * rng.uniform(0.9, 1.0, n)
        x[0] = -1.6e308
        g = cupy.asarray(x)
        assert float(mr.var(g)) == np.inf and float(mr.std(g)) == np.inf and float(mr.nanvar(g)) == np.inf
        mean = float(sum(map(Fraction, x.tolist())) / n)
        assert abs(float(mr.nanmean(g)) - mean) <= 1e-12 * 1.6e308, n


def test_ddof_rules_on_gpu():
    """np.var divides M2 by max(n - ddof, 0): inf, or NaN where M2 = 0; np.nanvar gives NaN wherever
    the count of numbers minus ddof is <= 0 (integer input: np.var's rule); both warn."""
    for case in ([1.0, 2.0, 4.0], [2.0, 2.0, 2.0], [3.5], [1.0, np.nan, 3.0], [np.nan, 5.0, np.nan]):
        x = np.array(case)
        g = cupy.asarray(x)
        for ddof in (0, 0.5, 1, 2, 2.5, 3, 4, -1):
            for name in ("var", "std", "nanvar", "nanstd"):
                ref = _quiet_numpy(getattr(np, name), x, ddof=ddof)
                dof = (np.count_nonzero(~np.isnan(x)) if name.startswith("nan") else x.size) - ddof
                if dof <= 0:
                    with pytest.warns(RuntimeWarning, match="Degrees of freedom <= 0"):
                        got = getattr(mr, name)(g, ddof=ddof)
                else:
                    got = _quiet_numpy(getattr(mr, name), g, ddof=ddof)
                _same(got, ref, 1e-14, f"{name} {case} ddof={ddof}")
    ints = cupy.asarray([1, 2, 3], dtype=cupy.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert float(mr.nanvar(ints, ddof=3)) == float(mr.var(ints, ddof=4)) == np.inf
    r = np.arange(3 * 2100, dtype=np.float64).reshape(3, 2100)  # rows: one row with too few numbers
    r[1, 1:] = np.nan
    r[2, :] = np.nan
    with pytest.warns(RuntimeWarning, match="Degrees of freedom <= 0"):
        got = mr.nanvar(cupy.asarray(r), axis=1, ddof=1)
    _same(got, _quiet_numpy(np.nanvar, r, axis=1, ddof=1), 1e-12, "nanvar rows")


@pytest.mark.parametrize("shape,axis", [((65, 129), 0), ((65, 129), 1), ((3, 2100), 1), ((4, 6, 33), 1)])
def test_hostile_slices_rows_and_columns(shape, axis):
    """The rows and columns kernels with one slice holding inf, one inf and -inf, one NaN, one all-NaN,
    one whose nanargmax NaN comes before -inf."""
    from ..helpers import hostile_slices

    x = hostile_slices(shape, axis)
    g = cupy.asarray(x)
    for name, ref_fn in MOMENTS.items():
        _same(_quiet_numpy(getattr(mr, name), g, axis=axis), _quiet_numpy(ref_fn, x, axis=axis), 1e-11,
              f"{name} axis={axis}")
    m = np.moveaxis(x, axis, -1)  # a view: the last slice is rewritten in x
    m[(-1,) * (x.ndim - 1)][:] = -np.inf  # no all-NaN slice left for nanarg*
    m[(-1,) * (x.ndim - 1)][[1, 4]] = np.nan
    g = cupy.asarray(x)
    for name in ARG:
        np.testing.assert_array_equal(cupy.asnumpy(getattr(mr, name)(g, axis=axis)), ARG[name](x, axis=axis),
                                      err_msg=f"{name} axis={axis}")


@pytest.mark.parametrize("chunks", [3, 4, (2, 1, 5, 3)], ids=str)
def test_hostile_dask_cupy_chunks(chunks):
    """GPU chunk partials merged on the host: an all-NaN chunk's first NaN beats a later -inf for
    nanargmax, inf and -inf in different chunks give a NaN mean, an all-NaN dask array raises."""
    x = np.array([np.nan, np.nan, np.nan, -np.inf, 5.0, np.nan, -np.inf, np.inf, 1.0, np.inf, 2.0])
    for y in (x, np.where(np.isinf(x), np.nan, x), np.where(np.isnan(x), -np.inf, x)):
        d = da.from_array(cupy.asarray(y), chunks=chunks)
        for name in ARG:
            assert int(getattr(mr, name)(d, split_every=2).compute()) == ARG[name](y), (name, y.tolist())
        for name, ref_fn in MOMENTS.items():
            _same(_quiet_numpy(lambda: getattr(mr, name)(d, split_every=2).compute()), _quiet_numpy(ref_fn, y),
                  1e-14, f"{name} {y.tolist()}")
    with pytest.raises(ValueError, match="All-NaN"):
        mr.nanargmax(da.from_array(cupy.full(11, cupy.nan), chunks=chunks)).compute()


FAST = ("argmax", "argmin", "var", "std", "any", "all", "count_nonzero", "mean")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 31, 1025, (1 << 20) + 3])
def test_default_arguments_fast_path_is_the_general_path(dtype, n):
    """axis=None with the defaults goes through the bound launchers (statistics._whole_on_gpu,
    cupy_backend.Launcher for mean); keepdims=True goes through the general path: the same bits and
    types, twice (bound, then warm), for contiguous 1-D and 3-D arrays, on a stream of its own too."""
    rng = np.random.default_rng(n)
    host = (rng.standard_normal(n) * 50 + 7).astype(dtype) if np.dtype(dtype).kind == "f" \
        else _few_values(rng, n, dtype)
    for shape in [(n,)] + ([(n // 5, 5, 1)] if n % 5 == 0 else [(1, n, 1)]):
        x = cupy.asarray(host.reshape(shape))
        for name in FAST:
            fn = getattr(mr, name)
            general = fn(x, keepdims=True).reshape(())
            for stream in (None, cupy.cuda.Stream(non_blocking=True)):
                with stream or cupy.cuda.Stream.null:
                    for _ in range(2):
                        fast = fn(x)
                        assert isinstance(fast, cupy.ndarray) and fast.shape == () and fast.dtype == general.dtype, name
                        np.testing.assert_array_equal(cupy.asnumpy(fast), cupy.asnumpy(general), err_msg=name)
            ref = (np.var(host.astype(np.float64)) if name == "var" else None)
            if ref is not None and n > 1:
                assert abs(float(general) - ref) <= 1e-2 * ref + 1e-6, (name, float(general), ref)
        for ddof in (1, 2.5):
            if n - ddof > 0:
                np.testing.assert_array_equal(cupy.asnumpy(mr.var(x, ddof=ddof)),
                                              cupy.asnumpy(mr.var(x, ddof=ddof, keepdims=True).reshape(())))


def test_fast_path_declines_what_it_does_not_take():
    """Views that are not C-contiguous, data on another GPU than the current one, empty arrays, ddof at
    or past the count (a warning to give) and the nan-forms all take the general path, with its results,
    warnings and errors."""
    rng = np.random.default_rng(5)
    host = rng.standard_normal((64, 33)).astype(np.float32)
    x = cupy.asarray(host)
    view = x[:, 1:]
    assert int(mr.argmax(view)) == int(np.argmax(host[:, 1:]))
    np.testing.assert_allclose(float(mr.var(view)), np.var(host[:, 1:].astype(np.float64)), rtol=1e-5)
    with pytest.raises(ValueError, match="empty"):
        mr.argmax(cupy.empty(0, np.float32))
    with pytest.warns(RuntimeWarning):
        assert math.isnan(float(mr.mean(cupy.empty(0, np.float32))))
    one = cupy.asarray(host[:1, :1])
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        mr.var(one, ddof=1)
    nan = cupy.asarray(np.full(40, np.nan, np.float32))
    with pytest.raises(ValueError, match="All-NaN"):
        mr.nanargmax(nan)
    if cupy.cuda.runtime.getDeviceCount() > 1:
        with cupy.cuda.Device(1):
            other = cupy.asarray(host)
        for name in FAST:
            got = getattr(mr, name)(other)
            assert got.data.device_id == 1, name
            np.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(getattr(mr, name)(x)), err_msg=name)


def _in_threads(work, count: int) -> None:
    """work(0) ... work(count - 1), each in a thread of its own, all started before any is joined."""
    import threading

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_per_thread_default_stream_keeps_scratch_apart():
    """The per-thread default stream has one handle in every thread but is a different stream in each:
    the bound launchers' scratch is keyed by thread there too, so threads reducing at once on it never
    share a workspace (results right under concurrency)."""
    rng = np.random.default_rng(9)
    hosts = [rng.standard_normal(1 << 22).astype(np.float32) for _ in range(4)]
    want = [(int(np.argmax(h)), np.var(h.astype(np.float64)), np.sum(h.astype(np.float64))) for h in hosts]
    keys, got, errors = {}, {}, []

    def work(i):
        try:
            with cupy.cuda.Stream.ptds:
                keys[i] = cupy_backend.stream_key()
                x = cupy.asarray(hosts[i])
                for _ in range(20):
                    got[i] = (int(mr.argmax(x)), float(mr.var(x)), float(mr.sum(x)))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    _in_threads(work, 4)
    assert not errors, errors
    assert len(set(keys.values())) == 4, keys
    for i, (index, var, total) in enumerate(want):
        assert got[i][0] == index
        assert abs(got[i][1] - var) <= 1e-4 * var and abs(got[i][2] - total) <= 1e-3 * (abs(total) + 1e3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8])
def test_one_launch_whole_statistic_repeats_its_bits(dtype):
    """stats_whole (the last block merges every block's State) at a size with the most blocks: the bits of
    rows + fold (the general path, keepdims=True), the same over repeated calls that alternate the
    statistics on one stream and on a second one (the arrivals counter left at 0 every time)."""
    rng = np.random.default_rng(24)
    n = (1 << 24) + 7
    host = (rng.standard_normal(n) * 3 + 1).astype(dtype) if np.dtype(dtype).kind == "f" \
        else rng.integers(0, 100, n).astype(dtype)
    x = cupy.asarray(host)
    general = {name: cupy.asnumpy(getattr(mr, name)(x, keepdims=True).reshape(())) for name in FAST}
    side = cupy.cuda.Stream(non_blocking=True)
    for _ in range(3):
        for stream in (cupy.cuda.Stream.null, side):
            with stream:
                for name in FAST:
                    np.testing.assert_array_equal(cupy.asnumpy(getattr(mr, name)(x)), general[name], err_msg=name)
    assert int(general["argmax"]) == int(np.argmax(host))


@pytest.mark.parametrize("grid", [1, 255, 257, 543, 544, 545, 1100, 2000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_whole_last_block_merges_as_the_fold_at_any_grid(dtype, grid):
    """stats_whole launched with any grid, also past the library's own (4 blocks per SM): its last block
    gives the bits of stats_fold's block over the same parts, leaves the arrivals counter at 0, and the
    variance is NumPy's."""
    rng = np.random.default_rng(grid)
    n = (1 << 22) + 3
    host = (rng.standard_normal(n) * 5 + 2).astype(dtype)
    x = cupy.asarray(host)
    whole = kernels.get_standalone_kernels(cupy_stats.WHOLE_ENTRY,
                                           {"whole": cupy_stats.whole_name("var", dtype)})["whole"]
    fold = kernels.get_standalone_kernels(cupy_stats.ENTRY, cupy_stats.stat_names("var", dtype))["fold"]
    sdt, rdt = cupy_stats.state_dtype("var", dtype), cupy_stats.result_dtype("var", dtype)
    mode, block = np.int32(cupy_stats._MOMENTS["var"]), cupy_stats.BLOCK
    parts = cupy.empty(grid * sdt.itemsize, dtype=np.uint8)
    arrivals = cupy.zeros(1, dtype=np.uint32)
    got, want = cupy.empty((), rdt), cupy.empty((), rdt)
    for _ in range(2):  # the second launch starts from the counter the first left
        whole(grid, block, (x, np.int64(n), parts, arrivals, got, np.float64(0.0), mode))
        fold(1, block, (parts, np.int64(1), np.int64(grid), np.int64(1), np.int64(grid), cupy_backend.NULL, want,
                        np.float64(0.0), mode))
        assert int(arrivals.get()[0]) == 0
        np.testing.assert_array_equal(cupy.asnumpy(got).reshape(1).view(np.uint8),
                                      cupy.asnumpy(want).reshape(1).view(np.uint8))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(float(got), np.var(host.astype(np.float64)), rtol=rtol)


PROBED = 1 << 17  # at least statistics.PROBE_MIN_SIZE


def _no_warning(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nanmin_nanmax_probe_then_numpys_warnings(dtype):
    """The finite probe queued before a whole nanmin/nanmax: found where a sampled element is finite (no
    wait for the reduction), not found where none is (all NaN, only infinities, the one finite element
    where the probe does not look), and in every case NumPy's value and warning."""
    from multireduce import statistics

    assert PROBED >= statistics.PROBE_MIN_SIZE
    rng = np.random.default_rng(3)
    stride = PROBED // kernels.PROBE_BLOCK
    unsampled = 5 * stride + 7  # past the first PROBE_BLOCK elements, off the spread ones
    cases = {}
    mixed = rng.standard_normal(PROBED).astype(dtype)
    mixed[rng.random(PROBED) < 0.3] = np.nan
    cases["mixed"] = (mixed, True)
    cases["all NaN"] = (np.full(PROBED, np.nan, dtype), False)
    hidden = np.full(PROBED, np.nan, dtype)
    hidden[unsampled] = -2.5
    cases["one finite, unsampled"] = (hidden, False)
    infs = np.full(PROBED, np.nan, dtype)
    infs[0], infs[stride] = -np.inf, np.inf
    cases["infinities only"] = (infs, False)
    late = np.full(PROBED, np.nan, dtype)
    late[stride * 3] = 4.0  # a spread sample
    cases["one finite, sampled"] = (late, True)
    for label, (host, proved) in cases.items():
        x = cupy.asarray(host)
        probe = cupy_backend.finite_probe(x)
        assert probe is not None and (probe[0].counts(probe[1])[0] > 0) == proved, label
        for name in ("nanmin", "nanmax"):
            want_warning = bool(np.isnan(host).all())
            if want_warning:
                with pytest.warns(RuntimeWarning, match="All-NaN"):
                    got = getattr(mr, name)(x)
                with pytest.warns(RuntimeWarning, match="All-NaN"):
                    want = getattr(np, name)(host)
            else:
                got = _no_warning(getattr(mr, name), x)
                want = _no_warning(getattr(np, name), host)
            assert got.dtype == host.dtype and got.shape == (), (label, name)
            np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"{label} {name}")
    fortran = cupy.asfortranarray(cupy.asarray(mixed.reshape(512, -1)))
    probe = cupy_backend.finite_probe(fortran)  # F-contiguous: the same elements, read in memory order
    assert probe is not None and probe[0].counts(probe[1])[0] > 0
    np.testing.assert_array_equal(cupy.asnumpy(_no_warning(mr.nanmax, fortran)), np.nanmax(mixed))
    view = cupy.asarray(mixed)[::2]
    assert cupy_backend.finite_probe(view) is None  # strided: the reduction's result is looked at instead
    np.testing.assert_array_equal(cupy.asnumpy(_no_warning(mr.nanmax, view)), np.nanmax(mixed[::2]))


def test_nanmax_probe_slots_run_out_and_come_back(monkeypatch):
    """With every probe slot taken (threads in the middle of a call), nanmax waits for its result as
    before; the slots come back after use, also when the reduction raises; bad arguments raise before
    any probe is launched."""
    from multireduce import api
    rng = np.random.default_rng(8)
    host = rng.standard_normal(PROBED).astype(np.float32)
    x = cupy.asarray(host)
    first = cupy_backend.finite_probe(x)
    probe = first[0]
    taken = [first[1]] + [probe.launch(x) for _ in range(probe.SLOTS - 1)]
    assert None not in taken and probe.launch(x) is None and cupy_backend.finite_probe(x) is None
    assert float(_no_warning(mr.nanmax, x)) == np.nanmax(host)
    with pytest.warns(RuntimeWarning, match="All-NaN"):
        assert math.isnan(float(mr.nanmin(cupy.full(PROBED, cupy.nan, cupy.float32))))
    for slot in taken:
        assert probe.counts(slot) == (2 * kernels.PROBE_BLOCK - 1,) * 2
    assert len(probe.free) == probe.SLOTS
    launched = []
    monkeypatch.setattr(cupy_backend.FiniteProbe, "launch", lambda self, a: launched.append(a))
    with pytest.raises(TypeError, match="keepdims"):
        mr.nanmax(x, keepdims="no")
    with pytest.raises(ValueError, match="split_every"):
        mr.nanmax(x, split_every=1)
    assert not launched
    monkeypatch.undo()

    def broken(*args, **kwargs):
        raise MemoryError("out of device memory")

    monkeypatch.setattr(api, "_reduction", broken)
    with pytest.raises(MemoryError):
        mr.nanmax(x)
    assert len(probe.free) == probe.SLOTS


def test_nanmax_probes_from_threads():
    """Threads calling whole nanmax/nanmin at once, each on its own stream, one of them on all-NaN data
    (its probe finds nothing, and it waits for its result): every value right, every slot back. The
    warnings are not counted here: warnings.catch_warnings is not thread-safe (the single-thread tests
    above check them)."""
    rng = np.random.default_rng(12)
    hosts = [rng.standard_normal(1 << 20).astype(np.float32) for _ in range(4)]
    hosts[2][:] = np.nan
    hosts[3][: 1 << 19] = np.nan  # the first half NaN: only the spread samples find a finite element
    errors, got = [], {i: [] for i in range(4)}

    def work(i):
        try:
            with cupy.cuda.Stream(non_blocking=True):
                x = cupy.asarray(hosts[i])
                for _ in range(50):
                    got[i].append((float(mr.nanmax(x)), float(mr.nanmin(x))))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _in_threads(work, 4)
    assert not errors, errors
    for i, host in enumerate(hosts):
        assert len(got[i]) == 50
        if i == 2:
            assert all(math.isnan(a) and math.isnan(b) for a, b in got[i])
        else:
            assert set(got[i]) == {(float(np.nanmax(host)), float(np.nanmin(host)))}, i
    probe = cupy_backend._probes[cupy.cuda.runtime.getDevice()]
    assert len(probe.free) == probe.SLOTS


def _sampled(n):
    """The positions finite_probe samples in an array of n elements (FiniteProbe.launch's stride)."""
    block = kernels.PROBE_BLOCK
    stride = max(block, n // block)
    return sorted(set(range(min(block, n))) | {(i + 1) * stride for i in range(block - 1) if (i + 1) * stride < n})


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_probe_counts_and_nan_moments_warn_as_numpy(dtype):
    """The probe's counts are those of its samples (finite; not NaN, infinities included), and whole
    nanmean/nanvar/nanstd give NumPy's values and warnings whether the sampled numbers prove the count
    (no wait) or not (the count read back)."""
    rng = np.random.default_rng(17)
    n = PROBED + 5
    where = _sampled(n)
    assert len(where) == 2 * kernels.PROBE_BLOCK - 1 and len(set(where)) == len(where)
    mixed = rng.standard_normal(n).astype(dtype)
    mixed[rng.random(n) < 0.4] = np.nan
    mixed[where[3]], mixed[where[300]] = np.inf, -np.inf
    probe = cupy_backend.finite_probe(cupy.asarray(mixed))
    sample = mixed[where]
    assert probe[0].counts(probe[1]) == (int(np.isfinite(sample).sum()), int((~np.isnan(sample)).sum()))
    unsampled = [i for i in range(n) if i not in set(where)]
    one = np.full(n, np.nan, dtype)
    one[unsampled[1000]] = 2.5
    two = one.copy()
    two[where[7]] = -1.0  # one sampled number, one not: the probe proves count > 0 only
    cases = {"mixed": mixed, "all NaN": np.full(n, np.nan, dtype), "one number, unsampled": one,
             "two numbers, one sampled": two}
    for label, host in cases.items():
        x = cupy.asarray(host)
        for name, ddof in (("nanmean", None), ("nanvar", 0), ("nanvar", 1), ("nanstd", 1)):
            args = () if ddof is None else (None,)
            kwargs = {} if ddof is None else {"ddof": ddof}
            with warnings.catch_warnings(record=True) as theirs:
                warnings.simplefilter("always")
                want = getattr(np, name)(host.astype(np.float64), *args, **kwargs)
            with warnings.catch_warnings(record=True) as ours:
                warnings.simplefilter("always")
                got = getattr(mr, name)(x, **kwargs)
            numpys = [str(w.message) for w in theirs]  # NumPy's own, not its arithmetic's "invalid value"
            assert [str(w.message) for w in ours] == [m for m in numpys if "slice" in m], (label, name, ddof)
            assert got.dtype == host.dtype, (label, name)
            if np.isnan(want):
                assert math.isnan(float(got)), (label, name, ddof)
            else:
                rtol = 2e-2 if dtype == np.float16 else 1e-5
                assert abs(float(got) - want) <= rtol * abs(want) + rtol, (label, name, ddof, float(got), want)
