"""GPU: exact functions on CuPy input, and the deterministic look-back scan (kernels/scan.cuh)."""

from __future__ import annotations

import numpy as np
import pytest

import multireduce as mr
from multireduce import exact

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 1023, 1025, 4096 * 32 + 1])
def test_exact_sum_gpu_equals_cpu_bits(dtype, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(dtype)
    got = exact.sum(cupy.asarray(x))
    assert isinstance(got, cupy.ndarray)
    assert bits(cupy.asnumpy(got)) == bits(exact.sum(x))
    c = exact.cumsum(cupy.asarray(x[:2000]))
    assert np.array_equal(bits(cupy.asnumpy(c)), bits(exact.cumsum(x[:2000])))


_NOT_YET_DETERMINISTIC = pytest.mark.xfail(
    strict=False,
    reason="the window-anchored look-back (32-tile windows, only window ends publish a prefix) made scans "
           "27-73 % slower on an H200 (2026-11-22: float32 0.59 x copy vs 0.81, int32->int64 0.22 vs 0.75) and "
           "was reverted; a cheaper anchoring is open work (issue 15)")


@_NOT_YET_DETERMINISTIC
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [(1 << 22) + 17, 1 << 24])
def test_lookback_scan_is_bitwise_repeatable(dtype, n):
    """100 runs, one result: the look-back's association order must not depend on timing. Sizes span
    many 32-tile windows, and a ragged last tile."""
    rng = np.random.default_rng(7)
    x = cupy.asarray(rng.standard_normal(n).astype(dtype))
    first = mr.cumsum(x)
    ref = np.cumsum(cupy.asnumpy(x).astype(np.float64))
    assert np.allclose(cupy.asnumpy(first), ref, rtol=1e-3, atol=1e-3 * np.sqrt(n))
    first_bits = bits(cupy.asnumpy(first))
    for _ in range(99):
        assert np.array_equal(bits(cupy.asnumpy(mr.cumsum(x))), first_bits)


@_NOT_YET_DETERMINISTIC
def test_lookback_rows_are_repeatable():
    rng = np.random.default_rng(9)
    x = cupy.asarray(rng.standard_normal((3, (1 << 20) + 5)).astype(np.float32))
    first = bits(cupy.asnumpy(mr.cumsum(x, axis=1)))
    for _ in range(20):
        assert np.array_equal(bits(cupy.asnumpy(mr.cumsum(x, axis=1))), first)
