"""segment_reduce / segment_scan against per-segment NumPy references: every built-in operator, a
non-commutative user operator, empty segments, segments straddling Dask chunks."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import multireduce as mr

from .helpers import matmul2x2_scalar, matmul_operator, random_matrices, sequential_fold, sequential_scan

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _offsets(rng, n, m):
    """m ascending start offsets in [0, n], with repeats (empty segments) and n itself now and then."""
    o = np.sort(rng.integers(0, n + 1, m))
    if m > 2:
        o[1] = o[2]  # an empty segment
    return o


def _ident(opname, dtype):
    from multireduce.operators import get_operator

    return get_operator(opname).identity(np.dtype(dtype))


@pytest.mark.parametrize("chunks", [None, 1, 7, 100, 1000])
@pytest.mark.parametrize("opname", list(UFUNC))
@pytest.mark.parametrize("n,m", [(0, 0), (0, 3), (1, 1), (31, 5), (1025, 1), (1025, 300), (5000, 2000)])
def test_segment_reduce_matches_per_segment_reference(n, m, opname, chunks):
    if chunks == 1 and n > 1100:
        pytest.skip("one-element chunks: covered at n <= 1025, thousands of tasks here")
    rng = np.random.default_rng(n + m)
    x = rng.integers(-50, 50, n).astype(np.int32) if opname != "prod" else rng.choice([-1, 1, 2], n).astype(np.int32)
    offsets = _offsets(rng, n, m)
    out_dtype = np.asarray(UFUNC[opname].reduce(np.ones(1, np.int32))).dtype
    ends = np.append(offsets[1:], n)
    ref = np.array([UFUNC[opname].reduce(x[s:e], dtype=out_dtype) if e > s else _ident(opname, out_dtype)
                    for s, e in zip(offsets, ends)], dtype=out_dtype)
    data = x if chunks is None else da.from_array(x, chunks=chunks or 1)
    got = mr.segment_reduce(data, offsets, opname)
    if chunks is not None:
        assert isinstance(got, da.Array)
        got = got.compute()
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == out_dtype
    # non-empty segments agree with NumPy's own reduceat
    if n and m:
        inside = offsets < n
        keep = (offsets < ends)[inside]
        want = UFUNC[opname].reduceat(x, offsets[inside], dtype=out_dtype)
        np.testing.assert_array_equal(got[inside][keep], want[keep])


@pytest.mark.parametrize("chunks", [None, 3, 64])
def test_segments_non_commutative_user_operator(chunks):
    op = matmul_operator()
    rng = np.random.default_rng(3)
    x = random_matrices(rng, 700)
    offsets = _offsets(rng, 700, 40)
    data = x if chunks is None else da.from_array(x, chunks=chunks)
    got = mr.segment_reduce(data, offsets, op)
    got = got.compute() if chunks is not None else got
    ends = np.append(offsets[1:], x.size)
    ref = [sequential_fold(x[s:e]) for s, e in zip(offsets, ends)]
    assert [int(v) for v in got] == ref
    scanned = mr.segment_scan(data, offsets, op)
    scanned = scanned.compute() if chunks is not None else scanned
    starts = np.unique(np.concatenate([[0], offsets[offsets < x.size]]))
    bounds = np.append(starts, x.size)
    ref_scan = np.concatenate([sequential_scan(x[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])
    np.testing.assert_array_equal(scanned, ref_scan)


@pytest.mark.parametrize("chunks", [None, 1, 5, 128])
@pytest.mark.parametrize("opname", list(UFUNC))
@pytest.mark.parametrize("n,m", [(0, 0), (1, 0), (33, 4), (1025, 40), (3000, 1)])
def test_segment_scan_restarts_at_every_offset(n, m, opname, chunks):
    if chunks == 1 and n > 1100:
        pytest.skip("one-element chunks: covered at n <= 1025, thousands of tasks here")
    rng = np.random.default_rng(n * 7 + m)
    x = rng.uniform(-1, 1, n) if opname != "prod" else rng.uniform(0.9, 1.1, n)
    offsets = _offsets(rng, n, m)
    starts = np.unique(np.concatenate([[0], offsets[offsets < n]])) if n else np.zeros(0, np.int64)
    bounds = np.append(starts, n)
    acc = {"sum": np.cumsum, "prod": np.cumprod, "min": np.minimum.accumulate, "max": np.maximum.accumulate}[opname]
    ref = np.concatenate([acc(x[s:e]) for s, e in zip(bounds[:-1], bounds[1:])] or [np.zeros(0)])
    data = x if chunks is None else da.from_array(x, chunks=chunks)
    got = mr.segment_scan(data, offsets, opname)
    got = got.compute() if chunks is not None else got
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_segment_arguments_are_checked():
    x = np.arange(10.0)
    with pytest.raises(ValueError, match="'offsets'.*ascending"):
        mr.segment_reduce(x, [3, 1])
    with pytest.raises(ValueError, match=r"'offsets'.*\[0, 10\]"):
        mr.segment_reduce(x, [0, 11])
    with pytest.raises(TypeError, match="'offsets'"):
        mr.segment_reduce(x, [0.5, 2.0])
    with pytest.raises(ValueError, match="'x' must be 1-D"):
        mr.segment_scan(np.ones((2, 2)), [0])
    with pytest.raises(ValueError, match="operator"):
        mr.segment_reduce(x, [0], op="nope")
    offsets = np.array([0, 4])
    mr.segment_reduce(x, offsets)
    np.testing.assert_array_equal(offsets, [0, 4])


# ------------------------------------------------------------------------------------------------
# The GPU kernels' decomposition (kernels/segment.cuh), replayed on the CPU: tiles of block * items
# elements, each thread walking the heads among its items, the block's segmented exclusive scan, each
# tile's head finished by the fix-up's scan over tiles. Small tiles so that segments cross threads and
# tiles in every way; the GPU tests run the kernels themselves.
# ------------------------------------------------------------------------------------------------
def _seg_combine(a, b, op):
    return (a[0] or b[0], b[1] if b[0] else op(a[1], b[1]))


def _exclusive_seg_scan(pairs, op, identity):
    out, run = [], (False, identity)
    for p in pairs:
        out.append(run)
        run = _seg_combine(run, p, op)
    return out, run


def _replay_carry_pass(pairs, op, identity, seed, block, items):
    """segment_carry_totals then segment_carry_apply: the pair entering each tile (seed before tile 0),
    from groups of block * items consecutive tiles, each thread folding ``items`` of them, each block
    folding the totals of the groups before it ``block`` at a time; the kernels' combination order."""
    group = block * items
    groups = -(-len(pairs) // group)

    def thread_folds(g):
        folds = []
        for t in range(block):
            mine = (False, identity)
            for j in range(g * group + t * items, min(g * group + (t + 1) * items, len(pairs))):
                mine = _seg_combine(mine, pairs[j], op)
            folds.append(mine)
        return folds

    totals = [_exclusive_seg_scan(thread_folds(g), op, identity)[1] for g in range(groups - 1)]
    entering = []
    for g in range(groups):
        group_carry = (False, seed)
        for base in range(0, g, block):  # a round: one group total per thread, identities past g
            chunk = totals[base:min(base + block, g)]
            chunk += [(False, identity)] * (block - len(chunk))
            group_carry = _seg_combine(group_carry, _exclusive_seg_scan(chunk, op, identity)[1], op)
        befores, _ = _exclusive_seg_scan(thread_folds(g), op, identity)
        for t, before in enumerate(befores):
            carry = _seg_combine(group_carry, before, op)
            for j in range(g * group + t * items, min(g * group + (t + 1) * items, len(pairs))):
                entering.append(carry)
                carry = _seg_combine(carry, pairs[j], op)
    assert len(entering) == len(pairs)
    return entering


def _replay_segment_kernels(x, offsets, op, identity, block, items, carry_block=2, carry_items=2):
    n, m = len(x), len(offsets)
    out = [None] * m
    if m == 0 or n == 0:
        return [identity] * m
    tile = block * items
    tiles = -(-n // tile)
    tile_first = [int(np.searchsorted(offsets, b * tile, side="left")) for b in range(tiles + 1)]
    assert tile_first == [int(np.sum(offsets < b * tile)) for b in range(tiles + 1)]
    tile_pairs, heads = [], []
    for b in range(tiles):
        threads = []
        for t in range(block):
            a = b * tile + t * items
            lo, hi = tile_first[b], tile_first[b + 1]
            s = lo + int(np.searchsorted(offsets[lo:hi], a, side="left")) - 1
            nxt = offsets[s + 1] if s + 1 < m else n
            acc, closed, first = identity, False, None

            def close(seg, v, state):
                if not state["closed"]:
                    state["closed"], state["first"] = True, (seg, v)
                elif seg >= 0:
                    assert out[seg] is None, "a segment written twice"
                    out[seg] = v

            state = {"closed": closed, "first": first}
            for i in range(a, min(a + items, n)):
                if nxt <= i:
                    close(s, acc, state)
                    acc = identity
                    s += 1
                    nxt = offsets[s + 1] if s + 1 < m else n
                    while nxt <= i:
                        out[s] = identity
                        s += 1
                        nxt = offsets[s + 1] if s + 1 < m else n
                acc = op(acc, x[i])
            if a < n <= a + items:
                close(s, acc, state)
                acc = identity
                for k in range(s + 1, m):
                    out[k] = identity
            threads.append((state["closed"], acc, state["first"]))
        before, total = _exclusive_seg_scan([(c, v) for c, v, _ in threads], op, identity)
        head = (-1, identity)
        for (c, _, first), (flag, carry) in zip(threads, before):
            if c:
                seg, v = first[0], op(carry, first[1])
                if flag or tiles == 1:
                    if seg >= 0:
                        assert out[seg] is None, "a segment written twice"
                        out[seg] = v
                else:
                    assert head == (-1, identity), "two heads in one tile"
                    head = (seg, v)
        tile_pairs.append(total)
        heads.append(head)
    if tiles > 1:
        carries = _replay_carry_pass(tile_pairs, op, identity, identity, carry_block, carry_items)
        assert carries == _exclusive_seg_scan(tile_pairs, op, identity)[0]
        for (seg, v), (_, carry) in zip(heads, carries):
            if seg >= 0:
                assert out[seg] is None, "a segment written twice"
                out[seg] = op(carry, v)
    assert all(o is not None for o in out), "a segment never written"
    return out


def test_the_replays_scalar_operator_is_the_registered_one():
    """The replays below combine with ``matmul2x2_scalar``: bit for bit the operator's own ``cpu``."""
    op = matmul_operator()
    rng = np.random.default_rng(11)
    a, b = random_matrices(rng, 500), random_matrices(rng, 500)
    a[:2], b[1:3] = np.uint64(2**64 - 1), np.uint64(2**64 - 1)  # every entry 0xFFFF: the widest products
    assert [matmul2x2_scalar(int(p), int(q)) for p, q in zip(a, b)] == op.combine(a, b).tolist()


@pytest.mark.parametrize("block,items,carry_block,carry_items", [(1, 1, 1, 1), (2, 3, 2, 2), (4, 2, 2, 3), (8, 4, 4, 1),
                                                                 (1, 1, 3, 2), (1, 2, 8, 8)])
@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (31, 5), (33, 40), (97, 12), (200, 3), (257, 257)])
def test_kernel_decomposition_replayed_on_cpu(n, m, block, items, carry_block, carry_items):
    rng = np.random.default_rng(n * 31 + m + block)
    op = matmul_operator()  # non-commutative: any reordering shows
    x = random_matrices(rng, n)
    for offsets in (_offsets(rng, n, m), np.sort(rng.integers(n // 2, n + 1, m)), np.full(m, n // 3),
                    np.arange(min(m, n + 1))):
        offsets = offsets.astype(np.int64)
        got = _replay_segment_kernels(x, offsets, matmul2x2_scalar, int(op.identity(np.dtype(np.uint64))), block,
                                      items, carry_block, carry_items)
        ends = np.append(offsets[1:], n)
        assert got == [sequential_fold(x[s:e]) for s, e in zip(offsets, ends)]


@pytest.mark.parametrize("chunks", [None, 1, 4, 64])
@pytest.mark.parametrize("opname,fill", [("nansum", 0.0), ("nanprod", 1.0), ("nanmin", np.inf), ("nanmax", -np.inf)])
def test_nan_operators_in_segments_read_nan_as_their_identity(opname, fill, chunks):
    """The nan-family through segment_reduce / segment_scan: NaN counts as the identity, so the answer is
    the plain operator's over the data with NaN replaced (an all-NaN segment gives the identity)."""
    rng = np.random.default_rng(len(opname) + (chunks or 0))
    n = 257
    x = rng.uniform(0.5, 1.5, n) if opname == "nanprod" else rng.standard_normal(n)
    x[rng.random(n) < 0.3] = np.nan
    x[40:60] = np.nan  # at least one all-NaN segment below
    offsets = np.array([0, 3, 40, 50, 60, 60, 200, n])
    before = x.copy()
    plain = opname[3:]
    filled = np.where(np.isnan(x), fill, x)
    want_reduce = mr.segment_reduce(filled, offsets, plain)
    want_scan = mr.segment_scan(filled, offsets, plain)
    assert not np.isnan(want_reduce).any() and want_reduce[3] == fill
    data = x if chunks is None else da.from_array(x, chunks=chunks)
    got_reduce, got_scan = mr.segment_reduce(data, offsets, opname), mr.segment_scan(data, offsets, opname)
    if chunks is not None:
        got_reduce, got_scan = got_reduce.compute(), got_scan.compute()
    np.testing.assert_allclose(got_reduce, want_reduce, rtol=1e-12)
    np.testing.assert_allclose(got_scan, want_scan, rtol=1e-12)
    np.testing.assert_array_equal(x, before)


# ------------------------------------------------------------------------------------------------
# The segmented scan kernel (segment_scan_tiles), replayed on the CPU: the same tiles, head masks and
# block scan, and the decoupled look-back run under random interleavings of the tiles (a window of W
# predecessors instead of 32), so that every mix of NONE / AGGREGATE / PREFIX a tile can read is met.
# ------------------------------------------------------------------------------------------------
NONE_, AGGREGATE_, PREFIX_ = 0, 1, 2


def _thread_heads(offsets, lo, hi, a, valid):
    """The kernel's head mask: lower bound of a in offsets[lo:hi], then each distinct offset below
    a + valid (repeats skipped by one upper-bound search)."""
    import bisect

    mask = 0
    j = bisect.bisect_left(offsets, a, lo, hi)
    while j < hi:
        o = offsets[j]
        if o >= a + valid:
            break
        mask |= 1 << (o - a)
        j = bisect.bisect_right(offsets, o, j + 1, hi) if j + 1 < hi and offsets[j + 1] == o else j + 1
    return mask


def _replay_segment_scan(x, offsets, op, identity, carry, block, items, window, rng, lookback=True, carry_block=2,
                         carry_items=2):
    n = len(x)
    tile = block * items
    tiles = -(-n // tile)
    offsets = [int(o) for o in offsets]
    tile_first = [int(np.searchsorted(offsets, b * tile, side="left")) for b in range(tiles + 1)]
    seed = identity if carry is None else carry
    words = [(NONE_, None)] * tiles
    out = [None] * n

    def look_back(b):
        exclusive = identity
        newest = b - 1
        while True:
            lanes = [newest - lane for lane in range(window)]
            read = [(PREFIX_, seed) if j < 0 else words[j] for j in lanes]
            while True:
                prefix = [lane for lane, (s, _) in enumerate(read) if s == PREFIX_]
                stop = prefix[0] if prefix else window - 1
                missing = [lane for lane in range(stop + 1) if read[lane][0] == NONE_]
                if not missing:
                    break
                yield  # nanosleep; then only the missing lanes poll again
                for lane in missing:
                    read[lane] = words[lanes[lane]]
            fold = identity
            for lane in range(stop, -1, -1):  # oldest on the left
                fold = op(fold, read[lane][1])
            exclusive = op(fold, exclusive)
            if prefix:
                return exclusive
            newest -= window

    def tile_pass_one(b):
        """Per thread (first element, valid items, heads, fold since its last head); the block's
        exclusive pairs; the tile's pair."""
        threads = []
        for t in range(block):
            a = b * tile + t * items
            valid = max(0, min(items, n - a))
            heads = _thread_heads(offsets, tile_first[b], tile_first[b + 1], a, valid)
            if a == 0 and carry is None and valid:
                heads |= 1
            acc = identity
            for k in range(valid):
                acc = x[a + k] if heads >> k & 1 else op(acc, x[a + k])
            threads.append((a, valid, heads, acc))
        befores, total = _exclusive_seg_scan([(h != 0, acc) for _, _, h, acc in threads], op, identity)
        return threads, befores, total

    def tile_pass_two(threads, befores, before_tile):
        for t, ((a, valid, heads, _), (bflag, bvalue)) in enumerate(zip(threads, befores)):
            running = bvalue if bflag else (before_tile if t == 0 else op(before_tile, bvalue))
            for k in range(valid):
                running = x[a + k] if heads >> k & 1 else op(running, x[a + k])
                assert out[a + k] is None
                out[a + k] = running

    if not lookback:  # the deterministic form: tile pairs, their exclusive scan from (no head, carry), rescan
        passes = [tile_pass_one(b) for b in range(tiles)]
        entering = _replay_carry_pass([total for _, _, total in passes], op, identity, seed, carry_block, carry_items)
        entering[0] = (False, seed)  # the rescan takes the seed itself into tile 0: no identity folded in
        for (threads, befores, _), (_, value) in zip(passes, entering):
            tile_pass_two(threads, befores, value)
        assert all(o is not None for o in out)
        return out

    def tile_program(b):
        threads, befores, (flag, value) = tile_pass_one(b)
        later = b + 1 < tiles
        opened = not threads[0][2] & 1
        before_tile = seed
        if b > 0:
            if later:
                words[b] = (PREFIX_ if flag else AGGREGATE_, value)
                yield
            before_tile = (yield from look_back(b)) if opened else identity
        if not flag and later:
            words[b] = (PREFIX_, op(before_tile, value))
        if b == 0 and flag and later:
            words[b] = (PREFIX_, value)
        yield
        tile_pass_two(threads, befores, before_tile)

    # blocks start in index order; any started one may run next
    programs, started = [], 0
    while started < tiles or programs:
        if started < tiles and (not programs or rng.random() < 0.5):
            programs.append(tile_program(started))
            started += 1
        i = int(rng.integers(len(programs)))
        try:
            next(programs[i])
        except StopIteration:
            programs.pop(i)
    assert all(o is not None for o in out)
    return out


def _segment_scan_reference(x, offsets, carry, mul, identity):
    n = len(x)
    heads = sorted({int(o) for o in offsets if o < n} | ({0} if carry is None else set()))
    out, run = [], None
    head_set = set(heads)
    for i in range(n):
        if i in head_set:
            run = x[i]
        else:
            run = mul(identity if carry is None and run is None else (carry if run is None else run), x[i])
        out.append(run)
    return out


@pytest.mark.parametrize("block,items,window,lookback,carry_block,carry_items", [
    (1, 1, 1, True, 2, 2), (2, 3, 2, True, 2, 2), (4, 2, 3, True, 2, 2), (4, 4, 32, True, 2, 2),
    (1, 1, 0, False, 1, 1), (1, 1, 0, False, 2, 3), (4, 2, 0, False, 2, 2), (1, 2, 0, False, 8, 8)])
@pytest.mark.parametrize("n", [1, 31, 97, 257])
def test_segment_scan_kernel_replayed_on_cpu(n, block, items, window, lookback, carry_block, carry_items):
    rng = np.random.default_rng(n * 13 + block + window)
    op = matmul_operator()  # non-commutative: any reordering shows
    x = [int(v) for v in random_matrices(rng, n)]
    mul = matmul2x2_scalar
    identity = int(op.identity(np.dtype(np.uint64)))
    layouts = (np.sort(rng.integers(0, n + 1, max(1, n // 5))), np.zeros(0, np.int64), np.array([n // 2] * 7 + [n] * 3),
               np.arange(n), np.sort(rng.integers(n // 2, n + 1, 4)))
    for offsets in layouts:
        for carry in (None, x[0]):
            got = _replay_segment_scan(x, offsets, mul, identity, carry, block, items, window, rng, lookback,
                                       carry_block, carry_items)
            assert got == _segment_scan_reference(x, offsets, carry, mul, identity), (list(offsets), carry)


def test_replayed_head_masks_skip_repeats_and_stay_inside_the_items():
    offsets = [0, 3, 3, 3, 3, 5, 9, 9, 12, 12]
    assert _thread_heads(offsets, 0, len(offsets), 0, 8) == (1 << 0) | (1 << 3) | (1 << 5)
    assert _thread_heads(offsets, 0, len(offsets), 8, 4) == 1 << 1  # 9 - 8; 12 is past the items
    assert _thread_heads(offsets, 0, len(offsets), 10, 2) == 0
    assert _thread_heads(offsets, 0, len(offsets), 12, 1) == 1


def _closing_by_predicated_stores(items, mask, before):
    """segment_reduce_tiles' general closing code for one lane (a head mask without repeats), replayed on
    expressions: (the fold after the last head, the first closure, the closures stored by index)."""
    acc, j, first, stored = "acc", 0, None, {}
    for k in range(items):
        head = (mask >> k) & 1
        if head and j > 0:
            stored[before + j] = acc
        first = acc if head and j == 0 else first
        j += head
        acc = f"e{k}" if head else f"({acc}.e{k})"
    return acc, first, stored


def _closing_at_heads(items, mask, before, heads):
    """The same lane through fold_at_heads<ITEMS, HEADS>: each element position compared with the lane's
    first HEADS head positions, the closures kept, the second one stored afterwards."""
    at, rest = [], mask
    for _ in range(heads):
        at.append((rest & -rest).bit_length() - 1 if rest else items)
        rest &= rest - 1
    acc, closes = "acc", ["acc"] * heads
    for k in range(items):
        hit = [k == a for a in at]
        closes = [acc if h else c for h, c in zip(hit, closes)]
        acc = f"e{k}" if any(hit) else f"({acc}.e{k})"
    lane_heads = bin(mask).count("1")
    stored = {before + 1: closes[1]} if lane_heads == 2 else {}
    return acc, closes[0] if lane_heads else None, stored


@pytest.mark.parametrize("items", [16, 32])
def test_closing_at_heads_folds_as_the_predicated_stores(items):
    """Every lane mask of at most two heads, through each fast path that admits it: the same fold after
    the last head, the same first closure and the same closure stored, in the same order of operations."""
    masks = [0] + [1 << a for a in range(items)] + [(1 << a) | (1 << b) for a in range(items) for b in range(a + 1, items)]
    for mask in masks:
        want = _closing_by_predicated_stores(items, mask, before=6)
        for heads in (1, 2) if bin(mask).count("1") <= 1 else (2,):
            assert _closing_at_heads(items, mask, 6, heads) == want, (mask, heads)


def test_scan_instantiations_fit_the_kernel_shape():
    """Every built-in scan instantiation: a thread's heads fit one 32-bit mask and its items are whole
    16-byte vectors in and out (the kernel's static_asserts, checked here without nvcc)."""
    import re

    from multireduce import dtypes as _dt
    from multireduce.backends import cupy_segment

    by_name = {v: k for k, v in _dt.CUDA_TYPE_NAMES.items()}
    scans = [e for _, exprs in cupy_segment.all_segment_instantiations() for e in exprs if "segment_scan_tiles" in e]
    assert len(scans) >= 4 * 8
    for e in scans:
        T, _, O, _, block, items = re.match(r"mr::segment_scan_tiles<(.+), (.+), (.+), (.+), (\d+), (\d+), (?:true|false), "
                                            r"mr::kScan\w+>", e).groups()
        items = int(items)
        assert items <= 32 and int(block) % 32 == 0, e
        assert (items * by_name[T].itemsize) % 16 == 0 and (items * by_name[O].itemsize) % 16 == 0, e


def test_segment_scan_form_follows_the_lookback_environment(monkeypatch):
    """The deterministic three-pass form where asked (argument, or MULTIREDUCE_SCAN_LOOKBACK=fixed); the
    one pass otherwise, "auto" included; a bad value names the variable."""
    from multireduce.backends import cupy_segment
    from multireduce.operators import get_operator

    LOOKBACK_ENV = cupy_segment.LOOKBACK_ENV
    monkeypatch.delenv(LOOKBACK_ENV, raising=False)
    assert cupy_segment.deterministic_scan() is False
    assert cupy_segment.deterministic_scan(True) is True
    for value, want in (("fixed", True), (" Fixed ", True), ("free", False), ("auto", False), ("", False)):
        monkeypatch.setenv(LOOKBACK_ENV, value)
        assert cupy_segment.deterministic_scan() is want, value
        assert cupy_segment.deterministic_scan(False) is False
    monkeypatch.setenv(LOOKBACK_ENV, "sometimes")
    with pytest.raises(ValueError, match=LOOKBACK_ENV):
        cupy_segment.deterministic_scan()
    names = cupy_segment.scan_names(np.float32, np.float32, np.float32, get_operator("sum"), deterministic=True)
    assert set(names) == {"starts", "check", "totals", "rescan", "group_totals", "carry_apply"}
    assert set(cupy_segment.scan_names(np.float32, np.float32, np.float32, get_operator("sum"))) == {
        "starts", "check", "scan"}


# ------------------------------------------------------------------------------------------------
# WarpTransposeLoad (kernels/segment.cuh), replayed on bytes: a warp's part of the tile loaded by
# consecutive lanes (16-byte vectors, or scalars in the partial / misaligned case) into the padded
# per-warp buffer, then each thread's run read back. Every thread must get its ITEMS consecutive
# elements, the buffer must hold everything, and no shared access of a warp may conflict on a bank.
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_warp_transpose_load_replayed_on_bytes(itemsize):
    from multireduce.backends import cupy_segment

    warp = 32
    items = cupy_segment.items_per_thread(itemsize)
    words = items * itemsize // 4  # kWords
    assert items * itemsize % 16 == 0 and warp % words == 0  # the kernel's static_asserts
    shared_words = warp * words + words  # kSharedWords

    def padded(word):
        return word + word // warp

    data = np.random.default_rng(itemsize).integers(0, 256, warp * items * itemsize, dtype=np.uint8)
    want = [data[t * items * itemsize:(t + 1) * items * itemsize] for t in range(warp)]
    for vectors in (True, False):
        buffer = np.full(shared_words * 4, -1, dtype=np.int64)  # bytes; -1: never written
        if vectors:
            for q in range(words // 4):
                at = [padded(4 * (q * warp + lane)) for lane in range(warp)]
                for j in range(4):
                    assert len({(w + j) % warp for w in at}) == warp, "bank conflict writing vectors"
                for lane, w in enumerate(at):
                    v = q * warp + lane  # the lane's 16 bytes of global memory
                    buffer[4 * w:4 * w + 16] = data[16 * v:16 * v + 16]
        else:
            for k in range(items):
                for lane in range(warp):
                    e = k * warp + lane
                    src = data[e * itemsize:(e + 1) * itemsize]
                    if itemsize >= 4:
                        for j in range(itemsize // 4):
                            w = padded(e * itemsize // 4 + j)
                            buffer[4 * w:4 * w + 4] = src[4 * j:4 * j + 4]
                    else:
                        byte = e * itemsize
                        at = 4 * padded(byte // 4) + byte % 4
                        buffer[at:at + itemsize] = src
        assert (buffer >= 0).sum() == warp * words * 4, "elements overlap or fall outside the buffer"
        runs = [padded(lane * words) for lane in range(warp)]
        for k in range(words):
            assert len({(r + k) % warp for r in runs}) == warp, "bank conflict reading runs"
        for lane, r in enumerate(runs):
            assert padded(lane * words + words - 1) == r + words - 1  # a run never straddles a pad
            np.testing.assert_array_equal(buffer[4 * r:4 * (r + words)], want[lane])
