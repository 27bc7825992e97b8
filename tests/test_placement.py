"""Grouping by worker on a real CPU cluster (the same logic the multi-GPU path uses, one GPU per worker):
one partial task per worker, output chunks made where their inputs live, uneven spreads, and a worker
killed in the middle of a reduction."""

from __future__ import annotations

import os
import signal
import time

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct, placement  # noqa: E402

from .helpers import matmul_operator, persist_spread, random_matrices, sequential_fold, sequential_scan, task_count, task_graphs  # noqa: E402


@pytest.fixture(scope="module")
def client(cpu_client):
    return cpu_client


def _spread(client, x: np.ndarray, chunk: int, owners: list[int]):
    return persist_spread(client, x, chunk, owners)


def _runs(holder, keys) -> int:
    return sum(1 for i, k in enumerate(keys) if i == 0 or holder[k] != holder[keys[i - 1]])


def _task_stream(client, fn):
    with distributed.get_task_stream(client) as stream:
        result = fn()
    return result, stream.data


def _name(key) -> str:
    return (key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0]


def test_one_partial_task_per_worker(client):
    x = np.random.default_rng(0).integers(-1000, 1000, size=12 * 1000)
    owners = [0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 1]  # uneven, interleaved
    d, workers = _spread(client, x, 1000, owners)
    holder = placement.holders(d, client)
    assert holder is not None and len(set(holder.values())) >= 2
    lazy = mr.sum(d)
    assert task_count(lazy, "sum-partial") == len(set(holder.values()))  # not 12: one per worker
    with task_graphs():
        total, stream = _task_stream(client, lambda: client.compute(lazy).result())
    assert total == x.sum()
    ran_on = {t["worker"] for t in stream if _name(t["key"]) == "sum-partial"}
    assert ran_on == set(holder.values())  # each worker reduced its own chunks


def test_noncommutative_groups_are_runs(client):
    op = matmul_operator()
    m = random_matrices(np.random.default_rng(1), 8 * 200)
    owners = [0, 0, 1, 1, 1, 0, 2, 2]
    d, _ = _spread(client, m, 200, owners)
    lazy = mr.reduce(d, op)
    holder = placement.holders(d, client)
    keys = placement.chunk_keys(d)
    # one partial task per worker, each keeping its chunks' own partials for the ordered fold
    assert task_count(lazy, "matmul2x2-partial") == len(set(holder.values())) == 3 < _runs(holder, keys)
    assert int(client.compute(lazy).result()) == sequential_fold(m)


def test_scan_outputs_are_made_where_inputs_live(client):
    # chunks of a few MB, as on GPUs: moving one costs more than any imbalance, so locality decides
    chunk = 1 << 19
    x = np.random.default_rng(2).integers(-1000, 1000, size=9 * chunk)
    owners = [2, 2, 0, 1, 1, 1, 0, 2, 0]
    d, _ = _spread(client, x, chunk, owners)
    out = client.persist(mr.cumsum(d))
    distributed.wait(out)
    holder = placement.holders(d, client)
    keys = placement.chunk_keys(d)
    # one totals task per worker holding any of chunks 0..n-2, however interleaved
    assert task_count(mr.cumsum(d), "cumsum-totals") == len({holder[k] for k in keys[:-1]}) == 3
    # before anything gathers the result (which copies chunks to one worker)
    graph_in, graph_out = d.__dask_graph__(), out.__dask_graph__()
    where_in = client.who_has([graph_in[k] for k in keys])
    where_out = client.who_has([graph_out[k] for k in placement.chunk_keys(out)])
    for ki, ko in zip(keys, placement.chunk_keys(out)):
        assert set(where_out[ko]) <= set(where_in[ki]), f"output {ko} was made away from its input"
    np.testing.assert_array_equal(client.compute(out).result(), np.cumsum(x))


def test_lazy_arrays_and_switching_placement_off(client):
    x = np.arange(10_000)
    lazy_input = da.from_array(x, chunks=1000)
    assert placement.holders(lazy_input, client) is None
    assert client.compute(mr.sum(lazy_input)).result() == x.sum()
    d = client.persist(lazy_input)
    distributed.wait(d)
    with dask.config.set({"multireduce.placement": False}):
        assert placement.holders(d, client) is None
        assert task_count(mr.sum(d, split_every=4), "sum-partial") == 10  # one per chunk
    assert client.compute(mr.sum(d)).result() == x.sum()


def _slow_add(a, b):
    time.sleep(0.05)
    return np.add(a, b)


@pytest.mark.slow
def test_worker_killed_mid_reduction_recomputes():
    """A worker process dies while the reduction runs: Dask recomputes, the answer is right, nothing hangs."""
    mr.register_operator("slow_add", identity=0, cpu=_slow_add, commutative=True, kinds="i", replace=True)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, scheduler_port=0,
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as c:
        x = np.arange(40 * 64, dtype=np.int64)
        d = c.persist(da.from_array(x, chunks=64))
        distributed.wait(d)
        future = c.compute(mr.reduce(d, "slow_add", split_every=2))
        time.sleep(0.5)
        victim = sorted(c.scheduler_info()["workers"])[0]
        os.kill(c.run(os.getpid)[victim], signal.SIGKILL)  # a crash, not a clean shutdown
        assert future.result(timeout=120) == x.sum()


@pytest.mark.parametrize("owners", [[0, 1, 2, 0, 1, 2, 0, 1, 2, 0], [1, 1, 1, 0, 0, 0, 2, 2, 2, 2],
                                    [2, 0, 0, 0, 0, 0, 0, 1, 0, 0]])
def test_noncommutative_scan_keeps_order_whatever_the_placement(client, owners):
    """Round-robin, contiguous and uneven: one totals task per worker, each keeping its chunks' own
    totals, and the scan of a non-commutative operator in chunk order."""
    op = matmul_operator()
    m = random_matrices(np.random.default_rng(sum(owners)), 10 * 33)
    d, _ = _spread(client, m, 33, owners)
    holder = placement.holders(d, client)
    keys = placement.chunk_keys(d)
    lazy = mr.scan(d, op)
    assert task_count(lazy, "scan-matmul2x2-totals") == len({holder[k] for k in keys[:-1]})
    got = client.compute(lazy).result()
    np.testing.assert_array_equal(got, sequential_scan(m))
    seeded = lazy.persist()  # the direct path: totals on the holders, carries on the client
    np.testing.assert_array_equal(seeded.compute(), sequential_scan(m))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bits_do_not_depend_on_placement_or_path(client, dtype):
    """The same array and chunking give the same bits lazily, persisted anywhere, and eagerly."""
    x = (np.random.default_rng(5).standard_normal(37 * 1025) * 1e3).astype(dtype)
    lazy = da.from_array(x, chunks=1025)
    want = {"sum": mr.sum(lazy, split_every=4).compute(), "mean": mr.mean(lazy, split_every=4).compute(),
            "cumsum": mr.cumsum(lazy).compute()}
    for owners in ([i % 3 for i in range(37)], [i * 3 // 37 for i in range(37)], [0] * 30 + [1] * 7, [2] * 37):
        d, _ = _spread(client, x, 1025, owners)
        for how in ("graph", "eager", "method"):
            run = {"graph": lambda r: dask.compute(r)[0], "eager": None, "method": lambda r: r.compute()}[how]
            s = mr.sum(d, split_every=4, compute=True) if how == "eager" else run(mr.sum(d, split_every=4))
            m = mr.mean(d, split_every=4, compute=True) if how == "eager" else run(mr.mean(d, split_every=4))
            assert s.tobytes() == want["sum"].tobytes(), (owners, how)
            assert m.tobytes() == want["mean"].tobytes(), (owners, how)
        assert mr.cumsum(d).compute().tobytes() == want["cumsum"].tobytes(), owners
        assert mr.cumsum(d).persist().compute().tobytes() == want["cumsum"].tobytes(), owners
    assert np.isclose(want["sum"], x.astype(np.float64).sum(), rtol=1e-5)


def test_whole_reduction_is_partials_and_one_aggregate(client):
    """A whole reduction of held chunks runs one partial task per worker and the aggregate, nothing else:
    no finalize task (the result is one block) and only the cull of Dask's optimisation; lazy inputs keep
    Dask's fusion and also skip finalize. Any way of computing gives the eager path's bits."""
    x = (np.random.default_rng(7).standard_normal(12 * 1025) * 100).astype(np.float32)
    d, _ = _spread(client, x, 1025, [0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 2, 1])
    workers = len(set(placement.holders(d, client).values()))
    lazy = mr.sum(d)
    with task_graphs():
        total, stream = _task_stream(client, lambda: client.compute(lazy).result())  # the graph
    assert sorted(_name(t["key"]) for t in stream) == ["sum-aggregate"] + ["sum-partial"] * workers
    method, stream = _task_stream(client, lazy.compute)  # the result's own .compute(): the direct path
    assert stream == [] and type(method) is type(total)
    assert total.tobytes() == mr.sum(d, compute=True).tobytes() == method.tobytes()
    with task_graphs():
        both = dask.compute(lazy, mr.max(d, keepdims=True))
    assert both[0].tobytes() == total.tobytes() and both[1].shape == (1,) and both[1][0] == x.max()
    assert lazy.__dask_optimize__ is not da.Array.__dask_optimize__
    assert (lazy + 1).compute() == total + 1  # results of further operations are plain dask arrays
    not_held = mr.sum(da.from_array(x, chunks=1025) * 2, split_every=4)
    optimized = not_held.__dask_optimize__(not_held.__dask_graph__(), not_held.__dask_keys__())
    assert not any(str(k[0] if isinstance(k, tuple) else k).startswith("mul-") for k in dict(optimized))  # fused
    value, stream = _task_stream(client, not_held.compute)
    assert not any(_name(t["key"]).startswith("finalize") for t in stream) 
    assert np.isclose(value, 2 * x.astype(np.float64).sum(), rtol=1e-5)


def test_a_held_whole_reduction_builds_its_graph_only_when_asked(client, monkeypatch):
    """``mr.sum(d)`` of a persisted array lays out no task until its graph is needed: ``.compute()``
    (the direct path) never needs it, nor do ``client.compute``, ``dask.compute`` and ``.persist()``
    (computed where held, their graph is the value); arithmetic and ``repr`` build it then, with the
    per-worker grouping, under the same name."""
    x = np.random.default_rng(9).integers(-1000, 1000, size=12 * 1000)
    d, _ = _spread(client, x, 1000, [0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 2, 1])

    def no_graph(*args, **kwargs):
        raise AssertionError("the graph was built")

    monkeypatch.setattr(direct, "reduction", no_graph)
    lazy = mr.sum(d)
    assert lazy.compute() == x.sum() and lazy._graph is None
    name = lazy.name
    assert client.compute(lazy).result() == x.sum() and lazy.name == f"{name}-value"  # the value's own keys
    assert dask.compute(mr.sum(d), mr.max(d)) == (x.sum(), x.max())
    assert mr.sum(d).persist().compute() == x.sum()
    monkeypatch.undo()
    other = mr.sum(d)
    assert (other + 1).compute() == x.sum() + 1 and other._graph is not None
    assert other.name in other.__dask_graph__().layers
    assert task_count(other, "sum-partial") == 3  # one per worker: the graph built with placement
    assert "sum-aggregate" in repr(mr.sum(d))
