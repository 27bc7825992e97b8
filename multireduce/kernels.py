"""Our CUDA kernels as CuPy modules: the source, the template instantiations, compilation and caching.

Two sources: ``kernels/multireduce.cuh``, the production kernels (what ``algorithm="auto"`` launches),
and ``kernels/catalogue.cuh``, the seeds' teaching kernels, compiled only when ``algorithm=`` names one.
Each is compiled with its includes inlined, so CuPy's on-disk cache key covers every line of device code
(a changed header can never load a stale binary). Kernels are compiled in groups: one ``RawModule`` per
(device, operator, group of name expressions), so the first ``sum`` of a new dtype compiles only the few
production kernels of its types. Nothing here launches a kernel; ``backends.cupy_backend`` does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import re
import threading
from importlib import resources
from pathlib import Path

import numpy as np

from . import dtypes as _dt
from .operators import Operator
from .tuning import SCAN_SHAPE_CANDIDATES, Policy, ScanShape, scan_size_class

ENTRY = "multireduce.cuh"
CATALOGUE_ENTRY = "catalogue.cuh"
COMPILE_OPTIONS = ("--std=c++17",)
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


class KernelError(RuntimeError):
    """A kernel failed to compile or launch; the message names the kernel and its template arguments."""


def source_dir() -> Path:
    """``kernels/`` of the source checkout this package was imported from, else the installed
    ``multireduce/_cuda`` package data (an editable install maps that name to one checkout only, which
    need not be this one)."""
    checkout = Path(__file__).resolve().parent.parent / "kernels"
    if (checkout / ENTRY).is_file():
        return checkout
    return Path(str(resources.files("multireduce._cuda")))


@functools.lru_cache(maxsize=None)
def kernel_source(entry: str = ENTRY) -> str:
    """The device source of ``entry`` (``ENTRY`` or ``CATALOGUE_ENTRY``), includes inlined once each;
    an include is resolved against the directory of the file that names it, as nvcc does."""
    seen: set[str] = set()

    def inline(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (source_dir() / name).read_text()
        text = text.replace("#pragma once", "")
        here = posixpath.dirname(name)
        return _INCLUDE.sub(lambda m: inline(posixpath.normpath(posixpath.join(here, m.group(1)))), text)

    return inline(entry)


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


class Group(tuple):
    """One module's kernels: (entry, ((role, name expression), ...)), hashable so it keys the module cache;
    ``names`` gives role -> expression."""

    __slots__ = ()

    @property
    def entry(self) -> str:
        return self[0]

    @property
    def names(self) -> dict[str, str]:
        return dict(self[1])


def _group(entry: str, names: dict[str, str]) -> Group:
    return Group((entry, tuple(names.items())))


@functools.lru_cache(maxsize=None)
def reduce_names(T: str, Acc: str, Op: str, p: Policy) -> Group:
    """The production reductions (``algorithm="auto"``) for element type T and accumulator Acc, by role."""
    return _group(ENTRY, {
        "vectorized": f"mr::reduce_vectorized<{T}, {Acc}, {Op}, {p.reduce_block}, {p.reduce_vectors_per_thread}>",
        "ordered_multi_block": (f"mr::reduce_ordered_multi_block<{T}, {Acc}, {Op}, {p.ordered_block}, "
                                f"{p.ordered_items}>"),
        "rows": f"mr::reduce_rows<{T}, {Acc}, {Op}, {p.reduce_row_block}, {p.ordered_items}, false>",
        "rows_ordered": f"mr::reduce_rows<{T}, {Acc}, {Op}, {p.reduce_row_block}, {p.ordered_items}, true>",
        "columns": f"mr::reduce_columns<{T}, {Acc}, {Op}>",
    })


# the seeds' ladder rungs that write one partial per block (kernels/catalogue/reduce.cuh)
_PARTIALS_RUNGS = ("neighbored", "neighbored_compact", "interleaved", "first_add", "unroll_last_warp",
                   "complete_unroll", "grid_stride", "warp_shuffle")


@functools.lru_cache(maxsize=None)
def reduce_catalogue_names(T: str, Acc: str, Op: str, p: Policy) -> Group:
    """The catalogue's reductions (``algorithm=`` one of them) for T and Acc, by role."""
    B = p.catalogue_block
    names = {rung: f"mr::reduce_{rung}_partials<{T}, {Acc}, {Op}, {B}>" for rung in _PARTIALS_RUNGS}
    names["last_block"] = f"mr::reduce_last_block<{T}, {Acc}, {Op}, {B}>"
    names["ordered_single_block"] = (f"mr::reduce_ordered_single_block<{T}, {Acc}, {Op}, {p.ordered_block}, "
                                     f"{p.ordered_items}>")
    return _group(CATALOGUE_ENTRY, names)


@functools.lru_cache(maxsize=None)
def scan_names(T: str, Acc: str, Out: str, Op: str, p: Policy, shape: ScanShape, deterministic: bool = False,
               cluster: int = 0) -> Group:
    """The production scans for element type T, accumulator Acc and output Out, by role; ``shape`` is the
    look-back kernel's tile, ``deterministic`` its fixed (timing-independent) look-back; ``cluster`` > 1
    adds that look-back with tiles in thread-block clusters of ``cluster`` ("lookback_clustered")."""
    flag = "true" if deterministic else "false"
    names = {
        "lookback": (f"mr::scan_lookback<{T}, {Acc}, {Out}, {Op}, {shape.block}, {shape.items}, {shape.held}, "
                     f"{flag}>"),
        "columns": f"mr::scan_columns<{T}, {Acc}, {Out}, {Op}>",
    }
    if cluster > 1:
        names["lookback_clustered"] = (f"mr::scan_lookback_clustered<{T}, {Acc}, {Out}, {Op}, {shape.block}, "
                                       f"{shape.items}, {shape.held}, {cluster}>")
    return _group(ENTRY, names)


#: A row of fewer tiles than this many clusters' worth runs the plain look-back: a cluster pads its row to a
#: whole number of clusters, and a short row would launch mostly empty blocks.
CLUSTERS_PER_ROW_MIN = 2


def lookback_geometry(rows: int, tiles_per_row: int, cluster: int) -> tuple[int, int, int]:
    """(tiles per row as launched, blocks, look-back descriptors) of a look-back scan of ``rows`` rows of
    ``tiles_per_row`` tiles: one descriptor per tile, or with clusters of ``cluster`` > 1 the row padded
    to whole clusters (the padding tiles hold no element) and one descriptor per cluster."""
    if cluster > 1:
        padded = -(-tiles_per_row // cluster) * cluster
        return padded, rows * padded, rows * (padded // cluster)
    return tiles_per_row, rows * tiles_per_row, rows * tiles_per_row


def scan_cluster(p: Policy, in_size: int, acc_size: int, out_size: int, deterministic: bool) -> int:
    """Tiles per thread-block cluster of the look-back scan for these element sizes, 0 for none: the
    policy's clusters serve the fixed look-back of scans whose input, accumulator and output are all 4
    bytes wide (float32: measured faster; float64 was not, float16 was not measured)."""
    return p.scan_cluster if deterministic and in_size == acc_size == out_size == 4 else 0


@functools.lru_cache(maxsize=None)
def scan_catalogue_names(T: str, Acc: str, Out: str, Op: str, p: Policy) -> Group:
    """The catalogue's block scans and their multi-level driver's kernels, by role."""
    B = p.scan_block
    return _group(CATALOGUE_ENTRY, {
        "hillis_steele": f"mr::scan_hillis_steele_tiles<{T}, {Acc}, {Op}, {B}>",
        "blelloch": f"mr::scan_blelloch_tiles<{T}, {Acc}, {Op}, {B}>",
        "add_back": f"mr::scan_add_back<{Acc}, {Op}>",
        "finish": f"mr::scan_finish<{Acc}, {Out}, {Op}>",
    })


def module_text(op: Operator, entry: str = ENTRY) -> str:
    return kernel_source(entry) + "\n" + op.cuda_source()


# ------------------------------------------------------------------------------------------------
# Precompiled production kernels (tools/build_prebuilt.py): no compiler at first call for built-ins
# ------------------------------------------------------------------------------------------------
PREBUILT_DIR = Path(__file__).resolve().parent / "_prebuilt"


def source_key(source: str) -> str:
    """What a prebuilt binary was compiled from: its source text and the options. A binary whose key
    differs from the current source's is never loaded."""
    return hashlib.sha256((source + "\n// " + " ".join(COMPILE_OPTIONS)).encode()).hexdigest()


def prebuilt_key(op: Operator) -> str:
    """source_key of the production source with ``op``'s functor."""
    return source_key(module_text(op, ENTRY))


@functools.lru_cache(maxsize=None)
def _prebuilt_index() -> dict:
    try:
        return json.loads((PREBUILT_DIR / "index.json").read_text())
    except (OSError, ValueError):
        return {}


_prebuilt_modules: dict = {}


def _prebuilt_kernels(op: Operator, group: Group, device: int) -> dict | None:
    """``group``'s kernels from the shipped fatbin, or None where it cannot serve them (a user operator,
    the catalogue, a source changed since the build, an expression not built, a GPU older than sm_80)."""
    if not op.builtin or group.entry != ENTRY:
        return None
    return _from_prebuilt(op.name, lambda: prebuilt_key(op), group.names, device)


def _from_prebuilt(name: str, current_key, names: dict[str, str], device: int) -> dict | None:
    """role -> Kernel from the fatbin indexed as ``name``, if it was built from the current source
    (``current_key()``) and holds every expression of ``names``; else None."""
    if os.environ.get("MULTIREDUCE_NO_PREBUILT"):
        return None
    built = _prebuilt_index().get(name)
    if built is None or any(e not in built["mangled"] for e in names.values()):
        return None
    import cupy

    module = _prebuilt_modules.get((device, name))
    if module is None:
        major = int(cupy.cuda.Device(device).compute_capability[:-1])
        usable = major >= 8 and built["key"] == current_key()
        module = cupy.RawModule(path=str(PREBUILT_DIR / built["file"])) if usable else False
        _prebuilt_modules[(device, name)] = module
    if module is False:
        return None
    try:  # the module loads at the first lookup
        return {role: Kernel(module.get_function(built["mangled"][e]), e) for role, e in names.items()}
    except Exception:  # e.g. a driver older than the toolkit that built the binary: compile instead
        _prebuilt_modules[(device, name)] = False
        return None


# ------------------------------------------------------------------------------------------------
# Compilation, memoized per device and group
# ------------------------------------------------------------------------------------------------
_modules: dict = {}
# Compiled modules kept, past which the memo starts again: (device, operator, group) is a small set for the
# built-in operators, but a program that makes operators in a loop would otherwise keep every module it
# ever compiled (a module dropped here is rebuilt from CuPy's disk cache or the prebuilt binaries).
_MAX_MODULES = 1024
_lock = threading.Lock()


@functools.lru_cache(maxsize=1024)
def _operator_token(op: Operator) -> str:
    """Operators hash by identity; tokenizing one costs tens of microseconds, so it is done once. A
    built-in operator is its functor (no dask import on a first call that needs none)."""
    if op.builtin:
        return op.cuda_functor
    from dask.base import tokenize

    return tokenize(op)


def get_kernels(op: Operator, group: Group) -> dict[str, "Kernel"]:
    """Compile (or fetch) ``group`` (from ``reduce_names`` & co.) for ``op`` on the current device; role ->
    kernel. Callers that launch often keep the result (the backend binds it once per device)."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), _operator_token(op), group)
    return _memoized(key, lambda: _prebuilt_kernels(op, group, key[0])
                     or _compiled(module_text(op, group.entry), group.names, f"multireduce kernels for operator {op.name!r}"))


def _memoized(key, make):
    found = _modules.get(key)
    if found is None:
        with _lock:
            if key not in _modules:
                if len(_modules) >= _MAX_MODULES:
                    _modules.clear()
                _modules[key] = make()
            found = _modules[key]
    return found


def _compiled(text: str, names: dict[str, str], what: str) -> dict[str, "Kernel"]:
    """NVRTC through CuPy (which caches the binary on disk), role -> Kernel."""
    import cupy

    if os.environ.get("MULTIREDUCE_KERNEL_CACHE"):
        os.environ["CUPY_CACHE_DIR"] = os.environ["MULTIREDUCE_KERNEL_CACHE"]
    expressions = sorted(set(names.values()))
    try:
        module = cupy.RawModule(code=text, options=COMPILE_OPTIONS, name_expressions=expressions)
        module.compile()
    except Exception as exc:  # CompileException carries NVRTC's log
        raise KernelError(f"compiling {what} failed; instantiations: {', '.join(expressions)}\n{exc}") from exc
    return {role: Kernel(module.get_function(e), e) for role, e in names.items()}


# ------------------------------------------------------------------------------------------------
# Operator-free modules (statistics, exact sums, ...): one source file each, prebuilt like the rest
# ------------------------------------------------------------------------------------------------
# entry -> "module:function" returning every name expression of that source, for tools/build_prebuilt.py
# and CI's nvcc check; the backend modules that launch them need no CuPy to list their names.
STANDALONE = {
    "stats.cuh": "multireduce.backends.cupy_stats:all_stats_instantiations",
    "stats_whole.cuh": "multireduce.backends.cupy_stats:all_whole_instantiations",
    "exact.cuh": "multireduce.backends.cupy_exact:all_exact_instantiations",
    "finish.cuh": "multireduce.kernels:all_finish_instantiations",
}
FINISH_ENTRY = "finish.cuh"


def finish_names(acc, out) -> dict[str, str]:
    """The finishing kernel (kernels/finish.cuh) of a reduction accumulated in ``acc`` with result ``out``:
    the cast, and a mean's division in ``division_dtype(acc)``."""
    return {"finish": f"mr::reduce_finish<{ctype(acc)}, {ctype(_dt.division_dtype(acc))}, {ctype(out)}>"}


PROBE_BLOCK = 256  # finite_probe reads the first PROBE_BLOCK elements and PROBE_BLOCK spread over the array
#: finite_probe (kernels/finish.cuh) by element size: the float's bits and its exponent field
PROBE_NAMES = {2: f"mr::finite_probe<unsigned short, 0x7c00ull, {PROBE_BLOCK}>",
               4: f"mr::finite_probe<unsigned int, 0x7f800000ull, {PROBE_BLOCK}>",
               8: f"mr::finite_probe<unsigned long long, 0x7ff0000000000000ull, {PROBE_BLOCK}>"}


def all_finish_instantiations() -> list[str]:
    """Every finishing kernel a built-in reduction can ask for: each GPU result dtype (any ``dtype=``) with
    each accumulator ``dtypes.accumulator_dtype`` may give it on the GPU, whatever WIDE_FLOAT32_ON_GPU is;
    and the finite probes."""
    return sorted({finish_names(_dt.accumulator_dtype(out, accumulate, "gpu"), out)["finish"]
                   for out in _dt.GPU_DTYPES for accumulate in ("input", "wide")} | set(PROBE_NAMES.values()))


def standalone_instantiations(entry: str) -> list[str]:
    import importlib

    module, function = STANDALONE[entry].split(":")
    return sorted(getattr(importlib.import_module(module), function)())


def standalone_key(entry: str) -> str:
    """source_key of ``entry``'s source, includes inlined."""
    return source_key(kernel_source(entry))


def get_standalone_kernels(entry: str, names: dict, extra: str = "") -> dict:
    """role -> Kernel for the name expressions ``names`` of the operator-free source ``entry`` on the
    current device: the shipped binary when it matches the source, else NVRTC (cached on disk by CuPy).
    ``extra``: source appended to ``entry`` (a generated policy the names use), always compiled by NVRTC.
    Callers that launch often keep the result, as with ``get_kernels``."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), entry, frozenset(names.items()), extra)
    if extra:
        return _memoized(key, lambda: _compiled(kernel_source(entry) + "\n" + extra, names, entry))
    return _memoized(key, lambda: _from_prebuilt("module:" + entry, lambda: standalone_key(entry), names, key[0])
                     or _compiled(kernel_source(entry), names, entry))


class Kernel:
    """A loaded kernel and the one place a launch's failure is turned into a KernelError naming it."""

    __slots__ = ("fn", "expression")

    def __init__(self, fn, expression: str):
        self.fn, self.expression = fn, expression

    def __call__(self, grid: int | tuple, block: int, args: tuple) -> None:
        try:
            self.fn(grid if isinstance(grid, tuple) else (grid,), (block,), args)
        except Exception as exc:
            raise KernelError(f"launching {self.expression} with grid={grid}, block={block} failed: {exc}") from exc


#: every built-in operator, the nan-family (kernels/common.cuh's NanSum & co.: production kernels only) included
BUILTIN_OPERATORS = ("sum", "prod", "min", "max", "nansum", "nanprod", "nanmin", "nanmax")


def fixed_lookback(op: Operator, acc) -> bool:
    """Whether the look-back scan must fold in a fixed order for the same bits on every run: float
    accumulators, except for min and max (order-free: any grouping gives the same value). Integer
    combines wrap exactly, so any grouping gives the same bits."""
    return np.dtype(acc).kind in "fc" and op.cuda_functor not in ("mr::Min", "mr::Max", "mr::NanMin", "mr::NanMax")


def _scan_passes(op: Operator, dtype: np.dtype, acc: np.dtype, out: np.dtype, policy: Policy) -> set[str]:
    """The production scans of one (input, accumulator, result) triple, each with the policy's tile: the
    scan itself, the carries (totals scanned in the accumulator) and the passes over accumulator data."""
    names: set[str] = set()
    fixed = fixed_lookback(op, acc)
    for t_in, t_out in [(dtype, out), (dtype, acc), (acc, acc), (acc, out)]:
        shape = policy.scan_shape(t_in.itemsize, acc.itemsize, t_out.itemsize)
        cluster = scan_cluster(policy, t_in.itemsize, acc.itemsize, t_out.itemsize, fixed)
        names.update(scan_names(ctype(t_in), ctype(acc), ctype(t_out), op.cuda_functor, policy, shape, fixed,
                                cluster).names.values())
    return names


def all_instantiations(policy: Policy, candidates: bool = True) -> list[tuple[str, str, list[str]]]:
    """Every (operator name, entry, name expressions) group the dtype table produces, production and
    catalogue apart, for CI's nvcc check; ``candidates`` adds every look-back tile the sweep may pick
    (sum only), which the prebuilt binaries leave out (only the policy's tiles run by default)."""
    from .operators import get_operator

    groups = []
    for opname in BUILTIN_OPERATORS:
        op = get_operator(opname)
        prod: set[str] = set()
        cat: set[str] = set()
        F = op.cuda_functor
        for dtype in _dt.GPU_DTYPES:
            if dtype.kind not in op.kinds:
                continue
            out = _dt.result_dtype(op.family, dtype)
            acc = _dt.accumulator_dtype(out)
            T, A, O = ctype(dtype), ctype(acc), ctype(out)
            for t_in in (T, A):  # later passes run over partials in the accumulator
                prod.update(reduce_names(t_in, A, F, policy).names.values())
                cat.update(reduce_catalogue_names(t_in, A, F, policy).names.values())
            prod.update(_scan_passes(op, dtype, acc, out, policy))
            if opname == "sum" and candidates:  # every look-back tile the sweep may pick for these sizes
                for candidate in SCAN_SHAPE_CANDIDATES[scan_size_class(dtype.itemsize, acc.itemsize, out.itemsize)]:
                    for fixed in {False, fixed_lookback(op, acc)}:
                        prod.add(scan_names(T, A, O, F, policy, candidate, fixed).names["lookback"])
            wide = _dt.wide_accumulator(out)
            if wide is not None and opname == "sum":  # float32 accumulated in float64 (dtypes.WIDE_FLOAT32)
                prod.update(reduce_names(T, ctype(wide), F, policy).names.values())
                prod.update(_scan_passes(op, dtype, wide, out, policy))
            if opname == "sum":  # mean accumulates integers in float64
                mean_acc = ctype(_dt.accumulator_dtype(_dt.result_dtype("mean", dtype)))
                prod.update(reduce_names(T, mean_acc, F, policy).names.values())
                cat.update(reduce_catalogue_names(T, mean_acc, F, policy).names.values())
            # the catalogue scans run in the accumulator: (T, Acc, Acc), (Acc, Acc, Acc), (Acc, Acc, Out)
            for t_in, t_out in [(T, A), (A, A), (A, O)]:
                cat.update(scan_catalogue_names(t_in, A, t_out, F, policy).names.values())
        groups.append((opname, ENTRY, sorted(prod)))
        if not op.masks_nan:  # the catalogue does not mask NaN: the API refuses it for the nan-family
            groups.append((opname, CATALOGUE_ENTRY, sorted(cat)))
    return groups
