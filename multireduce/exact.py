"""Exact (correctly rounded) sums, means and cumulative sums of floating-point arrays.

Every finite float is ``mant * 2**(e - 53)`` with an integer ``|mant| < 2**53`` (``np.frexp``). A chunk's
state is one Python integer per output, ``S`` with value ``S * 2**EBASE``: the exact sum of its finite
elements, plus flags for NaN, +inf and -inf and the element count. States add exactly, so any chunking,
tree fan-in, worker count or placement yields the same integer, and the result is rounded once
(round-half-even) to the output dtype. Inf/NaN follow NumPy: NaN if any NaN or both infinities, else the
infinity; a finite sum beyond the dtype's range rounds to inf.

On the CPU the per-chunk pass is vectorized: elements are binned by (row, exponent) with ``np.bincount``, each
contributing two pieces of at most 27 bits (float64 weights), ``_BATCH`` elements per call, so every bin's
float sum is an exact integer; each call's bins go into the Python integers before the next call, so no
float sum grows with the chunk, and only the bins that occur are made. CuPy chunks get the same integer from the GPU
kernel of kernels/exact.cuh (backends/cupy_exact.py), and exact cumsums of CuPy arrays and of a Dask
array's CuPy chunks the scan of kernels/exact_scan.cuh, seeded with the same carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._validation import as_array, check_flag, fan_in, flattened, normalize_axes, normalize_scan_axis, requested_dtype
from .core import carry_of
from .errors import gpu_memory_guard

EBASE = -1127  # value of bin k's unit: 2**(k + EBASE); frexp's exponent e maps to k = e + 1074
NBINS = 2100  # e + 1074 spans 0..2098 for float64
# Elements per np.bincount call. A piece is an integer below 2**27, so a cell's float64 sum of up to 2**26
# of them is exact; a batch stays well below that, and its cells go into the Python integers before the
# next batch, so no float sum grows with the chunk. 2**18 bounds a batch's temporaries (~100 bytes per
# element: frexp, pieces, keys, bincount) to ~25 MB and keeps them in cache.
_BATCH = 1 << 18
_FOLD = 1 << 12  # cells turned into Python objects at a time
_SCAN_SEGMENT = 1 << 12  # elements of a lane turned into Python objects at a time by the host scan
_SPLIT = float(2**27)


def _fmt(dt: np.dtype) -> tuple[int, int]:
    """(precision in bits, minimum normal exponent) of a float dtype."""
    fi = np.finfo(dt)
    return fi.nmant + 1, fi.minexp


def round_exact(num: int, den: int, exp: int, dt: np.dtype) -> float:
    """``num / den * 2**exp`` (den > 0) correctly rounded, half to even, to ``dt``, as a float64 that
    ``dt`` represents exactly (or +-inf on overflow)."""
    if num == 0:
        return 0.0
    p, emin = _fmt(dt)
    sign = -1.0 if num < 0 else 1.0
    num = abs(num)
    # k = floor(log2(num / den)) + exp
    k = num.bit_length() - den.bit_length()
    if (num << max(0, -k)) < (den << max(0, k)):
        k -= 1
    k += exp
    q = max(k - (p - 1), emin - (p - 1))  # the ulp's exponent (subnormals keep emin's ulp)
    # m = num / den / 2**(q - exp), split into integer part and remainder
    s = q - exp
    n2, d2 = (num, den << s) if s >= 0 else (num << -s, den)
    m, rem = divmod(n2, d2)
    if 2 * rem > d2 or (2 * rem == d2 and m & 1):
        m += 1
    try:
        value = math.ldexp(float(m), q)
    except OverflowError:
        return sign * math.inf
    if value > float(np.finfo(dt).max):
        return sign * math.inf
    return sign * value


@dataclass(frozen=True)
class ExactState:
    """Exact partial of a sum over some axes: ``total`` (object array of Python ints, value total * 2**EBASE),
    ``nan``/``pinf``/``ninf`` flags (bool arrays of the same shape) and the element ``count`` per output."""

    total: np.ndarray
    nan: np.ndarray
    pinf: np.ndarray
    ninf: np.ndarray
    count: int

    def __add__(self, other: "ExactState") -> "ExactState":
        return ExactState(
            np.asarray(self.total + other.total, dtype=object),
            self.nan | other.nan,
            self.pinf | other.pinf,
            self.ninf | other.ninf,
            self.count + other.count,
        )


def _pieces(part: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
    """(bin index e + 1074 of every element, [(weights, shift)]): each finite element of ``part`` is the sum
    of its pieces' ``weight * 2**(index + shift + EBASE)``, every weight an integer below 2**27 in
    magnitude. float16/32 mantissas fit 24 bits: one piece; float64's 53 bits: two (27 high, 26-27 low)."""
    m, e = np.frexp(part)
    index = e.astype(np.int64)
    index += 1074
    if part.dtype.itemsize <= 4:
        bits = 11 if part.dtype.itemsize == 2 else 24
        return index, [(m * part.dtype.type(2**bits), 53 - bits)]  # exact integers
    m *= 9007199254740992.0  # 2**53: exact
    high = np.floor(m / _SPLIT)
    m -= high * _SPLIT
    return index, [(high, 27), (m, 0)]


def _add_cells(totals: list, rows: np.ndarray, shifts: np.ndarray, values: np.ndarray) -> None:
    """totals[rows[i]] += values[i] * 2**shifts[i] for float64 ``values`` holding integers, in slices,
    so that the Python lists made on the way stay small whatever the count."""
    for start in range(0, values.size, _FOLD):
        stop = start + _FOLD
        for r, s, v in zip(rows[start:stop].tolist(), shifts[start:stop].tolist(), values[start:stop].tolist()):
            totals[r] += int(v) << s


def _row_totals(flat: np.ndarray, rows: int, n: int) -> list[int]:
    """The exact sums of the rows of ``flat`` (rows x n, C order, finite floats, n > 0), one Python int per
    row in units of 2**EBASE. ``flat`` is taken ``_BATCH`` elements at a time: each batch's pieces are
    summed per (row, exponent) cell with ``np.bincount`` (exact: fewer than 2**53 in every cell) and the
    cells are added into the rows' integers before the next batch, so no float sum spans two batches.
    A batch holding one row bins by exponent; one spanning several rows bins only the exponents that
    occur, and only the (row, exponent) pairs that occur once those outnumber its elements, so memory
    follows the batch, not the rows times the 2100 exponents."""
    totals = [0] * rows
    for start in range(0, flat.size, _BATCH):
        part = flat[start : start + _BATCH]
        first, last = start // n, (start + part.size - 1) // n
        index, pieces = _pieces(part)
        if first == last:
            key, size, width, used, cells = index, NBINS, NBINS, None, None
        else:
            counts = np.bincount(index, minlength=NBINS)
            used = np.flatnonzero(counts)
            width = used.size
            dense = np.zeros(NBINS, dtype=np.int64)
            dense[used] = np.arange(width)
            key = np.arange(start, start + part.size, dtype=np.int64)
            key //= n
            key -= first
            key *= width
            key += dense[index]
            size, cells = (last - first + 1) * width, None
            if size > 2 * part.size:  # more cells than elements: only the pairs that occur
                cells, key = np.unique(key, return_inverse=True)
                size = cells.size
        for weights, shift in pieces:
            sums = np.bincount(key, weights=weights, minlength=size)
            nonzero = np.flatnonzero(sums)
            cell = nonzero if cells is None else cells[nonzero]
            exponent = cell % width if used is None else used[cell % width]
            _add_cells(totals, first + cell // width, exponent + shift, sums[nonzero])
    return totals


def state_of(block, axes: tuple[int, ...]) -> ExactState:
    """The exact state of ``block`` reduced over ``axes`` (reduced axes dropped from the state's shape).
    A CuPy block's state is computed on its GPU (backends/cupy_exact.py: the same integer)."""
    if type(block).__module__.startswith("cupy"):
        from .backends import cupy_exact

        return cupy_exact.state_of(block, axes)
    x = np.asarray(block)
    kept = [d for d in range(x.ndim) if d not in axes]
    xt = np.transpose(x, kept + list(axes))
    kept_shape = tuple(x.shape[d] for d in kept)
    rows = math.prod(kept_shape)
    n = math.prod(x.shape[a] for a in axes)
    flat = np.ascontiguousarray(xt).reshape(rows * n)
    finite = np.isfinite(flat)
    all_finite = bool(finite.all())
    shaped = lambda a: a.reshape(kept_shape)  # noqa: E731
    if all_finite:
        false = np.zeros(kept_shape, dtype=bool)
        nan = pinf = ninf = false
    else:
        grid = flat.reshape(rows, n)
        nan = shaped(np.isnan(grid).any(axis=1))
        pinf = shaped((grid == np.inf).any(axis=1))
        ninf = shaped((grid == -np.inf).any(axis=1))
        flat = np.where(finite, flat, 0.0)
    if rows == 0:
        total = np.empty(kept_shape, dtype=object)
    elif n == 0:
        total = np.empty(kept_shape, dtype=object)
        total.fill(0)
    else:
        total = np.empty(rows, dtype=object)
        total[:] = _row_totals(flat, rows, n)
        total = total.reshape(kept_shape)
    return ExactState(total, nan, pinf, ninf, n)


def finish(state: ExactState, dt: np.dtype, mean: bool = False) -> np.ndarray:
    """Round the state once to ``dt`` (divided exactly by the count for a mean)."""
    out = np.empty(state.total.shape, dtype=np.float64)
    den = state.count if mean else 1
    flat_out = out.reshape(-1)
    for i, (t, nan, pinf, ninf) in enumerate(
        zip(state.total.reshape(-1), state.nan.reshape(-1), state.pinf.reshape(-1), state.ninf.reshape(-1))
    ):
        if nan or (pinf and ninf) or den == 0:
            flat_out[i] = math.nan
        elif pinf:
            flat_out[i] = math.inf
        elif ninf:
            flat_out[i] = -math.inf
        else:
            flat_out[i] = round_exact(t, den, EBASE, dt)
    return out.astype(dt)


class _Commutative:
    commutative = True
    name = "exact-sum"


class ExactSumPlan:
    """The reduction contract of ``graph.reduction`` for exact sums and means: partials are ExactStates."""

    op = _Commutative()

    def __init__(self, axes: tuple[int, ...], out_dtype: np.dtype, keepdims: bool, mean: bool, skipnan: bool = False):
        self.axes, self.out_dtype, self.keepdims, self.mean = axes, np.dtype(out_dtype), keepdims, mean
        self.skipnan = skipnan
        self.label = "exact-mean" if mean else ("exact-nansum" if skipnan else "exact-sum")

    def __dask_tokenize__(self):
        return ("ExactSumPlan", self.axes, str(self.out_dtype), self.keepdims, self.mean, self.skipnan)

    def partial(self, *blocks) -> ExactState:
        return self.combine(*(state_of(b, self.axes) for b in blocks))

    def combine(self, *partials: ExactState) -> ExactState:
        out = partials[0]
        for p in partials[1:]:
            out = out + p
        return out

    #: a left fold of exact integer states (``graph.first_level_folds``): any grouping gives the same state
    folds_left = True

    def aggregate(self, *partials: ExactState):
        state = self.combine(*partials)
        if self.skipnan:  # nansum: a NaN adds 0 (its mantissa never entered the total); only its flag goes
            state = ExactState(state.total, np.zeros_like(state.nan), state.pinf, state.ninf, state.count)
        value = finish(state, self.out_dtype, self.mean)
        if self.keepdims:
            value = np.expand_dims(value, self.axes)
        return value

    def whole(self, *blocks):
        return self.aggregate(self.partial(*blocks))


def _out_dtype(x_dtype: np.dtype, dtype, caller: str) -> np.dtype:
    if x_dtype.kind != "f":
        raise TypeError(f"{caller}: argument 'x' has dtype {x_dtype}; expected a floating-point dtype (float16/32/64)")
    dt = requested_dtype(dtype, "f", caller)
    dt = x_dtype if dt is None else dt
    if dt.itemsize > 8:
        raise TypeError(f"{caller}: argument 'dtype' is {dt}; expected float16, float32 or float64")
    if x_dtype.itemsize > 8:
        raise TypeError(f"{caller}: argument 'x' has dtype {x_dtype}; expected float16, float32 or float64")
    return dt


def _reduce(x, axis, dtype, keepdims, mean: bool, caller: str, split_every=None, skipnan=False):
    x, kind = as_array(x, caller)
    out_dt = _out_dtype(np.dtype(x.dtype), dtype, caller)
    axes = normalize_axes(axis, x.ndim, caller)
    plan = ExactSumPlan(axes, out_dt, check_flag(keepdims, "keepdims", caller), mean, skipnan)
    fan = fan_in(split_every, axes, caller)  # checked for every input kind, as the other entry points do
    if kind.startswith("dask"):
        from . import direct, graph, placement

        held = direct.held_result(x, plan, fan)  # .compute() folds the held chunks' states on the client
        if held is not None:
            return held
        return graph.reduction(x, plan, fan, placement.grouping_for(x, True))
    if kind == "cupy":
        from .backends import cupy_exact

        return cupy_exact.reduce(x, plan)
    value = plan.whole(x)
    return value if value.ndim else value[()]


def sum(x, axis=None, dtype=None, keepdims=False, split_every=None, *, skipnan=False,  # noqa: A001 - np.sum
        caller="exact.sum"):
    """The correctly rounded sum of ``x`` over ``axis``: the exact sum, rounded once (half to even) to
    ``dtype`` (default: ``x``'s float dtype). Bitwise the same for any chunking, fan-in and placement.
    ``skipnan``: NaN counts as 0 (nansum), without a copy of ``x``. ``caller`` names the public function
    in error messages (``multireduce.sum(..., exact=True)`` checks as ``multireduce.sum``)."""
    return _reduce(x, axis, dtype, keepdims, False, caller, split_every, skipnan)


def mean(x, axis=None, dtype=None, keepdims=False, split_every=None, *, caller="exact.mean"):
    """The correctly rounded mean: exact sum / count, rounded once."""
    return _reduce(x, axis, dtype, keepdims, True, caller, split_every)


# -- cumulative sums ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneState:
    """One lane's exact state in a cumsum's totals and carries: ``total`` (value total * 2**EBASE) and the
    NaN/+inf/-inf flags as the bits ``NAN | PINF | NINF``. One small object per lane and chunk: a scan
    along a short axis has as many lanes as elements."""

    total: int = 0
    flags: int = 0

    NAN: ClassVar[int] = 1
    PINF: ClassVar[int] = 2
    NINF: ClassVar[int] = 4

    def __add__(self, other: "LaneState") -> "LaneState":
        return LaneState(self.total + other.total, self.flags | other.flags)

    @property
    def nan(self) -> bool:
        return bool(self.flags & self.NAN)

    @property
    def pinf(self) -> bool:
        return bool(self.flags & self.PINF)

    @property
    def ninf(self) -> bool:
        return bool(self.flags & self.NINF)


def _exact_scan_1d(values: np.ndarray, carry: LaneState | None, dt: np.dtype, skipnan: bool = False) -> np.ndarray:
    """Correctly rounded inclusive prefix sums of a 1-d float array, seeded with ``carry``. ``skipnan``: NaN
    adds 0 (nancumsum), and so does a NaN flag in ``carry`` (as on the GPU, whose seeds drop the NaN counts
    of carry and tiles alike). Outputs are first proved from a float64 running sum (``_proved_scan``; for
    float64 outputs with the sum's exact rounding errors beside it); any it leaves unproved, and short
    lanes, come from the exact walk."""
    carry = LaneState() if carry is None else carry
    dt = np.dtype(dt)
    if values.size >= _PROVED_MIN:
        return _proved_scan(values, carry, dt, skipnan)
    return _exact_walk(values, carry, dt, skipnan)


_PROVED_MIN = 64  # shorter lanes (a scan along a short axis has many) take the walk: less setup per lane
_PROVED_BLOCK = 4096  # elements per exact anchor: the bound grows with the block, not with the lane
_PROVED_MAX_UNPROVED = 16  # more unproved outputs than this in a block: the walk for that block


def _proved_scan(values: np.ndarray, carry: LaneState, dt: np.dtype, skipnan: bool) -> np.ndarray:
    """_exact_scan_1d as pass 2's tile-wide paths on the GPU prove it, a block of _PROVED_BLOCK elements at a
    time from the exact total before it (``_proved_block``); NaN and infinities decide their outputs as the
    walk does."""
    v = values.astype(np.float64, copy=False)
    w = np.where(np.isfinite(v), v, 0.0)
    out = np.empty(v.size, dtype=dt)
    total = carry.total
    for start in range(0, v.size, _PROVED_BLOCK):
        block = w[start:start + _PROVED_BLOCK]
        got = _proved_block(block, total, dt)
        if got is None:  # the walk for this block, from the same exact total
            got = _exact_walk(block, LaneState(total), dt, skipnan)
        out[start:start + block.size] = got
        total += _exact_units(block)
    nan = np.logical_or.accumulate(np.isnan(v) & (not skipnan)) | (carry.nan and not skipnan)
    pinf = np.logical_or.accumulate(v == np.inf) | bool(carry.pinf)
    ninf = np.logical_or.accumulate(v == -np.inf) | bool(carry.ninf)
    out[pinf | ninf] = np.where(pinf, np.inf, -np.inf)[pinf | ninf]
    out[nan | (pinf & ninf)] = np.nan
    return out


def _proved_block(w: np.ndarray, total: int, dt: np.dtype):
    """The correctly rounded prefixes of the finite doubles ``w`` after the exact total ``total`` (units
    2**EBASE), or None where too few are proved: a float64 running sum from the total's nearest double
    (np.add.accumulate, in order; None past the doubles' range), its outputs proved by _narrow_outputs
    (float16/float32) or _wide_outputs (float64), the others rounded from the exact totals at their
    positions."""
    hi, lo, rest = _carry_parts(total)
    if hi is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.add.accumulate(np.concatenate([[hi], w]))  # a[0]: the total's double, then a running value per element
        if not np.all(np.isfinite(a)):
            return None
        out, proved = (_narrow_outputs if dt.itemsize <= 4 else _wide_outputs)(w, a, lo, rest, dt)
    where = np.flatnonzero(~proved)
    if where.size > _PROVED_MAX_UNPROVED:
        return None
    last = 0
    for i in where.tolist():  # the exact total up to each unproved output, from the one before
        total += _exact_units(w[last:i + 1])
        last = i + 1
        out[i] = round_exact(total, 1, EBASE, dt)
    return out


def _narrow_outputs(w: np.ndarray, a: np.ndarray, lo: float, rest: float, dt: np.dtype):
    """_proved_block's float16/float32 outputs and which are proved. The running value a_k lies within U_k
    of the exact prefix: the total's own rounding error (|lo| + rest), plus each addition's (at most |a_j|
    2^-53; their sum taken as cumsum(|a|) 2^-52, which also covers that float cumsum's own error, times
    1 + 2^-40 for the rest), or nothing more where every element and the total's double are multiples of
    2^g and every prefix stays below 2^53 g (no addition rounds; ties decided exactly). An output is proved
    where a - U and a + U, moved one ulp outward, round to the same value (monotone rounding): then that
    value is the exact prefix's."""
    hi, a = a[0], a[1:]
    base = abs(lo) + rest
    if _sums_exact(w, hi, lo):
        u = np.full(a.shape, base)
    else:
        u = (base + np.add.accumulate(np.abs(a)) * 2.0**-52) * (1.0 + 2.0**-40)
    below = np.where(u > 0, np.nextafter(a - u, -np.inf), a)
    above = np.where(u > 0, np.nextafter(a + u, np.inf), a)
    out, top = below.astype(dt), above.astype(dt)
    bits = {2: np.uint16, 4: np.uint32}[dt.itemsize]
    return out, out.view(bits) == top.view(bits)


def _wide_outputs(w: np.ndarray, a: np.ndarray, lo: float, rest: float, dt: np.dtype):
    """_narrow_outputs' float64 form. A double cannot prove a 53-bit rounding, so beside the running sum a_k
    the exact rounding error of each of its additions is computed (TwoSum: a_k + e_k = a_(k-1) + w_k), and
    their running sum E_k from the total's low part: a_k + E_k is the exact prefix but for E's own
    roundings, bounded by cumsum(|E|) 2^-52 (or nothing where E's sums are provably exact, as _sums_exact
    tells) and the total's remainder. (h, l) = TwoSum(a_k, E_k); the output is h where h + l lies inside
    h's rounding interval by more than that bound, and the even neighbour where the bound is 0 and h + l is
    its midpoint exactly."""
    before, a = a[:-1], a[1:]
    bv = a - before
    e = (before - (a - bv)) + (w - bv)  # a + e == before + w exactly
    big = np.add.accumulate(np.concatenate([[lo], e]))[1:]
    if _sums_exact(e, lo, 0.0):
        u = np.full(a.shape, rest)
    else:
        u = (rest + np.add.accumulate(np.abs(big)) * 2.0**-52) * (1.0 + 2.0**-40)
    h = a + big
    bv = h - a
    low = (a - (h - bv)) + (big - bv)  # h + low == a + big exactly
    mag, toward = np.abs(h), np.where(h < 0, -low, low)  # the value's magnitude is mag + toward (+- u)
    m, ex = np.frexp(mag)
    up = np.ldexp(1.0, ex - 54)  # half the gap to the next double above mag
    down = np.where(m == 0.5, up / 2, up)  # and below (half again under a power of two)
    margin = u + (np.abs(low) + u) * 2.0**-50  # covers the float comparisons below
    inside = (toward + margin < up) & (toward - margin > -down)
    tie_up = (u == 0) & (toward == up)
    tie_down = (u == 0) & (toward == -down)
    neighbour = np.where(tie_up, np.nextafter(mag, np.inf), np.nextafter(mag, 0.0))
    even = (mag.view(np.int64) & 1) == 0
    rounded = np.where((tie_up | tie_down) & ~even, neighbour, mag)
    proved = (inside | tie_up | tie_down) & (mag >= 2.0**-1021) & (mag < 2.0**1020)
    zero = (h == 0) & (low == 0) & (u == 0)  # an exact zero prefix is +0.0
    out = np.where(h < 0, -rounded, rounded)
    out[zero] = 0.0
    return out, proved | zero


def _carry_parts(total: int) -> tuple:
    """A carry total (units 2**EBASE) as hi (its nearest double), lo (the nearest double of what is left)
    and a bound on what is left after both; (None, None, None) past the doubles' range."""
    try:
        hi = round_exact(total, 1, EBASE, np.dtype(np.float64))
    except OverflowError:
        return None, None, None
    if not math.isfinite(hi):
        return None, None, None
    left = total - _units(hi)
    lo = round_exact(left, 1, EBASE, np.dtype(np.float64))
    left -= _units(lo)
    rest = math.ldexp(1.0, EBASE + abs(left).bit_length()) if left else 0.0  # above |left| 2**EBASE
    return hi, lo, rest


def _units(d: float) -> int:
    """A finite double as an integer count of 2**EBASE."""
    num, den = float(d).as_integer_ratio()
    return (num << -EBASE) // den


def _exact_units(w: np.ndarray) -> int:
    """The exact sum of finite doubles as an integer count of 2**EBASE (state_of's, vectorized)."""
    return int(state_of(w, (0,)).total[()]) if w.size else 0


def _sums_exact(w: np.ndarray, hi: float, lo: float) -> bool:
    """Whether every running sum a_k is exact: the elements, hi and lo are multiples of 2**g (g: the least
    lowest set bit among them) and every partial sum, at most |hi| + |lo| + sum |w| (the largest |a| is
    below that), stays below 2**53 2**g, so no addition rounds (lo is then 0 or the sums would not fit)."""
    if lo != 0.0:
        return False
    parts = np.concatenate([w[w != 0.0], [hi] if hi != 0.0 else []])
    if parts.size == 0:
        return True
    m, e = np.frexp(parts)
    mant = np.abs(np.ldexp(m, 53).astype(np.int64))
    lowest = mant & -mant  # a power of two: the lowest set bit of each significand
    g = int((np.frexp(lowest.astype(np.float64))[1] - 1 + e - 53).min())
    reach = (abs(hi) + float(np.abs(w).sum())) * (1.0 + 2.0**-40)
    return math.isfinite(reach) and (53 + g > 1023 or reach < math.ldexp(1.0, 53 + g))


def _exact_walk(values: np.ndarray, carry: LaneState, dt: np.dtype, skipnan: bool) -> np.ndarray:
    """_exact_scan_1d element by element: the exact running total as a Python integer, rounded at every
    element. ``_SCAN_SEGMENT`` elements at a time: the per-element Python objects of a segment are all
    this makes besides the output."""
    total, nan, pinf, ninf = carry.total, carry.nan and not skipnan, carry.pinf, carry.ninf
    out = np.empty(values.size, dtype=dt)
    for start in range(0, values.size, _SCAN_SEGMENT):
        v = values[start : start + _SCAN_SEGMENT].astype(np.float64, copy=False)
        m, e = np.frexp(np.where(np.isfinite(v), v, 0.0))
        mant = np.ldexp(m, 53).astype(np.int64).tolist()
        shifts = (e.astype(np.int64) + 1074).tolist()
        isnan = (np.zeros(v.shape, dtype=bool) if skipnan else np.isnan(v)).tolist()
        isp, isn = (v == np.inf).tolist(), (v == -np.inf).tolist()
        res = np.empty(v.size, dtype=np.float64)
        for i, (mi, si) in enumerate(zip(mant, shifts)):
            total += mi << si
            nan |= isnan[i]
            pinf |= isp[i]
            ninf |= isn[i]
            if nan or (pinf and ninf):
                res[i] = math.nan
            elif pinf or ninf:
                res[i] = math.inf if pinf else -math.inf
            else:
                res[i] = round_exact(total, 1, EBASE, dt)
        out[start : start + v.size] = res  # values dt holds exactly (or inf/NaN)
    return out


def _cumsum_block(block, axis: int, dt: np.dtype, carry: np.ndarray | None = None, skipnan: bool = False):
    """Exact cumsum of a block along ``axis``; ``carry``: object array of per-lane LaneStates (the block's
    shape without ``axis``). A CuPy block is scanned on its GPU, whatever its axis and lanes
    (cupy_exact.cumsum: the same bits), and stays there."""
    if type(block).__module__.startswith("cupy"):
        from .backends import cupy_exact

        return cupy_exact.cumsum(block, axis, dt, skipnan, carry)
    x = np.moveaxis(np.asarray(block), axis, -1)
    out = np.empty(x.shape, dtype=dt)
    lanes = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not (-1, n): n = 0 leaves -1 undefined
    res = out.reshape(lanes.shape)
    carries = carry.reshape(-1) if carry is not None else [None] * lanes.shape[0]
    for i in range(lanes.shape[0]):
        res[i] = _exact_scan_1d(lanes[i], carries[i], dt, skipnan)
    return np.moveaxis(out, -1, axis)


def _lane_states(block, axis: int, skipnan: bool = False) -> np.ndarray:
    """Per-lane exact totals of a block along ``axis``, as an object array of LaneStates."""
    st = state_of(block, (axis,))
    flags = (st.pinf * LaneState.PINF) | (st.ninf * LaneState.NINF)
    if not skipnan:
        flags |= st.nan * LaneState.NAN
    out = np.empty(st.total.shape, dtype=object)
    out.reshape(-1)[:] = [LaneState(t, f) for t, f in zip(st.total.reshape(-1).tolist(), flags.reshape(-1).tolist())]
    return out


@dataclass(frozen=True)
class ExactScanPlan:
    """The exact cumsum's per-chunk contract, the one ``core.ScanPlan`` has, so ``graph.scan`` (totals
    grouped per worker, one carries stage, depth 3 whatever the chunk count) and the held direct path
    (``direct.scan_of_held``: two ``client.run``, no task) serve it as they serve every scan. Totals are
    each lane's LaneState (host objects, exact), the carries their exact running sums in chunk order,
    and each chunk is scanned from its lanes' carry by ``_cumsum_block`` (its GPU's kernels for CuPy)."""

    axis: int
    out_dtype: np.dtype
    skipnan: bool = False
    label: str = "exact-cumsum"
    #: Python integer adds per lane and chunk: made once, in the carries task, not in every scan task
    carries_are_cheap: ClassVar[bool] = False

    def totals(self, *blocks) -> np.ndarray:
        """Each chunk's per-lane LaneStates, concatenated along the axis (one entry per chunk)."""
        parts = [np.expand_dims(_lane_states(b, self.axis, self.skipnan), self.axis) for b in blocks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=self.axis)

    def carries(self, *totals) -> np.ndarray:
        """The running exact sums of the totals along the axis: entry k-1 is what chunk k starts from."""
        stacked = totals[0] if len(totals) == 1 else np.concatenate(totals, axis=self.axis)
        rows = np.moveaxis(stacked, self.axis, -1)
        flat = rows.reshape(-1, rows.shape[-1])
        out = np.empty(flat.shape, dtype=object)
        for r in range(flat.shape[0]):
            running = flat[r, 0]
            out[r, 0] = running
            for i in range(1, flat.shape[1]):
                running = running + flat[r, i]
                out[r, i] = running
        return np.moveaxis(out.reshape(rows.shape), -1, self.axis)

    def scan_block(self, block, carries=None, index: int = 0):
        carry = carry_of(carries, self.axis, index)
        with gpu_memory_guard(block, f"{self.label} of a chunk"):
            return _cumsum_block(block, self.axis, self.out_dtype, carry, self.skipnan)

    def __call__(self, x):
        return self.scan_block(x)

    def __dask_tokenize__(self):
        return ("multireduce.ExactScanPlan", self.axis, str(self.out_dtype), self.skipnan, self.label)


def cumsum(x, axis=None, dtype=None, split_every=None, *, skipnan=False, caller="exact.cumsum"):
    """Inclusive cumulative sum whose every element is the correctly rounded exact prefix sum. ``axis=None``
    flattens (as NumPy). Dask input: each chunk's exact totals are carried exactly to the chunks after it,
    through the scans' own graph (``ExactScanPlan``) or, for a persisted array's ``.persist()``, the
    held direct path; CuPy chunks (their totals and their scans, any axis) run on their GPUs, and only the
    totals' words come to the host for the carries.
    ``skipnan``: NaN adds 0 (nancumsum); ``caller`` as in ``sum``. ``split_every`` is checked as every
    scan checks it (the carries are one exact fold whatever it is)."""
    x, kind = as_array(x, caller)
    dt = _out_dtype(np.dtype(x.dtype), dtype, caller)
    ax = 0 if axis is None else normalize_scan_axis(axis, x.ndim, caller)
    fan = fan_in(split_every, (ax,), caller)
    if axis is None:
        x = flattened(x, kind, caller)
    if kind == "numpy":
        return _cumsum_block(x, ax, dt, skipnan=skipnan)
    if kind == "cupy":  # on its GPU: kernels/exact_scan.cuh, the same bits
        from .backends import cupy_exact

        return cupy_exact.cumsum(x, ax, dt, skipnan)
    if 0 in x.shape:  # nothing to scan, and dask cannot compute a block() of several zero-size delayed chunks
        return x.astype(dt)
    from . import direct, graph, placement

    plan = ExactScanPlan(ax, dt, skipnan, "exact-nancumsum" if skipnan else "exact-cumsum")
    held = direct.held_scan(x, plan, fan)
    if held is not None:
        return held
    return graph.scan(x, plan, fan, placement.scan_grouping(x, placement.grouping_for(x, commutative=True)))


__all__ = ["sum", "mean", "cumsum", "ExactState", "LaneState", "ExactSumPlan", "ExactScanPlan", "round_exact", "state_of", "finish"]
