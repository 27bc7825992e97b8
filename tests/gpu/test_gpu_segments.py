"""segment_reduce on the GPU (kernels/segment.cuh through backends/cupy_segment) against NumPy's reduceat
semantics (empty segments give the identity): built-in operators over several dtypes, a non-commutative
user operator, empty / single / one-element segments, segments straddling threads, tiles, fix-up rounds
and Dask chunks, misaligned views, offsets on the GPU, and one case past 2^31 elements (``large``).
The kernels' decomposition itself is replayed on the CPU in tests/test_segments.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

from ..helpers import matmul_operator, random_matrices, sequential_fold  # noqa: E402

UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _reference(host, offsets, opname, out_dtype):
    """reduceat over the non-empty segments, the identity for the empty ones, in ``out_dtype``
    (exact for integers; for floats call it with float64 data and out_dtype)."""
    n = host.size
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = np.append(offsets[1:], n)
    ref = np.full(offsets.size, get_operator(opname).identity(np.dtype(out_dtype)), dtype=out_dtype)
    inside = offsets < n  # reduceat takes no index n; those segments are empty
    if inside.any():
        values = UFUNC[opname].reduceat(host, offsets[inside], dtype=out_dtype)
        full = (offsets < ends)[inside]  # where reduceat's x[i] for an empty segment is replaced
        ref[np.flatnonzero(inside)[full]] = values[full]
    return ref


def _layouts(rng, n):
    """Offsets that exercise every path: random with empties, one segment, n segments of one element,
    a first start past 0, clusters of equal starts, empty segments at the end, segments longer than a
    tile."""
    yield "random", np.sort(rng.integers(0, n + 1, max(1, n // 7)))
    yield "one", np.array([0])
    yield "ones", np.arange(n)
    yield "late start", np.array([n // 2, n // 2 + 1])[: 1 + (n > 1)]
    yield "clusters", np.sort(np.concatenate([np.full(5, n // 3), np.full(3, n // 2), [0], np.full(4, n)]))
    yield "long", np.sort(rng.integers(0, n + 1, 3))


def _data(rng, n, dtype, opname):
    dtype = np.dtype(dtype)
    if opname == "prod":
        return rng.choice([-1, 1, 2, 3] if dtype.kind != "u" else [1, 2, 3], n).astype(dtype)
    if dtype.kind == "b":
        return rng.random(n) < 0.5
    if dtype.kind == "f":
        return (rng.standard_normal(n) * 8).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dtype)


def _check(got, host, offsets, opname, out_dtype, what):
    """Integers exactly; floats against a float64 reference within the rounding of a fold of the
    segment (bounded by its absolute mass; float16 results round once from float32)."""
    got = cupy.asnumpy(got)
    assert got.dtype == out_dtype, what
    if out_dtype.kind != "f":
        np.testing.assert_array_equal(got, _reference(host, offsets, opname, out_dtype), err_msg=what)
        return
    wide = host.astype(np.float64)
    ref = _reference(wide, offsets, opname, np.dtype(np.float64))
    mass = _reference(np.abs(wide), offsets, "sum", np.dtype(np.float64)) if opname == "sum" else np.abs(ref)
    tol = {np.dtype(np.float16): 1e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}[out_dtype]
    wide_got = got.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the identity: equal, caught by ==
        bad = ~((wide_got == ref) | (np.abs(wide_got - ref) <= tol * (mass + 1)))
    assert not bad.any(), f"{what}: {bad.sum()} segments off, first at {np.flatnonzero(bad)[:5]}"


CASES = [("sum", np.int32), ("sum", np.float32), ("sum", np.float64), ("sum", np.uint8), ("sum", np.bool_),
         ("sum", np.float16), ("sum", np.int64), ("prod", np.int64), ("min", np.float32), ("max", np.int32),
         ("min", np.int16), ("max", np.float64)]


@pytest.mark.parametrize("n", [0, 1, 31, 1025, 40_000])
@pytest.mark.parametrize("opname,dtype", CASES)
def test_builtin_operators_match_reduceat(opname, dtype, n):
    rng = np.random.default_rng(n + len(opname))
    host = _data(rng, n, dtype, opname)
    x = cupy.asarray(host)
    out_dtype = np.asarray(UFUNC[opname].reduce(host[:1] if n else np.ones(1, dtype))).dtype
    for name, offsets in _layouts(rng, n):
        offsets = np.clip(offsets, 0, n)
        got = mr.segment_reduce(x, offsets, opname)
        assert isinstance(got, cupy.ndarray)
        _check(got, host, offsets, opname, out_dtype, f"{opname} {np.dtype(dtype)} n={n} {name}")


def test_float32_sum_at_2_24_plus_7_with_device_offsets():
    """2049 tiles: segments cut by tile boundaries in the thousands, one fix-up round; offsets on the GPU."""
    n = (1 << 24) + 7
    rng = np.random.default_rng(24)
    host = rng.random(n, dtype=np.float32)
    x = cupy.asarray(host)
    c = np.concatenate([[0.0], np.cumsum(host.astype(np.float64))])
    for m in (1, 1000, 100_000, 3_000_000):
        offsets = np.sort(rng.integers(0, n + 1, m))
        got = mr.segment_reduce(x, cupy.asarray(offsets))
        ends = np.append(offsets[1:], n)
        ref = c[ends] - c[offsets]
        err = np.abs(cupy.asnumpy(got).astype(np.float64) - ref)
        assert (err <= 1e-5 * (ref + 1.0)).all(), f"m={m}: worst {err.max()}"  # data >= 0: ref is the mass


def test_many_tiles_and_fixup_rounds_exact():
    """uint8 sums (uint64, exact) over 2^28 + 5 elements: 32769 tiles of 8192, so the fix-up block runs
    three rounds (16384 tiles each); one segment spanning every tile, one starting late, and a million
    short ones."""
    n = (1 << 28) + 5
    rng = np.random.default_rng(28)
    x = cupy.random.randint(0, 256, n, dtype=cupy.uint8)
    host = cupy.asnumpy(x)
    for offsets in (np.array([0]), np.array([3, n - 2]), np.sort(rng.integers(0, n + 1, 1_000_000))):
        got = cupy.asnumpy(mr.segment_reduce(x, offsets))
        np.testing.assert_array_equal(got, _reference(host, offsets, "sum", np.dtype(np.uint64)))
        got = cupy.asnumpy(mr.segment_reduce(x, offsets, "max"))
        np.testing.assert_array_equal(got, _reference(host, offsets, "max", np.dtype(np.uint8)))
    del x
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("n", [1, 31, 1025, 20_000])
def test_non_commutative_user_operator_keeps_order(n):
    op = matmul_operator()
    rng = np.random.default_rng(n)
    host = random_matrices(rng, n)  # uint64: 4096 per tile, so 20_000 crosses tiles
    x = cupy.asarray(host)
    for offsets in (np.array([0]), np.sort(rng.integers(0, n + 1, max(1, n // 50))), np.arange(n),
                    np.array([0, 0, n // 2, n // 2, n])):
        got = cupy.asnumpy(mr.segment_reduce(x, offsets, op))
        ends = np.append(offsets[1:], n)
        assert [int(v) for v in got] == [sequential_fold(host[s:e]) for s, e in zip(offsets, ends)]


def test_misaligned_and_strided_views():
    rng = np.random.default_rng(5)
    base = cupy.asarray(rng.integers(-100, 100, 50_001).astype(np.int32))
    host = cupy.asnumpy(base)
    for view, ref_host in ((base[1:], host[1:]), (base[3:-2], host[3:-2]), (base[::3], host[::3])):
        offsets = np.sort(rng.integers(0, view.size + 1, 300))
        got = mr.segment_reduce(view, offsets)
        np.testing.assert_array_equal(cupy.asnumpy(got), _reference(ref_host, offsets, "sum", np.dtype(np.int64)))
    np.testing.assert_array_equal(cupy.asnumpy(base), host)  # the input is not modified


def test_dask_of_cupy_segments_straddle_chunks():
    rng = np.random.default_rng(9)
    n = 100_003
    host = rng.integers(-100, 100, n).astype(np.int64)
    x = da.from_array(host, chunks=(9000, 1, 30_000, 61_002), asarray=False).map_blocks(cupy.asarray,
                                                                                      dtype=host.dtype)
    with dask.config.set(scheduler="synchronous"):
        for offsets in (np.array([0]), np.sort(rng.integers(0, n + 1, 777)), np.array([5, 9000, 9001, 9001, n])):
            lazy = mr.segment_reduce(x, offsets, "sum")
            got = lazy.compute()
            assert isinstance(got, cupy.ndarray)
            np.testing.assert_array_equal(cupy.asnumpy(got), _reference(host, offsets, "sum", np.dtype(np.int64)))
            op = matmul_operator()
            mats = random_matrices(rng, n)
            xm = da.from_array(mats, chunks=(9000, 1, 30_000, 61_002), asarray=False).map_blocks(cupy.asarray,
                                                                                               dtype=mats.dtype)
            got = cupy.asnumpy(mr.segment_reduce(xm, offsets, op).compute())
            ends = np.append(offsets[1:], n)
            assert [int(v) for v in got] == [sequential_fold(mats[s:e]) for s, e in zip(offsets, ends)]


def test_device_offsets_are_checked_before_any_work():
    x = cupy.arange(10.0)
    with pytest.raises(ValueError, match="'offsets'.*not ascending"):
        mr.segment_reduce(x, cupy.asarray([3, 1]))
    with pytest.raises(ValueError, match=r"'offsets'.*\[0, 10\]"):
        mr.segment_reduce(x, cupy.asarray([0, 11]))
    with pytest.raises(TypeError, match="'offsets'"):
        mr.segment_reduce(x, cupy.asarray([0.5, 2.0]))
    offsets = cupy.asarray([0, 4, 4, 7])
    got = mr.segment_reduce(x, offsets)
    np.testing.assert_array_equal(cupy.asnumpy(got), mr.segment_reduce(cupy.asnumpy(x), [0, 4, 4, 7]))
    np.testing.assert_array_equal(cupy.asnumpy(offsets), [0, 4, 4, 7])  # not modified


@pytest.mark.large
def test_segment_sum_past_2_31():
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 12 * 2**30:
        pytest.skip(f"needs ~12 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    n = (1 << 31) + 7  # uint8: 262145 tiles, 17 fix-up rounds; offsets and indices past 2^31
    x = cupy.random.randint(0, 256, size=n, dtype=cupy.uint8)
    host = cupy.asnumpy(x)
    rng = np.random.default_rng(31)
    for offsets in (np.array([0]), np.array([0, (1 << 31) - 3, (1 << 31) + 1, n]),
                    np.sort(rng.integers(0, n + 1, 100_000))):
        got = cupy.asnumpy(mr.segment_reduce(x, cupy.asarray(offsets)))
        np.testing.assert_array_equal(got, _reference(host, offsets, "sum", np.dtype(np.uint64)))
    del x
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("opname,fill", [("nansum", 0.0), ("nanprod", 1.0), ("nanmin", np.inf), ("nanmax", -np.inf)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_operators_read_nan_as_identity_in_the_kernel(opname, fill, dtype):
    rng = np.random.default_rng(3)
    n = 40_000
    host = (rng.uniform(0.99, 1.01, n) if opname == "nanprod" else rng.standard_normal(n)).astype(dtype)
    host[rng.random(n) < 0.25] = np.nan
    host[1000:1300] = np.nan
    offsets = np.sort(np.concatenate([rng.integers(0, n + 1, 300), [1000, 1000, 1300]]))
    filled = np.where(np.isnan(host), fill, host).astype(np.float64)
    want = _reference(filled, offsets, opname[3:], np.float64)
    got = mr.segment_reduce(cupy.asarray(host), offsets, opname)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), want, rtol=2e-4 if dtype == np.float32 else 1e-10)
