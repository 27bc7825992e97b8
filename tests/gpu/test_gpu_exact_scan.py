"""GPU: the exact cumsum kernels (kernels/exact_scan.cuh via backends/cupy_exact.py). GPU bits == the CPU
exact cumsum's bits (exact.py, the oracle) for every float dtype, awkward sizes, axes, output dtypes and
nancumsum, with no copy of the data to the host; the same bits run after run."""

from __future__ import annotations

import numpy as np
import pytest

import multireduce as mr
from multireduce import exact
from multireduce.backends import cupy_exact

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

FLOATS = [np.float16, np.float32, np.float64]


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    kind = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    nan = np.isnan(a)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(nan, np.isnan(b)) and \
        np.array_equal(a[~nan].view(kind), b[~nan].view(kind))


def make(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    dt = np.dtype(dtype)
    with np.errstate(over="ignore"):
        if kind == "normal":
            x = rng.standard_normal(n)
        elif kind == "cancel":
            half = rng.standard_normal(n // 2) * 1e4
            x = rng.permutation(np.concatenate([half, -half, rng.standard_normal(n - 2 * (n // 2)) * 1e-3]))
        elif kind == "range":
            lo, hi = (-1000, 1000) if dt == np.float64 else (-149, 127) if dt == np.float32 else (-24, 15)
            x = rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(lo, hi, n))
        elif kind == "ints":  # prefixes around 2^(p): exact rounding midpoints
            x = rng.integers(-3, 4, n).astype(np.float64)
            if n:
                x[0] = 2.0 ** (np.finfo(dt).nmant + 1)
        elif kind == "special":
            x = rng.standard_normal(n)
            x[rng.integers(0, n, min(n, 4))] = [np.inf, -np.inf, np.nan, np.inf][: min(n, 4)]
        else:
            raise ValueError(kind)
        return x.astype(dt)


def check(x, axis=None, dtype=None, skipnan=False):
    got = exact.cumsum(cupy.asarray(x), axis=axis, dtype=dtype, skipnan=skipnan)
    assert isinstance(got, cupy.ndarray)
    with np.errstate(over="ignore", invalid="ignore"):
        want = exact.cumsum(x, axis=axis, dtype=dtype, skipnan=skipnan)
    assert same(cupy.asnumpy(got), want), (x.dtype, x.shape, axis, dtype, skipnan)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 31, 33, 1023, 1025, 4095, 4096, 4097, 3 * 4096 + 5])
@pytest.mark.parametrize("kind", ["normal", "cancel", "range", "ints", "special"])
def test_exact_cumsum_gpu_equals_cpu_bits(dtype, n, kind):
    check(make(kind, n, dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_exact_cumsum_axes_output_dtypes_and_nancumsum(dtype):
    x = make("range", 3 * 5 * 700, dtype).reshape(3, 5, 700)
    for axis in (None, 0, 1, 2, -1):
        check(x, axis=axis)
    for out in FLOATS:
        check(x[0], axis=1, dtype=out)
    nans = make("special", 5000, dtype)
    nans[::97] = np.nan
    check(nans, skipnan=True)
    assert same(cupy.asnumpy(mr.nancumsum(cupy.asarray(nans), exact=True)), exact.cumsum(nans, skipnan=True))
    check(np.asfortranarray(x[:, :, :50]), axis=0)  # strided input: one device copy


@pytest.mark.large
@pytest.mark.parametrize("dtype", FLOATS)
def test_exact_cumsum_past_2_24(dtype):
    """2^24 + 7 elements: thousands of tiles and a ragged last one. The host scan is slow (~2 us per
    element): the last 5000 outputs against it seeded with the exact state of everything before them,
    and ~100 sampled prefixes against exact.sum."""
    n = (1 << 24) + 7
    x = make("cancel" if dtype == np.float64 else "normal", n, dtype)
    got = cupy.asnumpy(exact.cumsum(cupy.asarray(x)))
    carry = exact._lane_states(x[: n - 5000], 0)
    assert same(got[n - 5000:], exact._cumsum_block(x[n - 5000:], 0, np.dtype(dtype), carry))
    idx = np.unique(np.concatenate([np.arange(0, n, n // 97), [n - 1]]))
    for i in idx.tolist():
        ref = exact.sum(x[: i + 1])
        assert same(got[i:i + 1], np.asarray([ref], dtype=dtype)), i


def test_exact_cumsum_is_repeatable_and_needs_no_host_copy(monkeypatch):
    x = cupy.asarray(make("cancel", (1 << 20) + 3, np.float64))
    monkeypatch.setattr(cupy_exact, "to_host", lambda b: pytest.fail("copied to the host"))
    first = cupy.asnumpy(exact.cumsum(x))
    for _ in range(20):
        assert same(cupy.asnumpy(exact.cumsum(x)), first)


def test_nvrtc_build_is_exact_on_float32_subnormals():
    """Under CuPy's -ftz=true a float32 subnormal must still enter and leave the scan exactly."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    x = np.array([tiny, tiny, -tiny, 3 * tiny, np.float32(1e-40), -np.float32(1e-40)], dtype=np.float32)
    check(x)
    check(np.tile(x, 1000))
