"""Input checks: every bad argument raises before any work, naming the argument,
whatever calls came before; split_every is checked one way for every entry point and input kind; operators
that are not what they claim are refused at registration. Fast: small arrays, no cluster."""

from __future__ import annotations

import importlib

import dask.array as da
import numpy as np
import pytest

import multireduce as mr

ops = importlib.import_module("multireduce.operators")

REDUCTIONS = {"sum": mr.sum, "prod": mr.prod, "min": mr.min, "max": mr.max, "mean": mr.mean,
              "reduce": lambda x, **kw: mr.reduce(x, "sum", **kw)}
SCANS = {"cumsum": mr.cumsum, "cumprod": mr.cumprod, "scan": lambda x, **kw: mr.scan(x, "sum", **kw)}


def _inputs():
    x = np.random.default_rng(0).integers(1, 9, (5, 7))
    return {"numpy": x, "dask": da.from_array(x, chunks=(2, 3))}


# (argument, a valid value, invalid values that compare equal to valid ones or are simply wrong)
REDUCTION_ARGS = [
    ("axis", 1, [1.0, True, np.bool_(True), (1.0,), (True,), "1", 2, -3, (0, 0)]),
    ("axis", (0, 1), [(0.0, 1), (False, 1)]),
    ("keepdims", False, [0, 0.0, None, "no"]),
    ("keepdims", True, [1, 1.0]),
    ("split_every", 2, [2.0, True, "2", 1, 0, -5, {0: 0}, {0: 2.0}, {"0": 2}, {0: True}]),
    ("split_every", {0: 2}, [{0: 0}, {0: -1}]),
    ("algorithm", "auto", [None, 0, "fast"]),
    ("compute", False, [0, 0.0, None]),
    ("compute", True, [1, 1.0]),
    ("dtype", np.float64, ["not a dtype", object, np.str_]),
]
SCAN_ARGS = [
    ("axis", 1, [1.0, True, np.bool_(True), (1,), 2, -3, "1"]),
    ("axis", 0, [0.0, False, np.bool_(False)]),
    ("split_every", 2, [2.0, True, "2", 1, 0, -5, {0: 0}, {0: 2.0}, {"0": 2}]),
    ("split_every", {0: 2}, [{0: 0}, {1: 0}]),
    ("algorithm", "auto", [None, 0, "fast"]),
    ("dtype", np.int64, ["not a dtype", object]),
]


def _error_names_argument(fn, x, name, value):
    with pytest.raises((TypeError, ValueError, IndexError)) as info:
        result = fn(x, **{name: value})
        if hasattr(result, "compute"):
            result.compute()
    assert name in str(info.value) or "split_every" in str(info.value), (name, value, str(info.value))


@pytest.mark.parametrize("kind", ["numpy", "dask"])
@pytest.mark.parametrize("fname", list(REDUCTIONS))
def test_reduction_checks_do_not_depend_on_earlier_calls(fname, kind):
    fn, x = REDUCTIONS[fname], _inputs()[kind]
    for name, good, bads in REDUCTION_ARGS:
        fn(x, **{name: good})  # warms every cache with the valid form
        for bad in bads:
            _error_names_argument(fn, x, name, bad)
            fn(x, **{name: good})  # and the valid form still works after the error


@pytest.mark.parametrize("kind", ["numpy", "dask"])
@pytest.mark.parametrize("fname", list(SCANS))
def test_scan_checks_do_not_depend_on_earlier_calls(fname, kind):
    fn, x = SCANS[fname], _inputs()[kind]
    for name, good, bads in SCAN_ARGS:
        fn(x, **{name: good})
        for bad in bads:
            _error_names_argument(fn, x, name, bad)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_inclusive_must_be_a_bool_after_a_valid_call(kind):
    x = _inputs()[kind]
    for good, bads in ((True, [1, 1.0, np.int64(1)]), (False, [0, 0.0, None, "no"])):
        mr.scan(x, "sum", inclusive=good)
        for bad in bads:
            _error_names_argument(lambda x, **kw: mr.scan(x, "sum", **kw), x, "inclusive", bad)


@pytest.mark.parametrize("fname", list(REDUCTIONS) + list(SCANS))
def test_split_every_one_rule_for_every_entry_point_and_input(fname):
    fn = {**REDUCTIONS, **SCANS}[fname]
    message = "argument 'split_every'"
    for x in _inputs().values():
        for bad in (-5, 0, 1, "4", 2.0, True, np.bool_(True), None.__class__, {0: 0}, [2]):
            with pytest.raises(ValueError, match=message):
                fn(x, split_every=bad)
        for good in (2, 3, np.int32(4), {0: 1}, {0: 3, 1: 2}):
            fn(x, split_every=good)


def test_options_are_keyword_only():
    x = np.arange(5)
    with pytest.raises(TypeError):
        mr.sum(x, None, None, False, 4)
    with pytest.raises(TypeError):
        mr.scan(x, "sum", None, None, False)
    with pytest.raises(TypeError):
        mr.cumsum(x, None, None, "auto")


# ------------------------------------------------------------------------------------------------
# register_operator: samples of the algebra, one CUDA expression
# ------------------------------------------------------------------------------------------------
def _refused(match, **kw):
    kw = {"identity": 0, "cpu": np.add, "commutative": True, **kw}
    with pytest.raises((TypeError, ValueError), match=match):
        mr.register_operator("hostile", replace=True, **kw)
    assert "hostile" not in mr.operators()


# 0 is an identity of this operator, but it is not associative: (5 - 3) - 1 != 5 - (3 - 1)
def _minus_unless_zero(a, b):
    return np.where(b == 0, a, np.where(a == 0, b, a - b))


def test_not_associative_is_refused_with_the_values():
    _refused(r"not associative on int64: a=.*b=.*c=.*op\(op\(a, b\), c\) = .* but op\(a, op\(b, c\)\) =",
             cpu=_minus_unless_zero, commutative=False, kinds="iu")
    _refused(r"not associative on float64 \(beyond the tolerance", cpu=_minus_unless_zero, commutative=False,
             kinds="f")
    # np.subtract already fails on its identity
    _refused(r"argument 'identity' is 0, which is not an identity", cpu=np.subtract, commutative=False, kinds="iuf")


def test_wrong_identity_is_refused_with_the_values():
    _refused(r"argument 'identity' is 1, which is not an identity .* on int64: with e=.*x=.*op\(e, x\) =",
             identity=1, kinds="iuf")
    _refused("not an identity", identity=0, cpu=np.multiply, kinds="f")
    _refused("not an identity", identity=np.inf, cpu=np.add, kinds="f")
    _refused("not an identity", identity=0, cpu=np.maximum, kinds="i")  # negative values
    _refused("not an identity", identity=2**62, cpu=np.minimum, kinds="i")


def test_identity_must_be_a_number_of_every_kind():
    for bad in ("abc", b"0", "0", [0], object()):
        _refused("argument 'identity'", identity=bad)
    _refused("argument 'identity' is 1j, which does not convert to int64 exactly", identity=1j, kinds="i")
    _refused("argument 'identity' is -inf, which does not convert to int64 exactly", identity=-np.inf,
             cpu=np.maximum, kinds="if")
    _refused("argument 'identity' is -1, which does not convert to uint64 exactly", identity=-1,
             cpu=np.bitwise_and, kinds="iu")
    _refused("argument 'identity' is 0.5, which does not convert to int64", identity=0.5, kinds="i")


def test_cpu_function_failing_on_an_accepted_kind_is_refused():
    _refused(r"fails on float64 values, a kind it accepts .*kinds= without 'f'", cpu=np.bitwise_xor)
    _refused(r"fails on bool values", cpu=np.subtract, commutative=False)


def test_false_commutative_claim_is_refused():
    first_nonzero = lambda a, b: np.where(a == 0, b, a)  # noqa: E731 - associative, not commutative
    _refused(r"declared commutative=True .* op\(a, b\) = .* op\(b, a\) =", cpu=first_nonzero, kinds="iu")
    op = mr.register_operator("first_nonzero", identity=0, cpu=first_nonzero, commutative=False, kinds="iu",
                              replace=True)
    try:
        x = np.array([0, 0, 5, 3, 0, 7])
        assert mr.reduce(x, op) == 5 and mr.reduce(da.from_array(x, chunks=2), op).compute() == 5
    finally:
        mr.unregister_operator("first_nonzero")


def test_operators_that_pass_the_samples_are_accepted():
    accepted = [
        dict(identity=0, cpu=np.add, cuda="a + b", commutative=True, kinds="biufc"),
        dict(identity=1, cpu=np.multiply, cuda="a * b", commutative=True, kinds="iuf"),
        dict(identity=-np.inf, cpu=np.maximum, cuda="a > b ? a : b", commutative=True, kinds="f"),
        dict(identity=0, cpu=np.bitwise_or, cuda="(a | b)", commutative=True, kinds="biu"),
        dict(identity=np.uint64(0), cpu=np.bitwise_xor, cuda="a ^ b", commutative=True, kinds="u"),
    ]
    for kw in accepted:
        mr.register_operator("fine", replace=True, **kw)
    mr.unregister_operator("fine")


@pytest.mark.parametrize("cuda", [
    "a + b; } int evil() { return 0",
    "a + b;",
    "a + b }",
    "({ a + b; })",
    "a + b\n#include <cstdio>",
    "a /* hidden */ + b",
    "a + b // ); }",
    "a + b */",
    "(a + b",
    "a + b)",
    "a[0] + b]",
    "(a + b]",
    'a + b + "x"',
    "a + b + 'x'",
    "a + b \\\n ; ",
])
def test_cuda_must_be_one_expression(cuda):
    _refused("argument 'cuda'", cuda=cuda)


@pytest.mark.parametrize("preamble", [
    "} int evil() { return 0; } namespace mr_user {",
    "__device__ int f(int a) { return a; ",
    "/* } */ __device__ int g(int a) { return a; }",
])
def test_cuda_preamble_cannot_leave_the_namespace(preamble):
    _refused("argument 'cuda_preamble'", cuda="a + b", cuda_preamble=preamble)


def test_check_runs_on_a_second_side_the_way_the_gpu_check_does():
    # the GPU check calls check_algebra with op(a, b) as a reduction of the rows [a, b]; here the rows go
    # through the NumPy path of the same API, which must accept a correct operator and refuse a wrong one
    from multireduce.api import _reduction

    def through_api(op):
        def combine(a, b, dtype):
            return _reduction(np.stack([a, b], axis=1), op, 1, None, False, None, "auto", caller="test")
        return combine

    good = mr.Operator("g", "user", np.add, "a + b", True, "iuf", identity_value=0)
    ops.check_algebra("g", 0, through_api(good), True, "iuf", where="cuda")
    bad = mr.Operator("b", "user", _minus_unless_zero, "a - b", False, "if", identity_value=0)
    with pytest.raises(ValueError, match=r"operator 'b' \(cuda\) is not associative"):
        ops.check_algebra("b", 0, through_api(bad), False, "if", where="cuda")
    # an error of the second side is not reported as a kind the operator does not accept
    def broken(a, b, dtype):
        raise RuntimeError("compile failed")
    with pytest.raises(RuntimeError, match="compile failed"):
        ops.check_algebra("b", 0, broken, False, "i", where="cuda")


def test_dask_arrays_are_recognised_by_type_not_by_module_name():
    import dask

    from multireduce._validation import is_dask_array

    lazy = dask.delayed(np.arange(3))  # has a dask graph, but is no dask array
    assert not is_dask_array(lazy) and is_dask_array(da.arange(3, chunks=2))
    with pytest.raises(TypeError, match="argument 'x'"):
        mr.sum(lazy)
