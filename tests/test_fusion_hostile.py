"""Elementwise steps read into the loads (multireduce.fusion) against awkward graphs, constants and dtypes.

Three things are checked for each expression: which array and which steps ``split_steps`` reads (operand
order, the input array, refusals), that the steps compute what Dask's graph computes (NumPy), and that the
CUDA text the kernels compile computes the same bits. The last runs on the CPU: ``_CudaText`` reads the
generated expression (and the fused operator's ``load``) with C++'s conversion rules and CUDA's correctly
rounded intrinsics, in NumPy.
"""

from __future__ import annotations

import operator
import re

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph

import multireduce as mr
from multireduce import api, fusion
from multireduce.operators import get_operator

from .test_fusion import fusing  # noqa: F401 (a fixture)

RNG = np.random.default_rng(20261127)
CHUNKS = (13, 0, 250, 1, 97)
N = sum(CHUNKS)


def _data(dtype=np.float32, n=N, shape=None):
    x = (RNG.standard_normal(n if shape is None else int(np.prod(shape))) * 3).astype(dtype)
    x[::11] = np.round(x[::11])  # integers, halves and the constants' neighbourhood below
    x[1] = -0.0
    x[2] = 0.0
    x[3] = np.inf
    x[4] = -np.inf
    x[5] = np.nan
    x[6] = 2.0
    x[7] = np.finfo(dtype).smallest_subnormal
    x[8] = -0.5
    return x if shape is None else x.reshape(shape)


def _bits(a):
    """dtype, shape and bytes, every NaN read as one (the GPU writes its own NaN payloads)."""
    a = np.array(a)
    if a.dtype.kind == "f":
        a[np.isnan(a)] = np.nan
    return a.dtype, a.shape, a.tobytes()


# ------------------------------------------------------------------------------------------------
# The generated CUDA, read with C++'s rules in NumPy
# ------------------------------------------------------------------------------------------------
_CTYPE = {"float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64, "bool": np.bool_,
          "signed char": np.int8, "unsigned char": np.uint8, "short": np.int16, "unsigned short": np.uint16,
          "unsigned int": np.uint32, "unsigned long long": np.uint64}
_TOKEN = re.compile(r"\s*(0x[0-9a-fA-F]+(?:u|U|LL|ULL)?|\d+|static_cast<[\w ]+>|mr::load_transform<[\w:]+>"
                    r"|[A-Za-z_]\w*|>=|<=|==|!=|[-()?:,<>])")
_CMP = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal, "==": np.equal,
        "!=": np.not_equal}
_NAN_LOADS = {"mr::NanSum": 0.0, "mr::NanProd": 1.0, "mr::NanMin": np.inf, "mr::NanMax": -np.inf}


def _arith(*values):
    """C++'s usual arithmetic conversions: double over float over the integers (bool promotes to int)."""
    kinds = [np.asarray(v).dtype for v in values]
    if np.dtype(np.float64) in kinds:
        return np.float64
    if np.dtype(np.float32) in kinds:
        return np.float32
    return np.int64


def _as(v, t):
    with np.errstate(all="ignore"):
        return np.asarray(v).astype(t)


def _rn(ufunc, t):
    def f(*args):
        with np.errstate(all="ignore"):
            return ufunc(*(_as(a, t) for a in args))
    return f


_FUNCTIONS = {
    "__fadd_rn": _rn(np.add, np.float32), "__dadd_rn": _rn(np.add, np.float64),
    "__fsub_rn": _rn(np.subtract, np.float32), "__dsub_rn": _rn(np.subtract, np.float64),
    "__fmul_rn": _rn(np.multiply, np.float32), "__dmul_rn": _rn(np.multiply, np.float64),
    "__fdiv_rn": _rn(np.divide, np.float32), "__ddiv_rn": _rn(np.divide, np.float64),
    "__fsqrt_rn": _rn(np.sqrt, np.float32), "__dsqrt_rn": _rn(np.sqrt, np.float64),
    "fabsf": _rn(np.absolute, np.float32), "fabs": _rn(np.absolute, np.float64),
    "__int_as_float": lambda v: np.asarray(int(v) & 0xFFFFFFFF, np.uint32).view(np.float32),
    "__uint_as_float": lambda v: np.asarray(int(v) & 0xFFFFFFFF, np.uint32).view(np.float32),
    "__longlong_as_double": lambda v: np.asarray(int(v) & (2**64 - 1), np.uint64).view(np.float64),
}


class _CudaText:
    """A CUDA expression as the generated code writes it (calls, casts, unary minus, comparisons, ?:),
    evaluated over NumPy arrays with C++'s conversions; ``env`` names the variables."""

    def __init__(self, text: str, env: dict):
        self.tokens = _TOKEN.findall(text)
        assert "".join(self.tokens) == re.sub(r"\s+", "", text), f"unread text in {text!r}"
        self.i, self.env = 0, env

    def value(self):
        v = self.ternary()
        assert self.i == len(self.tokens), self.tokens[self.i:]
        return v

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, want=None):
        t = self.tokens[self.i]
        assert want is None or t == want, (want, t, self.tokens)
        self.i += 1
        return t

    def ternary(self):
        c = self.comparison()
        if self.peek() != "?":
            return c
        self.take("?")
        a = self.ternary()
        self.take(":")
        b = self.ternary()
        t = _arith(a, b) if {np.asarray(a).dtype, np.asarray(b).dtype} != {np.dtype(bool)} else np.bool_
        return np.where(_as(c, bool), _as(a, t), _as(b, t))

    def comparison(self):
        left = self.unary()
        while self.peek() in _CMP:
            op = _CMP[self.take()]
            right = self.unary()
            t = _arith(left, right)
            left = op(_as(left, t), _as(right, t))
        return left

    def unary(self):
        if self.peek() == "-":
            self.take()
            v = self.unary()
            return np.negative(v if np.asarray(v).dtype.kind == "f" else _as(v, np.int64))
        return self.primary()

    def primary(self):
        t = self.take()
        if t == "(":
            v = self.ternary()
            self.take(")")
            return v
        if t[0].isdigit():
            return int(re.sub(r"[uUL]+$", "", t), 0)
        if self.peek() != "(":
            return self.env[t]
        self.take("(")
        args = [self.ternary()]
        while self.peek() == ",":
            self.take()
            args.append(self.ternary())
        self.take(")")
        if t.startswith("static_cast<"):
            return _as(args[0], self.env.get(t[12:-1], _CTYPE.get(t[12:-1])))
        if t.startswith("mr::load_transform<"):
            fill = _NAN_LOADS.get(t[19:-1])
            v = np.asarray(args[0])
            return v if fill is None or v.dtype.kind != "f" else np.where(np.isnan(v), _as(fill, v.dtype), v)
        return _FUNCTIONS[t](*args)


def cuda_steps(steps, x):
    """``steps.cuda`` evaluated over ``x`` (float32 or float64 elements), as the kernel computes it."""
    ctype = fusion._CTYPES[x.dtype]
    return _CudaText(steps.cuda(ctype), {"e": x}).value()


def cuda_load(op, x, acc):
    """What the production kernels read for each element of ``x``: ``load_as<Acc, Op>`` (kernels/common.cuh)
    converts the element to the accumulator, then ``op``'s generated ``load`` runs on it."""
    body = op.cuda_source().split("load(const A& v) {", 1)[1].split("\n  }", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    env = {"A": np.dtype(acc).type, "v": _as(x, acc)}  # convert<Acc>(e)
    for statement in filter(None, (s.strip() for s in body.split(";"))):
        if statement.startswith("return "):
            return _as(_CudaText(statement[7:], env).value(), acc)
        declared = re.fullmatch(r"const ([\w ]+?) (\w+) = (.+)", statement, re.S)
        assert declared, statement
        env[declared[2]] = _as(_CudaText(declared[3], env).value(), _CTYPE[declared[1]])
    raise AssertionError("no return in the generated load")


def unfused_load(op, e_values, acc):
    """The unfused path's loads: the expression's chunk (CuPy, one kernel per step), converted to the
    accumulator, then the plain operator's own load."""
    plain = get_operator(op.plain)
    return _as(plain.load(_as(e_values, acc)), acc)


def _read(e):
    found = fusion.split_steps(e)
    assert found is not None, "steps not read"
    return found


def _check_expression(e, xn):
    """``e`` (an expression over the Dask array of ``xn``) is read over ``xn``'s array, and the steps in
    NumPy and in the CUDA text give Dask's bits."""
    below, steps = _read(e)
    with np.errstate(all="ignore"):
        want = e.compute()
        assert _bits(steps.evaluate(xn)) == _bits(want)
        assert _bits(cuda_steps(steps, xn)) == _bits(want)
    return below, steps


# ------------------------------------------------------------------------------------------------
# Operand order, constants on either side, signed zeros, special constants
# ------------------------------------------------------------------------------------------------
ORDERED = {
    "2 - x": (lambda x: 2 - x, ("subtract", ("constant", 2), fusion.LEAF)),
    "x - 2": (lambda x: x - 2, ("subtract", fusion.LEAF, ("constant", 2))),
    "1 / x": (lambda x: 1 / x, ("divide", ("constant", 1), fusion.LEAF)),
    "x / 3": (lambda x: x / 3, ("divide", fusion.LEAF, ("constant", 3))),
    "0 - x": (lambda x: 0 - x, ("subtract", ("constant", 0), fusion.LEAF)),
    "-x": (lambda x: -x, ("negative", fusion.LEAF)),
    "where(2 < x, x, 0)": (lambda x: da.where(2 < x, x, 0),
                           ("where", ("greater", fusion.LEAF, ("constant", 2)), fusion.LEAF, ("constant", 0))),
    "where(x > 0, 0, x)": (lambda x: da.where(x > 0, 0, x),
                           ("where", ("greater", fusion.LEAF, ("constant", 0)), ("constant", 0), fusion.LEAF)),
    "np.subtract(3, x)": (lambda x: np.subtract(3, x), ("subtract", ("constant", 3), fusion.LEAF)),
    "da.true_divide(2.5, x)": (lambda x: da.true_divide(2.5, x), ("divide", ("constant", 2.5), fusion.LEAF)),
}


_FLUSHING = {"add", "subtract", "multiply", "divide", "sqrt", "absolute", "negative", "greater", "greater_equal",
             "less", "less_equal", "equal", "not_equal"}


def _input_reaches_unflushed(tree) -> bool:
    """Whether the input reaches the result through no step that flushes a float32 subnormal under
    NVRTC's -ftz=true (a ``where`` branch, ``+x``): CuPy's step keeps its bits there, and the fused
    load, whose conversion flushes it, would not, so such float32 expressions are left to CuPy."""
    if tree[0] == "input":
        return True
    if tree[0] == "constant" or tree[0] in _FLUSHING:
        return False
    return any(_input_reaches_unflushed(t) for t in tree[1:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(ORDERED))
def test_operand_order_is_the_graphs(name, dtype):
    xn = _data(dtype)
    x = da.from_array(xn, chunks=(CHUNKS,))
    make, tree = ORDERED[name]
    e = make(x)
    if dtype == np.float32 and _input_reaches_unflushed(tree):
        assert fusion.split_steps(e) is None
        return
    if dtype == np.float64 and tree[0] == "divide":
        assert fusion.split_steps(e) is None  # an integer input divided is float64 too: left to CuPy
        return
    below, steps = _check_expression(e, xn)
    assert below.name == x.name and steps.tree == tree


def test_negation_and_subtraction_from_zero_keep_their_signed_zeros():
    xn = _data(np.float64)
    x = da.from_array(xn, chunks=(CHUNKS,))
    neg = _check_expression(-x, xn)[1]
    sub = _check_expression(0 - x, xn)[1]
    assert neg != sub
    with np.errstate(all="ignore"):
        assert np.signbit(cuda_steps(neg, xn)[2]) and not np.signbit(cuda_steps(sub, xn)[2])  # -(+0) vs 0 - (+0)


SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 1e-40, -1e-45, 5e-324,
           1.1754942e-38, 3.4028235e38, 3.4028236e38, 1e39, 1e-46, 0.1, 1 / 3, 2.0**-149, True, False, 0, -1,
           2**24 + 1, 2**40 + 1, 2**53 + 1, 2**60 + 2**36 + 1, 2**63, 2**64 + 1, 2**70, -(2**70)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_constant_is_written_with_the_bits_numpy_gives_it(dtype):
    xn = _data(dtype)
    x = da.from_array(xn, chunks=(CHUNKS,))
    read = 0
    for c in SPECIAL:
        for e in (x * c, c - x, da.where(x > c, x, c), x / c, da.where(x == c, -x, x)):
            if fusion.split_steps(e) is None:
                continue  # left to CuPy: an integer input gives float64 too, or float64's refusals below
            _check_expression(e, xn)
            read += 1
    assert read >= (60 if dtype == np.float32 else 10)


def test_python_constants_only_numpy_scalars_and_arrays_are_inputs():
    xn = _data()
    x = da.from_array(xn, chunks=(CHUNKS,))
    assert fusion.split_steps(x * np.float32(2)) is None  # a NumPy scalar is no weak Python number
    assert fusion.split_steps(x * da.from_array(np.float32(2))) is None  # a 0-d array: another input
    y1 = da.from_array(np.float32([3.0]), chunks=1)
    assert fusion.split_steps(x[:1] * y1) is None  # two arrays at one position: nothing above them
    below, steps = _read((x[:1] * y1) - 1)
    assert below.name == (x[:1] * y1).name and steps.tree == ("subtract", fusion.LEAF, ("constant", 1))
    assert fusion.split_steps(x.map_blocks(lambda b: b * 2)) is None
    assert fusion.split_steps(da.blockwise(lambda b: b * 2, "i", x, "i", dtype=x.dtype)) is None
    assert fusion.split_steps(x ** 2) is None and fusion.split_steps(x // 2) is None
    assert fusion.split_steps(da.where(True, x, 0)) is None  # a constant condition: dask broadcasts
    # dask's own blockwise fusion nests the steps in one task: left to CuPy (a missed fusion, not a wrong one)
    (optimized,) = dask.optimize(x * 2 + 1)
    assert fusion.split_steps(optimized) is None


def test_a_blockwise_of_an_operator_is_read_like_the_operator():
    xn = _data()
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = da.blockwise(operator.sub, "i", 7, None, x, "i", dtype=x.dtype)
    below, steps = _check_expression(e, xn)
    assert steps.tree == ("subtract", ("constant", 7), fusion.LEAF)


def test_the_input_is_the_array_the_steps_read_sliced_transposed_or_named():
    xn = _data(shape=(40, 30))
    x = da.from_array(xn, chunks=(7, 11))
    for e, view in ((x[::2] * 2, xn[::2]), (x.T - 1, xn.T), (x[::-1, 3:] / 3, xn[::-1, 3:])):
        below, steps = _read(e)
        assert below.chunks == e.chunks and below.dtype == e.dtype
        assert _bits(below.compute()) == _bits(view)
        with np.errstate(all="ignore"):
            assert _bits(steps.evaluate(view)) == _bits(e.compute())
    a = da.from_array(xn, chunks=(7, 11), name="same-name")
    below, _ = _read(a * 3)
    assert below.name == "same-name" and _bits(below.compute()) == _bits(xn)


# ------------------------------------------------------------------------------------------------
# Comparisons feeding arithmetic, where, bool constants
# ------------------------------------------------------------------------------------------------
BOOLEAN_STEPS = {
    "(x > 0) * x": lambda x: (x > 0) * x,
    "x * (x < 1) + (x >= 2)": lambda x: x * (x < 1) + (x >= 2),
    "where(x != x, 0, x)": lambda x: da.where(x != x, 0, x),
    "where(x, x, 1)": lambda x: da.where(x, x, 1),
    "where(x - 2, 3, x)": lambda x: da.where(x - 2, 3, x),
    "where(x > 0, x > 1, x)": lambda x: da.where(x > 0, x > 1, x),
    "x > (x > 0)": lambda x: da.where(x > (x > 0), x, -x),
    "(x > 0) == (x < 1)": lambda x: da.where((x > 0) == (x < 1), x, 0.5),
    "x * True + False": lambda x: x * True + False,
    "(x > 0) > 0": lambda x: ((x > 0) > 0) * x,
    "where(x > 0.1, x, 0.1)": lambda x: da.where(x > 0.1, x, 0.1),
    "x == 16777217": lambda x: da.where(x == 16777217, 1, x),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(BOOLEAN_STEPS))
def test_booleans_from_comparisons_enter_arithmetic_as_numpy_reads_them(name, dtype):
    xn = _data(dtype)
    xn[9:13] = [16777216, 16777217, 0.1, 1.0]
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = BOOLEAN_STEPS[name](x)
    if fusion.split_steps(e) is None:
        # left to CuPy: an ambiguous float64 expression, a float32 input passed through unflushed, or a
        # boolean beside a constant (NumPy compares or adds those in float64 or int64)
        steps = fusion._steps_of_chunk(fusion._tasks_of(e.__dask_graph__()), (e.name, 0), (0,))[1]
        boolean_beside_constant = "greater" in repr(steps) and "constant" in repr(steps)
        assert dtype == np.float64 or _input_reaches_unflushed(steps.tree) or boolean_beside_constant \
            or "16777217" in name
        return
    _check_expression(e, xn)


BOOL_AGAINST_FLOAT = {
    # a comparison's boolean compared with a Python float: NumPy compares in float64 (the constant is not
    # rounded to the input's float32), the CUDA text compares with the constant in float32
    "((x > 0) < 1.00000001) * x": lambda x: ((x > 0) < 1.00000001) * x,
    "where((x > 0) >= 1e-50, x, 0)": lambda x: da.where((x > 0) >= 1e-50, x, 0),
}


@pytest.mark.parametrize("name", list(BOOL_AGAINST_FLOAT))
def test_a_boolean_compared_with_a_float_constant_compares_in_float64(name):
    xn = _data(np.float32)
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = BOOL_AGAINST_FLOAT[name](x)
    if fusion.split_steps(e) is not None:
        _check_expression(e, xn)


def test_a_python_int_rounded_twice_through_float64_is_left_to_cupy():
    xn = _data(np.float32)
    x = da.from_array(xn, chunks=(CHUNKS,))
    c = 2**60 + 2**36 + 1  # halfway between two float32 after rounding to float64, above it before
    assert fusion.split_steps(x * c) is None and fusion.split_steps(x + (2**53 + 1)) is None
    _check_expression(x * 2**53, xn)  # exact in float64: rounded once to float32, as NumPy does
    _check_expression(x * (2**24 + 1), xn)


# ------------------------------------------------------------------------------------------------
# float64: NumPy's refusal for one candidate input dtype (None) compares equal to float64
# ------------------------------------------------------------------------------------------------
def test_none_compares_equal_to_float64():
    """Why ``split_steps`` checks ``Steps.dtype_of`` (None where NumPy refuses) for None before comparing it:
    ``np.dtype(None)`` is float64, so ``None == np.dtype("float64")``."""
    assert (None == np.dtype(np.float64)) and not (None == np.dtype(np.float32))


def test_float64_steps_over_booleans_that_numpy_keeps_boolean_are_not_read_as_numbers():
    xn = _data(np.float64)
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = ((x > 0) + (x > 1)) * x
    if fusion.split_steps(e) is not None:
        _check_expression(e, xn)


def test_float32_steps_over_booleans_that_numpy_keeps_boolean_are_left_to_cupy():
    x = da.from_array(_data(np.float32), chunks=(CHUNKS,))
    assert fusion.split_steps(((x > 0) + (x > 1)) * x) is None


@pytest.mark.parametrize("name", ["-x", "x * -2", "x + 300", "abs(x) * -1 + x"])
def test_float64_steps_some_integer_input_refuses_are_read(name):
    xn = _data(np.float64)
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = {"-x": lambda: -x, "x * -2": lambda: x * -2, "x + 300": lambda: x + 300,
         "abs(x) * -1 + x": lambda: abs(x) * -1 + x}[name]()
    _check_expression(e, xn)


# ------------------------------------------------------------------------------------------------
# Which dtype the input has
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_complex_input_is_not_taken_for_a_float_one(dtype):
    with np.errstate(all="ignore"):
        zn = (_data(np.float32) + 1j * _data(np.float32)[::-1]).astype(dtype)
    z = da.from_array(zn, chunks=(CHUNKS,))
    found = fusion.split_steps(abs(z) * 3)  # float32 from complex64, float64 from complex128
    assert found is None or found[0].dtype == z.dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inputs_of_other_dtypes_that_give_the_same_dtype_are_refused(dtype):
    for src in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.bool_):
        s = da.from_array(np.arange(1, N + 1).astype(src), chunks=(CHUNKS,))
        for e in (s * 0.5, s / 2, da.sqrt(s), (s > 3) * 1.5, da.where(s > 3, 0.5, 1.5), abs(s) / 3 + 1):
            if e.dtype == dtype:
                assert fusion.split_steps(e) is None, (src, e.dtype)
    td = da.from_array(np.arange(N).astype("m8[s]"), chunks=(CHUNKS,))
    assert fusion.split_steps(td / td) is None  # int64 / int64 is float64 too


# ------------------------------------------------------------------------------------------------
# The generated load: the element as the kernel converts it to the accumulator, then the steps
# ------------------------------------------------------------------------------------------------
def _plan(op, e, dtype=None, mean=False):
    plans = api._resolve_reduction("dask-cupy", op, e.dtype, e.ndim, None, dtype, False, 4, "auto", mean, None,
                                   "test")[0]
    return plans[0]


@pytest.mark.parametrize("func", ["sum", "nansum", "prod", "max", "nanmin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_generated_load_reads_the_unfused_bits(func, dtype):
    xn = _data(dtype)
    x = da.from_array(xn, chunks=(CHUNKS,))
    # float64: no division and no float constant, which an integer input would turn into float64 too
    expressions = (x * 2 + 1, da.where(x > 0, x * 2, -0.0), abs(x) * 3 - x, (x > 0.5) * x / 7) \
        if dtype == np.float32 \
        else (x * 2 + 1, da.where(x > 0, x, 0), abs(x) * 3 - x, (x > 0.5) * x * 7)
    for e in expressions:
        below, steps = _read(e)
        op = get_operator(func)
        plan = _plan(op, e)
        fused = fusion.fused_operator(op, steps, e.dtype)
        with np.errstate(all="ignore"):
            assert _bits(cuda_load(fused, xn, plan.acc_dtype)) == \
                _bits(unfused_load(fused, e.compute(), plan.acc_dtype))


REQUESTED = [  # (expression dtype, dtype=, operator): the accumulator is not the input's float or wider
    (np.float32, np.int32, "sum"),
    (np.float32, np.int64, "sum"),
    (np.float32, np.bool_, "sum"),
    (np.float64, np.float32, "sum"),
    (np.float64, np.float16, "sum"),
    (np.float64, np.float32, "prod"),
]


@pytest.mark.parametrize("case", REQUESTED, ids=lambda c: f"{np.dtype(c[0])}-dtype={np.dtype(c[1])}-{c[2]}")
def test_a_requested_dtype_that_would_convert_the_input_before_the_steps_keeps_them(case, monkeypatch):
    """The kernels convert each element to the accumulator before the load transform: where that is not
    exact, the steps stay CuPy's."""
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    dtype, requested, func = case
    x = da.from_array(_data(dtype), chunks=(CHUNKS,))
    e = x * 2 + 1
    assert fusion.fused(e, _plan(get_operator(func), e, requested)) is None


def test_fused_reads_through_steps_only_where_the_accumulator_holds_the_input(monkeypatch):
    """Where the generated load cannot give the unfused bits (above), ``fused`` should keep the steps."""
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    x = da.from_array(_data(np.float64), chunks=(CHUNKS,))
    e = x * 2 + 1
    assert fusion.fused(e, _plan(get_operator("sum"), e)) is not None
    assert fusion.fused(e, _plan(get_operator("sum"), e, np.float64)) is not None
    x32 = da.from_array(_data(np.float32), chunks=(CHUNKS,))
    assert fusion.fused(x32 * 2, _plan(get_operator("sum"), x32 * 2, np.float64)) is not None  # widened: exact


@pytest.mark.parametrize("requested", [np.int32, np.float32, np.bool_])
def test_fused_keeps_the_steps_for_a_narrowing_accumulator(requested, monkeypatch):
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    x = da.from_array(_data(np.float64), chunks=(CHUNKS,))
    e = x * 2 + 1
    assert fusion.fused(e, _plan(get_operator("sum"), e, requested)) is None
    mean_plan = _plan(get_operator("sum"), e, np.float32, mean=True)
    assert fusion.fused(e, mean_plan) is None


# ------------------------------------------------------------------------------------------------
# The API over awkward arrays: multi-dimensional, keepdims, single chunks, empty chunks
# ------------------------------------------------------------------------------------------------
def _both(calls, e, fusing):
    with dask.config.set({"multireduce.fuse-elementwise": False}), np.errstate(all="ignore"):
        want = [_bits(c(e)) for c in calls]
    assert not fusing
    with np.errstate(all="ignore"):
        got = [_bits(c(e)) for c in calls]
    return got, want


def test_axis_reductions_keepdims_and_scans_of_a_two_dimensional_expression(fusing):
    xn = _data(shape=(61, 37))
    x = da.from_array(xn, chunks=((20, 0, 41), (1, 36)))
    calls = [lambda e: mr.sum(e, axis=0).compute(), lambda e: mr.max(e, axis=1, keepdims=True).compute(),
             lambda e: mr.nansum(e, axis=(0, 1), keepdims=True).compute(), lambda e: mr.mean(e, axis=1).compute(),
             lambda e: mr.cumsum(e, axis=1).compute(), lambda e: mr.nancumsum(e, axis=0).compute(),
             lambda e: mr.prod(e, axis=0, split_every=2).compute()]
    got, want = _both(calls, da.where(x > 0.5, x / 3, 0 - x), fusing)
    assert len(fusing) == len(calls) and got == want


@pytest.mark.parametrize("chunks", [(N,), (0, N, 0), (1,) * 7 + (N - 7,)])
def test_single_and_empty_chunks(chunks, fusing):
    xn = _data(np.float64)
    x = da.from_array(xn, chunks=(chunks,))
    calls = [lambda e: mr.sum(e).compute(), lambda e: mr.max(e).compute(),
             lambda e: mr.cumsum(e).compute()]
    got, want = _both(calls, x * 3 - 1, fusing)
    assert len(fusing) == len(calls) and got == want


def test_a_zero_dimensional_expression(fusing):
    x = da.from_array(np.float32(2.5))
    got, want = _both([lambda e: mr.sum(e).compute()], x * 3 - 1, fusing)
    assert got == want


# ------------------------------------------------------------------------------------------------
# Graph attacks: long chains, chunks made by different steps
# ------------------------------------------------------------------------------------------------
def test_a_long_chain_of_steps_is_read_or_left_without_error(fusing):
    xn = _data()
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = x
    for _ in range(400):
        e = e + 1
    with dask.config.set({"multireduce.fuse-elementwise": False}):
        want = _bits(mr.sum(e).compute())
    assert _bits(mr.sum(e).compute()) == want


def _hand_made(x, constants):
    """An array whose chunk i is ``x``'s chunk i times ``constants[i]``, in one layer."""
    name = "hand-made-product"
    layer = {(name, i): Task((name, i), operator.mul, TaskRef((x.name, i)), c) for i, c in enumerate(constants)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, x.chunks, dtype=x.dtype)


def test_chunks_made_by_different_steps_are_not_read():
    x = da.from_array(_data(), chunks=(CHUNKS,))
    assert fusion.split_steps(_hand_made(x, [2, 2, 2, 2, 2])) is not None
    assert fusion.split_steps(_hand_made(x, [2, 2, 3, 2, 2])) is None
    assert fusion.split_steps(_hand_made(x, [2, 2, 2.0, 2, 2])) is None


def test_signed_zero_constants_are_different_steps():
    x = da.from_array(_data(), chunks=(CHUNKS,))
    assert fusion.Steps(("add", fusion.LEAF, ("constant", 0.0))) != \
        fusion.Steps(("add", fusion.LEAF, ("constant", -0.0)))
    assert fusion.split_steps(_hand_made(x, [0.0, 0.0, -0.0, 0.0, 0.0])) is None
