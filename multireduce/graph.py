"""The Dask graph: reductions as grouped partials plus a tree, scans as totals -> carries -> scans.

Both builders take ``groups``, a function that splits the ordered list of input chunk keys feeding one
output (a reduction's output block, or a scan's lane) into ordered groups; one task reduces a whole
group. The default gives each chunk its own group, so a lazy input streams: no task holds more than
one input chunk (as in ``dask.array``'s own reductions), and the partials, a few bytes each, meet in
a tree of fan-in ``split_every``. The multi-GPU layer groups a persisted array's chunks by the worker
that holds them (``placement``), so the task count follows the number of workers, not of chunks:
that is only for data already in memory. Groups need not be runs of consecutive chunks: a grouped
task returns each chunk's own partial or total and the graph puts them back in chunk order (the
``layout``), so non-commutative operators keep their order under any placement.

One builder (``_grouped_stages``) walks the lanes, groups and checks the chunks and collects the tasks
that ``reduction`` and ``scan`` emit into one layer (``HighLevelGraph.from_collections``). Over chunks
held in memory, tasks that read one worker's chunks ask for that worker and Dask's optimisation is cut
to the cull; a one-block result skips Dask's finalize task (``_RESULT_TYPES``).

Contract (other plan classes are written against it): ``reduction(x, plan, split_every, groups)``
takes any plan with ``partial(*blocks)``, ``combine(*partials)``, ``aggregate(*partials)``,
``whole(*blocks)`` and the attributes ``axes``, ``keepdims``, ``out_dtype``, ``label`` and
``op.commutative``.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Hashable, Sequence

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from dask.sizeof import sizeof

from .core import Partial, ReductionPlan, ScanPlan

Key = tuple
FOLD_TOTALS_UP_TO = 32  # up to this many totals groups per lane, scan tasks fold them (no carries stage)
Grouping = Callable[[Sequence[Hashable]], list[list[Hashable]]]


def contiguous_groups(size: int) -> Grouping:
    """Split keys into consecutive runs of ``size``."""

    def split(keys):
        return [list(keys[i : i + size]) for i in range(0, len(keys), size)]

    split.__qualname__ = f"contiguous_groups({size})"
    return split


def even_groups(count: int) -> Grouping:
    """Split keys into ``count`` consecutive runs (fewer if there are fewer keys) whose sizes differ by one
    at most."""

    def split(keys):
        n = min(count, len(keys))
        bounds = [len(keys) * i // n for i in range(n + 1)] if n else [0]
        return [list(keys[a:b]) for a, b in zip(bounds, bounds[1:])]

    split.__qualname__ = f"even_groups({count})"
    split.count = count
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


def _lanes(x: da.Array, along: Sequence[int]):
    """(lane, block indices): for every combination of block indices off the axes ``along``, the index
    of each chunk of that lane, in C order over ``along``."""
    others = [d for d in range(x.ndim) if d not in along]
    for lane in itertools.product(*(range(x.numblocks[d]) for d in others)):
        fixed = dict(zip(others, lane))
        index = []
        for inner in itertools.product(*(range(x.numblocks[d]) for d in along)):
            at = {**fixed, **dict(zip(along, inner))}
            index.append(tuple(at.get(d, 0) for d in range(x.ndim)))
        yield lane, index


def stage_token(x: da.Array, plan, split_every: int, groups: Grouping | None) -> str:
    """The token in a result's stage names: the input, the plan, the fan-in and the grouping (a
    grouping by worker names the placement, so two graphs under one name never differ)."""
    groups = groups or contiguous_groups(1)
    return tokenize(x, plan, split_every, getattr(groups, "__qualname__", groups))


def _grouped_stages(x: da.Array, plan, split_every: int, groups: Grouping | None, along: Sequence[int],
                    stages: dict[str, str], emit, chunks, dtype, last_apart: bool = False,
                    per_chunk: da.Array | None = None, token: str | None = None, whole=None,
                    carriers: set | None = None) -> da.Array:
    """The one builder behind ``reduction`` and ``scan``: per lane, the chunks (all, or with
    ``last_apart`` all but the last) are split by ``groups`` (checked: every chunk once) into groups and
    their chunk positions (``layout``), and
    ``emit(names, lane, index, grouped, layout)`` returns that lane's tasks. Every stage's tasks form one
    layer over ``x`` (``HighLevelGraph.from_collections``); the stage shows in each key's name
    (``stages``: stage -> name pattern with ``{label}`` and ``{token}``), which is what the dashboard
    shows. Over chunks held in memory, tasks reading one worker's chunks ask for it (``_pinned``), and so
    do tasks reading a ``carriers`` key (filled by ``emit``) that is pinned so."""
    groups = groups or contiguous_groups(1)
    token = token or stage_token(x, plan, split_every, groups)
    names = {stage: pattern.format(label=plan.label, token=token) for stage, pattern in stages.items()}
    layer: dict = {}
    for lane, index in _lanes(x, along):
        keys = [(x.name, *i) for i in (index[:-1] if last_apart else index)]
        grouped = groups(keys) if keys else []
        _check_groups(keys, grouped, ordered=False)  # every chunk's result is put back in chunk order
        position = {k: i for i, k in enumerate(keys)}
        layout = tuple(tuple(position[k] for k in group) for group in grouped)
        layer.update(emit(names, lane, index, grouped, layout))
    name = names["output"]
    holder = getattr(groups, "holder", None)  # placement found every chunk in a worker's memory
    sources = getattr(groups, "sources", None)
    if sources is not None:  # the tasks follow recipes: they read held chunks and shared constants, not x's tasks
        layer.update(sources.futures)
    if holder is not None:
        layer = _pinned(layer, holder, carriers or ())
    # with per-chunk partials made apart, the tasks here read only them: x must not be a dependency too,
    # or Dask's blockwise fusion (which fuses a layer into its only dependent) would leave it apart
    if sources is not None:
        dependencies = []
    else:
        dependencies = [x] if per_chunk is None else [per_chunk]
    graph = HighLevelGraph.from_collections(name, layer, dependencies=dependencies)
    # a FusedPlan's result (a tuple of results) is a host object: CuPy has no object dtype
    meta = meta_from_array(x._meta if np.dtype(dtype) != object else np.empty(0), ndim=len(chunks), dtype=dtype)
    one_block = len(chunks) <= 1 and all(len(c) == 1 for c in chunks)
    if one_block and whole is not None:  # read by ``_fuse_whole_reductions`` when several are computed together
        graph.layers[name].multireduce_whole = _WholeSource(x, plan, split_every, groups, (name, *(0,) * len(chunks)),
                                                            holder is not None)
    return _RESULT_TYPES[one_block, holder is not None](graph, name, chunks, meta=meta)


def _recipe_tasks(recipes, shared: dict, level: list, make) -> dict:
    """The tasks of groups that follow recipes (``recipes.Recipe``): ``make(recipe)`` per level key, reading
    the recipe's inputs, plus the constants the groups share (tasks of their own, run once)."""
    tasks = dict(shared)
    for key, recipe in zip(level, recipes):
        tasks[key] = (*make(recipe), *recipe.inputs)
    return tasks


def _pinned(tasks: dict, holder: dict, carriers=()) -> MaterializedLayer:
    """``tasks`` as a layer whose tasks that read chunks of one worker ask for that worker (a group's
    partial or totals, a chunk's scan), with ``allow_other_workers``: a lost worker's tasks run
    elsewhere once its chunks are recomputed. A task in ``carriers`` (chunks a scan kept) counts as held
    where it is pinned, for the tasks after it in ``tasks``' order. Data locality alone moved whole
    chunks: the scheduler weighs a chunk's transfer against its estimate of the holder's queue (0.5 s for
    a task it has not timed yet), and sent scan tasks away from their chunk (tests/test_scan_placement.py). The
    annotations reach the scheduler because pinned layers skip Dask's fusion (``_optimize_results``),
    which drops them."""
    where = _WorkerOf()
    held = dict(holder) if carriers else holder
    for key, task in tasks.items():
        if type(task) is not tuple:  # a future or a constant: nothing to run
            continue
        # tuple keys of arrays, string keys of scattered data
        workers = {held[a] for a in task[1:] if type(a) in (tuple, str) and a in held}
        if len(workers) == 1:
            where[key] = workers.pop()
            if key in carriers:
                held[key] = where[key]
    return MaterializedLayer(tasks, annotations={"workers": where, "allow_other_workers": _Pinned(where)})


class _WorkerOf(dict):
    """key -> worker as a Dask annotation: a module-level callable pickles by reference (the graph is
    pickled to the scheduler on every compute); a closure went by value through cloudpickle, ~2 ms."""

    __slots__ = ()

    def __call__(self, key):
        return self.get(key)


class _Pinned(_WorkerOf):
    __slots__ = ()

    def __call__(self, key):
        return True if key in self else None


class _WholeSource:
    """What a whole reduction's output layer was made from, so that several computed together can be made
    from one reading of their input (``_fuse_whole_reductions``)."""

    __slots__ = ("x", "plan", "split_every", "groups", "key", "held")

    def __init__(self, x, plan, split_every, groups, key, held):
        self.x, self.plan, self.split_every, self.groups, self.key, self.held = x, plan, split_every, groups, key, held


class FusedPlan:
    """Several whole reductions of one array as one plan: each chunk is read once and gives every plan's
    partial; each plan's partials are combined and aggregated as they would be alone (the same bits)."""

    keepdims = False
    out_dtype = np.dtype(object)

    def __init__(self, plans):
        self.plans = tuple(plans)
        self.axes = self.plans[0].axes
        self.label = "fused"

    def partial(self, *blocks):
        return tuple(_host_partial(p, *blocks) for p in self.plans)

    def partial_where_held(self, *blocks):
        """Each plan's partial as the plan makes it (on the chunk's device): the held paths bring every
        chunk's partials to the host together (``direct.values_here``), not one copy per chunk and plan."""
        return PerPlan(p.partial(*blocks) for p in self.plans)

    def combine(self, *partials):
        return tuple(p.combine(*(q[i] for q in partials)) for i, p in enumerate(self.plans))

    @property
    def folds_left(self) -> bool:
        return all(getattr(p, "folds_left", False) for p in self.plans)

    def aggregate(self, *partials):
        return tuple(p.aggregate(*(q[i] for q in partials)) for i, p in enumerate(self.plans))

    def whole(self, *blocks):
        return tuple(p.whole(*blocks) for p in self.plans)

    def __dask_tokenize__(self):
        return ("multireduce.FusedPlan", tokenize(*self.plans))


def _fuse_whole_reductions(dsk):
    """``dsk`` with every set of two or more whole reductions of one array (same fan-in and grouping) made
    from one reading of it (a ``FusedPlan``), each result then picked from the fused one: ``dask.compute(
    mr.sum(x), mr.max(x), mr.var(x))`` reads every chunk of ``x`` once. Also returns whether every such
    reduction is over held chunks."""
    if not isinstance(dsk, HighLevelGraph):
        return dsk, False
    found = {name: layer.multireduce_whole for name, layer in dsk.layers.items()
             if getattr(layer, "multireduce_whole", None) is not None}
    held = bool(found) and all(src.held for src in found.values())
    together: dict = {}
    for name, src in found.items():
        grouping = getattr(src.groups, "__qualname__", None) if src.groups is not None else None
        together.setdefault((src.x.name, src.split_every, grouping), []).append(name)
    if all(len(names) < 2 for names in together.values()):
        return dsk, held
    layers, dependencies = dict(dsk.layers), dict(dsk.dependencies)
    for names in together.values():
        if len(names) < 2:
            continue
        first = found[names[0]]
        fused = reduction(first.x, FusedPlan([found[n].plan for n in names]), first.split_every, first.groups)
        fused_graph = fused.__dask_graph__()
        for lname, layer in fused_graph.layers.items():
            if lname not in layers:
                layers[lname], dependencies[lname] = layer, set(fused_graph.dependencies[lname])
        fused_key = (fused.name,)
        for i, n in enumerate(names):
            layers[n] = MaterializedLayer({found[n].key: (_pick, fused_key, i)})
            dependencies[n] = {fused.name}
    return HighLevelGraph(layers, dependencies), held


class PerPlan(tuple):
    """A chunk's partials of a ``FusedPlan``, one per plan (a statistic's own partial may be a plain tuple)."""

    __slots__ = ()


def _pick(values, i: int):
    return values[i]


def _optimize_results(dsk, keys, **kwargs):
    """The one optimisation of every result type here: several whole reductions of one array fused
    (``_fuse_whole_reductions``); then only the cull where a layer is pinned to the workers holding its
    chunks (held chunks: Dask's low-level fusion would drop the layers' annotations, and has nothing to
    fuse there), else Dask's array optimisation. One function for every type: dask 2026.7-2026.8 group
    the collections of one ``dask.compute`` by their optimiser and hand the results back in the groups'
    order, so results of types with different optimisers came back swapped
    (``dask.compute(mr.sum(lz), mr.mean(lz, axis=0), mr.max(lz))`` gave the mean where the max belonged)."""
    dsk, held = _fuse_whole_reductions(dsk)
    if held or (isinstance(dsk, HighLevelGraph) and any(
            (getattr(layer, "annotations", None) or {}).get("workers") for layer in dsk.layers.values())):
        return _cull_only(dsk, keys)
    from dask.array.optimization import optimize

    return optimize(dsk, keys, **kwargs)


class _OneBlock(da.Array):
    """A result of one block (a whole reduction). Computed, its value is that block's, so Dask's finalize
    task (a concatenation of one block: one more task and scheduler round trip after the aggregate) is
    skipped, as Dask skips it for a Delayed; the aggregate's value is made fresh by its task, so the
    copy that finalize makes of a single chunk is not needed either. Only for keys that are a flat list
    (0-d and 1-d results): ``single_key`` picks the first."""

    __slots__ = ()
    __dask_optimize__ = staticmethod(_optimize_results)

    def __dask_postcompute__(self):
        return Delayed.__dask_postcompute__(self)

    def compute(self, **kwargs):
        """On a distributed client, with no arguments: the tasks before the aggregate run on the cluster
        and the aggregate on the client, as the held paths fold there (the same function of the same
        partials: the same bits); the aggregate task's own stage (its partials moved to one worker, one
        more scheduler round trip, its result fetched) costs 14-23 ms median on a 4-worker CPU cluster
        (2026-11-27, 256 lazily made chunks: 134-143 against 119-120 ms)."""
        if not kwargs:
            value = _aggregated_here(self)
            if value is not _NOT_HERE:
                return value
        return super().compute(**kwargs)


_NOT_HERE = object()


def _aggregated_here(result):
    """``result``'s value with its aggregate task run here, after the tasks it reads ran on the default
    distributed client's cluster; ``_NOT_HERE`` where another scheduler is configured, no client is
    there (or an asynchronous one), or the output task is not an aggregate of partials."""
    from dask.core import flatten

    from . import placement

    if not placement.distributed_is_the_scheduler():
        return _NOT_HERE
    client = placement.default_client()

    graph = result.__dask_graph__()
    (key,) = flatten(result.__dask_keys__())
    task = graph.get(key)
    if type(task) is not tuple or task[0] not in (_aggregate_layout, _aggregate_on):
        return _NOT_HERE
    reads = [i for i, a in enumerate(task) if _is_key_of(a, graph)]
    keys = [task[i] for i in reads]
    values = client.get(result.__dask_optimize__(graph, keys), keys, sync=True)
    args = list(task)
    for i, value in zip(reads, values):
        args[i] = value
    return args[0](*args[1:])


def _is_key_of(value, graph) -> bool:
    try:
        return type(value) is tuple and value in graph
    except TypeError:  # unhashable: not a key
        return False


def _cull_only(dsk, keys, **kwargs):
    from dask.core import flatten

    return HighLevelGraph.cull(dsk, set(flatten(keys))) if isinstance(dsk, HighLevelGraph) else dsk


class _Result(da.Array):
    """A result of several blocks over lazily made chunks: Dask's array, with ``_optimize_results``."""

    __slots__ = ()
    __dask_optimize__ = staticmethod(_optimize_results)


class _OfHeld(da.Array):
    """A result over an input whose chunks are all in workers' memory (futures): Dask's array optimisation
    (blockwise and linear fusion, slicing) has nothing to fuse there, so only the cull runs
    (``_optimize_results``; docs/performance.md, "Several GPUs")."""

    __slots__ = ()
    __dask_optimize__ = staticmethod(_optimize_results)


class _OneBlockOfHeld(_OneBlock, _OfHeld):
    __slots__ = ()
    __dask_optimize__ = staticmethod(_optimize_results)


_RESULT_TYPES = {(False, False): _Result, (True, False): _OneBlock, (False, True): _OfHeld,
                 (True, True): _OneBlockOfHeld}


def reduction(x: da.Array, plan: ReductionPlan, split_every: int, groups: Grouping | None = None,
              token: str | None = None) -> da.Array:
    """A lazy reduction of ``x`` over ``plan.axes``: one ``partial`` task per group, a ``combine`` tree of
    fan-in ``split_every`` over the group partials, one ``aggregate`` task per output block that combines
    the last level and finalizes (every stage costs a scheduler round trip, milliseconds on a cluster).

    Groups of chunks held by one worker (``placement``) run there by data locality."""
    axes = plan.axes
    on_device = type(x._meta).__module__.startswith("cupy")  # the result's chunk type follows the input's
    per_chunk = None
    sources = getattr(groups, "sources", None)  # the groups make their chunks themselves (``recipes``)
    if groups is None and math.prod(x.numblocks[d] for d in axes) > 1:  # every lane has several chunks
        # one chunk per partial (a lazy input): the partials as a blockwise layer over x, which Dask's
        # optimisation fuses with the layer making each chunk (dask.array's own reductions fuse so):
        # a materialised partial task could not fuse, and each chunk cost a task and a hand-over more
        per_chunk = _partials_per_chunk(x, plan)

    def emit(names, kept_index, index, grouped, layout):
        partial_name, combine_name, name = names["partial"], names["combine"], names["output"]
        out_index = index[0] if plan.keepdims else kept_index  # index[0]: 0 on every reduced axis
        out = (name, *out_index)
        keys = [(x.name, *i) for i in index]
        if sources is not None:
            recipes, shared = sources.recipes(grouped)
            if len(keys) == 1:
                return _recipe_tasks(recipes, shared, [out], lambda r: (_recipe_apply, plan.whole, r))
            if len(grouped) == 1:
                return _recipe_tasks(recipes, shared, [out],
                                     lambda r: (_recipe_whole_in_order, plan, on_device, split_every, r))
            level = [(partial_name, *kept_index, g) for g in range(len(grouped))]
            positions = {id(r): layout[g] for g, r in enumerate(recipes)}
            tasks = _recipe_tasks(recipes, shared, level, lambda r: (
                _recipe_partials_folded, plan, split_every, len(keys), positions[id(r)], r))
            tasks[out] = (_aggregate_layout, plan, on_device, split_every, layout, *level)
            return tasks
        if len(keys) == 1:  # one chunk: reduce and finalize in one task
            return {out: (plan.whole, keys[0])}
        if any(len(group) > 1 for group in grouped):
            # groups of chunks held by one worker: each task returns its chunks' own partials (host
            # values, a few bytes each) and one task folds them in chunk order with the tree every path
            # uses, so the bits do not depend on the placement
            if len(grouped) == 1:
                return {out: (_whole_in_order, plan, on_device, split_every, *grouped[0])}
            level = [(partial_name, *kept_index, g) for g in range(len(grouped))]
            tasks = {key: (_chunk_partials, plan, split_every, len(keys), positions, *group)
                     for key, group, positions in zip(level, grouped, layout)}
            tasks[out] = (_aggregate_layout, plan, on_device, split_every, layout, *level)
            return tasks
        # one chunk per group: partials in chunk order, then the tree
        in_order = sorted(range(len(grouped)), key=lambda g: layout[g][0])
        if per_chunk is not None:
            level = [(per_chunk.name, *grouped[g][0][1:]) for g in in_order]
            tasks = {}
        else:
            level = [(partial_name, *kept_index, g) for g in range(len(grouped))]
            tasks = {key: (_host_partial, plan, grouped[g][0]) for key, g in zip(level, in_order)}
        depth = 0
        while len(level) > split_every:  # the last level is folded into the aggregate task
            nxt = []
            for j in range(0, len(level), split_every):
                key = (combine_name, depth, *kept_index, j // split_every)
                tasks[key] = (plan.combine, *level[j : j + split_every])
                nxt.append(key)
            level, depth = nxt, depth + 1
        tasks[out] = (_aggregate_on, plan, on_device, *level)
        return tasks

    if plan.keepdims:
        chunks = tuple((1,) if d in axes else x.chunks[d] for d in range(x.ndim))
    else:
        chunks = tuple(x.chunks[d] for d in range(x.ndim) if d not in axes)
    stages = {stage: f"{{label}}-{stage}-{{token}}" for stage in ("partial", "combine")}
    stages["output"] = "{label}-aggregate-{token}"
    return _grouped_stages(x, plan, split_every, groups, axes, stages, emit, chunks, plan.out_dtype,
                           per_chunk=per_chunk, token=token, whole=len(axes) == x.ndim or None)


def scan(x: da.Array, plan: ScanPlan, split_every: int, groups: Grouping | None = None,
         token: str | None = None) -> da.Array:
    """A lazy scan of ``x`` along ``plan.axis`` with the same chunks as ``x``.

    Per lane (the chunks that share their position on the other axes): ``totals`` tasks, one per group
    of chunks 0..n-2; one ``carries`` task scanning those totals; one ``scan`` task per chunk, seeded
    with its carry. With at most ``FOLD_TOTALS_UP_TO`` groups the scan tasks fold the totals themselves
    and there is no carries task, unless the plan's carries are not cheap (``carries_are_cheap``: the
    exact scan's are Python integer adds per lane, better made once). Depth 3 whatever the number of chunks, no rechunking, each input read
    twice (chunks made by recipes: made once where they are kept, ``_recipe_scan_tasks``) and each output
    written once. Totals and scan tasks run by data locality where their chunks
    are, so every output chunk is made where its input lives.
    """

    sources = getattr(groups, "sources", None)
    # whether it keeps chunks follows from the grouping, which names the result (``stage_token``)
    carriers = set() if sources is not None and _keeps_chunks(x, plan, groups) else None

    def emit(names, lane, index, grouped, layout):
        name = names["output"]
        if sources is not None:
            return _recipe_scan_tasks(plan, sources, names, lane, [(x.name, *i) for i in index], grouped, layout,
                                      carriers)
        if len(index) == 1:
            return {(name, *index[0]): (plan.scan_block, (x.name, *index[0]))}
        total_keys = [(names["totals"], *lane, g) for g in range(len(grouped))]
        tasks = {key: (_host_totals, plan, *group) for key, group in zip(total_keys, grouped)}
        if len(total_keys) <= FOLD_TOTALS_UP_TO and getattr(plan, "carries_are_cheap", True):
            # few groups (one per GPU, say): every scan task folds the totals itself, a stage less.
            # It waits only for the groups holding chunks before its own, so chunk 0 is scanned at once
            # and a lazy input's chunks are released as they are scanned
            for i, idx in enumerate(index):
                used = [g for g, pos in enumerate(layout) if min(pos) < i]
                tasks[(name, *idx)] = (_scan_from_totals, plan, (x.name, *idx), i, tuple(layout[g] for g in used),
                                       *(total_keys[g] for g in used))
            return tasks
        carries_key = (names["carries"], *lane)
        tasks[carries_key] = (_carries_in_order, plan, layout, *total_keys)
        for i, idx in enumerate(index):
            tasks[(name, *idx)] = (_scan_seeded, plan, (x.name, *idx), carries_key, i)
        return tasks

    stages = {"totals": "{label}-totals-{token}", "carries": "{label}-carries-{token}", "output": "{label}-{token}",
              "made": "{label}-made-{token}", "chunk": "{label}-chunk-{token}"}
    # the last chunk's total seeds nothing: chunks 0..n-2 are grouped
    return _grouped_stages(x, plan, split_every, groups, (plan.axis,), stages, emit, x.chunks, plan.out_dtype,
                           last_apart=True, token=token, carriers=carriers)


KEEP_MEMORY_FRACTION = 0.5  # of a worker's memory, for its share of a scan's kept chunks and of its output


def _keeps_chunks(x: da.Array, plan: ScanPlan, groups: Grouping) -> bool:
    """Whether a scan of chunks made by recipes keeps each group's chunks, made for its totals, for its
    scan tasks (``multireduce.scan-keep-chunks``, as ``groups.keep_memory`` gives it: ``placement.
    scan_grouping``): always (True), never (False), or ("auto") where a worker's share fits in
    ``KEEP_MEMORY_FRACTION`` of the smallest worker's memory (its GPU's for CuPy chunks). Every group may be
    made before any is scanned, so a worker's share is all its groups hold, their chunks (the input's dtype)
    and their scanned chunks (the output's): the groups pinned to it (``groups.holder``, across every
    lane), else ceil(groups / workers) of the largest."""
    found = getattr(groups, "keep_memory", None)
    if found is None:
        return False
    workers, memory = found
    if memory == math.inf:
        return True
    per_element = np.dtype(x.dtype).itemsize + np.dtype(plan.out_dtype).itemsize
    holder, sources = getattr(groups, "holder", None), getattr(groups, "sources", None)
    sizes, share = [], {}
    for _, index in _lanes(x, (plan.axis,)):
        keys = [(x.name, *i) for i in index[:-1]]
        for group in groups(keys) if keys else ():
            size = sum(math.prod(x.chunks[d][b] for d, b in enumerate(k[1:])) for k in group) * per_element
            sizes.append(size)
            if holder is not None:
                reads = sources.reads.get(group[0]) if sources is not None else None
                first = next(iter(reads)) if reads else group[0]
                worker = holder.get(first)
                share[worker] = share.get(worker, 0) + size
    if not sizes:
        return False
    if share:
        return max(share.values()) <= KEEP_MEMORY_FRACTION * memory
    return max(sizes) * math.ceil(len(sizes) / workers) <= KEEP_MEMORY_FRACTION * memory


def _recipe_scan_tasks(plan: ScanPlan, sources, names, lane, keys, grouped, layout, carriers: set | None) -> dict:
    """A lane's scan over chunks made by recipes: one task per group makes its chunks one at a time and
    takes each one's total, then one scan task per chunk scans it from the totals of the groups before it.

    With ``carriers`` None, the group's task drops each chunk once its total is taken and every scan task
    makes its chunk again from its own recipe: one chunk per task in memory, as Dask's own scans hold.
    Otherwise (``_keeps_chunks``) the group's task (``made``) returns its totals and its chunks; a task per
    chunk (``chunk``) and one for the totals (``totals``) pick them out, each reading that output alone,
    so Dask runs them where it is (and, over held chunks, they are pinned there: ``carriers``) and
    releases it at once; each scan task reads its chunk's key, which Dask releases once it is scanned. A
    task that read the whole group's output besides other groups' totals could be sent, with all of it,
    to another worker. The lane's last chunk seeds nothing, is in no group and is made by its scan task.
    A persisted input is made once either way."""
    name = names["output"]
    total_keys = [(names["totals"], *lane, g) for g in range(len(grouped))]
    group_recipes, shared = sources.recipes(grouped)
    chunk_of: dict = {}
    if carriers is None:
        tasks = _recipe_tasks(group_recipes, shared, total_keys, lambda r: (_recipe_totals, plan, r))
    else:
        made_keys = [(names["made"], *lane, g) for g in range(len(grouped))]
        tasks = _recipe_tasks(group_recipes, shared, made_keys, lambda r: (_recipe_made, plan, r))
        for made, totals, group in zip(made_keys, total_keys, grouped):
            tasks[totals] = (_pick, made, 0)
            for j, key in enumerate(group):
                chunk_of[key] = (names["chunk"], *key[1:])
                tasks[chunk_of[key]] = (_kept_chunk, made, j)
        carriers.update(made_keys, chunk_of.values())
    made_again = [k for k in keys if k not in chunk_of]
    chunk_recipes, shared = sources.recipes([[k] for k in made_again])
    recipe_of = dict(zip(made_again, chunk_recipes))
    tasks.update(shared)
    fold_here = len(total_keys) <= FOLD_TOTALS_UP_TO and getattr(plan, "carries_are_cheap", True)
    if not fold_here:
        carries_key = (names["carries"], *lane)
        tasks[carries_key] = (_carries_in_order, plan, layout, *total_keys)
    for i, key in enumerate(keys):
        if fold_here:
            used = [g for g, pos in enumerate(layout) if min(pos) < i]
            how, seed = _scan_from_totals, (i, tuple(layout[g] for g in used), *(total_keys[g] for g in used))
        else:
            how, seed = _scan_seeded, (carries_key, i)
        if key in chunk_of:
            tasks[(name, *key[1:])] = (how, plan, chunk_of[key], *seed)
        else:
            recipe = recipe_of[key]
            tasks[(name, *key[1:])] = (_recipe_scan, plan, recipe, len(seed) + 1, how, *seed, *recipe.inputs)
    return tasks


def _recipe_totals(plan: ScanPlan, recipe, *inputs):
    """The per-chunk totals of a group made by its recipe, one chunk at a time, on the host."""
    return _totals_of(plan, recipe, inputs, None)


def _recipe_made(plan: ScanPlan, recipe, *inputs):
    """(the group's per-chunk totals as ``_recipe_totals`` gives them, its chunks in the group's order)."""
    chunks: list = []
    return _totals_of(plan, recipe, inputs, chunks), chunks


def _totals_of(plan: ScanPlan, recipe, inputs, keep: list | None):
    def total(block):
        if keep is not None:
            keep.append(block)
        return _host(plan.totals(block))

    totals = recipe.apply(dict(zip(recipe.inputs, inputs)), total)
    return totals[0] if len(totals) == 1 else np.concatenate(totals, axis=plan.axis)


def _kept_chunk(made, j: int):
    return made[1][j]


def _recipe_scan(plan: ScanPlan, recipe, seeded: int, *args):
    """Chunk made by ``recipe``, scanned by ``args[0]`` (``_scan_from_totals`` or ``_scan_seeded``) with the
    next ``seeded - 1`` arguments after the block; the rest are the recipe's inputs."""
    how, seed, inputs = args[0], args[1:seeded], args[seeded:]
    (block,) = recipe.make(dict(zip(recipe.inputs, inputs)))
    return how(plan, block, *seed)


def _host(value):
    """Small results (partials, totals, carries) cross workers as host memory: a 0-d or per-chunk
    device array would go through CUDA serialization and a device copy on the receiving GPU."""
    if type(value).__module__.startswith("cupy"):
        return value.get()
    return value


def _like(block, value):
    """``value`` (host) in the memory ``block`` lives in; host objects (the exact scan's LaneStates)
    stay on the host."""
    if type(block).__module__.startswith("cupy") and not type(value).__module__.startswith("cupy") \
            and getattr(value, "dtype", None) != object:
        import cupy

        return cupy.asarray(value)
    return value


@sizeof.register(Partial)
def _sizeof_partial(partial) -> int:
    """A partial's bytes as Dask (and dask-cuda's spilling) should count them: its value's, where
    ``sys.getsizeof`` would say a few dozen bytes for a 4 MB partial kept on a GPU."""
    return sizeof(partial.value) + sizeof(partial.count)


def stays_on_device(partial) -> bool:
    """Whether ``partial`` is folded where it is: a reduction's ``Partial`` whose value is a CuPy array of
    more than one element (a reduction over some axes: as large as a slice of the input, 4 MB for a float32 mean
    over time of a 721 x 1440 field). Such partials stay on the GPUs and every fold of them runs there
    (the backend's combine), on every path, so the bits do not depend on the path or the placement; a
    whole reduction's one-element partials go to the host, where moving and folding them costs least."""
    if type(partial) is not Partial:
        return False
    value = partial.value
    return type(value).__module__.startswith("cupy") and getattr(value, "size", 0) > 1


def _host_partial(plan, *blocks):
    """A group's partial with its value on the host, unless it ``stays_on_device``: the combine tree and the
    aggregate then move a few bytes between workers and run on the host (every operator has a CPU
    implementation)."""
    import dataclasses

    partial = plan.partial(*blocks)
    value = getattr(partial, "value", None)  # other plans' partials (exact states, ...) are host data already
    if value is None or not type(value).__module__.startswith("cupy") or stays_on_device(partial):
        return partial
    return dataclasses.replace(partial, value=_host(value))


def _block_partial(block, plan):
    return _host_partial(plan, block)


def _partials_per_chunk(x: da.Array, plan) -> da.Array:
    """Each chunk's own partial as a blockwise layer over ``x`` (an object per block), which Dask's
    optimisation fuses with the layer making the chunk."""
    return da.map_blocks(_block_partial, x, plan=plan, dtype=object,
                         name=f"{plan.label}-partial-{tokenize(x, plan, 'per-chunk')}",
                         meta=np.empty((0,) * x.ndim, dtype=object))


def first_level(split_every: int, items: list) -> list[list]:
    """The groups ``fold_in_order`` combines first (contiguous runs of ``split_every``), or [] where it
    combines nothing before the aggregate (``split_every`` items or fewer)."""
    if len(items) <= split_every:
        return []
    return [list(items[j : j + split_every]) for j in range(0, len(items), split_every)]


def fold_in_order(plan, split_every: int, partials):
    """Per-chunk partials, in chunk order, through the tree the lazy graph builds (contiguous combines of
    ``split_every`` while more remain, then the aggregate): one shape for a given chunk count, so the
    graph, the eager path and every placement give the same bits. A first-level group combined already
    where its chunks were (``fold_first_level``) comes as its value at its first position and None at
    the others: the same combine of the same partials in the same order."""
    level = list(partials)
    groups = getattr(plan, "combine_groups", None)  # a level's combines at once (``StatPlan``)
    if len(level) > split_every:
        if groups is not None and None not in level:
            level = groups(level, split_every)
        else:
            level = [_combined(plan, level[j : j + split_every]) for j in range(0, len(level), split_every)]
    while len(level) > split_every:
        level = groups(level, split_every) if groups is not None else \
            [plan.combine(*level[j : j + split_every]) for j in range(0, len(level), split_every)]
    return plan.aggregate(*level)


def fold_present_in_order(plan, split_every: int, count: int, positions, partials):
    """``fold_in_order``'s tree over ``count`` chunk positions of which only those at ``positions`` hold
    a partial (None among ``partials``: nothing either): the same combines of the same partials, in the
    same association, with the chunks that hold nothing left out; None where nothing is held. The caller
    accounts for the identities the full tree would have merged."""
    level = [None] * count
    for position, partial in zip(positions, partials):
        level[position] = partial

    def combined(group):
        held = [p for p in group if p is not None]
        if len(held) <= 1:
            return held[0] if held else None
        return plan.combine(*held)

    while len(level) > split_every:
        level = [combined(level[j : j + split_every]) for j in range(0, len(level), split_every)]
    return combined(level)


def cohort_reduction(x: da.Array, plan, split_every: int, cohorts: list, token: str) -> da.Array:
    """A lazy group-by reduction of ``x`` along ``plan.axis`` whose result is chunked by cohorts of groups,
    where each cohort (a run of group ids and the chunk positions that may hold them) is folded from those
    chunks' partials alone: a day that straddles two chunks of a year meets only them, and no partial of
    every group crosses the cluster. The bits are ``reduction``'s: the partials restricted to the cohort
    (``plan.restricted``) fold through ``fold_present_in_order``, and ``plan.finalize_groups`` merges the
    identities the full tree would have merged (a float sum's -0.0 becomes 0.0 there)."""
    ax = plan.axis
    on_device = type(x._meta).__module__.startswith("cupy")
    per_chunk = _partials_per_chunk(x, plan)
    token = tokenize(token, split_every, cohorts)  # the fan-in shapes the fold, so the bits
    name, piece = f"{plan.label}-cohorts-{token}", f"{plan.label}-cohort-piece-{token}"
    count = x.numblocks[ax]
    lanes = itertools.product(*(range(n) if d != ax else (None,) for d, n in enumerate(x.numblocks)))
    dsk = {}
    for lane in lanes:
        for b, (first, last, positions) in enumerate(cohorts):
            at = [tuple(p if d == ax else i for d, i in enumerate(lane)) for p in positions]
            # the run's own chunk's partial is read whole where it is (the fold runs there); of the chunks
            # after it only the run's groups travel (a straddling day, not the chunk's week)
            deps = [(per_chunk.name, *at[0])]
            for index in at[1:]:
                dsk[(piece, b, *index)] = (_cohort_piece, plan, (per_chunk.name, *index), first, last)
                deps.append((piece, b, *index))
            out = (name, *(b if d == ax else i for d, i in enumerate(lane)))
            dsk[out] = (_cohort_aggregate, plan, on_device, split_every, count, tuple(positions), first, last, *deps)
    chunks = tuple(tuple(last - first + 1 for first, last, _ in cohorts) if d == ax else c
                   for d, c in enumerate(x.chunks))
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[per_chunk])
    return da.Array(graph, name, chunks, meta=meta_from_array(x._meta, ndim=x.ndim, dtype=plan.out_dtype))


def _cohort_piece(plan, partial, first: int, last: int):
    """The groups ``first..last`` of a chunk's partial, in arrays of their own (a view would carry the
    whole partial's memory across the network)."""
    part = plan.restricted(partial, first, last)
    if part is None:
        return None
    return tuple(member.copy() if hasattr(member, "ndim") else member for member in part)


def _cohort_aggregate(plan, on_device: bool, split_every: int, count: int, positions, first: int, last: int,
                      *partials):
    parts = [None if p is None else plan.restricted(p, first, last) for p in partials]
    folded = fold_present_in_order(plan, split_every, count, positions, parts)
    return _device(on_device, plan.finalize_groups(folded, first, last, parts, count))


def _combined(plan, group: list):
    """A first-level group's combine. None marks a partial combined already into the group's first value
    where its chunks were: the whole group, or (plans that fold left) its leading run, so that combining
    what is left after it gives the group's own bits (``first_level_folds``)."""
    present = [p for p in group if p is not None]
    return present[0] if len(present) == 1 else plan.combine(*present)


#: ``split_every`` below which a plan that folds left may have a group's leading run combined apart
#: (``core.ReductionPlan.folds_left``: the column kernel folds fewer than 64 rows in one thread per column)
LEFT_FOLD_GROUPS = 64


def leading_runs_fold(plan, split_every: int) -> bool:
    """Whether a first-level group's leading run may be combined apart (``first_level_folds``)."""
    return getattr(plan, "folds_left", False) and split_every < LEFT_FOLD_GROUPS


def first_level_folds(groups: list, where: dict, leading_runs: bool) -> dict:
    """{worker: the runs of keys it combines itself}: each first-level group one worker holds whole and,
    with ``leading_runs`` (a plan that folds left, groups below ``LEFT_FOLD_GROUPS``), the leading run of
    two or more keys of a group that straddles workers, held by the worker holding its first key. The
    combined run comes back under its first key, the others absent; ``_combined`` combines the rest with
    it, in order."""
    local: dict = {}
    for group in groups:
        first = where[group[0]]
        run = 1
        while run < len(group) and where[group[run]] == first:
            run += 1
        if run > 1 and (run == len(group) or leading_runs):
            local.setdefault(first, []).append(list(group[:run]))
    return local


def fold_first_level(plan, split_every: int, count: int, positions, parts: list) -> list:
    """``parts`` (the partials of the chunks at ``positions`` of a lane of ``count`` chunks) with each
    first-level group of ``fold_in_order``'s tree that lies wholly among them combined here, in order,
    under the group's first position, None at its other positions: less crosses between workers, and
    the combine is the one ``fold_in_order`` would make. For a plan that folds left (``first_level_folds``)
    the leading run of a group that straddles workers is combined here too, when this task holds it."""
    if count <= split_every:
        return list(parts)
    at = {position: i for i, position in enumerate(positions)}
    where = {m: at.get(m) is not None for m in range(count)}  # held here or not
    groups = [list(range(j, min(j + split_every, count))) for j in range(0, count, split_every)]
    out = list(parts)
    for run in first_level_folds([g for g in groups if where[g[0]]], where,
                                 leading_runs_fold(plan, split_every)).get(True, ()):
        out[at[run[0]]] = plan.combine(*(parts[at[m]] for m in run))
        for m in run[1:]:
            out[at[m]] = None
    return out


def _chunk_partials(plan, split_every: int, count: int, positions, *blocks):
    """Each chunk's own partial (host values, or device values that ``stays_on_device``), in the group's
    order, with the first-level groups it holds wholly combined here (``fold_first_level``)."""
    return fold_first_level(plan, split_every, count, positions, [_host_partial(plan, b) for b in blocks])


def _recipe_partials_folded(plan, split_every: int, count: int, positions, recipe, *inputs):
    """``_recipe_partials`` with the first-level groups of the lane's tree that the group holds whole
    combined here (``fold_first_level``), after the partials came to the host: the combines the aggregate
    would make, where it would make them (host partials on the host, ``stays_on_device`` ones on a GPU)."""
    return fold_first_level(plan, split_every, count, positions, _recipe_partials(plan, recipe, *inputs))


def _recipe_partials(plan, recipe, *inputs):
    """Each chunk's own partial (host values), in the group's order, made from the recipe one chunk at a
    time: a chunk is dropped as soon as its partial is taken, and the partials come to the host together
    at the end (a copy per chunk would wait on the GPU between chunks); partials that ``stays_on_device``
    stay where they are."""
    return to_host_together(recipe.apply(dict(zip(recipe.inputs, inputs)), plan.partial))


def to_host_together(values: list) -> list:
    """``values`` (CuPy arrays, or objects whose ``value`` is one, such as ``Partial``) with every CuPy
    array brought to the host in one copy per device and dtype: a copy per chunk waits on the GPU and
    pays the copy's fixed cost each time (2.5 ms for 32 chunks on an H100). Anything else is kept."""
    import dataclasses

    found: dict = {}
    for i, v in enumerate(values):
        a = getattr(v, "value", v)
        if type(a).__module__.startswith("cupy") and not stays_on_device(v):
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



def _recipe_whole_in_order(plan, on_device: bool, split_every: int, recipe, *inputs):
    return _device(on_device, fold_in_order(plan, split_every, _recipe_partials(plan, recipe, *inputs)))


def _recipe_apply(fn, recipe, *inputs):
    (block,) = recipe.make(dict(zip(recipe.inputs, inputs)))
    return fn(block)


def _device(on_device: bool, value):
    if type(value) is tuple:  # a FusedPlan's results
        return tuple(_device(on_device, v) for v in value)
    if on_device and not type(value).__module__.startswith("cupy"):
        import cupy

        return cupy.asarray(value)
    return value


def _whole_in_order(plan, on_device: bool, split_every: int, *blocks):
    return _device(on_device, fold_in_order(plan, split_every, [_host_partial(plan, b) for b in blocks]))


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


__all__ = ["reduction", "scan", "contiguous_groups", "even_groups", "fold_in_order", "FusedPlan"]
