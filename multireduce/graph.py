"""The Dask graph: reductions as grouped partials plus a tree, scans as totals -> carries -> scans.

Both builders take ``groups``, a function that splits the ordered list of input chunk keys feeding one
output (a reduction's output block, or a scan's lane) into ordered groups; one task reduces a whole
group. The default makes contiguous runs of ``split_every`` chunks; the multi-GPU layer groups by the
worker that holds each chunk, so the task count follows the number of groups, not of chunks. Groups
must keep order (concatenated, they give the input order back) for non-commutative operators.
"""

from __future__ import annotations

import itertools
from typing import Callable, Hashable, Sequence

import dask.array as da
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .core import ReductionPlan, ScanPlan

Key = tuple
Grouping = Callable[[Sequence[Hashable]], list[list[Hashable]]]


def contiguous_groups(size: int) -> Grouping:
    """Split keys into consecutive runs of ``size``."""

    def split(keys):
        return [list(keys[i : i + size]) for i in range(0, len(keys), size)]

    split.__qualname__ = f"contiguous_groups({size})"
    return split


def _check_groups(keys, grouped) -> None:
    flat = [k for g in grouped for k in g]
    if flat != list(keys) or any(len(g) == 0 for g in grouped):
        raise ValueError(
            "groups: expected non-empty groups that list every input chunk once, in order; "
            f"got {len(grouped)} groups covering {len(flat)} of {len(keys)} chunks"
        )


def _block_index(ndim: int, fixed: dict[int, int]) -> tuple[int, ...]:
    return tuple(fixed.get(d, 0) for d in range(ndim))


def reduction(x: da.Array, plan: ReductionPlan, split_every: int, groups: Grouping | None = None) -> da.Array:
    """A lazy reduction of ``x`` over ``plan.axes``: one ``partial`` task per group, a ``combine`` tree of
    fan-in ``split_every`` over the group partials, one ``finalize`` task per output block."""
    groups = groups or contiguous_groups(split_every)
    token = tokenize(x, plan, split_every, getattr(groups, "__qualname__", groups))
    label = plan.label
    name = f"{label}-aggregate-{token}"
    axes, ndim = plan.axes, x.ndim
    kept = [d for d in range(ndim) if d not in axes]

    dsk: dict = {}
    for kept_index in itertools.product(*(range(x.numblocks[d]) for d in kept)):
        fixed = dict(zip(kept, kept_index))
        keys = [
            (x.name, *_block_index(ndim, {**fixed, **dict(zip(axes, reduced_index))}))
            for reduced_index in itertools.product(*(range(x.numblocks[d]) for d in axes))
        ]
        grouped = groups(keys)
        _check_groups(keys, grouped)
        level = []
        for g, group in enumerate(grouped):
            key = (f"{label}-partial-{token}", *kept_index, g)
            dsk[key] = (plan.partial, *group)
            level.append(key)
        depth = 0
        while len(level) > 1:
            nxt = []
            for j in range(0, len(level), split_every):
                key = (f"{label}-combine-{token}", depth, *kept_index, j // split_every)
                dsk[key] = (plan.combine, *level[j : j + split_every])
                nxt.append(key)
            level, depth = nxt, depth + 1
        out_index = _block_index(ndim, fixed) if plan.keepdims else kept_index
        dsk[(name, *out_index)] = (plan.finalize, level[0])

    if plan.keepdims:
        chunks = tuple((1,) if d in axes else x.chunks[d] for d in range(ndim))
    else:
        chunks = tuple(x.chunks[d] for d in kept)
    meta = meta_from_array(x._meta, ndim=len(chunks), dtype=plan.out_dtype)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[x])
    return da.Array(graph, name, chunks, meta=meta)


def scan(x: da.Array, plan: ScanPlan, split_every: int, groups: Grouping | None = None) -> da.Array:
    """A lazy scan of ``x`` along ``plan.axis`` with the same chunks as ``x``.

    Per lane (the chunks that share their position on the other axes): ``totals`` tasks, one per group
    of chunks 0..n-2; one ``carries`` task scanning those totals; one ``scan`` task per chunk, seeded
    with its carry. Depth 3 whatever the number of chunks, no rechunking, each input read twice and each
    output written once.
    """
    groups = groups or contiguous_groups(split_every)
    token = tokenize(x, plan, split_every, getattr(groups, "__qualname__", groups))
    label = plan.label
    name = f"{label}-{token}"
    axis, ndim = plan.axis, x.ndim
    others = [d for d in range(ndim) if d != axis]
    n = x.numblocks[axis]

    dsk: dict = {}
    for lane in itertools.product(*(range(x.numblocks[d]) for d in others)):
        fixed = dict(zip(others, lane))
        index = [_block_index(ndim, {**fixed, axis: i}) for i in range(n)]
        if n == 1:
            dsk[(name, *index[0])] = (plan.scan_block, (x.name, *index[0]))
            continue
        keys = [(x.name, *idx) for idx in index[:-1]]
        grouped = groups(keys)
        _check_groups(keys, grouped)
        total_keys = []
        for g, group in enumerate(grouped):
            key = (f"{label}-totals-{token}", *lane, g)
            dsk[key] = (plan.totals, *group)
            total_keys.append(key)
        carries_key = (f"{label}-carries-{token}", *lane)
        dsk[carries_key] = (plan.carries, *total_keys)
        for i, idx in enumerate(index):
            dsk[(name, *idx)] = (plan.scan_block, (x.name, *idx), carries_key, i)

    meta = meta_from_array(x._meta, ndim=ndim, dtype=plan.out_dtype)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[x])
    return da.Array(graph, name, x.chunks, meta=meta)


def graph_depth(array: da.Array) -> int:
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


def task_count(array: da.Array, prefix: str) -> int:
    """How many tasks of ``array``'s graph have keys whose name starts with ``prefix``."""
    return sum(1 for k in array.__dask_graph__() if (k[0] if isinstance(k, tuple) else k).startswith(prefix))


__all__ = ["reduction", "scan", "contiguous_groups", "graph_depth", "task_count"]
