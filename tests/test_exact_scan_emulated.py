"""kernels/exact_scan.cuh run on the host (tools/exact_host_emulator.cpp: the scan's own device functions
compiled by g++, the block scan replayed in the kernel's combination tree): every output of the exact GPU
cumsum must be bitwise exact.py's host cumsum on hostile data, for several tile shapes, output dtypes and
nancumsum, and the unproved outputs must come out exact through the fallback walk."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import exact_emulate  # noqa: E402

from multireduce import exact  # noqa: E402
from multireduce.backends import cupy_exact  # noqa: E402

pytestmark = pytest.mark.skipif(exact_emulate.compiler() is None, reason="no g++: the host emulator cannot be built")

DTYPES = (np.float16, np.float32, np.float64)
SHAPES = ((32, 1), (32, 4), (64, 3), (256, 4))  # (block, items): tiles of 32, 128, 192 and 1024 elements


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(a, b) -> bool:
    """Bitwise equal, NaN where NaN (exact.py's NaN is NumPy's; only its position matters)."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a)
    return a.dtype == b.dtype and np.array_equal(nan, np.isnan(b)) and np.array_equal(bits(a[~nan]), bits(b[~nan]))


def cases(dt, n, rng) -> dict[str, np.ndarray]:
    """Named hostile rows of ``n`` elements of ``dt``."""
    dt = np.dtype(dt)
    info = np.finfo(dt)
    lo, hi = math.log2(float(info.smallest_subnormal)), math.log2(float(info.max))
    if dt == np.float64:
        lo, hi = math.log2(1e-300), math.log2(1e300)
    sign = rng.choice([-1.0, 1.0], n)
    with np.errstate(over="ignore"):
        spread = (sign * np.exp2(rng.uniform(lo, hi, n))).astype(dt)
        base = rng.standard_normal(n).astype(dt)
        cancel = np.concatenate([base * dt.type(100), -base * dt.type(100)])[:n].copy()
        cancel[rng.integers(0, max(n, 1), max(1, n // 9))[:n]] = base[: max(1, n // 9)][:n] * dt.type(1e-3)
        cancel = rng.permutation(cancel) if n else cancel
        ints = rng.integers(-3, 4, n).astype(dt)  # prefixes of integers around 2^(p): exact midpoints
        if n:
            ints[0] = dt.type(2.0 ** (info.nmant + 1))
        big = (rng.choice([-1.0, 1.0], n) * float(info.max) * rng.uniform(0.3, 1.0, n)).astype(dt)
        sub = (rng.integers(-(1 << 10), 1 << 10, n) * float(info.smallest_subnormal)).astype(dt)
    special = rng.standard_normal(n).astype(dt)
    if n:
        special[rng.integers(0, n, 3)] = rng.choice([np.inf, -np.inf, np.nan], 3)
    infs = np.where(rng.random(n) < 0.05, np.inf, rng.standard_normal(n)).astype(dt)
    nans = np.where(rng.random(n) < 0.05, np.nan, rng.standard_normal(n)).astype(dt)
    return {"normal": base, "spread": spread, "cancel": cancel, "ints": ints, "big": big, "subnormal": sub,
            "special": special, "infs": infs, "nans": nans, "negzeros": np.full(n, -0.0, dt)}


def check(x, block, items, out_dtype=None, skipnan=False) -> int:
    got, unproved = exact_emulate.emulate_scan(x, out_dtype, block=block, items=items, skipnan=skipnan)
    with np.errstate(over="ignore", invalid="ignore"):
        want = exact.cumsum(x, dtype=out_dtype, skipnan=skipnan)
    assert same(got, want), (x.dtype, x.size, block, items, out_dtype, skipnan,
                             np.flatnonzero(bits(got) != bits(want))[:5])
    return unproved


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", (0, 1, 31, 33, 1023, 1025))
def test_hostile_rows_scan_to_the_host_cumsum(dt, n):
    rng = np.random.default_rng(100 * n + np.dtype(dt).itemsize)
    for name, x in cases(dt, n, rng).items():
        for block, items in SHAPES[:2] if n > 64 else SHAPES:
            check(x, block, items)


def test_tile_boundaries_and_shapes():
    rng = np.random.default_rng(3)
    for dt in DTYPES:
        for block, items in SHAPES:
            tile = block * items
            for n in (tile - 1, tile, tile + 1, 2 * tile + 7):
                x = cases(dt, n, rng)
                for name in ("spread", "ints", "special"):
                    check(x[name], block, items)


def test_output_dtypes_and_nancumsum():
    rng = np.random.default_rng(4)
    for dt in DTYPES:
        x = cases(dt, 700, rng)
        for out in DTYPES:
            for name in ("spread", "cancel", "ints", "special", "big"):
                check(x[name], 64, 3, out_dtype=out)
        for name in ("nans", "special", "cancel"):
            check(x[name], 32, 4, skipnan=True)


def test_fallbacks_happen_and_come_out_exact():
    """Outputs the double-double cannot prove: float64 prefixes past 2^1000 (the bound goes to inf), float64
    near-zero prefixes with an inexact prefix, a carry beyond 106 bits that puts prefixes on midpoints."""
    total = 0
    huge = np.array([1.5e308, -1.4e308, 1.0, 2.0**-30, -1.0e308, 3.0] * 20)
    total += check(huge, 32, 1)
    total += check(huge, 32, 4, out_dtype=np.float32)
    # a first tile leaves 1 + 2^-200 (beyond 106 bits: the seed is inexact); the next tile's prefixes then
    # sit 2^-200 above float64 values and below-zero crossings: near midpoints of float16/32/64
    ties = np.concatenate([[1.0, 2.0**-200], np.zeros(30), np.repeat([-1.0, 2.0**-53, 2.0**-53, 0.5, -0.5], 20)])
    for out in DTYPES:
        total += check(ties, 32, 1, out_dtype=out)
    sub = np.array([5e-324, 1e-310, -3e-320, 2.0**-1000, -(2.0**-1000), 1e-300] * 30)
    total += check(sub, 32, 1)
    assert total > 0  # the fallback walk ran, and its outputs matched exact.py


def test_prefixes_against_fractions():
    """A reference independent of exact.py: Fraction prefixes rounded by round_exact, and math.fsum."""
    rng = np.random.default_rng(8)
    for dt in DTYPES:
        for name in ("spread", "cancel", "ints"):
            x = cases(dt, 257, rng)[name]
            got, _ = exact_emulate.emulate_scan(x, block=32, items=2)
            run = Fraction(0)
            for i, v in enumerate(x.astype(np.float64).tolist()):
                run += Fraction(v)
                want = exact.round_exact(run.numerator, run.denominator, 0, np.dtype(dt))
                assert bits(np.array([want]).astype(dt))[0] == bits(got[i:i + 1])[0], (dt, name, i)
                if dt == np.float64:
                    assert float(got[i]) == math.fsum(x[: i + 1].tolist()), (name, i)


def test_seed_of_words_bounds_the_carry():
    """seed_of_words: |carry - hi - lo| <= eb, eb == 0 exactly when the carry fits the double-double, and
    hi = RN(hi + lo); words that are not digits, both signs, every magnitude, and past the range."""
    rng = np.random.default_rng(9)
    shift = -cupy_exact.WORD_BASE
    totals = [0, 1, -1, (1 << 106) - 1, (1 << 107) - 1, -(1 << 200) - 1, 1 << (1023 + shift), (1 << (1000 + shift)) - 1]
    for _ in range(300):
        b = int(rng.integers(1, 2100))
        totals.append(int(rng.choice([-1, 1])) * (int.from_bytes(rng.bytes(b // 8 + 1), "little") % (1 << b)))
    rows = []
    for i, t in enumerate(totals):
        mag = abs(t)
        words = [(1 if t >= 0 else -1) * ((mag >> (32 * j)) & 0xFFFFFFFF) for j in range(cupy_exact.KWORDS)]
        if i % 3 == 0:  # not digits: value moved into the word below
            for j in range(1, cupy_exact.KWORDS):
                k = int(rng.integers(-(1 << 20), 1 << 20))
                words[j] -= k
                words[j - 1] += k << 32
        rows.append(words + [i % 2, (i // 2) % 2, 0])
    seeds = exact_emulate.emulate_seed(np.array(rows, dtype=np.int64))
    for t, (hi, lo, eb, flags), row in zip(totals, seeds, rows):
        assert flags == (1 if row[-3] else 0) | (2 if row[-2] else 0)
        value = Fraction(t, 1 << shift)
        if abs(value) >= Fraction(2) ** 1000:
            assert eb == math.inf
            continue
        err = abs(value - Fraction(hi) - Fraction(lo))
        assert err <= Fraction(eb), t
        assert hi == hi + lo  # hi = RN(hi + lo)
        fits = t == 0 or (abs(t) >> max(0, abs(t).bit_length() - 106)) << max(0, abs(t).bit_length() - 106) == abs(t)
        assert (eb == 0.0) == fits, t


# -- a carry into the row: what a Dask array's earlier chunks hand to a CuPy chunk --------------------------
def lane(total: int, nan=False, pinf=False, ninf=False) -> exact.LaneState:
    return exact.LaneState(total, nan * exact.LaneState.NAN | pinf * exact.LaneState.PINF | ninf * exact.LaneState.NINF)


def carry_state(value: Fraction, nan=False, pinf=False, ninf=False) -> exact.LaneState:
    """exact.py's lane state of an exact running total ``value`` (a multiple of 2**-1074, as every sum of floats)."""
    units = value * Fraction(2) ** -exact.EBASE
    assert units.denominator == 1
    return lane(int(units), nan, pinf, ninf)


def host_scan(x, carry, out_dtype=None, skipnan=False):
    """exact._cumsum_block of the 1-d ``x`` seeded with ``carry``: what the Dask path's host scan gives."""
    lanes = np.empty((), dtype=object)
    lanes[()] = carry
    with np.errstate(over="ignore", invalid="ignore"):
        return exact._cumsum_block(x, 0, np.dtype(out_dtype or x.dtype), lanes, skipnan)


def check_carried(x, carry, block=32, items=2, out_dtype=None, skipnan=False) -> int:
    got, unproved = exact_emulate.emulate_scan(x, out_dtype, block=block, items=items, skipnan=skipnan, carry=carry)
    want = host_scan(x, carry, out_dtype, skipnan)
    assert same(got, want), (x.dtype, x.size, block, items, out_dtype, skipnan,
                             np.flatnonzero(bits(got) != bits(want))[:5])
    return unproved


def fraction_prefixes(x, carry: Fraction, dt) -> np.ndarray:
    """carry + each exact prefix of the finite ``x``, rounded by round_exact from Fractions (no exact.py scan)."""
    out, run = [], carry
    for v in np.asarray(x, dtype=np.float64).tolist():
        run += Fraction(v)
        out.append(exact.round_exact(run.numerator, run.denominator, 0, np.dtype(dt)))
    with np.errstate(over="ignore"):
        return np.array(out).astype(dt)


TINY = Fraction(2) ** -1074


def hostile_carries(x: np.ndarray) -> dict[str, Fraction]:
    """Carries that stress the seed: past float64, the smallest units, exactly minus the row's prefixes (the
    running sum cancels to 0 and just past it), on rounding midpoints of every format, and beyond 106 bits."""
    v = np.asarray(x, dtype=np.float64)
    prefix = Fraction(0)
    for e in v[: max(1, v.size // 2)].tolist():
        prefix += Fraction(e) if math.isfinite(e) else 0
    total = sum((Fraction(e) for e in v.tolist() if math.isfinite(e)), Fraction(0))
    return {
        "zero": Fraction(0),
        "huge": Fraction(2) ** 1100 + 3 * TINY,
        "past_f64": -(Fraction(2) ** 1024) + Fraction(2) ** 970,
        "f64_max": Fraction(float(np.finfo(np.float64).max)),
        "tiny": TINY,
        "minus_tiny": -3 * TINY,
        "cancel_half": -prefix,
        "cancel_all": -total,
        "cancel_all_plus_tiny": -total + TINY,
        "mid_f16": 1 + Fraction(2) ** -11,
        "mid_f32": -(1 + Fraction(2) ** -24),
        "mid_f64": 1 + Fraction(2) ** -53,
        "mid_f64_int": Fraction(2**53 + 1),
        "mid_f32_over_106": 1 + Fraction(2) ** -24 + Fraction(2) ** -200,
        "mid_f64_below_106": 1 + Fraction(2) ** -53 - Fraction(2) ** -300,
        "f16_max_mid": Fraction(65504 + 16),  # float16's max + half an ulp: a tie, and 65504 is odd: inf
        "f32_over": Fraction(float(np.finfo(np.float32).max)) * 2,
    }


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", (0, 1, 31, 65, 300))
def test_hostile_carries_scan_to_the_host_cumsum(dt, n):
    """Every output is the rounding of carry + the exact prefix, bitwise exact._cumsum_block's, with the carry
    entering as the row's first words slot, for carries that are huge, tiny, cancel the row or sit on ties."""
    rng = np.random.default_rng(1000 + n + np.dtype(dt).itemsize)
    rows = cases(dt, n, rng)
    zeros = np.zeros(n, dt)
    ulps = (rng.integers(-2, 3, n) * float(np.finfo(dt).smallest_subnormal)).astype(dt)
    fallbacks = 0
    for name in ("normal", "spread", "cancel", "ints", "subnormal", "big"):
        x = rows[name]
        for value in hostile_carries(x).values():
            fallbacks += check_carried(x, carry_state(value))
    for x in (zeros, ulps):  # a carry on a midpoint: the row's zeros and ulps keep every prefix near it
        for value in hostile_carries(x).values():
            for out in DTYPES:
                fallbacks += check_carried(x, carry_state(value), out_dtype=out)
    if n:
        assert fallbacks > 0  # the carries past the tracked range and beyond 106 bits went through the walk


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_carries_against_fractions(dt):
    """An exact.py-free reference: Fraction(carry) + Fraction prefixes, each rounded by round_exact."""
    rng = np.random.default_rng(77 + np.dtype(dt).itemsize)
    for name in ("normal", "spread", "cancel", "ints", "subnormal"):
        x = cases(dt, 130, rng)[name]
        for cname, value in hostile_carries(x).items():
            if abs(value) >= Fraction(2) ** 1024:
                continue  # past float64: round_exact's float cannot hold it (host_scan covers these)
            got, _ = exact_emulate.emulate_scan(x, block=32, items=2, carry=carry_state(value))
            assert same(got, fraction_prefixes(x, value, dt)), (name, cname)


FLAG_CARRIES = [dict(nan=True), dict(pinf=True), dict(ninf=True), dict(pinf=True, ninf=True),
                dict(nan=True, pinf=True)]


@pytest.mark.parametrize("flags", FLAG_CARRIES, ids=lambda f: "+".join(f))
@pytest.mark.parametrize("skipnan", (False, True))
def test_carried_flags_combine_as_the_host_scan(flags, skipnan):
    """The carry's NaN/+inf/-inf flags act as elements before the row: NaN (or +inf with -inf) makes every
    output NaN, one infinity every output that infinity until the row brings the other; nancumsum drops the
    carry's NaN as it drops the row's."""
    rng = np.random.default_rng(12)
    for dt in DTYPES:
        x = rng.standard_normal(150).astype(dt)
        with_inf = x.copy()
        with_inf[[40, 100]] = [np.inf, -np.inf]
        with_nan = x.copy()
        with_nan[70] = np.nan
        for row in (x, with_inf, with_nan, np.array([np.nan], dt), np.array([-np.inf], dt)):
            for value in (Fraction(0), Fraction(3, 4), Fraction(2) ** 1100):
                check_carried(row, carry_state(value, **flags), skipnan=skipnan)


def split_scan(x, cuts, skipnan=False, out_dtype=None, block=32, items=2):
    """exact.cumsum's Dask graph over chunks of ``x`` cut at ``cuts``: the carries that ExactScanPlan's totals
    and carries give (as graph.scan and the held direct path use them), each chunk scanned by the emulated
    GPU from its carry."""
    bounds = [0, *cuts, x.size]
    chunks = [x[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    plan = exact.ExactScanPlan(0, np.dtype(out_dtype or x.dtype), skipnan)
    carries = plan.carries(plan.totals(*chunks[:-1])) if len(chunks) > 1 else None
    pieces = [exact_emulate.emulate_scan(chunk, out_dtype, block=block, items=items, skipnan=skipnan,
                                         carry=None if k == 0 else carries[k - 1])[0]
              for k, chunk in enumerate(chunks)]
    return np.concatenate(pieces)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_any_chunking_gives_the_whole_array_bits(dt):
    """Chunk by chunk with carries (empty and one-element chunks, cuts on and off tile boundaries) equals the
    host exact cumsum of the whole array, cumsum and nancumsum, for several output dtypes."""
    rng = np.random.default_rng(31 + np.dtype(dt).itemsize)
    n = 300
    chunkings = [[], [0], [0, 0, 1], [1, 2, 3], [64, 64, 128], [150], [299], [n], [7, 31, 33, 64, 65, 200, 299, 299]]
    for name in ("spread", "cancel", "ints", "special", "nans", "big"):
        x = cases(dt, n, rng)[name]
        for skipnan in (False, True):
            with np.errstate(over="ignore", invalid="ignore"):
                want = exact.cumsum(x, skipnan=skipnan)
            for cuts in chunkings:
                assert same(split_scan(x, cuts, skipnan), want), (name, skipnan, cuts)
    x = cases(dt, n, rng)["spread"]
    for out in DTYPES:
        with np.errstate(over="ignore"):
            want = exact.cumsum(x, dtype=out)
        assert same(split_scan(x, [5, 100, 101], out_dtype=out), want), out


def test_carry_words_are_the_states_integers():
    """carry_words read back by fold_words gives the same Python integers, both signs, every magnitude up to the
    top word's limit; flags land in the three count slots; a total that is no float sum or too big is refused."""
    rng = np.random.default_rng(5)
    shift = cupy_exact.WORD_BASE - exact.EBASE
    units = [0, 1, -1, (1 << 32) - 1, -(1 << 32), (1 << (32 * 71)) - 1, -(1 << (32 * 71)), (1 << 2334) - 1,
             -(1 << 2335)]
    for _ in range(200):
        b = int(rng.integers(1, 2335))
        units.append(int(rng.choice([-1, 1])) * (int.from_bytes(rng.bytes(b // 8 + 1), "little") % (1 << b)))
    states = [lane(u << shift, i % 2 == 0, i % 3 == 0, i % 5 == 0) for i, u in enumerate(units)]
    words = cupy_exact.carry_words(states)
    assert words.shape == (len(units), cupy_exact.KTILEOUT)
    assert ((words[:, : cupy_exact.KWORDS - 1] >= 0) & (words[:, : cupy_exact.KWORDS - 1] < 1 << 32)).all()
    folded = np.column_stack([words[:, : cupy_exact.KWORDS], np.zeros(len(units), np.int64)])
    totals = cupy_exact.fold_words(folded)[0]
    assert [int(t) for t in totals] == [u << shift for u in units]
    for i, row in enumerate(words):
        assert row[cupy_exact.KWORDS:].tolist() == [int(i % 2 == 0), int(i % 3 == 0), int(i % 5 == 0)]
    with pytest.raises(OverflowError):
        cupy_exact.carry_words([carry_state(Fraction(2) ** 1300)])
    with pytest.raises(ValueError):
        cupy_exact.carry_words([lane(1)])


# -- rows past the words' int64 range: relaxed words, segments chained by carry_after ------------------------
def test_relaxed_words_keep_the_value_and_room_for_more_adds():
    """relax_words: words of any int64 values (the top one within what a sum can reach) keep their value, and
    every word but the top lands in [-2**31, 2**32 + 2**31), from where _WORD_ADDS (sum kernel) or _MAX_TILES
    plus a tile's elements (scan) more digit adds below 2**32 stay inside int64."""
    rng = np.random.default_rng(6)
    k = cupy_exact.KWORDS
    info = np.iinfo(np.int64)
    words = rng.integers(info.min, info.max, size=(50, k), dtype=np.int64, endpoint=True)
    words[:, -1] = rng.integers(-(1 << 40), 1 << 40, 50)
    words[0] = info.max
    words[1] = info.min
    words[0, -1] = words[1, -1] = 0
    relaxed = cupy_exact.relax_words(words)
    flags = np.zeros((50, 1), np.int64)
    assert [int(t) for t in cupy_exact.fold_words(np.hstack([relaxed, flags]))[0]] == \
        [int(t) for t in cupy_exact.fold_words(np.hstack([words, flags]))[0]]
    assert relaxed[:, : k - 1].min() >= -(1 << 31) and relaxed[:, : k - 1].max() < (1 << 32) + (1 << 31)
    widest = (1 << 32) + (1 << 31)
    assert widest + cupy_exact._WORD_ADDS * ((1 << 32) - 1) < 1 << 63
    tile = max(cupy_exact.scan_tile(np.dtype(a), np.dtype(b)) for a in DTYPES for b in DTYPES)
    assert widest + (cupy_exact._MAX_TILES + tile) * ((1 << 32) - 1) < 1 << 63


def segment_carry(carry_slot: np.ndarray, segment: np.ndarray, tile: int, rng) -> np.ndarray:
    """What device_cumsum hands the next segment of a row: carry_after of the words' cumsum at the segment's
    last slot, i.e. the carry slot plus every tile's words (a tile's pass-1 words are the unique digits of its
    exact sum and its flag counts: carry_words of its LaneState), here also spread into words far from digits
    (as 2**30 tiles of digits would leave them) before carry_after relaxes them."""
    cum = carry_slot.astype(np.int64).copy()
    for start in range(0, segment.size, tile):
        cum += cupy_exact.carry_words(list(exact._lane_states(segment[start:start + tile], 0).reshape(-1)))[0]
    k = cupy_exact.KWORDS
    shift = rng.integers(-(1 << 29), 1 << 29, k - 1)
    cum[: k - 1] += shift << 32  # the same value: word j gains shift_j 2**32, word j + 1 loses shift_j
    cum[1:k] -= shift
    cum[k:] *= 3  # counts past 1: flags seen in several tiles
    return cupy_exact.carry_after(cum[None, :])[0]


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_segments_chained_by_carry_after_give_the_whole_row(dt):
    """A row scanned segment by segment (device_cumsum past _MAX_TILES tiles), each segment seeded by
    carry_after of the one before, gives the whole row's bits: sums, nancumsums, flags carried across."""
    rng = np.random.default_rng(61 + np.dtype(dt).itemsize)
    block, items = 32, 2
    tile = block * items
    for name in ("spread", "cancel", "ints", "special", "nans", "big", "subnormal"):
        x = cases(dt, 5 * tile + 17, rng)[name]
        for skipnan in (False, True):
            for first in (None, carry_state(12345 + Fraction(5, 2**60)), carry_state(Fraction(-3, 4), pinf=True)):
                with np.errstate(over="ignore", invalid="ignore"):
                    want = exact.cumsum(x, skipnan=skipnan) if first is None else host_scan(x, first, skipnan=skipnan)
                for segment in (tile, 2 * tile, 3 * tile):
                    slot = (np.zeros(cupy_exact.KTILEOUT, np.int64) if first is None
                            else cupy_exact.carry_words([first])[0])
                    pieces = []
                    for start in range(0, x.size, segment):
                        part = x[start:start + segment]
                        got, _ = exact_emulate.emulate_scan(part, block=block, items=items, skipnan=skipnan, carry=slot)
                        pieces.append(got)
                        slot = segment_carry(slot, part, tile, rng)
                    with np.errstate(over="ignore", invalid="ignore"):
                        assert same(np.concatenate(pieces), want), (name, skipnan, first is None, segment)


# -- pass 2's fast path (approximate_outputs: a double running sum and its error bound) ----------------------
LIBRARY_SHAPE = (cupy_exact.SCAN_BLOCK, cupy_exact.scan_items(np.float32))  # 512 x 16 for float16/float32


def check_paths(x, block, items, out_dtype=None, carry=None, fast_tiles=None) -> int:
    """Outputs bitwise exact.py's (or the host scan's from ``carry``); returns how many threads ran the exact
    path (every thread for float64 elements or outputs, where the fast path is never tried). ``fast_tiles``: a
    list that gets (tiles the tile-wide fast path finished, tiles)."""
    got, _, exact_threads, _, fast = exact_emulate.emulate_scan_paths(x, out_dtype, block, items, carry=carry)
    with np.errstate(over="ignore", invalid="ignore"):
        want = exact.cumsum(x, dtype=out_dtype) if carry is None else host_scan(x, carry, out_dtype)
    assert same(got, want), (x.dtype, x.size, block, items, out_dtype, np.flatnonzero(bits(got) != bits(want))[:5])
    if fast_tiles is not None:
        fast_tiles.append((fast, -(-x.size // (block * items))))
    return exact_threads


def test_fast_path_proves_plain_data():
    """Uniform and normal float32, float16 and integer data: every tile finished by the tile-wide fast path
    (integers and float16 sums are exact in double: their bound stays 0 and ties are decided exactly), and
    every thread's outputs proved by the double running sum when the Partial path runs instead."""
    rng = np.random.default_rng(21)
    n = 1 << 15
    ints = rng.integers(-3, 4, n).astype(np.float32)
    ints[0] = 2.0**24  # prefixes around 2^24: the odd ones are float32 midpoints
    rows = {"uniform": rng.random(n).astype(np.float32), "normal": rng.standard_normal(n).astype(np.float32),
            "f16 normal": rng.standard_normal(n).astype(np.float16), "ints around 2^24": ints}
    for name, x in rows.items():
        for out in (np.float16, np.float32):
            fast = []
            assert check_paths(x, *LIBRARY_SHAPE, out_dtype=out, fast_tiles=fast) == 0, (name, out)
            if not (name == "uniform" and out == np.float16):  # float16 cannot hold sums past 65504
                assert fast[0][0] == fast[0][1], (name, out, fast)


def traps(rng, n) -> dict[str, np.ndarray]:
    """float32 rows whose double running sum lands on, or within its bound of, a rounding midpoint of float32
    or float16 while the exact prefix lies off it, so that only the bound keeps the fast path from a wrong
    rounding."""
    f = np.float32
    # on the float32 midpoint 1 + 2^-24 the dust 2^-70 is lost by the double sum but decides the rounding
    dust = np.concatenate([[1.0, 2.0**-24], np.full(n - 2, 2.0**-70)]).astype(f)
    # prefixes of integers around 2^24 (the odd ones are float32 midpoints) with dust 2^-30, which the double
    # sum drops (2^24 + 2^-30 needs 55 bits)
    ints = rng.integers(-3, 4, n).astype(f)
    ints[0] = f(2.0**24)
    at = rng.random(n) < 0.1
    ints[at] = (rng.choice([-1.0, 1.0, 3.0], int(at.sum())) * 2.0**-30).astype(f)
    # 1 lost under 2^60, then -2^60: the double sum is 0, the prefix 1; repeated with other magnitudes
    crossing = np.tile(np.array([2.0**60, 1.0, -(2.0**60), 2.0**-20, 3.0e30, -0.5, -3.0e30], f), n // 7 + 1)[:n]
    # 2^-16 + 2^-40 is a float32 midpoint; (1 + 2^-23) 2^-46 then -2^-46 leave it 2^-69 above, the double
    # sum ties 2^-69 away (to even) onto it: the smallest element unit, 2^-69, makes 2^53 of it = 2^-16 the
    # first magnitude whose additions round, which the bound must count
    edge = np.tile(np.array([2.0**-16, 2.0**-40, (1 + 2.0**-23) * 2.0**-46, -(2.0**-46), -(2.0**-16), -(2.0**-40)],
                            f), n // 6 + 1)[:n]
    # near-midpoints of float16: 1 + 2^-11 with dust below float16's and the double's reach
    half_dust = np.concatenate([[1.0, 2.0**-11], np.tile([2.0**-60, -(2.0**-60), 2.0**-61], n)[: n - 2]]).astype(f)
    # one thread of 16 items: from 1 + 2^-24 - 5 2^-52, eight additions of 2^-53 + 2^-76 each round up by
    # nearly 2^-53: the double sum ends 6 2^-53 above the midpoint 1 + 2^-24, the prefix 2^-52 - 2^-73 below.
    # The 11 additions' bound, 11 2^-53, covers the gap; a bound 4 times smaller would not
    ramp = np.tile(np.array([1.0, 2.0**-24, -1.25 * 2.0**-50] + [2.0**-53 + 2.0**-76] * 8 + [-1.0, -(2.0**-24)]
                            + [0.0] * 3, f), n // 16 + 1)[:n]
    return {"dust": dust, "ints dust": ints, "ramp": ramp, "crossing": crossing, "edge": edge, "half dust": half_dust}


def test_fast_path_gives_up_on_traps():
    """Where the double sum cannot decide, the thread reruns its elements on the exact path: every output still
    bitwise exact.py's, for both float outputs, the library's tile and small ones, and each trap does send
    threads to the exact path (so the fast path is not simply right by luck)."""
    rng = np.random.default_rng(22)
    for name, x in traps(rng, 3 * 8192 + 5).items():
        exact_threads = 0
        for out in (np.float16, np.float32):
            for block, items in (LIBRARY_SHAPE, (32, 3), (64, 16)):
                exact_threads += check_paths(x, block, items, out_dtype=out)
        assert exact_threads > 0, name


def test_fast_path_hostile_rows_at_the_library_tile():
    """Every hostile kind of ``cases`` (spread, cancellation, ties, subnormals, inf/NaN placement) through the
    library's 512 x 16 tiles, float16/float32 to both float outputs: bitwise exact.py's."""
    rng = np.random.default_rng(23)
    for dt in (np.float16, np.float32):
        for name, x in cases(dt, 2 * 8192 + 77, rng).items():
            for out in (np.float16, np.float32):
                check_paths(x, *LIBRARY_SHAPE, out_dtype=out)


def test_thread_sums_beyond_the_exact_spread():
    """thread_partial's plain double sum is taken only within its spread (25 binades for 16 float32): 15
    values of 2^27 - 8 and 1 + 2^-23 (26 binades) sum to 2^31 - 119 + 2^-23, which a double rounds. The next
    thread removes all but 1 + 2^-23: a rounded thread sum would show there, as 1 or 1 + 2^-22."""
    big = 2.0**27 - 8
    x = np.zeros(32 * 16, np.float32)
    x[:16] = [big] * 15 + [1 + 2.0**-23]
    x[16:18] = [-15 * 2.0**27, 120.0]
    got, _ = exact_emulate.emulate_scan(x, block=32, items=16)
    assert got[17] == np.float32(1 + 2.0**-23)
    check_paths(x, 32, 16)


def test_fast_path_counts_the_start_of_its_prefix():
    """The fast path starts from the exact prefix's hi alone: its bound starts at |lo| + eb. A carry 2^-60 off
    the float32 (float16) midpoint 1 + 2^-24 (1 + 2^-11) fits the double-double (lo = +-2^-60, eb = 0): its hi
    is the midpoint, and only lo decides the rounding of a row of zeros (or of ulps) after it."""
    rng = np.random.default_rng(24)
    for out, mid in ((np.float32, 1 + Fraction(2) ** -24), (np.float16, 1 + Fraction(2) ** -11)):
        for value in (mid + Fraction(2) ** -60, -mid - Fraction(2) ** -60, mid - Fraction(2) ** -60):
            for dt in (np.float16, np.float32):
                zeros = np.zeros(100, dt)
                assert check_paths(zeros, 32, 4, out_dtype=out, carry=carry_state(value)) > 0, (out, value, dt)
                ulps = (rng.integers(-2, 3, 100) * float(np.finfo(dt).smallest_subnormal)).astype(dt)
                for o in (np.float16, np.float32):
                    check_paths(ulps, 32, 4, out_dtype=o, carry=carry_state(value))


# -- pass 2's tile-wide fast path (the tile scanned in plain double under one bound per thread) --------------
def tile_traps(rng, block: int, items: int) -> dict[str, np.ndarray]:
    """float32 rows of a few tiles where a sum the tile scan forms rounds and that rounding decides an output:
    a tile-wide bound that left out the scan's errors, or the running sums', would round them wrongly."""
    f = np.float32
    tile = block * items
    rows = {}
    # threads 0 and 1 hold 2^30 and 2^-30: their sum in the scan rounds, 2^-30 is lost from every later prefix.
    # Threads 2..6 step the prefix down (2^24, 2^17, 2^10, 8, 2^-4, each + the lost 2^-30), where every output
    # is still proved; thread 7 ends 2^-35 below the float32 midpoint 1 + 2^-24, the exact prefix 2^-30 above
    # it. Thread 7's own running values are small, so only the scan's bound covers the loss; leaving it out
    # would prove the wrong rounding. The tile ends on the negated prefix, so every tile starts from 0.
    steps = [2.0**30, 2.0**-30, -(2.0**30) + 2.0**24, -(2.0**24) + 2.0**17, -(2.0**17) + 2.0**10,
             -(2.0**10) + 8.0, -8.0 + 2.0**-4]
    lost = np.zeros(3 * tile, f)
    for start in range(0, lost.size, tile):
        lost[start:start + 7 * items:items] = steps
        lost[start + 7 * items:start + 7 * items + 2] = [1.0 - 2.0**-4, 2.0**-24 - 2.0**-35]
        lost[start + tile - 2:start + tile] = [-1.0 - (2.0**-24 - 2.0**-35), -(2.0**-30)]
    rows["scan loses a bit"] = lost
    # integers up to 2^20 after 2^27 (float32 ulp 16 there: every prefix = 8 mod 16 is a tie): exact in double,
    # but only the elements' lowest bits (2^0), not their exponents (the least element's ulp, 2^-23), show it
    ints = rng.integers(-1000, 1001, 3 * tile).astype(f)
    ints[::97] = rng.integers(-(1 << 20), 1 << 20, ints[::97].size).astype(f)
    ints[0] = f(2.0**27)
    rows["integers with ties"] = ints
    # the same with 2^-30 once per tile: the sums are no longer exact, so the ties cannot be decided in double
    dusted = ints.copy()
    dusted[tile // 2::tile] = f(2.0**-30)
    rows["integers with dust"] = dusted
    return rows


def test_tile_fast_path_gives_up_where_the_tile_scan_rounds():
    """Rows where the tile scan's own roundings (a thread's sum, a warp's total) decide an output: the tile-wide
    fast path must give those tiles up and the Partial path round them exactly; integer rows whose exactness
    only the elements' lowest bits show stay on the tile path, ties included."""
    rng = np.random.default_rng(25)
    for block, items in (LIBRARY_SHAPE, (64, 16), (32, 4)):
        for name, x in tile_traps(rng, block, items).items():
            for out in (np.float16, np.float32):
                if name.startswith("integers") and out == np.float16:
                    continue  # past float16's range: every output inf, nothing to decide
                fast = []
                check_paths(x, block, items, out_dtype=out, fast_tiles=fast)
                done, tiles = fast[0]
                if name == "integers with ties":
                    assert done == tiles, (name, block, items, out, fast)
                else:
                    assert done < tiles, (name, block, items, out, fast)


def test_tile_fast_path_nancumsum_skips_nans_as_zeros():
    """nancumsum rows with NaNs in most tiles: the tile path reads a NaN as 0 (the same prefixes), so those
    tiles need not take the Partial path, and every output is exact.py's."""
    rng = np.random.default_rng(26)
    x = rng.random(4 * 8192 + 9).astype(np.float32)  # positive: no prefix passes near 0, where few are proved
    x[rng.integers(0, x.size, 40)] = np.nan
    got, _, _, _, fast = exact_emulate.emulate_scan_paths(x, None, *LIBRARY_SHAPE, skipnan=True)
    assert same(got, exact.cumsum(x, skipnan=True))
    assert fast == -(-x.size // 8192), fast


def test_tile_fast_path_counts_its_running_roundings():
    """From a carry 40 2^-52 below the float32 midpoint 1 + 2^-24, each of 12 elements 2^-53 + 2^-76 rounds the
    running double up by a whole 2^-52 (about 6 2^-52 too much in all), and then 33 2^-52 takes the double a
    few 2^-52 past the midpoint while the exact prefix stays below it, with no running value near the
    midpoint before. The running sums' bound (here 16 2^-52) keeps that output unproved, and the tile goes to
    the Partial path; without that bound, or with one 8 times smaller, the wrong rounding would be proved."""
    f = np.float32
    carry = carry_state(1 + Fraction(2) ** -24 - 40 * Fraction(2) ** -52)
    for block, items in (LIBRARY_SHAPE, (32, 16)):
        x = np.zeros(2 * block * items, f)
        x[:12] = f(2.0**-53 + 2.0**-76)
        x[12] = f(33 * 2.0**-52)
        x[13] = f(2.0**-30)  # every later prefix far from the midpoint: only output 12 is in doubt
        fast = []
        check_paths(x, block, items, out_dtype=f, carry=carry, fast_tiles=fast)
        assert fast[0] == (1, 2), fast  # the first tile gave up, the second did not


def pair_traps(rng, block: int, items: int) -> dict[str, np.ndarray]:
    """float64 rows the double-double tile path must give up: a pair of its scan loses a bit (2^60, 1 and
    2^-60: 1 + 2^-60 does not fit the low double) and a later output sits just off the float64 midpoint
    1 + 2^-53 that the lost bit decides; integers around 2^53 whose prefixes are exact ties (the path decides
    ties only where its sums are provably exact, which the elements' exponents do not show here)."""
    tile = block * items
    lost = np.zeros(2 * tile)
    for start in (0, tile):
        lost[start:start + 4 * items:items] = [2.0**60, 1.0, 2.0**-60, -(2.0**60)]
        lost[start + 4 * items] = 2.0**-53 - 2.0**-70  # the pair's 1 + 2^-53 - 2^-70: the exact prefix is above
        lost[start + tile - 2:start + tile] = [-1.0 - (2.0**-53 - 2.0**-70), -(2.0**-60)]
    ties = rng.integers(-3, 4, 4 * tile + 3).astype(np.float64)
    ties[0] = 2.0**53
    return {"pair loses a bit": lost, "ties around 2^53": ties}


def test_pair_path_proves_plain_float64_and_gives_up_where_its_scan_rounds():
    """float64 elements (and float32 ones into float64 outputs) take the tile-wide double-double path: every
    tile of uniform and normal data is finished there, exact ties of their prefixes included. The rows of
    pair_traps go to the Partial path, and every output is still exact.py's."""
    rng = np.random.default_rng(28)
    block, items = 64, 8
    tile = block * items
    n = 4 * tile + 3
    for name, x, out in (("uniform", rng.random(n), None), ("normal", rng.standard_normal(n), None),
                         ("float32 into float64", rng.standard_normal(n).astype(np.float32), np.float64)):
        fast = []
        check_paths(x, block, items, out_dtype=out, fast_tiles=fast)
        assert fast[0][0] == fast[0][1], (name, fast)
    for name, x in pair_traps(rng, block, items).items():
        fast = []
        check_paths(x, block, items, fast_tiles=fast)
        assert fast[0][0] < fast[0][1], (name, fast)
