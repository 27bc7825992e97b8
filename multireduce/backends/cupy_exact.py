"""CuPy input to the exact functions: the exact sum kernel of ``kernels/exact.cuh``.

A chunk's exact state (``exact.ExactState``) is computed on the GPU that holds it: each block keeps
per-thread floating-point expansions (TwoSum cascades) and a superaccumulator of integer words in
shared memory, and adds its carried digits into the row's ``KWORDS`` global words with integer atomics.
Only those words (8 * 73 bytes per output) come to the host, where they are folded into exact.py's
Python integer, so GPU, CPU and any chunking give the same bits.

Served by the kernel: sum/mean/nansum with ``exact=True`` of float16/32/64 CuPy arrays and of the CuPy
chunks of Dask arrays, any axes, any strides (reduced axes are moved last with one device copy when
the rows are not already contiguous). ``exact=True`` cumsum/nancumsum of a CuPy array run the exact scan of
``kernels/exact_scan.cuh`` (``cumsum``/``device_cumsum``: tile words, an int64 cumsum of them, double-double
pass 2 with a rigorous bound, an exact fallback walk for what it cannot prove), and so do the CuPy chunks of
a Dask array's, each seeded with the exact carry of the chunks before it (``carry_words``); the NumPy models below
(``tile_carries``, ``model_scan_tile``) are the design's first, simpler form, kept as CPU tests of it.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import sys
import threading
import weakref
from fractions import Fraction

import numpy as np

try:
    import cupy
except ImportError:  # the kernel names, the NumPy model and the nvcc check (CI, no GPU) need no CuPy
    cupy = None

from .. import kernels as _kernels
from ..tuning import policy
from . import on_device_of

_POLICY = policy(9)  # launch constants: one set for every GPU (tuning.policy)
BLOCK = _POLICY.exact_block
# Expansion length per thread. The exact sum of data spanning many binades has that many significant
# bits, and the expansion holds its top ~53 * TERMS; whatever falls below is deposited with shared atomics,
# which contend. H200, 2^26 (profile_exact --terms, 2026-11-24): on range90 data (|x| from 1e-45 to 1e45)
# 4 terms ran at 0.00 (float32) and 0.03 (float64) x the plain sum, 8 terms at 0.22 and 0.36; on uniform,
# normal and ill-conditioned data 8 terms cost within the run-to-run spread (0.72-0.83 x plain either way).
TERMS = _POLICY.exact_terms
# 16-byte packs each thread loads before adding any (exact.cuh visit_row): bytes in flight against DRAM
# latency. Per dtype, at TERMS = 8 (nvcc 13, sm_90): float64 4 (58 registers), float32 4 (56; 8 takes 72
# registers, 3 blocks per SM, and measured no faster), float16 2 (47), none spilling.
# python -m benchmarks exact --profile shapes sweeps it.
UNROLL = dict(_POLICY.exact_unroll)
BLOCKS_PER_SM = _POLICY.exact_blocks_per_sm  # one resident wave: every extra block costs a flush and 72 global atomics per row
KWORDS = 72  # kernels/exact.cuh kWords: word j counts units of 2**(32 j + WORD_BASE)
BIG = 960  # kernels/exact.cuh kBig: |x| >= 2**BIG goes straight to the superaccumulator
WORD_BASE = -1074  # bit 0 of the words: the smallest float64 subnormal
FLAG_NAN, FLAG_PINF, FLAG_NINF = 1, 2, 4
_ROWS_PER_LAUNCH = 65535  # gridDim.y; the kernel loops over rows past it
_PER_BLOCK_LIMIT = 1 << 28  # elements per block per launch: the banks' top digit never wraps (exact.cuh Banks)
# Digit adds an int64 word takes between two relax_words: every add is below 2**32 and a relaxed word is
# within [-2**31, 2**33), so the words stay below 2**63 with room to spare
_WORD_ADDS = 1 << 30
# Int64 words held at once (73 per row for a sum; (tiles + 1) x 75 per row for a scan, twice): an exact
# reduction or scan over a short axis has about as many rows as elements, so its rows go in batches
_WORDS_PER_BATCH = 1 << 22  # 32 MiB of int64


# ------------------------------------------------------------------------------------------------
# kernel names, module text, compile check, loader (the shape of cupy_stats)
# ------------------------------------------------------------------------------------------------
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def exact_name(dtype) -> str:
    return f"mr::exact::exact_sum_rows<{_kernels.ctype(dtype)}, {TERMS}, {BLOCK}, {UNROLL[np.dtype(dtype).name]}>"


def round_name(dtype) -> str:
    """The kernel that rounds rows of words to ``dtype`` on the device (exact.cuh exact_round_rows)."""
    return f"mr::exact::exact_round_rows<{_kernels.ctype(dtype)}>"


# The exact scan (kernels/exact_scan.cuh): tiles of SCAN_BLOCK x SCAN_ITEMS elements, the items per thread
# chosen by the wider of the input and output dtypes (pass 2 stages a tile of either in 48 KB of static
# shared memory); pass 1 takes one warp of SCAN_WARPS per tile. Why these values: tuning.py and
# benchmarks/sweep_exact_scan.py (pass 2 is compute- and occupancy-bound, docs/performance.md).
SCAN_BLOCK = _POLICY.exact_scan_block
SCAN_ITEMS = dict(_POLICY.exact_scan_items)
SCAN_WARPS = _POLICY.exact_scan_warps
SEED_BLOCK = _POLICY.elementwise_block
CARRY_BLOCK = _POLICY.exact_carry_block  # exact_words_cumsum: one block per word of a row
CARRY_ITEMS = _POLICY.exact_carry_items
KTILEOUT = KWORDS + 3  # exact_scan.cuh kTileOut: a tile's words, then its NaN/+inf/-inf counts
_FALLBACK_GRID = 1024  # blocks of one warp that look for marked tiles (grid-stride; no host round trip)
_RETRY_GRID = 1024  # blocks that look for the tiles pass 2's tile-wide fast path gave up (grid-stride)
# Tiles per row in one launch sequence: the words' int64 cumsum takes one digit (< 2**32) per tile, and the
# fallback walk a tile's elements on top, so a row's words stay below 2**63 up to ~2**31 tiles; longer
# rows (2**43 elements and more) are scanned in segments (device_cumsum)
_MAX_TILES = 1 << 30


def scan_items(dtype, out=None) -> int:
    """Elements per thread of pass 2 for ``dtype`` data scanned into ``out`` (default: ``dtype``)."""
    dtype = np.dtype(dtype)
    out = dtype if out is None else np.dtype(out)
    return SCAN_ITEMS[(dtype if dtype.itemsize >= out.itemsize else out).name]


def scan_tile(dtype, out=None) -> int:
    """Elements per tile of the exact scan of ``dtype`` data into ``out`` (default: ``dtype``)."""
    return SCAN_BLOCK * scan_items(dtype, out)


def scan_names(dtype, out) -> dict[str, str]:
    """The kernels of an exact cumsum of ``dtype`` data into ``out``: pass 1 (tile words), the carries (the
    words' cumsum), the seeds, pass 2 (the tile-wide proved roundings), its retry (the Partial path of the
    tiles pass 2 gave up) and the fallback walk."""
    T, O = _kernels.ctype(dtype), _kernels.ctype(out)
    name = np.dtype(dtype).name
    items = scan_items(dtype, out)
    return {
        "words": f"mr::exact::exact_tile_words<{T}, {TERMS}, {SCAN_WARPS}, {UNROLL[name]}>",
        "carries": f"mr::exact::exact_words_cumsum<{CARRY_BLOCK}, {CARRY_ITEMS}>",
        "seeds": f"mr::exact::exact_scan_seeds<{SEED_BLOCK}>",
        "tiles": f"mr::exact::exact_scan_tiles<{T}, {O}, {SCAN_BLOCK}, {items}>",
        "retry": f"mr::exact::exact_scan_retry<{T}, {O}, {SCAN_BLOCK}, {items}>",
        "fallback": f"mr::exact::exact_scan_fallback<{T}, {O}>",
    }


def all_exact_instantiations() -> list[str]:
    names = {exact_name(dt) for dt in FLOAT_DTYPES} | {round_name(dt) for dt in FLOAT_DTYPES}
    for dt in FLOAT_DTYPES:
        for out in FLOAT_DTYPES:
            names.update(scan_names(dt, out).values())
    return sorted(names)


ENTRY = "exact.cuh"


def module_text() -> str:
    """exact.cuh with its includes inlined (what NVRTC and nvcc compile)."""
    return _kernels.kernel_source(ENTRY)


_loaded: dict = {}


def _kernel(dtype, role: str = "sum"):
    """The exact-sum kernel of ``dtype`` (``role`` "round": the one rounding words to ``dtype``) on the
    current device: the prebuilt binary when it matches the source (kernels.STANDALONE), else NVRTC; all
    six load together."""
    device = cupy.cuda.runtime.getDevice()
    found = _loaded.get(device)
    if found is None:
        names = {("sum", dt.name): exact_name(dt) for dt in FLOAT_DTYPES}
        names.update({("round", dt.name): round_name(dt) for dt in FLOAT_DTYPES})
        found = _loaded[device] = _kernels.get_standalone_kernels(ENTRY, names)
    return found[(role, np.dtype(dtype).name)]


# ------------------------------------------------------------------------------------------------
# host side: words -> exact.py's state
# ------------------------------------------------------------------------------------------------
def _bias_total(count: int) -> int:
    """The sum of 2**63 * 2**(64 k) for k < count: what reading ``count`` words with their top bits flipped as
    one unsigned little-endian integer adds to their signed value."""
    return sum(1 << (63 + 64 * k) for k in range(count))


_EVEN_BIAS, _ODD_BIAS = _bias_total((KWORDS + 1) // 2), _bias_total(KWORDS // 2)


def fold_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, KWORDS + 1) int64 words -> (totals, nan, pinf, ninf): totals an object array of Python ints
    in exact.py's units (value total * 2**exact.EBASE), flags bool arrays, all of shape (rows,)."""
    from ..exact import EBASE

    shift = WORD_BASE - EBASE  # exact.py's unit is 2**53 times finer than the words' bit 0
    rows = words.shape[0]
    totals = np.empty(rows, dtype=object)
    # sum of words[j] * 2**(32 j), each word any int64: the even words are 64 bits apart, and so are the odd
    # ones, so each set is one little-endian integer once every word is biased by 2**63 (its top bit
    # flipped) to make it unsigned; int.from_bytes then does in C what a loop of shifts did in Python
    biased = np.ascontiguousarray(words[:, :KWORDS]).view(np.uint64) ^ np.uint64(1 << 63)
    for r in range(rows):
        row = biased[r]
        total = int.from_bytes(row[0::2].tobytes(), sys.byteorder) - _EVEN_BIAS
        total += (int.from_bytes(row[1::2].tobytes(), sys.byteorder) - _ODD_BIAS) << 32
        totals[r] = total << shift
    flags = words[:, KWORDS]
    return totals, (flags & FLAG_NAN) != 0, (flags & FLAG_PINF) != 0, (flags & FLAG_NINF) != 0


def carry_words(carries) -> np.ndarray:
    """exact.py's per-lane carries (a sequence of exact.LaneStates, as exact._lane_states and
    ExactScanPlan.carries give them) -> (lanes, KTILEOUT) int64 in the form pass 1 gives a tile: the total's
    digits in [0, 2**32) with a signed top word, then its NaN/+inf/-inf flags as counts, so that a carry can
    stand first in the words' cumsum (fold_words read backwards; exact.py's integers are multiples of 2**53,
    its unit being 2**53 times finer than the words' bit 0)."""
    from ..exact import EBASE

    shift = WORD_BASE - EBASE
    low_bits = 32 * (KWORDS - 1)
    out = np.zeros((len(carries), KTILEOUT), dtype=np.int64)
    for r, state in enumerate(carries):
        total = state.total
        units = total >> shift
        if units << shift != total:
            raise ValueError("an exact carry that is no sum of floats: its total is not a multiple of 2**53")
        top = units >> low_bits  # floor: the digits below stay non-negative for either sign
        if not -(1 << 63) <= top < (1 << 63):
            raise OverflowError("an exact carry beyond the scan's 72 words (more than 2**1261 in magnitude)")
        out[r, : KWORDS - 1] = np.frombuffer((units - (top << low_bits)).to_bytes(low_bits // 8, "little"), "<u4")
        out[r, KWORDS - 1] = top
        out[r, KWORDS:] = state.nan, state.pinf, state.ninf
    return out


def relax_words(words):
    """Int64 words (..., KWORDS) of any values -> words of the same value, each word's bits above its low 32
    moved into the next word (the top word keeps its own): every word but the top then lies in
    [-2**31, 2**32 + 2**31), so it can take _WORD_ADDS more digit adds. NumPy or CuPy, on the array's device."""
    out = words & 0xFFFFFFFF
    out[..., -1] = words[..., -1]
    out[..., 1:] += words[..., :-1] >> 32
    return out


def carry_after(cum_last):
    """The carry slot ((rows, KTILEOUT) int64) of what follows a scanned segment, from the words' cumsum at
    its last slot: the same value, its words relaxed (relax_words), and its NaN/+inf/-inf counts made 0/1,
    so that the next segment's cumsum has as much room as a fresh carry's. NumPy or CuPy."""
    out = cum_last.copy()
    out[:, :KWORDS] = relax_words(cum_last[:, :KWORDS])
    out[:, KWORDS:] = cum_last[:, KWORDS:] > 0
    return out


def _row_batches(rows: int, words_per_row: int):
    """(start, stop) of consecutive row batches holding at most _WORDS_PER_BATCH words (one row at least)."""
    step = max(1, _WORDS_PER_BATCH // max(1, words_per_row))
    return [(start, min(rows, start + step)) for start in range(0, rows, step)]


@functools.lru_cache(maxsize=4096)
def _grid_x(device: int, n: int, rows: int, per_sm: int, resident: int | None) -> int:
    """Blocks per row: ``per_sm`` blocks per SM in all, capped by the kernel's resident blocks per SM (the
    occupancy API; None when unknown) so that the grid is one wave. The words do not depend on it."""
    sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    if resident:
        per_sm = min(per_sm, resident)
    per_block = BLOCK * 16  # at least one 16-byte pack per thread
    want = max(1, -(-n // per_block))
    return int(max(1, min(want, max(1, sms * per_sm // min(rows, _ROWS_PER_LAUNCH)))))


def device_words(x, blocks_per_sm: int | None = None, words=None):
    """The (rows, KWORDS + 1) int64 words of a C-contiguous 2-d CuPy array's row sums, on its GPU (the
    kernel alone: what benchmarks time against a plain sum). ``blocks_per_sm`` (default BLOCKS_PER_SM) is
    the grid knob python -m benchmarks exact --profile shapes sweeps. ``words``: a zeroed (rows, KWORDS + 1) int64 array to
    add into (default: a new one). A block sees at most _PER_BLOCK_LIMIT elements per launch, longer rows
    take several launches into the same words, and the words are relaxed (relax_words) before their digit
    adds could pass _WORD_ADDS."""
    from .cupy_backend import scan_occupancy

    rows, n = x.shape
    if words is None:
        words = cupy.zeros((rows, KWORDS + 1), dtype=np.int64)
    kernel = _kernel(x.dtype)
    per_sm = BLOCKS_PER_SM if blocks_per_sm is None else int(blocks_per_sm)
    if per_sm < 1:
        raise ValueError(f"blocks_per_sm must be >= 1, got {blocks_per_sm}")
    gx = _grid_x(x.data.device_id, n, rows, per_sm, scan_occupancy(kernel, BLOCK))
    step = gx * _PER_BLOCK_LIMIT
    adds = 0  # digit adds into each word since the last relax: one per block and launch
    for start in range(0, n, step):  # the words add across launches as across blocks
        if adds + gx > _WORD_ADDS:
            words[:, :KWORDS] = relax_words(words[:, :KWORDS])
            adds = 0
        part = x[:, start:start + step]
        gy = min(rows, _ROWS_PER_LAUNCH)
        kernel((gx, gy), BLOCK, (part, np.int64(rows), np.int64(part.shape[1]), np.int64(n), words))
        adds += gx
    return words


def _rows_of(block, axes: tuple[int, ...]):
    """(kept_shape, rows x n view or copy with the reduced axes last and C-contiguous, n) of a CuPy block."""
    kept = [d for d in range(block.ndim) if d not in axes]
    kept_shape = tuple(block.shape[d] for d in kept)
    rows = math.prod(kept_shape)
    n = math.prod(block.shape[a] for a in axes)
    if rows == 0 or n == 0:
        return kept_shape, None, n
    order = kept + list(axes)
    if order != list(range(block.ndim)):  # reduced axes last: one device copy
        block = cupy.transpose(block, order)
    if not block._c_contiguous:
        block = block.copy()
    return kept_shape, block.reshape(rows, n), n


def state_of(block, axes: tuple[int, ...]):
    """The exact state of a CuPy ``block`` reduced over ``axes``, computed on its GPU (exact.state_of's
    contract: reduced axes dropped from the state's shape)."""
    from ..exact import ExactState

    with on_device_of(block):
        kept_shape, x, n = _rows_of(block, axes)
        if x is None:
            false = np.zeros(kept_shape, dtype=bool)
            total = np.empty(kept_shape, dtype=object)
            total.fill(0)
            return ExactState(total, false, false.copy(), false.copy(), n)
        rows = x.shape[0]
        totals = np.empty(rows, dtype=object)
        nan, pinf, ninf = (np.empty(rows, dtype=bool) for _ in range(3))
        for start, stop in _row_batches(rows, KWORDS + 1):  # words for a batch of rows at a time
            got = fold_words(device_words(x[start:stop]).get())
            for into, part in zip((totals, nan, pinf, ninf), got):
                into[start:stop] = part
    return ExactState(totals.reshape(kept_shape), nan.reshape(kept_shape), pinf.reshape(kept_shape),
                      ninf.reshape(kept_shape), n)


# Words kept between sums, per GPU and stream: the rounding launch clears the words it reads
# (exact_round_rows' ``clear``), so a sum of at most _KEPT_ROWS rows starts on zeroed words without a
# clearing launch. A lock per buffer keeps one call's launches together: two threads' sums on one stream
# must not interleave in the same words. A call that fails between its launches drops its buffer (the
# words may not be zero). A user stream's buffer is tied to that stream object (a destroyed stream's handle
# can come back as another stream's).
_KEPT_ROWS = 64
_KEPT_BUFFERS = 16
_ROUND_ROWS = 32  # kernels/exact.cuh kRoundRows: rows per rounding block


class _KeptWords:
    __slots__ = ("stream", "words", "lock")

    def __init__(self, stream, words):
        self.stream = stream
        self.words = words
        self.lock = threading.Lock()


_kept: collections.OrderedDict = collections.OrderedDict()
_kept_guard = threading.Lock()


def _kept_words(rows: int):
    """The zeroed words kept for the current GPU and stream (created on first use), or None for more rows."""
    if rows > min(_KEPT_ROWS, _WORDS_PER_BATCH // (KWORDS + 1)):  # one batch of rows, kept words
        return None
    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.runtime.getDevice(), stream.ptr)
    builtin = stream.ptr in (0, 1, 2)  # the legacy and per-thread default streams live as long as the process
    with _kept_guard:
        entry = _kept.get(key)
        if entry is not None and not builtin and entry.stream() is not stream:
            entry = None
        if entry is None:
            entry = _KeptWords(weakref.ref(stream) if not builtin else None,
                               cupy.zeros((_KEPT_ROWS, KWORDS + 1), dtype=np.int64))
            _kept[key] = entry
            while len(_kept) > _KEPT_BUFFERS:
                _kept.popitem(last=False)
        _kept.move_to_end(key)
    return key, entry


def _in_kept_words(rows: int, launches) -> bool:
    """``launches(words)`` on the kept words of ``rows`` rows (``_kept_words``), under their lock; a failure
    drops the buffer (its words may not be zero) and is raised. False where more rows than are kept."""
    found = _kept_words(rows)
    if found is None:
        return False
    key, entry = found
    with entry.lock:
        try:
            launches(entry.words[:rows])
        except BaseException:
            with _kept_guard:
                if _kept.get(key) is entry:
                    del _kept[key]
            raise
    return True


def _round_launch(words, rows: int, out_dtype, skipnan: bool, divisor: int, clear: bool, out) -> None:
    fi = np.finfo(out_dtype)
    grid = min(-(-rows // _ROUND_ROWS), 1024)
    _kernel(out_dtype, "round")(grid, _ROUND_ROWS,
                                (words, np.int64(rows), np.int32(fi.nmant + 1), np.int32(fi.minexp),
                                 np.int32(skipnan), np.int64(divisor), np.int32(clear), out))


class _WholeSum:
    """A whole-array exact sum bound to one (GPU, input dtype, output dtype, nansum): its two kernels, the
    sum kernel's resident blocks per SM and the rounding's constants, looked up once, so that a call is two launches into kept
    words and little Python."""

    __slots__ = ("sum_kernel", "round_kernel", "resident", "precision", "emin", "skipnan")

    def __init__(self, dtype, plan):
        from .cupy_backend import scan_occupancy

        self.sum_kernel, self.round_kernel = _kernel(dtype), _kernel(plan.out_dtype, "round")
        self.resident = scan_occupancy(self.sum_kernel, BLOCK)
        fi = np.finfo(plan.out_dtype)
        self.precision, self.emin = np.int32(fi.nmant + 1), np.int32(fi.minexp)
        self.skipnan = np.int32(plan.skipnan)


_whole_sums: dict = {}
_ONE, _CLEAR = np.int64(1), np.int32(1)


def _whole_sum(x, plan):
    """``reduce`` of a C-contiguous, non-empty ``x`` over every axis in one launch of each kernel (the same
    words and rounding as the general path), or None where that path is needed."""
    n = x.size
    key = (x.data.device_id, x.dtype.char, plan.out_dtype.char, plan.skipnan)
    bound = _whole_sums.get(key)
    if bound is None:
        bound = _whole_sums[key] = _WholeSum(x.dtype, plan)
    grid = _grid_x(key[0], n, 1, BLOCKS_PER_SM, bound.resident)
    if n > grid * _PER_BLOCK_LIMIT:
        return None
    out = cupy.empty(1, plan.out_dtype)
    count = np.int64(n)

    def launches(words):
        bound.sum_kernel((grid, 1), BLOCK, (x.reshape(1, n), _ONE, count, count, words))
        bound.round_kernel(1, _ROUND_ROWS, (words, _ONE, bound.precision, bound.emin, bound.skipnan,
                                            count if plan.mean else _ONE, _CLEAR, out))

    if not _in_kept_words(1, launches):
        return None
    return out.reshape((1,) * x.ndim if plan.keepdims else ())


def reduce(x, plan):
    """An exact sum, nansum or mean of one CuPy array, rounded on the device from the words (exact.cuh
    round_words: exact.py's rounding and division by the count, bit for bit), so the call returns without
    waiting for the GPU. Empty reductions take exact.py's host path (zeros, or NaN with its warning)."""
    if x.size and len(plan.axes) == x.ndim and x._c_contiguous:
        with on_device_of(x):
            value = _whole_sum(x, plan)
        if value is not None:
            return value
    with on_device_of(x):
        kept_shape, rows_n, n = _rows_of(x, plan.axes)
        if rows_n is not None:
            out_dtype = np.dtype(plan.out_dtype)
            divisor = n if plan.mean else 1
            rows = rows_n.shape[0]
            out = cupy.empty(rows, out_dtype)

            def launches(held):
                device_words(rows_n, words=held)
                _round_launch(held, rows, out_dtype, plan.skipnan, divisor, True, out)

            if not _in_kept_words(rows, launches):
                batches = _row_batches(rows, KWORDS + 1)
                words = cupy.empty((batches[0][1], KWORDS + 1), dtype=np.int64)  # one buffer, batch after batch
                for start, stop in batches:
                    held = words[: stop - start]
                    held.fill(0)
                    device_words(rows_n[start:stop], words=held)
                    _round_launch(held, stop - start, out_dtype, plan.skipnan, divisor, False, out[start:stop])
            out = out.reshape(kept_shape)
            return cupy.expand_dims(out, plan.axes) if plan.keepdims else out
        return cupy.asarray(plan.whole(x))


def _scan_kernels(dtype, out) -> dict:
    """The exact scan's kernels for (``dtype``, ``out``) on the current device: prebuilt when the binary
    matches the source, else NVRTC (a group apart from the sum's, so an exact sum compiles none of them)."""
    return _kernels.get_standalone_kernels(ENTRY, scan_names(dtype, out))


#: Whether several lanes scan in one device_cumsum (rows x n: one launch sequence) or one lane at a time.
#: Batched since it passed on an H100 (2026-11-26, tests/gpu/test_gpu_exact_scan.py, 270 passed, after cum was
#: made C order). MULTIREDUCE_EXACT_BATCHED_LANES=0 scans lanes one at a time, to compare the two.
BATCHED_LANES = os.environ.get("MULTIREDUCE_EXACT_BATCHED_LANES", "1") != "0"


def device_cumsum(x, dt, skipnan: bool = False, carry=None, out=None):
    """The exact inclusive cumsum of each row of a C-contiguous 2-d CuPy array (rows x n, n > 0, rows > 0)
    into ``out`` (default: a new (rows, n) array of ``dt``), on its GPU: pass 1, an int64 cumsum of the tile
    words, the seeds, pass 2 and the fallback walk (kernels/exact_scan.cuh); five launches (and the carry
    slots' copy) whatever the data, no host sync. ``carry``: (rows, KTILEOUT) int64 words (carry_words) of
    what precedes each row, so every output is the rounding of carry + the row's exact prefix, and the
    carry's flags decide as an earlier element's would. The words' cumsum takes one digit add per tile, so a
    row of more than _MAX_TILES tiles is scanned in segments of _MAX_TILES tiles, one row at a time, each
    segment seeded with the words after the one before (carry_after), on the device."""
    rows, n = x.shape
    out = cupy.empty((rows, n), dtype=dt) if out is None else out
    carry = None if carry is None else cupy.asarray(carry)
    tile = scan_tile(x.dtype, dt)
    if -(-n // tile) <= _MAX_TILES:
        _scan_segment(x, dt, skipnan, carry, out)
        return out
    span = _MAX_TILES * tile
    for r in range(rows):
        seed = None if carry is None else carry[r:r + 1]
        for start in range(0, n, span):
            cum = _scan_segment(x[r:r + 1, start:start + span], dt, skipnan, seed, out[r:r + 1, start:start + span])
            seed = carry_after(cum[:, -1])
    return out


def _scan_segment(x, dt, skipnan: bool, carry, out):
    """device_cumsum's launches for rows of at most _MAX_TILES tiles, ``x`` and ``out`` C-contiguous rows (or
    one row of a longer one); ``carry`` a CuPy array or None. Returns the words' cumsum (rows, tiles + 1,
    KTILEOUT): its last slot is everything up to each row's end."""
    rows, n = x.shape
    k = _scan_kernels(x.dtype, dt)
    tile = scan_tile(x.dtype, dt)
    tiles = -(-n // tile)
    count = rows * tiles
    i64 = np.int64
    # slot 0 of a row: its carry. A memset for none (CuPy's assignment to the strided slots compiles an
    # elementwise kernel at its first use: a Dask array's chunks with carries pay that once)
    words = cupy.zeros((rows, tiles + 1, KTILEOUT), dtype=np.int64)
    if carry is not None:
        words[:, 0] = carry
    k["words"](int(min(-(-count // SCAN_WARPS), 1 << 20)), SCAN_WARPS * 32,
               (x, i64(rows), i64(n), i64(tile), i64(tiles), words))
    # the carries: the words' cumsum along each row's slots, in place (integer adds: exact, order-free)
    k["carries"](rows * KTILEOUT, CARRY_BLOCK, (words, i64(rows), i64(tiles + 1)))
    cum = words
    seeds = cupy.empty(count * 4, dtype=np.int64)
    k["seeds"](int(min(-(-count // SEED_BLOCK), 1 << 16)), SEED_BLOCK,
               (cum, i64(count), i64(tiles), np.int32(skipnan), seeds))
    marked = cupy.empty(count, dtype=np.int32)
    k["tiles"](int(min(count, (1 << 31) - 1)), SCAN_BLOCK,
               (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(skipnan), out, marked))
    k["retry"](int(min(count, _RETRY_GRID)), SCAN_BLOCK,
               (x, i64(rows), i64(n), i64(tiles), seeds, np.int32(skipnan), out, marked))
    k["fallback"](int(min(count, _FALLBACK_GRID)), 32,
                  (x, i64(rows), i64(n), i64(tile), i64(tiles), cum, marked, out))
    return cum


def cumsum(x, axis: int, dt, skipnan: bool = False, carry=None):
    """exact.cumsum of one CuPy array along ``axis`` on its GPU (``skipnan``: nancumsum): bitwise exact.py's
    host scan (exact._cumsum_block). ``carry``: exact._cumsum_block's, an object array of per-lane
    LaneStates (the exact totals and flags of the earlier chunks of a Dask array; its shape is x's without
    ``axis``), entering the scan as the first slot of each lane's words. Any axis and any number of lanes
    run on the GPU: the scanned axis is moved last with one device copy when it is not already the
    contiguous one; the result is that layout moved back (as exact.py's). Lanes go in batches whose words
    stay within _WORDS_PER_BATCH (a scan along a short axis has a carry and a tile per element or so)."""
    dt = np.dtype(dt)
    with on_device_of(x):
        moved = cupy.moveaxis(x, axis, -1)
        if x.size == 0:
            return cupy.moveaxis(cupy.empty(moved.shape, dtype=dt), -1, axis)
        rows = cupy.ascontiguousarray(moved).reshape(-1, moved.shape[-1])
        lanes, n = rows.shape
        carries = None if carry is None else carry.reshape(-1)
        out = cupy.empty(rows.shape, dtype=dt)
        per_lane = 2 * (-(-n // scan_tile(x.dtype, dt)) + 1) * KTILEOUT  # the words and their cumsum
        for start, stop in _row_batches(lanes, per_lane) if BATCHED_LANES else [(r, r + 1) for r in range(lanes)]:
            words = None if carries is None else carry_words(carries[start:stop])
            device_cumsum(rows[start:stop], dt, skipnan, words, out[start:stop])
        return cupy.moveaxis(out.reshape(moved.shape), -1, axis)


# ------------------------------------------------------------------------------------------------
# a NumPy model of one block of the kernel (CPU tests of the split/flush arithmetic)
# ------------------------------------------------------------------------------------------------
def _deposit_model(acc: np.ndarray, d: np.ndarray) -> None:
    """exact.cuh's deposit for finite float64 values ``d`` into int64 words ``acc`` (wrapping adds)."""
    bits = d.view(np.uint64)
    field = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    mant = bits & np.uint64((1 << 52) - 1)
    mant = np.where(field > 0, mant | np.uint64(1 << 52), mant)
    pos = np.where(field > 0, field - 1, 0)
    word, shift = pos >> 5, (pos & 31).astype(np.uint64)
    low = mant << shift
    high = np.where(shift > 0, mant >> (np.uint64(64) - np.where(shift > 0, shift, np.uint64(1))), np.uint64(0))
    sign = np.where((bits >> np.uint64(63)) != 0, -1, 1).astype(np.int64)
    for k, piece in enumerate((low & np.uint64(0xFFFFFFFF), low >> np.uint64(32), high)):
        np.add.at(acc, word + k, sign * piece.astype(np.int64))


def model_words(x: np.ndarray, threads: int = 64, terms: int = TERMS) -> np.ndarray:
    """The words one block of ``threads`` threads would produce for the float array ``x`` (thread t takes
    elements t, t + threads, ...), with the same expansion, big-value and carry rules as exact.cuh."""
    v = np.asarray(x).astype(np.float64).ravel()
    acc = np.zeros(KWORDS, dtype=np.int64)
    flags = 0
    a = np.zeros((terms, threads))
    cols = -(-v.size // threads)
    padded = np.zeros(cols * threads)
    padded[: v.size] = v
    with np.errstate(invalid="ignore", over="ignore"):
        for c in range(cols):
            xs = padded[c * threads : (c + 1) * threads].copy()
            bad = ~np.isfinite(xs)
            if bad.any():
                flags |= FLAG_NAN * bool(np.isnan(xs).any()) | FLAG_PINF * bool((xs == np.inf).any())
                flags |= FLAG_NINF * bool((xs == -np.inf).any())
                xs[bad] = 0.0
            big = np.abs(xs) >= 2.0**BIG
            if big.any():
                _deposit_model(acc, xs[big])
                xs[big] = 0.0
            for i in range(terms):
                live = xs != 0.0
                s = a[i] + xs
                bv = s - a[i]
                e = (a[i] - (s - bv)) + (xs - bv)
                a[i] = np.where(live, s, a[i])
                xs = np.where(live, e, 0.0)
            rest = xs[xs != 0.0]
            if rest.size:
                _deposit_model(acc, rest)
    for i in range(terms):
        _deposit_model(acc, a[i][a[i] != 0.0])
    carry = 0
    out = np.zeros(KWORDS + 1, dtype=np.int64)
    for j in range(KWORDS - 1):
        value = int(acc[j]) + carry
        out[j] = value & 0xFFFFFFFF
        carry = value >> 32
    out[KWORDS - 1] = int(acc[KWORDS - 1]) + carry
    out[KWORDS] = flags
    return out


# ------------------------------------------------------------------------------------------------
# the exact scan's host side and a NumPy model of its pass 2 (docs/numerics.md, "Exact sums on the
# GPU"): pass 1 gives each tile's words, tile_carries scans them exactly, pass 2 rescans a tile with a
# double-double prefix and rounds where its error bound proves the rounding (model_scan_tile)
# ------------------------------------------------------------------------------------------------
def tile_carries(words: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Exclusive prefix of (tiles, KWORDS + 1) tile words: (carry totals in exact.py's units, one Python
    int per tile, and the OR-ed flags before each tile). Integer adds: exact and independent of order."""
    totals, nan, pinf, ninf = fold_words(np.asarray(words))
    flags = (nan * FLAG_NAN | pinf * FLAG_PINF | ninf * FLAG_NINF).astype(np.int64)
    carries, running, seen = [], 0, np.zeros(len(totals), dtype=np.int64)
    acc = 0
    for t, total in enumerate(totals.tolist()):
        carries.append(running)
        seen[t] = acc
        running += total
        acc |= int(flags[t])
    return carries, seen


_U = 2.0**-53  # unit roundoff of float64


def _seed(total: int) -> tuple[float, float, float]:
    """A double-double (hi, lo) near ``total * 2**EBASE`` and a bound on its error; inf bound when the
    carry is beyond float64 (every element of the tile then falls back)."""
    from ..exact import EBASE, round_exact

    f64 = np.dtype(np.float64)
    hi = round_exact(total, 1, EBASE, f64)
    if not math.isfinite(hi):
        return 0.0, 0.0, math.inf
    rest = total - (int(Fraction(hi) * 2**-EBASE))
    lo = round_exact(rest, 1, EBASE, f64)
    # |rest - lo| <= half an ulp of lo, or of the smallest subnormal
    return hi, lo, abs(lo) * _U + 2.0**-1074


def _proved(hi: float, lo: float, eb: float, dt: np.dtype) -> float | None:
    """The ``dt`` value nearest every point of [hi + lo - eb, hi + lo + eb], or None when a rounding
    midpoint of ``dt`` may lie inside (or the float arithmetic below could not bound it)."""
    if not math.isfinite(hi) or not math.isfinite(eb):
        return None
    r = float(np.asarray(hi).astype(dt))
    if not math.isfinite(r):
        return None
    up = float(np.nextafter(np.asarray(r, dtype=dt), np.asarray(np.inf, dtype=dt)))
    dn = float(np.nextafter(np.asarray(r, dtype=dt), np.asarray(-np.inf, dtype=dt)))
    if not (math.isfinite(up) and math.isfinite(dn)):
        return None
    hu, hd = (up - r) / 2, (r - dn) / 2  # exact for float16/32; for float64 underflow -> 0 -> None
    if hu == 0.0 or hd == 0.0:
        return None
    a = r - hi  # exact: r is hi rounded to fewer bits (Sterbenz), or hi itself
    # distances from hi + lo to the two midpoints, each with its float error bounded by 2 roundings
    du = (hu + a) - lo
    dd = (hd - a) + lo
    slack = 4 * _U * (hu + hd + abs(a) + abs(lo))
    if du > eb + slack and dd > eb + slack:
        return r
    return None


def model_scan_tile(x: np.ndarray, carry: int, flags: int, dt) -> tuple[np.ndarray, int]:
    """Pass 2 of the exact scan for one tile, in NumPy/Python floats as the kernel would do it: the running
    prefix is a double-double (TwoSum) seeded from the ``carry`` words' value, with a running error bound;
    an element whose rounding the bound proves is written directly, any other is rounded exactly from its
    exact prefix (the kernel's fallback). Returns the outputs (dtype ``dt``) and the fallback count."""
    from ..exact import EBASE, round_exact

    dt = np.dtype(dt)
    v = np.asarray(x).astype(np.float64).ravel()
    hi, lo, eb = _seed(carry)
    exact_total = carry
    out = np.empty(v.size, dtype=np.float64)
    fallbacks = 0
    for i, xi in enumerate(v.tolist()):
        if math.isnan(xi):
            flags |= FLAG_NAN
        elif xi == math.inf:
            flags |= FLAG_PINF
        elif xi == -math.inf:
            flags |= FLAG_NINF
        else:
            exact_total += int(Fraction(xi) * 2**-EBASE)
            if math.isfinite(eb):
                s = hi + xi
                bv = s - hi
                e = (hi - (s - bv)) + (xi - bv)  # TwoSum: s + e == hi + xi exactly
                t = lo + e
                eb = (eb + abs(t) * _U) * (1 + 4 * _U)  # t's rounding; the factor rounds the bound up
                hi = s + t
                bv = hi - s
                lo = (s - (hi - bv)) + (t - bv)  # TwoSum again: hi + lo == s + t exactly
                if not math.isfinite(hi):
                    eb = math.inf
        if flags & FLAG_NAN or (flags & FLAG_PINF and flags & FLAG_NINF):
            out[i] = math.nan
        elif flags & (FLAG_PINF | FLAG_NINF):
            out[i] = math.inf if flags & FLAG_PINF else -math.inf
        else:
            r = _proved(hi, lo, eb, dt)
            if r is None:
                fallbacks += 1
                r = round_exact(exact_total, 1, EBASE, dt)
            out[i] = r
    return out.astype(dt), fallbacks
