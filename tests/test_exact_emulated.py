"""kernels/exact.cuh run on the host (tools/exact_host_emulator.cpp: the kernel's own device functions
compiled by g++): the row's words must hold the exact sum of hostile data, for every grid, block, expansion
length and misalignment, and round through exact.py to the correctly rounded sum."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import exact_emulate  # noqa: E402

from multireduce.backends import cupy_exact  # noqa: E402
from multireduce.exact import EBASE, round_exact  # noqa: E402

pytestmark = pytest.mark.skipif(exact_emulate.compiler() is None, reason="no g++: the host emulator cannot be built")

DTYPES = (np.float16, np.float32, np.float64)
SIZES = (0, 1, 31, 33, 1023, 1025)


def exact_total(x: np.ndarray) -> tuple[int, bool, bool, bool]:
    """The exact sum of the finite elements in units of 2**EBASE, and the NaN/+inf/-inf flags."""
    v = np.asarray(x, dtype=np.float64)
    finite = v[np.isfinite(v)]
    total = 0
    for value in finite.tolist():
        num, den = value.as_integer_ratio()
        total += num * ((1 << -EBASE) // den)
    return total, bool(np.isnan(v).any()), bool((v == np.inf).any()), bool((v == -np.inf).any())


def check(x, grid=1, block=32, terms=cupy_exact.TERMS, unroll=None, byte_offset=0):
    unroll = cupy_exact.UNROLL[x.dtype.name] if unroll is None else unroll
    words = exact_emulate.emulate_words(x, grid=grid, block=block, terms=terms, unroll=unroll, byte_offset=byte_offset)
    totals, nan, pinf, ninf = cupy_exact.fold_words(words[None, :])
    want = exact_total(x)
    got = (totals[0], bool(nan[0]), bool(pinf[0]), bool(ninf[0]))
    assert got == want, (x.dtype, x.size, grid, block, terms, unroll, byte_offset)
    return got


def finite_max(dt):
    return float(np.finfo(dt).max)


def hostile(dt, n, rng) -> dict[str, np.ndarray]:
    """Named hostile rows of ``n`` elements of ``dt``."""
    dt = np.dtype(dt)
    info = np.finfo(dt)
    lo, hi = math.log2(float(info.smallest_subnormal)), math.log2(float(info.max))
    if dt == np.float64:
        lo, hi = -1000.0, 1000.0  # spreads up to 1e+-300
    sign = rng.choice([-1.0, 1.0], n)
    spread = (sign * np.exp2(rng.uniform(lo, hi, n))).astype(dt)
    base = rng.standard_normal(n).astype(dt)
    cond = np.concatenate([base, -base])[:n].copy()  # cancels to (near) zero: cond up to 1e16 and beyond
    if n:
        cond[0] = dt.type(float(info.eps) * 0.5)
        cond[rng.integers(0, n, max(1, n // 7))] *= dt.type(2 ** min(50, int(info.nmant)))
    sub = (rng.integers(-(1 << 10), 1 << 10, n) * float(info.smallest_subnormal)).astype(dt)
    big = rng.choice([-1.0, 1.0], n) * finite_max(dt)
    big = np.where(rng.random(n) < 0.8, big, 0).astype(dt)
    special = rng.standard_normal(n).astype(dt)
    if n:
        special[rng.integers(0, n, 3)] = rng.choice([np.inf, -np.inf, np.nan], 3)
    infs = np.where(rng.random(n) < 0.1, np.inf, rng.standard_normal(n)).astype(dt)
    near_bound = (sign * np.exp2(rng.integers(0, min(29, int(info.maxexp) - 2), n)) * (1 + rng.integers(0, 1 << min(int(info.nmant), 20), n)
                  * float(info.eps))).astype(dt)  # float32 packs right around the 27-binade bound
    return {"uniform": rng.random(n).astype(dt), "normal": base, "spread": spread, "cond": cond,
            "subnormal": sub, "max": big, "special": special, "infs": infs, "near_bound": near_bound,
            "zeros": np.zeros(n, dt), "negzeros": np.full(n, -0.0, dt)}


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_hostile_rows_give_the_exact_sum(dt, n):
    rng = np.random.default_rng(1000 * n + np.dtype(dt).itemsize)
    for name, x in hostile(dt, n, rng).items():
        for grid, block in ((1, 32), (3, 32), (2, 256)):
            check(x, grid=grid, block=block)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_misaligned_rows_every_expansion_length_and_unroll(dt):
    rng = np.random.default_rng(7)
    item = np.dtype(dt).itemsize
    rows = hostile(dt, 1025, rng)
    for offset in sorted({0, item, 2 * item, 16 - item, 1}):  # 1: not a multiple of the item size
        for name in ("spread", "cond", "special", "near_bound"):
            check(rows[name], grid=2, block=32, byte_offset=offset)
    for terms in (2, 3, 6, 8):
        for name in ("spread", "cond", "normal"):
            check(rows[name], grid=2, block=32, terms=terms)
    for unroll in (1, 2, 8):
        for name in ("spread", "special", "near_bound"):
            check(rows[name], grid=1, block=8, unroll=unroll, byte_offset=item)


def test_the_result_does_not_depend_on_the_grid():
    rng = np.random.default_rng(3)
    x = hostile(np.float32, 4099, rng)["spread"]
    seen = {check(x, grid=g, block=b) for g, b in ((1, 32), (2, 64), (5, 32), (16, 32), (1, 256))}
    assert len(seen) == 1


def f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def test_float32_pack_bound_edges_exhaustively():
    """Packs of 4 at exponent spreads 25..29 (the fast path's limit is 27) with the widest significands and
    the smallest ulps at the low end, both signs, subnormal and maximal binades: the sum stays exact."""
    packs = []
    for fhi in (28, 60, 127, 200, 254):
        for spread in range(25, 30):
            flo = fhi - spread
            if flo < 0:
                continue
            top = (fhi << 23) | 0x7FFFFF  # the widest significand of the top binade
            low = [(max(flo, 0) << 23) | m for m in (0, 1, 0x7FFFFF)]
            for lbits in low:
                for signs in ((1, 1, 1, 1), (1, -1, 1, -1), (1, 1, 1, -1), (-1, -1, -1, -1)):
                    vals = [top, top - 1, top, lbits]
                    packs.append([s * f32(b) for s, b in zip(signs, vals)])
                    packs.append([s * f32(b) for s, b in zip(signs, (lbits, top, lbits, top))])
    x = np.array(packs, dtype=np.float32)  # row-major: every 4 values form one aligned pack
    for p in x:
        check(p, grid=1, block=1)
    check(x.ravel(), grid=1, block=1)
    check(x.ravel(), grid=3, block=32)


def test_float16_packs_at_the_extremes():
    top = np.float16(65504.0)
    tiny = np.float16(2.0**-24)
    rows = [np.array([top] * 8, np.float16), np.array([top, tiny] * 4, np.float16),
            np.array([top, -tiny, -top, tiny, top, top, -tiny, tiny], np.float16),
            np.array([tiny, np.inf, top, tiny, -np.inf, tiny, np.nan, top], np.float16)]
    for x in rows:
        check(x, grid=1, block=1)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_words_round_to_the_correctly_rounded_sum(dt):
    rng = np.random.default_rng(11)
    for name in ("normal", "spread", "cond", "subnormal"):
        x = hostile(dt, 1025, rng)[name]
        total, *_ = check(x, grid=2, block=32)
        got = round_exact(total, 1, EBASE, np.dtype(dt))
        if dt == np.float64:
            assert got == math.fsum(x.tolist()), name
        else:  # a float64 holds these sums' rounding to dt only via the exact integer: compare with Fraction
            from fractions import Fraction
            exact = sum((Fraction(v) for v in x.astype(np.float64).tolist()), Fraction(0))
            assert got == float(np.float64(round_exact(exact.numerator, exact.denominator, 0, np.dtype(dt)))), name


def test_bank_digits_wrap_and_carry():
    """Elements >= 2^960 go straight into the 32-bit digit banks; widest significands at a few binades, both
    signs, thousands of them in one thread: every digit wraps many times in both banks."""
    rng = np.random.default_rng(5)
    top = np.float64(2.0**53 - 1) * 2.0 ** rng.integers(960 - 52, 1023 - 52, 4099)
    mixed = top * rng.choice([-1.0, 1.0], top.size)
    ones = np.full(4099, np.float64(2.0**53 - 1) * 2.0**(1000 - 52))
    for x in (top, -top, mixed, ones, np.concatenate([ones, -ones[:-1]])):
        check(x, grid=1, block=1)
        check(x, grid=2, block=32, terms=2)
    spread = hostile(np.float64, 4099, rng)["spread"]  # short expansions: most elements are deposited
    check(spread, grid=1, block=4, terms=2)


# ---- rounding the words on the device (exact.cuh round_words) against exact.py's finish -----------------
def words_of(total: int, flags: int = 0, spread: np.random.Generator | None = None) -> np.ndarray:
    """kOut words whose value is ``total`` units of 2**WORD_BASE: base-2**32 digits of |total| (negated for
    a negative total); with ``spread``, some of every word's value moved into the word below as 2**32
    multiples, so words are not digits (as when many blocks add theirs)."""
    sign, mag = (-1 if total < 0 else 1), abs(total)
    digits = [(mag >> (32 * j)) & 0xFFFFFFFF for j in range(cupy_exact.KWORDS)]
    assert mag >> (32 * cupy_exact.KWORDS) == 0
    words = [sign * d for d in digits]
    if spread is not None:
        for j in range(1, cupy_exact.KWORDS):
            k = int(spread.integers(-(1 << 20), 1 << 20))
            words[j] -= k
            words[j - 1] += k << 32
    return np.array(words + [flags], dtype=np.int64)


def host_rounding(words: np.ndarray, dt, skipnan: bool, divisor: int = 1) -> np.ndarray:
    from multireduce import exact

    totals, nan, pinf, ninf = cupy_exact.fold_words(words)
    if skipnan:
        nan = np.zeros_like(nan)
    return exact.finish(exact.ExactState(totals, nan, pinf, ninf, divisor), np.dtype(dt), mean=divisor != 1)


def rounding_cases(dt, rng) -> np.ndarray:
    """Word rows at every rounding decision of ``dt``: ties either way, a unit past them, subnormals, the
    largest finite and past it, zero, both signs, large and tiny totals, NaN/inf flags."""
    fi = np.finfo(dt)
    p, emin = fi.nmant + 1, fi.minexp
    shift = -cupy_exact.WORD_BASE  # total = value * 2**1074
    totals = [0, 1, -1, 2, 3]
    for e in (emin - p, emin - p + 1, emin - 3, emin, emin + 1, 0, 1, 30, fi.maxexp - 1):
        q = max(e, emin) - (p - 1)  # the ulp's exponent at 2**e
        ulp = 1 << (q + shift)
        for m in (1 << (p - 1), (1 << (p - 1)) + 1, (1 << p) - 1, 1, 2, 3):
            base = m * ulp
            half = ulp // 2
            for t in (base, base + half, base - half, base + half + 1, base + half - 1, base + 1, base - 1):
                if t > 0:
                    totals += [t, -t]
    big = (1 << (fi.maxexp + shift)) - (1 << (fi.maxexp - p - 1 + shift))  # max + half ulp: rounds to inf
    totals += [big, big - 1, -big, 1 << (32 * cupy_exact.KWORDS - 2), -(1 << (32 * cupy_exact.KWORDS - 2))]
    for _ in range(300):
        bits = int(rng.integers(1, 32 * cupy_exact.KWORDS - 2))
        totals.append(int(rng.choice([-1, 1])) * int.from_bytes(rng.bytes(bits // 8 + 1), "little") % (1 << bits))
    rows = [words_of(t) for t in totals]
    rows += [words_of(t, spread=rng) for t in totals[::7]]
    for flags in (1, 2, 4, 3, 5, 6, 7):
        rows += [words_of(12345, flags), words_of(-(1 << 1100), flags)]
    return np.stack(rows)


@pytest.mark.parametrize("skipnan,divisor", [(False, 1), (True, 1), (False, 3), (False, 10), (False, 1025),
                                             (False, (1 << 31) - 1), (False, (1 << 62) + 12345), (False, 0)])
@pytest.mark.parametrize("dt", DTYPES)
def test_device_rounding_matches_exact_py(dt, skipnan, divisor):
    """Sums (divisor 1) and means (divisor the count; 0: an empty mean, NaN) of every rounding case."""
    words = rounding_cases(dt, np.random.default_rng(17))
    if divisor > 1:  # quotients that land on ties and a unit past them: totals that are divisor x a case
        words = np.concatenate([words, np.stack([words_of(divisor * int(t)) for t in
                                                 cupy_exact.fold_words(words[:60])[0] >> 53])])
    with np.errstate(over="ignore"):  # past the dtype's range: inf, as the kernel's Convert<Out, double>
        got = exact_emulate.emulate_round(words, dt, skipnan, divisor).astype(dt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = host_rounding(words, dt, skipnan, divisor)
    bits = np.dtype(f"i{np.dtype(dt).itemsize}")
    same = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, [(int(cupy_exact.fold_words(words[i:i + 1])[0][0]), got[i], want[i]) for i in bad[:5]]


def test_device_rounding_of_emulated_rows():
    rng = np.random.default_rng(5)
    for dt in DTYPES:
        for name, x in hostile(dt, 1025, rng).items():
            words = exact_emulate.emulate_words(x, grid=3, block=32, terms=cupy_exact.TERMS,
                                                unroll=cupy_exact.UNROLL[np.dtype(dt).name])[None, :]
            for skipnan in (False, True):
                with np.errstate(over="ignore"):
                    got = exact_emulate.emulate_round(words, dt, skipnan).astype(dt)
                want = host_rounding(words, dt, skipnan)
                assert np.array_equal(got, want, equal_nan=True) and np.signbit(got) == np.signbit(want), (dt, name)
