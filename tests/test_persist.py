"""multireduce.persist on real CPU clusters: every worker holds an equal, contiguous range of chunks (looked
up with ``client.who_has``), the values are the input's, and a lost worker's chunks are recomputed."""

from __future__ import annotations

import gc
import importlib
import os
import random

import numpy as np
import pytest

import multireduce as mr
from multireduce import placement
from multireduce.placement import chunk_keys

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
persist_mod = importlib.import_module("multireduce.persist")  # the module; ``mr.persist`` is its function


def _where(client, x, order=None) -> list[int]:
    """The index (in ``order``, default ``worker_order``) of the one worker holding each chunk of ``x``, in
    C order."""
    distributed.wait(x)
    order = order or persist_mod.worker_order(client)
    who = client.who_has(x)
    out = []
    for key in chunk_keys(x):
        holders = who.get(key) or who.get(str(key))
        assert holders and len(holders) == 1, f"{key} is held by {holders}"
        out.append(order.index(holders[0]))
    return out


def _check_contiguous(where: list[int]) -> None:
    """Each worker's chunks are one run, the runs in worker order."""
    assert where == sorted(where), where


def _bytes_per_worker(x, where, workers: int) -> list[int]:
    import itertools
    import math

    sizes = [math.prod(s) * x.dtype.itemsize for s in itertools.product(*x.chunks)]
    shares = [0] * workers
    for w, s in zip(where, sizes):
        shares[w] += s
    return shares


def test_one_d_lazy_equal_ranges_in_worker_order(cpu_client):
    x = da.random.default_rng(11).standard_normal(12 * 37, chunks=37)
    want = x.compute()
    xp = mr.persist(x, client=cpu_client)
    where = _where(cpu_client, xp)
    assert where == [0] * 4 + [1] * 4 + [2] * 4
    assert xp.name == x.name  # the lazy array's own graph, run where asked
    np.testing.assert_array_equal(xp.compute(), want)


_MADE_ON: dict = {}  # chunk index -> the worker that ran the function making it (in-process workers)


def _noted(block, block_info=None):
    _MADE_ON[block_info[0]["chunk-location"][0]] = distributed.get_worker().address
    return block * 3


def test_chunks_are_made_on_their_worker_not_copied_there(cpu_client):
    # Dask's fusion makes each chunk in a task of its own name and leaves the chunk's key an alias of it:
    # that task must run on the chunk's worker too
    x = da.random.default_rng(10).random(9 * 29, chunks=29)
    _MADE_ON.clear()
    xp = mr.persist(x.map_blocks(_noted, dtype=x.dtype))
    where = _where(cpu_client, xp)
    order = persist_mod.worker_order(cpu_client)
    assert where == [0] * 3 + [1] * 3 + [2] * 3
    assert [_MADE_ON[i] for i in range(9)] == [order[w] for w in where]
    np.testing.assert_array_equal(xp.compute(), x.compute() * 3)


def test_chunk_count_that_workers_do_not_divide(cpu_client):
    x = da.random.default_rng(12).integers(-10**9, 10**9, size=10 * 53, chunks=53)
    want = x.compute()
    where = _where(cpu_client, mr.persist(x))  # the current client
    _check_contiguous(where)
    counts = [where.count(w) for w in range(3)]
    assert sum(counts) == 10 and max(counts) - min(counts) <= 1, counts
    np.testing.assert_array_equal(mr.persist(x).compute(), want)


def test_two_d_uneven_chunks_are_weighted_by_bytes(cpu_client):
    # last row and column chunks are short: shares are balanced in bytes, in C order of the chunk grid
    x = da.random.default_rng(13).random((101, 29), chunks=(17, 8)).astype(np.float32)
    want = x.compute()
    xp = mr.persist(x)
    where = _where(cpu_client, xp)
    _check_contiguous(where)
    shares = _bytes_per_worker(x, where, 3)
    largest = 17 * 8 * 4
    assert all(abs(s - x.nbytes / 3) <= largest for s in shares), (shares, x.nbytes / 3)
    np.testing.assert_array_equal(xp.compute(), want)
    assert float(mr.sum(xp, compute=True)) == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-5)


def test_already_persisted_input_is_moved_into_ranges(cpu_client):
    x = da.random.default_rng(14).standard_normal((40, 9), chunks=(7, 4))
    want = x.compute()
    held = cpu_client.persist(x)  # Dask's own placement
    distributed.wait(held)
    moved = mr.persist(held)
    assert moved.name != held.name
    del held
    gc.collect()
    where = _where(cpu_client, moved)
    _check_contiguous(where)
    shares = _bytes_per_worker(moved, where, 3)
    assert all(abs(s - x.nbytes / 3) <= 7 * 4 * 8 for s in shares), shares
    np.testing.assert_array_equal(moved.compute(), want)


def test_balanced_persisted_input_comes_back_as_it_is(cpu_client):
    x = mr.persist(da.random.default_rng(15).random(9 * 31, chunks=31))
    distributed.wait(x)
    again = mr.persist(x)
    assert again.name == x.name
    assert _where(cpu_client, again) == [0] * 3 + [1] * 3 + [2] * 3


def test_more_workers_than_chunks(cpu_client):
    x = da.random.default_rng(16).random(2 * 45, chunks=45)
    want = x.compute()
    xp = mr.persist(x)
    assert _where(cpu_client, xp) == [0, 1]
    np.testing.assert_array_equal(xp.compute(), want)


def test_several_arrays_share_the_ranges(cpu_client):
    a = da.random.default_rng(17).random(6 * 23, chunks=23)
    b = da.random.default_rng(18).integers(0, 1000, size=6 * 23, chunks=23)
    pa, pb = mr.persist(a, b)
    assert _where(cpu_client, pa) == _where(cpu_client, pb) == [0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal((pa + pb).compute(), a.compute() + b.compute())


def test_balanced_false_is_dask_placement(cpu_client):
    x = da.random.default_rng(19).random(7 * 19, chunks=19)
    (xp,) = [mr.persist(x, balanced=False)]
    assert placement.is_persisted(xp)
    np.testing.assert_array_equal(xp.compute(), x.compute())


@pytest.mark.parametrize("call, argument", [
    (lambda x, c: mr.persist(x, balanced="yes", client=c), "'balanced'"),
    (lambda x, c: mr.persist(x, client="tcp://127.0.0.1:8786"), "'client'"),
    (lambda x, c: mr.persist(np.arange(5), client=c), "'arrays[0]'"),
    (lambda x, c: mr.persist(x, [1, 2], client=c), "'arrays[1]'"),
    (lambda x, c: mr.persist(client=c), "one or more dask arrays"),
])
def test_bad_arguments_are_named(cpu_client, call, argument):
    x = da.ones(10, chunks=3)
    with pytest.raises(TypeError, match=argument.replace("[", r"\[").replace("]", r"\]")):
        call(x, cpu_client)


def test_no_client_is_refused_for_balanced_and_dask_persists_otherwise(monkeypatch):
    monkeypatch.setattr(placement, "default_client", lambda: None)
    x = da.random.default_rng(20).random(50, chunks=9)
    with pytest.raises(ValueError, match="client"):
        mr.persist(x)
    np.testing.assert_array_equal(mr.persist(x, balanced=False).compute(), x.compute())


def _slow_copy(block, seconds):
    import time

    time.sleep(seconds)
    return block.copy()


def test_ranges_hold_when_chunks_arrive_unevenly(cpu_client):
    # the input is made where Dask puts it, slowly, while the moves are already queued on their workers:
    # a task waiting on a busy worker must not be taken by an idle one (Dask's work stealing)
    x = da.random.default_rng(24).random(24 * 11, chunks=11)
    slow = x.map_blocks(_slow_copy, 0.02, dtype=x.dtype)
    moved = mr.persist(cpu_client.persist(slow))
    assert _where(cpu_client, moved) == [0] * 8 + [1] * 8 + [2] * 8
    np.testing.assert_array_equal(moved.compute(), x.compute())


def test_a_worker_gone_before_the_graph_arrives(cpu_client, monkeypatch):
    real = persist_mod.worker_order(cpu_client)
    monkeypatch.setattr(persist_mod, "worker_order", lambda client: [real[0], "tcp://127.0.0.1:9", real[2]])
    x = da.random.default_rng(25).random(9 * 13, chunks=13)
    xp = mr.persist(x)
    where = _where(cpu_client, xp, real)  # the gone worker's chunks run where Dask puts them
    assert where[:3] == [0] * 3 and where[6:] == [2] * 3
    np.testing.assert_array_equal(xp.compute(), x.compute())


# ------------------------------------------------------------------------------------------------
# The split itself and the worker order
# ------------------------------------------------------------------------------------------------
def test_ranges_equal_sizes_differ_by_one_at_most():
    for n in range(1, 40):
        for k in range(1, 9):
            out = persist_mod.ranges([5] * n, k)
            assert out == sorted(out)
            counts = [out.count(w) for w in range(min(n, k))]
            assert max(counts) - min(counts) <= 1 and sum(counts) == n, (n, k, out)


def test_ranges_uneven_sizes_stay_within_one_chunk_of_an_equal_share():
    rng = random.Random(21)
    for _ in range(300):
        sizes = [rng.choice([0, 1, 3, 64, 1000, rng.randrange(1, 5000)]) for _ in range(rng.randrange(1, 30))]
        k = rng.randrange(1, 7)
        out = persist_mod.ranges(sizes, k)
        used = min(k, len(sizes))
        assert out == sorted(out) and set(out) == set(range(used)), (sizes, k, out)  # every worker holds some
        if sum(sizes) == 0:
            continue
        shares = [sum(s for s, w in zip(sizes, out) if w == j) for j in range(used)]
        assert all(abs(s - sum(sizes) / used) <= max(sizes) for s in shares), (sizes, k, out)


def test_ranges_unknown_sizes_count_as_equal():
    assert persist_mod.ranges([float("nan")] * 5, 2) == [0, 0, 1, 1, 1]


def test_worker_order_numeric_names_first_then_by_address():
    class Fake:
        def scheduler_info(self, n_workers=0):
            names = {"tcp://h:5": 10, "tcp://h:1": 2, "tcp://h:9": "3", "tcp://h:2": "gpu-b", "tcp://h:3": "gpu-a"}
            return {"workers": {a: {"name": n} for a, n in names.items()}}

    assert persist_mod.worker_order(Fake()) == ["tcp://h:1", "tcp://h:9", "tcp://h:5", "tcp://h:3", "tcp://h:2"]


def test_no_workers_is_a_clear_error():
    class Empty:
        def scheduler_info(self, n_workers=0):
            return {"workers": {}}

    with pytest.raises(ValueError, match="no workers"):
        persist_mod.worker_order(Empty())


# ------------------------------------------------------------------------------------------------
# Lineage: a lost worker's chunks are recomputed by Dask
# ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)  # a lost worker's chunks, left restricted to it, would wait forever
def test_lost_worker_chunks_are_recomputed_in_process():
    from multireduce.cluster import local_cluster

    with local_cluster(n_workers=3, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        x = da.random.default_rng(22).standard_normal((60, 5), chunks=(7, 5))
        want = x.compute()
        lazy = mr.persist(x)
        moved = mr.persist(client.persist(x + 1))  # persisted first, its original then dropped
        gc.collect()
        where = _where(client, lazy)
        assert where == _where(client, moved)
        victim = persist_mod.worker_order(client)[1]
        worker = next(w for w in cluster.workers.values() if w.address == victim)
        client.sync(worker.close)
        client.wait_for_workers(2)
        assert victim not in client.scheduler_info()["workers"]
        np.testing.assert_array_equal(lazy.compute(), want)
        np.testing.assert_array_equal(moved.compute(), want + 1)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_worker_lost_while_its_chunks_are_made():
    import time

    from multireduce.cluster import local_cluster

    with local_cluster(n_workers=3, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        x = da.random.default_rng(26).standard_normal(30 * 17, chunks=17)
        want = x.compute()
        victim = persist_mod.worker_order(client)[1]
        worker = next(w for w in cluster.workers.values() if w.address == victim)
        xp = mr.persist(x.map_blocks(_slow_copy, 0.05, dtype=x.dtype))
        while not worker.data:  # some of its chunks made, most still queued on it
            time.sleep(0.01)
        client.sync(worker.close)
        np.testing.assert_array_equal(xp.compute(), want)
        assert victim not in client.scheduler_info()["workers"]


def _exit():
    os._exit(1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_lost_worker_process_chunks_are_recomputed():
    from multireduce.cluster import local_cluster

    with local_cluster(n_workers=3, gpu=False, processes=True) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(3)
        x = da.random.default_rng(23).random((50, 7), chunks=(6, 4))
        want = x.compute()
        moved = mr.persist(client.persist(x))
        gc.collect()
        where = _where(client, moved)
        _check_contiguous(where)
        victim = persist_mod.worker_order(client)[1]
        with pytest.raises(Exception):  # the worker exits before it answers
            client.run(_exit, workers=[victim])
        np.testing.assert_array_equal(moved.compute(), want)
        assert victim not in client.scheduler_info()["workers"]
