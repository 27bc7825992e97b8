"""Hostile tests of the statistics against NumPy: the edges a first implementation gets wrong.

Each test compares values, dtypes, warnings and errors with NumPy on NumPy input and on Dask input under
several chunkings (zero-length chunks, one-element chunks, unknown sizes where they apply), and checks
that nothing the caller passed is modified. References are NumPy in float64 or exact integers.
"""

from __future__ import annotations

import math
import warnings

import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce import exact as _exact
from multireduce import statistics as _stats

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

NAN, INF = np.nan, np.inf


def _chunkings(shape):
    """A few awkward chunkings of ``shape``: whole, one element per chunk along the first axis (small
    arrays), zero-length chunks at the ends and in the middle, uneven splits."""
    out = [tuple((s,) for s in shape)]
    if shape and shape[0] <= 8:
        out.append(((1,) * shape[0] if shape[0] else (0,),) + tuple((s,) for s in shape[1:]))
    zeros = []
    for s in shape:
        half = s // 2
        zeros.append((0, half, 0, s - half, 0))
    out.append(tuple(zeros))
    out.append(tuple((1, s - 1) if s > 1 else (s,) for s in shape))
    return out


def _outcome(fn):
    """(value or exception type, RuntimeWarning messages) of ``fn()``; a dask result is computed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
            if isinstance(value, da.Array):
                value = value.compute()
        except (ValueError, TypeError) as exc:
            value = type(exc)
    messages = {str(w.message) for w in caught if w.category is RuntimeWarning
                and not str(w.message).startswith(("invalid value", "divide by zero", "overflow"))}
    return value, messages


def _same(got, ref, rtol):
    if isinstance(ref, type):
        assert got is ref, (got, ref)
        return
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.dtype.kind in "biu":
        assert np.array_equal(got, ref), (got, ref)
    elif ref.dtype.kind == "c":
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=0, equal_nan=True)
    else:
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=0, equal_nan=True)
        # inf and NaN in the same places, with the same signs
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isposinf(got), np.isposinf(ref))


def check(name, x, *, np_name=None, rtol=1e-12, chunkings=None, **kw):
    """``mr.<name>(x, **kw)`` against ``np.<np_name>(x, **kw)``: value, dtype, RuntimeWarning texts,
    error type; on ``x`` and on dask arrays of it; ``x`` left unchanged."""
    x = np.asarray(x)
    before = x.copy()
    ref, ref_msgs = _outcome(lambda: getattr(np, np_name or name)(x, **kw))
    got, msgs = _outcome(lambda: getattr(mr, name)(x, **kw))
    _same(got, ref, rtol)
    assert msgs == ref_msgs, (name, kw, msgs, ref_msgs)
    for chunks in chunkings if chunkings is not None else _chunkings(x.shape):
        d = da.from_array(x, chunks=chunks)
        got, msgs = _outcome(lambda: getattr(mr, name)(d, **kw))
        _same(got, ref, rtol)
        assert msgs == ref_msgs, (name, kw, chunks, msgs, ref_msgs)
    np.testing.assert_array_equal(x, before)


# ------------------------------------------------------------------------------------------------
# 1. nanvar/nanstd: NaN wherever the non-NaN count <= ddof, per slice
# ------------------------------------------------------------------------------------------------
RAGGED = np.array([[1.0, NAN, NAN, NAN], [1.0, 2.5, NAN, NAN], [NAN] * 4, [1.0, 2.0, 4.0, NAN], [3.0, 1.0, 4.0, 1.5]])


@pytest.mark.parametrize("name", ["nanvar", "nanstd"])
@pytest.mark.parametrize("ddof", [0, 1, 2, 3, 0.5, 2.5, -1])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_nanvar_gives_nan_where_ddof_reaches_the_non_nan_count(name, ddof, axis):
    check(name, RAGGED, ddof=ddof, axis=axis)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("ddof", [1, 2, 5, 1.5])
def test_var_with_ddof_past_count_divides_by_zero_as_numpy(name, ddof):
    # np.var divides M2 by max(n - ddof, 0): inf where M2 > 0, NaN where M2 == 0
    check(name, np.array([[1.0, 2.0], [3.0, 3.0]]), ddof=ddof, axis=1)


def test_nanvar_of_integer_input_follows_var():
    check("nanvar", np.array([[1, 5], [2, 2]], dtype=np.int32), ddof=2, axis=1)


# ------------------------------------------------------------------------------------------------
# 2. var/std of empty input, negative ddof
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd"])
@pytest.mark.parametrize("ddof", [-2, -1, -0.5, 0, 1])
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 3), 0), ((3, 0), 1), ((3, 0), None), ((2, 0), (0, 1))])
def test_moments_of_empty_input_with_any_ddof(name, ddof, shape, axis):
    check(name, np.zeros(shape), ddof=ddof, axis=axis)


# ------------------------------------------------------------------------------------------------
# 3. inf and NaN in the moments: every chunking merges them as NumPy's sums do
# ------------------------------------------------------------------------------------------------
INF_CASES = [
    [INF, 1.0, 2.0, 3.0],
    [1.0, 2.0, 3.0, INF],
    [INF, INF, 1.0, 2.0],
    [INF, -INF, 1.0, 2.0],
    [-INF, 1.0, -INF, 5.0],
    [1.0, NAN, INF, 2.0],
    [NAN, NAN, INF, 2.0],
    [INF, 1e308, 1.0, -1.0],
]


@pytest.mark.parametrize("name", ["mean", "var", "std", "nanmean", "nanvar", "nanstd"])
@pytest.mark.parametrize("values", INF_CASES, ids=range(len(INF_CASES)))
def test_moments_with_inf_merge_as_numpy_on_every_chunking(name, values):
    x = np.array(values)
    check(name, x, rtol=1e-12)
    check(name, np.stack([x, x[::-1]]), axis=1, rtol=1e-12)


# finite data near DBL_MAX whose differences or squares overflow: the variance is inf, as NumPy's is
# (where NumPy's own sum overflows as well, NumPy's mean is inf and ours exact: not these cases)
OVERFLOW_CASES = [[-1.6e308, -1.39e308], [1.7e308, -1.7e308, 1.0], [1e200, -1e200, 3.0, 1e154]]


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd"])
@pytest.mark.parametrize("values", OVERFLOW_CASES, ids=range(len(OVERFLOW_CASES)))
def test_variance_of_finite_data_that_overflows_is_inf_on_every_chunking(name, values):
    check(name, np.array(values), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_mean_of_inf_keeps_the_input_dtype(dtype):
    check("nanmean", np.array([INF, 1, NAN, 2], dtype=dtype), rtol=1e-3)
    check("var", np.array([INF, 1, 2], dtype=dtype), rtol=1e-3)


# ------------------------------------------------------------------------------------------------
# 4. axis=None scans of dask arrays: zero-length chunks, several dimensions, unknown sizes
# ------------------------------------------------------------------------------------------------
SCAN_CHUNKS = [((1, 0, 2), (3, 0, 1)), ((0, 3), (4,)), ((3,), (0, 2, 0, 2, 0)), ((1, 1, 1), (1, 1, 1, 1))]


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "nancumsum", "nancumprod"])
@pytest.mark.parametrize("chunks", SCAN_CHUNKS)
def test_flattening_scans_of_dask_arrays_with_zero_length_chunks(name, chunks):
    x = np.arange(1.0, 13.0).reshape(3, 4) / 3
    x[1, 2] = NAN
    check(name, x, rtol=1e-14, chunkings=[chunks])


@pytest.mark.parametrize("chunks", SCAN_CHUNKS)
def test_exclusive_and_exact_scans_flatten_as_numpy(chunks):
    x = np.arange(1.0, 13.0).reshape(3, 4) / 3
    d = da.from_array(x, chunks=chunks)
    flat = np.cumsum(x)
    np.testing.assert_allclose(mr.scan(d, "sum", inclusive=False).compute(), np.concatenate([[0.0], flat[:-1]]),
                               rtol=1e-14)
    assert np.array_equal(mr.cumsum(d, exact=True).compute(), mr.cumsum(x.ravel(), exact=True))
    x[1, 1] = NAN
    assert np.array_equal(mr.nancumsum(da.from_array(x, chunks=chunks), exact=True).compute(),
                          mr.nancumsum(x.ravel(), exact=True))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 2)])
def test_flattening_scans_of_empty_dask_arrays(shape):
    x = np.zeros(shape)
    d = da.from_array(x, chunks=tuple((0, s) for s in shape))
    for name in ("cumsum", "nancumsum", "cumprod"):
        got = getattr(mr, name)(d).compute()
        assert got.shape == (0,) and got.dtype == np.float64


def test_scans_of_unknown_chunk_sizes():
    x = np.arange(1.0, 8.0)
    d = da.from_array(x, chunks=3)
    d = d[d > 2]
    assert np.array_equal(mr.cumsum(d).compute(), np.cumsum(x[x > 2]))
    two = da.from_array(np.arange(6.0).reshape(2, 3), chunks=1)
    two = two[two[:, 0] >= 0]
    with pytest.raises(ValueError, match="argument 'x' has unknown chunk sizes"):
        mr.cumsum(two)
    with pytest.raises(ValueError, match="argument 'x' has unknown chunk sizes"):
        mr.cumsum(two, exact=True)


# ------------------------------------------------------------------------------------------------
# 5. nanargmax/nanargmin: NaN as -inf/+inf, first occurrence wins, on every chunking
# ------------------------------------------------------------------------------------------------
ARG_CASES = [
    [NAN, -INF],
    [NAN, INF],
    [-INF, NAN, -INF],
    [NAN, NAN, -INF, 1.0],
    [1.0, NAN, 1.0],
    [NAN, 2.0, NAN, 2.0],
    [NAN, NAN],
    [NAN],
    [INF, NAN, INF, -INF],
]


@pytest.mark.parametrize("name", ["nanargmax", "nanargmin", "argmax", "argmin"])
@pytest.mark.parametrize("values", ARG_CASES, ids=range(len(ARG_CASES)))
def test_arg_rules_on_every_chunking(name, values):
    x = np.array(values)
    check(name, x)
    check(name, np.stack([x, x[::-1]]), axis=1)
    check(name, np.stack([x, x[::-1]]).T, axis=0)


@pytest.mark.parametrize("name", ["nanargmax", "nanargmin"])
def test_nanarg_all_nan_slice_raises_even_when_another_slice_is_fine(name):
    x = np.array([[1.0, NAN], [NAN, NAN]])
    check(name, x, axis=1)
    check(name, x, axis=0)


# ------------------------------------------------------------------------------------------------
# 6. exact=True: empty input, and the same checks and messages as the plain path
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 3), None), ((3, 0), None), ((0, 3), 0), ((3, 0), 1),
                                         ((2, 0), 0)])
@pytest.mark.parametrize("name", ["cumsum", "nancumsum"])
def test_exact_scans_of_empty_input(name, shape, axis):
    x = np.zeros(shape)
    got = getattr(mr, name)(x, axis=axis, exact=True)
    ref = getattr(np, name)(x, axis=axis)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    d = da.from_array(x, chunks=tuple((0, s) for s in shape))
    got = getattr(mr, name)(d, axis=axis, exact=True).compute()
    assert got.shape == ref.shape and got.dtype == ref.dtype


BAD_REDUCTION_ARGS = [
    {"axis": 2}, {"axis": -3}, {"axis": 0.0}, {"axis": (0, 0)}, {"axis": True}, {"keepdims": 1},
    {"dtype": "not-a-dtype"}, {"dtype": np.float64, "split_every": 1}, {"split_every": {0: 0}},
    {"compute": "yes"}, {"algorithm": 3},
]
BAD_SCAN_ARGS = [{"axis": 2}, {"axis": (0,)}, {"axis": 1.0}, {"dtype": "not-a-dtype"}, {"split_every": 1}, {"algorithm": 3}]


def _error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type and text are what is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("kw", BAD_REDUCTION_ARGS, ids=str)
def test_exact_reductions_refuse_what_the_plain_path_refuses_with_its_message(name, kw):
    x = np.ones((2, 3))
    plain = _error(lambda: getattr(mr, name)(x, **kw))
    assert plain is not None
    assert _error(lambda: getattr(mr, name)(x, exact=True, **kw)) == plain
    assert _error(lambda: getattr(mr, name)(da.from_array(x), exact=True, **kw)) == plain


@pytest.mark.parametrize("kw", BAD_SCAN_ARGS, ids=str)
def test_exact_cumsum_refuses_what_the_plain_path_refuses_with_its_message(kw):
    x = np.ones((2, 3))
    plain = _error(lambda: mr.cumsum(x, **kw))
    assert plain is not None
    exact = _error(lambda: mr.cumsum(x, exact=True, **kw))
    if "algorithm" in kw:  # the exact path has no kernel choice: it names the argument and the value
        assert exact[0] is TypeError and "argument 'algorithm'" in exact[1]
    else:
        assert exact == plain


def test_exact_refuses_a_kernel_choice_and_bad_dtypes_naming_them():
    with pytest.raises(ValueError, match=r"multireduce\.sum: argument 'algorithm' is 'blelloch'.*exact=True"):
        mr.sum(np.ones(3), exact=True, algorithm="blelloch")
    with pytest.raises(TypeError, match=r"multireduce\.nansum: argument 'dtype' is float128"):
        mr.nansum(np.ones(3), dtype=np.longdouble, exact=True)
    with pytest.raises(TypeError, match=r"multireduce\.cumsum: argument 'exact' must be True or False"):
        mr.cumsum(np.ones(3), exact="yes")


@pytest.mark.parametrize("name", ["nansum", "nancumsum"])
def test_exact_nan_family_counts_nan_as_zero_on_every_chunking(name):
    x = np.array([0.1, NAN, 1e16, NAN, -1e16, 0.2, INF, NAN])
    for cut in (3, 8):
        ref = getattr(np, name)(x[:cut].astype(object).astype(np.float64))
        got = getattr(mr, name)(x[:cut], exact=True)
        for chunks in _chunkings((cut,)):
            d = getattr(mr, name)(da.from_array(x[:cut], chunks=chunks), exact=True).compute()
            assert np.array_equal(d, got, equal_nan=True)
        if cut == 3:  # the exact sum of [0.1, 1e16] is representable exactly after rounding once
            assert np.array_equal(np.asarray(got), np.asarray(ref))
    assert np.isposinf(mr.nansum(x, exact=True))


# ------------------------------------------------------------------------------------------------
# 7. argument checks run before the NaN-masking copy
# ------------------------------------------------------------------------------------------------
def _no_work(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@pytest.mark.parametrize("call", [
    lambda x: mr.nansum(x, axis=5, dtype=np.int64),
    lambda x: mr.nansum(x, keepdims=2, dtype=np.int64),
    lambda x: mr.nanprod(x, axis=(0, 0), dtype=np.int64),
    lambda x: mr.nancumsum(x, axis=(0,), dtype=np.int64),
    lambda x: mr.nancumprod(x, axis=7, dtype=np.int64),
    lambda x: mr.nansum(x, axis=5, exact=True),
    lambda x: mr.nansum(x, split_every=1, exact=True),
    lambda x: mr.nancumsum(x, axis=5, exact=True),
    lambda x: mr.nanmean(x, axis=5),
    lambda x: mr.nanvar(x, axis=5),
    lambda x: mr.nanargmax(x, axis=(0, 1)),
    lambda x: mr.nanmax(x, axis=5),
])
def test_bad_arguments_fail_before_any_work(monkeypatch, call):
    monkeypatch.setattr(_stats, "_nan_to", _no_work)
    monkeypatch.setattr(_exact, "state_of", _no_work)
    monkeypatch.setattr(_exact, "_cumsum_block", _no_work)
    monkeypatch.setattr(np, "where", _no_work)
    x = np.full((4, 4), NAN)
    with pytest.raises((ValueError, TypeError)) as info:
        call(x)
    assert "argument" in str(info.value)


# ------------------------------------------------------------------------------------------------
# 8. segment offsets: every integer dtype, and clear errors naming `offsets`
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("name", ["segment_reduce", "segment_scan"])
def test_offsets_of_every_integer_dtype(dtype, name):
    x = np.arange(1.0, 34.0)
    offsets = np.array([0, 3, 3, 31, 33], dtype=dtype)
    before = offsets.copy()
    ref = getattr(mr, name)(x, offsets.astype(np.int64))
    assert np.array_equal(getattr(mr, name)(x, offsets), ref)
    assert np.array_equal(getattr(mr, name)(da.from_array(x, chunks=((0, 5, 0, 28),)), offsets).compute(), ref)
    assert np.array_equal(offsets, before)
    if name == "segment_reduce":  # by hand: [0:3], the empty [3:3], [3:31], [31:33], the empty [33:]
        assert ref.tolist() == [x[0:3].sum(), 0.0, x[3:31].sum(), x[31:33].sum(), 0.0]


@pytest.mark.parametrize("offsets, message", [
    (np.array([0, 2**63], dtype=np.uint64), "from 0 to 9223372036854775808"),
    (np.array([0, 2**64 - 1], dtype=np.uint64), "from 0 to 18446744073709551615"),
    (np.array([3, 1], dtype=np.uint64), "from 1 to 3, not ascending"),
    (np.array([3, 1], dtype=np.uint8), "from 1 to 3, not ascending"),
    (np.array([0, 4, 2]), "from 0 to 4, not ascending"),
    (np.array([-1, 2], dtype=np.int8), "from -1 to 2"),
    (np.array([0, 6]), "from 0 to 6"),
])
@pytest.mark.parametrize("name", ["segment_reduce", "segment_scan"])
def test_offsets_out_of_range_or_descending_name_offsets_and_the_given_values(offsets, message, name):
    for x in (np.arange(5.0), da.from_array(np.arange(5.0), chunks=2)):
        with pytest.raises(ValueError, match=rf"multireduce\.{name}: argument 'offsets' must be ascending start "
                                             rf"offsets in \[0, 5\]; got values {message}$"):
            getattr(mr, name)(x, offsets)


@pytest.mark.parametrize("offsets", [np.array([0.0, 2.0]), np.array([True, False]), np.array([[0, 2]]), 3,
                                     [0, 2**70], [0, 2**63], ["0"]])
def test_offsets_that_are_not_integers_name_offsets(offsets):
    with pytest.raises(TypeError, match=r"argument 'offsets' must be a 1-D array of integers"):
        mr.segment_reduce(np.arange(5.0), offsets)


# ------------------------------------------------------------------------------------------------
# 9. nanmean of integers is mean, bit for bit on NumPy input
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("n", [0, 1, 31, 33, 1023, 1025])
def test_nanmean_of_integers_equals_numpy(dtype, n):
    rng = np.random.default_rng(n)
    if dtype is np.bool_:
        x = rng.random(n) < 0.3
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    got, msgs = _outcome(lambda: mr.nanmean(x))
    ref, ref_msgs = _outcome(lambda: np.nanmean(x))
    assert np.asarray(got).dtype == np.float64
    assert msgs == ref_msgs
    assert np.array_equal(got, ref, equal_nan=True)  # the same float64 sum, divided once
    if n:
        check("nanmean", x, rtol=1e-13)
        check("nanmean", x.reshape(1, n), axis=1, keepdims=True, dtype=np.float32, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# More of the same classes: keepdims and axis tuples, float16, bool, wide integers, 0-d input
# ------------------------------------------------------------------------------------------------
MOMENT_NAMES = ["var", "std", "nanvar", "nanstd", "nanmean", "mean"]


# _chunkings((3, 4, 5)) holds 125 chunks (empty ones around each half on every axis); here each axis has
# one empty chunk, at its start, middle or end (18 chunks), beside the whole array, one row per chunk and
# uneven splits
AXIS_CHUNKINGS = [((3,), (4,), (5,)), ((1, 1, 1), (4,), (5,)), ((0, 1, 2), (2, 0, 2), (5, 0)), ((1, 2), (1, 3), (1, 4))]


@pytest.mark.parametrize("name", MOMENT_NAMES)
@pytest.mark.parametrize("axis", [None, 0, 2, (0, 2), (2, 0), (-1, -2), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_axis_tuples_and_keepdims(name, axis, keepdims):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5))
    x[0, 1, :] = NAN
    x[2, :, 3] = NAN
    if not name.startswith("nan"):
        x = np.nan_to_num(x, nan=0.5)
    ddof = {"ddof": 1} if "var" in name or "std" in name else {}
    check(name, x, axis=axis, keepdims=keepdims, rtol=1e-12, chunkings=AXIS_CHUNKINGS, **ddof)


@pytest.mark.parametrize("name", MOMENT_NAMES + ["nansum", "nanprod", "nanmax", "nanmin", "nanargmax", "argmin",
                                                 "count_nonzero", "any", "all"])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint64, np.float16, np.float32])
def test_dtypes_of_results(name, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((31, 3)) * 4).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[5, 1] = NAN
    # NumPy sums float16 in float16 steps (nanmean, nansum): ours are float32 or float64, a few float16 ulps off
    rtol = {np.float16: 1e-2, np.float32: 1e-5}.get(dtype, 1e-12)
    if name == "nanprod" and np.dtype(dtype).kind != "b":
        x = np.where(np.abs(x.astype(np.float64)) > 2, 1, x).astype(dtype)  # no overflow past float16
    check(name, x, axis=0, rtol=rtol)


@pytest.mark.parametrize("name", ["nansum", "nanprod", "nancumsum", "nancumprod"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32, np.bool_])
def test_integer_nan_family_widens_and_wraps_as_numpy(name, dtype):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    x = (rng.random(33) < 0.5) if info is None else rng.integers(info.min, info.max, 33, dtype=dtype, endpoint=True)
    check(name, x)
    check(name, x, dtype=np.int8 if dtype is not np.uint32 else np.uint16)


@pytest.mark.parametrize("value", [np.float64(3.0), np.array(NAN), np.array(2, dtype=np.int8), np.array(True),
                                   np.array(-INF, dtype=np.float32)])
@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanmean", "mean", "argmax", "nanargmax", "nanargmin",
                                  "nanmax", "cumsum", "nancumsum", "nansum", "count_nonzero", "any", "all"])
def test_zero_dimensional_input(name, value):
    check(name, value, chunkings=[()])


def test_ddof_and_flags_are_checked_with_their_names():
    with pytest.raises(TypeError, match=r"multireduce\.var: argument 'ddof' must be a finite real number"):
        mr.var(np.ones(3), ddof=np.nan)
    with pytest.raises(TypeError, match=r"multireduce\.nanstd: argument 'ddof'"):
        mr.nanstd(np.ones(3), ddof="1")
    with pytest.raises(TypeError, match=r"multireduce\.nanmean: argument 'dtype' is int64"):
        mr.nanmean(np.ones(3), dtype=np.int64)
    with pytest.raises(TypeError, match=r"multireduce\.nanmean: argument 'keepdims'"):
        mr.nanmean(np.ones(3, dtype=np.int64), keepdims=None)


@pytest.mark.parametrize("name", ["argmax", "nanargmax", "nansum", "nancumsum", "nanprod", "nanmax"])
def test_complex_input_is_a_clear_type_error_where_unsupported(name):
    with pytest.raises(TypeError, match=rf"multireduce\.{name}: argument 'x' has dtype complex128"):
        getattr(mr, name)(np.array([1 + 1j, 2]))


@pytest.mark.parametrize("name", ["sum", "mean", "cumsum", "prod", "any", "count_nonzero"])
def test_complex_input_where_supported(name):
    x = np.array([1 + 2j, 3 - 1j, 0.5j, 2.0])
    check(name, x, rtol=1e-14)


_Z = np.random.default_rng(2).standard_normal((7, 5)) + 1j * np.random.default_rng(3).standard_normal((7, 5))
_ZN = _Z.copy()
_ZN[1, 2] = complex(NAN, 1.0)
_ZN[3, :] = NAN


@pytest.mark.parametrize("name", ["var", "std", "nanvar", "nanstd", "nanmean"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("data", [_Z, _ZN], ids=["plain", "nan"])
def test_complex_moments(name, dtype, axis, data):
    kw = {} if name == "nanmean" else {"ddof": 1}
    check(name, data.astype(dtype), axis=axis, rtol=1e-5 if dtype == np.complex64 else 1e-12, **kw)


def test_complex_moments_of_ill_conditioned_and_infinite_data():
    check("var", np.array([1e8 + 1j, 1e8 + 2j, 1e8 - 1j, 1e8 + 0.5j]), rtol=1e-9)
    check("var", np.array([complex(INF, 1.0), 1j]))
    check("nanmean", np.array([complex(INF, 1.0), 1j, NAN]))


def test_nothing_passed_is_modified_by_the_nan_family():
    x = np.array([[1.0, NAN, 3.0], [NAN, NAN, 2.0]])
    before = x.copy()
    for fn in (mr.nansum, mr.nanprod, mr.nancumsum, mr.nancumprod):
        fn(x, dtype=np.int64)
        fn(x)
    mr.nansum(x, exact=True)
    mr.nancumsum(x, exact=True)
    np.testing.assert_array_equal(x, before)


def test_moments_on_large_awkward_sizes_against_float64_references():
    rng = np.random.default_rng(1)
    for n in (1023, 1025, 4097):
        x = 1e6 + rng.standard_normal(n)
        x[rng.integers(0, n, 9)] = NAN
        for name in ("nanvar", "nanstd", "nanmean"):
            check(name, x, ddof=1, rtol=1e-9) if name != "nanmean" else check(name, x, rtol=1e-12)
    assert math.isfinite(float(mr.var(np.arange(10.0))))


_X = np.random.default_rng(0).standard_normal((5, 6))
MISC = [
    ("argmax", _X, dict(axis=None, keepdims=True)), ("argmax", _X, dict(axis=1, keepdims=True)),
    ("nanargmin", _X, dict(axis=0, keepdims=True)), ("var", _X.astype(np.float32), dict(dtype=np.float64, axis=0)),
    ("std", np.arange(30).reshape(5, 6), dict(dtype=np.float64, axis=1)), ("var", _X, dict(ddof=np.int64(1))),
    ("var", _X, dict(ddof=np.float32(0.5))), ("var", np.array([2**62, -2**62, 7], np.int64), {}),
    ("var", np.array([2**63, 2**64 - 1], np.uint64), {}), ("mean", np.array([[True, False]]), dict(axis=0)),
    ("nanmax", np.array([[NAN, 1.0], [NAN, NAN]]), dict(axis=1)), ("nanmin", np.array([INF, NAN]), {}),
    ("nanmax", np.array([-INF, NAN]), {}), ("nanmax", np.array([NAN, NAN], np.float32), {}),
    ("nanmin", np.zeros((0, 3)), dict(axis=1)), ("nanmin", np.zeros((0, 3)), dict(axis=0)),
    ("argmax", np.zeros((0, 3)), dict(axis=1)), ("argmax", np.zeros((0, 3)), dict(axis=0)),
    ("nanargmax", np.zeros((3, 0)), dict(axis=0)), ("any", np.zeros((0, 3)), dict(axis=0)),
    ("all", np.array([NAN, 0.0]), {}), ("count_nonzero", np.array([[NAN, 0.0]]), dict(axis=(0, 1))),
    ("nanprod", np.array([NAN, NAN]), {}), ("nancumprod", np.array([[NAN, 2.0], [3.0, NAN]]), dict(axis=0)),
    ("nansum", np.array([INF, -INF, NAN]), {}), ("nansum", np.array([1, 2], np.uint8), dict(dtype=np.float16)),
    ("nancumsum", np.array([[1.0, NAN], [2.0, 3.0]]), dict(axis=1, dtype=np.int32)),
    ("nansum", np.array([[1.5, NAN], [2.5, 3.0]]), dict(axis=1, dtype=np.int32)),
    ("nansum", np.array([[1.5, NAN], [2.5, 3.0]]), dict(dtype=bool)),
    ("nanvar", np.array([[1.5, NAN], [2.5, 3.0]]), dict(axis=0, ddof=1, keepdims=True)),
    ("std", np.array([1e154, -1e154, 3e154]), {}), ("var", np.array([1e200, 1e200]), {}),
    ("mean", np.full(3, 65504, np.float16), {}),
]


@pytest.mark.parametrize("name, x, kw", MISC, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(MISC)])
def test_more_edges(name, x, kw):
    check(name, x, **kw)


@pytest.mark.parametrize("name", ["var", "nanvar", "nanmean", "nanstd", "nanmax", "nansum", "count_nonzero"])
def test_reductions_of_unknown_chunk_sizes(name):
    x = np.array([3.0, NAN, 1.0, INF, 2.0, -1.0, NAN, 5.0])
    d = da.from_array(x, chunks=3)
    d = d[d != 2.0]  # unknown sizes, one chunk may come out empty
    kept = x[x != 2.0]
    got, msgs = _outcome(lambda: getattr(mr, name)(d))
    ref, ref_msgs = _outcome(lambda: getattr(np, name)(kept))
    _same(got, ref, 1e-12)
    assert msgs == ref_msgs


def test_arg_of_unknown_chunk_sizes_is_refused_naming_x():
    d = da.from_array(np.arange(6.0), chunks=2)
    with pytest.raises(ValueError, match=r"multireduce\.nanargmax: argument 'x' has unknown chunk sizes"):
        mr.nanargmax(d[d > 1])
