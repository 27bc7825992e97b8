"""Soak on a LocalCUDACluster (one worker per GPU): 4 clients of mixed reductions and scans, results checked
against NumPy, worker RSS, CuPy pool and driver memory flat (tolerances: soak.run defaults, 256 MiB RSS and
64 MiB GPU per worker). Small settings here; the full run is `python benchmarks/soak.py`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytest.importorskip("dask_cuda")
pytestmark = pytest.mark.multi_gpu

# by name from sys.path, not from a file spec: the spawned client processes unpickle soak._client_main
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))
soak = importlib.import_module("soak")


def test_soak_gpu_short():
    out = soak.run(clients=4, requests=40, min_bytes=1024, max_bytes=64 * 2**20, cpu=False, seed=11)
    assert out["errors"] == [] and out["done"] == 160, out
    assert out["leaks"] == {}, out["growth_bytes"]
    assert all("pool" in g and "gpu_used" in g for g in out["growth_bytes"].values())
    print(out["small_request_per_s"], f"{out['seconds']:.1f} s")
