"""A request that cannot fit in GPU memory raises GPUOutOfMemoryError (naming the array and the GPU), and the
next request in the same process succeeds."""

from __future__ import annotations

import gc

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce.errors import GPUOutOfMemoryError, gpu_memory_guard  # noqa: E402

N = 64 * 2**20 + 33  # float32: 256 MiB and an awkward tail


@pytest.fixture
def nearly_full_gpu():
    """x on the GPU, and CuPy's pool capped so that a scan's output of x cannot fit. A cap rather than a
    filler sized from memGetInfo: other processes on the same GPU (pytest-xdist workers, a cluster's
    workers) change the free memory between the measurement and the call, which made the test flaky."""
    pool = cupy.get_default_memory_pool()
    host = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    x = cupy.asarray(host)
    # arrays of earlier tests die at some garbage collection; a free block they leave in the pool would
    # be reused under the cap (run 2026-11-22: the call did not raise), so collect and empty the pool first
    gc.collect()
    pool.free_all_blocks()
    limit = pool.get_limit()
    pool.set_limit(size=pool.total_bytes() + x.nbytes // 4)
    hold = [limit]  # _recover_and_check lifts the cap (pops it)

    yield host, x, hold
    pool.set_limit(size=limit)
    pool.free_all_blocks()


def _recover_and_check(host, x, cap_holder):
    cupy.get_default_memory_pool().set_limit(size=cap_holder.pop())
    cupy.get_default_memory_pool().free_all_blocks()
    got = cupy.asnumpy(mr.cumsum(x))
    ref = np.cumsum(host.astype(np.float64))
    # float32 running sums of N normals: the error grows like sqrt(N) * eps * |partial sums|
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * np.sqrt(N) * np.abs(ref).max())
    assert np.isclose(float(mr.sum(x, compute=True)), host.astype(np.float64).sum(), rtol=1e-4, atol=1.0)


def test_guard_names_array_and_gpu_then_recovers(nearly_full_gpu):
    host, x, hold = nearly_full_gpu
    with pytest.raises(GPUOutOfMemoryError) as info:
        with gpu_memory_guard(x, "a scan"):
            mr.cumsum(x)
    msg = str(info.value)
    dev = cupy.cuda.Device()
    assert isinstance(info.value.__cause__, cupy.cuda.memory.OutOfMemoryError)
    assert f"GPU {dev.id}" in msg and f"({N},)" in msg and "float32" in msg and f"{N * 4} bytes" in msg
    _recover_and_check(host, x, hold)


def test_api_raises_the_clear_error_then_recovers(nearly_full_gpu):
    """Needs gpu_memory_guard wired into core (ReductionPlan._chunk, ScanPlan.scan_block, the eager path)."""
    host, x, hold = nearly_full_gpu
    with pytest.raises(GPUOutOfMemoryError, match="float32"):
        mr.cumsum(x)
    _recover_and_check(host, x, hold)
