"""Group-by reductions: one value per group of labels along one axis, on NumPy, CuPy and Dask arrays.

Every chunk is reduced in one way whatever it holds: its elements are put in group order along the
axis (the order comes from the labels alone: on the host where they are few next to the data, on the
GPU of a CuPy chunk where they are many, ``DEVICE_LABELS_MIN``),
each group is then a segment, and the segments are reduced with the same operators as everywhere else
(NumPy: ``ufunc.reduceat`` along the axis; CuPy: the rows flattened into one vector and reduced by the
segment kernels of ``multireduce.segment_reduce``, one segment per (row, group), on the GPU that holds
the chunk). A CuPy chunk grouped along an axis that is not the last, with many elements after it (a
field by month), keeps its rows where they are instead: each run of equal labels is folded by the
row-segment kernel, then the runs of each group (``_Segments._reduce_rows``). No step loops over groups
in Python.

A chunk's result is a partial: a tuple of arrays whose last axis has one entry per group (the sum and
the non-NaN count, the count, mean and M2 of the moments, ...). Partials merge elementwise, so a
group may straddle any number of chunks and the labels need not be sorted. On Dask the partials meet
in the tree of ``graph.reduction`` (one partial per chunk, combined in chunk order); on the GPU they
stay on the device, since a group-by partial is as large as its output block.

Groups that no element falls in (``expected_groups`` naming labels the data lack) are known from the
labels before any data is read, so the result's dtype is known for lazy input too.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import _validation as v
from . import api
from . import dtypes as _dt
from .backends import is_cupy_array, numpy_stats, on_device_of
from .operators import get_operator
from .statistics import _as_dtype, _Commutative, segment_reduce

__all__ = ["groupby_reduce", "FUNCS"]

#: every ``func`` groupby_reduce takes; a "nan" prefix skips NaN as the NumPy function of that name does
FUNCS = ("sum", "nansum", "prod", "nanprod", "mean", "nanmean", "var", "nanvar", "std", "nanstd", "min", "nanmin",
         "max", "nanmax", "count", "any", "all")
_SKIPPING = ("sum", "prod", "mean", "var", "std", "min", "max")  # the functions that have a nan form
_MOMENTS = ("var", "std")


@dataclass(frozen=True)
class Grouped:
    """A chunk and the group codes of its positions along the grouped axis (host int64, -1: in no group)."""

    block: object
    codes: np.ndarray


class GroupIds:
    """The groups a group-by partial holds (sorted host int64), as the first member of the partial, a plain
    tuple ``(GroupIds, *states)`` whose states have one entry per listed group on their last axis. A plain
    tuple, so distributed serializes its arrays one by one (device to device where the transport can)
    and dask-cuda sizes, places and rebuilds it as any tuple of arrays."""

    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = np.asarray(ids, dtype=np.int64)

    def __reduce__(self):
        return GroupIds, (self.ids,)

    def __sizeof__(self) -> int:
        return int(self.ids.nbytes)

    def __dask_tokenize__(self):
        return ("multireduce.GroupIds", self.ids.tobytes())

    def __repr__(self) -> str:
        return f"GroupIds({self.ids.tolist()})"


def group_states(groups, states) -> tuple:
    """A partial of ``groups`` only: ``(GroupIds(groups), *states)``."""
    return (GroupIds(groups), *states)


def states_of(partial) -> tuple:
    """(groups or None, states): what a partial of some groups (``group_states``) holds; None for a partial
    of every group (a plain tuple of states)."""
    if partial and isinstance(partial[0], GroupIds):
        return partial[0].ids, tuple(partial[1:])
    return None, tuple(partial)


def _pair(block, codes):
    return Grouped(block, np.asarray(codes, dtype=np.int64))


def _xp(a):
    if is_cupy_array(a):
        import cupy

        return cupy
    return np


# ------------------------------------------------------------------------------------------------
# One chunk: group order, segments, partial states
# ------------------------------------------------------------------------------------------------
class _Segments:
    """A chunk's values with its elements in group order along the grouped axis, and the segment
    reductions over them, which return arrays with one entry per group on a last axis. Elements in no
    group (code -1) sort last, into a segment of their own (index ``ngroups``) that every reduction drops,
    so they never reach a group's segment even where rows are flattened into one vector.

    NumPy reduces along the grouped axis where it is (``reduceat`` adds whole rows of a leading axis at
    once); the GPU, which has no reduceat, moves the axis last and flattens the rows into one contiguous
    vector for the segment kernels (``flat``), made once here rather than by every reduction of the chunk,
    except where it keeps the rows in place (``rows``, see ``_keeps_rows``): there only labels that change
    often along the axis (runs shorter than ROWS_MIN_RUN on average) put the rows in group order first."""

    def __init__(self, block, codes, axis: int, ngroups: int, flat: bool):
        xp = _xp(block)
        self.ngroups, self.xp = ngroups, xp
        self.rows = _keeps_rows(xp, block, axis, flat)
        # the labels are planned where the data are when they are many (sorting them on the host would take
        # longer than the reduction), else on the host; the rows path's labels are few (one per row)
        many = xp is not np and not self.rows and codes.size >= DEVICE_LABELS_MIN
        codes = xp.asarray(codes) if many else _host(codes)
        key = _xp(codes).where(codes < 0, ngroups, codes)
        if self.rows:
            self.counts = np.bincount(key, minlength=ngroups + 1)
            self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
            self.flat, self.at = False, axis
            run_starts = _run_starts(key)
            runs = run_starts.size - 1
            if runs > ngroups + 1 and key.size < ROWS_MIN_RUN * runs:
                # short runs (by hour of day, by day of year) would each leave a partial row as large
                # as a row of data: one gather of whole rows puts each group in one run instead
                order = _group_order(key, ngroups)
                block = xp.take(block, xp.asarray(order), axis=axis)
                key = key[order]
                run_starts = _run_starts(key)
            self.key, self.run_starts = key, run_starts
            # the runs of each group, in group order, for the second fold (None: the runs are the groups)
            run_key = key[run_starts[:-1]]
            self.run_order = self.group_starts = None
            if not np.array_equal(run_key, np.arange(ngroups)):
                order = np.argsort(run_key, kind="stable")
                order = order[run_key[order] < ngroups]  # runs in no group dropped
                per_group = np.bincount(run_key[order], minlength=ngroups)
                self.run_order = xp.asarray(order)
                self.group_starts = np.concatenate([[0], np.cumsum(per_group)]).astype(np.int64)
            self.values = xp.ascontiguousarray(block)
            self.lead = tuple(s for d, s in enumerate(block.shape) if d != axis)
            return
        self.flat = flat or xp is not np
        self.at = block.ndim - 1 if self.flat else axis  # where the grouped axis is in ``values``
        values = xp.moveaxis(block, axis, -1) if self.flat else block
        self.key = key
        if key.size > 1 and bool((key[1:] < key[:-1]).any()):
            order = _group_order(key, ngroups)
            values = xp.take(values, xp.asarray(order), axis=self.at)
            self.key = key[order]
        # where each group's segment starts, from the keys in order (no count by atomics on the GPU, where
        # a few groups would make every element add to the same few counters)
        self.starts = _host(_xp(key).searchsorted(self.key, _xp(key).arange(ngroups + 1))).astype(np.int64)
        self.counts = np.diff(np.append(self.starts, self.key.size))
        self.values = xp.ascontiguousarray(values) if self.flat else values
        self.lead = tuple(s for d, s in enumerate(values.shape) if d != self.at)

    def lengths(self, every_row: bool = True):
        """Each group's element count (NaN included), int64, for every row; or, with ``every_row`` False,
        once, in a shape that broadcasts against the rows' results ((1, ..., 1, ngroups)): a state that
        carries it crosses between workers a row's worth, not the block's."""
        xp = self.xp
        counts = xp.asarray(self.counts[:-1], dtype=np.int64).reshape((1,) * len(self.lead) + (self.ngroups,))
        return xp.broadcast_to(counts, self.lead + (self.ngroups,)).copy() if every_row else counts

    def reduce(self, values, op: str, dtype) -> object:
        """``op`` over each group's segment of ``values`` (the layout of ``self.values``), in ``dtype``:
        an array of shape lead + (ngroups,); an empty group gives the operator's identity."""
        dtype = np.dtype(dtype)
        g = self.ngroups
        if self.rows:
            return self._reduce_rows(values, op, dtype)
        if self.flat:
            xp = self.xp
            rows, n = math.prod(self.lead), values.shape[-1]
            starts = xp.asarray(self.starts)
            offsets = (xp.arange(rows, dtype=np.int64)[:, None] * n + starts[None, :]).reshape(-1)
            out = segment_reduce(values.reshape(-1), offsets, op, dtype=dtype)
            return out.reshape(self.lead + (g + 1,))[..., :g]
        operator = get_operator(op)
        out = np.full(self.lead + (g + 1,), operator.identity(dtype), dtype=dtype)
        filled = self.counts > 0
        if filled.any() and out.size:  # reduceat gives x[i] for an empty segment: only filled ones go in
            with np.errstate(all="ignore"):
                found = operator.ufunc.reduceat(operator.load(values), self.starts[filled], axis=self.at, dtype=dtype)
            out[..., filled] = np.moveaxis(found, self.at, -1)
        return out[..., :g]

    def _reduce_rows(self, values, op: str, dtype: np.dtype):
        """reduce() on the GPU with the rows in place: each run of equal labels along the axis folded
        (cupy_segment.segment_reduce_rows), then the runs of each group folded in order, in one more
        launch where a group has several runs or runs are out of group order."""
        from .backends import cupy_segment

        operator = get_operator(op)
        acc = _dt.accumulator_dtype(dtype)  # float16 folded in float32, as the flat path's segment kernels do
        out = cupy_segment.segment_reduce_rows(self._rows3(values), self.run_starts, operator, acc)
        return self._runs_to_groups(out, operator.partials, acc, dtype)

    def _rows3(self, values):
        """``values`` (the layout of ``self.values``) as (rows before the axis, the axis, columns after)."""
        shape, at = values.shape, self.at
        return values.reshape(math.prod(shape[:at]), shape[at], math.prod(shape[at + 1:]))

    def _runs_to_groups(self, out, partials, acc, dtype):
        """Per-run folds (rows before, runs, columns after) -> per-group results in ``dtype`` (lead +
        (ngroups,)): the runs of each group folded in order with ``partials`` where needed."""
        from .backends import cupy_segment

        if self.run_order is not None:
            runs = self.xp.take(out, self.run_order, axis=1)
            out = cupy_segment.segment_reduce_rows(runs, self.group_starts, partials, acc)
        out = _as_dtype(out, dtype)
        shape, at = self.values.shape, self.at
        out = out.reshape(shape[:at] + (self.ngroups,) + shape[at + 1:])
        return self.xp.moveaxis(out, at, -1)

    def shifted_sums(self, shift, skipnan: bool):
        """Rows path: per group, the float64 sums of d and of d * d, d = x - shift (``shift``: lead +
        (ngroups,), one value per group and column), NaN as d = 0 with ``skipnan``; one read of the data
        (cupy_segment.segment_shifted_squares_rows), folded as reduce() folds sums."""
        from .backends import cupy_segment

        xp, at, g = self.xp, self.at, self.ngroups
        x3 = self._rows3(self.values)
        s3 = xp.moveaxis(shift, -1, at).reshape(x3.shape[0], g, x3.shape[2])
        s3 = xp.concatenate([s3, xp.zeros((x3.shape[0], 1, x3.shape[2]))], axis=1)  # runs in no group: 0
        found = cupy_segment.segment_shifted_squares_rows(x3, self.run_starts, self.key[self.run_starts[:-1]],
                                                          s3, skipnan)
        f64 = np.dtype(np.float64)
        return tuple(self._runs_to_groups(a, get_operator("sum").partials, f64, f64) for a in found)

    def spread(self, per_group):
        """Per-group values (lead + (ngroups,)) repeated over each group's elements, in the layout of
        ``values``."""
        xp = self.xp
        padded = xp.concatenate([per_group, xp.zeros(self.lead + (1,), dtype=per_group.dtype)], axis=-1)
        return xp.moveaxis(xp.take(padded, xp.asarray(self.key), axis=padded.ndim - 1), -1, self.at)


#: Columns after the grouped axis from which a GPU chunk keeps its rows in place (one thread per column of
#: each run of equal labels) instead of moving the axis last and cutting the flattened rows into segments
ROWS_MIN_COLUMNS = 256
#: The shortest average run of equal labels the rows path folds where the rows lie; shorter runs are put
#: in group order first (a gather of whole rows, in the data's dtype)
ROWS_MIN_RUN = 16


def _run_starts(key: np.ndarray) -> np.ndarray:
    """Where each run of equal codes begins, and the end: int64, [0] alone for no codes (no run at all:
    every group then folds nothing, the identity)."""
    if not key.size:
        return np.zeros(1, dtype=np.int64)
    return np.concatenate([[0], np.flatnonzero(key[1:] != key[:-1]) + 1, [key.size]]).astype(np.int64)


def _group_order(key, ngroups: int):
    """The stable order that sorts group keys (0..ngroups, on the host or the GPU), the keys narrowed to
    the smallest unsigned type that holds ngroups first: NumPy sorts 8- and 16-bit keys by radix (2^24 keys
    of 365 groups: 0.35 s against 2.6 s as int64 on this project's CI machine), the GPU's radix sort makes
    a pass per byte."""
    xp = _xp(key)
    for narrow in (np.uint8, np.uint16, np.uint32):
        if ngroups <= np.iinfo(narrow).max:
            key = key.astype(narrow)
            break
    return xp.argsort(key, kind="stable")


def _keeps_rows(xp, block, axis: int, flat: bool) -> bool:
    """Whether a chunk is reduced with its rows in place (``_Segments._reduce_rows``): on the GPU, the
    grouped axis not the last, and at least ROWS_MIN_COLUMNS elements after it."""
    return (xp is not np and not flat and axis < block.ndim - 1
            and math.prod(block.shape[axis + 1:]) >= ROWS_MIN_COLUMNS)


def _valid_count(seg: _Segments, floating: bool):
    """Each group's non-NaN count (its length where the data hold no NaN)."""
    if not floating:
        return seg.lengths()
    return seg.reduce(~seg.xp.isnan(seg.values), "sum", np.int64)


def _moments(seg: _Segments, skipnan: bool):
    """(count, anchor, offset, M2) per group, float64, as ``numpy_stats.moments_chunk`` makes them for a
    slice: a mean (the anchor), the mean of the deviations from it (the offset, which corrects the
    rounding of the first) and their sum of squares, two passes over the chunk. Data with inf or NaN
    in a group have anchor 0, so the offset carries them and M2 is NaN, as NumPy's var is."""
    xp = seg.xp
    if seg.rows and _reads_moments_twice(seg.values.dtype):
        return _moments_of_rows(seg, skipnan)
    dev = seg.values.astype(np.float64)  # a copy, worked on in place: the data, then deviations, then squares
    nan = xp.isnan(dev) if skipnan and seg.values.dtype.kind == "f" else None
    if nan is None:
        count = seg.lengths(every_row=False).astype(np.float64)
    else:  # NaN read as 0 once here, so every sum below is a plain one
        count = seg.reduce(~nan, "sum", np.int64).astype(np.float64)
        dev[nan] = 0.0
    per = xp.maximum(count, 1.0)
    anchor = seg.reduce(dev, "sum", np.float64) / per
    anchor = xp.where(xp.isfinite(anchor), anchor, 0.0)
    dev -= seg.spread(anchor)
    if nan is not None:
        dev[nan] = 0.0
    total = seg.reduce(dev, "sum", np.float64)
    offset = total / per
    dev *= dev
    m2 = xp.maximum(seg.reduce(dev, "sum", np.float64) - offset * total, 0.0)
    return count, anchor, offset, m2


def _reads_moments_twice(dtype) -> bool:
    """Whether the rows path's moments come from _moments_of_rows (its kernels exist for every GPU dtype)."""
    return _dt.gpu_supported(dtype)


def _moments_of_rows(seg: _Segments, skipnan: bool):
    """_moments() of a chunk whose rows stay in place, in two reads of the data and no copy of it: the
    anchors from one sum, the deviations' sums and squares from one more (``shifted_sums``). The values
    and their rounding are those of _moments: each deviation x - anchor rounded to float64, squared and
    rounded, added in the same order. One difference: float32 subnormals, which CuPy's conversion to
    float64 in _moments flushes to zero, are read as they are (as NumPy reads them) by the shipped
    kernels. Skipping NaN reads the data a third time, for the counts."""
    xp = seg.xp
    skip = skipnan and seg.values.dtype.kind == "f"
    count = (seg.reduce(~xp.isnan(seg.values), "sum", np.int64) if skip else seg.lengths(every_row=False)).astype(
        np.float64)
    per = xp.maximum(count, 1.0)
    anchor = seg.reduce(seg.values, "nansum" if skip else "sum", np.float64) / per
    anchor = xp.where(xp.isfinite(anchor), anchor, 0.0)
    total, squares = seg.shifted_sums(anchor, skip)
    offset = total / per
    m2 = xp.maximum(squares - offset * total, 0.0)
    return count, anchor, offset, m2


# ------------------------------------------------------------------------------------------------
# The plan: per chunk, merge, finish (graph.reduction's contract)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupByPlan:
    """One group-by reduction of ``stat`` along ``axis`` into ``ngroups`` groups. The partials keep the
    chunk's array type; the result has the groups where ``axis`` was (``keepdims`` in the graph's terms:
    one output block along it, whose length the caller sets to ``ngroups``)."""

    stat: str  # a plain name of FUNCS ("sum", not "nansum": ``skipnan`` says)
    axis: int
    ngroups: int
    acc_dtype: np.dtype
    out_dtype: np.dtype
    skipnan: bool = False
    ddof: float = 0.0
    min_count: int | None = None
    fill_value: object = None
    missing: tuple = ()  # groups no element falls in, known from the labels
    flat: bool = False  # the GPU's flattened segment path, also for NumPy chunks
    keepdims: ClassVar[bool] = True
    op: ClassVar[_Commutative] = _Commutative()

    @property
    def axes(self) -> tuple:
        return (self.axis,)

    @property
    def label(self) -> str:
        return f"groupby-{'nan' if self.skipnan else ''}{self.stat}"

    # -- per chunk ----------------------------------------------------------------------------------
    def _chunk(self, item: Grouped):
        """The chunk's states of every group (a last axis of ngroups)."""
        return self._chunk_counted(item)[0]

    def _chunk_counted(self, item: Grouped):
        """(the chunk's states of every group, each group's element count in it: host int64)."""
        block = item.block
        with on_device_of(block):
            seg = _Segments(block, item.codes, self.axis, self.ngroups, self.flat)
        return self._states(seg), seg.counts[:self.ngroups]

    def _states(self, seg: _Segments):
        block = seg.values
        with on_device_of(block), np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            floating = block.dtype.kind == "f"
            stat, values = self.stat, seg.values
            if stat in _MOMENTS:
                return _moments(seg, self.skipnan)
            if stat == "count":
                return (_valid_count(seg, floating),)
            if stat in ("any", "all"):
                return (seg.reduce(values != 0 if stat == "any" else values == 0, "sum", np.int64),)
            if stat == "mean":
                count = _valid_count(seg, floating) if self.skipnan else seg.lengths(every_row=False)
                return count, seg.reduce(values, "nansum" if self.skipnan else "sum", self.acc_dtype)
            if stat in ("min", "max") and values.dtype != self.acc_dtype:
                values = values.astype(self.acc_dtype)  # dtype= converts before comparing, as multireduce.min
            value = seg.reduce(values, ("nan" if self.skipnan else "") + stat, self.acc_dtype)
            if self.min_count is not None or (self.skipnan and stat in ("min", "max")):
                return value, _valid_count(seg, floating)  # an all-NaN group ends as NaN, not the identity
            return (value,)

    def _merge(self, left, right):
        stat = self.stat
        if stat in _MOMENTS:
            return numpy_stats.moments_merge(left, right)
        xp = _xp(left[0])
        if stat in ("min", "max"):
            pick = {("min", False): xp.minimum, ("min", True): xp.fmin, ("max", False): xp.maximum,
                    ("max", True): xp.fmax}[stat, self.skipnan]
            a, b = left[0], right[0]
            first = pick(a, b)
            if first.dtype.kind == "f":
                # 0.0 against -0.0: -0.0 is the smaller (IEEE 754-2019's minimum and maximum). NumPy's fmin and
                # fmax pick either, by the SIMD path an array's length takes, so merges of the same values in
                # arrays of other widths (cohorts, the tree) would differ in the sign
                zero = (a == 0) & (b == 0)
                negative = xp.signbit(a) | xp.signbit(b) if stat == "min" else xp.signbit(a) & xp.signbit(b)
                first = xp.where(zero, xp.where(negative, -0.0, 0.0).astype(first.dtype), first)
        elif stat == "prod":
            first = left[0] * right[0]
        else:
            first = left[0] + right[0]
        return (first,) + tuple(a + b for a, b in zip(left[1:], right[1:]))

    def _empty_state(self, states) -> tuple:
        """What each member of a chunk's state holds for a group with no element there (the identity of
        the fold, zero counts and moments): the values _chunk gives such a group, so a state widened with
        them merges to the bits of the full one."""
        stat, first = self.stat, states[0].dtype
        if stat in ("sum", "prod", "min", "max"):
            identity = get_operator(("nan" if self.skipnan else "") + stat).identity(first)
            return (identity,) + (0,) * (len(states) - 1)
        return (0,) * len(states)

    def _widened(self, partial, groups: np.ndarray) -> tuple:
        """The states of ``partial`` (of some groups, ``group_states``, or of every group) with a last axis
        of ``groups`` (which holds every group the partial has), the missing ones given _empty_state."""
        held, states = states_of(partial)
        if held is None or held.size == groups.size:
            return states
        xp = _xp(states[0])
        at = np.searchsorted(groups, held)
        out = []
        with on_device_of(states[0]):
            for member, fill in zip(states, self._empty_state(states)):
                wide = xp.full(member.shape[:-1] + (groups.size,), fill, dtype=member.dtype)
                wide[..., xp.asarray(at) if xp is not np else at] = member
                out.append(wide)
        return tuple(out)

    # -- the graph contract ---------------------------------------------------------------------
    def partial(self, *items):
        """The chunks' states for the groups they hold (``group_states``): a chunk of a time axis holds a
        month or two of twelve, and the rest would cross between workers as identities."""
        counted = [self._chunk_counted(item) for item in items]
        states = self._merged(states for states, _ in counted)
        # which groups the chunks hold, from their plans' counts (no pass over the labels here)
        present = np.flatnonzero(functools.reduce(np.add, (counts for _, counts in counted)))
        if present.size == self.ngroups:
            return group_states(present, states)
        xp = _xp(states[0])
        with on_device_of(states[0]):
            at = xp.asarray(present) if xp is not np else present
            return group_states(present, tuple(xp.take(member, at, axis=-1) for member in states))

    def _full(self, *items) -> tuple:
        """The states of every group (a last axis of ngroups) of the chunks, merged in order."""
        return self._merged(self._chunk(item) for item in items)

    def _merged(self, states) -> tuple:
        """States of the same groups merged in order."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return functools.reduce(self._merge, states)

    def combine(self, *partials):
        """Partials merged in order, each widened to the groups of them all: the merges of the full
        states, group by group, so the bits do not depend on which groups a partial carried."""
        held = [states_of(p)[0] for p in partials]
        if all(h is None for h in held):
            return self._merged(partials)
        groups = functools.reduce(np.union1d, (np.arange(self.ngroups) if h is None else h for h in held))
        groups = groups.astype(np.int64)
        return group_states(groups, self._merged(self._widened(p, groups) for p in partials))

    def finalize(self, partial):
        return self._finished(self._widened(partial, np.arange(self.ngroups)), 0)

    # -- cohorts: a run of groups folded from the chunks that hold them (``graph.cohort_reduction``) --------
    def restricted(self, partial, first: int, last: int):
        """``partial``'s states of groups ``first..last`` that it holds, or None where it holds none."""
        held, states = states_of(partial)
        if held is None:
            held = np.arange(self.ngroups)
        lo, hi = np.searchsorted(held, (first, last + 1))
        if lo == hi:
            return None
        return group_states(held[lo:hi], tuple(member[..., lo:hi] for member in states))

    def finalize_groups(self, folded, first: int, last: int, parts: list, count: int):
        """The result of groups ``first..last`` from ``folded`` (``graph.fold_present_in_order`` of the
        restricted ``parts`` of ``count`` chunks), with the bits of the full tree: there a group that some
        chunk lacks was merged with its empty state, which changes a float sum's -0.0 (and, on a GPU, a NaN's
        payload); a group every chunk holds was not."""
        groups = np.arange(first, last + 1)
        states = self._widened(folded, groups)
        if self.stat in _MOMENTS:  # merging an empty moment changes no bit (``moments_merge``)
            return self._finished(states, first)
        xp = _xp(states[0])
        with on_device_of(states[0]), np.errstate(invalid="ignore", over="ignore"):
            merged = self._merge(states, self._empty_state(states))
            if len(parts) == count:
                everywhere = np.ones(groups.size, dtype=bool)
                for part in parts:
                    held = np.zeros(groups.size, dtype=bool)
                    if part is not None:
                        held[states_of(part)[0] - first] = True  # a restricted part names its groups
                    everywhere &= held
                if everywhere.any():
                    keep = xp.asarray(everywhere) if xp is not np else everywhere
                    merged = tuple(xp.where(keep, s, m).astype(s.dtype, copy=False) for s, m in zip(states, merged))
        return self._finished(merged, first)

    def _finished(self, partial: tuple, first: int):
        """The result from the states of groups ``first``, ``first + 1``, ... (a last axis of them)."""
        stat = self.stat
        xp = _xp(partial[0])
        out = np.dtype(self.out_dtype)
        null = None
        with on_device_of(partial[0]), np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if stat in _MOMENTS:
                count, m2 = partial[0], partial[3]
                dof = count - self.ddof
                value = xp.where(dof > 0, m2 / xp.where(dof > 0, dof, 1.0), np.nan)
                value = xp.sqrt(value) if stat == "std" else value
            elif stat == "count":
                value = partial[0]
            elif stat in ("any", "all"):
                value = partial[0] > 0 if stat == "any" else partial[0] == 0
            elif stat == "mean":
                count, total = partial
                value = total / xp.where(count > 0, count, 1).astype(total.dtype)
                null = count == 0
            else:
                value = partial[0]
                if self.min_count is not None:
                    null = partial[1] < self.min_count
                elif stat in ("min", "max") and len(partial) > 1:
                    null = partial[1] == 0  # every element NaN: NaN, as numpy.nanmin (without its warning)
            value = value.astype(out, copy=False)
            fill = np.nan if stat in ("mean", "min", "max") or self.fill_value is None else self.fill_value
            # an integer result asked for (dtype=) holds no NaN, and no group can need it there: integer data
            # have no NaN, and groups without elements made the result float already (reduce_codes)
            if null is not None and (out.kind in "fc" or not (isinstance(fill, float) and math.isnan(fill))):
                value = xp.where(null, xp.asarray(fill, dtype=out), value)
            missing = [g - first for g in self.missing if first <= g < first + value.shape[-1]]
            if missing:
                value = value.copy()  # astype(copy=False) may have kept a partial's own array
                value[..., missing] = _fill_of(stat, self.fill_value)
            return xp.moveaxis(value, -1, self.axis)

    def aggregate(self, *partials):
        return self.finalize(self.combine(*partials))

    def whole(self, *items):
        return self.finalize(self._full(*items))

    def __dask_tokenize__(self):
        return ("multireduce.GroupByPlan", self.stat, self.axis, self.ngroups, str(self.acc_dtype),
                str(self.out_dtype), self.skipnan, self.ddof, self.min_count, repr(self.fill_value), self.missing,
                self.flat)


def _fill_of(stat: str, fill_value):
    """What a group no element falls in holds: ``fill_value``, by default NaN, except for count (0),
    any (False) and all (True), NumPy's values for nothing."""
    if fill_value is not None:
        return fill_value
    return {"count": 0, "any": False, "all": True}.get(stat, np.nan)


# ------------------------------------------------------------------------------------------------
# Labels -> codes
# ------------------------------------------------------------------------------------------------
def _null(labels):
    """Where labels are missing (NaN, NaT, None): on the labels' device."""
    xp = _xp(labels)
    if labels.dtype.kind in "fc":
        return xp.isnan(labels)
    if labels.dtype.kind in "mM":
        return np.isnat(labels)
    if labels.dtype.kind == "O":
        return np.array([x is None or x != x for x in labels], dtype=bool)
    return xp.zeros(labels.shape, dtype=bool)


def _host(a) -> np.ndarray:
    """``a`` as a NumPy array (a CuPy array copied to the host)."""
    return a.get() if is_cupy_array(a) else np.asarray(a)


def _mark(present, index) -> None:
    """present[index] = True; on the GPU one store per run of equal indices (labels in runs would
    otherwise store to the same few addresses once per element)."""
    if is_cupy_array(index):
        from .backends import cupy_segment

        cupy_segment.mark_present(present, index)
    else:
        present[index] = True


def _small_integer_codes(labels):
    """factorize's (codes, groups) for integer labels spanning few values (months, days, hours, classes)
    through a table of the span, in O(n + span) instead of sorting the labels (``unique``); None for
    other labels or a span wider than the labels are many. Codes on the labels' device, groups NumPy."""
    if labels.dtype.kind not in "iu" or labels.size == 0:
        return None
    xp = _xp(labels)
    lo, hi = int(labels.min()), int(labels.max())
    span = hi - lo + 1
    if span > 4 * labels.size + 1024:
        return None
    # in a type that holds the span: int8 labels from -128 to 127 are 255 apart (unsigned ones never wrap)
    wide = labels - labels.dtype.type(lo) if labels.dtype.kind == "u" else labels.astype(np.int64) - lo
    offset = wide.astype(np.intp, copy=False)
    present = xp.zeros(span, dtype=bool)
    _mark(present, offset)
    where = xp.flatnonzero(present)
    table = xp.full(span, -1, dtype=np.int64)
    table[where] = xp.arange(where.size)
    where = _host(where)
    if labels.dtype.kind == "u":
        groups = where.astype(np.uint64) + np.uint64(lo)
    else:
        groups = where.astype(np.int64) + np.int64(lo)
    return table[offset], groups.astype(labels.dtype)


#: From this many labels beside CuPy data (or CuPy labels), numeric labels are factorized and put in group
#: order on the GPU: sorting 2^26 labels on the host takes seconds, on the GPU milliseconds
DEVICE_LABELS_MIN = 1 << 16


def _factorizes_on_gpu(labels, expected_groups) -> bool:
    """Whether labels (already checked: one per element) are factorized on a GPU: many numeric ones, with
    numeric expected groups if any (strings, datetimes and objects stay on the host)."""
    if labels.dtype.kind not in "iuf" or not _dt.gpu_supported(labels.dtype) or labels.size < DEVICE_LABELS_MIN:
        return False  # float128 labels, for one, stay on the host
    if expected_groups is None:
        return True
    groups = np.asarray(expected_groups).dtype
    return groups.kind in "biuf" and _dt.gpu_supported(np.result_type(labels.dtype, groups))


def factorize(by, n: int, expected_groups, caller: str, device=None):
    """(codes, groups): the position of each label in ``groups`` (int64; -1 for NaN labels and, with
    ``expected_groups``, labels not in it), and the groups (NumPy): the sorted distinct labels, or
    ``expected_groups`` as given. With ``device`` (a GPU's id), many numeric labels are factorized on that
    GPU and their codes stay there (a CuPy array); otherwise codes are NumPy."""
    if v.is_dask_array(by):
        raise TypeError(f"{caller}: argument 'by' must be a NumPy or CuPy array or a list; got a dask array "
                        "(the groups shape the result: compute the labels first)")
    labels = by if is_cupy_array(by) else np.asarray(by)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"{caller}: argument 'by' must be 1-D with one label per element along 'axis' ({n}); "
                         f"got shape {labels.shape}")
    if device is not None and _factorizes_on_gpu(labels, expected_groups):
        import cupy

        with cupy.cuda.Device(device):  # NumPy labels copied up, CuPy ones on another GPU copied over
            labels = cupy.asarray(labels.astype(labels.dtype.newbyteorder("="), copy=False))
            return _factorize_labels(labels, expected_groups, caller)
    return _factorize_labels(_host(labels), expected_groups, caller)


def _factorize_labels(labels, expected_groups, caller: str):
    """factorize() of 1-D labels where they are (NumPy or CuPy; groups always NumPy)."""
    xp = _xp(labels)
    if expected_groups is None:
        found = _small_integer_codes(labels)
        if found is not None:
            return found
    null = _null(labels)
    try:
        if expected_groups is None:
            groups = _host(xp.unique(labels[~null]))
            sorted_groups, sorter = groups, np.arange(groups.size)
        else:
            groups = np.asarray(expected_groups)
            if groups.ndim != 1 or np.unique(groups).size != groups.size:
                raise ValueError(f"{caller}: argument 'expected_groups' must be 1-D with distinct labels; got "
                                 f"{groups.size} labels of shape {groups.shape}")
            sorter = np.argsort(groups, kind="stable")
            sorted_groups = groups[sorter]
        if labels.dtype.kind in "iu" and sorted_groups.dtype.kind in "iu" and \
                np.result_type(labels.dtype, sorted_groups.dtype).kind == "f":
            # int64 against uint64 would be searched in float64, where labels above 2^53 collide: keep the
            # groups a label could equal, in the labels' own type, and compare exactly
            info = np.iinfo(labels.dtype)
            keep = (sorted_groups >= info.min) & (sorted_groups <= info.max)
            sorted_groups, sorter = sorted_groups[keep].astype(labels.dtype), sorter[keep]
        if xp is not np:  # one dtype for both sides of the search on the GPU, as NumPy compares them
            common = np.result_type(labels.dtype, sorted_groups.dtype)
            labels, sorted_groups = labels.astype(common, copy=False), xp.asarray(sorted_groups.astype(common))
            sorter = xp.asarray(sorter)
        where = xp.searchsorted(sorted_groups, labels)
        inside = xp.minimum(where, max(sorted_groups.size - 1, 0))
        hit = (where < sorted_groups.size) & ~null
        if sorted_groups.size:
            hit &= sorted_groups[inside] == labels
    except TypeError as exc:
        raise TypeError(f"{caller}: argument 'by' holds labels (dtype {labels.dtype}) that cannot be ordered"
                        + ("" if expected_groups is None else f" against 'expected_groups' ({groups.dtype})")
                        + f": {exc}") from None
    codes = xp.where(hit, sorter[inside] if sorted_groups.size else -1, -1).astype(np.int64)
    return codes, groups


# ------------------------------------------------------------------------------------------------
# Checks, dtypes, running
# ------------------------------------------------------------------------------------------------
def _stat_of(func, skipna, floating: bool, caller: str) -> tuple[str, bool]:
    """(plain name, skip NaN): "nansum" -> ("sum", True); ``skipna`` True or False overrides the name."""
    if not isinstance(func, str) or func not in FUNCS:
        raise ValueError(f"{caller}: argument 'func' must be one of {', '.join(map(repr, FUNCS))}; got {func!r}")
    stat = func[3:] if func.startswith("nan") else func
    skip = func.startswith("nan") if skipna is None else v.check_flag(skipna, "skipna", caller)
    return stat, skip and floating and stat in _SKIPPING


def _dtypes(stat: str, dtype: np.dtype, requested, caller: str) -> tuple[np.dtype, np.dtype]:
    """(accumulator, result) dtypes: NumPy's result rules (sums of small integers in int64, means and
    variances of integers in float64, min/max in the input's dtype); floating sums and means accumulate
    in float64 and round once."""
    if requested is not None:
        if stat in ("count", "any", "all"):
            raise TypeError(f"{caller}: argument 'dtype' does not apply to {stat!r}; got {requested!r}")
        requested = v.requested_dtype(requested, "f" if stat in _MOMENTS else _dt.ARITHMETIC_KINDS, caller)
        if not np.can_cast(dtype, requested, "same_kind"):
            raise TypeError(f"{caller}: argument 'dtype' is {requested}, which {dtype} data cannot be cast to "
                            "without changing kind; expected a dtype of the data's kind or a wider one")
    if stat == "count":
        return np.dtype(np.int64), np.dtype(np.intp)
    if stat in ("any", "all"):
        return np.dtype(np.int64), np.dtype(np.bool_)
    if stat in _MOMENTS:
        return np.dtype(np.float64), requested or (dtype if dtype.kind == "f" else np.dtype(np.float64))
    if stat in ("min", "max"):
        out = requested or dtype
        return out, out
    out = _dt.result_dtype("mean" if stat == "mean" else "sum", dtype, requested)
    return (np.dtype(np.float64) if out.kind == "f" or stat == "mean" else out), out


def _check_count(value, name: str, caller: str):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{caller}: argument '{name}' must be None or an int >= 0; got {value!r}")
    return int(value)


def reduce_codes(x, codes, ngroups: int, func, *, axis=-1, skipna=None, ddof=0, min_count=None, fill_value=None,
                 dtype=None, split_every=None, method=None, caller: str = "multireduce.groupby_reduce",
                 flat: bool = False):
    """``func`` of each group of ``x`` along ``axis``, where ``codes`` (host int64, one per element along
    ``axis``) places each element in group 0..ngroups-1 (or none, -1): ``x``'s array type, the axis
    replaced by a last axis of ``ngroups`` (lazy for Dask). The entry behind ``groupby_reduce`` and the
    xarray accessor, which factorize labels their own ways."""
    x, kind = v.as_array(x, caller)
    v.check_dtype(x.dtype, "biuf", caller)
    if x.ndim == 0:
        raise ValueError(f"{caller}: argument 'x' must have at least one dimension; got a 0-d array")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{caller}: argument 'axis' must be an int; got {axis!r}")
    (ax,) = v.normalize_axes(axis, x.ndim, caller)
    if kind == "cupy" and is_cupy_array(codes):  # codes factorized on the GPU stay there, on x's GPU
        import cupy

        with cupy.cuda.Device(x.data.device_id):
            codes = cupy.asarray(codes, dtype=np.int64)
    else:
        codes = _host(codes).astype(np.int64, copy=False)
    xp = _xp(codes)
    with on_device_of(codes):
        bad = codes.shape != (x.shape[ax],) or (codes.size and (int(codes.min()) < -1 or int(codes.max()) >= ngroups))
    if bad:
        raise ValueError(f"{caller}: expected one group code in [-1, {ngroups}) per element along axis {ax} "
                         f"({x.shape[ax]}); got {codes.size} codes")
    stat, skipnan = _stat_of(func, skipna, x.dtype.kind == "f", caller)
    if isinstance(ddof, (bool, np.bool_)) or not isinstance(ddof, numbers.Real) or not math.isfinite(ddof):
        raise TypeError(f"{caller}: argument 'ddof' must be a finite real number; got {ddof!r}")
    if ddof != 0 and stat not in _MOMENTS:
        raise ValueError(f"{caller}: argument 'ddof' applies to var and std; got ddof={ddof!r} for {func!r}")
    min_count = _check_count(min_count, "min_count", caller)
    if min_count is not None and stat not in ("sum", "prod"):
        raise ValueError(f"{caller}: argument 'min_count' applies to sum and prod (and their nan forms); "
                         f"got min_count={min_count!r} for {func!r}")
    if fill_value is not None and not isinstance(fill_value, (numbers.Number, np.number, np.bool_)):
        raise TypeError(f"{caller}: argument 'fill_value' must be None or a number; got {fill_value!r}")
    acc, out = _dtypes(stat, x.dtype, dtype, caller)
    fan_in = v.fan_in(split_every, (ax,), caller)
    if method is not None and (not isinstance(method, str) or method not in METHODS):
        raise ValueError(f"{caller}: argument 'method' must be None, 'map-reduce' or 'cohorts'; got {method!r}")
    with on_device_of(codes):  # marks, not counts: no atomics on the GPU, whose few groups would contend
        present = xp.zeros(ngroups + 1, dtype=bool)
        _mark(present, xp.where(codes >= 0, codes, ngroups))
    missing = tuple(int(g) for g in np.flatnonzero(~_host(present[:ngroups])))
    fills = ([_fill_of(stat, fill_value)] if missing else []) + \
        ([np.nan if fill_value is None else fill_value] if min_count is not None else [])
    for fill in fills:  # NumPy's promotion: an integer result with NaN to hold becomes float64
        out = np.result_type(out, fill)
    plan = GroupByPlan(stat, ax, int(ngroups), acc, np.dtype(out), skipnan, float(ddof), min_count, fill_value,
                       missing, flat)
    if kind.startswith("dask"):
        return _lazy(x, codes, plan, fan_in, caller, method)
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(x.data.device_id):
            return cupy.moveaxis(plan.whole(Grouped(x, codes)), ax, -1)
    return np.moveaxis(plan.whole(Grouped(x, codes)), ax, -1)


METHODS = ("map-reduce", "cohorts")


def cohorts(codes: np.ndarray, sizes, ngroups: int, fan_in: int) -> list | None:
    """Runs of groups and the chunks (positions along the axis, of ``sizes``) that may hold them, where the
    codes never fall back across chunks (each chunk's smallest code at least every earlier chunk's
    largest: days, months or years of a time axis): one run per chunk that brings new groups (from the
    first, or the one after the last seen, to its largest; missing groups join the run before them, or
    the first), its chunks that one and the next ones whose smallest code is in the run. None where the
    codes fall back, where there would be one run only, or where a run spans more than ``4 * fan_in``
    chunks (the tree's levels then bound what one task holds)."""
    bounds = np.concatenate(([0], np.cumsum(np.asarray(sizes, dtype=np.int64))))
    spans = []
    for i in range(len(sizes)):
        held = codes[bounds[i] : bounds[i + 1]]
        held = held[held >= 0]
        if held.size:
            spans.append((i, int(held.min()), int(held.max())))
    runs, seen = [], -1
    for k, (i, low, high) in enumerate(spans):
        if low < seen:
            return None
        if high > seen:
            positions = list(itertools.takewhile(lambda j: spans[j][1] <= high, range(k, len(spans))))
            positions = [spans[j][0] for j in positions]
            runs.append([seen + 1 if runs else 0, high, positions])
            seen = high
    if len(runs) < 2 or max(len(r[2]) for r in runs) > 4 * fan_in:
        return None
    runs[-1][1] = ngroups - 1
    return [tuple(r) for r in runs]


def _cohorts_pay(x, plan: GroupByPlan) -> bool:
    """Whether ``method=None`` takes cohorts: where one tree's last task would hold every group's states
    over a chunk's extent of the other axes, more than half the largest chunk. Measured on 4 x H200 with a
    721 x 1440 float32 field in chunks of 166 hours (690 MB): the 365 daily maxima of the year (1.5 GB of
    states, 2.2 chunks) took 340-440 ms by cohorts and 1.2-1.4 s by one tree; its 12 monthly means (200 MB,
    0.29 of a chunk) 310-460 ms by one tree and 490-620 ms by cohorts, which run two more tasks a chunk."""
    states = 2 if plan.stat in ("mean", "var", "std") else 1
    wide = max(np.dtype(plan.acc_dtype).itemsize, np.dtype(plan.out_dtype).itemsize)
    lane = math.prod(max(x.chunks[d], default=0) for d in range(x.ndim) if d != plan.axis)  # a task's share
    largest = max(math.prod(max(c, default=0) for c in x.chunks), 1) * x.dtype.itemsize
    return 2 * plan.ngroups * lane * wide * states > largest


def _lazy(x, codes, plan: GroupByPlan, fan_in: int, caller: str, method=None):
    import dask.array as da
    from dask.base import tokenize
    from dask.layers import ArrayValuesDep

    from . import graph, placement

    ax = plan.axis
    if any(isinstance(c, float) and math.isnan(c) for c in x.chunks[ax]):
        raise ValueError(f"{caller}: argument 'x' has unknown chunk sizes along axis {ax}; "
                         "expected known sizes (call x.compute_chunk_sizes() first)")
    token = tokenize(x, codes, plan)
    # each chunk's codes go into its task as a value (a separate task per slice of the codes would be a
    # root task that Dask places anywhere and then moves to the chunk's worker)
    bounds = np.cumsum((0,) + x.chunks[ax])
    codes_by_chunk = ArrayValuesDep((x.chunks[ax],), {(i,): codes[bounds[i]:bounds[i + 1]]
                                                      for i in range(x.numblocks[ax])})
    index = tuple(range(x.ndim))
    grouped = da.blockwise(_pair, index, x, index, codes_by_chunk, (ax,), dtype=x.dtype, meta=x._meta,
                           name=f"groupby-chunks-{token}", align_arrays=False)
    runs = None
    if method == "cohorts" or (method is None and _cohorts_pay(x, plan)):
        runs = cohorts(codes, x.chunks[ax], plan.ngroups, fan_in)
    if method == "cohorts" and runs is None:
        raise ValueError(f"{caller}: argument 'method' is 'cohorts', which needs labels that never fall back "
                         "across chunks (each chunk's groups at or after the previous chunk's), more than one run "
                         f"of groups and runs of at most 4 x split_every = {4 * fan_in} chunks; got labels or "
                         "chunks that give none of that: use method='map-reduce' or None")
    if runs is not None:
        result = graph.cohort_reduction(grouped, plan, fan_in, runs, token)
    else:
        # over persisted chunks, a task per worker makes its chunks' partials where they are held (one task
        # per chunk costs a scheduler round trip each on a GPU worker's single thread)
        result = graph.reduction(grouped, plan, fan_in, placement.grouping_for(grouped, True))
        chunks = tuple((plan.ngroups,) if d == ax else c for d, c in enumerate(result.chunks))
        result = type(result)(result.dask, result.name, chunks, meta=result._meta)
    return da.moveaxis(result, ax, -1)


def groupby_reduce(x, by, func, *, expected_groups=None, axis=-1, skipna=None, ddof=0, min_count=None,
                   fill_value=None, dtype=None, split_every=None, method=None):
    caller = "multireduce.groupby_reduce"
    x, kind = v.as_array(x, caller)
    if x.ndim == 0:
        raise ValueError(f"{caller}: argument 'x' must have at least one dimension; got a 0-d array")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{caller}: argument 'axis' must be an int; got {axis!r}")
    (ax,) = v.normalize_axes(axis, x.ndim, caller)
    n = x.shape[ax]
    if isinstance(n, float) and math.isnan(n):
        raise ValueError(f"{caller}: argument 'x' has an unknown length along axis {ax}; call "
                         "x.compute_chunk_sizes() first")
    # many labels are factorized on the GPU of CuPy data (or of CuPy labels, whose codes then come to the
    # host for NumPy data and for the graph of Dask data)
    device = x.data.device_id if kind == "cupy" else (by.data.device_id if is_cupy_array(by) else None)
    codes, groups = factorize(by, int(n), expected_groups, caller, device=device)
    result = reduce_codes(x, codes, groups.size, func, axis=ax, skipna=skipna, ddof=ddof, min_count=min_count,
                          fill_value=fill_value, dtype=dtype, split_every=split_every, method=method, caller=caller)
    return result, groups


# ------------------------------------------------------------------------------------------------
# Docstring: NumPy style, shared texts from api._PARAMETERS (the group-by ones added there)
# ------------------------------------------------------------------------------------------------
api._PARAMETERS.update({
    "by": """by : 1-D array_like (NumPy or CuPy)
    One label per element along ``axis``: numbers, strings or datetimes. NaN (NaT, None) labels belong
    to no group. A Dask array is refused: the groups shape the result, so compute the labels first.""",
    "groupby_func": """func : str
    "sum", "prod", "mean", "var", "std", "min", "max" and their NaN-skipping forms "nansum" ... "nanmax",
    "count" (of non-NaN elements), "any" or "all".""",
    "expected_groups": """expected_groups : 1-D array_like, optional
    The groups of the result, in this order: labels not in it are dropped, and a group no element falls
    in is filled with ``fill_value``. By default the distinct labels present, sorted.""",
    "groupby_axis": """axis : int, optional
    The axis the labels run along (default -1). The result has it replaced by a last axis of groups.""",
    "skipna": """skipna : bool, optional
    True: skip NaN (as the "nan" forms); False: NaN propagates; None (default): as ``func`` is named.""",
    "groupby_ddof": """ddof : int or float, optional
    var and std: the divisor is ``N - ddof``, N a group's (non-NaN) element count; NaN where that is <= 0.""",
    "min_count": """min_count : int, optional
    sum and prod: a group with fewer non-NaN elements than this gives ``fill_value`` (NaN by default).""",
    "fill_value": """fill_value : number, optional
    The value of a group no element falls in. By default NaN (promoting integer results to float64),
    except count (0), any (False) and all (True).""",
    "groupby_dtype": """dtype : data-type, optional
    The result's dtype (sum, prod, mean, var, std, min, max), of the data's kind or wider. By default,
    NumPy's rule for the function; floating sums and means accumulate in float64 and round once.""",
    "groupby_method": """method : {None, "map-reduce", "cohorts"}, optional
    Dask input only. "map-reduce": every chunk's partial meets the others in one tree, and the result is
    one chunk along the groups. "cohorts": each run of groups is folded from the chunks that hold it alone
    and the result is chunked by those runs (a day that straddles two chunks meets only them); it needs
    labels that never fall back across chunks (times, sorted labels). None (default): "cohorts" where the
    labels allow it and the tree's last task would hold more than half the largest chunk (every group's
    states over the other axes: the daily maxima of a year of a field), else "map-reduce". Both give the
    same bits.""",
})
api.document(groupby_reduce, ("x", "by", "groupby_func", "expected_groups", "groupby_axis", "skipna", "groupby_ddof",
                              "min_count", "fill_value", "groupby_dtype", "split_every", "groupby_method"),
             """(result, groups) : tuple
    result: ``x``'s array type (lazy for Dask) with ``axis`` replaced by a last axis, one entry per group;
    groups: the labels of that axis (NumPy).""",
             summary="""One reduction per group of labels along an axis, as ``flox.groupby_reduce`` with one ``by``.

Groups may straddle Dask chunks and labels need not be sorted; NumPy input is reduced now on the CPU, CuPy
input on its GPU, and Dask input gives a lazy array of the same chunk type.""",
             examples="""
>>> import numpy as np, dask.array as da, multireduce as mr
>>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
>>> mr.groupby_reduce(x, np.array([0, 1, 0, 1, 2, 2]), "sum")
(array([ 4.,  6., 11.]), array([0, 1, 2]))
>>> means, groups = mr.groupby_reduce(da.from_array(x, chunks=4), np.array([0, 1, 0, 1, 2, 2]), "mean")
>>> means.compute()  # groups straddle the chunks
array([2. , 3. , 5.5])""")
