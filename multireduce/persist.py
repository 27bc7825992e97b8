"""Persisting dask arrays with the same share of chunks on every worker.

Dask places a persisted array's chunks where its scheduler finds room first: measured on 4 x H200
(2026-11), 128 chunks went [26, 31, 31, 40] to the four workers in one run and [14, 37, 38, 39] in
another. Work on held chunks runs where they are (``multireduce.direct``), so the busiest worker
bounds every call: with 39 of 128 chunks, four GPUs do at most 3.3 times the work of one.
``persist`` puts equal contiguous ranges of chunks on the workers instead::

    x = mr.persist(da.random.random(n, chunks=c))   # worker 0 (GPU 0) holds the first range, ...

How: each chunk's task carries the Dask annotation ``workers=[its worker]`` (what
``client.persist(..., workers=...)`` does for a whole graph, here per chunk; distributed 2026.8's
``persist`` takes no per-key mapping), in the array's own optimised graph, which is then persisted
unoptimised: fusion would drop the annotations. Where fusion made a chunk in a task of another name and
left the chunk's key an alias of it, that task gets the same worker, so chunks are made where they stay
rather than made elsewhere and copied. Chunks already in memory (an array persisted before) are moved by
one task per chunk that takes its chunk (no copy where it is already on its worker); the moved array has
new keys whose tasks depend on the old ones, so its lineage reaches back to the original graph. Keep
only the new array: the original's chunks stay in memory while it is referenced.

The restrictions are strict (``allow_other_workers=False``): with loose ones, Dask's work stealing gave a
chunk to an idle worker while its own was busy (a moved chunk on a loaded 3-process CPU cluster). A
strict restriction alone would leave a lost worker's chunks waiting for it forever, so a scheduler plugin
(``_Rescue``, added once per scheduler through ``client.run_on_scheduler``; the scheduler must be able
to import multireduce, as it must to read the graphs) drops the restriction of those chunks when their
worker leaves, or is gone when the graph arrives: Dask then runs them, or recomputes the lost ones, on
the workers left, as for any persisted array.
"""

from __future__ import annotations

import bisect
import numbers
import re

from ._validation import QUERY_PLANNING_ERROR, check_flag, is_dask_array, is_expression_array

__all__ = ["persist"]

_CALLER = "multireduce.persist"


def persist(*arrays, balanced: bool = True, client=None):
    """Persist dask arrays on a ``distributed`` cluster, each worker holding an equal, contiguous range of
    every array's chunks.

    Parameters
    ----------
    arrays : dask.array.Array
        One or more arrays (``persist(x)``, ``persist(x, y)``), lazy or persisted already. Each is split
        over all workers on its own: arrays with the same chunks get chunk ``i`` on the same worker.
    balanced : bool, default True
        True: worker ``k`` of ``n`` (ordered by worker name, numerically where names are numbers as
        ``LocalCUDACluster``'s are, so GPU 0 comes first; by address where names tie) holds the ``k``-th
        of ``n`` consecutive ranges of chunks in C order of the chunk grid. The ranges hold the same
        number of chunks, give or take one, or where chunks differ in size, about the same number of
        bytes (within one chunk of an equal share). With more workers than chunks, the first workers
        hold one chunk each. False: ``client.persist``, Dask's own placement (or ``dask.persist`` with
        the current scheduler, without a client).
    client : distributed.Client, optional
        The client whose cluster holds the chunks; default: the current client. Its workers are the
        scheduler's at the time of the call.

    Returns
    -------
    The persisted array, or for several arrays a tuple of them in the same order. Computation starts in
    the background, as with ``client.persist``.

    Each chunk is made on its worker (Dask neither places nor steals it elsewhere); a lost worker's
    chunks are recomputed by Dask on the workers left (the module docstring says how). A lazy array whose
    chunks are already in the cluster's memory under the same keys (the same array persisted and still
    referenced) keeps those chunks where they are: persist the persisted array instead, which moves them.

    Examples
    --------
    >>> import numpy as np, dask.array as da, distributed, multireduce as mr
    >>> from multireduce.cluster import local_cluster
    >>> with local_cluster(n_workers=2, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
    ...     x = mr.persist(da.from_array(np.arange(40.0), chunks=5))  # chunks 0-3 on one worker, 4-7 on the other
    ...     _ = distributed.wait(x)
    ...     held = sorted(len(keys) for keys in client.has_what().values())
    ...     print(held, float(mr.sum(x, compute=True)))
    [4, 4] 780.0
    """
    if not arrays:
        raise TypeError(f"{_CALLER}: expected one or more dask arrays; got none")
    for i, x in enumerate(arrays):
        if not is_dask_array(x):
            raise TypeError(f"{_CALLER}: argument 'arrays[{i}]' must be a dask array; got {type(x).__name__}")
        if is_expression_array(x):
            where = f"'arrays[{i}]'"
            raise TypeError(f"{_CALLER}: " + QUERY_PLANNING_ERROR.replace("'x'", where, 1))
    balanced = check_flag(balanced, "balanced", _CALLER)
    client = _client(client, required=balanced)
    if not balanced:
        import dask

        out = client.persist(list(arrays)) if client is not None else dask.persist(*arrays)
    else:
        workers = worker_order(client)
        client.run_on_scheduler(_install)
        out = client.persist([_restricted(x, workers, client) for x in arrays], optimize_graph=False)
    return out[0] if len(arrays) == 1 else tuple(out)


def _client(client, required: bool):
    """``client``, or the current client; None only where none is needed."""
    from . import placement

    if client is None:
        client = placement.default_client()
        if client is None and required:
            raise ValueError(f"{_CALLER}: balanced=True needs a distributed client; got client=None and no "
                             "current client (create distributed.Client(...) first, or pass client=)")
        return client
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a dependency
        Client = ()
    if not isinstance(client, Client):
        raise TypeError(f"{_CALLER}: argument 'client' must be a distributed.Client or None; "
                        f"got {type(client).__name__}")
    if client.asynchronous:
        raise ValueError(f"{_CALLER}: argument 'client' is asynchronous; expected a synchronous client")
    return client


def _name_order(item):
    """Sort key for (address, name): numeric names as numbers (worker 10 after worker 9), before others."""
    address, name = item
    if isinstance(name, numbers.Integral) and not isinstance(name, bool):
        return (0, int(name), "", address)
    text = str(name)
    if re.fullmatch(r"\d+", text):
        return (0, int(text), "", address)
    return (1, 0, text, address)


def worker_order(client) -> list[str]:
    """Addresses of the scheduler's workers now, in the order ``persist`` gives them ranges."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    if not info:
        raise ValueError(f"{_CALLER}: the client's scheduler has no workers yet (start some, or wait for them "
                         "with client.wait_for_workers(n))")
    return [a for a, _ in sorted(((a, w.get("name", a)) for a, w in info.items()), key=_name_order)]


def ranges(sizes: list, count: int) -> list[int]:
    """For chunks of ``sizes`` (elements each, in order) and ``count`` workers: the worker of each chunk,
    non-decreasing, so each worker's chunks are consecutive. Worker ``j``'s range starts at the first
    chunk whose middle lies past ``j`` equal shares of the total, moved where needed so that every worker
    holds a chunk: equal sizes give counts that differ by one at most, and unequal ones shares close to
    equal (a chunk larger than a share holds a worker alone). Fewer chunks than workers: one chunk each
    for the first workers. Sizes that are unknown (NaN) or all zero count as equal."""
    n = len(sizes)
    count = min(count, n)
    if not all(isinstance(s, numbers.Integral) for s in sizes) or sum(sizes) == 0:
        sizes = [1] * n
    total, before, middles = sum(sizes), 0, []
    for s in sizes:  # in integers (doubled, times count): no rounding moves a chunk on a boundary
        middles.append(count * (2 * before + s))
        before += s
    starts = [bisect.bisect_left(middles, 2 * total * j) for j in range(count)] + [n]
    for j in range(1, count):
        starts[j] = max(starts[j], starts[j - 1] + 1)
    for j in range(count - 1, 0, -1):
        starts[j] = min(starts[j], starts[j + 1] - 1)
    return [j for j in range(count) for _ in range(starts[j + 1] - starts[j])]


def _chunk_sizes(x) -> list:
    """Elements of each chunk of ``x`` in C order of the chunk grid (NaN where a chunk's shape is unknown)."""
    import itertools
    import math

    sizes = []
    for shape in itertools.product(*x.chunks):
        n = math.prod(shape)
        sizes.append(int(n) if not math.isnan(n) else n)
    return sizes


def _restricted(x, workers: list[str], client):
    """``x`` as an array whose chunks are asked to be made on their workers (``ranges``): x's own optimised
    graph with the chunk tasks annotated, or for chunks held already, one task per chunk that takes it."""
    import dask

    from . import placement

    keys = placement.chunk_keys(x)
    target = dict(zip(keys, (workers[i] for i in ranges(_chunk_sizes(x), len(workers)))))
    if placement.is_persisted(x):
        held = placement._looked_up(x, client)
        if held == target:
            return x
        return _moved(x, target)
    (optimised,) = dask.optimize(x)  # now, as client.persist would: persisted unoptimised, fusion drops annotations
    tasks = dict(optimised.__dask_graph__())
    return _annotated(tasks, optimised.name, x, _through_aliases(tasks, target))


def _through_aliases(tasks: dict, target: dict) -> dict:
    """``target`` (chunk key -> worker) with, for a chunk whose task is an alias of another (Dask's linear
    fusion names the fused task apart and leaves the chunk's key as an alias of it), the aliased tasks on
    the same worker: the chunk is made there, not made elsewhere and copied."""
    try:
        from dask._task_spec import Alias
    except ImportError:  # a Dask without task objects: no aliases
        return target
    where = {}
    for key, worker in target.items():
        while key in tasks and key not in where:
            where[key] = worker
            task = tasks[key]
            if not isinstance(task, Alias):
                break
            key = task.target
    return where


def _same(chunk):
    return chunk


def _moved(x, target: dict):
    """A new array whose chunk ``i`` is a task on ``target[x's chunk i]`` that returns x's chunk ``i``."""
    from . import placement

    token = placement._placement_token(target, False)
    name = f"balanced-{x.name}-{token}"
    graph = x.__dask_graph__()
    tasks, where = {}, {}
    for key in placement.chunk_keys(x):
        new = (name, *key[1:])
        tasks[new] = (_same, key)
        tasks[key] = graph[key]  # the chunk's future: the new task reads it
        where[new] = target[key]
    return _annotated(tasks, name, x, where)


def _annotated(tasks: dict, name: str, x, where: dict):
    """``tasks`` as the one layer of an array like ``x``; the tasks named in ``where`` must run on their
    worker (``_MARK`` tells the scheduler's ``_Rescue`` that they are ours)."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from .graph import _Pinned, _WorkerOf

    layer = MaterializedLayer(tasks, annotations={"workers": _WorkerOf(where), _MARK: _Pinned(where)})
    graph = HighLevelGraph({name: layer}, {name: set()})
    return da.Array(graph, name, x.chunks, meta=x._meta)


# ------------------------------------------------------------------------------------------------
# On the scheduler: a chunk whose worker is gone may run anywhere
# ------------------------------------------------------------------------------------------------
_MARK = "multireduce-balanced"  # the tasks' annotation and the plugin's name


def _install(dask_scheduler=None):
    """``client.run_on_scheduler``: add the plugin once per scheduler."""
    dask_scheduler.add_plugin(_rescue_type()(), name=_MARK, idempotent=True)


_RESCUE = None


def _rescue_type():
    """The plugin's class, made on first use: its base class comes with ``distributed``, which
    ``import multireduce`` does not load."""
    global _RESCUE
    if _RESCUE is None:
        from distributed.diagnostics.plugin import SchedulerPlugin

        class _Rescue(SchedulerPlugin):
            """Drops the restriction of a task ``persist`` placed once its worker is not in the cluster
            (the worker left, or was gone already when the graph came), so Dask runs it, or recomputes
            its lost chunk, on a worker it chooses; a task restricted so would otherwise wait forever."""

            idempotent = True

            def update_graph(self, scheduler, *, annotations, stimulus_id, **kwargs):
                ours = annotations.get(_MARK) or {}
                _release(scheduler, (scheduler.tasks.get(k) for k in ours), stimulus_id, kick=False)

            def remove_worker(self, scheduler, worker, *, stimulus_id, **kwargs):
                _release(scheduler, list(scheduler.tasks.values()), stimulus_id, kick=True)

        _RESCUE = _Rescue
    return _RESCUE


def _release(scheduler, tasks, stimulus_id: str, kick: bool) -> None:
    """Of ``tasks``, ours restricted only to workers that are gone lose the restriction; with ``kick``,
    those already waiting for a worker (state "no-worker") are scheduled again."""
    again = {}
    for ts in tasks:
        if ts is None or not ts.worker_restrictions or not (ts.annotations or {}).get(_MARK):
            continue
        if any(w in scheduler.workers for w in ts.worker_restrictions):
            continue
        ts.worker_restrictions = None
        if kick and ts.state == "no-worker" and scheduler.workers:
            again[ts.key] = "processing"
    if again:
        scheduler.transitions(again, stimulus_id=stimulus_id)
