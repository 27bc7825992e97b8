"""multireduce.errors on the CPU: the out-of-memory message and the guard, with a fake CuPy module."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from multireduce import errors


class OutOfMemoryError(MemoryError):
    """Stands for CuPy's, with its constructor (size, total, limit): at module level, as CuPy's, so that a
    chained error pickles; its __init__ does not take its own message back, as CuPy's does not."""

    def __init__(self, size, total=0, limit=0):
        text = size if isinstance(size, str) else f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes)"
        super().__init__(text)


def _fake_cupy(free=3 * 2**30, total=80 * 2**30):
    freed = []
    mod = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            Device=lambda: types.SimpleNamespace(id=2, pci_bus_id="0000:3B:00.0"),
            runtime=types.SimpleNamespace(memGetInfo=lambda: (free, total),
                                          getDeviceProperties=lambda i: {"name": b"Fake H200"})),
        get_default_memory_pool=lambda: types.SimpleNamespace(free_all_blocks=lambda: freed.append(1)))
    return mod, OutOfMemoryError, freed


def test_guard_turns_cupy_oom_into_a_clear_memory_error(monkeypatch):
    cupy, oom, freed = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    x = np.empty((1025, 33), dtype=np.float32)
    with pytest.raises(errors.GPUOutOfMemoryError) as info:
        with errors.gpu_memory_guard(x, "a scan"):
            raise oom("out of memory allocating 135,300 bytes")
    msg = str(info.value)
    assert isinstance(info.value, MemoryError) and isinstance(info.value.__cause__, oom)
    for part in ("GPU 2 (Fake H200, PCI 0000:3B:00.0)", "a scan", "(1025, 33)", "float32", f"{1025 * 33 * 4} bytes",
                 "3.00 GiB free of 80.00 GiB", "135,300 bytes"):
        assert part in msg, (part, msg)
    assert freed == [1]


def test_guard_passes_other_errors_and_results(monkeypatch):
    cupy, oom, freed = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    with pytest.raises(ValueError, match="not ours"):
        with errors.gpu_memory_guard(np.ones(3)):
            raise ValueError("not ours")
    with errors.gpu_memory_guard(np.ones(3)):
        value = 6
    assert value == 6 and freed == []


def test_guard_without_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    with pytest.raises(MemoryError) as info:
        with errors.gpu_memory_guard(np.ones(3)):
            raise MemoryError("host")
    assert type(info.value) is MemoryError


def _guarded_failure(cupy, exc, array):
    with pytest.raises(Exception) as info:
        with errors.gpu_memory_guard(array, "a reduction"):
            raise exc
    return info.value


def test_error_pickles_with_its_attributes(monkeypatch):
    import pickle

    cupy, oom, _ = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    err = _guarded_failure(cupy, oom("out of memory"), np.empty((31, 33), dtype=np.int16))
    back = pickle.loads(pickle.dumps(err))  # as Dask sends a worker's error to the client
    assert type(back) is errors.GPUOutOfMemoryError and str(back) == str(err) and isinstance(back, MemoryError)
    assert (back.what, back.shape, back.dtype, back.nbytes) == ("a reduction", (31, 33), np.int16, 31 * 33 * 2)
    assert back.gpu["id"] == 2 and back.gpu["name"] == "Fake H200" and back.gpu["total"] == 80 * 2**30
    assert back.gpu["pci"] == "0000:3B:00.0"


def test_driver_out_of_memory_counts_other_driver_errors_pass(monkeypatch):
    cupy, _, freed = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    # what CuPy raises when a kernel launch (not the pool) finds no memory
    driver_error = type("CUDADriverError", (RuntimeError,), {"__module__": "cupy_backends.cuda.api.driver"})
    err = _guarded_failure(cupy, driver_error("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), np.ones(1025))
    assert isinstance(err, errors.GPUOutOfMemoryError) and "(1025,)" in str(err) and freed == [1]
    other = _guarded_failure(cupy, driver_error("CUDA_ERROR_ILLEGAL_ADDRESS"), np.ones(3))
    assert type(other) is driver_error and freed == [1]


def test_failed_work_releases_its_arrays(monkeypatch):
    import gc
    import weakref

    cupy, oom, _ = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    refs = []

    def work():
        scratch = np.ones(1023)  # a temporary of the failed work: only this frame holds it
        refs.append(weakref.ref(scratch))
        raise oom("out of memory")

    with pytest.raises(errors.GPUOutOfMemoryError) as info:
        with errors.gpu_memory_guard(np.ones(3)):
            work()
    gc.collect()
    # the caller still holds the error (and its chained cause) but not the failed frame's array
    assert info.value.__cause__ is not None and refs[0]() is None


def test_unknown_chunk_sizes_in_the_message(monkeypatch):
    cupy, oom, _ = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    fake = types.SimpleNamespace(shape=(float("nan"), 4), dtype=np.dtype(np.float32))
    err = _guarded_failure(cupy, oom("out of memory"), fake)
    assert isinstance(err, errors.GPUOutOfMemoryError) and "shape ? " in str(err) and err.nbytes is None


def test_error_crosses_dask_with_its_type_attributes_and_cause(monkeypatch):
    """What a worker does with a task's error (distributed.core.error_message: tblib, a pickling round trip
    that falls back to a bare Exception(repr) on failure) and what the client does with it."""
    core = pytest.importorskip("distributed.core")
    cupy, oom, _ = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    err = _guarded_failure(cupy, oom(16 * 2**20, 3 * 2**30, 3 * 2**30 + 2**20), np.empty(2**21))
    assert isinstance(err, errors.GPUOutOfMemoryError)
    message = {k: getattr(v, "data", v) for k, v in core.error_message(err).items()}  # as sent: bytes
    _, back, _ = core.clean_exception(**message)
    assert type(back) is errors.GPUOutOfMemoryError and str(back) == str(err)
    assert back.shape == (2**21,) and back.nbytes == 2**24 and back.gpu["pci"] == "0000:3B:00.0"
    assert type(back.__cause__) is oom and "16,777,216 bytes" in str(back.__cause__)


def test_rmm_out_of_memory_is_recognised_as_gpu_out_of_memory():
    """CuPy allocating through RMM raises RMM's MemoryError, not CuPy's OutOfMemoryError."""
    import types

    from multireduce.errors import is_gpu_out_of_memory

    class OutOfMemoryError(Exception):
        pass

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(
        OutOfMemoryError=OutOfMemoryError)))
    rmm_failure = MemoryError("std::bad_alloc: out_of_memory: RMM failure at: arena_memory_resource.hpp:140: "
                              "Maximum pool size exceeded")
    assert is_gpu_out_of_memory(rmm_failure, fake_cupy)
    assert is_gpu_out_of_memory(OutOfMemoryError("out of memory allocating 1 GiB"), fake_cupy)
    assert not is_gpu_out_of_memory(MemoryError("host memory"), fake_cupy)
    assert not is_gpu_out_of_memory(ValueError("out_of_memory"), fake_cupy)
