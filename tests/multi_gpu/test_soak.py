"""Soak on a LocalCUDACluster (one worker per GPU): 4 client processes of mixed reductions, scans and
statistics in rounds, every result checked against NumPy; after a warm-up of every (dtype, operation, size
class), worker RSS, CuPy's pool and driver-level GPU memory stay within soak.RSS_TOL / soak.GPU_TOL (64 MiB
per worker; the reasoning is beside them in benchmarks/soak.py) and no cache of ours without a size bound
grows. Small settings here (~1 min on 4 x H200); the full size is `python -m benchmarks soak --full`."""

from __future__ import annotations

import importlib
import json

import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
pytestmark = pytest.mark.multi_gpu

# as a module of the benchmarks package, not from a file spec: the spawned client processes unpickle
# benchmarks.soak._client_main
soak = importlib.import_module("benchmarks.soak")


def test_soak_gpu_short():
    out = soak.run(clients=4, requests=40, rounds=4, min_bytes=1024, max_bytes=64 * 2**20, cpu=False, seed=11,
                   throughput_requests=100)
    report = {k: out[k] for k in ("done", "errors", "warmup_seconds", "round_seconds", "growth_bytes",
                                  "slope_bytes_per_round", "gpu_scope", "small_request_per_s")}
    print(json.dumps(report, indent=1, default=str))
    assert out["errors"] == [] and out["done"] == 160, out["errors"]
    assert all({"rss", "pool_used", "gpu_used"} <= set(g) for g in out["growth_bytes"].values()), out["growth_bytes"]
    assert out["leaks"] == {}, (out["leaks"], out["slope_bytes_per_round"])
    assert out["unbounded_cache_growth"] == {}, out["unbounded_cache_growth"]
