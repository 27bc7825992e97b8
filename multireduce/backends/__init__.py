"""Backends compute on one array in one place: NumPy on the CPU, CuPy (our kernels) on one GPU.

A backend is a module with the same functions (``reduce``, ``combine``, ``scan``, ``stack``, ...);
``backend_for`` picks it from the array type, so CuPy data always runs on the GPU that holds it.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

from . import numpy_backend


def is_cupy_array(x) -> bool:
    return type(x).__module__.startswith("cupy")


def on_device_of(x):
    """A context on the GPU that holds CuPy ``x`` (CuPy runs kernels and allocates on the current GPU,
    which need not be x's); for anything else, one that does nothing."""
    if is_cupy_array(x):
        import cupy

        return cupy.cuda.Device(x.data.device_id)
    return contextlib.nullcontext()


def backend_for(x) -> ModuleType:
    if is_cupy_array(x):
        from . import cupy_backend

        return cupy_backend
    return numpy_backend
