"""The Dask graph: reductions as grouped partials plus a tree, scans as totals -> carries -> scans.

Both builders take ``groups``, a function that splits the ordered list of input chunk keys feeding one
output (a reduction's output block, or a scan's lane) into ordered groups; one task reduces a whole
group. The default gives each chunk its own group, so a lazy input streams: no task holds more than
one input chunk (as in ``dask.array``'s own reductions), and the partials, a few bytes each, meet in
a tree of fan-in ``split_every``. The multi-GPU layer groups a persisted array's chunks by the worker
that holds them (``placement``), so the task count follows the number of workers, not of chunks:
that is only for data already in memory. Groups must keep order (concatenated, they give the input
order back) for non-commutative operators.

Contract (other plan classes are written against it): ``reduction(x, plan, split_every, groups)``
takes any plan with ``partial(*blocks)``, ``combine(*partials)``, ``aggregate(*partials)``,
``whole(*blocks)`` and the attributes ``axes``, ``keepdims``, ``out_dtype``, ``label`` and
``op.commutative``.
"""

from __future__ import annotations

import itertools
from typing import Callable, Hashable, Sequence

import dask.array as da
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from .core import ReductionPlan, ScanPlan

Key = tuple
FOLD_TOTALS_UP_TO = 32  # up to this many totals groups per lane, scan tasks fold them (no carries stage)
Grouping = Callable[[Sequence[Hashable]], list[list[Hashable]]]


def contiguous_groups(size: int) -> Grouping:
    """Split keys into consecutive runs of ``size``."""

    def split(keys):
        return [list(keys[i : i + size]) for i in range(0, len(keys), size)]

    split.__qualname__ = f"contiguous_groups({size})"
    return split


def _check_groups(keys, grouped, ordered: bool) -> None:
    """Every key once, in non-empty groups; ``ordered``: concatenated, the groups give ``keys`` back."""
    flat = [k for g in grouped for k in g]
    same = flat == list(keys) if ordered else sorted(map(str, flat)) == sorted(map(str, keys))
    if not same or any(len(g) == 0 for g in grouped):
        order = ", in order" if ordered else ""
        raise ValueError(
            f"groups: expected non-empty groups that list every input chunk once{order}; "
            f"got {len(grouped)} groups covering {len(flat)} of {len(keys)} chunks"
        )


def _block_index(ndim: int, fixed: dict[int, int]) -> tuple[int, ...]:
    return tuple(fixed.get(d, 0) for d in range(ndim))


def _array(x: da.Array, stages: list[tuple[str, dict, dict | None]], chunks, dtype) -> da.Array:
    """A dask array from ``stages`` (layer name, tasks), each depending on ``x`` and the stages before
    it; the last stage is the array's own layer. No ``workers`` annotations: Dask's graph optimisation
    drops them (dask 2026.7), and data locality already runs a group's task where its chunks are."""
    base = x.__dask_graph__()
    layers, deps = dict(base.layers), dict(base.dependencies)
    before = set(x.__dask_layers__())
    for name, tasks in stages:
        layers[name] = MaterializedLayer(tasks)
        deps[name] = set(before)
        before.add(name)
    name = stages[-1][0]
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=dtype)
    return da.Array(HighLevelGraph(layers, deps), name, chunks, meta=meta)


def reduction(x: da.Array, plan: ReductionPlan, split_every: int, groups: Grouping | None = None) -> da.Array:
    """A lazy reduction of ``x`` over ``plan.axes``: one ``partial`` task per group, a ``combine`` tree of
    fan-in ``split_every`` over the group partials, one ``aggregate`` task per output block that combines
    the last level and finalizes (every stage costs a scheduler round trip, milliseconds on a cluster).

    Groups of chunks held by one worker (``placement``) run there by data locality."""
    groups = groups or contiguous_groups(1)
    token = tokenize(x, plan, split_every, getattr(groups, "__qualname__", groups))
    label = plan.label
    partial_name, combine_name, name = (f"{label}-{stage}-{token}" for stage in ("partial", "combine", "aggregate"))
    axes, ndim = plan.axes, x.ndim
    kept = [d for d in range(ndim) if d not in axes]
    on_device = type(x._meta).__module__.startswith("cupy")  # the result's chunk type follows the input's

    partials: dict = {}
    combines: dict = {}
    finals: dict = {}
    for kept_index in itertools.product(*(range(x.numblocks[d]) for d in kept)):
        fixed = dict(zip(kept, kept_index))
        keys = [
            (x.name, *_block_index(ndim, {**fixed, **dict(zip(axes, reduced_index))}))
            for reduced_index in itertools.product(*(range(x.numblocks[d]) for d in axes))
        ]
        grouped = groups(keys)
        _check_groups(keys, grouped, ordered=False)  # every chunk's partial is put back in chunk order
        position = {k: i for i, k in enumerate(keys)}
        out_index = _block_index(ndim, fixed) if plan.keepdims else kept_index
        if len(keys) == 1:  # one chunk: reduce and finalize in one task
            finals[(name, *out_index)] = (plan.whole, *keys)
            continue
        if any(len(group) > 1 for group in grouped):
            # groups of chunks held by one worker: each task returns its chunks' own partials (host
            # values, a few bytes each) and one task folds them in chunk order with the tree every path
            # uses, so the bits do not depend on the placement
            layout = tuple(tuple(position[k] for k in group) for group in grouped)
            if len(grouped) == 1:
                finals[(name, *out_index)] = (_whole_in_order, plan, on_device, split_every, *grouped[0])
                continue
            level = []
            for g, group in enumerate(grouped):
                key = (partial_name, *kept_index, g)
                partials[key] = (_chunk_partials, plan, *group)
                level.append(key)
            finals[(name, *out_index)] = (_aggregate_layout, plan, on_device, split_every, layout, *level)
            continue
        grouped = sorted(grouped, key=lambda group: position[group[0]])  # one chunk each: the tree's order
        level = []
        for g, group in enumerate(grouped):
            key = (partial_name, *kept_index, g)
            partials[key] = (_host_partial, plan, *group)
            level.append(key)
        depth = 0
        while len(level) > split_every:  # the last level is folded into the aggregate task
            nxt = []
            for j in range(0, len(level), split_every):
                key = (combine_name, depth, *kept_index, j // split_every)
                combines[key] = (plan.combine, *level[j : j + split_every])
                nxt.append(key)
            level, depth = nxt, depth + 1
        finals[(name, *out_index)] = (_aggregate_on, plan, on_device, *level)

    if plan.keepdims:
        chunks = tuple((1,) if d in axes else x.chunks[d] for d in range(ndim))
    else:
        chunks = tuple(x.chunks[d] for d in kept)
    stages = [(partial_name, partials)] if partials else []
    if combines:
        stages.append((combine_name, combines))
    stages.append((name, finals))
    return _array(x, stages, chunks, plan.out_dtype)


def scan(x: da.Array, plan: ScanPlan, split_every: int, groups: Grouping | None = None) -> da.Array:
    """A lazy scan of ``x`` along ``plan.axis`` with the same chunks as ``x``.

    Per lane (the chunks that share their position on the other axes): ``totals`` tasks, one per group
    of chunks 0..n-2; one ``carries`` task scanning those totals; one ``scan`` task per chunk, seeded
    with its carry. With at most ``FOLD_TOTALS_UP_TO`` groups the scan tasks fold the totals themselves
    and there is no carries task. Depth 3 whatever the number of chunks, no rechunking, each input read twice and each
    output written once. Totals and scan tasks run by data locality where their chunks are, so every
    output chunk is made where its input lives.
    """
    groups = groups or contiguous_groups(1)
    token = tokenize(x, plan, split_every, getattr(groups, "__qualname__", groups))
    label = plan.label
    totals_name, carries_name, name = f"{label}-totals-{token}", f"{label}-carries-{token}", f"{label}-{token}"
    axis, ndim = plan.axis, x.ndim
    others = [d for d in range(ndim) if d != axis]
    n = x.numblocks[axis]

    totals: dict = {}
    carries: dict = {}
    scans: dict = {}
    for lane in itertools.product(*(range(x.numblocks[d]) for d in others)):
        fixed = dict(zip(others, lane))
        index = [_block_index(ndim, {**fixed, axis: i}) for i in range(n)]
        if n == 1:
            scans[(name, *index[0])] = (plan.scan_block, (x.name, *index[0]))
            continue
        keys = [(x.name, *idx) for idx in index[:-1]]
        grouped = groups(keys)
        _check_groups(keys, grouped, ordered=False)  # the layout below puts every chunk's total in place
        position = {k: i for i, k in enumerate(keys)}
        layout = [tuple(position[k] for k in group) for group in grouped]
        total_keys = []
        for g, group in enumerate(grouped):
            key = (totals_name, *lane, g)
            totals[key] = (_host_totals, plan, *group)
            total_keys.append(key)
        if len(total_keys) <= FOLD_TOTALS_UP_TO:
            # few groups (one per GPU, say): every scan task folds the totals itself, a stage less.
            # It waits only for the groups holding chunks before its own, so chunk 0 is scanned at once
            # and a lazy input's chunks are released as they are scanned
            for i, idx in enumerate(index):
                used = [g for g, pos in enumerate(layout) if min(pos) < i]
                scans[(name, *idx)] = (_scan_from_totals, plan, (x.name, *idx), i, tuple(layout[g] for g in used),
                                       *(total_keys[g] for g in used))
            continue
        carries_key = (carries_name, *lane)
        carries[carries_key] = (_carries_in_order, plan, tuple(layout), *total_keys)
        for i, idx in enumerate(index):
            scans[(name, *idx)] = (_scan_seeded, plan, (x.name, *idx), carries_key, i)

    stages = []
    if totals:
        stages.append((totals_name, totals))
    if carries:
        stages.append((carries_name, carries))
    stages.append((name, scans))
    return _array(x, stages, x.chunks, plan.out_dtype)


def _host(value):
    """Small results (partials, totals, carries) cross workers as host memory: a 0-d or per-chunk
    device array would go through CUDA serialization and a device copy on the receiving GPU."""
    if type(value).__module__.startswith("cupy"):
        return value.get()
    return value


def _like(block, value):
    """``value`` (host) in the memory ``block`` lives in."""
    if type(block).__module__.startswith("cupy") and not type(value).__module__.startswith("cupy"):
        import cupy

        return cupy.asarray(value)
    return value


def _host_partial(plan, *blocks):
    """A group's partial with its value on the host: the combine tree and the aggregate then move a few
    bytes between workers and run on the host (every operator has a CPU implementation)."""
    import dataclasses

    partial = plan.partial(*blocks)
    value = getattr(partial, "value", None)  # other plans' partials (exact states, ...) are host data already
    if value is None or not type(value).__module__.startswith("cupy"):
        return partial
    return dataclasses.replace(partial, value=_host(value))


def fold_in_order(plan, split_every: int, partials):
    """Per-chunk partials, in chunk order, through the tree the lazy graph builds (contiguous combines of
    ``split_every`` while more remain, then the aggregate): one shape for a given chunk count, so the
    graph, the eager path and every placement give the same bits."""
    level = list(partials)
    while len(level) > split_every:
        level = [plan.combine(*level[j : j + split_every]) for j in range(0, len(level), split_every)]
    return plan.aggregate(*level)


def _chunk_partials(plan, *blocks):
    """Each chunk's own partial (host values), in the group's order."""
    return [_host_partial(plan, b) for b in blocks]


def _device(on_device: bool, value):
    if on_device and not type(value).__module__.startswith("cupy"):
        import cupy

        return cupy.asarray(value)
    return value


def _whole_in_order(plan, on_device: bool, split_every: int, *blocks):
    return _device(on_device, fold_in_order(plan, split_every, _chunk_partials(plan, *blocks)))


def _aggregate_layout(plan, on_device: bool, split_every: int, layout, *groups):
    by_position = {pos: p for positions, group in zip(layout, groups) for pos, p in zip(positions, group)}
    ordered = [by_position[i] for i in range(len(by_position))]
    return _device(on_device, fold_in_order(plan, split_every, ordered))


def _aggregate_on(plan, on_device: bool, *partials):
    return _device(on_device, plan.aggregate(*partials))


def _host_totals(plan: ScanPlan, *blocks):
    """A group's per-chunk totals (one entry per chunk, in the group's order), on the host."""
    return _host(plan.totals(*blocks))


def _carries_in_order(plan: ScanPlan, layout, *totals):
    """The carries of chunks 0..k in chunk order, from per-group totals whose chunk positions are
    ``layout`` (a worker's chunks need not be contiguous: with round-robin placement they never are).
    Every chunk keeps its own total, so the fold is in chunk order even for non-commutative operators."""
    axis = plan.axis
    by_position = {}
    for positions, total in zip(layout, totals):
        for offset, pos in enumerate(positions):
            by_position[pos] = total[(slice(None),) * axis + (slice(offset, offset + 1),)]
    prefix = itertools.takewhile(lambda p: p in by_position, itertools.count())  # chunks 0..k all present
    return plan.carries(*(by_position[p] for p in prefix))


def _scan_seeded(plan: ScanPlan, block, carries, index: int):
    return plan.scan_block(block, _like(block, carries) if index > 0 else None, index)


def _scan_from_totals(plan: ScanPlan, block, index: int, layout, *totals):
    """Scan chunk ``index`` seeded from the totals of the groups holding chunks before it."""
    if index == 0:
        return plan.scan_block(block, None, 0)
    carries = _carries_in_order(plan, layout, *totals)
    return plan.scan_block(block, _like(block, carries), index)


__all__ = ["reduction", "scan", "contiguous_groups", "fold_in_order"]
