"""A held scan (``mr.cumsum(x).persist()`` over persisted chunks: no task runs) keeps its lineage: when a
worker holding some of its outputs is killed, the scheduler makes those chunks again from their inputs
(held on other workers, or recomputed first where they were lost too), with the same bits, for plain
arrays, expressions over them and a scan along an axis of a 2-D array."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct  # noqa: E402
from multireduce.cluster import local_cluster  # noqa: E402

from .helpers import kill_worker, persist_spread, workers_of  # noqa: E402

N_WORKERS = 4


@pytest.fixture(scope="module")
def cluster():
    # no Active Memory Manager: the copies of inputs a test makes must stay where it put them
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}), \
            local_cluster(n_workers=N_WORKERS, gpu=False, threads_per_worker=1, processes=True) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with distributed.Client(cluster) as client:
        client.wait_for_workers(N_WORKERS, timeout=60)
        yield client


def _recipes_of(keys: list, dask_scheduler=None) -> dict:
    """Output key -> (state, whether it has a run_spec, its dependencies' keys), as the scheduler has it."""
    out = {}
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        out[k] = None if ts is None else (ts.state, ts.run_spec is not None, sorted(map(str, (d.key for d in ts.dependencies))))
    return out


def _held_scans(client, arrays: dict) -> dict:
    """{label: held scan of arrays[label]}, made with no task run, and every output chunk known to the
    scheduler with its recipe (a run_spec reading its inputs) and still in memory where it was made."""
    with distributed.get_task_stream(client) as stream:
        outs = {label: fn().persist() for label, fn in arrays.items()}
        keys = [f.key for out in outs.values() for f in distributed.futures_of(out)]
        deadline = time.monotonic() + 20
        while True:  # the recipes reach the scheduler after the call returns
            seen = client.run_on_scheduler(_recipes_of, keys)
            if all(v is not None and v[1] for v in seen.values()):
                break
            assert time.monotonic() < deadline, {k: v for k, v in seen.items() if v is None or not v[1]}
            time.sleep(0.05)
    # the held path, and nothing recomputed (where the graph ran, why the held path declined)
    assert not stream.data, ([t["key"] for t in stream.data], direct.last_decline)
    assert all(state == "memory" and deps for state, _, deps in seen.values()), seen
    return outs


def _chunks(client, out) -> list:
    """Every output chunk, fetched to the client one by one (no copy lands on another worker)."""
    return client.gather(distributed.futures_of(out), errors="raise")


def _cumsum_bound(x: np.ndarray, axis: int) -> np.ndarray:
    # float64 scans: a blocked scan's roundings, far under the values' own scale
    return 1e-12 * np.cumsum(np.abs(x), axis=axis) + 1e-300


@pytest.mark.slow
def test_outputs_lost_with_their_worker_come_back_from_held_inputs(client):
    """Inputs spread over the workers (uneven, interleaved, an odd last chunk) and copied off the victim
    before it dies, so only outputs are lost: int64 exactly, float64 within rounding and with the bits it
    had, and an expression over the input (its chunks made again from the held input)."""
    rng = np.random.default_rng(41)
    chunk, owners = 1009, [1, 0, 1, 2, 3, 1, 1, 0, 2]
    n = chunk * len(owners) - 17
    xi = rng.integers(-(1 << 40), 1 << 40, size=n, dtype=np.int64)
    xf = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    di, workers = persist_spread(client, xi, chunk, owners)
    df, _ = persist_spread(client, xf, chunk, owners)
    outs = _held_scans(client, {"int": lambda: mr.cumsum(di), "float": lambda: mr.cumsum(df),
                                "expr": lambda: mr.cumsum(di * 2 - 5)})
    before = {label: _chunks(client, out) for label, out in outs.items()}
    victim = workers[1]
    where = client.who_has(distributed.futures_of(outs["int"]))
    assert sum(victim in w for w in where.values()) == owners.count(1)  # outputs made where their inputs are
    # the victim's inputs live on, elsewhere: what it loses is outputs only
    held = distributed.futures_of(di) + distributed.futures_of(df)
    who = client.who_has(held)
    client.replicate([f for f in held if victim in who[f.key]], n=1, workers=[w for w in workers if w != victim])
    kill_worker(client, victim)
    after = {label: _chunks(client, out) for label, out in outs.items()}
    np.testing.assert_array_equal(np.concatenate(after["int"]), np.cumsum(xi))
    np.testing.assert_array_equal(np.concatenate(after["expr"]), np.cumsum(xi * 2 - 5))
    got = np.concatenate(after["float"])
    assert got.dtype == np.float64 and np.all(np.abs(got - np.cumsum(xf)) <= _cumsum_bound(xf, 0))
    for label in outs:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(before[label], after[label])), label


def _plus_one(block):
    return block + 1


@pytest.mark.slow
def test_inputs_lost_too_are_recomputed_first(client):
    """Inputs made by map_blocks from from_array (they have lineage): the victim takes inputs and outputs
    with it; the scheduler makes the inputs again, then the outputs. A 2-D array scanned along each axis
    (int64 exactly) and a 1-D float64 array."""
    rng = np.random.default_rng(43)
    a = rng.integers(-(1 << 40), 1 << 40, size=(97, 61), dtype=np.int64)
    v = rng.standard_normal(9001)
    xa = client.persist(da.from_array(a, chunks=(23, 17)).map_blocks(_plus_one))
    xv = client.persist(da.from_array(v, chunks=1000).map_blocks(_plus_one))
    distributed.wait([xa, xv])
    outs = _held_scans(client, {"axis 0": lambda: mr.cumsum(xa, axis=0), "axis 1": lambda: mr.cumsum(xa, axis=1),
                                "float": lambda: mr.cumsum(xv)})
    before = {label: _chunks(client, out) for label, out in outs.items()}
    inputs = client.who_has(distributed.futures_of(xa))
    victim = max(sorted(client.scheduler_info()["workers"]), key=lambda w: sum(w in h for h in inputs.values()))
    assert any(victim in h for h in client.who_has(distributed.futures_of(outs["axis 1"])).values())
    kill_worker(client, victim)
    for label, axis in (("axis 0", 0), ("axis 1", 1)):
        np.testing.assert_array_equal(outs[label].compute(), np.cumsum(a + 1, axis=axis), err_msg=label)
    got = outs["float"].compute()
    assert np.all(np.abs(got - np.cumsum(v + 1)) <= _cumsum_bound(v + 1, 0))
    for label, out in outs.items():
        assert all(b.tobytes() == c.tobytes() for b, c in zip(before[label], _chunks(client, out))), label


@pytest.mark.slow
def test_outputs_of_inputs_without_lineage_raise_a_clear_error(client):
    """Inputs made from scattered data (no lineage, as Dask's own): lost with their worker, they take the
    outputs read from them along, which raise FutureCancelledError (never a wrong chunk, never a hang), as
    the graph's would; the outputs of the other workers' inputs stay readable."""
    rng = np.random.default_rng(47)
    blocks = [rng.integers(-(1 << 40), 1 << 40, size=1000 + i, dtype=np.int64) for i in range(6)]
    workers = workers_of(client, 2)
    scattered = [client.scatter(b, workers=[workers[i % 2]]) for i, b in enumerate(blocks)]
    lazy = da.concatenate([da.from_delayed(f, b.shape, b.dtype) for f, b in zip(scattered, blocks)])
    x = client.persist(lazy)
    distributed.wait(x)
    (out,) = _held_scans(client, {"int": lambda: mr.cumsum(x)}).values()
    where = client.who_has(distributed.futures_of(out))
    keys = [f.key for f in distributed.futures_of(out)]
    assert [list(where[k]) for k in keys] == [[workers[i % 2]] for i in range(6)]  # made where their inputs are
    kill_worker(client, workers[1])
    futures = distributed.futures_of(out)
    want = np.cumsum(np.concatenate(blocks))
    for i, future in enumerate(futures):
        if i % 2:
            with pytest.raises(distributed.client.FutureCancelledError):
                future.result(timeout=30)
        else:
            start = sum(len(b) for b in blocks[:i])
            np.testing.assert_array_equal(future.result(timeout=30), want[start:start + len(blocks[i])])
