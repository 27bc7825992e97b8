"""Argument checks for the public API: every error names the argument, what was expected and what came.

All of them run before any work starts, and none modifies what the user passed.
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from . import dtypes as _dt
from .backends import is_cupy_array
from .catalogue import CATALOGUE
from .operators import Operator

try:  # NumPy >= 1.25
    from numpy.exceptions import AxisError
except ImportError:  # pragma: no cover
    from numpy import AxisError


def is_dask_array(x) -> bool:
    # a dask array can exist only once dask.array is imported, so import time need not pay for it here
    dask_array = sys.modules.get("dask.array")
    return dask_array is not None and isinstance(x, dask_array.Array)


QUERY_PLANNING_ERROR = (
    "argument 'x' is a dask array built with dask's array expressions (dask.config 'array.query-planning' "
    "is True), which multireduce does not support yet; set dask.config.set({'array.query-planning': False}) "
    "(or DASK_ARRAY__QUERY_PLANNING=False) before dask.array is first imported")


def is_expression_array(x) -> bool:
    """A dask array of dask's array expressions (``array.query-planning``)."""
    return type(x).__module__.startswith("dask.array._array_expr")


def array_kind(x) -> str:
    """'dask', 'cupy' or 'numpy'; dask arrays whose chunks are neither raise."""
    if is_dask_array(x):
        if is_expression_array(x):
            raise TypeError(f"multireduce: {QUERY_PLANNING_ERROR}")
        meta = x._meta
        if is_cupy_array(meta):
            return "dask-cupy"
        if type(meta) is np.ndarray:
            return "dask-numpy"
        raise TypeError(
            f"argument 'x' is a dask array with chunks of type {type(meta).__module__}.{type(meta).__name__}; "
            "expected NumPy or CuPy chunks"
        )
    if is_cupy_array(x):
        return "cupy"
    return "numpy"


def _native(x):
    """``x`` in native byte order: ufuncs refuse a ``dtype=`` that differs from the data's only by byte
    order, and kernels read native words. A new array (lazily, chunk by chunk, for dask); ``x`` itself is
    left as it is."""
    dt = x.dtype
    if dt.isnative:
        return x
    return x.astype(dt.newbyteorder("="))


def as_array(x, caller: str):
    """(array, kind): ``x`` itself for NumPy, CuPy and Dask arrays (a native-byte-order copy where it
    is big-endian on a little-endian machine, or the reverse); array-likes (lists, scalars) become NumPy
    arrays. ``kind`` is 'numpy', 'cupy', 'dask-numpy' or 'dask-cupy'."""
    cls = type(x)
    if cls is np.ndarray:
        return _native(x), "numpy"
    if cls.__module__.startswith("cupy"):
        return x, "cupy"
    if hasattr(x, "dims") and hasattr(x, "coords"):  # xarray's DataArray and Dataset, without importing xarray
        name = caller.rsplit(".", 1)[-1]
        name, skip = (name[3:], ", skipna=True") if name.startswith("nan") else (name, "")
        raise TypeError(f"{caller}: argument 'x' is an xarray {cls.__name__}; expected a NumPy, CuPy or dask array. "
                        f"After `import multireduce.xarray`, use x.mr.{name}(dim=...{skip}), which keeps dims and "
                        "coords and stays lazy for dask-backed data; or pass x.data")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{caller}: argument 'x' is a masked array; expected a plain array (use x.filled(...))")
    if is_dask_array(x):
        kind = array_kind(x)
        return (_native(x) if kind == "dask-numpy" else x), kind
    if hasattr(x, "__cuda_array_interface__"):
        raise TypeError(
            f"{caller}: argument 'x' is a {type(x).__name__} on the GPU; expected a CuPy array "
            "(wrap it with cupy.asarray(x), which does not copy)"
        )
    try:
        return _native(np.asarray(x)), "numpy"
    except Exception as exc:
        raise TypeError(f"{caller}: argument 'x' must be an array; got {type(x).__name__} ({exc})") from None


def check_dtype(dtype, kinds: str, caller: str) -> None:
    """``x``'s dtype must be of one of ``kinds`` (NumPy kind letters)."""
    if dtype.kind not in kinds:
        raise TypeError(f"{caller}: argument 'x' has dtype {dtype}; expected a {_dt.describe_kinds(kinds)} dtype")


def requested_dtype(dtype, kinds: str, caller: str):
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{caller}: argument 'dtype' must be a NumPy dtype; got {dtype!r}") from None
    if dt.kind not in kinds:
        raise TypeError(f"{caller}: argument 'dtype' is {dt}; expected a {_dt.describe_kinds(kinds)} dtype")
    return dt


def check_gpu_dtypes(caller: str, **dtypes) -> None:
    for label, dt in dtypes.items():
        if not _dt.gpu_supported(dt):
            supported = ", ".join(str(d) for d in _dt.GPU_DTYPES)
            raise TypeError(f"{caller}: {label} {np.dtype(dt)} is not supported on the GPU; supported: {supported}")


def normalize_axes(axis, ndim: int, caller: str) -> tuple[int, ...]:
    """None -> every axis; int or tuple of ints -> sorted non-negative axes; range and repeats are errors."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Integral):
            raise TypeError(f"{caller}: argument 'axis' must be None, an int or a tuple of ints; got {axis!r}")
        a = int(a)
        if not -ndim <= a < ndim:
            raise AxisError(a, ndim, msg_prefix=f"{caller}: argument 'axis'")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{caller}: argument 'axis' repeats an axis; got {axis!r}")
    return tuple(sorted(out))


def normalize_scan_axis(axis, ndim: int, caller: str) -> int:
    if axis is None:
        return 0
    if isinstance(axis, tuple):
        raise TypeError(f"{caller}: argument 'axis' must be None or an int for a scan; got {axis!r}")
    return normalize_axes(axis, ndim, caller)[0]


def check_flag(value, name: str, caller: str) -> bool:
    """A True/False argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{caller}: argument '{name}' must be True or False; got {value!r}")
    return bool(value)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def fan_in(split_every, axes: tuple[int, ...], caller: str) -> int:
    """The tree's fan-in: ``split_every`` (int >= 2 or dask's {axis: int >= 1}), else dask's config, else
    16. Every entry point and input kind calls this, so a value is accepted or refused the same way
    everywhere, also where it is then unused (NumPy and CuPy input)."""
    if split_every is None:
        # dask is loaded whenever the input is a dask array; NumPy and CuPy calls must not import it (or need it)
        dask = sys.modules.get("dask")
        split_every = (dask.config.get("split_every", None) if dask is not None else None) or 16
    if isinstance(split_every, dict):
        if not all(_is_int(k) and _is_int(v) and v >= 1 for k, v in split_every.items()):
            raise ValueError(f"{caller}: argument 'split_every' as a dict must map int axes to ints >= 1; "
                             f"got {split_every!r}")
        return max(2, math.prod(int(split_every.get(a, 1)) for a in axes))
    if not _is_int(split_every) or split_every < 2:
        raise ValueError(f"{caller}: argument 'split_every' must be an int >= 2 or a dict of axis -> int; got {split_every!r}")
    return int(split_every)


def check_algorithm(algorithm, family: str, kind: str, op: Operator, caller: str) -> str:
    if not isinstance(algorithm, str):
        raise TypeError(f"{caller}: argument 'algorithm' must be a string; got {algorithm!r}")
    if algorithm == "auto":
        return algorithm
    entry = CATALOGUE.get(algorithm)
    if entry is None or entry.family != family:
        names = ["auto"] + [a.name for a in CATALOGUE.values() if a.family == family]
        raise ValueError(f"{caller}: argument 'algorithm' must be one of {', '.join(map(repr, names))}; got {algorithm!r}")
    if "cupy" not in kind:
        raise ValueError(
            f"{caller}: argument 'algorithm' is {algorithm!r}, a GPU kernel, but 'x' holds NumPy data; "
            "use algorithm='auto' or pass CuPy data"
        )
    if not op.commutative and not entry.keeps_order:
        keeping = ", ".join(repr(a.name) for a in CATALOGUE.values() if a.family == family and a.keeps_order)
        raise ValueError(
            f"{caller}: argument 'algorithm' is {algorithm!r}, which reorders elements, but operator {op.name!r} "
            f"is not commutative; use 'auto' or one of {keeping}"
        )
    return algorithm


def known_empty(x, axes: tuple[int, ...]) -> bool:
    """True when the shape is known and some reduced axis has length 0."""
    sizes = [x.shape[a] for a in axes]
    if any(isinstance(s, float) and math.isnan(s) for s in sizes):
        return False
    return math.prod(sizes) == 0


def flattened(x, kind: str, caller: str):
    """``x`` flattened in C order, for a scan over ``axis=None``. Dask: unknown chunk sizes cannot be
    flattened (refused, naming ``x``), and zero-length chunks are dropped first, because dask's reshape
    cannot line them up across dimensions (it raises on shapes NumPy flattens)."""
    if kind.startswith("dask") and x.ndim > 1:
        if any(isinstance(c, float) and math.isnan(c) for cs in x.chunks for c in cs):
            raise ValueError(f"{caller}: argument 'x' has unknown chunk sizes, so it cannot be flattened for "
                             "axis=None; call x.compute_chunk_sizes() first or pass an axis")
        if any(c == 0 for cs in x.chunks for c in cs):
            x = x.rechunk(tuple(tuple(c for c in cs if c) or (0,) for cs in x.chunks))
    return x.reshape(-1)


# ------------------------------------------------------------------------------------------------
# NumPy's keywords: where=, initial=, out=, correction=
# ------------------------------------------------------------------------------------------------
_KIND_NAMES = {"numpy": "NumPy", "cupy": "CuPy", "dask-numpy": "dask (NumPy chunks)", "dask-cupy": "dask (CuPy chunks)"}


def reduced_shape(shape, axes: tuple[int, ...], keepdims: bool) -> tuple:
    """The shape of a reduction of ``shape`` over ``axes``."""
    if keepdims:
        return tuple(1 if d in axes else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in axes)


def _described(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "ndim", 0):
        return f"{type(value).__module__.split('.')[0]}.{type(value).__name__} of shape {shape}, dtype {value.dtype}"
    return repr(value)


def where_mask(where, x, kind: str, caller: str):
    """``where=`` checked before any work: None for NumPy's default ``True`` (every element); else a boolean
    array of ``x``'s array kind that broadcasts to ``x``'s shape, or a Python bool for a 0-d mask of NumPy
    or CuPy input. Lists and scalars become NumPy arrays; nothing the caller passed is modified."""
    if where is True:
        return None
    if is_dask_array(where):
        if not kind.startswith("dask"):
            raise TypeError(f"{caller}: argument 'where' is a dask array, but 'x' is a {_KIND_NAMES[kind]} array, "
                            "which is reduced now; pass where.compute(), or x as a dask array")
        if array_kind(where) != kind:
            raise TypeError(f"{caller}: argument 'where' is a {_KIND_NAMES[array_kind(where)]} array, but 'x' is a "
                            f"{_KIND_NAMES[kind]} array; expected the same chunk type")
    elif is_cupy_array(where):
        if "cupy" not in kind:
            raise TypeError(f"{caller}: argument 'where' is a CuPy array, but 'x' holds NumPy data; pass "
                            "cupy.asnumpy(where)")
    else:
        try:
            where = np.asarray(where)
        except Exception as exc:
            raise TypeError(f"{caller}: argument 'where' must be a boolean array; got "
                            f"{type(where).__name__} ({exc})") from None
        if "cupy" in kind and where.ndim:
            raise TypeError(f"{caller}: argument 'where' is a NumPy array, but 'x' holds CuPy data; pass "
                            "cupy.asarray(where)")
    if where.dtype != np.bool_:
        raise TypeError(f"{caller}: argument 'where' must be a boolean array (NumPy casts it to bool only "
                        f"safely); got dtype {where.dtype}")
    if where.ndim == 0 and not is_dask_array(where):
        return bool(where)
    sizes = tuple(where.shape) + tuple(x.shape)
    if not any(isinstance(s, float) and math.isnan(s) for s in sizes):
        try:
            fits = np.broadcast_shapes(where.shape, x.shape) == tuple(x.shape)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{caller}: argument 'where' must broadcast to the shape of 'x', {tuple(x.shape)}; "
                             f"got shape {tuple(where.shape)}")
    return where


def initial_value(initial, ufunc, x_dtype, dtype, out_dtype, caller: str):
    """``initial=`` as a NumPy scalar of ``out_dtype``, converted as NumPy converts it (``ufunc.reduce``
    of nothing: a Python int outside the type raises OverflowError, a float for an integer type
    truncates, ``None`` means no initial value); ``ufunc`` None (a user operator): cast to ``out_dtype``."""
    if initial is None:
        return None
    try:
        if ufunc is not None:
            value = ufunc.reduce(np.empty(0, x_dtype), dtype=dtype, initial=initial)
        elif np.ndim(initial) != 0:
            raise ValueError(f"expected a scalar, got {np.ndim(initial)} dimensions")
        else:
            value = np.asarray(initial).astype(out_dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        kind = next(k for k in (OverflowError, TypeError, ValueError) if isinstance(exc, k))
        raise kind(f"{caller}: argument 'initial' must be a scalar that converts to the result dtype "
                   f"{np.dtype(out_dtype)}; got {initial!r} ({exc})") from None
    return np.asarray(value).astype(out_dtype)[()]


#: casting rules for ``out=`` as NumPy applies them: reductions cast unsafely, std through sqrt
#: ("same_kind"), the NaN-skipping moments of inexact input want an inexact ``out``, and an index
#: result wants an ``out`` whose dtype casts safely to intp
OUT_CASTING = ("unsafe", "same_kind", "inexact", "index")


def check_out(out, kind: str, x, shape: tuple, dtype, caller: str, casting: str = "unsafe") -> None:
    """``out=`` checked before any work: an array of ``x``'s array kind (NumPy or CuPy; dask results
    are lazy), of the result's ``shape``, writable, whose dtype the result's ``dtype`` casts to."""
    if out is None:
        return
    if kind.startswith("dask"):
        raise TypeError(f"{caller}: argument 'out' is for NumPy and CuPy input; 'x' is a dask array, whose result "
                        "is a lazy dask array: assign the result instead (y = ...), or copy its computed value "
                        "(out[...] = y.compute())")
    if kind == "cupy":
        if not is_cupy_array(out):
            raise TypeError(f"{caller}: argument 'out' must be a cupy.ndarray for CuPy input; got "
                            f"{type(out).__module__}.{type(out).__name__}")
        if out.data.device_id != x.data.device_id:
            raise ValueError(f"{caller}: argument 'out' is on GPU {out.data.device_id}, 'x' on GPU "
                             f"{x.data.device_id}; expected the GPU that holds 'x'")
    elif not isinstance(out, np.ndarray):
        raise TypeError(f"{caller}: argument 'out' must be a numpy.ndarray for NumPy input; got "
                        f"{type(out).__module__}.{type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{caller}: argument 'out' must have the shape of the result, {tuple(shape)}; got shape "
                         f"{tuple(out.shape)}")
    if kind == "numpy" and not out.flags.writeable:
        raise ValueError(f"{caller}: argument 'out' is read-only; expected a writable array")
    dtype = np.dtype(dtype)
    if casting == "index":
        if not np.can_cast(out.dtype, np.intp, "safe"):
            raise TypeError(f"{caller}: argument 'out' must have an integer dtype that casts safely to "
                            f"{np.dtype(np.intp)} (as in NumPy); got dtype {out.dtype}")
    elif casting == "inexact":
        if out.dtype.kind not in "fc":
            raise TypeError(f"{caller}: argument 'out' must have a floating or complex dtype for inexact 'x' "
                            f"(as in NumPy); got dtype {out.dtype}")
    elif not np.can_cast(dtype, out.dtype, casting):
        raise TypeError(f"{caller}: argument 'out' has dtype {out.dtype}, to which the result's dtype {dtype} does "
                        f"not cast with casting={casting!r} (as in NumPy)")


def ddof_or_correction(ddof, correction, caller: str):
    """``correction=`` (NumPy 2, the array API) is ``ddof`` by another name; both given is an error, as
    in NumPy (ddof left at 0 counts as not given)."""
    if correction is None:
        return ddof
    if isinstance(ddof, (bool, np.bool_)) or not isinstance(ddof, numbers.Real) or ddof != 0:
        raise ValueError(f"{caller}: arguments 'ddof' and 'correction' can't be provided simultaneously (as in "
                         f"NumPy); got ddof={ddof!r}, correction={correction!r}")
    return correction


_KEYWORD_HINTS = {
    "where": "mask 'x' first (e.g. np.where(where, x, 0) for a sum)",
    "initial": "fold it into the result yourself",
    "out": "assign the result instead",
}


def unknown_keywords(fn, given: dict) -> TypeError:
    """The error for keyword arguments ``fn`` does not take: names them and their values, what ``fn``
    accepts, and whether NumPy's function of that name takes them."""
    import inspect

    caller = f"multireduce.{fn.__name__}"
    accepted = [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    try:
        numpy_params = inspect.signature(getattr(np, fn.__name__)).parameters
    except (AttributeError, TypeError, ValueError):
        numpy_params = {}
    notes = []
    for name, value in given.items():
        note = f"{name}={_described(value)}"
        if name in numpy_params:
            note += f" (numpy.{fn.__name__} takes it; {caller} cannot honour it here"
            note += f": {_KEYWORD_HINTS[name]})" if name in _KEYWORD_HINTS else ")"
        elif name in _KEYWORD_HINTS:
            note += f" (numpy.{fn.__name__} has no '{name}' either)" if numpy_params else ""
        notes.append(note)
    s = "s" if len(given) > 1 else ""
    return TypeError(f"{caller}: unexpected keyword argument{s} {', '.join(notes)}; it accepts "
                     f"{', '.join(accepted)}")
