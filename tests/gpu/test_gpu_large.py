"""Past 2^31 elements: 64-bit indexing in the production reduce and scan, on a real GPU (needs ~30 GB)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = [pytest.mark.gpu, pytest.mark.large]

import multireduce as mr  # noqa: E402

N = (1 << 31) + 7


@pytest.fixture(scope="module")
def bytes_past_2_31():
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 30 * 2**30:
        pytest.skip(f"needs ~30 GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    x = cupy.random.randint(0, 256, size=N, dtype=cupy.uint8)
    yield x, cupy.asnumpy(x)
    del x
    cupy.get_default_memory_pool().free_all_blocks()


def test_sum_past_2_31(bytes_past_2_31):
    dev, host = bytes_past_2_31
    expected = int(np.sum(host, dtype=np.uint64))
    assert int(mr.sum(dev)) == expected
    assert int(mr.sum(dev, algorithm="vectorized")) == expected
    assert int(mr.max(dev)) == int(host.max()) and int(mr.min(dev)) == int(host.min())


def test_cumsum_past_2_31(bytes_past_2_31):
    dev, host = bytes_past_2_31
    out = mr.cumsum(dev)  # uint64, 16 GiB
    assert out.dtype == np.uint64 and out.size == N
    ref = np.cumsum(host, dtype=np.uint64)
    for lo in [0, (1 << 31) - 4096, N - 4096, 12345678]:
        np.testing.assert_array_equal(cupy.asnumpy(out[lo : lo + 4096]), ref[lo : lo + 4096])
    step = np.arange(0, N, 999_983)
    np.testing.assert_array_equal(cupy.asnumpy(out[cupy.asarray(step)]), ref[step])
    del out
    cupy.get_default_memory_pool().free_all_blocks()


def test_float32_sum_past_2_31():
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 12 * 2**30:
        pytest.skip("needs ~12 GiB of free GPU memory")
    x = cupy.random.random(N, dtype=cupy.float32) - 0.5
    got = float(mr.sum(x))
    ref = float(cupy.sum(x, dtype=cupy.float64))  # float64 reference (baseline use only)
    mass = float(cupy.sum(cupy.abs(x), dtype=cupy.float64))
    eps = np.finfo(np.float32).eps
    assert abs(got - ref) <= eps * (N / 1024 + 64) * mass
