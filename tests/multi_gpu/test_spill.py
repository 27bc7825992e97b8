"""On GPUs: a lazy CuPy array larger than the workers' GPU memory. Each worker's CuPy pool
is capped (a hard limit: an allocation past it fails) and dask-cuda's ``device_memory_limit`` spills stored
chunks to host memory below the cap. dask.array's sum and cumsum finish there; so must mr.sum and mr.cumsum,
and their graphs read one input chunk per task. The CPU version, with worker memory limits, is
tests/test_faults.py::test_lazy_inputs_stream_on_a_memory_limited_cluster."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (pip install 'multireduce[cluster]')")
pytestmark = pytest.mark.multi_gpu

import dask.array as da  # noqa: E402
import distributed  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.cluster import local_cluster  # noqa: E402

from ..gpu.test_oom import cap_pool  # noqa: E402
from ..test_faults import _chunk_inputs  # noqa: E402
from .test_multi_gpu import _make_block  # noqa: E402

CHUNK = 1 << 20  # float64: 8 MiB a chunk
N_CHUNKS = 128  # 1 GiB in all
DEVICE_LIMIT = 64 * 2**20  # dask-cuda spills stored chunks to host past this
POOL_CAP = 256 * 2**20  # each worker's GPU memory for multireduce and Dask alike
WORKERS = 2


@pytest.fixture(scope="module")
def client():
    # CuPy's own pool, said explicitly (the default is RMM's where rmm is installed): the test caps it
    with local_cluster(n_workers=WORKERS, gpu=True, device_memory_limit=DEVICE_LIMIT, rmm_async=False) as cluster, \
            distributed.Client(cluster) as c:
        c.wait_for_workers(WORKERS, timeout=120)
        yield c


def test_lazy_cupy_array_larger_than_gpu_memory_streams(client):
    caps = client.run(cap_pool, POOL_CAP)
    if None in caps.values():
        pytest.skip(f"the workers do not allocate through CuPy's default pool: {caps}")
    try:
        x = da.map_blocks(_make_block, np.float64, 3, chunks=((CHUNK,) * N_CHUNKS,), dtype=np.float64,
                          meta=cupy.empty(0, dtype=np.float64))
        # no worker can hold its share of x at once: it has to stream (or spill)
        assert x.nbytes > WORKERS * POOL_CAP and x.nbytes > WORKERS * DEVICE_LIMIT
        total, scanned = mr.sum(x), mr.cumsum(x)
        # no task takes more than one chunk of x as an input (tasks following recipes make theirs one at a time)
        assert set(_chunk_inputs(total, x.name, "sum-partial")) <= {0, 1}
        assert set(_chunk_inputs(scanned, x.name, "cumsum-totals")) <= {0, 1}
        # dask.array first, on the same capped cluster: a failure below is about our graphs, not the machine
        ref_total, ref_scan = client.compute([x.sum(), da.cumsum(x)[::2**16].sum()], sync=True)
        got_total, got_scan = client.compute([total, mr.sum(scanned[::2**16])], sync=True)
        # float64 sums of 2^27 uniform(-0.5, 0.5) values in different orders: |error| ~ 1e-9
        assert np.isclose(float(got_total), float(ref_total), rtol=1e-9, atol=1e-6), (got_total, ref_total)
        assert np.isclose(float(got_scan), float(ref_scan), rtol=1e-9, atol=1e-3), (got_scan, ref_scan)
    finally:
        client.run(cap_pool, 0)
