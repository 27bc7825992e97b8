"""The held paths' memory check on a real GPU: the free memory read where CuPy allocates (the device and
CuPy's pool, a pool limit included), and a held scan whose outputs cannot fit on the worker's GPU failing
before any work with an error naming the worker; with room, the same scan runs. The decision itself is
tested without a GPU in tests/test_direct_memory.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402
from multireduce.errors import GPUOutOfMemoryError  # noqa: E402

from .test_oom import CHUNK, HEADROOM, cap_pool, cuda_client  # noqa: E402, F401 - a one-GPU Dask CUDA worker


def test_free_memory_is_read_where_cupy_allocates():
    pool = cupy.get_default_memory_pool()
    if cupy.cuda.get_allocator() != pool.malloc:
        pytest.skip("CuPy does not allocate through its default pool here")
    held = cupy.ones(1 << 20)  # 8 MiB in use
    spare = cupy.ones(1 << 20)
    del spare  # 8 MiB cached in the pool
    device = cupy.cuda.Device().id
    room = direct._gpu_room(device)
    free, total = cupy.cuda.runtime.memGetInfo()
    assert set(room) == {"device", "CuPy's pool"} and room["CuPy's pool"] == pool.free_bytes() >= 8 << 20
    assert 0 < room["device"] <= total and abs(room["device"] - free) < 256 << 20
    try:
        pool.set_limit(size=pool.total_bytes() + (3 << 20))
        capped = direct._gpu_room(device)
        assert capped == {"device": 3 << 20, "CuPy's pool": pool.free_bytes()}, capped
    finally:
        pool.set_limit(size=0)
    found = direct._room_on([held])
    assert found is not None and found[1] == [device] and set(found[0]) == {"device", "CuPy's pool"}
    assert direct._room_on([np.ones(3)]) is None


def _kept(prefix: str, dask_worker=None) -> int:
    return sum(isinstance(k, tuple) and str(k[0]).startswith(prefix) for k in dask_worker.data)


def test_a_held_scan_that_cannot_fit_fails_before_any_work(cuda_client):
    import dask.array as da
    import distributed

    client = cuda_client
    host = np.random.default_rng(52).standard_normal(8 * CHUNK + 33)
    x = client.persist(da.from_array(host, chunks=CHUNK).map_blocks(cupy.asarray, dtype=host.dtype))
    distributed.wait(x)
    (worker,) = client.scheduler_info()["workers"]
    if client.run(cap_pool, HEADROOM, True)[worker] is None:
        pytest.skip("the worker does not allocate through CuPy's default pool")
    try:
        with distributed.get_task_stream(client) as stream, pytest.raises(GPUOutOfMemoryError) as info:
            mr.cumsum(x).persist()  # 8 chunks of 16 MiB kept, one more of scratch: 144 MiB, 4 MiB free
        text = str(info.value)
        need = (8 * CHUNK + 33 + CHUNK) * 8
        assert f"worker {worker}: the held scan's outputs need {need} bytes" in text, text
        assert info.value.gpu["free"] < need and "nothing was computed" in text, text
        assert not stream.data and client.run(_kept, "cumsum-seeded")[worker] == 0
    finally:
        client.run(cap_pool, 0)
    got = mr.cumsum(x).persist()
    ref = np.cumsum(host)
    np.testing.assert_allclose(cupy.asnumpy(got.compute()), ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def _room_here():
    return direct._gpu_room(cupy.cuda.Device().id)


@pytest.mark.parametrize("options", [{"rmm_pool_size": "1GiB"}, {"rmm_async": True}], ids=["pool", "async"])
def test_free_memory_is_read_through_rmm(options):
    """CuPy allocating through RMM: a pool's unused part counts (the whole pool where nothing tracks its
    allocations); the asynchronous allocator's is not readable, so it is not checked. A held scan that fits
    runs under both."""
    pytest.importorskip("rmm", reason="RMM is not installed (pip install rmm-cu13, or rmm-cu12 for CUDA 12)")
    pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (pip install 'multireduce[cluster]')")
    import dask.array as da
    import distributed

    from multireduce.cluster import local_cluster

    with local_cluster(n_workers=1, gpu=True, **options) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(1, timeout=120)
        (room,) = client.run(_room_here).values()
        if options.get("rmm_async"):
            assert room is None
        else:
            assert set(room) == {"device", "RMM's pool"} and room["RMM's pool"] > 0, room
        host = np.random.default_rng(53).integers(-1000, 1000, size=4 * CHUNK + 7)
        x = client.persist(da.from_array(host, chunks=CHUNK).map_blocks(cupy.asarray, dtype=host.dtype))
        distributed.wait(x)
        np.testing.assert_array_equal(cupy.asnumpy(mr.cumsum(x).persist().compute()), np.cumsum(host))
