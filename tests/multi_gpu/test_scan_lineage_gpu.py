"""A held scan of CuPy chunks on several GPUs (``mr.cumsum(x).persist()``, no task) survives a killed worker:
the scheduler makes the lost output chunks again on a GPU from their inputs (recomputed first, where they
were lost too), with the same bits. The same logic runs on a CPU process cluster in
tests/test_scan_lineage.py."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
pytestmark = pytest.mark.multi_gpu

import distributed  # noqa: E402

import multireduce as mr  # noqa: E402
from multireduce.cluster import gpu_count, local_cluster  # noqa: E402

from ..helpers import kill_worker  # noqa: E402
from ..test_scan_lineage import _chunks, _held_scans  # noqa: E402
from .test_multi_gpu import gpu_array  # noqa: E402


def test_held_cumsum_survives_a_killed_worker():
    with local_cluster(n_workers=min(gpu_count(), 4), gpu=True) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(len(cluster.workers), timeout=120)
        xi = gpu_array(c, (1 << 22) + 7, (1 << 18) + 3, np.int64, seed=31)
        xf = gpu_array(c, (1 << 22) + 7, (1 << 18) + 3, np.float64, seed=37)
        hi, hf = cupy.asnumpy(xi.compute()), cupy.asnumpy(xf.compute())
        outs = _held_scans(c, {"int64": lambda: mr.cumsum(xi), "float64": lambda: mr.cumsum(xf),
                               "expr": lambda: mr.cumsum(xi * 3 - 1)})
        before = {label: _chunks(c, out) for label, out in outs.items()}
        where = c.who_has(distributed.futures_of(outs["int64"]))
        victim = sorted({w for holders in where.values() for w in holders})[-1]
        kill_worker(c, victim)
        after = {label: _chunks(c, out) for label, out in outs.items()}
        assert all(isinstance(b, cupy.ndarray) for chunks in after.values() for b in chunks)
        np.testing.assert_array_equal(np.concatenate([cupy.asnumpy(b) for b in after["int64"]]), np.cumsum(hi))
        np.testing.assert_array_equal(np.concatenate([cupy.asnumpy(b) for b in after["expr"]]), np.cumsum(hi * 3 - 1))
        got = np.concatenate([cupy.asnumpy(b) for b in after["float64"]])
        assert np.all(np.abs(got - np.cumsum(hf)) <= 1e-12 * np.cumsum(np.abs(hf)) + 1e-300)
        for label in outs:
            assert all(cupy.asnumpy(a).tobytes() == cupy.asnumpy(b).tobytes()
                       for a, b in zip(before[label], after[label])), label
