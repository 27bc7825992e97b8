"""Segmented reduction and scan of one 1-D CuPy array on its GPU: the element-balanced kernels of
``kernels/segment.cuh`` (reduction: tile starts, tiles, the two-launch carry pass between tiles; scan:
tile starts, one look-back pass, or the deterministic tile totals, carry pass and rescan), one module per operator (user operators too) and element / accumulator (/ output) type,
as ``kernels.get_kernels`` does for the reductions.

The launcher keeps everything on the device: offsets may be a CuPy array (no host round trip for 10^7
segments); NumPy offsets are copied over once.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

try:
    import cupy
except ImportError:  # the kernel names and the nvcc check (CI, no GPU) need no CuPy
    cupy = None

from .. import dtypes as _dt
from .. import kernels as _kernels
from ..operators import Operator
from ..tuning import policy

_POLICY = policy(9)  # launch constants (template arguments: one set for every GPU, as tuning.policy says)
BLOCK = _POLICY.segment_block  # threads per tile
CARRY_BLOCK = _POLICY.segment_carry_block  # the carry pass between tiles: threads per block
CARRY_ITEMS = _POLICY.segment_carry_items  # consecutive tiles per carry thread: 1024 tiles (2^23 float32
#   elements) per block, so 2^28 float32 elements take 32 blocks and no thread waits on a long serial walk
SEARCH_BLOCK = _POLICY.segment_search_block
#: The scan's stores: through a per-warp shared buffer, coalesced (True), or straight from each thread's
#: registers (False); bench_segments times both ("multireduce kernels" / "... direct stores").
STAGED_STORES = True
#: cupy_backend.LOOKBACK_ENV (which imports CuPy; this module must import without it)
LOOKBACK_ENV = "MULTIREDUCE_SCAN_LOOKBACK"


def items_per_thread(itemsize: int) -> int:
    """Elements per thread: 128 bytes (eight 16-byte loads in flight) for 4- and 8-byte types; 32 for the
    narrow ones, whose per-element head checks, not loads, would otherwise dominate the unrolled code."""
    return min(_POLICY.segment_max_items, _POLICY.segment_tile_bytes // itemsize)


def tile_elements(itemsize: int) -> int:
    return BLOCK * items_per_thread(itemsize)


def tile_count(n: int, itemsize: int) -> int:
    return -(-n // tile_elements(itemsize))


def segment_names(dtype, acc, op: Operator) -> dict[str, str]:
    """The kernels for element dtype ``dtype`` and accumulator ``acc``, by role."""
    dtype, acc = np.dtype(dtype), np.dtype(acc)
    T, A, F = _kernels.ctype(dtype), _kernels.ctype(acc), op.cuda_functor
    return {
        "starts": "mr::segment_tile_starts",
        "check": "mr::segment_check_offsets",
        "tiles": f"mr::segment_reduce_tiles<{T}, {A}, {F}, {BLOCK}, {items_per_thread(dtype.itemsize)}>",
        **carry_names(A, F, heads=True),
    }


def carry_names(A: str, F: str, heads: bool) -> dict[str, str]:
    """The carry pass between tiles (accumulator ctype ``A``, functor ``F``): finishing the reduction's
    tile heads (``heads``) or writing the deterministic scan's entering values."""
    return {"group_totals": f"mr::segment_carry_totals<{A}, {F}, {CARRY_BLOCK}, {CARRY_ITEMS}>",
            "carry_apply": f"mr::segment_carry_apply<{A}, {F}, {CARRY_BLOCK}, {CARRY_ITEMS}, "
                           f"{'true' if heads else 'false'}>"}


def carry_groups(tiles: int) -> int:
    """Blocks of the carry pass (each CARRY_BLOCK x CARRY_ITEMS consecutive tiles)."""
    return -(-tiles // (CARRY_BLOCK * CARRY_ITEMS))


def scan_names(dtype, acc, out, op: Operator, staged: bool | None = None, deterministic: bool = False) -> dict[str, str]:
    """The segmented scan's kernels for element dtype ``dtype``, accumulator ``acc`` and output ``out``
    (``staged``: the store path, STAGED_STORES unless given; ``deterministic``: the three-pass form's
    kernels instead of the one-pass look-back)."""
    dtype, acc, out = np.dtype(dtype), np.dtype(acc), np.dtype(out)
    T, A, O, F = _kernels.ctype(dtype), _kernels.ctype(acc), _kernels.ctype(out), op.cuda_functor
    staged = STAGED_STORES if staged is None else staged
    tiles = f"mr::segment_scan_tiles<{T}, {A}, {O}, {F}, {BLOCK}, {items_per_thread(dtype.itemsize)}, " \
            f"{'true' if staged else 'false'}, "
    names = {"starts": "mr::segment_tile_starts", "check": "mr::segment_check_offsets"}
    if deterministic:
        names.update(totals=tiles + "mr::kScanTotals>", rescan=tiles + "mr::kScanRescan>",
                     **carry_names(A, F, heads=False))
    else:
        names["scan"] = tiles + "mr::kScanLookback>"
    return names


def all_segment_instantiations() -> list[tuple[str, list[str]]]:
    """(operator name, name expressions) for every built-in operator (the nan-family too) over the dtype
    table: the reduction and the scan (output in the result dtype; its deterministic form for float
    accumulators). tools/build_prebuilt.py ships these precompiled; CI compiles them with nvcc."""
    from ..operators import get_operator

    groups = []
    for opname in ("sum", "prod", "min", "max", "nansum", "nanprod", "nanmin", "nanmax"):
        op = get_operator(opname)
        exprs: set[str] = set()
        for dtype in _dt.GPU_DTYPES:
            if dtype.kind in op.kinds:
                out = _dt.result_dtype(op.family, dtype)
                acc = _dt.accumulator_dtype(out)
                exprs.update(segment_names(dtype, acc, op).values())
                exprs.update(scan_names(dtype, acc, out, op).values())
                if acc.kind == "f":  # where association changes bits: the deterministic form too
                    exprs.update(scan_names(dtype, acc, out, op, deterministic=True).values())
        groups.append((opname, sorted(exprs)))
    return groups


def module_text(op: Operator) -> str:
    """The common device headers (kernels.kernel_source), segment.cuh and ``op``'s functor."""
    beside = Path(__file__).resolve().parents[2] / "kernels" / "segment.cuh"  # a source checkout
    text = (beside if beside.exists() else _kernels.source_dir() / "segment.cuh").read_text()
    text = _kernels._INCLUDE.sub("", text.replace("#pragma once", ""))  # kernel_source holds them all
    return _kernels.kernel_source() + "\n" + text + "\n" + op.cuda_source()


#: kernels.py's prebuilt index names a built-in operator's segment module "segment:<operator>"
PREBUILT_PREFIX = "segment:"


def prebuilt_key(op: Operator) -> str:
    """kernels.source_key of ``op``'s segment module."""
    return _kernels.source_key(module_text(op))


def _kernels_for(op: Operator, names: dict[str, str]) -> dict:
    """role -> Kernel for ``names`` (segment_names or scan_names), one module per operator and names, as
    kernels.get_kernels loads them: the shipped binary for built-in operators (no compiler at first call),
    else NVRTC."""
    device = cupy.cuda.runtime.getDevice()
    key = (device, op.cuda_functor, op.cuda_source(), frozenset(names.items()))
    return _kernels._memoized(key, lambda: (
        op.builtin and _kernels._from_prebuilt(PREBUILT_PREFIX + op.name, lambda: prebuilt_key(op), names, device))
        or _kernels._compiled(module_text(op), names, f"the segment kernels for operator {op.name!r}"))


def supported(x, acc, out=None) -> bool:
    """Whether the kernels take this input: a 1-D CuPy array of a GPU dtype, accumulated in one (and, for
    the scan, written as ``out``, one too)."""
    return (cupy is not None and isinstance(x, cupy.ndarray) and x.ndim == 1 and _dt.gpu_supported(x.dtype)
            and _dt.gpu_supported(acc) and (out is None or _dt.gpu_supported(out)))


@functools.lru_cache(maxsize=None)
def _sms(device: int) -> int:
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def segment_reduce(x, offsets, op: Operator, acc, check=None):
    """``op`` over x[offsets[i]:offsets[i+1]] (the last to the end) for each i, in ``acc``, on x's GPU:
    a CuPy array of len(offsets). ``offsets``: ascending int64 in [0, len(x)], NumPy or CuPy: checked by
    the caller, or by ``check`` (an OffsetsCheck queued before on this stream and not yet waited for:
    where it fails, the work reads no offset and its result must be dropped)."""
    acc = np.dtype(acc)
    identity = op.identity(acc)
    with cupy.cuda.Device(x.data.device_id):
        m, n = int(offsets.shape[0]), int(x.shape[0])
        if m == 0 or n == 0:
            return cupy.full(m, identity, dtype=acc)
        x = cupy.ascontiguousarray(x)
        offsets = cupy.ascontiguousarray(cupy.asarray(offsets, dtype=np.int64))
        ks = _kernels_for(op, segment_names(x.dtype, acc, op))
        tile = tile_elements(x.dtype.itemsize)
        tiles = tile_count(n, x.dtype.itemsize)
        i64 = np.int64
        tile_first = _tile_starts(ks, offsets, tile, tiles, x.data.device_id, check)
        out = cupy.empty(m, dtype=acc)
        tile_flag = cupy.empty(tiles, dtype=np.int32)
        tile_value = cupy.empty(tiles, dtype=acc)
        head_seg = cupy.empty(tiles, dtype=np.int64)
        head_value = cupy.empty(tiles, dtype=acc)
        ks["tiles"](tiles, BLOCK, (x, i64(n), offsets, i64(m), tile_first, identity, out, tile_flag, tile_value,
                                   head_seg, head_value))
        if tiles > 1:
            _carry_pass(ks, tiles, tile_flag, tile_value, head_seg, head_value, identity, identity, out)
        return out


def _carry_pass(ks, tiles: int, tile_flag, tile_value, head_seg, head_value, identity, seed, out) -> None:
    """segment_carry_totals (skipped for one group) then segment_carry_apply over ``tiles`` tile pairs."""
    groups = carry_groups(tiles)
    acc = tile_value.dtype
    group_flag = cupy.empty(max(groups - 1, 1), dtype=np.int32)  # the last group's total is never read
    group_value = cupy.empty(max(groups - 1, 1), dtype=acc)
    if groups > 1:
        ks["group_totals"](groups - 1, CARRY_BLOCK, (np.int64(tiles), tile_flag, tile_value, identity, group_flag,
                                                      group_value))
    ks["carry_apply"](groups, CARRY_BLOCK, (np.int64(tiles), tile_flag, tile_value, head_seg, head_value, group_flag,
                                             group_value, identity, seed, out))


def _tile_starts(ks, offsets, tile: int, tiles: int, device: int, check=None):
    """tile_first[b] (b in [0, tiles]): the first offset at or after b * tile, on the GPU (none for any
    tile where ``check``, a pending OffsetsCheck, fails)."""
    tile_first = cupy.empty(tiles + 1, dtype=np.int64)
    grid = min(-(-(tiles + 1) // SEARCH_BLOCK), 16 * _sms(device))
    bad = np.uint64(0) if check is None else check.bad  # a null pointer: nothing to wait for
    ks["starts"](grid, SEARCH_BLOCK, (offsets, np.int64(offsets.shape[0]), np.int64(tile), np.int64(tiles), tile_first,
                                      bad))
    return tile_first


def deterministic_scan(deterministic: bool | None = None) -> bool:
    """Whether segment_scan takes its deterministic three-pass form: ``deterministic`` if given, else
    $MULTIREDUCE_SCAN_LOOKBACK (cupy_backend.LOOKBACK_ENV) == "fixed". Unlike plain scans, whose fixed
    look-back costs little, "auto" keeps the one pass here: determinism costs a second read of the data."""
    if deterministic is not None:
        return bool(deterministic)
    choice = os.environ.get(LOOKBACK_ENV, "").strip().lower()
    if choice not in ("fixed", "free", "auto", ""):
        raise ValueError(f"environment variable {LOOKBACK_ENV} is {choice!r}; expected 'fixed', 'free' or 'auto'")
    return choice == "fixed"


def segment_scan(x, offsets, op: Operator, acc, out_dtype, carry=None, staged=None, deterministic=None, check=None):
    """Inclusive scan of ``x`` restarting at every offset below len(x) (repeats count once), in ``acc``,
    written as ``out_dtype``, on x's GPU; ``carry`` (a value in ``acc``, or None) is the running value the
    elements before the first offset continue (earlier Dask chunks). ``offsets``: ascending integers in
    [0, len(x)] (checked by the caller), NumPy or CuPy. One pass with look-back, whose float sums may
    differ in the last bits run to run; ``deterministic`` (None: see deterministic_scan) reads the data
    twice (tile folds, their scan, a rescan) for the same bits every time. ``staged`` (private: benchmarks
    and tests) picks the store path, else STAGED_STORES. ``check``: as for segment_reduce."""
    acc, out_dtype = np.dtype(acc), np.dtype(out_dtype)
    deterministic = deterministic_scan(deterministic)
    identity = op.identity(acc)
    with cupy.cuda.Device(x.data.device_id):
        n = int(x.shape[0])
        if n == 0:
            return cupy.empty(0, dtype=out_dtype)
        x = cupy.ascontiguousarray(x)
        offsets = cupy.ascontiguousarray(cupy.asarray(offsets, dtype=np.int64))
        ks = _kernels_for(op, scan_names(x.dtype, acc, out_dtype, op, staged, deterministic))
        tiles = tile_count(n, x.dtype.itemsize)
        tile_first = _tile_starts(ks, offsets, tile_elements(x.dtype.itemsize), tiles, x.data.device_id, check)
        out = cupy.empty(n, dtype=out_dtype)
        seed = identity if carry is None else acc.type(carry)
        head = (x, out, np.int64(n), offsets, tile_first, identity, seed, np.int32(carry is not None))
        if deterministic:
            tile_flag, tile_value = cupy.empty(tiles, dtype=np.int32), cupy.empty(tiles, dtype=acc)
            unused = cupy.empty(1, dtype=np.uint64)
            ks["totals"](tiles, BLOCK, head + (unused, tile_flag, tile_value))
            empty_seg, empty_acc = cupy.empty(1, dtype=np.int64), cupy.empty(1, dtype=acc)  # no heads here
            _carry_pass(ks, tiles, tile_flag, tile_value, empty_seg, empty_acc, identity, seed, empty_acc)
            ks["rescan"](tiles, BLOCK, head + (unused, tile_flag, tile_value))
        else:
            words = cupy.zeros(tiles * (1 if acc.itemsize <= 4 else 2), dtype=np.uint64)  # look-back descriptors
            ks["scan"](tiles, BLOCK, head + (words, cupy.empty(1, dtype=np.int32), cupy.empty(1, dtype=acc)))
        return out


_flag_streams: dict = {}
_MAX_FLAG_STREAMS = 64  # a program that makes a stream per call would otherwise add one per stream


def _flag_stream(device: int, work_stream: int):
    """The non-blocking stream of ``device`` that the offsets checks queued on ``work_stream`` (a stream
    pointer) copy their flags on. One per work stream: a shared one would make a check's flag wait, in
    stream order, for the checks of other threads' streams queued before it."""
    key = (device, work_stream)
    stream = _flag_streams.get(key)
    if stream is None:
        if len(_flag_streams) >= _MAX_FLAG_STREAMS:
            _flag_streams.clear()  # a dropped stream finishes its queued copies before CUDA releases it
        with cupy.cuda.Device(device):
            stream = _flag_streams.setdefault(key, cupy.cuda.Stream(non_blocking=True))
    return stream


class OffsetsCheck:
    """segment_check_offsets queued on the GPU: ``bad`` is its flag on the device (for the kernels queued
    after it: segment_tile_starts gives no tile an offset where it is set); the flag also travels to
    pinned host memory on a side stream of the work's stream (``_flag_stream``) that waits for the check
    alone, so result() waits for the check, not for the work queued after it, and the work's stream never
    waits for the copy (in the stream, the 4-byte copy held the next kernel back by several microseconds)."""

    def __init__(self, offsets, n: int, op: Operator, dtype, acc, out=None):
        m = int(offsets.shape[0])
        self.bad, self._host, self._event = None, None, None
        if m == 0:
            return
        import cupyx

        device = offsets.data.device_id
        with cupy.cuda.Device(device):
            self.bad = cupy.zeros(1, dtype=np.int32)
            grid = min(-(-m // SEARCH_BLOCK), 16 * _sms(device))
            names = (segment_names(dtype, acc, op) if out is None
                     else scan_names(dtype, acc, out, op, deterministic=deterministic_scan()))
            _kernels_for(op, names)["check"](grid, SEARCH_BLOCK, (offsets, np.int64(m), np.int64(n), self.bad))
            self._host = cupyx.empty_pinned(1, dtype=np.int32)
            work = cupy.cuda.get_current_stream()
            checked = work.record()
            side = _flag_stream(device, work.ptr)
            side.wait_event(checked)
            cupy.cuda.runtime.memcpyAsync(self._host.ctypes.data, self.bad.data.ptr, 4,
                                          cupy.cuda.runtime.memcpyDeviceToHost, side.ptr)
            self._event = side.record()

    def result(self) -> tuple[bool, bool]:
        """(all in [0, n], ascending), once the check has run."""
        if self._event is None:
            return True, True
        self._event.synchronize()
        found = int(self._host[0])
        return not found & 1, not found & 2



# ------------------------------------------------------------------------------------------------
# Segments of rows (kernels/segment_rows.cuh): a group-by along an axis that is not the last
# ------------------------------------------------------------------------------------------------
ROWS_ENTRY = "segment_rows.cuh"
# H200, 2026-11-26, a float32 8760 x 7660 field by month (sum into float64, max) and 2190 x 30720: pieces
# of 256 rows, 16 rows in flight and two columns per thread read 0.83-0.93 x the copy roof, where 64 rows,
# 8 in flight and one column read 0.72-0.76 x; by day (runs of 24 rows) 0.78-0.80 either way
ROWS_BLOCK = 256
ROWS_UNROLL = 16  # rows in flight per thread
ROWS_VEC = 2  # adjacent columns per thread, loaded together where the rows allow it
#: the longest piece of a segment one thread walks: longer segments are cut, and the pieces' partials
#: folded by a second launch (their bytes are 1/ROWS_PIECE of the data's, times the accumulator's size)
ROWS_PIECE = 256
_GRID_Y = 65535


def rows_module_text(op: Operator) -> str:
    """segment_rows.cuh with the common headers and ``op``'s functor."""
    return _kernels.kernel_source(ROWS_ENTRY) + "\n" + op.cuda_source()


#: kernels.py's prebuilt index names a built-in operator's row-segment module "rows:<operator>"
ROWS_PREBUILT_PREFIX = "rows:"


def rows_prebuilt_key(op: Operator) -> str:
    """kernels.source_key of ``op``'s row-segment module."""
    return _kernels.source_key(rows_module_text(op))


def rows_names(dtype, acc, op: Operator) -> dict[int, str]:
    """{columns per thread: name expression} of the row-segment kernel for these types."""
    return {vec: (f"mr::segment_reduce_rows<{_kernels.ctype(dtype)}, {_kernels.ctype(acc)}, {op.cuda_functor}, "
                  f"{ROWS_BLOCK}, {ROWS_UNROLL}, {vec}>") for vec in sorted({1, ROWS_VEC})}


def shifted_names(dtype, skipnan: bool) -> dict[int, str]:
    """{columns per thread: name expression} of the variance's shifted-squares row kernel for ``dtype``."""
    return {vec: (f"mr::segment_shifted_squares_rows<{_kernels.ctype(dtype)}, {ROWS_BLOCK}, {ROWS_UNROLL}, {vec}, "
                  f"{'true' if skipnan else 'false'}>") for vec in sorted({1, ROWS_VEC})}


#: the row-segment module that also holds the shifted-squares kernels (they use no operator)
SHIFTED_MODULE_OPERATOR = "sum"


def all_rows_instantiations() -> list[tuple[str, list[str]]]:
    """(operator, name expressions) of every row-segment kernel a group-by asks for, per built-in operator:
    each GPU dtype folded in its result's accumulator, sums also in float64 (group-by sums of floats, the
    anchors of the moments), and the partials of each in their own type; the sum module also holds the
    variance's shifted-squares kernels. tools/build_prebuilt.py ships these
    precompiled; CI compiles them with nvcc (tools/compile_kernels.py)."""
    from ..operators import get_operator

    groups = []
    for opname in ("sum", "prod", "min", "max", "nansum", "nanprod", "nanmin", "nanmax"):
        op = get_operator(opname)
        exprs: set[str] = set()
        for dtype in _dt.GPU_DTYPES:
            if dtype.kind not in op.kinds:
                continue
            accs = {_dt.accumulator_dtype(_dt.result_dtype(op.family, dtype)), _dt.accumulator_dtype(dtype)}
            if op.family == "sum":  # group-by sums of floats and the variance's anchors of any data
                accs.add(np.dtype(np.float64))
            for acc in accs:
                if _dt.gpu_supported(acc) and acc.kind in op.kinds:
                    exprs.update(rows_names(dtype, acc, op).values())
                    exprs.update(rows_names(acc, acc, get_operator(op.partials.name)).values())
        if opname == SHIFTED_MODULE_OPERATOR:
            for dtype in _dt.GPU_DTYPES:
                for skipnan in (False, True) if dtype.kind == "f" else (False,):
                    exprs.update(shifted_names(dtype, skipnan).values())
        groups.append((opname, sorted(exprs)))
    return groups


def _rows_kernels(op: Operator, dtype, acc, shifted=None) -> dict:
    """{columns per thread: Kernel} of the row-segment kernel for these types (1 and ROWS_VEC); with
    ``shifted`` (skip NaN or not), the shifted-squares kernel for ``dtype`` from ``op``'s module instead."""
    device = cupy.cuda.runtime.getDevice()
    exprs = rows_names(dtype, acc, op) if shifted is None else shifted_names(dtype, shifted)
    names = {str(v): name for v, name in exprs.items()}
    key = (device, ROWS_ENTRY, op.cuda_functor, op.cuda_source(), tuple(names.values()))
    # the shipped binary for built-in operators (no compiler at first call), else NVRTC
    found = _kernels._memoized(key, lambda: (
        op.builtin and _kernels._from_prebuilt(ROWS_PREBUILT_PREFIX + op.name, lambda: rows_prebuilt_key(op), names,
                                               device))
        or _kernels._compiled(rows_module_text(op), names, f"the row-segment kernel for operator {op.name!r}"))
    return {int(v): kernel for v, kernel in found.items()}


def _rows_launch(x3, starts, op: Operator, acc):
    """One launch: (pre, len(starts) - 1, post) ``acc`` folds of x3's (pre, n, post) rows per segment."""
    pre, n, post = x3.shape
    segments = int(starts.shape[0]) - 1
    out = cupy.empty((pre, segments, post), dtype=acc)
    if out.size == 0:
        return out
    vec = _vec_for(x3)
    kernel = _rows_kernels(op, x3.dtype, acc)[vec]
    grid = (-(-post // (ROWS_BLOCK * vec)), min(pre * segments, _GRID_Y))
    kernel(grid, ROWS_BLOCK, (x3, starts, np.int64(pre), np.int64(n), np.int64(post), np.int64(segments),
                              op.identity(acc), out))
    return out


_MARK_RUN_STARTS = None


def mark_present(present, index) -> None:
    """present[index[i]] = True for every i, where ``index`` (a CuPy integer vector) changes: the first
    element of each run of equal values writes, the others would write the same thing again. Labels in
    runs (sorted or by time) then cost one store a run, not one per element to the same few addresses."""
    global _MARK_RUN_STARTS
    if index.size == 0:
        return
    if _MARK_RUN_STARTS is None:
        _MARK_RUN_STARTS = cupy.ElementwiseKernel(
            "raw T index", "raw bool present",
            "if (i == 0 || index[i] != index[i - 1]) present[index[i]] = true;", "multireduce_mark_run_starts")
    with cupy.cuda.Device(index.data.device_id):
        _MARK_RUN_STARTS(cupy.ascontiguousarray(index), present, size=index.size)


def _vec_for(x3) -> int:
    """Columns per thread: ROWS_VEC where the rows allow loading them together, else 1."""
    post = x3.shape[2]
    return ROWS_VEC if post % ROWS_VEC == 0 and x3.data.ptr % (ROWS_VEC * x3.dtype.itemsize) == 0 else 1


def segment_shifted_squares_rows(x3, starts, group_of, shift, skipnan: bool):
    """(total, squares): for each segment s of rows [starts[s], starts[s + 1]) of the CuPy (pre, n, post)
    ``x3`` and each column, the float64 sums of d and of d * d, d = x - shift[p, group_of[s], c] (NaN as
    d = 0 with ``skipnan``): two (pre, len(starts) - 1, post) arrays, each folded in row order; long
    segments in pieces as segment_reduce_rows cuts them, folded the same way. ``starts`` and
    ``group_of``: host int64; ``shift``: a CuPy float64 (pre, groups, post) array."""
    from ..operators import get_operator

    starts = np.asarray(starts, dtype=np.int64)
    group_of = np.asarray(group_of, dtype=np.int64)
    total_op = get_operator("sum")
    with cupy.cuda.Device(x3.data.device_id):
        x3 = cupy.ascontiguousarray(x3)
        shift = cupy.ascontiguousarray(shift, dtype=np.float64)
        cut = row_pieces(starts)
        if cut is None:
            cuts, piece_group = starts, group_of
        else:
            cuts, piece_starts = cut
            piece_group = np.repeat(group_of, np.diff(piece_starts))
        pre, n, post = x3.shape
        pieces = cuts.size - 1
        plan = cupy.asarray(np.concatenate([cuts, piece_group] + ([] if cut is None else [piece_starts])))
        total = cupy.empty((pre, pieces, post), dtype=np.float64)
        squares = cupy.empty_like(total)
        if total.size:
            vec = _vec_for(x3)
            kernel = _rows_kernels(get_operator(SHIFTED_MODULE_OPERATOR), x3.dtype, np.dtype(np.float64),
                                   shifted=bool(skipnan) and x3.dtype.kind == "f")[vec]
            grid = (-(-post // (ROWS_BLOCK * vec)), min(pre * pieces, _GRID_Y))
            kernel(grid, ROWS_BLOCK, (x3, plan[:cuts.size], plan[cuts.size:cuts.size + pieces], shift,
                                      np.int64(pre), np.int64(n), np.int64(post), np.int64(pieces),
                                      np.int64(shift.shape[1]), total, squares))
        if cut is None:
            return total, squares
        piece_starts_d = plan[cuts.size + pieces:]
        f64 = np.dtype(np.float64)
        return tuple(_rows_launch(a, piece_starts_d, total_op.partials, f64) for a in (total, squares))


def row_pieces(starts: np.ndarray):
    """(cuts, piece_starts) of segments of rows [starts[s], starts[s + 1]) cut into pieces of at most
    ROWS_PIECE rows (an empty segment keeps one empty piece): piece j is rows [cuts[j], cuts[j + 1]),
    segment s its pieces [piece_starts[s], piece_starts[s + 1]). None where no segment is cut."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.diff(starts)
    pieces = np.maximum(-(-lengths // ROWS_PIECE), 1)
    if int(pieces.max(initial=1)) == 1:
        return None
    piece_starts = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int64)
    segment = np.repeat(np.arange(lengths.size), pieces)
    within = np.arange(int(piece_starts[-1])) - piece_starts[segment]
    cuts = np.concatenate([np.minimum(starts[segment] + ROWS_PIECE * within, starts[segment + 1]),
                           starts[-1:]]).astype(np.int64)
    return cuts, piece_starts


def segment_reduce_rows(x3, starts, op: Operator, acc):
    """``op`` over the rows [starts[s], starts[s + 1]) of the CuPy (pre, n, post) ``x3`` for each segment
    s, in ``acc``, on x3's GPU: a (pre, len(starts) - 1, post) CuPy array; an empty segment gives the
    identity. ``starts``: host int64, ascending, from 0 to n. Each thread folds its column's rows in order;
    a segment longer than ROWS_PIECE rows is folded in pieces (``row_pieces``), whose partials are folded
    in order with ``op.partials``, so the bits depend on the data and ``starts`` alone."""
    acc = np.dtype(acc)
    starts = np.asarray(starts, dtype=np.int64)
    with cupy.cuda.Device(x3.data.device_id):
        x3 = cupy.ascontiguousarray(x3)
        cut = row_pieces(starts)
        if cut is None:
            return _rows_launch(x3, cupy.asarray(starts), op, acc)
        cuts, piece_starts = cut
        both = cupy.asarray(np.concatenate([cuts, piece_starts]))  # one copy to the GPU, not two
        partials = _rows_launch(x3, both[:cuts.size], op, acc)
        return _rows_launch(partials, both[cuts.size:], op.partials, acc)
