"""Statistics on one CuPy chunk: the NumPy backend's chunk code run with ``xp=cupy`` on the GPU that
holds the chunk, then the (small) partial copied to the host, so partials cross workers cheaply and
merge on the host. Merges are the NumPy backend's.

Today each chunk statistic is composed of CuPy calls (several passes over the chunk); the one-pass
kernels of ``kernels/stats.cuh`` are the planned replacement (see the report in the lead's notes).
"""

from __future__ import annotations

import cupy

from . import numpy_stats as _host

name = "cupy"


def to_host(partial):
    return tuple(cupy.asnumpy(p) for p in partial)


def _on_holder(block):
    return cupy.cuda.Device(block.data.device_id)


def arg_chunk(block, axes, largest, skipnan, offsets, shape):
    with _on_holder(block):
        return to_host(_host.arg_chunk(block, axes, largest, skipnan, offsets, shape, xp=cupy))


def moments_chunk(block, axes, skipnan):
    with _on_holder(block):
        return to_host(_host.moments_chunk(block, axes, skipnan, xp=cupy))


def extreme_chunk(block, axes, largest):
    with _on_holder(block):
        return to_host(_host.extreme_chunk(block, axes, largest, xp=cupy))


def truth_chunk(block, axes, every):
    with _on_holder(block):
        return to_host(_host.truth_chunk(block, axes, every, xp=cupy))


def count_chunk(block, axes):
    with _on_holder(block):
        return to_host(_host.count_chunk(block, axes, xp=cupy))
