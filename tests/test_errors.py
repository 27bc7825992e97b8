"""multireduce.errors on the CPU: the out-of-memory message and the guard, with a fake CuPy module."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from multireduce import errors


def _fake_cupy(free=3 * 2**30, total=80 * 2**30):
    class OutOfMemoryError(Exception):
        pass

    freed = []
    mod = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            Device=lambda: types.SimpleNamespace(id=2),
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
    for part in ("GPU 2", "Fake H200", "a scan", "(1025, 33)", "float32", f"{1025 * 33 * 4} bytes",
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
