"""The one dtype table: which dtypes each operator takes, what it returns, what it accumulates in.

Everything else (validation, the NumPy and CuPy backends, the list of kernel instantiations that CI
compiles) is derived from this table, so adding a dtype is one line here.

NumPy's rules are followed for results: small integers and booleans are summed into the platform
integer (int64 / uint64), floats keep their width, ``mean`` of integers is float64. Where NumPy
accumulates float16 in float16, multireduce accumulates in float32 and rounds once at the end.
"""

from __future__ import annotations

import numpy as np

#: dtype -> the C++ type name used by the CUDA kernels (``mr::half`` is our own 16-bit float).
CUDA_TYPE_NAMES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.float16): "mr::half",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

#: Every dtype the GPU kernels are instantiated for, in a stable order.
GPU_DTYPES: tuple[np.dtype, ...] = tuple(CUDA_TYPE_NAMES)

#: dtype kinds each operator family accepts (NumPy's ``dtype.kind`` letters).
ARITHMETIC_KINDS = "biufc"  # sum, prod, mean, cumsum, cumprod
ORDERED_KINDS = "biuf"  # min, max: complex numbers have no order that means anything here
USER_KINDS = "biuf"  # registered operators, unless they say otherwise

KIND_NAMES = {
    "b": "boolean",
    "i": "signed integer",
    "u": "unsigned integer",
    "f": "floating",
    "c": "complex",
}


def describe_kinds(kinds: str) -> str:
    """'biuf' -> 'boolean, signed integer, unsigned integer or floating'."""
    names = [KIND_NAMES[k] for k in kinds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _promote_for_sum(dtype: np.dtype) -> np.dtype:
    """NumPy's result type of ``add.reduce`` / ``multiply.reduce`` without ``dtype=``."""
    if dtype.kind == "b":
        return np.dtype(np.int_)
    if dtype.kind == "i" and dtype.itemsize < np.dtype(np.int_).itemsize:
        return np.dtype(np.int_)
    if dtype.kind == "u" and dtype.itemsize < np.dtype(np.uint).itemsize:
        return np.dtype(np.uint)
    return dtype


#: Accumulate float32 sums and scans (``sum``, ``mean``, ``cumsum``) in float64 on the GPU by default,
#: rounding once to float32 at the end (the output dtype is unchanged). The one switch for it: False until
#: the device run shows it costs nothing measurable (benchmarks/bench_reduce.py and bench_scan.py time
#: both side by side; docs/numerics.md). ``accumulate="wide"`` on the scans asks for it per call.
WIDE_FLOAT32_ON_GPU = False

#: Accumulate float32 sums and means of a Dask array of CuPy chunks over a leading run of its axes (not all:
#: a mean over time of a time x lat x lon field, a column sum of a matrix) in float64, rounded once to
#: float32 at the end, unless a dtype is asked for. Each chunk's partial there has as many elements as the
#: result (the partials of chunks along the reduced axes are summed together), where the wider accumulator
#: costs nothing measurable (0.179 ms against 0.165 for a plain read of a 166 x 721 x 1440 chunk, H200),
#: and float64 totals of float32 values are exact in any order wherever the chunks' sum bounds allow
#: (``exact_in_any_order``): each worker then sums its own chunks, and one total per worker crosses
#: instead of a float32 partial per chunk folded in chunk order (the field's mean over time on 4 x H200:
#: 29 against 116 ms). More accurate than float32 accumulation, and other bits than it; CuPy arrays, whole
#: reductions and trailing axes keep WIDE_FLOAT32_ON_GPU's choice.
WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS = True

#: ``accumulate=`` values of the scans: "auto" (float32 sums in float64 where that is free: on the CPU
#: for cumsum, on the GPU when WIDE_FLOAT32_ON_GPU), "wide" (float32 results accumulated in float64),
#: "input" (in the result dtype: ``np.cumsum``'s bits for NumPy input).
ACCUMULATE_CHOICES = ("auto", "wide", "input")


def wide_accumulator(result: np.dtype) -> np.dtype | None:
    """The wider accumulator of ``accumulate="wide"`` for ``result``: float64 for float32, else None."""
    return np.dtype(np.float64) if np.dtype(result) == np.float32 else None


def accumulator_dtype(result: np.dtype, accumulate: str = "input", where: str = "cpu", scan: bool = False) -> np.dtype:
    """What partial results are held in: the result type, but float16 work happens in float32.

    ``accumulate`` (ACCUMULATE_CHOICES; callers pass "auto" for the sum operator only) may widen float32
    results to float64: "wide" always; "auto" for scans on the CPU (``where="cpu"``, ``scan=True``: the
    NumPy backend's blocked float64 scan costs about what ``np.cumsum`` does and is at least as accurate as
    ``np.cumsum(x, dtype=float64).astype(float32)``, where float32 accumulation stops growing at 2^24), for
    everything on the GPU when WIDE_FLOAT32_ON_GPU, and for reductions of a Dask array of CuPy chunks over
    a leading run of its axes (``where="gpus, some axes"``) when WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS."""
    result = np.dtype(result)
    wide = wide_accumulator(result)
    on_gpu = where in ("gpu", "gpus, some axes")
    if wide is not None and (accumulate == "wide" or (accumulate == "auto" and (
            (where == "cpu" and scan) or (on_gpu and WIDE_FLOAT32_ON_GPU)
            or (where == "gpus, some axes" and not scan and WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS)))):
        return wide
    if result == np.float16:
        return np.dtype(np.float32)
    if result == np.complex64:
        return np.dtype(np.complex64)
    return result


def result_dtype(family: str, dtype: np.dtype, requested: np.dtype | None = None) -> np.dtype:
    """The dtype an operator family returns for input ``dtype`` (``requested`` is the user's ``dtype=``).

    ``family`` is "sum" (also prod, cumsum, cumprod), "order" (min, max), "mean" or "user".
    """
    if requested is not None:
        return requested
    if family == "sum":
        return _promote_for_sum(dtype)
    if family == "mean":
        return np.dtype(np.float64) if dtype.kind in "biu" else dtype
    return dtype


def gpu_supported(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in CUDA_TYPE_NAMES


def division_dtype(acc) -> np.dtype:
    """What numpy.mean divides a sum accumulated in ``acc`` by the count in: a float sum in its own type,
    an integer (or bool) sum in float64, since the count need not fit a narrow type such as int8."""
    acc = np.dtype(acc)
    return acc if acc.kind in "fc" else np.dtype(np.float64)


# Sums of float16 or float32 values in float64 are exact when every value is a multiple of 2**grid and the
# count times 2**(top + 1), a bound on the sum of their magnitudes, stays within float64's 53 bits above
# 2**grid: every partial sum is then a float64 exactly, so any grouping of the additions gives the same
# bits. ``top`` is the largest floor(log2 |v|) and ``grid`` the smallest exponent of a lowest set bit over
# the finite non-zero values (backends' ``sum_bounds``); NO_TOP and NO_GRID stand for none. NaN and
# infinities do not enter: a sum holding them is NaN or the infinity in any order.
NO_TOP, NO_GRID = -(1 << 20), 1 << 20
NARROW_FLOATS = (np.dtype(np.float16), np.dtype(np.float32))


def exact_in_any_order(count: int, top: int, grid: int) -> bool:
    """Whether ``count`` values bounded by ``top`` and ``grid`` (see above) sum exactly in float64."""
    return (max(int(count), 1) - 1).bit_length() + top + 1 <= 53 + grid


def merge_bounds(bounds) -> tuple[int, int]:
    """(top, grid) of the union of the values whose (top, grid) are ``bounds``."""
    bounds = list(bounds)
    return max((t for t, _ in bounds), default=NO_TOP), min((g for _, g in bounds), default=NO_GRID)
