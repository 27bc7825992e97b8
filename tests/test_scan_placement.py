"""Scans of persisted arrays whatever the placement, on a real CPU cluster (the multi-GPU layout: one
worker per GPU): one totals task per worker holding chunks, only those small totals move between
workers, every output chunk is made where its input lives, and a worker lost after the placement was
looked up gives the right answer, not a wrong one or a hang. The non-commutative operator under
round-robin placement is in tests/test_placement.py (test_noncommutative_scan_keeps_order_...)."""

from __future__ import annotations

import os
import signal
import time

import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce.graph import _OfHeld  # noqa: E402
from multireduce import direct, placement  # noqa: E402

from .helpers import persist_spread  # noqa: E402

N_CHUNKS = 9
PLACEMENTS = {"round-robin": [i % 3 for i in range(N_CHUNKS)],
              "contiguous": [i * 3 // N_CHUNKS for i in range(N_CHUNKS)],
              "uneven": [2, 2, 0, 1, 1, 1, 0, 2, 0]}


@pytest.fixture(scope="module")
def client(cpu_client):
    return cpu_client


def _clear_transfer_logs(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _moved_keys(dask_worker):
    return [k for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]


def _name(key) -> str:
    return (key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0]


@pytest.mark.parametrize("kind", list(PLACEMENTS))
def test_scan_whatever_the_placement(client, kind):
    # chunks of a few MB, as on GPUs: moving one costs more than any imbalance, so locality decides
    chunk = (1 << 19) - 3
    x = np.random.default_rng(len(kind)).integers(-(1 << 31), 1 << 31, size=N_CHUNKS * chunk, dtype=np.int64)
    d, _ = persist_spread(client, x, chunk, PLACEMENTS[kind])
    holder = placement.holders(d, client)
    keys = placement.chunk_keys(d)
    client.run(_clear_transfer_logs)
    with distributed.get_task_stream(client) as stream:
        out = client.persist(mr.cumsum(d))
        distributed.wait(out)
    totals = [t for t in stream.data if _name(t["key"]) == "cumsum-totals"]
    assert len(totals) == len({holder[k] for k in keys[:-1]}) == 3  # one per worker, however interleaved
    assert {t["worker"] for t in totals} == {holder[k] for k in keys[:-1]}
    moved = [k for ks in client.run(_moved_keys).values() for k in ks]
    assert moved and all(_name(k) == "cumsum-totals" for k in moved), moved  # no chunk crossed workers
    # before anything gathers the result (which copies chunks to one worker)
    graph_in, graph_out = d.__dask_graph__(), out.__dask_graph__()
    out_keys = placement.chunk_keys(out)
    where_in = client.who_has([graph_in[k] for k in keys])
    where_out = client.who_has([graph_out[k] for k in out_keys])
    for ki, ko in zip(keys, out_keys):
        assert set(where_out[ko]) == set(where_in[ki]), f"output {ko} was made away from its input"
    np.testing.assert_array_equal(client.compute(out).result(), np.cumsum(x))  # int64 wraps as NumPy's


@pytest.mark.parametrize("kind", list(PLACEMENTS))
def test_persist_scans_each_chunk_where_it_is(client, kind):
    """``mr.cumsum(d).persist()`` of held chunks runs no task: the totals come back to the client, the
    carries are folded there, each worker scans its own chunks and keeps the outputs, registered with
    the scheduler. Nothing moves between workers; the graph's bits; the output is a persisted array
    like any other (its keys are released when it is dropped)."""
    chunk = (1 << 18) + 5
    x = np.random.default_rng(3 + len(kind)).standard_normal(N_CHUNKS * chunk).astype(np.float32)
    d, _ = persist_spread(client, x, chunk, PLACEMENTS[kind])
    keys = placement.chunk_keys(d)
    lazy = mr.cumsum(d)
    client.run(_clear_transfer_logs)
    with distributed.get_task_stream(client) as stream:
        out = lazy.persist()
        distributed.wait(out)
    assert stream.data == []
    assert out.name != lazy.name and out.chunks == d.chunks and out.dtype == lazy.dtype
    assert placement.is_persisted(out)
    where_in = client.who_has([d.__dask_graph__()[k] for k in keys])
    out_keys = placement.chunk_keys(out)
    where_out = client.who_has([out.__dask_graph__()[k] for k in out_keys])
    for ki, ko in zip(keys, out_keys):
        assert set(where_out[ko]) == set(where_in[ki]), f"output {ko} was made away from its input"
    assert [k for ks in client.run(_moved_keys).values() for k in ks] == []
    graph = client.persist(lazy)
    assert out.compute().tobytes() == graph.compute().tobytes()
    np.testing.assert_allclose(out.compute(), np.cumsum(x.astype(np.float64)), rtol=1e-4, atol=1e-2)
    held = set(map(str, out_keys))
    del out
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(lambda dask_scheduler: sum(str(k) in held for k in dask_scheduler.tasks)):
        assert time.monotonic() < deadline, "the scan's outputs were not released with the array"
        time.sleep(0.05)


def test_persist_with_arguments_or_lazy_input_runs_the_graph(client):
    x = np.random.default_rng(8).integers(-99, 99, size=5 * 1001)
    d, _ = persist_spread(client, x, 1001, [0, 1, 2, 0, 1])
    with distributed.get_task_stream(client) as stream:
        out = mr.cumsum(d).persist(optimize_graph=False)  # an argument for Dask: Dask's persist
        distributed.wait(out)
    assert any(_name(t["key"]) == "cumsum-totals" for t in stream.data)
    np.testing.assert_array_equal(out.compute(), np.cumsum(x))
    lazy_input = mr.cumsum(da.from_array(x, chunks=1001))
    assert not isinstance(lazy_input, _OfHeld)  # nothing held: placement unknown, the plain graph
    np.testing.assert_array_equal(lazy_input.persist().compute(), np.cumsum(x))


@pytest.mark.slow
def test_worker_lost_after_placement_lookup():
    """The graph names groups by the worker that held them when it was built; that worker is killed
    before the graph runs. Dask recomputes the lost chunks elsewhere and every result is right (within
    a timeout: a hang fails); the eager path looks placement up again."""
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, scheduler_port=0,
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as c:
        x = np.random.default_rng(11).integers(-1000, 1000, size=24 * 1031, dtype=np.int64)
        d = c.persist(da.from_array(x, chunks=1031))  # Dask's own placement: no worker restrictions
        distributed.wait(d)
        holder = placement.holders(d, c)
        assert holder is not None and len(set(holder.values())) >= 2
        scan, total = mr.cumsum(d), mr.sum(d, split_every=4)  # grouped by the holders looked up now
        seeded_scan, direct_total = mr.cumsum(d), mr.sum(d, split_every=4)
        victim = holder[placement.chunk_keys(d)[0]]
        os.kill(c.run(os.getpid)[victim], signal.SIGKILL)  # a crash, not a clean shutdown
        np.testing.assert_array_equal(c.compute(scan).result(timeout=120), np.cumsum(x))
        assert c.compute(total).result(timeout=120) == x.sum()
        assert mr.sum(d, compute=True) == x.sum()
        # the results' own .persist() / .compute() look placement up again (or fall back to the graph)
        np.testing.assert_array_equal(c.compute(seeded_scan.persist()).result(timeout=120), np.cumsum(x))
        assert direct_total.compute() == x.sum()


def test_a_held_scan_builds_its_graph_only_when_asked(client, monkeypatch):
    x = np.random.default_rng(14).integers(-1000, 1000, size=N_CHUNKS * 1003)
    d, _ = persist_spread(client, x, 1003, PLACEMENTS["uneven"])

    def no_graph(*args, **kwargs):
        raise AssertionError("the graph was built")

    monkeypatch.setattr(direct, "scan", no_graph)
    lazy = mr.cumsum(d)
    np.testing.assert_array_equal(lazy.persist().compute(), np.cumsum(x))
    assert lazy._graph is None
    monkeypatch.undo()
    np.testing.assert_array_equal(client.compute(lazy).result(), np.cumsum(x))  # the graph, built now
    assert lazy.name in lazy.__dask_graph__().layers


def _restrictions(prefix, dask_scheduler):
    return {str(k): (sorted(ts.worker_restrictions or ()), ts.loose_restrictions)
            for k, ts in dask_scheduler.tasks.items() if str(k).startswith(prefix)}


def test_the_pinning_annotations_reach_the_scheduler(client):
    """graph._pinned's worker annotations (``_WorkerOf``/``_Pinned``) are not dropped on the way: over held
    chunks Dask's fusion, which drops annotations, does not run (graph._OfHeld), so every scan task
    reaches the scheduler restricted, loosely, to the worker holding its chunk."""
    chunk = 1000
    d, _ = persist_spread(client, np.arange(N_CHUNKS * chunk, dtype=np.int64), chunk, PLACEMENTS["uneven"])
    holder = placement.holders(d, client)
    lazy = mr.cumsum(d)
    out = client.persist(lazy)
    distributed.wait(out)
    seen = client.run_on_scheduler(_restrictions, f"('{lazy.name}'")
    assert len(seen) == N_CHUNKS
    for key, index in zip(placement.chunk_keys(d), range(N_CHUNKS)):
        assert seen[str((lazy.name, index))] == ([holder[key]], True), key
