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
import traceback

import dask
import numpy as np
from dask.utils import parse_timedelta

from . import placement
from .core import Partial, ReductionPlan
from .graph import fold_in_order


def _to_host(value):
    if type(value).__module__.startswith("cupy"):
        return value.get()  # one small device-to-host copy per group
    return np.asarray(value)


class ChunkMissing(LookupError):
    """A worker no longer holds a chunk it held when placement was looked up."""


class _Failed:
    """The reduction's own error on a worker, handed back as a value: ``client.run`` would re-raise it
    on the client as it is, where a ``TimeoutError`` or ``ConnectionError`` from an operator could not
    be told apart from a comm failure (a placement error) and would be recomputed through the graph."""

    def __init__(self, error: BaseException, where: str):
        error.add_note(f"raised on worker {where} by multireduce's direct reduction:\n{traceback.format_exc()}")
        self.error = error


def reduce_held_groups(plan: ReductionPlan, assignments: dict, dask_worker=None):
    """Runs on every worker through ``client.run``: reduce the groups of chunks this worker holds, each
    on the GPU holding it. Returns [(group index, Partial with a host value)], or ``_Failed``."""
    try:
        return _reduce_held(plan, assignments.get(dask_worker.address, ()), dask_worker)
    except ChunkMissing:
        raise
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


def _reduce_held(plan: ReductionPlan, mine, dask_worker):
    out = []
    for index, keys in mine:
        try:
            blocks = [dask_worker.data[k] for k in keys]
        except KeyError as exc:
            raise ChunkMissing(f"{dask_worker.address} does not hold {exc}") from None
        holder_device = getattr(getattr(blocks[0], "data", None), "device_id", None)
        # each chunk's own partial, folded on the client in the graph's tree: the same bits as the graph
        if holder_device is not None:  # CuPy: run on the GPU that holds the chunks
            import cupy

            with cupy.cuda.Device(holder_device):
                partials = [plan.partial(b) for b in blocks]
        else:
            partials = [plan.partial(b) for b in blocks]
        out.append((index, [Partial(_to_host(p.value), p.count) for p in partials]))
    return out


def _placement_errors() -> tuple[type[BaseException], ...]:
    """Errors that say the placement was stale (a moved chunk, a dead or unreachable worker), never
    the reduction's own: those must reach the caller."""
    from distributed.comm.core import CommClosedError

    return (ChunkMissing, WorkerGone, CommClosedError, ConnectionError, asyncio.TimeoutError, TimeoutError)


class WorkerGone(LookupError):
    """A worker the run waits on left the cluster after placement was looked up."""


async def _run_while_alive(client, plan, assignments: dict, interval: float):
    """``client.run`` of ``reduce_held_groups`` on the assigned workers, abandoned (WorkerGone) as soon
    as one of them is no longer in the scheduler's worker list: a dead address would otherwise hold the
    scheduler's broadcast for its whole connect timeout (30 s by default)."""
    run = asyncio.ensure_future(client._run(reduce_held_groups, plan, assignments, workers=list(assignments)))
    while True:
        done, _ = await asyncio.wait({run}, timeout=interval)
        if done:
            return run.result()
        live = (await client.scheduler.identity())["workers"]
        if any(w not in live for w in assignments):
            run.cancel()
            raise WorkerGone(f"a worker of {sorted(assignments)} left the cluster")


def reduce_persisted(x, plan: ReductionPlan, split_every: int = 16):
    """The reduction of all of ``x`` now, from the workers holding its chunks; None where the graph must
    be computed instead (see the module docstring)."""
    if len(plan.axes) != x.ndim or x.npartitions == 0:
        return None
    client = placement.default_client()
    if client is None:
        return None
    holder = placement.holders(x, client)
    if holder is None:
        return None
    keys = placement.chunk_keys(x)
    groups = placement.by_worker(holder, True)(keys)  # one group per worker: chunk order is restored below
    assignments: dict[str, list] = {}
    for index, group in enumerate(groups):
        assignments.setdefault(holder[group[0]], []).append((index, group))
    interval = parse_timedelta(dask.config.get("multireduce.direct-check-interval", "250ms"))
    try:
        replies = client.sync(_run_while_alive, client, plan, assignments, interval)
    except _placement_errors():
        return None  # the graph recomputes what moved or was lost
    for reply in replies.values():
        if isinstance(reply, _Failed):
            raise reply.error
    by_group = dict(p for reply in replies.values() for p in reply)
    if len(by_group) != len(groups):
        return None
    position = {k: i for i, k in enumerate(keys)}
    ordered = [None] * len(keys)
    for index, group in enumerate(groups):
        for k, p in zip(group, by_group[index]):
            ordered[position[k]] = p
    return fold_in_order(plan, split_every, ordered)
