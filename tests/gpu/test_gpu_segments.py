"""segment_reduce and segment_scan on the GPU (kernels/segment.cuh through backends/cupy_segment) against
NumPy: reduceat semantics (empty segments give the identity) and per-segment cumsum / cumprod /
accumulate; built-in operators over several dtypes, the nan-family, a non-commutative user operator,
empty / single / one-element segments, segments straddling threads, tiles, carry groups, look-back
windows and Dask chunks (carries), misaligned views, offsets on the GPU, and cases past 2^31 elements
(``large``). The kernels' decompositions are replayed on the CPU in tests/test_segments.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

from ..helpers import matmul_operator, random_matrices, sequential_fold, sequential_scan  # noqa: E402

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
    yield "distinct short", np.sort(rng.choice(n + 1, max(1, n // 5), replace=False))  # heads as masks


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
    """2049 tiles (three carry groups): segments cut by tile boundaries in the thousands; offsets on the GPU."""
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


def test_many_tiles_and_carry_groups_exact():
    """uint8 sums (uint64, exact) over 2^28 + 5 elements: 32769 tiles of 8192, so the carry pass runs 33
    groups of 1024 tiles, the last holding one; one segment spanning every tile, one starting late, and
    a million short ones."""
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


@pytest.mark.parametrize("call", [mr.segment_reduce, mr.segment_scan])
def test_refused_offsets_leave_no_trace(call):
    """The offsets check is queued before the work and waited for after it is queued: hostile offsets
    (far out of range, negative, descending, over many tiles) raise, the work behind the check reads no
    offset (no illegal address on the next synchronize), and the next call is right."""
    n = 1 << 20
    rng = np.random.default_rng(3)
    host = rng.standard_normal(n).astype(np.float32)
    x = cupy.asarray(host)
    hostile = [np.array([5, -(2**40), 2**50, 3]), np.sort(rng.integers(0, n, 5000))[::-1].copy(),
               np.concatenate([np.arange(0, n, 3), [n + 1]]), np.array([-1] * 3000 + [0])]
    for offsets in hostile:
        with pytest.raises(ValueError, match="'offsets'"):
            call(x, cupy.asarray(offsets))
        cupy.cuda.Device().synchronize()
    good = np.sort(rng.choice(n + 1, 4000, replace=False))
    got = cupy.asnumpy(call(x, cupy.asarray(good)))
    want = call(host, good)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(cupy.cuda.runtime.getDeviceCount() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("x_gpu, offsets_gpu", [(0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("call", [mr.segment_reduce, mr.segment_scan])
def test_offsets_on_another_gpu(call, x_gpu, offsets_gpu):
    """GPU 0 current, data and offsets on the GPUs given: the offsets (and their check's flag) move to
    the data's GPU, good offsets give the NumPy result there, and bad ones (uint64 ones included, whose
    order is checked as given) the offsets error, with every GPU still usable afterwards."""
    rng = np.random.default_rng(17)
    host = rng.standard_normal(1 << 18).astype(np.float32)
    good = np.sort(rng.choice(host.size + 1, 3000, replace=False))
    with cupy.cuda.Device(x_gpu):
        x = cupy.asarray(host)
    with cupy.cuda.Device(offsets_gpu):
        offsets = cupy.asarray(good)
        bad = [cupy.asarray(good[::-1].copy()), cupy.asarray(good[::-1].astype(np.uint64)),
               cupy.asarray(np.append(good, host.size + 1).astype(np.int32))]
    cupy.cuda.Device(0).use()
    got = call(x, offsets)
    assert got.data.device_id == x_gpu
    np.testing.assert_allclose(cupy.asnumpy(got), call(host, good), rtol=1e-4, atol=1e-3)
    for offsets in bad:
        with pytest.raises(ValueError, match="argument 'offsets' must be ascending"):
            call(x, offsets)
    for device in (0, 1):
        cupy.cuda.Device(device).synchronize()
    np.testing.assert_allclose(cupy.asnumpy(call(x, cupy.asarray(good))), call(host, good), rtol=1e-4, atol=1e-3)


@pytest.mark.large
def test_segment_sum_past_2_31():
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 12 * 2**30:
        pytest.skip(f"needs ~12 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    n = (1 << 31) + 7  # uint8: 262145 tiles, 257 carry groups (the last block folds 256 group totals); offsets and indices past 2^31
    x = cupy.random.randint(0, 256, size=n, dtype=cupy.uint8)
    host = cupy.asnumpy(x)
    rng = np.random.default_rng(31)
    for offsets in (np.array([0]), np.array([0, (1 << 31) - 3, (1 << 31) + 1, n]),
                    np.sort(rng.integers(0, n + 1, 100_000))):
        got = cupy.asnumpy(mr.segment_reduce(x, cupy.asarray(offsets)))
        np.testing.assert_array_equal(got, _reference(host, offsets, "sum", np.dtype(np.uint64)))
    del x
    cupy.get_default_memory_pool().free_all_blocks()


def _nan_case(seed, opname, dtype, fill):
    """40000 values, a quarter NaN and an all-NaN segment [1000, 1300) (its running value stays the
    identity), 300 random starts: (data, offsets, data with NaN read as ``fill``)."""
    rng = np.random.default_rng(seed)
    n = 40_000
    host = (rng.uniform(0.99, 1.01, n) if opname == "nanprod" else rng.standard_normal(n)).astype(dtype)
    host[rng.random(n) < 0.25] = np.nan
    host[1000:1300] = np.nan
    offsets = np.sort(np.concatenate([rng.integers(0, n + 1, 300), [1000, 1000, 1300]]))
    return host, offsets, np.where(np.isnan(host), fill, host)


@pytest.mark.parametrize("opname,fill", [("nansum", 0.0), ("nanprod", 1.0), ("nanmin", np.inf), ("nanmax", -np.inf)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_operators_read_nan_as_identity_in_the_kernel(opname, fill, dtype):
    host, offsets, filled = _nan_case(3, opname, dtype, fill)
    filled = filled.astype(np.float64)
    want = _reference(filled, offsets, opname[3:], np.float64)
    got = mr.segment_reduce(cupy.asarray(host), offsets, opname)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), want, rtol=2e-4 if dtype == np.float32 else 1e-10)


# ------------------------------------------------------------------------------------------------
# segment_scan: the one-pass look-back kernel (segment_scan_tiles)
# ------------------------------------------------------------------------------------------------
SCAN = {"sum": lambda s, dt: np.cumsum(s, dtype=dt), "prod": lambda s, dt: np.cumprod(s, dtype=dt),
        "min": lambda s, dt: np.minimum.accumulate(s.astype(dt or s.dtype)),
        "max": lambda s, dt: np.maximum.accumulate(s.astype(dt or s.dtype))}


def _segment_bounds(n, offsets):
    """Segment starts and ends of a scan: every offset below n, and 0 (the run before the first offset)."""
    starts = np.unique(np.concatenate([[0], np.asarray(offsets, dtype=np.int64)]))
    starts = starts[starts < n]
    return starts, np.append(starts[1:], n)


def _scan_reference(host, offsets, accumulate, out_dtype):
    """``accumulate`` (a NumPy scan of one segment) over each segment, concatenated."""
    starts, ends = _segment_bounds(host.size, offsets)
    parts = [accumulate(host[s:e], out_dtype) for s, e in zip(starts, ends)]
    return np.concatenate(parts).astype(out_dtype) if parts else np.zeros(0, out_dtype)


def _sum_scan_reference(host, offsets, dtype=np.float64):
    """The segmented running sum in ``dtype`` (float64: within rounding; int64: exact), vectorised (one
    cumsum, minus its value before each segment) for sizes where per-segment calls are too many; the
    same of |x| is the running mass."""
    starts, _ = _segment_bounds(host.size, offsets)
    seg = np.repeat(np.arange(starts.size), np.diff(np.append(starts, host.size)))
    c = np.concatenate([np.zeros(1, dtype), np.cumsum(host, dtype=dtype)])
    return c[1:] - c[starts][seg]


def _check_scan(got, host, offsets, opname, out_dtype, what, tol=None):
    """Integers exactly; floats against float64 within ``tol`` (per dtype) of the running mass."""
    got = cupy.asnumpy(got)
    assert got.dtype == out_dtype and got.shape == host.shape, what
    if out_dtype.kind != "f":
        np.testing.assert_array_equal(got, _scan_reference(host, offsets, SCAN[opname], out_dtype), err_msg=what)
        return
    wide = host.astype(np.float64)
    ref = _scan_reference(wide, offsets, SCAN[opname], np.dtype(np.float64))
    mass = _scan_reference(np.abs(wide), offsets, SCAN["sum"], np.dtype(np.float64)) if opname == "sum" else np.abs(ref)
    tol = tol or {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}[out_dtype]
    with np.errstate(invalid="ignore"):  # inf - inf where both are the identity: equal, caught by ==
        bad = ~((got.astype(np.float64) == ref) | (np.abs(got.astype(np.float64) - ref) <= tol * (mass + 1)))
    assert not bad.any(), f"{what}: {bad.sum()} elements off, first at {np.flatnonzero(bad)[:5]}"


@pytest.mark.parametrize("n", [0, 1, 31, 1025, 40_000])
@pytest.mark.parametrize("opname,dtype", CASES)
def test_segment_scan_builtin_operators_match_numpy(opname, dtype, n):
    rng = np.random.default_rng(n + 3 * len(opname))
    host = _data(rng, n, dtype, opname)
    x = cupy.asarray(host)
    out_dtype = np.asarray(SCAN[opname](host[:1] if n else np.ones(1, dtype), None)).dtype
    for name, offsets in _layouts(rng, n):
        offsets = np.clip(offsets, 0, n)
        got = mr.segment_scan(x, offsets, opname)
        assert isinstance(got, cupy.ndarray)
        _check_scan(got, host, offsets, opname, out_dtype, f"scan {opname} {np.dtype(dtype)} n={n} {name}")
    np.testing.assert_array_equal(cupy.asnumpy(x), host)  # the input is not modified


@pytest.mark.parametrize("staged,deterministic", [(True, False), (False, False), (True, True)])
def test_segment_scan_store_paths_and_carry_in(staged, deterministic):
    """Both store paths of the kernel (through shared memory, straight from registers) and the
    deterministic three-pass form, with and without a carry-in: the carry continues the run before the
    first offset, in element order."""
    from multireduce.backends import cupy_segment

    rng = np.random.default_rng(int(staged))
    n = 70_001  # whole tiles (both paths) and a ragged last one (element by element)
    for dtype, opname in ((np.float32, "sum"), (np.float64, "sum"), (np.int16, "max")):  # 4-, 8-, 2-byte stores
        host = _data(rng, n, dtype, opname)
        out_dtype = np.asarray(SCAN[opname](host[:1], None)).dtype
        acc = np.dtype(np.float32) if out_dtype == np.float16 else out_dtype
        op = get_operator(opname)
        for name, offsets in _layouts(rng, n):
            got = cupy_segment.segment_scan(cupy.asarray(host), offsets, op, acc, out_dtype, staged=staged,
                                            deterministic=deterministic)
            _check_scan(got, host, offsets, opname, out_dtype, f"{np.dtype(dtype)} {opname} {name} staged={staged}")
        # with a carry: the same as scanning [carry, x...] with every offset one further on, minus the carry
        carry = host.dtype.type(7 if opname == "sum" else 500)
        offsets = np.array([1000, 5000])
        got = cupy.asnumpy(cupy_segment.segment_scan(cupy.asarray(host), offsets, op, acc, out_dtype,
                                                     carry=acc.type(carry), staged=staged, deterministic=deterministic))
        _check_scan(np.concatenate([np.asarray([carry], dtype=out_dtype), got]), np.concatenate([[carry], host]),
                    offsets + 1, opname, out_dtype, f"{np.dtype(dtype)} {opname} carry staged={staged}")
    op = matmul_operator()  # the carry keeps order: carry on the left
    mats = random_matrices(rng, 9000)
    carry = np.uint64(random_matrices(rng, 1)[0])
    got = cupy.asnumpy(cupy_segment.segment_scan(cupy.asarray(mats), np.array([4097]), op, np.uint64, np.uint64,
                                                 carry=carry, staged=staged, deterministic=deterministic))
    np.testing.assert_array_equal(got[:4097], sequential_scan(np.concatenate([[carry], mats[:4097]]))[1:])
    np.testing.assert_array_equal(got[4097:], sequential_scan(mats[4097:]))


def test_deterministic_segment_scan_gives_the_same_bits_every_run():
    """The three-pass form over 4097 tiles (one long segment, then 10^5 short ones): identical bits on
    every run, and within rounding of the float64 reference. Tile folds, their scan and the rescan
    have fixed shapes; only the one-pass look-back's grouping depends on timing."""
    from multireduce.backends import cupy_segment
    from multireduce.backends import cupy_backend

    assert cupy_segment.LOOKBACK_ENV == cupy_backend.LOOKBACK_ENV  # one variable for both scans

    n = (1 << 25) + 3
    rng = np.random.default_rng(25)
    host = rng.random(n, dtype=np.float32)
    x = cupy.asarray(host)
    op = get_operator("sum")
    for offsets in (np.array([0]), np.sort(rng.integers(0, n + 1, 100_000))):
        runs = [cupy_segment.segment_scan(x, offsets, op, np.float32, np.float32, deterministic=True) for _ in range(3)]
        for other in runs[1:]:
            assert bool((other.view(cupy.uint32) == runs[0].view(cupy.uint32)).all())
        ref = _sum_scan_reference(host, offsets)
        err = np.abs(cupy.asnumpy(runs[0]).astype(np.float64) - ref)
        assert (err <= 2e-5 * (ref + 1.0)).all(), f"worst {err.max()} at {np.argmax(err)}"
        lookback = cupy.asnumpy(cupy_segment.segment_scan(x, offsets, op, np.float32, np.float32))
        assert (np.abs(lookback.astype(np.float64) - ref) <= 2e-5 * (ref + 1.0)).all()


def test_segment_scan_2_24_plus_7_with_device_offsets():
    """2049 tiles: look-back chains across thousands of tiles (one segment), heads in every tile (3e6
    segments), repeated offsets and offsets at n; exact int32 sums (int64) beside float32 ones."""
    n = (1 << 24) + 7
    rng = np.random.default_rng(247)
    host = rng.random(n, dtype=np.float32)
    ints = rng.integers(-1000, 1000, n).astype(np.int32)
    x, xi = cupy.asarray(host), cupy.asarray(ints)
    for m in (1, 1000, 3_000_000):
        offsets = np.sort(np.concatenate([rng.integers(0, n + 1, m), [n, n, n // 2, n // 2]]))
        got = cupy.asnumpy(mr.segment_scan(x, cupy.asarray(offsets))).astype(np.float64)
        ref = _sum_scan_reference(host, offsets)  # data >= 0: the reference is the running mass
        err = np.abs(got - ref)
        assert (err <= 2e-5 * (ref + 1.0)).all(), f"m={m}: worst {err.max()} at {np.argmax(err)}"
        got = cupy.asnumpy(mr.segment_scan(xi, offsets))
        starts, _ = _segment_bounds(n, offsets)
        seg = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))
        c = np.concatenate([[0], np.cumsum(ints, dtype=np.int64)])
        np.testing.assert_array_equal(got, c[1:] - c[starts][seg], err_msg=f"int32 m={m}")
        shift = seg.astype(np.int64) * 4096  # a segmented running max as one running max: segments ascend
        np.testing.assert_array_equal(cupy.asnumpy(mr.segment_scan(xi, offsets, "max")),
                                      np.maximum.accumulate(ints + shift) - shift, err_msg=f"max m={m}")


@pytest.mark.parametrize("n", [1, 31, 1025, 20_000])
def test_segment_scan_non_commutative_user_operator_keeps_order(n):
    op = matmul_operator()
    rng = np.random.default_rng(n + 1)
    host = random_matrices(rng, n)  # uint64: 4096 per tile, so 20_000 crosses tiles
    x = cupy.asarray(host)
    for name, offsets in _layouts(rng, n):
        offsets = np.clip(offsets, 0, n)
        got = cupy.asnumpy(mr.segment_scan(x, offsets, op))
        starts, ends = _segment_bounds(n, offsets)
        want = np.concatenate([sequential_scan(host[s:e]) for s, e in zip(starts, ends)])
        np.testing.assert_array_equal(got, want, err_msg=f"n={n} {name}")


@pytest.mark.parametrize("opname,fill", [("nansum", 0.0), ("nanprod", 1.0), ("nanmin", np.inf), ("nanmax", -np.inf)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_scan_nan_operators_read_nan_as_identity(opname, fill, dtype):
    host, offsets, filled = _nan_case(7, opname, dtype, fill)
    got = mr.segment_scan(cupy.asarray(host), offsets, opname)
    assert isinstance(got, cupy.ndarray) and got.dtype == dtype
    _check_scan(got, filled.astype(dtype), offsets, opname[3:], np.dtype(dtype), opname,
                tol=2e-4 if dtype == np.float32 else 1e-10)


def test_segment_scan_misaligned_and_strided_views():
    rng = np.random.default_rng(15)
    for dtype in (np.int32, np.float64):
        base = cupy.asarray(_data(rng, 50_001, dtype, "sum"))
        host = cupy.asnumpy(base)
        for view, ref_host in ((base[1:], host[1:]), (base[3:-2], host[3:-2]), (base[::3], host[::3])):
            offsets = np.sort(rng.integers(0, view.size + 1, 300))
            got = mr.segment_scan(view, offsets)
            _check_scan(got, ref_host, offsets, "sum", np.cumsum(ref_host[:1]).dtype, f"view {np.dtype(dtype)}")
        np.testing.assert_array_equal(cupy.asnumpy(base), host)  # the input is not modified
    raw = cupy.zeros(40_000 * 2 + 2, dtype=cupy.uint8)
    odd = raw[2:].view(cupy.float16)  # float16 at a 2-byte offset: the element-by-element path
    odd[...] = cupy.asarray(rng.standard_normal(40_000).astype(np.float16))
    offsets = np.sort(rng.integers(0, odd.size + 1, 100))
    _check_scan(mr.segment_scan(odd, offsets), cupy.asnumpy(odd), offsets, "sum", np.dtype(np.float16), "float16 odd")


@pytest.mark.parametrize("chunks", [(9000, 1, 30_000, 61_002), (4096,) * 24 + (1_699,), (100_003,)])
def test_dask_of_cupy_segment_scan_carries_across_chunks(chunks):
    """Chunks of CuPy arrays: each chunk's scan continues the carry from the chunks before it (segments
    straddling one, several or one-element chunks), on the kernel, with exact and float data."""
    rng = np.random.default_rng(len(chunks))
    n = 100_003
    layouts = (np.array([0]), np.sort(rng.integers(0, n + 1, 777)), np.array([5, 9000, 9001, 9001, n]),
               np.array([40_000]))
    ints = rng.integers(-100, 100, n).astype(np.int64)
    floats = rng.standard_normal(n).astype(np.float32)
    floats[rng.random(n) < 0.1] = np.nan
    mats = random_matrices(rng, n)
    op = matmul_operator()

    def lazy(host):
        return da.from_array(host, chunks=(chunks,), asarray=False).map_blocks(cupy.asarray, dtype=host.dtype)

    with dask.config.set(scheduler="synchronous"):
        for offsets in layouts:
            got = mr.segment_scan(lazy(ints), offsets, "sum").compute()
            assert isinstance(got, cupy.ndarray)
            _check_scan(got, ints, offsets, "sum", np.dtype(np.int64), f"int64 {offsets[:4]}")
            got = mr.segment_scan(lazy(ints), offsets, "max").compute()
            _check_scan(got, ints, offsets, "max", np.dtype(np.int64), f"max {offsets[:4]}")
            got = mr.segment_scan(lazy(floats), offsets, "nansum").compute()
            _check_scan(got, np.nan_to_num(floats, nan=0.0), offsets, "sum", np.dtype(np.float32), "nansum",
                        tol=2e-5)
            if offsets.size > 1:  # the user operator's Python reference is slow: two layouts
                got = cupy.asnumpy(mr.segment_scan(lazy(mats), offsets, op).compute())
                starts, ends = _segment_bounds(n, offsets)
                np.testing.assert_array_equal(got, np.concatenate([sequential_scan(mats[s:e]) for s, e in zip(starts, ends)]))


def test_segment_scan_device_offsets_are_checked_before_any_work():
    x = cupy.arange(10.0)
    with pytest.raises(ValueError, match="'offsets'.*not ascending"):
        mr.segment_scan(x, cupy.asarray([3, 1]))
    with pytest.raises(ValueError, match=r"'offsets'.*\[0, 10\]"):
        mr.segment_scan(x, cupy.asarray([0, 11]))
    offsets = cupy.asarray([0, 4, 4, 7, 10])
    got = mr.segment_scan(x, offsets)
    np.testing.assert_array_equal(cupy.asnumpy(got), mr.segment_scan(cupy.asnumpy(x), [0, 4, 4, 7, 10]))
    np.testing.assert_array_equal(cupy.asnumpy(offsets), [0, 4, 4, 7, 10])  # not modified


@pytest.mark.large
def test_segment_scan_past_2_31():
    """uint8 sums (uint64, exact) over 2^31 + 7 elements: 262145 tiles, heads at and around 2^31. An
    inclusive segmented sum is fully characterised by out[h] == x[h] at every head h (and 0) and
    out[i] - out[i-1] == x[i] elsewhere: checked in slices on the GPU, with no 16 GiB reference."""
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 32 * 2**30:
        pytest.skip(f"needs ~32 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    n = (1 << 31) + 7
    x = cupy.random.randint(0, 256, size=n, dtype=cupy.uint8)
    rng = np.random.default_rng(31)
    for offsets in (np.array([0, (1 << 31) - 3, (1 << 31) + 1, n]), np.sort(rng.integers(0, n + 1, 100_000))):
        out = mr.segment_scan(x, cupy.asarray(offsets))
        assert out.dtype == np.uint64 and out.shape == (n,)
        heads = cupy.zeros(n, dtype=bool)
        heads[cupy.asarray(np.concatenate([[0], offsets[offsets < n]]))] = True
        step = 1 << 28
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            o, xs, h = out[lo:hi], x[lo:hi].astype(cupy.uint64), heads[lo:hi]
            prev = out[lo - 1:hi - 1] if lo else cupy.concatenate([cupy.zeros(1, cupy.uint64), out[:hi - 1]])
            want = cupy.where(h, xs, prev + xs)
            assert bool((o == want).all()), f"slice at {lo}: {int((o != want).sum())} elements off"
        del out, heads
    del x
    cupy.get_default_memory_pool().free_all_blocks()


# ---- tile and carry-group boundaries ---------------------------------------------------------------
# The carry pass between tiles runs in groups of CARRY_BLOCK x CARRY_ITEMS tiles (a first launch folds
# each group, a second scans every group from the totals before it): these layouts cut segments at every
# tile boundary and around every group boundary, and run single segments over several groups.
def _boundary_layouts(n, itemsize):
    from multireduce.backends import cupy_segment

    tile = cupy_segment.tile_elements(itemsize)
    group = cupy_segment.CARRY_BLOCK * cupy_segment.CARRY_ITEMS * tile
    tiles = np.arange(1, -(-n // tile)) * tile
    groups = np.arange(1, -(-n // group)) * group
    yield "every tile", np.clip(np.sort(np.concatenate([tiles - 1, tiles + 2])), 0, n)
    yield "group edges", np.clip(np.sort(np.concatenate([groups - 5, groups, groups, groups + 1, [n, n]])), 0, n)
    yield "one huge", np.array([3, n - 2])
    yield "late huge", np.array([group + 7])
    yield "tiny", np.arange(0, n, 3)
    # a tile stages up to a quarter of its elements' worth of offsets in shared memory, else searches the
    # global array: tile 0 exactly at that capacity, tile 1 one past it, tile 2 at it with one repeat
    stage = tile // 4
    yield "staging edge", np.clip(np.sort(np.concatenate([np.arange(0, tile, 4), np.arange(tile, 2 * tile, 4), [tile + 1],
                                                          np.arange(2 * tile, 3 * tile, 4)[:stage - 1], [2 * tile + 8]])), 0, n)


def _groups_n(itemsize, groups=3, extra=77):
    """An n whose tiles fill ``groups`` - 1 carry groups and part of one more, ending mid-tile."""
    from multireduce.backends import cupy_segment

    return ((groups - 1) * cupy_segment.CARRY_BLOCK * cupy_segment.CARRY_ITEMS + 5) * \
        cupy_segment.tile_elements(itemsize) + extra


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
def test_reduce_exact_across_tile_and_carry_group_boundaries(dtype):
    n = _groups_n(np.dtype(dtype).itemsize)
    rng = np.random.default_rng(n % 1000)
    host = rng.integers(0, 100, n).astype(dtype)
    x = cupy.asarray(host)
    out = np.dtype(np.uint64) if dtype == np.uint8 else np.dtype(np.int64)
    for name, offsets in _boundary_layouts(n, np.dtype(dtype).itemsize):
        for opname, want in (("sum", out), ("max", np.dtype(dtype)), ("min", np.dtype(dtype))):
            got = mr.segment_reduce(x, cupy.asarray(offsets), opname)
            _check(got, host, offsets, opname, want, f"{np.dtype(dtype)} {opname} {name}")


@pytest.mark.parametrize("deterministic", [False, True])
def test_scan_exact_across_tile_and_carry_group_boundaries(deterministic):
    from multireduce.backends import cupy_segment

    n = _groups_n(4)
    rng = np.random.default_rng(5)
    host = rng.integers(-100, 100, n).astype(np.int32)
    x = cupy.asarray(host)
    op = get_operator("sum")
    for name, offsets in _boundary_layouts(n, 4):
        got = cupy_segment.segment_scan(x, offsets, op, np.int64, np.int64, deterministic=deterministic)
        np.testing.assert_array_equal(cupy.asnumpy(got), _sum_scan_reference(host, offsets, np.int64), err_msg=name)
        carried = cupy_segment.segment_scan(x, offsets, op, np.int64, np.int64, carry=11, deterministic=deterministic)
        # the carry is one more element in front, so the run before the first start continues it
        want = _sum_scan_reference(np.concatenate([[11], host]).astype(np.int64), offsets + 1, np.int64)[1:]
        np.testing.assert_array_equal(cupy.asnumpy(carried), want, err_msg=f"{name} carry")


def _heads_per_lane_layout(n, itemsize):
    """Offsets that give the warps of every tile each a different count of heads per lane, since the
    reduction picks its closing code per warp from the most heads any lane holds (none, one, two, more):
    warp 0 none; 1 one per lane, at varied items; 2 one in two lanes, at the first and last item; 3 one
    per lane and two (first and last item) in one lane; 4 two adjacent heads in two lanes; 5 three heads
    in one lane; 6 a repeated offset (an empty segment) in one lane beside single heads; 7 two per lane."""
    from multireduce.backends import cupy_segment

    items = cupy_segment.items_per_thread(itemsize)
    tile = cupy_segment.tile_elements(itemsize)
    span = 32 * items  # one warp's elements
    per_warp = {
        0: [],
        1: [lane * items + (lane * 7) % items for lane in range(32)],
        2: [3 * items, 17 * items + items - 1],
        3: [lane * items + (lane * 5) % items for lane in range(32) if lane != 9] + [9 * items, 9 * items + items - 1],
        4: [5 * items + 6, 5 * items + 7, 30 * items, 30 * items + 1, 12 * items + 3],
        5: [11 * items + 1, 11 * items + 4, 11 * items + items - 1, 20 * items + 2],
        6: [2 * items + 3, 8 * items + 5, 8 * items + 5, 25 * items + items - 1],
        7: [lane * items + k for lane in range(32) for k in ((lane * 3) % items, items - 1 - lane % 4)],
    }
    warps = tile // span
    starts = [t * tile + w * span + o for t in range(-(-n // tile)) for w in range(warps)
              for o in per_warp[w % len(per_warp)]]
    return np.array(sorted(o for o in starts if o <= n), dtype=np.int64)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_each_warps_closing_code_by_heads_per_lane(dtype):
    """Exact results over tiles whose warps take each closing path of the reduction (no head, at most one
    or two heads per lane, more, repeats), segments crossing lanes, warps and tiles: integer sums and
    float maxima (exact), and a non-commutative operator, where a closure taken one element early or
    late, or folded out of order, shows."""
    itemsize = np.dtype(dtype).itemsize
    from multireduce.backends import cupy_segment

    n = 3 * cupy_segment.tile_elements(itemsize) + 1000
    rng = np.random.default_rng(77)
    host = _data(rng, n, dtype, "sum")
    x = cupy.asarray(host)
    offsets = _heads_per_lane_layout(n, itemsize)
    assert np.any(np.diff(offsets) == 0) and offsets.size > 400
    sum_dtype = np.dtype(np.int64) if np.dtype(dtype).kind == "i" else np.dtype(dtype)
    for opname, want in (("sum", sum_dtype), ("max", np.dtype(dtype)), ("min", np.dtype(dtype))):
        if opname == "sum" and want.kind == "f":
            continue  # float sums: not exact; the bits test below covers them
        got = mr.segment_reduce(x, cupy.asarray(offsets), opname)
        _check(got, host, offsets, opname, want, f"{np.dtype(dtype)} {opname}")
    op = matmul_operator()
    matrices = random_matrices(rng, 3 * cupy_segment.tile_elements(8) + 500)
    layout = _heads_per_lane_layout(matrices.size, 8)
    got = cupy.asnumpy(mr.segment_reduce(cupy.asarray(matrices), layout, op))
    ends = np.append(layout[1:], matrices.size)
    assert [int(v) for v in got] == [sequential_fold(matrices[s:e]) for s, e in zip(layout, ends)]


def test_float_results_are_the_same_bits_on_every_run():
    """The reduction (tiles, then the carry pass: fixed trees, no look-back) and the deterministic scan,
    over several carry groups: two runs, identical bits."""
    from multireduce.backends import cupy_segment

    n = (1 << 24) + 7
    rng = np.random.default_rng(247)
    host = rng.standard_normal(n).astype(np.float32)
    x = cupy.asarray(host)
    op = get_operator("sum")
    layouts = list(_boundary_layouts(n, 4)) + [("random", np.sort(rng.integers(0, n + 1, 100_000)))]
    for name, offsets in layouts:
        offsets = cupy.asarray(offsets)
        a, b = (mr.segment_reduce(x, offsets) for _ in range(2))
        assert bool((a.view(cupy.uint32) == b.view(cupy.uint32)).all()), name
        _check(a, host, cupy.asnumpy(offsets), "sum", np.dtype(np.float32), name)
        a, b = (cupy_segment.segment_scan(x, offsets, op, np.float32, np.float32, deterministic=True) for _ in range(2))
        assert bool((a.view(cupy.uint32) == b.view(cupy.uint32)).all()), f"scan {name}"


def test_user_operator_across_tile_and_carry_group_boundaries():
    """The non-commutative user operator (uint64: 4096 per tile, 2^22 per carry group) over three carry
    groups: any reordering of tiles, groups or group totals shows."""
    op = matmul_operator()
    rng = np.random.default_rng(41)
    n = _groups_n(8)
    host = random_matrices(rng, n)
    x = cupy.asarray(host)
    for name, offsets in _boundary_layouts(n, 8):
        if name == "tiny":  # 4 million Python folds: covered by the exact built-in sums above
            continue
        got = cupy.asnumpy(mr.segment_reduce(x, cupy.asarray(offsets), op))
        ends = np.append(offsets[1:], n)
        assert [int(v) for v in got] == [sequential_fold(host[s:e]) for s, e in zip(offsets, ends)], name
