"""Elementwise steps read into a reduction's or scan's loads: ``mr.sum(x * 2)`` reads ``x`` once.

Over CuPy chunks, ``mr.sum(x * 2 + 1)`` would otherwise make each chunk of ``x * 2 + 1`` in device memory
(one elementwise kernel per step, each reading and writing the chunk) and then reduce it. When the steps
at the top of the array's graph are elementwise, one chunk in, one chunk out, with Python numbers as the
only other operands, the reduction runs over the chunks they read instead, and every element is made
from its input as the kernel loads it (an operator's load transform, ``kernels/common.cuh``): one read
of the input, no chunk of the expression at all, one kernel launch per chunk however long the chain.

The bits are those of the unfused path. A chunk that is a view (``da.from_array`` of a device array
slices it: misaligned, strided) is copied first, as the unfused step would have made a fresh array: the
vectorized reduction's association follows the address. Every step keeps the input's dtype (checked with NumPy's own
promotion) and is computed in it, with CUDA's correctly rounded intrinsics (``__fmul_rn`` & co.): NVRTC
would otherwise contract ``x * 2 + 1`` into one fused multiply-add, which CuPy's one-kernel-per-step
evaluation never does. Left to CuPy, because the bits could differ: transcendental functions, powers and
mixed dtypes; an input dtype the graph leaves ambiguous (any other input dtype NumPy would take to the
same result dtype: ``x * 0.5`` over float64 could be over int32); a Python constant beside a boolean
(NumPy compares those in float64) or an integer constant inexact in float64; an accumulator narrower than
the input (the kernels convert each element to it before the load transform runs); and float32 input
that reaches the result through no step that flushes subnormals (``where(x > 0, x, 0)``, ``+x``): CuPy and
our runtime-compiled kernels both flush float32 subnormals (NVRTC's -ftz=true), in CuPy's arithmetic
steps, abs and negation and in our load's conversion alike, but CuPy's ``where`` passes a subnormal
through untouched; a float32 constant that
is itself subnormal, for the same reason. One difference is left: the fused kernels are compiled at run
time (-ftz=true) where the plain float32 ones are prebuilt without it, so a float32 running sum or
comparison that passes through the subnormal range (|values| below 1.2e-38) is flushed to zero by the
fused kernel and not by the plain one. Each new expression
(constants included) is compiled once per device (NVRTC, cached on disk by CuPy); should NVRTC refuse it,
the backend runs the steps as CuPy kernels instead. ``multireduce.fuse-elementwise: false`` turns this off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import struct
import threading

import numpy as np

from .operators import Operator, get_operator

# Task function -> step name. Comparisons give booleans, which only ``where`` may read.
_ARITHMETIC = {
    operator.add: "add", np.add: "add",
    operator.sub: "subtract", np.subtract: "subtract",
    operator.mul: "multiply", np.multiply: "multiply",
    operator.truediv: "divide", np.true_divide: "divide",
    operator.neg: "negative", np.negative: "negative",
    operator.pos: "positive", np.positive: "positive",
    operator.abs: "absolute", abs: "absolute", np.absolute: "absolute",
    np.sqrt: "sqrt",
}
_COMPARISONS = {
    operator.gt: "greater", np.greater: "greater", operator.ge: "greater_equal", np.greater_equal: "greater_equal",
    operator.lt: "less", np.less: "less", operator.le: "less_equal", np.less_equal: "less_equal",
    operator.eq: "equal", np.equal: "equal", operator.ne: "not_equal", np.not_equal: "not_equal",
}
_STEPS = {**_ARITHMETIC, **_COMPARISONS, np.where: "where"}
_ARITY = {"negative": 1, "positive": 1, "absolute": 1, "sqrt": 1, "where": 3}
_NUMPY = {name: getattr(np, name) for name in set(_ARITHMETIC.values()) | set(_COMPARISONS.values())}
_NUMPY["where"] = np.where

# CUDA for each step on float / double operands: correctly rounded and never contracted
_CUDA_BINARY = {
    ("add", "float"): "__fadd_rn({}, {})", ("add", "double"): "__dadd_rn({}, {})",
    ("subtract", "float"): "__fsub_rn({}, {})", ("subtract", "double"): "__dsub_rn({}, {})",
    ("multiply", "float"): "__fmul_rn({}, {})", ("multiply", "double"): "__dmul_rn({}, {})",
    ("divide", "float"): "__fdiv_rn({}, {})", ("divide", "double"): "__ddiv_rn({}, {})",
}
_CUDA_UNARY = {
    ("negative", "float"): "(-{})", ("negative", "double"): "(-{})",
    ("positive", "float"): "({})", ("positive", "double"): "({})",
    ("absolute", "float"): "fabsf({})", ("absolute", "double"): "fabs({})",
    ("sqrt", "float"): "__fsqrt_rn({})", ("sqrt", "double"): "__dsqrt_rn({})",
}
_CUDA_COMPARE = {"greater": ">", "greater_equal": ">=", "less": "<", "less_equal": "<=", "equal": "==",
                 "not_equal": "!="}
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
# every dtype a chunk could have: an input dtype is taken as known only where no other gives the same result
_CANDIDATES = [np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                     np.int64, np.uint64, np.float16, np.float32, np.float64, np.longdouble,
                                     np.complex64, np.complex128, np.clongdouble, "m8[ns]")]
# float32 only: steps that flush a subnormal operand to zero under NVRTC's -ftz=true, which CuPy's kernels and
# ours are both compiled with (abs and negation too: abs.ftz and neg.ftz; tests/gpu/test_gpu_fusion_hostile.py
# checks CuPy's steps against this set); a value that reaches the result through none of them
# (``where(c, x, 0)``, ``+x``) would keep its subnormal bits in CuPy's step but not in our load, whose
# conversion flushes it
_FLUSHING = {"add", "subtract", "multiply", "divide", "sqrt", "absolute", "negative", *_CUDA_COMPARE}
# longer chains are left to CuPy (the reading recurses once per step)
MAX_STEPS = 64

LEAF = ("input",)


class Steps:
    """Elementwise steps over one input chunk: a tree of tuples, ``LEAF`` for the input element,
    ``("constant", value)`` for a Python number, ``(step, *operands)`` otherwise."""

    __slots__ = ("tree",)

    def __init__(self, tree):
        self.tree = tree

    def __eq__(self, other):
        return isinstance(other, Steps) and _same(self.tree, other.tree)

    def __hash__(self):
        return hash(repr(self.tree))

    def __repr__(self):
        return f"Steps({self.tree!r})"

    def evaluate(self, x):
        """The steps applied to ``x`` (NumPy or CuPy) with NumPy's rules: what the unfused graph computes."""
        return _evaluate(self.tree, x)

    def dtype_of(self, dtype: np.dtype, keeping: bool = False) -> np.dtype | None:
        """NumPy's result dtype for an input of ``dtype``; None where NumPy refuses it, or, ``keeping``, where
        a step gives numbers of another dtype (comparisons give booleans)."""
        try:
            return _dtype_of(self.tree, np.dtype(dtype), keeping)
        except (TypeError, ValueError, OverflowError):
            return None

    def cuda(self, ctype: str, element: str = "e") -> str:
        """A CUDA expression of ``element`` (a ``ctype``) computing the steps."""
        return _cuda(self.tree, ctype, element)

    def read_in_kernels(self, dtype) -> bool:
        """Whether kernels reading a ``dtype`` chunk through these steps (``cuda``) compute what NumPy's steps
        do: ``dtype`` is float32 or float64, the steps keep it, and ``_writable`` holds for it."""
        key = (self, np.dtype(dtype))
        found = _READ_IN_KERNELS.get(key)
        if found is None:
            dtype = np.dtype(dtype)
            kept = self.dtype_of(dtype, keeping=True) if dtype in _CTYPES else None
            # "is not None" first: a dtype compares equal to None (np.dtype(None) is float64)
            found = kept is not None and kept == dtype and _writable(self.tree, dtype)
            if len(_READ_IN_KERNELS) >= 1024:
                _READ_IN_KERNELS.clear()
            _READ_IN_KERNELS[key] = found
        return found


_READ_IN_KERNELS: dict = {}


def _constant_key(value):
    """A Python number by its type and bits: 0.0 and -0.0 differ, a NaN equals itself."""
    return type(value), (struct.pack("<d", value) if type(value) is float else value)


def _same(a, b) -> bool:
    if a[0] == "constant" or b[0] == "constant":
        return a[0] == b[0] and _constant_key(a[1]) == _constant_key(b[1])
    return a[0] == b[0] and len(a) == len(b) and all(_same(p, q) for p, q in zip(a[1:], b[1:]))


def _writable(tree, dtype: np.dtype) -> bool:
    """Whether ``_cuda`` computes ``tree`` over a ``dtype`` input exactly as NumPy's (and CuPy's) steps do:
    at most ``MAX_STEPS`` deep; every integer constant exact in float64 (NumPy rounds a larger one once,
    our literal would be rounded twice); no constant beside a boolean operand (NumPy compares or adds them in
    float64 or int64, not in ``dtype``); for float32, the input reaching the result only through a step
    that flushes subnormals (``_FLUSHING``)."""
    def boolean(t):
        return t[0] in _CUDA_COMPARE

    def walk(t, depth, flushed):
        if depth > MAX_STEPS:
            return False
        if t[0] == "input":
            return flushed or dtype != np.float32
        if t[0] == "constant":
            if type(t[1]) is int:  # exact in float64, it is rounded once to float32 by either way
                with np.errstate(over="ignore"):
                    converted = np.float64(t[1])
                return bool(np.isfinite(converted)) and int(converted) == t[1]
            if dtype == np.float32:  # a subnormal literal: our -ftz kernels would read it as zero
                with np.errstate(over="ignore", under="ignore"):
                    magnitude = abs(np.float32(t[1]))
                return not 0 < magnitude < np.finfo(np.float32).tiny
            return True
        operands = t[1:]
        if len(operands) == 2 and any(boolean(o) for o in operands) and any(o[0] == "constant" for o in operands):
            return False
        below = flushed or t[0] in _FLUSHING
        return all(walk(o, depth + 1, below) for o in operands)

    return walk(tree, 0, False)


def _evaluate(tree, x):
    if tree[0] == "input":
        return x
    if tree[0] == "constant":
        return tree[1]
    return _NUMPY[tree[0]](*(_evaluate(t, x) for t in tree[1:]))


def _dtype_of(tree, dtype: np.dtype, keeping: bool):
    """Result dtype of ``tree`` over an input of ``dtype``, from NumPy's promotion of one-element samples
    (Python numbers are weak, as in the unfused graph)."""
    sample = np.ones(1, dtype)

    def walk(t):
        if t[0] == "input":
            return sample
        if t[0] == "constant":
            return t[1]
        args = [walk(a) for a in t[1:]]
        with np.errstate(all="ignore"):
            out = _NUMPY[t[0]](*args)
        kind = np.asarray(out).dtype
        if keeping and kind != (np.bool_ if t[0] in _CUDA_COMPARE else dtype):
            raise TypeError("a step changes the dtype")
        return out

    return np.asarray(walk(tree)).dtype


def _literal(value, ctype: str) -> str:
    """``value`` as the unfused step sees it (a Python number taken in the input's dtype), bit for bit."""
    with np.errstate(over="ignore"):  # a float past float32's range is inf there, as NumPy makes it
        if ctype == "float":
            bits = struct.unpack("<I", np.float32(value).tobytes())[0]
            return f"__uint_as_float(0x{bits:08x}u)"
        bits = struct.unpack("<Q", np.float64(value).tobytes())[0]
    return f"__longlong_as_double(0x{bits:016x}LL)"


def _cuda(tree, ctype: str, element: str) -> str:
    if tree[0] == "input":
        return element
    if tree[0] == "constant":
        return _literal(tree[1], ctype)
    args = [_cuda(t, ctype, element) for t in tree[1:]]
    step = tree[0]
    if step == "where":
        return f"(({args[0]}) ? ({args[1]}) : ({args[2]}))"
    if step in _CUDA_COMPARE:
        return f"(({args[0]}) {_CUDA_COMPARE[step]} ({args[1]}))"
    if len(args) == 1:
        return _CUDA_UNARY[step, ctype].format(*args)
    return _CUDA_BINARY[step, ctype].format(*args)


# ------------------------------------------------------------------------------------------------
# Reading the steps from a Dask graph
# ------------------------------------------------------------------------------------------------
def _python_number(value) -> bool:
    return type(value) in (int, float, bool)


def _steps_of_chunk(task_of, key, index: tuple):
    """(input array name, Steps) of the elementwise steps that make chunk ``key`` from the chunk at the same
    position ``index`` of one other array, with Python numbers as the only other operands: the longest
    such chain from the top (a step reading anything else is the input). None where there is no step.
    ``task_of(key)``: the task making ``key``, None for anything else (held data, a legacy task)."""
    from dask._task_spec import DataNode, TaskRef

    def as_input(k):
        if not (isinstance(k, tuple) and tuple(k[1:]) == index):
            raise _NotFusable
        return LEAF, {k[0]}

    def walk(k, depth):
        if depth > MAX_STEPS:
            raise _NotFusable
        node = task_of(k)
        if node is None or node.func not in _STEPS or node.kwargs \
                or len(node.args) != _ARITY.get(_STEPS[node.func], 2):
            if depth:
                return as_input(k)
            raise _NotFusable
        operands, inputs = [], set()
        try:
            for arg in node.args:
                if isinstance(arg, TaskRef):
                    tree, found = walk(arg.key, depth + 1)
                    operands.append(tree)
                    inputs |= found
                elif isinstance(arg, DataNode) and _python_number(arg.value):
                    operands.append(("constant", arg.value))
                elif _python_number(arg):
                    operands.append(("constant", arg))
                else:
                    raise _NotFusable
        except _NotFusable:
            if depth:
                return as_input(k)
            raise
        if len(inputs) > 1:  # a step over several arrays: it is the input of the steps above it
            if depth:
                return as_input(k)
            raise _NotFusable
        return (_STEPS[node.func], *operands), inputs

    try:
        tree, inputs = walk(key, 0)
    except (_NotFusable, RecursionError):
        return None
    if len(inputs) != 1:
        return None
    return inputs.pop(), Steps(tree)


def _tasks_of(graph):
    """key -> the Task making it in ``graph`` (a HighLevelGraph), looked up in the key's own layer: only the
    layers a chain of steps passes through are materialised, not the whole graph (reading all of a lazily
    made array's graph costs ~1 ms per chunk)."""
    from dask._task_spec import Task

    def task_of(key):
        layer = graph.layers.get(key[0] if isinstance(key, tuple) and key else key)
        node = layer.get(key) if layer is not None else None
        return node if isinstance(node, Task) else None

    return task_of


class _NotFusable(Exception):
    pass


def split_steps(x, any_input: bool = False):
    """``read_steps(x, any_input)``, read once per array, and once per name over the same held chunks
    (``recipes.read_over_held``: a notebook makes the same expression again as a new array)."""
    from .recipes import read_once, read_over_held

    def read(a):
        return read_over_held(a, f"steps-{any_input}", lambda b: read_steps(b, any_input=any_input),
                              _steps_kept, _steps_remade)

    return read_once(x, "_multireduce_steps_any_input" if any_input else "_multireduce_steps", read)


_NO_STEPS = ("no steps",)


def _steps_kept(found, held):
    """What ``read_steps`` found, without the array it returns (which holds the futures): the input's
    name and the steps."""
    return _NO_STEPS if found is None else (found[0].name, found[1])


def _steps_remade(x, kept, held):
    """``read_steps``' value from what ``_steps_kept`` kept, the input array made again from ``x``'s graph."""
    import dask.array as da
    from dask.array.utils import meta_from_array

    if kept is _NO_STEPS:
        return None
    name, steps = kept
    graph = x.__dask_graph__()
    meta = meta_from_array(x._meta, ndim=x.ndim, dtype=np.dtype(x.dtype))
    return da.Array(graph.cull_layers([name]), name, x.chunks, meta=meta), steps


def read_steps(x, any_input: bool = False):
    """(the array the elementwise steps at the top of ``x``'s graph read, Steps) where every chunk of ``x``
    is made by the same steps from the chunk at its position of one other array, with Python numbers as
    the only other operands, and that array's dtype is ``x``'s (float32 or float64) whatever it could have
    been; None otherwise. The graph does not say the input's dtype: ``any_input`` also takes steps that
    give ``x``'s dtype from other input dtypes too (``abs`` of complex64 is float32 as well), and the
    array returned then claims ``x``'s dtype, which its chunks may not have: for consumers that check
    each chunk's dtype (``Steps.read_in_kernels``) and evaluate the steps apart where it is another."""
    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.highlevelgraph import HighLevelGraph

    from dask.core import flatten

    dtype = np.dtype(x.dtype)
    graph = x.__dask_graph__()
    if dtype not in _CTYPES or not x.npartitions or not isinstance(graph, HighLevelGraph):
        return None
    task_of = _tasks_of(graph)
    found = None
    try:
        for key in flatten(x.__dask_keys__()):
            this = _steps_of_chunk(task_of, key, tuple(key[1:]))
            if this is None or (found is not None and (this[0] != found[0] or this[1] != found[1])):
                return None
            found = this
    except RecursionError:
        return None
    name, steps = found
    # the input's dtype is not in the graph: it is taken as x's only where the steps keep x's dtype and no
    # other input dtype would give x's dtype (dtype_of is None where NumPy refuses: never equal)
    if not steps.read_in_kernels(dtype):
        return None
    for other in () if any_input else _CANDIDATES:
        found = steps.dtype_of(other) if other != dtype else None
        if found is not None and found == dtype:
            return None
    if name not in graph.layers:
        return None
    below = graph.cull_layers([name])
    meta = meta_from_array(x._meta, ndim=x.ndim, dtype=dtype)
    return da.Array(below, name, x.chunks, meta=meta), steps


# ------------------------------------------------------------------------------------------------
# The operator that reads through the steps
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class FusedOperator(Operator):
    """``plain`` (a built-in operator) reading each input element through ``steps`` (input dtype
    ``dtype``): the steps then the plain operator's own load (NaN masking for the nan-family), in the
    kernels' load transform; partial results folded by the plain operator's partials."""

    steps: Steps | None = None
    dtype: np.dtype | None = None
    plain: str = "sum"

    def load(self, x):
        return get_operator(self.plain).load(self.steps.evaluate(x))

    def unfused(self):
        """(the steps as a function of a chunk, the plain operator): what this operator computes, apart."""
        return self.steps.evaluate, get_operator(self.plain)

    def cuda_source(self) -> str:
        ctype = _CTYPES[np.dtype(self.dtype)]
        plain = get_operator(self.plain)
        folds = get_operator(plain.partials.name).cuda
        return (
            "namespace mr_user {\n"
            f"struct op_{self.name} : {folds} {{\n"
            "  template <class A>\n"
            "  __device__ __forceinline__ static A load(const A& v) {\n"
            f"    const {ctype} e = static_cast<{ctype}>(v);  // exact: v is an input element, widened\n"
            f"    return mr::load_transform<{plain.cuda}>(static_cast<A>({self.steps.cuda(ctype)}), 0);\n"
            "  }\n"
            "};\n"
            "}  // namespace mr_user\n"
        )

    def __dask_tokenize__(self):
        return ("multireduce.FusedOperator", self.plain, repr(self.steps), str(self.dtype))


_fused_operators: dict = {}
_lock = threading.Lock()


def fused_operator(plain: Operator, steps: Steps, dtype: np.dtype) -> FusedOperator:
    """The one FusedOperator of (built-in ``plain``, ``steps``, ``dtype``): kernels and plans cached per
    operator are then shared by every call with the same expression."""
    key = (plain.name, steps, np.dtype(dtype))
    with _lock:
        found = _fused_operators.get(key)
        if found is None:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            folds = plain.partials
            found = FusedOperator(
                f"fused_{plain.name}_{digest}", plain.family, plain.cpu, steps.cuda(_CTYPES[np.dtype(dtype)]),
                plain.commutative, plain.kinds,
                plain.identity_value, _identity_fn=plain._identity_fn, base=folds.name,
                steps=steps, dtype=np.dtype(dtype), plain=plain.name)
            if len(_fused_operators) >= 1024:
                _fused_operators.clear()
            _fused_operators[key] = found
    return found


def worth_fusing(x) -> bool:
    """Over CuPy chunks each step is a kernel reading and writing the chunk; NumPy's steps run in the same
    process either way, so NumPy chunks keep them."""
    return type(x._meta).__module__.startswith("cupy")


def fused(x, plan):
    """(the array to reduce or scan instead of ``x``, the plan reading it through the steps) where ``x`` is
    CuPy-backed elementwise steps over another array (``split_steps``) and ``plan`` runs a built-in
    operator with the production kernels; None otherwise."""
    from .placement import setting

    op = plan.op
    acc = np.dtype(plan.acc_dtype)
    # the kernels convert each element to the accumulator before the load transform runs: the steps can
    # start from it only where that conversion is exact (a float accumulator at least as wide)
    if (not setting("multireduce.fuse-elementwise") or not op.builtin or plan.algorithm != "auto"
            or not worth_fusing(x) or acc.kind != "f" or acc.itemsize < np.dtype(x.dtype).itemsize):
        return None
    found = split_steps(x)
    if found is None:
        return None
    below, steps = found
    return below, dataclasses.replace(plan, op=fused_operator(op, steps, x.dtype))


# statistics whose kernels (kernels/stats.cuh) read each element through the steps: the others keep them
STATISTICS_READING_STEPS = frozenset({"argmin", "argmax", "nanargmin", "nanargmax", "var", "std", "nanvar",
                                      "nanstd", "nanmean", "nanmin", "nanmax"})


def stat_reading_steps(stat_type: str, steps: Steps, dtype) -> tuple[str, str]:
    """(the C++ name, its source) of a Stat policy that is ``stat_type`` (a ``kernels/stats.cuh`` policy over
    ``dtype`` elements) reading each element through ``steps``: its visits hand the policy the steps' value
    of each loaded element, so the statistics kernels run unchanged over the array the steps read."""
    ctype = _CTYPES[np.dtype(dtype)]
    digest = hashlib.sha256(repr((stat_type, steps, str(np.dtype(dtype)))).encode()).hexdigest()[:16]
    name = f"mr_user::stat_fused_{digest}"
    source = (
        "namespace mr_user {\n"
        f"struct stat_fused_{digest} : {stat_type} {{\n"
        f"  typedef {stat_type} Plain;\n"
        "  typedef Plain::Elem Elem;\n"
        "  typedef Plain::State State;\n"
        "  __device__ __forceinline__ static Elem step(const Elem& v) {\n"
        f"    const {ctype} e = v;\n"
        f"    return {steps.cuda(ctype)};\n"
        "  }\n"
        "  __device__ __forceinline__ static void visit(State& s, const Elem& v, mr::index_t at) {\n"
        "    Plain::visit(s, step(v), at);\n"
        "  }\n"
        "  template <int G>\n"
        "  __device__ __forceinline__ static void visit_run(State& s, const Elem (&v)[G], const mr::index_t (&at)[G]) {\n"
        "    Elem w[G];\n"
        "#pragma unroll\n"
        "    for (int k = 0; k < G; ++k) w[k] = step(v[k]);\n"
        "    Plain::template visit_run<G>(s, w, at);\n"
        "  }\n"
        "};\n"
        "}  // namespace mr_user\n"
    )
    return name, source


def fused_statistic(x, plan):
    """(the array to take a statistic of instead of ``x``, the plan reading it through the steps) where ``x``
    is CuPy-backed elementwise steps over another array (``split_steps``) and ``plan`` (a
    ``statistics.StatPlan``) is one the statistics kernels can read so (``STATISTICS_READING_STEPS``);
    None otherwise."""
    from .placement import setting

    if (not setting("multireduce.fuse-elementwise") or getattr(plan, "steps", None) is not None
            or plan.stat not in STATISTICS_READING_STEPS or not worth_fusing(x)):
        return None
    found = split_steps(x, any_input=True)  # StatPlan reads through the steps only chunks of x's dtype
    if found is None:
        return None
    below, steps = found
    return below, dataclasses.replace(plan, steps=steps)


__all__ = ["Steps", "FusedOperator", "split_steps", "read_steps", "fused_operator", "fused", "fused_statistic",
           "stat_reading_steps"]
