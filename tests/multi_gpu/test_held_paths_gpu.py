"""The notebook paths on several GPUs (a LocalCUDACluster, one worker per GPU): expressions over persisted
CuPy chunks and reductions over some of their axes run where the chunks are with no task, lazily made
chunks take a few tasks per worker, several results computed together read the chunks once, and every
path gives the bits of the graph of one task per chunk. The same logic runs on CPU clusters in
tests/test_held_paths.py and tests/test_recipes.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
pytestmark = pytest.mark.multi_gpu

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import distributed  # noqa: E402

import multireduce as mr  # noqa: E402

from .test_multi_gpu import client  # noqa: E402, F401 - the module's cluster of one worker per GPU


def _make_block(seed, block_info=None):
    import cupy

    loc = block_info[None]["chunk-location"]
    shape = block_info[None]["chunk-shape"]
    flat = int(np.ravel_multi_index(loc, block_info[None]["num-chunks"]))
    return cupy.random.default_rng(seed + flat).random(shape, dtype=cupy.float32) - 0.5


def _gpu_array(shape, chunks, seed):
    return da.map_blocks(_make_block, seed, chunks=da.core.normalize_chunks(chunks, shape), dtype=np.float32,
                         meta=cupy.empty((0,) * len(shape), dtype=np.float32))


def _graph(fn, x):
    with dask.config.set({"multireduce.placement": False}):
        return fn(x).compute()


def _tasks(client, fn):
    with distributed.get_task_stream(client) as stream:
        value = fn()
    return value, len(stream.data)


def _same(a, b):
    a, b = cupy.asnumpy(cupy.asarray(a)), cupy.asnumpy(cupy.asarray(b))
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


EXPRESSIONS = {
    "sum": lambda v: mr.sum(v * 2), "var": lambda v: mr.var(v + 1), "argmax": lambda v: mr.argmax(abs(v)),
    "exact": lambda v: mr.sum(v * 3, exact=True), "mean_axis0": lambda v: mr.mean(v, axis=0),
    "sum_axis1": lambda v: mr.sum(v * 2, axis=1), "max_axis0": lambda v: mr.max(v - 1, axis=0, keepdims=True),
}


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_expressions_and_axes_of_held_chunks_run_where_they_are(client, name):
    fn = EXPRESSIONS[name]
    x = client.persist(_gpu_array((40_000, 96), (2_500, 96), seed=7))
    distributed.wait(x)
    value, tasks = _tasks(client, lambda: fn(x).compute())
    assert tasks == 0  # one call to the workers holding the chunks
    assert _same(value, _graph(fn, x))
    assert _same(client.compute(fn(x)).result(), value)  # the graph over held chunks: same bits


def _past_the_partials_limit(client, fn, x):
    """(``fn(x).compute()``, its task count) with ``direct.DIRECT_PARTIAL_BYTES`` below what the 24 chunks'
    partials of a 7 x 9 float64 result need and above one total per worker."""
    from multireduce import direct

    saved = direct.DIRECT_PARTIAL_BYTES
    direct.DIRECT_PARTIAL_BYTES = 24 * 7 * 9 * 8 // 2
    try:
        return _tasks(client, lambda: fn(x).compute())
    finally:
        direct.DIRECT_PARTIAL_BYTES = saved


@pytest.mark.parametrize("placement", ["dask", "interleaved"])
def test_float64_means_over_time_sum_each_workers_chunks_together(client, placement):
    """A float64 mean of float32 chunks whose sums are exact in any order: each worker sums its chunks of a
    lane on its GPU and one total per worker crosses, with the bits of the chunk-ordered tree, also past
    the per-chunk partials' limit; data whose sums round keep the ordered fold, with its bits."""
    from multireduce import direct

    fn = lambda v: mr.mean(v, axis=0, dtype=np.float64)  # noqa: E731
    workers = sorted(client.scheduler_info()["workers"])
    for scale in (1.0, 1e30):
        x = _gpu_array((6_000, 7, 9), (250, 7, 9), seed=5)
        if scale != 1.0:
            x = x * x.dtype.type(1.0) + da.where(x > 0.25, x.dtype.type(scale), x.dtype.type(0.0))
        if placement == "interleaved":
            x = da.concatenate([client.persist(x[i * 250:(i + 1) * 250], workers=[workers[i % len(workers)]])
                                for i in range(24)])
        x = client.persist(x)
        distributed.wait(x)
        ref = _graph(fn, x)
        direct.last_decline = None
        value, tasks = _tasks(client, lambda: fn(x).compute())
        assert tasks == 0 and direct.last_decline is None
        assert _same(value, ref)
        value, tasks = _past_the_partials_limit(client, fn, x)
        assert (tasks == 0) == (scale == 1.0)  # exact sums go direct; rounding ones take the graph
        assert _same(value, ref)


def test_float32_means_over_time_accumulate_in_float64_and_sum_each_workers_chunks_together(client):
    """The default float32 mean over some axes of CuPy chunks accumulates in float64
    (dtypes.WIDE_FLOAT32_OVER_SOME_AXES_OF_DASK_ON_GPUS): the float64 mean's bits rounded once to float32,
    on every path, and one total per worker crosses (past the per-chunk partials' limit too)."""
    from multireduce import direct

    x = client.persist(_gpu_array((6_000, 7, 9), (250, 7, 9), seed=9))
    distributed.wait(x)
    want = cupy.asnumpy(mr.mean(x, axis=0, dtype=np.float64).compute()).astype(np.float32)
    fn = lambda v: mr.mean(v, axis=0)  # noqa: E731
    direct.last_decline = None
    value, tasks = _tasks(client, lambda: fn(x).compute())
    assert tasks == 0 and direct.last_decline is None and value.dtype == np.float32
    assert _same(value, want) and _same(_graph(fn, x), want)
    assert _same(client.compute(fn(x)).result(), want)
    value, tasks = _past_the_partials_limit(client, fn, x)
    assert tasks == 0 and _same(value, want)
    host = cupy.asnumpy(x.compute()).astype(np.float64)
    np.testing.assert_allclose(cupy.asnumpy(value), host.mean(axis=0), rtol=2e-7, atol=1e-8)  # float64's, rounded


def test_axis_mean_against_numpy(client):
    x = client.persist(_gpu_array((4_000, 7, 9), (250, 7, 9), seed=3))
    distributed.wait(x)
    got = cupy.asnumpy(mr.mean(x, axis=0).compute())
    host = cupy.asnumpy(x.compute()).astype(np.float64)
    np.testing.assert_allclose(got, host.mean(axis=0), rtol=1e-4, atol=1e-6)


def test_axis_partials_are_folded_on_the_gpus_alike_on_every_path(client):
    """40 chunks: a tree of two levels, whose first-level groups a worker holding them folds itself; the
    partials of a reduction over some axes stay on the GPUs on every path, with the same bits."""
    from multireduce import graph

    shape, chunks = (40_000, 96), (1_000, 96)
    x = client.persist(_gpu_array(shape, chunks, seed=13))
    distributed.wait(x)
    host = cupy.asnumpy(x.compute()).astype(np.float64)
    from multireduce.core import Partial

    assert graph.stays_on_device(Partial(cupy.ones((1, 96)), 1))
    assert not graph.stays_on_device(Partial(cupy.ones((1, 1)), 1)) and not graph.stays_on_device(Partial(np.ones(9), 1))
    fns = {"mean": lambda v: mr.mean(v, axis=0), "nansum": lambda v: mr.nansum(v * 2, axis=0),
           "max": lambda v: mr.max(v, axis=0, keepdims=True)}
    for name, fn in fns.items():
        value, tasks = _tasks(client, lambda: fn(x).compute())
        assert tasks == 0
        assert type(value) is cupy.ndarray
        assert _same(value, _graph(fn, x)), name
        assert _same(client.compute(fn(x)).result(), value), name
        assert _same(fn(_gpu_array(shape, chunks, seed=13)).compute(), value), name  # lazily made chunks
    np.testing.assert_allclose(cupy.asnumpy(mr.mean(x, axis=0).compute()), host.mean(axis=0), rtol=1e-5, atol=1e-7)


def test_held_expression_scan_keeps_outputs_on_their_gpu(client):
    x = client.persist(_gpu_array((2**22,), (2**18,), seed=5))
    distributed.wait(x)
    out, tasks = _tasks(client, lambda: mr.cumsum(x * 2).persist())
    assert tasks == 0
    assert _same(out.compute(), _graph(lambda v: mr.cumsum(v * 2), x))


@pytest.mark.parametrize("what", ["sum", "cumsum", "var"])
def test_lazy_chunks_take_a_few_tasks_per_worker(client, what):
    lazy = _gpu_array((2**23,), (2**17,), seed=9)  # 64 chunks made in the graph
    fn = {"sum": mr.sum, "cumsum": mr.cumsum, "var": mr.var}[what]
    value, tasks = _tasks(client, lambda: fn(lazy).compute())
    workers = len(client.scheduler_info()["workers"])
    if what != "cumsum":
        assert tasks <= 2 * workers + 1  # two tasks per worker thread and the aggregate
    assert _same(value, _graph(fn, lazy))
    if what == "sum":
        host = cupy.asnumpy(lazy.compute()).astype(np.float64)
        assert abs(float(value) - host.sum()) <= 1e-5 * np.abs(host).sum()


def test_several_results_read_the_chunks_once(client):
    x = client.persist(_gpu_array((2**22,), (2**18,), seed=11))
    distributed.wait(x)
    fns = (mr.sum, mr.max, mr.var, lambda v: mr.sum(v, exact=True))
    together = dask.compute(*(fn(x * 2) for fn in fns))
    for got, fn in zip(together, fns):
        assert _same(got, _graph(fn, x * 2))


def test_client_compute_of_held_results_hands_the_values_over(client):
    """``client.compute`` / ``dask.compute`` of held results: one held call for those read together, one task
    per output block handing its value over (a CuPy array, made on the worker that runs it), the bits of
    the task graph (tests/test_held_value_graphs.py runs the same on a CPU cluster)."""
    x = client.persist(_gpu_array((2**22,), (2**18,), seed=13))
    m = client.persist(_gpu_array((2**10, 2**10), (2**7, 2**9), seed=14))
    distributed.wait([x, m])
    fns = (lambda: mr.sum(x), lambda: mr.var(x * 2), lambda: mr.max(x), lambda: mr.mean(m, axis=0))
    got, tasks = _tasks(client, lambda: dask.compute(*(fn() for fn in fns)))
    assert tasks <= len(fns) + 2  # the values handed over, and the axis mean's concatenation of its blocks
    with dask.config.set({"multireduce.held-values-in-graphs": False}):
        want = dask.compute(*(fn() for fn in fns))
    for g, w in zip(got, want):
        assert type(g) is type(w) is cupy.ndarray and _same(g, w)
    single, tasks = _tasks(client, lambda: client.compute(mr.sum(x)).result())
    assert tasks == 1 and _same(single, want[0])


def test_reductions_each_chunk_holds_persist_on_their_gpus(client):
    """Row sums, means, maxima and argmax of a tall CuPy matrix in row chunks, and of expressions over it:
    ``.persist()`` keeps each chunk's output block on the GPU holding the chunk (no task), CuPy blocks with
    the graph's bits."""
    m = client.persist(_gpu_array((40 * 4096, 32), (4096, 32), 31))
    distributed.wait(m)
    held = client.who_has(distributed.futures_of(m))
    for fn in (lambda v: mr.sum(v, axis=1), lambda v: mr.mean(v, axis=1, keepdims=True),
               lambda v: mr.max(v, axis=1), lambda v: mr.var(v, axis=1), lambda v: mr.sum(v * 2 - 1, axis=1),
               lambda v: mr.mean(da.where(v > 0, v, 0), axis=1), lambda v: mr.argmax(v, axis=1)):
        out, tasks = _tasks(client, lambda: fn(m).persist())
        assert tasks == 0 and "-chunks-" in out.name
        for key, where in client.who_has(distributed.futures_of(out)).items():
            assert where == held[(m.name, key[1], 0)], key
        got = out.compute()
        assert isinstance(got, cupy.ndarray) and _same(got, _graph(fn, m))
