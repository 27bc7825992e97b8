"""Statistics on one chunk, and the merges of their partials, for the CPU (and, through ``xp``, CuPy).

The chunk functions are written against the array API that NumPy and CuPy share, so the CuPy backend
(``cupy_stats``) calls the same code with ``xp=cupy`` and only adds the device-to-host copy of the
partial. Every partial is a tuple of arrays that keep the reduced axes (size 1), so partials of one
output block merge elementwise whatever the chunking. Merges run on the host (NumPy): partials are
small, and host partials cross workers without a GPU on the receiving side.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .numpy_backend import PIECE, flat_view


def _size(block, axes) -> int:
    return math.prod(block.shape[a] for a in axes)


def _kept_shape(block, axes) -> tuple:
    return tuple(1 if d in axes else s for d, s in enumerate(block.shape))


# ---------------------------------------------------------------------------------------------
# argmin / argmax: partial (value, index, seen); index is global, -1 where the chunk had no candidate
# ---------------------------------------------------------------------------------------------
def arg_chunk(block, axes, largest: bool, skipnan: bool, offsets, shape, xp=np):
    """The chunk's best (value, global index, seen) per output element; ``offsets`` is the chunk's start
    in the whole array of ``shape``. One axis: the index along it; every axis: the flat C index.

    ``skipnan`` (nanargmax/nanargmin) is NumPy's rule: NaN reads as -inf (nanargmax) or +inf
    (nanargmin), so a NaN still wins a tie with an infinity that comes after it
    (``np.nanargmax([nan, -inf]) == 0``), also across chunks; ``seen`` says whether the slice held a
    non-NaN element, and a slice that never did raises at the end. Without ``skipnan`` the first NaN
    wins and ``seen`` is all True."""
    kept = _kept_shape(block, axes)
    if _size(block, axes) == 0:
        return (xp.zeros(kept, dtype=block.dtype), xp.full(kept, -1, dtype=np.int64),
                xp.zeros(kept, dtype=bool))
    if skipnan and block.dtype.kind == "f":
        nan = xp.isnan(block)
        seen = ~nan.all(axis=axes, keepdims=True)
        block = xp.where(nan, xp.asarray(-np.inf if largest else np.inf, dtype=block.dtype), block)
    else:
        seen = xp.ones(kept, dtype=bool)
    pick = xp.argmax if largest else xp.argmin
    if len(axes) == block.ndim:  # axis=None: flat positions
        flat = block.reshape(-1)
        local = int(pick(flat))
        value = flat[local].reshape(kept)
        where = np.unravel_index(local, block.shape) if block.ndim else ()
        index = int(np.ravel_multi_index(tuple(w + o for w, o in zip(where, offsets)), shape)) if block.ndim else 0
        return value, xp.full(kept, index, dtype=np.int64), seen
    (axis,) = axes
    local = xp.expand_dims(pick(block, axis=axis), axis)
    value = xp.take_along_axis(block, local, axis=axis)
    return value, local.astype(np.int64) + offsets[axis], seen


def arg_merge(left, right, largest: bool):
    """The better of two (value, index, seen) partials elementwise: a candidate beats none; a NaN beats
    a number (NumPy: the first NaN wins; nanarg* partials hold no NaN); a larger (smaller) value wins;
    equal values: the lower index. Order-free, so partials may merge in any grouping. A (value, index)
    pair (a GPU chunk) counts as seen where it has a candidate."""
    va, ia, sa = left if len(left) == 3 else (*left, left[1] >= 0)
    vb, ib, sb = right if len(right) == 3 else (*right, right[1] >= 0)
    if va.dtype.kind == "f":
        an, bn = np.isnan(va), np.isnan(vb)
    else:
        an = bn = np.zeros(va.shape, dtype=bool)
    beats = (vb > va) if largest else (vb < va)
    tie = (vb == va) | (an & bn)
    both = (ia >= 0) & (ib >= 0)
    take = ((ia < 0) & (ib >= 0)) | (both & ((bn & ~an) | (~an & ~bn & beats) | (tie & (ib < ia))))
    return np.where(take, vb, va), np.where(take, ib, ia), sa | sb


# ---------------------------------------------------------------------------------------------
# moments: partial (count, anchor, offset, M2) in float64, merged with Chan's formula
# ---------------------------------------------------------------------------------------------
# The mean is kept as anchor + offset: the anchor is a float64 number (the chunk's rounded mean, exact
# as a number), the offset the mean of the (exact, by Sterbenz) differences from it. Two partials'
# means then differ by (anchor_b - anchor_a) + (offset_b - offset_a), computed from small, exact
# pieces: with 1e8 + N(0, 1) data a plain float64 mean would lose 1e-8 of every delta, and with
# one-element chunks that error reaches var itself (seen: 5e-10 relative).
def moments_chunk(block, axes, skipnan: bool, xp=np):
    """(count, anchor, offset, M2) of the chunk over ``axes``, float64, corrected two-pass over the
    chunk (on the GPU), or, for a NumPy chunk reduced over every axis, over each piece of PIECE elements
    (in cache) with the pieces merged as chunks are. ``skipnan``: NaNs do not count."""
    if xp is np and block.dtype.kind in "biuf" and len(axes) == block.ndim and block.size > PIECE:
        flat = flat_view(block)
        pieces = None if flat is None else _moments_pieces(flat, skipnan and block.dtype.kind == "f")
        if pieces is not None:
            kept = (1,) * block.ndim
            return tuple(p.reshape(kept) for p in _merge_all(pieces, moments_merge))
    complex_ = block.dtype.kind == "c"  # complex: the mean is complex, M2 sums |x - mean|^2 (NumPy's var)
    x = block.astype(np.complex128 if complex_ else np.float64)
    kept = _kept_shape(block, axes)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if skipnan and block.dtype.kind in "fc":
            valid = ~xp.isnan(x)
            count = valid.sum(axis=axes, keepdims=True).astype(np.float64)
            x = xp.where(valid, x, 0.0)
        else:
            valid = None
            count = xp.full(kept, float(_size(block, axes)), dtype=np.float64)
        per = xp.maximum(count, 1.0)
        anchor = x.sum(axis=axes, keepdims=True) / per
        rare = xp is not np or not bool(np.isfinite(anchor).all())  # no sync per chunk on the GPU
        if rare:  # finite data whose sum overflows still has a finite mean (|mean| <= max |x|)
            anchor = xp.where(xp.isfinite(anchor), anchor, (x / per).sum(axis=axes, keepdims=True))
        anchor = xp.where(xp.isfinite(anchor), anchor, 0.0)  # inf/NaN data: the offset carries them
        dev = x - anchor
        if valid is not None:
            dev = xp.where(valid, dev, 0.0)
        total = dev.sum(axis=axes, keepdims=True)
        offset = total / per
        squares = _square(dev, xp).sum(axis=axes, keepdims=True)
        m2 = squares - _times_conj(offset, total, xp)
        if rare or not bool(np.isfinite(m2).all()):
            # squares past DBL_MAX around a finite mean: M2 is inf, as NumPy's var is (inf - inf here)
            m2 = xp.where(xp.isinf(squares) & xp.isfinite(offset), np.inf, m2)
            # finite data spread past DBL_MAX: the differences overflow, and so does the variance
            data_finite = xp.isfinite(x if valid is None else xp.where(valid, x, 0.0)).all(axis=axes, keepdims=True)
            wide = xp.isfinite(anchor) & ~xp.isfinite(offset) & data_finite
            offset = xp.where(wide, 0.0, offset)
            m2 = xp.where(wide, np.inf, m2)
        m2 = xp.maximum(m2, 0.0)  # the correction may round below zero; NaN stays NaN
    return count, anchor, offset, m2


def _moments_pieces(flat, skipnan: bool):
    """(count, anchor, offset, M2) arrays of 1-D real NumPy ``flat``, one entry per piece of PIECE
    elements: the corrected two-pass of ``moments_chunk`` on each piece, converted to float64 in a buffer
    that stays in cache, so the data is read from memory once and no full-size temporary is made. None as
    soon as a piece's sum of squares is not finite (inf or NaN data, overflow): ``moments_chunk``'s general
    path owns those rules."""
    size = min(flat.size, PIECE)
    k = -(-flat.size // PIECE)
    count, anchor, total, squares = (np.empty(k) for _ in range(4))
    buf = np.empty(size)
    nan = np.empty(size, bool) if skipnan else None
    add = np.add.reduce
    with np.errstate(over="ignore", invalid="ignore"):
        for i, start in enumerate(range(0, flat.size, PIECE)):
            piece = flat[start : start + PIECE]
            m = piece.size
            b = buf if m == size else buf[:m]
            np.copyto(b, piece)
            holes = 0
            if nan is not None:
                mask = nan if m == size else nan[:m]
                np.isnan(b, out=mask)
                holes = int(np.count_nonzero(mask))
                if holes:
                    np.copyto(b, 0.0, where=mask)
            valid = m - holes
            a = add(b) / max(valid, 1)
            np.subtract(b, a, out=b)
            if holes:
                np.copyto(b, 0.0, where=mask)
            t = add(b)
            np.multiply(b, b, out=b)
            q = add(b)
            if not math.isfinite(q):
                return None
            count[i], anchor[i], total[i], squares[i] = valid, a, t, q
    offset = total / np.maximum(count, 1.0)
    return count, anchor, offset, np.maximum(squares - offset * total, 0.0)


def _merge_all(parts, merge):
    """One partial from partials stacked along axis 0 (a tuple of arrays): a balanced pairwise tree,
    neighbours (0, 1), (2, 3), ... merged a level at a time, each level one vectorised ``merge``, as
    ``StatPlan.combine`` merges chunks' partials."""
    while parts[0].shape[0] > 1:
        k = parts[0].shape[0]
        even = k - k % 2
        merged = merge(tuple(p[0:even:2] for p in parts), tuple(p[1:even:2] for p in parts))
        if k % 2:
            merged = tuple(np.concatenate([m, p[-1:]]) for m, p in zip(merged, parts))
        parts = merged
    return parts


def _square(d, xp):
    """|d|^2, real: d * d for real data (no conj copy), re^2 + im^2 for complex."""
    return d.real * d.real + d.imag * d.imag if d.dtype.kind == "c" else d * d


def _times_conj(a, b, xp):
    return (a * xp.conj(b)).real if a.dtype.kind == "c" else a * b


def moments_merge(left, right):
    """Chan, Golub and LeVeque's pairwise update: the correction term uses the difference of the two
    means (from the anchors), never a difference of large sums of squares.

    A partial whose mean is inf or NaN (data with inf or NaN: its anchor is 0, its offset the mean)
    merges as NumPy's sum would: the means add (inf + 1 = inf, inf - inf = NaN) and M2 is NaN, as
    NumPy's var of data holding inf or NaN is (x - inf). Chan's update would give inf - inf = NaN for
    a mean of [inf, 1]. An empty partial changes nothing (its mean means nothing)."""
    na, aa, oa, qa = left
    nb, ab, ob, qb = right
    n = na + nb
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        share = np.where(n > 0, nb / np.where(n > 0, n, 1.0), 0.0)
        delta = (ab - aa) + (ob - oa)
        offset = oa + delta * share
        m2 = qa + qb + _square(delta, np) * na * share
        anchor = aa
        ma, mb = aa + oa, ab + ob
        finite = np.isfinite(ma) & np.isfinite(mb)
        wide = finite & ~np.isfinite(delta)  # finite means whose difference overflows in pieces
        if wide.any():
            plain = mb - ma
            close = np.isfinite(plain)  # else the means are more than DBL_MAX apart: M2 is inf
            anchor = np.where(wide, np.where(close, ma, ma * (na / np.where(n > 0, n, 1.0)) + mb * share), anchor)
            offset = np.where(wide, np.where(close, plain * share, 0.0), offset)
            m2 = np.where(wide, np.where(close, qa + qb + _square(plain, np) * na * share, np.inf), m2)
        if not finite.all():
            anchor = np.where(finite, anchor, 0.0)
            offset = np.where(finite, offset, ma + mb)
            m2 = np.where(finite, m2, np.nan)
    left_empty, right_empty = na == 0, nb == 0
    anchor = np.where(left_empty, ab, np.where(right_empty, aa, anchor))
    offset = np.where(left_empty, ob, np.where(right_empty, oa, offset))
    m2 = np.where(left_empty, qb, np.where(right_empty, qa, m2))
    return n, anchor, offset, m2


def moments_mean(partial):
    count, anchor, offset, _ = partial
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, anchor + offset, np.nan)


# ---------------------------------------------------------------------------------------------
# folds: nanmin/nanmax, any/all, count_nonzero
# ---------------------------------------------------------------------------------------------
def extreme_chunk(block, axes, largest: bool, xp=np):
    """(NaN-skipping extreme, count) over ``axes``; an all-NaN or empty slice gives NaN (floats)."""
    kept = _kept_shape(block, axes)
    count = xp.full(kept, _size(block, axes), dtype=np.int64)
    if _size(block, axes) == 0:
        fill = np.nan if block.dtype.kind == "f" else 0
        return xp.full(kept, fill, dtype=block.dtype), count
    if block.dtype.kind == "f":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: the final stage warns once
            fn = xp.nanmax if largest else xp.nanmin
            return fn(block, axis=axes, keepdims=True), count
    fn = xp.max if largest else xp.min
    return fn(block, axis=axes, keepdims=True), count


def extreme_merge(left, right, largest: bool, lead: int = 0):
    """The (value, count) partial of ``left`` and ``right`` merged: a partial whose counts are all zero (an
    empty chunk's placeholder: ints have no NaN to mark it) gives way to the other whole. ``lead``: the
    leading axes index several partials stacked (``StatPlan``'s stacked merges), each merged with its own."""
    (va, na), (vb, nb) = left, right

    def empty(counts):
        rows, ones = counts.shape[:lead], (1,) * (counts.ndim - lead)
        if math.prod(counts.shape[lead:]) == 0:
            return np.zeros(rows + ones, dtype=bool)
        return ~counts.reshape(rows + (-1,)).any(axis=-1).reshape(rows + ones)

    value = np.where(empty(na), vb, np.where(empty(nb), va, extreme_of(va, vb, largest)))
    return value, na + nb


def extreme_of(a, b, largest: bool):
    """The larger (smaller) of ``a`` and ``b`` elementwise, NaN skipped as ``np.fmax``/``np.fmin`` skip it,
    and a tie of -0.0 and +0.0 giving +0.0 (-0.0) whichever side it is on: NumPy's ``fmin``/``fmax`` pick
    a zero's sign by where the element falls in their vector loops (the same pair gave -0.0 alone and
    +0.0 inside a longer array), so merges of the same partials grouped otherwise would differ."""
    if a.dtype.kind != "f":
        return np.maximum(a, b) if largest else np.minimum(a, b)
    with np.errstate(invalid="ignore"):
        if largest:
            keep = np.isnan(b) | (a > b) | ((a == b) & ~np.signbit(a))
        else:
            keep = np.isnan(b) | (a < b) | ((a == b) & np.signbit(a))
    return np.where(keep, a, b)


def stack_partials(partials):
    """``partials`` (tuples of NumPy arrays of one form: length, and each member's dtype and shape) as one
    tuple of arrays stacked along a new leading axis; None where they differ in form or hold anything else."""
    first = partials[0] if partials else None
    if type(first) is not tuple or not all(type(a) is np.ndarray for a in first):
        return None
    form = [(a.dtype, a.shape) for a in first]
    if not all(type(p) is tuple and len(p) == len(form) and all(
            type(a) is np.ndarray and (a.dtype, a.shape) == f for a, f in zip(p, form)) for p in partials):
        return None
    return tuple(np.stack(members) for members in zip(*partials))


def _nonzero_pieces(block, axes, xp):
    """The 1-D view of ``block`` for the piecewise any/all/count_nonzero (every axis, NumPy, larger than a
    piece), else None."""
    if xp is not np or len(axes) != block.ndim or block.size <= PIECE or block.dtype.kind not in "biufc":
        return None
    return flat_view(block)


def _nonzero_masks(flat):
    """``flat != 0`` piece by piece into one bool buffer that stays in cache (NumPy's any/all/count_nonzero
    of numbers make no SIMD pass over them; comparing and then reading bools does)."""
    buf = np.empty(min(flat.size, PIECE), bool)
    for start in range(0, flat.size, PIECE):
        piece = flat[start : start + PIECE]
        mask = buf if piece.size == buf.size else buf[: piece.size]
        np.not_equal(piece, 0, out=mask)
        yield mask


def truth_chunk(block, axes, every: bool, xp=np):
    flat = _nonzero_pieces(block, axes, xp)
    if flat is not None:
        # stops at the first piece that decides it
        found = every
        for mask in _nonzero_masks(flat):
            if (not mask.all()) if every else mask.any():
                found = not every
                break
        return (np.full((1,) * block.ndim, found),)
    fn = xp.all if every else xp.any
    return (fn(block, axis=axes, keepdims=True),)


def truth_merge(left, right, every: bool):
    return (np.logical_and(left[0], right[0]) if every else np.logical_or(left[0], right[0]),)


def count_chunk(block, axes, xp=np):
    kept = _kept_shape(block, axes)
    flat = _nonzero_pieces(block, axes, xp)
    if flat is not None:
        return (np.full(kept, sum(int(np.count_nonzero(m)) for m in _nonzero_masks(flat)), np.int64),)
    if block.ndim == 0:
        return (xp.asarray(block != 0, dtype=np.int64).reshape(kept),)
    return (xp.count_nonzero(block, axis=axes).astype(np.int64).reshape(kept),)


def count_merge(left, right):
    return (left[0] + right[0],)


def to_host(partial):
    return partial


# ---------------------------------------------------------------------------------------------
# segments: reductions and scans that restart at given start offsets (1-D)
# ---------------------------------------------------------------------------------------------
def segmented_scan(values, heads, op, xp=np):
    """Inclusive scan of ``values`` restarting wherever ``heads`` (bool) is set: Hillis-Steele
    doubling, so ``op`` is called log2(longest segment) times on whole arrays, earlier elements on the
    left (order kept for non-commutative operators)."""
    n = values.shape[0]
    segment = xp.cumsum(heads)
    v = values
    d = 1
    while d < n:
        same = segment[d:] == segment[:-d]
        if not bool(same.any()):
            break
        combined = xp.asarray(op.combine(v[:-d], v[d:])).astype(v.dtype, copy=False)
        v = xp.concatenate([v[:d], xp.where(same, combined, v[d:])])
        d *= 2
    return v


def segment_reduce(x, offsets, op, acc_dtype, xp=np):
    """One value per start offset (ascending, in [0, n]): ``op`` over x[offsets[i]:offsets[i+1]] (the
    last to the end); empty segments give the identity. Elements before offsets[0] take no part."""
    acc_dtype = np.dtype(acc_dtype)
    x = op.load(x)  # the nan-family reads NaN as its identity
    n = x.shape[0]
    m = len(offsets)
    identity = op.identity(acc_dtype)
    if m == 0:
        return xp.empty(0, dtype=acc_dtype)
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = np.append(offsets[1:], n)
    empty = offsets >= ends
    if n == 0 or empty.all():
        return xp.full(m, identity, dtype=acc_dtype)
    if op.ufunc is not None and xp is np:
        inside = offsets < n  # a prefix; those at n are empty and reduceat cannot take them
        out = np.full(m, identity, dtype=acc_dtype)
        out[inside] = op.ufunc.reduceat(x, offsets[inside], dtype=acc_dtype)
    else:
        heads = xp.zeros(n, dtype=bool)
        heads[0] = True
        starts = offsets[offsets < n]
        heads[xp.asarray(starts)] = True
        scanned = segmented_scan(x.astype(acc_dtype), heads, op, xp)
        out = scanned[xp.asarray(np.maximum(ends - 1, 0))]
    if empty.any():
        out = xp.where(xp.asarray(empty), xp.asarray(identity, dtype=acc_dtype), out)
    return out


def segment_scan(x, heads, op, acc_dtype, out_dtype, carry=None, xp=np):
    """Inclusive scan of ``x`` restarting at ``heads`` (positions); ``carry`` (earlier chunks' running
    value) is folded into the elements before the first head."""
    x = op.load(x)  # the nan-family reads NaN as its identity
    n = x.shape[0]
    flags = xp.zeros(n, dtype=bool)
    if n:
        heads = np.asarray(heads, dtype=np.int64)
        if heads.size:
            flags[xp.asarray(heads)] = True
    v = segmented_scan(x.astype(acc_dtype), flags, op, xp) if n else x.astype(acc_dtype)
    if carry is not None and n:
        first = int(heads[0]) if len(heads) else n
        if first:
            lead = xp.asarray(op.combine(xp.asarray(carry, dtype=acc_dtype), v[:first])).astype(acc_dtype)
            v = xp.concatenate([lead, v[first:]])
    return v.astype(out_dtype, copy=False)
