"""Errors multireduce raises on purpose.

``gpu_memory_guard`` turns a CuPy out-of-memory error raised inside our work into ``GPUOutOfMemoryError``:
a ``MemoryError`` that names the array being worked on (shape, dtype, bytes) and the GPU (id, name,
free/total memory), chained from CuPy's error. A kernel launch that finds no memory fails with a driver or
runtime error instead of CuPy's; those count too. So that the next request in the same process (a Dask
worker's next task) can succeed, the guard drops the failed work's arrays, which only the failed frames
still reference, and gives CuPy's cached blocks back to the driver. The error pickles with its attributes:
Dask sends a worker's error to the client that way.
"""

from __future__ import annotations

import contextlib
import sys
import traceback

# what a CUDA driver/runtime error says when a launch or an allocation outside CuPy's pool found no memory
_OOM_MARKERS = ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "out of memory")


class GPUOutOfMemoryError(MemoryError):
    """A GPU ran out of memory while multireduce worked on an array. Attributes: ``what`` (the work),
    ``shape``, ``dtype``, ``nbytes`` (the array; None where unknown) and ``gpu`` (a dict: ``id``, ``name``,
    ``pci``, ``free``, ``total``)."""

    def __init__(self, message: str, *, what: str = "", shape=None, dtype=None, nbytes=None, gpu=None):
        super().__init__(message)
        self.what, self.shape, self.dtype, self.nbytes, self.gpu = what, shape, dtype, nbytes, dict(gpu or {})

    def __reduce__(self):  # the default would call __init__(message) and lose the attributes
        return type(self), (self.args[0],), self.__dict__


def _gib(n) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


def _device_facts(cupy) -> dict:
    facts = {"id": None, "name": "unknown", "pci": None, "free": None, "total": None}
    try:
        dev = cupy.cuda.Device()
        facts["id"] = dev.id
        # a Dask CUDA worker sees its own GPU as device 0: the PCI bus id tells the GPUs of a host apart
        with contextlib.suppress(Exception):
            facts["pci"] = dev.pci_bus_id
        facts["free"], facts["total"] = cupy.cuda.runtime.memGetInfo()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        facts["name"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # the report must not fail where the driver itself is in trouble
        pass
    return facts


def _shape(shape):
    try:  # unknown (NaN) Dask chunk sizes: the message says "?" rather than failing
        return None if shape is None else tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return None


def _nbytes(shape, itemsize):
    shape = _shape(shape)
    if shape is None or itemsize is None:
        return None
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    return nbytes


def oom_message(what: str, shape, dtype, itemsize: int | None, device: dict, detail: str = "") -> str:
    nbytes = _nbytes(shape, itemsize)
    where = device.get("name") if device.get("pci") is None else f"{device.get('name')}, PCI {device['pci']}"
    return (f"GPU {device.get('id')} ({where}) ran out of memory during {what} of an array of "
            f"shape {_shape(shape) if _shape(shape) is not None else '?'} and dtype {dtype} "
            f"({'?' if nbytes is None else f'{nbytes} bytes, {_gib(nbytes)}'}); the GPU has "
            f"{_gib(device.get('free'))} free of {_gib(device.get('total'))}. Use smaller chunks, fewer "
            f"concurrent tasks per GPU, or a GPU with more memory." + (f" CuPy said: {detail}" if detail else ""))


def is_gpu_out_of_memory(exc: BaseException, cupy) -> bool:
    """CuPy's OutOfMemoryError, or a CUDA driver/runtime error that reports exhausted memory."""
    if isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return True
    name, module = type(exc).__name__, type(exc).__module__ or ""
    if name in ("CUDADriverError", "CUDARuntimeError") or module.startswith("cupy_backends"):
        return any(marker in str(exc) for marker in _OOM_MARKERS)
    # CuPy allocating through RMM (dask-cuda's rmm_allocator_external_lib_list): RMM raises its own
    # out_of_memory, a MemoryError subclass, with "out_of_memory" or "bad_alloc" in its text
    if isinstance(exc, MemoryError) and ("out_of_memory" in str(exc) or "bad_alloc" in str(exc)
                                         or module.startswith("rmm")):
        return True
    return False


def _release(exc: BaseException, cupy) -> None:
    # the failed work's arrays live in the finished frames' locals (the traceback keeps them): clear those,
    # then return the pool's now unused blocks; the traceback keeps its lines, not its locals
    traceback.clear_frames(exc.__traceback__)
    with contextlib.suppress(Exception):
        cupy.get_default_memory_pool().free_all_blocks()


@contextlib.contextmanager
def gpu_memory_guard(array, what: str = "a reduction"):
    """Around GPU work on ``array``: a GPU out-of-memory failure becomes ``GPUOutOfMemoryError``."""
    cupy = sys.modules.get("cupy")  # no CuPy imported: nothing of ours can raise its error
    if cupy is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        if not is_gpu_out_of_memory(exc, cupy):
            raise
        _release(exc, cupy)
        dtype = getattr(array, "dtype", None)
        shape = getattr(array, "shape", None)
        itemsize = getattr(dtype, "itemsize", None)
        device = _device_facts(cupy)
        raise GPUOutOfMemoryError(
            oom_message(what, shape, dtype, itemsize, device, str(exc)), what=what,
            shape=_shape(shape), dtype=dtype,
            nbytes=_nbytes(shape, itemsize), gpu=device) from exc
