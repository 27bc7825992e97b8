"""The statistics on CuPy data (the one-pass kernels of kernels/stats.cuh and the CuPy compositions)
against NumPy: awkward sizes, misaligned views (the kernels' scalar head), ties and NaNs at 16-byte
pack and block boundaries, ill-conditioned variances, and Dask arrays of CuPy chunks."""

from __future__ import annotations

import math
import warnings

import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.statistics import VAR_BOUND

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("synchronous_scheduler")]
cupy = pytest.importorskip("cupy")

from multireduce.backends import cupy_stats  # noqa: E402

SIZES = [1, 31, 33, 1025, 4097, (1 << 20) + 3]
DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64]
ARG = {"argmax": np.argmax, "argmin": np.argmin, "nanargmax": np.nanargmax, "nanargmin": np.nanargmin}


def _few_values(rng, n, dtype):
    """Values from a handful, so that ties are everywhere."""
    if np.dtype(dtype).kind == "b":
        return rng.random(n) < 0.5
    return rng.integers(0, 5, n).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_arg_kernels_match_numpy(dtype, n):
    rng = np.random.default_rng(n)
    x = _few_values(rng, n + 3, dtype)
    g = cupy.asarray(x)
    for start in (0, 1, 3):  # misaligned views go through the kernels' scalar head
        h, hx = g[start:start + n], x[start:start + n]
        for name in ARG:
            got = getattr(mr, name)(h)
            assert isinstance(got, cupy.ndarray) and int(got) == ARG[name](hx), (name, start)
    assert cupy_stats._modules, "the one-pass kernels did not run"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_arg_kernels_ties_and_nans_at_boundaries(dtype):
    n = (1 << 20) + 3
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, n).astype(dtype)
    pack = 16 // np.dtype(dtype).itemsize
    for b in (pack, 256 * pack, 4096 * pack, n - 1):  # pack, block-stride and tail boundaries
        y = x.copy()
        y[b - 1] = y[b] = 2
        y[b // 2] = -2
        y[min(b + 7, n - 1)] = -2
        g = cupy.asarray(y)
        for name in ARG:
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, b)
        y[b] = np.nan
        y[b + 1 if b + 1 < n else 0] = np.nan
        g = cupy.asarray(y)
        for name in ARG:
            assert int(getattr(mr, name)(g)) == ARG[name](y), (name, b, "nan")
    with pytest.raises(ValueError, match="All-NaN"):
        mr.nanargmax(cupy.full(1025, cupy.nan, dtype=dtype))


def _exact_var(x, ddof=0):
    w = np.asarray(x, dtype=np.float64).ravel()
    mean = math.fsum(w) / w.size
    return math.fsum((w - mean) ** 2) / (w.size - ddof)


@pytest.mark.parametrize("offset,dtype", [(1e8, np.float64), (1e4, np.float32), (0.0, np.float16), (0.0, np.int32)])
@pytest.mark.parametrize("n", [2, 31, 1025, (1 << 20) + 3])
def test_moment_kernels_within_bound(offset, dtype, n):
    rng = np.random.default_rng(n)
    x = (offset + rng.normal(0, 1, n)) if np.dtype(dtype).kind == "f" else rng.integers(-1000, 1000, n)
    x = x.astype(dtype)
    ref = _exact_var(x, 1)
    out = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)
    bound = VAR_BOUND + 2 * float(np.finfo(out).eps)
    for g in (cupy.asarray(x), cupy.asarray(np.concatenate([x[:1], x]))[1:]):
        got = mr.var(g, ddof=1)
        assert isinstance(got, cupy.ndarray) and got.dtype == out
        assert abs(float(got) - ref) <= bound * ref
        assert abs(float(mr.std(g, ddof=1)) - math.sqrt(ref)) <= bound * math.sqrt(ref)
        assert abs(float(mr.nanmean(g)) - float(np.mean(x.astype(np.float64)))) <= 1e-12 * max(1, abs(offset)) + \
            4 * float(np.finfo(out).eps) * max(1, abs(offset))


def test_nan_moments_on_gpu():
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, 4099)
    x[rng.random(x.size) < 0.3] = np.nan
    x[0] = np.nan  # no anchor at x[0]
    g = cupy.asarray(x)
    for name, ref in (("nanvar", np.nanvar), ("nanstd", np.nanstd), ("nanmean", np.nanmean)):
        np.testing.assert_allclose(float(getattr(mr, name)(g)), ref(x), rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(float(mr.var(g)))


@pytest.mark.parametrize("name", ["argmax", "nanargmin", "var", "nanstd", "nanmean", "nanmax", "nansum",
                                  "any", "all", "count_nonzero"])
def test_every_axis_and_dask_cupy(name):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (65, 129)).astype(np.float32)
    x[3, 7] = x[40, 100] = 9  # a tie across chunks
    x[rng.random(x.shape) < 0.05] = np.nan
    fn = getattr(mr, name)
    ref_fn = getattr(np, name)
    g = cupy.asarray(x)
    d = da.from_array(g, chunks=(16, 50))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for axis in (None, 0, 1):
            ref = np.asarray(ref_fn(x, axis=axis))
            for got in (fn(g, axis=axis), fn(d, axis=axis, split_every=2).compute()):
                assert isinstance(got, cupy.ndarray), type(got)
                np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), ref.astype(np.float64),
                                           rtol=1e-5, atol=1e-5, err_msg=f"{name} axis={axis}")
