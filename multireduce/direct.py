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
moved or a worker that died since placement was looked up (the cache entry is dropped), reductions
over only some axes.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from . import placement
from .core import Partial, ReductionPlan

_HOLDERS_KEPT = 64
_holders: OrderedDict = OrderedDict()  # array name -> {chunk key: worker address}


def _holders_of(x, client) -> dict | None:
    """Chunk key -> worker for a persisted ``x``: one ``who_has`` per array, then kept (a persisted
    array's chunks stay where they are unless a worker dies or data is rebalanced, and then the
    workers report the missing chunk and the entry is dropped)."""
    found = _holders.get(x.name)
    if found is None:
        found = placement.holders(x, client)
        if found is None:
            return None
        _holders[x.name] = found
        while len(_holders) > _HOLDERS_KEPT:
            _holders.popitem(last=False)
    else:
        _holders.move_to_end(x.name)
    return found


def _to_host(value):
    if type(value).__module__.startswith("cupy"):
        return value.get()  # one small device-to-host copy per group
    return np.asarray(value)


class ChunkMissing(LookupError):
    """A worker no longer holds a chunk it held when placement was looked up."""


def reduce_held_groups(plan: ReductionPlan, assignments: dict, dask_worker=None):
    """Runs on every worker through ``client.run``: reduce the groups of chunks this worker holds, each
    on the GPU holding it. Returns [(group index, Partial with a host value)]."""
    mine = assignments.get(dask_worker.address, ())
    out = []
    for index, keys in mine:
        try:
            blocks = [dask_worker.data[k] for k in keys]
        except KeyError as exc:
            raise ChunkMissing(f"{dask_worker.address} does not hold {exc}") from None
        holder_device = getattr(getattr(blocks[0], "data", None), "device_id", None)
        if holder_device is not None:  # CuPy: run on the GPU that holds the chunks
            import cupy

            with cupy.cuda.Device(holder_device):
                partial = plan.partial(*blocks)
        else:
            partial = plan.partial(*blocks)
        out.append((index, Partial(_to_host(partial.value), partial.count)))
    return out


def reduce_persisted(x, plan: ReductionPlan):
    """The reduction of all of ``x`` now, from the workers holding its chunks; None where the graph must
    be computed instead (see the module docstring)."""
    if len(plan.axes) != x.ndim or x.npartitions == 0:
        return None
    client = placement.default_client()
    if client is None:
        return None
    holder = _holders_of(x, client)
    if holder is None:
        return None
    keys = placement.chunk_keys(x)
    groups = placement.by_worker(holder, plan.op.commutative)(keys)
    assignments: dict[str, list] = {}
    for index, group in enumerate(groups):
        assignments.setdefault(holder[group[0]], []).append((index, group))
    try:
        replies = client.run(reduce_held_groups, plan, assignments, workers=list(assignments))
    except Exception:  # noqa: BLE001 - a moved chunk, a dead worker, ...: the graph path recomputes, and
        _holders.pop(x.name, None)  # re-raises with its own context any error that is not about placement
        return None
    partials = sorted((p for reply in replies.values() for p in reply), key=lambda ip: ip[0])
    if len(partials) != len(groups):
        _holders.pop(x.name, None)
        return None
    return plan.aggregate(*(p for _, p in partials))
