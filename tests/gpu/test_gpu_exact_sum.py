"""GPU: the exact sum kernel (kernels/exact.cuh via backends/cupy_exact.py). GPU bits == CPU exact bits ==
the correctly rounded Fraction reference, with no copy of the data to the host."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import multireduce as mr
from multireduce import exact
from multireduce.backends import cupy_exact

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

FLOATS = [np.float16, np.float32, np.float64]
KINDS = ["uniform", "cancel", "range90", "subnormal", "huge"]


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def make(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    if kind == "cancel":
        half = rng.standard_normal(n // 2) * 1e4
        x = np.concatenate([half, -half, rng.standard_normal(n - 2 * (n // 2)) * 1e-3])
        x[: min(3, n)] += 1e-3
    elif kind == "range90":
        x = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-45, 45, n)
    elif kind == "subnormal":
        x = rng.standard_normal(n) * 5e-324 * rng.integers(1, 1 << 40, n)
    elif kind == "huge":
        x = rng.choice([-1.0, 1.0], n) * rng.uniform(0.1, 1.7, n) * 1e308
        x[::2] = rng.standard_normal(x[::2].size)
    elif kind == "normal":
        x = rng.standard_normal(n)
    else:
        x = rng.random(n)
    rng.shuffle(x)
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    x[~np.isfinite(x)] = 1  # narrow dtypes: out-of-range values become ordinary ones, not inf
    return x


def reference(x: np.ndarray, dtype) -> float:
    from tests.test_exact import ref_round

    return ref_round(sum((Fraction(float(v)) for v in x.ravel()), Fraction(0)), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 31, 33, 1025, 4096 * 16 + 3])
def test_gpu_bits_equal_cpu_and_fraction(dtype, kind, n):
    x = make(kind, n, dtype)
    got = exact.sum(cupy.asarray(x))
    assert isinstance(got, cupy.ndarray) and got.dtype == dtype
    cpu = exact.sum(x)
    assert bits(cupy.asnumpy(got)) == bits(cpu)
    if n <= 1025:
        assert bits(cupy.asnumpy(got)) == bits(np.asarray(reference(x, dtype), dtype=dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_state_integer_equals_cpu(dtype):
    x = make("range90", (1 << 20) + 5, dtype)
    gpu = exact.state_of(cupy.asarray(x), (0,))
    cpu = exact.state_of(x, (0,))
    assert int(gpu.total[()]) == int(cpu.total[()]) and gpu.count == cpu.count


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("offset", [1, 2, 3, 7])
def test_misaligned_and_strided_views(dtype, offset):
    x = make("cancel", 5000, dtype, seed=offset)
    g = cupy.asarray(x)
    for view, host in ((g[offset:], x[offset:]), (g[offset:-offset], x[offset:-offset]), (g[::offset + 1], x[::offset + 1])):
        assert bits(cupy.asnumpy(exact.sum(view))) == bits(exact.sum(host))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, 2, (0, 2), (1, 2), None])
def test_axes_keepdims_mean(dtype, axis):
    x = make("range90", 7 * 33 * 129, dtype, seed=3).reshape(7, 33, 129)
    g = cupy.asarray(x)
    for kd in (False, True):
        assert np.array_equal(bits(cupy.asnumpy(exact.sum(g, axis=axis, keepdims=kd))), bits(exact.sum(x, axis=axis, keepdims=kd)))
        assert np.array_equal(bits(cupy.asnumpy(exact.mean(g, axis=axis, keepdims=kd))), bits(exact.mean(x, axis=axis, keepdims=kd)))
    t = cupy.asarray(np.asfortranarray(x))  # non-contiguous rows: moved with one device copy
    assert np.array_equal(bits(cupy.asnumpy(exact.sum(t, axis=axis))), bits(exact.sum(x, axis=axis)))


def test_many_rows_past_grid_y():
    x = make("normal", 70000 * 3, np.float32).reshape(70000, 3)
    assert np.array_equal(bits(cupy.asnumpy(exact.sum(cupy.asarray(x), axis=1))), bits(exact.sum(x, axis=1)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("specials", [[np.nan], [np.inf], [-np.inf], [np.inf, -np.inf], [-np.inf, np.nan]])
@pytest.mark.parametrize("where", ["first", "last", "middle"])
def test_inf_nan_placement(dtype, specials, where):
    x = make("uniform", 1025, dtype)
    at = {"first": 0, "last": 1025 - len(specials), "middle": 511}[where]
    x[at : at + len(specials)] = specials
    g = cupy.asarray(x)
    for view, host in ((g, x), (g[1:], x[1:])):
        got = cupy.asnumpy(exact.sum(view))
        with np.errstate(invalid="ignore"):
            expected = np.sum(host.astype(np.float64)).astype(dtype)
        assert bits(got) == bits(exact.sum(host))
        assert (np.isnan(got) and np.isnan(expected)) or got == expected
    assert bits(cupy.asnumpy(mr.nansum(g, exact=True))) == bits(mr.nansum(x, exact=True))


def test_grid_and_repeats_do_not_change_the_words(monkeypatch):
    x = cupy.asarray(make("range90", (1 << 18) + 11, np.float64))
    first = exact.state_of(x, (0,))
    for _ in range(20):
        assert int(exact.state_of(x, (0,)).total[()]) == int(first.total[()])
    for gx in (1, 3, 64, 1000):
        monkeypatch.setattr(cupy_exact, "_grid_x", lambda *args, gx=gx: gx)
        assert int(exact.state_of(x, (0,)).total[()]) == int(first.total[()])
    monkeypatch.setattr(cupy_exact, "_PER_BLOCK_LIMIT", 1000)  # many launches into the same words
    assert int(exact.state_of(x, (0,)).total[()]) == int(first.total[()])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dask_of_cupy_chunkings(dtype):
    da = pytest.importorskip("dask.array")
    x = make("cancel", 100003, dtype, seed=9)
    expected = bits(exact.sum(x))
    for chunks in (100003, 4096, 33333, 777):
        d = da.from_array(x, chunks=chunks, asarray=False).map_blocks(cupy.asarray, dtype=x.dtype)
        for split_every in (2, 8):
            got = mr.sum(d, exact=True, split_every=split_every)
            got = got.compute() if hasattr(got, "compute") else got
            assert bits(cupy.asnumpy(cupy.asarray(got))) == expected
        m = mr.mean(d, exact=True)
        m = m.compute() if hasattr(m, "compute") else m
        assert bits(cupy.asnumpy(cupy.asarray(m))) == bits(exact.mean(x))


@pytest.mark.large
def test_past_2_31_elements():
    n = (1 << 31) + 7
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 12 * 2**30:
        pytest.skip(f"needs ~12 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    ints = cupy.random.randint(-1000, 1001, size=n, dtype=cupy.int16)
    expected = int(cupy.sum(ints, dtype=cupy.int64))
    x = ints.astype(cupy.float16)
    del ints
    assert float(exact.sum(x, dtype=np.float64)) == float(expected)
    del x
    cupy.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------------------------------------
# hostile rows of tests/test_exact_emulated.py on the GPU: exact words for every grid, and the very
# words the host emulator (tools/exact_host_emulator.cpp) computes for the same grid
# ------------------------------------------------------------------------------------------------
def _emulated():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import exact_emulate

    return exact_emulate if exact_emulate.compiler() else None


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 31, 33, 1023, 1025, (1 << 16) + 5])
def test_hostile_rows_exact_words_for_every_grid(dtype, n, monkeypatch):
    from tests.test_exact_emulated import exact_total, hostile

    emulator = _emulated()
    rows = hostile(dtype, n, np.random.default_rng(n))
    for name, x in rows.items():
        want = exact_total(x)
        for offset in (0, 1):  # 1 element: the head path before the 16-byte packs
            host = x[offset:]
            g = cupy.asarray(x)[offset:]
            if offset:
                want = exact_total(host)
            for gx in (1, 3, 7, 132):
                monkeypatch.setattr(cupy_exact, "_grid_x", lambda *args, gx=gx: gx)
                words = cupy.asnumpy(cupy_exact.device_words(g.reshape(1, -1)))
                totals, nan, pinf, ninf = cupy_exact.fold_words(words)
                assert (totals[0], bool(nan[0]), bool(pinf[0]), bool(ninf[0])) == want, (name, offset, gx)
                if emulator is not None and host.size <= 1025:
                    emulated = emulator.emulate_words(host, grid=gx, block=cupy_exact.BLOCK, terms=cupy_exact.TERMS,
                                                      unroll=cupy_exact.UNROLL[host.dtype.name], byte_offset=offset * host.dtype.itemsize)
                    assert np.array_equal(words[0], emulated), (name, offset, gx)
            with np.errstate(invalid="ignore", over="ignore"):
                assert bits(cupy.asnumpy(exact.sum(g))) == bits(exact.sum(host)), (name, offset)


@pytest.mark.parametrize("dtype", FLOATS)
def test_blocks_per_sm_knob_keeps_the_words_exact(dtype):
    from tests.test_exact_emulated import exact_total, hostile

    x = hostile(dtype, (1 << 20) + 3, np.random.default_rng(5))["spread"]
    g = cupy.asarray(x).reshape(1, -1)
    want = exact_total(x)
    for per_sm in (1, 2, 4, 8, 32):
        totals, nan, pinf, ninf = cupy_exact.fold_words(cupy.asnumpy(cupy_exact.device_words(g, blocks_per_sm=per_sm)))
        assert (totals[0], bool(nan[0]), bool(pinf[0]), bool(ninf[0])) == want, per_sm


@pytest.mark.parametrize("kind", ["subnormal", "range90", "uniform"])
def test_nvrtc_build_is_exact_on_float32_subnormals(kind, monkeypatch):
    """The exact kernels compiled by CuPy's NVRTC (what runs where the prebuilt binary does not match: a
    GPU outside its architectures, an edited source) give the prebuilt kernels' bits. CuPy appends -ftz=true
    to every NVRTC compile, which flushed float32 subnormals even in the conversion to double."""
    from multireduce import kernels

    x = make(kind, 4096 + 5, np.float32)
    x[:7] = np.array([1e-45, -1e-45, 3e-42, 1.1754942e-38, -2e-40, 1.0, 1e-39], dtype=np.float32)
    want = exact.sum(x)
    monkeypatch.setenv("MULTIREDUCE_NO_PREBUILT", "1")
    monkeypatch.setattr(cupy_exact, "_loaded", {})
    monkeypatch.setattr(kernels, "_modules", {})
    g = cupy.asarray(x)
    assert bits(cupy.asnumpy(exact.sum(g))) == bits(want)
    for n in (1, 2, 5):  # a lone subnormal: the head path and the pack path
        assert bits(cupy.asnumpy(exact.sum(g[:n]))) == bits(exact.sum(x[:n])), n
    words = cupy.asnumpy(cupy_exact.device_words(g.reshape(1, -1)))
    assert int(cupy_exact.fold_words(words)[0][0]) == int(exact.state_of(x, (0,)).total[()])


# ------------------------------------------------------------------------------------------------
# limits of the words, and memory that follows the data (tests/test_exact_scan_emulated.py models them on
# the CPU): relaxed words between launches, rows in batches of words
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_words_relaxed_between_launches_stay_exact(dtype, monkeypatch):
    """A row longer than _PER_BLOCK_LIMIT per block takes several launches into the same words; with
    _WORD_ADDS small the words are relaxed (relax_words) before the launches that would pass it: the same
    exact total, sum and mean."""
    x = make("range90", (1 << 18) + 11, dtype)
    g = cupy.asarray(x)
    total = int(exact.state_of(x, (0,)).total[()])
    monkeypatch.setattr(cupy_exact, "_PER_BLOCK_LIMIT", 1000)
    for adds in (1, 100, 200, 1 << 30):  # gx blocks add once per launch: relaxed every launch, or every few
        monkeypatch.setattr(cupy_exact, "_WORD_ADDS", adds)
        assert int(exact.state_of(g, (0,)).total[()]) == total, adds
        assert bits(cupy.asnumpy(exact.sum(g))) == bits(exact.sum(x)), adds
        assert bits(cupy.asnumpy(exact.mean(g))) == bits(exact.mean(x)), adds


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_rows_go_in_batches_of_words(dtype, monkeypatch):
    """Reductions over a short axis: _WORDS_PER_BATCH of 5 rows' words; sums, means, nansums and the
    states of Dask chunks equal the CPU's bits, and no launch holds the words of more than 5 rows."""
    x = make("range90", 1003 * 37, dtype, seed=4).reshape(1003, 37)
    x[::11, 5] = np.nan
    g = cupy.asarray(x)
    seen = []
    real = cupy_exact.device_words

    def counted(rows, *args, **kwargs):
        seen.append(rows.shape[0])
        return real(rows, *args, **kwargs)

    monkeypatch.setattr(cupy_exact, "device_words", counted)
    monkeypatch.setattr(cupy_exact, "_WORDS_PER_BATCH", 5 * (cupy_exact.KWORDS + 1))
    with np.errstate(invalid="ignore"):
        for axis in (1, 0):
            assert np.array_equal(bits(cupy.asnumpy(exact.sum(g, axis=axis))), bits(exact.sum(x, axis=axis)))
            assert np.array_equal(bits(cupy.asnumpy(exact.mean(g, axis=axis))), bits(exact.mean(x, axis=axis)))
            assert np.array_equal(bits(cupy.asnumpy(mr.nansum(g, axis=axis, exact=True))),
                                  bits(mr.nansum(x, axis=axis, exact=True)))
        state, want = exact.state_of(g, (1,)), exact.state_of(x, (1,))
    assert [int(t) for t in state.total] == [int(t) for t in want.total]
    assert np.array_equal(state.nan, want.nan)
    assert seen and max(seen) <= 5


def device_memory_of(call):
    """(``call()``, the bytes a fresh CuPy memory pool held for it once it finished)."""
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        got = call()
        cupy.cuda.Device().synchronize()
        return got, pool.total_bytes()


def test_many_short_rows_hold_their_words_a_batch_at_a_time():
    """2^20 rows of 3: the words of one batch of rows (32 MiB), not 584 bytes for every row (611 MB)."""
    host = make("normal", 3 << 20, np.float64, seed=8).reshape(1 << 20, 3)
    x = cupy.asarray(host)
    got, held = device_memory_of(lambda: exact.sum(x, axis=1))
    assert held < 2 * x.nbytes + 64 * 2**20, held
    for rows in (slice(0, 2000), slice(-2000, None)):  # the host path takes ~10 s for all rows
        assert np.array_equal(bits(cupy.asnumpy(got[rows])), bits(exact.sum(host[rows], axis=1)))
