"""Whole reductions of persisted arrays computed now, on the workers that hold the chunks.

A lazy reduction (``graph.reduction``) costs a task graph: the client optimises and ships it, the
scheduler orders and assigns it, and every stage is a scheduler round trip plus dask's own finalize
task, 15-30 ms before and around the kernels even when the data is already in GPU memory. When the
chunks are persisted and the result is wanted now (``multireduce.sum(x, compute=True)``), none of
that is needed: one ``client.run`` asks every worker holding chunks to reduce its own groups with
our kernels, on its GPU, and send back one small partial per group (host memory, a few bytes); the
client combines them in order and finalizes. The chunks never move.

Anything this path cannot do exactly as the graph would returns None, and the caller computes the
graph instead: placement unknown (not persisted, no client, a chunk not in memory), a chunk that
moved or a worker that died since placement was looked up, reductions over only some axes. Every
other error (a kernel's, a bad chunk's, an operator's own ``TimeoutError``) surfaces unchanged: the worker
hands it back as a value (``_Failed``), so it is never taken for a comm failure and recomputed.

Why ``client.run`` and not ``client.submit`` with worker restrictions (issue 12, item 3), measured on a
4-process CPU LocalCluster, 128 persisted chunks (2026-11-22, a loaded 2-core machine, 20 calls x 3
rounds): ``client.run`` 49-53 ms median (21-38 ms best); one ``client.submit`` per worker restricted to
it (``allow_other_workers``, chunk futures as arguments) plus ``gather``, folded on the client, 55-157 ms
median (48-76 ms best), the graph 78-159 ms (55-58 ms best). Submitted tasks pass the scheduler's task
machinery (graph update, transitions, one message per task each way) that the graph also pays; run is
one broadcast. What the scheduler would add (recomputing lost chunks) the fallback to the graph gives.

Placement is looked up on every call (one ``who_has`` round trip, about a millisecond): the scheduler
forgets a dead or retired worker's keys at once, so the lookup names only live workers and follows a
``client.restart`` plus re-persist under the same array name. A cache keyed by the array's name sent
``client.run`` to dead addresses after such changes, and the scheduler waited its 30 s connect timeout
on each. For a worker that dies in the short window between lookup and run, the client checks the
live workers every ``multireduce.direct-check-interval`` (default 0.25 s) while the run is pending and
gives up on it, for the graph, as soon as a worker it waits on is gone; a slow run on live workers is
waited for however long it takes.
"""

from __future__ import annotations

import asyncio
import functools
import traceback

import dask
import numpy as np
from dask.utils import parse_timedelta

from dask.array.utils import meta_from_array
from dask.highlevelgraph import HighLevelGraph

from . import placement
from .core import ScanPlan
from .graph import (_device, _host_partial, _host_totals, _lanes, _OfHeld, _OneBlockOfHeld, _pinned, _scan_seeded,
                    fold_in_order)


class ChunkMissing(LookupError):
    """A worker no longer holds a chunk it held when placement was looked up."""


class _Failed:
    """The reduction's own error on a worker, handed back as a value: ``client.run`` would re-raise it
    on the client as it is, where a ``TimeoutError`` or ``ConnectionError`` from an operator could not
    be told apart from a comm failure (a placement error) and would be recomputed through the graph."""

    def __init__(self, error: BaseException, where: str):
        error.add_note(f"raised on worker {where} by multireduce's direct reduction:\n{traceback.format_exc()}")
        self.error = error


def each_held_chunk(per_chunk, assignments: dict, dask_worker=None):
    """Runs on every worker through ``client.run``: ``per_chunk(block)`` for each chunk key this worker
    was assigned, on the GPU holding the chunk. Returns the host results in the assigned order, or
    ``_Failed``."""
    try:
        return _each_held(per_chunk, assignments.get(dask_worker.address, ()), dask_worker)
    except ChunkMissing:
        raise
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


def _each_held(per_chunk, keys, dask_worker):
    try:
        blocks = [dask_worker.data[k] for k in keys]
    except KeyError as exc:
        raise ChunkMissing(f"{dask_worker.address} does not hold {exc}") from None
    out = []
    for block in blocks:
        device = getattr(getattr(block, "data", None), "device_id", None)
        if device is not None:  # CuPy: run on the GPU that holds the chunk
            import cupy

            with cupy.cuda.Device(device):
                out.append(per_chunk(block))
        else:
            out.append(per_chunk(block))
    return out


def _placement_errors() -> tuple[type[BaseException], ...]:
    """Errors that say the placement was stale (a moved chunk, a dead or unreachable worker), never
    the reduction's own: those must reach the caller."""
    from distributed.comm.core import CommClosedError

    return (ChunkMissing, WorkerGone, CommClosedError, ConnectionError, asyncio.TimeoutError, TimeoutError)


class WorkerGone(LookupError):
    """A worker the run waits on left the cluster after placement was looked up."""


async def _run_while_alive(client, per_chunk, assignments: dict, interval: float):
    """``client.run`` of ``each_held_chunk`` on the assigned workers, abandoned (WorkerGone) as soon
    as one of them is no longer in the scheduler's worker list: a dead address would otherwise hold the
    scheduler's broadcast for its whole connect timeout (30 s by default)."""
    run = asyncio.ensure_future(client._run(each_held_chunk, per_chunk, assignments, workers=list(assignments)))
    while True:
        done, _ = await asyncio.wait({run}, timeout=interval)
        if done:
            return run.result()
        live = (await client.scheduler.identity())["workers"]
        if any(w not in live for w in assignments):
            run.cancel()
            raise WorkerGone(f"a worker of {sorted(assignments)} left the cluster")


def held_values(x, keys: list, per_chunk):
    """{key: per_chunk(chunk)} for the chunks ``keys`` of a persisted ``x``, each computed by the worker
    holding it (host values); None where placement is unknown or went stale (the caller computes the
    graph instead). The reduction's own errors are raised."""
    client = placement.default_client()
    if client is None:
        return None
    holder = placement.holders(x, client)
    if holder is None:
        return None
    assignments: dict[str, list] = {}
    for k in keys:
        assignments.setdefault(holder[k], []).append(k)
    if not assignments:
        return {}
    interval = parse_timedelta(dask.config.get("multireduce.direct-check-interval", "250ms"))
    try:
        replies = client.sync(_run_while_alive, client, per_chunk, assignments, interval)
    except _placement_errors():
        return None  # the graph recomputes what moved or was lost
    for reply in replies.values():
        if isinstance(reply, _Failed):
            raise reply.error
    values = {k: v for worker, mine in assignments.items() for k, v in zip(mine, replies.get(worker, ()))}
    return values if len(values) == len(keys) else None


def reduce_persisted(x, plan, split_every: int = 16):
    """The reduction of all of ``x`` now, from the workers holding its chunks; None where the graph must
    be computed instead (see the module docstring). Each chunk's own partial comes back and the client
    folds them in chunk order with the graph's tree (``fold_in_order``): the same bits as the graph."""
    if len(plan.axes) != x.ndim or x.npartitions == 0:
        return None
    keys = placement.chunk_keys(x)
    partials = held_values(x, keys, functools.partial(_host_partial, plan))
    if partials is None:
        return None
    return fold_in_order(plan, split_every, [partials[k] for k in keys])


def scan_persisted(x, plan: ScanPlan, name: str):
    """``x`` scanned along ``plan.axis`` now, as a persisted array named ``name`` whose chunks are made on
    the workers holding the input's; None where the graph must run instead.

    Each chunk's total (all but a lane's last chunk) is computed where the chunk is and comes back to the
    client (``client.run``, host values); the client folds them into every chunk's carry in chunk order
    (``plan.carries``, as the graph's carries do, so the bits are the graph's under any placement and for
    non-commutative operators) and persists one task per chunk, seeded with its own carry as a literal
    and asking for the chunk's holder. No totals or carries tasks, no transfer between workers; the
    output keeps its lineage (the input's keys), so a lost worker's chunks are recomputed by the
    scheduler like any persisted result's."""
    client = placement.default_client()
    holder = placement.holders(x, client) if client is not None else None
    if holder is None:
        return None
    lanes = list(_lanes(x, (plan.axis,)))
    wanted = [(x.name, *i) for _, index in lanes for i in index[:-1]]
    totals = held_values(x, wanted, functools.partial(_host_totals, plan))
    if totals is None:
        return None
    tasks = {}
    edge = (slice(None),) * plan.axis
    for _, index in lanes:
        carries = plan.carries(*(totals[(x.name, *i)] for i in index[:-1])) if len(index) > 1 else None
        for i, idx in enumerate(index):
            carry = carries[edge + (slice(i - 1, i),)] if i else None
            tasks[(name, *idx)] = (_scan_seeded, plan, (x.name, *idx), carry, 1 if i else 0)
    layer = _pinned(tasks, holder)
    out = _OfHeld(HighLevelGraph.from_collections(name, layer, dependencies=[x]), name, x.chunks,
                  meta=meta_from_array(x._meta, ndim=x.ndim, dtype=plan.out_dtype))
    return client.persist(out, optimize_graph=False)


def _distributed_is_the_scheduler() -> bool:
    """``.compute()`` / ``.persist()`` without arguments would run on the default distributed client."""
    return dask.config.get("scheduler", None) in (None, "dask.distributed", "distributed") \
        and placement.default_client() is not None


class WholeOfHeld(_OneBlockOfHeld):
    """A whole reduction over chunks held in workers' memory whose ``.compute()`` takes the direct path
    (one ``client.run``, each chunk's partial folded on the client in the graph's order: the same value
    and type as the graph's), and the graph when that path cannot (placement stale, a worker gone,
    arguments to ``compute``, another scheduler). ``dask.compute``, ``client.compute`` and ``.persist``
    run the graph."""

    __slots__ = ("_direct",)

    def compute(self, **kwargs):
        if not kwargs and _distributed_is_the_scheduler():
            x, plan, split_every = self._direct
            value = reduce_persisted(x, plan, split_every)
            if value is not None:
                return _device(type(self._meta).__module__.startswith("cupy"), value)
        return super().compute(**kwargs)


class ScanOfHeld(_OfHeld):
    """A scan over chunks held in workers' memory whose ``.persist()`` takes ``scan_persisted``: totals
    now by ``client.run``, carries on the client, one scan task per chunk on its holder. ``client.persist``,
    ``dask.persist`` and ``.compute`` run the graph."""

    __slots__ = ("_direct",)

    def persist(self, **kwargs):
        if not kwargs and _distributed_is_the_scheduler():
            x, plan = self._direct
            # its own name: the graph's tasks under the same keys would differ (dask warns, and an
            # earlier graph result still held would be mixed with these)
            out = scan_persisted(x, plan, f"{self.name.rsplit('-', 1)[0]}-seeded-{self.name.rsplit('-', 1)[1]}")
            if out is not None:
                return out
        return super().persist(**kwargs)


def with_direct_compute(result, x, plan, split_every: int):
    """``result`` (the lazy whole reduction of a persisted ``x``) as a ``WholeOfHeld``."""
    out = WholeOfHeld(result.dask, result.name, result.chunks, meta=result._meta)
    out._direct = (x, plan, split_every)
    return out


def with_direct_persist(result, x, plan):
    """``result`` (the lazy scan of a persisted ``x``) as a ``ScanOfHeld``."""
    out = ScanOfHeld(result.dask, result.name, result.chunks, meta=result._meta)
    out._direct = (x, plan)
    return out
