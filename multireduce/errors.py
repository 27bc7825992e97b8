"""Errors multireduce raises on purpose.

``gpu_memory_guard`` turns a CuPy out-of-memory error raised inside our work into ``GPUOutOfMemoryError``:
a ``MemoryError`` that names the array being worked on (shape, dtype, bytes) and the GPU (id, name,
free/total memory), chained from CuPy's error. It frees CuPy's cached blocks first so that the next request
in the same process starts from a clean pool.
"""

from __future__ import annotations

import contextlib
import sys


class GPUOutOfMemoryError(MemoryError):
    """A GPU ran out of memory while multireduce worked on an array."""


def _gib(n) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


def _device_facts(cupy) -> dict:
    facts = {"id": None, "name": "unknown", "free": None, "total": None}
    try:
        dev = cupy.cuda.Device()
        facts["id"] = dev.id
        facts["free"], facts["total"] = cupy.cuda.runtime.memGetInfo()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        facts["name"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # the report must not fail where the driver itself is in trouble
        pass
    return facts


def oom_message(what: str, shape, dtype, itemsize: int | None, device: dict, detail: str = "") -> str:
    nbytes = None
    if shape is not None and itemsize is not None:
        nbytes = itemsize
        for n in shape:
            nbytes *= int(n)
    return (f"GPU {device.get('id')} ({device.get('name')}) ran out of memory during {what} of an array of "
            f"shape {tuple(shape) if shape is not None else '?'} and dtype {dtype} "
            f"({'?' if nbytes is None else f'{nbytes} bytes, {_gib(nbytes)}'}); the GPU has "
            f"{_gib(device.get('free'))} free of {_gib(device.get('total'))}. Use smaller chunks, fewer "
            f"concurrent tasks per GPU, or a GPU with more memory." + (f" CuPy said: {detail}" if detail else ""))


@contextlib.contextmanager
def gpu_memory_guard(array, what: str = "a reduction"):
    """Around GPU work on ``array``: CuPy's OutOfMemoryError becomes ``GPUOutOfMemoryError``."""
    cupy = sys.modules.get("cupy")  # no CuPy imported: nothing of ours can raise its error
    if cupy is None:
        yield
        return
    try:
        yield
    except cupy.cuda.memory.OutOfMemoryError as exc:
        with contextlib.suppress(Exception):
            cupy.get_default_memory_pool().free_all_blocks()
        dtype = getattr(array, "dtype", None)
        raise GPUOutOfMemoryError(oom_message(
            what, getattr(array, "shape", None), dtype, getattr(dtype, "itemsize", None),
            _device_facts(cupy), str(exc))) from exc
