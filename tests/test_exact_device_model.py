"""backends/cupy_exact.py's host side run without a GPU: CuPy stood in for by NumPy, and each kernel by a
model of its contract (a block adds the unique digits of its elements' exact sum into the row's words; pass 1
writes a tile's digits and flag counts; pass 2 rounds carry + prefix, the carry read from the words' cumsum).
The kernels themselves are tested against the host emulator (tests/test_exact_emulated.py,
tests/test_exact_scan_emulated.py); this is the launch plumbing around them: rows in batches of words,
launches into the same words with relaxed words between them, rows of many tiles in segments chained by
carry_after, carries per lane. tests/gpu/test_gpu_exact_sum.py and test_gpu_exact_scan.py run the same on
a GPU."""

from __future__ import annotations

import collections
import contextlib
import sys
import types

import numpy as np
import pytest

from multireduce import exact
from multireduce.backends import cupy_exact

K = cupy_exact.KWORDS


class Device(np.ndarray):
    """A NumPy array with the two CuPy attributes the host side reads, and ``get``."""

    @property
    def _c_contiguous(self) -> bool:
        return self.flags.c_contiguous

    @property
    def data(self):
        return types.SimpleNamespace(device_id=0)

    def get(self) -> np.ndarray:
        return np.array(self)


def dev(a) -> Device:
    return np.asarray(a).view(Device)


def fake_cupy() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        zeros=lambda *a, **k: dev(np.zeros(*a, **k)), empty=lambda *a, **k: dev(np.empty(*a, **k)),
        asarray=lambda a, *r, **k: dev(np.asarray(a, *r, **k)), cumsum=lambda a, axis: dev(np.cumsum(a, axis=axis)),
        ascontiguousarray=lambda a: dev(np.ascontiguousarray(a)), moveaxis=lambda *a: dev(np.moveaxis(*a)),
        transpose=lambda *a: dev(np.transpose(*a)), expand_dims=lambda *a: dev(np.expand_dims(*a)),
        cuda=types.SimpleNamespace(Device=lambda *a: contextlib.nullcontext(),
                                   runtime=types.SimpleNamespace(getDevice=lambda: 0),
                                   get_current_stream=lambda: _NULL_STREAM))


_NULL_STREAM = types.SimpleNamespace(ptr=0)


def digits(values: np.ndarray) -> tuple[np.ndarray, int]:
    """The unique digits (KWORDS int64, top signed) of the exact sum of ``values`` and its flag bits."""
    lane = exact._lane_states(np.asarray(values), 0).reshape(-1)[0]
    return cupy_exact.carry_words([lane])[0, :K], lane.flags


class Kernels:
    """Contract models of exact.cuh's and exact_scan.cuh's kernels, and a log of what they were given."""

    def __init__(self, grid: int):
        self.grid, self.rows_seen, self.launches, self.cum = grid, [], 0, None

    def sum_rows(self, grid, block, args):
        part, rows, n_part, _, words = args
        assert grid[0] == self.grid and part.shape == (int(rows), int(n_part)) and words.shape[0] == int(rows)
        self.rows_seen.append(int(rows))
        self.launches += 1
        for r in range(int(rows)):
            for piece in np.array_split(np.asarray(part[r]), self.grid):  # each block adds its digits
                d, flags = digits(piece)
                words[r, :K] += d
                words[r, K] |= flags

    def round_rows(self, grid, block, args):
        words, rows, precision, emin, skipnan, divisor, clear, out = args
        assert block == cupy_exact._ROUND_ROWS and grid == min(-(-int(rows) // block), 1024)
        totals, nan, pinf, ninf = cupy_exact.fold_words(np.asarray(words[: int(rows)]))
        state = exact.ExactState(totals, nan & (not skipnan), pinf, ninf, int(divisor))
        out[: int(rows)] = exact.finish(state, out.dtype, mean=True)
        if clear:  # the kernel clears what it read: kept words start the next sum at zero
            words[: int(rows)] = 0

    def scan(self) -> dict:
        def words_kernel(grid, block, args):
            x, rows, n, tile, tiles, words = args
            slots = words.reshape(-1, cupy_exact.KTILEOUT)
            for t in range(int(rows) * int(tiles)):
                row, start = divmod(t, int(tiles))
                part = np.asarray(x[row, start * int(tile):(start + 1) * int(tile)])
                d, flags = digits(part)
                slot = slots[t + t // int(tiles) + 1]
                slot[:K] = d
                slot[K:] = [bool(flags & exact.LaneState.NAN), bool(flags & exact.LaneState.PINF),
                            bool(flags & exact.LaneState.NINF)]

        def seeds_kernel(grid, block, args):
            self.cum = args[0]

        def tiles_kernel(grid, block, args):
            x, rows, n, tiles, seeds, skipnan, out, marked = args
            tile = cupy_exact.scan_tile(x.dtype, out.dtype)
            slots = np.asarray(self.cum).reshape(-1, cupy_exact.KTILEOUT)
            for t in range(int(rows) * int(tiles)):
                row, start = divmod(t, int(tiles))
                carry = slots[t + t // int(tiles)]
                total = cupy_exact.fold_words(np.hstack([carry[:K], [0]])[None, :])[0][0]
                counts = carry[K:] > 0
                flags = (exact.LaneState.NAN * bool(counts[0]) | exact.LaneState.PINF * bool(counts[1])
                         | exact.LaneState.NINF * bool(counts[2]))
                seg = slice(start * tile, (start + 1) * tile)
                with np.errstate(over="ignore", invalid="ignore"):
                    out[row, seg] = exact._exact_scan_1d(np.asarray(x[row, seg]), exact.LaneState(int(total), flags),
                                                         out.dtype, bool(skipnan))
            marked[:] = 0

        def carries_kernel(grid, block, args):  # exact_words_cumsum: the slots' cumsum along each row, in place
            words = args[0]
            words[...] = np.cumsum(words, axis=1)

        return {"words": words_kernel, "carries": carries_kernel, "seeds": seeds_kernel, "tiles": tiles_kernel,
                "retry": lambda *a: None, "fallback": lambda *a: None}


@pytest.fixture
def device(monkeypatch):
    """cupy_exact with NumPy for CuPy and the kernel models; scan tiles of 16 elements, 3 blocks per row."""
    kernels = Kernels(grid=3)
    monkeypatch.setattr(cupy_exact, "cupy", fake_cupy())
    monkeypatch.setattr(cupy_exact, "_kept", collections.OrderedDict())
    monkeypatch.setattr(cupy_exact, "_whole_sums", {})
    monkeypatch.setattr(cupy_exact, "_kernel", lambda dtype, role="sum": kernels.sum_rows if role == "sum"
                        else kernels.round_rows)
    monkeypatch.setattr(cupy_exact, "_scan_kernels", lambda dtype, out: kernels.scan())
    monkeypatch.setattr(cupy_exact, "_grid_x", lambda *args: kernels.grid)
    monkeypatch.setattr(cupy_exact, "scan_tile", lambda dtype, out=None: 16)
    backend = types.ModuleType("multireduce.backends.cupy_backend")
    backend.scan_occupancy = lambda kernel, block: None
    monkeypatch.setitem(sys.modules, "multireduce.backends.cupy_backend", backend)
    return kernels


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def data(shape, dtype, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    span = 12 if np.dtype(dtype) == np.float16 else 60
    x = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-span, span, n))).astype(dtype)
    x[rng.integers(0, n, 3)] = [np.inf, np.nan, -np.inf]
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_reductions_in_batches_of_rows_and_launches(device, monkeypatch, dtype):
    """Rows in batches of 4 rows' words, rows of 50 elements in launches of 9 elements per block, words
    relaxed before every launch or every other: sums, means, nansums and states equal exact.py's."""
    monkeypatch.setattr(cupy_exact, "_WORDS_PER_BATCH", 4 * (K + 1))
    monkeypatch.setattr(cupy_exact, "_PER_BLOCK_LIMIT", 9)
    x = data((23, 50), dtype, 1)
    for adds in (1, 2 * device.grid, 1 << 30):
        monkeypatch.setattr(cupy_exact, "_WORD_ADDS", adds)
        for axis in ((1,), (0,), (0, 1)):
            for mean, skipnan in ((False, False), (True, False), (False, True)):
                plan = exact.ExactSumPlan(axis, np.dtype(dtype), False, mean, skipnan)
                device.rows_seen.clear()
                with np.errstate(invalid="ignore"):
                    got = cupy_exact.reduce(dev(x), plan)
                    want = plan.whole(x)
                assert np.array_equal(bits(got), bits(want)), (adds, axis, mean, skipnan)
                assert max(device.rows_seen) <= 4
            state, host = cupy_exact.state_of(dev(x), axis), exact.state_of(x, axis)
            assert [int(t) for t in np.ravel(state.total)] == [int(t) for t in np.ravel(host.total)]
            assert np.array_equal(state.nan, host.nan) and np.array_equal(state.ninf, host.ninf)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_whole_sums_take_one_launch_of_each_kernel_with_the_general_paths_bits(device, monkeypatch, dtype):
    """A C-contiguous array reduced over every axis: one sum launch and one rounding launch into kept words
    (``_whole_sum``), the bits of exact.py's, call after call; a non-contiguous one takes the general path."""
    x = data((6, 35), dtype, 5)
    for mean, skipnan, keepdims in ((False, False, False), (True, False, True), (False, True, False)):
        plan = exact.ExactSumPlan((0, 1), np.dtype(dtype), keepdims, mean, skipnan)
        with np.errstate(invalid="ignore"):
            want = bits(plan.whole(x))
        for _ in range(2):
            device.rows_seen.clear()
            launches = device.launches
            got = cupy_exact.reduce(dev(x), plan)
            assert np.array_equal(bits(got), want) and device.rows_seen == [1] and device.launches == launches + 1
    monkeypatch.setattr(cupy_exact, "_whole_sum", lambda *a: pytest.fail("a strided view took the whole path"))
    plan = exact.ExactSumPlan((0, 1), np.dtype(dtype), False, False, False)
    assert np.array_equal(bits(cupy_exact.reduce(dev(x)[:, ::2], plan)), bits(plan.whole(x[:, ::2])))


def test_kept_words_are_cleared_by_the_rounding_and_dropped_after_a_failure(device, monkeypatch):
    """Sums of a few rows reuse one buffer of words per GPU and stream, which the rounding launch clears:
    repeated sums stay right, and a sum that fails between its launches leaves no dirty buffer behind."""
    x = data((3, 50), np.float32, 4)
    plan = exact.ExactSumPlan((1,), np.dtype(np.float32), False, False, False)
    want = bits(plan.whole(x))
    for _ in range(3):
        assert np.array_equal(bits(cupy_exact.reduce(dev(x), plan)), want)
    (entry,) = cupy_exact._kept.values()
    assert not np.asarray(entry.words).any()
    real = device.sum_rows

    def failing(grid, block, args):
        real(grid, block, args)  # the words are written, then the call fails before the rounding
        raise RuntimeError("launch failed")

    monkeypatch.setattr(device, "sum_rows", failing)
    with pytest.raises(RuntimeError, match="launch failed"):
        cupy_exact.reduce(dev(x), plan)
    assert not cupy_exact._kept  # dropped
    monkeypatch.setattr(device, "sum_rows", real)
    assert np.array_equal(bits(cupy_exact.reduce(dev(x), plan)), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_words_relaxed_between_launches(device, monkeypatch, dtype):
    """With _WORD_ADDS below the blocks of two launches the words are relaxed between launches: words that
    are no longer digits, the same value."""
    monkeypatch.setattr(cupy_exact, "_PER_BLOCK_LIMIT", 5)
    monkeypatch.setattr(cupy_exact, "_WORD_ADDS", device.grid)
    calls = []
    real = cupy_exact.relax_words
    monkeypatch.setattr(cupy_exact, "relax_words", lambda w: calls.append(1) or real(w))
    x = data((2, 400), dtype, 2)
    words = cupy_exact.device_words(dev(x))
    assert device.launches == -(-400 // (5 * device.grid)) and len(calls) == device.launches - 1
    totals = cupy_exact.fold_words(np.asarray(words))[0]
    assert [int(t) for t in totals] == [int(t) for t in exact.state_of(x, (1,)).total]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_scans_in_segments_and_batches_of_lanes(device, monkeypatch, dtype):
    """Rows of 7 tiles scanned in segments of 1 to 3 tiles (carry_after between them), lanes in batches of
    2, with and without per-lane carries, cumsum and nancumsum: exact.py's bits."""
    x = data((5, 7 * 16 - 3), dtype, 3)
    carries = exact._lane_states(data((5, 40), dtype, 4), 1)
    monkeypatch.setattr(cupy_exact, "_WORDS_PER_BATCH", 2 * 2 * 8 * cupy_exact.KTILEOUT)
    for limit in (1, 2, 3, 1 << 30):
        monkeypatch.setattr(cupy_exact, "_MAX_TILES", limit)
        for carry in (None, carries):
            for skipnan in (False, True):
                with np.errstate(over="ignore", invalid="ignore"):
                    want = exact._cumsum_block(x, 1, np.dtype(dtype), carry, skipnan)
                    got = cupy_exact.cumsum(dev(x), 1, dtype, skipnan, carry)
                    moved = cupy_exact.cumsum(dev(x.T.copy()), 0, dtype, skipnan, carry)
                nan = np.isnan(want)
                for out in (got, moved.T):
                    assert np.array_equal(np.isnan(out), nan), (limit, carry is None, skipnan)
                    assert np.array_equal(bits(out)[~nan], bits(want)[~nan]), (limit, carry is None, skipnan)
