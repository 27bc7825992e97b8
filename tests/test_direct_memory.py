"""Before a held scan keeps its outputs on the GPUs (and before a held reduction over some axes makes its
partials), each worker checks that they fit in what its GPUs have free, and fails before any work with
an error naming the worker, the bytes needed and free, and what to do. The decision is tested here with
made-up numbers, and the wiring on a CPU cluster whose workers are told made-up free memory; the reading
of a real GPU's free memory is in tests/gpu/test_direct_memory_gpu.py."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402
from multireduce.errors import GPUOutOfMemoryError  # noqa: E402

from .helpers import persist_spread  # noqa: E402

GIB = 1 << 30


@pytest.fixture(scope="module")
def client(cpu_client):
    return cpu_client


def test_the_decision_fits_up_to_the_last_byte():
    room = {"device": 3 * GIB + 7, "CuPy's pool": GIB - 7}
    assert direct.room_error("tcp://w:1", "the held scan's outputs", 4 * GIB, room, [0]) is None
    error = direct.room_error("tcp://w:1", "the held scan's outputs", 4 * GIB + 1, room, [0])
    assert isinstance(error, GPUOutOfMemoryError) and isinstance(error, MemoryError)
    text = str(error)
    for part in ("worker tcp://w:1", "the held scan's outputs", f"{4 * GIB + 1} bytes", f"{4 * GIB} bytes",
                 "GPU 0", "device 3.00 GiB", "CuPy's pool 1.00 GiB", "nothing was computed", "fewer chunks",
                 "spill", "rmm_pool_size"):
        assert part in text, (part, text)
    assert error.nbytes == 4 * GIB + 1 and error.gpu == {"id": 0, "free": 4 * GIB}
    back = pickle.loads(pickle.dumps(error))  # a worker's error reaches the client pickled
    assert str(back) == text and back.nbytes == error.nbytes and back.gpu == error.gpu


def test_the_decision_over_several_gpus_and_rmm():
    room = {"device": 5 * GIB, "RMM's pool": 2 * GIB + 12345}
    assert direct.room_error("tcp://w:2", "the held reduction's partials", 7 * GIB + 12345, room, [1, 3]) is None
    error = direct.room_error("tcp://w:2", "the held reduction's partials", 7 * GIB + 12346, room, [1, 3])
    assert "GPUs 1, 3, which have" in str(error) and "RMM's pool 2.00 GiB" in str(error), str(error)


def test_check_room_counts_each_chunk_and_one_chunk_of_scratch(monkeypatch):
    """``need`` (what, {chunk key: bytes}) summed over the worker's chunks, plus the largest once more; keys
    the worker was not given do not count; host chunks and unknown free memory are never refused."""
    seen = []

    def fake_room(blocks):
        seen.append(len(blocks))
        return {"device": 69}, [0]

    monkeypatch.setattr(direct, "_room_on", fake_room)
    need = ("outputs", {"a": 10, "b": 30, "c": 1000})
    blocks = [np.ones(2), np.ones(3)]
    with pytest.raises(GPUOutOfMemoryError, match=r"worker w: outputs need 70 bytes .* which has 69 bytes"):
        direct.check_room(need, ["a", "b"], blocks, "w")
    monkeypatch.setattr(direct, "_room_on", lambda blocks: ({"device": 70}, [0]))
    direct.check_room(need, ["a", "b"], blocks, "w")
    direct.check_room(need, ["b", "x"], blocks, "w")  # 60 bytes: "x" is not the worker's to count
    monkeypatch.setattr(direct, "_room_on", lambda blocks: None)  # host chunks, or free memory unknown
    direct.check_room(need, ["a", "b", "c"], blocks, "w")
    monkeypatch.setattr(direct, "_room_on", fake_room)
    direct.check_room(None, ["a", "b", "c"], blocks, "w")  # nothing to check: the GPU is not even asked
    direct.check_room(need, [], blocks, "w")
    assert seen == [2]


def test_host_chunks_are_not_checked():
    x = da.ones((10, 7), chunks=(4, 3))
    assert direct._on_gpus(x, "outputs", 8) is None
    assert direct._room_on([np.ones(3), np.ones(4)]) is None


def test_bytes_of_each_chunk_of_a_ragged_array():
    x = da.ones((10, 7), chunks=((4, 4, 2), (3, 3, 1)))
    sizes = direct._chunk_bytes(x, 8)
    assert sizes[(x.name, 0, 0)] == 4 * 3 * 8 and sizes[(x.name, 2, 2)] == 2 * 1 * 8 and len(sizes) == 9
    assert sum(sizes.values()) == 10 * 7 * 8
    partials = direct._chunk_bytes(x, 8, axes=(0,))  # each chunk's partial: one row of its columns
    assert partials[(x.name, 1, 0)] == 3 * 8 and partials[(x.name, 2, 2)] == 1 * 8


def _worker_keys(prefix: str, dask_worker=None) -> list:
    return [k for k in dask_worker.data if str(k).startswith(prefix) or (isinstance(k, tuple) and str(k[0]).startswith(prefix))]


@pytest.fixture
def made_up_gpus(monkeypatch):
    """Every chunk counts as a GPU chunk and every worker's GPU has ``free[0]`` bytes free (the workers run
    in this process, so they see the patched module)."""
    free = [0]
    monkeypatch.setattr(direct, "_on_gpus", lambda x, what, itemsize, axes=(): (what, direct._chunk_bytes(x, itemsize, axes)))
    monkeypatch.setattr(direct, "_room_on", lambda blocks: ({"device": free[0]}, [0]))
    return free


def test_a_held_scan_that_cannot_fit_fails_before_any_work(client, made_up_gpus):
    x = np.random.default_rng(50).integers(-1000, 1000, size=9 * 1001 - 5)
    d, workers = persist_spread(client, x, 1001, [0, 1, 2, 0, 0, 1, 2, 2, 0])
    # worker 0 scans chunks 0, 3, 4 and the short last one, and needs one more full chunk of scratch
    need = (3 * 1001 + 996 + 1001) * 8
    made_up_gpus[0] = need - 1
    with distributed.get_task_stream(client) as stream, \
            pytest.raises(GPUOutOfMemoryError, match=rf"worker {workers[0]}: the held scan's outputs need {need} bytes"):
        mr.cumsum(d).persist()
    assert not stream.data  # not the graph either
    assert not any(client.run(_worker_keys, "cumsum-seeded").values())  # nothing kept anywhere
    made_up_gpus[0] = need
    np.testing.assert_array_equal(mr.cumsum(d).persist().compute(), np.cumsum(x))
    made_up_gpus[0] = need - 1  # an expression over the held chunks: checked in its own runs
    with pytest.raises(GPUOutOfMemoryError, match=rf"worker {workers[0]}: the held scan's outputs need {need} bytes"):
        mr.cumsum(d * 2).persist()
    made_up_gpus[0] = need
    np.testing.assert_array_equal(mr.cumsum(d * 2).persist().compute(), np.cumsum(x * 2))


def test_a_held_reduction_whose_partials_cannot_fit_fails_before_any_work(client, made_up_gpus):
    x = np.random.default_rng(51).standard_normal((60, 45))
    d = client.persist(da.from_array(x, chunks=(13, 10)))
    distributed.wait(d)
    made_up_gpus[0] = 10
    with pytest.raises(GPUOutOfMemoryError, match="the held reduction's partials need"):
        mr.sum(d, axis=0).compute()
    made_up_gpus[0] = 1 << 30
    np.testing.assert_allclose(mr.sum(d, axis=0).compute(), x.sum(axis=0), rtol=1e-12)
    made_up_gpus[0] = 0  # whole reductions make one number per chunk: not checked
    assert np.isclose(mr.sum(d).compute(), x.sum(), rtol=1e-12)
