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
