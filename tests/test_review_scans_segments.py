"""Awkward cases for three paths over real clusters (port 0): lazy scans that keep the chunks they made
(``multireduce.scan-keep-chunks``), segment_reduce / segment_scan over chunks made by recipes, and held
scans that keep their lineage (a killed worker's outputs made again). Every value is checked against
NumPy (exact for integers, Python-integer matrix products for the non-commutative operator) and, where
settings differ, bit for bit against each other."""

from __future__ import annotations

import fractions
import gc
import time
import types
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import multireduce as mr  # noqa: E402
from multireduce import graph, placement  # noqa: E402
from multireduce.cluster import local_cluster  # noqa: E402
from multireduce.operators import get_operator  # noqa: E402

from .helpers import (MATMUL_IDENTITY, kill_worker, matmul_operator, persist_spread, random_matrices,  # noqa: E402
                      sequential_fold, sequential_scan, task_count, workers_of)

KEEP = "multireduce.scan-keep-chunks"
SETTINGS = (True, False, "auto")


def _made(block):
    """The lazily made chunks: a step Dask cannot skip, so every chunk comes from a recipe."""
    return block * 3 - 1


def _lazy(a, chunks):
    return da.from_array(a, chunks=chunks).map_blocks(_made, dtype=a.dtype)


def _same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _exclusive(scanned, axis: int, identity):
    """NumPy's inclusive scan shifted by one along ``axis``, starting from ``identity``."""
    first = np.full_like(np.take(scanned, [0], axis=axis), identity)
    rest = np.take(scanned, range(scanned.shape[axis] - 1), axis=axis)
    return np.concatenate([first, rest], axis=axis)


def _by_setting(build):
    """{setting: ``build()`` made under it}."""
    out = {}
    for keep in SETTINGS:
        with dask.config.set({KEEP: keep}):
            out[keep] = build()
    return out


def _keys_in_memory(dask_scheduler=None):
    return [str(k) for k, ts in dask_scheduler.tasks.items() if ts.state == "memory"]


def _worker_keys(dask_worker=None):
    return [str(k) for k in dask_worker.data]


def _clear_transfer_log(dask_worker=None):
    dask_worker.transfer_incoming_log.clear()


def _moved(dask_worker=None):
    return [str(k) for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]


# ------------------------------------------------------------------------------------------------
# Lazy scans keeping their chunks
# ------------------------------------------------------------------------------------------------
_RNG = np.random.default_rng(20261126)
_A1 = _RNG.integers(-1000, 1000, 1000)
_A3 = _RNG.integers(-1000, 1000, (9, 11, 13))
CHUNKINGS = {
    # empty chunks first, inside and last, and a one-element chunk: more chunks than the 6 groups
    "empty chunks": (_A1, ((0, 100, 0, 0, 300, 1, 150, 0, 449, 0),), {}),
    "one chunk": (_A1, (1000,), {}),
    "many tiny chunks": (_A1[:29], (1,), {}),
    "uneven": (_A1, ((7, 500, 3, 90, 1, 399),), {}),
    "3-D axis 0": (_A3, (4, (0, 5, 6), 5), {"axis": 0}),
    "3-D axis 1": (_A3, (4, (0, 5, 6), 5), {"axis": 1}),
    "3-D axis -1": (_A3, (4, (0, 5, 6), 5), {"axis": -1}),
    "3-D axis None": (_A3, (4, (0, 5, 6), 5), {"axis": None}),
}


@pytest.mark.parametrize("case", sorted(CHUNKINGS))
def test_scans_over_awkward_chunkings_are_numpys_under_every_setting(cpu_client, case):
    a, chunks, kw = CHUNKINGS[case]
    host = _made(a)
    axis = kw.get("axis")
    flat, ax = (host.ravel(), 0) if axis is None else (host, axis)
    references = {
        "cumsum": np.cumsum(host, axis=axis),
        "cumprod": np.cumprod(host, axis=axis),  # int64 wraps, as NumPy's does
        "exclusive sum": _exclusive(np.cumsum(flat, axis=ax), ax, 0),
        "exclusive max": _exclusive(np.maximum.accumulate(flat, axis=ax), ax, np.iinfo(np.int64).min),
    }
    scans = {
        "cumsum": lambda x: mr.cumsum(x, **kw),
        "cumprod": lambda x: mr.cumprod(x, **kw),
        "exclusive sum": lambda x: mr.scan(x, "sum", inclusive=False, **kw),
        "exclusive max": lambda x: mr.scan(x, "max", inclusive=False, **kw),
    }
    if a.ndim > 1:
        del scans["cumprod"]  # runtime: the 1-D cases cover it
    built = {(name, keep): r for name, fn in scans.items()
             for keep, r in _by_setting(lambda: fn(_lazy(a, chunks))).items()}
    # every setting's graph computed together: distinct graphs never share a key with another task
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = dict(zip(built, dask.compute(*built.values())))
    for (name, keep), got in values.items():
        want = references[name]
        assert got.shape == want.shape and got.dtype == want.dtype, (name, keep)
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {name} {keep}")
        assert _same_bits(got, values[(name, False)]), (name, keep)


def test_dtypes_and_requests_keep_numpys_values_under_every_setting(cpu_client):
    rng = np.random.default_rng(3)
    chunks = ((0, 13, 1, 40, 0, 7, 29, 3, 1, 55, 0, 12),)
    n = sum(chunks[0])
    b = rng.random(n) < 0.5
    i8 = rng.integers(-128, 128, n).astype(np.int8)
    u16 = rng.integers(0, 1 << 16, n).astype(np.uint16)
    f32 = rng.standard_normal(n).astype(np.float32)
    c128 = (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / 2
    nan = rng.standard_normal(n)
    nan[rng.integers(0, n, 20)] = np.nan
    cases = [  # (input, scan, NumPy's reference, relative tolerance: 0 for exact)
        (b, mr.cumsum, np.cumsum, 0),
        (b, mr.cumprod, np.cumprod, 0),
        (i8, lambda x: mr.cumsum(x, dtype=np.int16), lambda a: np.cumsum(a, dtype=np.int16), 0),  # wraps
        (u16, mr.cumprod, np.cumprod, 0),  # wraps
        (u16, lambda x: mr.cumsum(x, dtype=np.float64), lambda a: np.cumsum(a, dtype=np.float64), 0),
        (f32, mr.cumsum, lambda a: np.cumsum(a.astype(np.float64)).astype(np.float32), 1e-4),
        (c128, mr.cumsum, np.cumsum, 1e-12),
        (c128, lambda x: mr.cumprod(x, dtype=np.complex64), lambda a: np.cumprod(a).astype(np.complex64), 1e-4),
        (nan, mr.nancumsum, np.nancumsum, 1e-12),
        (nan, lambda x: mr.nancumprod(x / 8 + 1), lambda a: np.nancumprod(a / 8 + 1), 1e-12),
        (nan, lambda x: mr.cumsum(x, exact=True), np.cumsum, 1e-12),  # NaN from the first one on
    ]
    built = [_by_setting(lambda: scan(da.from_array(a, chunks=chunks).map_blocks(np.copy, dtype=a.dtype)))
             for a, scan, _, _ in cases]
    values = dask.compute(*[r for per in built for r in per.values()])
    for k, (a, _, reference, rtol) in enumerate(cases):
        got = dict(zip(SETTINGS, values[3 * k: 3 * k + 3]))
        want = reference(a)
        assert all(_same_bits(v, got[False]) for v in got.values()), k
        assert got[False].dtype == want.dtype, (k, got[False].dtype, want.dtype)
        if rtol == 0:
            np.testing.assert_array_equal(got[False], want, err_msg=str(k))
        else:  # sums of values of order 1: the absolute error is bounded by the running sum of |x|
            np.testing.assert_allclose(got[False], want, rtol=rtol, atol=rtol * 10, err_msg=str(k))


def _matmul_references(m):
    inclusive = sequential_scan(m)
    exclusive = np.concatenate([np.array([MATMUL_IDENTITY], dtype=np.uint64), inclusive[:-1]])
    return inclusive, exclusive


def test_non_commutative_scans_keep_chunk_order_under_every_setting(cpu_client):
    op = matmul_operator()
    rng = np.random.default_rng(5)
    m = random_matrices(rng, 700)
    inclusive, exclusive = _matmul_references(m)
    chunks = ((0, 13, 1, 40, 0, 7, 29, 3, 1, 55, 0, 12, 539),)
    results = []
    for per_thread in (2, 20):  # 20: more than 32 groups per lane, so a carries stage
        with dask.config.set({"multireduce.tasks-per-thread": per_thread}):
            for inc in (True, False):
                results += _by_setting(lambda: mr.scan(_lazy(m, chunks), op, inclusive=inc)).values()
    values = dask.compute(*results)
    host_inc, host_exc = _matmul_references(_made(m))
    for k, got in enumerate(values):
        want = host_inc if (k // 3) % 2 == 0 else host_exc
        assert got.dtype == np.uint64 and np.array_equal(got, want), k
    # held chunks on interleaved workers: the groups are no runs, each chunk keeps its place
    owners = [0, 1, 2, 1, 0, 2, 2, 0, 1]
    held, _ = persist_spread(cpu_client, m[: 61 * len(owners)], 61, owners)
    want_inc, want_exc = _matmul_references(m[: 61 * len(owners)])
    for inc, want in ((True, want_inc), (False, want_exc)):
        for keep, r in _by_setting(lambda: mr.scan(held + np.uint64(0), op, inclusive=inc)).items():
            assert np.array_equal(r.compute(), want), (inc, keep)
            assert np.array_equal(r.persist().compute(), want), (inc, keep)  # the held scan's direct path


def test_a_result_keeps_the_graph_it_was_built_with_and_releases_its_chunks(cpu_client):
    a = np.random.default_rng(9).integers(-(1 << 40), 1 << 40, 97 * 31)
    x = _lazy(a, 97)
    want = np.cumsum(_made(a))
    built = _by_setting(lambda: mr.cumsum(x))
    # lazily made chunks are not pinned to a worker: "auto" makes them again, the graph of False
    assert len({r.name for r in built.values()}) == 2 and built["auto"].name == built[False].name
    with dask.config.set({KEEP: True}):
        assert mr.cumsum(x).name == built[True].name  # the same graph, the same name
    assert task_count(built[True], "cumsum-made") > 0 and task_count(built[False], "cumsum-made") == 0
    assert task_count(built["auto"], "cumsum-made") == 0
    before = set(cpu_client.run_on_scheduler(_keys_in_memory))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dask.config.set({KEEP: False}):  # changed after building: the graph stays the one built
            first, second = built[True].compute(), built[True].compute()
        persisted = [cpu_client.persist(built[True]), cpu_client.persist(built[True]), cpu_client.persist(built[False])]
        distributed.wait(persisted)
        together = cpu_client.compute([built[True], built[False], built["auto"], mr.cumsum(x)], sync=True)
    for got in (first, second, *(p.compute() for p in persisted), *together):
        assert _same_bits(got, want)
    del persisted
    gc.collect()
    deadline = time.monotonic() + 10
    while set(cpu_client.run_on_scheduler(_keys_in_memory)) - before:
        assert time.monotonic() < deadline, sorted(set(cpu_client.run_on_scheduler(_keys_in_memory)) - before)[:5]
        time.sleep(0.05)
    tokens = {r.name.rsplit("-", 1)[1] for r in built.values()}  # every stage's key carries its graph's token

    def still_held():
        return [k for keys in cpu_client.run(_worker_keys).values() for k in keys if any(t in k for t in tokens)]

    # the workers free what the scheduler released when its message reaches them: soon, not at once
    while still_held():
        assert time.monotonic() < deadline, still_held()[:5]
        time.sleep(0.05)


def test_lazily_made_chunks_are_kept_only_when_asked_to_and_scanned_right(cpu_client):
    """Over lazily made chunks (no worker to pin a group to) Dask places each kept chunk's scan task and
    may move the chunk to another worker for it (28 of 63 chunks in one run here), where making it again
    moves nothing: "auto" makes them again, True keeps them (the README says what it may cost)."""
    a = np.random.default_rng(7).integers(-(1 << 30), 1 << 30, 64 * 2_001)
    for keep in ("auto", True):
        with dask.config.set({KEEP: keep}):
            result = mr.cumsum(_lazy(a, 2_001))
        assert (task_count(result, "cumsum-made") > 0) == (keep is True)
        cpu_client.run(_clear_transfer_log)
        out = cpu_client.persist(result)
        distributed.wait(out)
        assert np.array_equal(out.compute(), np.cumsum(_made(a)))
        moved = [k for keys in cpu_client.run(_moved).values() for k in keys]
        if keep == "auto":
            assert not [k for k in moved if "-chunk-" in k or "-made-" in k], moved
        del out


def _pinned_stages(result) -> set:
    """The stages (``made``, ``chunk``, ``totals``, ...) of ``result``'s layer whose tasks ask for a worker."""
    layer = result.dask.layers[result.name]
    asked = (layer.annotations or {}).get("workers") or {}
    return {str(k[0]).rsplit("-", 2)[-2] for k in asked}


def test_groups_over_scattered_chunks_ask_for_their_worker(cpu_client):
    rng = np.random.default_rng(17)
    workers = workers_of(cpu_client, 3)
    blocks = [rng.integers(-99, 99, 200 + i) for i in range(6)]
    futures = [cpu_client.scatter(b, workers=[workers[i % 3]]) for i, b in enumerate(blocks)]
    x = da.concatenate([da.from_delayed(f, b.shape, b.dtype) for f, b in zip(futures, blocks)])
    held, _ = persist_spread(cpu_client, np.concatenate(blocks)[:1_200], 200, [0, 1, 2, 0, 1, 2])
    with dask.config.set({KEEP: True}):
        assert {"made", "chunk", "totals"} <= _pinned_stages(mr.cumsum(held * 2))  # persisted: pinned
        scanned = mr.cumsum(x * 2)
        assert np.array_equal(scanned.compute(), np.cumsum(np.concatenate(blocks) * 2))
        assert {"made", "chunk", "totals"} <= _pinned_stages(scanned)
    assert _pinned_stages(mr.segment_scan(x * 2, [0, 7]))


def test_held_expressions_give_the_same_bits_by_every_path_and_setting(cpu_client):
    rng = np.random.default_rng(8)
    owners = [2, 0, 0, 1, 2, 1, 1, 0, 2, 2, 0]
    a = (rng.standard_normal(37 * len(owners)) * np.exp2(rng.integers(-30, 30, 37 * len(owners)))).astype(np.float32)
    d, _ = persist_spread(cpu_client, a, 37, owners)
    b = rng.standard_normal((60, 50)).astype(np.float32)
    h = cpu_client.persist(da.from_array(b, chunks=(7, 9)))
    distributed.wait(h)
    for build in (lambda: mr.scan(d * 2, "sum", inclusive=False), lambda: mr.cumsum(h * 3, axis=1)):
        got = []
        for r in _by_setting(build).values():
            got += [r.compute(), r.persist().compute()]  # the graph, then the held scan's direct path
        with dask.config.set({"multireduce.placement": False}):
            got.append(build().compute())  # a task per chunk
        assert all(_same_bits(g, got[0]) for g in got)
    np.testing.assert_allclose(got[0], np.cumsum(b.astype(np.float64) * 3, axis=1), rtol=1e-4, atol=1e-3)


def test_the_auto_rule_counts_every_group_a_worker_holds():
    x = da.ones((40, 100), chunks=(10, 10))  # scanned along axis 1: 4 lanes of 10 chunks, 9 grouped each
    plan = types.SimpleNamespace(axis=1, out_dtype=np.dtype(np.float64))
    keys = [(x.name, i, j) for i in range(4) for j in range(10)]
    groups = placement.by_worker(dict.fromkeys(keys, "tcp://a"), True)  # every chunk held by one worker
    share = 4 * 9 * 10 * 10 * (8 + 8)  # that worker's 4 groups of 9 chunks, in and out
    groups.keep_memory = (3, share / graph.KEEP_MEMORY_FRACTION / 2)  # half the memory its share needs
    assert not graph._keeps_chunks(x, plan, groups)


def test_reductions_and_segments_do_not_read_the_scan_setting(cpu_client):
    a = np.random.default_rng(4).integers(-99, 99, 2_000)
    x = _lazy(a, 97)
    names = {keep: (r.name, s.name) for keep, (r, s) in
             _by_setting(lambda: (mr.sum(x), mr.segment_reduce(x, [0, 5]))).items()}
    assert len(set(names.values())) == 1, names
    with dask.config.set({KEEP: "sometimes"}):
        assert int(mr.sum(x).compute()) == int(np.sum(_made(a)))


def test_a_bad_setting_is_named_before_a_scan_does_any_work(cpu_client):
    x = _lazy(np.arange(5_000), 97)
    with dask.config.set({KEEP: 2}), pytest.raises(ValueError, match=r"scan-keep-chunks.*'auto'.*got 2"):
        mr.cumsum(x)
    for given, keeps in (("YES", True), ("off", False), (" Auto ", False), (1, True), ("0", False)):
        with dask.config.set({KEEP: given}):
            assert (task_count(mr.cumsum(x), "cumsum-made") > 0) == keeps, given


# ------------------------------------------------------------------------------------------------
# segment_reduce / segment_scan over chunks made by recipes
# ------------------------------------------------------------------------------------------------
SEG_CHUNKS = (0, 13, 1, 40, 0, 7, 29, 3, 1, 55, 0, 12, 0)
SEG_N = sum(SEG_CHUNKS)
_BOUNDS = np.cumsum((0,) + SEG_CHUNKS)
UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _segment_layouts():
    rng = np.random.default_rng(6)
    return {
        "chunk boundaries": np.unique(_BOUNDS),
        "boundaries twice": np.sort(np.concatenate([_BOUNDS, _BOUNDS])),  # empty segments at every boundary
        "just before boundaries": np.unique(np.clip(_BOUNDS - 1, 0, SEG_N)),
        "just after boundaries": np.unique(np.clip(_BOUNDS + 1, 0, SEG_N)),
        "all at the end": np.array([SEG_N, SEG_N, SEG_N]),
        "one at 0": np.array([0]),
        "one straddling all": np.array([2]),
        "none": np.array([], dtype=np.int64),
        "uint64": np.sort(rng.integers(0, SEG_N + 1, 20)).astype(np.uint64),
        "int8": np.array([0, 5, 100], dtype=np.int8),
        "list": [3, 17, 17, 90, SEG_N],
    }


def _reduce_reference(host, offsets, opname, dtype):
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = np.append(offsets[1:], host.size)
    ident = get_operator(opname).identity(np.dtype(dtype))
    return np.array([UFUNC[opname].reduce(host[s:e], dtype=dtype) if e > s else ident
                     for s, e in zip(offsets, ends)], dtype=dtype)


def _scan_reference(host, offsets, opname, dtype):
    offsets = np.asarray(offsets, dtype=np.int64)
    starts = np.unique(np.concatenate([[0], offsets[offsets < host.size]])).astype(np.int64)
    bounds = np.append(starts, host.size)
    return np.concatenate([UFUNC[opname].accumulate(host[s:e], dtype=dtype) for s, e in zip(bounds[:-1], bounds[1:])])


def _per_chunk(fn, *args):
    with dask.config.set({"multireduce.placement": False}):
        return fn(*args)


def test_segments_at_chunk_boundaries_and_awkward_offsets_are_numpys(cpu_client):
    rng = np.random.default_rng(11)
    data = {"sum": rng.integers(-500, 500, SEG_N), "prod": rng.choice(np.array([1, -1, 2]), SEG_N, p=[0.9, 0.08, 0.02])}
    layouts = _segment_layouts()
    built, per_chunk, wanted = [], [], []
    for opname, a in data.items():
        x = _lazy(a, (SEG_CHUNKS,))
        host = _made(a)
        for offsets in layouts.values():
            for fn, reference in ((mr.segment_reduce, _reduce_reference), (mr.segment_scan, _scan_reference)):
                built.append(fn(x, offsets, opname))
                wanted.append(reference(host, offsets, opname, np.int64))
                if opname == "sum":
                    per_chunk.append((len(built) - 1, _per_chunk(fn, x, offsets, opname)))
    assert task_count(built[0], "segment-pieces") <= 6  # made by groups, not a task per chunk
    got, ref = dask.compute(built, [r for _, r in per_chunk])
    for k, (g, w) in enumerate(zip(got, wanted)):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), k
    for (k, _), r in zip(per_chunk, ref):
        assert _same_bits(got[k], r), k


def test_segments_of_every_dtype_and_request(cpu_client):
    rng = np.random.default_rng(12)
    offsets = np.sort(rng.integers(0, SEG_N + 1, 12))
    cases = [
        (rng.random(SEG_N) < 0.5, "sum", None),
        (rng.integers(-128, 128, SEG_N).astype(np.int8), "sum", np.int8),  # wraps, as NumPy's
        (rng.integers(0, 1 << 32, SEG_N).astype(np.uint32), "sum", np.float64),
        (rng.integers(-9, 9, SEG_N) + 1j * rng.integers(-9, 9, SEG_N), "sum", None),
        (rng.integers(-9, 9, SEG_N).astype(np.int64), "min", np.float32),
    ]
    built, wanted = [], []
    for a, opname, dtype in cases:
        x = da.from_array(a, chunks=(SEG_CHUNKS,)).map_blocks(np.copy, dtype=a.dtype)
        for fn in (mr.segment_reduce, mr.segment_scan):
            built.append(fn(x, offsets, opname, dtype=dtype))
            wanted.append(fn(a, offsets, opname, dtype=dtype))  # NumPy input: checked in tests/test_segments.py
    want_reduce = _reduce_reference(cases[1][0], offsets, "sum", np.int8)
    assert np.array_equal(wanted[2], want_reduce)
    for k, (g, w) in enumerate(zip(dask.compute(*built), wanted)):
        assert _same_bits(g, w), k


def test_non_commutative_segments_over_lazy_and_held_chunks(cpu_client):
    op = matmul_operator()
    rng = np.random.default_rng(13)
    m = random_matrices(rng, SEG_N)
    offsets = np.unique(np.concatenate([_BOUNDS[::2], rng.integers(0, SEG_N, 6)]))
    x = da.from_array(m, chunks=(SEG_CHUNKS,)).map_blocks(np.copy, dtype=m.dtype)
    got_reduce, got_scan = dask.compute(mr.segment_reduce(x, offsets, op), mr.segment_scan(x, offsets, op))
    ends = np.append(offsets[1:], SEG_N)
    assert [int(v) for v in got_reduce] == [sequential_fold(m[s:e]) for s, e in zip(offsets, ends)]
    starts = np.unique(np.concatenate([[0], offsets[offsets < SEG_N]]))
    bounds = np.append(starts, SEG_N)
    want_scan = np.concatenate([sequential_scan(m[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])
    assert np.array_equal(got_scan, want_scan)


def test_segments_of_an_array_of_empty_chunks(cpu_client):
    x = _lazy(np.arange(0, dtype=np.int64), ((0,) * 10,))
    for offsets in ([0, 0], [], np.array([0], dtype=np.uint8)):
        got = mr.segment_reduce(x, offsets).compute()
        assert got.dtype == np.int64 and np.array_equal(got, np.zeros(len(offsets), np.int64))
        scanned = mr.segment_scan(x, offsets, "max").compute()
        assert scanned.dtype == np.int64 and scanned.shape == (0,)


_calls: list = []


def _counted(block):
    _calls.append(block.size)
    return block + 1


@pytest.mark.parametrize("fn", [mr.segment_reduce, mr.segment_scan])
def test_bad_offsets_are_named_before_any_work(cpu_client, fn):
    a = np.random.default_rng(14).integers(-9, 9, SEG_N)
    x = da.from_array(a, chunks=(SEG_CHUNKS,)).map_blocks(_counted, dtype=a.dtype)
    _calls.clear()
    name = fn.__name__
    for bad, error, match in [
        ([5, 3], ValueError, rf"{name}: argument 'offsets' must be ascending .*\[0, {SEG_N}\].*not ascending"),
        ([-1, 4], ValueError, r"from -1 to 4"),
        ([0, SEG_N + 1], ValueError, rf"from 0 to {SEG_N + 1}"),
        (np.array([2**63 + 5], dtype=np.uint64), ValueError, r"from 9223372036854775813"),
        (np.array([1.5]), TypeError, r"1-D array of integers; got dtype float64"),
        (np.array([[1, 2]]), TypeError, r"shape \(1, 2\)"),
        (np.array([True]), TypeError, r"dtype bool"),
        (da.from_array(np.array([1, 2])), TypeError, r"dask array"),
    ]:
        with pytest.raises(error, match=match):
            fn(x, bad)
    with pytest.raises(ValueError, match="1-D"):
        fn(x.reshape(1, SEG_N), [0])
    assert not _calls  # nothing was made


# ------------------------------------------------------------------------------------------------
# Held scans keeping their lineage
# ------------------------------------------------------------------------------------------------
def test_held_scans_over_empty_single_and_tiny_chunks(cpu_client):
    a = np.random.default_rng(18).integers(-99, 99, 40)
    lowest = np.iinfo(np.int64).min
    scans = [(mr.cumsum, np.cumsum(a)), (lambda q: mr.scan(q, "sum", inclusive=False), np.cumsum(a) - a),
             (lambda q: mr.cumsum(q * 2), np.cumsum(a * 2)),
             (lambda q: mr.scan(q * 2, "max", inclusive=False),
              np.concatenate([[lowest], np.maximum.accumulate(a * 2)[:-1]]))]
    for chunks in (((0, 5, 0, 7, 28, 0),), ((40,),), ((0, 40),), ((1,) * 40,)):
        held = cpu_client.persist(da.from_array(a, chunks=chunks))
        distributed.wait(held)
        for fn, want in scans:
            result = fn(held)
            persisted = result.persist()  # the direct path: a fresh name, no task
            assert "-seeded-" in persisted.name, chunks
            assert _same_bits(persisted.compute(), want) and _same_bits(result.compute(), want), chunks
    empty = cpu_client.persist(da.from_array(np.ones((6, 0, 5), dtype=np.int64), chunks=(2, 0, 2)))
    distributed.wait(empty)
    for axis in (0, 2):
        assert mr.cumsum(empty, axis=axis).persist().compute().shape == (6, 0, 5)


def test_held_scans_dropped_at_once_or_failing_leave_nothing_behind(cpu_client):
    a = np.random.default_rng(16).integers(-99, 99, 1_000)
    x = cpu_client.persist(da.from_array(a, chunks=100) + 2)
    distributed.wait(x)
    before = {k for keys in cpu_client.run(_worker_keys).values() for k in keys}
    names = set()
    for _ in range(4):  # persisted and dropped at once: a fresh name each time, nothing kept
        out = mr.cumsum(x).persist()
        names.add(out.name)
        del out
    assert len(names) == 4
    kept = mr.cumsum(x).persist()
    twice = mr.cumsum(x).persist()
    assert kept.name != twice.name and _same_bits(kept.compute(), twice.compute())
    assert np.array_equal(kept.compute(), np.cumsum(a + 2))
    with pytest.raises(ZeroDivisionError, match="chunk 7"):
        mr.cumsum(x.map_blocks(_fails_at_7, dtype=x.dtype)).persist()
    del kept, twice
    gc.collect()
    deadline = time.monotonic() + 10
    while {k for keys in cpu_client.run(_worker_keys).values() for k in keys} - before:
        assert time.monotonic() < deadline, {k for keys in cpu_client.run(_worker_keys).values() for k in keys} - before
        time.sleep(0.05)


def _fails_at_7(block, block_info=None):
    if block_info is not None and block_info[None]["chunk-location"][0] == 7:
        raise ZeroDivisionError("chunk 7")
    return block - 1


# the process cluster comes last: its client, the newest, is the default client from then on
@pytest.fixture(scope="module")
def process_client():
    # no Active Memory Manager: the copies of inputs the test makes must stay where it puts them
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}), \
            local_cluster(n_workers=3, gpu=False, threads_per_worker=1, processes=True) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(3, timeout=60)
        yield client


def _outputs_after_killing_a_holder(client, outs: dict, held: list, workers: list, watched):
    """Every output of ``outs`` gathered, the second worker killed (the inputs it holds copied elsewhere
    first, so only the outputs are lost; it must hold some of ``watched``), gathered again: the second
    gathering, whose bits must be the first's."""
    before = {k: client.gather(distributed.futures_of(v)) for k, v in outs.items()}
    victim = workers[1]
    who = client.who_has(held)
    client.replicate([h for h in held if victim in who[h.key]], n=1, workers=[w for w in workers if w != victim])
    assert any(victim in w for w in client.who_has(distributed.futures_of(watched)).values())
    kill_worker(client, victim)
    after = {k: client.gather(distributed.futures_of(v)) for k, v in outs.items()}
    for k in outs:
        assert all(_same_bits(b, c) for b, c in zip(before[k], after[k])), k
    return after


@pytest.mark.slow
def test_held_scans_of_every_kind_come_back_after_their_worker_is_killed(process_client):
    client = process_client
    rng = np.random.default_rng(15)
    op = matmul_operator()
    owners = [1, 0, 1, 2, 0, 1, 2]
    m = random_matrices(rng, 61 * len(owners))
    f = rng.standard_normal(61 * len(owners))
    f[17::17] = np.nan
    dm, workers = persist_spread(client, m, 61, owners)
    df, _ = persist_spread(client, f, 61, owners)
    mi = (m >> np.uint64(40)).astype(np.int64) - (1 << 23)
    outs = {"exclusive matmul": mr.scan(dm, op, inclusive=False).persist(),
            "matmul of an expression": mr.scan(dm + np.uint64(0), op).persist(),
            "nancumsum": mr.nancumsum(df).persist(),
            "exact cumsum": mr.cumsum(df * 2.0, exact=True).persist(),
            "exclusive int sum": mr.scan((dm >> np.uint64(40)).astype(np.int64) - (1 << 23), "sum",
                                         inclusive=False).persist()}
    after = _outputs_after_killing_a_holder(client, outs, distributed.futures_of(dm) + distributed.futures_of(df),
                                            workers, outs["nancumsum"])
    inclusive, exclusive = _matmul_references(m)
    assert np.array_equal(np.concatenate(after["exclusive matmul"]), exclusive)
    assert np.array_equal(np.concatenate(after["matmul of an expression"]), inclusive)
    assert np.array_equal(np.concatenate(after["exclusive int sum"]), np.cumsum(mi) - mi)
    np.testing.assert_allclose(np.concatenate(after["nancumsum"]), np.nancumsum(f), rtol=1e-12, atol=1e-12)
    exact = np.concatenate(after["exact cumsum"])
    running, want = fractions.Fraction(0), []
    for v in f[:17] * 2.0:  # every prefix sum rounded once
        running += fractions.Fraction(float(v))
        want.append(float(running))
    assert np.isnan(exact[17:]).all() and np.array_equal(exact[:17], want)


@pytest.mark.slow
def test_held_reductions_each_chunk_holds_come_back_after_their_worker_is_killed(process_client):
    """Row sums, maxima and argmax of a tall matrix (and the row variances of an expression over it) kept
    where each row chunk is (``mr.sum(m, axis=1).persist()``, no task): a worker holding outputs is killed
    and the scheduler makes them again from their lineage, the same bits."""
    client = process_client
    rng = np.random.default_rng(23)
    a = rng.standard_normal((61 * 7, 5))
    a[100, 2] = np.nan
    m = client.persist(da.from_array(a, chunks=(61, 5)))
    distributed.wait(m)
    workers = sorted(client.scheduler_info()["workers"])
    outs = {"sum": mr.sum(m, axis=1).persist(), "var": mr.var(m * 1.0, axis=1).persist(),
            "max keepdims": mr.max(m, axis=1, keepdims=True).persist(), "argmax": mr.argmax(m, axis=1).persist()}
    assert all("-chunks-" in out.name for out in outs.values())  # the expression's chunks made where they are
    after = _outputs_after_killing_a_holder(client, outs, distributed.futures_of(m), workers, outs["sum"])
    np.testing.assert_allclose(np.concatenate(after["sum"]), a.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(np.concatenate(after["var"]), a.var(axis=1), rtol=1e-12)
    assert np.array_equal(np.concatenate(after["max keepdims"]), a.max(axis=1, keepdims=True), equal_nan=True)
    assert np.array_equal(np.concatenate(after["argmax"]), np.argmax(a, axis=1))  # chunk offsets in the lineage
