"""``client.compute``, ``dask.compute`` and ``.persist()`` of results over held chunks, on a real CPU cluster:
Dask reads their graph on the client first, and the held call made there hands the value over in one task
per output block; results asked for together read the chunks once; the bits are the task graph's; where the
held call declines (or cannot wait: an asynchronous client) the task graph runs as before."""

from __future__ import annotations

import asyncio
import re

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402

from .helpers import persist_spread, task_graphs  # noqa: E402


def _stream(client, fn):
    """``fn()`` and the names of the tasks the cluster ran meanwhile."""
    with distributed.get_task_stream(client) as stream:
        value = fn()
    return value, sorted(re.sub(r"-[0-9a-f]{32}", "", t["key"][0] if isinstance(t["key"], tuple) else t["key"])
                         for t in stream.data)


def _bits(value) -> bytes:
    return np.asarray(value).tobytes()


@pytest.fixture(scope="module")
def spread(cpu_client):
    x = (np.random.default_rng(41).standard_normal(12 * 1001) * 1e3).astype(np.float32)
    x[7] = np.nan  # nan-skipping reductions see one
    d, _ = persist_spread(cpu_client, x, 1001, [0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 2, 1])
    return x, d


@pytest.fixture()
def held_calls(monkeypatch):
    """The plans each held call of this test reduced (a FusedPlan's named one by one)."""
    calls = []
    real = direct.reduce_held

    def counted(x, plan, *args, **kwargs):
        calls.append([p.label for p in getattr(plan, "plans", (plan,))])
        return real(x, plan, *args, **kwargs)

    monkeypatch.setattr(direct, "reduce_held", counted)
    return calls


def test_client_compute_hands_the_held_value_over_in_one_task(cpu_client, spread, held_calls):
    x, d = spread
    got, ran = _stream(cpu_client, lambda: cpu_client.compute(mr.nansum(d)).result())
    assert ran == ["nansum-aggregate-value"] and len(held_calls) == 1  # one held call, one task handing it over
    with task_graphs():
        want, ran_graph = _stream(cpu_client, lambda: cpu_client.compute(mr.nansum(d)).result())
    assert "nansum-partial" in ran_graph  # the reference is the task graph
    assert type(got) is type(want) and got.dtype == want.dtype and _bits(got) == _bits(want)
    assert _bits(mr.nansum(d).compute()) == _bits(got)
    np.testing.assert_allclose(got, np.nansum(x.astype(np.float64)), rtol=1e-5)


def test_results_computed_together_take_one_held_call(cpu_client, spread, held_calls):
    x, d = spread
    fns = (mr.sum, mr.max, mr.var, mr.nanmean, lambda v: mr.sum(v, exact=True), mr.argmax,
           lambda v: mr.sum(v, keepdims=True))
    got, ran = _stream(cpu_client, lambda: dask.compute(*(fn(d) for fn in fns)))
    assert len(ran) == len(fns)  # a task per result, handing its value over
    # one call for every result reading the bare chunks the same way; argmax reads them located, alone
    assert sorted(map(sorted, held_calls)) == [["argmax"], sorted(["sum", "max", "var", "nanmean", "exact-sum", "sum"])]
    with task_graphs():
        want = dask.compute(*(fn(d) for fn in fns))
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype and _bits(g) == _bits(w)
    assert got[-1].shape == (1,) and np.isnan(got[0])  # keepdims kept; the NaN reached the plain sum


def test_persist_of_a_held_reduction_keeps_the_value_on_a_worker(cpu_client, spread, held_calls):
    x, d = spread
    kept, ran = _stream(cpu_client, lambda: distributed.wait(r := mr.max(d).persist()) and r)
    assert ran == ["max-aggregate-value"] and len(held_calls) == 1
    assert kept.compute() == np.nanmax(x) or np.isnan(kept.compute())
    on_cluster = cpu_client.persist(mr.min(d))
    with task_graphs():
        assert _bits(on_cluster.compute()) == _bits(cpu_client.compute(mr.min(d)).result())


def test_reductions_over_some_axes_hand_over_each_output_block(cpu_client, held_calls, monkeypatch):
    a = np.random.default_rng(43).standard_normal((40, 30)).astype(np.float32)
    m = cpu_client.persist(da.from_array(a, chunks=(7, 11)))
    distributed.wait(m)
    got, ran = _stream(cpu_client, lambda: cpu_client.compute(mr.mean(m, axis=0)).result())
    # one task per output block (3 along axis 1), and Dask's concatenation of them
    assert [n for n in ran if not n.startswith("finalize")] == ["mean-aggregate-value"] * 3 and len(held_calls) == 1
    with task_graphs():
        want = cpu_client.compute(mr.mean(m, axis=0)).result()
    assert got.shape == (30,) and got.dtype == want.dtype and _bits(got) == _bits(want)
    # a result too large to travel in the graph keeps its tasks (run again: the same graph's keys released
    # first, else the scheduler serves its partials from memory)
    from benchmarks.harness import wait_released

    monkeypatch.setattr(direct, "VALUE_GRAPH_BYTES", 64)
    for _ in range(3):  # under load a worker can still serve a released key's data: then run it once more
        wait_released(cpu_client, ["mean-partial"])
        large, ran = _stream(cpu_client, lambda: cpu_client.compute(mr.mean(m, axis=0)).result())
        if "mean-partial" in ran:
            break
    assert "mean-partial" in ran and _bits(large) == _bits(want)


def test_the_task_graph_runs_where_the_held_call_declines_or_cannot_wait(cpu_client, spread, monkeypatch):
    x, d = spread
    with dask.config.set({"multireduce.held-values-in-graphs": False}):
        value, ran = _stream(cpu_client, lambda: cpu_client.compute(mr.sum(d)).result())
    assert "sum-partial" in ran
    monkeypatch.setattr(direct, "reduce_held", lambda *args, **kwargs: None)  # declines (a chunk lost, ...)
    declined, ran = _stream(cpu_client, lambda: cpu_client.compute(mr.sum(d)).result())
    assert "sum-partial" in ran and _bits(declined) == _bits(value)
    monkeypatch.undo()
    # a graph read for anything but computing it (arithmetic, a direct read) is the task graph, built lazily
    r = mr.sum(d)
    assert "sum-partial" in {k[0].rsplit("-", 1)[0] for k in r.__dask_graph__() if isinstance(k, tuple)}
    assert _bits((mr.sum(d) * 1).compute()) == _bits(value)


def test_an_asynchronous_client_runs_the_task_graph(cpu_client, spread):
    x, d = spread

    async def run():
        async with distributed.Client(cpu_client.scheduler.address, asynchronous=True) as client:
            held = await client.persist(da.from_array(x, chunks=1001))
            return await client.compute(mr.sum(held))  # the held call would block this coroutine's loop

    with task_graphs():
        want = cpu_client.compute(mr.sum(da.from_array(x, chunks=1001))).result()
    assert _bits(asyncio.run(run())) == _bits(want)


def _boom(block):
    raise ZeroDivisionError("a chunk that cannot be made")


def test_a_lazy_whole_reduction_aggregates_on_the_client(cpu_client):
    """``.compute()`` of a whole reduction of lazily made chunks: the first-stage tasks run on the cluster and
    the aggregate on the client (no aggregate task), with the bits and type of the graph's aggregate task."""
    lz = da.random.default_rng(44).standard_normal(97 * 1013, chunks=1013).astype(np.float32)
    for fn in (mr.sum, mr.var, mr.max, lambda v: mr.sum(v, exact=True), lambda v: mr.mean(v, keepdims=True)):
        got, ran = _stream(cpu_client, lambda: fn(lz).compute())
        assert ran and not any("aggregate" in n for n in ran), ran
        (want,) = dask.compute(fn(lz))  # the graph, its aggregate a task
        assert type(got) is type(want) and np.shape(got) == np.shape(want) and _bits(got) == _bits(want)
    with pytest.raises(ZeroDivisionError, match="cannot be made"):
        mr.sum(lz.map_blocks(_boom, dtype=lz.dtype)).compute()
    assert _bits(mr.sum(lz).compute(scheduler="sync")) == _bits(mr.sum(lz).compute())  # arguments: as asked


def test_results_of_every_type_come_back_in_the_order_asked(cpu_client, spread):
    """dask 2026.7-2026.8 group the collections of one ``dask.compute`` by their ``__dask_optimize__`` and
    hand the results back in the groups' order: every result type here has the one optimiser, so a whole
    reduction, a reduction over one axis and a scan, lazy or held, interleaved, come back where asked."""
    x, d = spread
    a = np.arange(12.0).reshape(4, 3)
    for arr, how in ((da.from_array(a, chunks=2), {"scheduler": "sync"}), (da.from_array(a, chunks=2), {}),
                     (cpu_client.persist(da.from_array(a, chunks=2)), {})):
        m = a
        got = dask.compute(mr.sum(arr), mr.mean(arr, axis=0), mr.max(arr), mr.cumsum(arr, axis=0), mr.min(arr), **how)
        want = (m.sum(), m.mean(axis=0), m.max(), np.cumsum(m, axis=0), m.min())
        assert [np.shape(g) for g in got] == [np.shape(w) for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w)
        got = dask.compute(mr.sum(d), mr.cumsum(d), mr.nanmax(d))  # held, on the cluster
        assert np.shape(got[1]) == x.shape and np.isnan(got[0]) and got[2] == np.nanmax(x)
