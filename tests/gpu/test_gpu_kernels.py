"""Every GPU algorithm x dtype x operator x awkward size against NumPy, on a real GPU.

The same logic runs on the CPU in tests/test_api.py and tests/test_dask.py; here the kernels are the
subject. Data is made once per (dtype, size, op family) and reused across algorithms.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce import dtypes as _dt  # noqa: E402
from multireduce.catalogue import CATALOGUE, REDUCE_ALGORITHMS, SCAN_ALGORITHMS  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

from ..helpers import (  # noqa: E402
    ALL_DTYPES, AWKWARD_SIZES, BUILTIN_OPS, assert_matches, matmul_operator, random_array, random_matrices,
    reference_reduce, sequential_fold,
)

SCAN_OPS = BUILTIN_OPS


@functools.lru_cache(maxsize=64)
def _data(dtype, n, family):
    rng = np.random.default_rng(hash((np.dtype(dtype).str, n, family)) % 2**32)
    host = random_array(rng, n, dtype, family)
    return host, cupy.asarray(host)


def _expected_dtypes(opname, dtype):
    family = "order" if opname in ("min", "max") else "sum"
    out = _dt.result_dtype(family, np.dtype(dtype))
    return out, _dt.accumulator_dtype(out)


@pytest.mark.parametrize("n", AWKWARD_SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opname", BUILTIN_OPS)
@pytest.mark.parametrize("algorithm", ["auto"] + list(REDUCE_ALGORITHMS))
def test_reduce_every_algorithm(algorithm, opname, dtype, n):
    host, dev = _data(dtype, n, "prod" if opname == "prod" else "sum")
    if n == 0 and opname in ("min", "max"):
        with pytest.raises(ValueError, match="zero-size array"):
            mr.reduce(dev, opname, algorithm=algorithm)
        return
    got = mr.reduce(dev, opname, algorithm=algorithm)
    assert isinstance(got, cupy.ndarray) and got.shape == ()
    out, acc = _expected_dtypes(opname, dtype)
    ref, mass = reference_reduce(host, opname)
    assert_matches(cupy.asnumpy(got), ref, mass, acc, out, n, f"{algorithm} {opname} {np.dtype(dtype)} n={n}",
                   product=opname == "prod")


@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "exclusive"])
@pytest.mark.parametrize("n", AWKWARD_SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opname", SCAN_OPS)
@pytest.mark.parametrize("algorithm", ["auto"] + list(SCAN_ALGORITHMS))
def test_scan_every_algorithm(algorithm, opname, dtype, n, inclusive):
    host, dev = _data(dtype, n, "prod" if opname == "prod" else "sum")
    before = dev.copy()
    got = mr.scan(dev, opname, algorithm=algorithm, inclusive=inclusive)
    cupy.testing.assert_array_equal(dev, before)  # the input is untouched
    out, acc = _expected_dtypes(opname, dtype)
    what = f"{algorithm} {opname} {np.dtype(dtype)} n={n} inclusive={inclusive}"
    # reference: inclusive scan in float64 / exact integers, shifted for exclusive
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[opname]
    if host.dtype.kind == "f" and opname in ("sum", "prod"):
        ref = ufunc.accumulate(host.astype(np.float64))
        mass = np.add.accumulate(np.abs(host.astype(np.float64))) if opname == "sum" else np.abs(ref)
    else:
        ref = ufunc.accumulate(host, dtype=acc if host.dtype.kind != "f" else None)
        mass = None
    if not inclusive and n:
        first = np.asarray([get_operator(opname).identity(acc)], dtype=ref.dtype)
        ref = np.concatenate([first, ref[:-1]])
        if mass is not None:
            mass = np.concatenate([np.zeros(1), mass[:-1]])
    assert_matches(cupy.asnumpy(got), ref, mass, acc, out, max(n, 1), what, product=opname == "prod")


# ------------------------------------------------------------------------------------------------
# Non-commutative operator: 2x2 matrix products mod 2^16
# ------------------------------------------------------------------------------------------------
ORDERED_REDUCE = ["auto"] + [a for a in REDUCE_ALGORITHMS if CATALOGUE[a].keeps_order]


@pytest.mark.parametrize("n", AWKWARD_SIZES)
@pytest.mark.parametrize("algorithm", ORDERED_REDUCE)
def test_noncommutative_reduce_keeps_order(algorithm, n):
    op = matmul_operator()
    host = random_matrices(np.random.default_rng(n), n)
    got = int(mr.reduce(cupy.asarray(host), op, algorithm=algorithm))
    assert got == sequential_fold(host) and got != 0
    if n > 1:  # the check can fail: reversed order gives another product
        assert sequential_fold(host[::-1]) != got


@pytest.mark.parametrize("n", [1, 33, 1025, (1 << 20) + 3, (1 << 24) + 7])
@pytest.mark.parametrize("inclusive", [True, False])
@pytest.mark.parametrize("algorithm", ["auto"] + list(SCAN_ALGORITHMS))
def test_noncommutative_scan_keeps_order(algorithm, inclusive, n):
    op = matmul_operator()
    host = random_matrices(np.random.default_rng(n + 1), n)
    got = cupy.asnumpy(mr.scan(cupy.asarray(host), op, algorithm=algorithm, inclusive=inclusive))
    # reference: the NumPy backend (itself checked against a one-at-a-time loop in tests/test_api.py)
    ref = mr.scan(host, op, inclusive=inclusive)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("algorithm", [a for a in REDUCE_ALGORITHMS if not CATALOGUE[a].keeps_order])
def test_reordering_algorithms_refuse_noncommutative(algorithm):
    op = matmul_operator()
    with pytest.raises(ValueError, match="not commutative"):
        mr.reduce(cupy.arange(10, dtype=cupy.uint64), op, algorithm=algorithm)


# ------------------------------------------------------------------------------------------------
# N-d, axes, non-contiguous inputs
# ------------------------------------------------------------------------------------------------
SHAPES_AXES = [
    ((33, 1025), 0), ((33, 1025), 1), ((33, 1025), (0, 1)), ((7, 9, 1031), 2), ((7, 9, 1031), 0),
    ((7, 9, 1031), (0, 2)), ((7, 9, 1031), (1, 2)), ((3, 1 << 17, 5), 1), ((1 << 18, 3), 0), ((2, 1 << 20), 1),
    ((5000, 40), 1), ((40, 5000), 0),
]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axis", SHAPES_AXES, ids=str)
@pytest.mark.parametrize("opname", BUILTIN_OPS + ["mean"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.uint8, np.float16], ids=lambda d: np.dtype(d).name)
def test_reduce_axes(dtype, opname, shape, axis, keepdims):
    rng = np.random.default_rng(7)
    host = random_array(rng, shape, dtype, opname)
    got = getattr(mr, opname)(cupy.asarray(host), axis=axis, keepdims=keepdims)
    ref, mass = reference_reduce(host, opname, axis=axis, keepdims=keepdims)
    out = np.asarray(getattr(np, opname)(host[(slice(0, 1),) * host.ndim], axis=axis, keepdims=keepdims)).dtype
    acc = np.float32 if out == np.float16 else out
    n = host.size // max(np.asarray(ref).size, 1)
    assert_matches(cupy.asnumpy(got), ref, mass, acc, out, n, f"{opname} {shape} axis={axis}",
                   product=opname == "prod")


@pytest.mark.parametrize("shape,axis", [((33, 1025), 0), ((33, 1025), 1), ((7, 9, 1031), 1), ((3, 1 << 17, 5), 1),
                                        ((1 << 18, 3), 0), ((300, 300), 0), ((5000, 40), 1)], ids=str)
@pytest.mark.parametrize("opname", ["sum", "max"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_scan_axes(dtype, opname, shape, axis):
    host = random_array(np.random.default_rng(3), shape, dtype, opname)
    got = mr.scan(cupy.asarray(host), opname, axis=axis)
    if opname == "sum":
        ref = np.cumsum(host.astype(np.float64) if host.dtype.kind == "f" else host, axis=axis)
        mass = np.cumsum(np.abs(host.astype(np.float64)), axis=axis) if host.dtype.kind == "f" else None
    else:
        ref, mass = np.maximum.accumulate(host, axis=axis), None
    out = np.cumsum(host.ravel()[:1]).dtype if opname == "sum" else host.dtype
    assert_matches(cupy.asnumpy(got), ref, mass, out, out, shape[axis], f"{opname} {shape} axis={axis}")


def test_non_contiguous_inputs():
    host = random_array(np.random.default_rng(5), (64, 300), np.float32)
    dev = cupy.asarray(host)
    for view_h, view_d in [(host.T, dev.T), (host[::3, 1::2], dev[::3, 1::2]), (host[:, 7], dev[:, 7])]:
        for axis in [None, 0, -1]:
            ref, mass = reference_reduce(view_h, "sum", axis=axis)
            assert_matches(cupy.asnumpy(mr.sum(view_d, axis=axis)), ref, mass, np.float32, np.float32,
                           view_h.size, f"sum {view_h.shape} axis={axis}")
        ref = np.cumsum(view_h.astype(np.float64), axis=0)
        mass = np.cumsum(np.abs(view_h.astype(np.float64)), axis=0)
        assert_matches(cupy.asnumpy(mr.cumsum(view_d, axis=0)), ref, mass, np.float32, np.float32,
                       view_h.shape[0], "cumsum view")


def test_misaligned_views_use_scalar_edges():
    host = random_array(np.random.default_rng(9), 1 << 20, np.float32)
    dev = cupy.asarray(host)
    for offset in range(1, 5):
        ref, mass = reference_reduce(host[offset:], "sum")
        assert_matches(cupy.asnumpy(mr.sum(dev[offset:])), ref, mass, np.float32, np.float32, host.size - offset)
        ref = np.cumsum(host[offset:].astype(np.float64))
        mass = np.cumsum(np.abs(host[offset:].astype(np.float64)))
        assert_matches(cupy.asnumpy(mr.cumsum(dev[offset:])), ref, mass, np.float32, np.float32, host.size)


# ------------------------------------------------------------------------------------------------
# NumPy semantics on the GPU
# ------------------------------------------------------------------------------------------------
def test_nan_and_inf_propagate():
    x = random_array(np.random.default_rng(1), 100_001, np.float32)
    x[5000] = np.nan
    dev = cupy.asarray(x)
    assert np.isnan(float(mr.min(dev))) and np.isnan(float(mr.max(dev))) and np.isnan(float(mr.sum(dev)))
    y = x.copy()
    y[5000] = np.inf
    assert float(mr.max(cupy.asarray(y))) == np.inf and float(mr.sum(cupy.asarray(y))) == np.inf
    scanned = cupy.asnumpy(mr.cumsum(dev))
    assert not np.isnan(scanned[:5000]).any() and np.isnan(scanned[5000:]).all()


def test_integer_overflow_wraps_like_numpy():
    x = np.full(1000, np.iinfo(np.int64).max // 3, dtype=np.int64)
    x[::2] += 12345
    assert int(mr.sum(cupy.asarray(x))) == int(np.sum(x))
    np.testing.assert_array_equal(cupy.asnumpy(mr.cumsum(cupy.asarray(x))), np.cumsum(x))


def test_dtype_argument_and_mean():
    x = random_array(np.random.default_rng(2), 4099, np.int16)
    dev = cupy.asarray(x)
    assert mr.sum(dev, dtype=np.float32).dtype == np.float32
    assert abs(float(mr.sum(dev, dtype=np.float64)) - float(x.astype(np.float64).sum())) < 1e-6
    assert mr.mean(dev).dtype == np.float64
    assert abs(float(mr.mean(dev)) - x.mean()) < 1e-9
    assert mr.cumsum(dev, dtype=np.int32).dtype == np.int32


def test_bad_input_on_gpu_is_refused_before_launch():
    with pytest.raises(TypeError, match="argument 'x' has dtype complex64"):
        mr.min(cupy.ones(3, dtype=cupy.complex64))
    with pytest.raises(TypeError, match="not supported on the GPU"):
        mr.sum(cupy.ones(3, dtype=cupy.complex64))
    op = mr.register_operator("cpu_only_xor", identity=0, cpu=np.bitwise_xor, commutative=True, kinds="biu", replace=True)
    with pytest.raises(ValueError, match="no CUDA expression"):
        mr.reduce(cupy.arange(4), op)


def test_compile_errors_name_the_kernel():
    from multireduce.kernels import KernelError

    # compiled at registration (operators' GPU check), so the error comes before any data is reduced
    with pytest.raises(KernelError, match=r"broken.*mr_user::op_broken"):
        mr.register_operator("broken", identity=0, cpu=np.add, cuda="a +* b", commutative=True, replace=True)
    assert "broken" not in mr.operators()


def test_results_stay_on_the_device_and_kernels_are_ours(monkeypatch):
    # cupy.sum / cupy.cumsum must not be what runs
    def refuse(*a, **k):
        raise AssertionError("cupy reduction called")

    monkeypatch.setattr(cupy, "sum", refuse)
    monkeypatch.setattr(cupy, "cumsum", refuse)
    x = cupy.arange(1 << 20, dtype=cupy.int32)
    out = mr.sum(x)
    assert isinstance(out, cupy.ndarray) and int(out) == (1 << 20) * ((1 << 20) - 1) // 2
    assert isinstance(mr.cumsum(x), cupy.ndarray)


# ------------------------------------------------------------------------------------------------
# Every look-back tile shape the sweep may pick, so a default can change without new code
# ------------------------------------------------------------------------------------------------
def _host_inclusive_scan(values: np.ndarray, ufunc) -> np.ndarray:
    """Inclusive scan by doubling (earlier element always on the left), exact for any associative op."""
    out = values.copy()
    d = 1
    while d < out.size:
        out[d:] = ufunc(out[:-d], out[d:])
        d *= 2
    return out


# (input, output, accumulator): every size class of tuning.scan_size_class, float16 for 8-element held vectors
_TILE_CASES = [(np.int32, np.int32, np.int32), (np.float32, np.float32, np.float32), (np.int64, np.int64, np.int64),
               (np.float64, np.float64, np.float64), (np.int32, np.int64, np.int64), (np.uint8, np.uint64, np.uint64),
               (np.float16, np.float16, np.float32)]


@pytest.mark.parametrize("case", _TILE_CASES, ids=lambda c: f"{np.dtype(c[0]).name}->{np.dtype(c[1]).name}")
def test_lookback_every_candidate_tile(case):
    from multireduce.backends import cupy_backend as cb
    from multireduce.tuning import SCAN_SHAPE_CANDIDATES, scan_size_class

    T, O, acc = (np.dtype(d) for d in case)
    op = get_operator("sum")
    rng = np.random.default_rng(7)
    for shape in SCAN_SHAPE_CANDIDATES[scan_size_class(T.itemsize, acc.itemsize, O.itemsize)]:
        tile = shape.tile(T.itemsize)
        shared = shape.block * shape.items  # where the held layers begin
        for rows, K in [(1, 1), (1, 33), (1, shared - 1), (1, shared + 7), (1, tile - 1), (1, tile), (1, tile + 1),
                        (3, 3 * tile + 5), (1, 97 * tile + 13), (5, 1025)]:
            host = random_array(rng, rows * K + 1, T)
            dev = cupy.asarray(host)
            for offset in (0, 1):  # aligned rows, and a view one element in (scalar loads)
                x = dev[offset : offset + rows * K].reshape(rows, K)
                h = host[offset : offset + rows * K].reshape(rows, K).astype(acc)
                carry_host = random_array(rng, rows, acc)
                for carry, inclusive in [(None, True), (cupy.asarray(carry_host), False)]:
                    out = cupy.empty((rows, K), O)
                    cb.lookback_scan(x, out, op, acc, op.identity(acc), carry, inclusive, shape)
                    seeded = np.concatenate([(carry_host if carry is not None else np.zeros(rows, acc))[:, None], h], 1)
                    ref = np.add.accumulate(seeded.astype(np.float64 if acc.kind == "f" else acc), axis=1)
                    ref = ref[:, 1:] if inclusive else ref[:, :-1]
                    what = f"tile {shape} {T.name}->{O.name} rows={rows} K={K} offset={offset} inclusive={inclusive}"
                    mass = np.add.accumulate(np.abs(seeded.astype(np.float64)), axis=1)[:, 1 if inclusive else 0:]
                    mass = mass[:, :K]
                    assert_matches(cupy.asnumpy(out), ref.astype(np.float64) if acc.kind == "f" else ref,
                                   mass if acc.kind == "f" else None, acc, O, K, what)


def test_lookback_candidate_tiles_keep_order():
    """Non-commutative 2x2 matrix products through every 8-byte candidate: order across tiles and rows."""
    from multireduce.backends import cupy_backend as cb
    from multireduce.tuning import SCAN_SHAPE_CANDIDATES

    from ..helpers import matmul2x2

    op = matmul_operator()
    acc = np.dtype(np.uint64)
    rng = np.random.default_rng(11)
    for shape in SCAN_SHAPE_CANDIDATES["8byte"]:
        tile = shape.tile(acc.itemsize)
        rows, K = 2, 40 * tile + 77
        host = random_matrices(rng, rows * K).reshape(rows, K)
        carry_host = random_matrices(rng, rows)
        out = cupy.empty((rows, K), acc)
        cb.lookback_scan(cupy.asarray(host), out, op, acc, op.identity(acc), cupy.asarray(carry_host), True, shape)
        ref = _host_inclusive_scan(np.concatenate([carry_host[:, None], host], 1).T, matmul2x2).T[:, 1:]
        got = cupy.asnumpy(out)
        assert np.array_equal(got, ref), f"tile {shape}: first difference at " \
            f"{np.argwhere(got != ref)[:1].tolist()}"
        assert np.count_nonzero(ref[:, -1]), "products collapsed to zero: the check would be vacuous"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32, np.uint8, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_repeated_calls_take_the_whole_array_path_and_agree(dtype):
    """The second call of a signature goes through the cached plan's bound launcher; it must give what the
    general path gives, and hand back to it for input it cannot take."""
    from multireduce import api

    rng = np.random.default_rng(5)
    for opname, fn in [("sum", mr.sum), ("min", mr.min), ("max", mr.max), ("prod", mr.prod)]:
        for n in [1, 33, 1025, (1 << 20) + 3]:
            host = random_array(rng, n, dtype, "prod" if opname == "prod" else "sum")
            dev = cupy.asarray(host)
            first = fn(dev)
            plan = api._default_plans[(cupy.ndarray, f"multireduce.{opname}", get_operator(opname), dev.dtype, 1)]
            assert (cupy.ndarray, dev.dtype) in plan._launchers
            second = fn(dev)
            assert second.dtype == first.dtype and second.shape == ()
            cupy.testing.assert_array_equal(first, second)
            out, acc = _expected_dtypes(opname, dtype)
            ref, mass = reference_reduce(host, opname)
            assert_matches(cupy.asnumpy(second), ref, mass, acc, out, n, f"{opname} {np.dtype(dtype)} n={n}",
                           product=opname == "prod")
        # what the reducer cannot take goes the general way, with the same answers and errors
        strided = cupy.asarray(random_array(rng, 2050, dtype))[::2]
        cupy.testing.assert_array_equal(fn(strided), fn(cupy.ascontiguousarray(strided)))
        two_d = cupy.asarray(random_array(rng, (33, 17), dtype))
        cupy.testing.assert_array_equal(fn(two_d), fn(two_d.reshape(-1)))
        empty = cupy.empty(0, dtype)
        if opname in ("min", "max"):
            with pytest.raises(ValueError, match="zero-size array"):
                fn(empty)
        else:
            assert float(fn(empty)) == float(get_operator(opname).identity(np.dtype(_expected_dtypes(opname, dtype)[1])))


def test_first_calls_compile_only_production_kernels(monkeypatch):
    """algorithm="auto" never waits for the catalogue: the first reduction and scan of a dtype build only
    groups of the production source, and a catalogue algorithm builds its own group when asked for."""
    from multireduce import kernels
    from multireduce.backends import cupy_backend as cb

    monkeypatch.setattr(kernels, "_modules", {})  # as in a fresh process (the groups already built stay valid)
    cb._reduce_kernels_on.cache_clear()
    rng = np.random.default_rng(23)
    host = random_array(rng, 1025, np.int16)
    x = cupy.asarray(host)
    assert int(mr.sum(x, axis=0)) == int(host.astype(np.int64).sum())  # axis=0: not the cached fast path
    got = cupy.asnumpy(mr.cumsum(x.reshape(5, 205), axis=1))
    assert np.array_equal(got, np.cumsum(host.astype(np.int64).reshape(5, 205), axis=1))
    assert kernels._modules, "no kernel group was looked up"
    assert {key[2].entry for key in kernels._modules} == {kernels.ENTRY}
    ref = int(host.astype(np.int64).sum())
    assert int(mr.sum(x, algorithm="warp_shuffle")) == ref
    assert kernels.CATALOGUE_ENTRY in {key[2].entry for key in kernels._modules}
    cb._reduce_kernels_on.cache_clear()  # its entries point into the dict monkeypatch puts back


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_exclusive_scans_of_empty_input_keep_the_input_shape(shape):
    x = cupy.empty(shape, cupy.float32)
    for inclusive in (True, False):
        out = mr.scan(x, "sum", axis=-1, inclusive=inclusive)
        assert out.shape == shape and out.size == 0, (shape, inclusive, out.shape)
