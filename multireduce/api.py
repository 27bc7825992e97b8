"""The public, NumPy-style API over NumPy, CuPy and Dask arrays.

NumPy input is computed now on the CPU, CuPy input now on its GPU with our kernels, and a Dask array
returns a lazy Dask array whose chunk type matches the input's (like ``dask.array.sum``).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import _validation as v
from . import dtypes as _dt
from . import exact as _exact
from .errors import gpu_memory_guard
from .core import ReductionPlan, ScanPlan, empty_error
from .operators import SAMPLE_DTYPES, Operator, check_algebra, get_operator, on_register, registered

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


def _typed(value):
    """A cache key that tells apart values that compare equal across types: ``1.0 == 1 == True``, so
    without the types a call with ``axis=1`` would let ``axis=1.0`` or ``axis=True`` through unchecked."""
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return (type(value), value)


def _cached(fn):
    """Memoize a resolver on its (hashable) arguments and their types; unhashable ones (a list axis, a
    dict split_every) take the uncached path. Exceptions are never cached, so bad input raises on every
    call, whatever came before."""
    cached = functools.lru_cache(maxsize=512)(lambda typed, *key: fn(*key))

    def resolve(*key):
        try:
            typed = _typed(key)
            hash(typed)
        except TypeError:
            return fn(*key)
        return cached(typed, *key)

    resolve.cache_clear = cached.cache_clear  # after a module setting the resolver reads changes
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
    fan_in = v.fan_in(split_every, axes, caller)
    algorithm = _check_loads(v.check_algorithm(algorithm, "reduce", kind, op, caller), op, caller)
    out_dtype = _dt.result_dtype(family, dtype, requested)
    # a leading run of axes, not all: each chunk's partial is as large as the result (dtypes.WIDE_FLOAT32_*)
    leading = 0 < len(axes) < ndim and tuple(axes) == tuple(range(len(axes)))
    where = "cpu" if "cupy" not in kind else "gpus, some axes" if kind == "dask-cupy" and leading else "gpu"
    # a dtype asked for is the accumulator's, as in NumPy
    auto = op.builtin and op.name == "sum" and (requested is None or where != "gpus, some axes")
    acc_dtype = _dt.accumulator_dtype(out_dtype, "auto" if auto else "input", where)  # dtypes.WIDE_FLOAT32_*
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


def _check_loads(algorithm: str, op: Operator, caller: str) -> str:
    if op.masks_nan and algorithm != "auto":
        raise ValueError(f"{caller}: argument 'algorithm' is {algorithm!r}, but operator {op.name!r} masks NaN as "
                         "elements are loaded, which only the production kernels do; use algorithm='auto'")
    return algorithm


def _check_gpu(caller, op, dtype, acc_dtype, out_dtype):
    v.check_gpu_dtypes(caller, **{"argument 'x' has dtype": dtype, "the accumulator dtype": acc_dtype,
                                  "the result dtype": out_dtype})
    if not op.builtin and not op.cuda:
        raise ValueError(f"{caller}: operator {op.name!r} has no CUDA expression, so it cannot run on CuPy data; "
                         "register it with cuda='...'")


def _gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device: the CPU checks are all that can run
        return False


def _check_on_gpu(op: Operator) -> None:
    """At registration, where CuPy and a GPU exist: compile the CUDA expression (through the reduction
    kernels, so a compile error raises ``kernels.KernelError`` now) and run the identity, associativity and
    commutativity samples through it. Each ``op(a, b)`` is a reduction of the row ``[a, b]``."""
    if not op.cuda or not _gpu_present():
        return
    import cupy

    def combine(a, b, dtype):
        rows = cupy.asarray(np.stack([a, b], axis=1))
        return cupy.asnumpy(_reduction(rows, op, 1, None, False, None, "auto", caller="multireduce.register_operator"))

    kinds = "".join(k for k in op.kinds if _dt.gpu_supported(SAMPLE_DTYPES[k]))
    check_algebra(op.name, op.identity_value, combine, op.commutative, kinds, where="cuda")


on_register(_check_on_gpu)


# (array type, caller, operator, dtype, ndim) -> the plan of a call with every option at its default:
# small arrays spend most of their time in Python, and this skips all of it that an earlier call of the
# same signature has already checked and resolved. The key holds the Operator itself, not its name, so a
# re-registered name resolves to a new operator and a new plan; the cache is bounded (dropped when full)
# because unregistered operators stay in it otherwise.
_default_plans: dict = {}
_MAX_DEFAULT_PLANS = 1024


def _reduction(x, op, axis, dtype, keepdims, split_every, algorithm, *, caller, mean=False, label=None,
               compute=False):
    defaults = (axis is None and dtype is None and keepdims is False and split_every is None
                and algorithm == "auto" and compute is False)
    if defaults:
        try:
            plan = _default_plans.get((type(x), caller, registered(op, op), x.dtype, x.ndim))
        except (TypeError, AttributeError):  # an unhashable op or not an array: the checks below name it
            plan = None
        if plan is not None:
            result = plan.launch(x)
            if result is not None:
                return result
    op = get_operator(op, caller=caller)
    x, kind = v.as_array(x, caller)
    if split_every is None and kind.startswith("dask"):
        import dask  # dask and the graph layers load on the first dask input: NumPy/CuPy users never pay for them

        split_every = dask.config.get("split_every", None)
    plans, axes, keepdims, fan_in = _resolve_reduction(kind, op, x.dtype, x.ndim, axis, dtype, keepdims, split_every,
                                                       algorithm, mean, label, caller)
    if op.empty_is_error and v.known_empty(x, axes):
        raise ValueError(empty_error(op))

    compute = v.check_flag(compute, "compute", caller)
    if kind.startswith("dask"):
        if compute:
            return _computed_now(x, plans, keepdims, axes, fan_in, op)
        return _lazy_reduction(x, plans, keepdims, axes, fan_in, op)

    if defaults and kind in ("numpy", "cupy") and len(plans) == 1:
        if len(_default_plans) >= _MAX_DEFAULT_PLANS:
            _default_plans.clear()
        _default_plans[(type(x), caller, op, x.dtype, x.ndim)] = plans[0]
    with _run_device(kind, x), gpu_memory_guard(x, caller):
        for plan in plans:
            x = plan(x)
        if len(plans) > 1 and not keepdims:
            x = x.squeeze(axis=axes)
    if kind == "numpy" and x.ndim == 0:
        return x[()]
    return x


def _read_through_steps(x, plans):
    """(x, plans), or, where the elementwise steps at the top of ``x`` can be read into one plan's loads
    (``fusion``), the array they read and that plan over it."""
    if len(plans) != 1:
        return x, plans
    from . import fusion

    found = fusion.fused(x, plans[0])
    return (x, plans) if found is None else (found[0], (found[1],))


def _lazy_reduction(x, plans, keepdims, axes, fan_in, op):
    from . import direct, graph, placement

    x, plans = _read_through_steps(x, plans)
    if len(plans) == 1:
        # chunks held by workers (a persisted array, or an expression over persisted arrays): the
        # result's .compute() reduces them where they are (direct), and the graph is built only if
        # something asks for it
        held = direct.held_result(x, plans[0], fan_in)
        if held is not None:
            return held
    for i, plan in enumerate(plans):
        groups = placement.grouping_for(x, True) if i == 0 else None  # the graph restores chunk order
        x = graph.reduction(x, plan, fan_in, groups)
    return x if keepdims or len(plans) == 1 else x.squeeze(axis=axes)


def _computed_now(x, plans, keepdims, axes, fan_in, op):
    """``compute=True`` on a Dask array: the result on the client, in host memory (NumPy). A whole
    reduction of a persisted array is reduced where its chunks are (``direct``); anything else computes
    the graph."""
    from . import direct

    x, plans = _read_through_steps(x, plans)
    value = direct.reduce_held(x, plans[0], fan_in) if len(plans) == 1 else None
    if value is None:
        import dask

        value = dask.compute(_lazy_reduction(x, plans, keepdims, axes, fan_in, op))[0]  # the graph, not direct again
    return _on_host(value)


def _on_host(value):
    """A computed result in host memory as ``compute=True`` returns it: NumPy, a 0-d result as a scalar."""
    if type(value).__module__.startswith("cupy"):
        value = value.get()
    value = np.asarray(value)
    return value[()] if value.ndim == 0 else value


def _check_accumulate(accumulate, caller: str) -> str:
    if not isinstance(accumulate, str) or accumulate not in _dt.ACCUMULATE_CHOICES:
        raise ValueError(f"{caller}: argument 'accumulate' must be one of "
                         f"{', '.join(map(repr, _dt.ACCUMULATE_CHOICES))}; got {accumulate!r}")
    return accumulate


@_cached
def _resolve_scan(kind, op, dtype, ndim, axis, requested, inclusive, algorithm, split_every, label, caller,
                  accumulate="auto"):
    v.check_dtype(dtype, op.kinds, caller)
    requested = v.requested_dtype(requested, op.kinds, caller)
    inclusive = v.check_flag(inclusive, "inclusive", caller)
    ax = 0 if axis is None else v.normalize_scan_axis(axis, ndim, caller)
    algorithm = _check_loads(v.check_algorithm(algorithm, "scan", kind, op, caller), op, caller)
    fan_in = v.fan_in(split_every, (ax,), caller)
    accumulate = _check_accumulate(accumulate, caller)
    out_dtype = _dt.result_dtype(op.family, dtype, requested)
    if accumulate == "auto" and not (op.builtin and op.name == "sum"):
        accumulate = "input"  # "auto" widens sums only (cumprod and user operators keep NumPy's accumulator)
    acc_dtype = _dt.accumulator_dtype(out_dtype, accumulate, "gpu" if "cupy" in kind else "cpu", scan=True)
    if "cupy" in kind:
        _check_gpu(caller, op, dtype, acc_dtype, out_dtype)
    return ScanPlan(op, ax, acc_dtype, out_dtype, inclusive, algorithm, label or f"scan-{op.name}"), fan_in


def _scan(x, op, axis, dtype, inclusive, algorithm, *, caller, label=None, split_every=None, accumulate="auto",
          out=None):
    x, kind = v.as_array(x, caller)
    op = get_operator(op, caller=caller)
    if split_every is None and kind.startswith("dask"):
        import dask  # dask and the graph layers load on the first dask input: NumPy/CuPy users never pay for them

        split_every = dask.config.get("split_every", None)
    plan, fan_in = _resolve_scan(kind, op, x.dtype, x.ndim, axis, dtype, inclusive, algorithm, split_every, label,
                                 caller, accumulate)
    v.check_out(out, kind, x, (x.size,) if axis is None else x.shape, plan.out_dtype, caller)
    if axis is None:
        x = v.flattened(x, kind, caller)
    if kind.startswith("dask"):
        # one totals task per worker holding chunks: each chunk's total is kept, so order survives any placement
        from . import direct, graph, placement

        x, (plan,) = _read_through_steps(x, (plan,))
        held = direct.held_scan(x, plan, fan_in)  # .persist() scans held chunks where they are, with no task
        if held is not None:
            return held
        return graph.scan(x, plan, fan_in, placement.scan_grouping(x, placement.grouping_for(x, commutative=True)))
    with _run_device(kind, x), gpu_memory_guard(x, caller):
        return _into(out, plan(x), kind, x)


def _wants_exact(x, dtype, exact, caller: str, algorithm="auto", compute=False) -> bool:
    """``exact=True`` on floating data (requested or given): the exact path. Integer sums are exact anyway.
    Taking it, the arguments the exact path does not read are checked here, before any work, as the other
    path checks them."""
    if not v.check_flag(exact, "exact", caller):
        return False
    if dtype is not None:
        wanted = v.requested_dtype(dtype, _dt.ARITHMETIC_KINDS, caller).kind == "f"
    else:
        wanted = (getattr(getattr(x, "dtype", None), "kind", None) or np.asarray(x).dtype.kind) == "f"
    if wanted:
        v.check_flag(compute, "compute", caller)
        if not isinstance(algorithm, str):
            raise TypeError(f"{caller}: argument 'algorithm' must be a string; got {algorithm!r}")
        if algorithm != "auto":
            raise ValueError(f"{caller}: argument 'algorithm' is {algorithm!r}, but exact=True runs the exact "
                             "kernels; use algorithm='auto'")
    return wanted


def _exact_now_or_lazy(result, compute, caller: str):
    if not v.check_flag(compute, "compute", caller) or not v.is_dask_array(result):
        return result
    return _on_host(result.compute())


# ------------------------------------------------------------------------------------------------
# NumPy's keywords: where=, initial=, out=
# ------------------------------------------------------------------------------------------------
def _module(kind: str):
    """The array module of an input kind's results: NumPy, CuPy, or dask.array (lazy)."""
    if kind == "cupy":
        import cupy

        return cupy
    if kind.startswith("dask"):
        import dask.array

        return dask.array
    return np


def _masked(x, kind: str, mask, fill):
    """``x`` with the elements where ``mask`` is False replaced by ``fill`` (the operator's identity): a new
    array (lazy for dask: blockwise, so it works with every chunk source), ``x`` itself for no mask. The
    fill is a NumPy scalar of its own dtype, so ``x`` keeps its dtype unless the fill's is wider."""
    if mask is None or mask is True:
        return x
    if mask is False:
        dtype = np.result_type(x.dtype, fill)
        if kind.startswith("dask"):
            return x.map_blocks(_full_like, fill, dtype, dtype=dtype)
        return _full_like(x, fill, dtype)
    return _module(kind).where(mask, x, fill)


def _full_like(block, fill, dtype):
    return np.full_like(block, fill, dtype=dtype)  # CuPy blocks: CuPy's, through __array_function__


def _mask_everywhere(mask, x, kind: str):
    """The mask broadcast to ``x``'s shape and chunks (a view for NumPy and CuPy), for counting: so the
    counts come out chunked as the reductions of ``x``."""
    if mask is None or isinstance(mask, bool):
        mask = _module("cupy" if "cupy" in kind else "numpy").asarray(mask is not False)
    if kind.startswith("dask"):
        import dask.array as da

        return da.broadcast_to(mask, x.shape).rechunk(x.chunks)  # the mask may be chunked otherwise
    return _module(kind).broadcast_to(mask, x.shape)


def _not_nan(x, mask, kind: str):
    """``mask`` and not NaN: the elements a NaN-skipping statistic reads."""
    xp = _module(kind)
    keep = ~xp.isnan(x)
    return keep if mask is None or mask is True else keep & mask


def _fold_block(block, op, start, dtype):
    return np.asarray(op.combine(start, block)).astype(dtype, copy=False) if type(block) is np.ndarray else \
        op.combine(start, block).astype(dtype, copy=False)


def _fold_initial(result, op, start, kind: str, dtype):
    """``start op result``, elementwise: NumPy's ``initial`` comes first in the fold."""
    if kind.startswith("dask"):
        return result.map_blocks(_fold_block, op, start, dtype, dtype=dtype)
    folded = _fold_block(np.asarray(result) if kind == "numpy" else result, op, start, dtype)
    return folded[()] if kind == "numpy" and folded.ndim == 0 else folded


def _filled(x, kind: str, shape: tuple, value, dtype):
    """An array of ``shape`` holding ``value``, of ``x``'s array kind: the result of folding nothing but
    the initial value (an empty min/max with ``initial=``)."""
    if kind.startswith("dask"):
        import dask.array as da

        result = da.full(shape, value, dtype=dtype)
        return result.map_blocks(_module("cupy").asarray, dtype=dtype) if kind == "dask-cupy" else result
    with _run_device(kind, x):
        result = _module(kind).full(shape, value, dtype=dtype)
    return result[()] if kind == "numpy" and not shape else result


def _into(out, result, kind: str, x):
    """``result`` written into ``out`` (checked by ``v.check_out``) and ``out`` returned; ``result``
    itself where there is no ``out``. Unsafe casting, as NumPy's reductions write their ``out``."""
    if out is None:
        return result
    if kind == "cupy":
        import cupy

        with _run_device(kind, x):
            cupy.copyto(out, result, casting="unsafe")
        return out
    np.copyto(out, result, casting="unsafe")
    return out


def _now(result, compute: bool, kind: str):
    """``compute=True`` on dask input: the result on the client, as NumPy."""
    return _on_host(result.compute()) if compute and kind.startswith("dask") else result


def _no_identity_error(op: Operator, caller: str) -> ValueError:
    name = {"min": "minimum", "max": "maximum", "nanmin": "fmin", "nanmax": "fmax"}.get(op.name, op.name)
    return ValueError(f"{caller}: argument 'where' needs 'initial': reduction operation {name!r} does not have an "
                      "identity, so to use a where mask one has to specify 'initial' (as in NumPy)")


def _keyword_reduction(x, op, axis, dtype, keepdims, split_every, algorithm, compute, caller, where, initial, out,
                       plain, *, kinds=None, exact=False, skipnan=False):
    """A reduction by ``op`` with NumPy's ``where=``, ``initial=`` and ``out=``: every argument checked
    first, then ``plain(masked_x)`` (the function without these keywords) reduces ``x`` with the elements
    outside ``where`` replaced by the identity, ``initial`` is folded in first, and the result is written
    into ``out``. ``skipnan``: a NaN-skipping min/max (NaN is left out like a masked element)."""
    op = get_operator(op, caller=caller)
    x, kind = v.as_array(x, caller)
    if kinds is not None:
        v.check_dtype(x.dtype, kinds, caller)
    if split_every is None and kind.startswith("dask"):
        import dask

        split_every = dask.config.get("split_every", None)
    plans, axes, keepdims, _ = _resolve_reduction(kind, op.partials, x.dtype, x.ndim, axis, dtype, keepdims,
                                                  split_every, algorithm, False, None, caller)
    out_dtype = plans[-1].out_dtype
    compute = v.check_flag(compute, "compute", caller)
    exact = exact is not False and _wants_exact(x, dtype, exact, caller, algorithm, compute)
    mask = v.where_mask(where, x, kind, caller)
    ufunc = op.partials.ufunc
    start = v.initial_value(initial, ufunc, x.dtype, dtype, out_dtype, caller)
    if mask is not None and start is None and op.empty_is_error:
        raise _no_identity_error(op, caller)
    if start is not None and exact:
        raise ValueError(f"{caller}: argument 'initial' cannot be folded into a correctly rounded sum "
                         f"(exact=True); got initial={initial!r}: add it to the result, or use exact=False")
    if start is not None and ufunc is None and "cupy" in kind:
        raise TypeError(f"{caller}: argument 'initial' with operator {op.name!r}, which has no NumPy ufunc, takes "
                        f"NumPy or dask (NumPy chunks) input; got {v._KIND_NAMES[kind]} input: fold it into the "
                        "result yourself")
    shape = v.reduced_shape(x.shape, axes, keepdims)
    v.check_out(out, kind, x, shape, out_dtype, caller)

    if start is not None and op.empty_is_error and v.known_empty(x, axes):
        return _into(out, _now(_filled(x, kind, shape, start, out_dtype), compute, kind), kind, x)
    fill = op.partials.identity(out_dtype if op.family == "order" else x.dtype)
    if skipnan and start is not None and x.dtype.kind == "f":
        if np.isnan(start):  # fmin/fmax with a NaN start: the NaN-skipping extreme, NaN for an empty slice
            return _into(out, _now(plain(_masked(x, kind, mask, x.dtype.type(np.nan)), False), compute, kind), kind, x)
        # NaN left out like a masked element: the plain operator folds the rest, with no all-NaN warning
        result = _reduction(_masked(x, kind, _not_nan(x, mask, kind), fill), op.partials, axes, None, keepdims,
                            split_every, algorithm, caller=caller)
    else:
        result = plain(_masked(x, kind, mask, fill), exact)
    if start is not None:
        result = _fold_initial(result, op.partials, start, kind, out_dtype)
    return _into(out, _now(result, compute, kind), kind, x)


def _keyword_mean(x, kind, mask, axes, dtype, keepdims, split_every, algorithm, caller, empty_warning):
    """The mean of the elements of ``x`` where ``mask`` is True: their sum over their count, both
    reductions of the same kind as ``x`` (lazy for dask), finished blockwise with NumPy's warning for
    a slice with no element. ``axes`` normalised; the result keeps the reduced axes if ``keepdims``."""
    requested = v.requested_dtype(dtype, _dt.ARITHMETIC_KINDS, caller)
    out_dtype = _dt.result_dtype("mean", x.dtype, requested)
    total_dtype = np.dtype(np.float32) if out_dtype == np.float16 else out_dtype  # NumPy sums float16 in float32
    total, count = _total_and_count(x, kind, mask, axes, total_dtype, keepdims, split_every, algorithm, caller)
    if kind.startswith("dask"):
        import dask.array as da

        return da.map_blocks(_mean_of, total, count.rechunk(total.chunks), out_dtype, empty_warning, dtype=out_dtype)
    return _mean_of(total, count, out_dtype, empty_warning)


def _total_and_count(x, kind, mask, axes, dtype, keepdims, split_every, algorithm, caller):
    """(the sum in ``dtype`` of the elements of ``x`` where ``mask`` is True, their number)."""
    masked = _masked(x, kind, mask, x.dtype.type(0))
    total = _reduction(masked, "sum", axes, dtype, keepdims, split_every, algorithm, caller=caller)
    count = _reduction(_mask_everywhere(mask, masked, kind), "sum", axes, None, keepdims, split_every, "auto",
                       caller=caller)
    return total, count


def _mean_of(total, count, dtype, empty_warning):
    """``total / count`` in ``dtype``; NumPy's warning where some count is 0 (None: none)."""
    import warnings

    if empty_warning and bool((count == 0).any()):
        warnings.warn(empty_warning, RuntimeWarning, stacklevel=5)  # the caller of mean or nanmean
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).astype(dtype)


def _where_mean(x, axis, dtype, keepdims, split_every, algorithm, compute, exact, where, out, caller):
    """``mean`` with ``where=`` or ``out=``: every argument checked, then the masked mean."""
    x, kind = v.as_array(x, caller)
    if split_every is None and kind.startswith("dask"):
        import dask

        split_every = dask.config.get("split_every", None)
    plans, axes, keepdims, _ = _resolve_reduction(kind, get_operator("sum"), x.dtype, x.ndim, axis, dtype, keepdims,
                                                  split_every, algorithm, True, "mean", caller)
    compute = v.check_flag(compute, "compute", caller)
    exact = exact is not False and _wants_exact(x, dtype, exact, caller, algorithm, compute)
    mask = v.where_mask(where, x, kind, caller)
    if mask is not None and exact:
        raise ValueError(f"{caller}: argument 'where' cannot be combined with exact=True (the correctly rounded mean "
                         "divides by the whole count); use exact=False, or mask 'x' with NaN and "
                         "multireduce.nansum(..., exact=True) / the count")
    v.check_out(out, kind, x, v.reduced_shape(x.shape, axes, keepdims), plans[-1].out_dtype, caller)
    if mask is None:
        result = mean(x, axes, dtype, keepdims, split_every=split_every, algorithm=algorithm, exact=exact)
    else:
        result = _keyword_mean(x, kind, mask, axes, dtype, keepdims, split_every, algorithm, caller,
                               "Mean of empty slice.")
    return _into(out, _now(result, compute, kind), kind, x)


# ------------------------------------------------------------------------------------------------
# Docstrings: one text per shared parameter, in NumPy's style
# ------------------------------------------------------------------------------------------------
_PARAMETERS = {
    "x": """x : array_like, numpy.ndarray, cupy.ndarray or dask.array.Array
    The input. NumPy input is computed now on the CPU, CuPy input now on its GPU, and a Dask array
    gives a lazy Dask array with chunks of the input's type.""",
    "op": """op : str or Operator
    "sum", "prod", "min", "max" or the name of an operator registered with
    ``multireduce.register_operator`` (or the Operator it returned).""",
    "axis": """axis : None or int or tuple of ints, optional
    Axis or axes along which to reduce. The default, None, reduces every axis.""",
    "scan_axis": """axis : int, optional
    Axis along which to scan. The default, None, scans the flattened array.""",
    "dtype": """dtype : data-type, optional
    The type of the result, also used for the accumulator (float16 is accumulated in float32). By
    default, NumPy's rule for this function.""",
    "arg_axis": """axis : None or int, optional
    The axis to search along. The default, None, searches the flattened array.""",
    "moments_dtype": """dtype : data-type, optional
    The type of the result: a floating type (nanmean: complex too). The moments are accumulated in float64
    (complex128 for complex input) whatever it is. By default, NumPy's rule for this function (float64
    for integers and booleans).""",
    "ddof": """ddof : int or float, optional
    Delta degrees of freedom: the divisor is ``N - ddof``, N the number of elements (nanvar/nanstd: of
    non-NaN elements). Default 0.""",
    "segment_x": """x : 1-D numpy.ndarray, cupy.ndarray or dask.array.Array (or array_like)
    The input, one dimension. NumPy input is computed now on the CPU, CuPy input now on its GPU, and a
    Dask array gives a lazy Dask array (segments may straddle its chunks).""",
    "offsets": """offsets : 1-D array_like of integers (NumPy or CuPy)
    The start of each segment, ascending, in [0, len(x)]. CuPy offsets of CuPy input are checked and
    used on the GPU where the segment kernels run; a Dask array of offsets is refused (the segment
    layout shapes the graph: compute it first).""",
    "segment_op": """op : str or Operator, optional
    "sum" (default), "prod", "min", "max" or the name of an operator registered with
    ``multireduce.register_operator`` (or the Operator it returned); non-commutative ones keep element
    order.""",
    "segment_dtype": """dtype : data-type, optional
    The type of the result, also used for the accumulator (float16 is accumulated in float32). By
    default, NumPy's rule for the operator.""",
    "keepdims": """keepdims : bool, optional
    If True, the reduced axes are left in the result with size one.""",
    "inclusive": """inclusive : bool, optional
    True (default): element i of the result includes x[i]. False: an exclusive scan, which starts every
    lane from the operator's identity; the result has as many elements as ``x``.""",
    "split_every": """split_every : int >= 2 or dict of {axis: int >= 1}, optional
    The fan-in of the Dask tree (as in ``dask.array``); by default dask's ``split_every`` config, else
    16. Checked for every input, used for Dask input only.""",
    "algorithm": """algorithm : str, optional
    "auto" (default) or a GPU kernel named by ``multireduce.algorithms()``; other names apply to CuPy
    data only.""",
    "compute": """compute : bool, optional
    For a Dask array: False (default) returns a lazy Dask array; True returns the result now, on the
    client, as NumPy (a whole reduction of a persisted array then runs where its chunks are, without a
    task graph). Other input is computed now in any case.""",
    "accumulate": """accumulate : {"auto", "wide", "input"}, optional
    What float32 results are accumulated in. "auto" (default): float64 where it is free, rounded once per
    element: cumsum of NumPy (and dask-NumPy) data, and on the GPU when
    ``multireduce.dtypes.WIDE_FLOAT32_ON_GPU``; otherwise as "input". "wide": float64 always (at least as
    accurate as ``np.cumsum(x, dtype=np.float64).astype(np.float32)``, bitwise that for NumPy input).
    "input": in the result dtype, as NumPy does (``np.cumsum``'s bits for NumPy input). Other dtypes are
    accumulated as NumPy does in any case (float16 in float32).""",
    "out": """out : numpy.ndarray or cupy.ndarray, optional
    An array of the result's shape to write the result into, returned in place of a new one: a NumPy
    array for NumPy input, a CuPy array on the GPU that holds ``x`` for CuPy input. The result is computed
    as without ``out`` and cast into it as NumPy casts for this function (docs/numpy-keywords.md). Dask
    input raises TypeError (its result is lazy: assign it instead).""",
    "initial": """initial : scalar, optional
    The value the fold starts from, as in NumPy: converted to the result dtype as NumPy converts it, and
    the result of a slice with no element (an empty min or max too). None (default): no start value.""",
    "where": """where : array_like of bool, optional
    Which elements take part, broadcast to the shape of ``x``: a boolean NumPy, CuPy or dask array of the
    kind of ``x`` (a dask ``where`` needs dask ``x``). The others count as the operator's identity, lazily
    for dask; min and max need ``initial`` with it, as in NumPy. Default True: every element.""",
    "stat_where": """where : array_like of bool, optional
    Which elements take part, broadcast to the shape of ``x``: a boolean NumPy, CuPy or dask array of the
    kind of ``x`` (a dask ``where`` needs dask ``x``). The count is of these elements (a slice with none
    gives NaN with NumPy's warning), lazily for dask. Default True: every element.""",
    "correction": """correction : int or float, optional
    ``ddof`` by its NumPy 2 (array API) name; giving both (ddof other than 0) raises ValueError, as in
    NumPy. Default None: ``ddof``.""",
    "exact": """exact : bool, optional
    True: the correctly rounded result (the exact sum, rounded once, half to even), bitwise the same for
    NumPy, CuPy and Dask input with any chunking, fan-in, worker count or placement
    (``multireduce.exact``, docs/numerics.md). Integer input is exact either way.""",
}


# Examples, one per function (multireduce.statistics' too), run by tests/test_docstrings.py: small NumPy and
# Dask arrays, scalars printed so that the text reads the same under every NumPy version
_IMPORT = ">>> import numpy as np, dask.array as da, multireduce as mr\n"
_EXAMPLES = {name: _IMPORT + text.lstrip("\n") for name, text in {
    "sum": """
>>> x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int8)
>>> print(mr.sum(x), mr.sum(x).dtype)  # small integers sum into int64, as in NumPy
21 int64
>>> mr.sum(x, axis=0)
array([5, 7, 9])
>>> d = da.from_array(np.arange(10.0), chunks=3)
>>> mr.sum(d)  # lazy, like dask.array.sum
dask.array<sum-aggregate, shape=(), dtype=float64, chunksize=(), chunktype=numpy.ndarray>
>>> print(mr.sum(d).compute(), mr.sum(d, compute=True))
45.0 45.0
>>> y = np.array([0.1, 0.2, 0.3])
>>> print(mr.sum(y), mr.sum(y, exact=True))  # exact: the correctly rounded sum, for any chunking
0.6000000000000001 0.6""",
    "prod": """
>>> x = np.array([1, 2, 3, 4], dtype=np.int16)
>>> print(mr.prod(x), mr.prod(x).dtype)
24 int64
>>> mr.prod(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
array([ 2., 12.])
>>> print(mr.prod(da.from_array(np.arange(1, 7), chunks=4)).compute())
720""",
    "min": """
>>> x = np.array([[3, 1, 4], [1, 5, 9]])
>>> print(mr.min(x))
1
>>> mr.min(x, axis=1)
array([1, 1])
>>> print(mr.min(np.array([2.0, np.nan, 1.0])))  # NaN propagates, as in NumPy
nan
>>> mr.min(da.from_array(x, chunks=(1, 2)), axis=0).compute()
array([1, 1, 4])""",
    "max": """
>>> x = np.array([[3, 1, 4], [1, 5, 9]])
>>> print(mr.max(x))
9
>>> mr.max(x, axis=0, keepdims=True)
array([[3, 5, 9]])
>>> mr.max(da.from_array(x, chunks=(1, 2)), axis=1).compute()
array([4, 9])""",
    "mean": """
>>> x = np.array([[1, 2], [3, 4]], dtype=np.int32)
>>> print(mr.mean(x))  # integers are averaged in float64
2.5
>>> mr.mean(x, axis=0)
array([2., 3.])
>>> print(mr.mean(da.from_array(np.arange(12.0), chunks=5)).compute())
5.5""",
    "reduce": """
>>> x = np.array([3, 1, 4, 1, 5])
>>> print(mr.reduce(x, "max"), mr.reduce(x, "sum"))
5 14
>>> op = mr.register_operator("bitxor_example", identity=0, cpu=np.bitwise_xor, cuda="a ^ b",
...                           commutative=True, kinds="biu")
>>> print(mr.reduce(np.array([1, 2, 4, 8, 3], dtype=np.uint32), "bitxor_example"))
12
>>> mr.unregister_operator("bitxor_example")""",
    "cumsum": """
>>> mr.cumsum(np.array([1, 2, 3, 4], dtype=np.int8))  # int8 accumulates in int64, as in NumPy
array([ 1,  3,  6, 10])
>>> mr.cumsum(np.array([[1, 2], [3, 4]]), axis=0)
array([[1, 2],
       [4, 6]])
>>> d = da.from_array(np.arange(1.0, 7.0), chunks=2)
>>> mr.cumsum(d).compute()  # each chunk starts from the carry of the chunks before it
array([ 1.,  3.,  6., 10., 15., 21.])""",
    "cumprod": """
>>> mr.cumprod(np.array([1, 2, 3, 4]))
array([ 1,  2,  6, 24])
>>> mr.cumprod(da.from_array(np.array([1.0, 2.0, 0.5, 4.0]), chunks=2)).compute()
array([1., 2., 1., 4.])""",
    "scan": """
>>> x = np.array([3, 1, 4, 1, 5])
>>> mr.scan(x, "max")
array([3, 3, 4, 4, 5])
>>> mr.scan(x, "sum", inclusive=False)  # exclusive: starts from the identity
array([0, 3, 4, 8, 9])
>>> mr.scan(da.from_array(x, chunks=2), "min").compute()
array([3, 1, 1, 1, 1])""",
    "argmax": """
>>> x = np.array([[1, 9, 3], [9, 2, 7]])
>>> print(mr.argmax(x))  # the flat index of the first largest element
1
>>> mr.argmax(x, axis=0)
array([1, 0, 1])
>>> print(mr.argmax(da.from_array(x.ravel(), chunks=4)).compute())  # the index across chunks
1""",
    "argmin": """
>>> x = np.array([[4, 1, 3], [1, 2, 0]])
>>> print(mr.argmin(x))
5
>>> mr.argmin(x, axis=1)
array([1, 2])
>>> print(mr.argmin(da.from_array(x.ravel(), chunks=4)).compute())
5""",
    "nanargmax": """
>>> x = np.array([1.0, np.nan, 3.0, 2.0])
>>> print(mr.nanargmax(x), mr.argmax(x))  # argmax: the first NaN wins
2 1
>>> print(mr.nanargmax(da.from_array(x, chunks=2)).compute())
2""",
    "nanargmin": """
>>> x = np.array([4.0, np.nan, 3.0, 2.0])
>>> print(mr.nanargmin(x), mr.argmin(x))
3 1
>>> print(mr.nanargmin(da.from_array(x, chunks=2)).compute())
3""",
    "var": """
>>> x = np.array([1.0, 2.0, 3.0, 4.0])
>>> print(mr.var(x), mr.var(x, ddof=1))
1.25 1.6666666666666667
>>> mr.var(np.array([[1, 2], [3, 5]]), axis=0)  # integers give float64
array([1. , 2.25])
>>> print(mr.var(da.from_array(x, chunks=3)).compute())  # one pass over the chunks
1.25""",
    "std": """
>>> x = np.array([1.0, 2.0, 3.0, 4.0])
>>> print(mr.std(x))
1.118033988749895
>>> print(mr.std(da.from_array(x, chunks=3), ddof=1).compute())
1.2909944487358056""",
    "nanvar": """
>>> x = np.array([1.0, np.nan, 3.0])
>>> print(mr.nanvar(x), mr.var(x))
1.0 nan
>>> print(mr.nanvar(da.from_array(x, chunks=2)).compute())
1.0""",
    "nanstd": """
>>> x = np.array([1.0, np.nan, 5.0])
>>> print(mr.nanstd(x))
2.0
>>> mr.nanstd(np.array([[1.0, np.nan], [3.0, 4.0]]), axis=0)
array([1., 0.])""",
    "nanmean": """
>>> x = np.array([1.0, np.nan, 3.0])
>>> print(mr.nanmean(x), mr.mean(x))
2.0 nan
>>> print(mr.nanmean(da.from_array(x, chunks=2)).compute())
2.0""",
    "nanmin": """
>>> x = np.array([[2.0, np.nan], [1.0, 4.0]])
>>> print(mr.nanmin(x))
1.0
>>> mr.nanmin(x, axis=0)
array([1., 4.])""",
    "nanmax": """
>>> x = np.array([[2.0, np.nan], [1.0, 4.0]])
>>> print(mr.nanmax(x))
4.0
>>> mr.nanmax(da.from_array(x, chunks=1), axis=1).compute()
array([2., 4.])""",
    "nansum": """
>>> x = np.array([1.0, np.nan, 2.5])
>>> print(mr.nansum(x), mr.sum(x))
3.5 nan
>>> print(mr.nansum(da.from_array(x, chunks=2)).compute())
3.5""",
    "nanprod": """
>>> x = np.array([2.0, np.nan, 2.5])
>>> print(mr.nanprod(x))
5.0
>>> mr.nanprod(np.array([[np.nan, 3.0], [2.0, 4.0]]), axis=0)
array([ 2., 12.])""",
    "nancumsum": """
>>> x = np.array([1.0, np.nan, 2.5])
>>> mr.nancumsum(x)
array([1. , 1. , 3.5])
>>> mr.nancumsum(da.from_array(x, chunks=2)).compute()
array([1. , 1. , 3.5])""",
    "nancumprod": """
>>> x = np.array([2.0, np.nan, 2.5])
>>> mr.nancumprod(x)
array([2., 2., 5.])
>>> mr.nancumprod(da.from_array(x, chunks=2)).compute()
array([2., 2., 5.])""",
    "any": """
>>> x = np.array([[0, 0], [0, 3]])
>>> print(mr.any(x))
True
>>> mr.any(x, axis=0)
array([False,  True])
>>> print(mr.any(np.array([0.0, np.nan])))  # NaN is not zero
True""",
    "all": """
>>> x = np.array([[1, 2], [0, 3]])
>>> print(mr.all(x))
False
>>> mr.all(x, axis=1)
array([ True, False])
>>> print(mr.all(da.from_array(x, chunks=1)[0]).compute())
True""",
    "count_nonzero": """
>>> x = np.array([[0, 1, 2], [3, 0, 0]])
>>> print(mr.count_nonzero(x))
3
>>> mr.count_nonzero(x, axis=0)
array([1, 1, 1])
>>> print(mr.count_nonzero(da.from_array(x, chunks=1)).compute())
3""",
    "segment_reduce": """
>>> x = np.arange(1, 9)  # 1 .. 8
>>> mr.segment_reduce(x, [0, 3, 3, 5])  # [1 2 3], [], [4 5], [6 7 8]: an empty segment gives 0
array([ 6,  0,  9, 21])
>>> mr.segment_reduce(x, [0, 3, 5], op="max")
array([3, 5, 8])
>>> mr.segment_reduce(da.from_array(x, chunks=3), [0, 2, 5]).compute()  # segments across chunks
array([ 3, 12, 21])""",
    "segment_scan": """
>>> x = np.arange(1, 9)
>>> mr.segment_scan(x, [0, 3, 5])  # restarts at 3 and at 5
array([ 1,  3,  6,  4,  9,  6, 13, 21])
>>> mr.segment_scan(da.from_array(x, chunks=3), [0, 3, 5], op="max").compute()
array([1, 2, 3, 4, 5, 6, 7, 8])""",
}.items()}


def document(fn, params: tuple[str, ...], returns: str, summary: str | None = None, examples: str | None = None):
    """Give ``fn`` a NumPy-style docstring: ``summary`` (default: ``fn``'s own docstring), then the shared
    texts of ``params`` and ``returns``, then ``examples`` (default: ``_EXAMPLES`` under ``fn``'s name, if
    any). Returns ``fn``."""
    import inspect

    signature = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        # ``**unknown`` only turns a keyword the function does not take into a clear error
        fn.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values()
                                                         if p.kind is not p.VAR_KEYWORD])
    summary = inspect.cleandoc(fn.__doc__ or "") if summary is None else summary
    body = "\n".join(_PARAMETERS[p] for p in params)
    examples = _EXAMPLES.get(fn.__name__) if examples is None else examples
    tail = f"\nExamples\n--------\n{examples.strip()}\n" if examples else ""
    fn.__doc__ = f"{summary}\n\nParameters\n----------\n{body}\n\nReturns\n-------\n{returns}\n{tail}"
    return fn


def _doc(summary: str, params: tuple[str, ...], returns: str):
    """``document`` as a decorator."""
    return lambda fn: document(fn, params, returns, summary)


_REDUCTION = ("x", "axis", "dtype", "keepdims", "out", "initial", "where", "split_every", "algorithm", "compute")
_MEAN = ("x", "axis", "dtype", "keepdims", "out", "stat_where", "split_every", "algorithm", "compute", "exact")
_SCAN = ("x", "scan_axis", "dtype", "out", "split_every", "algorithm")
_REDUCED = """out : numpy scalar or array, cupy.ndarray or dask.array.Array
    The reduced array: a NumPy scalar where every axis of NumPy input is reduced."""
_SCANNED = """out : numpy.ndarray, cupy.ndarray or dask.array.Array
    An array of the shape of ``x`` (flattened for ``axis=None``)."""


# ------------------------------------------------------------------------------------------------
# Reductions
# ------------------------------------------------------------------------------------------------
def _keywords_given(where, initial, out) -> bool:
    return where is not True or initial is not None or out is not None


@_doc("Reduce ``x`` with the associative operator ``op``.", _REDUCTION[:1] + ("op",) + _REDUCTION[1:], _REDUCED)
def reduce(x, op: str | Operator, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True,
           split_every=None, algorithm="auto", compute=False, **unknown):
    if unknown:
        raise v.unknown_keywords(reduce, unknown)
    if _keywords_given(where, initial, out):
        caller = "multireduce.reduce"
        return _keyword_reduction(x, op, axis, dtype, keepdims, split_every, algorithm, compute, caller, where, initial,
                                  out, lambda xm, exact: _reduction(xm, op, axis, dtype, keepdims, split_every,
                                                                    algorithm, caller=caller))
    return _reduction(x, op, axis, dtype, keepdims, split_every, algorithm, caller="multireduce.reduce",
                      compute=compute)


def _called(fn, x, axis, dtype, keepdims, out, initial, where, split_every, algorithm, compute, unknown):
    """prod, min and max as called: NumPy's keywords, where given, take the masked path."""
    name = fn.__name__
    caller = f"multireduce.{name}"
    if unknown:
        raise v.unknown_keywords(fn, unknown)
    if _keywords_given(where, initial, out):
        return _keyword_reduction(x, name, axis, dtype, keepdims, split_every, algorithm, compute, caller, where,
                                  initial, out, lambda xm, exact: _reduction(
                                      xm, name, axis, dtype, keepdims, split_every, algorithm, caller=caller))
    return _reduction(x, name, axis, dtype, keepdims, split_every, algorithm, caller=caller, compute=compute)


@_doc("Sum of elements, as ``numpy.sum`` (small integers and booleans sum into int64 / uint64).",
      _REDUCTION + ("exact",), _REDUCED)
def sum(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
        algorithm="auto", compute=False, exact=False, **unknown):
    if unknown:
        raise v.unknown_keywords(sum, unknown)
    if _keywords_given(where, initial, out):
        return _keyword_reduction(x, "sum", axis, dtype, keepdims, split_every, algorithm, compute, "multireduce.sum",
                                  where, initial, out, lambda xm, exact: sum(
                                      xm, axis, dtype, keepdims, split_every=split_every, algorithm=algorithm,
                                      exact=exact), exact=exact)
    if exact is not False and _wants_exact(x, dtype, exact, "multireduce.sum", algorithm, compute):
        return _exact_now_or_lazy(_exact.sum(x, axis, dtype, keepdims, split_every, caller="multireduce.sum"),
                                  compute, "multireduce.sum")
    return _reduction(x, "sum", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.sum", compute=compute)


@_doc("Product of elements, as ``numpy.prod``; integer overflow wraps as in NumPy.", _REDUCTION, _REDUCED)
def prod(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
         algorithm="auto", compute=False, **unknown):
    return _called(prod, x, axis, dtype, keepdims, out, initial, where, split_every, algorithm, compute, unknown)


@_doc("Minimum, as ``numpy.min``: NaN propagates; empty input raises ValueError. ``dtype`` (an extension over "
      "NumPy) converts the elements before they are compared.", _REDUCTION, _REDUCED)
def min(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
        algorithm="auto", compute=False, **unknown):
    return _called(min, x, axis, dtype, keepdims, out, initial, where, split_every, algorithm, compute, unknown)


@_doc("Maximum, as ``numpy.max``: NaN propagates; empty input raises ValueError. ``dtype`` (an extension over "
      "NumPy) converts the elements before they are compared.", _REDUCTION, _REDUCED)
def max(x, axis=None, dtype=None, keepdims=False, *, out=None, initial=None, where=True, split_every=None,
        algorithm="auto", compute=False, **unknown):
    return _called(max, x, axis, dtype, keepdims, out, initial, where, split_every, algorithm, compute, unknown)


@_doc("Arithmetic mean, as ``numpy.mean`` (integers in float64, float16 accumulated in float32; a narrow "
      "``dtype=`` sums in that type and divides as NumPy does).", _MEAN, _REDUCED)
def mean(x, axis=None, dtype=None, keepdims=False, *, out=None, where=True, split_every=None, algorithm="auto",
         compute=False, exact=False, **unknown):
    if unknown:
        raise v.unknown_keywords(mean, unknown)
    if where is not True or out is not None:
        return _where_mean(x, axis, dtype, keepdims, split_every, algorithm, compute, exact, where, out,
                           "multireduce.mean")
    if exact is not False and _wants_exact(x, dtype, exact, "multireduce.mean", algorithm, compute):
        return _exact_now_or_lazy(_exact.mean(x, axis, dtype, keepdims, split_every, caller="multireduce.mean"),
                                  compute, "multireduce.mean")
    return _reduction(x, "sum", axis, dtype, keepdims, split_every, algorithm, caller="multireduce.mean",
                      mean=True, label="mean", compute=compute)


# ------------------------------------------------------------------------------------------------
# Scans
# ------------------------------------------------------------------------------------------------
@_doc("Inclusive (default) or exclusive scan of ``x`` with ``op``; ``op`` must be associative, not necessarily "
      "commutative (element order is kept everywhere).",
      _SCAN[:1] + ("op",) + _SCAN[1:4] + ("inclusive",) + _SCAN[4:] + ("accumulate",), _SCANNED)
def scan(x, op: str | Operator, axis=None, dtype=None, *, out=None, inclusive=True, split_every=None,
         algorithm="auto", accumulate="auto", **unknown):
    if unknown:
        raise v.unknown_keywords(scan, unknown)
    return _scan(x, op, axis, dtype, inclusive, algorithm, caller="multireduce.scan", split_every=split_every,
                 accumulate=accumulate, out=out)


@_doc("Cumulative sum, as ``numpy.cumsum``; float32 is accumulated in float64 where that is free "
      "(``accumulate=``).", _SCAN + ("accumulate", "exact"), _SCANNED)
def cumsum(x, axis=None, dtype=None, *, out=None, split_every=None, algorithm="auto", accumulate="auto", exact=False,
           **unknown):
    if unknown:
        raise v.unknown_keywords(cumsum, unknown)
    _check_accumulate(accumulate, "multireduce.cumsum")
    if _wants_exact(x, dtype, exact, "multireduce.cumsum", algorithm):
        return _exact_scan_into(out, x, axis, dtype, "multireduce.cumsum",
                                lambda: _exact.cumsum(x, axis, dtype, split_every, caller="multireduce.cumsum"))
    return _scan(x, "sum", axis, dtype, True, algorithm, caller="multireduce.cumsum", label="cumsum",
                 split_every=split_every, accumulate=accumulate, out=out)


def _exact_scan_into(out, x, axis, dtype, caller: str, scan):
    """An exact scan (``scan()``), written into ``out`` as the other scans are: ``out`` checked first."""
    if out is None:
        return scan()
    y, kind = v.as_array(x, caller)
    shape = (y.size,) if axis is None else y.shape
    v.check_out(out, kind, y, shape, np.dtype(dtype) if dtype is not None else y.dtype, caller)
    result = scan()
    with _run_device(kind, y):
        return _into(out, result, kind, y)


@_doc("Cumulative product, as ``numpy.cumprod``.", _SCAN + ("accumulate",), _SCANNED)
def cumprod(x, axis=None, dtype=None, *, out=None, split_every=None, algorithm="auto", accumulate="auto", **unknown):
    if unknown:
        raise v.unknown_keywords(cumprod, unknown)
    return _scan(x, "prod", axis, dtype, True, algorithm, caller="multireduce.cumprod", label="cumprod",
                 split_every=split_every, accumulate=accumulate, out=out)
