"""Group-by over CuPy chunks on several GPUs (a LocalCUDACluster, one worker per GPU): a field of hours
grouped by month through one tree, a task per worker making its chunks' partials where they are held,
and by day through cohorts; each with the bits of the graph of one task per chunk and against NumPy. The
same logic runs on CPU clusters in tests/test_groupby.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
pytestmark = pytest.mark.multi_gpu

import dask  # noqa: E402
import distributed  # noqa: E402

import multireduce as mr  # noqa: E402

from .test_held_paths_gpu import _gpu_array, _same  # noqa: E402
from .test_multi_gpu import client  # noqa: E402, F401 - the module's cluster of one worker per GPU


def _months(hours: int) -> np.ndarray:
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
    return np.resize(np.repeat(np.arange(12), days), hours)


@pytest.mark.parametrize("func, by, method", [("mean", "month", "map-reduce"), ("nanvar", "month", "map-reduce"),
                                              ("max", "day", "cohorts"), ("nansum", "day", "cohorts"),
                                              ("mean", "month", "cohorts")])
def test_field_grouped_on_every_gpu_gives_the_bits_of_a_task_per_chunk(client, func, by, method):  # noqa: F811
    hours = 2000
    x = client.persist(_gpu_array((hours, 16, 24), (83, 16, 24), seed=70))
    distributed.wait(x)
    labels = _months(hours) if by == "month" else np.arange(hours) // 24
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with dask.config.set({"multireduce.placement": False}), distributed.get_task_stream(client) as per_chunk:
            want = mr.groupby_reduce(x, labels, func, axis=0, method=method)[0].compute()
        with distributed.get_task_stream(client) as stream:
            got = mr.groupby_reduce(x, labels, func, axis=0, method=method)[0].compute()
        assert isinstance(got, cupy.ndarray) and _same(got, want)
        reference = mr.groupby_reduce(cupy.asnumpy(x.compute()), labels, func, axis=0)[0]
    np.testing.assert_allclose(cupy.asnumpy(got), reference, rtol=2e-5, atol=1e-6, equal_nan=True)
    if method == "map-reduce":  # a task per worker, not per chunk
        assert len(stream.data) < len(per_chunk.data) / 4, (len(stream.data), len(per_chunk.data))
