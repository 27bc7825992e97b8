"""CuPy input to the exact functions. No exact GPU kernel yet: chunks are copied to the host and go
through the CPU path, so results are bitwise the CPU's (and slow: a device-to-host copy per chunk)."""

from __future__ import annotations

import numpy as np


def to_host(block) -> np.ndarray:
    import cupy

    return cupy.asnumpy(block)


def reduce(x, plan):
    import cupy

    return cupy.asarray(plan.whole(to_host(x)))


def cumsum(x, axis: int, dt):
    import cupy

    from ..exact import _cumsum_block

    return cupy.asarray(_cumsum_block(to_host(x), axis, dt))
