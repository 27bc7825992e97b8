"""Elementwise steps read into the production kernels' loads (multireduce.fusion) on the GPU: the generated
operator compiles, and every reduction and scan reading through the steps gives the bits of the unfused
path (CuPy's kernels for each step, then ours), on awkward sizes, with NaN, signed zeros and infinities.
The same logic runs on the CPU in tests/test_fusion.py."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

import multireduce as mr  # noqa: E402
from multireduce import fusion  # noqa: E402

SIZES = [1, 31, 1025, (1 << 20) + 3, (1 << 24) + 7]


def _chunks(n):
    if n == 1:  # Dask 2026.7-2026.8 builds a graph missing a dependency for two steps over chunks (0, 0, 1, 0)
        return (1,)
    return tuple(c for c in (n // 3, 0, n // 3 + 1, n - 2 * (n // 3) - 1) if c >= 0)


def _data(n, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 1e3).astype(dtype)
    x[:: max(1, n // 7)] = np.inf if n > 3 else x[0]
    x[1 % n] = -0.0
    x[n // 2] = np.nan
    return x


def _bits(a):
    a = cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.asarray(a)
    return a.dtype, a.shape, a.tobytes()


EXPRESSIONS = {
    "x * 2 + 1": lambda x: x * 2 + 1,
    "(x + 0.1) / 3": lambda x: (x + 0.1) / 3,
    "where(x > 0, x * 2, -0.0)": lambda x: da.where(x > 0, x * 2, -0.0),
    "abs(x) * 3 - x": lambda x: abs(x) * 3 - x,
}
CALLS = {
    "sum": lambda e: mr.sum(e).compute(),
    "mean": lambda e: mr.mean(e).compute(),
    "max": lambda e: mr.max(e).compute(),
    "nansum": lambda e: mr.nansum(e).compute(),
    "prod": lambda e: mr.prod(e).compute(),
    "cumsum": lambda e: mr.cumsum(e).compute(),
    "nancumsum": lambda e: mr.nancumsum(e).compute(),
}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_fused_reductions_and_scans_give_the_unfused_bits(name, n, monkeypatch):
    made = []
    make = fusion.fused_operator
    monkeypatch.setattr(fusion, "fused_operator", lambda *a: made.append(a) or make(*a))
    xn = _data(n, np.float32, n)
    x = da.from_array(cupy.asarray(xn), chunks=(_chunks(n),), asarray=False)
    e = EXPRESSIONS[name](x)
    assert fusion.split_steps(e) is not None
    with np.errstate(all="ignore"), dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = {k: _bits(call(e)) for k, call in CALLS.items()}
        assert not made
        got = {k: _bits(call(e)) for k, call in CALLS.items()}
    assert len(made) == len(CALLS)  # every call read through the steps
    assert got == want


STATISTICS = {
    "var": lambda e: mr.var(e).compute(), "nanstd": lambda e: mr.nanstd(e, ddof=1).compute(),
    "nanmean": lambda e: mr.nanmean(e).compute(), "argmax": lambda e: mr.argmax(e).compute(),
    "nanargmin": lambda e: mr.nanargmin(e).compute(), "nanmax": lambda e: mr.nanmax(e).compute(),
}


@pytest.mark.parametrize("n", [31, 1025, (1 << 20) + 3])
@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_statistics_read_through_the_steps_give_the_unfused_bits(name, n, monkeypatch):
    """The statistics kernels (kernels/stats.cuh) with a policy reading each element through the steps."""
    made = []
    make = fusion.fused_statistic
    monkeypatch.setattr(fusion, "fused_statistic", lambda x, plan: made.append(make(x, plan)) or made[-1])
    xn = _data(n, np.float32, n + 1)
    if n > 33:
        xn[n // 3] = np.nan  # a chunk with NaN beside one without: an all-NaN slice raises on both paths alike
    x = da.from_array(cupy.asarray(xn), chunks=(_chunks(n),), asarray=False)
    e = EXPRESSIONS[name](x)
    with np.errstate(all="ignore"), dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = {k: _bits(call(e)) for k, call in STATISTICS.items()}
        assert not any(made)
        made.clear()
        got = {k: _bits(call(e)) for k, call in STATISTICS.items()}
    assert len(made) == len(STATISTICS) and all(m is not None for m in made)
    assert got == want


def test_statistics_over_an_axis_and_float64_read_through_the_steps():
    rng = np.random.default_rng(9)
    xn = rng.standard_normal((1000, 257))
    x = da.from_array(cupy.asarray(xn), chunks=((300, 700), (100, 157)), asarray=False)  # strided views
    e = x * 3 - 1
    calls = [lambda v: mr.var(v, axis=0), lambda v: mr.argmax(v, axis=1), lambda v: mr.nanmax(v, axis=0)]
    with dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(c(e).compute()) for c in calls]
        got = [_bits(c(e).compute()) for c in calls]
    assert got == want
    np.testing.assert_allclose(cupy.asnumpy(mr.var(e, axis=0).compute()), (xn * 3 - 1).var(axis=0), rtol=1e-12)


def test_float64_and_a_two_dimensional_axis_reduction():
    rng = np.random.default_rng(7)
    xn = rng.standard_normal((1000, 257))
    x = da.from_array(cupy.asarray(xn), chunks=((300, 700), (100, 157)), asarray=False)
    e = x * 3 - 1
    assert fusion.split_steps(e) is not None
    with dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(mr.sum(e, axis=0).compute()), _bits(mr.min(e, axis=1).compute()),
                    _bits(mr.cumsum(e, axis=1).compute())]
        got = [_bits(mr.sum(e, axis=0).compute()), _bits(mr.min(e, axis=1).compute()),
               _bits(mr.cumsum(e, axis=1).compute())]
    assert got == want
    np.testing.assert_allclose(cupy.asnumpy(mr.sum(e, axis=0).compute()), (xn * 3 - 1).sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("layout", ["misaligned", "fortran", "strided"])
def test_chunks_that_are_views_give_the_unfused_bits(layout):
    """The vectorized reduction's association follows the address: a chunk that is a misaligned, Fortran-
    ordered or strided view is read as the fresh C-ordered array CuPy's step would have made."""
    rng = np.random.default_rng(5)
    base = cupy.asarray((rng.standard_normal((1 << 12) + 5) * 100).astype(np.float32))
    if layout == "misaligned":
        data, chunks = base[3:], (1 << 10) + 1  # every chunk starts off a 16-byte boundary
    elif layout == "fortran":
        data, chunks = cupy.asfortranarray(base[: 64 * 64].reshape(64, 64)), (64, 32)
    else:
        data, chunks = base[::3], 333
    before = cupy.asnumpy(data).tobytes()
    x = da.from_array(data, chunks=chunks, asarray=False)
    e = x * 2 + 1
    assert fusion.split_steps(e) is not None
    with dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(mr.sum(e).compute()), _bits(mr.nansum(e, axis=0).compute()), _bits(mr.mean(e).compute())]
        got = [_bits(mr.sum(e).compute()), _bits(mr.nansum(e, axis=0).compute()), _bits(mr.mean(e).compute())]
    assert got == want
    assert cupy.asnumpy(data).tobytes() == before


def test_the_fused_kernel_is_compiled_once_per_expression():
    x = da.from_array(cupy.asarray(_data(4099, np.float32, 3)), chunks=1000, asarray=False)
    from multireduce import kernels

    with dask.config.set(scheduler="sync"):
        mr.sum(x * 5 + 2).compute()
        before = len(kernels._modules)
        mr.sum(x * 5 + 2).compute()  # the same expression again: the same operator and module
        assert len(kernels._modules) == before
        mr.sum(x * 6 + 2).compute()  # another constant: another module
        assert len(kernels._modules) == before + 1


def _refuse_to_compile(monkeypatch, refused):
    """Kernel modules for which ``refused(what, the kernel names joined)`` fail to build, as a compiler
    that rejects the generated code would; the others build as usual."""
    from multireduce import kernels

    compiled = kernels._compiled

    def refusing(text, names, what):
        if refused(what, " ".join(names.values())):
            raise kernels.KernelError(f"compiling {what} failed (refused by the test)")
        return compiled(text, names, what)

    monkeypatch.setattr(kernels, "_compiled", refusing)


def test_kernels_that_fail_to_build_leave_the_steps_to_cupy(monkeypatch):
    """A compiler that refuses the generated code costs speed, not the result: the steps run as CuPy kernels
    and the plain operator's kernels reduce them (the unfused bits), with one warning."""
    from multireduce.backends import cupy_backend

    _refuse_to_compile(monkeypatch, lambda what, names: "fused_" in what or "mr_user::op_fused_" in names)
    monkeypatch.setattr(cupy_backend, "_unfused_warned", set())
    x = da.from_array(cupy.asarray(_data(5003, np.float32, 11)), chunks=1000, asarray=False)
    e = x * 7 - 3  # an expression no other test compiles
    with dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(mr.sum(e).compute()), _bits(mr.cumsum(e).compute())]
        with pytest.warns(RuntimeWarning, match="failed to build"):
            got = [_bits(mr.sum(e).compute()), _bits(mr.cumsum(e).compute())]
    assert got == want


def test_statistics_whose_kernels_fail_to_build_run_the_steps_apart(monkeypatch):
    """The same for the statistics' generated policy: one warning, the unfused bits."""
    from multireduce import statistics

    _refuse_to_compile(monkeypatch, lambda what, names: "mr_user::stat_fused_" in names)
    monkeypatch.setattr(statistics, "_REFUSED", set())
    x = da.from_array(cupy.asarray(_data(5003, np.float32, 13)), chunks=1000, asarray=False)
    e = x * 9 - 4  # an expression no other test compiles
    with dask.config.set(scheduler="sync"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [_bits(mr.var(e).compute()), _bits(mr.argmax(e).compute())]
        with pytest.warns(RuntimeWarning, match="failed to build"):
            got = [_bits(mr.var(e).compute()), _bits(mr.argmax(e).compute())]
    assert got == want
