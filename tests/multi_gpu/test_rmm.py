"""GPU workers on RMM (``local_cluster(rmm_pool_size=...)`` and ``rmm_async=True``): CuPy allocates through
RMM on every worker, nothing multireduce does allocates from CuPy's own pool there, and sums and scans of
chunks persisted with ``mr.persist`` (an equal, contiguous range per GPU) are right. The argument plumbing
is tested without a GPU in tests/test_cluster_rmm.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (pip install 'multireduce[cluster]')")
pytest.importorskip("rmm", reason="RMM is not installed (pip install rmm-cu13, or rmm-cu12 for CUDA 12)")
pytestmark = [pytest.mark.multi_gpu, pytest.mark.gpu]

import dask.array as da  # noqa: E402
import distributed  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.cluster import gpu_count, local_cluster  # noqa: E402
from multireduce.placement import chunk_keys  # noqa: E402

from .test_multi_gpu import _make_block  # noqa: E402

CHUNK = (1 << 20) + 3  # awkward sizes: the last chunk is short
N = 37 * CHUNK - 11


@pytest.fixture(scope="module", params=[{"rmm_pool_size": "1GiB"}, {"rmm_async": True}],
            ids=["pool", "async"])
def rmm_client(request):
    workers = min(gpu_count(), 4)
    with local_cluster(n_workers=workers, gpu=True, **request.param) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(workers, timeout=120)
        yield client, request.param


def _allocators():
    """On a worker: CuPy's allocator, RMM's resource, and what CuPy's own pool holds."""
    import cupy
    import rmm

    allocator = cupy.cuda.get_allocator()
    return {"allocator": f"{getattr(allocator, '__module__', '')}.{getattr(allocator, '__qualname__', '')}",
            "resource": type(rmm.mr.get_current_device_resource()).__name__,
            "cupy_pool_bytes": cupy.get_default_memory_pool().total_bytes()}


def _persisted(client, dtype, seed):
    chunks = ((CHUNK,) * (N // CHUNK) + ((N % CHUNK,) if N % CHUNK else ()),)
    x = da.map_blocks(_make_block, dtype, seed, chunks=chunks, dtype=dtype, meta=cupy.empty(0, dtype=dtype))
    x = mr.persist(x, client=client)
    distributed.wait(x)
    return x


def test_cupy_allocates_through_rmm_on_every_worker(rmm_client):
    client, options = rmm_client
    seen = client.run(_allocators)
    assert len(seen) == min(gpu_count(), 4)
    want = "CudaAsyncMemoryResource" if options.get("rmm_async") else "PoolMemoryResource"
    for worker, facts in seen.items():
        assert facts["allocator"].startswith("rmm."), (worker, facts)
        assert facts["resource"] == want, (worker, facts)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_sum_and_cumsum_of_persisted_chunks(rmm_client, dtype):
    client, _ = rmm_client
    x = _persisted(client, dtype, seed=int(np.dtype(dtype).num))
    who = client.who_has(x)
    shares = {a: 0 for a in client.scheduler_info()["workers"]}
    for key in chunk_keys(x):
        (holder,) = who.get(key) or who.get(str(key))
        shares[holder] += 1
    assert max(shares.values()) - min(shares.values()) <= 1, shares

    host = cupy.asnumpy(x.compute())
    total = mr.sum(x).compute()  # the held path: every worker reduces its own chunks
    scanned = mr.cumsum(x).persist()  # the held scan: outputs stay on the workers
    distributed.wait(scanned)
    got = cupy.asnumpy(scanned.compute())
    if np.dtype(dtype).kind == "i":
        assert int(total) == int(host.sum())
        np.testing.assert_array_equal(got, np.cumsum(host))
    else:
        ref = np.cumsum(host.astype(np.float64))
        assert float(total) == pytest.approx(float(ref[-1]), rel=1e-9, abs=1e-6)
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-6)
    # everything the work allocated on the workers came from RMM: CuPy's own pool was never used
    assert all(f["cupy_pool_bytes"] == 0 for f in client.run(_allocators).values())
