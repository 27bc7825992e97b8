"""Dask arrays with CuPy chunks through the graph, on one GPU (multi-GPU placement is tests/multi_gpu)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("synchronous_scheduler")]

import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402

from ..helpers import assert_matches, matmul_operator, random_array, random_matrices, reference_reduce  # noqa: E402


def _dask_cupy(host, chunks):
    return da.from_array(host, chunks=chunks, asarray=False).map_blocks(cupy.asarray, dtype=host.dtype)


@pytest.mark.parametrize("split_every", [2, 64])
@pytest.mark.parametrize("opname", ["sum", "prod", "min", "max", "mean"])
def test_reductions_of_cupy_chunks(opname, split_every):
    host = random_array(np.random.default_rng(0), (1000, 37), np.float32, opname)
    x = _dask_cupy(host, ((1, 0, 499, 300, 200), (10, 27)))
    for axis in [None, 0, 1]:
        lazy = getattr(mr, opname)(x, axis=axis, split_every=split_every)
        assert isinstance(lazy._meta, cupy.ndarray)
        got = lazy.compute()
        assert isinstance(got, cupy.ndarray)
        ref, mass = reference_reduce(host, opname, axis=axis)
        assert_matches(cupy.asnumpy(got), ref, mass, np.float32, np.float32, host.size, f"{opname} axis={axis}")


def test_cumsum_of_cupy_chunks_matches_numpy():
    host = random_array(np.random.default_rng(1), 100_003, np.int32)
    x = _dask_cupy(host, 7001)
    got = mr.cumsum(x).compute()
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), np.cumsum(host))


def test_noncommutative_scan_across_cupy_chunks():
    op = matmul_operator()
    host = random_matrices(np.random.default_rng(2), 5003)
    x = _dask_cupy(host, 97)
    np.testing.assert_array_equal(cupy.asnumpy(mr.scan(x, op).compute()), mr.scan(host, op))
    assert int(mr.reduce(x, op, split_every=3).compute()) == int(mr.reduce(host, op))
