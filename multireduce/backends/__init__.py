"""Backends compute on one array in one place: NumPy on the CPU, CuPy (our kernels) on one GPU.

A backend is a module with the same functions (``reduce``, ``combine``, ``scan``, ``stack``, ...);
``backend_for`` picks it from the array type, so CuPy data always runs on the GPU that holds it.
"""

from __future__ import annotations

import contextlib
import threading
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


_later = threading.local()


@contextlib.contextmanager
def partials_later():
    """Within it, on this thread, a backend may return a chunk's partial as a ``Later`` (what the GPU
    computed, still on the GPU, and what the host makes of it) instead of waiting for the GPU: a caller
    computing many chunks' partials then brings them to the host together (``finish_later``)."""
    before = getattr(_later, "on", False)
    _later.on = True
    try:
        yield
    finally:
        _later.on = before


def later_wanted() -> bool:
    return getattr(_later, "on", False)


class Later:
    """A chunk's partial not yet on the host: ``raw`` (a device byte buffer) and ``then``, which makes the
    partial from ``raw``'s bytes on the host (a NumPy uint8 array)."""

    __slots__ = ("raw", "then")

    def __init__(self, raw, then):
        self.raw, self.then = raw, then


def finish_later(values: list) -> list:
    """``values`` with every ``Later`` made into its partial, the raw buffers of each GPU brought to the
    host in one copy (a copy per chunk waits for the GPU each time: it then idles while the host prepares
    the next chunk's launch)."""
    at = [i for i, v in enumerate(values) if type(v) is Later]
    if not at:
        return values
    import numpy as np

    out = list(values)
    by_device: dict = {}
    for i in at:
        raw = values[i].raw
        if is_cupy_array(raw):
            by_device.setdefault(raw.data.device_id, []).append(i)
        else:  # already on the host
            out[i] = values[i].then(np.asarray(raw))
    if not by_device:
        return out
    import cupy

    for device, items in by_device.items():
        with cupy.cuda.Device(device):
            raws = [values[i].raw for i in items]
            flat = (cupy.concatenate(raws) if len(raws) > 1 else raws[0]).get()
        offsets = np.cumsum([0] + [r.size for r in raws])
        for j, i in enumerate(items):
            out[i] = values[i].then(flat[offsets[j]:offsets[j + 1]])
    return out
