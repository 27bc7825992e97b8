"""Shared test helpers: random data of every dtype, NumPy references, stated error bounds, a
non-commutative operator, and one comparison used by the CPU and GPU tests alike."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import time

import numpy as np

import multireduce as mr

ALL_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.float16, np.float32, np.float64]
AWKWARD_SIZES = [0, 1, 31, 32, 33, 1023, 1024, 1025, (1 << 20) + 3, (1 << 24) + 7]
BUILTIN_OPS = ["sum", "prod", "min", "max"]


def random_array(rng: np.random.Generator, shape, dtype, op: str = "sum") -> np.ndarray:
    """Random data, never zeros: full integer ranges (wrapping is part of the contract), floats in
    [-1, 1), and for float products values near 1 so that long products neither overflow nor vanish."""
    dtype = np.dtype(dtype)
    n = math.prod(shape) if isinstance(shape, tuple) else shape
    if dtype.kind == "b":
        # mostly True so that prod/min of bools is not trivially False
        return rng.random(shape) < (0.999 if op in ("prod", "min") else 0.5)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if op == "prod":
        spread = 1.0 / math.sqrt(max(n, 1))
        return np.exp(rng.normal(0.0, spread, size=shape)).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def numpy_result_dtype(opname: str, dtype) -> np.dtype:
    """What NumPy itself returns (the contract multireduce follows)."""
    x = np.ones(1, dtype=dtype)
    fn = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean,
          "cumsum": np.cumsum, "cumprod": np.cumprod}[opname]
    return np.asarray(fn(x)).dtype


def float_bound(acc_dtype, n: int, product: bool = False) -> float:
    """Relative error bound for a blocked tree reduction or scan in ``acc_dtype``.

    Sums: against the sum of |x|; at most n/1024 + 64 roundings lie on any element's path (sequential
    chains per thread and across tiles, plus log2 levels of trees), each at most eps of the running
    |sum|. Products: against |product|; every one of the n-1 multiplications contributes its rounding,
    whatever the order, so the bound is n eps."""
    eps = np.finfo(acc_dtype).eps
    return float(eps * (n + 64)) if product else float(eps * (n / 1024 + 64))


def reference_reduce(x: np.ndarray, opname: str, axis=None, keepdims=False):
    """float64 (floats) or exact NumPy (integers, bools) reference and the |x| mass for bounds."""
    if opname in ("min", "max"):
        fn = np.min if opname == "min" else np.max
        return fn(x, axis=axis, keepdims=keepdims), None
    if x.dtype.kind == "f" or opname == "mean":
        wide = x.astype(np.float64)
        if opname == "sum":
            return np.sum(wide, axis=axis, keepdims=keepdims), np.sum(np.abs(wide), axis=axis, keepdims=keepdims)
        if opname == "mean":
            return np.mean(wide, axis=axis, keepdims=keepdims), np.mean(np.abs(wide), axis=axis, keepdims=keepdims)
        ref = np.prod(wide, axis=axis, keepdims=keepdims)
        return ref, np.abs(ref)
    fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean}[opname]
    return fn(x, axis=axis, keepdims=keepdims), None


def assert_matches(got, ref, mass, acc_dtype, out_dtype, n: int, what: str = "", product: bool = False) -> None:
    """Exact for integers and bools; within ``float_bound`` (plus one rounding to the output) for floats."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.dtype == np.dtype(out_dtype), f"{what}: dtype {got.dtype}, expected {np.dtype(out_dtype)}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    if np.dtype(out_dtype).kind != "f" or mass is None:
        # integers, bools, and min/max of floats: exact (NaN in the same places)
        np.testing.assert_array_equal(got, ref.astype(out_dtype), err_msg=what)
        return
    bound = float_bound(acc_dtype, n, product) * np.asarray(mass, dtype=np.float64)
    bound = bound + np.finfo(out_dtype).eps * np.abs(ref)  # the final rounding to the output type
    bound = bound + np.finfo(out_dtype).tiny
    err = np.abs(got.astype(np.float64) - ref)
    worst = np.max(err - bound) if err.size else 0.0
    assert np.all(err <= bound), f"{what}: error exceeds bound by {worst:g} (max err {np.max(err):g})"


# ------------------------------------------------------------------------------------------------
# A non-commutative operator: products of 2x2 matrices over Z / 2^16, packed in a uint64
# (entries a00 | a01 << 16 | a10 << 32 | a11 << 48). Associative, not commutative.
# ------------------------------------------------------------------------------------------------
MATMUL_IDENTITY = 1 | (1 << 48)


def matmul2x2(a, b):
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    m = np.uint64(0xFFFF)
    s16, s32, s48 = np.uint64(16), np.uint64(32), np.uint64(48)
    a00, a01, a10, a11 = a & m, (a >> s16) & m, (a >> s32) & m, (a >> s48) & m
    b00, b01, b10, b11 = b & m, (b >> s16) & m, (b >> s32) & m, (b >> s48) & m
    c00 = (a00 * b00 + a01 * b10) & m
    c01 = (a00 * b01 + a01 * b11) & m
    c10 = (a10 * b00 + a11 * b10) & m
    c11 = (a10 * b01 + a11 * b11) & m
    return c00 | (c01 << s16) | (c10 << s32) | (c11 << s48)


def matmul2x2_scalar(a: int, b: int) -> int:
    """``matmul2x2`` of two Python ints, without NumPy: the CPU replays of the kernels combine one pair at a
    time, where a NumPy call per pair costs 30x more than the arithmetic (tests/test_segments.py checks
    that the two agree)."""
    a00, a01, a10, a11 = a & 0xFFFF, a >> 16 & 0xFFFF, a >> 32 & 0xFFFF, a >> 48 & 0xFFFF
    b00, b01, b10, b11 = b & 0xFFFF, b >> 16 & 0xFFFF, b >> 32 & 0xFFFF, b >> 48 & 0xFFFF
    return ((a00 * b00 + a01 * b10) & 0xFFFF | ((a00 * b01 + a01 * b11) & 0xFFFF) << 16
            | ((a10 * b00 + a11 * b10) & 0xFFFF) << 32 | ((a10 * b01 + a11 * b11) & 0xFFFF) << 48)


MATMUL_CUDA_PREAMBLE = r"""
__device__ __forceinline__ unsigned long long mm2(unsigned long long a, unsigned long long b) {
  const unsigned long long m = 0xFFFFull;
  unsigned long long a00 = a & m, a01 = (a >> 16) & m, a10 = (a >> 32) & m, a11 = (a >> 48) & m;
  unsigned long long b00 = b & m, b01 = (b >> 16) & m, b10 = (b >> 32) & m, b11 = (b >> 48) & m;
  return ((a00 * b00 + a01 * b10) & m) | (((a00 * b01 + a01 * b11) & m) << 16) |
         (((a10 * b00 + a11 * b10) & m) << 32) | (((a10 * b01 + a11 * b11) & m) << 48);
}
"""


def matmul_operator() -> mr.Operator:
    """Registered once per process (re-registering the same definition replaces it)."""
    return mr.register_operator(
        "matmul2x2",
        identity=MATMUL_IDENTITY,
        cpu=matmul2x2,
        cuda="mm2(a, b)",
        cuda_preamble=MATMUL_CUDA_PREAMBLE,
        commutative=False,
        kinds="u",
        replace=True,
    )


def sequential_fold(values: np.ndarray) -> int:
    """The exact left-to-right matrix product of a 1-d uint64 array (reference, O(n) Python ops, vectorised
    by halving: pairs (0,1), (2,3), ... which is the same product by associativity)."""
    v = np.asarray(values, dtype=np.uint64)
    if v.size == 0:
        return MATMUL_IDENTITY
    while v.size > 1:
        if v.size % 2:
            v = np.append(v, np.uint64(MATMUL_IDENTITY))
        v = matmul2x2(v[0::2], v[1::2])
    return int(v[0])


def sequential_scan(values: np.ndarray) -> np.ndarray:
    """Left-to-right inclusive matrix-product scan, one element at a time (slow, exact reference)."""
    out = np.empty(values.size, dtype=np.uint64)
    acc = np.uint64(MATMUL_IDENTITY)
    for i, v in enumerate(np.asarray(values, dtype=np.uint64)):
        acc = matmul2x2(acc, v)
        out[i] = acc
    return out


def random_matrices(rng, n: int) -> np.ndarray:
    """Random invertible matrices mod 2^16 (odd diagonal, even a01: odd determinant), so that long
    products never collapse to the zero matrix, as products of arbitrary ones do mod 2^16."""
    v = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    odd_diagonal = np.uint64(1 | (1 << 48))
    even_a01 = ~np.uint64(1 << 16)
    return (v | odd_diagonal) & even_a01


_spreads = itertools.count()


def workers_of(client, count: int) -> list[str]:
    """The sorted addresses of the client's workers, once at least ``count`` are connected: on a loaded
    machine a worker whose heartbeat came late can be briefly away from the scheduler."""
    client.wait_for_workers(count, timeout=60)
    return sorted(client.scheduler_info()["workers"])


def persist_spread(client, x: np.ndarray, chunk: int, owners: list[int]):
    """(a persisted dask array whose i-th block lives on worker owners[i], the sorted worker addresses):
    uneven and interleaved spreads on purpose. Block names carry the data's token and a number of their
    own, so two spreads never share keys, not even of the same data (keys of a spread just dropped may
    still be in the scheduler while the next one is placed)."""
    import dask.array as da
    import distributed
    from dask.base import tokenize
    from dask.core import flatten

    workers = workers_of(client, max(owners) + 1)
    token = tokenize(x)
    for _ in range(5):
        made = next(_spreads)
        # the concatenated array's chunks are tasks of their own, which Dask may run on another worker
        # than the block's (under load): such a spread is made again under new names
        blocks = [client.persist(da.from_array(x[i * chunk:(i + 1) * chunk], chunks=chunk,
                                               name=f"spread-{i}-{owner}-{made}-{token}"),
                                 workers=[workers[owner]])
                  for i, owner in enumerate(owners)]
        whole = client.persist(da.concatenate(blocks))
        distributed.wait(whole)
        who = client.who_has(whole)
        keys = list(flatten(whole.__dask_keys__()))
        if all(set(who.get(k, ())) == {workers[owner]} for k, owner in zip(keys, owners)):
            return whole, workers
        del whole, blocks
    raise AssertionError(f"five spreads of {len(owners)} blocks over {workers} did not stay where they were put")


# ------------------------------------------------------------------------------------------------
# Graph inspection (tests only)
# ------------------------------------------------------------------------------------------------
def graph_depth(array: "dask.array.Array") -> int:
    """Longest chain of dependent tasks in ``array``'s graph (input layers included)."""
    from dask.core import get_dependencies

    dsk = dict(array.__dask_graph__())
    depth: dict = {}

    def visit(key):
        if key in depth:
            return depth[key]
        stack = [(key, False)]
        while stack:
            k, done = stack.pop()
            deps = get_dependencies(dsk, k)
            if done:
                depth[k] = 1 + max((depth[d] for d in deps), default=0)
            elif k not in depth:
                stack.append((k, True))
                stack.extend((d, False) for d in deps if d not in depth)
        return depth[key]

    return max((visit(k) for k in dsk), default=0)


def task_count(array: "dask.array.Array", prefix: str) -> int:
    """How many tasks of ``array``'s graph have keys whose name starts with ``prefix``."""
    return sum(1 for k in array.__dask_graph__() if (k[0] if isinstance(k, tuple) else k).startswith(prefix))


def hostile_slices(shape, axis: int, seed: int = 3) -> np.ndarray:
    """Normal data of ``shape`` whose slices along ``axis`` are hostile: slice 0 holds inf, slice 1 inf and
    -inf, slice 2 a NaN (last), the last slice only NaN (what the statistics' rows and columns kernels get)."""
    x = np.random.default_rng(seed).normal(0, 1, shape)
    m = np.moveaxis(x, axis, -1)
    m[(0,) * (x.ndim - 1)][3] = np.inf
    m[(1,) * (x.ndim - 1)][[0, -1]] = [np.inf, -np.inf]
    m[(2,) * (x.ndim - 1)][-1] = np.nan
    m[(-1,) * (x.ndim - 1)][:] = np.nan
    return x


def kill_worker(client, address: str) -> None:
    """SIGKILL the worker process at ``address`` (its nanny starts a new one) and wait until the scheduler
    has let it go."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while address in client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline, f"{address} still listed after SIGKILL"
        time.sleep(0.05)


@contextlib.contextmanager
def task_graphs():
    """Held results computed by ``client.compute`` / ``dask.compute`` inside run their task graphs (the
    reference a test compares the held paths with), not the held call those would otherwise make."""
    import dask

    with dask.config.set({"multireduce.held-values-in-graphs": False}):
        yield
