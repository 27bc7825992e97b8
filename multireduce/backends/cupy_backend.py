"""The GPU backend: every operator on CuPy arrays through our kernels, on the device that holds them.

Dispatch (written down, as CUB does):
- reduce, 1-d or a few long rows: commutative -> ``reduce_vectorized`` (one launch; one block when the
  input is small), otherwise ``reduce_ordered_multi_block``; many rows -> ``reduce_rows``; an axis that
  is not the last -> ``reduce_columns``, split along K when there are too few columns to fill the GPU.
- scan: rows -> ``scan_lookback`` (one pass, carry-in per row from device memory), or on sm_90 for the
  fixed look-back of float32 ``scan_lookback_clustered`` (one look-back per thread-block cluster of
  tiles: ``kernels.scan_cluster``); an axis that is not the last -> ``scan_columns`` when there are
  enough columns, else transposed to rows and back.
- ``algorithm=`` names a catalogue kernel instead; the catalogue runs on rows, from its own modules
  (``kernels.reduce_catalogue_names`` / ``scan_catalogue_names``), compiled only when first asked for.
Nothing here synchronises with the host: results stay on the device.
"""

from __future__ import annotations

import functools
import math
import os
import threading

import cupy
import numpy as np

from .. import dtypes as _dt
from .. import kernels as _k
from ..operators import Operator
from ..tuning import policy as _policy

NULL = np.uint64(0)  # a null device pointer as a kernel argument


def concatenate(values, axis=0):
    return cupy.concatenate(values, axis=axis)


# ------------------------------------------------------------------------------------------------
# Device facts and reusable workspace
# ------------------------------------------------------------------------------------------------
_device_facts: dict[int, tuple[int, object]] = {}


def _facts():
    dev = cupy.cuda.runtime.getDevice()
    facts = _device_facts.get(dev)
    if facts is None:
        device = cupy.cuda.Device(dev)
        major = int(device.compute_capability[:-1])
        facts = (device.attributes["MultiProcessorCount"], _policy(major))
        _device_facts[dev] = facts
    return facts


_workspaces: dict[tuple, list] = {}
_MAX_WORKSPACES = 64  # a stream made per request would otherwise add one per stream, each holding GPU memory


_PER_THREAD_STREAM = 2  # cudaStreamPerThread: one handle, a different stream in every host thread


def stream_key():
    """The current stream, as the key of scratch reused by the launches queued on it: its handle, and the
    host thread too for the per-thread default stream (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1), whose one
    handle is a different stream in each thread, so that two threads never share scratch."""
    ptr = cupy.cuda.get_current_stream().ptr
    return (ptr, threading.get_ident()) if ptr == _PER_THREAD_STREAM else ptr


def _workspace(grid: int, acc: np.dtype) -> tuple[cupy.ndarray, cupy.ndarray]:
    """(partials, counter) for a one-launch reduction on the current stream: scratch for one partial per
    block and a zeroed counter for the last-block guard (the last block resets it). Reused per (device,
    stream, dtype): launches on one stream run in order, so the next one cannot overwrite partials still
    being read."""
    key = (cupy.cuda.runtime.getDevice(), stream_key(), acc)
    space = _workspaces.get(key)
    if space is None:
        if len(_workspaces) >= _MAX_WORKSPACES:
            # the oldest: CuPy's pool reuses its blocks only on the stream they came from, after the work queued there
            _workspaces.pop(next(iter(_workspaces)))
        space = _workspaces[key] = [cupy.empty(max(grid, 4096), acc), cupy.zeros(1, dtype=np.uint32)]
    elif space[0].size < grid:
        space[0] = cupy.empty(grid, acc)
    return space[0], space[1]


@functools.lru_cache(maxsize=1024)  # keyed by operator objects: bounded, as operators come and go
def _identity(op: Operator, acc: np.dtype):
    return op.identity(acc)


def _i64(v) -> np.int64:
    return np.int64(v)


def _three_axes(x, axes: tuple[int, ...], commutative: bool):
    """View ``x`` as a C-contiguous (outer, K, inner) array with ``axes`` in the middle.

    Contiguous data whose reduced axes are adjacent needs no copy; otherwise commutative work moves
    the axes to the end (one copy), and non-commutative work (one axis) makes ``x`` contiguous.
    """
    shape = x.shape
    a0, a1 = axes[0], axes[-1]
    adjacent = a1 - a0 + 1 == len(axes)
    if adjacent and (x.flags.c_contiguous or not commutative):
        x = cupy.ascontiguousarray(x)
        outer = math.prod(shape[:a0])
        K = math.prod(shape[a0 : a1 + 1])
        return x.reshape(outer, K, math.prod(shape[a1 + 1 :])), outer, K, math.prod(shape[a1 + 1 :])
    kept = [d for d in range(x.ndim) if d not in axes]
    moved = cupy.ascontiguousarray(x.transpose(kept + list(axes)))
    outer = math.prod(shape[d] for d in kept)
    K = math.prod(shape[d] for d in axes)
    return moved.reshape(outer, K, 1), outer, K, 1


# ------------------------------------------------------------------------------------------------
# Reductions
# ------------------------------------------------------------------------------------------------
def _reduce_kernels(op: Operator, T, acc, catalogue: bool = False):
    """(role -> kernel, SMs, policy) of the production reductions, or the catalogue's."""
    return _reduce_kernels_on(cupy.cuda.runtime.getDevice(), op, np.dtype(T), np.dtype(acc), catalogue)


@functools.lru_cache(maxsize=4096)
def _reduce_kernels_on(device: int, op: Operator, T: np.dtype, acc: np.dtype, catalogue: bool):
    sms, p = _facts()
    names = _k.reduce_catalogue_names if catalogue else _k.reduce_names
    return _k.get_kernels(op, names(_k.ctype(T), _k.ctype(acc), op.cuda_functor, p)), sms, p


def _vectorized_rule(T: np.dtype, sms: int, p) -> tuple[int, int, int]:
    """(elements per block per pass, most blocks, threads per block) of ``reduce_vectorized``:
    grid = min(ceil(n / first), second)."""
    per_block = p.reduce_block * (16 // T.itemsize) * p.reduce_vectors_per_thread
    return per_block, sms * p.reduce_blocks_per_sm, p.reduce_block


def _launch_vectorized(kernel, rule, x1, n: int, identity, out1, space) -> None:
    """``reduce_vectorized`` of the contiguous ``x1`` (n elements) into ``out1``; ``space`` is
    (partials, counter) with room for the rule's largest grid."""
    per_block, max_grid, block = rule
    grid = min(-(-n // per_block), max_grid)
    kernel(grid, block, (x1, np.int64(n), identity, space[0] if grid > 1 else out1, out1, space[1]))


def _reduce_1d(x1, op: Operator, acc, identity, out1, algorithm: str) -> None:
    """Reduce the contiguous 1-d array ``x1`` into the one-element device array ``out1``."""
    n = x1.size
    ks, sms, p = _reduce_kernels(op, x1.dtype, acc)
    if algorithm in ("auto", "vectorized") and op.commutative:
        rule = _vectorized_rule(x1.dtype, sms, p)
        _launch_vectorized(ks["vectorized"], rule, x1, n, identity, out1, _workspace(rule[1], acc))
        return
    if algorithm in ("auto", "ordered_multi_block"):
        tile = p.ordered_block * p.ordered_items
        grid = max(1, min(-(-n // (tile * 4)), sms * 4))
        segment = -(-n // grid)
        partials, counter = _workspace(grid, acc)
        ks["ordered_multi_block"](grid, p.ordered_block, (x1, _i64(n), _i64(segment), identity,
                                                          partials if grid > 1 else out1, out1, counter))
        return
    ks, _, _ = _reduce_kernels(op, x1.dtype, acc, catalogue=True)
    if algorithm == "ordered_single_block":
        ks["ordered_single_block"](1, p.ordered_block, (x1, _i64(n), identity, out1))
        return
    block = p.catalogue_block
    if algorithm == "last_block":
        grid = max(1, min(-(-n // block), 2 * sms))
        ks["last_block"](grid, block, (x1, _i64(n), identity, cupy.empty(grid, acc), out1, _workspace(1, acc)[1]))
        return
    # the *_partials rungs: launch until one partial is left
    current = x1
    while True:
        m = current.size
        if algorithm in ("first_add", "unroll_last_warp", "complete_unroll"):
            grid = -(-m // (2 * block))
        elif algorithm in ("grid_stride", "warp_shuffle"):
            grid = min(-(-m // block), 2 * sms)
        else:
            grid = -(-m // block)
        grid = max(grid, 1)
        partials = out1 if grid == 1 else cupy.empty(grid, acc)
        ks[algorithm](grid, block, (current, _i64(m), identity, partials))
        if grid == 1:
            return
        current = partials
        ks, _, _ = _reduce_kernels(op.partials, acc, acc, catalogue=True)


def _reduce_columns(x3, op, acc, identity, outer, K, inner, sms, p):
    """(outer, K, inner) -> (outer * inner,), splitting K into in-order segments when columns are few."""
    columns = outer * inner
    target = sms * 2048
    segments = 1
    if columns < target and K >= 64:
        segments = int(min(K // 32, max(1, target // columns)))
    segment = -(-K // segments)
    segments = -(-K // segment)
    ks, _, _ = _reduce_kernels(op, x3.dtype, acc)
    out = cupy.empty(outer * segments * inner, acc)
    total = outer * segments * inner
    block = p.elementwise_block
    grid = max(1, min(-(-total // block), sms * 32))
    ks["columns"](grid, block, (x3, _i64(outer), _i64(K), _i64(inner), _i64(segments), _i64(segment), identity, out))
    if segments == 1:
        return out
    # the segments' partials are folded as they are: no load transform on them
    return _reduce_columns(out.reshape(outer, segments, inner), op.partials, acc, identity, outer, segments, inner,
                           sms, p)


_unfused_warned: set = set()  # operators whose kernels failed to build: not tried again in this process


def _unfused(op: Operator, error: Exception | None = None):
    """(steps, plain operator) of an operator that reads its input through elementwise steps
    (``fusion.FusedOperator``) whose kernels failed to build (``error``; None: asks whether they did): the
    steps are then applied by CuPy and the plain operator's kernels run, the unfused path's bits, slower.
    None for any other operator."""
    unfused = getattr(op, "unfused", None)
    if unfused is None or (error is None and op.name not in _unfused_warned):
        return None
    if op.name not in _unfused_warned:
        _unfused_warned.add(op.name)
        import warnings

        warnings.warn(f"multireduce: the kernels reading through elementwise steps ({op.cuda}) failed to build; "
                      f"the steps run as CuPy kernels instead. Set multireduce.fuse-elementwise to False to "
                      f"skip them. {error}", RuntimeWarning, stacklevel=3)
    return unfused()


def as_a_step_makes_it(x):
    """``x`` laid out as the chunk elementwise steps over it would be (``fusion``): CuPy makes each step's
    result a fresh C-contiguous array, and our kernels' association follows the address (a misaligned start
    is read element by element first), so a chunk that is a view (misaligned, strided or in Fortran order:
    ``da.from_array`` of a device array slices it) is copied first, as the unfused step would have, and the
    unfused bits are kept."""
    if x._c_contiguous and x.data.ptr % 16 == 0:
        return x
    return x.copy(order="C")


def _as_the_steps_make_it(x, op: Operator):
    """``as_a_step_makes_it`` for an operator reading through steps; any other operator's input as it is."""
    return x if getattr(op, "steps", None) is None else as_a_step_makes_it(x)


def reduce(x, op: Operator, axes: tuple[int, ...], acc_dtype, algorithm: str = "auto"):
    """Reduce ``axes`` of ``x`` with ``op``, accumulating in ``acc_dtype``; reduced axes kept (size 1)."""
    found = _unfused(op)
    if found is None:
        try:
            return _reduce(_as_the_steps_make_it(x, op), op, axes, acc_dtype, algorithm)
        except _k.KernelError as error:
            found = _unfused(op, error)
            if found is None:
                raise
    steps, plain = found
    return _reduce(steps(x), plain, axes, acc_dtype, algorithm)


def _reduce(x, op: Operator, axes: tuple[int, ...], acc_dtype, algorithm: str = "auto"):
    acc = np.dtype(acc_dtype)
    identity = _identity(op, acc)
    keep_shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    if not axes:  # axis=(): every element its own one-element reduction, read as the operator loads it
        return cupy.asarray(op.load(x)).astype(acc)
    if x.ndim == 0:
        x = x.reshape(1)
        axes = (0,)
    x3, outer, K, inner = _three_axes(x, axes, op.commutative)
    if outer * inner == 0:
        return cupy.empty(keep_shape, acc)
    if K == 0:
        return cupy.full(keep_shape, identity, acc)
    sms, p = _facts()
    if algorithm == "auto" and inner > 1:
        return _reduce_columns(x3, op, acc, identity, outer, K, inner, sms, p).reshape(keep_shape)
    if inner > 1:  # a catalogue kernel works on rows: move the axis last
        x3 = cupy.ascontiguousarray(x3.transpose(0, 2, 1)).reshape(outer * inner, K, 1)
        outer, inner = outer * inner, 1
    out = cupy.empty(outer, acc)
    rows = x3.reshape(outer, K)
    if algorithm == "auto" and outer > 1 and not (outer <= 2 * sms and K >= 1 << 16):
        ks, _, _ = _reduce_kernels(op, x3.dtype, acc)
        role = "rows" if op.commutative else "rows_ordered"
        ks[role](min(outer, sms * 16), p.reduce_row_block, (rows, _i64(outer), _i64(K), identity, out))
    elif outer == 1:
        _reduce_1d(x3.reshape(K), op, acc, identity, out, algorithm)
    else:
        for r in range(outer):
            _reduce_1d(rows[r], op, acc, identity, out[r : r + 1], algorithm)
    return out.reshape(keep_shape)


def bind(op: Operator, T, acc_dtype, out_dtype, mean=False):
    """The eager launcher of a whole-array reduction (``core.ReductionPlan.launch``; ``mean``: divided
    by the element count), or None for non-commutative operators (their ordered kernel is launched by
    ``reduce``)."""
    return Launcher(op, T, acc_dtype, out_dtype, mean) if op.commutative else None


class Launcher:
    """``reduce_vectorized`` over a whole array for one (operator, input dtype, accumulator, result
    dtype), bound to each device once: the kernel, its grid rule and a workspace per stream, looked up
    once because small inputs spend most of their time in Python. Returns None where the general path
    is needed (empty or non-contiguous input, data on another device than the current one, a misaligned
    chunk read through elementwise steps: ``_as_the_steps_make_it``)."""

    __slots__ = ("acc", "cast", "divisor", "identity", "op", "per_device", "steps", "type")

    def __init__(self, op: Operator, T, acc, out, mean=False):
        self.op, self.type, self.acc = op, np.dtype(T), np.dtype(acc)
        self.cast = None if np.dtype(out) == self.acc and not mean else np.dtype(out)
        # the count's type as core.ReductionPlan.finalize divides by it: the same bits as the general path
        self.divisor = _dt.division_dtype(self.acc).type if mean else None
        self.identity = _identity(op, self.acc)
        self.steps = getattr(op, "steps", None) is not None  # misaligned views go the general way
        self.per_device: dict[int, tuple] = {}

    def _bind(self, device: int) -> tuple:
        # its own per-stream workspace, sized for the largest grid: going through _workspace (a key with
        # the dtype in it) measured ~1 us more per call at 2^10 on an H200 (python -m benchmarks reduce --profile small)
        ks, sms, p = _reduce_kernels(self.op, self.type, self.acc)
        state = self.per_device[device] = (ks["vectorized"], _vectorized_rule(self.type, sms, p), {})
        return state

    def __call__(self, x):
        # ndarray._c_contiguous is the flag itself; x.flags builds an object on every call
        if x.size == 0 or not x._c_contiguous or (self.steps and x.data.ptr % 16):
            return None
        device = cupy.cuda.runtime.getDevice()
        if x.data.device_id != device:
            return None
        kernel, rule, spaces = self.per_device.get(device) or self._bind(device)
        stream = stream_key()
        space = spaces.get(stream)
        if space is None:
            space = spaces[stream] = (cupy.empty(rule[1], self.acc), cupy.zeros(1, dtype=np.uint32))
        out = cupy.empty((), self.acc)
        _launch_vectorized(kernel, rule, x, x.size, self.identity, out, space)
        if self.cast is None:
            return out
        return finish(out, None if self.divisor is None else self.divisor(x.size), self.cast)


@functools.lru_cache(maxsize=256)
def _finish_kernel(device: int, acc: np.dtype, out: np.dtype):
    return _k.get_standalone_kernels(_k.FINISH_ENTRY, _k.finish_names(acc, out))["finish"]


class FiniteProbe:
    """What a few elements of a CuPy float array say, known before a reduction launched after the probe
    has finished: nanmin/nanmax of a whole array warn, as NumPy does, about an all-NaN slice, and
    nanmean/nanvar about a slice with too few numbers, which needs the result on the host, and waiting for
    it left the GPU idle between calls (nanmax 0.60-0.70 x the copy roof at 2^26 float32 on an H200).
    ``launch`` queues ``finite_probe`` (kernels/finish.cuh) over the first kernels.PROBE_BLOCK elements
    and as many less one spread over the array, on the current stream, writing into a slot of pinned,
    mapped host memory; ``counts`` waits for that launch alone and gives (finite samples, samples that are
    not NaN): lower bounds of the array's own counts, which prove the warning away when large enough (the
    caller checks the result otherwise). Slots are taken from a free list, so threads never share one;
    with none free, ``launch`` returns None."""

    SLOTS = 64
    __slots__ = ("events", "free", "flags", "kernels", "pointer")

    def __init__(self, device: int):
        with cupy.cuda.Device(device):
            self.pointer = cupy.cuda.runtime.hostAlloc(8 * self.SLOTS, 3)  # portable | mapped: UVA, one address
            self.events = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(self.SLOTS)]
            self.kernels = {size: _k.get_standalone_kernels(_k.FINISH_ENTRY, {"probe": name})["probe"]
                            for size, name in _k.PROBE_NAMES.items()}
        import ctypes

        self.flags = np.ctypeslib.as_array((ctypes.c_int32 * (2 * self.SLOTS)).from_address(self.pointer))
        self.flags = self.flags.reshape(self.SLOTS, 2)
        self.free = list(range(self.SLOTS))

    def launch(self, x):
        try:
            slot = self.free.pop()
        except IndexError:
            return None
        n = x.size
        stride = max(_k.PROBE_BLOCK, n // _k.PROBE_BLOCK)  # no element sampled twice
        self.kernels[x.itemsize](1, _k.PROBE_BLOCK, (x, np.int64(n), np.int64(stride),
                                                     np.uint64(self.pointer + 8 * slot)))
        self.events[slot].record()
        return slot

    def counts(self, slot) -> tuple[int, int]:
        try:
            self.events[slot].synchronize()
            return int(self.flags[slot, 0]), int(self.flags[slot, 1])
        finally:
            self.free.append(slot)


_probes: dict = {}


def finite_probe(x):
    """(probe, slot) of FiniteProbe.launch over ``x`` (a CuPy float array, C- or F-contiguous, on the
    current device), or None where it does not apply (then the caller waits for its result as before)."""
    if x.itemsize not in _k.PROBE_NAMES or not (x.flags.c_contiguous or x.flags.f_contiguous):
        return None
    device = x.data.device_id
    if device != cupy.cuda.runtime.getDevice():
        return None
    probe = _probes.get(device)
    if probe is None:
        probe = _probes[device] = FiniteProbe(device)
    slot = probe.launch(x)
    return None if slot is None else (probe, slot)


def finish(value, divisor, out_dtype):
    """``value`` (an accumulator array) as ``out_dtype``, divided first by ``divisor`` (a scalar of
    ``dtypes.division_dtype(value.dtype)``; None: no division): ``(value / divisor).astype(out_dtype)``
    through our prebuilt kernel, since CuPy's would compile at first use. ``value`` itself where nothing
    is to be done, as astype(copy=False)."""
    out_dtype = np.dtype(out_dtype)
    if divisor is None and value.dtype == out_dtype:
        return value
    if not value._c_contiguous:
        # not cupy.ascontiguousarray: it makes a 0-d value 1-d, as NumPy's does
        value = value.copy()
    out = cupy.empty(value.shape, out_dtype)
    n = value.size
    if n:
        sms, p = _facts()
        kernel = _finish_kernel(cupy.cuda.runtime.getDevice(), value.dtype, out_dtype)
        grid = max(1, min(-(-n // p.elementwise_block), sms * 8))
        kernel(grid, p.elementwise_block, (value, np.int64(n), _dt.division_dtype(value.dtype).type(0 if divisor is None else divisor),
                                           np.int32(divisor is not None), out))
    return out


def combine(op: Operator, values: list):
    """Fold equally shaped partials in order (one column reduction over the stacked partials)."""
    if len(values) == 1:
        return values[0]
    stacked = cupy.stack(values)
    return reduce(stacked, op.partials, (0,), stacked.dtype)[0]


# ------------------------------------------------------------------------------------------------
# Scans
# ------------------------------------------------------------------------------------------------
def _scan_kernels(op, T, acc, out_dtype, shape=None, deterministic=False):
    """The production scan group for these types; ``shape`` the look-back kernel's tile, else the policy's;
    ``deterministic`` the look-back's fixed variant (and its clustered form where the policy has one)."""
    sms, p = _facts()
    sizes = (np.dtype(T).itemsize, acc.itemsize, np.dtype(out_dtype).itemsize)
    shape = shape or p.scan_shape(*sizes)
    cluster = _k.scan_cluster(p, *sizes, deterministic)
    names = _k.scan_names(_k.ctype(T), _k.ctype(acc), _k.ctype(out_dtype), op.cuda_functor, p, shape, deterministic,
                          cluster)
    return _k.get_kernels(op, names), sms, p, shape


def _scan_catalogue_kernels(op, T, acc, out_dtype):
    """The catalogue's scan group for these types, compiled on first use."""
    sms, p = _facts()
    names = _k.scan_catalogue_names(_k.ctype(T), _k.ctype(acc), _k.ctype(out_dtype), op.cuda_functor, p)
    return _k.get_kernels(op, names), sms, p


#: Environment override of the look-back variant, for benchmarks and bisecting: "fixed" (deterministic
#: for every operator) or "free" (timing-dependent association for every operator); unset or "auto":
#: ``kernels.fixed_lookback`` (fixed for float accumulators of sum, prod and user operators).
LOOKBACK_ENV = "MULTIREDUCE_SCAN_LOOKBACK"
_LOOKBACK_CHOICES = {"fixed": True, "free": False, "auto": None, "": None}


def _deterministic(op, acc, deterministic) -> bool:
    if deterministic is None:
        choice = os.environ.get(LOOKBACK_ENV, "").strip().lower()
        if choice not in _LOOKBACK_CHOICES:
            raise ValueError(f"environment variable {LOOKBACK_ENV} is {choice!r}; expected 'fixed', 'free' or 'auto'")
        deterministic = _LOOKBACK_CHOICES[choice]
    return _k.fixed_lookback(op, acc) if deterministic is None else bool(deterministic)


_occupancy: dict[tuple, int | None] = {}


def _occupancy_from_attributes(fn, device: int, block: int) -> int:
    """The driver's arithmetic from the kernel's attributes and the device's limits."""
    attrs = fn.attributes
    dev = cupy.cuda.Device(device).attributes
    warps = -(-block // 32)
    by_threads = dev["MaxThreadsPerMultiProcessor"] // (warps * 32)
    regs = -(-max(attrs["num_regs"], 1) * 32 // 256) * 256 * warps  # granted per warp, 256 registers at a time
    by_registers = dev["MaxRegistersPerMultiprocessor"] // regs
    by_shared = dev["MaxSharedMemoryPerMultiprocessor"] // (attrs["shared_size_bytes"] + 1024)  # 1 KB reserved per block
    return max(0, min(by_threads, by_registers, by_shared, dev.get("MaxBlocksPerMultiprocessor", 32)))


def scan_occupancy(kernel, block: int) -> int | None:
    """Resident blocks per SM of a look-back ``kernel`` (a ``kernels.Kernel``) at ``block`` threads, as the
    driver reports it (cuOccupancyMaxActiveBlocksPerMultiprocessor through CuPy), else computed from the
    kernel's attributes; None if neither can be had. The launch bounds' blocks-per-SM in kernels/scan.cuh
    are only a register-budget hint for ptxas; this is the number that holds. Correctness does not depend
    on it (tiles wait only for lower block indices, see kernels/scan.cuh); 0 means the tile cannot run."""
    device = cupy.cuda.runtime.getDevice()
    key = (device, kernel.expression, block)
    if key in _occupancy:
        return _occupancy[key]
    fn = kernel.fn
    try:
        found = int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, 0))
    except Exception:  # no such call in this CuPy, or a kernel object without a handle
        try:
            found = _occupancy_from_attributes(fn, device, block)
        except Exception:
            found = None
    _occupancy[key] = found
    return found


def lookback_scan(rows, out_rows, op, acc, identity, carry, inclusive: bool, shape=None, deterministic=None) -> None:
    """One-pass decoupled look-back scan of the contiguous (R, K) ``rows`` into ``out_rows``, each row
    seeded by ``carry[row]`` (None: the identity); ``shape`` (a tuning.ScanShape) overrides the policy's;
    ``deterministic`` (private: benchmarks and tests) forces the fixed (True) or free (False) look-back,
    None takes $MULTIREDUCE_SCAN_LOOKBACK, else ``kernels.fixed_lookback``."""
    R, K = rows.shape
    deterministic = _deterministic(op, acc, deterministic)
    ks, sms, p, shape = _scan_kernels(op, rows.dtype, acc, out_rows.dtype, shape, deterministic)
    tiles_per_row = -(-K // shape.tile(rows.dtype.itemsize))
    cluster = _k.scan_cluster(p, rows.dtype.itemsize, acc.itemsize, out_rows.dtype.itemsize, deterministic)
    if tiles_per_row < _k.CLUSTERS_PER_ROW_MIN * cluster:
        cluster = 0
    kernel = ks["lookback_clustered" if cluster else "lookback"]
    if scan_occupancy(kernel, shape.block) == 0:
        raise _k.KernelError(f"{kernel.expression}: the driver fits no block of {shape.block} threads on an SM of "
                             f"this GPU (registers or shared memory); pick a smaller tuning.ScanShape")
    launched_per_row, grid, descriptors = _k.lookback_geometry(R, tiles_per_row, cluster)  # one block per tile
    per_descriptor = 1 if acc.itemsize <= 4 else 2  # 8- or 16-byte descriptors (kernels/scan.cuh)
    words = cupy.zeros(descriptors * per_descriptor, np.uint64)
    kernel(grid, shape.block, (rows, out_rows, _i64(K), _i64(launched_per_row), identity,
                               NULL if carry is None else carry, words, np.int32(inclusive)))


def _inclusive_multilevel(rows, op, acc, identity, algorithm):
    """Catalogue scan of a contiguous (R, K) array into a new (R, K) Acc array, any K.

    Block scans, then the per-row tile totals are scanned by the same function (recursion, so any
    length works: the seed stops at two levels), then added back to every tile but each row's first.
    """
    R, K = rows.shape
    ks, sms, p = _scan_catalogue_kernels(op, rows.dtype, acc, acc)
    tile = p.scan_block if algorithm == "hillis_steele" else 2 * p.scan_block
    tiles = -(-K // tile)
    out = cupy.empty((R, K), acc)
    totals = cupy.empty((R, tiles), acc)
    ks[algorithm](R * tiles, p.scan_block, (rows, out, _i64(K), _i64(tiles), identity, totals))
    if tiles > 1:
        scanned = _inclusive_multilevel(totals, op, acc, identity, algorithm)
        ks_acc, _, _ = _scan_catalogue_kernels(op, acc, acc, acc)
        ks_acc["add_back"](R * tiles, p.elementwise_block, (out, _i64(K), _i64(tile), _i64(tiles), scanned))
    return out


def _scan_rows(rows, out_rows, op, acc, identity, carry, inclusive, algorithm) -> None:
    if algorithm in ("auto", "decoupled_lookback"):
        lookback_scan(rows, out_rows, op, acc, identity, carry, inclusive)
        return
    R, K = rows.shape
    inclusive_scan = _inclusive_multilevel(rows, op, acc, identity, algorithm)
    ks_fin, sms, p = _scan_catalogue_kernels(op, acc, acc, out_rows.dtype)
    n = R * K
    grid = max(1, min(-(-n // p.elementwise_block), sms * 8))
    ks_fin["finish"](grid, p.elementwise_block, (inclusive_scan, out_rows, _i64(R), _i64(K),
                                                  NULL if carry is None else carry, identity, np.int32(inclusive)))


def scan(x, op: Operator, axis: int, acc_dtype, out_dtype, carry=None, inclusive: bool = True,
         algorithm: str = "auto"):
    """Scan ``x`` along ``axis``; ``carry`` (keepdims shape, on the device) is folded in on the left."""
    found = _unfused(op)
    if found is None:
        try:
            return _scan(x, op, axis, acc_dtype, out_dtype, carry, inclusive, algorithm)
        except _k.KernelError as error:
            found = _unfused(op, error)
            if found is None:
                raise
    steps, plain = found
    return _scan(steps(x), plain, axis, acc_dtype, out_dtype, carry, inclusive, algorithm)


def _scan(x, op: Operator, axis: int, acc_dtype, out_dtype, carry=None, inclusive: bool = True,
          algorithm: str = "auto"):
    acc, out_dtype = np.dtype(acc_dtype), np.dtype(out_dtype)
    identity = _identity(op, acc)
    out = cupy.empty(x.shape, out_dtype)
    if x.size == 0:
        return out
    shape = x.shape
    outer, K, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    x3 = cupy.ascontiguousarray(x).reshape(outer, K, inner)
    if carry is not None:
        carry = cupy.ascontiguousarray(carry.astype(acc, copy=False)).reshape(outer * inner)
    if inner == 1:
        _scan_rows(x3.reshape(outer, K), out.reshape(outer, K), op, acc, identity, carry, inclusive, algorithm)
        return out
    sms, p = _facts()
    if algorithm == "auto" and outer * inner >= p.column_min_threads:
        ks, _, _, _ = _scan_kernels(op, x.dtype, acc, out_dtype, deterministic=_deterministic(op, acc, None))
        grid = max(1, min(-(-(outer * inner) // p.elementwise_block), sms * 32))
        ks["columns"](grid, p.elementwise_block, (x3, out, _i64(outer), _i64(K), _i64(inner), identity,
                                  NULL if carry is None else carry, np.int32(inclusive)))
        return out
    # few long columns: scan them as rows of a transposed copy
    rows = cupy.ascontiguousarray(x3.transpose(0, 2, 1)).reshape(outer * inner, K)
    out_rows = cupy.empty((outer * inner, K), out_dtype)
    _scan_rows(rows, out_rows, op, acc, identity, carry, inclusive, algorithm)
    out[...] = out_rows.reshape(outer, inner, K).transpose(0, 2, 1).reshape(shape)
    return out


# ------------------------------------------------------------------------------------------------
# Bounds of float16/float32 values for sums exact in float64 (dtypes.exact_in_any_order)
# ------------------------------------------------------------------------------------------------
# From the bits: |v| = m 2**base with m a whole number, so floor(log2 |v|) = base + 31 - clz(m) and the
# lowest set bit is base + ffs(m) - 1. One read of the chunk, one pair of atomics per warp.
_BOUNDS_SOURCE = r"""
#define MR_NO_TOP (%(no_top)d)
#define MR_NO_GRID (%(no_grid)d)
__device__ __forceinline__ void mr_take(unsigned m, int base, int& top, int& grid) {
  top = max(top, base + 31 - __clz(m));
  grid = min(grid, base + __ffs(m) - 1);
}
__device__ __forceinline__ void mr_publish(int top, int grid, int* out) {
  for (int o = 16; o > 0; o >>= 1) {
    top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    grid = min(grid, __shfl_xor_sync(0xffffffffu, grid, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(out, top);
    atomicMin(out + 1, grid);
  }
}
// the bounds of one IEEE value of kMantissa fraction bits and kExponent exponent bits, read as bits
template <int kMantissa, int kExponent>
__device__ __forceinline__ void mr_bounds_of(unsigned b, int& top, int& grid) {
  const unsigned magnitude = (1u << (kMantissa + kExponent)) - 1u, infinite = ((1u << kExponent) - 1u) << kMantissa;
  const int bias = (1 << (kExponent - 1)) - 1;
  b &= magnitude;
  if (b == 0u || b >= infinite) return;
  const int field = (int)(b >> kMantissa);
  const unsigned m = b & ((1u << kMantissa) - 1u);
  if (field) mr_take(m | (1u << kMantissa), field - bias - kMantissa, top, grid);
  else mr_take(m, 1 - bias - kMantissa, top, grid);
}
// each 32-bit word holds 32 / kBits values
template <int kBits, int kMantissa, int kExponent>
__device__ __forceinline__ void mr_bounds_of_word(unsigned w, int& top, int& grid) {
#pragma unroll
  for (int k = 0; k < 32 / kBits; ++k) mr_bounds_of<kMantissa, kExponent>(kBits == 32 ? w : (w >> (k * kBits)) & 0xffffu, top, grid);
}
template <int kBits, int kMantissa, int kExponent>
__device__ __forceinline__ void mr_bounds_of_pack(const uint4& v, int& top, int& grid) {
  mr_bounds_of_word<kBits, kMantissa, kExponent>(v.x, top, grid);
  mr_bounds_of_word<kBits, kMantissa, kExponent>(v.y, top, grid);
  mr_bounds_of_word<kBits, kMantissa, kExponent>(v.z, top, grid);
  mr_bounds_of_word<kBits, kMantissa, kExponent>(v.w, top, grid);
}
// 16-byte packs, two in flight per thread: one 4-byte load per thread at a time left the read at a fraction
// of the memory roof; the ``edges`` values before the first pack and after the last (fewer than two packs'
// worth, ``n_head`` of them before) read by block 0
template <class Bits, int kMantissa, int kExponent>
__device__ __forceinline__ void mr_sum_bounds(const uint4* packs, long long n_packs, const Bits* head, int n_head,
                                              const Bits* tail, int n_tail, int* out) {
  constexpr int kBits = 8 * sizeof(Bits);
  int top = MR_NO_TOP, grid = MR_NO_GRID;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; i + stride < n_packs; i += 2 * stride) {
    const uint4 a = packs[i], b = packs[i + stride];
    mr_bounds_of_pack<kBits, kMantissa, kExponent>(a, top, grid);
    mr_bounds_of_pack<kBits, kMantissa, kExponent>(b, top, grid);
  }
  if (i < n_packs) mr_bounds_of_pack<kBits, kMantissa, kExponent>(packs[i], top, grid);
  if (blockIdx.x == 0 && (int)threadIdx.x < n_head) mr_bounds_of<kMantissa, kExponent>(head[threadIdx.x], top, grid);
  if (blockIdx.x == 0 && (int)threadIdx.x < n_tail) mr_bounds_of<kMantissa, kExponent>(tail[threadIdx.x], top, grid);
  mr_publish(top, grid, out);
}
extern "C" __global__ void mr_sum_bounds_f32(const uint4* packs, long long n_packs, const unsigned* head, int n_head,
                                             const unsigned* tail, int n_tail, int* out) {
  mr_sum_bounds<unsigned, 23, 8>(packs, n_packs, head, n_head, tail, n_tail, out);
}
extern "C" __global__ void mr_sum_bounds_f16(const uint4* packs, long long n_packs, const unsigned short* head,
                                             int n_head, const unsigned short* tail, int n_tail, int* out) {
  mr_sum_bounds<unsigned short, 10, 5>(packs, n_packs, head, n_head, tail, n_tail, out);
}
// a float32 value as a double from its bits, as the shipped kernels' conversion makes it: NVRTC's -ftz=true
// would flush a subnormal, and its conversion gave a NaN another payload (the canonical one)
__device__ __forceinline__ double mr_f32_bits_as_f64(unsigned b) {
  if ((b & 0x7f800000u) == 0x7f800000u) {  // inf, NaN: the payload moved up, a NaN quieted
    const unsigned long long m = b & 0x7fffffu;
    return __longlong_as_double(((unsigned long long)(b >> 31) << 63) | (0x7ffull << 52) | (m << 29) |
                                (m ? (1ull << 51) : 0ull));
  }
  if ((b & 0x7f800000u) != 0u) return (double)__uint_as_float(b);  // normal: exact
  const double m = (double)(b & 0x7fffffu) * __longlong_as_double(0x36a0000000000000LL);  // 2^-149
  return (b >> 31) ? -m : m;
}
// The float64 sums over the leading ``rows`` of a C-contiguous float32 (rows, 4 * packs) array and the
// values' sum bounds, in one read (``sum_with_bounds``): a thread per pack of 4 columns, the rows in order
// from +0.0 (the column kernel's identity; the result is used only where the bounds make every float64
// sum exact, so the order cannot change it), four rows' packs in flight.
extern "C" __global__ void mr_column_sums_with_bounds_f32(const uint4* x, long long rows, long long packs,
                                                          double* out, int* bounds) {
  int top = MR_NO_TOP, grid = MR_NO_GRID;
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < packs;
       c += (long long)gridDim.x * blockDim.x) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    const uint4* p = x + c;
    long long r = 0;
    for (; r + 4 <= rows; r += 4) {
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = p[(r + k) * packs];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        mr_bounds_of_pack<32, 23, 8>(v[k], top, grid);
        s0 += mr_f32_bits_as_f64(v[k].x); s1 += mr_f32_bits_as_f64(v[k].y);
        s2 += mr_f32_bits_as_f64(v[k].z); s3 += mr_f32_bits_as_f64(v[k].w);
      }
    }
    for (; r < rows; ++r) {
      const uint4 v = p[r * packs];
      mr_bounds_of_pack<32, 23, 8>(v, top, grid);
      s0 += mr_f32_bits_as_f64(v.x); s1 += mr_f32_bits_as_f64(v.y);
      s2 += mr_f32_bits_as_f64(v.z); s3 += mr_f32_bits_as_f64(v.w);
    }
    double* o = out + 4 * c;
    o[0] = s0; o[1] = s1; o[2] = s2; o[3] = s3;
  }
  mr_publish(top, grid, bounds);
}
"""
_bounds_modules: dict[int, object] = {}
#: whether the held paths sum chunks in any order where ``sum_bounds`` allows it (numpy_backend's says why
#: not there): on a GPU the bounds pass is one more read at the memory roof
SUMS_IN_ANY_ORDER = True


def _bounds_function(name: str):
    """The kernel ``name`` of _BOUNDS_SOURCE on the current GPU (the module compiled once per GPU)."""
    from ..dtypes import NO_GRID, NO_TOP

    device = cupy.cuda.runtime.getDevice()
    module = _bounds_modules.get(device)
    if module is None:
        module = _bounds_modules[device] = cupy.RawModule(
            code=_BOUNDS_SOURCE % {"no_top": NO_TOP, "no_grid": NO_GRID})
    return module.get_function(name)


def _bounds_into(into):
    """``into``, or fresh (NO_TOP, NO_GRID) bounds on the current GPU for the kernels' atomics to merge into."""
    from ..dtypes import NO_GRID, NO_TOP

    return into if into is not None else cupy.asarray(np.array([NO_TOP, NO_GRID], dtype=np.int32))


#: ``sum_with_bounds`` runs a thread per 4 columns down every row: with fewer packs of columns per SM than
#: this the GPU would be mostly idle (a column sum of a tall 32-column matrix: 8 threads), and the two
#: passes (the column kernel splits long columns into segments) are taken instead
SUM_WITH_BOUNDS_MIN_PACKS_PER_SM = 128


def sum_with_bounds(x, plan, into=None):
    """(``plan``'s partial of ``x``, ``sum_bounds(x, into)``) in one read, or None where ``plan`` is not a
    float64 sum or mean of a C-contiguous float32 ``x`` over a leading run of its axes whose rest is a whole
    number of 16-byte packs, enough of them for the GPU (then the caller makes the two apart). The partial
    is for use only where the bounds of every chunk make its float64 sums exact in any order
    (``direct._totals_here``): its sums run in another order than the column kernel's."""
    from ..core import Partial

    op, axes = plan.op, tuple(plan.axes)
    if not (op.builtin and op.name == "sum" and getattr(op, "steps", None) is None and x.dtype == np.float32
            and np.dtype(plan.acc_dtype) == np.float64 and x.flags.c_contiguous and x.ndim > len(axes) > 0
            and axes == tuple(range(len(axes))) and x.data.ptr % 16 == 0):
        return None
    rows = math.prod(x.shape[: len(axes)])
    columns = math.prod(x.shape[len(axes):])
    sms, _ = _facts()
    packs = columns // 4
    if columns % 4 or rows == 0 or packs < sms * SUM_WITH_BOUNDS_MIN_PACKS_PER_SM:
        return None
    out = _bounds_into(into)
    sums = cupy.empty(columns, np.float64)
    grid = int(max(1, min(-(-packs // 256), sms * 8)))
    _bounds_function("mr_column_sums_with_bounds_f32")((grid,), (256,), (x, np.int64(rows), np.int64(packs), sums, out))
    keep = (1,) * len(axes) + tuple(x.shape[len(axes):])
    return Partial(sums.reshape(keep), rows), out


def sum_bounds(x, into=None):
    """(top, grid) of a float16 or float32 ``x`` (numpy_backend.sum_bounds) as a (2,) int32 array on its GPU,
    without waiting for it. ``into``: an earlier result on the same GPU, merged into in place (the kernel's
    atomics), so the bounds of many chunks come to the host in one copy."""
    if not (x.flags.c_contiguous or x.flags.f_contiguous):  # the order of the elements does not matter
        x = cupy.ascontiguousarray(x)
    out = _bounds_into(into)
    if x.size:
        sms, _ = _facts()
        flat = x.reshape(-1, order="A")
        per_pack = 16 // x.itemsize
        n_head = min(x.size, (-flat.data.ptr % 16) // x.itemsize)  # up to the first 16-byte boundary
        n_packs = (x.size - n_head) // per_pack
        head, body = flat[:n_head], flat[n_head:]
        tail = body[n_packs * per_pack:]
        grid = int(max(1, min(-(-n_packs // 512), sms * 8)))
        kernel = _bounds_function("mr_sum_bounds_f32" if x.dtype == np.float32 else "mr_sum_bounds_f16")
        kernel((grid,), (256,), (body, np.int64(n_packs), head if head.size else flat, np.int32(head.size),
                                 tail if tail.size else flat, np.int32(tail.size), out))
    return out

