"""CPU model of the statistics kernels in kernels/stats.cuh, checked against NumPy where no GPU is.

Each class and function below mirrors one device function or kernel, formula for formula, and is named
after it (``ArgStat.visit`` is ``mr::ArgStat<T, Largest, SkipNan>::visit``, ``stats_rows`` is
``mr::stats_rows``, ...), so a reader can hold the two side by side. The model runs the kernels' exact
element order: the 16-byte head, UNROLL packs per thread in flight with a grid-stride over the row's
blocks, the tail, the warp shuffle tree (``warp_merge``), the block's warp fold, and ``stats_fold`` over
the blocks; the layouts, splits and pieces come from the host code itself (``cupy_stats.plan_layout``,
``row_splits``, ``column_pieces``). The cases are the hostile ones of NumPy's rules: inf, -inf and NaN at
pack, unroll, block and grid-stride boundaries, ties across threads and blocks, nanargmax's NaN-as--inf,
values near 1e308, every ddof rule, one element. Doubles are IEEE doubles in Python too; the GPU may fuse
a multiply-add, so values are compared with a tolerance and special values (inf, NaN) exactly.
The kernels themselves run against NumPy in tests/gpu/test_gpu_statistics.py."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

from multireduce.backends import cupy_stats, numpy_stats

from .helpers import hostile_slices

BLOCK, ROW_UNROLL, COLUMN_UNROLL = cupy_stats.BLOCK, cupy_stats.ROW_UNROLL, cupy_stats.COLUMN_UNROLL
WARP = 32
INF, NAN = math.inf, math.nan


def is_nan(v):
    return v != v


def finite(w):  # MomentsStat::finite
    return w - w == 0.0


def ieee_div(a, b):
    """a / b as the GPU divides (x / 0 is inf or NaN; Python raises)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def key_of(dtype):  # StatKey<T>: float16 compares as float; Python floats and ints hold every key exactly
    return float if np.dtype(dtype).kind == "f" else int


# ---------------------------------------------------------------------------------------------------
# the Stat policies
# ---------------------------------------------------------------------------------------------------
class ArgStat:
    """mr::ArgStat<T, Largest, SkipNan>: State (key, index)."""

    def __init__(self, dtype, largest, skipnan):
        self.largest, self.skipnan = largest, skipnan and np.dtype(dtype).kind == "f"
        self.floating = np.dtype(dtype).kind == "f"
        self.K = key_of(dtype)

    def nan_as_worst(self, k):  # mr::nan_as_worst<Largest, K>
        if self.floating:
            return (-INF if self.largest else INF) if is_nan(k) else k
        return k

    def start(self):
        return (self.K(0), -1)

    def beats(self, b, a):
        return b > a if self.largest else b < a

    def visit(self, s, v, i):
        k = self.K(v)
        if s[1] < 0:
            return (k, i)
        if self.skipnan:
            r, rs = self.nan_as_worst(k), self.nan_as_worst(s[0])
            if self.beats(r, rs):
                return (r, i)
            if not is_nan(k):
                return (rs, s[1])
            return s
        if not is_nan(s[0]) and (is_nan(k) or self.beats(k, s[0])):
            return (k, i)
        return s

    def visit_run(self, s, v, at):  # OneByOne::visit_run
        for k, i in zip(v, at):
            s = self.visit(s, k, i)
        return s

    def merge(self, a, b):
        if b[1] < 0:
            return a
        if a[1] < 0:
            return b
        lower = b[1] < a[1]
        if self.skipnan:
            ra, rb = self.nan_as_worst(a[0]), self.nan_as_worst(b[0])
            take = self.beats(rb, ra) or (rb == ra and lower)
            hollow = is_nan(a[0]) and is_nan(b[0])
            return (a[0] if hollow else (rb if take else ra), b[1] if take else a[1])
        an, bn = is_nan(a[0]), is_nan(b[0])
        take = (bn and (not an or lower)) if (an or bn) else (self.beats(b[0], a[0]) or (b[0] == a[0] and lower))
        return b if take else a

    def result(self, s, ddof, mode):
        return -1 if (self.skipnan and is_nan(s[0])) else s[1]


def _fused_f32(a, b, c):
    """a * b + c rounded once to float32, half to even (__fmaf_rn), for finite float32 a, b, c."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))  # within an ulp of the exact value; its neighbours decide
    candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    gaps = [abs(Fraction(float(k)) - exact) for k in candidates]
    best = min(gaps)
    ties = [k for k, g in zip(candidates, gaps) if g == best]
    return ties[0] if len(ties) == 1 else next(k for k in ties if int(k.view(np.uint32)) % 2 == 0)


class MomentsStat:
    """mr::MomentsStat<T, SkipNan>: State (n, anchor, mean (the offset), m2), all doubles."""

    def __init__(self, dtype, skipnan):
        self.skipnan = skipnan and np.dtype(dtype).kind == "f"
        self.out = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)
        self.narrow = np.dtype(dtype) == np.float16  # MomentsStat::kNarrowRuns

    def start(self):
        return (0.0, 0.0, 0.0, 0.0)

    def single(self, w):
        a = w if finite(w) else 0.0
        return (1.0, a, w - a, w - w)

    def visit(self, s, v, i=0):
        w = float(v)
        if self.skipnan and is_nan(w):
            return s
        d = w - s[1]
        delta = d - s[2]
        if s[0] == 0.0 or not finite(delta):
            return self.merge(s, self.single(w))
        n = s[0] + 1.0
        mean = s[2] + delta / n
        return (n, s[1], mean, s[3] + delta * (d - mean))

    def visit_run(self, s, v, at):
        R = min(len(v), 16 if self.narrow else 8)  # stats.cuh MomentsStat::visit_run
        assert len(v) % R == 0
        for c in range(0, len(v), R):
            s = self.visit_narrow(s, v[c:c + R]) if self.narrow else self.visit_some(s, v[c:c + R])
        return s

    def visit_narrow(self, s, v):
        """MomentsStat::visit_narrow: a float16 run in float32 (NumPy float32 scalars round as the kernel's
        __fsub_rn/__fadd_rn/__fdiv_rn/__fmul_rn do; the square is fused: one rounding of e * e + q)."""
        f32 = np.float32
        R = len(v)
        w = [f32(k) for k in v]
        if s[0] == 0.0:
            for wk in reversed(w):
                s = (s[0], float(wk) if finite(float(wk)) else s[1], s[2], s[3])
        anchor = f32(s[1])
        d, total, nans = [], f32(0.0), []
        with np.errstate(all="ignore"):
            for wk in w:
                d.append(f32(wk - anchor))
                nan = self.skipnan and is_nan(float(wk))
                nans.append(nan)
                total = total if nan else f32(total + d[-1])
            if not finite(float(total)):
                return self.merge(s, self.wide_run([float(k) for k in v]))
            count = R - sum(nans)
            if self.skipnan and count == 0:
                return s
            mean = f32(total / f32(count)) if self.skipnan else f32(total * f32(1.0 / R))
            q = f32(0.0)
            for dk, nan in zip(d, nans):
                e = f32(dk - mean)
                q = q if nan else _fused_f32(e, e, q)
        return self.merge(s, (float(count), s[1], float(mean), float(q)))

    def visit_some(self, s, v):
        R = len(v)
        w = [float(k) for k in v]
        if s[0] == 0.0:
            for wk in reversed(w):
                s = (s[0], wk if finite(wk) else s[1], s[2], s[3])
        d, total, count = [], 0.0, 0.0
        for wk in w:
            d.append(wk - s[1])
            if self.skipnan:
                ok = not is_nan(d[-1])
                total += d[-1] if ok else 0.0
                count += 1.0 if ok else 0.0
            else:
                total += d[-1]
        if not finite(total):
            return self.merge(s, self.wide_run(w))
        if self.skipnan and count == 0.0:
            return s
        n = count if self.skipnan else float(R)
        mean = total / n if self.skipnan else total * (1.0 / R)
        q = 0.0
        for dk in d:
            e = dk - mean
            q += 0.0 if (self.skipnan and is_nan(e)) else e * e
        return self.merge(s, (n, s[1], mean, q))

    def wide_run(self, w):  # MomentsStat::wide_run
        count, finite_data = 0.0, True
        for wk in w:
            ok = not (self.skipnan and is_nan(wk))
            count += 1.0 if ok else 0.0
            finite_data = finite_data and (not ok or finite(wk))
        n = count if self.skipnan else float(len(w))
        mean = 0.0
        for wk in w:
            mean += 0.0 if (self.skipnan and is_nan(wk)) else wk / n
        return (n, 0.0, mean, INF if finite_data else NAN)

    def merge(self, a, b):
        if b[0] == 0.0:
            return a
        if a[0] == 0.0:
            return b
        n = a[0] + b[0]
        share = b[0] / n
        delta = (b[1] - a[1]) + (b[2] - a[2])
        if not finite(delta):
            return self.merge_wide(a, b, n, share)
        return (n, a[1], a[2] + delta * share, a[3] + b[3] + delta * delta * a[0] * share)

    def merge_wide(self, a, b, n, share):
        ma, mb = a[1] + a[2], b[1] + b[2]
        if not finite(ma) or not finite(mb):
            return (n, 0.0, ma + mb, NAN)
        delta = mb - ma
        if finite(delta):
            return (n, ma, delta * share, a[3] + b[3] + delta * delta * a[0] * share)
        return (n, ma * (a[0] / n) + mb * share, 0.0, INF)

    def result(self, s, ddof, mode):
        if mode == 2:
            r = NAN if s[0] == 0.0 else s[1] + s[2]
        else:
            dof = s[0] - ddof
            r = NAN if (self.skipnan and not dof > 0.0) else ieee_div(s[3], dof if dof > 0.0 else 0.0)
            if mode == 1:
                r = math.sqrt(r) if r == r and r >= 0 else NAN
        with np.errstate(over="ignore"):
            return self.out.type(r)


def make_stat(name, dtype):
    if name in cupy_stats._ARG:
        return ArgStat(dtype, name.endswith("max"), name.startswith("nan"))
    return MomentsStat(dtype, name.startswith("nan"))


# ---------------------------------------------------------------------------------------------------
# the kernels
# ---------------------------------------------------------------------------------------------------
def warp_merge(stat, lanes, valid):
    """mr::warp_merge: shfl_down by 16, 8, 4, 2, 1; lane l merges lane l + d where l + d < valid. Only
    the lanes that lane 0's result depends on are computed (at shift d: lanes below d)."""
    s = list(lanes)
    d = WARP // 2
    while d:
        s = [stat.merge(s[l], s[l + d]) if l + d < valid else s[l] for l in range(d)]
        d //= 2
    return s[0]


def stats_rows(stat, buf, offset, itemsize, length, row_stride, row_index_step, rows, splits):
    """mr::stats_rows<Stat, BLOCK, ROW_UNROLL>: one State per block (row * splits + split); ``buf`` the
    elements from a 256-byte aligned base, the array starting ``offset`` elements in."""
    P = 16 // itemsize
    U = ROW_UNROLL
    threads = splits * BLOCK
    out = []
    for b in range(rows * splits):
        row, split = divmod(b, splits)
        xr = offset + row * row_stride
        base = row * row_index_step
        address = xr * itemsize
        head = ((16 - address % 16) % 16) // itemsize
        if address % itemsize or head > length:
            head = length
        packs = (length - head) // P
        states = []
        for tid in range(BLOCK):
            thread = split * BLOCK + tid
            s = stat.start()
            for i in range(thread, head, threads):
                s = stat.visit(s, buf[xr + i], base + i)
            p = thread
            while p + (U - 1) * threads < packs:
                at = [head + (p + u * threads) * P + k for u in range(U) for k in range(P)]
                s = stat.visit_run(s, [buf[xr + j] for j in at], [base + j for j in at])
                p += U * threads
            while p < packs:
                at = [head + p * P + k for k in range(P)]
                s = stat.visit_run(s, [buf[xr + j] for j in at], [base + j for j in at])
                p += threads
            for i in range(head + packs * P + thread, length, threads):
                s = stat.visit(s, buf[xr + i], base + i)
            states.append(s)
        out.append(block_merge(stat, states))
    return out


def block_merge(stat, states):
    """mr::block_merge<Stat, BLOCK>: the BLOCK threads' States, warp by warp, then the warps'."""
    warps = [warp_merge(stat, states[w:w + WARP], WARP) for w in range(0, BLOCK, WARP)]
    lanes = [warps[t] if t < BLOCK // WARP else warps[0] for t in range(WARP)]
    return warp_merge(stat, lanes, BLOCK // WARP)


def stats_columns(stat, buf, offset, outer, outer_stride, length, inner, piece, splits):
    """mr::stats_columns<Stat, BLOCK, COLUMN_UNROLL>: out[t], t = split * columns + column."""
    columns = outer * inner
    out = []
    for t in range(columns * splits):
        column, split = t % columns, t // columns
        xc = offset + (column // inner) * outer_stride + column % inner
        s = stat.start()
        j = split * piece
        end = min(j + piece, length)
        while j + COLUMN_UNROLL <= end:
            at = list(range(j, j + COLUMN_UNROLL))
            s = stat.visit_run(s, [buf[xc + a * inner] for a in at], at)
            j += COLUMN_UNROLL
        while j < end:
            s = stat.visit(s, buf[xc + j * inner], j)
            j += 1
        out.append(s)
    return out


def stats_fold(stat, parts, outputs, splits, split_stride, output_stride, grid):
    """mr::stats_fold. A grid of at least ``outputs`` blocks: a block per output, thread t merging splits
    t, t + BLOCK, ... into start() in that order (the kernel's batches of four loads merge in the same
    order), then block_merge. Else one warp per output; lane l starts from split l (split 0 past
    ``splits``, never read) and strides by 32, then warp_merge over min(splits, 32) lanes."""
    states = []
    for o in range(outputs):
        p = o * output_stride
        if grid >= outputs:
            threads = []
            for t in range(BLOCK):
                s = stat.start()
                for k in range(t, splits, BLOCK):
                    s = stat.merge(s, parts[p + k * split_stride])
                threads.append(s)
            states.append(block_merge(stat, threads))
            continue
        lanes = []
        for lane in range(WARP):
            s = parts[p + (lane if lane < splits else 0) * split_stride]
            for k in range(lane + WARP, splits, WARP):
                s = stat.merge(s, parts[p + k * split_stride])
            lanes.append(s)
        states.append(warp_merge(stat, lanes, min(splits, WARP)))
    return states


def model_run(name, x, axes, sms, base=None, ddof=0.0):
    """cupy_stats.run with the kernels above: (States, results), outputs in C order of the kept axes.
    ``x`` is a view of the 1-D ``base`` (its 16-byte alignment is modelled from there) or None."""
    stat = make_stat(name, x.dtype)
    isz = x.itemsize
    if base is None or any(s % isz for s in x.strides):
        x = np.ascontiguousarray(x)
        base = x.reshape(-1)
    offset = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // isz if x.size else 0
    strides = tuple(s // isz for s in x.strides)
    axes = tuple(axes)
    layout = cupy_stats.plan_layout(tuple(x.shape), strides, axes)
    if layout.copy == "moveaxis":
        rest = [d for d in range(x.ndim) if d not in axes]
        x = np.ascontiguousarray(np.moveaxis(x, sorted(axes), list(range(len(rest), x.ndim))))
        base, offset = x.reshape(-1), 0
    elif layout.copy == "contiguous":
        x = np.ascontiguousarray(x)
        base, offset = x.reshape(-1), 0
    buf = base.tolist()
    if layout.kind == "rows":
        splits = cupy_stats.row_splits(layout, isz, sms)
        parts = stats_rows(stat, buf, offset, isz, layout.length, layout.stride, layout.index_step, layout.rows,
                           splits)
        fold = (layout.rows * splits, 1, 0) if layout.whole else (splits, 1, splits)
    else:
        piece, splits = cupy_stats.column_pieces(layout, sms)
        parts = stats_columns(stat, buf, offset, layout.rows, layout.stride, layout.length, layout.inner, piece,
                              splits)
        fold = (splits, layout.rows * layout.inner, 1)
    states = stats_fold(stat, parts, layout.outputs, *fold, cupy_stats.fold_grid(layout.outputs, fold[0], sms))
    mode = cupy_stats._MOMENTS.get(name, 0)
    return states, [stat.result(s, ddof, mode) for s in states]


def gpu_result(name, x, axis=None, sms=2, base=None, ddof=0.0):
    """What the fold writes for CuPy input, shaped as NumPy's result (keepdims=False)."""
    axes = tuple(range(x.ndim)) if axis is None else (axis,)
    _, results = model_run(name, x, axes, sms, base, ddof)
    shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    return np.array(results).reshape(shape)


# ---------------------------------------------------------------------------------------------------
# argmin / argmax
# ---------------------------------------------------------------------------------------------------
ARG = {"argmax": np.argmax, "argmin": np.argmin, "nanargmax": np.nanargmax, "nanargmin": np.nanargmin}


def numpy_arg(name, x, axis=None):
    """NumPy's answer; -1 where nanarg* raises (an all-NaN slice), as the kernel's result says."""
    try:
        return ARG[name](x, axis=axis)
    except ValueError:
        if axis is None:
            return np.int64(-1)
        hollow = np.isnan(x).all(axis=axis)
        got = ARG[name](np.where(np.isnan(x).all(axis=axis, keepdims=True), 0, x), axis=axis)
        return np.where(hollow, -1, got)


def boundaries(n, itemsize, splits=1):
    """Element positions where a thread, an unrolled pass, a block or the grid-stride wraps."""
    P = 16 // itemsize
    threads = splits * BLOCK
    marks = {0, 1, P - 1, P, ROW_UNROLL * P - 1, ROW_UNROLL * P, BLOCK * P - 1, BLOCK * P,
             threads * P - 1, threads * P, threads * P * ROW_UNROLL - 1, threads * P * ROW_UNROLL, n // 2, n - 2,
             n - 1}
    return sorted(m for m in marks if 0 <= m < n)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_arg_ties_and_nans_at_every_boundary(dtype):
    """Ties and NaNs at thread, pack, unroll, block and grid-stride boundaries: the lower index wins
    though a later-visited thread or block holds it; the first NaN wins argmax; nanargmax reads NaN
    as -inf."""
    isz = np.dtype(dtype).itemsize
    n = 2 * BLOCK * (16 // isz) * ROW_UNROLL + 37  # two unrolled passes of one block, a tail
    rng = np.random.default_rng(isz)
    marks = boundaries(n, isz)
    for sms in (1, 64):  # one block grid-striding the row, or several blocks per row
        for a, b in zip(marks, marks[1:]):
            x = rng.integers(-3, 3, n).astype(dtype)
            x[a] = x[b] = 7  # a tie: the lower index wins
            x[(a + b) // 2 + 1 if (a + b) // 2 + 1 < n else 0] = -7
            for name in ARG:
                assert gpu_result(name, x, sms=sms) == ARG[name](x), (name, a, b, sms)
            x[b] = np.nan  # the first NaN wins argmax/argmin; nanarg* skip it
            if b + 1 < n:
                x[b + 1] = np.nan
            for name in ARG:
                assert gpu_result(name, x, sms=sms) == ARG[name](x), (name, a, b, sms, "nan")


def test_nanarg_reads_nan_as_the_worst_number():
    """np.nanargmax([nan, -inf]) == 0: a NaN ties with -inf and the first wins, wherever the two sit."""
    n = 2 * BLOCK * 2 * ROW_UNROLL + 5  # float64: P = 2
    for first, second in [(0, 1), (0, n - 1), (BLOCK * 2, 7), (n - 1, 0), (2047, 2048), (2048, 2047)]:
        for largest, worst in ((True, -np.inf), (False, np.inf)):
            name = "nanargmax" if largest else "nanargmin"
            x = np.full(n, np.nan)
            x[second] = worst  # all NaN but one infinity: the first element wins (NaN or not)
            x[first] = np.nan
            for sms in (1, 64):
                assert gpu_result(name, x, sms=sms) == ARG[name](x) == 0, (name, first, second)
            x = np.full(n, worst)  # all infinities but NaNs: still the first element
            x[first] = x[second] = np.nan
            assert gpu_result(name, x, sms=64) == ARG[name](x) == 0
            x = np.full(n, np.nan)  # NaN until a finite number
            x[second] = 3.0
            assert gpu_result(name, x, sms=64) == ARG[name](x) == second
    assert gpu_result("nanargmax", np.full(n, np.nan), sms=64) == -1  # the host raises "All-NaN slice"
    assert gpu_result("nanargmin", np.array([np.nan]), sms=1) == -1
    for name in ARG:  # one element
        assert gpu_result(name, np.array([np.nan]), sms=1) == (-1 if name.startswith("nan") else 0)
        assert gpu_result(name, np.array([-np.inf]), sms=1) == 0


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64, np.uint64, np.bool_], ids=lambda d: np.dtype(d).name)
def test_arg_integers_first_occurrence(dtype):
    info = np.iinfo(dtype) if np.dtype(dtype).kind != "b" else None
    n = BLOCK * (16 // np.dtype(dtype).itemsize) + 3
    rng = np.random.default_rng(2)
    x = rng.integers(0, 2, n).astype(dtype)
    if info is not None:
        x[n // 3] = x[n - 1] = info.max  # extremes the float keys of other types could not tell apart
        x[5] = x[n // 2] = info.min
        if info.bits == 64:
            x[7] = info.max - 1
    for name in ARG:
        for sms in (1, 8):
            assert gpu_result(name, x, sms=sms) == ARG[name](x), (name, sms)


@pytest.mark.parametrize("shape,view,axis", [((3, 2200), "cols", 1), ((3, 2200), "cols", None),
                                             ((65, 129), None, 0), ((65, 129), None, 1), ((5, 7, 31), None, 1),
                                             ((65, 129), None, None)])
def test_arg_axes_and_strided_rows(shape, view, axis):
    """Strided, misaligned rows (stats_rows in place), columns (stats_columns) and the contiguous copy,
    with NaN, ties and all-NaN slices."""
    rng = np.random.default_rng(len(shape))
    base = rng.integers(-2, 3, math.prod(shape)).astype(np.float32)
    x = base.reshape(shape)
    if view == "cols":
        x = x[:, 5:2190]  # rows of 2185 elements, 2200 apart: each row starts at a different alignment
    x[..., 0] = np.nan if x.ndim == 2 else x[..., 0]
    flat = x.reshape(-1) if x.flags.c_contiguous else None
    if flat is not None:
        flat[rng.random(flat.size) < 0.02] = np.nan
    else:
        x[1, 100] = x[2, 2000] = np.nan
    if axis is not None:
        np.moveaxis(x, axis, -1)[(1,) * (x.ndim - 1)] = np.nan  # one all-NaN slice
    for name in ARG:
        got = gpu_result(name, x, axis, sms=4, base=base)
        np.testing.assert_array_equal(got, numpy_arg(name, x, axis), err_msg=f"{name} axis={axis}")


def test_arg_partials_to_the_host_format():
    """cupy_stats.arg_partial: the nan-forms' partial holds the rank (NaN read as -inf/+inf), ``seen``
    False only for an all-NaN slice, global indices; the plain forms keep NaN and seen True."""
    x = np.array([[np.nan, np.nan, np.nan], [np.nan, -np.inf, 2.0], [1.0, np.nan, 1.0]])
    sdt = cupy_stats.state_dtype("nanargmax", x.dtype)
    for name in ARG:
        states, _ = model_run(name, x, (1,), sms=1)
        st = np.array(states, dtype=sdt).reshape(3, 1)
        value, index, seen = cupy_stats.arg_partial(st, x.dtype, x.shape, (1,), name.endswith("max"),
                                                    name.startswith("nan"), (10, 20), (13, 23))
        if name == "nanargmax":
            np.testing.assert_array_equal(value.ravel(), [-np.inf, 2.0, 1.0])
            np.testing.assert_array_equal(index.ravel(), [20, 22, 20])
            np.testing.assert_array_equal(seen.ravel(), [False, True, True])
        elif name == "nanargmin":
            np.testing.assert_array_equal(value.ravel(), [np.inf, -np.inf, 1.0])
            np.testing.assert_array_equal(index.ravel(), [20, 21, 20])
        else:
            assert np.isnan(value.ravel()).tolist() == [True, True, True] and seen.all()
            np.testing.assert_array_equal(index.ravel(), [20, 20, 21])
    states, _ = model_run("nanargmin", x, (0, 1), sms=1)
    _, index, seen = cupy_stats.arg_partial(np.array(states, dtype=sdt).reshape(1, 1), x.dtype, x.shape, (0, 1),
                                            False, True, (2, 3), (5, 6))
    assert int(index[0, 0]) == np.ravel_multi_index((3, 4), (5, 6)) and seen.all()  # x[1, 1], -inf


def _host_takes_seen():
    part = numpy_stats.arg_chunk(np.array([np.nan]), (0,), True, True, (0,), (1,))
    return len(part) == 3


@pytest.mark.skipif(not _host_takes_seen(), reason="needs numpy_stats' (value, index, seen) partials (wt-stats)")
@pytest.mark.parametrize("name", list(ARG))
def test_gpu_chunk_partials_merge_on_the_host_as_numpy(name):
    """Chunks through the modelled kernel, partials merged by numpy_stats.arg_merge in every order: the
    whole array's NumPy answer (an all-NaN chunk's NaN before a later -inf wins nanargmax)."""
    x = np.array([np.nan, np.nan, -np.inf, np.nan, 5.0, 5.0, np.nan, -np.inf, np.inf, np.inf, 1.0])
    largest, skipnan = name.endswith("max"), name.startswith("nan")
    sdt = cupy_stats.state_dtype(name, x.dtype)
    for cuts in ([2], [1, 2, 5], [3, 7, 9], [4, 5, 6, 8]):
        for y in (x, x[::-1].copy(), np.where(np.isinf(x), np.nan, x)):
            parts = []
            for lo, hi in zip([0] + cuts, cuts + [len(y)]):
                states, _ = model_run(name, y[lo:hi], (0,), sms=1)
                parts.append(cupy_stats.arg_partial(np.array(states, dtype=sdt).reshape(1), y.dtype, (hi - lo,),
                                                    (0,), largest, skipnan, (lo,), y.shape))
            for order in (parts, parts[::-1]):
                acc = order[0]
                for p in order[1:]:
                    acc = numpy_stats.arg_merge(acc, p, largest)
                want = numpy_arg(name, y)
                got = -1 if not acc[2].all() else int(acc[1][0])
                assert got == want, (name, cuts, y.tolist())


# ---------------------------------------------------------------------------------------------------
# moments: var, std, nanvar, nanstd, nanmean
# ---------------------------------------------------------------------------------------------------
MOMENTS = {"var": np.var, "std": np.std, "nanvar": np.nanvar, "nanstd": np.nanstd, "nanmean": np.nanmean}


def numpy_moment(name, x, axis=None, ddof=0.0):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if name == "nanmean":
            return MOMENTS[name](x, axis=axis)
        return MOMENTS[name](x, axis=axis, ddof=ddof)


def assert_same(got, ref, rtol, what):
    """Special values exactly (inf with its sign, NaN), finite values within rtol."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    special = ~np.isfinite(ref)
    np.testing.assert_array_equal(got[special], ref[special], err_msg=what)
    np.testing.assert_allclose(got[~special], ref[~special], rtol=rtol, atol=0, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
def test_moments_with_inf_and_nan_at_boundaries(dtype):
    """inf, -inf and NaN at thread, unroll, block and grid-stride boundaries: the mean is their sum
    (inf, or NaN for inf - inf), var NaN; nanvar skips NaN. Chan's delta would read inf - inf."""
    isz = np.dtype(dtype).itemsize
    n = 2 * BLOCK * (16 // isz) * ROW_UNROLL + 13
    rng = np.random.default_rng(isz + 1)
    marks = boundaries(n, isz)
    cases = []
    for m in marks[::2]:
        cases += [{m: np.inf}, {m: -np.inf}, {m: np.nan}, {m: np.inf, n - 1 - m: -np.inf}, {m: np.inf, 0: np.nan}]
    rtol = 1e-12 if isz == 8 else 1e-5
    for k, case in enumerate(cases):
        x = rng.normal(3, 1, n).astype(dtype)
        for at, value in case.items():
            x[at] = value
        sms = (1, 64)[k % 2]
        for name in MOMENTS:
            assert_same(gpu_result(name, x, sms=sms), numpy_moment(name, x), rtol, f"{name} {case}")
    x = np.full(n, np.inf, dtype=dtype)  # every element inf: mean inf
    assert_same(gpu_result("nanmean", x, sms=64), np.inf, 0, "all inf")
    assert np.isnan(gpu_result("var", x, sms=64))


def test_moments_small_hostile_cases():
    """NumPy's answers on short data: [inf, 1], [inf, -inf], [1e308, -1e308] (mean 0, var inf), squares
    past DBL_MAX (var inf, mean finite), one element, NaN only."""
    cases = [[np.inf, 1.0], [1.0, np.inf], [np.inf, -np.inf], [-np.inf, -np.inf, 2.0], [np.nan, np.inf],
             [1e308, -1e308], [-1e308, 1e308, 0.0], [1e200, -1e200, 3e200],
             [3.5], [np.inf], [np.nan], [np.nan, np.nan, 1.0], [0.0, 0.0]]
    for case in cases:
        for lead in (0, 1, 5):  # misaligned starts: the scalar head, then a pack
            base = np.concatenate([np.ones(lead), case])
            x = base[lead:]
            for name in MOMENTS:
                assert_same(gpu_result(name, x, sms=1, base=base), numpy_moment(name, x), 1e-14, f"{name} {case}")
    # where NumPy's own sum overflows (mean of 3 x 1.7e308: inf, var inf), the anchored mean does not:
    # the exact answers, a deliberate difference
    x = np.full(3, 1.7e308)
    assert gpu_result("nanmean", x) == 1.7e308 and gpu_result("var", x) == 0.0


def test_moments_overflowing_differences_give_inf_not_nan():
    """Finite data whose spread passes DBL_MAX (+-1.5e308): var and std inf (the true values overflow),
    the mean finite and right. NumPy's own sums overflow here (it may give NaN), so the reference is
    exact: the mean in fractions."""
    rng = np.random.default_rng(7)
    for n in (2, 31, 1025, 5000):
        x = np.where(rng.random(n) < 0.5, 1.5e308, -1.5e308) * rng.uniform(0.9, 1.0, n)
        x[0] = -1.6e308  # the anchor far from half the data
        mean = float(sum(map(Fraction, x.tolist())) / n)
        for sms in (1, 64):
            assert gpu_result("var", x, sms=sms) == np.inf
            assert gpu_result("nanstd", x, sms=sms) == np.inf
            got = float(gpu_result("nanmean", x, sms=sms))
            assert abs(got - mean) <= 1e-12 * 1.6e308, (n, got, mean)


def test_ddof_rules():
    """np.var: M2 / max(n - ddof, 0), so inf where M2 > 0 and NaN where M2 = 0; np.nanvar: NaN wherever
    the count of numbers minus ddof is <= 0."""
    for x in ([1.0, 2.0, 4.0], [2.0, 2.0, 2.0], [3.5], [1.0, np.nan, 3.0], [np.nan, 5.0, np.nan], [np.nan] * 3):
        x = np.array(x)
        for ddof in (0, 0.5, 1, 2, 2.5, 3, 4, -1):
            for name in ("var", "std", "nanvar", "nanstd"):
                assert_same(gpu_result(name, x, sms=1, ddof=ddof), numpy_moment(name, x, ddof=ddof), 1e-14,
                            f"{name} {x.tolist()} ddof={ddof}")
    ints = np.array([1, 2, 3], dtype=np.int32)  # np.nanvar of integers is np.var: inf at ddof >= n
    for name in ("nanvar", "var"):
        for ddof in (3, 4):
            assert gpu_result(name, ints, sms=1, ddof=ddof) == numpy_moment(name, ints, ddof=ddof) == np.inf


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int32, np.uint8],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 31, 33, 1023, 1025, 4099])
def test_moments_awkward_sizes_against_numpy(dtype, n):
    rng = np.random.default_rng(n)
    x = (rng.normal(50, 3, n) if np.dtype(dtype).kind == "f" else rng.integers(0, 200, n)).astype(dtype)
    if np.dtype(dtype).kind == "f" and n > 2:
        x[rng.random(n) < 0.1] = np.nan
    rtol = {8: 1e-11, 4: 1e-4, 2: 5e-3, 1: 1e-11}[np.dtype(dtype).itemsize]
    for name in MOMENTS:
        ref = numpy_moment(name, x.astype(np.float64) if np.dtype(dtype).kind == "f" else x, ddof=0)
        got = gpu_result(name, x, sms=(1, 64)[n % 2])
        assert got.dtype == (np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.float64), name
        assert_same(got, np.asarray(ref).astype(got.dtype), rtol, f"{name} n={n}")


@pytest.mark.parametrize("shape,axis", [((65, 129), 0), ((65, 129), 1), ((3, 2100), 1), ((4, 6, 33), 1)])
def test_moments_axes_with_inf_slices(shape, axis):
    """Rows and columns kernels with one slice holding inf, one -inf and inf, one NaN, one all-NaN."""
    x = hostile_slices(shape, axis)
    for name in MOMENTS:
        assert_same(gpu_result(name, x, axis, sms=8), numpy_moment(name, x, axis), 1e-11, f"{name} axis={axis}")


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_one_launch_grid_is_the_rows_kernels(itemsize):
    """WholeLauncher's stats_whole takes the grid stats_rows takes for the same array (row_splits of its
    layout), so its last block merges the States stats_fold would, in the same order: the same bits."""
    for sms in (1, 8, 132):
        for n in (1, 31, 1025, 4096 * 33, (1 << 24) + 7, (1 << 31) + 5):
            layout = cupy_stats.plan_layout((n,), (1,), (0,))
            assert layout.whole and layout.rows == 1
            assert cupy_stats.whole_splits(n, itemsize, sms * cupy_stats.BLOCKS_PER_SM) == \
                cupy_stats.row_splits(layout, itemsize, sms), (n, sms)
