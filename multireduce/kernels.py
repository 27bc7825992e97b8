"""Our CUDA kernels as CuPy modules: the source, the template instantiations, compilation and caching.

The source is ``kernels/multireduce.cuh`` with its includes inlined, so CuPy's on-disk cache key
covers every line of device code (a changed header can never load a stale binary). Kernels are
compiled in groups: one ``RawModule`` per (device, operator, family, type triple) holds every kernel
of that family for those types, so a process compiles each group once and later processes load it
from CuPy's cache. Nothing here launches a kernel; ``backends.cupy_backend`` does.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import numpy as np

from . import dtypes as _dt
from .operators import Operator
from .tuning import SCAN_SHAPE_CANDIDATES, Policy, ScanShape, scan_size_class

ENTRY = "multireduce.cuh"
COMPILE_OPTIONS = ("--std=c++17",)
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


class KernelError(RuntimeError):
    """A kernel failed to compile or launch; the message names the kernel and its template arguments."""


def source_dir() -> Path:
    """The installed ``multireduce/_cuda`` package data, or ``kernels/`` of a source checkout."""
    try:
        return Path(str(resources.files("multireduce._cuda")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "kernels"


@functools.lru_cache(maxsize=None)
def kernel_source() -> str:
    """The whole device source, includes inlined once each."""
    seen: set[str] = set()

    def inline(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (source_dir() / name).read_text()
        text = text.replace("#pragma once", "")
        return _INCLUDE.sub(lambda m: inline(m.group(1)), text)

    return inline(ENTRY)


def cache_dir() -> str:
    """Where compiled kernels are kept: $MULTIREDUCE_KERNEL_CACHE, else CuPy's ($CUPY_CACHE_DIR or ~/.cupy)."""
    return (
        os.environ.get("MULTIREDUCE_KERNEL_CACHE")
        or os.environ.get("CUPY_CACHE_DIR")
        or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")
    )


# ------------------------------------------------------------------------------------------------
# Template instantiations, generated from the dtype table
# ------------------------------------------------------------------------------------------------
def ctype(dtype) -> str:
    return _dt.CUDA_TYPE_NAMES[np.dtype(dtype)]


@functools.lru_cache(maxsize=None)
def reduce_names(T: str, Acc: str, Op: str, p: Policy) -> dict[str, str]:
    """Every reduction kernel for element type T and accumulator Acc, by role."""
    B = p.catalogue_block
    names = {
        "neighbored": f"mr::reduce_neighbored_partials<{T}, {Acc}, {Op}>",
        "neighbored_compact": f"mr::reduce_neighbored_compact_partials<{T}, {Acc}, {Op}>",
        "interleaved": f"mr::reduce_interleaved_partials<{T}, {Acc}, {Op}>",
        "first_add": f"mr::reduce_first_add_partials<{T}, {Acc}, {Op}>",
        "unroll_last_warp": f"mr::reduce_unroll_last_warp_partials<{T}, {Acc}, {Op}>",
        "complete_unroll": f"mr::reduce_complete_unroll_partials<{T}, {Acc}, {Op}, {B}>",
        "grid_stride": f"mr::reduce_grid_stride_partials<{T}, {Acc}, {Op}>",
        "warp_shuffle": f"mr::reduce_warp_shuffle_partials<{T}, {Acc}, {Op}>",
        "last_block": f"mr::reduce_last_block<{T}, {Acc}, {Op}>",
        "vectorized": f"mr::reduce_vectorized<{T}, {Acc}, {Op}, {p.reduce_block}>",
        "ordered_single_block": f"mr::reduce_ordered_single_block<{T}, {Acc}, {Op}, {p.ordered_block}, {p.ordered_items}>",
        "ordered_multi_block": f"mr::reduce_ordered_multi_block<{T}, {Acc}, {Op}, {p.ordered_block}, {p.ordered_items}>",
        "rows": f"mr::reduce_rows<{T}, {Acc}, {Op}, {p.reduce_row_block}, {p.ordered_items}, false>",
        "rows_ordered": f"mr::reduce_rows<{T}, {Acc}, {Op}, {p.reduce_row_block}, {p.ordered_items}, true>",
        "columns": f"mr::reduce_columns<{T}, {Acc}, {Op}>",
    }
    return MappingProxyType(names)


@functools.lru_cache(maxsize=None)
def scan_names(T: str, Acc: str, Out: str, Op: str, p: Policy, shape: ScanShape) -> dict[str, str]:
    """Every scan kernel for element type T, accumulator Acc and output Out, by role; ``shape`` is the
    look-back kernel's tile."""
    B = p.scan_block
    return MappingProxyType({
        "hillis_steele": f"mr::scan_hillis_steele_tiles<{T}, {Acc}, {Op}, {B}>",
        "blelloch": f"mr::scan_blelloch_tiles<{T}, {Acc}, {Op}, {B}>",
        "add_back": f"mr::scan_add_back<{Acc}, {Op}>",
        "finish": f"mr::scan_finish<{Acc}, {Out}, {Op}>",
        "lookback": f"mr::scan_lookback<{T}, {Acc}, {Out}, {Op}, {shape.block}, {shape.items}, {shape.held}>",
        "columns": f"mr::scan_columns<{T}, {Acc}, {Out}, {Op}>",
    })


def module_text(op: Operator) -> str:
    return kernel_source() + "\n" + op.cuda_source()


# ------------------------------------------------------------------------------------------------
# Compilation, memoized per device and group
# ------------------------------------------------------------------------------------------------
_modules: dict = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=1024)
def _operator_token(op: Operator) -> str:
    """Operators hash by identity; tokenizing one costs tens of microseconds, so it is done once."""
    from dask.base import tokenize

    return tokenize(op)


def get_kernels(op: Operator, names) -> dict[str, object]:
    """Compile (or fetch) the group ``names`` (from ``reduce_names`` / ``scan_names``, which return one
    shared read-only mapping per type triple) for ``op`` on the current device; role -> kernel."""
    import cupy

    # keyed by identity (hashing the mapping on every launch costs microseconds); each entry keeps its
    # mapping alive, so an id can never be reused by another mapping while the entry exists
    key = (cupy.cuda.runtime.getDevice(), _operator_token(op), id(names))
    found = _modules.get(key)
    if found is not None:
        return found[1]
    with _lock:
        if key not in _modules:
            if os.environ.get("MULTIREDUCE_KERNEL_CACHE"):
                os.environ["CUPY_CACHE_DIR"] = os.environ["MULTIREDUCE_KERNEL_CACHE"]
            expressions = sorted(set(names.values()))
            try:
                module = cupy.RawModule(code=module_text(op), options=COMPILE_OPTIONS, name_expressions=expressions)
                module.compile()
            except Exception as exc:  # CompileException carries NVRTC's log
                raise KernelError(
                    f"compiling multireduce kernels for operator {op.name!r} failed; instantiations: "
                    f"{', '.join(expressions)}\n{exc}"
                ) from exc
            _modules[key] = (names, {role: _Kernel(module, expr) for role, expr in names.items()})
    return _modules[key][1]


class _Kernel:
    """A RawKernel that names itself when a launch fails."""

    __slots__ = ("module", "expression", "_fn")

    def __init__(self, module, expression: str):
        self.module, self.expression, self._fn = module, expression, None

    @property
    def raw(self):
        """The CuPy RawKernel itself, loaded (for launch paths that cannot afford this wrapper)."""
        if self._fn is None:
            self._fn = self.module.get_function(self.expression)
        return self._fn

    def __call__(self, grid: int, block: int, args: tuple) -> None:
        if self._fn is None:
            self._fn = self.module.get_function(self.expression)
        try:
            self._fn((int(grid),), (int(block),), args)
        except Exception as exc:
            raise KernelError(f"launching {self.expression} with grid={grid}, block={block} failed: {exc}") from exc


def all_instantiations(policy: Policy) -> list[tuple[str, list[str]]]:
    """Every (operator functor, name expressions) group the dtype table produces, for CI's nvcc check."""
    from .operators import get_operator

    groups = []
    for opname in ("sum", "prod", "min", "max"):
        op = get_operator(opname)
        exprs: set[str] = set()
        for dtype in _dt.GPU_DTYPES:
            if dtype.kind not in op.kinds:
                continue
            out = _dt.result_dtype(op.family, dtype)
            acc = _dt.accumulator_dtype(out)
            T, A, O = ctype(dtype), ctype(acc), ctype(out)
            exprs.update(reduce_names(T, A, op.cuda_functor, policy).values())
            exprs.update(reduce_names(A, A, op.cuda_functor, policy).values())  # later passes over partials
            shape = policy.scan_shape(dtype.itemsize, acc.itemsize, out.itemsize)
            exprs.update(scan_names(T, A, O, op.cuda_functor, policy, shape).values())
            if opname == "sum":  # every look-back tile the sweep may pick for these sizes
                for candidate in SCAN_SHAPE_CANDIDATES[scan_size_class(dtype.itemsize, acc.itemsize, out.itemsize)]:
                    exprs.add(scan_names(T, A, O, op.cuda_functor, policy, candidate)["lookback"])
            # the catalogue scans run in the accumulator: (T, Acc, Acc), (Acc, Acc, Acc), (Acc, Acc, Out)
            for t_in, t_out, size_in, size_out in [(T, A, dtype.itemsize, acc.itemsize),
                                                   (A, A, acc.itemsize, acc.itemsize),
                                                   (A, O, acc.itemsize, out.itemsize)]:
                shape = policy.scan_shape(size_in, acc.itemsize, size_out)
                exprs.update(scan_names(t_in, A, t_out, op.cuda_functor, policy, shape).values())
            if opname == "sum":  # mean accumulates integers in float64
                mean_acc = _dt.accumulator_dtype(_dt.result_dtype("mean", dtype))
                exprs.update(reduce_names(T, ctype(mean_acc), op.cuda_functor, policy).values())
        groups.append((opname, sorted(exprs)))
    return groups

