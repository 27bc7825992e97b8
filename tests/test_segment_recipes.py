"""segment_reduce / segment_scan over chunks made inside the graph, on a real cluster (three single-threaded
workers): the per-chunk stage is a few tasks per worker thread, each making its run of chunks one at a
time (recipes), with the bits of the graph of one task per chunk and NumPy's exact integers."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.operators import get_operator

from .helpers import matmul_operator, persist_spread, random_matrices, sequential_fold, sequential_scan, task_count

distributed = pytest.importorskip("distributed")

UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
# uneven, with empty chunks (one of them first) and one-element ones: 16 chunks, more than the six groups
CHUNKS = (0, 97, 1, 250, 13, 0, 301, 64, 7, 199, 1, 120, 33, 0, 88, 226)
N = sum(CHUNKS)
GROUPS = 3 * 2  # three single-threaded workers, multireduce.tasks-per-thread 2


def _offsets(rng):
    """Offset layouts: segments straddling many chunks (with empty ones), a single segment starting past
    0, every element its own segment, starts that repeat and reach N, and no segment at all."""
    few = np.sort(rng.integers(0, N + 1, 9))
    few[3] = few[4]  # an empty segment
    many = np.sort(rng.integers(0, N + 1, 400))
    return {"straddling": few, "one": np.array([37]), "every": np.arange(N), "repeats": np.concatenate([
        many, [N, N]]), "none": np.array([], dtype=np.int64)}


def _made(block):
    return block * 3 - 2 if block.dtype.kind == "i" else block * np.float32(0.5) + np.float32(1.0)


def _data(dtype, opname, seed=7):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        if opname == "prod":  # made into 1 mostly, -2 and 4 now and then: long products seldom wrap
            return rng.choice(np.array([1, 0, 2], dtype), N, p=[0.96, 0.03, 0.01])
        return rng.integers(-10**6, 10**6, N, dtype=dtype)
    if opname == "prod":
        return (rng.standard_normal(N) * 0.02).astype(dtype)  # made into 1 + N(0, 0.01)
    return rng.standard_normal(N).astype(dtype)


def _lazy(a):
    return da.from_array(a, chunks=(CHUNKS,)).map_blocks(_made, dtype=a.dtype)


def _per_chunk(fn, *args):
    with dask.config.set({"multireduce.placement": False}):
        return fn(*args)


def _reduce_reference(host, offsets, opname):
    ends = np.append(offsets[1:], host.size)
    ident = get_operator(opname).identity(host.dtype)
    return np.array([UFUNC[opname].reduce(host[s:e]) if e > s else ident for s, e in zip(offsets, ends)],
                    dtype=host.dtype)


def _scan_reference(host, offsets, opname):
    starts = np.unique(np.concatenate([[0], offsets[offsets < host.size]])).astype(np.int64)
    bounds = np.append(starts, host.size)
    return np.concatenate([UFUNC[opname].accumulate(host[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("opname", sorted(UFUNC))
def test_lazy_chunks_give_the_per_chunk_graphs_bits_and_numpys_integers(cpu_client, opname):
    layouts = _offsets(np.random.default_rng(len(opname)))
    for dtype in (np.float32, np.int64):
        a = _data(dtype, opname)
        x = _lazy(a)
        host = _made(a)
        results, references = [], []
        for offsets in layouts.values():
            for fn in (mr.segment_reduce, mr.segment_scan):
                results.append(fn(x, offsets, opname))
                references.append(_per_chunk(fn, x, offsets, opname))
        assert all(task_count(r, "segment-pieces") <= GROUPS for r in results[::2])
        assert all(task_count(r, "segment-tails") <= GROUPS for r in results[1::2])
        assert all(task_count(r, "segment-pieces") == len(CHUNKS) for r in references[::2])
        got, ref = dask.compute(results, references)
        for (name, offsets), g_reduce, g_scan, r_reduce, r_scan in zip(layouts.items(), got[::2], got[1::2],
                                                                       ref[::2], ref[1::2]):
            assert g_reduce.shape == (offsets.size,) and g_scan.shape == (N,), name
            assert _same_bits(g_reduce, r_reduce), (dtype, name)
            assert _same_bits(g_scan, r_scan), (dtype, name)
            if dtype is np.int64:
                np.testing.assert_array_equal(g_reduce, _reduce_reference(host, offsets, opname), err_msg=name)
                np.testing.assert_array_equal(g_scan, _scan_reference(host, offsets, opname), err_msg=name)
            else:
                ref64 = _reduce_reference(host.astype(np.float64), offsets, opname)
                np.testing.assert_allclose(g_reduce, ref64, rtol=1e-4, atol=1e-3, err_msg=name)


_calls: list = []


def _counted(block, block_info=None):
    _calls.append(block_info[None]["chunk-location"][0])
    return block * 3 - 2


def _names(stream):
    """The task stream's task names, less Dask's finalize (the concatenation of the result's chunks)."""
    names = [t["key"][0] if isinstance(t["key"], tuple) else t["key"] for t in stream.data]
    return [n for n in names if not n.startswith("finalize-")]


def test_tasks_are_groups_not_chunks_and_each_chunk_is_made_once_per_pass(cpu_client):
    a = _data(np.int64, "sum", seed=11)
    x = da.from_array(a, chunks=(CHUNKS,)).map_blocks(_counted, dtype=a.dtype)
    offsets = np.sort(np.random.default_rng(2).integers(0, N + 1, 40))
    k = len(CHUNKS)
    for fn, first_stage, passes, tasks in [
        (mr.segment_reduce, "segment-pieces", [range(k)], lambda groups: groups + k),
        (mr.segment_scan, "segment-tails", [range(k - 1), range(k)], lambda groups: groups + 1 + k),
    ]:
        reference = _per_chunk(fn, x, offsets).compute()
        _calls.clear()
        with distributed.get_task_stream(cpu_client) as stream:
            got = fn(x, offsets).compute()
        names = _names(stream)
        groups = sum(1 for name in names if name.startswith(first_stage))
        assert 2 <= groups <= GROUPS
        assert len(names) == tasks(groups)  # the chunks are made inside them
        assert sorted(_calls) == sorted(i for p in passes for i in p)  # the last chunk seeds no scan
        assert _same_bits(got, reference)
        with dask.config.set({"multireduce.placement": False}), distributed.get_task_stream(cpu_client) as stream:
            fn(x, offsets).compute()
        # a task per chunk and stage at least, besides those making the chunks that Dask did not fuse
        assert len(_names(stream)) >= (2 * k if fn is mr.segment_reduce else 3 * k + 1)


def test_shared_work_and_placement_off_keep_a_task_per_chunk(cpu_client):
    a = _data(np.int64, "sum", seed=3)
    offsets = np.sort(np.random.default_rng(4).integers(0, N + 1, 30))
    rechunked = _lazy(a).rechunk(150)
    got = mr.segment_reduce(rechunked, offsets)
    assert task_count(got, "segment-pieces") == rechunked.numblocks[0]
    np.testing.assert_array_equal(got.compute(), _reduce_reference(_made(a), offsets, "sum"))
    scanned = mr.segment_scan(rechunked, offsets, "max")
    assert task_count(scanned, "segment-tails") == rechunked.numblocks[0]
    np.testing.assert_array_equal(scanned.compute(), _scan_reference(_made(a), offsets, "max"))
    few = da.from_array(a, chunks=N // 4 + 1) + 1  # a chunk per thread or fewer: nothing to gain
    assert task_count(mr.segment_reduce(few, offsets), "segment-pieces") == few.numblocks[0]
    with dask.config.set({"multireduce.placement": False}):
        assert task_count(mr.segment_scan(_lazy(a), offsets), "segment-tails") == len(CHUNKS)


def test_persisted_chunks_and_expressions_over_them(cpu_client):
    op = matmul_operator()  # non-commutative: every piece must come back in chunk order
    rng = np.random.default_rng(9)
    m = random_matrices(rng, 97 * 15 + 40)
    owners = [0, 1, 2, 0, 0, 1, 2, 2, 1, 0, 1, 2, 0, 1, 2]  # interleaved: a worker's chunks are no run
    held, workers = persist_spread(cpu_client, m[: 97 * 15], 97, owners)
    offsets = np.sort(rng.integers(0, held.shape[0] + 1, 25))
    offsets[5] = offsets[6]
    y = held.map_blocks(np.copy, dtype=m.dtype)  # made from held chunks, on the worker holding each
    for fn, stage in ((mr.segment_reduce, "segment-pieces"), (mr.segment_scan, "segment-tails")):
        # persisted input keeps its graph of a task per chunk
        assert task_count(fn(held, offsets, op), stage) == held.numblocks[0]
        got = fn(y, offsets, op)
        assert task_count(got, stage) == len(workers)  # one per worker holding chunks
        with distributed.get_task_stream(cpu_client) as stream:
            value = got.compute()
        assert sorted(t["worker"] for t in stream.data if t["key"][0].startswith(stage)) == workers  # run there
        assert _same_bits(value, _per_chunk(fn, y, offsets, op).compute())
        host = m[: 97 * 15]
        if fn is mr.segment_reduce:
            ends = np.append(offsets[1:], host.size)
            assert [int(v) for v in value] == [sequential_fold(host[s:e]) for s, e in zip(offsets, ends)]
        else:
            starts = np.unique(np.concatenate([[0], offsets[offsets < host.size]]))
            bounds = np.append(starts, host.size)
            expected = np.concatenate([sequential_scan(host[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])
            np.testing.assert_array_equal(value, expected)


def test_an_expression_over_one_held_chunk(cpu_client):
    a = np.random.default_rng(12).integers(-99, 99, 500)
    held = cpu_client.persist(da.from_array(a, chunks=500))
    distributed.wait(held)
    y = held * 3 - 2
    offsets = np.array([0, 10, 10, 250, 499])
    for fn, reference in ((mr.segment_reduce, _reduce_reference), (mr.segment_scan, _scan_reference)):
        for opname in ("sum", "max"):
            got = fn(y, offsets, opname).compute()
            np.testing.assert_array_equal(got, reference(a * 3 - 2, offsets, opname))
