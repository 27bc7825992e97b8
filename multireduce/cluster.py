"""Getting a Dask cluster for multireduce: one worker per GPU where there are GPUs, else CPU workers.

multireduce works with any ``distributed.Client`` (an existing cluster, ``deploy/`` scripts, SLURM,
Kubernetes); this helper is the one-box default::

    from multireduce.cluster import local_cluster
    with local_cluster() as cluster, distributed.Client(cluster) as client:
        ...
"""

from __future__ import annotations

import importlib.util


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CuPy or a driver)."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def local_cluster(n_workers: int | None = None, gpu: bool | None = None, **kwargs):
    """A LocalCUDACluster with one worker per GPU (``gpu=None``: when GPUs and dask-cuda exist), otherwise
    a CPU LocalCluster. Ports default to 0 and the dashboard to a free loopback port, so several clusters
    never collide. Extra keyword arguments go to the cluster class."""
    # host binds the scheduler and every worker and nanny the cluster starts to loopback (the default would
    # bind workers to every interface); pass host= to open it on purpose
    kwargs.setdefault("host", "127.0.0.1")
    kwargs.setdefault("scheduler_port", 0)
    kwargs.setdefault("dashboard_address", "127.0.0.1:0")
    have_gpus = gpu_count() > 0
    have_dask_cuda = importlib.util.find_spec("dask_cuda") is not None
    if gpu is None:
        gpu = have_gpus and have_dask_cuda
    if gpu:
        if not have_gpus:
            raise RuntimeError("local_cluster(gpu=True): no CUDA GPU is visible to this process")
        if not have_dask_cuda:
            raise RuntimeError("local_cluster(gpu=True) needs dask-cuda: pip install 'multireduce[cluster]'")
        from dask_cuda import LocalCUDACluster

        if n_workers is not None:
            kwargs.setdefault("CUDA_VISIBLE_DEVICES", list(range(n_workers)))
        return LocalCUDACluster(**kwargs)
    from distributed import LocalCluster

    kwargs.setdefault("threads_per_worker", 1)
    return LocalCluster(n_workers=n_workers or 2, **kwargs)
