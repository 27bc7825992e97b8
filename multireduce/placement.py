"""Where chunks live: group a persisted array's chunks by the worker (one GPU each) that holds them.

With such groups the reduction graph has one ``partial`` task per worker and the scan graph one
``totals`` task per worker; every such task depends only on chunks held by one worker, so the
scheduler's data locality runs it there and only partial results cross the network. Nothing is
pinned: if a worker dies, Dask recomputes its chunks elsewhere and the same graph still completes.

Placement is known only for arrays persisted through a ``distributed.Client`` (their graph holds
futures); for lazy arrays the default contiguous groups apply and Dask places the tasks.
Set ``dask.config.set({"multireduce.placement": False})`` to turn the lookup off. Every multireduce
setting is read by ``setting``, as dask reads its own from YAML files and environment variables.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Hashable, Sequence

import dask

from .graph import Grouping, even_groups


def default_client():
    """The current ``distributed`` client, or None; None too for an asynchronous client called from its
    event loop (``await client.compute(...)``): its calls return coroutines, and a held call or a
    placement lookup cannot wait for them there, so the task graph runs."""
    try:
        from distributed import default_client as current

        client = current()
    except (ImportError, ValueError):
        return None
    return None if getattr(client, "asynchronous", False) else client


def distributed_is_the_scheduler() -> bool:
    """``.compute()`` / ``.persist()`` without arguments would run on the default distributed client."""
    return dask.config.get("scheduler", None) in (None, "dask.distributed", "distributed") \
        and default_client() is not None


def chunk_keys(x) -> tuple:
    """``x``'s chunk keys in C order, read once per array (a held call asks several times)."""
    from dask.core import flatten

    from .recipes import read_once

    return read_once(x, "_multireduce_chunk_keys", lambda x: tuple(flatten(x.__dask_keys__())))


def is_persisted(x) -> bool:
    """True when every chunk of ``x`` is a distributed future (``client.persist`` / ``x.persist()``); read
    once per array, as its graph never changes."""
    from .recipes import read_once

    return read_once(x, "_multireduce_persisted", _futures_only)


def _futures_only(x) -> bool:
    try:
        from distributed import Future
    except ImportError:
        return False
    # a persisted array's own layer holds its futures; looking only there keeps this O(chunks)
    layer = getattr(x.__dask_graph__(), "layers", {}).get(x.name)
    if layer is None:
        return False
    # a layer not yet laid out (a Blockwise of an expression) holds tasks, not futures: looking into it
    # would lay out every task of it (1 ms for 32 chunks of ``x * 2``, each time a held call is made)
    if not getattr(layer, "is_materialized", lambda: True)():
        return False
    keys = chunk_keys(x)
    return bool(keys) and all(isinstance(layer.get(k), Future) for k in keys)


def holders(x, client=None) -> dict[Hashable, str] | None:
    """Chunk key -> address of a worker holding it, for a persisted ``x``; None when unknown."""
    if not setting("multireduce.placement") or not is_persisted(x):
        return None
    client = client or default_client()
    return None if client is None else _looked_up(x, client)


def _looked_up(x, client) -> dict[Hashable, str] | None:
    """``holders`` of a persisted ``x`` with a client, from the scheduler (one ``who_has``); a chunk on
    several workers: the first by address."""
    who = who_holds(x, client)
    return None if who is None else {k: w[0] for k, w in who.items()}


def who_holds(x, client, avoid=frozenset()) -> dict[Hashable, list[str]] | None:
    """Chunk key -> every worker holding it (sorted by address, leaving out those in ``avoid``), from the
    scheduler (one ``who_has``); None when some chunk is in the memory of no such worker."""
    graph = x.__dask_graph__()
    return who_holds_futures({k: graph[k] for k in chunk_keys(x)}, client, avoid)


def who_holds_futures(futures: dict, client, avoid=frozenset()) -> dict[Hashable, list[str]] | None:
    """``who_holds`` for {key: Future} (who_has takes futures, not bare keys)."""
    who = client.who_has(list(futures.values()))
    found = {k: sorted(set(who.get(k) or who.get(str(k)) or ()) - set(avoid)) for k in futures}
    if any(not w for w in found.values()):
        return None  # some chunk is not in memory yet: let Dask place the work
    return found


def holders_of(futures: dict, client) -> dict[Hashable, str] | None:
    """Key -> a worker holding it (the first by address), for {key: Future}; None if some is in no
    worker's memory."""
    who = who_holds_futures(futures, client)
    return None if who is None else {k: w[0] for k, w in who.items()}


def by_worker(holder: dict[Hashable, str], commutative: bool) -> Grouping:
    """Groups of keys held by one worker. Commutative operators get one group per worker (keys in their
    original order inside it); non-commutative ones one group per contiguous run on the same worker.
    The function carries ``holder``, so the graph can ask for each group's task to run there."""

    def split(keys: Sequence[Hashable]) -> list[list[Hashable]]:
        if commutative:
            groups: dict[str, list] = {}
            for k in keys:
                groups.setdefault(holder[k], []).append(k)
            return list(groups.values())
        runs: list[list] = []
        for k in keys:
            if runs and holder[runs[-1][-1]] == holder[k]:
                runs[-1].append(k)
            else:
                runs.append([k])
        return runs

    split.__qualname__ = f"by_worker-{_placement_token(holder, commutative)}"
    split.holder = holder  # the graph pins each group's task to this worker (as a preference)
    return split


# Where a persisted array's chunks were seen last, per (client, array name): a held result's name
# follows its grouping, and looking placement up costs a scheduler round trip (``who_has``, 1.6 ms on
# 4 x H200, 2026-11-26) that the direct paths' replies make unnecessary: each run tells where every chunk
# is. A placement that is not current only costs the graph locality (its tasks prefer workers that
# no longer hold the chunks); the name still follows the grouping the graph is built with, so two
# graphs under one name never differ, and values never depend on placement.
_seen: dict[tuple, tuple[float, dict]] = {}
_seen_lock = threading.Lock()
_SEEN_MAX = 64


# Every multireduce setting, its kind and its default. Settings arrive as Python values
# (``dask.config.set``), YAML (real booleans and numbers, or quoted strings) or environment variables
# (``DASK_MULTIREDUCE__PLACEMENT=false``: dask turns "false", "true", "none" and Python literals into
# values, anything else stays a string), so strings are read as those sources would read them.
_SETTINGS = {
    "multireduce.placement": ("flag", True),
    "multireduce.direct-to-workers": ("flag or None", None),
    "multireduce.direct-connect-timeout": ("duration above 0", "2s"),
    "multireduce.direct-check-interval": ("duration above 0", "250ms"),
    "multireduce.placement-reuse": ("duration", "10s"),
    "multireduce.tasks-per-thread": ("number above 0", 2),
    "multireduce.fuse-elementwise": ("flag", True),
    "multireduce.scan-keep-chunks": ("flag or auto", "auto"),
    "multireduce.held-values-in-graphs": ("flag", True),
}
# the words YAML 1.1 (dask's config files) reads as booleans, and what dask's environment parsing gives
_FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def setting(name: str):
    """The multireduce setting ``name`` read from ``dask.config``: True/False for a flag (also the strings
    "true"/"false", "yes"/"no", "on"/"off", "1"/"0" in any case, and the integers 1/0), None too where None
    means "decide by itself" (also "none"/"null"), "auto" too where that means "decide by itself" (any
    case), seconds (a float) for a duration (a number or a string such as "250ms", as
    ``dask.utils.parse_timedelta`` reads it). Anything else raises a ValueError naming
    the setting, what it expects and what it was given (a number above 0: a float)."""
    from dask.utils import parse_timedelta

    kind, default = _SETTINGS[name]
    given = dask.config.get(name, default)
    if kind == "flag or auto" and isinstance(given, str) and given.strip().lower() == "auto":
        return "auto"
    if kind == "number above 0":
        try:
            value = float(given) if not isinstance(given, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not 0 < value < math.inf:
            raise ValueError(f"dask.config {name!r}: expected a number above 0 such as {default!r}, got {given!r}")
        return value
    if kind.startswith("flag"):
        if kind == "flag or None" and (given is None or isinstance(given, str) and given.strip().lower() in
                                       ("none", "null")):
            return None
        if isinstance(given, bool):
            return given
        if type(given) is int and given in (0, 1):
            return bool(given)
        if isinstance(given, str) and given.strip().lower() in _FLAG_WORDS:
            return _FLAG_WORDS[given.strip().lower()]
        wanted = "True or False" + {"flag or None": " or None", "flag or auto": " or 'auto'"}.get(kind, "")
        raise ValueError(f"dask.config {name!r}: expected {wanted} (or a string such as 'true', 'false', "
                         f"'yes', 'no', '1', '0'), got {given!r}")
    seconds = None
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        seconds = float(given)
    elif isinstance(given, str) and given.strip():
        try:
            seconds = float(parse_timedelta(given.strip()))
        except (KeyError, ValueError, TypeError, IndexError):  # what parse_timedelta raises for what it cannot read
            seconds = None
    if seconds is None or not 0 <= seconds < math.inf or (kind == "duration above 0" and seconds == 0):
        wanted = "a duration above 0" if kind == "duration above 0" else "a duration (0 turns it off)"
        raise ValueError(f"dask.config {name!r}: expected {wanted}, a number of seconds or a string such as "
                         f"{default!r}, got {given!r}")
    return seconds


def remember(x, holder: dict, client=None) -> None:
    """Record ``holder`` (chunk key -> worker, every chunk of ``x``) as where ``x``'s chunks are now."""
    client = client or default_client()
    if client is None:
        return
    with _seen_lock:
        _seen.pop((client.id, x.name), None)
        _seen[(client.id, x.name)] = (time.monotonic(), dict(holder))
        while len(_seen) > _SEEN_MAX:
            _seen.pop(next(iter(_seen)))


def _array_of(key) -> Hashable:
    """The name of the array a chunk key belongs to."""
    return key[0] if isinstance(key, tuple) and key else key


def remember_chunks(holder: dict, client=None) -> None:
    """Record ``holder`` (chunk key -> worker, chunks of one or more arrays, not necessarily all of any)
    into each array's recorded placement (``remember``), kept where recorded within
    ``multireduce.placement-reuse``: an expression over held arrays reads some of their chunks, and a
    bare call over one of them may read them all."""
    client = client or default_client()
    if client is None:
        return
    reuse = setting("multireduce.placement-reuse")
    by_name: dict = {}
    for k, w in holder.items():
        by_name.setdefault(_array_of(k), {})[k] = w
    now = time.monotonic()
    with _seen_lock:
        for name, part in by_name.items():
            entry = _seen.pop((client.id, name), None)
            kept = entry[1] if entry is not None and reuse and now - entry[0] <= reuse else {}
            _seen[(client.id, name)] = (now, {**kept, **part})
        while len(_seen) > _SEEN_MAX:
            _seen.pop(next(iter(_seen)))


def recently_seen_chunks(keys, client=None) -> dict | None:
    """Chunk key -> worker for every one of ``keys`` (chunks of persisted arrays) from the placements
    recorded within ``multireduce.placement-reuse`` (``remember``, ``remember_chunks``); None where some
    key is not covered. A placement gone stale costs the caller a lookup, never a wrong value: a worker
    answers for chunks it no longer holds with a request to look them up."""
    reuse = setting("multireduce.placement-reuse")
    client = client or default_client()
    if not reuse or client is None:
        return None
    now = time.monotonic()
    found = {}
    with _seen_lock:
        for k in keys:
            entry = _seen.get((client.id, _array_of(k)))
            if entry is None or now - entry[0] > reuse or k not in entry[1]:
                return None
            found[k] = entry[1][k]
    return found


def recently_seen(x, client=None) -> dict | None:
    """``x``'s placement as recorded by ``remember`` within ``multireduce.placement-reuse`` (default
    10 s; 0: never), if it covers every chunk of ``x``; else None."""
    reuse = setting("multireduce.placement-reuse")
    client = client or default_client()
    if not reuse or client is None:
        return None
    with _seen_lock:
        entry = _seen.get((client.id, x.name))
    if entry is None or time.monotonic() - entry[0] > reuse:
        return None
    holder = entry[1]
    keys = chunk_keys(x)
    return holder if len(holder) == len(keys) and all(k in holder for k in keys) else None


def _placement_token(holder: dict, commutative: bool) -> str:
    """A token naming ``holder`` (chunk key -> worker): md5 of its items' repr in key order. dask's
    ``tokenize`` of the same list took 4.8 ms for 512 chunks (it normalizes every tuple), this 0.6 ms
    (2-core machine, 2026-11-26): it was most of the time a held result took to be made."""
    import hashlib

    try:
        items = sorted(holder.items())
    except TypeError:  # keys of mixed types (not a dask array's): order them by their text
        items = sorted(holder.items(), key=str)
    return hashlib.md5(repr((items, commutative)).encode(), usedforsecurity=False).hexdigest()


def grouping_for(x, commutative: bool, sources=None) -> Grouping | None:
    """The grouping the graph should use for ``x`` (None: the default contiguous groups), from where its
    chunks were seen last (``recently_seen``) or looked up now."""
    if not setting("multireduce.placement"):
        return None
    client = default_client()
    if client is None:
        return None
    if not is_persisted(x):
        return grouping_of_sources(x, commutative, client, sources)
    holder = recently_seen(x, client)
    if holder is None:
        holder = _looked_up(x, client)
        if holder:
            remember(x, holder, client)
    return by_worker(holder, commutative) if holder else None


def _workers(client) -> dict:
    """Address -> what the client's scheduler reported last of that worker (the client keeps its identity)."""
    return getattr(client, "_scheduler_identity", {}).get("workers") or client.scheduler_info()["workers"]


def worker_count(client) -> int:
    """How many workers the client's scheduler reported last (0 without a client)."""
    return len(_workers(client)) if client is not None else 0


def _threads(client, workers: dict | None = None) -> int:
    """The worker threads the client's scheduler reported last."""
    workers = _workers(client) if workers is None else workers
    return sum(int(w.get("nthreads", 1)) for w in workers.values()) or 1


def scan_keep_memory(x, workers: dict, pinned: bool = True) -> tuple[int, float] | None:
    """For a scan of ``x`` made by recipes, what ``multireduce.scan-keep-chunks`` lets it keep: (how many
    workers, the memory of the smallest: its GPU's for CuPy chunks, else its ``memory_limit``), memory
    infinite where the setting is True; None (make every chunk again) where it is False, or "auto" and
    the groups are not ``pinned`` to the workers holding what they read (Dask would place each kept
    chunk's scan task and may move the chunk to another worker for it, where making it again moves
    nothing) or some worker's memory is not reported (no limit set, no GPU monitoring)."""
    keep = setting("multireduce.scan-keep-chunks")
    if keep is False or not workers:
        return None
    if keep is True:
        return len(workers), math.inf
    if not pinned:
        return None
    on_device = type(x._meta).__module__.startswith("cupy")
    sizes = [_device_memory(w) if on_device else w.get("memory_limit") for w in workers.values()]
    if not all(isinstance(s, (int, float)) and s > 0 for s in sizes):
        return None
    return len(workers), float(min(sizes))


def _device_memory(worker: dict):
    """A worker's GPU memory in bytes as ``distributed`` reports it (NVML), or None."""
    return (worker.get("gpu") or {}).get("memory-total") or (worker.get("metrics") or {}).get("gpu-memory-total")


def grouping_of_sources(x, commutative: bool, client, sources=None) -> Grouping | None:
    """For an ``x`` made inside the graph: groups whose tasks make their own chunks (``recipes``), so the
    first stage is a few tasks per worker thread instead of one per chunk. An expression over persisted
    arrays (every chunk made from held chunks of one worker) is grouped by that worker, as a persisted
    array is; anything else in contiguous runs, ``multireduce.tasks-per-thread`` (default 2) per worker
    thread, placed by Dask. None (one task per chunk, as before) where the graph cannot be split so (see
    ``recipes.ChunkSources``) or there is nothing to gain (a chunk per thread or fewer). A scan's grouping
    also carries what it may keep (``scan_grouping``)."""
    from .recipes import ChunkSources

    n = len(chunk_keys(x))
    per_thread = setting("multireduce.tasks-per-thread")
    reported = _workers(client)
    tasks = max(1, math.ceil(_threads(client, reported) * per_thread))
    sources = sources if sources is not None else ChunkSources.of(x)
    if not sources.ok:
        return None
    if sources.held_only:
        found, chunk_worker, _ = next(sources_placements(sources, client))
        if chunk_worker is None:  # a chunk made from chunks held apart: Dask moves them, as it would
            return None
        split = by_worker(chunk_worker, commutative)
        split.holder = {f: found[f] for f in sources.futures}
    elif n <= tasks:
        return None
    else:
        split = even_groups(tasks)
    split.sources = sources
    return split


def sources_placements(sources, client):
    """Where the held chunks ``sources`` (``recipes.ChunkSources``) reads are, as (held chunk key -> worker,
    chunk key -> the one worker holding what it reads (``one_worker_each``), looked up now): the placement
    recorded last (``recently_seen_chunks``: no scheduler round trip, 1.6 ms on 4 x H200), passed over
    where it holds some chunk's inputs apart (it may be stale), then looked up (one ``who_has``, recorded)
    at most twice, the chunk workers None where they are held apart; (None, None, True) where some held
    chunk is in no worker's memory. A caller takes the next where the workers found a chunk it read gone
    or one of its workers left."""
    seen = recently_seen_chunks(sources.futures, client)
    where = None if seen is None else one_worker_each(sources, seen)
    if where is not None:
        yield seen, where, False
    for _ in range(2):
        found = holders_of(sources.futures, client)
        if found is None:
            yield None, None, True
            return
        remember_chunks(found, client)
        yield found, one_worker_each(sources, found), True


def one_worker_each(sources, found: dict) -> dict | None:
    """Chunk key -> the one worker holding every held chunk it reads (``found``: held key -> worker), or
    None where some chunk reads chunks held apart."""
    chunk_worker = {}
    for k in sources.keys:
        workers = {found[f] for f in sources.reads[k]}
        if len(workers) != 1:
            return None
        chunk_worker[k] = workers.pop()
    return chunk_worker


def kept_groups_at_least() -> int:
    """How many groups a scan that keeps the chunks of groups Dask places makes at least: distributed's
    scheduler places a task group that reads the outputs of fewer than
    ``distributed.scheduler.rootish-taskgroup-dependencies`` tasks (5 by default) as root tasks, on
    whichever thread is free, not where its input is (``Scheduler.is_rootish``), and the tasks picking a
    kept group's chunks would then carry the whole group to another worker."""
    import dask

    return max(1, int(dask.config.get("distributed.scheduler.rootish-taskgroup-dependencies", 5)))


def scan_grouping(x, groups: Grouping | None) -> Grouping | None:
    """``groups`` (``grouping_for``) as a scan's: where its groups make their chunks (``recipes``), with what
    ``multireduce.scan-keep-chunks`` lets the scan keep (``keep_memory``, read now, as the grouping is) and,
    where it keeps, a name that says so (``stage_token``: a graph that keeps differs from one that does not).
    Reductions never read the setting."""
    setting("multireduce.scan-keep-chunks")  # a bad value is named before any work, on every scan's path
    if groups is None or getattr(groups, "sources", None) is None:
        return groups
    client = default_client()
    keep = scan_keep_memory(x, _workers(client), pinned=getattr(groups, "holder", None) is not None)
    if keep is None:
        return groups
    runs, least = groups, kept_groups_at_least()
    if getattr(groups, "holder", None) is None and getattr(groups, "count", least) < least:
        runs = even_groups(least)

    def split(keys):
        return runs(keys)

    split.__dict__.update(groups.__dict__)
    split.__dict__.update(runs.__dict__)
    split.keep_memory = keep
    split.__qualname__ = f"{runs.__qualname__}-keep{keep}"
    return split
