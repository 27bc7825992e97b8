"""Dask arrays through the graph: uneven, one-element and empty chunks, split_every, 1-3 d, the graph's
shape (task counts, depth, keys, layer names), unknown chunk sizes, grouping, property tests, and a
real distributed cluster."""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multireduce as mr
from multireduce import graph
from multireduce.core import ReductionPlan, ScanPlan
from multireduce.operators import get_operator

from .helpers import (assert_matches, graph_depth, matmul_operator, random_array, random_matrices, reference_reduce,
                      sequential_fold, task_count)

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.usefixtures("synchronous_scheduler")]


CHUNKINGS = [
    ((1000,), (1000,)),
    ((1000,), ((1, 0, 499, 300, 0, 200),)),  # one-element and empty chunks
    ((1000,), ((1,) * 10 + (990,),)),
    ((40, 30), ((7, 0, 33), (1, 29))),
    ((6, 10, 9), ((1, 5), (3, 3, 4), (9,))),
]


# fan-in 2: the deepest tree, uneven groups at every level; 1000: one level
@pytest.mark.parametrize("split_every", [2, 1000])
@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("opname", ["sum", "prod", "min", "max", "mean"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_reductions_over_chunkings(dtype, opname, shape, chunks, split_every):
    x = random_array(np.random.default_rng(0), shape, dtype, opname)
    d = da.from_array(x, chunks=chunks)
    axes = [None] + list(range(len(shape))) + ([(0, len(shape) - 1)] if len(shape) > 1 else [])
    cases = [(axis, keepdims) for axis in axes for keepdims in (False, True)]
    lazies = [getattr(mr, opname)(d, axis=axis, keepdims=keepdims, split_every=split_every) for axis, keepdims in cases]
    assert all(isinstance(lazy, da.Array) for lazy in lazies)
    for (axis, keepdims), lazy, got in zip(cases, lazies, dask.compute(*lazies)):  # one scheduler run for all
        expected = np.asarray(getattr(np, opname)(x, axis=axis, keepdims=keepdims))
        assert lazy.shape == expected.shape and lazy.dtype == expected.dtype
        if expected.dtype.kind != "f":
            np.testing.assert_array_equal(got, expected)
        else:
            ref, mass = reference_reduce(x, opname, axis=axis, keepdims=keepdims)
            acc = np.float32 if expected.dtype == np.float16 else expected.dtype
            assert_matches(got, ref, mass, acc, expected.dtype, x.size, f"{opname} axis={axis}",
                           product=opname == "prod")


@pytest.mark.parametrize("shape,chunks", CHUNKINGS, ids=str)
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.int8], ids=lambda d: np.dtype(d).name)
def test_scans_over_chunkings(dtype, shape, chunks):
    x = random_array(np.random.default_rng(1), shape, dtype)
    d = da.from_array(x, chunks=chunks)
    for axis in [None] + list(range(len(shape))):
        got = mr.cumsum(d, axis=axis, split_every=3)
        assert got.chunks == (d.chunks if axis is not None else got.chunks)
        expected = np.cumsum(x, axis=axis)
        if expected.dtype.kind != "f":
            np.testing.assert_array_equal(got.compute(), expected)
        else:
            np.testing.assert_allclose(got.compute(), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(mr.cumprod(d.astype(np.int64), axis=axis).compute(),
                                      np.cumprod(x.astype(np.int64), axis=axis))


def test_empty_dask_arrays_follow_numpy():
    e = da.zeros((0, 5), chunks=(1, 5), dtype=np.float64)
    assert mr.sum(e).compute() == 0
    np.testing.assert_array_equal(mr.sum(e, axis=0).compute(), np.zeros(5))
    with pytest.raises(ValueError, match="zero-size array to reduction operation minimum"):
        mr.min(e)  # known shape: refused before any work
    assert np.isnan(mr.mean(e).compute())
    assert mr.cumsum(e, axis=0).compute().shape == (0, 5)


def test_unknown_chunk_sizes_work_or_say_so():
    x = np.arange(100, dtype=np.int64)
    d = da.from_array(x, chunks=10)
    unknown = d[d % 3 != 0]  # chunk sizes unknown until computed
    assert math.isnan(unknown.chunks[0][0])
    kept = x[x % 3 != 0]
    assert mr.sum(unknown).compute() == kept.sum()
    assert mr.max(unknown).compute() == kept.max()
    assert mr.mean(unknown).compute() == kept.mean()
    np.testing.assert_array_equal(mr.cumsum(unknown).compute(), np.cumsum(kept))
    empty_unknown = d[d < 0]
    with pytest.raises(ValueError, match="zero-size array"):
        mr.min(empty_unknown).compute()  # only knowable at run time
    two_d = da.from_array(np.ones((10, 4)), chunks=5)
    two_d = two_d[two_d[:, 0] > 0]
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        mr.cumsum(two_d)


def test_noncommutative_across_chunks():
    op = matmul_operator()
    x = random_matrices(np.random.default_rng(5), 1001)
    d = da.from_array(x, chunks=((1, 0, 300, 200, 500),))
    for split_every in (2, 3, 100):
        assert int(mr.reduce(d, op, split_every=split_every).compute()) == sequential_fold(x)
    np.testing.assert_array_equal(mr.scan(d, op).compute(), mr.scan(x, op))
    x2 = x[:1000].reshape(20, 50)
    d2 = da.from_array(x2, chunks=(7, 13))
    assert int(mr.reduce(d2, op).compute()) == sequential_fold(x2.ravel())
    np.testing.assert_array_equal(mr.reduce(d2, op, axis=1).compute(), mr.reduce(x2, op, axis=1))
    np.testing.assert_array_equal(mr.scan(d2, op, axis=1).compute(), mr.scan(x2, op, axis=1))


def test_results_are_lazy_with_numpy_meta_and_readable_names():
    d = da.ones(100, chunks=10)
    s = mr.sum(d, split_every=4)
    assert isinstance(s, da.Array) and type(s._meta) is np.ndarray
    assert s.name.startswith("sum-aggregate-")
    prefixes = {k[0].rsplit("-", 1)[0] for k in s.__dask_graph__() if isinstance(k, tuple)}
    assert {"sum-partial", "sum-aggregate"} <= prefixes
    # a lazy input streams: one partial task per chunk (none holds two chunks), one aggregate
    streamed = mr.sum(d)
    assert task_count(streamed, "sum-partial") == 10 and task_count(streamed, "sum-aggregate") == 1
    assert streamed.compute() == 100
    # one chunk is one task from chunk to result
    single = mr.sum(da.ones(7, chunks=7))
    assert task_count(single, "sum-partial") == 0 and task_count(single, "sum-aggregate") == 1
    assert single.compute() == 7
    assert mr.cumsum(d).name.startswith("cumsum-")
    assert mr.mean(d).name.startswith("mean-aggregate-")


def test_keys_are_deterministic():
    d = da.from_array(np.arange(100), chunks=10)
    assert mr.sum(d).name == mr.sum(d).name
    assert mr.sum(d).name != mr.sum(d, split_every=3).name
    assert mr.cumsum(d).name == mr.cumsum(d).name
    assert mr.sum(d).name != mr.prod(d).name


@pytest.mark.parametrize("n_chunks", [1, 2, 10, 100, 1000])
def test_scan_graph_is_linear_with_constant_depth(n_chunks):
    d = da.ones(n_chunks * 4, chunks=4)
    s = mr.cumsum(d, split_every=8)
    tasks = len(dict(s.__dask_graph__()))
    # input chunks + one totals task per chunk but the last + one carries task + one scan task per chunk
    assert tasks <= 3 * n_chunks
    assert graph_depth(s) <= 4  # input -> totals -> carries -> scan
    np.testing.assert_array_equal(s.compute(), np.arange(1, n_chunks * 4 + 1))


@pytest.mark.parametrize("n_chunks,split_every", [(100, 4), (1000, 16), (64, 2)])
def test_reduction_tree_depth_is_logarithmic(n_chunks, split_every):
    d = da.ones(n_chunks, chunks=1)
    s = mr.sum(d, split_every=split_every)
    assert graph_depth(s) <= 2 + math.ceil(math.log(n_chunks, split_every)) + 1
    assert s.compute() == n_chunks


def test_groups_make_one_task_per_group():
    """The hook the multi-GPU layer uses: the task count follows the groups, not the chunks."""
    x = np.arange(1000, dtype=np.int64)
    d = da.from_array(x, chunks=10)  # 100 chunks
    two_groups = lambda keys: [list(keys[:37]), list(keys[37:])]  # noqa: E731
    op = get_operator("sum")
    plan = ReductionPlan(op, (0,), np.dtype(np.int64), np.dtype(np.int64), False, label="sum")
    s = graph.reduction(d, plan, split_every=16, groups=two_groups)
    # two stages: the partials, then one aggregate that combines and finalizes
    assert task_count(s, "sum-partial") == 2 and task_count(s, "sum-combine") == 0
    assert task_count(s, "sum-aggregate") == 1
    assert s.compute() == x.sum()
    splan = ScanPlan(op, 0, np.dtype(np.int64), np.dtype(np.int64), label="cumsum")
    c = graph.scan(d, splan, split_every=16, groups=lambda keys: [list(keys)])
    # few groups: the scan tasks fold the totals themselves, no carries stage
    assert task_count(c, "cumsum-totals") == 1 and task_count(c, "cumsum-carries") == 0
    many = graph.scan(d, splan, split_every=2)  # 99 one-chunk groups: a carries task
    assert task_count(many, "cumsum-carries") == 1
    np.testing.assert_array_equal(many.compute(), np.cumsum(x))
    np.testing.assert_array_equal(c.compute(), np.cumsum(x))
    with pytest.raises(ValueError, match="groups: expected non-empty groups"):
        graph.reduction(d, plan, split_every=16, groups=lambda keys: [list(keys[1:])])


def test_split_every_validation_and_config():
    d = da.ones(100, chunks=10)
    with pytest.raises(ValueError, match="argument 'split_every' must be an int >= 2"):
        mr.sum(d, split_every=1)
    with pytest.raises(ValueError, match="argument 'split_every' must be an int >= 2"):
        mr.sum(d, split_every=True)
    assert mr.sum(d, split_every={0: 3}).compute() == 100
    with dask.config.set(split_every=2):
        assert graph_depth(mr.sum(da.ones(64, chunks=1))) >= 7


def test_dask_input_is_not_modified_and_chunk_type_matches():
    x = np.arange(20.0)
    d = da.from_array(x, chunks=5)
    before = d.name
    out = mr.cumsum(d)
    assert d.name == before and type(out._meta) is np.ndarray
    np.testing.assert_array_equal(x, np.arange(20.0))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    data=st.data(),
    opname=st.sampled_from(["sum", "min", "max", "prod"]),
    split_every=st.integers(2, 5),
)
def test_property_any_shape_and_chunking(shape, data, opname, split_every):
    shape = tuple(shape)
    chunks = tuple(
        tuple(_split(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=6)), n)) for n in shape
    )
    x = random_array(np.random.default_rng(sum(shape)), shape, np.int64, opname)
    d = da.from_array(x, chunks=chunks)
    axis = data.draw(st.sampled_from([None] + list(range(len(shape)))))
    try:
        expected = getattr(np, opname)(x, axis=axis)
    except ValueError:
        with pytest.raises(ValueError):
            getattr(mr, opname)(d, axis=axis, split_every=split_every).compute()
        return
    np.testing.assert_array_equal(getattr(mr, opname)(d, axis=axis, split_every=split_every).compute(), expected)
    scan_axis = 0 if axis is None else axis
    np.testing.assert_array_equal(mr.cumsum(d, axis=scan_axis, split_every=split_every).compute(),
                                  np.cumsum(x, axis=scan_axis))


def _split(sizes, n):
    """Chunk sizes summing to n (zeros allowed only for n == 0)."""
    out, left = [], n
    for s in sizes:
        if left <= 0:
            break
        out.append(min(s, left))
        left -= out[-1]
    if left > 0:
        out.append(left)
    return out or [0]


def test_on_a_real_distributed_cluster():
    """A real scheduler and worker processes (port 0), cleaned up afterwards."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, scheduler_port=0,
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as client, \
            dask.config.set(scheduler=client):
        x = random_array(np.random.default_rng(9), (400, 30), np.int64)
        d = client.persist(da.from_array(x, chunks=(37, 11)))
        with distributed.get_task_stream(client) as stream:
            assert client.compute(mr.sum(d)).result() == x.sum()
        ran = {(t["key"][0] if isinstance(t["key"], tuple) else t["key"]).rsplit("-", 1)[0] for t in stream.data}
        assert "sum-partial" in ran  # the graph's tasks ran on the workers (the last ones may be fused)
        assert {t["worker"] for t in stream.data} <= set(client.scheduler_info()["workers"])
        np.testing.assert_array_equal(client.compute(mr.max(d, axis=0)).result(), x.max(axis=0))
        np.testing.assert_array_equal(client.compute(mr.cumsum(d, axis=0)).result(), np.cumsum(x, axis=0))
        op = matmul_operator()  # a user operator travels inside the tasks
        m = random_matrices(np.random.default_rng(10), 500)
        dm = da.from_array(m, chunks=33)
        assert int(client.compute(mr.reduce(dm, op)).result()) == sequential_fold(m)
