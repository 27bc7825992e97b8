"""The held path beyond bare whole reductions, on a real CPU cluster: reductions over some axes of persisted
arrays and expressions over persisted arrays run where the chunks are, in one call and no task, with the
graph's bits; what cannot (chunks of one result on several workers, shared work) takes the graph."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct, placement  # noqa: E402

from .helpers import persist_spread, task_graphs  # noqa: E402


def _no_tasks(client, fn):
    """``fn()`` and the tasks the cluster ran meanwhile."""
    with distributed.get_task_stream(client) as stream:
        result = fn()
    return result, stream.data


def _graph(fn, x):
    with dask.config.set({"multireduce.placement": False}):
        return fn(x).compute()


@pytest.fixture(scope="module")
def field(cpu_client):
    a = np.random.default_rng(11).standard_normal((48, 7, 9)).astype(np.float32)
    a[3, 2, 4] = np.nan
    x = cpu_client.persist(da.from_array(a, chunks=(5, 7, 5)))
    distributed.wait(x)
    return a, x


AXES = {
    "mean0": lambda v: mr.mean(v, axis=0), "sum12": lambda v: mr.sum(v, axis=(1, 2)),
    "max0k": lambda v: mr.max(v, axis=0, keepdims=True), "var0": lambda v: mr.var(v, axis=0),
    "nanmean0": lambda v: mr.nanmean(v, axis=0), "exact0": lambda v: mr.sum(v, axis=0, exact=True),
    "prod2": lambda v: mr.prod(v / 4 + 1, axis=2), "count1": lambda v: mr.count_nonzero(v > 0, axis=1),
    # trees of several levels: groups of chunks one worker holds are combined there
    "mean0_fan3": lambda v: mr.mean(v, axis=0, split_every=3), "var0_fan2": lambda v: mr.var(v, axis=0, split_every=2),
    "sum_fan2": lambda v: mr.sum(v * 2, split_every=2), "exact_fan2": lambda v: mr.sum(v, axis=0, exact=True, split_every=2),
}


@pytest.mark.parametrize("name", sorted(AXES))
def test_reductions_over_some_axes_of_held_arrays(cpu_client, field, name):
    a, x = field
    fn = AXES[name]
    value, stream = _no_tasks(cpu_client, lambda: fn(x).compute())
    assert stream == []  # one call to the workers, no task
    ref = _graph(fn, x)
    assert value.shape == ref.shape and value.dtype == ref.dtype
    assert np.array_equal(value, ref, equal_nan=True)
    with task_graphs():
        assert np.array_equal(cpu_client.compute(fn(x)).result(), ref, equal_nan=True)  # the graph, same bits
    assert np.array_equal(cpu_client.compute(fn(x)).result(), ref, equal_nan=True)  # the held call, handed over


def test_axis_mean_against_numpy(cpu_client, field):
    a, x = field
    got = mr.mean(x, axis=0).compute()
    np.testing.assert_allclose(got, a.astype(np.float64).mean(axis=0), rtol=1e-5, equal_nan=True)


EXPRESSIONS = {
    "sum": lambda v: mr.sum(v * 2), "var": lambda v: mr.var(v + 1), "argmax": lambda v: mr.argmax(abs(v)),
    "nanmax": lambda v: mr.nanmax(v - 1), "exact": lambda v: mr.sum(v * 3, exact=True),
    "astype": lambda v: mr.sum(v.astype(np.float64) ** 2), "where": lambda v: mr.max(da.where(v > 0, v, -v)),
    "axis": lambda v: mr.mean(v * 2, axis=0),
}


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_expressions_over_held_arrays_run_where_the_chunks_are(cpu_client, field, name):
    a, x = field
    fn = EXPRESSIONS[name]
    value, stream = _no_tasks(cpu_client, lambda: fn(x).compute())
    assert stream == []
    assert np.array_equal(value, _graph(fn, x), equal_nan=True)


def test_expression_against_numpy(cpu_client, field):
    a, x = field
    assert mr.sum(x * 2).compute() == pytest.approx(np.nansum(a.astype(np.float64) * 2), rel=1e-5) or np.isnan(
        mr.sum(x * 2).compute())
    b = np.nan_to_num(a)
    y = cpu_client.persist(da.from_array(b, chunks=(5, 7, 5)))
    assert float(mr.sum(y * 2 + 1).compute()) == pytest.approx(float((b.astype(np.float64) * 2 + 1).sum()), rel=1e-5)


def test_scans_of_held_expressions_keep_outputs_where_inputs_are(cpu_client, field):
    a, x = field
    fn = lambda v: mr.cumsum(v * 2 - 1, axis=0)  # noqa: E731
    out, stream = _no_tasks(cpu_client, lambda: fn(x).persist())
    assert stream == []
    assert np.array_equal(out.compute(), _graph(fn, x), equal_nan=True)


def test_groups_combined_where_their_chunks_are(cpu_client):
    """Contiguous runs on one worker: most first-level groups are combined on their worker; the bits are
    the graph's whatever the spread."""
    a = np.random.default_rng(5).standard_normal(24 * 50 * 6).reshape(24 * 50, 6)
    for owners in ([0] * 8 + [1] * 8 + [2] * 8, [0, 1, 2] * 8, [0] * 5 + [1] * 14 + [2] * 5):
        flat, _ = persist_spread(cpu_client, a.ravel(), 300, owners)
        x = flat.reshape(24 * 50, 6)
        for fn in (lambda v: mr.mean(v, axis=0, split_every=4), lambda v: mr.sum(v * 3, split_every=3)):
            value, stream = _no_tasks(cpu_client, lambda: fn(x).compute())
            assert np.array_equal(value, _graph(fn, x))
        np.testing.assert_allclose(mr.mean(x, axis=0, split_every=4).compute(), a.mean(axis=0), rtol=1e-12)


def test_chunks_read_from_several_workers_take_the_graph(cpu_client):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(12 * 100), rng.standard_normal(12 * 100)
    x, _ = persist_spread(cpu_client, a, 100, [0, 1, 2] * 4)
    y, _ = persist_spread(cpu_client, b, 100, [1, 2, 0] * 4)
    direct.last_decline = None
    value, stream = _no_tasks(cpu_client, lambda: mr.sum(x * y).compute())
    assert stream  # the graph ran: Dask moves one side of each product
    assert "no one worker holds all of" in direct.last_decline  # and the direct path said why
    assert value == _graph(mr.sum, x * y)
    assert value == pytest.approx(float((a * b).sum()), rel=1e-12)


def test_large_partials_over_some_axes_take_the_graph(cpu_client, field, monkeypatch):
    """Partials of a lane's chunks that would cross to the client in bulk meet on a worker instead."""
    from multireduce import direct

    a, x = field
    fn = AXES["mean0"]
    monkeypatch.setattr(direct, "DIRECT_PARTIAL_BYTES", 64)
    value, stream = _no_tasks(cpu_client, lambda: fn(x).compute())
    assert stream  # the graph ran
    assert np.array_equal(value, _graph(fn, x), equal_nan=True)


def test_first_level_groups_folded_where_their_chunks_are_give_the_same_tree():
    """A worker combines the first-level groups of the lane's tree that it holds wholly (fewer partials
    cross); the aggregate then folds the same combines of the same partials in the same order."""
    from multireduce import graph

    class Recording:
        def combine(self, *parts):
            return ("combine", *parts)

        def aggregate(self, *parts):
            return ("aggregate", *parts)

    plan, parts = Recording(), list(range(37))
    want = graph.fold_in_order(plan, 8, parts)
    mine = graph.fold_first_level(plan, 8, 37, list(range(5, 31)), parts[5:31])
    assert mine[:3] == [5, 6, 7] and mine[-7:] == [24, 25, 26, 27, 28, 29, 30]  # groups held in part: apart
    assert mine[3] == ("combine", *range(8, 16)) and mine[11] == ("combine", *range(16, 24))
    assert mine[4:11] == [None] * 7 and mine[12:19] == [None] * 7
    assert graph.fold_in_order(plan, 8, parts[:5] + mine + parts[31:]) == want
    assert graph.fold_first_level(plan, 40, 37, list(range(37)), parts) == parts  # one level: nothing before it
    shuffled = [30, 29] + list(range(5, 29))  # the group's own order need not be the lane's
    mine = graph.fold_first_level(plan, 8, 37, shuffled, [parts[p] for p in shuffled])
    assert mine[shuffled.index(8)] == ("combine", *range(8, 16))


def test_leading_runs_of_straddling_groups_fold_where_they_are_for_plans_that_fold_left():
    """A plan whose combine folds left (sum, max, ... with a ufunc) has the leading run of a group that
    straddles workers combined where that run is: fewer partials cross, and combining the rest with it
    gives the group's bits (float32 sums, whose association shows in the bits). A plan that does not fold
    left (the variance's pairwise merge) keeps its straddling groups apart."""
    from multireduce import graph
    from multireduce.api import _resolve_reduction
    from multireduce.operators import get_operator

    rng = np.random.default_rng(8)
    blocks = [(rng.standard_normal((5, 3)) * 10.0 ** rng.integers(-6, 7)).astype(np.float32) for _ in range(37)]
    for name in ("sum", "max", "prod"):
        plan = _resolve_reduction("numpy", get_operator(name), np.dtype(np.float32), 2, 0, None, False, 8,
                                  "auto", False, None, name)[0][0]
        assert plan.folds_left
        parts = [plan.partial(b) for b in blocks]
        want = np.asarray(graph.fold_in_order(plan, 8, parts))
        held = list(range(5, 31))  # groups 0 and 3 straddle; 3 starts here: its leading run 24..30
        mine = graph.fold_first_level(plan, 8, 37, held, parts[5:31])
        assert [m is None for m in mine].count(True) == 7 + 7 + 6  # two whole groups, one run of 7
        assert mine[:3] == parts[5:8]  # group 0's first chunk is elsewhere: apart
        got = np.asarray(graph.fold_in_order(plan, 8, parts[:5] + mine + parts[31:]))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
        assert graph.fold_first_level(plan, 64, 37, held, parts[5:31]) == parts[5:31]  # one level: nothing
    class Pairwise:  # a plan without folds_left: only whole groups are combined where they are
        def combine(self, *parts):
            return ("combine", *parts)

    mine = graph.fold_first_level(Pairwise(), 8, 37, list(range(5, 31)), list(range(5, 31)))
    assert [m is None for m in mine].count(True) == 14 and mine[-7:] == list(range(24, 31))


def test_straddling_groups_on_a_cluster_keep_the_graphs_bits(cpu_client):
    """Contiguous shares that cut most first-level groups: sums, means, maxima, products, variances and exact
    sums over one axis, directly and through the graph of a task per worker: the bits of a task per chunk."""
    a = (np.random.default_rng(9).standard_normal(26 * 40 * 6) * 1e3).astype(np.float32)
    owners = [0] * 9 + [1] * 9 + [2] * 8  # groups of 4 and 3 straddle at 9 and 18
    flat, _ = persist_spread(cpu_client, a, 240, owners)
    x = flat.reshape(26 * 40, 6)
    for fan in (3, 4):
        for fn in (lambda v: mr.sum(v, axis=0, split_every=fan), lambda v: mr.mean(v * 3, axis=0, split_every=fan),
                   lambda v: mr.max(v, axis=0, split_every=fan), lambda v: mr.prod(v / 1e3 + 1, axis=0, split_every=fan),
                   lambda v: mr.var(v, axis=0, split_every=fan), lambda v: mr.sum(v, axis=0, exact=True, split_every=fan)):
            want = _graph(fn, x)
            direct_value = fn(x).compute()
            with task_graphs():
                graph_value = cpu_client.compute(fn(x)).result()
            for got in (direct_value, graph_value):
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_dask_counts_a_partials_bytes():
    """Partials of reductions over some axes are as large as a slice of the input: Dask's scheduler and
    dask-cuda's spilling weigh them by their value's bytes."""
    from dask.sizeof import sizeof

    from multireduce import graph  # noqa: F401 - registers the size of a Partial
    from multireduce.core import Partial

    assert sizeof(Partial(np.ones((1, 1000)), 7)) >= 8000
    assert sizeof(Partial(np.float32(1), 7)) < 200


@pytest.mark.parametrize("split_every", [3])
def test_groups_made_by_recipes_fold_what_they_hold_with_the_same_bits(cpu_client, split_every):
    """Lazily made chunks and expressions over held ones, reduced over one axis with a tree of several
    levels: the recipe groups combine the first-level groups they hold; the bits are those of one task
    per chunk."""
    a = np.random.default_rng(split_every).standard_normal((40 * 7, 5)).astype(np.float32)
    lazy = da.from_array(a, chunks=(7, 5)).map_blocks(lambda b: b * 3, dtype=a.dtype)
    held = cpu_client.persist(da.from_array(a, chunks=(7, 5)))
    distributed = pytest.importorskip("distributed")
    distributed.wait(held)
    for x in (lazy, held * 3, held):
        for fn in (lambda v: mr.sum(v, axis=0, split_every=split_every),
                   lambda v: mr.mean(v, axis=0, split_every=split_every),
                   lambda v: mr.max(v, axis=0, keepdims=True, split_every=split_every)):
            with task_graphs():
                got = [fn(x).compute(), cpu_client.compute(fn(x)).result()]
            with dask.config.set({"multireduce.placement": False}):
                want = fn(x).compute()
            for g in got:
                assert g.dtype == want.dtype and g.tobytes() == want.tobytes()


def _stale_first_plan(monkeypatch):
    """_recipes_by_worker whose first plan names, for every chunk, a worker that does not hold what it
    reads (as if a replica were dropped between the lookup and the call); later plans are right."""
    real, calls = direct._recipes_by_worker, []

    def planner(sources, found):
        calls.append(1)
        recipes, where = real(sources, found)
        if len(calls) > 1:
            return recipes, where
        workers = sorted(placement.default_client().scheduler_info()["workers"])
        moved = {workers[(workers.index(w) + 1) % len(workers)]: r for w, r in recipes.items()}
        return moved, {k: workers[(workers.index(w) + 1) % len(workers)] for k, w in where.items()}

    monkeypatch.setattr(direct, "_recipes_by_worker", planner)
    return calls


def test_expressions_planned_again_where_a_chunk_moved_after_the_lookup(cpu_client, field, monkeypatch):
    """A reduction and a scan of an expression over held chunks whose first plan is stale: the workers
    say the chunks moved, the plan is made once more, and still no task runs; the values are the graph's."""
    a, x = field
    calls = _stale_first_plan(monkeypatch)
    value, stream = _no_tasks(cpu_client, lambda: mr.sum(x * 2 - 1, axis=0).compute())
    assert stream == [] and len(calls) == 2 and direct.last_decline is None
    assert np.array_equal(value, _graph(lambda v: mr.sum(v, axis=0), x * 2 - 1), equal_nan=True)
    calls = _stale_first_plan(monkeypatch)
    out, stream = _no_tasks(cpu_client, lambda: mr.cumsum(x * 2 - 1, axis=0).persist())
    assert stream == [] and len(calls) == 2 and direct.last_decline is None
    assert np.array_equal(out.compute(), _graph(lambda v: mr.cumsum(v, axis=0), x * 2 - 1), equal_nan=True)


def test_expressions_reuse_the_placement_seen_last_and_look_it_up_when_stale(cpu_client, field, monkeypatch):
    """An expression over held chunks plans its recipes from where the chunks were seen last: a second call
    asks the scheduler nothing (no ``who_has``), and a recorded placement gone stale (every chunk said to be
    on another worker) costs one lookup, never a task or a wrong value."""
    a, x = field
    lookups = []
    real = placement.holders_of

    def counted(futures, client):
        lookups.append(len(futures))
        return real(futures, client)

    monkeypatch.setattr(placement, "holders_of", counted)
    want = _graph(lambda v: mr.sum(v, axis=0), x * 2 - 1)
    expression = x * 2 - 1
    for _ in range(2):
        value, stream = _no_tasks(cpu_client, lambda: mr.sum(expression, axis=0).compute())
        assert stream == [] and direct.last_decline is None
        assert np.array_equal(value, want, equal_nan=True)
    assert len(lookups) <= 1  # the first call may look up; the second reads what the first saw
    keys = [k for k in placement.chunk_keys(x)]
    seen = placement.recently_seen_chunks(keys, cpu_client)
    assert seen is not None and set(seen) == set(keys)
    workers = sorted(cpu_client.scheduler_info()["workers"])
    assert len(workers) > 1
    placement.remember_chunks({k: workers[(workers.index(w) + 1) % len(workers)] for k, w in seen.items()},
                              cpu_client)
    lookups.clear()
    value, stream = _no_tasks(cpu_client, lambda: mr.sum(expression, axis=0).compute())
    assert stream == [] and direct.last_decline is None and len(lookups) == 1
    assert np.array_equal(value, want, equal_nan=True)
    assert placement.recently_seen_chunks(keys, cpu_client) == seen  # the lookup's placement recorded
    with dask.config.set({"multireduce.placement-reuse": 0}):
        lookups.clear()
        value, _ = _no_tasks(cpu_client, lambda: mr.sum(expression, axis=0).compute())
        assert lookups and np.array_equal(value, want, equal_nan=True)  # looked up, not reused


def test_a_recorded_placement_holding_operands_apart_is_looked_up_again(cpu_client):
    """Two held operands recorded on different workers (as they were, before one was replicated) are
    looked up again, not sent to the graph: the expression then runs where the chunks are, no task."""
    a = np.random.default_rng(12).standard_normal((60, 10))
    b = a[::-1].copy()
    workers = sorted(cpu_client.scheduler_info()["workers"])
    x = cpu_client.persist(da.from_array(a, chunks=(10, 10)), workers=[workers[0]])
    y = cpu_client.persist(da.from_array(b, chunks=(10, 10)), workers=[workers[1]])
    distributed.wait([x, y])
    _, stream = _no_tasks(cpu_client, lambda: mr.sum(x * y).compute())
    assert stream and direct.last_decline is not None  # held apart: the graph
    cpu_client.replicate(y, n=len(workers))
    value, stream = _no_tasks(cpu_client, lambda: mr.sum(x * y).compute())
    assert stream == [] and direct.last_decline is None
    assert np.array_equal(value, _graph(mr.sum, x * y))


CHUNK_WHOLE = {
    "sum1": lambda v: mr.sum(v, axis=1), "mean1k": lambda v: mr.mean(v, axis=1, keepdims=True),
    "var1": lambda v: mr.var(v, axis=1), "argmax1": lambda v: mr.argmax(v, axis=1),
    "nanargmin1k": lambda v: mr.nanargmin(v, axis=1, keepdims=True),
    "nanmax1": lambda v: mr.nanmax(v, axis=1), "exact1": lambda v: mr.sum(v, axis=1, exact=True),
    "sum_expr1": lambda v: mr.sum(v * 2 - 1, axis=1),  # an expression: each chunk made where it is read
    "mean_where1": lambda v: mr.mean(da.where(v > 0, v, 0), axis=1),
    "argmax_expr1": lambda v: mr.argmax(v * 2 - 1, axis=1),
}


@pytest.mark.parametrize("name", sorted(CHUNK_WHOLE))
def test_reductions_each_chunk_holds_keep_their_blocks_where_the_chunks_are(cpu_client, name):
    """A tall matrix in row chunks, reduced along its rows, or an expression over it: ``.persist()`` keeps
    each chunk's output block on the worker holding the chunk (one call, no task, whatever the output's
    size), with the graph's chunks and bits."""
    a = np.random.default_rng(sorted(CHUNK_WHOLE).index(name)).standard_normal((700, 9)).astype(np.float32)
    a[13, 4] = np.nan
    x = cpu_client.persist(da.from_array(a, chunks=(100, 9)))
    distributed.wait(x)
    fn = CHUNK_WHOLE[name]
    direct.last_decline = None
    out, stream = _no_tasks(cpu_client, lambda: fn(x).persist())
    ref = _graph(fn, x)
    assert stream == [] and direct.last_decline is None and "-chunks-" in out.name
    held = cpu_client.who_has(distributed.futures_of(x))
    kept = cpu_client.who_has(distributed.futures_of(out))
    for key, where in kept.items():  # output block i lies where input chunk i does
        assert where == held[(x.name, key[1], 0)], key
    assert out.chunks == fn(x).chunks and out.dtype == ref.dtype
    got = out.compute()
    assert got.shape == ref.shape and np.array_equal(got, ref, equal_nan=True)
    assert np.array_equal(fn(x).compute(), ref, equal_nan=True)  # .compute() too, whichever path it takes


def test_reductions_each_chunk_holds_over_a_field_and_large_outputs(cpu_client, field, monkeypatch):
    """Over a 3-d field whose middle axis each chunk holds whole, with DIRECT_PARTIAL_BYTES below the
    output's size: ``.persist()`` still keeps the blocks where the chunks are, ``.compute()`` takes the
    graph, both with the graph's bits."""
    a, x = field
    monkeypatch.setattr(direct, "DIRECT_PARTIAL_BYTES", 64)
    for fn in (lambda v: mr.mean(v, axis=1), lambda v: mr.max(v, axis=1, keepdims=True)):
        ref = _graph(fn, x)
        out, stream = _no_tasks(cpu_client, lambda: fn(x).persist())
        assert stream == []
        assert np.array_equal(out.compute(), ref, equal_nan=True)
        value, stream = _no_tasks(cpu_client, lambda: fn(x).compute())
        assert stream and np.array_equal(value, ref, equal_nan=True)
    # a reduced axis over several chunks keeps the graph's persist
    out = mr.mean(x, axis=0).persist()
    assert "-chunks-" not in out.name
    assert np.array_equal(out.compute(), _graph(lambda v: mr.mean(v, axis=0), x), equal_nan=True)
