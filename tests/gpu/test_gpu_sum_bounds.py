"""The bounds of float16/float32 values that decide whether their float64 sum is exact in any order, on the
GPU (cupy_backend.sum_bounds) against NumPy's (numpy_backend.sum_bounds, itself checked against exact
rationals in tests/test_sums_in_any_order.py)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

from multireduce.backends import cupy_backend, numpy_backend  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sum_bounds_on_the_gpu_are_numpys(dtype):
    rng = np.random.default_rng(4)
    tiny = float(np.finfo(dtype).smallest_subnormal)
    big = float(np.finfo(dtype).max)
    for a in (rng.standard_normal((300, 70)).astype(dtype), (rng.integers(-9, 9, 999) * tiny).astype(dtype),
              np.array([np.nan, 0, -np.inf, 2.5, -0.0, big, -tiny], dtype=dtype), np.array([], dtype=dtype),
              rng.uniform(-1e3, 1e3, (64, 33)).astype(dtype)[:, ::2], np.full(1 << 20, 0.75, dtype=dtype)):
        got = tuple(int(v) for v in cupy_backend.sum_bounds(cupy.asarray(a)).get())
        assert got == numpy_backend.sum_bounds(a), (dtype, a.ravel()[:5])


def test_sum_bounds_of_a_strided_view():
    a = np.random.default_rng(5).uniform(-1e3, 1e3, (64, 33)).astype(np.float32)
    a[::2, ::2] *= np.float32(1e-20)
    got = tuple(int(v) for v in cupy_backend.sum_bounds(cupy.asarray(a)[:, ::2]).get())
    assert got == numpy_backend.sum_bounds(a[:, ::2])


def test_sum_bounds_merged_on_the_gpu_into_an_earlier_result():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal(700).astype(np.float32) * 1e4, rng.standard_normal(900).astype(np.float32) * 1e-4
    first = cupy_backend.sum_bounds(cupy.asarray(a))
    merged = cupy_backend.sum_bounds(cupy.asarray(b), first)
    assert merged is first
    assert tuple(int(v) for v in merged.get()) == numpy_backend.sum_bounds(np.concatenate([a, b]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sum_bounds_at_every_start_and_length_around_the_packs(dtype):
    """The kernel reads 16-byte packs from the first 16-byte boundary and the values before and after
    them one by one: every start offset within a pack and lengths around one and two packs, each value's
    bounds distinct so a value read twice or skipped changes them."""
    rng = np.random.default_rng(7)
    base = (2.0 ** rng.integers(-14, 14, 200) * rng.integers(1, 2047, 200)).astype(dtype)
    on_gpu = cupy.asarray(base)
    for start in range(9):
        for length in (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100):
            a = base[start : start + length]
            got = tuple(int(v) for v in cupy_backend.sum_bounds(on_gpu[start : start + length]).get())
            assert got == numpy_backend.sum_bounds(a), (start, length)
            for i in range(length):  # the one value with the widest bounds at each position in turn
                b = a.copy()
                b[i] = np.finfo(dtype).smallest_subnormal if i % 2 else np.finfo(dtype).max
                g = cupy.asarray(base).copy()
                g[start : start + length] = cupy.asarray(b)
                got = tuple(int(v) for v in cupy_backend.sum_bounds(g[start : start + length]).get())
                assert got == numpy_backend.sum_bounds(b), (start, length, i)


def test_sum_bounds_of_a_large_array():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((1 << 24) + 7).astype(np.float32)
    a[(1 << 23) + 3] = np.float32(3e-42)  # one subnormal deep inside
    got = tuple(int(v) for v in cupy_backend.sum_bounds(cupy.asarray(a)[1:]).get())
    assert got == numpy_backend.sum_bounds(a[1:])


def _mean_plan(axes, acc=np.float64, op="sum"):
    from multireduce.core import ReductionPlan
    from multireduce.operators import get_operator

    return ReductionPlan(get_operator(op), axes, np.dtype(acc), np.dtype(np.float32), True, True)


@pytest.fixture
def any_width(monkeypatch):
    """sum_with_bounds for narrow arrays too (it leaves those to the two passes by default)."""
    monkeypatch.setattr(cupy_backend, "SUM_WITH_BOUNDS_MIN_PACKS_PER_SM", 0)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 166])
def test_column_sums_with_bounds_in_one_read_are_the_two_passes(rows, any_width):
    """cupy_backend.sum_with_bounds: the bounds are sum_bounds', and where they make every float64 sum exact
    the sums are the column kernel's bit for bit (signed zeros, subnormals, NaN and inf columns included)."""
    from multireduce.dtypes import exact_in_any_order

    rng = np.random.default_rng(rows)
    a = (rng.integers(-2**20, 2**20, (rows, 6, 8)) * 2.0 ** -25).astype(np.float32)
    a[:, 0, 0] = -0.0  # an all-negative-zero column: +0.0 from the identity in both
    special = a.copy()
    special[rows // 2, 1, 2], special[0, 1, 3], special[-1, 1, 3] = np.nan, np.inf, -np.inf
    tiny = (rng.integers(-2**20, 2**20, (rows, 6, 8)) * 2.0 ** -149).astype(np.float32)  # subnormals
    tiny[:, 0, 0] = -0.0
    plan = _mean_plan((0,))
    for data in (a, special, tiny):
        x = cupy.asarray(data)
        got = cupy_backend.sum_with_bounds(x, plan)
        assert got is not None
        part, bounds = got
        want = plan.partial(x)
        want_bounds = tuple(int(v) for v in cupy_backend.sum_bounds(x).get())
        assert tuple(int(v) for v in bounds.get()) == want_bounds == numpy_backend.sum_bounds(data)
        assert part.count == want.count == rows and part.value.shape == want.value.shape
        assert part.value.dtype == want.value.dtype == np.float64
        assert exact_in_any_order(rows, *want_bounds)
        assert cupy.asnumpy(part.value).tobytes() == cupy.asnumpy(want.value).tobytes()
    merged = cupy_backend.sum_with_bounds(cupy.asarray(a * np.float32(2.0 ** 30)), plan, bounds)[1]
    assert merged is bounds  # merged into an earlier result, as sum_bounds does
    assert tuple(int(v) for v in bounds.get()) == numpy_backend.sum_bounds(
        np.concatenate([data.ravel(), (a * np.float32(2.0 ** 30)).ravel()]))  # the last data's bounds and these


def test_column_sums_with_bounds_leave_narrow_arrays_to_the_two_passes():
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    narrow = cupy.ones((4096, 32), np.float32)  # a tall matrix's column sum: 8 threads would do it all
    wide = cupy.ones((3, 4 * sms * cupy_backend.SUM_WITH_BOUNDS_MIN_PACKS_PER_SM), np.float32)
    assert cupy_backend.sum_with_bounds(narrow, _mean_plan((0,))) is None
    assert cupy_backend.sum_with_bounds(wide, _mean_plan((0,))) is not None


def test_column_sums_with_bounds_take_only_what_they_read_right(any_width):
    x = cupy.asarray(np.random.default_rng(1).random((10, 4, 8), dtype=np.float32))
    assert cupy_backend.sum_with_bounds(x, _mean_plan((0, 1))) is not None  # a leading run of axes
    two = cupy_backend.sum_with_bounds(x, _mean_plan((0, 1)))[0]
    assert two.value.shape == (1, 1, 8) and two.count == 40
    for refused in [(x, _mean_plan((1,))), (x, _mean_plan((0,), np.float32)), (x, _mean_plan((0,), op="max")),
                    (x[:, :, :6], _mean_plan((0,))), (x[:, :, 1:5], _mean_plan((0,))),
                    (x.astype(np.float16), _mean_plan((0,))), (cupy.ones(330, np.float32)[1:321].reshape(10, 32), _mean_plan((0,))),
                    (x, _mean_plan((0, 1, 2)))]:
        assert cupy_backend.sum_with_bounds(*refused) is None
