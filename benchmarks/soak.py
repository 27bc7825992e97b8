"""Soak test: N client processes send mixed reductions and scans to one cluster in rounds; every result is
checked against NumPy, worker memory is sampled after a warm-up and after every round, and small-request
throughput is reported next to dask.array.sum on the same requests.

    python -m benchmarks soak                     # default: 4 clients x 80 requests, 1 KB .. 1 GB (~2 min)
    python -m benchmarks soak --full              # the full size: 4 clients x 500 requests, 1 KB .. 1 GB
    python -m benchmarks soak --cpu --clients 2 --requests 20 --max-bytes 1e6
    python -m benchmarks soak --memory-probe [--sizes-mb 1,64,1024] [--report-mb 16]

Memory is judged after a warm-up, not from a cold start: the first use of each dtype, operation and size
class loads kernel modules, sizes workspaces and fills Dask's and our caches, and that is a one-off cost,
not a leak. The warm-up runs every (dtype, operation, size class) eagerly on every worker and through Dask
from every client process; then the baseline is sampled; then each round's requests run and the workers
are sampled again once the scheduler holds no task. A sample is taken after a garbage collection,
``malloc_trim`` (RSS then counts live memory, not the allocator's free lists) and, on GPUs, after CuPy's
pool has returned its unused blocks (the driver then counts live arrays, the context and loaded modules, not
blocks cached for the largest request so far). Reported per worker: the growth from the baseline to the
last round and the per-round slope (least squares); the run fails where the growth passes the tolerances,
or where a cache of ours without a size bound grew after the warm-up.

``--memory-probe`` asks which operation leaves driver-level GPU memory behind outside CuPy's pool, in one
process on one GPU, no cluster: each soak operation (OPS) on every GPU dtype at several sizes
(``--sizes-mb``), eagerly on a CuPy array; after each, a synchronize and the pool's free blocks returned,
then this process's NVML reading against the baseline (taken after one small run of everything). A
reading above it that a later trivial launch or a second sample brings back is a transient reservation
(local memory resized for a kernel, for one), not a leak. Prints the operations whose reading passed
``--report-mb``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import threading
import time

import numpy as np

from benchmarks import harness as h

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", "bool"]
OPS = ["sum", "min", "max", "mean", "cumsum", "argmax", "var", "nansum"]
# lower edges in bytes: the one-block, several-block and many-chunk regimes of the kernels and the graph
SIZE_CLASSES = {"small": 1024, "medium": 64 * 2**10, "large": 16 * 2**20}
# Growth allowed per worker between the baseline (after the warm-up) and the last round. What may still grow
# then, measured on a CPU cluster (2026-11-26, tracemalloc; ~9 KB per request per worker, all in Dask's and
# distributed's bookkeeping, none in ours): distributed's in-memory logs (1,000-entry transfer and state
# logs, 10,000 log records, 7,200 system-monitor samples), the profiler's history (1,000 one-second
# cycles, ~15 MB when full), dask's key_split cache (100,000 entries, ~20 MB when full), and the
# worker's performance digests (``digests_total`` / ``digests_max``: ~12 keys and ~2.3 KB per request,
# with no bound: a new span each time the cluster goes idle); our caches with a size bound; allocator noise
# after malloc_trim. Each sample records the digests' and key_split's sizes beside RSS. A request's data
# is 1 KB - 1 GB (tens of MB typical), so keeping the arrays of even a few requests passes 64 MiB. On the
# GPU, after the pool returned its free blocks, nothing of a request may stay; a kernel module or
# workspace first loaded after the warm-up is 1-2 MB.
RSS_TOL = 64 * 2**20
GPU_TOL = 64 * 2**20
FULL = {"clients": 4, "requests": 500, "min_bytes": 1024, "max_bytes": 1e9}


def ops_for(dtype) -> list[str]:
    kind = np.dtype(dtype).kind
    if kind == "c":  # no order, and no complex statistics kernels
        return ["sum", "mean", "cumsum"]
    if kind == "b":  # as NumPy, a boolean cumsum or mean changes dtype: covered by the integer types
        return [op for op in OPS if op not in ("cumsum", "mean")]
    return list(OPS)


def dtypes_for(gpu: bool) -> list[str]:
    # complex data runs on the CPU backend only (dtypes.GPU_DTYPES)
    return [d for d in DTYPES if not (gpu and np.dtype(d).kind == "c")]


def warmup_grid(gpu: bool, min_bytes: int, max_bytes: int) -> list[tuple[str, str, int]]:
    """Every (dtype, operation, size class) the run can send, at the class's lower edge clipped to the run's
    range."""
    edges = sorted({min(max(edge, min_bytes), max_bytes) for edge in SIZE_CLASSES.values()})
    return [(d, op, nbytes) for d in dtypes_for(gpu) for op in ops_for(d) for nbytes in edges]


def cache_sizes() -> dict[str, tuple[int, int | None]]:
    """Our memos in this process: name -> (entries, bound; None: no bound). Module-level ``lru_cache``
    functions, and module-level dicts with a lower-case private name (upper-case ones are tables) whose
    bound, where they have one, is the module's ``_MAX_<NAME>``."""
    out = {}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname == "multireduce" or modname.startswith("multireduce.")):
            continue
        for attr, obj in list(vars(mod).items()):
            info = getattr(obj, "cache_info", None)
            if callable(info) and getattr(obj, "__module__", None) == modname:
                ci = info()
                out[f"{modname}.{attr}"] = (ci.currsize, ci.maxsize)
            elif isinstance(obj, dict) and attr.startswith("_") and not attr.startswith("__") \
                    and attr != attr.upper():
                out[f"{modname}.{attr}"] = (len(obj), getattr(mod, "_MAX_" + attr.lstrip("_").upper(), None))
    return out


def _sample(dask_worker=None):
    """On a worker, between rounds: RSS, and where CuPy is in use the pool and driver-level GPU bytes."""
    import ctypes
    import gc

    import psutil

    gc.collect()
    out = {}
    cupy = sys.modules.get("cupy")
    gpu = cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0
    if gpu:
        # cupy.asarray(host) stages through a pinned buffer that CuPy holds until its next pinned allocation
        # (pinned_memory's event watcher), then keeps in the pinned pool: up to the largest recent chunk
        # (~1 GB here), bounded, not a leak. Released before RSS is read, so RSS counts what we keep.
        cupy.cuda.Device().synchronize()
        cupy.cuda.alloc_pinned_memory(0)  # the watcher lets go of finished transfers' buffers
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    try:  # RSS then counts live memory, not glibc's free lists
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    out["rss"] = psutil.Process().memory_info().rss
    # distributed's and dask's own growth (see RSS_TOL): reported beside RSS, not cleared
    out["digest_keys"] = len(getattr(dask_worker, "digests_total", ()) or ())
    key_split = getattr(sys.modules.get("dask.utils"), "key_split", None)
    info = getattr(key_split, "cache_info", None)
    out["key_split_cache"] = info().currsize if callable(info) else None
    if gpu:
        pool = cupy.get_default_memory_pool()
        out["pool_used"], out["pool_held"] = pool.used_bytes(), pool.total_bytes()
        pool.free_all_blocks()
        out["gpu_used"], out["gpu_scope"] = h.device_memory_reader(cupy)()
    out["caches"] = cache_sizes()
    return out


def _data(rng, dtype, n, op):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        hi = min(int(info.max), 100) + 1  # small values: sums of 1 GB of int8 stay exact in int64 references
        return rng.integers(max(int(info.min), -100), hi, n).astype(dt)
    x = rng.standard_normal(n) + (1j * rng.standard_normal(n) if dt.kind == "c" else 0)
    x = x.astype(dt)
    if op == "nansum" and n > 1:
        x[rng.random(n) < 0.01] = np.nan
    return x


# A request of up to 1 GB is made twice (its chunks on the workers, the reference on the client) and checked
# once: single-threaded that is seconds per request, and 4 x 500 requests would not fit one device call.
# Both sides make a chunk in pieces of PIECE elements, each from its own seed, on threads (NumPy's generators
# and ufuncs release the GIL), so worker and client make the same bits; the check works piece by piece too.
PIECE = 1 << 22


def _map(fn, n: int) -> list:
    """``fn(lo, hi)`` over [0, n) in pieces of PIECE elements, on threads; results in order. A pool per
    call (a thread start is microseconds against a piece's milliseconds): no module state, which would
    travel with ``_chunk`` when the soak runs as a script (cloudpickle takes __main__'s functions by value,
    and a lock or a pool cannot be pickled) and which threads of one worker would race to create."""
    bounds = [(lo, min(lo + PIECE, n)) for lo in range(0, n, PIECE)] or [(0, 0)]
    if len(bounds) == 1:
        return [fn(*bounds[0])]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(8, len(bounds), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda b: fn(*b), bounds))


def _block(dtype, op, seed, index, n):
    """Chunk ``index`` of a request (n elements): the same bits wherever it is made."""
    out = np.empty(n, dtype=np.dtype(dtype))

    def fill(lo, hi):
        out[lo:hi] = _data(np.random.default_rng([seed, index, lo // PIECE]), dtype, hi - lo, op)

    _map(fill, n)
    return out


def _eps(dt) -> float:
    size = dt.itemsize // 2 if dt.kind == "c" else dt.itemsize
    return {2: 1e-2, 4: 1e-5, 8: 1e-12}.get(size, 1e-5) if dt.kind in "fc" else 1e-12


def _check(op, got, host):
    """``got`` against a reference from ``host`` in float64 / complex128 / int64, piece by piece."""
    dt = host.dtype
    n = host.size
    ref_t = np.complex128 if dt.kind == "c" else np.int64 if dt.kind in "iub" else np.float64
    got = np.asarray(got)
    if op == "argmax":  # ties: NumPy and multireduce both take the lowest index
        assert int(got) == int(np.argmax(host)), (op, dt, got, np.argmax(host))
        return
    if op == "var":  # Chan's merge of the pieces' (count, mean, M2)
        parts = _map(lambda lo, hi: (hi - lo, host[lo:hi].mean(dtype=np.float64),
                                     host[lo:hi].var(dtype=np.float64) * (hi - lo)), n)
        count, mean, m2 = parts[0]
        for c, m, q in parts[1:]:
            delta, total = m - mean, count + c
            mean, m2, count = mean + delta * c / total, m2 + q + delta * delta * count * c / total, total
        ref = m2 / count
        rtol = max(_eps(dt), 1e-9) * 10
        assert np.isclose(float(got), ref, rtol=rtol, atol=rtol * abs(ref)), (op, dt, got, ref)
        return
    if op in ("min", "max"):
        ref = getattr(np, op)(np.array(_map(lambda lo, hi: getattr(np, op)(host[lo:hi]), n)))
        assert np.array_equal(np.asarray(got, dtype=dt), ref, equal_nan=dt.kind == "f"), (op, dt, got, ref)
        return
    reduce = np.nansum if op == "nansum" else np.sum
    sums = np.array(_map(lambda lo, hi: reduce(host[lo:hi], dtype=ref_t), n), dtype=ref_t)
    if dt.kind in "fc" or op == "mean":  # the float tolerance: sqrt(n) roundings of the largest magnitude
        eps = _eps(dt)
        scale = np.sqrt(n) * eps * max(1.0, max(_map(
            lambda lo, hi: float(np.fmax.reduce(np.abs(host[lo:hi]), initial=0)), n)))
        rtol, atol = eps * 10, scale * 10 / (n if op == "mean" else 1)
    if op != "cumsum":
        ref = sums.sum() / n if op == "mean" else sums.sum()
        if dt.kind in "iub" and op != "mean":
            assert np.array_equal(np.asarray(got, dtype=ref_t), ref), (op, dt, got, ref)
        else:
            assert np.allclose(np.asarray(got).astype(ref.dtype), ref, rtol=rtol, atol=atol), (op, dt, got, ref)
        return
    assert got.shape == host.shape, (op, dt, got.shape, host.shape)
    offsets = np.concatenate([[0], np.cumsum(sums)[:-1]]).astype(ref_t)

    def same(lo, hi):
        ref = np.cumsum(host[lo:hi], dtype=ref_t)
        ref += offsets[lo // PIECE]
        if dt.kind in "iub":
            return np.array_equal(got[lo:hi].astype(np.int64, copy=False), ref)
        return np.allclose(got[lo:hi].astype(ref_t, copy=False), ref, rtol=rtol, atol=atol)

    assert all(_map(same, n)), (op, dt)


def _chunk(spec, block_info=None):
    dtype, op, seed, gpu = spec
    info = block_info[None]
    block = _block(dtype, op, seed, info["chunk-location"][0], info["chunk-shape"][0])
    if gpu:
        import cupy

        return cupy.asarray(block)
    return block


def _request(client, spec, gpu):
    """Build, send and check one request: (dtype, op, n, n_chunks, persist, seed)."""
    import dask.array as da

    import multireduce as mr

    dtype, op, n, n_chunks, persist, seed = spec
    # each chunk is made where it runs, from its own seeds, and the reference here from the same seeds
    # while the cluster works: a graph that carried the data would ship up to 1 GB per request through the
    # scheduler
    dt = np.dtype(dtype)
    step = max(-(-n // n_chunks), 1)
    sizes = tuple(min(step, n - start) for start in range(0, n, step))
    meta = __import__("cupy").empty(0, dt) if gpu else np.empty(0, dt)  # CuPy chunks: CuPy meta
    x = da.map_blocks(_chunk, dtype=dt, chunks=(sizes,), meta=meta, spec=(dtype, op, seed, gpu))
    if persist:
        x = client.persist(x)
    future = client.compute(getattr(mr, op)(x))
    host = np.empty(n, dtype=dt)
    for i, start in enumerate(range(0, n, step)):
        host[start:start + sizes[i]] = _block(dtype, op, seed, i, sizes[i])
    got = future.result()
    del future
    if gpu and hasattr(got, "get"):
        got = got.get()
    _check(op, got, host)
    if gpu:  # results arrive as CuPy arrays on GPU 0: the client's pool would hold blocks as large as the
        # largest result there, and a worker on that GPU that can only read the whole GPU's use would count them
        import cupy

        del got
        cupy.get_default_memory_pool().free_all_blocks()


def _specs(rng, n_requests, min_bytes, max_bytes, gpu):
    out = []
    kinds = dtypes_for(gpu)
    for _ in range(n_requests):
        dtype = kinds[rng.integers(len(kinds))]
        ops = ops_for(dtype)
        op = ops[rng.integers(len(ops))]
        nbytes = int(np.exp(rng.uniform(np.log(min_bytes), np.log(max_bytes))))
        n = max(nbytes // np.dtype(dtype).itemsize, 1) + int(rng.integers(0, 3))
        out.append((dtype, op, n, int(rng.integers(1, 9)), bool(rng.random() < 0.5), int(rng.integers(2**31))))
    return out


def _client_main(address, index, warmup, rounds, gpu, barrier, queue, timeout, stop):
    """One client process: its share of the warm-up, then each round's requests; after each stage it waits
    at the barrier twice (work done; the parent has sampled). ``stop`` set by the parent between the two
    waits ends the run after that stage (the deadline), so a partial soak still reports."""
    from distributed import Client

    done, stage = 0, "connect"
    try:
        with Client(address, timeout=60) as client:
            stage = "warm-up"
            for spec in warmup:
                _request(client, spec, gpu)
            barrier.wait(timeout), barrier.wait(timeout)
            for r, specs in enumerate(rounds):
                if stop.is_set():
                    break
                stage = f"round {r}"
                for spec in specs:
                    _request(client, spec, gpu)
                    done += 1
                barrier.wait(timeout), barrier.wait(timeout)
        queue.put((index, done, None))
    except BaseException as exc:  # the parent reports which client failed, where and why
        barrier.abort()
        queue.put((index, done, f"{stage}: {type(exc).__name__}: {exc}"))


def _warm_worker(grid, gpu):
    """On a worker: every (dtype, op, size class) once, eagerly, so that each worker has loaded its kernels."""
    import multireduce as mr

    rng = np.random.default_rng(0)
    for dtype, op, nbytes in grid:
        host = _data(rng, dtype, max(nbytes // np.dtype(dtype).itemsize, 1), op)
        if gpu:
            import cupy

            host = cupy.asarray(host)
        getattr(mr, op)(host)
    return len(grid)


def _quiet(client, timeout=30.0):
    """Wait until the scheduler holds no task: the clients' released keys are gone from the workers."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _throughput(client, gpu, n=200):
    import dask.array as da

    import multireduce as mr

    rng = np.random.default_rng(1)
    host = rng.standard_normal(128).astype(np.float64)  # 1 KB
    x = da.from_array(host, chunks=64)
    if gpu:
        import cupy

        x = x.map_blocks(cupy.asarray, dtype=x.dtype)
    x = client.persist(x)
    out = {}
    for name, fn in (("multireduce.sum", mr.sum), ("dask.array.sum", lambda a: a.sum())):
        client.compute(fn(x)).result()
        t0 = time.perf_counter()
        for _ in range(n):
            client.compute(fn(x)).result()
        out[name] = n / (time.perf_counter() - t0)
    return out


def _progress_line(stage: int, seconds: float, samples: list[dict]) -> str:
    """One line per stage: how long it took and each worker's growth over the baseline so far (MB)."""
    base, now = samples[0], samples[-1]
    grew = {w: {m: round((now[w][m] - base[w][m]) / 2**20) for m in ("rss", "pool_used", "gpu_used")
                if m in now[w] and m in base.get(w, {})} for w in now}
    name = "warm-up" if stage == 0 else f"round {stage}"
    return f"soak: {name} done in {seconds:.1f} s; growth MB per worker {json.dumps(grew)}"


def _slope(values) -> float:
    """Least-squares growth per round over baseline, round 1, ..."""
    if len(values) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(values)), np.asarray(values, dtype=np.float64), 1)[0])


#: Driver-level GPU use is judged on the smaller of the last two rounds' samples: the driver holds memory
#: outside CuPy's pool for a round or two after some requests (the 4 x H200 soak of 2026-11-26 read +1.5
#: to +4.2 GB on one worker or another after 6 of 10 rounds, at most two in a row, each back to within
#: 20 MB of the baseline later, with the pool flat throughout), and a leak does not come back down; a leak
#: that starts in the last round alone cannot be told from such a reservation. With one round, its sample.
PERSIST_ROUNDS = 2


def summarize(samples: list[dict], rss_tol: int, gpu_tol: int) -> dict:
    """``samples``: the baseline and one sample per round, each {worker: _sample()}. Per worker and metric:
    growth (last - baseline), slope per round, and what passed its tolerance (for driver-level GPU use
    the growth that persisted over the last PERSIST_ROUNDS rounds, beside its peak); caches of ours
    without a bound that grew after the warm-up."""
    tol = {"rss": rss_tol, "pool_used": gpu_tol, "gpu_used": gpu_tol}
    base, last = samples[0], samples[-1]
    growth, slope, leaks, caches, persisted, peak = {}, {}, {}, {}, {}, {}
    for w in base:
        growth[w], slope[w] = {}, {}
        for metric in ("rss", "pool_used", "gpu_used"):
            if metric not in base[w] or w not in last:
                continue
            rounds = [s[w][metric] - base[w][metric] for s in samples[1:] if w in s]
            growth[w][metric] = last[w][metric] - base[w][metric]
            slope[w][metric] = _slope([s[w][metric] for s in samples if w in s])
            judged = growth[w][metric]
            if metric == "gpu_used" and rounds:
                judged = min(rounds[-PERSIST_ROUNDS:]) if len(rounds) >= PERSIST_ROUNDS else rounds[-1]
                persisted[w], peak[w] = judged, max(rounds)
            if judged > tol[metric]:
                leaks.setdefault(w, {})[metric] = judged
        for name, (entries, bound) in last.get(w, {}).get("caches", {}).items():
            before = base[w]["caches"].get(name, (0, bound))[0]
            if bound is None and entries > before:
                caches.setdefault(w, {})[name] = (before, entries)
    bookkeeping = {w: {k: last[w][k] - base[w][k] for k in ("digest_keys", "key_split_cache")
                       if isinstance(base[w].get(k), int) and isinstance(last.get(w, {}).get(k), int)}
                   for w in base}
    return {"growth_bytes": growth, "slope_bytes_per_round": slope, "tolerance_bytes": tol, "leaks": leaks,
            "gpu_used_persisted_bytes": persisted, "gpu_used_peak_bytes": peak, "unbounded_cache_growth": caches,
            "distributed_bookkeeping_growth": bookkeeping}


def run(clients=4, requests=80, min_bytes=1024, max_bytes=1e9, cpu=False, seed=0, rss_tol=RSS_TOL,
        gpu_tol=GPU_TOL, rounds=5, throughput_requests=200, timeout=1800.0, warmup=True,
        deadline=None, progress=None) -> dict:
    """``requests`` per client, split into ``rounds``; returns the report (``ok``: every result right, no
    memory growth past the tolerances, no unbounded cache growth). ``warmup=False`` takes the baseline from a
    cold cluster instead (to see what the warm-up absorbs). After ``deadline`` seconds no new round starts
    and the report covers the rounds done (``complete`` is then false), because a device call that is cut
    off returns nothing. ``progress(line)`` is called after each stage."""
    from distributed import Client

    from multireduce.cluster import local_cluster

    gpu = not cpu
    min_bytes, max_bytes = int(min_bytes), int(max_bytes)
    rng = np.random.default_rng(seed)
    grid = warmup_grid(gpu, min_bytes, max_bytes) if warmup else []
    # the Dask warm-up: the grid split over the clients, persisted and lazy, chunked so that every worker
    # takes part in the larger classes
    warm_specs = [(d, op, max(nb // np.dtype(d).itemsize, 1), 8, bool(i % 2), int(rng.integers(2**31)))
                  for i, (d, op, nb) in enumerate(grid)]
    per_client = [_specs(np.random.default_rng([seed, i]), requests, min_bytes, max_bytes, gpu) for i in range(clients)]
    cuts = np.linspace(0, requests, rounds + 1).astype(int)
    # CuPy's own pool, said explicitly (local_cluster's default is RMM's asynchronous allocator where rmm is
    # installed): the samples read live bytes from CuPy's pool and driver-level use after emptying it, and
    # RMM's asynchronous pool keeps what it reserved (driver-level use then reads as growth)
    with local_cluster(gpu=gpu, **({"rmm_async": False} if gpu else {})) as cluster, Client(cluster) as client:
        n_workers = len(client.scheduler_info()["workers"])
        t_warm = time.perf_counter()
        if grid:
            client.run(_warm_worker, grid, gpu)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        barrier = ctx.Barrier(clients + 1)
        stop = ctx.Event()
        procs = [ctx.Process(target=_client_main, args=(
            cluster.scheduler_address, i, warm_specs[i::clients],
            [per_client[i][cuts[r]:cuts[r + 1]] for r in range(rounds)], gpu, barrier, q, timeout, stop))
            for i in range(clients)]
        for p in procs:
            p.start()
        samples, seconds, broken, t0 = [], [], None, t_warm
        try:
            for stage in range(rounds + 1):  # the warm-up, then each round
                barrier.wait(timeout)
                seconds.append(time.perf_counter() - t0)
                _quiet(client)
                samples.append(client.run(_sample))
                if progress:
                    progress(_progress_line(stage, seconds[-1], samples))
                last = stage == rounds
                if not last and deadline is not None and time.perf_counter() - t_warm > deadline:
                    stop.set()
                barrier.wait(timeout)
                if stop.is_set():
                    break
                t0 = time.perf_counter()
        except threading.BrokenBarrierError:
            broken = "a client failed (see errors)"
        reports = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        tput = _throughput(client, gpu, throughput_requests) if throughput_requests else {}
    warm_seconds, round_seconds = (seconds[0] if seconds else None), seconds[1:]
    errors = [r for r in reports if r[2]] + ([(None, 0, broken)] if broken and not any(r[2] for r in reports) else [])
    summary = summarize(samples, rss_tol, gpu_tol) if samples else {"leaks": {}, "unbounded_cache_growth": {}}
    done = sum(r[1] for r in reports)
    complete = done == clients * requests
    scope = {s.get("gpu_scope") for s in samples[0].values()} if samples else set()
    return {"clients": clients, "requests": requests, "rounds": rounds, "workers": n_workers,
            "bytes": [min_bytes, max_bytes], "warmup_requests": len(warm_specs), "done": done, "errors": errors,
            "warmup_seconds": warm_seconds, "round_seconds": round_seconds,
            "requests_per_s": done / sum(round_seconds) if round_seconds and sum(round_seconds) else None,
            "gpu_scope": sorted(x for x in scope if x), **summary, "small_request_per_s": tput,
            "complete": complete, "stopped_at_deadline": stop.is_set(),
            "ok": not errors and not summary["leaks"] and not summary["unbounded_cache_growth"]}


def memory_probe(sizes_mb: str, report_mb: float) -> list:
    """``--memory-probe``: each operation on every GPU dtype at each size, eagerly; those after which this
    process's driver-level memory stayed more than ``report_mb`` above the baseline."""
    import cupy

    import multireduce as mr

    pool = cupy.get_default_memory_pool()
    reader = h.device_memory_reader(cupy)

    def used():
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
        return reader()[0]

    rng = np.random.default_rng(0)
    cases = [(d, op) for d in dtypes_for(True) for op in ops_for(d)]
    for d, op in cases:  # warm-up: modules loaded, workspaces sized
        getattr(mr, op)(cupy.asarray(_data(rng, d, 4096, op)))
    base = used()
    print(f"baseline {base / 2**20:.0f} MB (scope {reader()[1]})", flush=True)
    flagged = []
    sizes = [float(s) for s in sizes_mb.split(",")]
    for mb in sizes:
        for d, op in cases:
            n = max(int(mb * 2**20) // np.dtype(d).itemsize, 1)
            x = cupy.asarray(_data(rng, d, n, op))
            r = getattr(mr, op)(x)
            del x, r
            after = used() - base
            if after > report_mb * 2**20:
                cupy.zeros(1).sum()  # a trivial launch: does a resized reservation come back?
                later = used() - base
                flagged.append((mb, d, op, after, later))
                print(f"{mb:g} MB {d} {op}: +{after / 2**20:.0f} MB, after a trivial launch +{later / 2**20:.0f} MB",
                      flush=True)
    print(f"flagged {len(flagged)} of {len(cases) * len(sizes)}; final +{(used() - base) / 2**20:.0f} MB")
    return flagged


def main(argv=None):
    p = h.parser("soak", __doc__)
    p.add_argument("--full", action="store_true",
                   help="the full size: 4 clients x 500 requests, 1 KB .. 1 GB (tens of minutes on 4 x H200)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=80, help="per client, over all rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-bytes", type=float, default=1024)
    p.add_argument("--max-bytes", type=float, default=1e9)
    p.add_argument("--cpu", action="store_true", help="a CPU LocalCluster instead of LocalCUDACluster")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-tol-mb", type=float, default=RSS_TOL / 2**20, help="allowed RSS growth per worker")
    p.add_argument("--gpu-tol-mb", type=float, default=GPU_TOL / 2**20, help="allowed driver-level GPU growth")
    p.add_argument("--no-warmup", action="store_true", help="baseline from a cold cluster (diagnosis)")
    p.add_argument("--out", help="also write the report (JSON) here")
    p.add_argument("--deadline", type=float, help="seconds after which no new round starts (a partial report)")
    p.add_argument("--memory-probe", action="store_true",
                   help="instead of the soak: which operation leaves GPU memory behind (one process, one GPU)")
    p.add_argument("--sizes-mb", default="1,64,1024", help="with --memory-probe: input sizes")
    p.add_argument("--report-mb", type=float, default=16, help="with --memory-probe: what growth is reported")
    a = p.parse_args(argv)
    if a.memory_probe:
        memory_probe(a.sizes_mb, a.report_mb)
        return 0
    if a.full:
        for k, v in FULL.items():
            setattr(a, k, v)
    if a.clients < 1 or a.requests < 1 or not 1 <= a.rounds <= a.requests or not 1 <= a.min_bytes <= a.max_bytes:
        p.error("need --clients >= 1, --requests >= 1, 1 <= --rounds <= --requests, 1 <= --min-bytes <= "
                f"--max-bytes; got {vars(a)}")
    out = run(a.clients, a.requests, int(a.min_bytes), int(a.max_bytes), a.cpu, a.seed,
              int(a.rss_tol_mb * 2**20), int(a.gpu_tol_mb * 2**20), a.rounds, warmup=not a.no_warmup,
              deadline=a.deadline, progress=lambda line: print(line, file=sys.stderr, flush=True))
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if out["ok"] else 1

