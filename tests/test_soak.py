"""benchmarks/soak.py on a CPU LocalCluster with tiny settings: every result checked, memory flat, throughput
reported; and its argument checks."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")
pytest.importorskip("psutil")

# by name from sys.path, not from a file spec: the spawned client processes unpickle soak._client_main
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
soak = importlib.import_module("soak")


def test_soak_cpu_small():
    out = soak.run(clients=2, requests=8, min_bytes=1, max_bytes=50_000, cpu=True, seed=3, warmup=2,
                   throughput_requests=20)
    assert out["errors"] == [] and out["done"] == 16 and out["leaks"] == {}, out
    assert out["ok"] and len(out["growth_bytes"]) == 2
    assert set(out["small_request_per_s"]) == {"multireduce.sum", "dask.array.sum"}
    assert all(v > 0 for v in out["small_request_per_s"].values())


def test_soak_checker_catches_a_wrong_result():
    import numpy as np

    host = np.arange(1, 34, dtype=np.int32)
    soak._check("sum", host.sum(dtype=np.int64), host)
    with pytest.raises(AssertionError):
        soak._check("sum", host.sum(dtype=np.int64) + 1, host)
    x = np.random.default_rng(0).standard_normal(1025).astype(np.float32)
    with pytest.raises(AssertionError):
        soak._check("cumsum", np.cumsum(x) * 1.01, x)


@pytest.mark.parametrize("argv", [["--clients", "0"], ["--requests", "0"], ["--min-bytes", "10", "--max-bytes", "5"]])
def test_soak_rejects_bad_arguments(argv):
    with pytest.raises(SystemExit):
        soak.main(argv + ["--cpu"])
