"""``compute=True``: whole reductions of persisted arrays on the workers holding the chunks, without a
task graph, on a real CPU cluster (the same code runs on dask-cuda workers with CuPy chunks:
tests/multi_gpu). Every fallback to the graph is checked to give the same answer."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402

from .helpers import matmul_operator, persist_spread, random_matrices, sequential_fold, task_graphs  # noqa: E402


@pytest.fixture(scope="module")
def client(cpu_client):
    return cpu_client


def _spread(client, x: np.ndarray, chunk: int, owners: list[int]):
    return persist_spread(client, x, chunk, owners)[0]


def _busy(dask_scheduler) -> bool:
    return any(ts.state in ("processing", "waiting", "queued", "no-worker") for ts in dask_scheduler.tasks.values())


def _wait_idle(client, timeout: float = 30.0) -> None:
    """Until no task of an earlier computation is pending: under load one could finish inside the next
    measurement's task stream and be counted as the measured call's."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_busy):
        assert time.monotonic() < deadline, "the scheduler did not become idle"
        time.sleep(0.01)


def _tasks_during(client, fn):
    _wait_idle(client)
    with distributed.get_task_stream(client) as stream:
        value = fn()
    return value, len(stream.data)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.float64])
def test_whole_reductions_run_on_the_holders_without_tasks(client, dtype):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(9 * 1000) * 100).astype(dtype)
    # products of floats near 1 neither overflow nor vanish; integer products wrap exactly
    near_one = (1 + rng.standard_normal(9 * 1000) * 1e-3).astype(dtype) if np.dtype(dtype).kind == "f" else x
    owners = [0, 0, 1, 2, 2, 2, 0, 1, 1]
    # one persist per distinct array: persisting the same data twice and dropping one copy releases keys
    # the other shares while the scheduler is still placing them
    arrays = {id(a): _spread(client, a, 1000, owners) for a in {id(x): x, id(near_one): near_one}.values()}
    for fn, ref in [(mr.sum, np.sum), (mr.prod, np.prod), (mr.min, np.min), (mr.max, np.max), (mr.mean, np.mean)]:
        data = near_one if fn is mr.prod else x
        d = arrays[id(data)]
        got, tasks = _tasks_during(client, lambda: fn(d, compute=True))
        assert tasks == 0, f"{fn.__name__}: {tasks} tasks ran; the direct path runs none"
        assert isinstance(got, np.generic) and got.dtype == np.asarray(fn(data)).dtype
        if np.dtype(dtype).kind == "f":
            assert np.isfinite(got) and np.isclose(got, ref(data.astype(np.float64)), rtol=1e-4, atol=1e-2)
        else:
            assert got == fn(data), fn.__name__
        assert got == fn(d).compute() or np.isclose(got, fn(d).compute(), rtol=1e-6)


def test_order_is_kept_for_noncommutative_operators(client):
    op = matmul_operator()
    m = random_matrices(np.random.default_rng(3), 8 * 300)
    d = _spread(client, m, 300, [0, 1, 1, 2, 0, 0, 2, 1])
    got, tasks = _tasks_during(client, lambda: mr.reduce(d, op, compute=True))
    assert tasks == 0
    assert int(got) == sequential_fold(m) and int(got) != sequential_fold(m[::-1])


def test_chunks_are_read_where_they_are_now(client):
    """The direct path asks every worker what it holds (no placement lookup that could be stale):
    chunks moved or replicated since the result was built are reduced once each, where they are."""
    x = np.arange(1, 6001, dtype=np.int64)
    d = _spread(client, x, 1000, [0, 1, 2, 0, 1, 2])
    lazy = mr.sum(d)
    client.replicate(distributed.futures_of(d), n=3)  # every chunk on every worker now
    assert all(len(w) == 3 for w in client.who_has(distributed.futures_of(d)).values())
    got, tasks = _tasks_during(client, lazy.compute)
    assert got == x.sum() and tasks == 0  # each chunk counted once
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0


def test_a_chunk_no_worker_reports_falls_back_to_the_graph(client, monkeypatch):
    x = np.arange(1, 6001, dtype=np.int64)
    d = _spread(client, x, 1000, [0, 1, 2, 0, 1, 2])
    real_run = direct._run

    def one_chunk_short(*args, **kwargs):
        replies = real_run(*args, **kwargs)
        worker = next(w for w in sorted(replies) if replies[w])
        replies[worker].pop(next(iter(replies[worker])))  # as if that chunk had been lost meanwhile
        return replies

    monkeypatch.setattr(direct, "_run", one_chunk_short)
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks > 0  # the graph ran
    monkeypatch.undo()
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0


def test_what_the_direct_path_cannot_do_computes_the_graph(client):
    x = np.random.default_rng(4).integers(-50, 50, size=(60, 40))
    lazy = da.from_array(x, chunks=(20, 20))  # not persisted: no placement
    got, tasks = _tasks_during(client, lambda: mr.sum(lazy, compute=True))
    assert got == x.sum() and tasks > 0 and isinstance(got, np.generic)
    persisted = client.persist(lazy)
    distributed.wait(persisted)
    by_axis = mr.max(persisted, axis=0, compute=True)  # only some axes: the graph
    assert isinstance(by_axis, np.ndarray) and np.array_equal(by_axis, x.max(axis=0))
    with pytest.raises(TypeError, match="argument 'compute' must be True or False"):
        mr.sum(persisted, compute="yes")
    with pytest.raises(ValueError, match="zero-size array"):
        mr.min(client.persist(da.zeros(0, chunks=5)), compute=True)


def test_numpy_and_cupy_inputs_ignore_compute():
    x = np.arange(10)
    assert mr.sum(x, compute=True) == 45 and mr.mean(x, compute=True) == 4.5


def _add_unless_sentinel(a, b):
    if np.any(np.asarray(a) == -7777) or np.any(np.asarray(b) == -7777):
        raise TimeoutError("sentinel element -7777 reached the operator")
    return np.add(a, b)


def test_an_operators_own_timeout_surfaces_without_the_graph(client):
    """An error raised by the reduction on a worker surfaces as it is, even of a type that a comm
    failure also has (TimeoutError): it is not taken for stale placement and recomputed by the graph."""
    mr.register_operator("add_unless_sentinel", identity=0, cpu=_add_unless_sentinel, commutative=True, kinds="i",
                         replace=True)
    x = np.random.default_rng(6).integers(-1000, 1000, size=3 * 1031)
    d = _spread(client, x, 1031, [0, 1, 2])
    assert mr.reduce(d, "add_unless_sentinel", compute=True) == x.sum()
    x[1500] = -7777
    bad = _spread(client, x, 1031, [0, 1, 2])
    with pytest.raises(TimeoutError, match="sentinel element") as err:
        _tasks_during(client, lambda: mr.reduce(bad, "add_unless_sentinel", compute=True))
    assert any("raised on worker" in note for note in getattr(err.value, "__notes__", ()))
    _wait_idle(client)
    with distributed.get_task_stream(client) as stream, pytest.raises(TimeoutError):
        mr.reduce(bad, "add_unless_sentinel", compute=True)
    assert not stream.data  # the graph did not run


def _kept_keys(prefix, dask_worker):
    return [str(k) for k in dask_worker.state.tasks if prefix in str(k)]


def test_a_scan_error_on_a_worker_surfaces_and_leaves_nothing_behind(client):
    """The last chunk's total is never computed, so a sentinel there fails in the scans themselves,
    after the other workers kept their outputs: the error surfaces as it is, the graph does not run,
    and no worker keeps an output the scheduler never heard of."""
    mr.register_operator("add_unless_sentinel", identity=0, cpu=_add_unless_sentinel, commutative=True, kinds="i",
                         replace=True)
    x = np.random.default_rng(7).integers(-1000, 1000, size=6 * 1031)
    good = _spread(client, x, 1031, [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(mr.scan(good, "add_unless_sentinel").persist().compute(), np.cumsum(x))
    x[-3] = -7777
    bad = _spread(client, x, 1031, [0, 1, 2, 0, 1, 2])
    lazy = mr.scan(bad, "add_unless_sentinel")
    _wait_idle(client)
    with distributed.get_task_stream(client) as stream, pytest.raises(TimeoutError, match="sentinel element"):
        lazy.persist()
    assert not stream.data
    prefix = lazy.name.rsplit("-", 1)[0] + "-seeded"
    assert not any(client.run(_kept_keys, prefix).values())


@pytest.mark.parametrize("stat", ["var", "std", "nanvar", "nanmean", "nanmax", "nanmin", "any", "all", "nansum",
                                  "argmax", "argmin", "nanargmax", "nanargmin"])
def test_whole_statistics_of_held_chunks_run_no_task(client, stat):
    rng = np.random.default_rng(len(stat))
    x = (rng.standard_normal(9 * 1000) * 10).astype(np.float32)
    x[rng.integers(0, x.size, 50)] = np.nan if stat.startswith("nan") else 0.0
    d = _spread(client, x, 1000, [0, 1, 1, 2, 0, 0, 2, 1, 2])
    lazy = getattr(mr, stat)(d)
    got, tasks = _tasks_during(client, lazy.compute)
    assert tasks == 0, f"{stat}: {tasks} tasks ran"
    with task_graphs():
        graph_value = client.compute(lazy).result()
    assert np.asarray(got).tobytes() == np.asarray(graph_value).tobytes(), stat
    np.testing.assert_allclose(got, getattr(np, stat)(x.astype(np.float64)), rtol=1e-5)


def test_an_all_nan_held_statistic_warns_on_the_client(client):
    d = _spread(client, np.full(3 * 100, np.nan, dtype=np.float32), 100, [0, 1, 2])
    with pytest.warns(RuntimeWarning, match="All-NaN slice"):
        assert np.isnan(mr.nanmax(d).compute())


@pytest.mark.parametrize("fn", ["sum", "mean", "nansum"])
def test_exact_reductions_of_held_chunks_run_no_task(client, fn):
    rng = np.random.default_rng(21)
    x = rng.standard_normal(9 * 1000) * np.exp2(rng.integers(-40, 40, 9 * 1000))
    x[::97] = np.nan if fn == "nansum" else x[::97]
    d = _spread(client, x, 1000, [2, 1, 0, 0, 1, 2, 2, 0, 1])
    lazy = getattr(mr, fn)(d, exact=True)
    got, tasks = _tasks_during(client, lazy.compute)
    assert tasks == 0
    with task_graphs():
        assert np.asarray(got).tobytes() == np.asarray(client.compute(lazy).result()).tobytes()
    if fn != "nansum":  # nansum has no compute=
        assert np.asarray(getattr(mr, fn)(d, exact=True, compute=True)).tobytes() == np.asarray(got).tobytes()
    assert np.asarray(got).tobytes() == np.asarray(getattr(mr, fn)(x, exact=True)).tobytes()  # same bits as NumPy input


@pytest.mark.parametrize("fn", ["cumsum", "nancumsum"])
def test_exact_scans_of_held_chunks_run_no_task(client, fn):
    """``mr.cumsum(d, exact=True).persist()`` of a persisted array (round-robin owners, an empty chunk):
    the held direct path (no task), the same bits as the graph's scan and as NumPy input's, and the graph
    has the scans' depth (per-worker totals, one carries stage), not a chain of carries through every chunk."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal(9 * 1000) * np.exp2(rng.integers(-40, 40, 9 * 1000))
    x[::97] = np.nan if fn == "nancumsum" else x[::97]
    d = _spread(client, x, 1000, [2, 1, 0, 0, 1, 2, 2, 0, 1])
    want = getattr(mr, fn)(x, exact=True)
    held, tasks = _tasks_during(client, lambda: getattr(mr, fn)(d, exact=True).persist())
    assert tasks == 0
    assert held.compute().tobytes() == want.tobytes()
    lazy = getattr(mr, fn)(d, exact=True)
    assert client.compute(lazy).result().tobytes() == want.tobytes()
    label = "exact-nancumsum" if fn == "nancumsum" else "exact-cumsum"
    keys = [k for k in dict(lazy.dask) if isinstance(k, tuple)]
    totals = [k for k in keys if k[0].startswith(f"{label}-totals")]
    assert 1 <= len(totals) <= 3 < d.npartitions, keys  # one per worker holding chunks 0..n-2, not one per chunk
    assert not any(k[0].startswith(("_add_lanes", "_lane_states")) for k in keys)  # no carry chain
    assert len([k for k in keys if k[0].startswith(f"{label}-carries")]) == 1  # made once, not in every scan task
    ragged = client.persist(da.from_array(x, chunks=((3000, 0, 2500, 1, 3499),)))
    assert getattr(mr, fn)(ragged, exact=True).compute().tobytes() == want.tobytes()


def test_held_argmax_of_a_2d_array_knows_each_chunks_place(client):
    rng = np.random.default_rng(30)
    x = rng.integers(0, 50, size=(60, 45)).astype(np.float64)  # many ties: the first occurrence must win
    d = client.persist(da.from_array(x, chunks=(13, 10)))
    distributed.wait(d)
    for fn in ("argmax", "argmin"):
        lazy = getattr(mr, fn)(d)
        got, tasks = _tasks_during(client, lazy.compute)
        with task_graphs():
            assert tasks == 0 and got == getattr(np, fn)(x) == client.compute(lazy).result(), fn


@pytest.mark.slow  # a benchmark run end to end: CI runs it in its second step
def test_profile_held_runs_on_the_cpu(capsys):
    """python -m benchmarks multigpu --profile held --cpu: a real LocalCluster (loopback); the direct scan
    shows no task."""
    from benchmarks import multigpu

    tables = multigpu.main(["--cpu", "--profile", "held", "--repeats", "1"])
    results = {row[0]: row for row in tables["results"]}
    assert results["mr.cumsum(x).persist()"][3] == "0" and results["client.persist(mr.cumsum(x))"][3] != "0"
    assert "| mr.cumsum(x).persist() |" in capsys.readouterr().out


def test_persisting_the_same_scan_again_never_loses_chunks(client):
    """Every direct scan gets fresh keys: with shared keys, a dropped earlier result's release could
    reach the scheduler after the next one's registration and forget its chunks (4 of 10 calls)."""
    x = np.arange(100.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    names = set()
    for _ in range(10):
        y = mr.cumsum(d).persist()
        names.add(y.name)
        assert float(y[-1].compute()) == 4950.0
        del y
    assert len(names) == 10


def test_dropping_kept_outputs_skips_workers_that_left(client):
    """A scan abandoned because a worker left drops what the others kept without naming the dead
    address (a run to it would wait the scheduler's 30 s connect timeout)."""
    live = sorted(client.scheduler_info()["workers"])
    key = ("kept-by-a-failed-scan", 0)
    client.run(lambda dask_worker: dask_worker.update_data(data={key: np.ones(3)}), workers=[live[0]])
    t0 = time.monotonic()
    direct._drop_kept_on_live(client, ["tcp://127.0.0.1:9", live[0]], [key])
    assert time.monotonic() - t0 < 20  # not the 30 s connect timeout
    assert not client.run(_kept_keys, "kept-by-a-failed-scan")[live[0]]


class _TwoArgumentError(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def test_an_error_that_cannot_round_trip_comes_back_as_its_type_and_text():
    import pickle

    try:
        raise _TwoArgumentError(1, 2)
    except _TwoArgumentError as error:
        failed = direct._Failed(error, "tcp://worker")
    back = pickle.loads(pickle.dumps(failed)).error  # as client.run hands it over
    assert "_TwoArgumentError: 1 2" in str(back) and any("raised on worker" in n for n in back.__notes__)
    try:
        raise TimeoutError("an operator's own")
    except TimeoutError as error:
        failed = direct._Failed(error, "tcp://worker")
    back = pickle.loads(pickle.dumps(failed)).error
    assert type(back) is TimeoutError  # errors that pickle keep their type


def _forget_data(key, dask_worker):
    from distributed.worker_state_machine import RemoveReplicasEvent

    # what the Active Memory Manager's ReduceReplicas has a worker do with a surplus replica
    dask_worker.handle_stimulus(RemoveReplicasEvent(keys=[key], stimulus_id="test-reduce-replicas"))


def test_a_replica_gone_before_the_scan_falls_back_to_the_graph(client, monkeypatch):
    """Between the totals run and the scans, an input chunk leaves the worker chosen to scan it (the
    Active Memory Manager drops extra replicas): the direct scan falls back to the graph, right and
    with nothing left behind, instead of raising the worker's KeyError."""
    x = np.arange(60.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2])
    client.replicate(distributed.futures_of(d), n=3)
    real_run = direct._run

    def drop_then_run(c, workers, fn, *args, **kwargs):
        if fn is direct.scan_and_keep:
            work = args[1]
            worker = sorted(work)[0]
            c.run(_forget_data, work[worker][0][0], workers=[worker])
        return real_run(c, workers, fn, *args, **kwargs)

    monkeypatch.setattr(direct, "_run", drop_then_run)
    out = mr.cumsum(d).persist()
    monkeypatch.undo()
    assert "seeded" not in out.name  # the graph ran
    np.testing.assert_array_equal(out.compute(), np.cumsum(x))
    assert not any(client.run(_kept_keys, "cumsum-seeded").values())


class _SchedulerWith:
    """``client.scheduler`` with its ``update_data`` replaced (everything else is the real one's)."""

    def __init__(self, real, update_data):
        self._real, self.update_data = real, update_data

    def __getattr__(self, name):
        return getattr(self._real, name)


def _registered(prefix, dask_scheduler):
    return [str(k) for k in dask_scheduler.tasks if prefix in str(k)]


def _nothing_left(client, prefix: str, timeout: float = 10.0) -> bool:
    """No key named ``prefix``-something on the scheduler nor on any worker (workers free theirs when told,
    a moment later)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_registered, prefix) or any(client.run(_kept_keys, prefix).values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_gone_before_registration_falls_back_to_the_graph(client, monkeypatch):
    """The workers kept their outputs, but one of them left before the client registered them: the
    scheduler refuses its address (KeyError) after registering the keys before it. The graph runs
    instead, and nothing registered in part or kept stays behind."""
    x = np.arange(60.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2])
    real = client.scheduler

    async def with_a_departed_worker(*, who_has, nbytes, client):
        last = sorted(who_has, key=str)[-1]
        return await real.update_data(who_has={**who_has, last: ["tcp://127.0.0.1:9"]}, nbytes=nbytes, client=client)

    monkeypatch.setattr(client, "scheduler", _SchedulerWith(real, with_a_departed_worker))
    out = mr.cumsum(d).persist()
    monkeypatch.undo()
    assert "seeded" not in out.name  # the graph ran
    np.testing.assert_array_equal(out.compute(), np.cumsum(x))
    assert _nothing_left(client, "cumsum-seeded")


def test_an_unexpected_registration_error_surfaces(client, monkeypatch):
    """Only a departed worker or a comm failure falls back to the graph: any other error while registering
    the outputs is raised (a defect is never recomputed around), and nothing kept stays behind."""
    d = _spread(client, np.arange(60.0), 10, [0, 1, 2, 0, 1, 2])

    async def broken(**kwargs):
        raise RuntimeError("a defect in the registration")

    monkeypatch.setattr(client, "scheduler", _SchedulerWith(client.scheduler, broken))
    lazy = mr.cumsum(d)
    with pytest.raises(RuntimeError, match="a defect in the registration"):
        lazy.persist()
    monkeypatch.undo()
    assert _nothing_left(client, "cumsum-seeded")


def _failing_broadcast(*args, **kwargs):
    raise AssertionError("the scheduler's broadcast was used")


def test_workers_are_called_without_the_scheduler(client, monkeypatch):
    """The client calls the workers holding the chunks itself (one round trip instead of two): with the
    scheduler's broadcast broken, the eager sum, the held sum and the held scan still run, no task."""
    x = np.arange(1, 6001, dtype=np.int64)
    d = _spread(client, x, 1000, [0, 1, 2, 0, 1, 2])
    monkeypatch.setattr(client, "_run", _failing_broadcast)
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0
    got, tasks = _tasks_during(client, mr.sum(d).compute)
    assert got == x.sum() and tasks == 0
    out = mr.cumsum(d).persist()
    assert "seeded" in out.name  # the direct scan, both of its runs without the broadcast
    np.testing.assert_array_equal(out.compute(), np.cumsum(x))


def test_direct_calls_can_be_turned_off(client, monkeypatch):
    d = _spread(client, np.arange(60.0), 10, [0, 1, 2, 0, 1, 2])
    assert mr.sum(d, compute=True) == 1770.0
    monkeypatch.setattr(direct, "_call_one", _failing_broadcast)
    with dask.config.set({"multireduce.direct-to-workers": False}):
        assert mr.sum(d, compute=True) == 1770.0


def _calls_to(monkeypatch) -> list:
    """The workers each run of ``values_of_held`` is sent to, in order."""
    sent, real_run = [], direct._run

    def recording(c, workers, fn, *args, **kwargs):
        if fn is direct.values_of_held:
            sent.append(sorted(workers))
        return real_run(c, workers, fn, *args, **kwargs)

    monkeypatch.setattr(direct, "_run", recording)
    return sent


def test_only_the_workers_holding_the_chunks_are_called(client, monkeypatch):
    """Two of three workers hold the chunks: the third is never called; each chunk is computed once,
    also where it has a copy on another worker."""
    from multireduce import placement

    x = np.arange(1, 6001, dtype=np.int64)
    d = _spread(client, x, 1000, [0, 1, 0, 1, 0, 1])
    everyone = sorted(client.scheduler_info()["workers"])
    sent = _calls_to(monkeypatch)
    assert mr.sum(d, compute=True) == x.sum() and mr.sum(d).compute() == x.sum()
    assert sent == [everyone[:2], everyone[:2]]
    client.replicate(distributed.futures_of(d), n=3)
    sent.clear()
    with dask.config.set({"multireduce.placement-reuse": 0}):  # where the chunks are now
        got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0 and sent == [everyone[:1]]  # each chunk once, from one copy
    assert set(placement.recently_seen(d, client).values()) == {everyone[0]}


def test_a_placement_gone_stale_is_looked_up_and_run_again(client, monkeypatch):
    """Where the chunks were seen last no longer holds them all (as if they had moved): the first run
    misses chunks, the placement is looked up and the run made once more, still without the graph."""
    from multireduce import placement

    x = np.arange(1.0, 61.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2])
    everyone = sorted(client.scheduler_info()["workers"])
    placement.remember(d, {k: everyone[0] for k in placement.chunk_keys(d)}, client)
    sent = _calls_to(monkeypatch)
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0
    assert sent == [everyone[:1], everyone]
    assert placement.recently_seen(d, client) == placement.holders(d, client)
    assert client not in direct._direct_unreachable


def test_a_remembered_worker_that_is_gone_costs_one_lookup_not_a_timeout(client, monkeypatch):
    from multireduce import placement

    x = np.arange(1.0, 61.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2])
    everyone = sorted(client.scheduler_info()["workers"])
    gone = "tcp://127.0.0.1:9" if everyone[0].startswith("tcp") else everyone[0].rsplit("/", 1)[0] + "/999999"
    keys = placement.chunk_keys(d)
    placement.remember(d, {**placement.holders(d, client), keys[0]: gone}, client)
    sent = _calls_to(monkeypatch)
    t0 = time.monotonic()
    got, tasks = _tasks_during(client, lambda: mr.sum(d, compute=True))
    assert got == x.sum() and tasks == 0 and time.monotonic() - t0 < 20
    assert sent == [sorted([*everyone, gone]), everyone]  # the direct call given up, not sent through the scheduler
    assert client not in direct._direct_unreachable  # the address is gone, not unreachable


def test_workers_the_client_cannot_reach_are_asked_through_the_scheduler_from_then_on(client, monkeypatch):
    """A client outside the workers' network (it reaches only the scheduler): the first direct call fails,
    the broadcast answers, and later runs go through the scheduler without trying again."""
    from multireduce import placement

    d = _spread(client, np.arange(60.0), 10, [0, 1, 2, 0, 1, 2])
    assert mr.sum(d, compute=True) == 1770.0
    tries = []

    async def unreachable(c, worker, *args):
        tries.append(worker)
        raise OSError("no route to host")

    monkeypatch.setattr(direct, "_call_one", unreachable)
    monkeypatch.setattr(direct, "_direct_unreachable", direct.weakref.WeakSet())
    assert mr.sum(d, compute=True) == 1770.0
    # Each worker tried once, at once, and only holders of chunks; under load the scheduler may have copied
    # chunks elsewhere, so the tried set is checked against every copy rather than one holder per chunk.
    who = placement.who_holds(d, client)
    first_tries = list(tries)
    assert len(first_tries) == len(set(first_tries)) and client in direct._direct_unreachable
    assert set(first_tries) <= {w for holders in who.values() for w in holders}
    assert all(set(holders) & set(first_tries) for holders in who.values())
    assert mr.sum(d, compute=True) == 1770.0 and mr.cumsum(d).persist().compute()[-1] == 1770.0
    assert tries == first_tries  # not tried again


def _no_who_has(*args, **kwargs):
    raise AssertionError("placement was looked up")


def test_a_direct_run_spares_the_next_result_its_placement_lookup(client, monkeypatch):
    """A direct run learns where every chunk is; a result made over the same array within
    ``multireduce.placement-reuse`` takes its grouping from there instead of asking the scheduler."""
    from multireduce import placement

    x = np.arange(1, 6001, dtype=np.int64)
    d = _spread(client, x, 1000, [0, 1, 2, 0, 1, 2])
    assert mr.sum(d, compute=True) == x.sum()
    fresh = placement.holders(d, client)
    assert placement.recently_seen(d, client) == fresh
    monkeypatch.setattr(client, "who_has", _no_who_has)
    held = mr.sum(d)
    assert held.compute() == x.sum()
    with task_graphs():
        assert client.compute(held).result() == x.sum()  # the graph, grouped as the scheduler would have told
    with dask.config.set({"multireduce.placement-reuse": 0}), pytest.raises(AssertionError, match="looked up"):
        mr.sum(d)


def test_a_placement_seen_before_a_move_costs_locality_not_correctness(client):
    """The chunks moved since they were seen: the graph built from the old placement runs its tasks where
    the chunks were, Dask moves what they need, and the value is the same."""
    from multireduce import placement

    x = np.arange(1.0, 61.0)
    d = _spread(client, x, 10, [0, 1, 2, 0, 1, 2])
    keys = placement.chunk_keys(d)
    first = sorted(client.scheduler_info()["workers"])[0]
    placement.remember(d, {k: first for k in keys}, client)  # as if every chunk had been on one worker
    stale = mr.sum(d)
    with dask.config.set({"multireduce.placement-reuse": 0}):
        assert mr.sum(d).name != stale.name  # the looked-up placement groups differently, under another name
    with task_graphs():
        assert client.compute(stale).result() == x.sum() and stale.compute() == x.sum()
    np.testing.assert_array_equal(client.persist(mr.cumsum(d)).compute(), np.cumsum(x))


def test_partials_travel_as_columns_and_come_back_equal():
    import pickle

    from multireduce.core import Partial

    rng = np.random.default_rng(12)
    found = {("x", i): Partial(rng.random((1, 3)).astype(np.float32), 1000 + i) for i in range(37)}
    columns = direct._PartialColumns.of(list(found), list(found.values()))
    packed = pickle.loads(pickle.dumps(direct._Packed(columns)))  # as the reply travels
    back = packed.unpack()
    assert list(back) == list(found)
    for k, p in found.items():
        assert back[k].value.dtype == p.value.dtype and np.array_equal(back[k].value, p.value)
        assert back[k].value.shape == p.value.shape and type(back[k].count) is int and back[k].count == p.count
    zero_d = {("y", i): Partial(np.array(i + 0.5, dtype=np.float64), 3) for i in range(5)}
    back = direct._Packed(direct._PartialColumns.of(list(zero_d), list(zero_d.values()))).unpack()
    assert all(type(back[k].value) is np.ndarray and back[k].value.shape == () for k in zero_d)  # not NumPy scalars
    # anything else travels as it is: mixed shapes, NumPy counts, other values
    for other in ({**found, ("x", 99): Partial(np.ones((1, 4), np.float32), 1)},
                  {("x", 0): Partial(np.ones(1), np.int64(3))}, {("x", 0): 5}, {}):
        assert direct._PartialColumns.of(list(other), list(other.values())) is None
        again = direct._Packed(other).unpack()
        assert list(again) == list(other) and all(type(again[k]) is type(v) for k, v in other.items())


def test_statistic_partials_travel_as_columns_and_come_back_equal():
    import pickle

    rng = np.random.default_rng(13)
    found = {("x", i): (rng.random((1, 3)).astype(np.float32), np.arange(3, dtype=np.int64)[None] + i,
                        np.array(i % 2 == 0)) for i in range(41)}
    columns = direct._TupleColumns.of(list(found), list(found.values()))
    assert columns is not None and [m.shape for m in columns.members] == [(41, 1, 3), (41, 1, 3), (41,)]
    back = pickle.loads(pickle.dumps(direct._Packed(columns))).unpack()
    assert list(back) == list(found)
    for k, p in found.items():
        assert len(back[k]) == 3 and all(type(a) is np.ndarray for a in back[k])  # 0-d arrays, not scalars
        assert all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) for a, b in zip(back[k], p))
    # tuples of other forms travel as they are
    for other in ({**found, ("x", 99): (np.ones((1, 3), np.float32),)}, {("x", 0): (np.ones(2), 3)},
                  {("x", 0): (np.ones(2),), ("x", 1): (np.ones(2, np.float32),)}, {("x", 0): None}):
        assert direct._TupleColumns.of(list(other), list(other.values())) is None


def _large_reply(seed: int):
    from multireduce.core import Partial

    big = np.random.default_rng(seed).random((721, 1440))  # a float64 total per worker: 8.3 MB
    return direct._Packed(({0: Partial(big, 7), 1: Partial(np.arange(3.0), 2)}, (5, -60)))


@pytest.mark.parametrize("to_workers", [True, False])
def test_large_partials_travel_outside_the_pickle_and_arrive_equal_and_writable(client, to_workers):
    import pickle

    packed = _large_reply(3)
    assert len(packed.buffers) == 1 and len(packed.data) < 1 << 12  # the 8.3 MB array is not in the pickle
    want = _large_reply(3).unpack()
    for protocol in (4, 5):  # stdlib pickle under either protocol gives the same values, writable
        back = pickle.loads(pickle.dumps(packed, protocol=protocol)).unpack()
        assert np.array_equal(back[0][0].value, want[0][0].value) and back[1] == (5, -60)
        assert back[0][0].value.flags.writeable
        again = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(packed, protocol=5)), protocol=protocol))
        assert np.array_equal(again.unpack()[0][0].value, want[0][0].value)  # what arrived travels on
    columns = np.asfortranarray(want[0][0].value)
    back = pickle.loads(pickle.dumps(direct._Packed({"f": columns}), protocol=4)).unpack()["f"]
    assert np.array_equal(back, columns) and back.flags.writeable
    workers = sorted(client.scheduler_info()["workers"])
    with dask.config.set({"multireduce.direct-to-workers": to_workers}):
        replies = direct._run(client, workers, _large_reply, 3)
    assert sorted(replies) == workers
    for (partials, bounds) in replies.values():
        value = partials[0].value
        assert np.array_equal(value, want[0][0].value) and partials[0].count == 7 and bounds == (5, -60)
        assert np.array_equal(partials[1].value, np.arange(3.0)) and value.flags.writeable
        value += 1.0  # the fold may add into what arrived


@pytest.mark.parametrize("name", ["multireduce.placement-reuse", "multireduce.direct-connect-timeout",
                                  "multireduce.direct-check-interval"])
@pytest.mark.parametrize("value", [True, "abc", -1, float("inf"), [1]])
def test_bad_duration_settings_name_the_setting(client, name, value):
    d = _spread(client, np.arange(60.0), 10, [0, 1, 2, 0, 1, 2])
    assert mr.sum(d, compute=True) == 1770.0
    with dask.config.set({name: value}), pytest.raises(ValueError, match=f"dask.config '{name}': expected"):
        mr.sum(d, compute=True)
        mr.sum(d).compute()
