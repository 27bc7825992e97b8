"""Several GPUs through a LocalCUDACluster (one worker per GPU): results equal the single-GPU results,
chunks stay on their GPU, outputs are made where their inputs live, a killed worker is recomputed.
The same grouping logic runs on a CPU cluster in tests/test_placement.py."""

from __future__ import annotations

import math
import os
import signal

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
pytestmark = pytest.mark.multi_gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import distributed  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce import placement  # noqa: E402
from multireduce.cluster import gpu_count, local_cluster  # noqa: E402

from ..helpers import assert_matches, task_count  # noqa: E402


def _make_block(dtype, seed, block_info=None):
    import cupy

    loc = block_info[None]["chunk-location"][0]
    shape = block_info[None]["chunk-shape"]
    rng = cupy.random.default_rng(seed + loc)
    if np.dtype(dtype).kind == "f":
        return rng.random(shape, dtype=dtype) - 0.5
    return rng.integers(-1000, 1000, size=shape, dtype=dtype)


def gpu_array(client, n, chunk, dtype, seed=0):
    x = da.map_blocks(_make_block, dtype, seed, chunks=((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()),),
                      dtype=dtype, meta=cupy.empty(0, dtype=dtype))
    x = client.persist(x)
    distributed.wait(x)
    return x


@pytest.fixture(scope="module")
def client():
    if gpu_count() < 2:
        pytest.skip(f"needs 2 or more GPUs; {gpu_count()} visible")
    with local_cluster(n_workers=min(gpu_count(), 4), gpu=True) as cluster, distributed.Client(cluster) as c:
        yield c


def _single_gpu(x):
    return cupy.asarray(x.compute())  # gathered onto this process's GPU


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_results_equal_single_gpu(client, dtype):
    x = gpu_array(client, (1 << 24) + 7, 1 << 20, dtype, seed=int(np.dtype(dtype).num))
    whole = _single_gpu(x)
    for opname in ["sum", "min", "max", "prod"]:
        got = getattr(mr, opname)(x).compute()
        assert isinstance(got, cupy.ndarray)
        ref = getattr(mr, opname)(whole)
        if np.dtype(dtype).kind != "f" or opname in ("min", "max"):
            assert got.item() == ref.item(), opname  # bitwise for integers
        elif opname == "sum":
            host = cupy.asnumpy(whole).astype(np.float64)
            assert_matches(cupy.asnumpy(got), host.sum(), np.abs(host).sum(), np.float32, np.float32, host.size)
    got = mr.cumsum(x).compute()
    ref = mr.cumsum(whole)
    if np.dtype(dtype).kind != "f":
        cupy.testing.assert_array_equal(got, ref)
    else:
        host = cupy.asnumpy(whole).astype(np.float64)
        assert_matches(cupy.asnumpy(got), np.cumsum(host), np.cumsum(np.abs(host)), np.float32, np.float32, host.size)


def test_one_task_per_gpu_and_chunks_stay_put(client):
    x = gpu_array(client, 1 << 24, 1 << 19, np.float32)
    holder = placement.holders(x, client)
    workers = set(holder.values())
    assert len(workers) >= 2
    lazy = mr.sum(x)
    assert task_count(lazy, "sum-partial") == len(workers)
    # the task graph: with held values in graphs, client.compute would make the held call instead
    with dask.config.set({"multireduce.held-values-in-graphs": False}), \
            distributed.get_task_stream(client) as stream:
        client.compute(lazy).result()
    partial_workers = {t["worker"] for t in stream.data if "sum-partial" in str(t["key"])}
    assert partial_workers == workers
    assert len(stream.data) == len(workers) + 1  # the partials and the aggregate: no finalize task
    # the chunks on each worker are CuPy arrays on that worker's own GPU (each worker sees its GPU as
    # device 0 through CUDA_VISIBLE_DEVICES, so compare PCI bus ids)
    def buses(dask_worker):
        return sorted({cupy.cuda.Device(v.device.id).pci_bus_id for v in dask_worker.data.values()
                       if isinstance(v, cupy.ndarray)})

    per_worker = client.run(buses)
    held = {w: b for w, b in per_worker.items() if b}
    assert len(held) >= 2 and all(len(b) == 1 for b in held.values())
    assert len({b[0] for b in held.values()}) == len(held)  # one distinct GPU per worker


def _clear_transfer_logs(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _moved_keys(dask_worker):
    return [k for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]


def test_scan_outputs_made_on_the_input_gpu(client):
    """Every output chunk is made on its input's GPU and only the per-worker totals (host) move,
    whatever the placement (Dask's own here: round-robin-like)."""
    x = gpu_array(client, 1 << 24, 1 << 21, np.int32)
    client.run(_clear_transfer_logs)
    out = client.persist(mr.cumsum(x))
    distributed.wait(out)
    moved = [k for ks in client.run(_moved_keys).values() for k in ks]
    assert all(str(k[0] if isinstance(k, tuple) else k).startswith("cumsum-totals") for k in moved), moved
    gin, gout = x.__dask_graph__(), out.__dask_graph__()
    kin, kout = placement.chunk_keys(x), placement.chunk_keys(out)
    where_in = client.who_has([gin[k] for k in kin])
    where_out = client.who_has([gout[k] for k in kout])
    for ki, ko in zip(kin, kout):
        assert set(where_out[ko]) == set(where_in[ki])


def test_killed_worker_is_recomputed():
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    with local_cluster(n_workers=2, gpu=True) as cluster, distributed.Client(cluster) as c:
        x = gpu_array(c, 1 << 24, 1 << 18, np.int64)
        expected = mr.sum(_single_gpu(x)).item()
        future = c.compute(mr.sum(x, split_every=2))
        victim = sorted(c.scheduler_info()["workers"])[0]
        os.kill(c.run(os.getpid)[victim], signal.SIGKILL)
        assert future.result(timeout=180).item() == expected


def test_array_on_another_device_runs_there():
    """Eager CuPy input on device 1 while device 0 is current: computed on device 1, result there."""
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs in this process")
    host = np.random.default_rng(3).integers(-1000, 1000, size=(1 << 20) + 5).astype(np.int32)
    with cupy.cuda.Device(1):
        x = cupy.asarray(host)
    with cupy.cuda.Device(0):
        s = mr.sum(x)
        c = mr.cumsum(x)
    assert s.device.id == 1 and c.device.id == 1
    assert int(s) == int(host.sum())
    np.testing.assert_array_equal(cupy.asnumpy(c), np.cumsum(host))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_compute_now_runs_on_the_gpus_without_tasks(client, dtype):
    """``compute=True``: each worker reduces its chunks on its GPU through client.run; no task runs and
    the answers equal the graph's (bitwise for integers)."""
    x = gpu_array(client, (1 << 24) + 7, 1 << 20, dtype, seed=5)
    for opname in ["sum", "min", "max", "mean"]:
        fn = getattr(mr, opname)
        with distributed.get_task_stream(client) as stream:
            got = fn(x, compute=True)
        assert not stream.data, f"{opname}: {len(stream.data)} tasks ran"
        assert isinstance(got, np.generic)
        graph_value = cupy.asnumpy(fn(x).compute())[()]
        if np.dtype(dtype).kind != "f" or opname in ("min", "max"):
            assert got == graph_value, opname
        else:
            assert np.isclose(got, graph_value, rtol=1e-5, atol=1e-3), (opname, got, graph_value)


def _is_device(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_is_device(v) for v in value)
    return isinstance(getattr(value, "value", value), cupy.ndarray)


def test_only_host_values_cross_gpus_and_one_totals_task_per_gpu(client):
    """Partials and scan totals (what moves between workers) are host values; one totals task per GPU;
    results equal the single-GPU ones bit for bit whatever the path."""
    x = gpu_array(client, (1 << 22) + 1025, 1 << 18, np.float32, seed=3)
    workers = set(placement.holders(x, client).values())
    keys = placement.chunk_keys(x)
    for lazy, stage in ((mr.sum(x), "sum-partial"), (mr.cumsum(x), "cumsum-totals")):
        dsk = dict(lazy.__dask_graph__())
        inner = [k for k in dsk if isinstance(k, tuple) and isinstance(k[0], str) and k[0].startswith(stage)]
        assert inner and len(inner) <= len(workers)
        assert not any(_is_device(v) for v in client.get(dsk, inner)), stage
    holders_of_totals = {placement.holders(x, client)[k] for k in keys[:-1]}
    assert task_count(mr.cumsum(x), "cumsum-totals") == len(holders_of_totals)
    graph_sum, eager_sum = mr.sum(x).compute(), mr.sum(x, compute=True)
    assert cupy.asnumpy(graph_sum).tobytes() == np.asarray(eager_sum).tobytes()
    lazy_input = da.map_blocks(_make_block, np.float32, 3, chunks=x.chunks, dtype=np.float32,
                               meta=cupy.empty(0, dtype=np.float32))
    assert cupy.asnumpy(mr.sum(lazy_input).compute()).tobytes() == np.asarray(eager_sum).tobytes()


def test_methods_of_held_results_take_the_direct_paths(client):
    """``mr.sum(x).compute()`` runs no task and returns what the graph returns (a CuPy 0-d array, same
    bits); ``mr.cumsum(x).persist()`` runs no task either, keeps every output chunk on the GPU holding
    its input, moves nothing between workers, and equals the graph's scan bit for bit."""
    x = gpu_array(client, (1 << 22) + 1025, 1 << 18, np.float32, seed=9)
    lazy = mr.sum(x)
    with distributed.get_task_stream(client) as stream:
        value = lazy.compute()
    assert not stream.data and isinstance(value, cupy.ndarray)
    assert cupy.asnumpy(value).tobytes() == cupy.asnumpy(client.compute(lazy).result()).tobytes()
    keys = placement.chunk_keys(x)
    client.run(_clear_transfer_logs)
    with distributed.get_task_stream(client) as stream:
        seeded = mr.cumsum(x).persist()
        distributed.wait(seeded)
    assert not stream.data  # totals and scans ran through client.run, each worker on its own chunks
    where_in = client.who_has([x.__dask_graph__()[k] for k in keys])
    out_keys = placement.chunk_keys(seeded)
    where_out = client.who_has([seeded.__dask_graph__()[k] for k in out_keys])
    assert all(set(where_out[ko]) == set(where_in[ki]) for ki, ko in zip(keys, out_keys))
    assert [k for ks in client.run(_moved_keys).values() for k in ks] == []
    graph = client.persist(mr.cumsum(x))
    assert cupy.asnumpy(seeded.compute()).tobytes() == cupy.asnumpy(graph.compute()).tobytes()


@pytest.mark.parametrize("stat", ["var", "std", "nanmax", "any", "argmax", "nanargmin"])
def test_held_statistics_compute_without_tasks(client, stat):
    """A whole statistic of a persisted array: ``.compute()`` folds each chunk's (host) partial on the
    client, no task runs, and the value is the graph's, as a CuPy array like the graph's."""
    x = gpu_array(client, (1 << 22) + 1025, 1 << 18, np.float32, seed=13)
    lazy = getattr(mr, stat)(x)
    with distributed.get_task_stream(client) as stream:
        value = lazy.compute()
    assert not stream.data, f"{stat}: {len(stream.data)} tasks"
    graph_value = client.compute(lazy).result()
    assert type(value) is type(graph_value)
    assert cupy.asnumpy(value).tobytes() == cupy.asnumpy(graph_value).tobytes()


def _wide_data(n, dtype, seed):
    """Values over ~80 binades, half of them nearly cancelling their neighbour: a float sum in any other
    order loses bits."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-40, 40, n))).astype(dtype)
    x[1::2] = -x[0::2][: n // 2] * np.asarray(1 + 2.0 ** -10, dtype)
    return x


def _held(client, host, chunk, balanced=False):
    """``host`` in CuPy chunks persisted where Dask puts them, or, ``balanced``, in equal contiguous ranges
    over every worker (Dask's own placement may leave a worker without chunks)."""
    lazy = da.from_array(host, chunks=chunk).map_blocks(cupy.asarray, dtype=host.dtype,
                                                        meta=cupy.empty(0, dtype=host.dtype))
    x = mr.persist(lazy, client=client) if balanced else client.persist(lazy)
    distributed.wait(x)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_bits_equal_on_one_gpu_and_on_every_gpu(client, dtype):
    """``exact=True`` gives the same bits on one GPU (a CuPy array; a one-worker cluster) as on
    every GPU of the box through Dask, for several chunkings, the graph, the held (direct) and the eager
    path, and as NumPy input: sum, mean, nansum and cumsum."""
    host = _wide_data((1 << 22) + 1031, dtype, seed=21)
    chunkings = (1 << 18, (1 << 20) + 3, 77777)
    arrays = [_held(client, host, chunk, balanced=i == 0) for i, chunk in enumerate(chunkings)]
    assert len(set(placement.holders(arrays[0], client).values())) == len(client.scheduler_info()["workers"])
    whole = cupy.asarray(host)
    with local_cluster(n_workers=1, gpu=True) as one, distributed.Client(one, set_as_default=False) as single:
        on_one = _held(single, host, 1 << 20)
        for name in ("sum", "mean", "nansum", "cumsum"):
            fn = getattr(mr, name)
            want = np.asarray(fn(host, exact=True))
            assert cupy.asnumpy(fn(whole, exact=True)).tobytes() == want.tobytes(), (name, "one CuPy array")
            got = single.compute(fn(on_one, exact=True)).result()
            assert cupy.asnumpy(got).tobytes() == want.tobytes(), (name, "one-worker cluster")
            for x in arrays:
                lazy = fn(x, exact=True)
                for path, got in (("graph", client.compute(lazy).result()), ("held", lazy.compute())):
                    assert cupy.asnumpy(got).tobytes() == want.tobytes(), (name, path, x.chunks[0][:2])
                if name in ("sum", "mean"):
                    eager = fn(x, exact=True, compute=True)
                    assert np.asarray(eager).tobytes() == want.tobytes(), (name, "eager", x.chunks[0][:2])
            if name == "sum" and dtype == np.float64:  # correctly rounded, as math.fsum
                assert float(want) == math.fsum(host.tolist())
