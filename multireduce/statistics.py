"""argmin/argmax, var/std, the NaN-skipping family and any/all/count_nonzero over NumPy, CuPy and Dask.

Each function is one ``StatPlan`` run through the same contract as the other reductions: ``partial``
(a group of chunks -> a small host partial), ``combine`` (partials -> one), ``aggregate``/``whole``
(-> the result). NumPy and CuPy input run the plan on the whole array now; Dask input builds the graph
with ``graph.reduction`` (one partial per worker for persisted data). Partials carry state, not
values:

* argmin/argmax: (value, global index); a chunk knows where it lies, so the index is the position in
  the whole array; equal values keep the lower index, the first NaN wins (NumPy), and the merge is
  order-free.
* var/std/nanvar/nanstd/nanmean: (count, anchor + offset = mean, M2) in float64, two passes inside a chunk and Chan's
  pairwise update between chunks. Relative error stays within ``VAR_BOUND`` of an exact reference for
  data with a mean up to 1e8 times the spread, for every chunking (tests/test_statistics.py), at
  least as good as NumPy's own two-pass var in the input's dtype.
* nanmin/nanmax (Dask input): (NaN-skipping extreme, count); any/all: a bool; count_nonzero: an int64 count.

Complex input: var/std/nanvar/nanstd/nanmean run the same moments with a complex mean and M2 = sum |x - mean|^2
(NumPy's rule; the GPU kernels have no complex type, so CuPy chunks use the array-API code of numpy_stats);
argmin/argmax and the NaN-as-identity family refuse complex with a TypeError naming ``x``.

nansum/nanprod/nancumsum/nancumprod run the built-in operators of the same names (``operators.py``), whose
kernels read NaN as the identity as they load each element (one pass; NumPy input: ``Operator.load``);
so do nanmin/nanmax on NumPy and CuPy input (Dask input: the (extreme, count) partials above).

On the GPU every statistic here is one read of the data (``kernels/stats.cuh``, launched by
``backends/cupy_stats``): whole arrays, trailing axes (rows) and leading or middle axes (columns) in
place; reduced axes that are not one run, and views whose reduced part is not contiguous, are copied
first (said in cupy_stats). For CuPy input the final values stay on the GPU; the host waits only where
a NumPy warning or error depends on the data (nanarg* of an all-NaN slice, the NaN-skipping counts of
nanvar/nanstd/nanmean, nanmin/nanmax of an all-NaN slice).

``mean`` shares nothing with the moments: it is ``sum`` / count (the sum kernels, NumPy's dtype rules,
``exact=`` possible), and a mean computed beside a var would need an API that returns both (out of
scope). ``nanmean`` does share them: it needs the non-NaN count per slice, which the moments State
carries, so it is the var kernel with the mean as its final value.
"""

from __future__ import annotations

import builtins
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import _validation as v
from . import api
from . import exact as _exact
from . import dtypes as _dt
from .operators import get_operator
from .backends import Later, finish_later, is_cupy_array, numpy_stats, on_device_of

# float64 partials: the relative error of var against an exact reference on 1e8 + N(0, 1) data is a
# few hundred ulps at most (mean rounding in each chunk, one rounding per Chan merge level)
VAR_BOUND = 1e-11

_ARG = ("argmax", "argmin", "nanargmax", "nanargmin")
_MOMENTS = ("var", "std", "nanvar", "nanstd", "nanmean")


@dataclass(frozen=True)
class _Commutative:
    """What ``graph.reduction`` asks of a plan's operator: every merge here is order-free."""

    commutative: bool = True


@dataclass(frozen=True)
class Located:
    """A chunk and where it starts in the whole array (argmin/argmax need global positions)."""

    block: object
    offsets: tuple


def _locate(block, block_info=None):
    return Located(block, tuple(start for start, _ in block_info[0]["array-location"]))


def _backend(block):
    if is_cupy_array(block):
        from .backends import cupy_stats

        return cupy_stats
    return numpy_stats


# (statistic, steps, dtype) whose generated policy failed to build: the steps run apart, not tried again
_REFUSED: set = set()


def _refused(plan, dtype) -> bool:
    return (plan.stat, plan.steps, np.dtype(dtype)) in _REFUSED


def _refuse(plan, dtype, error) -> None:
    key = (plan.stat, plan.steps, np.dtype(dtype))
    if key not in _REFUSED:
        _REFUSED.add(key)
        warnings.warn(f"multireduce: the {plan.stat} kernels reading through elementwise steps failed to build; "
                      f"the steps run as CuPy kernels instead. Set multireduce.fuse-elementwise to False to skip "
                      f"them. {error}", RuntimeWarning, stacklevel=4)


@dataclass(frozen=True)
class StatPlan:
    stat: str
    axes: tuple
    keepdims: bool
    out_dtype: np.dtype
    ddof: float = 0.0
    shape: tuple = ()  # the whole array's shape (argmin/argmax over every axis)
    gpu: bool = False  # CuPy input: the result goes back to the GPU
    skipnan: bool = False  # a nan-statistic of floating input (integers have no NaN: NumPy's plain rules)
    steps: object = None  # fusion.Steps each element is read through (``fusion.fused_statistic``), or None
    op: ClassVar[_Commutative] = _Commutative()

    @property
    def label(self) -> str:
        return self.stat

    @property
    def _largest(self) -> bool:
        return self.stat.endswith("max")

    # -- per chunk --------------------------------------------------------------------------------
    def _chunk(self, block):
        if isinstance(block, Located):
            block, offsets = block.block, block.offsets
        else:
            offsets = (0,) * block.ndim
        be = _backend(block)
        steps = self.steps
        if steps is not None and (not getattr(be, "READS_STEPS", False) or not steps.read_in_kernels(block.dtype)
                                  or _refused(self, block.dtype)):
            # the steps first, as the graph would; also where the chunk is not of the dtype the steps were
            # read for (the graph does not say it: abs(x) of float32 may read complex64 chunks)
            block, steps = steps.evaluate(block), None
        if steps is not None:
            from .kernels import KernelError

            try:
                return self._chunk_of(be, block, offsets, steps)
            except KernelError as error:  # the generated policy did not build: the steps run apart
                _refuse(self, block.dtype, error)
                block = steps.evaluate(block)
        return self._chunk_of(be, block, offsets, None)

    def _chunk_of(self, be, block, offsets, steps):
        through = {} if steps is None else {"steps": steps}
        if self.stat in _ARG:
            return be.arg_chunk(block, self.axes, self._largest, self.stat.startswith("nan"), offsets, self.shape,
                                **through)
        if self.stat in _MOMENTS:
            return be.moments_chunk(block, self.axes, self.stat.startswith("nan"), **through)
        if self.stat in ("nanmin", "nanmax"):
            return be.extreme_chunk(block, self.axes, self._largest, **through)
        if steps is not None:
            block = steps.evaluate(block)  # not read through by the kernels (fusion.STATISTICS_READING_STEPS)
        if self.stat in ("any", "all"):
            return be.truth_chunk(block, self.axes, self.stat == "all")
        return be.count_chunk(block, self.axes)

    def _merge(self, left, right, lead: int = 0):
        """``left`` and ``right`` merged; ``lead``: leading axes that index stacked partials (only the
        extremes' merge looks at a partial as a whole, the others are elementwise)."""
        if self.stat in _ARG:
            return numpy_stats.arg_merge(left, right, self._largest)
        if self.stat in _MOMENTS:
            return numpy_stats.moments_merge(left, right)
        if self.stat in ("nanmin", "nanmax"):
            return numpy_stats.extreme_merge(left, right, self._largest, lead)
        if self.stat in ("any", "all"):
            return numpy_stats.truth_merge(left, right, self.stat == "all")
        return numpy_stats.count_merge(left, right)

    # -- the graph contract -------------------------------------------------------------------------
    def partial(self, *blocks):
        """One chunk's partial may be a ``backends.Later`` (asked for with ``backends.partials_later``: the
        caller finishes it); several chunks' are merged here, so they are finished first."""
        parts = [self._chunk(b) for b in blocks]
        return parts[0] if len(parts) == 1 else self.combine(*parts)

    def combine(self, *partials):
        # a balanced pairwise tree: each merge level adds one rounding to the moments
        partials = finish_later(list(partials))
        if len(partials) == 1:
            return partials[0]
        if len(partials) > 2:
            stacked = _stacked(partials, self.stat in _ARG)
            if stacked is not None:
                return self._combine_stacked(stacked)
        return self._combine_pairwise(partials)

    def _combine_pairwise(self, partials):
        level = list(partials)
        while len(level) > 1:
            nxt = [self._merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]

    def _combine_stacked(self, stacked, axis: int = 0):
        """``_combine_pairwise``'s tree over partials stacked along ``axis`` (0, or 1 for several groups
        stacked along axis 0): each level's merges as one merge of the even-placed partials with the
        odd-placed ones. The merges are elementwise, so each element sees the same operations; a level of
        64 partials costs one merge, not 32. Returns the merged partial (its members lose ``axis``)."""
        lead = (slice(None),) * axis
        n = stacked[0].shape[axis]
        while n > 1:
            left = tuple(a[(*lead, slice(0, n - 1, 2))] for a in stacked)
            right = tuple(a[(*lead, slice(1, n, 2))] for a in stacked)
            merged = self._merge(left, right, axis + 1)
            if n % 2:
                merged = tuple(np.concatenate([m, a[(*lead, slice(n - 1, n))]], axis=axis)
                               for m, a in zip(merged, stacked))
            stacked, n = merged, (n + 1) // 2
        return tuple(a[(*lead, 0)] for a in stacked)

    def combine_groups(self, partials: list, size: int) -> list:
        """``[self.combine(*partials[j : j + size]) for j in range(0, len(partials), size)]`` (a level of
        ``graph.fold_in_order``'s tree), the full groups' trees merged together, level by level."""
        full = len(partials) // size * size
        stacked = _stacked(partials[:full], self.stat in _ARG) if full and size > 1 else None
        if stacked is None:
            return [self.combine(*partials[j : j + size]) for j in range(0, len(partials), size)]
        groups = tuple(a.reshape(full // size, size, *a.shape[1:]) for a in stacked)
        merged = self._combine_stacked(groups, axis=1)
        out = [tuple(m[i] for m in merged) for i in range(full // size)]
        if full < len(partials):
            out.append(self.combine(*partials[full:]))
        return out

    def finalize(self, partial):
        if type(partial) is Later:
            partial = finish_later([partial])[0]
        stat = self.stat
        if stat in _ARG:
            value = _finish_arg(stat, partial)
        elif stat in _MOMENTS:
            value = _finish_moments(stat, partial, self.ddof, self.skipnan)
        elif stat in ("nanmin", "nanmax"):
            value, count = partial
            if count.size and not count.any():
                raise ValueError(f"zero-size array to reduction operation {'fmax' if self._largest else 'fmin'} "
                                 "which has no identity")
            if value.dtype.kind == "f" and np.isnan(value).any():
                warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
        else:
            value = partial[0]
        if not self.keepdims:
            value = value.reshape(tuple(s for d, s in enumerate(value.shape) if d not in self.axes))
        value = np.asarray(value).astype(self.out_dtype, copy=False)
        if self.gpu:
            import cupy

            return cupy.asarray(value)
        return value

    def aggregate(self, *partials):
        return self.finalize(self.combine(*partials))

    def whole(self, *blocks):
        return self.finalize(self.partial(*blocks))

    def __dask_tokenize__(self):
        return ("multireduce.StatPlan", self.stat, self.axes, self.keepdims, str(self.out_dtype), self.ddof,
                self.shape, self.gpu, self.skipnan, repr(self.steps))


def _stacked(partials, arg: bool):
    """``numpy_stats.stack_partials`` of ``partials``, an argmin/argmax GPU pair (value, index) given the
    ``seen`` its merge would give it (index >= 0) first."""
    if arg:
        partials = [p if len(p) == 3 else (*p, p[1] >= 0) for p in partials]
    return numpy_stats.stack_partials(partials)


def _finish_arg(stat, partial):
    index = partial[1]
    if (index < 0).any():  # a (value, index) GPU partial marks an all-NaN slice so; empty input raised earlier
        if stat.startswith("nan"):
            raise ValueError("All-NaN slice encountered")
        raise ValueError(f"attempt to get {stat} of an empty sequence")
    if len(partial) == 3 and not partial[2].all():
        raise ValueError("All-NaN slice encountered")
    return index


# NumPy's texts: var/std warn without the full stop, nanvar/nanstd with it
_DOF_WARNING = {False: "Degrees of freedom <= 0 for slice", True: "Degrees of freedom <= 0 for slice."}


def _finish_moments(stat, partial, ddof, skipnan):
    """``skipnan``: NaN-skipping statistic of floating input (integer input follows var and mean, as
    NumPy's nanvar/nanmean hand it to them)."""
    count, m2 = partial[0], partial[3]
    if stat == "nanmean":
        if (count == 0).any():
            warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=4)
        return numpy_stats.moments_mean(partial)
    dof = count - ddof
    short = dof <= 0
    if short.any():
        warnings.warn(_DOF_WARNING[skipnan], RuntimeWarning, stacklevel=4)
    if skipnan:  # np.nanvar: NaN wherever dof <= 0, whatever M2 is
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.where(short, np.nan, m2 / np.where(short, 1.0, dof))
    else:
        # np.var: M2 / max(count - ddof, 0), under the caller's errstate as NumPy divides (0/0 = NaN, M2/0 =
        # inf); an empty slice has M2 = 0, so ddof < 0 gives 0 there as in NumPy
        var = m2 / np.maximum(dof, 0.0)
    return np.sqrt(var) if stat.endswith("std") else var


# ------------------------------------------------------------------------------------------------
# Running a plan
# ------------------------------------------------------------------------------------------------
def _known_chunks(x, caller):
    if builtins.any(isinstance(c, float) and math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(f"{caller}: argument 'x' has unknown chunk sizes; expected known sizes (call "
                         "x.compute_chunk_sizes() first)")


_whole_launchers: dict = {}  # (statistic, array type, dtype) -> cupy_stats.WholeLauncher, or False


def _whole_on_gpu(stat, x, kinds, ddof=0.0):
    """The fast path of ``stat`` over all of ``x`` with the default arguments: a CuPy array of a dtype
    the kernels take, C-contiguous, non-empty and on the current GPU, reduced by the bound kernels with
    no validation beyond the type (which is what the general path would check and then launch); else
    None. Small statistics spend more host time in the general path than the GPU spends at 2^26."""
    try:
        launcher = _whole_launchers.get((stat, type(x), x.dtype))
    except (AttributeError, TypeError):  # not an array: the general path names it
        return None
    if launcher is None:
        launcher = _whole_launchers[(stat, type(x), x.dtype)] = _whole_launcher(stat, x, kinds)
    return launcher(x, ddof) if launcher else None


def _whole_launcher(stat, x, kinds):
    if not is_cupy_array(x) or x.dtype.kind not in kinds:
        return False
    from .backends import cupy_stats

    return cupy_stats.WholeLauncher(stat, x.dtype) if x.dtype in _dt.CUDA_TYPE_NAMES else False


def _run(x, kind, plan, split_every, caller):
    if kind.startswith("dask"):
        from . import direct, fusion, graph, placement  # dask loads on the first dask input only

        found = fusion.fused_statistic(x, plan)
        if found is not None:  # elementwise steps at the top of x, read by the kernels as they load
            x, plan = found
        fan = v.fan_in(split_every, plan.axes, caller)
        if plan.stat not in _ARG:
            # a statistic of held chunks: .compute() folds the chunks' partials where they are
            held = direct.held_result(x, plan, fan)
            if held is not None:
                return held
        if plan.stat in _ARG:
            def located_graph(token=None, groups_of_x=None):
                located = x.map_blocks(_locate, dtype=x.dtype, meta=x._meta, name=f"{plan.stat}-locate-{x.name}")
                # located chunks are made where x's are (one task per worker holding them), or a few per
                # worker thread for a lazy x
                return graph.reduction(located, plan, fan, placement.grouping_for(located, True), token=token)

            held = direct.held_result(x, plan, fan, build=located_graph, located=Located)
            return held if held is not None else located_graph()
        return graph.reduction(x, plan, fan, placement.grouping_for(x, True))
    if kind == "cupy":
        import cupy

        from .backends import cupy_stats

        with cupy.cuda.Device(x.data.device_id):
            if cupy_stats.handles(x, plan.stat):
                return _gpu_whole(plan, x, cupy_stats)
            return plan.whole(x)
    result = plan.whole(x)
    return result[()] if result.ndim == 0 else result


def _gpu_whole(plan, x, cupy_stats):
    """A CuPy array: the kernels' final values stay on the GPU; the host waits for them only where a
    NumPy warning or error depends on the data (an all-NaN slice, a NaN-skipping count), and for a whole
    nanmean/nanvar/nanstd not even there when a probe of a few elements finds enough numbers first."""
    stat, axes = plan.stat, plan.axes
    floating = x.dtype.kind == "f"
    if np.dtype(plan.out_dtype) != cupy_stats.result_dtype(stat, x.dtype) and stat in _MOMENTS:
        return plan.whole(x)  # var(x, dtype=...): the float64 moments (kernel States) finished on the host
    counted = stat in _MOMENTS and stat.startswith("nan") and floating

    def run():
        return cupy_stats.run(x, stat, axes, states=counted, result=True, ddof=plan.ddof)

    (states, result), (_, numbers) = _probed(x, axes, run) if counted else (run(), (0, 0))
    if stat in _ARG and stat.startswith("nan") and floating and bool((_small_on_host(result) < 0).any()):
        raise ValueError("All-NaN slice encountered")
    if stat in _MOMENTS:
        if counted and numbers > (0 if stat == "nanmean" else plan.ddof):
            short = False  # enough numbers sampled: no slice is short of them, no need to wait for the count
        elif counted:
            count = _small_on_host(states.view(np.float64).reshape(-1, 4)[:, 0])
            short = bool((count == 0).any() if stat == "nanmean" else (count - plan.ddof <= 0).any())
        else:
            count = math.prod(x.shape[a] for a in axes)
            short = stat != "nanmean" and count - plan.ddof <= 0
        if short:
            warnings.warn("Mean of empty slice" if stat == "nanmean" else _DOF_WARNING[plan.skipnan],
                          RuntimeWarning, stacklevel=5)
    if stat in ("nanmin", "nanmax") and floating and bool(np.isnan(_small_on_host(result)).any()):
        warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=5)
    kept = tuple(1 if d in axes else s for d, s in enumerate(x.shape)) if plan.keepdims else \
        tuple(s for d, s in enumerate(x.shape) if d not in axes)
    return result.reshape(kept).astype(plan.out_dtype, copy=False)


def _prepare(x, caller, kinds):
    x, kind = v.as_array(x, caller)
    v.check_dtype(x.dtype, kinds, caller)
    return x, kind


# ------------------------------------------------------------------------------------------------
# argmin / argmax
# ------------------------------------------------------------------------------------------------
def _arg(stat, x, axis, keepdims, split_every):
    if axis is None and keepdims is False and split_every is None and not stat.startswith("nan"):
        result = _whole_on_gpu(stat, x, "biuf")
        if result is not None:
            return result
    caller = f"multireduce.{stat}"
    x, kind = _prepare(x, caller, "biuf")
    axes = _arg_axes(x, axis, caller)
    keepdims = v.check_flag(keepdims, "keepdims", caller)
    v.fan_in(split_every, axes, caller)  # checked on every input kind, as the other entry points do
    if axis is None and x.ndim and v.known_empty(x, axes) or axis is not None and x.shape[axes[0]] == 0:
        raise ValueError(f"attempt to get {stat} of an empty sequence")
    if kind.startswith("dask"):
        _known_chunks(x, caller)
    shape = tuple(int(s) for s in x.shape)
    plan = StatPlan(stat, axes, keepdims, np.dtype(np.intp), shape=shape, gpu="cupy" in kind)
    return _run(x, kind, plan, split_every, caller)


def _arg_axes(x, axis, caller):
    if axis is not None and (isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral)):
        raise TypeError(f"{caller}: argument 'axis' must be None or an int; got {axis!r}")
    return v.normalize_axes(axis, x.ndim, caller)


def _arg_into(stat, x, axis, keepdims, split_every, out):
    """``out=``: checked (NumPy's rule: a dtype that casts safely to intp) before the search runs."""
    caller = f"multireduce.{stat}"
    x, kind = _prepare(x, caller, "biuf")
    shape = v.reduced_shape(x.shape, _arg_axes(x, axis, caller), v.check_flag(keepdims, "keepdims", caller))
    v.check_out(out, kind, x, shape, np.intp, caller, "index")
    return api._into(out, _arg(stat, x, axis, keepdims, split_every), kind, x)


def argmax(x, axis=None, keepdims=False, *, out=None, split_every=None, **unknown):
    """Index of the largest element, as ``numpy.argmax``: the flat index for ``axis=None``, the first
    occurrence on ties, the first NaN if there is one; an empty slice raises ValueError."""
    if unknown:
        raise v.unknown_keywords(argmax, unknown)
    if out is not None:
        return _arg_into("argmax", x, axis, keepdims, split_every, out)
    return _arg("argmax", x, axis, keepdims, split_every)


def argmin(x, axis=None, keepdims=False, *, out=None, split_every=None, **unknown):
    """Index of the smallest element, as ``numpy.argmin`` (first occurrence, first NaN wins)."""
    if unknown:
        raise v.unknown_keywords(argmin, unknown)
    if out is not None:
        return _arg_into("argmin", x, axis, keepdims, split_every, out)
    return _arg("argmin", x, axis, keepdims, split_every)


def nanargmax(x, axis=None, keepdims=False, *, out=None, split_every=None, **unknown):
    """``numpy.nanargmax``: NaNs ignored; an all-NaN slice raises ValueError."""
    if unknown:
        raise v.unknown_keywords(nanargmax, unknown)
    if out is not None:
        return _arg_into("nanargmax", x, axis, keepdims, split_every, out)
    return _arg("nanargmax", x, axis, keepdims, split_every)


def nanargmin(x, axis=None, keepdims=False, *, out=None, split_every=None, **unknown):
    """``numpy.nanargmin``: NaNs ignored; an all-NaN slice raises ValueError."""
    if unknown:
        raise v.unknown_keywords(nanargmin, unknown)
    if out is not None:
        return _arg_into("nanargmin", x, axis, keepdims, split_every, out)
    return _arg("nanargmin", x, axis, keepdims, split_every)


# ------------------------------------------------------------------------------------------------
# moments
# ------------------------------------------------------------------------------------------------
def _moment(stat, x, axis, dtype, ddof, keepdims, split_every):
    if (axis is None and dtype is None and keepdims is False and split_every is None and stat in ("var", "std")
            and (type(ddof) is int and -(1 << 53) < ddof or type(ddof) is float and math.isfinite(ddof))
            and getattr(x, "size", 0) - ddof > 0):
        result = _whole_on_gpu(stat, x, "biuf", float(ddof))  # count - ddof > 0: no warning to give
        if result is not None:
            return result
    caller = f"multireduce.{stat}"
    x, kind, axes, keepdims, out = _moment_args(stat, x, axis, dtype, ddof, keepdims, split_every, caller)
    plan = StatPlan(stat, axes, keepdims, out, ddof=float(ddof), gpu="cupy" in kind,
                    skipnan=stat.startswith("nan") and x.dtype.kind in "fc")
    return _run(x, kind, plan, split_every, caller)


def _moment_args(stat, x, axis, dtype, ddof, keepdims, split_every, caller):
    """(x as an array, its kind, the axes, keepdims, the result dtype), every argument checked."""
    x, kind = _prepare(x, caller, "biufc")
    # NumPy: a complex var is real (|x - mean|^2), a complex nanmean complex; integers give float64
    requested = v.requested_dtype(dtype, "fc" if stat == "nanmean" else "f", caller)
    if isinstance(ddof, (bool, np.bool_)) or not isinstance(ddof, numbers.Real) or not math.isfinite(ddof):
        raise TypeError(f"{caller}: argument 'ddof' must be a finite real number; got {ddof!r}")
    axes = v.normalize_axes(axis, x.ndim, caller)
    keepdims = v.check_flag(keepdims, "keepdims", caller)
    v.fan_in(split_every, axes, caller)
    if x.dtype.kind == "c":
        out = requested or (x.dtype if stat == "nanmean" else np.empty(0, x.dtype).real.dtype)
    else:
        out = requested or (x.dtype if x.dtype.kind == "f" else np.dtype(np.float64))
    return x, kind, axes, keepdims, np.dtype(out)


def _keyword_moment(stat, x, axis, dtype, ddof, keepdims, split_every, where, out):
    """var, std, nanvar, nanstd and nanmean with NumPy's ``where=`` and ``out=``, every argument checked
    first. With a mask: the mean of the elements where it is True (and, for the NaN-skipping forms of
    inexact input, not NaN) over their count, then the sum of their squared deviations from it (two
    passes, as NumPy's own var; float64 throughout), finished by NumPy's rules for that statistic."""
    caller = f"multireduce.{stat}"
    x, kind, axes, keep, out_dtype = _moment_args(stat, x, axis, dtype, ddof, keepdims, split_every, caller)
    mask = v.where_mask(where, x, kind, caller)
    skipnan = stat.startswith("nan") and x.dtype.kind in "fc"
    casting = "inexact" if skipnan else "same_kind" if stat.endswith("std") else "unsafe"
    v.check_out(out, kind, x, v.reduced_shape(x.shape, axes, keep), out_dtype, caller, casting)
    if mask is None:
        result = nanmean(x, axis, dtype, keepdims, split_every=split_every) if stat == "nanmean" else \
            _moment(stat, x, axis, dtype, ddof, keepdims, split_every)
        return api._into(out, result, kind, x)
    if skipnan:
        mask = api._not_nan(x, mask, kind)
    if stat == "nanmean":
        result = api._keyword_mean(x, kind, mask, axes, dtype, keep, split_every, "auto", caller,
                                   "Mean of empty slice." if x.dtype.kind not in "fc" else "Mean of empty slice")
        return api._into(out, result, kind, x)
    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    total, count = api._total_and_count(wide, kind, mask, axes, wide.dtype, True, split_every, "auto", caller)
    with np.errstate(invalid="ignore", divide="ignore"):
        deviation = api._masked(wide - total / count, kind, mask, wide.dtype.type(0))
    squares = (deviation * deviation.conj()).real if x.dtype.kind == "c" else deviation * deviation
    m2 = api._reduction(squares, "sum", axes, None, True, split_every, "auto", caller=caller)
    if kind.startswith("dask"):
        import dask.array as da

        result = da.map_blocks(_masked_moments_of, count.rechunk(m2.chunks), m2, stat, float(ddof), skipnan, out_dtype,
                               dtype=out_dtype)
    else:
        result = _masked_moments_of(count, m2, stat, float(ddof), skipnan, out_dtype)
    if not keep:
        result = result.squeeze(axis=axes)
    if kind == "numpy" and result.ndim == 0:
        result = result[()]
    return api._into(out, result, kind, x)


def _masked_moments_of(count, m2, stat, ddof, skipnan, dtype):
    """var or std from a masked slice's count and sum of squared deviations, as ``_finish_moments``."""
    return _finish_moments(stat, (count, None, None, m2), ddof, skipnan).astype(dtype)


def _moments_called(fn, x, axis, dtype, ddof, keepdims, split_every, out, where, correction, unknown):
    """var, std, nanvar and nanstd as called: NumPy's keywords, where given, take the masked path."""
    if unknown:
        raise v.unknown_keywords(fn, unknown)
    stat = fn.__name__
    if correction is not None:
        ddof = v.ddof_or_correction(ddof, correction, f"multireduce.{stat}")
    if where is not True or out is not None:
        return _keyword_moment(stat, x, axis, dtype, ddof, keepdims, split_every, where, out)
    return _moment(stat, x, axis, dtype, ddof, keepdims, split_every)


def var(x, axis=None, dtype=None, ddof=0, keepdims=False, *, out=None, where=True, correction=None,
        split_every=None, **unknown):
    """Variance, as ``numpy.var`` (integers give float64), in one pass over the data: each chunk's
    (count, mean, M2) merged with Chan's formula. ``ddof`` >= count warns and gives inf/NaN as NumPy."""
    return _moments_called(var, x, axis, dtype, ddof, keepdims, split_every, out, where, correction, unknown)


def std(x, axis=None, dtype=None, ddof=0, keepdims=False, *, out=None, where=True, correction=None,
        split_every=None, **unknown):
    """Standard deviation, as ``numpy.std``: the square root of ``var``."""
    return _moments_called(std, x, axis, dtype, ddof, keepdims, split_every, out, where, correction, unknown)


def nanvar(x, axis=None, dtype=None, ddof=0, keepdims=False, *, out=None, where=True, correction=None,
           split_every=None, **unknown):
    """``numpy.nanvar``: NaNs do not count; an all-NaN slice warns and gives NaN."""
    return _moments_called(nanvar, x, axis, dtype, ddof, keepdims, split_every, out, where, correction, unknown)


def nanstd(x, axis=None, dtype=None, ddof=0, keepdims=False, *, out=None, where=True, correction=None,
           split_every=None, **unknown):
    """``numpy.nanstd``: the square root of ``nanvar``."""
    return _moments_called(nanstd, x, axis, dtype, ddof, keepdims, split_every, out, where, correction, unknown)


def nanmean(x, axis=None, dtype=None, keepdims=False, *, out=None, where=True, split_every=None, **unknown):
    """``numpy.nanmean``: NaNs do not count; an all-NaN slice warns ("Mean of empty slice") and gives NaN.
    Integer and bool input holds no NaN: it is ``mean`` (as NumPy hands it to ``np.mean``), bit for bit."""
    if unknown:
        raise v.unknown_keywords(nanmean, unknown)
    if where is not True or out is not None:
        return _keyword_moment("nanmean", x, axis, dtype, 0, keepdims, split_every, where, out)
    caller = "multireduce.nanmean"
    x, kind = _prepare(x, caller, "biufc")
    if x.dtype.kind not in "fc":
        return api._reduction(x, "sum", axis, dtype, keepdims, split_every, "auto", caller=caller, mean=True,
                              label="nanmean")
    return _moment("nanmean", x, axis, dtype, 0, keepdims, split_every)


# ------------------------------------------------------------------------------------------------
# nanmin / nanmax, any / all / count_nonzero
# ------------------------------------------------------------------------------------------------
def _fold(stat, x, axis, keepdims, split_every, kinds, out_dtype=None):
    if axis is None and keepdims is False and split_every is None and stat in ("any", "all", "count_nonzero"):
        result = _whole_on_gpu(stat, x, "biuf")
        if result is not None:
            return result
    caller = f"multireduce.{stat}"
    x, kind = _prepare(x, caller, kinds)
    axes = v.normalize_axes(axis, x.ndim, caller)
    keepdims = v.check_flag(keepdims, "keepdims", caller)
    v.fan_in(split_every, axes, caller)
    if stat in ("nanmin", "nanmax") and v.known_empty(x, axes):
        raise ValueError(f"zero-size array to reduction operation {'fmax' if stat == 'nanmax' else 'fmin'} "
                         "which has no identity")
    plan = StatPlan(stat, axes, keepdims, np.dtype(out_dtype or x.dtype), gpu="cupy" in kind)
    return _run(x, kind, plan, split_every, caller)


_HOST_CHECK_MAX = 1 << 16  # results up to this size are checked for all-NaN or empty slices on the host
PROBE_MIN_SIZE = 1 << 16  # a whole CuPy nanmin/nanmax/nanmean/nanvar of this many elements or more samples it first


def _probed(x, axes, run):
    """(``run()``, the finite probe's (finite, not NaN) sample counts) for a CuPy float ``x``: the probe
    (``cupy_backend.finite_probe``) queued before ``run``'s kernels where ``axes`` are all of a large enough
    ``x``, so the host waits for it alone; (0, 0) without one. Its slot goes back even where ``run`` raises."""
    probe = None
    if len(axes) == x.ndim and x.size >= PROBE_MIN_SIZE:
        from .backends import cupy_backend

        probe = cupy_backend.finite_probe(x)
    try:
        value = run()
    finally:
        counts = probe[0].counts(probe[1]) if probe is not None else (0, 0)
    return value, counts


def _small_on_host(values):
    """``values`` for a data-dependent check (the host waits for it anyway): a small CuPy array copied to
    the host, since CuPy's comparisons and any() compile kernels at their first use; NumPy and large
    arrays as they are."""
    return values.get() if is_cupy_array(values) and values.size <= _HOST_CHECK_MAX else values


def _nan_extreme(stat, x, axis, keepdims, split_every):
    """NumPy and CuPy input: the nan-family operator (NaN read as +inf / -inf as the kernels load each
    element), then the all-NaN slices, which gave that identity, finished as NumPy: a warning and NaN.
    Only where some slice equals the identity is the data looked at again (isnan over it). Dask input
    keeps the (extreme, count) partials of ``StatPlan``, which know an all-NaN slice without a second
    pass over the data."""
    caller = f"multireduce.{stat}"
    x, kind = _prepare(x, caller, "biuf")
    if kind.startswith("dask"):
        return _fold(stat, x, axis, keepdims, split_every, "biuf")
    if x.dtype.kind != "f":
        return api._reduction(x, stat[3:], axis, None, keepdims, split_every, "auto", caller=caller)

    def run():
        return api._reduction(x, stat, axis, None, keepdims, split_every, "auto", caller=caller)

    if kind == "cupy" and x.size >= PROBE_MIN_SIZE:
        axes = v.normalize_axes(axis, x.ndim, caller)  # the arguments checked before any launch
        v.check_flag(keepdims, "keepdims", caller)
        v.fan_in(split_every, axes, caller)
        result, (finite, _) = _probed(x, axes, run)
        if finite:
            return result  # a finite element: the extreme is no identity, and no slice is all-NaN
    else:
        result = run()
    identity = np.inf if stat == "nanmin" else -np.inf
    if bool((_small_on_host(result) == identity).any()):
        xp = np
        if kind == "cupy":
            import cupy as xp
        hollow = xp.isnan(x).all(axis=v.normalize_axes(axis, x.ndim, caller), keepdims=keepdims)
        if bool(hollow.any()):
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
            result = xp.where(hollow, xp.asarray(np.nan, dtype=result.dtype), result)
            if kind == "numpy" and result.ndim == 0:
                result = result[()]
    return result


def _keyword_extreme(stat, x, axis, keepdims, split_every, out, initial, where):
    caller = f"multireduce.{stat}"
    return api._keyword_reduction(x, stat, axis, None, keepdims, split_every, "auto", False, caller, where, initial,
                                  out, lambda xm, exact: _nan_extreme(stat, xm, axis, keepdims, split_every),
                                  kinds="biuf", skipnan=True)


def nanmin(x, axis=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None, **unknown):
    """``numpy.nanmin``: NaNs ignored; an all-NaN slice warns and gives NaN; empty input raises."""
    if unknown:
        raise v.unknown_keywords(nanmin, unknown)
    if api._keywords_given(where, initial, out):
        return _keyword_extreme("nanmin", x, axis, keepdims, split_every, out, initial, where)
    return _nan_extreme("nanmin", x, axis, keepdims, split_every)


def nanmax(x, axis=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None, **unknown):
    """``numpy.nanmax``: NaNs ignored; an all-NaN slice warns and gives NaN; empty input raises."""
    if unknown:
        raise v.unknown_keywords(nanmax, unknown)
    if api._keywords_given(where, initial, out):
        return _keyword_extreme("nanmax", x, axis, keepdims, split_every, out, initial, where)
    return _nan_extreme("nanmax", x, axis, keepdims, split_every)


def _keyword_truth(stat, x, axis, keepdims, split_every, out, where):
    """any/all with ``where=`` (the other elements count as False for any, True for all) and ``out=``."""
    caller = f"multireduce.{stat}"
    x, kind = _prepare(x, caller, "biufc")
    axes = v.normalize_axes(axis, x.ndim, caller)
    shape = v.reduced_shape(x.shape, axes, v.check_flag(keepdims, "keepdims", caller))
    v.fan_in(split_every, axes, caller)
    mask = v.where_mask(where, x, kind, caller)
    v.check_out(out, kind, x, shape, np.bool_, caller)
    masked = api._masked(x, kind, mask, x.dtype.type(stat == "all"))
    return api._into(out, _fold(stat, masked, axis, keepdims, split_every, "biufc", np.bool_), kind, x)


def any(x, axis=None, keepdims=False, *, out=None, where=True, split_every=None, **unknown):
    """``numpy.any``: True where some element is non-zero (NaN counts as non-zero); empty -> False."""
    if unknown:
        raise v.unknown_keywords(any, unknown)
    if where is not True or out is not None:
        return _keyword_truth("any", x, axis, keepdims, split_every, out, where)
    return _fold("any", x, axis, keepdims, split_every, "biufc", np.bool_)


def all(x, axis=None, keepdims=False, *, out=None, where=True, split_every=None, **unknown):
    """``numpy.all``: True where every element is non-zero; empty -> True."""
    if unknown:
        raise v.unknown_keywords(all, unknown)
    if where is not True or out is not None:
        return _keyword_truth("all", x, axis, keepdims, split_every, out, where)
    return _fold("all", x, axis, keepdims, split_every, "biufc", np.bool_)


def count_nonzero(x, axis=None, keepdims=False, *, split_every=None, **unknown):
    """``numpy.count_nonzero``: an intp (NumPy 2 gives an ``np.intp`` scalar, not an int, for
    ``axis=None`` too)."""
    if unknown:
        raise v.unknown_keywords(count_nonzero, unknown)
    return _fold("count_nonzero", x, axis, keepdims, split_every, "biufc", np.intp)


# ------------------------------------------------------------------------------------------------
# NaN as the identity: nansum, nanprod, nancumsum, nancumprod
# ------------------------------------------------------------------------------------------------
def _nan_operator(x, dtype, plain: str, caller: str, axis, split_every, keepdims=None):
    """(``x`` as an array, the operator name): the nan-family's operator, which masks NaN as the kernels
    load each element (one pass), for floating input summed in a floating type; the plain operator for
    other input, which holds no NaN. A floating ``x`` with an integer or bool ``dtype=`` (NaN would be
    converted before the mask could see it) goes through a copy with NaN replaced, made only after the
    arguments are checked (``keepdims`` None: a scan), so bad input fails before that work."""
    x, kind = _prepare(x, caller, "biuf")
    if x.dtype.kind != "f":
        return x, plain
    requested = v.requested_dtype(dtype, _dt.ARITHMETIC_KINDS, caller)
    if requested is None or requested.kind in "fc":
        return x, "nan" + plain
    if keepdims is None:
        axes = (0 if axis is None else v.normalize_scan_axis(axis, x.ndim, caller),)
    else:
        axes = v.normalize_axes(axis, x.ndim, caller)
        v.check_flag(keepdims, "keepdims", caller)
    v.fan_in(split_every, axes, caller)
    fill = 0 if plain == "sum" else 1
    if kind.startswith("dask"):
        return x.map_blocks(_nan_to, fill, dtype=x.dtype, meta=x._meta), plain
    return _nan_to(x, fill), plain


def _nan_to(block, fill):
    xp = _xp(block)
    return xp.where(xp.isnan(block), xp.asarray(fill, dtype=block.dtype), block)


def nansum(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
           exact=False, **unknown):
    """``numpy.nansum``: NaN counts as 0 (an all-NaN slice sums to 0; inf - inf stays NaN), masked as the
    kernels load each element; ``exact=True`` as in ``sum``."""
    caller = "multireduce.nansum"
    if unknown:
        raise v.unknown_keywords(nansum, unknown)
    if api._keywords_given(where, initial, out):
        return api._keyword_reduction(x, "nansum", axis, dtype, keepdims, split_every, "auto", False, caller, where,
                                      initial, out, lambda xm, exact: nansum(
                                          xm, axis, dtype, keepdims, split_every=split_every, exact=exact),
                                      kinds="biuf", exact=exact)
    if exact is not False and api._wants_exact(x, dtype, exact, caller):
        return _exact.sum(x, axis, dtype, keepdims, split_every, skipnan=True, caller=caller)
    x, op = _nan_operator(x, dtype, "sum", caller, axis, split_every, keepdims)
    return api._reduction(x, op, axis, dtype, keepdims, split_every, "auto", caller=caller)


def nanprod(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
            **unknown):
    """``numpy.nanprod``: NaN counts as 1, masked as the kernels load each element."""
    caller = "multireduce.nanprod"
    if unknown:
        raise v.unknown_keywords(nanprod, unknown)
    if api._keywords_given(where, initial, out):
        return api._keyword_reduction(x, "nanprod", axis, dtype, keepdims, split_every, "auto", False, caller, where,
                                      initial, out, lambda xm, exact: nanprod(
                                          xm, axis, dtype, keepdims, split_every=split_every), kinds="biuf")
    x, op = _nan_operator(x, dtype, "prod", caller, axis, split_every, keepdims)
    return api._reduction(x, op, axis, dtype, keepdims, split_every, "auto", caller=caller)


def nancumsum(x, axis=None, dtype=None, *, out=None, split_every=None, exact=False, **unknown):
    """``numpy.nancumsum``: a running sum in which NaN counts as 0 (``axis=None`` flattens), masked as the
    scan kernels load each element; ``exact=True`` as in ``cumsum``; ``out`` as in ``cumsum``."""
    if unknown:
        raise v.unknown_keywords(nancumsum, unknown)
    caller = "multireduce.nancumsum"
    if exact is not False and api._wants_exact(x, dtype, exact, caller):
        return api._exact_scan_into(out, x, axis, dtype, caller,
                                    lambda: _exact.cumsum(x, axis, dtype, split_every, skipnan=True, caller=caller))
    x, op = _nan_operator(x, dtype, "sum", caller, axis, split_every)
    return api._scan(x, op, axis, dtype, True, "auto", caller=caller, label="nancumsum", split_every=split_every,
                     out=out)


def nancumprod(x, axis=None, dtype=None, *, out=None, split_every=None, **unknown):
    """``numpy.nancumprod``: a running product in which NaN counts as 1 (``axis=None`` flattens); ``out`` as
    in ``cumsum``."""
    if unknown:
        raise v.unknown_keywords(nancumprod, unknown)
    caller = "multireduce.nancumprod"
    x, op = _nan_operator(x, dtype, "prod", caller, axis, split_every)
    return api._scan(x, op, axis, dtype, True, "auto", caller=caller, label="nancumprod", split_every=split_every,
                     out=out)


# ------------------------------------------------------------------------------------------------
# Segments
# ------------------------------------------------------------------------------------------------
def _segment_args(x, offsets, op, dtype, caller, scan=False):
    x, kind = v.as_array(x, caller)
    op = get_operator(op, caller=caller)
    v.check_dtype(x.dtype, op.kinds, caller)
    requested = v.requested_dtype(dtype, op.kinds, caller)
    if x.ndim != 1:
        raise ValueError(f"{caller}: argument 'x' must be 1-D; got {x.ndim} dimensions (shape {x.shape})")
    if kind.startswith("dask"):
        _known_chunks(x, caller)
    n = int(x.shape[0])
    out = _dt.result_dtype(op.family, x.dtype, requested)
    if is_cupy_array(offsets) and kind == "cupy" and _gpu_segments(x, _dt.accumulator_dtype(out), out if scan else None):
        # 10^7 offsets stay on the GPU: one fused check there, no host round trip of the array
        acc = _dt.accumulator_dtype(out)
        return (x, kind, _DeviceOffsets(offsets, n, caller, op, x.dtype, acc, out if scan else None,
                                        device=x.data.device_id), op, acc, out)
    if is_cupy_array(offsets):
        offsets = offsets.get()
    elif v.is_dask_array(offsets):
        raise TypeError(f"{caller}: argument 'offsets' must be a NumPy array or a list; got a dask array "
                        "(the segment layout shapes the graph: compute it first)")
    given = np.asarray(offsets)
    offsets = _integer_offsets(given, caller)
    # checked in the given dtype: a uint64 past 2**63 must not wrap to a negative int64 first, and
    # np.diff of unsigned offsets wraps instead of going negative
    ascending = bool((given[1:] >= given[:-1]).all())
    if given.size and (given.min() < 0 or given.max() > n or not ascending):
        raise _offsets_range_error(given, n, ascending, caller)
    return x, kind, offsets, op, _dt.accumulator_dtype(out), out


def _integer_offsets(offsets, caller):
    """NumPy or CuPy offsets as int64, after checking they are a 1-D array of integers (any width or
    signedness; values past int64 are out of range for any ``x``, and the callers' range checks say so
    in the given dtype)."""
    if offsets.ndim != 1 or (offsets.size and offsets.dtype.kind not in "iu"):
        raise TypeError(f"{caller}: argument 'offsets' must be a 1-D array of integers; got dtype "
                        f"{offsets.dtype}, shape {offsets.shape}")
    with on_device_of(offsets):
        return offsets.astype(np.int64, copy=False)


def _offsets_range_error(given, n, ascending, caller):
    """``given``: the offsets as the caller passed them (not the int64 copy), so the values in the
    message are the caller's."""
    with on_device_of(given):  # a CuPy reduction runs on the current GPU, which need not be given's
        low, high = int(given.min()), int(given.max())
    return ValueError(f"{caller}: argument 'offsets' must be ascending start offsets in [0, {n}]; got "
                      f"values from {low} to {high}" + ("" if ascending else ", not ascending"))


class _DeviceOffsets:
    """CuPy offsets as int64 on ``device`` (x's: copied there if they are elsewhere), with their check (the
    same rules and messages as NumPy ones) queued on that GPU by a kernel of the module that reduces
    ``dtype`` into ``acc`` with ``op`` next (scans it into ``scan_out``). The work is queued behind the
    check before the host waits for it, so the GPU never idles between them; where the check fails the
    work walks no offset (segment_tile_starts) and ``run`` raises instead of returning its result."""

    def __init__(self, offsets, n, caller, op, dtype, acc, scan_out=None, *, device):
        import cupy

        from .backends import cupy_segment

        self.given, self.n, self.caller = offsets, n, caller
        offsets = _integer_offsets(offsets, caller)
        with cupy.cuda.Device(device):
            if offsets.data.device_id != device:  # the check's flag must be where the work reads it
                offsets = offsets.copy()  # CuPy copies to the current device
            self.offsets = cupy.ascontiguousarray(offsets)
        self.check = cupy_segment.OffsetsCheck(self.offsets, n, op, dtype, acc, scan_out)

    def run(self, work):
        """``work(offsets, check)``'s result, or the offsets error."""
        try:
            result = work(self.offsets, self.check)
        finally:
            inside, ascending = self.check.result()  # always: the pinned flag must land before it is freed
        if not (inside and ascending):
            given = self.given
            if given.dtype == np.uint64:  # the int64 copy wrapped values past 2**63: order them as given
                with on_device_of(given):
                    ascending = bool((given[1:] >= given[:-1]).all())
            raise _offsets_range_error(given, self.n, ascending, self.caller)
        return result


def _gpu_segments(block, acc, out=None):
    """Whether the segment kernels (backends/cupy_segment) take this block (scanned into ``out``)."""
    if not is_cupy_array(block):
        return False
    from .backends import cupy_segment

    return cupy_segment.supported(block, acc, out)


def _segment_reduce_block(block, offsets, op, acc):
    """One NumPy or CuPy array's segment reductions in ``acc``: the GPU kernels where they apply."""
    if _gpu_segments(block, acc):
        from .backends import cupy_segment

        return cupy_segment.segment_reduce(block, offsets, op, acc)
    return numpy_stats.segment_reduce(block, _host(offsets), op, acc, _xp(block))


def _xp(x):
    if is_cupy_array(x) or (v.is_dask_array(x) and is_cupy_array(x._meta)):
        import cupy

        return cupy
    return np


def segment_reduce(x, offsets, op="sum", dtype=None):
    """One value per start offset: ``op`` over ``x[offsets[i]:offsets[i+1]]`` (the last segment runs to
    the end), as ``np.<ufunc>.reduceat`` with ascending offsets, except that an empty segment gives the
    operator's identity (reduceat gives ``x[offsets[i]]``). Elements before ``offsets[0]`` take no part.

    ``op`` is any registered operator (user ones included; non-commutative ones keep element order).
    On Dask, segments may straddle chunks: each chunk reduces the segments that start in it, and a
    segment cut by chunk boundaries is finished with the head pieces of the chunks it runs into."""
    caller = "multireduce.segment_reduce"
    x, kind, offsets, op, acc, out = _segment_args(x, offsets, op, dtype, caller)
    if kind.startswith("dask"):
        return _dask_segment_reduce(x, offsets, op, acc, out)
    if isinstance(offsets, _DeviceOffsets):
        from .backends import cupy_segment

        return _as_dtype(offsets.run(lambda o, check: cupy_segment.segment_reduce(x, o, op, acc, check)), out)
    return _as_dtype(_segment_reduce_block(x, offsets, op, acc), out)


def _as_dtype(values, dtype):
    """``values.astype(dtype, copy=False)``; on the GPU through the prebuilt finishing kernel, since CuPy's
    astype compiles an elementwise kernel at its first use."""
    if is_cupy_array(values):
        from .backends import cupy_backend

        return cupy_backend.finish(values, None, dtype)
    return values.astype(dtype, copy=False)


def segment_scan(x, offsets, op="sum", dtype=None):
    """Inclusive scan of 1-D ``x`` that restarts at every offset in ``offsets`` (ascending, in
    [0, len(x)]); the elements before ``offsets[0]`` form a segment of their own. Dask: each chunk's
    first run is seeded with the running value carried from the chunks before it."""
    caller = "multireduce.segment_scan"
    x, kind, offsets, op, acc, out = _segment_args(x, offsets, op, dtype, caller, scan=True)
    if isinstance(offsets, _DeviceOffsets):  # they stay on the device
        from .backends import cupy_segment

        return offsets.run(lambda o, check: cupy_segment.segment_scan(x, o, op, acc, out, check=check))
    if not kind.startswith("dask") and _gpu_segments(x, acc, out):
        return _segment_scan_task(x, offsets, op, acc, out, [None], 0)
    offsets = _host(offsets)
    heads = np.unique(offsets[offsets < x.shape[0]])
    if kind.startswith("dask"):
        return _dask_segment_scan(x, heads, op, acc, out)
    return numpy_stats.segment_scan(x, heads, op, acc, out, None, _xp(x))


def _chunk_bounds(x):
    ends = np.cumsum(x.chunks[0]).astype(np.int64)
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), ends


def _host(a):
    return a.get() if is_cupy_array(a) else np.asarray(a)


def _dask_segment_reduce(x, offsets, op, acc, out):
    from dask.base import tokenize

    lo, hi = _chunk_bounds(x)
    n, k = int(x.shape[0]), len(lo)
    groups = _segment_groups(x)
    token = tokenize(x, offsets, op, str(acc), str(out), getattr(groups, "__qualname__", None))
    pieces_name, name = f"segment-pieces-{token}", f"segment_reduce-{token}"
    first = np.searchsorted(offsets, lo, side="left")  # segments starting in chunk j: [first[j], first[j+1])
    first = np.append(first, len(offsets))
    ends = np.append(offsets[1:], n)
    local = [offsets[first[j]:first[j + 1]] - lo[j] for j in range(k)]
    if groups is None:
        pieces = {(pieces_name, j): (_segment_pieces_task, (x.name, j), local[j], op, acc) for j in range(k)}
    else:
        pieces, where = _segment_recipe_stage(x, groups, pieces_name, k, lambda r, js: (
            _segment_pieces_of_recipe, r, [local[j] for j in js], op, acc))
    finals, chunks = {}, []
    gpu = _xp(x) is not np
    for j in range(k):
        following = range(0)
        if local[j].size:  # the last segment starting here runs on into the chunks before its end
            following = range(j + 1, int(np.searchsorted(lo, ends[first[j + 1] - 1], side="left")))
        if groups is None:
            finals[(name, j)] = (_segment_finish_task, (pieces_name, j), op, out, gpu,
                                 *((pieces_name, i) for i in following))
        else:
            at, group_keys = _picked(where, [j, *following])
            finals[(name, j)] = (_segment_finish_of_groups, op, out, gpu, at, *group_keys)
        chunks.append(int(local[j].size))
    stages = {pieces_name: pieces, name: finals}
    return _segment_array(x, groups, stages, name, (tuple(chunks),), out)


def _segment_groups(x):
    """The grouping whose tasks make their own chunks (``recipes``) for ``x``'s segment operations: over
    chunks made inside the graph on a distributed cluster, the reductions' grouping (``placement``); None
    (a task per chunk and stage, reading ``x``'s chunks) for persisted input, without a client, with
    placement off, where the graph shares work between chunks (rechunk, overlap) or where there are no
    more chunks than worker threads."""
    from . import placement

    groups = placement.grouping_for(x, True)  # each chunk's piece is its own: the stages restore chunk order
    return groups if getattr(groups, "sources", None) is not None else None


def _segment_recipe_stage(x, groups, name: str, count: int, make):
    """The per-chunk stage over chunks 0..count-1 made by recipes: one task per group, ``make(recipe,
    chunk indices)``, returning each chunk's piece in the group's order, plus the constants the groups
    share; and where each chunk's piece is (chunk index -> (task key, position))."""
    from .graph import _recipe_tasks

    grouped = groups([(x.name, j) for j in range(count)]) if count else []
    recipes, shared = groups.sources.recipes(grouped)
    level = [(name, g) for g in range(len(grouped))]
    tasks = _recipe_tasks(recipes, shared, level, lambda r: make(r, [key[1] for key in r.chunks]))
    where = {key[1]: (level[g], p) for g, group in enumerate(grouped) for p, key in enumerate(group)}
    return tasks, where


def _picked(where, chunks):
    """For a task that reads the pieces of ``chunks`` from the group tasks (``where``): (at, keys), the group
    tasks' keys, each once, and per chunk (argument index among them, position in the group)."""
    keys: dict = {}
    at = []
    for j in chunks:
        key, position = where[j]
        at.append((keys.setdefault(key, len(keys)), position))
    return tuple(at), list(keys)


def _pieces_at(at, groups):
    return [groups[i][p] for i, p in at]


def _segment_array(x, groups, stages: dict, name: str, chunks, out, reread: bool = False):
    """The result array of the stages (layer name -> tasks, in order, each reading the one before; the last
    is ``name``). Per chunk (``groups`` None): the first stage reads ``x``'s chunks, whose layers stay, and
    with ``reread`` the last one too. Following recipes: one layer of every stage, the held chunks read and
    the shared constants, and nothing of ``x`` (tasks that read held chunks of one worker ask for it, as
    ``graph`` does)."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    meta = x._meta[:0].astype(out)
    if groups is None:
        layers = dict(x.__dask_graph__().layers)
        deps = dict(x.__dask_graph__().dependencies)
        below = set(x.__dask_layers__())
        for stage, tasks in stages.items():
            layers[stage], deps[stage] = tasks, set(below)
            below = {stage}
        if reread:
            deps[name] |= set(x.__dask_layers__())
        return da.Array(HighLevelGraph(layers, deps), name, chunks, meta=meta)
    from .graph import _OfHeld, _pinned

    layer = dict(groups.sources.futures)
    for tasks in stages.values():
        layer.update(tasks)
    holder = getattr(groups, "holder", None)
    if holder is not None:  # an expression over persisted arrays: Dask's fusion would drop the annotations
        return _OfHeld(HighLevelGraph({name: _pinned(layer, holder)}, {name: set()}), name, chunks, meta=meta)
    return da.Array(HighLevelGraph({name: layer}, {name: set()}), name, chunks, meta=meta)


def _segment_pieces_task(block, local_offsets, op, acc):
    """(head, reductions): ``head`` reduces the elements before the chunk's first start (the tail of a
    segment that began in an earlier chunk), the rest are the segments starting in this chunk."""
    return _head_and_rest(_segment_reductions(block, local_offsets, op, acc))


def _segment_reductions(block, local_offsets, op, acc):
    return _segment_reduce_block(block, np.concatenate([[0], local_offsets]), op, acc)


def _head_and_rest(values):
    values = _host(values)
    return values[0], values[1:]


def _segment_pieces_of_recipe(recipe, local_offsets, op, acc, *inputs):
    """``_segment_pieces_task`` of each chunk of a group made by its recipe, one chunk at a time, in the
    group's order; the values come to the host together (``graph.to_host_together``)."""
    from .graph import to_host_together

    values = recipe.apply(dict(zip(recipe.inputs, inputs)), lambda b, o: _segment_reductions(b, o, op, acc),
                          local_offsets)
    return [_head_and_rest(v) for v in to_host_together(values)]


def _segment_finish_of_groups(op, out, gpu, at, *groups):
    """``_segment_finish_task`` of the chunk whose pieces, with those of the chunks its last segment runs
    into, are at ``at`` among the group tasks' values (``_picked``)."""
    pieces = _pieces_at(at, groups)
    return _segment_finish_task(pieces[0], op, out, gpu, *pieces[1:])


def _segment_finish_task(pieces, op, out, gpu, *following):
    head, values = pieces
    if following and values.size:
        last = values[-1:]
        for h, _ in following:  # the last segment runs on into these chunks: their heads, in order
            last = np.asarray(op.combine(last, np.asarray([h], dtype=last.dtype))).astype(last.dtype)
        values = np.concatenate([values[:-1], last])
    values = values.astype(out, copy=False)
    if gpu:
        import cupy

        return cupy.asarray(values)
    return values


def _scan_tail(block, local_heads, op, acc):
    """What a chunk hands on: the reduction of its elements after its last head (all of them if it has
    none), and whether it has a head (then nothing earlier reaches past it)."""
    return _host(_tail_value(block, local_heads, op, acc))[0], bool(len(local_heads))


def _tail_value(block, local_heads, op, acc):
    start = int(local_heads[-1]) if len(local_heads) else 0
    return _segment_reduce_block(block, np.asarray([start]), op, acc)


def _scan_tails_of_recipe(recipe, local_heads, op, acc, *inputs):
    """``_scan_tail`` of each chunk of a group made by its recipe, one chunk at a time, in the group's
    order; the values come to the host together."""
    from .graph import to_host_together

    values = to_host_together(recipe.apply(dict(zip(recipe.inputs, inputs)),
                                           lambda b, h: _tail_value(b, h, op, acc), local_heads))
    return [(_host(v)[0], bool(len(h))) for v, h in zip(values, local_heads)]


def _segment_carries(op, acc, *tails):
    """Each chunk's incoming running value (None for chunk 0), from every chunk's tail (the last one's
    seeds nothing)."""
    return _carries_from(op, acc, tails[:-1])


def _segment_carries_of_groups(op, acc, at, *groups):
    """``_segment_carries`` from the tails of every chunk but the last, at ``at`` among the group tasks'
    values (``_picked``)."""
    return _carries_from(op, acc, _pieces_at(at, groups))


def _carries_from(op, acc, tails):
    """The carries of chunks 0..len(tails) in one pass over the tails of the chunks before the last: the
    previous chunk's tail, folded onto the previous carry unless that chunk has a head of its own (chunk 0
    starts a segment at its first element)."""
    carries, carry = [None], None
    for total, has_head in tails:
        if has_head or carry is None:
            carry = total
        else:
            carry = np.asarray(op.combine(np.asarray(carry), np.asarray(total))).astype(acc)[()]
        carries.append(carry)
    return carries


def _segment_scan_task(block, local_heads, op, acc, out, carries, j):
    if _gpu_segments(block, acc, out):
        from .backends import cupy_segment

        return cupy_segment.segment_scan(block, local_heads, op, acc, out, carries[j])
    return numpy_stats.segment_scan(block, local_heads, op, acc, out, carries[j], _xp(block))


def _segment_scan_of_recipe(recipe, local_heads, op, acc, out, carries, j, *inputs):
    """``_segment_scan_task`` of the chunk made by ``recipe`` (made again: its tail was taken by a group
    task that dropped it, so no task holds more than one chunk)."""
    (block,) = recipe.make(dict(zip(recipe.inputs, inputs)))
    return _segment_scan_task(block, local_heads, op, acc, out, carries, j)


def _dask_segment_scan(x, heads, op, acc, out):
    from dask.base import tokenize

    lo, hi = _chunk_bounds(x)
    k = len(lo)
    groups = _segment_groups(x)
    token = tokenize(x, heads, op, str(acc), str(out), getattr(groups, "__qualname__", None))
    tails_name, carries_name, name = (f"segment-{s}-{token}" for s in ("tails", "carries", "scan"))
    cut = np.searchsorted(heads, lo, side="left")
    cut = np.append(cut, len(heads))
    local = [heads[cut[j]:cut[j + 1]] - lo[j] for j in range(k)]
    carries_key = (carries_name, 0)
    # depth 3 whatever the chunking (tails -> one carries pass -> scans), as for plain scans
    if groups is None:
        tails = {(tails_name, j): (_scan_tail, (x.name, j), local[j], op, acc) for j in range(k)}
        carries = {carries_key: (_segment_carries, op, acc, *tails)}
        scans = {(name, j): (_segment_scan_task, (x.name, j), local[j], op, acc, out, carries_key, j)
                 for j in range(k)}
        return _segment_array(x, None, {tails_name: tails, carries_name: carries, name: scans}, name, x.chunks, out,
                              reread=True)
    # the last chunk's tail seeds nothing: its chunk is made once, by its scan
    tails, where = _segment_recipe_stage(x, groups, tails_name, k - 1, lambda r, js: (
        _scan_tails_of_recipe, r, [local[j] for j in js], op, acc))
    at, group_keys = _picked(where, range(k - 1))
    carries = {carries_key: (_segment_carries_of_groups, op, acc, at, *group_keys)}
    chunk_recipes, shared = groups.sources.recipes([[(x.name, j)] for j in range(k)])
    scans = dict(shared)
    for j, recipe in enumerate(chunk_recipes):
        scans[(name, j)] = (_segment_scan_of_recipe, recipe, local[j], op, acc, out, carries_key, j, *recipe.inputs)
    return _segment_array(x, groups, {tails_name: tails, carries_name: carries, name: scans}, name, x.chunks, out)


__all__ = ["segment_reduce", "segment_scan", "argmax", "argmin", "nanargmax", "nanargmin", "var", "std", "nanvar", "nanstd", "nanmean",
           "nanmin", "nanmax", "nansum", "nanprod", "nancumsum", "nancumprod", "any", "all", "count_nonzero",
           "StatPlan", "VAR_BOUND"]


# ------------------------------------------------------------------------------------------------
# Docstrings: each function's own text, then its parameters in NumPy's style (the shared texts of
# api._PARAMETERS, one per parameter)
# ------------------------------------------------------------------------------------------------
_INDEX = """out : numpy.intp or numpy.ndarray, cupy.ndarray or dask.array.Array
    Indices (intp) into the reduced axis, or into the flattened array for ``axis=None``: a NumPy scalar
    where NumPy input is reduced to one value."""
_SEGMENTED = """out : numpy.ndarray, cupy.ndarray or dask.array.Array
    One value per offset, of the input's array type."""
_SEGMENT_SCANNED = """out : numpy.ndarray, cupy.ndarray or dask.array.Array
    An array of the shape of ``x``, of the input's array type."""
for _functions, _params, _returns in [
    ((argmax, argmin, nanargmax, nanargmin), ("x", "arg_axis", "keepdims", "out", "split_every"), _INDEX),
    ((var, std, nanvar, nanstd), ("x", "axis", "moments_dtype", "ddof", "keepdims", "out", "stat_where", "correction",
                                  "split_every"), api._REDUCED),
    ((nanmean,), ("x", "axis", "moments_dtype", "keepdims", "out", "stat_where", "split_every"), api._REDUCED),
    ((nanmin, nanmax), ("x", "axis", "keepdims", "out", "initial", "where", "split_every"), api._REDUCED),
    ((any, all), ("x", "axis", "keepdims", "out", "where", "split_every"), api._REDUCED),
    ((count_nonzero,), ("x", "axis", "keepdims", "split_every"), api._REDUCED),
    ((nansum,), ("x", "axis", "dtype", "keepdims", "out", "initial", "where", "split_every", "exact"), api._REDUCED),
    ((nanprod,), ("x", "axis", "dtype", "keepdims", "out", "initial", "where", "split_every"), api._REDUCED),
    ((nancumsum,), ("x", "scan_axis", "dtype", "out", "split_every", "exact"), api._SCANNED),
    ((nancumprod,), ("x", "scan_axis", "dtype", "out", "split_every"), api._SCANNED),
    ((segment_reduce,), ("segment_x", "offsets", "segment_op", "segment_dtype"), _SEGMENTED),
    ((segment_scan,), ("segment_x", "offsets", "segment_op", "segment_dtype"), _SEGMENT_SCANNED),
]:
    for _fn in _functions:
        api.document(_fn, _params, _returns)
del _functions, _params, _returns, _fn
