"""Elementwise steps read into the kernels' loads (multireduce.fusion) on the GPU, for the awkward operands,
constants and dtypes of tests/test_fusion_hostile.py: the fused kernels against the unfused path (CuPy's
kernel per step, then ours), bit for bit, through NVRTC and the real kernels, float32 subnormals included
(CuPy's kernels and ours are both compiled with -ftz=true). The shapes the module leaves to CuPy (a boolean
beside a constant, a complex input, a narrowing accumulator, an integer constant inexact in float64) give
the unfused bits too."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce import fusion  # noqa: E402

N = 100_003
CHUNKS = (31_000, 0, 1, 68_002, 1000)


def _data(dtype, seed=5):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N) * 3).astype(dtype)
    x[::11] = np.round(x[::11])
    x[1], x[2], x[3], x[4], x[5], x[6] = -0.0, 0.0, np.inf, -np.inf, np.nan, -0.5
    x[7] = np.finfo(dtype).smallest_subnormal
    return x


def _bits(a):
    a = cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.array(a)
    if a.dtype.kind == "f":
        a = a.copy()
        a[np.isnan(a)] = np.nan
    return a.dtype, a.shape, a.tobytes()


def _array(xn):
    return da.from_array(cupy.asarray(xn), chunks=(CHUNKS,), asarray=False)


def _fused_and_unfused(e, calls, monkeypatch):
    """(the fused operators and statistics' plans made, the fused path's bits, the unfused bits)."""
    made = []
    make, make_statistic = fusion.fused_operator, fusion.fused_statistic
    monkeypatch.setattr(fusion, "fused_operator", lambda *a: made.append(a) or make(*a))

    def statistic(x, plan):
        found = make_statistic(x, plan)
        if found is not None:
            made.append(found[1])
        return found

    monkeypatch.setattr(fusion, "fused_statistic", statistic)
    with np.errstate(all="ignore"), dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(c(e)) for c in calls]
        got = [_bits(c(e)) for c in calls]
    return made, got, want


CALLS = [lambda e: mr.sum(e).compute(), lambda e: mr.nansum(e).compute(), lambda e: mr.max(e).compute(),
         lambda e: mr.cumsum(e).compute()]

EXPRESSIONS = {
    "2 - x": lambda x: 2 - x,
    "1 / x": lambda x: 1 / x,
    "-x": lambda x: -x,
    "0 - x": lambda x: 0 - x,
    "where(2 < x, x, -0.0)": lambda x: da.where(2 < x, x, -0.0),
    "where(x > 0, 0, x)": lambda x: da.where(x > 0, 0, x),
    "(x > 0) * x": lambda x: (x > 0) * x,
    "x * (x < 1) + (x >= 2)": lambda x: x * (x < 1) + (x >= 2),
    "where(x != x, 0, x)": lambda x: da.where(x != x, 0, x),
    "where(x, x, 1)": lambda x: da.where(x, x, 1),
    "x * True + False": lambda x: x * True + False,
    "x * 1e-40 + 1e39": lambda x: x * 1e-40 + 1e39,
    "x * nan - inf": lambda x: x * float("nan") - float("inf"),
    "where(x > 0.1, x, 0.1)": lambda x: da.where(x > 0.1, x, 0.1),
    "x * (2**40 + 1)": lambda x: x * (2**40 + 1),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_awkward_operands_and_constants_give_the_unfused_bits(name, dtype, monkeypatch):
    e = EXPRESSIONS[name](_array(_data(dtype)))
    if fusion.split_steps(e) is None:
        pytest.skip("not read for this dtype (an integer input gives the same dtype)")
    made, got, want = _fused_and_unfused(e, CALLS, monkeypatch)
    assert len(made) == len(CALLS) and got == want


def test_a_boolean_compared_with_a_float_constant(monkeypatch):
    x = _array(_data(np.float32))
    made, got, want = _fused_and_unfused(((x > 0) < 1.00000001) * x, CALLS[:1], monkeypatch)
    assert got == want and not made


def test_float64_boolean_addition(monkeypatch):
    x = _array(_data(np.float64))
    made, got, want = _fused_and_unfused(((x > 0) + (x > 1)) * x, CALLS[:1], monkeypatch)
    assert got == want and not made


def test_a_complex_input(monkeypatch):
    zn = (_data(np.float32) + 1j * _data(np.float32, 6)).astype(np.complex64)
    zn[np.isnan(zn)] = 1
    made, got, want = _fused_and_unfused(abs(_array(zn)) * 3, CALLS[:1], monkeypatch)
    assert got == want and not made
    # a statistic takes the steps (float32 chunks would give float32 too) and computes them apart for
    # these complex64 chunks
    stats = [lambda e: mr.argmax(e).compute(), lambda e: mr.var(e).compute(), lambda e: mr.nanmin(e).compute()]
    made, got, want = _fused_and_unfused(abs(_array(zn)) * 3, stats, monkeypatch)
    assert got == want and len(made) == len(stats)


@pytest.mark.parametrize("case", ["sum-int32", "sum-bool", "cumsum-int64", "mean64-float32", "sum64-float32"])
def test_a_requested_dtype(case, monkeypatch):
    func, requested = case.split("-")
    dtype = np.float64 if func.endswith("64") else np.float32
    xn = _data(dtype)
    xn[~np.isfinite(xn)] = 1.25
    call = {"sum": mr.sum, "cumsum": mr.cumsum, "mean64": mr.mean, "sum64": mr.sum}[func]
    made, got, want = _fused_and_unfused(_array(xn) * 2 + 1, [lambda e: call(e, dtype=requested).compute()],
                                         monkeypatch)
    assert got == want and not made


def test_a_large_python_int_constant(monkeypatch):
    x = _array(_data(np.float32))
    made, got, want = _fused_and_unfused(x * (2**60 + 2**36 + 1), CALLS[:1], monkeypatch)
    assert got == want and not made


# ---- float32 subnormals: which of CuPy's steps flush them, and the fused bits where they do ---------------
def _subnormal_data(seed=9):
    """Float32 values almost all subnormal or zero, both signs, and some normal ones that are multiples of
    2**-123: sums of the normal ones are zero or normal, so no running sum passes through the subnormal
    range, where the fused kernels (-ftz) and the prebuilt ones differ by design (multireduce/fusion.py)."""
    rng = np.random.default_rng(seed)
    tiny = np.finfo(np.float32).smallest_subnormal
    x = (rng.integers(-5000, 5000, N) * np.float64(tiny)).astype(np.float32)
    normal = x[::97]
    normal[:] = rng.choice([-1.0, 1.0], normal.size) * rng.uniform(1, 2, normal.size) * 2.0 ** -rng.integers(
        90, 100, normal.size)
    return x


STEP_PROBES = {  # CuPy's one-step kernel of each step over a float32 subnormal
    "absolute": lambda v: cupy.absolute(v), "negative": lambda v: cupy.negative(v),
    "positive": lambda v: cupy.positive(v), "add": lambda v: v + np.float32(0),
    "subtract": lambda v: v - np.float32(0), "multiply": lambda v: v * np.float32(1),
    "divide": lambda v: v / np.float32(1), "sqrt": lambda v: cupy.sqrt(cupy.absolute(v)),
}


def test_cupy_steps_flush_float32_subnormals_exactly_where_fusion_says():
    """The premise of fusion._FLUSHING: CuPy's kernels (NVRTC, -ftz=true) flush a float32 subnormal operand
    to zero in these steps and pass it through in the others."""
    v = cupy.asarray(np.array([np.finfo(np.float32).smallest_subnormal, -1e-39, 5e-39], dtype=np.float32))
    flushed = {name: bool((cupy.asnumpy(step(v)) == 0).all()) for name, step in STEP_PROBES.items()}
    kept = {name: bool((cupy.asnumpy(step(v)) != 0).all()) for name, step in STEP_PROBES.items()}
    expected = {name: name in fusion._FLUSHING for name in STEP_PROBES}
    assert all(flushed[n] or kept[n] for n in STEP_PROBES), (flushed, kept)
    assert flushed == expected, (flushed, expected)


SUBNORMAL_EXPRESSIONS = {
    "abs(x)": lambda x: abs(x), "-x": lambda x: -x, "-abs(x)": lambda x: -abs(x),
    "abs(x) * 2": lambda x: abs(x) * 2,
}
SUBNORMAL_CALLS = CALLS + [lambda e: mr.argmax(e).compute(), lambda e: mr.min(e).compute(),
                           lambda e: mr.var(e).compute()]


@pytest.mark.parametrize("name", list(SUBNORMAL_EXPRESSIONS))
def test_float32_subnormals_through_abs_and_negation_give_the_unfused_bits(name, monkeypatch):
    """Data almost all subnormal: any step of the fused kernel that treated a subnormal differently from
    CuPy's step followed by the prebuilt kernel would change a sum, an extreme or its index."""
    e = SUBNORMAL_EXPRESSIONS[name](_array(_subnormal_data()))
    if fusion.split_steps(e, any_input=True) is None:
        pytest.skip("left to CuPy for float32")
    made, got, want = _fused_and_unfused(e, SUBNORMAL_CALLS, monkeypatch)
    # abs: reductions leave it to CuPy (complex64 input gives float32 too), statistics read it
    statistics = sum(1 for m in made if not isinstance(m, tuple))
    assert statistics == 2 and got == want  # argmax and var
