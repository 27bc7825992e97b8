"""Scans of chunks made inside the graph (recipes) keep the chunks they made for their totals and scan
them, where they fit (``multireduce.scan-keep-chunks``), instead of making each chunk twice; the bits
are the same either way. On a real CPU cluster (three single-threaded workers, port 0)."""

from __future__ import annotations

import fractions
import math
import types
from collections import Counter

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import graph, placement  # noqa: E402

from .helpers import persist_spread, task_count  # noqa: E402

KEEP = "multireduce.scan-keep-chunks"
_made: list = []


def _counted(block, block_info=None):
    _made.append(block_info[None]["chunk-location"])
    return block * 3 - 1


def _scans():
    return {
        "cumsum": mr.cumsum,
        "cumprod": lambda x: mr.cumprod(x / 4096 + 1),
        "nancumsum": mr.nancumsum,
        "axis0": lambda x: mr.cumsum(x, axis=0),
        "exact": lambda x: mr.cumsum(x, exact=True),
    }


def _input(name):
    """(the array the chunks are made from, its chunks): awkward sizes, and NaNs where the scan skips them."""
    rng = np.random.default_rng(len(name))
    if name == "axis0":
        return rng.integers(-999, 999, (233, 37)).astype(np.float64), (17, 10)
    a = rng.standard_normal(4_001) * 100
    if name == "nancumsum":
        a[rng.integers(0, a.size, 300)] = np.nan
    if name == "cumsum":
        a = rng.integers(-(1 << 40), 1 << 40, 4_001)  # integers: np.cumsum is exact
    return a, 211


def _reference(name, a):
    made = a * 3 - 1
    if name == "cumsum":
        return np.cumsum(made)
    if name == "cumprod":
        return np.cumprod(made / 4096 + 1)
    if name == "nancumsum":
        return np.nancumsum(made)
    if name == "axis0":
        return np.cumsum(made, axis=0)
    total, out = fractions.Fraction(0), []
    for v in made:  # the exact scan rounds each exact prefix sum once
        total += fractions.Fraction(float(v))
        out.append(float(total))
    return np.array(out)


def _scan(client, fn, x, keep):
    """(the scan persisted through its graph, then gathered; how many times each chunk was made)."""
    with dask.config.set({KEEP: keep}):
        result = fn(x)
    _made.clear()
    out = client.persist(result)
    distributed.wait(out)
    made = Counter(_made)
    return out.compute(), made, result


@pytest.mark.parametrize("name", sorted(_scans()))
def test_kept_chunks_are_made_once_with_the_bits_of_making_them_twice(cpu_client, name):
    a, chunks = _input(name)
    x = da.from_array(a, chunks=chunks).map_blocks(_counted, dtype=np.float64 if a.dtype.kind == "f" else a.dtype)
    fn = _scans()[name]
    kept, made_kept, result = _scan(cpu_client, fn, x, True)
    again, made_again, remade = _scan(cpu_client, fn, x, False)
    assert remade.name != result.name  # two graphs, two names: Dask never sees one key with two tasks
    every = {tuple(i) for i in np.ndindex(*x.numblocks)}
    assert set(made_kept) == set(made_again) == every
    assert set(made_kept.values()) == {1}  # every chunk made once
    last = {i for i in every if i[0] == x.numblocks[0] - 1}  # each lane's last chunk seeds nothing: in no group
    assert all(n == (1 if i in last else 2) for i, n in made_again.items())
    assert kept.dtype == again.dtype and np.array_equal(kept, again, equal_nan=True)  # the same bits
    reference = _reference(name, a)
    if name == "cumsum" or name == "exact":
        assert np.array_equal(kept, reference)
    else:
        np.testing.assert_allclose(kept, reference, rtol=1e-12, atol=1e-9)
    groups = task_count(result, f"{result.name.rsplit('-', 1)[0]}-made")
    assert 0 < groups <= 6 * math.prod(x.numblocks[1:])  # a few per worker thread and lane


def test_kept_chunks_stay_where_they_were_made_and_are_released(cpu_client):
    a = np.random.default_rng(7).integers(-(1 << 30), 1 << 30, 64 * 4_093)
    x = da.from_array(a, chunks=4_093).map_blocks(_counted, dtype=a.dtype)
    cpu_client.run(_clear_transfer_logs)
    with distributed.get_task_stream(cpu_client) as stream:
        out, made, result = _scan(cpu_client, mr.cumsum, x, True)
    assert np.array_equal(out, np.cumsum(a * 3 - 1)) and set(made.values()) == {1}
    moved = [k for keys in cpu_client.run(_moved_keys).values() for k in keys]
    assert not [k for k in moved if "-made-" in str(k)]  # no group's chunks crossed between workers
    ran = {t["key"]: t["worker"] for t in stream.data}
    tasks = dict(result.__dask_graph__())
    picks = [k for k in ran if k in tasks and str(k[0]).startswith(("cumsum-chunk-", "cumsum-totals-"))]
    # chunk 0's pick is its scan's only input: Dask's linear fusion may run the two as one task
    assert len(picks) >= 62 + task_count(result, "cumsum-made")
    assert all(ran[k] == ran[tasks[k][1]] for k in picks)  # each ran where the group's chunks were made
    # once scanned, the kept chunks are released: only the scan's output stays in memory
    held = cpu_client.run_on_scheduler(_keys_in_memory)
    assert not [k for k in held if "-made-" in k or "-chunk-" in k]


def test_expressions_over_persisted_arrays_keep_chunks_on_their_worker(cpu_client):
    chunk, owners = 2_003, [2, 0, 0, 1, 2, 1, 1, 0, 2, 2, 0]
    a = np.random.default_rng(11).integers(-(1 << 30), 1 << 30, chunk * len(owners))
    d, workers = persist_spread(cpu_client, a, chunk, owners)
    x = d.map_blocks(_counted, dtype=a.dtype)
    with distributed.get_task_stream(cpu_client) as stream:
        kept, made, result = _scan(cpu_client, mr.cumsum, x, True)
    again, made_again, _ = _scan(cpu_client, mr.cumsum, x, False)
    assert np.array_equal(kept, again) and np.array_equal(kept, np.cumsum(a * 3 - 1))
    assert set(made.values()) == {1} and sum(made_again.values()) == 2 * len(owners) - 1
    for t in stream.data:  # every task reading a chunk, or the chunks a worker made, ran on that worker
        key = t["key"]
        if isinstance(key, tuple) and key[0].startswith(("cumsum-chunk-", result.name)):
            assert t["worker"] == workers[owners[key[1]]]


def test_the_auto_rule_follows_the_workers_memory():
    x = da.ones((1000, 30), chunks=(100, 10), dtype=np.float32)
    plan = types.SimpleNamespace(axis=0, out_dtype=np.dtype(np.float64))
    groups = graph.even_groups(3)  # per lane: 9 chunks in groups of 3 chunks, 3 lanes
    share = 2 * (3 * 100 * 10 * (4 + 8))  # ceil(9 groups / 5 workers) groups of 3 chunks in and out

    def keeps(memory, workers=5):
        groups.keep_memory = None if memory is None else (workers, memory)
        return graph._keeps_chunks(x, plan, groups)

    fraction = graph.KEEP_MEMORY_FRACTION
    assert keeps(share / fraction) and not keeps(share / fraction - 1)
    assert keeps(math.inf) and not keeps(None)
    assert keeps(share / fraction / 2, workers=9) and not keeps(share / fraction / 2)


def test_the_setting_and_the_memory_it_reads():
    host = {"a": {"memory_limit": 8 << 30}, "b": {"memory_limit": 6 << 30}}
    gpus = {"a": {"memory_limit": 8 << 30, "gpu": {"memory-total": 80 << 30}},
            "b": {"memory_limit": 8 << 30, "metrics": {"gpu-memory-total": 40 << 30}}}
    on_host = da.ones(10)
    on_device = types.SimpleNamespace(_meta=type("ndarray", (), {"__module__": "cupy._core.core"})())
    with dask.config.set({KEEP: "auto"}):
        assert placement.scan_keep_memory(on_host, host) == (2, float(6 << 30))
        assert placement.scan_keep_memory(on_device, gpus) == (2, float(40 << 30))
        assert placement.scan_keep_memory(on_device, host) is None  # no GPU reported: made twice
        assert placement.scan_keep_memory(on_host, {**host, "c": {"memory_limit": 0}}) is None  # no limit
    for given, expected in ((True, (2, math.inf)), ("yes", (2, math.inf)), ("AUTO", (2, float(6 << 30))),
                            (False, None), ("off", None)):
        with dask.config.set({KEEP: given}):
            assert placement.scan_keep_memory(on_host, host) == expected


def test_a_bad_setting_is_named_before_any_work(cpu_client):
    x = da.from_array(np.arange(1, 5_000, dtype=np.float64), chunks=97).map_blocks(_counted, dtype=np.float64)
    _made.clear()
    with dask.config.set({KEEP: "sometimes"}), pytest.raises(ValueError, match="scan-keep-chunks.*'sometimes'"):
        mr.cumsum(x)
    assert not _made


def _clear_transfer_logs(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _moved_keys(dask_worker):
    return [k for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]


def _keys_in_memory(dask_scheduler):
    return [str(k) for k, ts in dask_scheduler.tasks.items() if ts.state == "memory"]


def test_kept_chunks_stay_put_on_a_cluster_of_two_threads():
    """distributed places a task group that reads the outputs of fewer than five tasks as root tasks, on any
    free thread (``Scheduler.is_rootish``): with two threads a lazy scan would make four groups, and their
    kept chunks' picks would carry whole groups to the other worker. A kept scan makes five groups at least."""
    from multireduce.cluster import local_cluster

    a = np.random.default_rng(3).integers(-(1 << 30), 1 << 30, 17 * 1_009)
    with local_cluster(n_workers=2, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        assert placement._threads(client) == 2
        for axis_scan in (False, True):
            x = da.from_array(a.reshape(17, 1_009) if axis_scan else a, chunks=1_009 if not axis_scan else (1, 1_009))
            x = x.map_blocks(_counted, dtype=a.dtype)
            fn = (lambda v: mr.cumsum(v, axis=0)) if axis_scan else mr.cumsum
            client.run(_clear_transfer_logs)
            out, made, result = _scan(client, fn, x, True)
            want = np.cumsum(a.reshape(17, 1_009) * 3 - 1, axis=0) if axis_scan else np.cumsum(a * 3 - 1)
            assert np.array_equal(out, want) and set(made.values()) == {1}
            assert task_count(result, f"{result.name.rsplit('-', 1)[0]}-made") >= 5
            moved = [k for keys in client.run(_moved_keys).values() for k in keys]
            assert not [k for k in moved if "-made-" in str(k)]
