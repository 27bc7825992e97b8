"""No compiler at first call: built-in reductions, scans and segment reductions and scans of CuPy data, in
a fresh process with empty kernel caches, run on prebuilt kernels only, ours and what finishes them (no CuPy elementwise kernel,
which CuPy would compile with NVRTC at its first use)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Inputs are copied from the host and results read back with .get(): neither launches a kernel, so any
# NVRTC run comes from the calls under test. compile_using_nvrtc is where every CuPy compile goes (our
# RawModules and CuPy's own elementwise and reduction kernels), looked up as a module global at each call.
_CHILD = r"""
import os, sys
import numpy as np
import cupy
from cupy.cuda import compiler

compiled = []
CALL = ("import",)
real = compiler.compile_using_nvrtc


def watched(source, *args, **kwargs):
    compiled.append((CALL, source[-300:]))
    return real(source, *args, **kwargs)


compiler.compile_using_nvrtc = watched
import multireduce as mr
from multireduce import dtypes, kernels

rng = np.random.default_rng(3)
for dtype in dtypes.GPU_DTYPES:
    # whole arrays (the bound launcher, or partial -> finalize for mean), rows, and columns many enough
    # for the column kernels (fewer long columns are transposed by a CuPy copy kernel: not covered yet)
    for shape, axis in [((100_003,), None), ((7, 1001), 1), ((3, 1 << 16), 0)]:
        host = rng.integers(0, 2, shape).astype(dtype)  # 0 and 1: every reference below is exact in float64
        x = cupy.asarray(host)
        wide = host.astype(np.float64)
        for name in ("sum", "prod", "min", "max", "mean", "cumsum", "cumprod"):
            CALL = (name, str(dtype), shape, axis)
            got = getattr(mr, name)(x, axis=axis).get()
            ref = getattr(np, name)(wide, axis=axis).astype(got.dtype)
            assert got.shape == ref.shape, CALL
            tol = 1e-2 if dtype == np.float16 else 1e-6
            assert np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol), CALL
    # the statistics family, whole arrays (the all-NaN check of nanmin/nanmax included)
    host = rng.integers(0, 2, 100_003).astype(dtype)
    x = cupy.asarray(host)
    names = ("argmax", "argmin", "var", "std", "any", "all", "count_nonzero")
    if host.dtype.kind == "f":
        names += ("nansum", "nanmax", "nanmin", "nanmean")
    for name in names:
        CALL = (name, str(dtype))
        got = getattr(mr, name)(x)
        got = got.get() if isinstance(got, cupy.ndarray) else got
        ref = getattr(np, name)(host.astype(np.float64) if name in ("var", "std", "nanmean") else host)
        assert np.allclose(np.float64(got), np.float64(ref), rtol=1e-2 if dtype == np.float16 else 1e-6), CALL
    # segments (1-D), offsets on the device: the check, the kernels (prebuilt per operator) and the cast
    host = rng.integers(0, 2, 100_003).astype(dtype)
    x, starts = cupy.asarray(host), np.sort(rng.choice(100_004, 997, replace=False))
    for name in ("segment_reduce", "segment_scan"):
        for opname in ("sum", "prod", "min", "max") + (("nansum", "nanmax") if host.dtype.kind == "f" else ()):
            CALL = (name, opname, str(dtype))
            got = getattr(mr, name)(x, cupy.asarray(starts), opname).get()
            ref = getattr(mr, name)(host, starts, opname)  # the NumPy path compiles nothing
            assert got.dtype == ref.dtype and got.shape == ref.shape, CALL
            tol = 1e-2 if dtype == np.float16 else 1e-6
            assert np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol), CALL
assert not compiled, f"NVRTC ran {len(compiled)} times, first for {compiled[0][0]}: ...{compiled[0][1]}"
cubins = [f for f in os.listdir(sys.argv[1]) if f.endswith(".cubin")]
assert not cubins, cubins
assert kernels._prebuilt_modules and all(kernels._prebuilt_modules.values()), kernels._prebuilt_modules
print("ok")
"""


def test_first_calls_of_builtins_compile_nothing(tmp_path):
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path), "MULTIREDUCE_KERNEL_CACHE": str(tmp_path),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("MULTIREDUCE_NO_PREBUILT", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-5000:]
