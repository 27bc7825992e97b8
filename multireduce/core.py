"""Reduction and scan plans: the per-chunk contract shared by the eager path and the Dask graph.

A reduction is ``partial`` (a group of chunks -> one ``Partial``), ``combine`` (partials -> one, in
order) and ``finalize`` (the last partial -> the result). A partial carries its element count beside
its value, so ``mean`` and NumPy's "min of nothing is an error" work even where chunk sizes are only
known at run time.

A scan is ``totals`` (each chunk's reduction along the axis), ``carries`` (an exclusive scan of the
totals) and ``scan_block`` (each chunk scanned, seeded with its carry). The plans are frozen,
picklable and tokenizable, so Dask keys are deterministic and the tasks can run on any worker; each
method dispatches on the chunk type, so CuPy chunks stay on their GPU.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .backends import backend_for
from .dtypes import NARROW_FLOATS, division_dtype
from .errors import gpu_memory_guard
from .operators import Operator


def empty_error(op: Operator) -> str:
    """NumPy's own words for a min/max of nothing, so code that catches NumPy's error catches ours."""
    ufunc = {"min": "minimum", "max": "maximum", "nanmin": "fmin", "nanmax": "fmax"}[op.name]
    return f"zero-size array to reduction operation {ufunc} which has no identity"


@dataclass(frozen=True)
class Partial:
    """A partial reduction: ``value`` keeps the reduced axes (size 1); ``count`` elements went into each."""

    value: object
    count: int


@dataclass(frozen=True)
class ReductionPlan:
    """How one reduction is computed, whatever the data: the Dask graph's per-chunk contract, and
    (``__call__``) the eager reduction of one array. Plans compare and hash by their fields; the
    operator compares by identity, so a plan never outlives a re-registered operator of the same name."""

    op: Operator
    axes: tuple[int, ...]
    acc_dtype: np.dtype
    out_dtype: np.dtype
    keepdims: bool
    mean: bool = False
    algorithm: str = "auto"
    label: str = "reduce"

    def _chunk(self, block) -> Partial:
        backend = backend_for(block)
        with gpu_memory_guard(block, f"{self.label} of a chunk"):
            value = backend.reduce(block, self.op, self.axes, self.acc_dtype, self.algorithm)
        return Partial(value, math.prod(block.shape[a] for a in self.axes))

    def partial(self, *blocks) -> Partial:
        """Reduce a group of chunks (in order) to one partial."""
        return self.combine(*(self._chunk(b) for b in blocks))

    def combine(self, *partials: Partial) -> Partial:
        if len(partials) == 1:
            return partials[0]
        values = [p.value for p in partials]
        value = backend_for(values[0]).combine(self.op.partials, values)
        return Partial(value, sum(p.count for p in partials))

    @property
    def folds_left(self) -> bool:
        """Whether ``combine`` of fewer than 64 partials folds them one after another, left to right (NumPy's
        ufunc loop; the column kernel, whose columns take one thread each below 64 rows): then a leading
        run of a group combined first, and the rest combined with it, gives the group's own bits. An
        operator without a ufunc folds NumPy partials pairwise, and does not."""
        return self.op.partials.ufunc is not None

    def sums_narrow_floats_in_float64(self, dtype) -> bool:
        """Whether this plan's partials of ``dtype`` chunks are float64 sums of float16/float32 values
        (sum, mean, nansum in float64): exact, so foldable in any order, where ``dtypes.exact_in_any_order``."""
        return (type(self) is ReductionPlan and self.op.name in ("sum", "nansum") and self.algorithm == "auto"
                and np.dtype(self.acc_dtype) == np.float64 and np.dtype(dtype) in NARROW_FLOATS)

    def finalize(self, partial: Partial):
        value = partial.value
        if partial.count == 0 and self.op.empty_is_error:
            raise ValueError(empty_error(self.op))
        divisor = None
        if self.mean:
            if partial.count == 0:
                warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=2)
            # as numpy.mean, cast back unsafely; an empty mean divides by NaN, which gives NaN without
            # numpy's divide-by-zero warning
            divisor = division_dtype(self.acc_dtype).type(partial.count or np.nan)
        if not self.keepdims:
            value = value.squeeze(axis=self.axes)
        finish = getattr(backend_for(value), "finish", None)
        if finish is not None:  # the GPU's, prebuilt: CuPy's divide and astype would compile at first use
            return finish(value, divisor, self.out_dtype)
        if divisor is not None:
            value = value / divisor
        return value.astype(self.out_dtype, copy=False)

    def aggregate(self, *partials: Partial):
        """The last stage in one task: combine the partials and finalize."""
        return self.finalize(self.combine(*partials))

    def whole(self, *blocks):
        """A single group's chunks straight to the result: one task instead of two."""
        return self.finalize(self.partial(*blocks))

    # -- eager: the plan bound to the backend (and, on a GPU, the device) it runs on --------------
    def __post_init__(self):
        object.__setattr__(self, "_launchers", {})

    def __getstate__(self):
        # a binding holds loaded kernels and device workspace: each process binds its own
        return {k: v for k, v in self.__dict__.items() if k != "_launchers"}

    def __setstate__(self, state):
        self.__dict__.update(state, _launchers={})

    def launch(self, x):
        """All of ``x`` (whose every axis this plan reduces: the caller checks) reduced to this plan's
        result in one step, or None where the general path is needed: the backend's launcher declines
        (empty or non-contiguous input, data on another GPU than the current one), or the plan is not a
        plain whole-array reduction. Bound once per (array type, dtype); a launcher binds to each device
        once."""
        key = (type(x), x.dtype)
        launcher = self._launchers.get(key)
        if launcher is None:
            launcher = self._launchers[key] = self._bind(x)
        return launcher(x) if launcher else None

    def _bind(self, x):
        bind = getattr(backend_for(x), "bind", None)
        if bind is None or self.keepdims or self.algorithm != "auto":
            return False
        return bind(self.op, x.dtype, self.acc_dtype, self.out_dtype, mean=self.mean) or False

    def __call__(self, x):
        """Reduce one array now: the bound launcher where it takes ``x``, else partial -> finalize."""
        value = self.launch(x) if len(self.axes) == x.ndim else None
        return self.finalize(self.partial(x)) if value is None else value

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("multireduce.ReductionPlan", tokenize(self.op), self.axes, str(self.acc_dtype),
                str(self.out_dtype), self.keepdims, self.mean, self.algorithm)


def carry_of(carries, axis: int, index: int):
    """What chunk ``index`` of a lane starts from: entry ``index - 1`` of a plan's ``carries`` along
    ``axis``, kept as a slice of length 1; None for chunk 0 or no carries."""
    if carries is None or index <= 0:
        return None
    return carries[(slice(None),) * axis + (slice(index - 1, index),)]


@dataclass(frozen=True)
class ScanPlan:
    op: Operator
    axis: int
    acc_dtype: np.dtype
    out_dtype: np.dtype
    inclusive: bool = True
    algorithm: str = "auto"
    label: str = "scan"
    #: the carries are one vectorized scan: each scan task may fold the few groups' totals itself
    carries_are_cheap: ClassVar[bool] = True

    def totals(self, *blocks):
        """Each chunk's total along the axis, concatenated along the axis (one entry per chunk)."""
        backend = backend_for(blocks[0])
        parts = [backend.reduce(b, self.op, (self.axis,), self.acc_dtype, self.algorithm) for b in blocks]
        return parts[0] if len(parts) == 1 else backend.concatenate(parts, axis=self.axis)

    def carries(self, *totals):
        """Inclusive scan of the totals of chunks 0..n-2: entry k-1 is what chunk k's scan starts from.

        The last chunk's total is never needed, so the graph does not read that chunk twice.
        """
        backend = backend_for(totals[0])
        stacked = totals[0] if len(totals) == 1 else backend.concatenate(list(totals), axis=self.axis)
        # totals are partial results: folded as they are (a NaN total of nancumsum stays NaN)
        return backend.scan(stacked, self.op.partials, self.axis, self.acc_dtype, self.acc_dtype)

    def scan_block(self, block, carries=None, index: int = 0):
        """Scan chunk ``index`` of its lane; ``carries`` comes from ``carries`` (None for chunk 0)."""
        backend = backend_for(block)
        carry = carry_of(carries, self.axis, index)
        with gpu_memory_guard(block, f"{self.label} of a chunk"):
            return backend.scan(block, self.op, self.axis, self.acc_dtype, self.out_dtype, carry,
                                self.inclusive, self.algorithm)

    def __call__(self, x):
        return self.scan_block(x)

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("multireduce.ScanPlan", tokenize(self.op), self.axis, str(self.acc_dtype),
                str(self.out_dtype), self.inclusive, self.algorithm)
