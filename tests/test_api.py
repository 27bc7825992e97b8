"""The public API on NumPy input against NumPy itself: every op x dtype x axis x keepdims, NumPy's
dtype rules, empty inputs, NaN/inf, overflow, errors, user operators (a non-commutative one too)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import multireduce as mr

from .helpers import (
    ALL_DTYPES, MATMUL_IDENTITY, assert_matches, matmul_operator, random_array, random_matrices, reference_reduce,
    sequential_fold, sequential_scan,
)

SHAPES_AXES = [
    ((0,), None), ((1,), None), ((31,), 0), ((1025,), None), ((33, 17), None), ((33, 17), 0), ((33, 17), 1),
    ((33, 17), (0, 1)), ((33, 17), -1), ((4, 5, 6), None), ((4, 5, 6), (0, 2)), ((4, 5, 6), 1), ((4, 5, 6), (1, 2)),
    ((0, 7), 1), ((7, 0), 0),
]
REDUCTIONS = ["sum", "prod", "min", "max", "mean"]


def _numpy(opname, x, axis, keepdims):
    return getattr(np, opname)(x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axis", SHAPES_AXES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opname", REDUCTIONS)
def test_reductions_match_numpy(opname, dtype, shape, axis, keepdims):
    x = random_array(np.random.default_rng(0), shape, dtype, opname)
    before = x.copy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = _numpy(opname, x, axis, keepdims)
    except ValueError:
        with pytest.raises(ValueError, match="zero-size array"):
            getattr(mr, opname)(x, axis=axis, keepdims=keepdims)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = getattr(mr, opname)(x, axis=axis, keepdims=keepdims)
    np.testing.assert_array_equal(x, before)  # nothing the user passed is modified
    assert type(got) is type(expected) or (np.isscalar(got) and np.isscalar(expected))
    expected = np.asarray(expected)
    if x.size == 0 or expected.size == 0:
        np.testing.assert_array_equal(np.asarray(got), expected)
        assert np.asarray(got).dtype == expected.dtype
        return
    ref, mass = reference_reduce(x, opname, axis=axis, keepdims=keepdims)
    acc = np.float32 if expected.dtype == np.float16 else expected.dtype
    n = x.size // max(expected.size, 1)
    assert_matches(got, ref, mass, acc, expected.dtype, n, f"{opname} {np.dtype(dtype)} {shape} axis={axis}",
                   product=opname == "prod")


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opname", ["cumsum", "cumprod"])
def test_scans_match_numpy(opname, dtype, axis):
    x = random_array(np.random.default_rng(1), (23, 37), dtype, "prod" if opname == "cumprod" else "sum")
    expected = getattr(np, opname)(x, axis=axis)
    got = getattr(mr, opname)(x, axis=axis)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype.kind != "f":
        np.testing.assert_array_equal(got, expected)
    else:
        wide = getattr(np, opname)(x.astype(np.float64), axis=axis)
        mass = np.cumsum(np.abs(x.astype(np.float64)), axis=axis) if opname == "cumsum" else np.abs(wide)
        acc = np.float32 if expected.dtype == np.float16 else expected.dtype
        assert_matches(got, wide, mass, acc, expected.dtype, x.size, opname, product=opname == "cumprod")


@pytest.mark.parametrize("inclusive", [True, False])
@pytest.mark.parametrize("opname", ["sum", "prod", "min", "max"])
def test_scan_inclusive_and_exclusive(opname, inclusive):
    x = random_array(np.random.default_rng(2), 1000, np.int64, opname)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[opname]
    inc = ufunc.accumulate(x)
    got = mr.scan(x, opname, inclusive=inclusive)
    if inclusive:
        np.testing.assert_array_equal(got, inc)
    else:
        from multireduce.operators import get_operator

        assert got[0] == get_operator(opname).identity(np.int64)
        np.testing.assert_array_equal(got[1:], inc[:-1])


def test_numpy_dtype_rules():
    for dtype in ALL_DTYPES:
        x = np.ones(3, dtype=dtype)
        assert mr.sum(x).dtype == np.sum(x).dtype
        assert mr.prod(x).dtype == np.prod(x).dtype
        assert mr.min(x).dtype == np.min(x).dtype
        assert mr.mean(x).dtype == np.mean(x).dtype
        assert mr.cumsum(x).dtype == np.cumsum(x).dtype
    x = np.arange(10, dtype=np.int32)
    assert mr.sum(x, dtype=np.float32).dtype == np.float32
    assert mr.mean(x, dtype=np.float32).dtype == np.float32
    assert mr.cumsum(x, dtype=np.int16).dtype == np.int16
    assert mr.sum(np.array([True, True, False])) == 2  # bool sums count


def test_float16_accumulates_in_float32():
    x = np.full(10_000, 0.1, dtype=np.float16)
    exact = 10_000 * float(np.float16(0.1))
    assert abs(float(mr.sum(x)) - exact) < abs(float(np.sum(x, dtype=np.float16)) - exact) or \
        abs(float(mr.sum(x)) - exact) <= exact * 2**-10
    assert mr.sum(x).dtype == np.float16


def test_empty_inputs_follow_numpy():
    for dtype in [np.int32, np.float64, np.bool_]:
        e = np.zeros(0, dtype=dtype)
        assert mr.sum(e) == 0 and mr.sum(e).dtype == np.sum(e).dtype
        assert mr.prod(e) == 1
        for op in (mr.min, mr.max):
            with pytest.raises(ValueError, match="zero-size array to reduction operation"):
                op(e)
        assert mr.cumsum(e).shape == (0,)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(mr.mean(np.zeros(0)))


def test_nan_inf_and_overflow_follow_numpy():
    x = np.array([1.0, np.nan, -np.inf, 3.0])
    assert np.isnan(mr.min(x)) and np.isnan(mr.max(x)) and np.isnan(mr.sum(x))
    y = np.array([1.0, np.inf, 2.0])
    assert mr.max(y) == np.inf and mr.sum(y) == np.inf and mr.min(-y) == -np.inf
    assert np.isnan(mr.sum(np.array([np.inf, -np.inf])))
    big = np.full(4, np.iinfo(np.int64).max, dtype=np.int64)
    assert mr.sum(big) == np.sum(big)  # wraps, as NumPy does
    np.testing.assert_array_equal(mr.cumsum(big), np.cumsum(big))


# ------------------------------------------------------------------------------------------------
# Bad input: clear errors, before any work
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x,op,match,exc", [
    (np.array(["a", "b"]), "sum", r"argument 'x' has dtype <U1; expected a boolean", TypeError),
    (np.array([1, 2], dtype=object), "sum", "argument 'x' has dtype object", TypeError),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), "max", "argument 'x' has dtype datetime64", TypeError),
    (np.ones(3, dtype=np.complex64), "min", "argument 'x' has dtype complex64; expected a boolean, signed", TypeError),
    (np.ones(3), "median", "argument 'op' must be one of", ValueError),
])
def test_bad_dtype_and_op(x, op, match, exc):
    with pytest.raises(exc, match=match):
        mr.reduce(x, op)


def test_complex_where_it_has_meaning():
    z = np.array([1 + 2j, 3 - 1j], dtype=np.complex128)
    assert mr.sum(z) == np.sum(z) and mr.prod(z) == np.prod(z)
    np.testing.assert_array_equal(mr.cumsum(z), np.cumsum(z))


def test_bad_arguments_name_themselves():
    x = np.ones((3, 4))
    with pytest.raises(np.exceptions.AxisError, match="argument 'axis'.*axis 2 is out of bounds"):
        mr.sum(x, axis=2)
    with pytest.raises(ValueError, match="argument 'axis' repeats an axis; got \\(0, 0\\)"):
        mr.sum(x, axis=(0, 0))
    with pytest.raises(TypeError, match="argument 'axis' must be None, an int or a tuple of ints; got 1.5"):
        mr.sum(x, axis=1.5)
    with pytest.raises(TypeError, match="argument 'axis' must be None or an int for a scan"):
        mr.cumsum(x, axis=(0, 1))
    with pytest.raises(TypeError, match="argument 'keepdims' must be True or False; got 'yes'"):
        mr.sum(x, keepdims="yes")
    with pytest.raises(TypeError, match="argument 'dtype' must be a NumPy dtype; got 'nonsense'"):
        mr.sum(x, dtype="nonsense")
    with pytest.raises(TypeError, match="argument 'dtype' is <U3"):
        mr.sum(x, dtype="U3")
    with pytest.raises(ValueError, match="argument 'algorithm' must be one of 'auto'"):
        mr.sum(x, algorithm="fastest")
    with pytest.raises(ValueError, match="argument 'algorithm' is 'interleaved', a GPU kernel, but 'x' holds NumPy"):
        mr.sum(x, algorithm="interleaved")
    with pytest.raises(TypeError, match="argument 'inclusive' must be True or False"):
        mr.scan(x, "sum", inclusive=None)
    with pytest.raises(TypeError, match="argument 'x' is a masked array"):
        mr.sum(np.ma.masked_array([1, 2], mask=[0, 1]))


def test_array_likes_and_scalars():
    assert mr.sum([1, 2, 3]) == 6
    assert mr.max(7) == 7
    assert mr.sum(np.float32(2.5)) == np.float32(2.5)


# ------------------------------------------------------------------------------------------------
# User operators
# ------------------------------------------------------------------------------------------------
def test_register_operator_validates():
    with pytest.raises(TypeError, match="argument 'identity' is required"):
        mr.register_operator("noid", identity=None, cpu=np.add, commutative=True)
    with pytest.raises(ValueError, match="argument 'name' is 'sum', a built-in operator"):
        mr.register_operator("sum", identity=0, cpu=np.add, commutative=True)
    with pytest.raises(ValueError, match="must be a Python identifier"):
        mr.register_operator("no spaces", identity=0, cpu=np.add, commutative=True)
    with pytest.raises(TypeError, match="argument 'cpu' must be a NumPy ufunc or a callable"):
        mr.register_operator("nocpu", identity=0, cpu=3, commutative=True)
    with pytest.raises(TypeError, match="argument 'commutative' must be True or False"):
        mr.register_operator("nocomm", identity=0, cpu=np.add, commutative="yes")
    mr.register_operator("xor_once", identity=0, cpu=np.bitwise_xor, commutative=True, kinds="biu", replace=True)
    with pytest.raises(ValueError, match="already registered"):
        mr.register_operator("xor_once", identity=0, cpu=np.bitwise_xor, commutative=True, kinds="biu")
    assert "xor_once" in mr.operators()
    mr.unregister_operator("xor_once")
    assert "xor_once" not in mr.operators()


def test_user_ufunc_operator():
    mr.register_operator("bxor", identity=0, cpu=np.bitwise_xor, cuda="a ^ b", commutative=True, kinds="biu", replace=True)
    x = random_array(np.random.default_rng(3), (50, 40), np.uint32)
    assert mr.reduce(x, "bxor") == np.bitwise_xor.reduce(x, axis=None)
    np.testing.assert_array_equal(mr.reduce(x, "bxor", axis=1), np.bitwise_xor.reduce(x, axis=1))
    np.testing.assert_array_equal(mr.scan(x, "bxor", axis=0), np.bitwise_xor.accumulate(x, axis=0))
    with pytest.raises(TypeError, match="expected a unsigned integer dtype|expected a"):
        mr.reduce(np.ones(3, dtype=np.complex64), "bxor")


@pytest.mark.parametrize("n", [0, 1, 2, 31, 33, 1023, 1025])
def test_noncommutative_operator_keeps_order(n):
    op = matmul_operator()
    x = random_matrices(np.random.default_rng(n), n)
    assert int(mr.reduce(x, op)) == sequential_fold(x)
    np.testing.assert_array_equal(mr.scan(x, op), sequential_scan(x))
    exclusive = mr.scan(x, op, inclusive=False)
    if n:
        assert exclusive[0] == MATMUL_IDENTITY
        np.testing.assert_array_equal(exclusive[1:], sequential_scan(x)[:-1])
    if n > 1:
        assert sequential_fold(x[::-1]) != sequential_fold(x)  # the check can fail


def test_noncommutative_multi_axis_is_c_order():
    op = matmul_operator()
    x = random_matrices(np.random.default_rng(4), 6 * 5 * 4).reshape(6, 5, 4)
    assert int(mr.reduce(x, op)) == sequential_fold(x.ravel())
    got = mr.reduce(x, op, axis=(0, 2))
    expected = [sequential_fold(x[:, j, :].ravel()) for j in range(5)]
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.uint64))
    assert mr.reduce(x, op, axis=(0, 2), keepdims=True).shape == (1, 5, 1)


# ------------------------------------------------------------------------------------------------
# The cached whole-array path (calls with every option at its default)
# ------------------------------------------------------------------------------------------------
def test_repeated_default_calls_use_the_cached_plan_and_agree():
    from multireduce import api
    from multireduce.operators import get_operator

    rng = np.random.default_rng(3)
    for dtype in [np.float16, np.float32, np.int8, np.int64, np.uint32, np.bool_]:
        for fn, opname in [(mr.sum, "sum"), (mr.prod, "prod"), (mr.min, "min"), (mr.max, "max")]:
            x = random_array(rng, 1000, dtype, "prod" if opname == "prod" else "sum")
            before = x.copy()
            first = fn(x)
            plan = api._default_plans[(np.ndarray, f"multireduce.{opname}", get_operator(opname), x.dtype, 1)]
            assert (np.ndarray, x.dtype) in plan._launchers  # the plan bound itself to NumPy once
            second = fn(x)
            np.testing.assert_array_equal(x, before)
            assert type(second) is type(first) and second.dtype == first.dtype
            assert second == first or (np.isnan(first) and np.isnan(second))
            ref = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[opname](x)
            assert second.dtype == ref.dtype and (second == ref or np.isnan(ref))
            # what the cached path does not take goes the general way: empty input keeps NumPy's rules
            empty = np.empty(0, dtype)
            if opname in ("min", "max"):
                with pytest.raises(ValueError, match="zero-size array"):
                    fn(empty)
            else:
                assert fn(empty) == {"sum": np.sum, "prod": np.prod}[opname](empty)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(mr.mean(np.empty(0, np.float32)))


def test_mean_takes_the_cached_plan_with_the_general_paths_bits():
    """mean with the defaults binds a launcher too (sum, then one division by the count in the
    accumulator's division type): the same bits and types as the general path (every axis spelled
    out) and as numpy.mean, for every dtype, N-D input and awkward sizes."""
    from multireduce import api
    from multireduce.operators import get_operator

    rng = np.random.default_rng(11)
    for dtype in [np.float16, np.float32, np.float64, np.int8, np.int64, np.uint32, np.bool_]:
        for n in (1, 31, 1025, 4099):
            x = random_array(rng, n, dtype, "sum")
            for shape in [(n,), (1, n, 1)]:
                y = x.reshape(shape)
                first, second = mr.mean(y), mr.mean(y)
                plan = api._default_plans[(np.ndarray, "multireduce.mean", get_operator("sum"), y.dtype, y.ndim)]
                assert (np.ndarray, y.dtype) in plan._launchers
                general = mr.mean(y, axis=tuple(range(y.ndim)))
                for got in (first, second):
                    assert type(got) is type(general) and got.dtype == general.dtype
                    np.testing.assert_array_equal(got, general)
                    assert got.dtype == np.mean(y).dtype
                np.testing.assert_allclose(float(first), float(np.mean(y.astype(np.float64))), rtol=2e-3, atol=1e-3)


def test_cached_plan_follows_a_replaced_operator_and_options():
    x = np.arange(1, 9, dtype=np.int64)
    mr.register_operator("pick", identity=0, cpu=np.add, commutative=True, replace=True)
    try:
        assert mr.reduce(x, "pick") == 36 and mr.reduce(x, "pick") == 36
        mr.register_operator("pick", identity=0, cpu=np.bitwise_xor, commutative=True, kinds="biu", replace=True)
        assert mr.reduce(x, "pick") == np.bitwise_xor.reduce(x) and mr.reduce(x, "pick") == np.bitwise_xor.reduce(x)
        # a callable operator (no ufunc) has no one-step launcher: its cached plan folds pairwise
        mr.register_operator("pick", identity=np.iinfo(np.int64).min, cpu=lambda a, b: np.maximum(a, b), commutative=True, kinds="i",
                             replace=True)
        assert mr.reduce(x, "pick") == 8 and mr.reduce(x, "pick") == 8
    finally:
        mr.unregister_operator("pick")
    with pytest.raises(ValueError, match="argument 'op'"):
        mr.reduce(x, "pick")
    assert mr.sum(x) == 36 and mr.sum(x, dtype=np.int8) == 36 and mr.sum(x, keepdims=True).shape == (1,)
    assert mr.sum([1, 2, 3]) == 6 and mr.sum(np.float32(2.5)) == np.float32(2.5)
    with pytest.raises(TypeError, match="argument 'x' has dtype"):
        mr.sum(np.array(["a"]))


def test_plans_pickle_without_their_binding():
    import pickle

    from multireduce import api
    from multireduce.operators import get_operator

    x = np.random.default_rng(8).standard_normal(33)
    assert mr.sum(x) == mr.sum(x)
    plan = api._default_plans[(np.ndarray, "multireduce.sum", get_operator("sum"), x.dtype, 1)]
    assert plan._launchers
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.axes == plan.axes and copy.op.name == "sum" and copy._launchers == {}
    assert copy(x) == plan(x) == np.add.reduce(x)


def test_unhashable_operator_is_refused_by_name():
    with pytest.raises(ValueError, match="argument 'op'"):
        mr.reduce(np.arange(3), ["sum"])


# ------------------------------------------------------------------------------------------------
# Exclusive scans' length, big-endian input, narrow dtype=, misaligned input
# ------------------------------------------------------------------------------------------------
def _exclusive_reference(x, axis, ufunc):
    """np.ufunc.accumulate shifted right by one along ``axis``, starting from the identity."""
    moved = np.moveaxis(x, axis, 0)
    out = np.empty(moved.shape, dtype=ufunc.accumulate(moved[:1] if moved.shape[0] else moved, axis=0).dtype)
    if moved.shape[0]:
        out[0] = ufunc.identity
        out[1:] = ufunc.accumulate(moved, axis=0)[:-1]
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("shape", [(0,), (1,), (31,), (33,), (1025,), (0, 5), (5, 0), (4, 0, 3), (7, 6)], ids=str)
@pytest.mark.parametrize("opname,ufunc", [("sum", np.add), ("prod", np.multiply)])
def test_exclusive_scan_has_the_input_length_on_every_axis(shape, opname, ufunc):
    import dask.array as da

    x = random_array(np.random.default_rng(5), shape, np.int64, opname)
    for axis in range(len(shape)):
        expected = _exclusive_reference(x, axis, ufunc)
        got = mr.scan(x, opname, axis=axis, inclusive=False)
        assert got.shape == x.shape and np.array_equal(got, expected), (axis, got, expected)
        chunks = tuple(max(1, s // 3) for s in shape)
        lazy = mr.scan(da.from_array(x, chunks=chunks), opname, axis=axis, inclusive=False)
        assert lazy.shape == x.shape and np.array_equal(lazy.compute(), expected)


def test_exclusive_scan_with_empty_and_unknown_chunks():
    import dask.array as da

    x = np.arange(1, 9)
    got = mr.scan(da.from_array(x, chunks=((3, 0, 5),)), "sum", inclusive=False).compute()
    assert np.array_equal(got, _exclusive_reference(x, 0, np.add))
    assert mr.scan(np.array([]), "sum", inclusive=False).shape == (0,)
    rng = np.random.default_rng(7)
    for n, chunk in ((33, 4), (1025, 100), (40, 3)):
        v = rng.integers(-20, 10, n)
        v[: chunk * 2] = -1  # whole chunks vanish under the mask
        lazy = da.from_array(v, chunks=chunk)
        picked = lazy[lazy > 0]  # unknown chunk sizes, some of them 0
        expected = _exclusive_reference(v[v > 0], 0, np.add)
        for inclusive in (False, True):
            got = mr.scan(picked, "sum", inclusive=inclusive).compute()
            want = expected if not inclusive else np.cumsum(v[v > 0])
            assert got.shape == want.shape and np.array_equal(got, want)
        assert mr.cumsum(picked).compute().shape == (int((v > 0).sum()),)


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">u2", ">f4", ">i8", "<f8"])
def test_big_endian_input_matches_numpy_and_is_left_alone(dtype):
    import dask.array as da

    x = (random_array(np.random.default_rng(11), (33, 17), np.dtype(dtype).newbyteorder("="))).astype(dtype)
    before = x.copy()
    mass = float(np.abs(x.astype(np.float64)).sum())

    def same(got, expected):
        # integers exactly; floats up to the rounding of another summation order, relative to the input's mass
        expected = np.asarray(expected)
        assert np.asarray(got).dtype == expected.dtype
        eps = np.finfo(expected.dtype).eps if expected.dtype.kind == "f" else 0
        np.testing.assert_allclose(got, expected, rtol=8 * eps, atol=8 * eps * mass)

    lazy_x = da.from_array(x, chunks=(8, 5))
    for opname in REDUCTIONS:
        for axis in (None, 0, 1):
            expected = getattr(np, opname)(x, axis=axis)
            same(getattr(mr, opname)(x, axis=axis), expected)
            same(getattr(mr, opname)(lazy_x, axis=axis).compute(), expected)
    for axis in (0, 1):
        same(mr.cumsum(x, axis=axis), np.cumsum(x, axis=axis))
        same(mr.cumsum(lazy_x, axis=axis).compute(), np.cumsum(x, axis=axis))
        same(mr.scan(lazy_x, "max", axis=axis, inclusive=False).compute()[1:], np.maximum.accumulate(x, axis=axis)[:-1]
             if axis == 0 else mr.scan(x, "max", axis=axis, inclusive=False)[1:])
    assert np.array_equal(x, before) and x.dtype == np.dtype(dtype)


NARROW = [np.int8, np.uint8, np.int16, np.float16, np.bool_]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opname", ["sum", "prod", "mean", "min", "max", "cumsum", "cumprod"])
def test_narrow_dtype_argument_matches_numpy(opname, dtype):
    import dask.array as da

    rng = np.random.default_rng(13)
    for x in (np.arange(1000, dtype=np.int16) % 7, rng.integers(-3, 9, (33, 31)).astype(np.int16)):
        if opname in ("min", "max"):  # NumPy has no dtype= here: ours converts before comparing
            expected = getattr(np, opname)(x.astype(dtype))
        else:
            expected = getattr(np, opname)(x, dtype=dtype)
        for data in (x, da.from_array(x, chunks=7 if x.ndim == 1 else (7, 9))):
            got = getattr(mr, opname)(data, dtype=dtype)
            got = np.asarray(got.compute() if isinstance(got, da.Array) else got)
            assert got.dtype == np.asarray(expected).dtype
            if np.dtype(dtype) == np.float16 and opname in ("sum", "mean", "cumsum", "cumprod"):
                # NumPy accumulates float16 in float16; multireduce in float32, rounded once at the end, so
                # they agree to float16's rounding where NumPy's running value has not overflowed yet
                wide = np.asarray(expected, np.float64)
                finite = np.isfinite(wide)
                np.testing.assert_allclose(got.astype(np.float64)[finite], wide[finite], rtol=2e-2)
            else:
                assert np.array_equal(got, expected), (got, expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.float16])
def test_misaligned_input_gives_the_same_bits_as_an_aligned_copy(dtype):
    itemsize = np.dtype(dtype).itemsize
    # NumPy's buffered (misaligned) path changes the summation order beyond its 8192-element buffer
    for n in (31, 1025, 8193, 100_003):
        values = random_array(np.random.default_rng(n), (n,), dtype)
        buffer = np.zeros(n * itemsize + 1, dtype=np.uint8)
        view = buffer[1:].view(dtype)  # data at an odd address, as a chunk in a message buffer can be
        view[...] = values
        assert not view.flags.aligned or itemsize == 1
        aligned = view.copy()
        for opname in ("sum", "prod", "mean", "min", "max"):
            got, ref = getattr(mr, opname)(view), getattr(mr, opname)(aligned)
            assert np.asarray(got).tobytes() == np.asarray(ref).tobytes(), (opname, n)
        two_d_view = view[: (n // 31) * 31].reshape(-1, 31)
        assert np.asarray(mr.sum(two_d_view, axis=1)).tobytes() == np.asarray(mr.sum(two_d_view.copy(), axis=1)).tobytes()
        assert mr.cumsum(view).tobytes() == mr.cumsum(aligned).tobytes()
        assert np.array_equal(view, values)


def test_numpy_calls_import_no_dask():
    """NumPy and CuPy users never pay for importing dask (first-call time), nor need it installed."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, multireduce as mr\n"
            "x = np.arange(1, 1000, dtype=np.float32)\n"
            "mr.sum(x); mr.mean(x); mr.max(x); mr.cumsum(x); mr.scan(x, 'prod', inclusive=False)\n"
            "mr.sum(x, split_every=4)\n"
            "mr.argmax(x); mr.var(x); mr.std(x); mr.nanmax(x); mr.nansum(x); mr.any(x); mr.all(x)\n"
            "mr.count_nonzero(x); mr.nancumsum(x); mr.segment_reduce(x, [0, 5, 90]); mr.segment_scan(x, [0, 7])\n"
            "mr.sum(x, exact=True); mr.cumsum(x, exact=True)\n"
            "print(sorted(m for m in sys.modules if m == 'dask' or m.startswith(('dask.', 'distributed'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------------------------------------
# The nan-family's operators: NaN read as the identity where elements are loaded, partials as they are
# ------------------------------------------------------------------------------------------------
NAN_SIZES = [1, 31, 33, 1023, 1025]


def _nan_data(rng, n, dtype, product=False):
    """Random values (near 1 for products, so they neither vanish nor overflow) with NaN at random places,
    at both ends and as a run, plus an inf and a -inf: inf - inf must stay NaN."""
    x = (rng.uniform(0.5, 1.5, n) if product else rng.standard_normal(n)).astype(dtype)
    x[rng.random(n) < 0.3] = np.nan
    x[0] = x[-1] = np.nan
    x[n // 3 : n // 3 + min(40, n // 4)] = np.nan
    return x


def _same(got, ref, dtype, n):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    tol = 8 * float(np.finfo(dtype).eps) * max(1.0, n ** 0.5)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", NAN_SIZES)
def test_nan_operators_match_numpy_on_numpy_and_dask(n, dtype):
    import dask.array as da

    rng = np.random.default_rng(n)
    for name, ref in [("nansum", np.nansum), ("nanprod", np.nanprod)]:
        x = _nan_data(rng, n, dtype, product=name == "nanprod")
        before = x.copy()
        expected = ref(x)
        for fn in (getattr(mr, name), lambda a: mr.reduce(a, name)):
            got = fn(x)
            assert np.asarray(got).dtype == expected.dtype
            _same(got, expected, dtype, n)
            _same(fn(x), expected, dtype, n)  # the cached plan's launcher
            _same(fn(da.from_array(x, chunks=max(1, n // 5))).compute(), expected, dtype, n)
        np.testing.assert_array_equal(x, before)
        scan = {"nansum": (mr.nancumsum, np.nancumsum), "nanprod": (mr.nancumprod, np.nancumprod)}[name]
        _same(scan[0](x), scan[1](x), dtype, n)
        _same(mr.scan(x, name), scan[1](x), dtype, n)
        _same(scan[0](da.from_array(x, chunks=max(1, n // 5))).compute(), scan[1](x), dtype, n)
        two_d = x[: n - n % 3].reshape(3, -1) if n >= 3 else x.reshape(1, -1)
        for axis in (0, 1):
            _same(getattr(mr, name)(two_d, axis=axis), ref(two_d, axis=axis), dtype, n)
            _same(scan[0](two_d, axis=axis), scan[1](two_d, axis=axis), dtype, n)


def test_nan_operators_keep_arithmetic_nan_across_chunks():
    """inf and -inf in different chunks: the partials' sum is NaN and must stay NaN (np.nansum gives NaN),
    so a NaN partial or scan total is never read as the identity."""
    import dask.array as da

    x = np.array([np.inf, 1.0, np.nan, -np.inf, 2.0, np.nan, 3.0])
    for chunks in (1, 2, 3, 7):
        d = da.from_array(x, chunks=chunks)
        assert np.isnan(mr.nansum(d).compute()) and np.isnan(np.nansum(x))
        np.testing.assert_array_equal(mr.nancumsum(d).compute(), np.nancumsum(x))
        np.testing.assert_array_equal(mr.scan(d, "nansum").compute(), np.nancumsum(x))
    assert mr.nansum(np.full(33, np.nan)) == 0 and mr.nanprod(np.full(33, np.nan, np.float32)) == 1
    assert mr.nansum(da.from_array(np.full(33, np.nan), chunks=4)).compute() == 0


def test_nan_operators_dtype_rules_and_refusals():
    import dask.array as da

    rng = np.random.default_rng(11)
    x = _nan_data(rng, 257, np.float64) * 10
    for name in ("nansum", "nanprod"):
        ref = getattr(np, name)
        # an integer result type: NaN is masked before the conversion, as in NumPy
        assert getattr(mr, name)(x[:9], dtype=np.int64) == ref(x[:9], dtype=np.int64)
        assert getattr(mr, name)(x, dtype=np.float32).dtype == np.float32
        i = rng.integers(-5, 5, 100)
        assert getattr(mr, name)(i) == ref(i) and getattr(mr, name)(i).dtype == ref(i).dtype
    assert mr.nancumsum(x, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="argument 'algorithm'"):
        mr.reduce(x, "nansum", algorithm="interleaved")
    with pytest.raises(ValueError, match="argument 'algorithm'"):
        mr.scan(da.from_array(x, chunks=10), "nansum", algorithm="blelloch")
    with pytest.raises(TypeError, match="argument 'x' has dtype"):
        mr.reduce(np.arange(5), "nansum")  # the nan-family takes floating data; nansum() sends ints to sum
    with pytest.raises(ValueError, match="reduction operation fmin"):
        mr.reduce(np.zeros(0), "nanmin")
    with pytest.raises(ValueError, match="argument 'name'"):
        mr.register_operator("nansum", identity=0, cpu=np.add, commutative=True)
    assert {"nansum", "nanprod", "nanmin", "nanmax"} <= set(mr.operators())


def test_nanmin_nanmax_operators_skip_nan():
    """The raw operators read NaN as their identity: an all-NaN slice gives +inf / -inf (multireduce.nanmin
    finishes that as NumPy); otherwise np.fmin / np.fmax's reduction and running scan."""
    import dask.array as da

    rng = np.random.default_rng(12)
    for n in NAN_SIZES:
        x = _nan_data(rng, n, np.float32)
        for name, ufunc, inf in [("nanmin", np.fmin, np.inf), ("nanmax", np.fmax, -np.inf)]:
            want = ufunc.reduce(x)
            want = inf if np.isnan(want) else want
            assert mr.reduce(x, name) == want and mr.reduce(da.from_array(x, chunks=7), name).compute() == want
            running = ufunc.accumulate(x)
            np.testing.assert_array_equal(mr.scan(x, name), np.where(np.isnan(running), inf, running))


def test_nanmin_nanmax_finish_all_nan_slices_as_numpy():
    """multireduce.nanmin/nanmax run the operators, then finish the slices that gave the identity: all-NaN
    ones warn and give NaN, a slice of infinities (with or without NaN) keeps its infinity."""
    rng = np.random.default_rng(13)
    x = _nan_data(rng, 33 * 9, np.float64).reshape(33, 9)
    x[3] = np.nan
    x[5] = np.where(np.isnan(x[5]), np.nan, np.inf)
    x[7] = -np.inf
    x[:, 2] = np.nan
    for name in ("nanmin", "nanmax"):
        ref = getattr(np, name)
        for axis in (0, 1):
            for keepdims in (False, True):
                with pytest.warns(RuntimeWarning, match="All-NaN slice"):
                    got = getattr(mr, name)(x, axis=axis, keepdims=keepdims)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    np.testing.assert_array_equal(got, ref(x, axis=axis, keepdims=keepdims))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no all-NaN slice: no warning, no second look at the data
            assert getattr(mr, name)(x[5]) == ref(x[5]) and getattr(mr, name)(x) == ref(x)
        with pytest.warns(RuntimeWarning, match="All-NaN slice"):
            assert np.isnan(getattr(mr, name)(np.full(5, np.nan, np.float32)))


# ------------------------------------------------------------------------------------------------
# accumulate=: float32 cumsum in float64
# ------------------------------------------------------------------------------------------------
def _f32_bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_float32_cumsum_of_ten_million_uniforms_is_float32_rounding_of_the_exact_sum():
    """The issue's example at 10^7: np.cumsum's float32 running sum stops growing near 2^24; ours is the
    float64 running sum rounded once, within float32 rounding of the exact prefix sums."""
    import math

    x = np.random.default_rng(15).random(10**7, dtype=np.float32)
    got = mr.cumsum(x)
    assert got.dtype == np.float32
    assert np.array_equal(_f32_bits(got), _f32_bits(np.cumsum(x, dtype=np.float64).astype(np.float32)))
    for k in (1, 1 << 16, (1 << 16) + 1, 3_333_333, 10**7):
        exact = math.fsum(x[:k].astype(np.float64))
        ulp = float(np.spacing(np.float32(exact)))
        assert abs(float(got[k - 1]) - exact) <= 0.5 * ulp + exact * 1e-12, k
    plain = mr.cumsum(x, accumulate="input")
    assert np.array_equal(_f32_bits(plain), _f32_bits(np.cumsum(x)))
    assert abs(float(plain[-1]) - exact) > 10 * ulp  # float32 accumulation drifts (stalls entirely at 2^24)


@pytest.mark.parametrize("n", [0, 1, 31, 33, 1023, 1025, (1 << 16) + 1])
@pytest.mark.parametrize("axis", [0, 1])
def test_accumulate_options_on_numpy_data(n, axis):
    rng = np.random.default_rng(n + axis)
    x = (rng.standard_normal((3, n)) * 1e3).astype(np.float32)
    if axis == 0:
        x = np.ascontiguousarray(x.T)
    before = x.copy()
    wide = np.cumsum(x, axis=axis, dtype=np.float64).astype(np.float32)
    for accumulate in ("auto", "wide"):
        assert np.array_equal(_f32_bits(mr.cumsum(x, axis=axis, accumulate=accumulate)), _f32_bits(wide))
        got = mr.scan(x, "sum", axis=axis, inclusive=False, accumulate=accumulate)
        shifted = np.moveaxis(np.cumsum(x, axis=axis, dtype=np.float64), axis, 0)
        shifted = np.concatenate([np.zeros_like(shifted[:1]), shifted[:-1]])[: x.shape[axis]]
        assert np.array_equal(_f32_bits(got), _f32_bits(np.moveaxis(shifted, 0, axis).astype(np.float32)))
    assert np.array_equal(_f32_bits(mr.cumsum(x, axis=axis, accumulate="input")), _f32_bits(np.cumsum(x, axis=axis)))
    y = (1 + rng.standard_normal((3, n)) * 0.01).astype(np.float32)
    assert np.array_equal(_f32_bits(mr.cumprod(y, axis=1)), _f32_bits(np.cumprod(y, axis=1)))  # "auto": sums only
    assert np.array_equal(_f32_bits(mr.cumprod(y, axis=1, accumulate="wide")),
                          _f32_bits(np.cumprod(y, axis=1, dtype=np.float64).astype(np.float32)))
    assert np.array_equal(x, before)


def test_accumulate_keeps_numpy_special_values_and_other_dtypes():
    x = np.array([-0.0, 1.0, np.inf, -np.inf, 2.0, np.nan, 3.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, ref = mr.cumsum(x), np.cumsum(x)
    assert np.array_equal(_f32_bits(got[:1]), _f32_bits(ref[:1]))  # -0.0 stays -0.0
    np.testing.assert_array_equal(got, ref)
    big = np.full(3, np.finfo(np.float32).max, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(mr.cumsum(big), np.cumsum(big))  # overflow to inf as float32 does
    d = np.random.default_rng(1).standard_normal(1025)
    assert np.array_equal(mr.cumsum(d, accumulate="wide"), np.cumsum(d))  # float64: already the widest
    h = np.random.default_rng(2).standard_normal(1025).astype(np.float16)
    assert mr.cumsum(h, accumulate="input").dtype == np.float16


def test_accumulate_on_dask_data_matches_the_numpy_path():
    da = pytest.importorskip("dask.array")
    x = np.random.default_rng(3).random(200_003, dtype=np.float32)
    ref = np.cumsum(x, dtype=np.float64)
    for chunks in (1000, 65_537):
        d = da.from_array(x, chunks=chunks)
        got = mr.cumsum(d).compute()
        assert got.dtype == np.float32
        # float64 carries between chunks: a float64 association error, far below float32 rounding
        assert np.max(np.abs(got - ref) / np.spacing(ref.astype(np.float32))) <= 0.5 + 1e-3
        np.testing.assert_array_equal(mr.cumsum(d, accumulate="input").compute().dtype, np.float32)


@pytest.mark.parametrize("bad", ["float64", "", None, 1, "Wide"])
def test_bad_accumulate_names_itself(bad):
    x = np.ones(3, dtype=np.float32)
    for fn in (mr.cumsum, mr.cumprod, lambda x, **k: mr.scan(x, "sum", **k)):
        with pytest.raises(ValueError, match=r"argument 'accumulate' must be one of 'auto', 'wide', 'input'; got"):
            fn(x, accumulate=bad)
