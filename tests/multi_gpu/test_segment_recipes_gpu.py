"""segment_reduce / segment_scan over CuPy chunks made inside the graph on several GPUs (a LocalCUDACluster, one
worker per GPU): a few tasks per worker make the chunks and take their pieces on the GPU (brought to the
host together), with the bits of the graph of one task per chunk and NumPy's exact integers. The same logic
runs on a CPU cluster in tests/test_segment_recipes.py."""

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
from multireduce.operators import get_operator  # noqa: E402

from .test_multi_gpu import client  # noqa: E402, F401 - the module's cluster of one worker per GPU

UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
# 64 uneven chunks, two of them empty
CHUNKS = tuple(0 if i in (0, 37) else 20_000 + 997 * (i % 7) for i in range(64))
N = sum(CHUNKS)


def _make_block(dtype, opname, block_info=None):
    import cupy

    loc = block_info[None]["chunk-location"][0]
    rng = cupy.random.default_rng(11 + loc)
    shape = block_info[None]["chunk-shape"]
    if np.dtype(dtype).kind == "f":
        if opname == "prod":
            return (1 + (rng.random(shape, dtype=np.float32) - 0.5) * np.float32(0.02)).astype(dtype)
        return rng.random(shape, dtype=np.float32).astype(dtype) - 0.5
    if opname == "prod":  # mostly 1, now and then -1 or 2: long products seldom wrap (NumPy wraps alike)
        return cupy.asarray(np.random.default_rng(11 + loc).choice(np.array([1, -1, 2], dtype), shape,
                                                                   p=[0.97, 0.02, 0.01]))
    return rng.integers(-10**6, 10**6, size=shape, dtype=dtype)


def _lazy(dtype, opname):
    return da.map_blocks(_make_block, dtype, opname, chunks=(CHUNKS,), dtype=dtype, meta=cupy.empty(0, dtype=dtype))


def _per_chunk(fn, *args):
    with dask.config.set({"multireduce.placement": False}):
        return fn(*args).compute()


def _host(a):
    return cupy.asnumpy(cupy.asarray(a))


def _same_bits(a, b):
    a, b = _host(a), _host(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _offsets(rng):
    few = np.sort(rng.integers(0, N + 1, 20))
    few[3] = few[4]  # an empty segment
    return {"straddling": few, "many": np.sort(rng.integers(0, N + 1, 50_000)), "one": np.array([123]),
            "every": np.arange(N)}


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("opname", sorted(UFUNC))
def test_lazy_gpu_chunks_follow_recipes_with_the_per_chunk_graphs_bits(client, dtype, opname):
    x = _lazy(dtype, opname)
    host = _host(x.compute())
    threads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())
    for name, offsets in _offsets(np.random.default_rng(3)).items():
        for fn, stage in ((mr.segment_reduce, "segment-pieces"), (mr.segment_scan, "segment-tails")):
            lazy = fn(x, offsets, opname)
            with distributed.get_task_stream(client) as stream:
                got = lazy.compute()
            assert isinstance(got, cupy.ndarray)
            first = [t for t in stream.data if str(t["key"][0]).startswith(stage)]
            assert 1 <= len(first) <= 2 * threads, (name, len(first))  # groups, not the 64 chunks
            assert _same_bits(got, _per_chunk(fn, x, offsets, opname)), (name, fn.__name__)
            if np.dtype(dtype).kind == "i":
                reference = _reduce_reference if fn is mr.segment_reduce else _scan_reference
                np.testing.assert_array_equal(_host(got), reference(host, offsets, opname), err_msg=name)


def _reduce_reference(host, offsets, opname):
    """reduceat over the non-empty segments, the identity for the empty ones."""
    ends = np.append(offsets[1:], host.size)
    ref = np.full(offsets.size, get_operator(opname).identity(host.dtype), dtype=host.dtype)
    inside = offsets < host.size
    values = UFUNC[opname].reduceat(host, offsets[inside])
    full = (offsets < ends)[inside]
    ref[np.flatnonzero(inside)[full]] = values[full]
    return ref


def _scan_reference(host, offsets, opname):
    starts = np.unique(np.concatenate([[0], offsets[offsets < host.size]])).astype(np.int64)
    if starts.size == host.size:  # every element its own segment
        return host.copy()
    bounds = np.append(starts, host.size)
    return np.concatenate([UFUNC[opname].accumulate(host[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])
