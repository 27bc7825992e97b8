"""Recipes: chunks made inside the graph are made by a few tasks per worker (lazy inputs) or by the worker
holding their data (expressions over persisted arrays), with Dask's own bits and lineage."""

from __future__ import annotations

import weakref

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce import placement
from multireduce.recipes import ChunkSources

from .helpers import task_count

distributed = pytest.importorskip("distributed")


def _data(n=40_011, seed=5):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _groups(keys, size):
    return [keys[i : i + size] for i in range(0, len(keys), size)]


# ------------------------------------------------------------------------------------------------
# Following a recipe (no cluster)
# ------------------------------------------------------------------------------------------------
def test_recipes_make_every_chunk_once_in_order():
    calls = []

    def produce(block, block_info=None):
        calls.append(block_info[None]["chunk-location"][0])
        return block * 3

    a = _data(1003)
    y = (da.from_array(a, chunks=100).map_blocks(produce, dtype=a.dtype) - 1).astype(np.float64)
    sources = ChunkSources(y)
    assert sources.ok and not sources.held_only and not sources.futures
    recipes, shared = sources.recipes(_groups(sources.keys, 4))
    assert len(recipes) == 3 and not shared
    with dask.config.set(scheduler="synchronous"):
        expected = [y.blocks[i].compute() for i in range(y.numblocks[0])]
    calls.clear()
    made = [b for r in recipes for b in r.make({k: None for k in r.inputs})]
    assert calls == list(range(11))  # every chunk once, in chunk order
    assert len(made) == 11 and all(np.array_equal(m, e) for m, e in zip(made, expected))


def test_a_recipe_holds_one_chunk_at_a_time():
    alive, peak = set(), [0]

    def produce(block):
        out = block * 2.0
        alive.add(id(out))
        weakref.finalize(out, alive.discard, id(out))
        peak[0] = max(peak[0], len(alive))
        return out

    a = _data(4000)
    y = da.from_array(a, chunks=250).map_blocks(produce, dtype=np.float64) + 1.0
    sources = ChunkSources(y)
    (recipe,), _ = sources.recipes([sources.keys])
    inputs = {k: None for k in recipe.inputs}
    total = 0.0
    for block in recipe.make(inputs):
        total += float(block.sum(dtype=np.float64))
        del block
    assert peak[0] <= 2  # the chunk being made and at most the one just handed out
    assert total == pytest.approx(float((a * 2.0 + 1.0).astype(np.float64).sum()), rel=1e-9)


def test_shared_constants_stay_tasks_and_shared_work_is_refused():
    a = _data(4000).reshape(40, 100)
    x = da.from_array(a, chunks=(10, 100))
    w = da.from_array(np.linspace(0.5, 1.5, 100), chunks=100)
    sources = ChunkSources(x * w)
    assert sources.ok
    recipes, shared = sources.recipes(_groups(sources.keys, 2))
    assert len(shared) == 1 and all(k in r.inputs for r in recipes for k in shared)
    # tasks whose one output feeds several chunks: Dask keeps them
    assert not ChunkSources((x + 1).rechunk((15, 50))).ok
    assert not ChunkSources(da.overlap.overlap(x, depth={0: 1}, boundary="reflect")).ok
    assert not ChunkSources(x - x.mean(axis=0)).ok


# ------------------------------------------------------------------------------------------------
# On a real cluster (three single-threaded workers)
# ------------------------------------------------------------------------------------------------
def _graph_bits(fn, x):
    """``fn(x)`` computed through the graph of one task per chunk (placement off), the reference bits."""
    with dask.config.set({"multireduce.placement": False}):
        return fn(x).compute()


REDUCTIONS = {
    "sum": mr.sum, "prod": lambda x: mr.prod(x / 4 + 1), "min": mr.min, "max": mr.max, "mean": mr.mean,
    "var": mr.var, "nanmean": mr.nanmean, "argmax": mr.argmax, "nansum": mr.nansum,
    "exact": lambda x: mr.sum(x, exact=True), "any": lambda x: mr.any(x > 3.5),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_lazy_inputs_take_a_few_tasks_per_thread_with_the_same_bits(cpu_client, name):
    fn = REDUCTIONS[name]
    a = _data()
    a[[7, 20_001]] = np.nan if name.startswith("nan") else a[[7, 20_001]]
    x = da.from_array(a, chunks=997) * 1.5 - 0.25  # 41 chunks made in the graph
    result = fn(x)
    got = result.compute()
    assert np.array_equal(np.asarray(got), np.asarray(_graph_bits(fn, x)), equal_nan=True)
    if name not in ("argmax", "any", "prod"):  # those wrap x in more steps of their own; checked for bits above
        partials = sum(1 for k in result.__dask_graph__() if "partial" in str(k[0] if isinstance(k, tuple) else k))
        assert 1 <= partials <= 3 * 2  # three threads, two tasks each (the default)


def test_axis_reductions_of_lazy_inputs(cpu_client):
    a = _data(60_000).reshape(300, 200)
    x = da.from_array(a, chunks=(25, 100)) + 1
    for fn in (lambda v: mr.sum(v, axis=0), lambda v: mr.mean(v, axis=1), lambda v: mr.max(v, axis=0),
               lambda v: mr.var(v, axis=0)):
        assert np.array_equal(fn(x).compute(), _graph_bits(fn, x))
    ref = (a.astype(np.float64) + 1).sum(axis=0)
    np.testing.assert_allclose(mr.sum(x, axis=0).compute(), ref, rtol=1e-5)


def test_tasks_per_thread_setting(cpu_client):
    x = da.from_array(_data(), chunks=997) + 2
    with dask.config.set({"multireduce.tasks-per-thread": 1}):
        assert task_count(mr.sum(x), "sum-partial") == 3
    with dask.config.set({"multireduce.tasks-per-thread": "4"}):
        assert task_count(mr.sum(x), "sum-partial") == 12
    for bad in (0, -1, "many", "", True):
        with dask.config.set({"multireduce.tasks-per-thread": bad}):
            with pytest.raises(ValueError, match="multireduce.tasks-per-thread"):
                mr.sum(x)


def test_shared_work_keeps_dasks_tasks(cpu_client):
    x = da.from_array(_data(40_000).reshape(200, 200), chunks=(20, 200))
    y = (x + 1).rechunk((50, 50))
    assert placement.grouping_for(y, True) is None
    fn = lambda v: mr.sum(v, axis=0)  # noqa: E731
    assert task_count(fn(y), "sum-partial") == 16  # one per chunk, as before
    assert np.array_equal(fn(y).compute(), _graph_bits(fn, y))


def test_expressions_over_persisted_arrays_run_where_the_chunks_are(cpu_client):
    a = _data()
    x = cpu_client.persist(da.from_array(a, chunks=997))
    distributed.wait(x)
    workers = {w for ws in cpu_client.who_has(x).values() for w in ws}
    w = da.from_array(np.float32(0.5) * np.ones(997, np.float32), chunks=997)
    for fn in (lambda v: mr.sum(v * 2), lambda v: mr.var(v + 1), lambda v: mr.min(abs(v)),
               lambda v: mr.sum(v.astype(np.float64) * np.float64(1.25)), lambda v: mr.nansum(v)):
        result = fn(x)
        assert np.array_equal(result.compute(), _graph_bits(fn, x))
        partials = sum(1 for k in result.__dask_graph__() if "partial" in str(k[0]))
        assert partials <= len(workers)  # one per worker holding chunks
    # a constant shared by every chunk: one task of its own, the rest per worker
    y = x.reshape(-1)[: 997 * 40].reshape(40, 997) * w
    assert np.array_equal(mr.sum(y).compute(), _graph_bits(mr.sum, y))


def test_an_expression_over_held_chunks_is_read_once_per_name_and_futures(cpu_client, monkeypatch):
    """The same expression made again over the same persisted array (a new ``x * 2`` of the same name) is
    not read from its graph again, and gives the same bits; the array persisted again (new futures under
    the same keys) is read anew; what was read goes with the persisted array."""
    import gc

    from multireduce import recipes

    reads = []
    real_init = ChunkSources.__init__

    def counted(self, x):
        reads.append(x.name)
        real_init(self, x)

    monkeypatch.setattr(ChunkSources, "__init__", counted)
    a = _data(seed=8)
    x = cpu_client.persist(da.from_array(a, chunks=997))
    distributed.wait(x)
    want = _graph_bits(lambda v: mr.sum(v * 2), x)
    values = [mr.sum(x * 2).compute() for _ in range(3)]
    assert all(np.array_equal(v, want) for v in values)
    assert reads.count((x * 2).name) == 1
    assert np.array_equal(mr.var(x + 1).compute(), _graph_bits(lambda v: mr.var(v + 1), x))
    assert reads.count((x + 1).name) == 1
    keys = set(placement.chunk_keys(x))

    def kept_for_x():
        return any(future.key in keys for future in list(recipes._read_over_held.keys()))

    assert kept_for_x()
    name = x.name
    del x, values
    gc.collect()
    assert not kept_for_x()  # gone with the persisted array's futures
    x = cpu_client.persist(da.from_array(a, chunks=997))  # the same keys, new futures
    distributed.wait(x)
    assert x.name == name
    reads.clear()
    assert np.array_equal(mr.sum(x * 2).compute(), want)
    assert reads.count((x * 2).name) == 1


def test_what_outlives_an_expression_is_not_kept_and_a_written_array_is_read_again(cpu_client):
    """An expression whose tasks hold a future (``map_blocks(f, future)``) or more than a little literal
    data (``x + da.from_array(big)``) is read again each time, so nothing keeps them once the caller lets
    them go; an array written into (``x[i] = v``: the same object under a new name) is read again and
    reduced as written."""
    import gc

    from multireduce import recipes

    a = _data(n=400_003, seed=9)  # float32: 1.6 MB, more literal data than is kept
    x = cpu_client.persist(da.from_array(a, chunks=50_000))
    distributed.wait(x)
    future = cpu_client.scatter(np.float32(5.0))
    key = future.key
    y = x.map_blocks(lambda b, f: b + f, future, dtype=np.float32)
    assert np.array_equal(mr.sum(y).compute(), _graph_bits(mr.sum, y))
    big = np.arange(a.size, dtype=np.float32)
    alive = weakref.ref(big)
    z = x + da.from_array(big, chunks=50_000)
    assert np.array_equal(mr.sum(z).compute(), _graph_bits(mr.sum, z))
    del y, future, z, big
    gc.collect()
    assert alive() is None
    assert key not in cpu_client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
    assert not any(name.startswith(("lambda", "add")) for per in recipes._read_over_held.values()
                   for _, name in per)
    w = x * 2
    assert np.array_equal(mr.sum(w).compute(), _graph_bits(mr.sum, w))
    w[3] = 1e6
    assert np.array_equal(mr.sum(w).compute(), _graph_bits(mr.sum, w))
    x[0] = -7.0
    want = a.copy()
    want[0] = -7.0
    with dask.config.set({"multireduce.placement": False}):
        assert np.array_equal(mr.sum(x).compute(), mr.sum(want))


SCANS = {
    "cumsum": mr.cumsum, "cumprod": lambda x: mr.cumprod(x / 8 + 1), "exact": lambda x: mr.cumsum(x, exact=True),
    "nancumsum": mr.nancumsum, "axis0": lambda x: mr.cumsum(x.reshape(-1, 3), axis=0),
    "axis1": lambda x: mr.cumsum(x.reshape(-1, 3).rechunk((997, 1)), axis=1),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCANS))
def test_scans_of_lazy_inputs_and_held_expressions(cpu_client, name):
    fn = SCANS[name]
    a = _data(40_011 - 40_011 % 3)
    lazy = da.from_array(a, chunks=997) * 1.5 - 0.25
    held = cpu_client.persist(da.from_array(a, chunks=997))
    distributed.wait(held)
    for x in (lazy, held * 1.5 - 0.25):
        result = fn(x)
        assert np.array_equal(result.compute(), _graph_bits(fn, x), equal_nan=True)
        assert np.array_equal(cpu_client.persist(result).compute(), _graph_bits(fn, x), equal_nan=True)
    np.testing.assert_allclose(mr.cumsum(lazy).compute(), np.cumsum((a * 1.5 - 0.25).astype(np.float64)),
                               rtol=1e-6, atol=1e-3)


def test_lazy_scan_totals_are_a_few_tasks_per_thread(cpu_client):
    x = da.from_array(_data(), chunks=997) + 1
    with dask.config.set({"multireduce.scan-keep-chunks": False}):  # kept chunks: test_scan_keeps_chunks.py
        result = mr.cumsum(x)
    assert task_count(result, "cumsum-totals") <= 6
    assert task_count(result, "cumsum-") == 41 + task_count(result, "cumsum-totals")  # a scan task per chunk


# ------------------------------------------------------------------------------------------------
# Several results, one read
# ------------------------------------------------------------------------------------------------
_made = []


def _counted(block, block_info=None):
    _made.append(block_info[None]["chunk-location"])
    return block * 1.5


@pytest.mark.parametrize("held", [False, True])
def test_several_whole_results_computed_together_read_each_chunk_once(cpu_client, held):
    a = _data()
    base = da.from_array(a, chunks=997)
    if held:
        base = cpu_client.persist(base)
        distributed.wait(base)
    x = base.map_blocks(_counted, dtype=a.dtype)
    fns = (mr.sum, mr.max, mr.var, mr.nanmean, lambda v: mr.sum(v, exact=True), mr.count_nonzero)
    alone = [_graph_bits(fn, x) for fn in fns]
    _made.clear()
    together = dask.compute(*(fn(x) for fn in fns))
    assert sorted(_made) == [(i,) for i in range(x.numblocks[0])]  # every chunk made once, for all six
    for got, ref in zip(together, alone):
        assert type(got) is type(ref) and np.array_equal(got, ref)
    # results of other arrays, or over some axes only, are computed as before beside them
    other = da.from_array(a[::-1].copy(), chunks=997)
    s, o, m = dask.compute(mr.sum(x), mr.sum(other), mr.max(x))
    assert (s, o, m) == (alone[0], _graph_bits(mr.sum, other), alone[1])




class _Tracked(np.ndarray):
    pass


_made_refs: list = []
_alive_when_made: list = []


def _tracked_chunk(block):
    """A chunk made with a temporary, as ``random(...) - 0.5`` is; notes how many made chunks are alive when
    the next one is made."""
    import gc

    gc.collect()
    _alive_when_made.append(sum(r() is not None for r in _made_refs))
    out = (block * 2.0 + 1.0).view(_Tracked)
    _made_refs.append(weakref.ref(out))
    return out


def test_a_recipe_keeps_no_chunk_alive_while_it_makes_the_next():
    """``Recipe.apply`` hands each chunk to the function and drops it before the next one is made: a loop
    over ``make`` would keep the previous chunk through the next one's making (three chunks at once on a
    GPU where dask.array holds two)."""
    x = da.from_array(np.arange(40.0), chunks=5).map_blocks(_tracked_chunk, dtype=float, meta=np.empty(0))
    sources = ChunkSources(x)
    (recipe,), _ = sources.recipes([sources.keys])
    _made_refs.clear()
    _alive_when_made.clear()
    got = recipe.apply({}, lambda block, position: float(block.sum()), range(len(sources.keys)))
    assert got == [float((np.arange(5.0) + 5 * i).sum() * 2 + 5) for i in range(8)]
    assert _alive_when_made == [0] * 8  # the previous chunk was dropped before each was made
    assert recipe.apply({}, lambda b, p: p, range(3)) == [0, 1, 2]  # fewer extras than chunks: stops there
