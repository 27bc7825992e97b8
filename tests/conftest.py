"""GPU tests skip, with the reason, where no device exists; everything else runs everywhere."""

from __future__ import annotations

import pytest

from multireduce.cluster import gpu_count


def pytest_collection_modifyitems(config, items):
    gpus = gpu_count()
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU and CuPy; none is visible here")
    few_gpus = pytest.mark.skip(reason=f"needs 2 or more CUDA GPUs; {gpus} visible here")
    for item in items:
        if item.get_closest_marker("gpu") and gpus == 0:
            item.add_marker(no_gpu)
        if item.get_closest_marker("multi_gpu") and gpus < 2:
            item.add_marker(few_gpus)


@pytest.fixture
def synchronous_scheduler():
    """Dask's synchronous scheduler for the test (files that want it for every test: ``pytestmark``)."""
    import dask

    with dask.config.set(scheduler="synchronous"):
        yield


@pytest.fixture(scope="module")
def cpu_client():
    """A real distributed cluster of three single-threaded CPU workers (in-process), port 0, closed after."""
    distributed = pytest.importorskip("distributed")
    from multireduce.cluster import local_cluster

    # local_cluster: every listener (the workers' HTTP endpoints too) on loopback
    with local_cluster(n_workers=3, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory):
    """deploy/make-certs.sh's CA and certificates, made once (four RSA-3072 keys take seconds) for every
    test that only reads them; its CA key is in the sibling folder ``certs-ca``."""
    import subprocess
    from pathlib import Path

    d = tmp_path_factory.mktemp("tls") / "certs"
    script = Path(__file__).resolve().parent.parent / "deploy" / "make-certs.sh"
    subprocess.run(["bash", str(script), str(d)], check=True, capture_output=True, text=True, timeout=300)
    return d
