"""A statistic's chunk partials left on the GPU and brought to the host together (backends.partials_later,
finish_later; what the held path does for every chunk of a worker) against each partial copied at once:
the same values, bit for bit, for every statistic, layout and dtype, chunks on every GPU in one finish."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

from multireduce.backends import Later, cupy_stats, finish_later, partials_later  # noqa: E402

CALLS = {
    "argmax": lambda b, axes: cupy_stats.arg_chunk(b, axes, True, False, (3,) * b.ndim, tuple(s + 3 for s in b.shape)),
    "nanargmin": lambda b, axes: cupy_stats.arg_chunk(b, axes, False, True, (0,) * b.ndim, b.shape),
    "var": lambda b, axes: cupy_stats.moments_chunk(b, axes, False),
    "nanvar": lambda b, axes: cupy_stats.moments_chunk(b, axes, True),
    "nanmax": lambda b, axes: cupy_stats.extreme_chunk(b, axes, True),
    "nanmin": lambda b, axes: cupy_stats.extreme_chunk(b, axes, False),
    "any": lambda b, axes: cupy_stats.truth_chunk(b, axes, False),
    "all": lambda b, axes: cupy_stats.truth_chunk(b, axes, True),
    "count_nonzero": lambda b, axes: cupy_stats.count_chunk(b, axes),
}


def _blocks(dtype):
    rng = np.random.default_rng(8)
    out = []
    for device in range(cupy.cuda.runtime.getDeviceCount()):
        for shape in ((1025,), (33, 31), (1, 7)):
            a = rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else \
                rng.integers(-50, 50, shape).astype(dtype)
            if a.dtype.kind == "f":
                a.ravel()[::5] = np.nan
                a[..., :1] = np.nan  # an all-NaN column
            a.ravel()[1::7] = 0
            with cupy.cuda.Device(device):
                out.append(cupy.asarray(a))
    return out


def _bits(partial):
    return [(np.asarray(p).dtype, np.asarray(p).shape, np.asarray(p).tobytes()) for p in partial]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("stat", sorted(CALLS))
def test_partials_finished_together_are_those_copied_one_by_one(stat, dtype):
    blocks = _blocks(dtype)
    cases = [(b, axes) for b in blocks for axes in ([(0,)] if b.ndim == 1 else [(0, 1), (0,), (1,)])]
    want = [_bits(CALLS[stat](b, axes)) for b, axes in cases]
    with partials_later():
        later = [CALLS[stat](b, axes) for b, axes in cases]
    assert all(type(v) is Later for v in later)  # nothing waited for the GPU inside
    got = [_bits(p) for p in finish_later(later)]
    assert got == want
