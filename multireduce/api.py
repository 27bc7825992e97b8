"""The public, NumPy-style API over NumPy, CuPy and Dask arrays.

NumPy input is computed now on the CPU, CuPy input now on its GPU with our kernels, and a Dask array
returns a lazy Dask array whose chunk type matches the input's (like ``dask.array.sum``).
"""

from __future__ import annotations

import builtins
import contextlib
import functools

import dask
import numpy as np

from . import _validation as v
from . import dtypes as _dt
from . import direct, graph, placement
from .core import ReductionPlan, ScanPlan
from .operators import Operator, get_operator, on_registry_change

__all__ = ["sum", "prod", "min", "max", "mean", "reduce", "cumsum", "cumprod", "scan"]


_NO_SWITCH = contextlib.nullcontext()


def _run_device(kind: str, x):
    """Eager CuPy work runs on the GPU that holds ``x``."""
    if kind == "cupy":
        import cupy

        holder = x.data.device_id
        if holder != cupy.cuda.runtime.getDevice():
            return cupy.cuda.Device(holder)
    return _NO_SWITCH


def _cached(fn):
    """Memoize a resolver on its (hashable) arguments; unhashable ones (a list axis, a dict split_every)
    take the uncached path. Exceptions are never cached, so bad input raises on every call."""
    cached = functools.lru_cache(maxsize=512)(fn)

    def resolve(*key):
        try:
            hash(key)
        except TypeError:
            return fn(*key)
        return cached(*key)

    return resolve


@_cached
def _resolve_reduction(kind, op, dtype, ndim, axis, requested, keepdims, split_every, algorithm, mean, label, caller):
    """Everything about a reduction that does not depend on the data: checks, dtypes, plans, fan-in."""
    family = "mean" if mean else op.family
    kinds = _dt.ARITHMETIC_KINDS if mean else op.kinds
    v.check_dtype(dtype, kinds, caller)
    requested = v.requested_dtype(requested, kinds, caller)
    axes = v.normalize_axes(axis, ndim, caller)
    keepdims = v.check_flag(keepdims, "keepdims", caller)
    fan_in = v.fan_in(split_every, axes, caller) if kind.startswith("dask") else None
    algorithm = v.check_algorithm(algorithm, "reduce", kind, op, caller)
    out_dtype = _dt.result_dtype(family, dtype, requested)
    acc_dtype = _dt.accumulator_dtype(out_dtype)
    if "cupy" in kind:
        _check_gpu(caller, op, dtype, acc_dtype, out_dtype)
    label = label or op.name
    if op.commutative or len(axes) <= 1:
        plans = (ReductionPlan(op, axes, acc_dtype, out_dtype, keepdims, mean, algorithm, label),)
    else:
        # order matters: fold the last axis first, then the next, which is C order over the axes
        steps = sorted(axes, reverse=True)
        plans = tuple(ReductionPlan(op, (a,), acc_dtype, acc_dtype, True, False, algorithm, label) for a in steps[:-1])
        plans += (ReductionPlan(op, (steps[-1],), acc_dtype, out_dtype, True, False, algorithm, label),)
    return plans, axes, keepdims, fan_in


def _check_gpu(caller, op, dtype, acc_dtype, out_dtype):
    v.check_gpu_dtypes(caller, **{"argument 'x' has dtype": dtype, "the accumulator dtype": acc_dtype,
                                  "the result dtype": out_dtype})
    if not op.builtin and not op.cuda:
        raise ValueError(f"{caller}: operator {op.name!r} has no CUDA expression, so it cannot run on CuPy data; "
                         "register it with cuda='...'")


# (array type, caller, operator as passed, dtype) -> a backend's whole-array reducer, for calls with every
# option at its default: small arrays spend most of their time in Python, and this skips all of it that
# a previous call of the same signature has already checked and resolved. Operator names are keys, so
# the cache empties whenever the operator registry changes.
_whole_reducers: dict = {}
on_registry_change(_whole_reducers.clear)


def _reduction(x, op, axis, dtype, keepdims, split_every, algorithm, *, caller, mean=False, label=None,
               compute=False):
    defaults = axis is None and dtype is None and keepdims is False and split_every is None and algorithm == "auto"
    if defaults and not mean and compute is False:
        key = (type(x), caller, op, getattr(x, "dtype", None))
        try:
            whole = _whole_reducers.get(key)
        except TypeError:  # an unhashable op: the checks below name it
            whole = None
        if whole is not None:
            result = whole(x)
            if result is not None:
                return result
    op_arg = op
    op = get_operator(op, caller=caller)
    x, kind = v.as_array(x, caller)
    if split_every is None and kind.startswith("dask"):
        split_every = dask.config.get("split_every", None)
    plans, axes, keepdims, fan_in = _resolve_reduction(kind, op, x.dtype, x.ndim, axis, dtype, keepdims, split_every,
                                                       algorithm, mean, label, caller)
    if op.empty_is_error and v.known_empty(x, axes):
        ufunc = "minimum" if op.name == "min" else "maximum"
        raise ValueError(f"zero-size array to reduction operation {ufunc} which has no identity")

    compute = v.check_flag(compute, "compute", caller)
    if kind.startswith("dask"):
        if compute:
            return _computed_now(x, plans, keepdims, axes, fan_in, op)
        return _lazy_reduction(x, plans, keepdims, axes, fan_in, op)

    if defaults and not mean and kind in ("numpy", "cupy") and len(plans) == 1:
        whole = plans[0].whole_reducer(x)
        if whole is not None:
            _whole_reducers[(type(x), caller, op_arg, x.dtype)] = whole
    with _run_device(kind, x):
        for plan in plans:
            x = plan(x)
        if len(plans) > 1 and not keepdims:
            x = x.squeeze(axis=axes)
    if kind == "numpy" and x.ndim == 0:
        return x[()]
    return x


def _lazy_reduction(x, plans, keepdims, axes, fan_in, op):
    for i, plan in enumerate(plans):
        groups = placement.grouping_for(x, True) if i == 0 else None  # the graph restores chunk order
        x = graph.reduction(x, plan, fan_in, groups)
    return x if keepdims or len(plans) == 1 else x.squeeze(axis=axes)


def _computed_now(x, plans, keepdims, axes, fan_in, op):
    """``compute=True`` on a Dask array: the result on the client, in host memory (NumPy). A whole
    reduction of a persisted array is reduced where its chunks are (``direct``); anything else computes
    the graph."""
    value = direct.reduce_persisted(x, plans[0], fan_in) if len(plans) == 1 else None
    if value is None:
        value = _lazy_reduction(x, plans, keepdims, axes, fan_in, op).compute()
        if type(value).__module__.startswith("cupy"):
            value = value.get()
    value = np.asarray(value)
    return value[()] if value.ndim == 0 else value


@_cached
def _resolve_scan(kind, op, dtype, ndim, axis, requested, inclusive, algorithm, split_every, label, caller):
    v.check_dtype(dtype, op.kinds, caller)
    requested = v.requested_dtype(requested, op.kinds, caller)
    inclusive = v.check_flag(inclusive, "inclusive", caller)
    ax = 0 if axis is None else v.normalize_scan_axis(axis, ndim, caller)
    algorithm = v.check_algorithm(algorithm, "scan", kind, op, caller)
    fan_in = v.fan_in(split_every, (), caller) if kind.startswith("dask") else None
    out_dtype = _dt.result_dtype(op.family, dtype, requested)
    acc_dtype = _dt.accumulator_dtype(out_dtype)
    if "cupy" in kind:
        _check_gpu(caller, op, dtype, acc_dtype, out_dtype)
    return ScanPlan(op, ax, acc_dtype, out_dtype, inclusive, algorithm, label or f"scan-{op.name}"), fan_in


def _scan(x, op, axis, dtype, inclusive, algorithm, *, caller, label=None, split_every=None):
    x, kind = v.as_array(x, caller)
    op = get_operator(op, caller=caller)
    if split_every is None and kind.startswith("dask"):
        split_every = dask.config.get("split_every", None)
    plan, fan_in = _resolve_scan(kind, op, x.dtype, x.ndim, axis, dtype, inclusive, algorithm, split_every, label,
                                 caller)
    if axis is None:
        if kind.startswith("dask") and x.ndim > 1 and builtins.any(np.isnan(c) for cs in x.chunks for c in cs):
            raise ValueError(f"{caller}: argument 'x' has unknown chunk sizes, so it cannot be flattened for "
                             "axis=None; call x.compute_chunk_sizes() first or pass an axis")
        x = x.reshape(-1)
    if kind.startswith("dask"):
        # one totals task per worker holding chunks: each chunk's total is kept, so order survives any placement
        return graph.scan(x, plan, fan_in, placement.grouping_for(x, commutative=True))
    with _run_device(kind, x):
        return plan(x)


# ------------------------------------------------------------------------------------------------
# Reductions
# ------------------------------------------------------------------------------------------------
def reduce(x, op: str | Operator, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto",
           compute=False):
    """Reduce ``x`` with ``op`` ("sum", "prod", "min", "max" or a registered operator) over ``axis``.

    ``split_every`` is the fan-in of the Dask tree (dask's config, else 16); ``algorithm`` names a GPU
    kernel from ``multireduce.algorithms("reduce")`` and only applies to CuPy data. For a Dask array,
    ``compute=True`` returns the result now, on the client, in host memory (NumPy); a whole reduction of
    a persisted array then runs on the workers holding the chunks without a task graph (every function
    below takes the same ``compute``).
    """
    return _reduction(x, op, axis, dtype, keepdims, split_every, algorithm, caller="multireduce.reduce",
                      compute=compute)


def sum(x, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto", compute=False):
    """Sum of elements, as ``numpy.sum`` (small integers and booleans sum into int64 / uint64)."""
    return _reduction(x, "sum", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.sum", compute=compute)


def prod(x, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto", compute=False):
    """Product of elements, as ``numpy.prod``; integer overflow wraps as in NumPy."""
    return _reduction(x, "prod", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.prod", compute=compute)


def min(x, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto", compute=False):
    """Minimum, as ``numpy.min``: NaN propagates; empty input raises ValueError.

    ``dtype`` (an extension over NumPy) converts the elements before they are compared.
    """
    return _reduction(x, "min", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.min", compute=compute)


def max(x, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto", compute=False):
    """Maximum, as ``numpy.max``: NaN propagates; empty input raises ValueError."""
    return _reduction(x, "max", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.max", compute=compute)


def mean(x, axis=None, dtype=None, keepdims=False, split_every=None, algorithm="auto", compute=False):
    """Arithmetic mean, as ``numpy.mean`` (integers in float64, float16 accumulated in float32)."""
    return _reduction(x, "sum", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.mean",
                      mean=True, label="mean", compute=compute)


# ------------------------------------------------------------------------------------------------
# Scans
# ------------------------------------------------------------------------------------------------
def scan(x, op: str | Operator, axis=None, dtype=None, inclusive=True, algorithm="auto", split_every=None):
    """Inclusive (default) or exclusive scan of ``x`` with ``op`` along ``axis`` (None flattens).

    ``op`` must be associative; it need not be commutative (element order is kept everywhere).
    An exclusive scan starts every lane from the operator's identity.
    """
    return _scan(x, op, axis, dtype, inclusive, algorithm, caller="multireduce.scan", split_every=split_every)


def cumsum(x, axis=None, dtype=None, algorithm="auto", split_every=None):
    """Cumulative sum, as ``numpy.cumsum`` (``axis=None`` flattens)."""
    return _scan(x, "sum", axis, dtype, True, algorithm, caller="multireduce.cumsum", label="cumsum",
                 split_every=split_every)


def cumprod(x, axis=None, dtype=None, algorithm="auto", split_every=None):
    """Cumulative product, as ``numpy.cumprod`` (``axis=None`` flattens)."""
    return _scan(x, "prod", axis, dtype, True, algorithm, caller="multireduce.cumprod", label="cumprod",
                 split_every=split_every)
