"""Whole reductions and scans of persisted arrays computed now, on the workers that hold the chunks.

A lazy reduction (``graph.reduction``) costs a task graph: the client optimises and ships it, the
scheduler orders and assigns it, and every stage is a scheduler round trip, 15-30 ms before and around
the kernels even when the data is already in GPU memory; a scan persisted through the graph pays the
scheduler's per-task cost once per chunk (about 1 ms each on a GPU box, 2026-11-25). Over chunks held
in workers' memory none of that is needed:

- ``reduce_persisted`` (``mr.sum(x, compute=True)`` and the held result's own ``.compute()``,
  ``WholeOfHeld``): one run (``client.run``'s message) asks the workers for the partial of each
  chunk they hold, computed on its GPU and brought to the host in one copy; the client folds them in
  chunk order with the graph's tree, so the bits are the graph's.
- ``scan_persisted`` (the held scan's own ``.persist()``, ``ScanOfHeld``): one run for each chunk's
  total, the carries folded on the client, a second run in which every worker holding
  chunks scans its own and keeps the outputs, registered with the scheduler as a scatter registers
  its data, each with its recipe (lineage, below). No task runs and nothing moves between workers.

Only the workers holding the chunks are called, each for the chunks it was chosen for (a chunk on
two workers is computed by one): where the chunks were seen last (the previous run's, or the held
result's lookup, ``placement.recently_seen``), else one ``who_has``. Each worker reads its own memory,
so a placement gone stale (a chunk moved, a worker gone) costs one lookup and a second run, never a
wrong value. Anything these paths cannot do exactly as the graph would returns None, and the caller
runs the graph instead: not persisted, no client, a chunk in no worker's memory, a worker that left
while the run was pending (the client checks the scheduler's worker list every
``multireduce.direct-check-interval``, default 0.25 s, so a dead address cannot hold the run for the
30 s connect timeout), reductions over only some axes. Every other error (a kernel's, a bad chunk's,
an operator's own ``TimeoutError``) surfaces unchanged: the worker hands it back as a value
(``_Failed``), so it is never taken for a comm failure and recomputed; a scan that fails on one worker
drops what the others kept.

A worker that stops answering (a stopped process, a swapping machine, a partitioned node) stays in
the scheduler's list until its heartbeats are missed for ``distributed.scheduler.worker-ttl`` (5 min),
and a pooled connection to it takes the run's message and never replies. Workers that hold none of
the chunks are never called, so they cannot hold the run. The work runs in a thread on each worker
(the chunks read on its event loop first, as a task's inputs are), so its event loop keeps answering
however long the chunks take; a reply pending for ``multireduce.direct-check-interval`` starts a
liveness probe of the workers not yet answered: a new connection (never a pooled one) and an
``identity`` request, from the client for a direct call and from the scheduler for its broadcast,
bounded by ``multireduce.direct-connect-timeout`` (default 2 s) and repeated every such timeout while
the reply is pending. A busy worker answers it and is waited for; one that does not is given up:
its chunks are taken from other copies where there are any, else ``WorkerStalled`` names it, how many
chunks only it holds and the setting, a few seconds after the call (the graph would wait for the
worker as long as Dask does: ``client.compute`` / ``client.persist``). A scan given up on drops what
the other workers kept, and the scheduler drops the silent worker's outputs once it answers again.
Nothing is added to a run whose workers all answer in time: the probe starts only after a check
interval without every reply, and the placement comes from the previous run's replies.

The scan's outputs keep their lineage, though no task made them (``_register_with_lineage``): once
registered, each output key gets its recipe through one ``client.persist`` of a graph of one task per
output, ``_kept_block`` of its input chunk (for an expression, of the held chunks its recipe reads) from
its carry (a literal of a few bytes). The scheduler runs none of them (it fills in the missing task of a
key it holds as data, and runs only released keys); a worker lost later loses those chunks as it loses
any computed task's: the scheduler makes them again from their inputs (those recomputed first where
they were lost too) with the same function and carry, so the same bits. As with the graph, an output
whose input has no lineage (scattered data) and is lost with it raises ``FutureCancelledError``. Cost, 4
CPU workers, 128 chunks (2026-11-26, a loaded 2-core machine, 60 calls each, interleaved, three runs):
the held scan's median 60.0 -> 60.4, 39.7 -> 42.0 and 44.5 -> 52.1 ms for a persisted input, 67.6 ->
76.6, 59.6 -> 63.9 and 67.1 -> 76.6 ms for ``x * 2`` (each chunk's recipe goes to the scheduler too). Of
that, the client's part is 4.9 ms median (7.3 for ``x * 2``); the scheduler takes the graph in about 10
ms after the call has returned (a LocalCluster's scheduler shares the client's process, so here that
time competes with the next call).

A held scan keeps every output on the GPUs holding its inputs until the scans are done (``update_data``
takes them together, so dask-cuda's spilling cannot make room meanwhile), and a reduction over some axes
stacks its chunks' partials there: where the chunks are CuPy arrays, each worker first checks that the
bytes its chunks need (plus one chunk's of scratch) fit in what its GPUs have free where CuPy allocates
(the device, plus CuPy's pool's cached blocks, or RMM's pool's unused part), at the start of the
totals run and again before the scans (``check_room``), and raises ``GPUOutOfMemoryError`` naming the
worker, the bytes needed and free, and what to do, before any work. An allocator whose free memory
cannot be read (managed memory, RMM's asynchronous one) is not checked; host chunks never are.

Why ``client.run`` and not ``client.submit`` with worker restrictions, measured on a
4-process CPU LocalCluster, 128 persisted chunks (2026-11-22, a loaded 2-core machine, 20 calls x 3
rounds): ``client.run`` 49-53 ms median (21-38 ms best); one ``client.submit`` per worker restricted to
it (``allow_other_workers``, chunk futures as arguments) plus ``gather``, folded on the client, 55-157 ms
median (48-76 ms best), the graph 78-159 ms (55-58 ms best). Submitted tasks pass the scheduler's task
machinery (graph update, transitions, one message per task each way) that the graph also pays; run is
one broadcast. What the scheduler would add (recomputing lost chunks) a reduction does not need (its
value is on the client) and a scan's outputs get from their recipes (above).

Since 2026-11-26 the client sends the workers ``run``'s message itself (``_call_one``): one round trip
instead of the scheduler's two. It uses the client's pooled connections and security, as distributed's
own ``direct_to_workers`` gathers do; a worker it cannot reach or a worker gone sends the run through
the scheduler once more (a client that cannot reach its workers at all is remembered and goes through
the scheduler from then on). ``multireduce.direct-to-workers`` (True/False) or the client's own
``direct_to_workers`` decide it where set. Every setting is read by ``placement.setting``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import pickle
import time
import traceback
import uuid
import weakref

import dask
import numpy as np

import dask.array as da
from dask.array.utils import meta_from_array
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from . import placement
from .backends import Later, finish_later, on_device_of, partials_later
from .core import ScanPlan
from .dtypes import NO_GRID, NO_TOP, exact_in_any_order, merge_bounds
from .graph import (PerPlan, _device, _lanes, _OfHeld, _OneBlockOfHeld, _scan_seeded, first_level, first_level_folds,
                    fold_in_order, leading_runs_fold, reduction, scan, stage_token, stays_on_device, to_host_together)


logger = logging.getLogger(__name__)

#: Why the direct path declined in this process's last attempt and left the work to the graph (the
#: results are the same either way; this says which path ran, for a test or a profile that expected the
#: direct one): the first reason the attempt met, None where it did not decline. Also logged at DEBUG
#: level on the "multireduce.direct" logger.
last_decline: str | None = None


def _attempting() -> None:
    """A direct attempt begins: the reasons of earlier ones are forgotten."""
    global last_decline
    last_decline = None


def _declined(reason: str):
    """None, the direct path's answer for "the graph must run", with ``reason`` kept in ``last_decline``
    unless the attempt declined for an earlier, closer reason already."""
    global last_decline
    if last_decline is None:
        last_decline = reason
    logger.debug("the direct path declined, the graph runs: %s", reason)
    return None


def _not_direct_here(kwargs: dict) -> bool:
    """Whether a held result's ``compute``/``persist`` goes to the graph as asked: arguments given, or a
    scheduler other than distributed's (said in ``last_decline``)."""
    _attempting()
    if kwargs or not placement.distributed_is_the_scheduler():
        _declined("arguments to compute/persist, or a scheduler other than distributed's: the graph, as asked")
        return True
    return False


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


async def values_of_held(per_chunk, work: dict, only_where=frozenset(), extra=None, need=None, dask_worker=None):
    """Runs on each worker named in ``work`` (worker -> keys) through a run: ``per_chunk(block,
    *extra[key])`` for each of its keys this worker holds (None for those in ``only_where``: the caller
    only wants to know they are here), on the GPU holding it, brought to the host together. Returns
    ``_Packed({key: value})``, or ``_Failed``. The chunks are read on the worker's event loop, as it
    reads a task's inputs, and the work runs in a thread: the loop keeps answering heartbeats, other
    clients and the caller's liveness probe, so a worker busy with large chunks is never taken for a
    stalled one. ``need``: see ``check_room``, done first."""
    try:
        held = [k for k in work.get(dask_worker.address, ()) if k in dask_worker.data]
        blocks = [dask_worker.data[k] for k in held]
        check_room(need, held, blocks, dask_worker.address)
        return await asyncio.to_thread(values_here, per_chunk, held, blocks, only_where, extra or {})
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


def values_here(per_chunk, keys: list, blocks: list, only_where=frozenset(), extra=None, folds=None) -> _Packed:
    """``values_of_held``'s work on the chunks ``blocks`` (named ``keys``) of this worker. ``folds`` (a
    combine function and groups of keys): each group's host values combined here, in order, and sent as
    one value under its first key; the client would combine exactly those values in that order (the
    first level of ``fold_in_order``), so the bits are the same and less crosses the network."""
    from .recipes import one_at_a_time

    extra = extra or {}
    kept = _KeptOnGpu()

    def one(block, k):
        if k in only_where:
            return kept.add(None)
        with partials_later():  # this chunk's own partial only: not what making the next chunk computes
            kept.add(_call_where_held(block, per_chunk, *extra.get(k, ())))

    # chunks made one by one (a recipe): none kept alive while the next is made; a statistic's partials
    # stay on the GPU until every chunk's is launched (or LATER_BYTES of them wait), then come to the host
    # in one copy
    one_at_a_time(blocks, one, keys)
    computed = kept.finished()
    if computed and all(type(v) is PerPlan for v in computed):  # several plans' partials (a FusedPlan)
        computed = _on_host_by_plan(keys, computed)
    if folds and folds[1] and computed and all(stays_on_device(v) for v in computed):
        # partials of a reduction over some axes are combined on the GPU, as on every path: only the
        # groups' results come to the host
        values = _folded(dict(zip(keys, computed)), folds)
        keys, computed, folds = list(values), list(values.values()), None
    # the common cases: no per-chunk work on the host
    columns = _PartialColumns.of(keys, computed) or _TupleColumns.of(keys, computed)
    if not folds or not folds[1]:
        return _Packed(columns if columns is not None else dict(zip(keys, to_host_together(computed))))
    return _Packed(_folded(columns.expand() if columns is not None else dict(zip(keys, to_host_together(computed))),
                           folds))


#: the most bytes of statistics' States a worker keeps on a GPU before bringing them to the host
#: (``values_here``): a variance over some axes keeps 32 bytes per output and chunk, and the copy doubles
#: them for a moment
LATER_BYTES = 64 << 20


class _KeptOnGpu:
    """The chunk partials ``values_here`` computed, with the ``backends.Later`` among them (also inside a
    FusedPlan's ``PerPlan``) brought to the host together once LATER_BYTES of them wait, and at the end."""

    def __init__(self):
        self.values: list = []
        self.waiting = 0

    def add(self, value) -> None:
        self.values.append(value)
        inner = value if type(value) is PerPlan else (value,)
        self.waiting += sum(v.raw.nbytes for v in inner if type(v) is Later)
        if self.waiting >= LATER_BYTES:
            self.values = self._finish(self.values)
            self.waiting = 0

    @staticmethod
    def _finish(values: list) -> list:
        at = [(i, j) for i, value in enumerate(values)
              for j, v in enumerate(value if type(value) is PerPlan else (value,)) if type(v) is Later]
        if not at:
            return values
        done = finish_later([values[i][j] if type(values[i]) is PerPlan else values[i] for i, j in at])
        out = [list(v) if type(v) is PerPlan else v for v in values]
        for (i, j), v in zip(at, done):
            if type(values[i]) is PerPlan:
                out[i][j] = v
            else:
                out[i] = v
        return [PerPlan(v) if type(values[i]) is PerPlan else v for i, v in enumerate(out)]

    def finished(self) -> list:
        """Every value added, in order, on the host."""
        self.values, self.waiting = self._finish(self.values), 0
        return self.values


def _on_host_by_plan(keys: list, computed: list) -> list:
    """Per-chunk tuples of several plans' partials with every plan's partials brought to the host together
    (``_PartialColumns`` where they have its form, else ``to_host_together``), as one plan's would be."""
    by_plan = []
    for column in zip(*computed):
        packed = _PartialColumns.of(keys, list(column))
        by_plan.append(list(packed.expand().values()) if packed is not None else to_host_together(list(column)))
    return [tuple(values) for values in zip(*by_plan)] if by_plan else computed


def _folded(values: dict, folds) -> dict:
    """``values`` with each group of ``folds`` (combine, groups of keys) combined in order under its first key."""
    combine, groups = folds
    for group in groups:
        values[group[0]] = combine(*(values.pop(k) for k in group))
    return values


class _Packed:
    """A worker's reply pickled as one buffer. ``client.run`` serializes each NumPy array in a reply
    apart (its own header and frames): a dict of 99 host partials cost ~14 ms per call that way on a
    4-worker CPU cluster (2026-11-26), where one pickle costs well under 1 ms. Buffers of at least
    ``OUT_OF_BAND_BYTES`` each (such as a worker's total of a 721 x 1440 float64 mean, 8.3 MB) stay out of the
    pickle, so distributed sends them as frames of their own, uncopied: inside the pickle each was
    copied three more times between the worker's array and the client's (four 8.3 MB replies took 106
    ms per call that way, 38 ms out of band, on a 4-worker cluster of this project's 2-core VM,
    2026-11-27)."""

    __slots__ = ("buffers", "data")

    def __init__(self, value):
        buffers: list = []

        def apart(buffer) -> bool:  # pickle's convention: a false value sends the buffer out of band
            if buffer.raw().nbytes < OUT_OF_BAND_BYTES:
                return True
            buffers.append(buffer)
            return False

        self.data = pickle.dumps(value, protocol=5, buffer_callback=apart)
        self.buffers = buffers

    def __reduce_ex__(self, protocol):
        # out of band again under protocol 5 (what arrived may be memoryviews, which pickle refuses); an
        # older protocol gets writable copies in the stream (a fold may add into what arrived)
        if protocol >= 5:
            buffers = [b if type(b) is pickle.PickleBuffer else pickle.PickleBuffer(b) for b in self.buffers]
        else:
            buffers = [bytearray(b) for b in self.buffers]
        return _packed_from, (self.data, buffers)

    def unpack(self):
        value = pickle.loads(self.data, buffers=self.buffers)
        return value.expand() if isinstance(value, (_PartialColumns, _TupleColumns)) else value


OUT_OF_BAND_BYTES = 1 << 16


def _packed_from(data: bytes, buffers: list) -> _Packed:
    packed = _Packed.__new__(_Packed)
    packed.data, packed.buffers = data, list(buffers)
    return packed


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


class _TupleColumns:
    """{key: tuple of NumPy arrays} whose tuples have one form (length, and each member's dtype and shape):
    a statistic's chunk partials. Each member travels stacked over the keys: pickling 128 argmax
    partials apart took 1.2 ms and unpickling 0.6 ms on this project's 2-core VM (2026-11-27).
    ``expand`` gives back tuples of arrays of the same dtypes, shapes and values (views of the stacks)."""

    def __init__(self, keys: list, members: tuple):
        self.keys, self.members = keys, members

    @classmethod
    def of(cls, keys: list, parts: list):
        from .backends.numpy_stats import stack_partials

        members = stack_partials(parts)
        return None if members is None else cls(list(keys), members)

    def expand(self) -> dict:
        return {k: tuple(m[i, ...] for m in self.members) for i, k in enumerate(self.keys)}


async def scan_and_keep(kept: _Kept, work: dict, recipes=None, need=None, dask_worker=None):
    """Runs on the workers holding a scan's input through a run: scan each (input key, output key, carry)
    of ``work[this worker]`` here (``kept.block_of``: a scan's, or a ``ChunkReduced``) and keep the outputs
    in this worker's memory, as a scatter does (the
    worker tells the scheduler nothing; the client registers the keys). With ``recipes`` (worker ->
    ``recipes.Recipe``), the input chunks are made here from the chunks this worker holds, one at a time,
    in the recipe's order. Returns {output key: bytes}, or ``_Failed``. The scans run in a thread (see
    ``values_of_held``); outputs of a scan the client gave up on meanwhile (``drop_kept`` came first) are
    not kept. ``need``: see ``check_room``, done before any scan."""
    from dask.sizeof import sizeof

    mine = work.get(dask_worker.address, ())
    recipe = recipes.get(dask_worker.address) if recipes is not None else None
    reads = recipe.inputs if recipe is not None else [in_key for in_key, _, _ in mine]
    if any(k not in dask_worker.data for k in reads):
        # a replica the client chose is gone (the Active Memory Manager drops extra copies every 2 s):
        # placement, not the operator: the caller falls back to the graph
        return _Moved()
    try:
        inputs = [dask_worker.data[k] for k in reads]
        check_room(need, [in_key for in_key, _, _ in mine], inputs, dask_worker.address)
        outputs = await asyncio.to_thread(_scans_here, kept, mine, inputs, recipe)
        if any(_name_of(k) in _abandoned.get(dask_worker, ()) for k in outputs):
            return _Moved()  # nobody waits for this reply any more
        dask_worker.update_data(data=outputs, stimulus_id=f"multireduce-scan-{kept.label}")
        return {k: sizeof(v) for k, v in outputs.items()}
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


def _scans_here(kept: _Kept, mine, inputs: list, recipe=None) -> dict:
    """``scan_and_keep``'s work: the chunks are ``inputs`` (in ``mine``'s order), or made by ``recipe`` from
    them (its inputs, in its order)."""
    seeds = {in_key: (out_key, carry) for in_key, out_key, carry in mine}

    def scanned(block, in_key):
        out_key, carry = seeds[in_key]
        return out_key, _kept_block(kept, carry, block)

    if recipe is None:
        return dict(scanned(block, in_key) for (in_key, _, _), block in zip(mine, inputs))
    return dict(recipe.apply(dict(zip(recipe.inputs, inputs)), scanned, recipe.chunks))


class _Kept:
    """What a held call keeps of each chunk where the chunk is (``scan_and_keep``): ``block_of(chunk,
    carry)`` makes its output block, and the same function is the task that makes it again where a worker
    holding it is lost (``_register_with_lineage``), so both give the same bits."""

    __slots__ = ("plan",)

    def __init__(self, plan):
        self.plan = plan

    @property
    def label(self) -> str:
        return self.plan.label

    @property
    def out_dtype(self):
        return self.plan.out_dtype


class ChunkScanned(_Kept):
    """A held scan's chunk: scanned from its carry (None: a lane's first chunk)."""

    __slots__ = ()

    def block_of(self, block, carry):
        return _scan_seeded(self.plan, block, carry, 0 if carry is None else 1)


class ChunkReduced(_Kept):
    """A reduction over axes that every chunk holds whole (one chunk along each reduced axis: the row sums
    of a matrix in row chunks): each output block is ``fold_in_order`` of that chunk's one partial, the
    graph's aggregate of a lane of one chunk (the same bits). The carry is the chunk's offsets where the
    partial reads ``located`` chunks (argmin/argmax), else None."""

    __slots__ = ("split_every", "on_device", "located")

    def __init__(self, plan, split_every: int, on_device: bool, located=None):
        super().__init__(plan)
        self.split_every, self.on_device, self.located = split_every, on_device, located

    def block_of(self, block, offsets):
        chunk = block if self.located is None else self.located(block, offsets)
        return _device(self.on_device, fold_in_order(self.plan, self.split_every, [self.plan.partial(chunk)]))


def _kept_block(kept: _Kept, carry, block):
    """``kept.block_of(block, carry)`` on the GPU holding ``block``."""
    with on_device_of(block):
        return kept.block_of(block, carry)


def _kept_block_made(kept: _Kept, carry, recipe, *inputs):
    """``_kept_block`` of the chunk ``recipe`` makes from ``inputs`` (the held chunks it reads)."""
    (block,) = recipe.make(dict(zip(recipe.inputs, inputs)))
    return _kept_block(kept, carry, block)


def _name_of(key):
    return key[0] if isinstance(key, tuple) else key


# Per worker: the names of scans whose outputs ``drop_kept`` dropped, newest last. Its run can reach a
# worker before the scan's own run is done with it (the scans run in a thread; a stalled worker reads
# both once it resumes): the scan then keeps nothing.
_abandoned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ABANDONED_MAX = 256


class _Moved:
    """``scan_and_keep``'s answer when an input chunk it was given is no longer in this worker's memory."""


def _release_registered(keys: list, client_id: str, dask_scheduler=None):
    """Runs on the scheduler: let go of ``keys`` that a failed ``update_data`` may have registered in
    part (in memory, wanted by nobody): wanted by this client, then released, as a dropped future is."""
    known = [k for k in keys if k in dask_scheduler.tasks]
    if known:
        dask_scheduler.client_desires_keys(keys=known, client=client_id)
        dask_scheduler.client_releases_keys(keys=known, client=client_id, stimulus_id="multireduce-scan-failed")


def _drop_kept_on_live(client, workers: list, keys: list, unanswered=()) -> None:
    """``drop_kept`` on those of ``workers`` still alive, given up on as soon as one of them leaves: a
    run that names a dead address would hold the call for the scheduler's whole connect timeout (30 s).
    A worker that left took its outputs with it. Workers that do not answer (``unanswered``, or found
    so now) are handed to the scheduler, which drops their outputs once they answer again."""
    live = set(client.sync(client.scheduler.identity)["workers"])
    alive = [w for w in workers if w in live and w not in unanswered]
    silent = [w for w in workers if w in live and w in unanswered]
    if alive:
        try:
            _run(client, alive, drop_kept, keys)  # None (a worker left meanwhile) is as good as done
        except _Unanswered as error:
            silent += error.workers
    timeout = placement.setting("multireduce.direct-connect-timeout")
    for worker in silent:
        client.run_on_scheduler(_drop_when_answering, worker, keys, timeout, wait=False)


def drop_kept(keys: list, dask_worker=None):
    """Forget outputs ``scan_and_keep`` kept here when the scan as a whole failed (the scheduler never
    heard of them), and keep none of that scan that is still running here."""
    from distributed.worker_state_machine import FreeKeysEvent

    names = _abandoned.setdefault(dask_worker, {})
    names.update(dict.fromkeys({_name_of(k) for k in keys}))
    while len(names) > _ABANDONED_MAX:
        names.pop(next(iter(names)))
    mine = [k for k in keys if k in dask_worker.state.tasks]
    if mine:
        dask_worker.handle_stimulus(FreeKeysEvent(keys=mine, stimulus_id="multireduce-scan-failed"))


async def _drop_when_answering(address: str, keys: list, timeout: float, dask_scheduler=None):
    """Runs on the scheduler in the background: ``drop_kept`` on the worker at ``address`` once it answers
    again, given up when it leaves. A worker that stalled during a scan finishes it when it resumes; the
    scheduler, which every worker reaches, outlives the client's call."""
    message = _run_message(drop_kept, keys)
    pause = timeout
    while address in dask_scheduler.workers:
        try:
            await _fresh_call(address, message, timeout, dask_scheduler.connection_args)
            return
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(pause)  # each try leaves a connection in a stopped process's backlog
            pause = min(2 * pause, 30.0)


def _placement_errors() -> tuple[type[BaseException], ...]:
    """Errors that say the placement was stale (a moved chunk, a dead or unreachable worker), never
    the reduction's own: those must reach the caller."""
    from distributed.comm.core import CommClosedError

    return (WorkerGone, CommClosedError, ConnectionError, asyncio.TimeoutError, TimeoutError)


class WorkerGone(LookupError):
    """A worker the run waits on left the cluster while it ran."""


class WorkerStalled(TimeoutError):
    """Workers holding chunks that a held result's ``.compute()`` / ``.persist()`` needs did not answer
    within ``multireduce.direct-connect-timeout`` (stopped, swapping, cut off), and no other worker holds
    those chunks."""


class _Unanswered(Exception):
    """Workers a run waited on that did not answer a liveness probe within the connect timeout. Not a
    placement error: the scheduler's broadcast or the graph would wait for them as long."""

    def __init__(self, workers):
        super().__init__(sorted(workers))
        self.workers = sorted(workers)


def _stalled(counts: dict, total: int, name: str, timeout: float) -> WorkerStalled:
    """The error for workers (worker -> how many of the ``total`` chunks of ``name`` only it holds) that
    did not answer."""
    which = ", ".join(f"{w} ({n} of the {total} chunks)" for w, n in sorted(counts.items()))
    return WorkerStalled(
        f"worker{'s' if len(counts) > 1 else ''} {which} of {name!r} did not answer within {timeout:g} s "
        f"(dask.config 'multireduce.direct-connect-timeout'): stopped, swapping or cut off, and no other worker "
        f"holds those chunks. Raise the setting to wait longer, or use the graph (client.compute / "
        f"client.persist of the result), which waits for the worker as Dask does.")


def _run_message(fn, *args) -> dict:
    """The message a worker's ``run`` handler takes (what the scheduler's broadcast sends) for ``fn(*args)``
    run by ``_unpickled_in_a_thread``."""
    from distributed.protocol.pickle import dumps

    return dict(op="run", function=dumps(_unpickled_in_a_thread), args=dumps((_payload(fn, *args),)), wait=True,
                kwargs=dumps({}))


def _payload(fn, *args) -> bytes:
    from distributed.protocol.pickle import dumps

    return dumps((fn, args))


async def _unpickled_in_a_thread(payload: bytes, dask_worker=None):
    """What every run of this module executes on a worker: ``payload`` (``fn`` and its arguments, pickled)
    unpickled in a thread, then ``fn(*args, dask_worker=...)`` (awaited where it is a coroutine function).
    The run handler unpickles its arguments on the worker's event loop, and the first use of an operator
    imports its module there: seconds in which the worker would not answer a liveness probe."""
    from distributed.protocol.pickle import loads
    from distributed.utils import has_arg

    fn, args = await asyncio.to_thread(loads, payload)
    out = fn(*args, dask_worker=dask_worker) if has_arg(fn, "dask_worker") else fn(*args)
    return await out if asyncio.iscoroutine(out) else out


async def _run_while_alive(client, workers: list, interval: float, timeout: float, direct: bool, fn, *args):
    """``fn(*args)`` on ``workers``: the client calls each worker itself (``direct``, ``_call_one``) or the
    scheduler broadcasts (``client.run``). Every ``interval`` the scheduler's worker list is checked: a
    worker that left gives up the run (WorkerGone) at once, where its dead address would hold it for the
    whole connect timeout (30 s). A reply still pending after ``interval`` starts a liveness probe of the
    workers not yet answered (``_unanswered``: a fresh connection, from where the call was sent, bounded
    by ``timeout``), repeated every ``timeout``: those that do not answer it are given up (``_Unanswered``),
    as the scheduler would give up a worker that missed its heartbeats, but within seconds. Replies taking
    longer than that from workers that answer the probe are waited for: they are busy, not stalled. A
    direct call still connecting is not probed: its connect fails within ``timeout`` by itself, and a
    client that reaches no worker (outside their network) must go through the scheduler, not fail."""
    loop = asyncio.get_running_loop()
    connected: set = set()  # direct calls past connecting: a connect not made is bounded by its own timeout
    if direct:
        message = _run_message(fn, *args)
        calls = {w: asyncio.ensure_future(_call_one(client, w, message, timeout, connected)) for w in workers}
    else:
        run = asyncio.ensure_future(client._run(_unpickled_in_a_thread, _payload(fn, *args), workers=workers))
        calls = dict.fromkeys(workers, run)
    probe, probe_due = None, loop.time() + interval
    begun, known = loop.time(), _answered.get(client, ())
    grace = _first_contact_grace()
    try:
        while True:
            for call in calls.values():
                if call.done() and call.exception() is not None:
                    raise call.exception()
            pending = {c for c in calls.values() if not c.done()}
            if not pending:
                return {w: c.result() for w, c in calls.items()} if direct else run.result()
            await asyncio.wait(pending, timeout=interval, return_when=asyncio.FIRST_EXCEPTION)
            if all(c.done() for c in pending):
                continue
            live = (await client.scheduler.identity())["workers"]
            if any(w not in live for w in workers):
                raise WorkerGone(f"a worker of {sorted(workers)} left the cluster")
            if probe is not None and probe.done():
                # a worker never called before may still be importing this module on its event loop (the
                # run's message is read there): it is given distributed's own connect timeout to answer
                silent = [w for w in probe.result() if not calls[w].done()
                          and (w in known or loop.time() - begun >= grace)]
                if silent:
                    raise _Unanswered(silent)
                probe = None
            if probe is None and loop.time() >= probe_due:
                waiting = [w for w, c in calls.items() if not c.done() and (w in connected or not direct)]
                if waiting:
                    probe = asyncio.ensure_future(_unanswered(client, waiting, timeout, direct))
                    probe_due = loop.time() + timeout
    finally:
        for call in (*calls.values(), probe):
            if call is not None:
                call.cancel()  # nothing when it is done; a call abandoned here must not linger


async def _unanswered(client, workers: list, timeout: float, direct: bool) -> list:
    """Those of ``workers`` that do not answer a liveness probe within ``timeout``: from the client for a
    direct call, from the scheduler for its broadcast (a client outside the workers' network reaches
    none of them itself)."""
    if direct:
        return await _silent(workers, timeout, client.connection_args)
    return await client._run_on_scheduler(_silent_to_the_scheduler, workers, timeout)


async def _silent(workers: list, timeout: float, connection_args: dict) -> list:
    answers = await asyncio.gather(*(_answers(w, timeout, connection_args) for w in workers))
    return [w for w, answered in zip(workers, answers) if not answered]


async def _silent_to_the_scheduler(workers: list, timeout: float, dask_scheduler=None) -> list:
    return await _silent(workers, timeout, dask_scheduler.connection_args)


async def _answers(address: str, timeout: float, connection_args: dict) -> bool:
    """Whether the worker at ``address`` answers a new connection (never a pooled one: a stopped process's
    socket takes what is written to it and never replies) and an ``identity`` request within ``timeout``.
    Its event loop answers while it runs our work in a thread, or the graph's tasks in its own."""
    try:
        await _fresh_call(address, {"op": "identity"}, timeout, connection_args)
        return True
    except (OSError, asyncio.TimeoutError):
        return False


async def _fresh_call(address: str, message: dict, timeout: float, connection_args: dict):
    """The reply to ``message`` from ``address`` over a new connection, closed after, all within ``timeout``:
    distributed's ``connect`` bounds the TCP connect by its timeout, but not the handshake that follows,
    which a stopped process never answers (its kernel accepts the connection)."""
    from distributed.comm import connect
    from distributed.core import send_recv

    comm = None

    async def call():
        nonlocal comm
        comm = await connect(address, timeout=timeout, **connection_args)
        return await send_recv(comm, **message)

    try:
        return await asyncio.wait_for(call(), timeout)
    finally:
        if comm is not None:
            comm.abort()


async def _call_one(client, address: str, message: dict, timeout: float, connected: set | None = None):
    """What the worker at ``address`` replies to ``message`` (a run), sent over the client's own pooled
    connections with its security settings, one round trip instead of the scheduler's two (a no-op: 1.9 ms
    through the scheduler on 4 x H200, 2026-11-26). Connecting is bounded by ``timeout``
    (``multireduce.direct-connect-timeout``) so an unreachable worker is soon given up on (``_run`` then
    asks the scheduler). ``connected``: ``address`` is added once connected."""
    from distributed.core import clean_exception, send_recv

    # distributed bounds the TCP connect, not the handshake after it, which a stopped worker never answers
    comm = await asyncio.wait_for(client.rpc.connect(address, timeout=timeout), timeout)
    _last_direct_connect[client] = time.monotonic()  # the client reaches its workers
    if connected is not None:
        connected.add(address)
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


async def _call_each(client, workers: list, fn, *args) -> dict:
    """What ``client.run(fn, *args, workers=workers)`` returns, each worker called by the client itself
    (``_call_one``); one failed call cancels the others."""
    message = _run_message(fn, *args)
    timeout = placement.setting("multireduce.direct-connect-timeout")
    calls = [asyncio.ensure_future(_call_one(client, w, message, timeout)) for w in workers]
    try:
        replies = await asyncio.gather(*calls)
    finally:
        for call in calls:  # one failed: the others are not left running unawaited
            call.cancel()
    return dict(zip(workers, replies))


# Per client: whether calling workers directly failed where the scheduler's broadcast reached them, and
# when a direct connection last succeeded.
_direct_unreachable: weakref.WeakSet = weakref.WeakSet()
_last_direct_connect: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> monotonic time


def _goes_direct(client) -> bool:
    """Whether the client calls workers itself: ``multireduce.direct-to-workers`` when set; else the
    client's own ``direct_to_workers`` when set; else yes unless it failed before, since a client that
    cannot reach its workers is one outside the cluster's network, where distributed's default
    (through the scheduler) is the safe one and that fallback costs one bounded connect attempt once."""
    chosen = placement.setting("multireduce.direct-to-workers")
    if chosen is not None:
        return chosen
    if getattr(client, "direct_to_workers", None) is not None:
        return bool(client.direct_to_workers)
    return client not in _direct_unreachable


# Per client: the workers that have answered one of this module's runs (so they have imported it).
_answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _first_contact_grace() -> float:
    """How long a worker that never answered a run may take before a silent probe counts: distributed's
    ``distributed.comm.timeouts.connect`` (30 s by default)."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect", "30s")))


def _run(client, workers: list, fn, *args):
    """``fn(*args)`` on ``workers`` from the client's thread: {worker: reply}, None on a placement error
    (a worker gone, unreachable); a worker's own error (``_Failed``) is raised, and so is ``_Unanswered``
    for workers that did not answer (``_run_while_alive``). Workers are called directly where
    ``_goes_direct``; a direct call that fails on placement is made once more through the scheduler."""
    interval = placement.setting("multireduce.direct-check-interval")
    timeout = placement.setting("multireduce.direct-connect-timeout")
    unreached = None
    started = time.monotonic()
    if _goes_direct(client):
        try:
            replies = client.sync(_run_while_alive, client, workers, interval, timeout, True, fn, *args)
        except WorkerGone as error:  # the scheduler cannot reach it either
            return _declined(f"a worker left before answering ({error})")
        except (*_placement_errors(), OSError):  # distributed's connect raises a bare OSError on its timeout,
            unreached = set(workers)  # ours a TimeoutError
        else:  # a worker's own error (_Failed, possibly a TimeoutError) is raised here, never taken for placement
            _answered.setdefault(client, set()).update(replies)
            return _unpacked(replies)
    try:
        replies = client.sync(_run_while_alive, client, workers, interval, timeout, False, fn, *args)
    except (*_placement_errors(), OSError) as error:  # the scheduler's connect times out with a bare OSError too
        return _declined(f"a worker could not be reached through the scheduler ({type(error).__name__}: {error})")
    # the scheduler reached every worker the client could not, and no direct connection of the client
    # succeeded meanwhile (under TLS a worker busy past the connect timeout fails a handshake it would pass later)
    if unreached and unreached <= set(replies) and _last_direct_connect.get(client, float("-inf")) < started:
        _direct_unreachable.add(client)
    _answered.setdefault(client, set()).update(replies)
    return _unpacked(replies)


def _unpacked(replies: dict) -> dict:
    replies = {w: r.unpack() if isinstance(r, _Packed) else r for w, r in replies.items()}
    for reply in replies.values():
        if isinstance(reply, _Failed):
            raise reply.error
    return replies


def held_values(x, keys: list, per_chunk, only_where=frozenset(), extra=None, need=None):
    """({key: per_chunk(chunk)}, {key: worker}) for the chunks ``keys`` (every chunk) of a persisted ``x``,
    each computed by one worker holding it (host values), and only those workers called: where the
    chunks were seen last (``placement.recently_seen``), else where the scheduler says they are (one
    ``who_has``). A placement gone stale (a chunk not where it was, a worker gone) is looked up again and
    run once more; a chunk replicated on a worker that does not answer is taken from another copy.
    None where some chunk is in no worker's memory or a worker left (the caller computes the graph
    instead). The reduction's own errors are raised, and ``WorkerStalled`` for a worker that does not
    answer and holds chunks no other worker has. ``need``: see ``check_room``."""
    client = placement.default_client()
    if client is None or not placement.setting("multireduce.placement") or not placement.is_persisted(x):
        return None
    if not keys:
        return {}, {}
    holder, fresh, silent, work = placement.recently_seen(x, client), False, set(), {}
    for _ in range(3):  # the placement seen last, then looked up, then without workers that did not answer
        if holder is None:
            who = placement.who_holds(x, client, avoid=silent)
            if who is None and silent:
                raise _stalled_holding(client, x, keys, silent, work)
            if who is None:
                return _declined(f"a chunk of {x.name} is in no worker's memory")
            holder, fresh = {k: w[0] for k, w in who.items()}, True
        work = {}
        for k in keys:
            work.setdefault(holder[k], []).append(k)
        try:
            replies = _run(client, sorted(work), values_of_held, per_chunk, work, only_where, extra, need)
        except _Unanswered as error:
            silent.update(error.workers)
            holder = None
            continue
        values = {k: v for reply in (replies or {}).values() for k, v in reply.items()}
        if replies is not None and len(values) == len(keys):
            placement.remember(x, holder, client)  # the next result over x needs no placement lookup
            return values, {k: holder[k] for k in keys}
        if fresh:
            return _declined(f"workers holding {x.name} answered for {len(values)} of its {len(keys)} chunks "
                             "(a chunk moved, or a worker left)")
        holder = None
    if silent:
        raise _stalled_holding(client, x, keys, silent, work)
    return _declined(f"the chunks of {x.name} were not where they were looked up, three times")


def _stalled_holding(client, x, keys: list, silent: set, asked: dict) -> WorkerStalled:
    """``WorkerStalled`` for the workers ``silent``, with how many of ``keys`` no other worker holds (where
    some chunk is in no memory now: how many each was asked for, ``asked``)."""
    who = placement.who_holds(x, client)
    if who is None:
        counts = {w: len(asked.get(w, ())) for w in silent}
    else:
        counts = {w: sum(1 for k in keys if w in who[k] and set(who[k]) <= silent) for w in silent}
    counts = {w: n for w, n in counts.items() if n} or counts
    return _stalled(counts, len(keys), x.name, placement.setting("multireduce.direct-connect-timeout"))


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
    _attempting()
    if len(plan.axes) != x.ndim or x.npartitions == 0:
        return None
    keys = placement.chunk_keys(x)
    if located is None:
        found = held_values(x, keys, getattr(plan, "partial_where_held", plan.partial))
    else:
        found = held_values(x, keys, functools.partial(_partial_of_located, plan, located), extra=chunk_offsets(x))
    if found is None:
        return None
    return fold_in_order(plan, split_every, [found[0][k] for k in keys])


def _partial_of_located(plan, located, block, *offsets):
    return plan.partial(located(block, offsets))


# ------------------------------------------------------------------------------------------------
# GPU memory, checked before the work
# ------------------------------------------------------------------------------------------------
def _on_gpus(x, what: str, itemsize: int, axes=()):
    """``need`` for ``check_room`` where ``x``'s chunks are CuPy arrays: (``what``, ``_chunk_bytes``); None
    for host chunks (no check)."""
    if not type(x._meta).__module__.startswith("cupy"):
        return None
    return what, _chunk_bytes(x, itemsize, axes)


def _chunk_bytes(x, itemsize: int, axes=()) -> dict:
    """{chunk key: bytes of an array of ``itemsize`` shaped as the chunk of ``x``, its ``axes`` one long}."""
    import itertools

    sizes = [(1,) * len(c) if d in axes else c for d, c in enumerate(x.chunks)]
    return {(x.name, *idx): itemsize * math.prod(sizes[d][i] for d, i in enumerate(idx))
            for idx in itertools.product(*map(range, x.numblocks))}


def check_room(need, keys: list, blocks: list, where: str) -> None:
    """On a worker, before any work on its chunks ``keys`` (read from ``blocks``, the held chunks): raise
    ``GPUOutOfMemoryError`` where what the work keeps on the GPUs holding ``blocks``, ``need`` = (what,
    {chunk key: bytes}) summed over ``keys`` plus the largest once more (one chunk's scratch), cannot fit in
    what they have free. Host chunks, or an allocator whose free memory cannot be bounded, are not checked
    (the allocation itself fails then); a check is two driver calls per GPU."""
    if not need or not keys:
        return
    what, sizes = need
    bytes_of = [sizes[k] for k in keys if k in sizes]
    found = _room_on(blocks) if bytes_of else None
    if found is None:
        return
    error = room_error(where, what, sum(bytes_of) + max(bytes_of), *found)
    if error is not None:
        raise error


def room_error(where: str, what: str, needed: int, room: dict, gpus: list):
    """The decision, from numbers alone: None where ``needed`` bytes fit in ``room`` (bytes free for new
    arrays by where they are: the device, CuPy's or RMM's pool; summed over ``gpus``, the device ids),
    else the ``GPUOutOfMemoryError`` to raise, naming the worker ``where``, the bytes needed and free, and
    what to do."""
    from .errors import GPUOutOfMemoryError, _gib

    free = sum(room.values())
    if needed <= free:
        return None
    parts = " + ".join(f"{kind} {_gib(n)}" for kind, n in room.items())
    which = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(map(str, gpus))}"
    return GPUOutOfMemoryError(
        f"worker {where}: {what} need {needed} bytes ({_gib(needed)}) on {which}, which {'has' if len(gpus) == 1 else 'have'} "
        f"{free} bytes ({_gib(free)}) free ({parts}); nothing was computed. Hold fewer chunks on each worker "
        f"(more workers or GPUs, or smaller arrays per call), let Dask spill (dask-cuda's device_memory_limit, "
        f"and client.persist / client.compute of the result, whose tasks spill as they go), or give the workers "
        f"an RMM pool (multireduce.cluster.local_cluster(rmm_pool_size=...) or rmm_async=True) so that CuPy and "
        f"spilling share one allocator.",
        what=what, nbytes=needed, gpu={"id": gpus[0] if len(gpus) == 1 else tuple(gpus), "free": free})


def _room_on(blocks: list):
    """(free bytes by where, summed over the GPUs holding ``blocks``, those GPUs' ids) where ``blocks``
    holds CuPy arrays; None for host chunks or where a GPU's free memory cannot be bounded."""
    gpus = sorted({b.device.id for b in blocks if type(b).__module__.startswith("cupy")})
    if not gpus:
        return None
    room: dict = {}
    for gpu in gpus:
        found = _gpu_room(gpu)
        if found is None:
            return None
        for kind, n in found.items():
            room[kind] = room.get(kind, 0) + n
    return room, gpus


def _gpu_room(gpu: int):
    """Bytes that new CuPy arrays can take on GPU ``gpu``, by where: the device's free memory, plus the
    cached free blocks of CuPy's pool or the unused part of RMM's pool, whichever CuPy allocates from
    (an upper bound where RMM does not count its allocations). None where it cannot be bounded: managed
    memory (made to exceed the device), RMM's asynchronous allocator (its free pool is not readable), an
    allocator of another library, or any failure to read."""
    try:
        import cupy

        with cupy.cuda.Device(gpu):
            free = int(cupy.cuda.runtime.memGetInfo()[0])
            allocator = cupy.cuda.get_allocator()
            pool = getattr(allocator, "__self__", None)
            if isinstance(pool, cupy.cuda.MemoryPool):  # CuPy's own pool (the default)
                cached = int(pool.free_bytes())
                limit = int(pool.get_limit())
                if limit:  # a pool limit caps what it may hold, free memory or not
                    return {"device": max(0, min(free, limit - int(pool.total_bytes()))), "CuPy's pool": cached}
                return {"device": free, "CuPy's pool": cached}
            if getattr(allocator, "__name__", "") == "_malloc":  # no pool: each array from the device
                return {"device": free}
            if "rmm" in (getattr(allocator, "__module__", None) or ""):
                pooled = _rmm_pool_room()
                return None if pooled is None else {"device": free, "RMM's pool": pooled}
            return None
    except Exception:  # noqa: BLE001 - a check that cannot read leaves the decision to the allocation
        return None


def _rmm_pool_room():
    """The unused bytes of the current device's RMM pool (0 without a pool: plain cudaMalloc), through
    the adaptors over it (tracking or statistics, when dask-cuda tracks allocations); the whole pool
    where nothing counts its allocations; None for another resource (managed, asynchronous)."""
    import rmm

    resource, used = rmm.mr.get_current_device_resource(), None
    while resource is not None:
        if used is None and hasattr(resource, "get_allocated_bytes"):  # tracking (and limiting) adaptors
            used = int(resource.get_allocated_bytes())
        elif used is None and hasattr(resource, "allocation_counts"):  # statistics adaptor
            counts = resource.allocation_counts  # a dict in older RMM, a Statistics record in newer
            used = int(counts["current_bytes"] if isinstance(counts, dict) else counts.current_bytes)
        if isinstance(resource, rmm.mr.PoolMemoryResource):
            size = int(resource.pool_size())
            return size if used is None else max(0, size - used)
        if isinstance(resource, rmm.mr.CudaMemoryResource):
            return 0
        resource = getattr(resource, "upstream_mr", None)
    return None


def scan_persisted(x, plan: ScanPlan, name: str, sources=None):
    """``x`` scanned along ``plan.axis`` now, as a persisted array named ``name`` whose chunks are made
    and kept on the workers holding the input's; None where the graph must run instead.

    Two ``client.run`` calls and no task: each chunk's total (all but a lane's last chunk) is computed
    where the chunk is and comes back to the client (host values); the client folds them into every
    chunk's carry in chunk order (``plan.carries``, as the graph's carries do, so the bits are the
    graph's under any placement and for non-commutative operators); each worker then scans its chunks
    with their carries and keeps the outputs, which the client registers with the scheduler as a
    scatter does, with each chunk's recipe (``_register_with_lineage``). Nothing moves between workers.
    If a worker holding outputs is lost, the scheduler makes them again from their inputs, as it would
    the graph's (``client.persist(mr.cumsum(x))``).
    With ``sources`` (an expression over persisted arrays, ``held_sources``), each worker makes the
    chunks it scans from the chunks it holds, in both calls."""
    _attempting()
    client = placement.default_client()
    keys = placement.chunk_keys(x)
    lanes = list(_lanes(x, (plan.axis,)))
    wanted = [(x.name, *i) for _, index in lanes for i in index[:-1]]
    recipes = None
    # the outputs must fit on the GPUs holding the inputs: checked on each worker before the totals are
    # computed, and again before the scans
    need = _on_gpus(x, "the held scan's outputs", np.dtype(plan.out_dtype).itemsize)
    if sources is None:
        # every chunk's total but each lane's last, and where every chunk is, in one run
        found = held_values(x, keys, plan.totals, only_where=frozenset(keys) - set(wanted), need=need)
    else:
        planned = planned_recipe_values(sources, plan.totals, need=need)
        found = None if planned is None else (planned[0], planned[2])
        recipes = None if planned is None else planned[1]
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
    return _keep_where_held(client, x, ChunkScanned(plan), name, work, recipes, need, sources)


def _keep_where_held(client, x, kept: _Kept, name: str, work: dict, recipes, need, sources=None, chunks=None):
    """``scan_and_keep`` of ``kept`` and ``work`` ({worker: [(input key, output key, carry)]}) on its
    workers, then the outputs registered with the scheduler with their lineage: the persisted array ``name`` of ``chunks``
    (default ``x.chunks``), or None where the graph must run instead (nothing of it left behind)."""
    out_keys = [out_key for per_worker in work.values() for _, out_key, _ in per_worker]
    try:
        replies = _run(client, sorted(work), scan_and_keep, kept, work, recipes, need)
    except _Unanswered as error:  # nothing of this result may stay behind, on these workers either
        _drop_kept_on_live(client, list(work), out_keys, unanswered=error.workers)
        raise _stalled({w: len(work[w]) for w in error.workers}, x.npartitions, x.name,
                       placement.setting("multireduce.direct-connect-timeout")) from None
    except BaseException:  # a worker's own error: nothing of this result may stay behind
        _drop_kept_on_live(client, list(work), out_keys)
        raise
    # every worker answered with its outputs: else the graph runs instead
    if (replies is None or any(isinstance(r, _Moved) for r in replies.values())
            or sum(len(k) for k in replies.values()) != len(out_keys)):
        _drop_kept_on_live(client, list(work), out_keys)
        return _declined(f"the held {kept.label} of {x.name} kept "
                         f"{sum(len(k) for k in (replies or {}).values() if isinstance(k, dict))}"
                         f" of {len(out_keys)} output chunks (a chunk moved, or a worker left)")
    nbytes = {k: n for per_worker in replies.values() for k, n in per_worker.items()}
    try:
        client.sync(client.scheduler.update_data, who_has={k: [w] for w, per in replies.items() for k in per},
                    nbytes=nbytes, client=client.id)
        out = _register_with_lineage(client, x, kept, name, work, sources, chunks)
    except Exception as error:  # noqa: BLE001 - whatever failed, nothing registered in part may stay
        client.run_on_scheduler(_release_registered, out_keys, client.id)
        _drop_kept_on_live(client, list(work), out_keys)
        if isinstance(error, (KeyError, *_placement_errors())):
            # a worker that left after its reply (the scheduler's KeyError for its address): the graph
            return _declined(f"a worker left after keeping outputs of the held {kept.label} of {x.name} ({error!r})")
        raise  # anything else is a defect to see, not a placement to recompute around
    for k in out_keys:
        client.futures[k].finish(type=type(x._meta))
    return out


def reduced_chunks_persisted(x, plan, split_every: int, name: str, sources=None, located=None):
    """``plan``'s reduction of ``x`` whose reduced axes each lie in one chunk, now, as a persisted array
    named ``name``: each worker reduces the chunks it holds and keeps the output blocks (``ChunkReduced``;
    one ``client.run``, no task), registered with their lineage as a held scan's are. ``x`` persisted, or
    with ``sources`` (``held_sources``) an expression over persisted arrays whose chunks each worker makes
    from what it holds, one at a time. ``located`` (argmin/argmax): each chunk reduced as
    ``located(chunk, its offsets)``, the offsets travelling in the scan's place of a carry. None where the
    graph must run instead."""
    _attempting()
    client = placement.default_client()
    if client is None:
        return _declined("no distributed client")
    chunks = _reduced_chunks(x, plan)
    need = _on_gpus(x, "the held reduction's outputs", np.dtype(plan.out_dtype).itemsize, plan.axes)
    one = ChunkReduced(plan, split_every, type(x._meta).__module__.startswith("cupy"), located)
    offsets = chunk_offsets(x) if located is not None else {}

    def work_of(holder: dict) -> dict:
        work: dict[str, list] = {}
        for key in placement.chunk_keys(x):
            index = key[1:] if plan.keepdims else tuple(i for d, i in enumerate(key[1:]) if d not in plan.axes)
            work.setdefault(holder[key], []).append((key, (name, *index), offsets.get(key)))
        return work

    if sources is not None:  # the chunks made where what they read is: the recipes, planned again if moved
        for _, where, _ in placement.sources_placements(sources, client):
            if where is None:
                return _declined(f"some chunk of {x.name} reads chunks no one worker holds all of")
            recipes, where = _recipes_by_worker(sources, where)
            out = _keep_where_held(client, x, one, name, work_of(where), recipes, need, sources, chunks)
            if out is not None:
                return out
        return None
    seen = placement.recently_seen(x, client)
    # the placement seen last (an array of the same name persisted again may sit elsewhere), then looked up
    for holder in ([seen] if seen is not None else []) + [None]:
        holder = holder or placement.holders(x, client)
        if holder is None:
            return _declined(f"a chunk of {x.name} is in no worker's memory")
        out = _keep_where_held(client, x, one, name, work_of(holder), None, need, chunks=chunks)
        if out is not None:
            placement.remember(x, holder, client)
            return out
    return None


def _register_with_lineage(client, x, kept: _Kept, name: str, work: dict, sources=None, chunks=None):
    """The held outputs (registered with the scheduler as data, ``update_data``) as a persisted array
    whose chunks keep their recipe: each output key gets a task, ``_kept_block`` of its input chunk
    (a dependency: the held chunk, or with ``sources`` the held chunks its recipe reads) from its carry
    (a literal, a few bytes). ``client.persist`` of that graph gives the scheduler's tasks their run_spec
    and dependencies; keys already in memory are not run again (the scheduler only recommends released
    keys to run, and fills in the missing run_spec of a key it has as data). A worker lost later loses
    those chunks as it loses any computed task's: the scheduler makes them again from their inputs,
    which are recomputed first where they were lost too and have lineage of their own."""
    from dask._task_spec import Task, TaskRef

    made_by = None
    if sources is not None:  # a recipe per chunk, reading the held chunks only
        recipes, shared = sources.recipes([[k] for k in sources.keys])
        made_by = {r.chunks[0]: _reading_held_only(r, shared) for r in recipes}
    tasks = {}
    for per_worker in work.values():
        for in_key, out_key, carry in per_worker:
            if made_by is None:
                tasks[out_key] = Task(out_key, functools.partial(_kept_block, kept, carry), TaskRef(in_key))
            else:
                recipe = made_by[in_key]
                tasks[out_key] = Task(out_key, functools.partial(_kept_block_made, kept, carry, recipe),
                                      *map(TaskRef, recipe.inputs))
    chunks = x.chunks if chunks is None else chunks
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=kept.out_dtype)
    lineage = da.Array(HighLevelGraph.from_collections(name, tasks, dependencies=[]), name, chunks, meta=meta)
    return client.persist(lineage, optimize_graph=False)


class _GraphOnDemand:
    """A result whose task graph is built when something first asks for it (``.dask``): laying out the
    per-worker tasks is work the direct paths of ``.compute()`` / ``.persist()`` never need (a few ms
    on a GPU box, 2026-11-25). Placement is still read when the result is made (where the chunks were
    seen last, else one ``who_has``, ~1 ms): the name follows the grouping, as the graph's always did,
    so two results under one name never carry different tasks (Dask warns of that, and it happened when a worker died between two
    builds). First in the bases: the property shadows Dask's slot.

    Read by ``dask.compute`` / ``dask.persist`` / ``client.compute`` / ``client.persist`` to run it
    (``_asked_to_compute``), a result that has a direct path (``_value_graph``) is computed by it there and
    then, and its graph is its value under a name of its own (the task graph's name with ``-value``): one
    task per output block handing the value over (``_handed_over``). The value is kept for the next such
    read; any other read gets the task graph under the result's own name (``_name`` follows which graph
    was read last, as Dask reads the graph before the keys). A held call that fails or declines is not
    tried again for this result: the task graph runs and reports what it reports."""

    __slots__ = ()

    @property
    def dask(self):
        reader = _dask_reader()
        if reader is not None and reader.f_code.co_name == "is_dask_collection":
            return self._graph or _NOT_BUILT_YET  # only asked whether this is a collection
        together = _asked_to_compute(self, reader, siblings=self._handed is None)
        if together is not None and self._handed is None:
            try:
                self._handed = self._value_graph(together) or False
            except Exception:  # noqa: BLE001 - the task graph runs and reports it, in its future
                logger.debug("the held call of %s failed; the task graph runs", self._task_name, exc_info=True)
                self._handed = False
        if self._handed and together is not None:
            self._name = self._handed.name
            return self._handed.graph
        return self._task_graph()

    @dask.setter
    def dask(self, graph):
        self._graph = graph

    def _value_graph(self, together: list):
        return None

    def _task_graph(self):
        """The task graph, never the value (also what a ``.compute()`` the direct path declined runs)."""
        self._name = self._task_name
        if self._graph is None:
            self._graph = self._build_graph()
        return self._graph

    def _hand_over(self, value) -> "_Handed":
        name = f"{self._task_name}-value"
        return _Handed(name, _handed_over(name, self.chunks, value, type(self._meta).__module__.startswith("cupy")))


class _Handed:
    __slots__ = ("name", "graph")

    def __init__(self, name: str, graph):
        self.name, self.graph = name, graph


# ------------------------------------------------------------------------------------------------
# Held results computed where Dask asks for their graph
# ------------------------------------------------------------------------------------------------
# ``client.compute(mr.sum(x))`` of a persisted ``x`` ran a task per worker and an aggregate task: three
# scheduler round trips, 42-56 ms on 4 x H200 against 6-14 ms for the held call (2026-11-27). Dask reads
# a collection's graph on the client (``HLGExpr.from_collection``; ``collections_to_dsk`` before dask
# 2025) before it ships anything, so a held result computed at that moment costs the held call plus one
# task that hands the value over: 23 against 38 ms median, 13.5 ms held, on a 4-worker CPU cluster.
# Only when that read comes from a call that computes or persists (``_COMPUTING``) with no scheduler
# of its own named: ``dask.optimize``, ``visualize``, a ``Delayed`` made of the result, arithmetic and
# ``ChunkSources`` get the task graph.
_READERS = frozenset({"from_collection", "collections_to_dsk", "_extract_graph_and_keys", "is_dask_collection"})
_COMPUTING = {("dask.base", "compute"), ("dask.base", "persist"), ("distributed.client", "compute"),
              ("distributed.client", "persist"), ("distributed.client", "get")}
_NOT_BUILT_YET = HighLevelGraph({}, {})
# Above this many bytes, a result over some axes keeps its task graph: a value in the graph travels
# through the scheduler (pickled in the graph), where a task's result goes worker to client.
VALUE_GRAPH_BYTES = 8 << 20


def _is_dask(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == "dask" or module.startswith("dask.")


def _dask_reader():
    """The frame of the dask function reading a graph on demand (one of ``_READERS``, at most four frames
    above the ``dask`` property), or None."""
    import sys

    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        if frame.f_code.co_name in _READERS and _is_dask(frame):
            return frame
        frame = frame.f_back
    return None


def _asked_to_compute(result, reader, siblings: bool = True):
    """Whether ``result``'s graph is read (``reader``) by a call that computes or persists it now on the
    distributed client, with no scheduler of its own named and the held paths allowed here: the results
    read by that call (``result`` first, then the other collections of the call; only ``result`` where
    ``siblings`` is False), else None. Dask's own reading of a collection is not an API, so a reader not
    recognised costs the speed only: the task graph runs, as it always did."""
    if reader is None or reader.f_code.co_name == "is_dask_collection" \
            or not placement.setting("multireduce.held-values-in-graphs") or not placement.distributed_is_the_scheduler():
        return None
    if placement.default_client() is None:  # gone, or asynchronous (a coroutine's caller cannot wait here)
        return None
    together, collections, frame = [result], None, reader
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return None
        where = (frame.f_globals.get("__name__", ""), frame.f_code.co_name)
        if collections is None and where[1] in ("collections_to_expr", "collections_to_dsk"):
            collections = frame.f_locals.get("collections")
        if where in _COMPUTING:
            if where[0] == "dask.base" and (frame.f_locals.get("scheduler") is not None
                                             or frame.f_locals.get("get") is not None):
                return None  # a scheduler named for this call: the graph, as asked
            break
    else:
        return None
    if siblings and isinstance(collections, (list, tuple)):
        together += [c for c in collections if c is not result]
    return together


def _handed_over(name: str, chunks, value, on_device: bool) -> HighLevelGraph:
    """The graph of a computed result: one task per output block making that block (host memory in the
    graph, on the device of the worker that runs it where the result is a CuPy array)."""
    import itertools

    host = value.get() if type(value).__module__.startswith("cupy") else value
    starts = [np.cumsum((0,) + c) for c in chunks]
    tasks = {}
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        where = tuple(slice(s[i], s[i + 1]) for s, i in zip(starts, index))
        block = np.asarray(host)[where] if where else host
        tasks[(name, *index)] = (_device, on_device, block)
    return HighLevelGraph({name: MaterializedLayer(tasks)}, {name: set()})


def _graph_on_demand(cls, name: str, chunks, meta, direct: tuple):
    out = cls(HighLevelGraph({name: MaterializedLayer({})}, {name: set()}), name, chunks, meta=meta)
    out._direct = direct
    out._graph = None  # built on first use
    out._handed = None  # the value graph: None not tried, False declined or failed (``_GraphOnDemand``)
    out._task_name = name
    return out


class WholeOfHeld(_GraphOnDemand, _OneBlockOfHeld):
    """A whole reduction over a persisted array whose ``.compute()`` takes the direct path (one
    ``client.run``, each chunk's partial folded on the client in the graph's order: the same value
    and type as the graph's), and the graph when that path cannot (a chunk in no worker's memory, a
    worker gone, arguments to ``compute``, another scheduler). ``dask.compute``, ``client.compute`` and
    ``.persist`` make the same held call when they read the graph, and hand the value over in one task
    (``_GraphOnDemand``); anything else that reads the graph gets the task graph, built on demand."""

    __slots__ = ("_direct", "_graph", "_handed", "_task_name")

    def _build_graph(self):
        x, plan, split_every, token, build, _, groups, _ = self._direct
        if build is not None:
            return build(token, groups).dask
        return reduction(x, plan, split_every, groups, token=token).dask

    def compute(self, **kwargs):
        if not _not_direct_here(kwargs):
            x, plan, split_every, _, _, located, _, sources = self._direct
            value = reduce_held(x, plan, split_every, located, sources)
            if value is not None:
                return _device(type(self._meta).__module__.startswith("cupy"), value)
        self._task_graph()
        return super().compute(**kwargs)

    def _value_graph(self, together: list):
        """Every whole reduction of ``together`` over the same held chunks as this one (same fan-in and
        grouping, no ``build``/``located``) not computed yet, computed by one held call that reads each
        chunk once (a ``FusedPlan``, the same bits as each alone); each of them keeps its value graph, and
        this one's is returned. None where the held call declines: the task graph then."""
        x, plan, split_every, _, _, located, _, sources = self._direct
        # _same_reading admits no result with build or located: such a one is computed alone
        fused = [self] + [r for r in together[1:] if type(r) is WholeOfHeld and r._handed is None
                          and _same_reading(r._direct, self._direct)]
        fused = list({id(r): r for r in fused}.values())
        if len(fused) == 1:
            value = reduce_held(x, plan, split_every, located, sources)
            return None if value is None else self._hand_over(value)
        from .graph import FusedPlan

        values = reduce_held(x, FusedPlan([r._direct[1] for r in fused]), split_every, sources=sources)
        if values is None:
            return None
        for r, value in zip(fused[1:], values[1:]):
            r._handed = r._hand_over(value)
        return self._hand_over(values[0])


def _same_reading(a: tuple, b: tuple) -> bool:
    """Whether two held whole reductions (their ``_direct``) read the same chunks the same way: one
    ``FusedPlan`` serves both with each one's own bits."""
    (xa, _, split_a, _, build_a, located_a, groups_a, sources_a) = a
    (xb, _, split_b, _, build_b, located_b, groups_b, sources_b) = b
    return (xa.name == xb.name and split_a == split_b and build_a is build_b is located_a is located_b is None
            and getattr(groups_a, "__qualname__", groups_a) == getattr(groups_b, "__qualname__", groups_b)
            and (sources_a is None) == (sources_b is None))


class ScanOfHeld(_GraphOnDemand, _OfHeld):
    """A scan of a persisted array whose ``.persist()`` takes ``scan_persisted`` (two ``client.run``
    calls, no task) and the graph when that path cannot. ``client.persist``, ``dask.persist`` and
    ``.compute`` run the graph, built on demand."""

    __slots__ = ("_direct", "_graph", "_handed", "_task_name")

    def _build_graph(self):
        x, plan, split_every, token, groups, _ = self._direct
        return scan(x, plan, split_every, groups, token=token).dask

    def persist(self, **kwargs):
        if not _not_direct_here(kwargs):
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
    return bool(x.npartitions) and placement.setting("multireduce.placement") and placement.is_persisted(x) \
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
    groups = placement.scan_grouping(x, placement.grouping_for(x, commutative=True, sources=sources))
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
    if not x.npartitions or not placement.setting("multireduce.placement") or placement.default_client() is None:
        return None
    from .recipes import ChunkSources

    sources = ChunkSources.of(x)
    return sources if sources.held_only else None


async def _on_made_chunks(recipes: dict, need, dask_worker, work):
    """On a worker named in ``recipes`` (worker -> ``recipes.Recipe``): ``work(keys, chunks)`` in a thread
    (as ``values_of_held``), the chunks of this worker's recipe made from the chunks it holds one at a time
    as ``work`` consumes them. None where the recipe names no chunk here, ``_Moved`` where a held chunk it
    reads is no longer here, ``_Failed`` on an error. ``need``: see ``check_room``, done first."""
    recipe = recipes.get(dask_worker.address)
    if recipe is None:
        return None
    if any(k not in dask_worker.data for k in recipe.inputs):
        return _Moved()
    try:
        check_room(need, recipe.chunks, [dask_worker.data[k] for k in recipe.inputs], dask_worker.address)
        made = recipe.make({k: dask_worker.data[k] for k in recipe.inputs})  # runs in the thread, as consumed
        return await asyncio.to_thread(work, recipe.chunks, made)
    except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
        return _Failed(error, dask_worker.address)


async def values_of_recipes(per_chunk, recipes: dict, extra=None, folds=None, need=None, dask_worker=None):
    """Runs on the workers named in ``recipes``: ``per_chunk(chunk, *extra[key])`` of each chunk this worker
    makes (``_on_made_chunks``), on the GPU holding it, brought to the host together. ``folds``: (combine,
    {worker: groups of keys}) combined here (``values_here``)."""
    mine = (folds[0], folds[1].get(dask_worker.address, ())) if folds else None
    found = await _on_made_chunks(recipes, need, dask_worker, lambda keys, made: values_here(
        per_chunk, keys, made, frozenset(), extra or {}, mine))
    return _Packed({}) if found is None else found


async def totals_of_recipes(plan, recipes: dict, lane_of: dict, need=None, dask_worker=None):
    """Runs on the workers named in ``recipes``: each chunk this worker makes reduced by ``plan`` and added to
    its lane's total (``lane_of``: chunk key -> lane) in the order made, and the chunks' ``sum_bounds``
    merged. ``_Packed(({lane: Partial}, (top, grid)))``, host values. For plans whose partials may be summed
    in any order once the bounds allow (``core.ReductionPlan.sums_narrow_floats_in_float64``): the client
    checks the bounds of every worker's chunks together before it uses the totals."""
    found = await _on_made_chunks(recipes, need, dask_worker,
                                  lambda keys, made: _totals_here(plan, keys, made, lane_of))
    return _Packed(({}, (NO_TOP, NO_GRID))) if found is None else found


def _totals_here(plan, keys: list, blocks, lane_of: dict) -> _Packed:
    from .backends import backend_for, is_cupy_array
    from .recipes import one_at_a_time

    totals: dict = {}
    bounds: dict = {}  # per GPU (None: host memory), merged where they are: one copy to the host each

    def add(block, k):
        where = block.data.device_id if is_cupy_array(block) else None
        backend = backend_for(block)
        with on_device_of(block):
            # one read for both where the backend can (its partial is used only where every bound allows)
            both = getattr(backend, "sum_with_bounds", lambda *a: None)(block, plan, bounds.get(where))
            if both is not None:
                part, bounds[where] = both
            else:
                part = plan.partial(block)
                bounds[where] = backend.sum_bounds(block, bounds.get(where))
            lane = lane_of[k]
            totals[lane] = part if lane not in totals else plan.combine(totals[lane], part)

    one_at_a_time(blocks, add, keys)  # made one by one: none kept alive while the next is made
    lanes = list(totals)
    parts = [totals[lane] for lane in lanes]
    columns = _PartialColumns.of(lanes, parts)
    host = columns.expand() if columns is not None else dict(zip(lanes, to_host_together(parts)))
    merged = merge_bounds(b if type(b) is tuple else tuple(int(v) for v in b.get()) for b in bounds.values())
    return _Packed((host, merged))


def _recipes_by_worker(sources, where: dict):
    """({worker: Recipe} making every chunk of ``sources`` on the worker ``where`` names for it, the shared
    constants made on each worker that needs them; ``where``): ``where`` is chunk key -> the worker holding
    every held chunk it reads (``placement.sources_placements``)."""
    chunks: dict = {}
    for k in sources.keys:
        chunks.setdefault(where[k], []).append(k)
    recipes, shared = sources.recipes(list(chunks.values()))
    return {worker: _reading_held_only(recipe, shared) for worker, recipe in zip(chunks, recipes)}, where


def _reading_held_only(recipe, shared: dict):
    """``recipe`` with the constants it shares with other recipes (``shared``) made in it: it reads held
    chunks only."""
    from .recipes import Recipe

    if not shared or not any(k in shared for k in recipe.inputs):
        return recipe
    tasks = {**{k: shared[k] for k in recipe.inputs if k in shared}, **recipe.tasks}
    return Recipe(tasks, recipe.chunks, [k for k in recipe.inputs if k not in shared])


def recipe_values(sources, per_chunk, extra=None, fold_groups=None, need=None):
    """{chunk key: per_chunk(chunk)} for every chunk of ``sources`` (host values), each made and computed
    by the worker holding what it is made from, in one call; None where the graph must run instead.
    ``fold_groups`` (a combine function, groups of keys, and whether leading runs may be combined apart:
    ``graph.first_level_folds``): a group, or its leading run, whose chunks one worker makes comes back
    combined there, under its first key, its other keys absent. ``need``: see ``check_room``."""
    found = planned_recipe_values(sources, per_chunk, extra, fold_groups, need)
    return None if found is None else found[0]


def planned_recipe_values(sources, per_chunk, extra=None, fold_groups=None, need=None):
    """(recipe_values' values, the recipes that made them (``_recipes_by_worker``), {chunk key: worker}),
    or None (see ``_recipe_replies``)."""
    planned_folds = []

    def arguments(recipes, where):
        folds = None
        if fold_groups is not None:
            combine, groups, leading_runs = fold_groups
            local = first_level_folds(groups, where, leading_runs)
            folds = (combine, local) if local else None
        planned_folds.append(folds)
        return per_chunk, recipes, extra, folds, need

    found = _recipe_replies(sources, values_of_recipes, arguments)
    if found is None:
        return None
    replies, recipes, where = found
    folds = planned_folds[-1]
    values = {k: v for reply in replies.values() for k, v in reply.items()}
    folded = sum(len(g) - 1 for groups in (folds[1].values() if folds else ()) for g in groups)
    if len(values) + folded != len(sources.keys):
        return _declined(f"workers answered for {len(values) + folded} of the {len(sources.keys)} chunks of "
                         f"{sources.name}")
    return values, recipes, where


def _recipe_replies(sources, fn, arguments):
    """({worker: reply}, recipes, {chunk key: worker}) of ``fn(*arguments(recipes, where))`` run on every
    worker making chunks of ``sources`` (``_recipes_by_worker``), or None where the graph must run. The
    recipes are planned from where the chunks were seen last, and again from a lookup where a chunk they
    read is not there (a replica the Active Memory Manager dropped, a placement gone stale) or a worker
    of that placement left (``placement.sources_placements``)."""
    client = placement.default_client()
    for found, where, fresh in placement.sources_placements(sources, client):
        if where is None:
            return _declined(f"some chunk of {sources.name} reads chunks no one worker holds all of")
        recipes, where = _recipes_by_worker(sources, where)
        try:
            replies = _run(client, sorted(recipes), fn, *arguments(recipes, where))
        except _Unanswered as error:
            raise _stalled({w: len(recipes[w].chunks) for w in error.workers}, len(sources.keys), sources.name,
                           placement.setting("multireduce.direct-connect-timeout")) from None
        if replies is None and fresh:
            return _declined(f"a worker holding chunks of {sources.name} left")
        if replies is None or any(isinstance(r, _Moved) for r in replies.values()):
            continue
        if not fresh:
            placement.remember_chunks(found, client)  # still where it was: kept for the next call
        return replies, recipes, where
    return _declined(f"the chunks that the chunks of {sources.name} are made from moved twice while looked up")


def _summed_in_any_order(x, plan, sources, lanes: list, need):
    """{lane index: the lane's totals, one per worker making its chunks} where the sums are exact in any
    order (``dtypes.exact_in_any_order`` over the bounds of every chunk), so that combining them gives the
    bits of the chunk-ordered tree; ``_NOT_EXACT`` where the bounds do not allow it, None where the graph
    must run. One call: each worker sums its chunks of each lane on its GPU, one total per lane crosses."""
    lane_of = {k: i for i, (_, keys) in enumerate(lanes) for k in keys}
    found = _recipe_replies(sources, totals_of_recipes, lambda recipes, where: (plan, recipes, lane_of, need))
    if found is None:
        return None
    totals: dict = {}
    bounds = []
    for worker in sorted(found[0]):
        parts, worker_bounds = found[0][worker]
        bounds.append(worker_bounds)
        for lane, part in parts.items():
            totals.setdefault(lane, []).append(part)
    count = math.prod(x.shape[a] for a in plan.axes)
    if len(totals) != len(lanes) or any(sum(p.count for p in parts) != count for parts in totals.values()):
        return _declined(f"workers' totals of {sources.name} do not cover every chunk")
    return totals if exact_in_any_order(count, *merge_bounds(bounds)) else _NOT_EXACT


_NOT_EXACT = object()


def reduce_held(x, plan, split_every: int, located=None, sources=None):
    """``plan``'s reduction of ``x`` now, from the workers holding what its chunks are made from (see
    ``reduce_persisted``), over all of its axes or some: each chunk's partial comes back and the client
    folds every lane's partials in chunk order with the graph's tree, then lays the lanes' results out
    as the graph's output blocks (the same bits). None where the graph must run instead."""
    _attempting()
    whole = len(plan.axes) == x.ndim
    if sources is None:
        if whole:
            return reduce_persisted(x, plan, split_every, located)
        sources = held_sources(x)
        if sources is None:
            return None
    lanes = [(kept, [(x.name, *i) for i in index]) for kept, index in _lanes(x, plan.axes)]
    on_device = type(x._meta).__module__.startswith("cupy")
    # each chunk's partial, and all of them stacked for one copy to the host (``_PartialColumns``)
    need = None if whole else _on_gpus(x, "the held reduction's partials",
                                       2 * max(np.dtype(plan.out_dtype).itemsize, 4), plan.axes)
    if not whole and located is None and _sums_in_any_order(x, plan):
        totals = _summed_in_any_order(x, plan, sources, lanes, need)
        if totals is None:
            return None
        if totals is not _NOT_EXACT:
            blocks = {}
            for i, (kept, keys) in enumerate(lanes):
                parts = [_to_device_again(p) for p in totals[i]] if on_device else totals[i]
                blocks[tuple(keys[0][1:]) if plan.keepdims else tuple(kept)] = _device(on_device, plan.aggregate(*parts))
            return _laid_out(blocks)
        if not _partials_fit(x, plan):
            return _declined("a sum over some axes not exact in any order whose partials would exceed "
                             "DIRECT_PARTIAL_BYTES: the graph")
    # the first level of each lane's tree: a group of chunks one worker makes is combined there
    groups = [g for _, keys in lanes for g in first_level(split_every, keys)]
    per_chunk = getattr(plan, "partial_where_held", plan.partial) if located is None else \
        functools.partial(_partial_of_located, plan, located)
    values = recipe_values(sources, per_chunk, chunk_offsets(x) if located is not None else None,
                           fold_groups=(plan.combine, groups, leading_runs_fold(plan, split_every)), need=need)
    if values is None:
        return None
    if on_device and not whole:  # partials that ``stays_on_device`` are folded on the GPU here too
        values = {k: _to_device_again(v) for k, v in values.items()}
    blocks = {}
    for kept, keys in lanes:
        # a first-level group combined where its chunks were comes under its first key alone (None at the
        # others): fold_in_order takes it as it is, and combines every other group here
        value = fold_in_order(plan, split_every, [values.get(k) for k in keys])
        if whole:
            return value
        blocks[tuple(keys[0][1:]) if plan.keepdims else tuple(kept)] = _device(on_device, value)
    return _laid_out(blocks)


def _to_device_again(value):
    """A partial that ``stays_on_device`` on the workers, back on this process's GPU after crossing to it
    as host memory."""
    from .core import Partial

    if type(value) is Partial and type(value.value) is np.ndarray and value.value.size > 1:
        import cupy

        return Partial(cupy.asarray(value.value), value.count)
    return value


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
    ``client.compute`` and ``.persist`` make the same call and hand the value over in a task per output
    block, up to ``VALUE_GRAPH_BYTES`` of output; beyond that, and for anything else, the task graph.
    Over a persisted array whose reduced axes each lie in one chunk, ``.persist()`` keeps each chunk's
    output block where the chunk is (``reduced_chunks_persisted``), whatever the output's size; where the
    per-chunk partials would not fit the client (``fits`` False), ``.compute()`` takes the graph."""

    __slots__ = ("_direct", "_graph", "_handed", "_task_name")

    def _build_graph(self):
        x, plan, split_every, token, groups, _, _, build, _ = self._direct
        if build is not None:
            return build(token, groups).dask
        return reduction(x, plan, split_every, groups, token=token).dask

    def compute(self, **kwargs):
        x, plan, split_every, _, _, sources, fits, _, _ = self._direct
        if fits and not _not_direct_here(kwargs):
            value = reduce_held(x, plan, split_every, sources=sources)
            if value is not None:
                return value
        self._task_graph()
        return super().compute(**kwargs)

    def persist(self, **kwargs):
        x, plan, split_every, _, _, sources, _, _, located = self._direct
        if _chunks_hold_reduced_axes(x, plan) and not _not_direct_here(kwargs):
            # a fresh name for every call, as a held scan's (ScanOfHeld.persist says why)
            out = reduced_chunks_persisted(x, plan, split_every, f"{plan.label}-chunks-{uuid.uuid4().hex}",
                                           None if is_held(x) else sources, located)
            if out is not None:
                return out
        return super().persist(**kwargs)

    def _value_graph(self, together: list):
        x, plan, split_every, _, _, sources, fits, _, _ = self._direct
        if not fits or math.prod(self.shape) * np.dtype(self.dtype).itemsize > VALUE_GRAPH_BYTES:
            return None
        value = reduce_held(x, plan, split_every, sources=sources)
        return None if value is None else self._hand_over(value)


def _reduced_chunks(x, plan) -> tuple:
    """The chunks of ``plan``'s reduction of ``x`` over some axes: one per chunk of the kept axes, the
    reduced axes gone (or of length 1 with ``keepdims``)."""
    return (tuple((1,) if d in plan.axes else x.chunks[d] for d in range(x.ndim)) if plan.keepdims
            else tuple(x.chunks[d] for d in range(x.ndim) if d not in plan.axes))


def _chunks_hold_reduced_axes(x, plan) -> bool:
    """Whether each chunk of ``x`` (persisted, or an expression over persisted arrays: ``held_result``
    asked) holds every reduced axis whole: its output blocks are then each chunk's own
    (``reduced_chunks_persisted``)."""
    return all(x.numblocks[d] == 1 for d in plan.axes)


# Above this many bytes of per-chunk partials, a reduction over some axes of held chunks takes the graph:
# the partials of a lane's chunks must meet in chunk order, and through the client they cross the network
# and pickle once more than through a worker. The mean over time of a 721 x 1440 field in 53 chunks
# (212 MB of partials) took 555-760 ms direct and 309-328 ms through the graph (4 x H200, 2026-11-26).
DIRECT_PARTIAL_BYTES = 64 << 20


def _partials_fit(x, plan) -> bool:
    per_lane = math.prod(x.numblocks[d] for d in plan.axes)
    out = math.prod(x.shape[d] for d in range(x.ndim) if d not in plan.axes)
    return per_lane * out * max(np.dtype(plan.out_dtype).itemsize, 4) <= DIRECT_PARTIAL_BYTES


def _sums_in_any_order(x, plan) -> bool:
    """Whether ``plan``'s partials of ``x`` are float64 sums of float16/float32 values, which the direct path
    sums in any order where their bounds make them exact (``_summed_in_any_order``), and ``x``'s chunks
    live where a bounds pass costs less than the transfers it saves (the backend's ``SUMS_IN_ANY_ORDER``)."""
    from .backends import backend_for

    out = math.prod(x.shape[d] for d in range(x.ndim) if d not in plan.axes)
    largest_chunk = math.prod(max(c, default=0) for c in x.chunks)
    return bool(getattr(plan, "sums_narrow_floats_in_float64", lambda dtype: False)(x.dtype)
                and getattr(backend_for(x._meta), "SUMS_IN_ANY_ORDER", False)
                and out * ANY_ORDER_CHUNK_PER_OUTPUT >= largest_chunk)


#: The sums in any order cost one more read of every chunk (its bounds) to spare moving a partial per chunk:
#: worth it where a chunk holds at most this many elements per output element (a read at ~4 TB/s against
#: a transfer at ~1 GB/s over TCP, docs/performance.md). The time mean of a 721 x 1440 field has 166 per
#: output; a column sum of a tall 32-column matrix in chunks of 2^21 rows has 2^21, and keeps the ordered
#: fold of its small partials.
ANY_ORDER_CHUNK_PER_OUTPUT = 4096


def _totals_fit(x, plan) -> bool:
    """Whether one total per lane and worker (what crosses where the sums are exact in any order) stays
    within DIRECT_PARTIAL_BYTES."""
    if not _sums_in_any_order(x, plan):
        return False
    workers = placement.worker_count(placement.default_client()) or 1
    per_lane = min(math.prod(x.numblocks[d] for d in plan.axes), workers)
    out = math.prod(x.shape[d] for d in range(x.ndim) if d not in plan.axes)
    return per_lane * out * np.dtype(np.float64).itemsize <= DIRECT_PARTIAL_BYTES


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
    # located chunks (argmin/argmax): only a persist whose chunks each hold the reduced axes is direct
    fits = located is None and build is None and (_partials_fit(x, plan) or _totals_fit(x, plan))
    if (build is None) != (located is None) or not (fits or _chunks_hold_reduced_axes(x, plan)):
        _attempting()
        return _declined("a reduction over some axes whose partials would exceed DIRECT_PARTIAL_BYTES (or that "
                         "reads located chunks): the graph")
    chunks = _reduced_chunks(x, plan)
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=plan.out_dtype)
    name = f"{plan.label}-aggregate-{token}"
    return _graph_on_demand(PartOfHeld, name, chunks, meta,
                            (x, plan, split_every, token, groups, sources, fits, build, located))
