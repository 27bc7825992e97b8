"""Sums of float16/float32 values in float64 that are exact, and so the same in any order: the bounds of the
values (``dtypes.exact_in_any_order``, the backends' ``sum_bounds``) and the held path that sums each
worker's chunks of a lane together where the bounds allow it (taken for CuPy chunks; here for NumPy
chunks too, on a real CPU cluster), with the bits of the
chunk-ordered tree whatever the placement; data the bounds refuse keep the ordered fold."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import dask
import numpy as np
import pytest

from multireduce.backends import numpy_backend
from multireduce.dtypes import NO_GRID, NO_TOP, exact_in_any_order, merge_bounds


def _bounds_by_fractions(x) -> tuple[int, int]:
    top, grid = NO_TOP, NO_GRID
    for v in np.asarray(x, dtype=np.float64).ravel().tolist():
        if v == 0 or not math.isfinite(v):
            continue
        f = Fraction(abs(v))
        t = f.numerator.bit_length() - f.denominator.bit_length()
        if Fraction(2) ** t > f:
            t -= 1
        g = (f.numerator & -f.numerator).bit_length() - 1 - (f.denominator.bit_length() - 1)
        top, grid = max(top, t), min(grid, g)
    return top, grid


def _bounds_cases(dtype):
    rng = np.random.default_rng(0)
    info = np.finfo(dtype)
    big = 3e4 if dtype == np.float16 else 3e38
    return {
        "normal": rng.standard_normal(1000).astype(dtype),
        "subnormal": (rng.integers(-100, 100, 300) * float(info.smallest_subnormal)).astype(dtype),
        "special": np.array([0, -0.0, np.inf, -np.inf, np.nan, 1.5, big, -float(info.smallest_subnormal)], dtype=dtype),
        "empty": np.array([], dtype=dtype),
        "nothing finite non-zero": np.array([np.nan, 0, -np.inf], dtype=dtype),
        "pieces": rng.uniform(-1e-3, 1e3, 70_000).astype(dtype).reshape(700, 100)[:, ::3],  # strided, several pieces
    }


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_sum_bounds_are_those_of_the_exact_values(dtype):
    for name, x in _bounds_cases(dtype).items():
        assert numpy_backend.sum_bounds(x) == _bounds_by_fractions(x), name


def test_merged_bounds_are_the_bounds_of_the_union():
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(50).astype(np.float32) * s for s in (1e-3, 1.0, 1e5)]
    assert merge_bounds(numpy_backend.sum_bounds(p) for p in parts) == numpy_backend.sum_bounds(np.concatenate(parts))
    assert merge_bounds([]) == (NO_TOP, NO_GRID)


def test_bounds_merged_into_an_earlier_result_are_those_of_both():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal(70).astype(np.float32) * 1e4, rng.standard_normal(90).astype(np.float32) * 1e-4
    merged = numpy_backend.sum_bounds(b, numpy_backend.sum_bounds(a))
    assert merged == numpy_backend.sum_bounds(np.concatenate([a, b])) == merge_bounds(
        [numpy_backend.sum_bounds(a), numpy_backend.sum_bounds(b)])


def test_sums_the_bounds_allow_are_the_exact_sum_in_every_order():
    """Soundness: wherever the bounds allow it, float64 sums in shuffled orders and random groupings all
    equal the exact rational sum."""
    rng = np.random.default_rng(2)
    shuffler = random.Random(3)
    allowed = 0
    for trial in range(300):
        n = int(rng.integers(1, 400))
        spread = float(10.0 ** rng.integers(-12, 13))
        x = (rng.standard_normal(n) * spread).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x * 64) / np.float32(64)  # coarse grids, large values
        if not exact_in_any_order(n, *numpy_backend.sum_bounds(x)):
            continue
        allowed += 1
        exact = sum(Fraction(float(v)) for v in x.tolist())
        values = [float(v) for v in x.tolist()]
        for _ in range(5):
            shuffler.shuffle(values)
            total = 0.0
            for v in values:
                total += v
            assert Fraction(total) == exact
            groups = [values[i:i + 7] for i in range(0, len(values), 7)]
            assert Fraction(math.fsum([sum(g) for g in groups])) == exact and Fraction(sum(sum(g) for g in groups)) == exact
    assert allowed > 50


def test_the_bounds_refuse_where_an_order_changes_the_sum():
    x = np.array([2.0**24, 1.0, 2.0**-30, -(2.0**24)], dtype=np.float32)
    assert not exact_in_any_order(len(x), *numpy_backend.sum_bounds(x))
    a = ((np.float64(x[0]) + x[1]) + x[2]) + x[3]
    b = ((np.float64(x[0]) + x[3]) + x[1]) + x[2]
    assert a != b  # the float64 sum depends on the order here
    assert exact_in_any_order(2**20, 10, -20) and not exact_in_any_order(2**20 + 1, 10, -22)
    assert exact_in_any_order(1, 52, 0) and not exact_in_any_order(2, 52, 0)


# ---- the held path -----------------------------------------------------------------------------------
distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402

from .helpers import persist_spread  # noqa: E402


def _graph(fn, x):
    with dask.config.set({"multireduce.placement": False}):
        return fn(x).compute()


@pytest.fixture
def summed_together(monkeypatch):
    """How many chunks the workers summed into lane totals (the workers run in this process), with the
    path taken for NumPy chunks too: it is the GPU's (numpy_backend.SUMS_IN_ANY_ORDER says why not on the
    CPU), and its logic is the same."""
    monkeypatch.setattr(numpy_backend, "SUMS_IN_ANY_ORDER", True)
    made = []
    totals_here = direct._totals_here

    def counting(plan, keys, blocks, lane_of):
        made.extend(keys)
        return totals_here(plan, keys, blocks, lane_of)

    monkeypatch.setattr(direct, "_totals_here", counting)
    return made


def _field(seed, scale=1.0):
    a = np.random.default_rng(seed).standard_normal((60, 4, 5)).astype(np.float32) * np.float32(scale)
    a[7, 1, 2] = np.nan
    a[8, 0, 0] = -0.0
    return a


F64 = np.float64  # float32 sums and means accumulate in float32 unless float64 is asked for
REDUCTIONS = {
    "mean0": lambda v: mr.mean(v, axis=0, dtype=F64), "sum0k": lambda v: mr.sum(v, axis=0, dtype=F64, keepdims=True),
    "nansum0": lambda v: mr.nansum(v, axis=0, dtype=F64), "mean02": lambda v: mr.mean(v, axis=(0, 2), dtype=F64),
    "mean0_fan2": lambda v: mr.mean(v, axis=0, split_every=2, dtype=F64),
    "mean_expr": lambda v: mr.mean(v * 2 + 1, axis=0, dtype=F64),
}


@pytest.mark.parametrize("owners", [[0] * 4 + [1] * 4 + [2] * 4, [0, 1, 2] * 4, [2, 0, 0, 1, 2, 2, 1, 0, 0, 0, 1, 2]])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_exact_sums_over_an_axis_summed_per_worker_give_the_ordered_bits(cpu_client, summed_together, name, owners):
    a = _field(5)
    flat, _ = persist_spread(cpu_client, a.reshape(-1), 5 * 4 * 5, owners)
    x = flat.reshape(a.shape)
    fn = REDUCTIONS[name]
    with distributed.get_task_stream(cpu_client) as stream:
        value = fn(x).compute()
    assert stream.data == []  # one call, no task
    # every chunk summed into its worker's lane totals (a call planned again, where Dask's memory manager
    # dropped a replica meanwhile, sums some twice)
    assert len(set(summed_together)) == 12
    ref = _graph(fn, x)
    assert value.dtype == ref.dtype and value.shape == ref.shape
    assert np.array_equal(value, ref, equal_nan=True)
    assert np.array_equal(np.signbit(value), np.signbit(ref))


def test_sums_the_bounds_refuse_keep_the_ordered_fold(cpu_client, summed_together):
    a = _field(6)
    a[::2] *= np.float32(1e30)  # 1e30 beside values of order 1: float64 rounds, the order decides the bits
    a[1::4] *= np.float32(1e-30)
    flat, _ = persist_spread(cpu_client, a.reshape(-1), 5 * 4 * 5, [0, 1, 2] * 4)
    x = flat.reshape(a.shape)
    value = mr.mean(x, axis=0, dtype=F64).compute()
    assert len(set(summed_together)) == 12  # tried, and refused by the bounds
    assert np.array_equal(value, _graph(lambda v: mr.mean(v, axis=0, dtype=F64), x), equal_nan=True)


def test_partials_too_large_for_the_client_go_direct_only_where_the_sums_are_exact(cpu_client, summed_together,
                                                                                     monkeypatch):
    """Per-chunk partials past DIRECT_PARTIAL_BYTES: one total per lane and worker still fits, so the direct path
    takes the sum where the bounds allow it, and the graph where they do not."""
    good = _field(7)
    bad = _field(8)
    bad[::2] *= np.float32(1e30)
    for a, direct_expected in ((good, True), (bad, False)):
        flat, _ = persist_spread(cpu_client, a.reshape(-1), 5 * 4 * 5, [0, 1, 2] * 4)
        x = flat.reshape(a.shape)
        ref = _graph(lambda v: mr.mean(v, axis=0, dtype=F64), x)
        per_chunk_partials = 12 * 4 * 5 * 8
        monkeypatch.setattr(direct, "DIRECT_PARTIAL_BYTES", per_chunk_partials // 2)  # 3 totals per lane fit
        with distributed.get_task_stream(cpu_client) as stream:
            value = mr.mean(x, axis=0, dtype=F64).compute()
        monkeypatch.undo()
        assert (stream.data == []) == direct_expected
        assert np.array_equal(value, ref, equal_nan=True)


def test_narrow_results_keep_the_ordered_fold_of_their_small_partials(cpu_client, summed_together, monkeypatch):
    """A column sum of a tall matrix: every chunk holds more elements per output than
    direct.ANY_ORDER_CHUNK_PER_OUTPUT, so a bounds read of it would cost more than moving its partial; the
    ordered fold runs (one call, no task), with the same bits either way."""
    m = np.random.default_rng(10).integers(-1000, 1000, (12 * 5000, 2)).astype(np.float32)
    flat, _ = persist_spread(cpu_client, m.reshape(-1), 5000 * 2, [0, 1, 2] * 4)
    x = flat.reshape(m.shape)
    fn = lambda v: mr.sum(v, axis=0, dtype=F64)  # noqa: E731
    ref = _graph(fn, x)
    with distributed.get_task_stream(cpu_client) as stream:
        value = fn(x).compute()
    assert stream.data == [] and summed_together == [] and np.array_equal(value, ref)
    monkeypatch.setattr(direct, "ANY_ORDER_CHUNK_PER_OUTPUT", 5000)
    assert np.array_equal(fn(x).compute(), ref) and len(set(summed_together)) == 12


def test_mean_over_time_against_numpy(cpu_client):
    a = _field(9, scale=40.0) + np.float32(280)  # a temperature-like field: exact sums in any order
    flat, _ = persist_spread(cpu_client, a.reshape(-1), 5 * 4 * 5, [1, 2, 0, 0] * 3)
    x = flat.reshape(a.shape)
    np.testing.assert_allclose(mr.mean(x, axis=0, dtype=F64).compute(), a.astype(np.float64).mean(axis=0), rtol=1e-12,
                               equal_nan=True)


def test_float32_sums_over_some_axes_of_gpu_chunks_accumulate_in_float64():
    """dtypes.WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS: a Dask array of CuPy chunks reduced over a leading
    run of its axes (sum, mean) accumulates float32 in float64 and returns float32; trailing axes, a whole
    reduction, a CuPy or NumPy array, a dtype asked for and the other operators keep their accumulator."""
    from multireduce import api, dtypes
    from multireduce.operators import get_operator

    def plan(kind, axis, requested=None, op="sum", mean=False, dtype=np.float32, ndim=3):
        plans, _, _, _ = api._resolve_reduction(kind, get_operator(op), np.dtype(dtype), ndim, axis, requested,
                                                False, None, "auto", mean, None, "test")
        return plans[-1].acc_dtype, plans[-1].out_dtype

    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert plan("dask-cupy", 0) == (f64, f32) and plan("dask-cupy", (0, 1), mean=True) == (f64, f32)
    assert plan("dask-cupy", (1, 2), mean=True) == (f32, f32) and plan("dask-cupy", 1, ndim=2) == (f32, f32)
    assert plan("dask-cupy", 0, ndim=1) == (f32, f32)  # every axis of a 1-d array: a whole reduction
    assert plan("dask-cupy", None) == (f32, f32) and plan("dask-cupy", (0, 1, 2), mean=True) == (f32, f32)
    assert plan("cupy", 0) == (f32, f32) and plan("dask-numpy", 0) == (f32, f32) and plan("numpy", 0) == (f32, f32)
    assert plan("dask-cupy", 0, requested=np.float32) == (f32, f32)  # a dtype asked for is the accumulator
    assert plan("dask-cupy", 0, requested=np.float64) == (f64, f64)
    assert plan("dask-cupy", 0, op="max") == (f32, f32) and plan("dask-cupy", 0, op="prod") == (f32, f32)
    assert plan("dask-cupy", 0, dtype=np.float16) == (f32, np.dtype(np.float16))
    assert plan("dask-cupy", 0, dtype=np.float64) == (f64, f64)
    saved = dtypes.WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS
    try:
        dtypes.WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS = False
        api._resolve_reduction.cache_clear()
        assert plan("dask-cupy", 0) == (f32, f32)
    finally:
        dtypes.WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS = saved
        api._resolve_reduction.cache_clear()
