"""The CPU backend: every operator on NumPy arrays, so the API and the graph run without a GPU.

The functions here have the same signatures as the CuPy backend's; ``core`` calls whichever matches
the chunk type. Ufunc operators use ``ufunc.reduce`` / ``ufunc.accumulate``; other callables go through
order-preserving pairwise folds (reduce) and Hillis-Steele doubling (scan), both vectorised so that a
Python callable is called O(log n) times, not n times.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import NO_GRID, NO_TOP, division_dtype
from ..operators import Operator


def concatenate(values, axis=0):
    return np.concatenate(values, axis=axis)


def _fold_pairs(x: np.ndarray, op: Operator, identity) -> np.ndarray:
    """Reduce axis 0 by combining neighbours (0,1), (2,3), ... until one row is left; order is kept."""
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            pad = np.full((1,) + x.shape[1:], identity, dtype=x.dtype)
            x = np.concatenate([x, pad])
        x = np.asarray(op.combine(x[0::2], x[1::2])).astype(x.dtype, copy=False)
    return x


def _aligned(x):
    """``x`` in a buffer whose address is a multiple of the item size.

    NumPy's reductions pick a different (pairwise) summation order for misaligned data, so a chunk that
    arrives at an odd address (a view into a message buffer on a worker) would give other bits than the
    same values elsewhere; a copy makes the order depend on the values only."""
    if isinstance(x, np.ndarray) and not x.flags.aligned:
        return np.array(x, copy=True, order="K")
    return x


#: elements per piece of the whole-array passes below and of the statistics (numpy_stats): a float64
#: piece (512 KiB) stays in L2 while it is read several times, and 2^16 elements keep the Python cost
#: per piece at a few per cent of its arithmetic (python -m benchmarks stats --cpu)
PIECE = 1 << 16


def flat_view(x):
    """``x`` as a 1-D view in memory order (reductions over every axis ignore the order), or None where
    that would need a copy (non-contiguous arrays of several dimensions)."""
    if type(x) is not np.ndarray:
        return None
    if x.ndim == 1:
        return x
    if x.flags.c_contiguous or x.flags.f_contiguous:
        return x.ravel(order="K")
    return None


#: the ufuncs that skip NaN themselves: nanmin/nanmax read NaN as the identity in one pass, no copy
_NAN_SKIPPING = {"min": np.fmin, "max": np.fmax}


def _nan_pieces(flat, op: Operator, acc_dtype):
    """nansum/nanprod of 1-D float ``flat`` as an ``acc_dtype`` scalar: each piece copied into a buffer in
    cache, its NaNs set to the identity there, reduced, and the pieces' results reduced (a pairwise tree
    over pieces, as NumPy's is over the elements), so no full-size copy of the data is made."""
    ufunc, size = op.ufunc, min(flat.size, PIECE)
    identity = op.identity(flat.dtype)
    buf, nan = np.empty(size, flat.dtype), np.empty(size, bool)
    parts = np.empty(-(-flat.size // PIECE), acc_dtype)
    for i, start in enumerate(range(0, flat.size, PIECE)):
        piece = flat[start : start + PIECE]
        b, mask = (buf, nan) if piece.size == size else (buf[: piece.size], nan[: piece.size])
        np.isnan(piece, out=mask)
        np.copyto(b, piece)
        np.copyto(b, identity, where=mask)
        parts[i] = ufunc.reduce(b, dtype=acc_dtype)
    return ufunc.reduce(parts)


def _load_reduce(x, op: Operator, acc_dtype, axes=None):
    """The one-pass reductions of float ``x`` for an operator whose load only masks NaN
    (``Operator.nan_mask_only``; ``axes``: None for all; the result keeps the reduced axes unless ``axes``
    is None), or None where the load copy is the way (partial axes of nansum/nanprod, small or
    non-contiguous data)."""
    if op.base in _NAN_SKIPPING:
        return _NAN_SKIPPING[op.base].reduce(x, axis=axes, dtype=acc_dtype, keepdims=axes is not None,
                                             initial=op.identity(acc_dtype))
    if x.size <= PIECE or (axes is not None and len(axes) != x.ndim):
        return None
    flat = flat_view(x)
    if flat is None:
        return None
    value = _nan_pieces(flat, op, acc_dtype)
    return value if axes is None else np.full((1,) * x.ndim, value, acc_dtype)


def reduce(x, op: Operator, axes: tuple[int, ...], acc_dtype, algorithm: str = "auto"):
    """Reduce ``axes`` of ``x`` with ``op`` in ``acc_dtype``; the result keeps the reduced axes (size 1).
    Elements are read through ``op.load`` (the nan-family's NaN -> identity).

    Non-commutative operators take one axis at a time, so the caller passes one axis for them.
    """
    x = _aligned(x)
    acc_dtype = np.dtype(acc_dtype)
    identity = op.identity(acc_dtype)
    if op.nan_mask_only and x.dtype.kind == "f" and type(x) is np.ndarray:
        value = _load_reduce(x, op, acc_dtype, tuple(axes))
        if value is not None:
            return value
    x = op.load(x)
    if op.ufunc is not None:
        return op.ufunc.reduce(x, axis=axes, dtype=acc_dtype, keepdims=True, initial=identity)
    if len(axes) != 1:
        # callables reduce one axis after the other, last first, which keeps C order
        for axis in sorted(axes, reverse=True):
            x = reduce(x, op, (axis,), acc_dtype)
        return x
    (axis,) = axes
    moved = np.moveaxis(np.asarray(x, dtype=acc_dtype), axis, 0)
    if moved.shape[0] == 0:
        folded = np.full((1,) + moved.shape[1:], identity, dtype=acc_dtype)
    else:
        folded = _fold_pairs(moved, op, identity)
    return np.moveaxis(folded, 0, axis)


class _Launcher:
    """A whole-array reduction to a NumPy scalar in one ufunc call, for one (operator, accumulator,
    result dtype) with the lookups done once; None for empty input (the general path owns NumPy's
    empty-input rules) and for ndarray subclasses."""

    __slots__ = ("acc", "cast", "divisor", "load", "op", "ufunc")

    def __init__(self, op: Operator, acc, out, mean=False):
        self.ufunc, self.acc = op.ufunc, np.dtype(acc)
        self.cast = None if np.dtype(out) == self.acc and not mean else np.dtype(out)
        # the count's type as core.ReductionPlan.finalize divides by it: the same bits as the general path
        self.divisor = division_dtype(self.acc).type if mean else None
        self.load = op.load if op.masks_nan else None
        self.op = op

    def __call__(self, x):
        if type(x) is not np.ndarray or x.size == 0:
            return None
        if not x.flags.aligned:  # as _aligned, inline: this path is timed in microseconds
            x = np.array(x, copy=True, order="K")
        value = None
        if self.load is not None and self.op.nan_mask_only and x.dtype.kind == "f":
            value = _load_reduce(x, self.op, self.acc)
            if value is None:
                x = self.load(x)
        if value is None:
            value = self.ufunc.reduce(x, axis=None, dtype=self.acc)
        if self.divisor is not None:
            value = value / self.divisor(x.size)
        return value if self.cast is None else value.astype(self.cast)


def bind(op: Operator, T, acc_dtype, out_dtype, mean=False):
    """The eager launcher of a whole-array reduction (``core.ReductionPlan.launch``; ``mean``: divided
    by the element count), or None for operators without a ufunc (their pairwise fold runs through
    ``reduce``)."""
    return None if op.ufunc is None else _Launcher(op, acc_dtype, out_dtype, mean)


def combine(op: Operator, values: list):
    """Fold equally shaped partials in order: ``values[0] op values[1] op ...`` (as they are: no load
    transform)."""
    if len(values) == 1:
        return values[0]
    dtype = values[0].dtype
    if op.ufunc is not None:
        out = values[0]
        for v in values[1:]:
            out = op.ufunc(out, v, dtype=dtype)
        return out
    return _fold_pairs(np.stack(values), op, op.identity(dtype))[0]


def _inclusive_scan(x: np.ndarray, op: Operator, axis: int, acc_dtype) -> np.ndarray:
    if op.ufunc is not None:
        return op.ufunc.accumulate(x, axis=axis, dtype=acc_dtype)
    y = np.moveaxis(np.array(x, dtype=acc_dtype, copy=True), axis, 0)
    n, offset = y.shape[0], 1
    while offset < n:
        # the right-hand side is evaluated before the assignment: every step reads the old values
        y[offset:] = op.combine(y[: n - offset], y[offset:])
        offset *= 2
    return np.moveaxis(y, 0, axis)


#: elements per accumulator block of ``_scan_wide`` (all lanes together): 512 KB of float64 stays in L2,
#: and 2^16 elements keep the per-block Python cost at a few percent (benchmarks/bench_scan.py --cpu)
_WIDE_BLOCK = 1 << 16


def _scan_wide(x, ufunc, axis: int, acc_dtype, out_dtype, carry, inclusive: bool):
    """``ufunc``'s scan of ``x`` in ``acc_dtype``, wider than ``out_dtype``, block by block along the axis
    without a full-size accumulator array: each block's buffer starts with the running value, so the
    association is the sequential one. With no carry that is bitwise ``ufunc.accumulate(x, dtype=acc)``
    cast to ``out_dtype`` (a float32 cumsum as ``np.cumsum(x, dtype=float64).astype(float32)``); a carry
    enters on the left of the first element, as the first term of the sequence."""
    src = np.moveaxis(x, axis, 0)
    n = src.shape[0]
    out = np.empty(src.shape, out_dtype)
    lanes = max(1, src[0].size) if n else 1
    step = max(1, _WIDE_BLOCK // lanes)
    running = None if carry is None else np.moveaxis(np.asarray(carry, dtype=acc_dtype), axis, 0)[0]
    for start in range(0, n, step):
        block = src[start : start + step]
        if running is None:  # no identity folded into the first element (keeps -0.0, as NumPy)
            buf = block.astype(acc_dtype)
            ufunc.accumulate(buf, axis=0, out=buf)
            done = buf if inclusive else np.concatenate([np.full_like(buf[:1], ufunc.identity), buf[:-1]])
        else:
            buf = np.empty((block.shape[0] + 1,) + block.shape[1:], acc_dtype)
            buf[0] = running
            buf[1:] = block
            ufunc.accumulate(buf, axis=0, out=buf)
            done = buf[1:] if inclusive else buf[:-1]
        out[start : start + step] = done
        running = buf[-1].copy()
    return np.moveaxis(out, 0, axis)


def scan(
    x,
    op: Operator,
    axis: int,
    acc_dtype,
    out_dtype,
    carry=None,
    inclusive: bool = True,
    algorithm: str = "auto",
):
    """Scan ``x`` along ``axis``; ``carry`` (keepdims shape) is combined in on the left of every element.

    A float accumulator wider than the result (float32 accumulated in float64) runs ``_scan_wide``."""
    acc_dtype, out_dtype = np.dtype(acc_dtype), np.dtype(out_dtype)
    x = op.load(_aligned(x))
    if (op.ufunc is not None and op.ufunc.identity is not None and acc_dtype.kind == "f" and out_dtype.kind == "f"
            and acc_dtype.itemsize > out_dtype.itemsize and np.ndim(x) > 0):
        return _scan_wide(np.asarray(x), op.ufunc, axis, acc_dtype, out_dtype, carry, inclusive)
    scanned = _inclusive_scan(x, op, axis, acc_dtype)
    if carry is not None:
        scanned = np.asarray(op.combine(np.asarray(carry, dtype=acc_dtype), scanned)).astype(acc_dtype, copy=False)
    if not inclusive:
        shape = list(scanned.shape)
        shape[axis] = 1
        first = (
            np.broadcast_to(np.asarray(carry, dtype=acc_dtype), shape)
            if carry is not None
            else np.full(shape, op.identity(acc_dtype), dtype=acc_dtype)
        )
        # shift right by one and keep the input's length: an empty input (or chunk) stays empty
        length = scanned.shape[axis]
        scanned = np.take(np.concatenate([first, scanned], axis=axis), np.arange(length), axis=axis)
    return scanned.astype(out_dtype, copy=False)


#: whether the held paths sum chunks in any order where ``sum_bounds`` allows it: on the CPU the bounds pass
#: costs ~18 x the sum it would spare (2^22 float32, this project's 2-core VM, 2026-11-27: 96 against 5.4 ms),
#: more than the partials' transfers it saves; the function stays for tests of that path's logic
SUMS_IN_ANY_ORDER = False


def sum_bounds(x, into: tuple[int, int] | None = None) -> tuple[int, int]:
    """(top, grid) of a float16 or float32 ``x`` (``dtypes.exact_in_any_order``): the largest floor(log2 |v|)
    and the smallest exponent of a lowest set bit over its finite non-zero values; (NO_TOP, NO_GRID) where
    it has none. Read from the float32 bits (float16 values are float32s exactly), a piece at a time.
    ``into``: bounds of other values (an earlier result), merged in."""
    flat = np.ascontiguousarray(x).reshape(-1)
    top, grid = into if into is not None else (NO_TOP, NO_GRID)
    for start in range(0, flat.size, PIECE):
        bits = flat[start:start + PIECE].astype(np.float32, copy=False).view(np.uint32) & np.uint32(0x7FFFFFFF)
        bits = bits[(bits != 0) & (bits < 0x7F800000)].astype(np.int64)
        if bits.size == 0:
            continue
        field = bits >> 23
        mantissa = np.where(field > 0, (bits & 0x7FFFFF) | 0x800000, bits)
        base = np.where(field > 0, field - 150, -149)  # |v| = mantissa * 2**base
        # floor(log2) of a whole number below 2**24 from frexp of its float64: exact
        top = max(top, int((base + np.frexp(mantissa.astype(np.float64))[1]).max()) - 1)
        lowest = (mantissa & -mantissa).astype(np.float64)
        grid = min(grid, int((base + np.frexp(lowest)[1]).min()) - 1)
    return top, grid

