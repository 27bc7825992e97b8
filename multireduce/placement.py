"""Where chunks live: group a persisted array's chunks by the worker (one GPU each) that holds them.

With such groups the reduction graph has one ``partial`` task per worker and the scan graph one
``totals`` task per worker; every such task depends only on chunks held by one worker, so the
scheduler's data locality runs it there and only partial results cross the network. Nothing is
pinned: if a worker dies, Dask recomputes its chunks elsewhere and the same graph still completes.

Placement is known only for arrays persisted through a ``distributed.Client`` (their graph holds
futures); for lazy arrays the default contiguous groups apply and Dask places the tasks.
Set ``dask.config.set({"multireduce.placement": False})`` to turn the lookup off.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import dask

from .graph import Grouping


def default_client():
    """The current ``distributed`` client, or None."""
    try:
        from distributed import default_client as current

        return current()
    except (ImportError, ValueError):
        return None


def chunk_keys(x) -> list:
    from dask.core import flatten

    return list(flatten(x.__dask_keys__()))


def is_persisted(x) -> bool:
    """True when every chunk of ``x`` is a distributed future (``client.persist`` / ``x.persist()``)."""
    try:
        from distributed import Future
    except ImportError:
        return False
    # a persisted array's own layer holds its futures; looking only there keeps this O(chunks)
    layer = getattr(x.__dask_graph__(), "layers", {}).get(x.name)
    if layer is None:
        return False
    keys = chunk_keys(x)
    return bool(keys) and all(isinstance(layer.get(k), Future) for k in keys)


def holders(x, client=None) -> dict[Hashable, str] | None:
    """Chunk key -> address of a worker holding it, for a persisted ``x``; None when unknown."""
    if not dask.config.get("multireduce.placement", True) or not is_persisted(x):
        return None
    client = client or default_client()
    if client is None:
        return None
    keys = chunk_keys(x)
    graph = x.__dask_graph__()
    who = client.who_has([graph[k] for k in keys])  # who_has takes futures, not bare keys
    found = {k: sorted(who.get(k) or who.get(str(k)) or ()) for k in keys}
    if any(not w for w in found.values()):
        return None  # some chunk is not in memory yet: let Dask place the work
    return {k: w[0] for k, w in found.items()}


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

    from dask.base import tokenize

    split.__qualname__ = f"by_worker-{tokenize(sorted(holder.items(), key=str), commutative)}"
    split.holder = holder  # the graph pins each group's task to this worker (as a preference)
    return split


def grouping_for(x, commutative: bool) -> Grouping | None:
    """The grouping the graph should use for ``x`` (None: the default contiguous groups)."""
    holder = holders(x)
    return by_worker(holder, commutative) if holder else None
