"""NumPy's keywords on the reductions and statistics (where=, initial=, out=, correction=) against NumPy
itself: awkward sizes, masks with all-False rows, every axis form and keepdims, NumPy and unevenly chunked
Dask input (chunks of size 0 too), NumPy's dtype and error rules, and the clear errors for keywords a
function cannot honour, raised before any work."""

from __future__ import annotations

import math
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce import api

from .helpers import float_bound, matmul_operator, random_array, random_matrices, sequential_fold

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

DTYPES = [np.float32, np.float64, np.int32]
# (shape, axis): awkward sizes, every axis form; the 2-D and 3-D masks have all-False rows
CASES = [
    ((0,), None), ((1,), None), ((31,), 0), ((33,), None), ((1023,), None), ((1025,), 0),
    ((33, 17), None), ((33, 17), 1), ((33, 17), 0), ((33, 17), (0, 1)), ((0, 7), 1), ((4, 5, 6), (0, 2)),
]
# uneven dask chunkings with chunks of size 0, by shape
CHUNKS = {
    (1025,): ((0, 500, 1, 0, 524),),
    (33, 17): ((10, 0, 23), (5, 0, 12)),
    (4, 5, 6): ((1, 0, 3), (5,), (2, 4)),
}
NUMPY = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "nansum": np.nansum, "nanprod": np.nanprod,
         "nanmin": np.nanmin, "nanmax": np.nanmax}


def _mask(rng, shape):
    """Random, mostly True, with the first row (of 2-D and more) all False."""
    w = rng.random(shape) < 0.7
    if len(shape) >= 2 and shape[0]:
        w[0] = False
    return w


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args, **kwargs)


def _compare(got, ref, mass, out_dtype, n, what, product=False):
    """``got`` against a float64 (or exact integer) reference: exact for integers and min/max (``mass``
    None), NaN where the reference has NaN, else within the stated bound of a blocked sum."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == np.dtype(out_dtype), f"{what}: dtype {got.dtype}, expected {np.dtype(out_dtype)}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    if got.dtype.kind != "f" or mass is None:
        np.testing.assert_array_equal(got, ref.astype(out_dtype), err_msg=what)
        return
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=what)
    bound = float_bound(out_dtype, max(n, 1), product) * np.asarray(mass, dtype=np.float64)
    bound = bound + np.finfo(out_dtype).eps * np.abs(ref) + np.finfo(out_dtype).tiny
    err = np.where(nan, 0.0, np.abs(got.astype(np.float64) - np.where(nan, 0.0, ref)))
    assert np.all(err <= np.where(nan, 0.0, bound)), f"{what}: max error {np.max(err):g}"


def _reference(name, x, axis, keepdims, where, initial):
    """NumPy on a float64 copy (floats) or the input itself (integers), and the mass for the bound."""
    fn = NUMPY[name]
    kwargs = {"axis": axis, "keepdims": keepdims, "where": where}
    if initial is not None:
        kwargs["initial"] = initial
    wide = x.astype(np.float64) if x.dtype.kind == "f" else x
    ref = _quiet(fn, wide, **kwargs)
    if name in ("min", "max", "nanmin", "nanmax") or x.dtype.kind != "f":
        return ref, None
    if name.endswith("prod"):
        return ref, np.abs(ref)
    mass = _quiet(np.nansum, np.abs(wide), axis=axis, keepdims=keepdims, where=where) + abs(initial or 0)
    return ref, mass


# ------------------------------------------------------------------------------------------------
# where= and initial= on the reductions, NumPy input
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axis", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["sum", "prod", "min", "max"])
def test_where_and_initial_match_numpy(name, dtype, shape, axis, keepdims):
    rng = np.random.default_rng(len(shape) * 1000 + math.prod(shape))
    x = random_array(rng, shape, dtype, name)
    w = _mask(rng, shape)
    x0, w0 = x.copy(), w.copy()
    for initial in ([None, 3] if name in ("sum", "prod") else [3, -2]):
        got = getattr(mr, name)(x, axis=axis, keepdims=keepdims, where=w, initial=initial)
        expected = _quiet(NUMPY[name], x, axis=axis, keepdims=keepdims, where=w,
                          **({} if initial is None else {"initial": initial}))
        ref, mass = _reference(name, x, axis, keepdims, w, initial)
        assert np.isscalar(got) == np.isscalar(expected)
        _compare(got, ref, mass, np.asarray(expected).dtype, x.size, f"{name} initial={initial}",
                 product=name == "prod")
    np.testing.assert_array_equal(x, x0)  # nothing the user passed is modified
    np.testing.assert_array_equal(w, w0)


@pytest.mark.parametrize("name", ["sum", "prod", "min", "max"])
def test_initial_alone_and_empty_axes(name):
    x = random_array(np.random.default_rng(5), (33, 17), np.float64, name)
    for axis in (None, 0, (0, 1)):
        np.testing.assert_allclose(getattr(mr, name)(x, axis=axis, initial=0.5),
                                   NUMPY[name](x, axis=axis, initial=0.5), rtol=1e-13)
    empty = np.zeros((0, 4), np.float32)
    got = getattr(mr, name)(empty, axis=0, initial=2)  # min/max of nothing with initial: initial, as NumPy
    expected = NUMPY[name](empty, axis=0, initial=2)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    got = getattr(mr, name)(empty, initial=2)
    assert type(got) is type(NUMPY[name](empty, initial=2)) and got == 2


def test_initial_converts_as_numpy():
    i8 = np.array([1, 2, 100], dtype=np.int8)
    for fn, x, initial in [("sum", i8, 1.5), ("max", i8, 1.5), ("max", i8, -1.5), ("min", i8, True),
                           ("sum", np.array([True, True]), True), ("prod", i8, 2), ("min", np.array([True]), 0),
                           ("sum", np.float16([1, 2]), 0.1)]:
        got, expected = getattr(mr, fn)(x, initial=initial), NUMPY[fn](x, initial=initial)
        assert got == expected and got.dtype == expected.dtype, (fn, x.dtype, initial)
    got = mr.sum(i8, dtype=np.float32, initial=2.7)
    assert got.dtype == np.float32 and got == np.sum(i8, dtype=np.float32, initial=2.7)
    for fn, x, initial in [("max", i8, 1000), ("min", np.uint8([1]), -1), ("sum", i8, 2**70),
                           ("sum", np.float64([1]), 1j), ("sum", np.float64([1]), "a"), ("sum", i8, [1, 2])]:
        with pytest.raises(Exception) as numpy_error:
            NUMPY[fn](x, initial=initial)
        with pytest.raises(type(numpy_error.value), match=rf"multireduce\.{fn}: argument 'initial'"):
            getattr(mr, fn)(x, initial=initial)


def test_min_max_with_where_need_initial_as_numpy():
    x = np.arange(6.0).reshape(2, 3)
    for where in (np.ones((2, 3), bool), np.True_, np.array([True, False, True]), False):
        for name in ("min", "max", "nanmin", "nanmax"):
            with pytest.raises(ValueError):
                NUMPY[name](x, where=where)
            with pytest.raises(ValueError, match=rf"multireduce\.{name}: argument 'where' needs 'initial'.*"
                                                 "does not have an identity"):
                getattr(mr, name)(x, where=where)
    assert mr.min(x, where=True) == np.min(x, where=True) == 0  # True, the default: every element, no initial
    assert mr.min(x, where=False, initial=7) == np.min(x, where=False, initial=7) == 7
    assert mr.sum(x, where=False) == 0 and mr.prod(x, axis=1, where=np.False_).tolist() == [1.0, 1.0]


# ------------------------------------------------------------------------------------------------
# Dask input: lazy, any chunking, where of NumPy or dask with other chunks
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", list(CHUNKS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dask_where_and_initial(dtype, shape):
    rng = np.random.default_rng(11)
    chunks = CHUNKS[shape]
    ndim = len(shape)
    for name in ("sum", "prod", "min", "max"):
        x = random_array(rng, shape, dtype, name)
        w = _mask(rng, shape)
        dx = da.from_array(x, chunks=chunks)
        # where as a dask array chunked otherwise, and as a NumPy array broadcast along the first axis
        wheres = [(w, da.from_array(w, chunks=tuple((s,) for s in shape))), (np.broadcast_to(w[-1], shape), w[-1])]
        for axis, keepdims in ((None, False), (ndim - 1, True), (tuple(range(ndim)), False)):
            for full, where in wheres:
                initial = None if name in ("sum", "prod") else 0.25 if x.dtype.kind == "f" else 7
                got = getattr(mr, name)(dx, axis=axis, keepdims=keepdims, where=where, initial=initial)
                assert isinstance(got, da.Array)
                expected = _quiet(NUMPY[name], x, axis=axis, keepdims=keepdims, where=full,
                                  **({} if initial is None else {"initial": initial}))
                ref, mass = _reference(name, x, axis, keepdims, full, initial)
                _compare(got.compute(), ref, mass, np.asarray(expected).dtype, x.size,
                         f"dask {name} axis={axis}", product=name == "prod")
    now = mr.sum(dx, where=w, initial=1, compute=True)
    assert isinstance(now, np.generic)


def test_dask_where_stays_lazy_with_any_chunk_source():
    calls = []

    def made(block):
        calls.append(block.shape)
        return block

    x = np.random.default_rng(3).uniform(-1, 1, (40, 9))
    dx = da.from_array(x, chunks=((7, 0, 33), (9,))).map_blocks(made, meta=np.empty((0, 0)))
    w = da.from_array(x > 0, chunks=((20, 20), (4, 5)))
    result = mr.mean(dx, axis=0, where=w)
    assert calls == [] and isinstance(result, da.Array)  # lazy: no chunk made yet
    np.testing.assert_allclose(result.compute(), np.mean(x, axis=0, where=x > 0), rtol=1e-13)


# ------------------------------------------------------------------------------------------------
# mean and the moments: the count is of the masked elements
# ------------------------------------------------------------------------------------------------
MOMENTS = {"mean": np.mean, "var": np.var, "std": np.std, "nanvar": np.nanvar, "nanstd": np.nanstd,
           "nanmean": np.nanmean}


MOMENT_CASES = [((1,), None), ((31,), 0), ((1025,), None), ((33, 17), 1), ((33, 17), 0), ((33, 17), (0, 1)),
                ((4, 5, 6), (0, 2))]


@pytest.mark.parametrize("shape,axis,dask_input", [c + (False,) for c in MOMENT_CASES]
                         + [c + (True,) for c in MOMENT_CASES if c[0] in CHUNKS], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_moments_with_where_match_numpy(dtype, shape, axis, dask_input):
    rng = np.random.default_rng(math.prod(shape))
    x = random_array(rng, shape, dtype)
    if x.dtype.kind == "f":
        x.flat[rng.integers(0, x.size, size=max(1, x.size // 10))] = np.nan  # the NaN-skipping forms skip them
    w = _mask(rng, shape)
    x0, w0 = x.copy(), w.copy()
    given = da.from_array(x, chunks=CHUNKS[shape]) if dask_input else x
    for name, fn in MOMENTS.items():
        for keepdims in (False, True):
            kwargs = {"axis": axis, "keepdims": keepdims, "where": w}
            if name not in ("mean", "nanmean"):
                kwargs["ddof"] = 1
            got = _quiet(getattr(mr, name), given, **kwargs)
            if dask_input:
                assert isinstance(got, da.Array)
                got = _quiet(got.compute)
            expected = _quiet(fn, x, **kwargs)
            ref = _quiet(fn, x.astype(np.float64), **kwargs)
            got, ref = np.asarray(got), np.asarray(ref)
            assert got.dtype == np.asarray(expected).dtype and got.shape == ref.shape, name
            rtol = 1e-12 if got.dtype == np.float64 else 1e-5
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol, equal_nan=True, err_msg=name)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's own 0/0, as NumPy
def test_moments_warn_as_numpy_for_empty_slices():
    x = np.random.default_rng(8).normal(size=(3, 5))
    w = np.ones((3, 5), bool)
    w[1] = False
    w[2, 1:] = False
    for name, text in [("mean", "Mean of empty slice"), ("nanmean", "Mean of empty slice"),
                       ("var", "Degrees of freedom <= 0"), ("nanstd", "Degrees of freedom <= 0")]:
        kwargs = {"axis": 1, "where": w} | ({} if "mean" in name else {"ddof": 1})
        with pytest.warns(RuntimeWarning, match=text):
            got = getattr(mr, name)(x, **kwargs)
        np.testing.assert_allclose(got, _quiet(MOMENTS[name], x, **kwargs), rtol=1e-13, equal_nan=True)
        assert np.isnan(got[1]) and np.isnan(got[2]) == (name != "mean" and name != "nanmean")
    # ddof past the count: var divides by max(count - ddof, 0) (inf), nanvar gives NaN, as NumPy
    w2 = np.ones((3, 5), bool)
    w2[0, 2:] = False
    np.testing.assert_array_equal(_quiet(mr.var, x, axis=1, where=w2, ddof=2),
                                  _quiet(np.var, x, axis=1, where=w2, ddof=2))
    np.testing.assert_array_equal(_quiet(mr.nanvar, x, axis=1, where=w2, ddof=2),
                                  _quiet(np.nanvar, x, axis=1, where=w2, ddof=2))


def test_correction_is_ddof():
    x = np.random.default_rng(9).normal(size=(31, 4))
    for name in ("var", "std", "nanvar", "nanstd"):
        fn, ref = getattr(mr, name), MOMENTS[name]
        np.testing.assert_allclose(fn(x, axis=0, correction=1), ref(x, axis=0, correction=1), rtol=1e-13)
        np.testing.assert_allclose(fn(x, correction=1.5), fn(x, ddof=1.5), rtol=1e-15)
        assert fn(x, ddof=0, correction=1) == fn(x, ddof=1)  # ddof left at 0 counts as not given, as NumPy
        with pytest.raises(ValueError):
            ref(x, ddof=1, correction=1)
        with pytest.raises(ValueError, match=rf"multireduce\.{name}: arguments 'ddof' and 'correction' can't be"):
            fn(x, ddof=1, correction=1)
        dx = da.from_array(x, chunks=((0, 10, 21), (4,)))
        np.testing.assert_allclose(fn(dx, correction=2).compute(), ref(x, correction=2), rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# The NaN-skipping forms and any/all
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dask_input", [False, True])
@pytest.mark.parametrize("name", ["nansum", "nanprod", "nanmin", "nanmax"])
def test_nan_forms_with_where_and_initial(name, dask_input):
    rng = np.random.default_rng(12)
    x = random_array(rng, (33, 17), np.float64, "prod" if name == "nanprod" else "sum")
    x[rng.random(x.shape) < 0.2] = np.nan
    x[3] = np.nan  # an all-NaN row
    w = _mask(rng, x.shape)
    given = da.from_array(x, chunks=CHUNKS[(33, 17)]) if dask_input else x
    for axis in (None, 0, 1):
        for initial in ([None, 0.5] if name in ("nansum", "nanprod") else [0.5, -0.5]):
            extra = {} if initial is None else {"initial": initial}
            got = getattr(mr, name)(given, axis=axis, where=w, **extra)
            got = got.compute() if dask_input else got
            ref, mass = _reference(name, x, axis, False, w, initial)
            _compare(got, ref, mass, np.float64, x.size, f"{name} axis={axis}", product=name == "nanprod")
    # a NaN initial: fmin/fmax skip it; a slice with nothing else gives NaN
    if name in ("nanmin", "nanmax"):
        got = _quiet(getattr(mr, name), given, axis=1, where=w, initial=np.nan)
        got = _quiet(got.compute) if dask_input else got
        np.testing.assert_array_equal(got, _quiet(NUMPY[name], x, axis=1, where=w, initial=np.nan))


def test_integer_nan_forms_are_the_plain_ones():
    x = random_array(np.random.default_rng(2), (33, 17), np.int32)
    w = _mask(np.random.default_rng(3), x.shape)
    for name in ("nansum", "nanprod", "nanmin", "nanmax", "nanmean", "nanvar"):
        kwargs = {"axis": 0, "where": w} | ({"initial": 5} if name[3:] in ("min", "max") else {})
        np.testing.assert_allclose(_quiet(getattr(mr, name), x, **kwargs),
                                   _quiet(getattr(np, name), x, **kwargs), rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("dask_input", [False, True])
def test_any_all_with_where(dask_input):
    rng = np.random.default_rng(4)
    x = (rng.random((33, 17)) < 0.1).astype(np.float32)
    x[5, 5] = np.nan  # NaN is non-zero
    w = _mask(rng, x.shape)
    given = da.from_array(x, chunks=CHUNKS[(33, 17)]) if dask_input else x
    for name in ("any", "all"):
        for axis, keepdims in ((None, False), (0, True), (1, False), ((0, 1), True)):
            got = getattr(mr, name)(given, axis=axis, keepdims=keepdims, where=w)
            got = got.compute() if dask_input else got
            expected = getattr(np, name)(x, axis=axis, keepdims=keepdims, where=w)
            assert np.asarray(got).dtype == np.bool_ and np.array_equal(got, expected), (name, axis)


# ------------------------------------------------------------------------------------------------
# exact=, user operators, compute=
# ------------------------------------------------------------------------------------------------
def test_exact_with_where_and_refusals():
    rng = np.random.default_rng(6)
    x = rng.normal(size=1025) * 10.0 ** rng.integers(-8, 9, size=1025)
    w = rng.random(1025) < 0.6
    assert mr.sum(x, where=w, exact=True) == math.fsum(x[w])
    dx = da.from_array(x, chunks=((0, 300, 1, 0, 724),))
    assert mr.sum(dx, where=w, exact=True, compute=True) == math.fsum(x[w])
    y = x.copy()
    y[::7] = np.nan
    assert mr.nansum(y, where=w, exact=True) == math.fsum(v for v in y[w] if not np.isnan(v))
    with pytest.raises(ValueError, match=r"multireduce\.sum: argument 'initial' cannot .*exact=True"):
        mr.sum(x, initial=1.0, exact=True)
    with pytest.raises(ValueError, match=r"multireduce\.mean: argument 'where' cannot .*exact=True"):
        mr.mean(x, where=w, exact=True)


def test_user_operator_with_where_and_initial_keeps_order():
    op = matmul_operator()  # not commutative: initial must come first, the kept elements in order
    rng = np.random.default_rng(7)
    x = random_matrices(rng, 1025)
    w = rng.random(1025) < 0.5
    start = int(random_matrices(rng, 1)[0])
    expected = sequential_fold(np.concatenate([[start], x[w]]).astype(np.uint64))
    assert int(mr.reduce(x, op, where=w, initial=start)) == expected
    dx = da.from_array(x, chunks=((0, 100, 1, 924),))
    assert int(mr.reduce(dx, op, where=w, initial=start).compute()) == expected
    rows = x[:1023].reshape(33, 31)
    got = mr.reduce(rows, op, axis=1, where=w[:1023].reshape(33, 31))
    assert [int(v) for v in got] == [sequential_fold(r[m]) for r, m in zip(rows, w[:1023].reshape(33, 31))]


# ------------------------------------------------------------------------------------------------
# out=
# ------------------------------------------------------------------------------------------------
OUT_CASES = [  # (function, kwargs, x dtype)
    ("sum", {"axis": 0}, np.float64), ("prod", {"axis": 1, "keepdims": True}, np.float64), ("min", {}, np.int32),
    ("max", {"axis": (0, 1)}, np.float32), ("mean", {"axis": 0}, np.int32), ("var", {"axis": 1}, np.float64),
    ("std", {}, np.float32), ("nanvar", {"axis": 0}, np.float64), ("nanstd", {"axis": 1}, np.float64),
    ("nanmean", {"axis": 0}, np.float64), ("nansum", {"axis": 1}, np.float64), ("nanprod", {}, np.float64),
    ("nanmin", {"axis": 0}, np.float64), ("nanmax", {"axis": 1}, np.float32), ("any", {"axis": 0}, np.float64),
    ("all", {"axis": 1, "keepdims": True}, np.int32), ("argmax", {"axis": 0}, np.float64), ("argmin", {}, np.int32),
    ("nanargmax", {"axis": 1}, np.float64), ("nanargmin", {"axis": 0, "keepdims": True}, np.float64),
    ("reduce", {"axis": 0}, np.int32),
]


def _call(name, lib, x, **kwargs):
    if name == "reduce":
        return mr.reduce(x, "max", **kwargs) if lib is mr else np.maximum.reduce(x, **kwargs)
    return getattr(lib, name)(x, **kwargs)


@pytest.mark.parametrize("name,kwargs,dtype", OUT_CASES, ids=lambda c: c if isinstance(c, str) else "")
def test_out_writes_the_result_as_numpy(name, kwargs, dtype):
    rng = np.random.default_rng(13)
    x = (rng.integers(-50, 50, size=(33, 17)) / 4).astype(dtype)  # quarters: sums are exact, casts agree
    x0 = x.copy()
    expected = np.asarray(_call(name, np, x, **kwargs))
    for out_dtype in {expected.dtype, np.dtype(np.float64), np.dtype(np.int64)}:
        ours = np.full(expected.shape, 7, out_dtype)
        try:
            theirs = np.full(expected.shape, 7, out_dtype)
            _call(name, np, x, out=theirs, **kwargs)
        except TypeError:  # NumPy's casting rule refuses this out dtype: so does multireduce, before any work
            with pytest.raises(TypeError, match=rf"multireduce\.{name}: argument 'out'"):
                _call(name, mr, x, out=ours, **kwargs)
            assert (ours == 7).all()
            continue
        assert _call(name, mr, x, out=ours, **kwargs) is ours
        np.testing.assert_allclose(ours, theirs, rtol=1e-6 if dtype == np.float32 else 1e-13)
    np.testing.assert_array_equal(x, x0)
    # a view as out; the wrong shape, a list, a read-only array: errors naming 'out'
    base = np.zeros((2,) + expected.shape, expected.dtype)
    view = base[1, ...]
    assert _call(name, mr, x, out=view, **kwargs) is view
    np.testing.assert_allclose(base[1], expected, rtol=1e-6 if dtype == np.float32 else 1e-13)
    with pytest.raises(ValueError, match=rf"multireduce\.{name}: argument 'out' must have the shape"):
        _call(name, mr, x, out=np.zeros(expected.shape + (1,), expected.dtype), **kwargs)
    with pytest.raises(TypeError, match=rf"multireduce\.{name}: argument 'out' must be a numpy.ndarray"):
        _call(name, mr, x, out=expected.tolist(), **kwargs)
    with pytest.raises(ValueError, match="read-only"):
        _call(name, mr, x, out=np.broadcast_to(np.zeros((), expected.dtype), expected.shape), **kwargs)
    with pytest.raises(TypeError, match=rf"multireduce\.{name}: argument 'out' is for NumPy and CuPy input; 'x' is "
                                        r"a dask array.*assign the result instead"):
        _call(name, mr, da.from_array(x, chunks=10), out=np.empty(expected.shape, expected.dtype), **kwargs)


def test_out_with_where_and_initial():
    rng = np.random.default_rng(14)
    x = rng.uniform(-1, 1, (31, 33)).astype(np.float32)
    w = _mask(rng, x.shape)
    for name in ("sum", "max", "nanmin"):
        ours, theirs = np.empty(33, np.float64), np.empty(33, np.float64)
        assert getattr(mr, name)(x, axis=0, where=w, initial=0.5, out=ours) is ours
        NUMPY[name](x, axis=0, where=w, initial=0.5, out=theirs)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    ours = np.empty(31, np.float32)
    assert _quiet(mr.mean, x, axis=1, where=w, out=ours) is ours
    np.testing.assert_allclose(ours, _quiet(np.mean, x.astype(np.float64), axis=1, where=w), rtol=1e-6, equal_nan=True)
    scalar_out = np.empty((), np.float64)
    assert mr.sum(x, out=scalar_out) is scalar_out and np.isclose(scalar_out, np.sum(x, dtype=np.float64), rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Errors: named, before any work
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def no_work(monkeypatch):
    """Any reduction that starts fails the test: the errors below must come first."""
    def started(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(api, "_reduction", started)
    monkeypatch.setattr(api, "_masked", started)


def test_bad_keywords_raise_before_any_work(no_work):
    x = np.arange(12.0).reshape(3, 4)
    w = x > 3
    cases = [
        (lambda: mr.sum(x, where=x), TypeError, r"multireduce\.sum: argument 'where' must be a boolean array"),
        (lambda: mr.sum(x, where=[1, 0, 1, 0]), TypeError, "boolean array"),
        (lambda: mr.prod(x, where=np.ones(3, bool)), ValueError, r"'where' must broadcast to the shape of 'x', \(3, "),
        (lambda: mr.min(x, where=w), ValueError, "needs 'initial'"),
        (lambda: mr.max(x, where=w, initial="a"), ValueError, "argument 'initial'"),
        (lambda: mr.sum(x, where=da.from_array(w)), TypeError, "'where' is a dask array, but 'x' is a NumPy array"),
        (lambda: mr.sum(x, where=w, axis=2), np.exceptions.AxisError, "axis"),
        (lambda: mr.sum(x, where=w, out=np.empty(3)), ValueError, "'out' must have the shape of the result, \\(\\)"),
        (lambda: mr.mean(x, where=w, out=[0.0]), TypeError, "'out' must be a numpy.ndarray"),
        (lambda: mr.var(x, where=np.ones((4, 3), bool)), ValueError, "'where' must broadcast"),
        (lambda: mr.std(x, where=w, out=np.empty((), np.int64)), TypeError, "casting='same_kind'"),
        (lambda: mr.nanvar(x, out=np.empty((), np.int64)), TypeError, "floating or complex dtype"),
        (lambda: mr.argmax(x, out=np.empty((), np.float64)), TypeError, "casts safely to"),
        (lambda: mr.any(x, where=w.astype(int)), TypeError, "boolean array"),
        (lambda: mr.nansum(x, where=w, initial=[1, 2]), ValueError, r"multireduce\.nansum: argument 'initial'"),
        (lambda: mr.sum(x, where=w, compute=1), TypeError, "'compute' must be True or False"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    np.testing.assert_array_equal(x, np.arange(12.0).reshape(3, 4))


def test_keywords_a_function_does_not_take_are_named():
    x = np.arange(6.0)
    for call, name, keyword, hint in [
        (lambda: mr.cumsum(x, where=x > 1), "cumsum", "where", "numpy.cumsum has no 'where' either"),
        (lambda: mr.mean(x, initial=1), "mean", "initial", "numpy.mean has no 'initial' either"),
        (lambda: mr.var(x, initial=1), "var", "initial", "accepts x, axis, dtype, ddof, keepdims, out, where"),
        (lambda: mr.count_nonzero(x, out=np.empty(())), "count_nonzero", "out", "it accepts x, axis, keepdims"),
        (lambda: mr.cumprod(x, initial=1), "cumprod", "initial", "numpy.cumprod has no 'initial' either"),
        (lambda: mr.nancumsum(x, initial=1), "nancumsum", "initial", "accepts x, axis, dtype"),
        (lambda: mr.scan(x, "max", where=True), "scan", "where", "accepts x, op, axis"),
        (lambda: mr.sum(x, axes=0), "sum", "axes", "accepts x, axis, dtype, keepdims, out, initial, where"),
    ]:
        with pytest.raises(TypeError, match=rf"multireduce\.{name}: unexpected keyword argument {keyword}=") as error:
            call()
        assert hint in str(error.value)
    with pytest.raises(TypeError, match="keyword arguments mean=1, where=True"):
        mr.cumsum(x, mean=1, where=True)


def test_where_kinds_must_match_x():
    x = np.arange(8.0)
    dx = da.from_array(x, chunks=3)
    with pytest.raises(TypeError, match="'where' is a dask array"):
        mr.mean(x, where=da.from_array(x > 2, chunks=3))
    with pytest.raises(TypeError, match="'where' is a dask array"):
        mr.any(x, where=da.from_array(x > 2, chunks=3))
    # dask x takes a NumPy or a dask where
    assert mr.sum(dx, where=x > 2).compute() == mr.sum(dx, where=da.from_array(x > 2, chunks=5)).compute() == 25


# ------------------------------------------------------------------------------------------------
# CuPy: the same on the GPU (the logic above runs on NumPy data here)
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum", "prod", "min", "max", "mean", "var", "std", "nanvar", "nanmean", "nansum",
                                  "nanmin", "any", "all"])
def test_cupy_where_initial_out(name):
    import cupy

    rng = np.random.default_rng(15)
    x = random_array(rng, (33, 1025), np.float32, "prod" if name == "prod" else "sum")
    x[rng.random(x.shape) < 0.05] = np.nan if name.startswith("nan") else x[0, 0]
    w = _mask(rng, x.shape)
    kwargs = {"axis": 1, "where": w}
    if name in ("min", "max", "nanmin"):
        kwargs["initial"] = 0.5
    expected = np.asarray(_quiet(getattr(mr, name), x, **kwargs))
    gx, gw = cupy.asarray(x), cupy.asarray(w)
    got = _quiet(getattr(mr, name), gx, **(kwargs | {"where": gw}))
    assert isinstance(got, cupy.ndarray) and got.dtype == expected.dtype
    rtol = 0 if name in ("min", "max", "nanmin", "any", "all") else 1e-5
    np.testing.assert_allclose(got.get(), expected, rtol=rtol, atol=rtol, equal_nan=True)
    out = cupy.full(expected.shape, 7, expected.dtype)
    assert _quiet(getattr(mr, name), gx, out=out, **(kwargs | {"where": gw})) is out
    np.testing.assert_allclose(out.get(), expected, rtol=rtol, atol=rtol, equal_nan=True)
    gd = da.from_array(gx, chunks=((10, 0, 23), (500, 525)))
    lazy = _quiet(getattr(mr, name), gd, **(kwargs | {"where": da.from_array(gw, chunks=((33,), (1025,)))}))
    np.testing.assert_allclose(cupy.asnumpy(_quiet(lazy.compute)), expected, rtol=rtol, atol=rtol, equal_nan=True)
    np.testing.assert_array_equal(gx.get(), x)
    np.testing.assert_array_equal(gw.get(), w)


@pytest.mark.gpu
def test_cupy_out_and_where_errors():
    import cupy

    gx = cupy.arange(12.0).reshape(3, 4)
    with pytest.raises(TypeError, match="'out' must be a cupy.ndarray"):
        mr.sum(gx, out=np.empty(()))
    with pytest.raises(TypeError, match="'where' is a NumPy array, but 'x' holds CuPy data"):
        mr.sum(gx, where=np.ones(4, bool))
    with pytest.raises(TypeError, match="'where' is a CuPy array, but 'x' holds NumPy data"):
        mr.sum(np.arange(4.0), where=cupy.ones(4, bool))
    out = cupy.empty(4, cupy.int64)
    assert mr.argmax(gx, axis=0, out=out) is out and out.get().tolist() == [2, 2, 2, 2]


def test_dask_config_split_every_is_used_with_keywords():
    x = np.random.default_rng(1).uniform(-1, 1, 1025)
    w = x > 0
    with dask.config.set(split_every=3):
        got = mr.sum(da.from_array(x, chunks=100), where=w, initial=1.0)
    assert math.isclose(got.compute(), 1.0 + math.fsum(x[w]), rel_tol=1e-13)


SCANS = {"cumsum": (mr.cumsum, np.cumsum), "cumprod": (mr.cumprod, np.cumprod),
         "nancumsum": (mr.nancumsum, np.nancumsum), "nancumprod": (mr.nancumprod, np.nancumprod)}


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("out_dtype", [np.float64, np.float32, np.int64])
def test_scans_write_into_out_as_numpy_does(name, axis, out_dtype):
    ours, theirs = SCANS[name]
    rng = np.random.default_rng(31)
    x = (rng.standard_normal((33, 31)) + 1).astype(np.float32)
    x[3, 4] = np.nan if name.startswith("nan") else x[3, 4]
    kept = x.copy()
    shape = (x.size,) if axis is None else x.shape
    out = np.full(shape, 7, out_dtype)
    with np.errstate(all="ignore"):
        got = ours(x, axis=axis, out=out)
        # computed as without out, then cast into it (docs/numpy-keywords.md); NumPy's own out= would
        # accumulate in out's dtype
        want = theirs(x, axis=axis)
        mine = ours(x, axis=axis)
    assert got is out and np.array_equal(x, kept, equal_nan=True)
    np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-30, equal_nan=True)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(out, mine.astype(out_dtype), equal_nan=out_dtype != np.int64)


def test_scan_out_is_checked_before_any_work():
    x = np.arange(12.0).reshape(3, 4)
    with pytest.raises(ValueError, match="argument 'out' must have the shape of the result, \\(12,\\)"):
        mr.cumsum(x, out=np.empty((3, 4)))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty((3, 4))
        ro.flags.writeable = False
        mr.cumsum(x, axis=0, out=ro)
    with pytest.raises(TypeError, match="assign the result instead"):
        mr.cumsum(da.from_array(x, chunks=2), out=np.empty(12))
    out = np.empty(12)
    assert mr.cumsum(x, out=out, exact=True) is out and np.array_equal(out, np.cumsum(x))
    with pytest.raises(ValueError, match="shape of the result"):
        mr.nancumsum(x, out=np.empty(11), exact=True)
