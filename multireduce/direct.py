"""Whole reductions and scans of persisted arrays computed now, on the workers that hold the chunks.

A lazy reduction (``graph.reduction``) costs a task graph: the client optimises and ships it, the
scheduler orders and assigns it, and every stage is a scheduler round trip, 15-30 ms before and around
the kernels even when the data is already in GPU memory; a scan persisted through the graph pays the
scheduler's per-task cost once per chunk (about 1 ms each on a GPU box, 2026-11-25). Over chunks held
in workers' memory none of that is needed:

- ``reduce_persisted`` (``mr.sum(x, compute=True)`` and the held result's own ``.compute()``,
  ``WholeOfHeld``): one ``client.run`` asks every worker for the partial of each chunk it holds,
  computed on its GPU and brought to the host in one copy; the client folds them in chunk order with
  the graph's tree, so the bits are the graph's.
- ``scan_persisted`` (the held scan's own ``.persist()``, ``ScanOfHeld``): one ``client.run`` for
  each chunk's total, the carries folded on the client, a second ``client.run`` in which every worker
  scans its own chunks and keeps the outputs, registered with the scheduler as a scatter registers
  its data. No task runs and nothing moves between workers.

Each worker reads its own memory (``dask_worker.data``): no placement lookup, so nothing can be stale
after a worker was killed, retired or restarted and the array persisted again; a chunk replicated on
two workers is taken once. Anything these paths cannot do exactly as the graph would returns None,
and the caller runs the graph instead: not persisted, no client, a chunk in no worker's memory, a
worker that left while the run was pending (the client checks the scheduler's worker list every
``multireduce.direct-check-interval``, default 0.25 s, so a dead address cannot hold the run for the
30 s connect timeout), reductions over only some axes. Every other error (a kernel's, a bad chunk's,
an operator's own ``TimeoutError``) surfaces unchanged: the worker hands it back as a value
(``_Failed``), so it is never taken for a comm failure and recomputed; a scan that fails on one worker
drops what the others kept.

The scan's outputs have no lineage (the price of running no task): a lost worker's output chunks
raise ``FutureCancelledError`` when used, never a wrong or missing chunk. ``client.persist(mr.cumsum(x))``
keeps the graph, which Dask can recompute.

Why ``client.run`` and not ``client.submit`` with worker restrictions (issue 12, item 3), measured on a
4-process CPU LocalCluster, 128 persisted chunks (2026-11-22, a loaded 2-core machine, 20 calls x 3
rounds): ``client.run`` 49-53 ms median (21-38 ms best); one ``client.submit`` per worker restricted to
it (``allow_other_workers``, chunk futures as arguments) plus ``gather``, folded on the client, 55-157 ms
median (48-76 ms best), the graph 78-159 ms (55-58 ms best). Submitted tasks pass the scheduler's task
machinery (graph update, transitions, one message per task each way) that the graph also pays; run is
one broadcast. What the scheduler would add (recomputing lost chunks) the fallback to the graph gives.

Since 2026-11-26 the client sends the workers ``run``'s message itself (``_call_each``) once it knows
them (from the last run on every worker): one round trip instead of the scheduler's two. It uses the
client's pooled connections and security, as distributed's own ``direct_to_workers`` gathers do; a
worker it cannot reach, a listed worker gone, or chunks on a worker that joined since send the run
through the scheduler once more (a client that cannot reach its workers at all is remembered and goes
through the scheduler from then on). ``multireduce.direct-to-workers`` (True/False) or the client's own
``direct_to_workers`` decide it where set.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import time
import traceback
import uuid
import weakref

import dask

import dask.array as da
from dask.array.utils import meta_from_array
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from . import placement
from .backends import on_device_of
from .core import ScanPlan
from .graph import (_device, _lanes, _OfHeld, _OneBlockOfHeld, _scan_seeded, fold_in_order, reduction, scan,
                    stage_token)


class _Failed:
    """The reduction's own error on a worker, handed back as a value: ``client.run`` would re-raise it
    on the client as it is, where a ``TimeoutError`` or ``ConnectionError`` from an operator could not
    be told apart from a comm failure (a placement error) and would be recomputed through the graph."""

    def __init__(self, error: BaseException, where: str):
        note = f"raised on worker {where} by multireduce's direct reduction:\n{traceback.format_exc()}"
        try:  # the error travels pickled; one that cannot come back whole is sent as its type and text
            pickle.loads(pickle.dumps(error))
        except Exception:  # noqa: BLE001 - any failure to round-trip
            error = Exception(f"{type(error).__module__}.{type(error).__qualname__}: {error}")
        error.add_note(note)
        self.error = error


def _call_where_held(block, fn, *args):
    with on_device_of(block):  # run on the GPU that holds the chunk
        return fn(block, *args)


def _to_host_together(values: list) -> list:
    """``values`` (CuPy arrays, or objects whose ``value`` is one, such as ``Partial``) with every CuPy
    array brought to the host in one copy per device and dtype: a copy per chunk waits on the GPU and
    pays the copy's fixed cost each time (2.5 ms for 32 chunks on an H100). Anything else is kept."""
    import dataclasses

    found: dict = {}
    for i, v in enumerate(values):
        a = getattr(v, "value", v)
        if type(a).__module__.startswith("cupy"):
            found.setdefault((a.device.id, a.dtype.str), []).append((i, a))
    if not found:
        return values
    import cupy

    out = list(values)
    for (device, _), items in found.items():
        with cupy.cuda.Device(device):
            flat = cupy.concatenate([a.ravel() for _, a in items]).get()
        at = 0
        for i, a in items:
            host = flat[at : at + a.size].reshape(a.shape)
            at += a.size
            out[i] = dataclasses.replace(out[i], value=host) if out[i] is not a else host
    return out


def values_of_held(per_chunk, keys: list, only_where=frozenset(), extra=None, dask_worker=None):
    """Runs on every worker through ``client.run``: ``per_chunk(block, *extra[key])`` for each of
    ``keys`` this worker holds (None for those in ``only_where``: the caller only wants to know where
    they are), on the GPU holding it, brought to the host together. Returns {key: value}, or
    ``_Failed``. Reading the worker's own memory needs no placement lookup and cannot be stale."""
    try:
        held = [k for k in keys if k in dask_worker.data]
        extra = extra or {}
        computed = [None if k in only_where else _call_where_held(dask_worker.data[k], per_chunk, *extra.get(k, ()))
                    for k in held]
        columns = _PartialColumns.of(held, computed)  # the common case: no per-chunk work on the host
        return _Packed(columns if columns is not None else dict(zip(held, _to_host_together(computed))))
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


class _Packed:
    """A worker's reply pickled as one buffer. ``client.run`` serializes each NumPy array in a reply
    apart (its own header and frames): a dict of 99 host partials cost ~14 ms per call that way on a
    4-worker CPU cluster (2026-11-26), where one pickle costs well under 1 ms."""

    def __init__(self, value):
        self.data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self):
        value = pickle.loads(self.data)
        return value.expand() if isinstance(value, _PartialColumns) else value


class _PartialColumns:
    """{key: Partial} whose values are arrays of one type, device, dtype and shape and whose counts are
    Python ints, as three host columns: one device-to-host copy of the stacked values and no per-chunk
    work on the worker (pickling 512 ``Partial`` objects apart took 2.8 ms and unpickling 1.5 ms, the
    columns 0.07 and 0.4 ms on this 2-core machine, 2026-11-26). ``expand`` gives back equal Partials
    with NumPy values (the same dtype, values and count type), so the fold's bits cannot change."""

    def __init__(self, keys: list, values, counts):
        self.keys, self.values, self.counts = keys, values, counts

    @classmethod
    def of(cls, keys: list, parts: list):
        import numpy as np

        from .core import Partial

        if not parts or type(parts[0]) is not Partial:
            return None
        first = parts[0].value
        kind = type(first)
        on_gpu = kind.__module__.startswith("cupy") and kind.__name__ == "ndarray"
        if not (kind is np.ndarray or on_gpu) or not all(
                type(p) is Partial and type(p.value) is kind and p.value.dtype == first.dtype
                and p.value.shape == first.shape and (not on_gpu or p.value.device.id == first.device.id)
                and type(p.count) is int and -(1 << 63) <= p.count < (1 << 63) for p in parts):
            return None
        if on_gpu:
            import cupy

            with cupy.cuda.Device(first.device.id):
                values = cupy.stack([p.value for p in parts]).get()
        else:
            values = np.stack([p.value for p in parts])
        return cls(list(keys), values, np.array([p.count for p in parts], dtype=np.int64))

    def expand(self) -> dict:
        from .core import Partial

        return {k: Partial(self.values[i, ...], c) for i, (k, c) in enumerate(zip(self.keys, self.counts.tolist()))}


def scan_and_keep(plan: ScanPlan, work: dict, recipes=None, dask_worker=None):
    """Runs on the workers holding a scan's input through ``client.run``: scan each (input key, output
    key, carry) of ``work[this worker]`` here and keep the outputs in this worker's memory, as a scatter
    does (the worker tells the scheduler nothing; the client registers the keys). With ``recipes``
    (worker -> ``recipes.Recipe``), the input chunks are made here from the chunks this worker holds,
    one at a time, in the recipe's order. Returns {output key: bytes}, or ``_Failed``."""
    from dask.sizeof import sizeof

    kept = {}
    mine = work.get(dask_worker.address, ())
    recipe = recipes.get(dask_worker.address) if recipes is not None else None
    reads = recipe.inputs if recipe is not None else [in_key for in_key, _, _ in mine]
    if any(k not in dask_worker.data for k in reads):
        # a replica the client chose is gone (the Active Memory Manager drops extra copies every 2 s):
        # placement, not the operator: the caller falls back to the graph
        return _Moved()
    try:
        if recipe is None:
            blocks = ((in_key, dask_worker.data[in_key]) for in_key, _, _ in mine)
        else:
            blocks = zip(recipe.chunks, recipe.make({k: dask_worker.data[k] for k in reads}))
        seeds = {in_key: (out_key, carry) for in_key, out_key, carry in mine}
        for in_key, block in blocks:
            out_key, carry = seeds[in_key]
            kept[out_key] = _call_where_held(block, lambda b: _scan_seeded(plan, b, carry, 0 if carry is None else 1))
        dask_worker.update_data(data=kept, stimulus_id=f"multireduce-scan-{plan.label}")
        return {k: sizeof(v) for k, v in kept.items()}
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


class _Moved:
    """``scan_and_keep``'s answer when an input chunk it was given is no longer in this worker's memory."""


def _release_registered(keys: list, client_id: str, dask_scheduler=None):
    """Runs on the scheduler: let go of ``keys`` that a failed ``update_data`` may have registered in
    part (in memory, wanted by nobody): wanted by this client, then released, as a dropped future is."""
    known = [k for k in keys if k in dask_scheduler.tasks]
    if known:
        dask_scheduler.client_desires_keys(keys=known, client=client_id)
        dask_scheduler.client_releases_keys(keys=known, client=client_id, stimulus_id="multireduce-scan-failed")


def _drop_kept_on_live(client, workers: list, keys: list) -> None:
    """``drop_kept`` on those of ``workers`` still alive, given up on as soon as one of them leaves: a
    run that names a dead address would hold the call for the scheduler's whole connect timeout (30 s).
    A worker that left took its outputs with it."""
    live = set(client.sync(client.scheduler.identity)["workers"])
    alive = [w for w in workers if w in live]
    if alive:
        _run(client, alive, drop_kept, keys)  # None (a worker left meanwhile) is as good as done


def drop_kept(keys: list, dask_worker=None):
    """Forget outputs ``scan_and_keep`` kept here when the scan as a whole failed (the scheduler never
    heard of them)."""
    from distributed.worker_state_machine import FreeKeysEvent

    mine = [k for k in keys if k in dask_worker.state.tasks]
    if mine:
        dask_worker.handle_stimulus(FreeKeysEvent(keys=mine, stimulus_id="multireduce-scan-failed"))


def _placement_errors() -> tuple[type[BaseException], ...]:
    """Errors that say the placement was stale (a moved chunk, a dead or unreachable worker), never
    the reduction's own: those must reach the caller."""
    from distributed.comm.core import CommClosedError

    return (WorkerGone, CommClosedError, ConnectionError, asyncio.TimeoutError, TimeoutError)


class WorkerGone(LookupError):
    """A worker the run waits on left the cluster while it ran."""


async def _run_while_alive(client, workers, interval: float, direct: bool, fn, *args):
    """``fn(*args)`` on ``workers`` (None: every worker the scheduler has), abandoned (WorkerGone) as
    soon as one of them is no longer in the scheduler's worker list: a dead address would otherwise hold
    the call for its whole connect timeout (30 s). ``direct``: the client calls each worker itself
    (``_call_each``); else the scheduler broadcasts (``client.run``). For a run on every worker, the
    workers waited on are those the scheduler lists at the first check."""
    call = _call_each(client, workers, fn, *args) if direct else client._run(fn, *args, workers=workers)
    run = asyncio.ensure_future(call)
    waited = set(workers) if workers is not None else None
    try:
        while True:
            done, _ = await asyncio.wait({run}, timeout=interval)
            if done:
                return run.result()
            live = (await client.scheduler.identity())["workers"]
            if waited is None:
                waited = set(live)
            elif any(w not in live for w in waited):
                raise WorkerGone(f"a worker of {sorted(waited)} left the cluster")
    finally:
        run.cancel()  # nothing when it is done; a call abandoned here must not linger


async def _call_each(client, workers: list, fn, *args) -> dict:
    """What ``client.run(fn, *args, workers=workers)`` returns, without the scheduler in between: the
    client sends each worker the message the scheduler's broadcast would (the worker's ``run``
    handler, over the client's own pooled connections with its security settings), one round trip
    instead of two (a no-op: 1.9 ms through the scheduler on 4 x H200, 2026-11-26). Connecting is
    bounded by ``multireduce.direct-connect-timeout`` so an unreachable worker is soon given up on
    (``_run`` then asks the scheduler)."""
    from distributed.core import clean_exception, send_recv
    from distributed.protocol.pickle import dumps

    message = dict(op="run", function=dumps(fn), args=dumps(args), wait=True, kwargs=dumps({}))
    timeout = placement.config_seconds("multireduce.direct-connect-timeout", "2s", positive=True)

    async def one(address):
        comm = await client.rpc.connect(address, timeout=timeout)
        _last_direct_connect[client] = time.monotonic()  # the client reaches its workers
        try:
            reply = await send_recv(comm, **message)
        except BaseException:
            comm.abort()  # a reply half read must not reach the pool's next user
            raise
        finally:
            client.rpc.reuse(address, comm)  # a closed comm gives its slot back, an open one returns to the pool
        if reply.get("status") != "OK":  # the worker could not run fn at all (our functions catch their own)
            _, error, tb = clean_exception(**reply)
            raise error.with_traceback(tb)
        return reply["result"]

    calls = [asyncio.ensure_future(one(w)) for w in workers]
    try:
        replies = await asyncio.gather(*calls)
    finally:
        for call in calls:  # one failed: the others are not left running unawaited
            call.cancel()
    return dict(zip(workers, replies))


# Per client: the workers the last run on every worker answered from (so the next one can call them
# itself), and whether calling workers directly failed where the scheduler's broadcast reached them.
_known_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_direct_unreachable: weakref.WeakSet = weakref.WeakSet()
_last_direct_connect: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> monotonic time


def _goes_direct(client) -> bool:
    """Whether the client calls workers itself: ``multireduce.direct-to-workers`` when set; else the
    client's own ``direct_to_workers`` when set; else yes unless it failed before, since a client that
    cannot reach its workers is one outside the cluster's network, where distributed's default
    (through the scheduler) is the safe one and that fallback costs one bounded connect attempt once."""
    chosen = dask.config.get("multireduce.direct-to-workers", None)
    if chosen is not None:
        return bool(chosen)
    if getattr(client, "direct_to_workers", None) is not None:
        return bool(client.direct_to_workers)
    return client not in _direct_unreachable


def _run(client, workers, fn, *args, complete=None):
    """``fn(*args)`` on ``workers`` (None: every worker) from the client's thread: the replies, None on
    a placement error; a worker's own error (``_Failed``) is raised. Workers are called directly where
    ``_goes_direct`` (for every worker: those that answered last time); a direct call that fails on
    placement (an address gone, unreachable), or whose replies ``complete(replies)`` rejects (a worker
    that joined since, holding chunks), is made once more through the scheduler, whose broadcast
    reaches every worker it has now."""
    interval = placement.config_seconds("multireduce.direct-check-interval", "250ms", positive=True)
    targets = workers if workers is not None else _known_workers.get(client)
    unreached = None
    started = time.monotonic()
    if targets and _goes_direct(client):
        try:
            replies = client.sync(_run_while_alive, client, list(targets), interval, True, fn, *args)
        except (*_placement_errors(), OSError):  # distributed's connect raises a bare OSError on its timeout
            unreached = set(targets)
        else:  # a worker's own error (_Failed, possibly a TimeoutError) is raised here, never taken for placement
            replies = _unpacked(replies)
            if complete is None or complete(replies):
                return replies
    try:
        replies = client.sync(_run_while_alive, client, workers, interval, False, fn, *args)
    except (*_placement_errors(), OSError):  # the scheduler's connect times out with a bare OSError too
        return None
    replies = _unpacked(replies)
    # the scheduler reached every worker the client could not, and no direct connection of the client
    # succeeded meanwhile (under TLS a worker busy past the connect timeout fails a handshake it would pass later)
    if unreached and unreached <= set(replies) and _last_direct_connect.get(client, float("-inf")) < started:
        _direct_unreachable.add(client)
    if workers is None:
        _known_workers[client] = sorted(replies)
    return replies


def _unpacked(replies: dict) -> dict:
    replies = {w: r.unpack() if isinstance(r, _Packed) else r for w, r in replies.items()}
    for reply in replies.values():
        if isinstance(reply, _Failed):
            raise reply.error
    return replies


def held_values(x, keys: list, per_chunk, only_where=frozenset(), extra=None):
    """({key: per_chunk(chunk)}, {key: worker}) for the chunks ``keys`` of a persisted ``x``, each
    computed by a worker holding it (host values; a replicated chunk is taken from the first worker
    by address); None where some chunk is in no worker's memory or a worker left while it ran (the
    caller computes the graph instead). The reduction's own errors are raised."""
    client = placement.default_client()
    if client is None or not dask.config.get("multireduce.placement", True) or not placement.is_persisted(x):
        return None
    if not keys:
        return {}, {}
    wanted = set(keys)

    def complete(replies):
        return wanted <= {k for reply in replies.values() for k in reply}

    replies = _run(client, None, values_of_held, per_chunk, keys, only_where, extra, complete=complete)
    if replies is None:
        return None
    values, holder = {}, {}
    for worker in sorted(replies):
        for k, v in replies[worker].items():
            if k not in values:
                values[k], holder[k] = v, worker
    if len(values) != len(keys):
        return None
    placement.remember(x, holder, client)  # the next result over x needs no placement lookup
    return values, holder


def chunk_offsets(x) -> dict:
    """Chunk key -> where the chunk starts in ``x`` (a tuple of element offsets, one per axis)."""
    import itertools

    from dask.array.core import slices_from_chunks

    return {(x.name, *index): tuple(s.start for s in where)
            for index, where in zip(itertools.product(*map(range, x.numblocks)), slices_from_chunks(x.chunks))}


def reduce_persisted(x, plan, split_every: int = 16, located=None):
    """The reduction of all of ``x`` now, from the workers holding its chunks; None where the graph must
    be computed instead (see the module docstring). Each chunk's own partial comes back and the client
    folds them in chunk order with the graph's tree (``fold_in_order``): the same bits as the graph.
    ``located(block, offsets)``: what the plan reduces instead of a bare chunk (argmin/argmax need
    each chunk's place in the array)."""
    if len(plan.axes) != x.ndim or x.npartitions == 0:
        return None
    keys = placement.chunk_keys(x)
    if located is None:
        found = held_values(x, keys, plan.partial)
    else:
        found = held_values(x, keys, functools.partial(_partial_of_located, plan, located), extra=chunk_offsets(x))
    if found is None:
        return None
    return fold_in_order(plan, split_every, [found[0][k] for k in keys])


def _partial_of_located(plan, located, block, *offsets):
    return plan.partial(located(block, offsets))


def scan_persisted(x, plan: ScanPlan, name: str, sources=None):
    """``x`` scanned along ``plan.axis`` now, as a persisted array named ``name`` whose chunks are made
    and kept on the workers holding the input's; None where the graph must run instead.

    Two ``client.run`` calls and no task: each chunk's total (all but a lane's last chunk) is computed
    where the chunk is and comes back to the client (host values); the client folds them into every
    chunk's carry in chunk order (``plan.carries``, as the graph's carries do, so the bits are the
    graph's under any placement and for non-commutative operators); each worker then scans its chunks
    with their carries and keeps the outputs, which the client registers with the scheduler as a
    scatter does. Nothing moves between workers. The outputs have no lineage: if a worker holding
    some is lost, computing from them raises ``FutureCancelledError`` (a clear error, never a wrong or
    missing chunk); ``client.persist(mr.cumsum(x))`` keeps the graph, which Dask can recompute.
    With ``sources`` (an expression over persisted arrays, ``held_sources``), each worker makes the
    chunks it scans from the chunks it holds, in both calls."""
    from distributed import Future

    client = placement.default_client()
    keys = placement.chunk_keys(x)
    lanes = list(_lanes(x, (plan.axis,)))
    wanted = [(x.name, *i) for _, index in lanes for i in index[:-1]]
    recipes = None
    if sources is None:
        # every chunk's total but each lane's last, and where every chunk is, in one run
        found = held_values(x, keys, plan.totals, only_where=frozenset(keys) - set(wanted))
    else:
        planned = _recipes_by_worker(sources, client)
        recipes, holder = planned if planned is not None else (None, None)
        totals = recipe_values(sources, plan.totals, recipes=recipes) if planned is not None else None
        found = None if totals is None else (totals, holder)
    if found is None:
        return None
    totals, holder = found
    work: dict[str, list] = {}
    edge = (slice(None),) * plan.axis
    for _, index in lanes:
        carries = plan.carries(*(totals[(x.name, *i)] for i in index[:-1])) if len(index) > 1 else None
        for i, idx in enumerate(index):
            carry = carries[edge + (slice(i - 1, i),)] if i else None
            work.setdefault(holder[(x.name, *idx)], []).append(((x.name, *idx), (name, *idx), carry))
    out_keys = [(name, *idx) for _, index in lanes for idx in index]
    try:
        kept = _run(client, list(work), scan_and_keep, plan, work, recipes)
    except BaseException:  # a worker's own error: nothing of this scan may stay behind
        _drop_kept_on_live(client, list(work), out_keys)
        raise
    # every worker answered with its outputs: else the graph runs instead
    if (kept is None or any(isinstance(r, _Moved) for r in kept.values())
            or sum(len(k) for k in kept.values()) != len(out_keys)):
        _drop_kept_on_live(client, list(work), out_keys)
        return None
    nbytes = {k: n for per_worker in kept.values() for k, n in per_worker.items()}
    try:
        client.sync(client.scheduler.update_data, who_has={k: [w] for w, per in kept.items() for k in per},
                    nbytes=nbytes, client=client.id)
    except Exception as error:  # noqa: BLE001 - whatever failed, nothing registered in part may stay
        client.run_on_scheduler(_release_registered, out_keys, client.id)
        _drop_kept_on_live(client, list(work), out_keys)
        if isinstance(error, (KeyError, *_placement_errors())):
            return None  # a worker that left after its reply (the scheduler's KeyError for its address): the graph
        raise  # anything else is a defect to see, not a placement to recompute around
    chunk_type = type(x._meta)
    layer = {}
    for k in out_keys:
        layer[k] = Future(k, client)
        client.futures[k].finish(type=chunk_type)
    meta = meta_from_array(x._meta, ndim=x.ndim, dtype=plan.out_dtype)
    return da.Array(HighLevelGraph.from_collections(name, layer, dependencies=[]), name, x.chunks, meta=meta)


def _distributed_is_the_scheduler() -> bool:
    """``.compute()`` / ``.persist()`` without arguments would run on the default distributed client."""
    return dask.config.get("scheduler", None) in (None, "dask.distributed", "distributed") \
        and placement.default_client() is not None


class _GraphOnDemand:
    """A result whose task graph is built when something first asks for it (``.dask``): laying out the
    per-worker tasks is work the direct paths of ``.compute()`` / ``.persist()`` never need (a few ms
    on a GPU box, 2026-11-25). Placement is still looked up when the result is made (one ``who_has``,
    ~1 ms): the name follows the grouping, as the graph's always did, so two results under one name
    never carry different tasks (Dask warns of that, and it happened when a worker died between two
    builds). First in the bases: the property shadows Dask's slot."""

    __slots__ = ()

    @property
    def dask(self):
        if self._graph is None:
            self._graph = self._build_graph()
        return self._graph

    @dask.setter
    def dask(self, graph):
        self._graph = graph


def _graph_on_demand(cls, name: str, chunks, meta, direct: tuple):
    out = cls(HighLevelGraph({name: MaterializedLayer({})}, {name: set()}), name, chunks, meta=meta)
    out._direct = direct
    out._graph = None  # built on first use
    return out


class WholeOfHeld(_GraphOnDemand, _OneBlockOfHeld):
    """A whole reduction over a persisted array whose ``.compute()`` takes the direct path (one
    ``client.run``, each chunk's partial folded on the client in the graph's order: the same value
    and type as the graph's), and the graph when that path cannot (a chunk in no worker's memory, a
    worker gone, arguments to ``compute``, another scheduler). ``dask.compute``, ``client.compute`` and
    ``.persist`` run the graph, built on demand."""

    __slots__ = ("_direct", "_graph")

    def _build_graph(self):
        x, plan, split_every, token, build, _, groups, _ = self._direct
        if build is not None:
            return build(token, groups).dask
        return reduction(x, plan, split_every, groups, token=token).dask

    def compute(self, **kwargs):
        if not kwargs and _distributed_is_the_scheduler():
            x, plan, split_every, _, _, located, _, sources = self._direct
            value = reduce_held(x, plan, split_every, located, sources)
            if value is not None:
                return _device(type(self._meta).__module__.startswith("cupy"), value)
        return super().compute(**kwargs)


class ScanOfHeld(_GraphOnDemand, _OfHeld):
    """A scan of a persisted array whose ``.persist()`` takes ``scan_persisted`` (two ``client.run``
    calls, no task) and the graph when that path cannot. ``client.persist``, ``dask.persist`` and
    ``.compute`` run the graph, built on demand."""

    __slots__ = ("_direct", "_graph")

    def _build_graph(self):
        x, plan, split_every, token, groups, _ = self._direct
        return scan(x, plan, split_every, groups, token=token).dask

    def persist(self, **kwargs):
        if not kwargs and _distributed_is_the_scheduler():
            x, plan, _, _, _, sources = self._direct
            # a fresh name for every call, as scattered data gets: the graph's tasks under the same
            # keys would differ (Dask warns), and a dropped earlier result's release could reach the
            # scheduler after this one's registration and forget its chunks (seen: 6 of 20 calls)
            out = scan_persisted(x, plan, f"{plan.label}-seeded-{uuid.uuid4().hex}", sources)
            if out is not None:
                return out
        return super().persist(**kwargs)


def is_held(x) -> bool:
    """``x`` is persisted (every chunk a future of the default distributed client) and placement is on:
    its whole reductions take ``whole_of_held`` and its scans ``scan_of_held``."""
    return bool(x.npartitions) and dask.config.get("multireduce.placement", True) and placement.is_persisted(x) \
        and placement.default_client() is not None


def whole_of_held(x, plan, split_every: int, build=None, located=None, sources=None, groups=None) -> WholeOfHeld:
    """The lazy whole reduction of a persisted ``x`` (or, with ``sources``, of an expression over persisted
    arrays: ``held_result``) whose graph is built only when asked for: by ``build(token, groups)`` where
    given (a graph over something made from ``x``, with this token and ``x``'s grouping), else
    ``graph.reduction`` of ``x``. ``located``: see ``reduce_persisted``."""
    groups = groups if groups is not None else placement.grouping_for(x, True)
    token = stage_token(x, plan, split_every, groups)
    name = f"{plan.label}-aggregate-{token}"
    chunks = ((1,),) * x.ndim if plan.keepdims else ()
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=plan.out_dtype)
    return _graph_on_demand(WholeOfHeld, name, chunks, meta,
                            (x, plan, split_every, token, build, located, groups, sources))


def scan_of_held(x, plan: ScanPlan, split_every: int, sources=None) -> ScanOfHeld:
    """The lazy scan of a persisted ``x`` (or, with ``sources``, of an expression over persisted arrays:
    ``held_scan``) whose graph is built only when asked for."""
    groups = placement.grouping_for(x, commutative=True, sources=sources)
    token = stage_token(x, plan, split_every, groups)
    name = f"{plan.label}-{token}"
    meta = meta_from_array(x._meta, ndim=x.ndim, dtype=plan.out_dtype)
    return _graph_on_demand(ScanOfHeld, name, x.chunks, meta, (x, plan, split_every, token, groups, sources))


def held_scan(x, plan: ScanPlan, split_every: int) -> ScanOfHeld | None:
    """The lazy scan of ``x`` when its chunks are held (``held_result``'s rule): its ``.persist()`` scans
    them where they are, with no task; None where only the graph serves ``x``."""
    if is_held(x):
        return scan_of_held(x, plan, split_every)
    sources = held_sources(x)
    return scan_of_held(x, plan, split_every, sources) if sources is not None else None


# ------------------------------------------------------------------------------------------------
# Expressions over held chunks, and reductions over some axes
# ------------------------------------------------------------------------------------------------
def held_sources(x):
    """``recipes.ChunkSources`` of ``x`` where every chunk of it can be made on one worker from chunks that
    worker holds: a persisted array, or elementwise steps (arithmetic, ``map_blocks``, ``astype``,
    ``where``, constants) over persisted arrays. None otherwise (the graph serves ``x``)."""
    if not x.npartitions or not dask.config.get("multireduce.placement", True) or placement.default_client() is None:
        return None
    from .recipes import ChunkSources

    sources = ChunkSources(x)
    return sources if sources.held_only else None


def values_of_recipes(per_chunk, recipes: dict, extra=None, dask_worker=None):
    """Runs on the workers named in ``recipes`` (worker -> ``recipes.Recipe``): each chunk of this worker's
    recipe made from the chunks it holds, one at a time, and ``per_chunk(chunk, *extra[key])`` of it on
    the GPU holding it, brought to the host together. ``_Moved`` where a held chunk the recipe reads is
    no longer here."""
    recipe = recipes.get(dask_worker.address)
    if recipe is None:
        return _Packed({})
    if any(k not in dask_worker.data for k in recipe.inputs):
        return _Moved()
    try:
        extra = extra or {}
        made = recipe.make({k: dask_worker.data[k] for k in recipe.inputs})
        computed = [_call_where_held(chunk, per_chunk, *extra.get(key, ())) for key, chunk in zip(recipe.chunks, made)]
        columns = _PartialColumns.of(recipe.chunks, computed)
        return _Packed(columns if columns is not None else dict(zip(recipe.chunks, _to_host_together(computed))))
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


def _recipes_by_worker(sources, client):
    """{worker: Recipe} making every chunk of ``sources`` on the worker holding what it reads (the shared
    constants made on each worker that needs them), and {chunk key: worker}; None where some held chunk
    is in no worker's memory or a chunk reads chunks held by several workers."""
    from .recipes import Recipe

    found = placement.holders_of(sources.futures, client)
    if found is None:
        return None
    chunks: dict = {}
    where = {}
    for k in sources.keys:
        workers = {found[f] for f in sources.reads[k]}
        if len(workers) != 1:
            return None
        where[k] = workers.pop()
        chunks.setdefault(where[k], []).append(k)
    recipes, shared = sources.recipes(list(chunks.values()))
    work = {}
    for worker, recipe in zip(chunks, recipes):
        tasks = {**{k: shared[k] for k in recipe.inputs if k in shared}, **recipe.tasks}
        work[worker] = Recipe(tasks, recipe.chunks, [k for k in recipe.inputs if k not in shared])
    return work, where


def recipe_values(sources, per_chunk, extra=None, recipes=None):
    """{chunk key: per_chunk(chunk)} for every chunk of ``sources`` (host values), each made and computed
    by the worker holding what it is made from (``recipes``, else ``_recipes_by_worker``), in one call;
    None where the graph must run instead."""
    client = placement.default_client()
    if recipes is None:
        planned = _recipes_by_worker(sources, client)
        if planned is None:
            return None
        recipes = planned[0]
    work = recipes
    replies = _run(client, sorted(work), values_of_recipes, per_chunk, work, extra)
    if replies is None or any(isinstance(r, _Moved) for r in replies.values()):
        return None
    values = {k: v for reply in replies.values() for k, v in reply.items()}
    return values if len(values) == len(sources.keys) else None


def reduce_held(x, plan, split_every: int, located=None, sources=None):
    """``plan``'s reduction of ``x`` now, from the workers holding what its chunks are made from (see
    ``reduce_persisted``), over all of its axes or some: each chunk's partial comes back and the client
    folds every lane's partials in chunk order with the graph's tree, then lays the lanes' results out
    as the graph's output blocks (the same bits). None where the graph must run instead."""
    whole = len(plan.axes) == x.ndim
    if sources is None:
        if whole:
            return reduce_persisted(x, plan, split_every, located)
        sources = held_sources(x)
        if sources is None:
            return None
    if located is None:
        values = recipe_values(sources, plan.partial)
    else:
        values = recipe_values(sources, functools.partial(_partial_of_located, plan, located), chunk_offsets(x))
    if values is None:
        return None
    on_device = type(x._meta).__module__.startswith("cupy")
    if whole:
        return fold_in_order(plan, split_every, [values[k] for k in sources.keys])
    blocks = {}
    for kept_index, index in _lanes(x, plan.axes):
        value = fold_in_order(plan, split_every, [values[(x.name, *i)] for i in index])
        blocks[tuple(index[0]) if plan.keepdims else tuple(kept_index)] = _device(on_device, value)
    return _laid_out(blocks)


def _laid_out(blocks: dict):
    """One array from blocks keyed by their block index (every index of a grid present)."""
    from dask.array.core import concatenate3

    (first,) = {len(i) for i in blocks} or {0}
    if first == 0:
        return blocks[()]
    shape = [1 + max(i[d] for i in blocks) for d in range(first)]

    def nest(prefix):
        d = len(prefix)
        if d == first:
            return blocks[tuple(prefix)]
        return [nest(prefix + [j]) for j in range(shape[d])]

    return concatenate3(nest([]))


class PartOfHeld(_GraphOnDemand, _OfHeld):
    """A reduction over some axes of held chunks (or of an expression over them) whose ``.compute()`` takes
    ``reduce_held`` (one call to the workers, no task) and the graph when that path cannot. ``dask.compute``,
    ``client.compute`` and ``.persist`` run the graph, built on demand."""

    __slots__ = ("_direct", "_graph")

    def _build_graph(self):
        x, plan, split_every, token, groups, _ = self._direct
        return reduction(x, plan, split_every, groups, token=token).dask

    def compute(self, **kwargs):
        if not kwargs and _distributed_is_the_scheduler():
            x, plan, split_every, _, _, sources = self._direct
            value = reduce_held(x, plan, split_every, sources=sources)
            if value is not None:
                return value
        return super().compute(**kwargs)


def held_result(x, plan, split_every: int, build=None, located=None):
    """The lazy result of ``plan``'s reduction of ``x`` when its chunks are held (``x`` persisted, or an
    expression over persisted arrays whose chunks it reads from one worker each): its ``.compute()`` then
    runs where the chunks are, with no task; None where only the graph serves ``x``."""
    whole = len(plan.axes) == x.ndim
    if whole and is_held(x):
        return whole_of_held(x, plan, split_every, build, located)
    sources = held_sources(x)
    if sources is None:
        return None
    groups = placement.grouping_for(x, True, sources=sources)
    token = stage_token(x, plan, split_every, groups)
    if whole:
        return whole_of_held(x, plan, split_every, build, located, sources=sources, groups=groups)
    if build is not None or located is not None:
        return None
    chunks = (tuple((1,) if d in plan.axes else x.chunks[d] for d in range(x.ndim)) if plan.keepdims
              else tuple(x.chunks[d] for d in range(x.ndim) if d not in plan.axes))
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=plan.out_dtype)
    name = f"{plan.label}-aggregate-{token}"
    return _graph_on_demand(PartOfHeld, name, chunks, meta, (x, plan, split_every, token, groups, sources))
