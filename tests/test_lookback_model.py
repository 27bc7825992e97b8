"""CPU model of the deterministic look-back in kernels/scan.cuh (``look_back_fixed``): the same tile, window
and super-window indices, the same publications and the same fixed 32-lane trees, run under random
schedules with blocks dispatched in index order and few or many resident at once. Checks what the GPU
test cannot isolate: every read finds the status it expects from the tile it names, no schedule
deadlocks, each tile publishes at most once, and the prefixes equal the sequential fold for a
non-commutative operator (composition of affine maps mod a prime). The kernel itself runs in
tests/gpu/test_gpu_exact.py."""

from __future__ import annotations

import numpy as np
import pytest

from multireduce import kernels

WARP = 32
AGGREGATE, PREFIX, WINDOW = 1, 2, 3
P = 1_000_003


def op(f, g):
    """x -> a x + b, then g: associative, not commutative, exact."""
    return (f[0] * g[0] % P, (f[1] * g[0] + g[1]) % P)


IDENTITY = (1, 0)


def tree(values):
    """warp_reduce_ordered: lane l folds [l, l + 2o) from two halves in order; lane 0's value."""
    v = list(values) + [IDENTITY] * (WARP - len(values))
    offset = 1
    while offset < WARP:
        v = [op(v[lane], v[lane + offset]) if lane + offset < WARP else v[lane] for lane in range(WARP)]
        offset *= 2
    return v[0]


def tile_process(tile, tiles_per_row, aggregate, carry, words):
    """One tile's warp 0, as a generator: yields the (tile, expected status) pairs it waits for, returns
    its exclusive prefix. ``words`` is the descriptor array: tile -> (status, value)."""
    row_first = tile - tile % tiles_per_row
    p = tile - row_first
    in_window, window = p % WARP, p // WARP
    in_super, sup = window % WARP, window // WARP
    publishes = p + 1 < tiles_per_row
    window_end = in_window == WARP - 1
    super_end = window_end and in_super == WARP - 1

    def publish(status, value):
        assert tile not in words, f"tile {tile} publishes twice"
        words[tile] = (status, value)

    if not window_end and publishes:
        publish(AGGREGATE, aggregate)
    level0 = [(row_first + window * WARP + lane, AGGREGATE) for lane in range(in_window)]
    level1 = [(row_first + (sup * WARP + lane) * WARP + WARP - 1, WINDOW) for lane in range(in_super)]
    prefix = [(row_first + sup * WARP * WARP - 1, PREFIX)] if sup > 0 else []
    if window_end:
        yield level0
        e0 = tree([words[j][1] for j, _ in level0])
        if not super_end and publishes:
            publish(WINDOW, op(e0, aggregate))
        yield level1 + prefix
    else:
        yield level0 + level1 + prefix
        e0 = tree([words[j][1] for j, _ in level0])
    before_super = words[prefix[0][0]][1] if prefix else carry
    e1 = tree([words[j][1] for j, _ in level1])
    if super_end and publishes:
        publish(PREFIX, op(before_super, op(e1, op(e0, aggregate))))
    return carry if p == 0 else op(op(before_super, e1), e0)


class Words(dict):
    """The descriptor array; remembers which tiles have published since the scheduler last looked."""

    def __init__(self):
        super().__init__()
        self.new = []

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.new.append(key)


def run(aggregates, tiles_per_row, carries, resident, rng):
    """Blocks start in index order, at most ``resident`` at a time; any started block whose waits are met
    may take its next step (picked at random)."""
    n = len(aggregates)
    words = Words()
    results: dict = {}
    running: dict = {}
    unmet: dict = {}  # tile -> how many of its awaited tiles have not published
    watchers: dict = {}  # awaited tile -> tiles waiting for it
    ready: list = []
    started = 0

    def wait(t, keys):
        for j, status in keys:
            assert j < t, (t, j)
        missing = [j for j, _ in keys if j not in words]
        unmet[t] = len(missing)
        for j in missing:
            watchers.setdefault(j, []).append(t)
        if not missing:
            ready.append(t)

    def publications():
        for j in words.new:
            for t in watchers.pop(j, ()):
                unmet[t] -= 1
                if unmet[t] == 0:
                    ready.append(t)
        words.new.clear()

    pending_waits: dict = {}
    while len(results) < n:
        while started < n and len(running) < resident:
            gen = tile_process(started, tiles_per_row, aggregates[started], carries[started // tiles_per_row], words)
            running[started] = gen
            pending_waits[started] = next(gen)
            wait(started, pending_waits[started])
            started += 1
        publications()
        assert ready, f"deadlock: tiles {sorted(running)} wait; published {len(words)}"
        t = ready.pop(int(rng.integers(len(ready))))
        for j, status in pending_waits[t]:
            assert words[j][0] == status, (t, j, status, words[j][0])
        try:
            pending_waits[t] = running[t].send(None)
            wait(t, pending_waits[t])
        except StopIteration as done:
            results[t] = done.value
            del running[t], pending_waits[t]
        publications()
    return [results[t] for t in range(n)]


@pytest.mark.parametrize("tiles_per_row", [1, 2, 31, 32, 33, 1023, 1025, 2 * 1024 + 40])
@pytest.mark.parametrize("resident", [1, 7, 3000])
def test_fixed_lookback_folds_in_order_under_any_schedule(tiles_per_row, resident):
    rng = np.random.default_rng(tiles_per_row * 7 + resident)
    rows = 2 if tiles_per_row < 1024 else 1
    aggregates = [tuple(int(v) for v in rng.integers(1, P, 2)) for _ in range(rows * tiles_per_row)]
    carries = [tuple(int(v) for v in rng.integers(1, P, 2)) for _ in range(rows)]
    got = run(aggregates, tiles_per_row, carries, resident, rng)
    for r in range(rows):
        running = carries[r]
        for k in range(tiles_per_row):
            t = r * tiles_per_row + k
            assert got[t] == running, (r, k)
            running = op(running, aggregates[t])


def clustered_exclusive(aggregates, tiles_per_row, carries, cluster, resident, rng):
    """The tiles' exclusive prefixes as scan_lookback_clustered forms them (kernels/scan.cuh,
    cluster_before_tile): each row padded to whole clusters (a padding tile's aggregate is the identity),
    a cluster's aggregate its tiles' in order, the fixed look-back above over the row's clusters, then
    tile r of a cluster: (the fold before the cluster) op its earlier peers' aggregates; the row's carry
    itself before its first cluster."""
    rows = len(carries)
    padded, blocks, descriptors = kernels.lookback_geometry(rows, tiles_per_row, cluster)
    assert blocks == rows * padded and descriptors * cluster == blocks
    tiles = []
    for r in range(rows):
        tiles += aggregates[r * tiles_per_row:(r + 1) * tiles_per_row] + [IDENTITY] * (padded - tiles_per_row)
    clustered = []
    for c in range(descriptors):
        fold = tiles[c * cluster]
        for a in tiles[c * cluster + 1:(c + 1) * cluster]:
            fold = op(fold, a)
        clustered.append(fold)
    before_cluster = run(clustered, padded // cluster, carries, resident, rng)
    out = []
    for r in range(rows):
        for k in range(tiles_per_row):
            t = r * padded + k
            before = before_cluster[t // cluster]
            for a in tiles[t - t % cluster:t]:
                before = op(before, a)
            out.append(before)
    return out


@pytest.mark.parametrize("tiles_per_row", [16, 17, 8 * 32 + 3, 8 * 1024 + 9])
@pytest.mark.parametrize("resident", [1, 50])
def test_clustered_lookback_folds_in_order(tiles_per_row, resident):
    """Clusters of 8 tiles: every tile's exclusive prefix equals the sequential fold of the row before it,
    for a non-commutative operator, rows not a whole number of clusters included."""
    rng = np.random.default_rng(tiles_per_row + resident)
    rows = 2 if tiles_per_row < 1024 else 1
    aggregates = [tuple(int(v) for v in rng.integers(1, P, 2)) for _ in range(rows * tiles_per_row)]
    carries = [tuple(int(v) for v in rng.integers(1, P, 2)) for _ in range(rows)]
    got = clustered_exclusive(aggregates, tiles_per_row, carries, 8, resident, rng)
    for r in range(rows):
        running = carries[r]
        for k in range(tiles_per_row):
            assert got[r * tiles_per_row + k] == running, (r, k)
            running = op(running, aggregates[r * tiles_per_row + k])


def test_clusters_serve_the_fixed_four_byte_scans_on_sm90_only():
    """The policy's clusters: sm_90 alone, the fixed look-back of 4-byte scans alone, and the launch pads
    each row to whole clusters with one descriptor per cluster."""
    from multireduce.tuning import ScanShape, policy

    hopper = policy(9)
    assert hopper.scan_cluster == 8 and policy(8).scan_cluster == 0 and policy(10).scan_cluster == 0
    assert kernels.scan_cluster(hopper, 4, 4, 4, True) == 8
    assert kernels.scan_cluster(hopper, 4, 4, 4, False) == 0  # the free look-back keeps one per tile
    assert kernels.scan_cluster(hopper, 8, 8, 8, True) == 0  # float64: measured no faster
    assert kernels.scan_cluster(hopper, 4, 8, 4, True) == 0  # float32 accumulated in float64
    assert kernels.scan_cluster(hopper, 2, 4, 2, True) == 0  # float16 in float32: not measured
    assert kernels.scan_cluster(policy(8), 4, 4, 4, True) == 0
    shape = ScanShape(128, 61, 6)
    names = kernels.scan_names("float", "float", "float", "mr::Sum", hopper, shape, True, 8).names
    assert names["lookback_clustered"] == "mr::scan_lookback_clustered<float, float, float, mr::Sum, 128, 61, 6, 8>"
    assert "lookback_clustered" not in kernels.scan_names("float", "float", "float", "mr::Sum", hopper, shape,
                                                          True).names
    assert kernels.lookback_geometry(3, 17, 8) == (24, 72, 9)
    assert kernels.lookback_geometry(2, 16, 8) == (16, 32, 4)
    assert kernels.lookback_geometry(3, 17, 0) == (17, 51, 51)
    # the production list (prebuilt binaries, CI's nvcc check) holds the clustered scans of float32 sums
    exprs = {e for name, _, group in kernels.all_instantiations(hopper, candidates=False) if name == "sum"
             for e in group}
    assert "mr::scan_lookback_clustered<float, float, float, mr::Sum, 128, 61, 6, 8>" in exprs
    assert not any("clustered" in e and ("double" in e or "half" in e) for e in exprs)
