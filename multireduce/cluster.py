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
    """CUDA devices visible to this process (0 without CuPy or a driver).

    Examples
    --------
    >>> from multireduce.cluster import gpu_count
    >>> n = gpu_count()  # 0 on a machine without a GPU or without CuPy
    >>> isinstance(n, int) and n >= 0
    True
    """
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _check_exposure(kwargs: dict) -> None:
    """Default ``host`` to loopback (Dask's default binds workers to every interface) and refuse an address
    reachable from other machines without TLS: a local cluster runs whatever code a connection sends."""
    from multireduce.deploy import is_loopback

    if kwargs.get("processes") is False and "host" not in kwargs and kwargs.get("interface") is None \
            and kwargs.get("protocol") in (None, "inproc", "inproc://"):
        # Dask's in-process transport takes no host; each worker still serves HTTP (/metrics), on every
        # interface unless told where
        kwargs.setdefault("worker_dashboard_address", "127.0.0.1:0")
        return
    if kwargs.get("interface") is not None:  # Dask refuses host and interface together
        where, local = f"interface={kwargs['interface']!r}", kwargs["interface"] == "lo"
    else:
        host = kwargs.setdefault("host", "127.0.0.1")
        bare = host.split("://", 1)[-1] if isinstance(host, str) else host
        where, local = f"host={host!r}", isinstance(bare, str) and is_loopback(bare)
    security = kwargs.get("security")
    if not local and not (security is True or getattr(security, "require_encryption", False)):
        raise ValueError(f"local_cluster({where}): an address that is not loopback is reachable from other "
                         "machines and needs security=distributed.Security(..., require_encryption=True) "
                         "(TLS); expected a loopback host such as '127.0.0.1', or such a security argument")


def local_cluster(n_workers: int | None = None, gpu: bool | None = None, **kwargs):
    """A LocalCUDACluster with one worker per GPU (``gpu=None``: when GPUs and dask-cuda exist), otherwise
    a CPU LocalCluster. Ports default to 0 and the dashboard to a free loopback port, so several clusters
    never collide. The scheduler, workers and nannies listen on 127.0.0.1 unless ``host`` (or ``interface``)
    names another address (``processes=False`` without either: Dask's in-process transport, and the workers'
    HTTP endpoints on loopback); one that is not loopback ("", "0.0.0.0" and "::" included) needs
    ``security=distributed.Security(...)`` with TLS, checked before anything starts. Extra keyword arguments
    go to the cluster class.

    Worker processes import the script that starts the cluster again: start it under
    ``if __name__ == "__main__":`` (README, "Several GPUs, several nodes").

    Examples
    --------
    >>> import numpy as np, dask.array as da, distributed, multireduce as mr
    >>> from multireduce.cluster import local_cluster
    >>> with local_cluster(n_workers=2, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
    ...     x = client.persist(da.from_array(np.arange(10.0), chunks=5))  # a chunk on each worker
    ...     print(type(cluster).__name__, len(client.scheduler_info()["workers"]), mr.sum(x, compute=True))
    LocalCluster 2 45.0
    """
    _check_exposure(kwargs)
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
