"""Statistics on one CuPy chunk: the NumPy backend's chunk code run with ``xp=cupy`` on the GPU that
holds the chunk, then the (small) partial copied to the host, so partials cross workers cheaply and
merge on the host. Merges are the NumPy backend's.

Whole-chunk argmin/argmax (every axis) and moments of a C-contiguous chunk of a GPU dtype run the
one-pass kernels of ``kernels/stats.cuh`` (one read of the data, one partial per block, the block
partials merged on the host with the chunk-partial rules); the other cases (one axis of an n-d chunk,
nanmin/nanmax, any/all/count_nonzero) are still composed of CuPy calls, several passes each.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

try:
    import cupy
except ImportError:  # the kernel names and the nvcc check (CI, no GPU) need no CuPy
    cupy = None

from .. import dtypes as _dt
from .. import kernels as _kernels
from . import numpy_stats as _host

name = "cupy"


def to_host(partial):
    return tuple(cupy.asnumpy(p) for p in partial)


def _on_holder(block):
    return cupy.cuda.Device(block.data.device_id)


def arg_chunk(block, axes, largest, skipnan, offsets, shape):
    with _on_holder(block):
        if _whole_kernel_fits(block, axes):
            return _arg_kernel(block, largest, skipnan, offsets, shape)
        return to_host(_host.arg_chunk(block, axes, largest, skipnan, offsets, shape, xp=cupy))


def moments_chunk(block, axes, skipnan):
    with _on_holder(block):
        if _whole_kernel_fits(block, axes):
            return _moments_kernel(block, skipnan)
        return to_host(_host.moments_chunk(block, axes, skipnan, xp=cupy))


# ------------------------------------------------------------------------------------------------
# the one-pass kernels (kernels/stats.cuh)
# ------------------------------------------------------------------------------------------------
BLOCK = 256
BLOCKS_PER_SM = 8  # enough resident warps to keep the loads in flight; partials stay a few thousand


def stats_names(dtype) -> dict:
    """Every stats kernel for ``dtype``, by role (largest, skipnan) / "moments"+skipnan, from the dtype
    table: NaN-skipping forms only where the dtype has NaN."""
    dtype = np.dtype(dtype)
    T = _kernels.ctype(dtype)
    skips = (False, True) if dtype.kind == "f" else (False,)
    names = {}
    for skip in skips:
        s = str(skip).lower()
        for largest in (False, True):
            names[("arg", largest, skip)] = f"mr::stats_arg_partials<{T}, {str(largest).lower()}, {s}, {BLOCK}>"
        names[("moments", skip)] = f"mr::stats_moments_partials<{T}, {s}, {BLOCK}>"
    return names


def all_stats_instantiations() -> list[str]:
    return sorted({e for dt in _dt.GPU_DTYPES for e in stats_names(dt).values()})


def module_text() -> str:
    """The common device headers (kernels.kernel_source) and stats.cuh, includes inlined once."""
    beside = Path(__file__).resolve().parents[2] / "kernels" / "stats.cuh"  # a source checkout
    text = (beside if beside.exists() else _kernels.source_dir() / "stats.cuh").read_text()
    text = text.replace("#pragma once", "").replace('#include "common.cuh"', "")
    return _kernels.kernel_source() + "\n" + text


_modules: dict = {}
_lock = threading.Lock()


def _kernel(dtype, role):
    key = (cupy.cuda.runtime.getDevice(), np.dtype(dtype))
    found = _modules.get(key)
    if found is None:
        with _lock:
            if key not in _modules:
                names = stats_names(dtype)
                try:
                    module = cupy.RawModule(code=module_text(), options=_kernels.COMPILE_OPTIONS,
                                            name_expressions=sorted(names.values()))
                    module.compile()
                except Exception as exc:
                    raise _kernels.KernelError(f"compiling the stats kernels for {np.dtype(dtype)} failed: {exc}") from exc
                _modules[key] = {role: module.get_function(expr) for role, expr in names.items()}
            found = _modules[key]
    return found[role]


def _whole_kernel_fits(block, axes) -> bool:
    return (len(axes) == block.ndim and block.size > 0 and block.dtype in _dt.CUDA_TYPE_NAMES
            and block.flags.c_contiguous)


@functools.lru_cache(maxsize=None)  # one entry per device; the grid itself is not memoized: one per size
def _sms(device: int) -> int:
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def _grid(device: int, n: int) -> int:
    per_block = BLOCK * 16  # one 16-byte pack per thread at least
    return int(max(1, min(_sms(device) * BLOCKS_PER_SM, -(-n // per_block))))


def _arg_kernel(block, largest, skipnan, offsets, shape):
    n = block.size
    grid = _grid(block.data.device_id, n)
    key_dtype = np.float32 if block.dtype == np.float16 else block.dtype
    keys = cupy.empty(grid, dtype=key_dtype)
    where = cupy.empty(grid, dtype=np.int64)
    skip = skipnan and block.dtype.kind == "f"
    _kernel(block.dtype, ("arg", largest, skip))((grid,), (BLOCK,), (block, np.int64(n), keys, where))
    value, local = _fold_host((keys.get(), where.get()), lambda a, b: _host.arg_merge(a, b, largest))
    kept = (1,) * block.ndim
    local = int(local)
    if local < 0:
        return np.zeros(kept, dtype=block.dtype), np.full(kept, -1, dtype=np.int64)
    at = np.unravel_index(local, block.shape) if block.ndim else ()
    index = int(np.ravel_multi_index(tuple(w + o for w, o in zip(at, offsets)), shape)) if block.ndim else 0
    return np.asarray(value, dtype=block.dtype).reshape(kept), np.full(kept, index, dtype=np.int64)


def _moments_kernel(block, skipnan):
    n = block.size
    grid = _grid(block.data.device_id, n)
    out = cupy.empty(4 * grid, dtype=np.float64)
    skip = skipnan and block.dtype.kind == "f"
    _kernel(block.dtype, ("moments", skip))((grid,), (BLOCK,), (block, np.int64(n), out))
    parts = out.get().reshape(grid, 4)
    merged = _fold_host(tuple(parts[:, k] for k in range(4)), _host.moments_merge)
    kept = (1,) * block.ndim
    return tuple(np.asarray(m, dtype=np.float64).reshape(kept) for m in merged)


def _fold_host(columns, merge):
    """Merge the block partials (arrays of equal length, one entry per block) pairwise, vectorized:
    log2(blocks) NumPy steps."""
    while len(columns[0]) > 1:
        m = len(columns[0])
        half = m // 2
        left = tuple(c[:half] for c in columns)
        right = tuple(c[half:2 * half] for c in columns)
        merged = merge(left, right)
        if m % 2:
            merged = tuple(np.concatenate([a, c[-1:]]) for a, c in zip(merged, columns))
        columns = merged
    return tuple(c[0] for c in columns)


def compile_all(arch: str = "sm_90", nvcc: str = "nvcc") -> int:
    """Compile every instantiation of stats.cuh with nvcc (CI has nvcc but no GPU); returns nvcc's status."""
    import os
    import subprocess
    import tempfile

    body = ",\n  ".join(f"(void*)&{e}" for e in all_stats_instantiations())
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "stats.cu")
        with open(path, "w") as f:
            f.write(module_text() + f"\nvoid* const multireduce_stats_instantiations[] = {{\n  {body}\n}};\n")
        proc = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-c", path, "-o", path + ".o"],
                              capture_output=True, text=True)
    if proc.returncode:
        print(proc.stderr[-20000:])
    return proc.returncode


if __name__ == "__main__":
    import sys

    sys.exit(compile_all(*(sys.argv[1:2] or ["sm_90"])))


def extreme_chunk(block, axes, largest):
    with _on_holder(block):
        return to_host(_host.extreme_chunk(block, axes, largest, xp=cupy))


def truth_chunk(block, axes, every):
    with _on_holder(block):
        return to_host(_host.truth_chunk(block, axes, every, xp=cupy))


def count_chunk(block, axes):
    with _on_holder(block):
        return to_host(_host.count_chunk(block, axes, xp=cupy))
