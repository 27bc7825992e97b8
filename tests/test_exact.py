"""multireduce.exact: correctly rounded sums, means and cumsums against exact rational references."""

from __future__ import annotations

import math
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

from multireduce import exact  # noqa: E402

SIZES = [1, 2, 31, 33, 1023, 1025, 4097]
FLOATS = [np.float16, np.float32, np.float64]


def ref_round(value: Fraction, dt) -> float:
    """``value`` correctly rounded (half to even) to ``dt``, found independently of multireduce: the two
    neighbours of NumPy's cast of float(value), compared exactly."""
    dt = np.dtype(dt)
    top = np.finfo(dt).max
    if abs(value) >= Fraction(float(top)) + Fraction(float(top) - float(np.nextafter(top, dt.type(0)))) / 2:
        return math.inf if value > 0 else -math.inf  # IEEE: overflow from half an ulp past the largest finite
    with np.errstate(over="ignore"):
        c = np.array(float(value)).astype(dt)
    cands = [c, np.nextafter(c, dt.type(np.inf)), np.nextafter(c, dt.type(-np.inf))]
    cands = [x for x in cands if np.isfinite(x)]
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]

    def key(x):
        return (abs(Fraction(float(x)) - value), int(np.array(x).view(uint)) & 1)

    return float(min(cands, key=key))


def exact_sum(x) -> Fraction:
    return sum((Fraction(float(v)) for v in np.asarray(x).ravel()), Fraction(0))


def data(rng, n, dt, kind):
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "range":  # huge dynamic range with both signs
        span = 12 if dt == np.float16 else 60
        x = rng.standard_normal(n) * np.exp2(rng.integers(-span, span, n))
    elif kind == "cancel":  # large terms that cancel, leaving small ones
        big = rng.standard_normal(n // 2 + 1) * 1e4
        x = np.concatenate([big, -big, rng.standard_normal(n) * 1e-3])[:n]
        rng.shuffle(x)
    else:
        raise ValueError(kind)
    x = x.astype(dt)
    if dt == np.float16:
        x = x[np.isfinite(x)]
    return x


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("kind", ["normal", "range", "cancel"])
def test_sum_correctly_rounded(dt, kind):
    rng = np.random.default_rng(abs(hash((str(dt), kind))) % 2**32)
    for n in SIZES:
        x = data(rng, n, dt, kind)
        got = exact.sum(x)
        assert got.dtype == x.dtype
        assert float(got) == ref_round(exact_sum(x), dt), (n, kind)
        if dt == np.float64:
            assert float(got) == math.fsum(x)


def test_sum_float32_to_float64_and_back():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1025).astype(np.float32)
    assert exact.sum(x, dtype=np.float64) == math.fsum(x.astype(np.float64))
    y = rng.standard_normal(1025) * 1e3
    assert float(exact.sum(y, dtype=np.float32)) == ref_round(exact_sum(y), np.float32)


def test_adversarial():
    tiny = np.nextafter(0.0, 1.0)
    cases = [
        [1.0, 2.0**-53],  # exact tie: stays on the even 1.0
        [1.0 + 2.0**-52, 2.0**-53],  # tie: rounds up to the even neighbour
        [1.0, 2.0**-53, 2.0**-105],  # just over the tie
        [1e308, 1e308, -1e308, -1e308, 1.0],  # an intermediate overflow that cancels
        [2.0**1023, -(2.0**1023), tiny, tiny, -tiny],  # subnormal survivors
        [tiny] * 1025,
        [1e16, 1.0, -1e16, 3.0, 2.0**-1000],  # condition number far beyond 1e16
        [-0.5 * tiny, 0.25],  # a value NumPy keeps in float64 only
    ]
    for c in cases:
        x = np.array(c, dtype=np.float64)
        x = x[np.isfinite(x)]
        assert exact.sum(x) == ref_round(exact_sum(x), np.float64), c
    assert exact.sum(np.array([2.0**1023] * 3)) == np.inf
    assert exact.sum(np.array([-(2.0**1023)] * 3)) == -np.inf
    h = np.array([65504.0, 16.0], dtype=np.float16)  # float16: 65520 is the tie that overflows
    assert exact.sum(h) == np.inf and exact.sum(h).dtype == np.float16


@pytest.mark.parametrize("dt", FLOATS)
def test_inf_nan_follow_numpy(dt):
    rng = np.random.default_rng(5)
    for specials in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf], [np.inf, np.inf, np.nan]):
        for n in (1, 33, 1025):
            x = rng.standard_normal(n).astype(dt)
            pos = rng.choice(n + len(specials), len(specials), replace=False)
            x = np.insert(x, np.sort(pos) - np.arange(len(specials)), specials).astype(dt)
            with np.errstate(invalid="ignore"):
                expect = np.sum(x)
            got = exact.sum(x)
            assert np.isnan(got) == np.isnan(expect) and (np.isnan(got) or got == expect), (specials, n)


def test_axis_keepdims_and_input_untouched():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 33, 7)) * np.exp2(rng.integers(-40, 40, (5, 33, 7)))
    before = x.copy()
    for axis in (0, 1, 2, -1, (0, 2), (1, 2), None):
        got = exact.sum(x, axis=axis, keepdims=True)
        assert got.shape == np.sum(x, axis=axis, keepdims=True).shape
        flat = exact.sum(x, axis=axis)
        assert flat.shape == np.sum(x, axis=axis).shape
        axes = tuple(range(3)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
        moved = np.moveaxis(x, [a % 3 for a in axes], list(range(len(axes))))
        lanes = moved.reshape(math.prod(moved.shape[: len(axes)]), -1)
        ref = [math.fsum(lanes[:, j]) for j in range(lanes.shape[1])]
        assert np.array_equal(np.ravel(flat), ref)
    assert np.array_equal(x, before)


def test_empty_and_mean():
    assert exact.sum(np.zeros(0)) == np.sum(np.zeros(0))
    assert exact.sum(np.ones((0, 3)), axis=0).shape == (3,)
    rng = np.random.default_rng(11)
    for dt in FLOATS:
        for n in (1, 3, 31, 1025):
            x = (rng.standard_normal(n) * 100).astype(dt)
            ref = ref_round(exact_sum(x) / n, dt)
            got = exact.mean(x)
            assert float(got) == ref and got.dtype == dt
    with np.errstate(invalid="ignore"):
        assert np.isnan(exact.mean(np.zeros(0)))


def test_cumsum_every_prefix_correctly_rounded():
    rng = np.random.default_rng(13)
    for dt in FLOATS:
        x = data(rng, 300, dt, "range") if dt != np.float16 else data(rng, 300, dt, "normal")
        got = exact.cumsum(x)
        assert got.dtype == dt and got.shape == x.shape
        acc = Fraction(0)
        for i, v in enumerate(x):
            acc += Fraction(float(v))
            assert float(got[i]) == ref_round(acc, dt), (dt, i)
    x = np.array([1.0, np.inf, 2.0, -np.inf, 3.0, np.nan])
    got = exact.cumsum(x)
    with np.errstate(invalid="ignore"):
        expect = np.cumsum(x)
    assert np.array_equal(got, expect, equal_nan=True)
    m = rng.standard_normal((4, 37))
    for axis in (0, 1):
        got = exact.cumsum(m, axis=axis)
        lanes = np.moveaxis(m, axis, -1)
        ref = np.array([[math.fsum(l[: i + 1]) for i in range(l.size)] for l in lanes])
        assert np.array_equal(np.moveaxis(got, axis, -1), ref)
    assert np.array_equal(exact.cumsum(m), exact.cumsum(m.ravel()))


@pytest.mark.parametrize("chunks", [1, 7, 100, 1025, (3, 500, 22, 500)])
def test_dask_sum_bitwise_across_chunkings(chunks):
    rng = np.random.default_rng(17)
    x = rng.standard_normal(1025) * np.exp2(rng.integers(-80, 80, 1025))
    d = da.from_array(x, chunks=chunks)
    ref = exact.sum(x)
    for split_every in (2, 3, 16):
        got = exact.sum(d, split_every=split_every).compute()
        assert bits(got) == bits(ref)
    assert bits(exact.mean(d).compute()) == bits(exact.mean(x))
    assert np.array_equal(bits(exact.cumsum(d).compute()), bits(exact.cumsum(x)))


def test_dask_axes_and_2d_cumsum():
    rng = np.random.default_rng(19)
    x = rng.standard_normal((33, 31)) * 1e8
    d = da.from_array(x, chunks=(10, 7))
    for axis in (0, 1, None, (0, 1)):
        for keepdims in (False, True):
            assert np.array_equal(bits(exact.sum(d, axis=axis, keepdims=keepdims).compute()),
                                  bits(exact.sum(x, axis=axis, keepdims=keepdims)))
    for axis in (0, 1):
        assert np.array_equal(bits(exact.cumsum(d, axis=axis).compute()), bits(exact.cumsum(x, axis=axis)))


# -- chunks of any size: no float sum past 2**53, no bins per output, host objects a batch at a time -------


def test_a_batch_of_pieces_sums_exactly_in_float64():
    """Every piece is an integer below 2**27 (float64 mantissas split 27/26, float32/16 mantissas whole), and
    np.bincount sums at most _BATCH of them into a cell: exact while _BATCH * 2**27 <= 2**53."""
    assert exact._BATCH * 2**27 <= 2**53
    rng = np.random.default_rng(41)
    for dt in FLOATS:
        x = data(rng, 4097, dt, "range")
        index, pieces = exact._pieces(x)
        value = Fraction(0)
        for weights, shift in pieces:
            wide = weights.astype(np.float64)
            assert np.all(np.abs(wide) < 2**27) and np.all(wide == np.floor(wide))
            value += sum(Fraction(int(w)) * Fraction(2) ** (int(k) + shift + exact.EBASE)
                         for w, k in zip(weights.tolist(), index.tolist()))
        assert value == exact_sum(x), dt


@pytest.mark.parametrize("batch", [1, 2, 5, 64, 1000])
def test_batches_cut_rows_anywhere(monkeypatch, batch):
    """Small batches (np.bincount calls) cutting rows at every offset: each batch's cells go into the rows'
    integers, one row's or several rows' (their exponents only, dense or as the pairs that occur)."""
    rng = np.random.default_rng(batch)
    shapes = [(1, 1025), (7, 33), (33, 7), (300, 3), (5, 1), (4, 250)]
    cases = {shape: (data(rng, math.prod(shape), np.float64, "range").reshape(shape),
                     data(rng, math.prod(shape), np.float32, "cancel").reshape(shape),
                     data(rng, math.prod(shape), np.float64, "normal").reshape(shape)) for shape in shapes}
    whole = {shape: [exact.sum(x, axis=1) for x in xs] for shape, xs in cases.items()}
    monkeypatch.setattr(exact, "_BATCH", batch)
    monkeypatch.setattr(exact, "_FOLD", 3)
    for shape, xs in cases.items():
        for x, want in zip(xs, whole[shape]):
            got = exact.sum(x, axis=1)
            assert np.array_equal(bits(got), bits(want)), (shape, x.dtype)
            assert [float(g) for g in got] == [ref_round(exact_sum(row), x.dtype) for row in x], (shape, x.dtype)
            assert np.array_equal(bits(exact.sum(x, axis=0)), bits(np.array([ref_round(exact_sum(c), x.dtype)
                                                                               for c in x.T], dtype=x.dtype)))


def test_sparse_cells_when_exponents_outnumber_elements(monkeypatch):
    """A batch of many short rows over ~200 binades takes the pairs that occur (np.unique), one of few
    binades the dense cells: both give every row's exact sum."""
    calls = []
    real_unique = np.unique
    monkeypatch.setattr(np, "unique", lambda *a, **k: calls.append(1) or real_unique(*a, **k))
    rng = np.random.default_rng(43)
    wide = data(rng, 3000, np.float64, "range").reshape(1000, 3)
    narrow = rng.random((30, 100))
    for x, sparse in ((wide, True), (narrow, False)):
        calls.clear()
        got = exact.sum(x, axis=1)
        assert bool(calls) == sparse
        assert [float(g) for g in got] == [math.fsum(row) for row in x]


def _one_binade_past_2_26() -> tuple[np.ndarray, int]:
    """2**26 + 1 float64 values in [1, 1.5) and their exact sum in units of 2**-52. The low 27 bits of the
    mantissas add up past 2**53 (an odd integer there, which a float64 sum rounds down by one), and the sum
    lies one unit past half an ulp above a value with an even last bit: one unit less is a tie that rounds
    down, to the even value."""
    n = (1 << 26) + 1
    low = (1 << 27) - 1
    a, b = (1 << 52) + (0x5A5A5A << 27) + low, (1 << 52) + (0x3C3C3C << 27) + low
    last = (1 << 52) + (0x123456 << 27) + (1 << 26) + (1 << 25) + 1
    x = np.empty(n)
    x[0:-1:2] = a * 2.0**-52
    x[1:-1:2] = b * 2.0**-52
    x[-1] = last * 2.0**-52
    return x, (n - 1) // 2 * (a + b) + last


@pytest.mark.slow
def test_past_2_26_elements_in_one_chunk_correctly_rounded():
    """The case that broke the promise: a float64 bin sum carried over 2**26 elements rounded, so NumPy input
    and a one-chunk Dask array gave one ulp less than the correctly rounded sum (and than two chunks)."""
    x, units = _one_binade_past_2_26()
    want = ref_round(Fraction(units, 1 << 52), np.float64)
    assert want != ref_round(Fraction(units - 1, 1 << 52), np.float64)  # one unit less rounds otherwise
    assert float(exact.sum(x)) == want
    for chunks in (x.size, (1 << 25, x.size - (1 << 25))):
        assert float(exact.sum(da.from_array(x, chunks=chunks)).compute(scheduler="synchronous")) == want, chunks


def _traced_peak(f) -> int:
    f()  # imports and caches first
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_axis_reductions_take_memory_in_proportion_to_the_data():
    """An exact reduction over a short axis holds one Python integer per output (~190 bytes, 8x a row of
    three float64) and per-batch temporaries, not 2100 float64 bins per output row (290 MB for 281 KB)."""
    import dask

    import multireduce as mr

    rng = np.random.default_rng(47)
    for rows in (1000, 4000):
        x = data(rng, rows * 3, np.float64, "range").reshape(rows, 3)
        nans = x.copy()
        nans[::7, 1] = np.nan
        d = da.from_array(x, chunks=(rows // 2, 3))
        with dask.config.set(scheduler="synchronous"):
            calls = {"dask sum": lambda: mr.sum(d, axis=1, exact=True, compute=True),
                     "mean": lambda: mr.mean(x, axis=1, exact=True),
                     "nansum": lambda: mr.nansum(nans, axis=1, exact=True),
                     "sum over axis 0 of a transpose": lambda: mr.sum(x.T, axis=0, exact=True)}
            for name, call in calls.items():
                peak = _traced_peak(call)
                assert peak < 40 * x.nbytes + 2**20, (name, rows, peak)


def test_cumsum_takes_memory_in_proportion_to_the_data():
    """Per-lane totals and carries are LaneStates (a total and flag bits), and a long lane becomes Python
    objects a segment at a time."""
    import dask

    rng = np.random.default_rng(53)
    y = rng.standard_normal((3, 2000))
    d = da.from_array(y, chunks=(1, 2000))
    with dask.config.set(scheduler="synchronous"):
        peak = _traced_peak(lambda: exact.cumsum(d, axis=0).compute())
    assert peak < 40 * y.nbytes + 2**20, peak
    lane = rng.standard_normal(1 << 15)
    peak = _traced_peak(lambda: exact.cumsum(lane))
    assert peak < 2 * lane.nbytes + 3 * 2**19, peak


def test_distributed_worker_counts():
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(23)
    x = rng.standard_normal(4097) * np.exp2(rng.integers(-100, 100, 4097))
    ref = exact.sum(x)
    for workers in (1, 2):
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                                      scheduler_port=0, dashboard_address="127.0.0.1:0") as cluster:
            with distributed.Client(cluster) as client:
                for chunks in (64, 1000):
                    d = da.from_array(x, chunks=chunks)
                    got = client.compute(exact.sum(d, split_every=4)).result()
                    assert bits(got) == bits(ref)


def test_bad_input_raises():
    with pytest.raises(TypeError, match="argument 'x'.*floating"):
        exact.sum(np.arange(5))
    with pytest.raises(TypeError, match="argument 'dtype'"):
        exact.sum(np.ones(3), dtype=np.int32)
    with pytest.raises(TypeError, match="keepdims"):
        exact.sum(np.ones(3), keepdims=1)
    with pytest.raises(np.exceptions.AxisError):
        exact.sum(np.ones(3), axis=1)
    with pytest.raises(TypeError, match="argument 'x'.*floating"):
        exact.cumsum(np.arange(5))


def test_exact_keyword_of_the_api_matches_the_exact_module_and_is_chunking_independent():
    import dask.array as da

    import multireduce as mr

    rng = np.random.default_rng(11)
    x = (rng.standard_normal(10_007) * 10.0 ** rng.integers(-12, 12, 10_007)).astype(np.float64)
    ref = math.fsum(x.tolist())
    assert mr.sum(x, exact=True) == ref
    bits = {float(mr.sum(da.from_array(x, chunks=c), exact=True, compute=True)) for c in (7, 1000, 4096)}
    assert bits == {ref}
    assert float(mr.mean(x, exact=True)) == float(mr.exact.mean(x))
    np.testing.assert_array_equal(mr.cumsum(x[:300], exact=True), mr.exact.cumsum(x[:300]))
    # integers are exact anyway: the plain path, NumPy's dtype
    assert mr.sum(np.arange(10, dtype=np.int32), exact=True) == 45
    with pytest.raises(TypeError, match="argument 'exact'"):
        mr.sum(x, exact=1)


# -- the GPU kernel's arithmetic, modelled in NumPy (backends/cupy_exact.py; runs without a GPU) ----------

from multireduce.backends import cupy_exact  # noqa: E402


def _words_value(words) -> Fraction:
    totals, nan, pinf, ninf = cupy_exact.fold_words(np.asarray(words, dtype=np.int64).reshape(1, -1))
    return Fraction(int(totals[0])) * Fraction(2) ** exact.EBASE


def _adversarial(kind: str, n: int, rng) -> np.ndarray:
    if kind == "cancel":  # x and -x, shuffled, plus a few small survivors
        half = rng.standard_normal(n // 2) * 1e12
        x = np.concatenate([half, -half, rng.standard_normal(n - 2 * (n // 2)) * 1e-9])
        x[: min(3, n)] += 1e-20
    elif kind == "range90":  # 90 orders of magnitude, both signs
        x = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-45, 45, n)
    elif kind == "subnormal":
        x = rng.standard_normal(n) * 5e-324 * rng.integers(1, 1 << 40, n)
        x[::3] = rng.standard_normal(x[::3].size) * 1e-310
    elif kind == "huge":  # near the float64 limit: beyond 2**960 the kernel deposits directly
        x = rng.choice([-1.0, 1.0], n) * rng.uniform(0.1, 1.7, n) * 1e308
        x[::2] = rng.standard_normal(x[::2].size)
    else:
        x = rng.random(n)
    rng.shuffle(x)
    return x


@pytest.mark.parametrize("kind", ["uniform", "cancel", "range90", "subnormal", "huge"])
@pytest.mark.parametrize("n", [1, 31, 33, 1025])
def test_kernel_model_is_exact(kind, n):
    rng = np.random.default_rng(n * 7 + len(kind))
    x = _adversarial(kind, n, rng)
    words = cupy_exact.model_words(x, threads=32)
    assert words[-1] == 0
    assert _words_value(words) == exact_sum(x)
    # same integer as the CPU path, for any thread count and expansion length
    for threads, terms in ((1, 1), (7, 2), (64, 8)):
        again = cupy_exact.model_words(x, threads=threads, terms=terms)
        assert _words_value(again) == _words_value(words)
    assert int(cupy_exact.fold_words(words.reshape(1, -1))[0][0]) == int(exact.state_of(x, (0,)).total[()])


@pytest.mark.parametrize("dt", FLOATS)
def test_kernel_model_narrow_dtypes(dt):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(1023) * 10.0 ** rng.integers(-3, 4, 1023)).astype(dt)
    x = x[np.isfinite(x)]
    words = cupy_exact.model_words(x, threads=16)
    assert _words_value(words) == exact_sum(x)
    assert float(exact.finish(exact.ExactState(cupy_exact.fold_words(words.reshape(1, -1))[0].reshape(()),
                                               np.array(False), np.array(False), np.array(False), x.size),
                              np.dtype(dt))) == ref_round(exact_sum(x), dt)


@pytest.mark.parametrize("specials", [[np.nan], [np.inf], [-np.inf], [np.inf, -np.inf], [np.nan, np.inf]])
def test_kernel_model_flags(specials):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(100)
    x[rng.choice(100, len(specials), replace=False)] = specials
    words = cupy_exact.model_words(x, threads=8)
    _, nan, pinf, ninf = cupy_exact.fold_words(words.reshape(1, -1))
    st = exact.state_of(x, (0,))
    assert (bool(nan[0]), bool(pinf[0]), bool(ninf[0])) == (bool(st.nan), bool(st.pinf), bool(st.ninf))
    finite = np.where(np.isfinite(x), x, 0.0)
    assert _words_value(words) == exact_sum(finite)


def test_fold_words_carries_and_signs():
    rng = np.random.default_rng(2)
    words = rng.integers(-(1 << 40), 1 << 40, size=(5, cupy_exact.KWORDS + 1))
    words[3] = 0  # zero
    info = np.iinfo(np.int64)  # the whole int64 range, every word's top bit in both states
    words[4] = rng.choice(np.array([info.min, info.max, -1, 1, 0], dtype=np.int64), cupy_exact.KWORDS + 1)
    words[:, -1] = [0, 1, 6, 0, 0]
    totals, nan, pinf, ninf = cupy_exact.fold_words(words)
    assert totals[3] == 0
    for r in range(5):
        expected = sum(int(w) << (32 * j) for j, w in enumerate(words[r, :-1]))
        assert Fraction(int(totals[r])) * Fraction(2) ** exact.EBASE == Fraction(expected) * Fraction(2) ** cupy_exact.WORD_BASE
    assert nan.tolist() == [False, True, False, False, False] and pinf.tolist() == [False, False, True, False, False]
    assert ninf.tolist() == [False, False, True, False, False]


def test_kernel_constants_match_python():
    import re
    from pathlib import Path

    text = (Path(cupy_exact.__file__).resolve().parents[2] / "kernels" / "exact.cuh").read_text()
    assert int(re.search(r"kWords = (\d+)", text).group(1)) == cupy_exact.KWORDS
    assert int(re.search(r"kBig = (\d+)", text).group(1)) == cupy_exact.BIG
    # the top of the words holds the largest sum the launch limits allow: 2**40 values below 2**1024
    assert 32 * cupy_exact.KWORDS + cupy_exact.WORD_BASE > 1024 + 40 + 32


# -- the kernel's own source, compiled for the host (g++) with one thread per block, blocks run in turn -----

_HOST_SHIM = r"""
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __launch_bounds__(x)
struct Dim { long long x, y, z; };
static Dim blockIdx, gridDim, blockDim, threadIdx;
inline void __syncthreads() {}
inline long long __double_as_longlong(double d) { long long v; std::memcpy(&v, &d, 8); return v; }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) { auto o = *p; *p |= v; return o; }
namespace mr { typedef long long index_t; struct half { unsigned short bits; };
inline float half_to_float(unsigned short) { return 0.f; }
template <class To, class From> struct Convert { static To apply(const From& v) { return static_cast<To>(v); } };
template <class From> struct Convert<half, From> { static half apply(const From&) { return half{0x7e00}; } }; }
"""

_HOST_MAIN = r"""
using namespace mr::exact;
template <class T> void run(const char* path, long long rows, long long n, long long offset, int grid) {
  FILE* f = fopen(path, "rb");
  std::vector<T> buf(rows * n + offset + 8);
  if (fread(buf.data() + offset, sizeof(T), rows * n, f) != (size_t)(rows * n)) exit(2);
  fclose(f);
  std::vector<long long> out(rows * kOut, 0);
  gridDim = {grid, 2, 1}; blockDim = {1, 1, 1}; threadIdx = {0, 0, 0};
  for (long long by = 0; by < 2; ++by)
    for (long long b = 0; b < grid; ++b) {
      blockIdx = {b, by, 0};
      exact_sum_rows<T, 4, 1>(buf.data() + offset, rows, n, n, out.data());
    }
  for (long long i = 0; i < rows * kOut; ++i) printf("%lld\n", out[i]);
}
int main(int argc, char** argv) {
  long long rows = atoll(argv[3]), n = atoll(argv[4]), off = atoll(argv[5]);
  int grid = atoi(argv[6]);
  if (argv[2][0] == 'd') run<double>(argv[1], rows, n, off, grid); else run<float>(argv[1], rows, n, off, grid);
}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    import shutil
    import subprocess
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    work = tmp_path_factory.mktemp("exact_host")
    source = (Path(cupy_exact.__file__).resolve().parents[2] / "kernels" / "exact.cuh").read_text()
    source = source.replace('#include "common.cuh"', _HOST_SHIM)
    source = source.replace('#include "exact_scan.cuh"', "")  # the scan: tests/test_exact_scan_emulated.py
    (work / "h.cpp").write_text(source + _HOST_MAIN)
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(work / "h"), str(work / "h.cpp")], check=True)
    return work


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["uniform", "cancel", "range90", "subnormal", "huge"])
def test_kernel_source_on_host(host_kernel, dt, kind):
    """exact.cuh's own arithmetic (grid-stride visit with misaligned heads, TwoSum cascade, deposits,
    carries, flags), one thread per block, blocks in turn: the same integer as the CPU state."""
    import subprocess

    rng = np.random.default_rng(len(kind))
    for rows, n, offset, grid in ((1, 1, 1, 1), (1, 1025, 1, 3), (3, 33, 3, 2), (2, 4099, 0, 5)):
        with np.errstate(over="ignore"):
            x = _adversarial(kind, rows * n, rng).astype(dt).reshape(rows, n)
        if kind == "uniform":
            x.reshape(-1)[rng.integers(0, x.size)] = [np.inf, -np.inf, np.nan][rng.integers(0, 3)]
        path = host_kernel / "in.bin"
        x.tofile(path)
        args = [str(host_kernel / "h"), str(path), "d" if dt == np.float64 else "f", str(rows), str(n), str(offset), str(grid)]
        words = np.array(subprocess.run(args, capture_output=True, text=True, check=True).stdout.split(), dtype=np.int64)
        totals, nan, pinf, ninf = cupy_exact.fold_words(words.reshape(rows, cupy_exact.KWORDS + 1))
        st = exact.state_of(x, (1,))
        assert [int(t) for t in totals] == [int(t) for t in st.total]
        assert nan.tolist() == st.nan.tolist() and pinf.tolist() == st.pinf.tolist() and ninf.tolist() == st.ninf.tolist()


# -- the exact GPU scan's host side and its pass-2 rounding model ---------------------------------------


def _same(a, b) -> bool:
    """Bitwise equal, any NaN equal to any NaN (NumPy's cumsum does not fix a NaN's sign)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(np.isnan(a), np.isnan(b)) and bits(a[~np.isnan(a)]).tolist() == bits(b[~np.isnan(b)]).tolist()


def _ref_prefixes(x, carry: Fraction, dt) -> list[float]:
    """Every prefix of ``carry + x`` rounded with ref_round, inf/NaN as NumPy's cumsum places them."""
    out, run, specials = [], carry, []
    for v in np.asarray(x, dtype=np.float64).tolist():
        if math.isfinite(v):
            run += Fraction(v)
        else:
            specials.append(v)
        if specials:
            with np.errstate(invalid="ignore"):
                out.append(float(np.sum(np.array(specials))))
        elif abs(run) >= Fraction(2) ** 1024:  # past every dtype's range (ref_round's float() would overflow)
            out.append(math.inf if run > 0 else -math.inf)
        else:
            out.append(ref_round(run, dt))
    return out


def _scan_cases(rng):
    yield "cancel", _adversarial("cancel", 1025, rng)
    yield "range90", _adversarial("range90", 1023, rng)
    yield "subnormal", _adversarial("subnormal", 257, rng)
    yield "huge", _adversarial("huge", 257, rng)
    ties = np.repeat([1.0, 2.0**-53, 2.0**-53, -(2.0**-53), 3 * 2.0**-53], 40)  # prefixes on half-ulps
    yield "ties", ties
    specials = rng.standard_normal(129)
    specials[[17, 60]] = [np.inf, -np.inf]
    yield "inf", specials
    nans = rng.standard_normal(65)
    nans[33] = np.nan
    yield "nan", nans


@pytest.mark.parametrize("dt", FLOATS)
def test_scan_model_rounds_every_prefix_exactly(dt):
    """Pass 2 of the exact GPU scan (double-double prefix, proved-or-fallback rounding) against fractions on
    adversarial data: a proved rounding is never wrong, and the fallbacks are counted."""
    rng = np.random.default_rng(np.dtype(dt).itemsize)
    fallbacks = {}
    for name, x in _scan_cases(rng):
        with np.errstate(over="ignore"):
            x = np.asarray(x).astype(dt)
        got, fallbacks[name] = cupy_exact.model_scan_tile(x, 0, 0, dt)
        assert _same(got, np.array(_ref_prefixes(x, Fraction(0), dt), dtype=dt)), name
        assert _same(got, exact.cumsum(x)), name
    if dt != np.float64:  # float16/32 outputs have 29+ bits of room: ordinary data needs no fallback
        assert fallbacks["range90"] + fallbacks["cancel"] <= 2, fallbacks


def test_scan_model_proves_ordinary_data():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(4097)
    got, fallbacks = cupy_exact.model_scan_tile(x, 0, 0, np.float64)
    assert _same(got, exact.cumsum(x))
    assert fallbacks <= 10  # the double-double prefix proves nearly every float64 rounding (2 today)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_scan_tiles_with_carried_words(dt):
    """Tiles scanned independently, each seeded with the exclusive scan of the earlier tiles' words (what
    pass 1 gives), equal the CPU exact cumsum of the whole array bitwise, including flags that carry."""
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        x = np.concatenate([_adversarial("range90", 700, rng), _adversarial("cancel", 333, rng)]).astype(dt)
    x[500] = np.inf
    for tile in (1, 31, 256):
        starts = list(range(0, x.size, tile))
        words = np.stack([cupy_exact.model_words(x[s:s + tile], threads=8) for s in starts])
        carries, flags = cupy_exact.tile_carries(words)
        assert carries[0] == 0 and flags[0] == 0
        pieces = [cupy_exact.model_scan_tile(x[s:s + tile], c, int(f), dt)[0]
                  for s, c, f in zip(starts, carries, flags)]
        assert _same(np.concatenate(pieces), exact.cumsum(x)), tile


def test_scan_model_seed_beyond_float64_falls_back():
    big = 2**1024 * 2**-exact.EBASE  # a carry past the float64 range: every element rounds from words
    x = np.array([-1.7e308, -1.7e308, 1.0], dtype=np.float64)
    got, fallbacks = cupy_exact.model_scan_tile(x, big, 0, np.float64)
    carry = Fraction(2) ** 1024
    assert _same(got, np.array(_ref_prefixes(x, carry, np.float64)))
    assert fallbacks == 3
