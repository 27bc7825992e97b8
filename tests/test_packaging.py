"""The kernels ship in the wheel, and every instantiation the dtype table produces compiles (nvcc for
sm_80 and sm_90, and NVRTC as CuPy uses it) on machines without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"


def test_wheel_contains_the_cuda_sources(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("multireduce-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for header in ["multireduce.cuh", "common.cuh", "block.cuh", "reduce.cuh", "scan.cuh"]:
        assert f"multireduce/_cuda/{header}" in names


def test_kernel_source_inlines_every_header():
    from multireduce import kernels

    text = kernels.kernel_source()
    assert '#include "' not in text
    for marker in ["struct half", "block_reduce_ordered", "reduce_vectorized", "scan_lookback"]:
        assert marker in text


@pytest.mark.skipif(shutil.which("nvcc") is None and not IN_CI, reason="nvcc is not installed here")
def test_every_instantiation_compiles():
    """CI has nvcc: a kernel that does not compile fails CI (NVRTC too when libnvrtc is installed)."""
    args = [sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", "sm_80", "--arch", "sm_90"]
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from compile_kernels import find_nvrtc
    finally:
        sys.path.pop(0)
    if find_nvrtc():
        args.append("--nvrtc")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-20000:]
    assert "0 translation units failed" in proc.stdout
