"""A worker that stops answering (SIGSTOP here: a swapping machine or a partitioned node looks the same)
while held results are computed, on a real CPU cluster of worker processes. It stays in the scheduler's
list for minutes (``distributed.scheduler.worker-ttl``), and a pooled connection to it takes a message
and never replies. A worker holding none of the chunks must not hold the held paths up at all; one
holding chunks that no other worker has is named in an error within seconds; a worker merely busy
with its chunks for longer than the connect timeout is waited for."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

import dask
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import direct, placement  # noqa: E402
from multireduce.cluster import local_cluster  # noqa: E402

from .helpers import persist_spread  # noqa: E402
from .test_direct_hostile import _pool_is_whole  # noqa: E402

pytestmark = pytest.mark.timeout(60)  # a regression hangs: fail the test, not the run

# quick settings, so a stall is found within about 1.1 s
QUICK = {"multireduce.direct-connect-timeout": "1s", "multireduce.direct-check-interval": "100ms"}
SLOW = 4242.5  # a chunk holding this value sleeps in the operator (in the worker's thread, not its event loop)
STOP = 10**15  # a chunk holding this value (sums of the other elements stay far below it) stops its worker, once


@pytest.fixture(scope="module")
def cluster():
    mark = Path(tempfile.mkdtemp(prefix="multireduce-stall-"))
    os.environ["MR_TEST_STOP_MARK"] = str(mark / "stopped")  # the worker processes inherit it
    os.environ["MR_TEST_PID"] = str(os.getpid())
    try:
        with local_cluster(n_workers=4, gpu=False, processes=True) as cluster:
            yield cluster
    finally:
        os.environ.pop("MR_TEST_STOP_MARK", None)
        os.environ.pop("MR_TEST_PID", None)


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster) as client:
        yield client


def _pid(client, worker: str) -> int:
    return client.run(os.getpid, workers=[worker])[worker]


@contextlib.contextmanager
def _stopped(client, worker: str):
    pid = _pid(client, worker)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
    _answers_again(client, worker)


def _answers_again(client, worker: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.run(os.getpid, workers=[worker])
            return
        except Exception:  # noqa: BLE001 - not yet
            assert time.monotonic() < deadline, f"{worker} did not come back"
            time.sleep(0.1)


def _timed(fn):
    t0 = time.monotonic()
    value = fn()
    return value, time.monotonic() - t0


def _data(seed: int, n: int = 6 * 997) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n) * 1000


@pytest.mark.slow
@pytest.mark.parametrize("direct_to_workers", [None, False])
def test_a_stalled_worker_holding_nothing_holds_nothing_up(client, direct_to_workers):
    """Worker 3 holds none of the chunks and is stopped: the held sum (both entry points) and the held
    scan answer at once, right, whether the client calls the workers itself or through the scheduler."""
    x = _data(1)
    d, workers = persist_spread(client, x, 997, [0, 1, 2, 2, 1, 0])
    assert np.isclose(mr.sum(d, compute=True), x.sum())  # every connection the direct calls use is open
    with dask.config.set({"multireduce.direct-to-workers": direct_to_workers}), _stopped(client, workers[3]):
        got, seconds = _timed(lambda: mr.sum(d, compute=True))
        assert np.isclose(got, x.sum(), rtol=1e-12) and seconds < 20, seconds
        got, seconds = _timed(lambda: mr.sum(d).compute())
        assert np.isclose(got, x.sum(), rtol=1e-12) and seconds < 20, seconds
        out, seconds = _timed(lambda: mr.cumsum(d).persist())
        assert "seeded" in out.name and seconds < 20, seconds  # the direct scan: both runs
        np.testing.assert_allclose(out.compute(), np.cumsum(x), rtol=1e-9, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("direct_to_workers", [None, False])
@pytest.mark.parametrize("how", ["compute=True", ".compute()", "scan .persist()"])
def test_a_stalled_worker_holding_chunks_is_named_within_seconds(client, how, direct_to_workers):
    """Worker 1 holds two of the six chunks, no other worker has them, and it is stopped: the held
    paths raise ``WorkerStalled`` naming it, its chunks and the setting, within about the connect
    timeout; once it answers again the same calls are right."""
    x = _data(2)
    d, workers = persist_spread(client, x, 997, [0, 1, 2, 0, 1, 2])
    call = {"compute=True": lambda: mr.sum(d, compute=True), ".compute()": lambda: mr.sum(d).compute(),
            "scan .persist()": lambda: mr.cumsum(d).persist()}[how]
    assert np.isclose(mr.sum(d, compute=True), x.sum())  # the client's pooled connection to worker 1 is open
    with dask.config.set({**QUICK, "multireduce.direct-to-workers": direct_to_workers}):
        with _stopped(client, workers[1]):
            t0 = time.monotonic()
            with pytest.raises(direct.WorkerStalled) as err:
                call()
            seconds = time.monotonic() - t0
        message = str(err.value)
        assert seconds < 20, seconds
        assert _pool_is_whole(client), repr(client.rpc)  # the abandoned call gave its connection back
        assert f"worker {workers[1]} (2 of the 6 chunks) of {d.name!r} did not answer within 1 s" in message
        assert "'multireduce.direct-connect-timeout'" in message and isinstance(err.value, TimeoutError)
        got = call()
    want = np.cumsum(x) if how.startswith("scan") else x.sum()
    np.testing.assert_allclose(got.compute() if how.startswith("scan") else got, want, rtol=1e-9, atol=1e-6)


@pytest.mark.slow
def test_a_stalled_worker_without_a_connection_yet_is_named_too(client):
    """No pooled connection to the stopped worker (which answered a run before: a worker never called
    is given distributed's connect timeout, as it may be importing multireduce): the client's direct
    connect times out, the run goes through the scheduler, whose broadcast is probed from the scheduler:
    still an error naming it, within a few connect timeouts."""
    x = _data(3)
    d, workers = persist_spread(client, x, 997, [3, 3, 3, 0, 0, 0])
    with dask.config.set(QUICK):
        assert mr.sum(d, compute=True) == pytest.approx(x.sum())
        placement.remember(d, placement.holders(d, client), client)
        with _stopped(client, workers[3]):
            client.rpc.remove(workers[3])  # as if the client had never called it
            t0 = time.monotonic()
            with pytest.raises(direct.WorkerStalled, match=f"worker {workers[3]} \\(3 of the 6 chunks\\)"):
                mr.sum(d, compute=True)
            assert time.monotonic() - t0 < 20
        assert client not in direct._direct_unreachable  # the client reaches its workers; that one was stopped


@pytest.mark.slow
def test_a_chunk_with_a_copy_elsewhere_is_taken_from_the_copy(client):
    """Every chunk has a copy on two workers; the one the placement chose is stopped: the sum is taken
    from the other copies, right, in about the connect timeout."""
    x = _data(4)
    d, workers = persist_spread(client, x, 997, [0, 0, 0, 1, 1, 1])
    client.amm.stop()  # it would drop the copies nothing needs
    try:
        client.replicate(distributed.futures_of(d), n=2)
        assert all(len(w) == 2 for w in client.who_has(distributed.futures_of(d)).values())
        with dask.config.set({**QUICK, "multireduce.placement-reuse": 0}):
            assert np.isclose(mr.sum(d, compute=True), x.sum())
            chosen = sorted(set(placement.holders(d, client).values()))
            with _stopped(client, chosen[0]):
                got, seconds = _timed(lambda: mr.sum(d, compute=True))
    finally:
        client.amm.start()
    assert np.isclose(got, x.sum(), rtol=1e-12) and seconds < 20, seconds


def _slow_add(a, b):
    if (np.asarray(a) == SLOW).any() or (np.asarray(b) == SLOW).any():
        time.sleep(3.0)
    return np.add(a, b)


def _stop_once_add(a, b):
    in_a_worker = os.environ.get("MR_TEST_PID") not in (None, str(os.getpid()))  # registering runs it here too
    if in_a_worker and ((np.asarray(a) >= STOP).any() or (np.asarray(b) >= STOP).any()):
        mark = Path(os.environ["MR_TEST_STOP_MARK"])
        if not mark.exists():
            mark.touch()
            os.kill(os.getpid(), signal.SIGSTOP)  # the test continues this process
    return np.add(a, b)


@pytest.fixture
def operators():
    slow = mr.register_operator("stall_test_slow_add", identity=0.0, cpu=_slow_add, commutative=True, kinds="fi",
                                replace=True)
    stop = mr.register_operator("stall_test_stop_once_add", identity=0, cpu=_stop_once_add, commutative=True,
                                kinds="i", replace=True)
    yield slow, stop
    mr.unregister_operator("stall_test_slow_add")
    mr.unregister_operator("stall_test_stop_once_add")


@pytest.mark.slow
def test_a_worker_busy_past_the_connect_timeout_is_waited_for(client, operators):
    """A chunk takes 3 s in the operator, the connect timeout is 1 s: the worker answers every probe
    meanwhile (the work runs in a thread, its event loop is free), so the sum and the scan wait for it
    and are right. The operator's module is first imported on the workers here, by this call."""
    slow, _ = operators
    x = np.round(_data(5))
    x[1500] = SLOW
    d, _ = persist_spread(client, x, 997, [0, 1, 2, 0, 1, 2])
    with dask.config.set({"multireduce.direct-connect-timeout": "1s", "multireduce.direct-check-interval": "50ms"}):
        got, seconds = _timed(lambda: mr.reduce(d, slow, compute=True))
        assert got == x.sum() and seconds >= 3
        out = mr.scan(d, slow).persist()
    assert "seeded" in out.name
    np.testing.assert_array_equal(out.compute(), np.cumsum(x))


def _kept_keys(prefix, dask_worker):
    return [str(k) for k in dask_worker.state.tasks if prefix in str(k)]


@pytest.mark.slow
def test_a_worker_stalled_in_the_scans_leaves_nothing_behind(client, operators, cluster):
    """The last chunk's worker stops itself while scanning it (the second run), after the other workers
    kept their outputs: the scan raises ``WorkerStalled`` naming it; the others' outputs are dropped at
    once, and the stopped worker's once it runs again (it finishes the scan it was in)."""
    _, stop = operators
    mark = Path(os.environ["MR_TEST_STOP_MARK"])
    mark.unlink(missing_ok=True)
    x = np.random.default_rng(6).integers(-1000, 1000, size=6 * 997)
    x[-5] = STOP
    d, workers = persist_spread(client, x, 997, [0, 1, 2, 0, 1, 3])
    victim = workers[3]
    assert placement.holders(d, client)[(d.name, 5)] == victim
    pid = _pid(client, victim)
    lazy = mr.scan(d, stop)
    prefix = lazy.name.rsplit("-", 1)[0] + "-seeded"
    try:
        with dask.config.set(QUICK):
            t0 = time.monotonic()
            with pytest.raises(direct.WorkerStalled, match=f"worker {victim} \\(1 of the 6 chunks\\)"):
                lazy.persist()
            assert time.monotonic() - t0 < 20 and mark.exists()
            assert not any(v for w, v in client.run(_kept_keys, prefix, workers=workers[:3]).items())
    finally:
        os.kill(pid, signal.SIGCONT)
    _answers_again(client, victim)
    deadline = time.monotonic() + 15
    while any(client.run(_kept_keys, prefix).values()):  # the scheduler drops them once it answers
        assert time.monotonic() < deadline, client.run(_kept_keys, prefix)
        time.sleep(0.1)
    assert not client.run_on_scheduler(lambda dask_scheduler: [k for k in dask_scheduler.tasks if prefix in str(k)])
    np.testing.assert_array_equal(mr.scan(d, stop).persist().compute(), np.cumsum(x))  # stops no more
