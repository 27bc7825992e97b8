"""Scans of CuPy chunks made inside the graph on several GPUs (a LocalCUDACluster, one worker per GPU): with
``multireduce.scan-keep-chunks`` "auto" the GPUs' memory (NVML) lets a scan over pinned runs keep the chunks it
made for their totals, and with True each chunk is made once instead of twice, no run of kept chunks crosses
between workers,
and the bits are those of making every chunk twice. The same logic runs on a CPU cluster in
tests/test_scan_keeps_chunks.py."""

from __future__ import annotations

from collections import Counter

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

from .test_multi_gpu import client  # noqa: E402, F401 - the module's cluster of one worker per GPU

KEEP = "multireduce.scan-keep-chunks"
_made: list = []  # per worker process: the chunks it made


def _make_block(seed, block_info=None):
    import cupy

    loc = block_info[None]["chunk-location"]
    _made.append(tuple(loc))
    shape = block_info[None]["chunk-shape"]
    flat = int(np.ravel_multi_index(loc, block_info[None]["num-chunks"]))
    return cupy.random.default_rng(seed + flat).random(shape, dtype=cupy.float32) - 0.5


def _gpu_array(shape, chunks, seed):
    shape = (shape,) if isinstance(shape, int) else shape
    return da.map_blocks(_make_block, seed, chunks=da.core.normalize_chunks(chunks, shape), dtype=np.float32,
                         meta=cupy.empty((0,) * len(shape), dtype=np.float32))


def _clear(dask_worker):
    _made.clear()
    dask_worker.transfer_incoming_log.clear()


def _report(dask_worker):
    return list(_made), [str(k) for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]


def _scan(client, fn, x, keep):
    with dask.config.set({KEEP: keep}):
        result = fn(x)
    client.run(_clear)
    out = client.persist(result)
    distributed.wait(out)
    reports = client.run(_report).values()
    made = Counter(loc for locs, _ in reports for loc in locs)
    moved = [k for _, keys in reports for k in keys]
    return cupy.asnumpy(out.compute()), made, moved, result


SCANS = {"cumsum": mr.cumsum, "cumprod": lambda v: mr.cumprod(v / 64 + 1), "nancumsum": mr.nancumsum,
         "axis0": lambda v: mr.cumsum(v, axis=0), "exact": lambda v: mr.cumsum(v, exact=True)}


def test_auto_reads_the_gpus_memory(client):
    x = _gpu_array((1 << 24) + 5, 1 << 20, seed=3)
    workers = placement._workers(client)
    found = placement.scan_keep_memory(x, workers)
    assert found is not None and found[0] == len(workers)
    assert found[1] == min(placement._device_memory(w) for w in workers.values()) > 1 << 30
    # lazily made: no worker to pin a run to, so "auto" makes each chunk again
    assert not any("-made-" in str(k[0]) for k in mr.cumsum(x).__dask_graph__())
    held = client.persist(x)
    distributed.wait(held)
    expression = held.map_blocks(cupy.negative, dtype=held.dtype)  # not read into the loads: made by recipes
    assert any("-made-" in str(k[0]) for k in mr.cumsum(expression).__dask_graph__())  # 64 MiB of chunks fit


@pytest.mark.parametrize("name", sorted(SCANS))
def test_kept_chunks_are_made_once_with_the_same_bits(client, name):
    shape, chunks = ((4_099, 1_031), (251, 1_031)) if name == "axis0" else ((1 << 24) + 5, 1 << 19)
    x = _gpu_array(shape, chunks, seed=len(name))
    kept, made, moved, result = _scan(client, SCANS[name], x, True)
    again, made_again, _, _ = _scan(client, SCANS[name], x, False)
    every = {tuple(i) for i in np.ndindex(*x.numblocks)}
    assert set(made) == set(made_again) == every and set(made.values()) == {1}
    assert sum(made_again.values()) == 2 * len(every) - int(np.prod(x.numblocks[1:]))
    assert kept.dtype == again.dtype and np.array_equal(kept, again, equal_nan=True)
    assert not [k for k in moved if "-made-" in k]  # no run of kept chunks crossed between GPUs
    if name in ("cumsum", "exact", "axis0"):
        host = cupy.asnumpy(x.compute()).astype(np.float64)
        ref = np.cumsum(host, axis=0 if name == "axis0" else None)
        np.testing.assert_allclose(kept, ref, rtol=1e-5, atol=1e-2 if name != "exact" else 1e-4)
