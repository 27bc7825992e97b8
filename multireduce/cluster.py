"""Getting a Dask cluster for multireduce: one worker per GPU where there are GPUs, else CPU workers.

multireduce works with any ``distributed.Client`` (an existing cluster, ``deploy/`` scripts, SLURM,
Kubernetes); this helper is the one-box default::

    from multireduce.cluster import local_cluster
    with local_cluster() as cluster, distributed.Client(cluster) as client:
        ...

GPU memory: where the ``rmm`` package is installed, every GPU worker allocates through RMM's asynchronous
allocator (``cudaMallocAsync``) and CuPy allocates through it too (``rmm_allocator_external_lib_list=
["cupy"]``, set by dask-cuda in each worker process), as RAPIDS deployments run: CuPy, dask-cuda's
spilling and unspilling and everything else share one allocator. With CuPy's own pool instead (the
default without ``rmm``, or ``rmm_async=False``), CuPy keeps freed blocks for itself, and dask-cuda's
unspilling, which allocates outside it, failed with out-of-memory while the pool held free memory:
2 x H200, 32 GiB of float32 per GPU, every held sum and scan and ``dask.array.sum`` itself failed so on
one and on two workers; on RMM's pool or its asynchronous allocator all of them finished with the right
values, the asynchronous one as fast as the pool or faster. Where everything fits, CuPy's own pool was
10-25 % faster on the held calls (docs/performance.md, "Allocators"). ``DEFAULT_RMM`` is what a call that
names no RMM option gets.
"""

from __future__ import annotations

import importlib.util
import numbers

#: RMM options that ``local_cluster`` gives GPU workers when the call names none of ``rmm_pool_size``,
#: ``rmm_async``, ``rmm_managed_memory`` (or another ``rmm_*`` option of LocalCUDACluster), where the
#: ``rmm`` package is installed (without it: CuPy's own pool, as with None). None keeps CuPy's own memory
#: pool on every worker. Never applied to CPU clusters.
DEFAULT_RMM: dict | None = {"rmm_async": True}

#: The same for a cluster whose workers talk UCX (``protocol="ucx"``). UCX moves a CuPy array from GPU to
#: GPU through CUDA IPC, which cannot map memory of a ``cudaMallocAsync`` pool that was not made shareable:
#: under RMM's asynchronous allocator it staged through host memory instead. 4 x H200, 2026-11-27, one
#: array from one worker to another: 100 MB in 13.1 ms with an RMM pool, 16.2 ms with CuPy's pool, 329 ms
#: with the asynchronous allocator (TCP: 106 ms). So an RMM pool, half of each GPU to begin with (it grows).
DEFAULT_RMM_UCX: dict | None = {"rmm_pool_size": 0.5}

_RMM_OPTIONS = ("rmm_pool_size", "rmm_async", "rmm_managed_memory")


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


def _uses_ucx(kwargs: dict) -> bool:
    """Whether the cluster would speak UCX: ``protocol``, a ``host`` with a ``ucx://`` scheme (distributed
    takes the protocol from it), or either in ``scheduler_kwargs`` / ``worker_kwargs``."""
    def ucx(value) -> bool:
        return isinstance(value, str) and value.strip().lower().startswith("ucx")

    places = [kwargs] + [kwargs.get(k) or {} for k in ("scheduler_kwargs", "worker_kwargs")]
    return any(ucx(p.get("protocol")) or ucx(p.get("host")) for p in places if isinstance(p, dict))


def _check_ucx_exposure(uses_ucx: bool, allowed) -> None:
    """Refuse a UCX cluster unless its caller accepted that it listens on every interface, unauthenticated
    (measured with distributed-ucxx 0.52 and UCX 1.21: the scheduler's and each worker's listener on
    0.0.0.0 although their addresses said 127.0.0.1; ``UCX_NET_DEVICES=lo`` moves UCX's own TCP transport
    to loopback but not those listeners)."""
    if not isinstance(allowed, bool):
        raise TypeError(f"local_cluster: argument 'ucx_on_all_interfaces' must be True or False, got {allowed!r}")
    if uses_ucx and not allowed:
        raise ValueError("local_cluster(protocol='ucx'): distributed-ucxx listens on every network interface "
                         "(0.0.0.0), whatever host is given, and UCX has no TLS or authentication, so any machine "
                         "that reaches this one could run code in the cluster; pass ucx_on_all_interfaces=True "
                         "where only trusted hosts reach this machine's network, or keep protocol='tcp' (loopback)")


def _check_rmm(options: dict, origin: str) -> dict:
    """``options`` (rmm_pool_size, rmm_async, rmm_managed_memory; None: not set) checked, without the
    unset ones. ``origin``: how an error names where they came from."""
    pool, use_async, managed = (options.get(k) for k in _RMM_OPTIONS)
    if pool is not None:
        from dask.utils import parse_bytes

        if isinstance(pool, bool) or not isinstance(pool, (numbers.Real, str)):
            ok = False
        elif isinstance(pool, numbers.Integral):
            ok = pool > 0
        elif isinstance(pool, numbers.Real):
            ok = 0 < pool <= 1
        else:
            try:
                ok = parse_bytes(pool) > 0
            except (ValueError, TypeError):
                ok = False
        if not ok:
            raise ValueError(f"{origin}: 'rmm_pool_size' must be a number of bytes above 0, a size such as "
                             f"'24GiB', or a fraction of each GPU's memory in (0, 1]; got {pool!r}")
    for name, value in (("rmm_async", use_async), ("rmm_managed_memory", managed)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{origin}: '{name}' must be True, False or None; got {value!r}")
    if use_async and managed:
        raise ValueError(f"{origin}: 'rmm_async=True' and 'rmm_managed_memory=True' exclude each other "
                         "(RMM's asynchronous allocator does not use managed memory); choose one")
    if use_async and pool is not None:
        raise ValueError(f"{origin}: 'rmm_pool_size' is not used with 'rmm_async=True' (the asynchronous "
                         f"allocator grows and trims its own pool); got rmm_pool_size={pool!r}: pass one")
    return {k: v for k, v in zip(_RMM_OPTIONS, (pool, use_async, managed)) if v is not None}


def _rmm_install_hint() -> str:
    """The pip line for RMM wheels matching CuPy's CUDA (both lines where that is not known)."""
    try:
        import cupy

        major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:
        major = None
    if major in (12, 13):
        return f"pip install rmm-cu{major}"
    return "pip install rmm-cu13 (CUDA 13) or rmm-cu12 (CUDA 12)"


def _with_cupy(libs) -> list:
    """``rmm_allocator_external_lib_list`` with "cupy" in it (dask-cuda's forms: None, "a,b" or a list)."""
    if libs is None:
        libs = []
    elif isinstance(libs, str):
        libs = [v.strip() for v in libs.split(",") if v.strip()]
    else:
        libs = list(libs)
    return libs if "cupy" in libs else [*libs, "cupy"]


def local_cluster(n_workers: int | None = None, gpu: bool | None = None, *, rmm_pool_size=None,
                  rmm_async: bool | None = None, rmm_managed_memory: bool | None = None,
                  ucx_on_all_interfaces: bool = False, **kwargs):
    """A LocalCUDACluster with one worker per GPU (``gpu=None``: when GPUs and dask-cuda exist), otherwise
    a CPU LocalCluster. Ports default to 0 and the dashboard to a free loopback port, so several clusters
    never collide. The scheduler, workers and nannies listen on 127.0.0.1 unless ``host`` (or ``interface``)
    names another address (``processes=False`` without either: Dask's in-process transport, and the workers'
    HTTP endpoints on loopback); one that is not loopback ("", "0.0.0.0" and "::" included) needs
    ``security=distributed.Security(...)`` with TLS, checked before anything starts. Extra keyword arguments
    go to the cluster class.

    GPU memory (LocalCUDACluster's own options, passed on): ``rmm_pool_size`` (bytes, a size such as
    "24GiB", or a fraction of each GPU's memory) gives every worker an RMM pool of that size;
    ``rmm_async=True`` RMM's asynchronous allocator (``cudaMallocAsync``) instead; ``rmm_managed_memory``
    managed memory. With any of them CuPy allocates through RMM on every worker ("cupy" is added to
    ``rmm_allocator_external_lib_list``), so CuPy, dask-cuda's spilling and everything else share one
    allocator. None (the default) for all three: ``DEFAULT_RMM`` decides (RMM's asynchronous allocator
    where ``rmm`` is installed, else CuPy's own pool); ``rmm_async=False`` asks for CuPy's own pool. The
    options need the ``rmm`` package (``rmm-cu13`` or ``rmm-cu12``) and GPU workers: on a CPU cluster
    they are refused, not ignored, so a script that asked for RMM never runs without it unnoticed. Every
    argument is checked before anything starts. With ``protocol="ucx"`` (distributed-ucxx installed) the
    default is ``DEFAULT_RMM_UCX`` instead, an RMM pool: UCX moves arrays GPU to GPU over NVLink or PCIe,
    which RMM's asynchronous allocator prevents (a warning says so where it is asked for).

    UCX listens on every network interface: distributed-ucxx (0.52) opens its listeners on 0.0.0.0
    whatever ``host`` says, and UCX has neither TLS nor authentication, so anyone who reaches the machine
    could run code in the cluster. ``protocol="ucx"`` is therefore refused unless
    ``ucx_on_all_interfaces=True`` says that only trusted hosts reach this machine's network.

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
    _check_ucx_exposure(_uses_ucx(kwargs), ucx_on_all_interfaces)
    rmm = _check_rmm({"rmm_pool_size": rmm_pool_size, "rmm_async": rmm_async,
                      "rmm_managed_memory": rmm_managed_memory}, "local_cluster")
    rmm_given = [*rmm, *(k for k in kwargs if k.startswith("rmm_"))]  # DEFAULT_RMM then stays out
    asked = {k: v for k, v in {**kwargs, **rmm}.items() if k.startswith("rmm_") and v not in (None, False)}
    _check_exposure(kwargs)
    kwargs.setdefault("scheduler_port", 0)
    kwargs.setdefault("dashboard_address", "127.0.0.1:0")
    have_gpus = gpu_count() > 0
    have_dask_cuda = importlib.util.find_spec("dask_cuda") is not None
    if asked and (gpu is False or (gpu is None and not (have_gpus and have_dask_cuda))):
        why = ("gpu=False" if gpu is False else
               "no CUDA GPU is visible to this process" if not have_gpus else "dask-cuda is not installed")
        name, value = next(iter(asked.items()))
        raise ValueError(f"local_cluster({name}={value!r}): RMM options are for GPU workers (dask-cuda), but this "
                         f"would be a CPU cluster ({why}); drop the RMM options or start GPU workers")
    if gpu is None:
        gpu = have_gpus and have_dask_cuda
    if gpu:
        if not have_gpus:
            raise RuntimeError("local_cluster(gpu=True): no CUDA GPU is visible to this process")
        if not have_dask_cuda:
            raise RuntimeError("local_cluster(gpu=True) needs dask-cuda: pip install 'multireduce[cluster]'")
        ucx = _uses_ucx(kwargs)
        default_name = "DEFAULT_RMM_UCX" if ucx else "DEFAULT_RMM"
        default = DEFAULT_RMM_UCX if ucx else DEFAULT_RMM
        if not rmm_given and default and importlib.util.find_spec("rmm") is not None:
            unknown = sorted(set(default) - set(_RMM_OPTIONS))
            if unknown:
                raise ValueError(f"multireduce.cluster.{default_name}: unknown option {unknown[0]!r}; expected "
                                 f"some of {', '.join(_RMM_OPTIONS)}")
            rmm = _check_rmm(default, f"multireduce.cluster.{default_name}")
        if ucx and rmm.get("rmm_async"):
            import warnings

            warnings.warn("local_cluster(protocol='ucx', rmm_async=True): UCX cannot map memory of RMM's "
                          "asynchronous allocator between GPUs and stages every transfer through host memory "
                          "(0.3 GB/s measured, slower than TCP); rmm_pool_size=... or rmm_async=False moves "
                          "arrays GPU to GPU", RuntimeWarning, stacklevel=2)
        kwargs.update(rmm)
        if kwargs.get("rmm_pool_size") is not None or kwargs.get("rmm_async") or kwargs.get("rmm_managed_memory"):
            if importlib.util.find_spec("rmm") is None:
                used = ", ".join(f"{k}={v!r}" for k, v in rmm.items() if v is not None and v is not False)
                raise RuntimeError(f"local_cluster({used}) needs the rmm package on this machine (dask-cuda "
                                   f"starts the workers here): {_rmm_install_hint()}")
            kwargs["rmm_allocator_external_lib_list"] = _with_cupy(kwargs.get("rmm_allocator_external_lib_list"))
        from dask_cuda import LocalCUDACluster

        if n_workers is not None:
            kwargs.setdefault("CUDA_VISIBLE_DEVICES", list(range(n_workers)))
        return LocalCUDACluster(**kwargs)
    from distributed import LocalCluster

    kwargs.setdefault("threads_per_worker", 1)
    return LocalCluster(n_workers=n_workers or 2, **kwargs)
