"""Statistics on one CuPy array or chunk, with the one-pass kernels of ``kernels/stats.cuh``.

Every statistic (argmin/argmax and their NaN-skipping forms, the moments behind var/std/nanvar/nanstd/
nanmean, nanmin/nanmax, any/all, count_nonzero) runs as one read of the data and a small fold:

* every axis, or trailing axes, of rows with contiguous elements: ``stats_rows`` (16-byte loads);
  rows may be strided (a Dask chunk of a C-contiguous 2-D array reads in place);
* a run of leading or middle axes of a C-contiguous array (outer, len, inner): ``stats_columns``;
* then ``stats_fold``: one warp per output merges the blocks' States into the State (partials for
  Dask, copied to the host) or the final value (CuPy input: it stays on the GPU, no synchronisation
  unless a NumPy warning or error depends on the data).

Copies, said here because they cost a pass: reduced axes that are not one run (``var(x, axis=(0, 2))``
of a 3-d array) are moved to the end in a contiguous copy; a view whose reduced part is not contiguous
(or, for every axis, whose rows are shorter than ``SHORT_ROW`` elements) is copied to C order first.
Complex any/all/count_nonzero and empty chunks are CuPy compositions (``numpy_stats`` with
``xp=cupy``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

try:
    import cupy
except ImportError:  # the kernel names, the layout logic and the nvcc check (CI, no GPU) need no CuPy
    cupy = None

from .. import dtypes as _dt
from .. import kernels as _kernels
from ..tuning import Policy
from . import Later, later_wanted, on_device_of
from . import numpy_stats as _host

if cupy is not None:
    from . import cupy_backend as _cupy_backend

ENTRY = "stats.cuh"
WHOLE_ENTRY = "stats_whole.cuh"  # stats_whole alone: what WholeLauncher loads
READS_STEPS = True  # the chunk functions take ``steps`` (fusion.Steps) and read each element through them

# The launch constants are tuning.Policy's (what each one is, and what it measured, is said there). The
# module is prebuilt from one instantiation list for every architecture, so it takes the one policy
# tuning._POLICIES has; an architecture with its own policy would need its own stats instantiations.
_POLICY = Policy()
BLOCK = _POLICY.stats_block
ROW_UNROLL = _POLICY.stats_row_unroll
COLUMN_UNROLL = _POLICY.stats_column_unroll
BLOCKS_PER_SM = _POLICY.stats_rows_blocks_per_sm
THREADS_PER_SM = _POLICY.stats_columns_threads_per_sm
SHORT_ROW = _POLICY.stats_short_row
MIN_PIECE = _POLICY.stats_min_piece

_ARG = ("argmax", "argmin", "nanargmax", "nanargmin")
_MOMENTS = {"var": 0, "std": 1, "nanvar": 0, "nanstd": 1, "nanmean": 2}  # the fold's result mode


# ------------------------------------------------------------------------------------------------
# the Stat types and kernel names, from the dtype table
# ------------------------------------------------------------------------------------------------
def _b(flag) -> str:
    return "true" if flag else "false"


def stat_type(stat: str, dtype) -> str:
    """The C++ Stat policy of ``stat`` on ``dtype``; the NaN-skipping forms only where there is NaN."""
    dtype = np.dtype(dtype)
    T = _kernels.ctype(dtype)
    nan = stat.startswith("nan") and dtype.kind == "f"
    if stat in _ARG:
        return f"mr::ArgStat<{T}, {_b(stat.endswith('max'))}, {_b(nan)}>"
    if stat in _MOMENTS:
        return f"mr::MomentsStat<{T}, {_b(nan)}>"
    if stat in ("nanmin", "nanmax"):
        return f"mr::ExtremeStat<{T}, {_b(stat == 'nanmax')}>"
    if stat in ("any", "all"):
        return f"mr::TruthStat<{T}, {_b(stat == 'all')}>"
    if stat == "count_nonzero":
        return f"mr::CountStat<{T}>"
    raise KeyError(stat)


def stat_names(stat: str, dtype, S: str | None = None) -> dict:
    S = S or stat_type(stat, dtype)
    return {"rows": f"mr::stats_rows<{S}, {BLOCK}, {ROW_UNROLL}>",
            "columns": f"mr::stats_columns<{S}, {BLOCK}, {COLUMN_UNROLL}>",
            "fold": f"mr::stats_fold<{S}, {BLOCK}>"}


def whole_name(stat: str, dtype) -> str:
    """The one-launch kernel of ``stat`` over a whole contiguous array (WholeLauncher's)."""
    return f"mr::stats_whole<{stat_type(stat, dtype)}, {BLOCK}, {ROW_UNROLL}, {BLOCKS_PER_SM}>"


STATS = _ARG + tuple(_MOMENTS) + ("nanmin", "nanmax", "any", "all", "count_nonzero")
#: the statistics WholeLauncher serves (statistics' fast paths for the default arguments)
WHOLE = ("argmax", "argmin", "var", "std", "any", "all", "count_nonzero")


def all_stats_instantiations() -> list[str]:
    return sorted({e for dt in _dt.GPU_DTYPES for stat in STATS for e in stat_names(stat, dt).values()})


def all_whole_instantiations() -> list[str]:
    """WHOLE_ENTRY's module: stats_whole of each statistic WholeLauncher serves, on each dtype."""
    return sorted({whole_name(stat, dt) for dt in _dt.GPU_DTYPES for stat in WHOLE})


def module_text() -> str:
    """stats.cuh with its includes inlined (what NVRTC and nvcc compile)."""
    return _kernels.kernel_source(ENTRY)


@functools.lru_cache(maxsize=None)
def state_dtype(stat: str, dtype) -> np.dtype:
    """The NumPy image of the kernel's State (C layout: ``align=True``)."""
    dtype = np.dtype(dtype)
    key = np.dtype(np.float32) if dtype == np.float16 else dtype
    if stat in _ARG:
        return np.dtype([("key", key), ("index", np.int64)], align=True)
    if stat in _MOMENTS:
        return np.dtype([("n", np.float64), ("anchor", np.float64), ("offset", np.float64), ("m2", np.float64)])
    if stat in ("nanmin", "nanmax"):
        return np.dtype([("value", key), ("seen", np.int32)], align=True)
    if stat in ("any", "all"):
        return np.dtype([("value", np.int32)])
    return np.dtype([("value", np.int64)])


@functools.lru_cache(maxsize=None)
def result_dtype(stat: str, dtype) -> np.dtype:
    """The fold's result type (``Stat::Out``)."""
    dtype = np.dtype(dtype)
    if stat in _ARG or stat == "count_nonzero":
        return np.dtype(np.int64)
    if stat in _MOMENTS:
        return dtype if dtype.kind == "f" else np.dtype(np.float64)
    if stat in ("any", "all"):
        return np.dtype(np.bool_)
    return dtype


# ------------------------------------------------------------------------------------------------
# layouts: which kernel reads an array, and with which numbers (host logic only)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """How the kernels see an array reduced over some axes.

    ``copy``: None (read in place), "contiguous" (C-order copy first) or "moveaxis" (reduced axes moved
    to the end, C-order copy). ``kind`` "rows": ``rows`` rows of ``length`` contiguous elements,
    ``stride`` apart; element j of row r has index r * ``index_step`` + j; ``whole``: every row folds
    into one output. ``kind`` "columns": (outer, length, inner) with (length, inner) contiguous and
    outer blocks ``stride`` apart; one output per (outer, inner). Strides are in elements."""

    kind: str
    copy: str | None
    rows: int = 1
    length: int = 1
    stride: int = 0
    index_step: int = 0
    inner: int = 1
    whole: bool = False

    @property
    def outputs(self) -> int:
        return 1 if self.whole else self.rows * self.inner


def _collapse(shape, strides):
    """The single stride of dims that collapse into one (C order, size-1 dims ignored), 0 if none is
    left, None if they do not collapse."""
    kept = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, a), (nb, b) in zip(kept, kept[1:]):
        if a != b * nb:
            return None
    return kept[-1][1] if kept else 0


def _c_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=1024)  # a pure function of small tuples, on every call's path
def plan_layout(shape, strides, axes) -> Layout:
    """The layout for an array of ``shape`` and element ``strides`` reduced over ``axes``."""
    shape, strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
    nd = len(shape)
    axes = tuple(sorted(axes))
    if nd == 0:
        return Layout("rows", None, whole=True)
    if not axes:  # axis=(): every element is its own output, a column of one
        flat = _collapse(shape, strides)
        return Layout("columns", None if flat in (0, 1) else "contiguous", rows=math.prod(shape), stride=1)
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        rest = [d for d in range(nd) if d not in axes]
        moved = tuple(shape[d] for d in rest + list(axes))
        return _replace_copy(_layout_in(moved, _c_strides(moved), tuple(range(len(rest), nd))), "moveaxis")
    got = _layout_in(shape, strides, axes)
    if got is None:
        return _replace_copy(_layout_in(shape, _c_strides(shape), axes), "contiguous")
    return got


def _replace_copy(layout: Layout, copy: str) -> Layout:
    return Layout(layout.kind, copy, layout.rows, layout.length, layout.stride, layout.index_step, layout.inner,
                  layout.whole)


def _layout_in(shape, strides, axes) -> Layout | None:
    """In place, or None (a copy is needed)."""
    nd = len(shape)
    k0, k1 = axes[0], axes[-1] + 1
    if k0 == 0 and k1 == nd:  # every axis: the longest contiguous trailing run makes the rows
        c = nd
        while c > 0 and _collapse(shape[c - 1:], strides[c - 1:]) in (0, 1):
            c -= 1
        outer = _collapse(shape[:c], strides[:c])
        rows, length = math.prod(shape[:c]), math.prod(shape[c:])
        if outer is None or (rows > 1 and length < SHORT_ROW):
            return None
        return Layout("rows", None, rows=rows, length=length, stride=outer, index_step=length, whole=True)
    if _collapse(shape[k0:], strides[k0:]) not in (0, 1):  # the reduced run and what follows: contiguous
        return None
    outer = _collapse(shape[:k0], strides[:k0])
    if outer is None:
        return None
    rows, length, inner = math.prod(shape[:k0]), math.prod(shape[k0:k1]), math.prod(shape[k1:])
    if inner == 1 and length >= SHORT_ROW:
        return Layout("rows", None, rows=rows, length=length, stride=outer)
    return Layout("columns", None, rows=rows, length=length, stride=outer, inner=inner)


def row_splits(layout: Layout, itemsize: int, sms: int) -> int:
    """Blocks per row: enough blocks for the GPU, each with at least one unrolled pass of packs."""
    per_block = BLOCK * (16 // itemsize) * ROW_UNROLL
    most = max(1, -(-layout.length // per_block))
    want = max(1, -(-sms * BLOCKS_PER_SM // layout.rows))
    return int(min(most, want, (2**31 - 1) // max(layout.rows, 1)))


def whole_splits(n: int, itemsize: int, most: int) -> int:
    """stats_whole's grid for a C-contiguous array of ``n`` elements: row_splits of its one row, with
    ``most`` = sms * BLOCKS_PER_SM (the State of each block is what the last one merges)."""
    return min(most, -(-n // (BLOCK * (16 // itemsize) * ROW_UNROLL)))


def column_pieces(layout: Layout, sms: int) -> tuple[int, int]:
    """(piece, splits): the reduced run cut into pieces of at least MIN_PIECE elements, enough of them
    for the GPU's threads."""
    columns = layout.rows * layout.inner
    want = max(1, sms * THREADS_PER_SM // max(columns, 1))
    splits = max(1, min(want, -(-layout.length // MIN_PIECE)))
    piece = -(-layout.length // splits)
    return int(piece), int(-(-layout.length // piece))


def fold_grid(outputs: int, splits: int, sms: int) -> int:
    """stats_fold's grid: a block per output (the kernel's choice when the grid has a block for each)
    where each output merges more States than a warp loads at once and the blocks fit one wave; a
    warp per output otherwise (a smaller grid than ``outputs`` for two outputs or more; one output
    always gets the block)."""
    if outputs <= sms * 8 and splits > 32:
        return outputs
    return int(min(-(-outputs // (BLOCK // 32)), sms * 32))


# ------------------------------------------------------------------------------------------------
# launching
# ------------------------------------------------------------------------------------------------
_loaded: dict = {}
_MAX_LOADED = 1024  # kernel tables kept (per device, statistic, dtype and expression), past which the memo starts again


def _kernels_for(stat: str, dtype, device: int, steps=None) -> dict:
    key = (device, stat, dtype, steps)
    found = _loaded.get(key)
    if found is None:
        if steps is None:
            found = _kernels.get_standalone_kernels(ENTRY, stat_names(stat, dtype))
        else:  # the policy reading each element through the steps: compiled once per expression (NVRTC)
            from ..fusion import stat_reading_steps

            name, source = stat_reading_steps(stat_type(stat, dtype), steps, dtype)
            found = _kernels.get_standalone_kernels(ENTRY, stat_names(stat, dtype, name), extra=source)
        if len(_loaded) >= _MAX_LOADED:
            _loaded.clear()
        _loaded[key] = found
    return found


_sms: dict = {}


def _sm_count(device: int) -> int:
    found = _sms.get(device)
    if found is None:
        found = _sms[device] = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
    return found


def handles(block, stat: str) -> bool:
    return block.size > 0 and block.dtype in _dt.CUDA_TYPE_NAMES


_NULL = np.uint64(0)


def run(block, stat: str, axes, *, states: bool, result: bool, ddof: float = 0.0, steps=None):
    """(states, result) of ``stat`` over ``axes`` of ``block`` (on its GPU): ``states`` a device byte
    buffer of one State per output (view it with ``state_dtype``), ``result`` the final values
    (``result_dtype``), each only if asked for; outputs in C order of the kept axes. ``steps``
    (``fusion.Steps``): each element read through them, over ``block`` laid out as the chunk they stand
    for would be (fresh, C-ordered: the rows kernel's association follows the address)."""
    device = block.data.device_id
    if steps is not None:
        block = _cupy_backend.as_a_step_makes_it(block)
    isz = block.itemsize
    strides = tuple(s // isz for s in block.strides) if all(s % isz == 0 for s in block.strides) else None
    if strides is None:
        block, strides = cupy.ascontiguousarray(block), _c_strides(block.shape)
    layout = plan_layout(tuple(block.shape), strides, tuple(axes))
    if layout.copy == "moveaxis":
        rest = [d for d in range(block.ndim) if d not in axes]
        block = cupy.ascontiguousarray(cupy.moveaxis(block, sorted(axes), list(range(len(rest), block.ndim))))
    elif layout.copy == "contiguous":
        block = cupy.ascontiguousarray(block)
    ks = _kernels_for(stat, block.dtype, device, steps)
    sms = _sm_count(device)
    sdt = state_dtype(stat, block.dtype)
    if layout.kind == "rows":
        splits = row_splits(layout, isz, sms)
        parts = cupy.empty(layout.rows * splits * sdt.itemsize, dtype=np.uint8)
        ks["rows"](layout.rows * splits, BLOCK, (block, np.int64(layout.length), np.int64(layout.stride),
                                                 np.int64(layout.index_step), np.int32(splits), parts))
        fold_splits, split_stride, output_stride = (layout.rows * splits, 1, 0) if layout.whole else (splits, 1, splits)
    else:
        piece, splits = column_pieces(layout, sms)
        columns = layout.rows * layout.inner
        parts = cupy.empty(columns * splits * sdt.itemsize, dtype=np.uint8)
        grid = int(min(-(-columns * splits // BLOCK), sms * 64))
        ks["columns"](grid, BLOCK, (block, np.int64(layout.rows), np.int64(layout.stride), np.int64(layout.length),
                                    np.int64(layout.inner), np.int64(piece), np.int64(splits), parts))
        fold_splits, split_stride, output_stride = splits, columns, 1
    outputs = layout.outputs
    got_states = cupy.empty(outputs * sdt.itemsize, dtype=np.uint8) if states else None
    got_result = cupy.empty(outputs, dtype=result_dtype(stat, block.dtype)) if result else None
    mode = _MOMENTS.get(stat, 0)
    grid = fold_grid(outputs, fold_splits, sms)
    ks["fold"](grid, BLOCK, (parts, np.int64(outputs), np.int64(fold_splits), np.int64(split_stride),
                             np.int64(output_stride), _NULL if got_states is None else got_states,
                             _NULL if got_result is None else got_result, np.float64(ddof), np.int32(mode)))
    return got_states, got_result


class WholeLauncher:
    """``run`` of one (statistic, dtype) over every axis of a C-contiguous array, to its final value,
    bound to each device once: one launch of ``stats_whole`` (stats_rows' blocks, the last of them
    merging their States as stats_fold does: the same bits; the fold's own launch cost ~5 % at 2^26
    elements), the grid rule and a workspace per stream (the blocks' States and the arrivals counter the
    kernel leaves at 0), since a statistic at 2^26 elements is otherwise host-bound (the general path's
    layout, allocations and argument building cost more host time than the kernels' GPU time: python -m
    benchmarks stats --profile call). Returns None where the general path is needed (empty or
    non-contiguous input, data on another device than the current one)."""

    __slots__ = ("mode", "per_device", "result", "stat", "state", "type")

    def __init__(self, stat: str, dtype):
        self.stat, self.type = stat, np.dtype(dtype)
        self.state, self.result = state_dtype(stat, dtype), result_dtype(stat, dtype)
        self.mode = np.int32(_MOMENTS.get(stat, 0))
        self.per_device: dict[int, tuple] = {}

    def _bind(self, device: int) -> tuple:
        with cupy.cuda.Device(device):
            whole = _kernels.get_standalone_kernels(WHOLE_ENTRY, {"whole": whole_name(self.stat, self.type)})["whole"]
        most = _sm_count(device) * BLOCKS_PER_SM  # row_splits' bound for one row
        found = self.per_device[device] = (whole, most, {})
        return found

    def __call__(self, x, ddof: float = 0.0):
        n = x.size
        if n == 0 or not x._c_contiguous:
            return None
        device = cupy.cuda.runtime.getDevice()
        if x.data.device_id != device:
            return None
        whole, most, spaces = self.per_device.get(device) or self._bind(device)
        stream = _cupy_backend.stream_key()
        space = spaces.get(stream)
        if space is None:  # kernels on one stream run in order: the next call's blocks wait for this one's last
            states = cupy.empty(most * self.state.itemsize, dtype=np.uint8)
            space = spaces[stream] = (states, cupy.zeros(1, dtype=np.uint32))
        splits = whole_splits(n, x.itemsize, most)
        out = cupy.empty((), self.result)
        whole(splits, BLOCK, (x, np.int64(n), space[0], space[1], out, np.float64(ddof), self.mode))
        return out


# ------------------------------------------------------------------------------------------------
# chunk partials for StatPlan (numpy_stats' partial formats, on the host)
# ------------------------------------------------------------------------------------------------
def to_host(partial):
    return tuple(cupy.asnumpy(p) for p in partial)


def _kept(block, axes):
    return tuple(1 if d in axes else s for d, s in enumerate(block.shape))


def _states_then(block, stat, axes, steps, then):
    """``then(States)`` (host, kept shape) of ``stat`` over ``axes`` of ``block``; a ``Later`` where the caller
    asked for partials later (``backends.partials_later``): the States stay on the GPU until then."""
    states, _ = run(block, stat, axes, states=True, result=False, steps=steps)
    sdt, kept = state_dtype(stat, block.dtype), _kept(block, axes)

    def made(raw):
        return then(raw.view(sdt).reshape(kept))

    return Later(states, made) if later_wanted() else made(states.get())


def _evaluated(block, steps):
    return block if steps is None else steps.evaluate(block)


def arg_partial(st, dtype, block_shape, axes, largest, skipnan, offsets, shape):
    """numpy_stats' (value, global index, seen) partial from the kernel's States ``st`` (host, kept
    shape) of a chunk of ``block_shape`` starting at ``offsets`` in the whole array of ``shape``. The
    nan-forms' State keeps its key NaN only for a slice that held nothing but NaN (its index is then
    the slice's first NaN, a candidate that ranks as -inf/+inf); the partial holds that rank and
    ``seen`` False, so a later -inf still loses the tie to the earlier NaN across chunks."""
    value = st["key"].astype(dtype)
    seen = np.ones(value.shape, dtype=bool)
    if skipnan and np.dtype(dtype).kind == "f":
        seen = ~np.isnan(value)
        value[~seen] = -np.inf if largest else np.inf
    local = st["index"].astype(np.int64)
    if len(block_shape) == 1:  # the flat index is the chunk's own plus its start (the common held chunk)
        return value, np.where(local >= 0, local + offsets[0], -1), seen
    if len(axes) == len(block_shape):  # one flat index: the chunk's position in the whole array
        if block_shape and local.ravel()[0] >= 0:
            at = np.unravel_index(int(local.ravel()[0]), block_shape)
            local = np.full_like(local, np.ravel_multi_index(tuple(w + o for w, o in zip(at, offsets)), shape))
        return value, local, seen
    (axis,) = axes
    return value, np.where(local >= 0, local + offsets[axis], -1), seen


def arg_chunk(block, axes, largest, skipnan, offsets, shape, steps=None):
    with on_device_of(block):
        if not handles(block, "argmax"):
            return to_host(_host.arg_chunk(_evaluated(block, steps), axes, largest, skipnan, offsets, shape, xp=cupy))
        stat = ("nanarg" if skipnan else "arg") + ("max" if largest else "min")
        dtype, block_shape = block.dtype, tuple(block.shape)
        return _states_then(block, stat, axes, steps, lambda st: arg_partial(
            st, dtype, block_shape, axes, largest, skipnan, offsets, shape))


def _moments(st):
    return tuple(np.ascontiguousarray(st[f]) for f in ("n", "anchor", "offset", "m2"))


def moments_chunk(block, axes, skipnan, steps=None):
    with on_device_of(block):
        if not handles(block, "var"):
            return to_host(_host.moments_chunk(_evaluated(block, steps), axes, skipnan, xp=cupy))
        return _states_then(block, "nanvar" if skipnan else "var", axes, steps, _moments)


def extreme_chunk(block, axes, largest, steps=None):
    with on_device_of(block):
        if not handles(block, "nanmax"):
            return to_host(_host.extreme_chunk(_evaluated(block, steps), axes, largest, xp=cupy))
        kept = _kept(block, axes)
        dtype, count = block.dtype, math.prod(block.shape[a] for a in axes)

        def extreme(st):
            value = st["value"].astype(dtype)
            if dtype.kind == "f":
                value = np.where(st["seen"] != 0, value, np.nan).astype(dtype)
            return value, np.full(kept, count, dtype=np.int64)

        return _states_then(block, "nanmax" if largest else "nanmin", axes, steps, extreme)


def truth_chunk(block, axes, every):
    with on_device_of(block):
        if not handles(block, "any"):
            return to_host(_host.truth_chunk(block, axes, every, xp=cupy))
        return _states_then(block, "all" if every else "any", axes, None, lambda st: (st["value"] != 0,))


def count_chunk(block, axes):
    with on_device_of(block):
        if not handles(block, "count_nonzero"):
            return to_host(_host.count_chunk(block, axes, xp=cupy))
        return _states_then(block, "count_nonzero", axes, None, lambda st: (np.ascontiguousarray(st["value"]),))
